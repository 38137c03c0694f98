// Pooling: max/avg/adaptive pooling against naive float64 loops (padding, dilation,
// ceil_mode, count_include_pad), their backward and gradcheck; max_pool2d's gradient from
// its input (ties, NaN, -inf, every layout); max_pool2d's saved input and transient bytes;
// errors; the MaxPool2d, AvgPool2d and AdaptiveAvgPool2d modules.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "autograd/gradcheck.h"
#include "autograd/ops/pool.h"
#include "autograd/ops/unary.h"
#include "memory/allocator.h"
#include "nn/pooling.h"
#include "tensor/memory_format.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/pool.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::gradcheck;

namespace {

constexpr DType kAllFloat[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

// ---- naive pooling references (independent of Note [Pooling windows]'s code) ----------

/// PyTorch's output size rule, written out: floor or ceil of (L + 2p - d(k-1) - 1) / s, plus one,
/// minus the last window when ceil_mode starts it at or past the end of the padded-left input.
int64_t out_size(int64_t L, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const double q = double(L + 2 * p - d * (k - 1) - 1) / double(s);
  int64_t o = int64_t(ceil_mode ? std::ceil(q) : std::floor(q)) + 1;
  if (ceil_mode && (o - 1) * s >= L + p) --o;
  return o;
}

struct PoolRef {
  Shape shape;
  std::vector<double> y, gx;
  std::vector<int64_t> idx;
};

/// No outputs yet: the output shape (xs with its last two sizes OH, OW) and gx zero, of xs's size.
PoolRef empty_ref(const Shape& xs, int64_t OH, int64_t OW) {
  PoolRef r;
  r.shape = xs;
  r.shape[xs.size() - 2] = OH, r.shape.back() = OW;
  r.gx.assign(size_t(numel_of(xs)), 0.0);
  return r;
}

/// Max pooling of x (P planes of H x W) by scanning each window; gx from gy if given.
PoolRef naive_max(const std::vector<double>& x, const Shape& xs, Int2 k, Int2 s, Int2 p, Int2 d, bool ceil_mode,
                  const std::vector<double>* gy = nullptr) {
  const int64_t H = xs[xs.size() - 2], W = xs.back(), P = numel_of(xs) / (H * W);
  const int64_t OH = out_size(H, k.h, s.h, p.h, d.h, ceil_mode), OW = out_size(W, k.w, s.w, p.w, d.w, ceil_mode);
  PoolRef r = empty_ref(xs, OH, OW);
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t arg = -1;
        for (int64_t i = 0; i < k.h; ++i)
          for (int64_t j = 0; j < k.w; ++j) {
            const int64_t ih = oh * s.h - p.h + i * d.h, iw = ow * s.w - p.w + j * d.w;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double v = x[size_t((pl * H + ih) * W + iw)];
            if (arg < 0 || v > best || std::isnan(v)) best = v, arg = ih * W + iw;
          }
        REQUIRE(arg >= 0);
        const size_t o = r.y.size();
        r.y.push_back(best);
        r.idx.push_back(arg);
        if (gy) r.gx[size_t(pl * H * W + arg)] += (*gy)[o];
      }
  return r;
}

/// Average pooling: the divisor counts the window's cells inside the padded input
/// (count_include_pad) or inside the input.
PoolRef naive_avg(const std::vector<double>& x, const Shape& xs, Int2 k, Int2 s, Int2 p, bool ceil_mode,
                  bool include_pad, const std::vector<double>* gy = nullptr) {
  const int64_t H = xs[xs.size() - 2], W = xs.back(), P = numel_of(xs) / (H * W);
  const int64_t OH = out_size(H, k.h, s.h, p.h, 1, ceil_mode), OW = out_size(W, k.w, s.w, p.w, 1, ceil_mode);
  PoolRef r = empty_ref(xs, OH, OW);
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double sum = 0;
        int64_t padded = 0, inside = 0;
        for (int64_t i = 0; i < k.h; ++i)
          for (int64_t j = 0; j < k.w; ++j) {
            const int64_t ih = oh * s.h - p.h + i, iw = ow * s.w - p.w + j;
            if (ih < H + p.h && iw < W + p.w) ++padded;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            ++inside;
            sum += x[size_t((pl * H + ih) * W + iw)];
          }
        const double div = double(include_pad ? padded : inside);
        const size_t o = r.y.size();
        r.y.push_back(sum / div);
        if (!gy) continue;
        for (int64_t i = 0; i < k.h; ++i)
          for (int64_t j = 0; j < k.w; ++j) {
            const int64_t ih = oh * s.h - p.h + i, iw = ow * s.w - p.w + j;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W) r.gx[size_t((pl * H + ih) * W + iw)] += (*gy)[o] / div;
          }
      }
  return r;
}

/// Adaptive average pooling: output o averages [floor(o L / O), ceil((o + 1) L / O)).
PoolRef naive_adaptive(const std::vector<double>& x, const Shape& xs, Int2 out,
                       const std::vector<double>* gy = nullptr) {
  const int64_t H = xs[xs.size() - 2], W = xs.back(), P = numel_of(xs) / (H * W);
  PoolRef r = empty_ref(xs, out.h, out.w);
  auto lo = [](int64_t o, int64_t L, int64_t O) { return int64_t(std::floor(double(o) * double(L) / double(O))); };
  auto hi = [](int64_t o, int64_t L, int64_t O) { return int64_t(std::ceil(double(o + 1) * double(L) / double(O))); };
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < out.h; ++oh)
      for (int64_t ow = 0; ow < out.w; ++ow) {
        double sum = 0;
        const int64_t h0 = lo(oh, H, out.h), h1 = hi(oh, H, out.h), w0 = lo(ow, W, out.w), w1 = hi(ow, W, out.w);
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) sum += x[size_t((pl * H + ih) * W + iw)];
        const double n = double((h1 - h0) * (w1 - w0));
        const size_t o = r.y.size();
        r.y.push_back(sum / n);
        if (gy)
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) r.gx[size_t((pl * H + ih) * W + iw)] += (*gy)[o] / n;
      }
  return r;
}

struct MaxCase {
  Shape x;
  Int2 k;
  MaxPool2dOptions o;
};
const MaxCase kMaxCases[] = {
    {{2, 3, 8, 8}, 2, {}},
    {{2, 3, 9, 7}, 3, {.stride = 2, .padding = 1}},                     // ResNet's stem pool, odd sizes
    {{1, 2, 7, 9}, {3, 2}, {.stride = {2, 3}, .padding = {1, 1}}},      // non-square
    {{2, 2, 9, 9}, 3, {.stride = 2, .padding = 1, .dilation = 2}},      // dilation
    {{2, 2, 5, 5}, 3, {.stride = 3, .padding = 1, .ceil_mode = true}},  // ceil drops a padding-only window
    {{1, 3, 6, 7}, 2, {.stride = 2, .ceil_mode = true}},                // ceil adds a partial window
    {{3, 6, 6}, {2, 3}, {.stride = 1}},                                 // unbatched, overlapping windows
    {{2, 3, 9, 8}, 3, {.stride = 1, .padding = 1, .dilation = 2}},      // 3x3/s1 dilated: 9 windows per pixel
    {{1, 2, 18, 17}, 16, {.stride = 2}},  // 256 positions: more than a byte-sized argmax holds
    // Note [CPU max-pool fast paths]: windows inside the plane, with the kernel fixed at
    // compile time (2x2 above, 3x3 here) or not (dilated), disjoint or overlapping.
    {{2, 3, 9, 10}, 3, {.stride = 3}},
    {{2, 3, 8, 9}, 3, {.stride = 2}},                 // 3x3 stride 2: overlapping, no padding
    {{2, 2, 9, 9}, 2, {.stride = 3, .dilation = 2}},  // dilated, disjoint
    {{2, 3, 9, 7}, 2, {}},                            // 2x2 stride 2, odd sizes: a last row and column no window covers
    {{4, 16, 28, 28}, 2, {}},                         // the Fashion-MNIST CNN's pool: planes in parallel chunks
};

/// Few distinct values, so windows tie, with some -inf and NaN: the argmax's corner cases
/// (all exact in every floating dtype).
std::vector<double> tied_values(int64_t n, uint64_t seed) {
  std::vector<double> v = random_values(n, seed, 0, 1);
  for (double& x : v)
    x = x < 0.03   ? std::numeric_limits<double>::quiet_NaN()
        : x < 0.15 ? -std::numeric_limits<double>::infinity()
                   : std::floor(x * 4) - 2;
  return v;
}

struct AvgCase {
  Shape x;
  Int2 k;
  AvgPool2dOptions o;
};
const AvgCase kAvgCases[] = {
    {{2, 3, 8, 8}, 2, {}},
    {{2, 2, 7, 6}, 3, {.stride = 2, .padding = 1}},
    {{2, 2, 7, 6}, 3, {.stride = 2, .padding = 1, .count_include_pad = false}},
    {{1, 2, 7, 8}, {3, 2}, {.stride = {2, 3}, .padding = {1, 1}, .ceil_mode = true}},
    {{1, 2, 5, 5}, 3, {.stride = 3, .padding = 1, .ceil_mode = true, .count_include_pad = false}},
    {{1, 2, 6, 7}, 4, {.stride = 3, .padding = 2, .ceil_mode = true}},  // the last window is clipped at H + pad
    {{3, 5, 5}, 2, {.stride = 1}},
};

/// body(c, t, x) for every case c in every dtype t and layout, x a random input of c.x in that
/// dtype and layout from the next seed; the case, dtype and layout are captured for failures.
template <typename Case, size_t N, typename Body>
void for_each_input(const Case (&cases)[N], uint64_t& seed, Body&& body) {
  for (const Case& c : cases)
    for (DType t : kAllFloat)
      for (Layout layout : kAllLayouts) {
        CAPTURE(shape_str(c.x));
        CAPTURE(c.k.str());
        CAPTURE(dtype_name(t));
        CAPTURE(layout_name(layout));
        body(c, t, random_tensor(c.x, t, ++seed, layout));
      }
}

}  // namespace

TEST_CASE("pool: output sizes follow PyTorch's rule, ceil_mode included") {
  CHECK(out_size(5, 3, 3, 1, 1, true) == 2);  // a third window would start in the right padding
  CHECK(out_size(6, 2, 2, 0, 1, true) == 3);
  CHECK(out_size(7, 2, 2, 0, 1, true) == 4);  // a partial last window
  CHECK(out_size(7, 2, 2, 0, 1, false) == 3);
  CHECK(out_size(112, 3, 2, 1, 1, false) == 56);  // ResNet
  CHECK(ops::max_pool2d(zeros({1, 1, 5, 5}), 3, {.stride = 3, .padding = 1, .ceil_mode = true}).out.sizes() ==
        Shape{1, 1, 2, 2});
  CHECK(ops::max_pool2d(zeros({1, 1, 7, 7}), 2, {.ceil_mode = true}).out.sizes() == Shape{1, 1, 4, 4});
  CHECK(ops::avg_pool2d(zeros({1, 1, 7, 7}), 2).sizes() == Shape{1, 1, 3, 3});
}

TEST_CASE("pool: max_pool2d values and argmax indices match a naive scan in every dtype and layout") {
  uint64_t seed = 1;
  for_each_input(kMaxCases, seed, [](const MaxCase& c, DType t, const Tensor& x) {
    const ops::MaxPool2dResult r = ops::max_pool2d(x, c.k, c.o);
    const PoolRef ref =
        naive_max(values_of(x), c.x, c.k, pool_stride(c.o.stride, c.k), c.o.padding, c.o.dilation, c.o.ceil_mode);
    REQUIRE(r.out.sizes() == ref.shape);
    CHECK(r.out.dtype() == t);
    CHECK(r.indices.dtype() == kInt64);
    check_close(r.out, ref.y, 0, 0, "max values");  // a max is exact
    CHECK(r.indices.tolist<int64_t>() == ref.idx);
  });
}

TEST_CASE("pool: max_pool2d lets NaN win, takes the first of equal maxima, ignores -inf padding") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Tensor x = make_tensor({1, nan, 3, 3, -inf, -inf, 2, 5, 5}, {1, 1, 3, 3}, kFloat32);
  const ops::MaxPool2dResult r = ops::max_pool2d(x, 2, {.stride = 1});
  const std::vector<double> v = values_of(r.out);
  CHECK(std::isnan(v[0]));
  CHECK(r.indices.tolist<int64_t>() == std::vector<int64_t>{1, 1, 7, 7});
  CHECK(v[1] != v[1]);
  CHECK(v[2] == 5);
  const Tensor all_neg_inf = full({1, 1, 2, 2}, -inf);
  const ops::MaxPool2dResult r2 = ops::max_pool2d(all_neg_inf, 3, {.stride = 1, .padding = 1});
  CHECK(r2.indices.tolist<int64_t>() == std::vector<int64_t>{0, 0, 0, 0});  // the first cell in each window
}

TEST_CASE("pool: avg_pool2d matches a naive mean with either divisor, in every dtype and layout") {
  uint64_t seed = 100;
  for_each_input(kAvgCases, seed, [](const AvgCase& c, DType t, const Tensor& x) {
    const Tensor y = ops::avg_pool2d(x, c.k, c.o);
    const PoolRef ref = naive_avg(values_of(x), c.x, c.k, pool_stride(c.o.stride, c.k), c.o.padding, c.o.ceil_mode,
                                  c.o.count_include_pad);
    REQUIRE(y.sizes() == ref.shape);
    check_close(y, ref.y, default_rtol(t), default_rtol(t), "avg");
  });
}

TEST_CASE("pool: adaptive_avg_pool2d matches naive windows, shrinking and growing") {
  uint64_t seed = 200;
  const std::pair<Shape, Int2> cases[] = {{{2, 3, 7, 7}, 1},      {{2, 3, 7, 7}, {3, 2}}, {{1, 2, 10, 9}, {4, 5}},
                                          {{1, 2, 3, 4}, {5, 7}}, {{3, 8, 8}, 4},         {{2, 4, 13, 11}, {6, 6}},
                                          {{2, 64, 7, 7}, {1, 1}}};
  for (const auto& [xs, out] : cases)
    for (DType t : kAllFloat)
      for (Layout layout : kAllLayouts) {
        CAPTURE(shape_str(xs));
        CAPTURE(out.str());
        CAPTURE(dtype_name(t));
        const Tensor x = random_tensor(xs, t, ++seed, layout);
        const Tensor y = ops::adaptive_avg_pool2d(x, out);
        const PoolRef ref = naive_adaptive(values_of(x), xs, out);
        REQUIRE(y.sizes() == ref.shape);
        check_close(y, ref.y, default_rtol(t), default_rtol(t), "adaptive");
      }
}

TEST_CASE("pool: backward kernels match the naive routing of each gradient") {
  uint64_t seed = 300;
  for (DType t : kAllFloat) {
    CAPTURE(dtype_name(t));
    const double tol = 2 * default_rtol(t);
    for (const MaxCase& c : kMaxCases) {
      CAPTURE(shape_str(c.x));
      const Tensor x = random_tensor(c.x, t, ++seed);
      const ops::MaxPool2dResult r = ops::max_pool2d(x, c.k, c.o);
      const Tensor gy = random_tensor(r.out.sizes(), t, ++seed, Layout::Transposed);
      const std::vector<double> gyv = values_of(gy);
      const PoolRef ref = naive_max(values_of(x), c.x, c.k, pool_stride(c.o.stride, c.k), c.o.padding, c.o.dilation,
                                    c.o.ceil_mode, &gyv);
      const Tensor gx = ops::max_pool2d_backward(gy, r.indices, c.x, c.k, c.o);
      CHECK(gx.sizes() == c.x);
      check_close(gx, ref.gx, tol, tol, "max backward");
    }
    for (const AvgCase& c : kAvgCases) {
      CAPTURE(shape_str(c.x));
      const Tensor x = random_tensor(c.x, t, ++seed);
      const Tensor gy = random_tensor(ops::avg_pool2d(x, c.k, c.o).sizes(), t, ++seed, Layout::Strided);
      const std::vector<double> gyv = values_of(gy);
      const PoolRef ref = naive_avg(values_of(x), c.x, c.k, pool_stride(c.o.stride, c.k), c.o.padding, c.o.ceil_mode,
                                    c.o.count_include_pad, &gyv);
      check_close(ops::avg_pool2d_backward(gy, c.x, c.k, c.o), ref.gx, tol, tol, "avg backward");
    }
    for (const auto& [xs, out] : {std::pair<Shape, Int2>{{2, 3, 7, 7}, {3, 2}}, {{1, 2, 3, 4}, {5, 7}}}) {
      const Tensor x = random_tensor(xs, t, ++seed);
      const Tensor gy = random_tensor(ops::adaptive_avg_pool2d(x, out).sizes(), t, ++seed);
      const std::vector<double> gyv = values_of(gy);
      const PoolRef ref = naive_adaptive(values_of(x), xs, out, &gyv);
      check_close(ops::adaptive_avg_pool2d_backward(gy, xs), ref.gx, tol, tol, "adaptive backward");
    }
  }
}

TEST_CASE("pool: max_pool2d's gradient from its input routes like the naive scan: ties, NaN, -inf, every layout") {
  // max_pool2d_values and max_pool2d_backward_from_input (Note [Window-local max-pool
  // indices]) against float64 loops, and against the public int64 indices' routing bit
  // for bit, on contiguous, transposed, strided and channels-last inputs.
  uint64_t seed = 500;
  for (const MaxCase& c : kMaxCases)
    for (DType t : kAllFloat)
      for (bool tied : {false, true})
        for (int layout = 0; layout < 4; ++layout) {
          const bool nhwc = layout == 3;
          if (nhwc && c.x.size() != 4) continue;
          CAPTURE(shape_str(c.x));
          CAPTURE(c.k.str());
          CAPTURE(dtype_name(t));
          CAPTURE(tied);
          CAPTURE(nhwc ? "channels-last" : layout_name(kAllLayouts[layout]));
          const int64_t n = numel_of(c.x);
          Tensor x = make_tensor(tied ? tied_values(n, ++seed) : random_values(n, ++seed), c.x, t,
                                 nhwc ? Layout::Contiguous : kAllLayouts[layout]);
          if (nhwc) x = to_channels_last(x);
          const Tensor y = ops::max_pool2d_values(x, c.k, c.o);
          const Tensor gy = random_tensor(y.sizes(), t, ++seed, Layout::Transposed);
          const std::vector<double> gyv = values_of(gy);
          const PoolRef ref = naive_max(values_of(x), c.x, c.k, pool_stride(c.o.stride, c.k), c.o.padding, c.o.dilation,
                                        c.o.ceil_mode, &gyv);
          REQUIRE(y.sizes() == ref.shape);
          check_close(y, ref.y, 0, 0, "max values");
          if (nhwc) CHECK(is_channels_last(y));
          const Tensor gx = ops::max_pool2d_backward_from_input(gy, x, c.k, c.o);
          REQUIRE(gx.sizes() == c.x);
          const double tol = 2 * default_rtol(t);
          check_close(gx, ref.gx, tol, tol, "max backward from the input");
          const ops::MaxPool2dResult r = ops::max_pool2d(x, c.k, c.o);
          CHECK(r.indices.tolist<int64_t>() == ref.idx);
          CHECK(values_of(gx) == values_of(ops::max_pool2d_backward(gy, r.indices, c.x, c.k, c.o)));
        }
}

TEST_CASE("pool: max_pool2d after relu saves no bytes of its own and recomputes its argmax in backward") {
  // Note [Max-pool backward from the input]: the node keeps relu's output, which relu keeps anyway.
  const MaxPool2dOptions opts{.stride = 2, .padding = 1};
  Tensor x = random_tensor({4, 8, 16, 16}, kFloat32, 450);
  x.requires_grad_();
  auto allocated = [] { return memory::stats(kCPU).allocated_bytes.current; };
  auto allocation = [&](const Tensor& t) {  // bytes the allocator takes for t's data (rounding included)
    const int64_t before = allocated();
    DataPtr p = memory::allocate(kCPU, size_t(t.numel()) * t.element_size());
    return allocated() - before;
  };
  auto peak = [] { return memory::stats(kCPU).allocated_bytes.peak; };
  memory::reset_peak(kCPU);
  const int64_t before = allocated();
  Tensor h = relu(x);
  Tensor y = max_pool2d(h, 3, opts);
  const int64_t grown = allocated() - before, forward_peak = peak() - before;
  CHECK(grown == allocation(h) + allocation(y));  // no int64 indices (8 bytes per output element)
  CHECK(forward_peak == grown);                   // not even while the forward runs: it computes none

  // grad_x = relu's mask * max_pool2d_backward(g) with the forward's argmax.
  const Tensor g = random_tensor(y.sizes(), kFloat32, 451);
  const ops::MaxPool2dResult fwd = ops::max_pool2d(h.detach(), 3, opts);
  CHECK(values_of(fwd.out) == values_of(y));
  const std::vector<double> routed = values_of(ops::max_pool2d_backward(g, fwd.indices, h.sizes(), 3, opts));
  const std::vector<double> hv = values_of(h);
  std::vector<double> expected(routed.size());
  for (size_t i = 0; i < routed.size(); ++i) expected[i] = hv[i] > 0 ? routed[i] : 0.0;
  y.backward(g);
  check_close(x.grad(), expected, 0.0, 0.0, "grad_x");

  // The CPU finds each argmax and routes its gradient in one pass per plane: the backward
  // allocates grad_x and no index buffer.
  memory::reset_peak(kCPU);
  const int64_t at = allocated();
  const Tensor gx = ops::max_pool2d_backward_from_input(g, h.detach(), 3, opts);
  const int64_t backward_peak = peak() - at;
  CHECK(backward_peak == allocation(gx));
  CHECK(values_of(gx) == routed);

  // An in-place write to the pool's input before backward is caught by the saved input's version.
  Tensor h2 = relu(x);
  Tensor y2 = max_pool2d(h2, 3, opts);
  ops::add_(h2.detach(), 1.0);  // the same storage, so the same version counter
  check_error([&] { y2.backward(g); }, {"MaxPool2dBackward", "modified by an in-place", "version"});
}

TEST_CASE("pool: errors name the op, the shapes and the settings") {
  const Tensor x = zeros({2, 3, 8, 8});
  check_error([&] { ops::max_pool2d(x, 2, {.padding = 2}); }, {"max_pool2d", "padding (2, 2)", "half the kernel"});
  check_error([&] { ops::avg_pool2d(x, 3, {.padding = 2}); }, {"avg_pool2d", "padding (2, 2)", "kernel (3, 3)"});
  check_error([&] { ops::max_pool2d(zeros({1, 1, 2, 2}), 3); }, {"max_pool2d", "[1, 1, 2, 2]", "too small"});
  check_error([&] { ops::max_pool2d(zeros({8, 8}), 2); }, {"max_pool2d", "3-D", "4-D", "[8, 8]"});
  check_error([&] { ops::avg_pool2d(x, 2, {.stride = {0, 1}}); }, {"avg_pool2d", "stride", "(0, 1)"});
  check_error([&] { ops::max_pool2d(x, 2, {.stride = -1}); }, {"max_pool2d", "stride", "(-1, -1)"});
  check_error([&] { ops::max_pool2d(x, {0, 2}); }, {"max_pool2d", "kernel size", "(0, 2)"});
  check_error([&] { ops::max_pool2d(x, 2, {.dilation = 0}); }, {"max_pool2d", "dilation"});
  check_error([&] { ops::max_pool2d(zeros({2, 3, 8, 8}, kInt32), 2); }, {"max_pool2d", "floating-point", "int32"});
  check_error([&] { ops::adaptive_avg_pool2d(x, {0, 1}); }, {"adaptive_avg_pool2d", "output size", "(0, 1)"});
  check_error([&] { ops::adaptive_avg_pool2d(zeros({2, 3, 0, 4}), 1); }, {"adaptive_avg_pool2d", "non-zero"});
  const ops::MaxPool2dResult r = ops::max_pool2d(x, 2);
  check_error([&] { ops::max_pool2d_backward(r.out, r.indices.to(kInt32), x.sizes(), 2); },
              {"max_pool2d_backward", "int64", "[2, 3, 4, 4]"});
  check_error(
      [&] {
        ops::max_pool2d_backward(zeros({2, 3, 3, 3}), r.indices, x.sizes(), 2);
      },
      {"max_pool2d_backward", "grad_out", "[2, 3, 4, 4]"});
  check_error(
      [&] {
        ops::avg_pool2d_backward(zeros({2, 3, 3, 3}), x.sizes(), 2);
      },
      {"avg_pool2d_backward", "[2, 3, 4, 4]"});
  check_error(
      [&] {
        ops::max_pool2d_backward_from_input(zeros({2, 3, 4, 4}, kFloat64), x, 2);
      },
      {"max_pool2d_backward", "float64[2, 3, 4, 4]", "float32[2, 3, 8, 8]", "same dtype"});
  check_error(
      [&] {
        ops::max_pool2d_backward_from_input(zeros({2, 3, 3, 3}), x, 2);
      },
      {"max_pool2d_backward", "grad_out", "[2, 3, 4, 4]"});
  check_error(
      [&] {
        ops::max_pool2d_backward_from_input(zeros({2, 3, 4, 4}), x.to(kInt32), 2);
      },
      {"max_pool2d_backward", "floating-point", "int32"});
  // Empty batches pool to empty outputs.
  CHECK(ops::max_pool2d(zeros({0, 3, 8, 8}), 2).out.sizes() == Shape{0, 3, 4, 4});
  CHECK(ops::max_pool2d_values(zeros({0, 3, 9, 9}), 3, {.stride = 2, .padding = 1}).sizes() == Shape{0, 3, 5, 5});
  CHECK(ops::max_pool2d_backward_from_input(zeros({0, 3, 5, 5}), zeros({0, 3, 9, 9}), 3, {.stride = 2, .padding = 1})
            .sizes() == Shape{0, 3, 9, 9});
  {
    Tensor e = to_channels_last(zeros({0, 8, 9, 9}));
    e.requires_grad_();
    Tensor ye = max_pool2d(e, 3, {.stride = 2, .padding = 1});
    CHECK(ye.sizes() == Shape{0, 8, 5, 5});
    ye.backward(zeros({0, 8, 5, 5}));
    CHECK(e.grad().sizes() == Shape{0, 8, 9, 9});
  }
  CHECK(ops::adaptive_avg_pool2d(zeros({0, 3, 8, 8}), 2).sizes() == Shape{0, 3, 2, 2});
}

TEST_CASE("nn: pooling modules forward the functional ops and print like torch") {
  const Tensor x = random_tensor({2, 3, 9, 9}, kFloat32, 9);
  nn::MaxPool2d mp(3, {.stride = 2, .padding = 1});
  check_close(mp(x), values_of(ops::max_pool2d(x, 3, {.stride = 2, .padding = 1}).out), 0, 0, "MaxPool2d");
  CHECK(mp.extra_repr() == "kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=false");
  CHECK(mp.named_parameters().empty());
  nn::AvgPool2d ap({2, 3}, {.ceil_mode = true, .count_include_pad = false});
  check_close(ap(x), values_of(ops::avg_pool2d(x, {2, 3}, {.ceil_mode = true, .count_include_pad = false})), 0, 0,
              "AvgPool2d");
  CHECK(ap.extra_repr() == "kernel_size=(2, 3), stride=(2, 3), padding=0, ceil_mode=true, count_include_pad=false");
  nn::AdaptiveAvgPool2d gap({1, 1});
  CHECK(gap(x).sizes() == Shape{2, 3, 1, 1});
  CHECK(gap.extra_repr() == "output_size=(1, 1)");
  check_error([] { nn::MaxPool2d(0); }, {"MaxPool2d", "kernel_size"});
}

TEST_CASE("pool: a max_pool2d window entirely in the padding gives -inf and index -1, and routes no gradient") {
  // Only dilation can leave a window with no input pixel: on H = 2 a kernel of 2 rows
  // dilated by 3 with padding 2 reads rows (-2, 1), (-1, 2), (0, 3). The middle window
  // used to give 0 (padding counts as -inf) and index -1, which the backward rejected.
  const Tensor x = make_tensor({1, 2}, {1, 1, 2, 1}, kFloat32);
  const MaxPool2dOptions o{.stride = 1, .padding = {2, 0}, .dilation = {3, 1}};
  const ops::MaxPool2dResult r = ops::max_pool2d(x, {2, 1}, o);
  const std::vector<double> v = values_of(r.out);
  REQUIRE(v.size() == 3);
  CHECK(v[0] == 2);
  CHECK((std::isinf(v[1]) && v[1] < 0));
  CHECK(v[2] == 1);
  CHECK(r.indices.tolist<int64_t>() == std::vector<int64_t>{1, -1, 0});
  const Tensor gx =
      ops::max_pool2d_backward(make_tensor({10, 20, 30}, {1, 1, 3, 1}, kFloat32), r.indices, x.sizes(), {2, 1}, o);
  CHECK(values_of(gx) == std::vector<double>{30, 10});
  CHECK(values_of(ops::max_pool2d_values(x, {2, 1}, o)) == v);
  CHECK(values_of(ops::max_pool2d_backward_from_input(make_tensor({10, 20, 30}, {1, 1, 3, 1}, kFloat32), x, {2, 1},
                                                      o)) == std::vector<double>{30, 10});
  check_error(
      [&] {
        ops::max_pool2d_backward(ones({1, 1, 3, 1}), full({1, 1, 3, 1}, -2, kInt64), x.sizes(), {2, 1}, o);
      },
      {"max_pool2d_backward", "index -2"});
}
