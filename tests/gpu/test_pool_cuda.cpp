// max_pool2d, avg_pool2d and adaptive_avg_pool2d (frugal's kernels) on CUDA against the CPU
// ops on the same inputs: forward and every gradient through autograd, in float32, float16,
// bfloat16 and float64, on small odd configurations and on ResNet-50's pools (the stem max
// pool, global average pooling); the argmax indices; mismatched devices. max_pool2d's
// maxima, indices and gradient from its input (Note [Fused max-pool backward] in
// tensor/cuda/pool.cu) equal the CPU's bit for bit, with ties, NaN and -inf, in every
// layout, and its CUDA backward allocates nothing besides grad_x. adaptive_avg_pool2d's
// gradient equals the CPU's bit for bit in both layouts, and global pooling's keeps a
// channels-last input's layout.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/pool.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/pool.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda pooling: forward and backward match the CPU, ResNet's pools included") {
  struct MaxCase {
    Shape x;
    Int2 k;
    MaxPool2dOptions o;
  };
  const MaxCase max_cases[] = {
      {{2, 3, 9, 7}, 3, {.stride = 2, .padding = 1}},
      {{2, 2, 9, 9}, {3, 2}, {.stride = {2, 1}, .padding = 1, .dilation = {2, 1}, .ceil_mode = true}},
      {{8, 64, 112, 112}, 3, {.stride = 2, .padding = 1}},  // ResNet's stem pool
  };
  uint64_t seed = 1;
  for (const MaxCase& c : max_cases) {
    const Tensor x = random_tensor(c.x, kFloat64, ++seed);
    const Shape ys = ops::max_pool2d(x, c.k, c.o).out.sizes();
    for (DType t : kFloatTypes) {
      compare_devices([&](const std::vector<Tensor>& in) { return max_pool2d(in[0], c.k, c.o); }, {x}, ys, t, ++seed,
                      "max_pool2d " + shape_str(c.x));
      const Tensor xt = x.to(t);
      CHECK(ops::max_pool2d(xt.to(kGpu), c.k, c.o).indices.cpu().tolist<int64_t>() ==
            ops::max_pool2d(xt, c.k, c.o).indices.tolist<int64_t>());
    }
  }
  struct AvgCase {
    Shape x;
    Int2 k;
    AvgPool2dOptions o;
  };
  const AvgCase avg_cases[] = {
      {{2, 3, 9, 7}, 3, {.stride = 2, .padding = 1}},
      {{2, 2, 7, 8}, {3, 2}, {.stride = {2, 3}, .padding = 1, .ceil_mode = true, .count_include_pad = false}},
      {{8, 256, 28, 28}, 2, {}},
  };
  for (const AvgCase& c : avg_cases) {
    const Tensor x = random_tensor(c.x, kFloat64, ++seed);
    const Shape ys = ops::avg_pool2d(x, c.k, c.o).sizes();
    for (DType t : kFloatTypes)
      compare_devices([&](const std::vector<Tensor>& in) { return avg_pool2d(in[0], c.k, c.o); }, {x}, ys, t, ++seed,
                      "avg_pool2d " + shape_str(c.x));
  }
  const std::pair<Shape, Int2> adaptive_cases[] = {
      {{8, 2048, 7, 7}, 1},      // global average pooling: a warp per output
      {{2, 3, 13, 11}, {4, 5}},  // thread per output, overlapping windows
      {{2, 3, 3, 4}, {5, 7}},    // growing
      {{2, 4, 64, 48}, {2, 3}},  // large windows, several outputs per plane
  };
  for (const auto& [xs, out] : adaptive_cases) {
    const Tensor x = random_tensor(xs, kFloat64, ++seed);
    const Shape ys = ops::adaptive_avg_pool2d(x, out).sizes();
    for (DType t : kFloatTypes)
      compare_devices([&](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], out); }, {x}, ys, t,
                      ++seed, "adaptive_avg_pool2d " + shape_str(xs));
  }
  const Tensor xg = random_tensor({2, 3, 8, 8}, {kFloat32, kGpu}, 1, Layout::Transposed);
  check_dtype_norm_close(ops::max_pool2d(xg, 2).out, ops::max_pool2d(xg.cpu(), 2).out, 0, "non-contiguous max");
  const ops::MaxPool2dResult r = ops::max_pool2d(xg, 2);
  check_error([&] { ops::max_pool2d_backward(r.out, r.indices.cpu(), xg.sizes(), 2); },
              {"max_pool2d_backward", "cuda", "cpu"});
}

namespace {

/// Few distinct values, so windows tie, with some -inf and NaN (all exact in every dtype).
std::vector<double> tied_values(int64_t n, uint64_t seed) {
  std::vector<double> v = random_values(n, seed, 0, 1);
  for (double& x : v)
    x = x < 0.03   ? std::numeric_limits<double>::quiet_NaN()
        : x < 0.15 ? -std::numeric_limits<double>::infinity()
                   : std::floor(x * 4) - 2;
  return v;
}

}  // namespace

TEST_CASE("cuda max_pool2d: maxima, indices and the gradient from the input equal the CPU's bit for bit") {
  struct Case {
    Shape x;
    Int2 k;
    MaxPool2dOptions o;
  };
  const Case cases[] = {
      {{2, 16, 9, 7}, 3, {.stride = 2, .padding = 1}},                  // ResNet's pool, odd sizes, C % 8 == 0
      {{2, 24, 7, 9}, 3, {.stride = 2, .padding = 1}},                  // 16-byte vectors, a short channel group
      {{2, 3, 7, 9}, 3, {.stride = 2, .padding = 1}},                   // C = 3: a channel a thread
      {{2, 8, 8, 10}, 2, {}},                                           // 2x2/s2: windows do not overlap
      {{1, 24, 11, 9}, 3, {.stride = 1, .padding = 1, .dilation = 2}},  // 3x3/s1 dilated: 9 windows a pixel
      {{2, 3, 9, 9}, {3, 2}, {.stride = {2, 1}, .padding = 1, .dilation = {2, 1}, .ceil_mode = true}},  // C = 3
      {{1, 8, 2, 1}, {2, 1}, {.stride = 1, .padding = {2, 0}, .dilation = {3, 1}}},  // a window of padding only
      {{1, 8, 18, 17}, 16, {.stride = 2}},                  // 256 positions: int64 indices in backward
      {{4, 64, 112, 112}, 3, {.stride = 2, .padding = 1}},  // ResNet-50's stem pool
  };
  uint64_t seed = 1000;
  for (const Case& c : cases)
    for (DType t : kFloatTypes)
      for (const char* layout : {"contiguous", "channels-last", "transposed"}) {
        CAPTURE(shape_str(c.x));
        CAPTURE(c.k.str());
        CAPTURE(dtype_name(t));
        CAPTURE(layout);
        const bool nhwc = std::string(layout) == "channels-last";
        const Layout l = std::string(layout) == "transposed" ? Layout::Transposed : Layout::Contiguous;
        const std::vector<double> xv = tied_values(numel_of(c.x), ++seed);
        Tensor x = make_tensor(xv, c.x, t, l), xg = make_tensor(xv, c.x, {t, kGpu}, l);
        if (nhwc) x = to_channels_last(x), xg = to_channels_last(xg);
        const ops::MaxPool2dResult ref = ops::max_pool2d(x, c.k, c.o), got = ops::max_pool2d(xg, c.k, c.o);
        check_close(got.out, values_of(ref.out), 0, 0, "max_pool2d out");
        CHECK(got.indices.cpu().tolist<int64_t>() == ref.indices.tolist<int64_t>());
        const Tensor values = ops::max_pool2d_values(xg, c.k, c.o);
        check_close(values, values_of(ref.out), 0, 0, "max_pool2d_values");
        CHECK(is_channels_last(values) == nhwc);
        // The gradient in the input's layout, as autograd hands it over.
        const std::vector<double> gv = random_values(ref.out.numel(), ++seed);
        Tensor gy = make_tensor(gv, ref.out.sizes(), t), gyg = make_tensor(gv, ref.out.sizes(), {t, kGpu});
        if (nhwc) gy = to_channels_last(gy), gyg = to_channels_last(gyg);
        const Tensor gx_ref = ops::max_pool2d_backward_from_input(gy, x, c.k, c.o);
        const Tensor gx = ops::max_pool2d_backward_from_input(gyg, xg, c.k, c.o);
        CHECK(is_channels_last(gx) == nhwc);
        check_close(gx, values_of(gx_ref), 0, 0, "max_pool2d_backward_from_input");
        check_close(ops::max_pool2d_backward(gyg, got.indices, c.x, c.k, c.o), values_of(gx_ref), 0, 0,
                    "max_pool2d_backward from the indices");
      }
}

TEST_CASE("cuda max_pool2d: the backward from the input allocates nothing besides grad_x") {
  // ResNet-50's stem pool at batch 8: the argmax lives in shared memory alone, where int64
  // indices would take 8 bytes per output (Note [Fused max-pool backward]).
  const MaxPool2dOptions o{.stride = 2, .padding = 1};
  const Tensor x = to_channels_last(random_tensor({8, 64, 112, 112}, {kFloat16, kGpu}, 7));
  const Tensor gy = to_channels_last(random_tensor({8, 64, 56, 56}, {kFloat16, kGpu}, 8));
  // What the allocator takes for grad_x (rounding included).
  auto current = [] { return memory::stats(kGpu).allocated_bytes.current; };
  int64_t grad_bytes = 0;
  {
    const int64_t c0 = current();
    const DataPtr a = memory::allocate(kGpu, size_t(x.numel()) * 2);
    grad_bytes = current() - c0;
  }
  memory::reset_peak(kGpu);
  const int64_t before = memory::stats(kGpu).allocated_bytes.current;
  const Tensor gx = ops::max_pool2d_backward_from_input(gy, x, 3, o);
  CHECK(memory::stats(kGpu).allocated_bytes.peak - before == grad_bytes);
  CHECK(memory::stats(kGpu).allocated_bytes.current - before == grad_bytes);
  check_close(gx, values_of(ops::max_pool2d_backward_from_input(gy.cpu(), x.cpu(), 3, o)), 0, 0, "grad_x");
}

TEST_CASE("cuda max_pool2d: the backward from the input names mismatched devices") {
  const Tensor x = random_tensor({2, 3, 8, 8}, {kFloat32, kGpu}, 3);
  check_error(
      [&] {
        ops::max_pool2d_backward_from_input(zeros({2, 3, 4, 4}), x, 2);
      },
      {"max_pool2d_backward", "cuda", "cpu"});
}

TEST_CASE("cuda adaptive_avg_pool2d: the gradient equals the CPU's bit for bit in both layouts") {
  // Tiling windows (global pooling's among them) and overlapping ones; C = 24 takes the
  // 16-byte kernels, C = 3 a channel a thread; an NCHW pool that keeps the width runs as
  // channels-last rows (columns_as_channels in tensor/cuda/pool.cu).
  const std::pair<Shape, Int2> cases[] = {
      {{3, 24, 7, 7}, 1},        // global pooling
      {{2, 3, 7, 9}, 1},         // global pooling, C = 3
      {{2, 24, 8, 6}, {4, 3}},   // 2x2 windows tiling the input
      {{2, 3, 13, 11}, {4, 5}},  // overlapping windows
      {{2, 24, 3, 4}, {5, 7}},   // growing
      {{2, 8, 9, 16}, {4, 16}},  // keeps the width
  };
  uint64_t seed = 2000;
  for (const auto& [xs, os] : cases)
    for (DType t : kFloatTypes)
      for (bool nhwc : {false, true}) {
        CAPTURE(shape_str(xs));
        CAPTURE(dtype_name(t));
        CAPTURE(nhwc);
        const Shape ys{xs[0], xs[1], os.h, os.w};
        const std::vector<double> gv = random_values(numel_of(ys), ++seed);
        Tensor gy = make_tensor(gv, ys, t), gyg = make_tensor(gv, ys, {t, kGpu});
        if (nhwc) gy = to_channels_last(gy), gyg = to_channels_last(gyg);
        const Tensor gx = ops::adaptive_avg_pool2d_backward(gyg, xs);
        check_close(gx, values_of(ops::adaptive_avg_pool2d_backward(gy, xs)), 0, 0, "adaptive_avg_pool2d_backward");
      }
}

TEST_CASE("cuda adaptive_avg_pool2d: global pooling's gradient keeps a channels-last input's layout") {
  // grad_out (N, C, 1, 1) is both layouts at once, so the node answers in x's (Note
  // [Channels-last global pool backward] in autograd/ops/pool.cpp): channels-last, with
  // the values of the NCHW backward, g / (H W) at every pixel.
  const Shape shapes[] = {{3, 24, 7, 7}, {2, 3, 7, 9}, {1, 64, 5, 3}};
  uint64_t seed = 3000;
  for (const Shape& xs : shapes)
    for (DType t : kFloatTypes) {
      CAPTURE(shape_str(xs));
      CAPTURE(dtype_name(t));
      const std::vector<double> xv = random_values(numel_of(xs), ++seed), gv = random_values(xs[0] * xs[1], ++seed);
      const Shape ys{xs[0], xs[1], 1, 1};
      auto grad_x = [&](Device d) {
        const Tensor x = to_channels_last(make_tensor(xv, xs, {t, d}));
        x.requires_grad_();
        const Tensor y = adaptive_avg_pool2d(x, 1);
        return autograd::grad({y}, {x}, {make_tensor(gv, ys, {t, d})})[0];  // contiguous, as flatten's backward
      };
      const Tensor gx = grad_x(kGpu), gx_cpu = grad_x(kCPU);
      CHECK_MESSAGE(suggests_channels_last(gx), gx.describe(), " strides ", shape_str(gx.strides()));
      CHECK_MESSAGE(suggests_channels_last(gx_cpu), gx_cpu.describe(), " strides ", shape_str(gx_cpu.strides()));
      const std::vector<double> nchw = values_of(ops::adaptive_avg_pool2d_backward(make_tensor(gv, ys, t), xs));
      check_close(gx, nchw, 0, 0, "CUDA grad_x");
      check_close(gx_cpu, nchw, 0, 0, "CPU grad_x");
      const std::vector<double> g = values_of(make_tensor(gv, ys, t));  // rounded to t
      std::vector<double> ref(size_t(numel_of(xs)));
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = g[i / size_t(xs[2] * xs[3])] / double(xs[2] * xs[3]);
      check_close(nchw, ref, default_rtol(t), 0, "grad_x against float64");
    }
}
