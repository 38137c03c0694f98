// interpolate (every mode, align_corners both ways, size or scale_factor; images and signals):
// forward and backward against a naive float64 reference of PyTorch's formulas in every
// dtype and layout, PyTorch 1.13's own values and gradients (tests/cpu/interpolate_golden.h,
// made by tools/make_interpolate_golden.py), gradcheck, empty batches, one thread against
// two bit for bit, errors, and the Upsample module.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/interpolate.h"
#include "autograd/ops/reduce.h"
#include "core/threads.h"
#include "nn/upsampling.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/interpolate.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/cpu/interpolate_golden.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kAllFloat[] = {kFloat32, kFloat64, kFloat16, kBFloat16};
using M = InterpolateMode;

// ---- a naive reference, written from PyTorch's UpSample.h (not from frugal's helpers) ----

/// PyTorch's nearest_idx: copy when out == in, halve when out == 2 in, else
/// min(floor(o * scale), in - 1) with the scale and the product in float, as torch computes them.
int64_t ref_nearest(int64_t o, int64_t in, int64_t out, double scale_factor) {
  if (out == in) return o;
  if (out == 2 * in) return o / 2;
  const float scale = scale_factor > 0 ? float(1.0 / scale_factor) : float(in) / float(out);
  return std::min(int64_t(std::floor(float(o) * scale)), in - 1);
}

/// PyTorch's area_pixel_compute_source_index in double: i0, i1 and the weight of i1.
struct RefTap {
  int64_t i0, i1;
  double l1;
};
RefTap ref_linear(int64_t o, int64_t in, int64_t out, bool align_corners, double scale_factor) {
  double src;
  if (out == in) {  // torch's CPU copies a dim whose size does not change, whatever the scale
    src = double(o);
  } else if (align_corners) {
    src = out > 1 ? double(in - 1) / double(out - 1) * double(o) : 0.0;
  } else {
    const double scale = scale_factor > 0 ? 1.0 / scale_factor : double(in) / double(out);
    src = std::max(scale * (double(o) + 0.5) - 0.5, 0.0);
  }
  const int64_t i0 = std::min(int64_t(std::floor(src)), in - 1);
  return {i0, std::min(i0 + 1, in - 1), src - double(i0)};
}

/// PyTorch's nearest_exact_idx: min(floor((o + 0.5) * scale), in - 1), the scale in float.
int64_t ref_nearest_exact(int64_t o, int64_t in, int64_t out, double scale_factor) {
  const float scale = scale_factor > 0 ? float(1.0 / scale_factor) : float(in) / float(out);
  return std::min(int64_t(std::floor(float((double(o) + 0.5) * double(scale)))), in - 1);
}

/// Keys' cubic convolution kernel with a = -0.75 (PyTorch's), at distance x from a tap.
double ref_cubic_kernel(double x) {
  const double a = -0.75;
  x = std::fabs(x);
  if (x <= 1) return (a + 2) * x * x * x - (a + 3) * x * x + 1;
  if (x < 2) return a * x * x * x - 5 * a * x * x + 8 * a * x - 4 * a;
  return 0;
}

/// (input index, weight) pairs one output index of one dim reads.
using RefTaps = std::vector<std::pair<int64_t, double>>;

RefTaps ref_taps(M mode, int64_t o, int64_t in, int64_t out, bool align_corners, double scale_factor) {
  switch (mode) {
    case M::Nearest: return {{ref_nearest(o, in, out, scale_factor), 1.0}};
    case M::NearestExact: return {{ref_nearest_exact(o, in, out, scale_factor), 1.0}};
    case M::Bilinear:
    case M::Linear: {
      const RefTap t = ref_linear(o, in, out, align_corners, scale_factor);
      return {{t.i0, 1 - t.l1}, {t.i1, t.l1}};
    }
    case M::Bicubic: {  // no copying shortcut and no clamp of the source at 0; the taps clamp
      const double scale = scale_factor > 0 ? 1.0 / scale_factor : double(in) / double(out);
      const double src = align_corners ? (out > 1 ? double(in - 1) / double(out - 1) * double(o) : 0.0)
                                       : scale * (double(o) + 0.5) - 0.5;
      const int64_t i = int64_t(std::floor(src));
      RefTaps t;
      for (int64_t k = -1; k <= 2; ++k)
        t.push_back({std::clamp<int64_t>(i + k, 0, in - 1), ref_cubic_kernel(src - double(i + k))});
      return t;
    }
    case M::Area: {  // adaptive average pooling: [floor(o in / out), ceil((o + 1) in / out))
      const int64_t begin = o * in / out, end = ((o + 1) * in + out - 1) / out;
      RefTaps t;
      for (int64_t i = begin; i < end; ++i) t.push_back({i, 1.0 / double(end - begin)});
      return t;
    }
  }
  return {};
}

struct Ref {
  Shape y_shape;
  std::vector<double> y, gx;
};

/// interpolate of x (N, C, H, W) by the formulas above; gx from gy when given.
Ref reference_2d(const std::vector<double>& x, const Shape& xs, const InterpolateOptions& o,
              const std::vector<double>* gy = nullptr) {
  const int64_t P = xs[0] * xs[1], H = xs[2], W = xs[3];
  const int64_t OH = o.size ? o.size->h : int64_t(std::floor(double(H) * o.scale_factor->h));
  const int64_t OW = o.size ? o.size->w : int64_t(std::floor(double(W) * o.scale_factor->w));
  const bool given = o.scale_factor && !o.recompute_scale_factor;
  const double sh = given ? o.scale_factor->h : 0.0, sw = given ? o.scale_factor->w : 0.0;
  const bool ac = o.align_corners.value_or(false);
  Ref r{{xs[0], xs[1], OH, OW}, {}, std::vector<double>(size_t(P * H * W), 0.0)};
  for (int64_t p = 0; p < P; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        std::vector<std::pair<int64_t, double>> taps;  // (index in the plane, weight)
        for (const auto& [ih, wh] : ref_taps(o.mode, oh, H, OH, ac, sh))
          for (const auto& [iw, ww] : ref_taps(o.mode, ow, W, OW, ac, sw)) taps.push_back({ih * W + iw, wh * ww});
        double v = 0;
        for (const auto& [i, wt] : taps) v += wt * x[size_t(p * H * W + i)];
        const size_t out_index = r.y.size();
        r.y.push_back(v);
        if (gy)
          for (const auto& [i, wt] : taps) r.gx[size_t(p * H * W + i)] += wt * (*gy)[out_index];
      }
  return r;
}

/// interpolate of a signal x (N, C, L) along its one dim, by the same per-dim formulas.
Ref reference_1d(const std::vector<double>& x, const Shape& xs, const InterpolateOptions& o,
                 const std::vector<double>* gy = nullptr) {
  const int64_t P = xs[0] * xs[1], L = xs[2];
  const int64_t OL = o.size ? o.size->w : int64_t(std::floor(double(L) * o.scale_factor->w));
  const double scale = o.scale_factor && !o.recompute_scale_factor ? o.scale_factor->w : 0.0;
  Ref r{{xs[0], xs[1], OL}, {}, std::vector<double>(size_t(P * L), 0.0)};
  for (int64_t p = 0; p < P; ++p)
    for (int64_t ol = 0; ol < OL; ++ol) {
      const RefTaps taps = ref_taps(o.mode, ol, L, OL, o.align_corners.value_or(false), scale);
      double v = 0;
      for (const auto& [i, wt] : taps) v += wt * x[size_t(p * L + i)];
      const size_t out_index = r.y.size();
      r.y.push_back(v);
      if (gy)
        for (const auto& [i, wt] : taps) r.gx[size_t(p * L + i)] += wt * (*gy)[out_index];
    }
  return r;
}

/// The reference of x's rank: a signal (N, C, L) or an image (N, C, H, W).
Ref reference(const std::vector<double>& x, const Shape& xs, const InterpolateOptions& o,
              const std::vector<double>* gy = nullptr) {
  return xs.size() == 3 ? reference_1d(x, xs, o, gy) : reference_2d(x, xs, o, gy);
}

/// The golden inputs' formulas: x[i] = 2 sin(0.731 i), grad_out[i] = cos(0.413 i).
std::vector<double> golden_x(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = 2 * std::sin(0.731 * double(i));
  return v;
}
std::vector<double> golden_gy(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::cos(0.413 * double(i));
  return v;
}

std::string describe(const InterpolateOptions& o) {
  std::string s = interpolate_mode_name(o.mode);
  s += o.size ? " size=" + o.size->str() : " scale_factor=" + o.scale_factor->str();
  if (o.align_corners) s += *o.align_corners ? " align_corners=true" : " align_corners=false";
  if (o.recompute_scale_factor) s += " recompute_scale_factor";
  return s;
}

struct Case {
  Shape x;
  InterpolateOptions o;
};

/// Up, down, non-integer and per-dim scales, size 1 outputs, every mode and both align_corners.
std::vector<Case> cases() {
  std::vector<Case> c;
  const std::vector<std::pair<Shape, InterpolateOptions>> sizes = {
      {{2, 3, 7, 9}, {.size = Int2{13, 5}}},
      {{2, 3, 7, 9}, {.scale_factor = 1.7}},
      {{1, 2, 10, 11}, {.size = Int2{4, 3}}},
      {{2, 2, 5, 6}, {.scale_factor = Scale2{0.5, 2.5}}},
      {{1, 3, 7, 7}, {.scale_factor = 1.1}},  // out == in: nearest copies whatever the scale
      {{2, 1, 4, 5}, {.scale_factor = 2.0}},
      {{1, 2, 6, 4}, {.scale_factor = Scale2{1.7, 0.75}, .recompute_scale_factor = true}},
      {{1, 2, 3, 4}, {.size = Int2{1, 7}}},
      {{1, 1, 1, 1}, {.size = Int2{3, 2}}},
  };
  for (const auto& [xs, base] : sizes) {
    for (M mode : {M::Nearest, M::NearestExact, M::Area}) {
      InterpolateOptions o = base;
      o.mode = mode;
      c.push_back({xs, o});
    }
    for (M mode : {M::Bilinear, M::Bicubic})
      for (std::optional<bool> align_corners : {std::optional<bool>(), std::optional(false), std::optional(true)}) {
        InterpolateOptions o = base;
        o.mode = mode;
        o.align_corners = align_corners;
        c.push_back({xs, o});
      }
  }
  return c;
}

/// Up, down, non-integer and same-size resizes, size-1 inputs and outputs, every 1-D mode.
std::vector<Case> cases_1d() {
  std::vector<Case> c;
  const std::vector<std::pair<Shape, InterpolateOptions>> sizes = {
      {{2, 3, 7}, {.size = 13}},        {{2, 3, 7}, {.scale_factor = 1.7}},
      {{1, 2, 11}, {.size = 4}},        {{2, 2, 6}, {.scale_factor = 0.5}},
      {{1, 3, 7}, {.scale_factor = 1.1}},  // out == in
      {{2, 1, 5}, {.scale_factor = 2.0}}, {{1, 2, 6}, {.scale_factor = 1.7, .recompute_scale_factor = true}},
      {{1, 2, 4}, {.size = 1}},         {{1, 1, 1}, {.size = 3}},
  };
  for (const auto& [xs, base] : sizes) {
    for (M mode : {M::Nearest, M::NearestExact, M::Area}) {
      InterpolateOptions o = base;
      o.mode = mode;
      c.push_back({xs, o});
    }
    for (std::optional<bool> align_corners : {std::optional<bool>(), std::optional(false), std::optional(true)}) {
      InterpolateOptions o = base;
      o.mode = M::Linear;
      o.align_corners = align_corners;
      c.push_back({xs, o});
    }
  }
  return c;
}

/// Every case: the images' and the signals'.
std::vector<Case> all_cases() {
  std::vector<Case> c = cases(), signals = cases_1d();
  c.insert(c.end(), signals.begin(), signals.end());
  return c;
}

/// The tolerance of a result in `dt` against float64: a few roundings of the stored type.
double tol(DType dt) { return dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : 2 * default_rtol(dt); }

}  // namespace

TEST_CASE("interpolate: the reference and frugal match PyTorch 1.13's values and gradients, in every layout") {
  std::vector<InterpolateGolden> goldens = interpolate_goldens();
  for (const InterpolateGolden& g : interpolate_goldens_1d()) goldens.push_back(g);
  for (const InterpolateGolden& g : goldens) {
    CAPTURE(g.name);
    const std::vector<double> xv = golden_x(numel_of(g.x)), gyv = golden_gy(numel_of(g.y));
    // The reference of the test is PyTorch's formulas (up to float32's rounding of the sources).
    const Ref ref = reference(values_of(make_tensor(xv, g.x, g.dtype)), g.x, g.options, &gyv);
    CHECK(ref.y_shape == g.y);
    const double t = g.dtype == kFloat64 ? 1e-12 : 1e-5;
    check_close(ref.y, g.y_values, t, t, "reference y");
    // PyTorch 1.13's CPU bicubic backward copies the gradient when neither dim changes size,
    // while its forward resamples with the scale factor (as frugal's): its gradient is then
    // not the forward's. frugal's is (gradcheck below), so here it matches the reference's.
    const bool torch_gx_differs = std::string(g.name) == "same_size_bicubic";
    const std::vector<double>& gx = torch_gx_differs ? ref.gx : g.gx;
    if (torch_gx_differs) check_close(g.gx, golden_gy(numel_of(g.y)), 1e-6, 1e-6, "torch copies");
    else check_close(ref.gx, g.gx, t, t, "reference gx");
    for (Layout layout : kAllLayouts) {
      CAPTURE(layout_name(layout));
      Tensor x = make_tensor(xv, g.x, g.dtype, layout);
      x.requires_grad_();
      const Tensor y = interpolate(x, g.options);
      REQUIRE(y.sizes() == g.y);
      if (g.x.size() == 3) CHECK(y.is_contiguous());  // a signal's, as torch's, whatever the input's layout
      y.backward(make_tensor(gyv, g.y, g.dtype, layout));
      check_close(y, g.y_values, t, t, "y");
      check_close(x.grad(), gx, t, t, "gx");
    }
    if (g.x.size() == 4) {
      const Tensor xc = to_channels_last(make_tensor(xv, g.x, g.dtype));
      check_close(ops::interpolate(xc, g.options), g.y_values, t, t, "channels-last y");
    }
  }
}

TEST_CASE("interpolate: forward and backward match the float64 reference in every dtype and layout") {
  uint64_t seed = 100;
  for (const Case& c : all_cases()) {
    CAPTURE(shape_str(c.x));
    CAPTURE(describe(c.o));
    for (DType dt : kAllFloat)
      for (Layout layout : kAllLayouts) {
        CAPTURE(name_of(dt, layout));
        const Tensor x = random_tensor(c.x, dt, ++seed, layout);
        const Tensor y = ops::interpolate(x, c.o);
        const Tensor gy = random_tensor(y.sizes(), dt, ++seed, layout);
        const std::vector<double> gyv = values_of(gy);
        const Ref ref = reference(values_of(x), c.x, c.o, &gyv);
        REQUIRE(y.sizes() == ref.y_shape);
        CHECK(y.dtype() == dt);
        check_close(y, ref.y, tol(dt), tol(dt), "y");
        const Tensor gx = ops::interpolate_backward(gy, c.x, c.o);
        CHECK(gx.sizes() == c.x);
        CHECK(gx.dtype() == dt);
        check_close(gx, ref.gx, tol(dt), tol(dt) * std::max(1.0, max_abs(gx)), "gx");
      }
  }
}

TEST_CASE("interpolate: gradcheck in float64 for every mode, both align_corners, sizes and scale factors") {
  uint64_t seed = 500;
  for (const Case& c : all_cases()) {
    CAPTURE(shape_str(c.x));
    CAPTURE(describe(c.o));
    const InterpolateOptions o = c.o;
    check_gradcheck([o](const TensorList& in) { return interpolate(in[0], o); }, {leaf(c.x, ++seed)});
  }
}

TEST_CASE("interpolate: a channels-last input gives a channels-last output and gradient, bit for bit the planar ones") {
  // The CPU resizes channels-last tensors as they lie, a block of 64 channels per backward
  // accumulator: 70 channels make a full block and a partial one.
  uint64_t seed = 7;
  for (const Shape& xs : {Shape{2, 3, 5, 6}, Shape{2, 70, 4, 5}})
    for (DType dt : {kFloat32, kFloat16, kFloat64})
      for (const InterpolateOptions& o :
           {InterpolateOptions{.size = Int2{7, 4}, .mode = M::Bilinear},
            InterpolateOptions{.scale_factor = 2.0, .mode = M::Nearest},
            InterpolateOptions{.size = Int2{9, 4}, .mode = M::Bicubic},
            InterpolateOptions{.scale_factor = Scale2{0.6, 1.7}, .mode = M::Bicubic, .align_corners = true},
            InterpolateOptions{.scale_factor = 1.5, .mode = M::NearestExact},
            InterpolateOptions{.size = Int2{3, 4}, .mode = M::Area}}) {
        CAPTURE(describe(o));
        CAPTURE(name_of(dt, xs));
        const Tensor x = to_channels_last(random_tensor(xs, dt, ++seed));
        const Tensor y = ops::interpolate(x, o);
        CHECK(is_channels_last(y));
        CHECK(bytes_of(y.contiguous()) == bytes_of(ops::interpolate(x.contiguous(), o)));
        const Tensor gy = to_channels_last(random_tensor(y.sizes(), dt, ++seed));
        const Tensor gx = ops::interpolate_backward(gy, x.sizes(), o);
        CHECK(is_channels_last(gx));
        CHECK(bytes_of(gx.contiguous()) == bytes_of(ops::interpolate_backward(gy.contiguous(), x.sizes(), o)));
      }
}

TEST_CASE("interpolate: expanded, offset and channels-ambiguous inputs and an expanded gradient, as their copies") {
  // Inputs users pass that no layout of the test util makes: a broadcast image (stride-0
  // batch and channel dims), a slice at a storage offset, a one-channel tensor whose strides
  // fit NCHW and NHWC alike, and the expanded ones a sum's backward hands over.
  const Tensor base = random_tensor({1, 1, 5, 6}, kFloat32, 41);
  const Tensor big = random_tensor({3, 4, 7, 8}, kFloat32, 42);
  const Tensor one_channel = to_channels_last(random_tensor({2, 1, 5, 6}, kFloat32, 43));
  const std::vector<Tensor> inputs = {base.expand({2, 3, 5, 6}), big.slice(0, 1, 3).slice(2, 1, 6).slice(3, 2, 8),
                                      one_channel};
  for (M mode : {M::Nearest, M::Bilinear, M::Bicubic, M::NearestExact, M::Area})
    for (const Tensor& x : inputs) {
      const InterpolateOptions o{.size = Int2{7, 4}, .mode = mode};
      CAPTURE(describe(o));
      CAPTURE(shape_str(x.strides()));
      CHECK(bytes_of(ops::interpolate(x, o).contiguous()) == bytes_of(ops::interpolate(x.contiguous(), o)));
      Tensor leaf = x.contiguous().detach();  // a leaf of its own (contiguous() of the 1-channel one is x)
      leaf.requires_grad_();
      frugal::sum(interpolate(leaf, o)).backward();  // the output gradient is an expanded 1
      const Tensor ones = frugal::ones({x.size(0), x.size(1), 7, 4}, kFloat32);
      CHECK(bytes_of(leaf.grad().contiguous()) == bytes_of(ops::interpolate_backward(ones, x.sizes(), o)));
    }
}

TEST_CASE("interpolate: an empty batch or no channels give empty outputs and gradients") {
  for (const Shape& xs : {Shape{0, 3, 4, 5}, Shape{2, 0, 4, 5}})
    for (M mode : {M::Nearest, M::Bilinear, M::Bicubic, M::NearestExact, M::Area}) {
      CAPTURE(shape_str(xs));
      Tensor x = zeros(xs, kFloat32);
      x.requires_grad_();
      const Tensor y = interpolate(x, {.scale_factor = 2.0, .mode = mode});
      CHECK(y.sizes() == Shape{xs[0], xs[1], 8, 10});
      y.backward(zeros(y.sizes(), kFloat32));
      CHECK(x.grad().sizes() == xs);
      CHECK(ops::interpolate_backward(zeros({xs[0], xs[1], 3, 3}, kFloat32), xs, {.size = Int2{3, 3}}).sizes() == xs);
    }
}

TEST_CASE("interpolate: one thread and two give bit-identical values and gradients") {
  // Large enough that the kernels run on two threads (Note [Chunked parallel loops]).
  const Shape xs{4, 8, 33, 31};
  const Tensor x = random_tensor(xs, kFloat32, 11);
  for (const InterpolateOptions& o :
       {InterpolateOptions{.scale_factor = 1.7, .mode = M::Nearest},
        InterpolateOptions{.size = Int2{64, 50}, .mode = M::Bilinear, .align_corners = true},
        InterpolateOptions{.scale_factor = Scale2{0.6, 2.3}, .mode = M::Bilinear},
        InterpolateOptions{.scale_factor = Scale2{2.3, 0.6}, .mode = M::Bicubic},
        InterpolateOptions{.size = Int2{50, 64}, .mode = M::NearestExact}}) {
    CAPTURE(describe(o));
    const Tensor gy = random_tensor(ops::interpolate_output_shape(xs, o), kFloat32, 12);
    auto run = [&](int threads) {
      const int before = get_num_threads();
      set_num_threads(threads);
      const std::vector<uint8_t> y = bytes_of(ops::interpolate(x, o)),
                                 gx = bytes_of(ops::interpolate_backward(gy, xs, o));
      set_num_threads(before);
      return std::pair{y, gx};
    };
    const auto one = run(1), two = run(2);
    CHECK(one.first == two.first);
    CHECK(one.second == two.second);
  }
}

TEST_CASE("interpolate: errors name the op, the shapes, the dtypes and the settings") {
  const Tensor x = random_tensor({1, 2, 4, 4}, kFloat32, 1);
  check_error(
      [&] {
        ops::interpolate(random_tensor({4, 4}, kFloat32, 1), {.size = Int2{8, 8}});
      },
      {"interpolate", "3-D (N, C, L) or 4-D", "[4, 4]"});
  check_error(
      [&] {
        ops::interpolate(random_tensor({1, 1, 2, 4, 4}, kFloat32, 1), {.scale_factor = 2.0});
      },
      {"interpolate", "4-D", "[1, 1, 2, 4, 4]"});
  check_error(
      [&] {
        ops::interpolate(x, {.size = Int2{8, 8}, .scale_factor = 2.0});
      },
      {"interpolate", "exactly one of size and scale_factor", "size=(8, 8)", "scale_factor=2.0"});
  check_error([&] { ops::interpolate(x, {}); }, {"interpolate", "exactly one of size and scale_factor", "neither"});
  check_error([&] { ops::interpolate(x, {.size = Int2{0, 8}}); }, {"interpolate", "size must be positive", "(0, 8)"});
  check_error([&] { ops::interpolate(x, {.size = Int2{-1, 8}}); }, {"interpolate", "size must be positive"});
  check_error([&] { ops::interpolate(x, {.scale_factor = -2.0}); },
              {"interpolate", "scale_factor must be positive", "-2.0"});
  check_error([&] { ops::interpolate(x, {.scale_factor = 0.1}); },
              {"interpolate", "scale_factor 0.1", "output size of 0x0", "[1, 2, 4, 4]"});
  check_error(
      [&] {
        ops::interpolate(x, {.size = Int2{8, 8}, .mode = InterpolateMode(7)});
      },
      {"interpolate", "unknown mode"});
  check_error([] { interpolate_mode("trilinear"); },
              {"interpolate", "unknown mode 'trilinear'", "nearest", "linear", "bilinear", "bicubic", "nearest-exact",
               "area"});
  for (M mode : {M::Nearest, M::Bilinear, M::Bicubic, M::NearestExact, M::Area, M::Linear})
    CHECK(interpolate_mode(interpolate_mode_name(mode)) == mode);
  CHECK(interpolate_mode("nearest-exact") == M::NearestExact);
  for (M mode : {M::NearestExact, M::Area})
    check_error(
        [&] {
          ops::interpolate(x, {.size = Int2{8, 8}, .mode = mode, .align_corners = true});
        },
        {"interpolate", "align_corners", interpolate_mode_name(mode)});
  check_error(
      [&] {
        ops::interpolate(x, {.size = Int2{8, 8}, .align_corners = false});
      },
      {"interpolate", "align_corners", "nearest"});
  check_error(
      [&] {
        ops::interpolate(random_tensor({1, 2, 4, 4}, kInt64, 1), {.size = Int2{8, 8}});
      },
      {"interpolate", "floating-point", "int64[1, 2, 4, 4]"});
  check_error(
      [&] {
        ops::interpolate(zeros({1, 2, 0, 4}, kFloat32), {.size = Int2{8, 8}});
      },
      {"interpolate", "height and width", "[1, 2, 0, 4]"});
  check_error(
      [&] {
        ops::interpolate_backward(zeros({1, 2, 7, 8}, kFloat32), {1, 2, 4, 4}, {.size = Int2{8, 8}});
      },
      {"interpolate_backward", "float32[1, 2, 7, 8]", "[1, 2, 8, 8]"});
  check_error(
      [&] {
        ops::interpolate_backward(zeros({1, 2, 8, 8}, kInt32), {1, 2, 4, 4}, {.size = Int2{8, 8}});
      },
      {"interpolate_backward", "floating-point", "int32"});
}

TEST_CASE("nn: Upsample forwards interpolate, checks its options and prints like torch") {
  const Tensor x = random_tensor({2, 3, 5, 4}, kFloat32, 9);
  nn::Upsample up({.scale_factor = 2.0});
  check_close(up(x), values_of(ops::interpolate(x, {.scale_factor = 2.0})), 0, 0, "Upsample nearest");
  CHECK(up.extra_repr() == "scale_factor=2.0, mode='nearest'");
  CHECK(up.named_parameters().empty());
  nn::Upsample bl({.size = Int2{7, 9}, .mode = M::Bilinear, .align_corners = true});
  check_close(bl(x), values_of(ops::interpolate(x, {.size = Int2{7, 9}, .mode = M::Bilinear, .align_corners = true})),
              0, 0, "Upsample bilinear");
  CHECK(bl.extra_repr() == "size=(7, 9), mode='bilinear'");
  CHECK(nn::Upsample({.scale_factor = Scale2{1.5, 2.0}}).extra_repr() == "scale_factor=(1.5, 2.0), mode='nearest'");
  CHECK(nn::Upsample({.size = 4}).extra_repr() == "size=4, mode='nearest'");
  check_error([] { nn::Upsample(InterpolateOptions{}); }, {"Upsample", "exactly one of size and scale_factor"});
  check_error([] { nn::Upsample({.scale_factor = 2.0, .align_corners = true}); }, {"Upsample", "align_corners"});
  check_error([] { nn::Upsample({.size = Int2{0, 3}}); }, {"Upsample", "size must be positive"});
  check_error([] { nn::Upsample({.scale_factor = std::nan("")}); }, {"Upsample", "scale_factor must be positive"});
  nn::Upsample bc({.scale_factor = 2.0, .mode = M::Bicubic, .align_corners = true});
  check_close(bc(x),
              values_of(ops::interpolate(x, {.scale_factor = 2.0, .mode = M::Bicubic, .align_corners = true})), 0, 0,
              "Upsample bicubic");
  CHECK(bc.extra_repr() == "scale_factor=2.0, mode='bicubic'");
  CHECK(nn::Upsample({.size = 3, .mode = M::NearestExact}).extra_repr() == "size=3, mode='nearest-exact'");
}

// ---- 3-D (N, C, L) inputs: Note [1-D interpolation as 2-D] ----------------------------------

TEST_CASE("interpolate 1-D: the modes and sizes a 3-D input takes; Upsample on signals") {
  const Tensor s = random_tensor({2, 3, 5}, kFloat32, 3), image = random_tensor({2, 3, 4, 5}, kFloat32, 4);
  check_error([&] { ops::interpolate(s, {.scale_factor = 2.0, .mode = M::Bilinear}); },
              {"interpolate", "'bilinear' needs a 4-D input", "[2, 3, 5]", "'linear'"});
  check_error([&] { ops::interpolate(s, {.scale_factor = 2.0, .mode = M::Bicubic}); },
              {"interpolate", "'bicubic' needs a 4-D input"});
  check_error([&] { ops::interpolate(image, {.scale_factor = 2.0, .mode = M::Linear}); },
              {"interpolate", "'linear' needs a 3-D input", "[2, 3, 4, 5]", "'bilinear'"});
  check_error([&] { ops::interpolate(s, {.size = Int2{2, 7}}); }, {"interpolate", "one size", "(2, 7)"});
  check_error([&] { ops::interpolate(s, {.scale_factor = Scale2{1.0, 2.0}}); },
              {"interpolate", "one scale_factor", "(1.0, 2.0)"});
  check_error([&] { ops::interpolate(s, {.scale_factor = 0.1}); }, {"interpolate", "scale_factor 0.1", "[2, 3, 5]"});
  check_error([] { ops::interpolate(zeros({1, 2, 0}, kFloat32), {.size = 3}); }, {"interpolate", "length", "[1, 2, 0]"});
  check_error([&] { ops::interpolate_backward(zeros({2, 3, 9}), {2, 3, 5}, {.size = 10}); },
              {"interpolate_backward", "[2, 3, 9]", "[2, 3, 10]"});
  check_error([&] { ops::interpolate(s, {.size = 9, .mode = M::Nearest, .align_corners = true}); },
              {"interpolate", "align_corners", "nearest"});
  // Empty batches and channels.
  for (const Shape& xs : {Shape{0, 3, 4}, Shape{2, 0, 4}})
    for (M mode : {M::Nearest, M::Linear, M::NearestExact, M::Area}) {
      Tensor x = zeros(xs, kFloat32);
      x.requires_grad_();
      const Tensor y = interpolate(x, {.scale_factor = 2.0, .mode = mode});
      CHECK(y.sizes() == Shape{xs[0], xs[1], 8});
      y.backward(zeros(y.sizes(), kFloat32));
      CHECK(x.grad().sizes() == xs);
    }
  // nn::Upsample resizes signals as torch.nn.Upsample does.
  nn::Upsample up({.scale_factor = 2.0, .mode = M::Linear, .align_corners = true});
  check_close(up(s), values_of(ops::interpolate(s, {.scale_factor = 2.0, .mode = M::Linear, .align_corners = true})),
              0, 0, "Upsample linear");
  CHECK(up.extra_repr() == "scale_factor=2.0, mode='linear'");
  CHECK(nn::Upsample({.size = 9, .mode = M::Linear}).extra_repr() == "size=9, mode='linear'");
  // A channels-last-like signal (the batch's rows interleaved) gives the same values as its copy.
  const Tensor nlc = random_tensor({2, 5, 3}, kFloat32, 5).transpose(1, 2);
  for (M mode : {M::Nearest, M::Linear, M::NearestExact, M::Area}) {
    const Tensor y = ops::interpolate(nlc, {.size = 8, .mode = mode});
    CHECK(y.is_contiguous());
    CHECK(bytes_of(y) == bytes_of(ops::interpolate(nlc.contiguous(), {.size = 8, .mode = mode})));
  }
}
