// interpolate (frugal's gather kernels, Note [Interpolation source indices]) on CUDA against
// the CPU op on the same inputs: forward and the input gradient through autograd in float32,
// float16, bfloat16 and float64, every mode ('area' is adaptive_avg_pool2d's kernels) and both
// align_corners, sizes and scale factors (up, down, non-integer, per-dim), contiguous,
// transposed and channels-last inputs (the channels-last kernels read and write NHWC natively
// and keep the layout); the nearest modes' values and gradients equal the CPU's bit for bit
// (same source indices, sums in the same order);
// the backward is deterministic run to run; empty batches.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "autograd/ops/interpolate.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/interpolate.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using M = InterpolateMode;

struct Case {
  Shape x;
  InterpolateOptions o;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  const std::vector<std::pair<Shape, InterpolateOptions>> sizes = {
      {{2, 3, 7, 9}, {.size = Int2{13, 5}}},
      {{2, 3, 7, 9}, {.scale_factor = 1.7}},
      {{1, 4, 10, 11}, {.size = Int2{4, 3}}},
      {{2, 8, 5, 6}, {.scale_factor = Scale2{0.5, 2.5}}},
      {{1, 3, 7, 7}, {.scale_factor = 1.1}},     // out == in
      {{4, 16, 32, 32}, {.scale_factor = 2.0}},  // a decoder's 2x upsampling
      {{1, 2, 3, 4}, {.size = Int2{1, 7}}},
      {{2, 64, 17, 23}, {.size = Int2{64, 64}}},  // large factors: many outputs per input pixel
  };
  for (const auto& [xs, base] : sizes) {
    for (M mode : {M::Nearest, M::NearestExact, M::Area}) {
      InterpolateOptions o = base;
      o.mode = mode;
      c.push_back({xs, o});
    }
    for (M mode : {M::Bilinear, M::Bicubic})
      for (bool align_corners : {false, true}) {
        InterpolateOptions o = base;
        o.mode = mode;
        o.align_corners = align_corners;
        c.push_back({xs, o});
      }
  }
  return c;
}

std::string describe(const Case& c) {
  std::string s = shape_str(c.x) + " " + interpolate_mode_name(c.o.mode);
  s += c.o.size ? " size=" + c.o.size->str() : " scale_factor=" + c.o.scale_factor->str();
  if (c.o.align_corners) s += *c.o.align_corners ? " align_corners" : "";
  return s;
}

}  // namespace

TEST_CASE("cuda interpolate: forward and backward match the CPU in every dtype") {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    const Tensor x = random_tensor(c.x, kFloat64, ++seed);
    const Shape ys = ops::interpolate_output_shape(c.x, c.o);
    for (DType t : kFloatTypes)
      compare_devices([&](const std::vector<Tensor>& in) { return interpolate(in[0], c.o); }, {x}, ys, t, ++seed,
                      "interpolate " + describe(c));
  }
}

TEST_CASE("cuda interpolate: every layout, channels-last kept; the nearest modes equal the CPU bit for bit") {
  uint64_t seed = 100;
  for (const Case& c : cases())
    for (DType t : {kFloat32, kFloat16})
      for (const char* layout : {"contiguous", "transposed", "channels-last"}) {
        CAPTURE(describe(c));
        CAPTURE(name_of(t, c.x));
        CAPTURE(layout);
        const bool nhwc = std::string(layout) == "channels-last";
        const Layout l = std::string(layout) == "transposed" ? Layout::Transposed : Layout::Contiguous;
        const std::vector<double> xv = random_values(numel_of(c.x), ++seed);
        Tensor x = make_tensor(xv, c.x, t, l), xg = make_tensor(xv, c.x, {t, kGpu}, l);
        if (nhwc) x = to_channels_last(x), xg = to_channels_last(xg);
        const Tensor y = ops::interpolate(x, c.o), yg = ops::interpolate(xg, c.o);
        CHECK(is_channels_last(yg) == (nhwc && c.x[1] > 1));
        const std::vector<double> gyv = random_values(y.numel(), ++seed);
        Tensor gy = make_tensor(gyv, y.sizes(), t), gyg = make_tensor(gyv, y.sizes(), {t, kGpu});
        if (nhwc) gy = to_channels_last(gy), gyg = to_channels_last(gyg);
        const Tensor gx = ops::interpolate_backward(gy, c.x, c.o), gxg = ops::interpolate_backward(gyg, c.x, c.o);
        if (nhwc && c.x[1] > 1) CHECK(is_channels_last(gxg));
        if (c.o.mode == M::Nearest || c.o.mode == M::NearestExact) {
          CHECK(bytes_of(yg.cpu()) == bytes_of(y));
          CHECK(bytes_of(gxg.cpu()) == bytes_of(gx));
        } else {
          check_dtype_norm_close(yg.cpu(), y, rtol_for(t), "y");
          check_dtype_norm_close(gxg.cpu(), gx, rtol_for(t), "gx");
        }
        // Deterministic: a second backward gives the same bits (no atomics).
        CHECK(bytes_of(ops::interpolate_backward(gyg, c.x, c.o).cpu()) == bytes_of(gxg.cpu()));
      }
}

TEST_CASE("cuda interpolate: empty batches give empty outputs and gradients") {
  const Tensor x = zeros({0, 3, 4, 5}, {kFloat32, kGpu});
  for (M mode : {M::Nearest, M::Bilinear, M::Bicubic, M::NearestExact, M::Area}) {
    CHECK(ops::interpolate(x, {.scale_factor = 2.0, .mode = mode}).sizes() == Shape{0, 3, 8, 10});
    CHECK(ops::interpolate_backward(zeros({0, 3, 8, 10}, {kFloat32, kGpu}), x.sizes(),
                                    {.scale_factor = 2.0, .mode = mode})
              .sizes() == x.sizes());
  }
}

TEST_CASE("cuda interpolate 1-D: (N, C, L) signals match the CPU in every dtype and mode") {
  uint64_t seed = 300;
  const std::vector<std::pair<Shape, InterpolateOptions>> sizes = {
      {{2, 3, 7}, {.size = 13}}, {{1, 4, 11}, {.size = 4}}, {{2, 8, 50}, {.scale_factor = 1.7}},
      {{1, 3, 7}, {.scale_factor = 1.1}}};
  for (const auto& [xs, base] : sizes)
    for (M mode : {M::Nearest, M::Linear, M::NearestExact, M::Area})
      for (bool align_corners : {false, true}) {
        if (align_corners && mode != M::Linear) continue;
        InterpolateOptions o = base;
        o.mode = mode;
        if (mode == M::Linear) o.align_corners = align_corners;
        const Case c{xs, o};
        const Tensor x = random_tensor(xs, kFloat64, ++seed);
        const Shape ys = ops::interpolate_output_shape(xs, o);
        REQUIRE(ys.size() == 3);
        for (DType t : kFloatTypes)
          compare_devices([&](const std::vector<Tensor>& in) { return interpolate(in[0], o); }, {x}, ys, t, ++seed,
                          "interpolate " + describe(c));
      }
}
