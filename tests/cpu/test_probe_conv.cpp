// Probes for silent wrong answers in convolution and pooling on the CPU: conv2d over the
// whole grid of stride x padding x dilation x groups x bias (asymmetric settings, padding
// larger than the kernel, depthwise with a channel multiplier), 1x1 and larger-than-input
// kernels, odd and size-1 sizes, size-0 batches, channels-last and transposed views, 16-bit
// inputs that only a float32 accumulation gets right; max_pool2d's torch contract (first
// maximum takes the gradient, NaN wins, -inf padding, dilation, ceil_mode's last-window rule),
// avg_pool2d's divisors (count_include_pad, ceil_mode windows over the padded edge),
// adaptive_avg_pool2d's bins; bn_relu_conv2d / conv2d_stats and LowRankConv2d against
// float64 compositions. Every expectation is a float64 loop written here, a closed form, or
// torch's documented rule (named where used); gradients go through autograd and are compared
// with the loops' scatter of every product, or with central differences in float64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/ops/all.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/conv_bn.h"
#include "autograd/ops/pool.h"
#include "nn/channels_last.h"
#include "nn/conv.h"
#include "nn/low_rank_conv.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/pool.h"
#include "tensor/random.h"
#include "tests/cpu/conv_reference.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

/// The ways users hand a 4-D input to an op: contiguous, a channels-last permute of an
/// (N, H, W, C) buffer, the transpose of an (N, C, W, H) buffer.
enum class View { Contiguous, ChannelsLast, Transposed };
const char* view_name(View v) {
  return v == View::Contiguous ? "contiguous" : v == View::ChannelsLast ? "channels-last" : "H/W transposed";
}
constexpr View kViews[] = {View::Contiguous, View::ChannelsLast, View::Transposed};

/// A float64 leaf (requires grad) laid out as `v`, and the (N, C, H, W) view of it the op sees.
struct ViewedLeaf {
  Tensor leaf, x;
  View v;
  /// The leaf's gradient in the view's (N, C, H, W) order.
  std::vector<double> grad() const {
    REQUIRE(leaf.grad().defined());
    if (v == View::ChannelsLast) return values_of(leaf.grad().permute({0, 3, 1, 2}));
    if (v == View::Transposed) return values_of(leaf.grad().transpose(2, 3));
    return values_of(leaf.grad());
  }
};

ViewedLeaf viewed_leaf(const Shape& s, View v, uint64_t seed, DType dt = kFloat64) {
  ViewedLeaf r;
  r.v = v;
  if (v == View::ChannelsLast) {
    r.leaf = random_tensor({s[0], s[2], s[3], s[1]}, dt, seed);
    r.leaf.requires_grad_();
    r.x = r.leaf.permute({0, 3, 1, 2});
  } else if (v == View::Transposed) {
    r.leaf = random_tensor({s[0], s[1], s[3], s[2]}, dt, seed);
    r.leaf.requires_grad_();
    r.x = r.leaf.transpose(2, 3);
  } else {
    r.leaf = random_tensor(s, dt, seed);
    r.leaf.requires_grad_();
    r.x = r.leaf;
  }
  return r;
}

std::string conv_name(const Shape& xs, const Shape& ws, const Conv2dOptions& o, bool bias) {
  return detail::str_cat("x", shape_str(xs), " w", shape_str(ws), " stride", o.stride.str(), " pad", o.padding.str(),
                         " dil", o.dilation.str(), " groups ", o.groups, bias ? " bias" : "");
}

/// Runs conv2d through autograd on a viewed float64 input and checks y, grad_x, grad_w and
/// grad_bias against conv_ref.
void check_conv_autograd(const Shape& xs, const Shape& ws, const Conv2dOptions& o, bool with_bias, View v,
                         uint64_t seed) {
  CAPTURE(conv_name(xs, ws, o, with_bias));
  CAPTURE(view_name(v));
  const ViewedLeaf x = viewed_leaf(xs, v, seed);
  const Tensor w = leaf(ws, seed + 1);
  const Tensor b = with_bias ? leaf({ws[0]}, seed + 2) : Tensor();
  const Shape ys{xs[0], ws[0], conv_out(xs[2], ws[2], o.stride.h, o.padding.h, o.dilation.h),
                 conv_out(xs[3], ws[3], o.stride.w, o.padding.w, o.dilation.w)};
  const Tensor gy = random_tensor(ys, kFloat64, seed + 3, Layout::Transposed);
  const std::vector<double> gyv = values_of(gy), bv = with_bias ? values_of(b) : std::vector<double>();
  const ConvRef ref = conv_ref(values_of(x.x), xs, values_of(w), ws, with_bias ? &bv : nullptr, o, &gyv);
  const Tensor y = conv2d(x.x, w, b, o);
  REQUIRE(y.sizes() == ref.ys);
  check_close(y, ref.y, 1e-12, 1e-12, "y");
  y.backward(gy);
  check_close(x.grad(), ref.gx, 1e-12, 1e-12, "grad_x");
  REQUIRE(w.grad().defined());
  check_close(w.grad(), ref.gw, 1e-12, 1e-12, "grad_w");
  if (with_bias) {
    REQUIRE(b.grad().defined());
    check_close(b.grad(), ref.gb, 1e-12, 1e-12, "grad_bias");
  }
}

// ---- float64 pooling references (torch's CPU kernels, written out) -------------------------

/// torch's pooling_output_shape: div_rtn(L + 2p - d(k-1) - 1 + (ceil ? s-1 : 0), s) + 1, and
/// with ceil_mode "the last pooling starts inside the image": --out when (out-1) s >= L + p.
int64_t pool_out(int64_t L, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const double num = double(L + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0));
  int64_t out = int64_t(std::floor(num / double(s))) + 1;
  if (ceil_mode && (out - 1) * s >= L + p) --out;
  return out;
}

struct PoolRef {
  int64_t OH = 0, OW = 0;
  std::vector<double> y, gx;
  std::vector<int64_t> idx;  // max pooling: the flat index ih * W + iw in the plane
};

/// torch's max_pool2d (aten/src/ATen/native/cpu/MaxPoolKernel.cpp): per window maxval = -inf,
/// maxindex = its first in-bounds pixel, then `if (val > maxval || isnan(val))` take it, in
/// window order. The gradient goes to maxindex. x: P planes of H x W.
PoolRef max_pool_ref(const std::vector<double>& x, int64_t P, int64_t H, int64_t W, Int2 k, Int2 s, Int2 p, Int2 d,
                     bool ceil_mode, const std::vector<double>* gy = nullptr) {
  PoolRef r;
  r.OH = pool_out(H, k.h, s.h, p.h, d.h, ceil_mode), r.OW = pool_out(W, k.w, s.w, p.w, d.w, ceil_mode);
  r.gx.assign(x.size(), 0.0);
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < r.OH; ++oh)
      for (int64_t ow = 0; ow < r.OW; ++ow) {
        int64_t ih0 = oh * s.h - p.h, iw0 = ow * s.w - p.w;
        const int64_t ih1 = std::min(ih0 + (k.h - 1) * d.h + 1, H), iw1 = std::min(iw0 + (k.w - 1) * d.w + 1, W);
        while (ih0 < 0) ih0 += d.h;
        while (iw0 < 0) iw0 += d.w;
        if (ih0 >= H || iw0 >= W) FAIL("a window with no input pixel");  // the probes keep torch's pad <= k / 2
        double maxval = -kInf;
        int64_t maxindex = ih0 * W + iw0;
        for (int64_t ih = ih0; ih < ih1; ih += d.h)
          for (int64_t iw = iw0; iw < iw1; iw += d.w) {
            const double v = x[size_t(pl * H * W + ih * W + iw)];
            if (v > maxval || std::isnan(v)) maxval = v, maxindex = ih * W + iw;
          }
        const size_t o = r.y.size();
        r.y.push_back(maxval);
        r.idx.push_back(maxindex);
        if (gy) r.gx[size_t(pl * H * W + maxindex)] += (*gy)[o];
      }
  return r;
}

/// Appends sum(x[plane + ih * W + iw] over rows [h.first, h.second) x columns [w.first,
/// w.second)) / div to r.y; with gy, scatters that output's gradient / div back over the window.
void average_window(const std::vector<double>& x, int64_t plane, int64_t W, std::pair<int64_t, int64_t> h,
                    std::pair<int64_t, int64_t> w, double div, const std::vector<double>* gy, PoolRef& r) {
  double sum = 0;
  for (int64_t ih = h.first; ih < h.second; ++ih)
    for (int64_t iw = w.first; iw < w.second; ++iw) sum += x[size_t(plane + ih * W + iw)];
  const size_t o = r.y.size();
  r.y.push_back(sum / div);
  if (gy)
    for (int64_t ih = h.first; ih < h.second; ++ih)
      for (int64_t iw = w.first; iw < w.second; ++iw) r.gx[size_t(plane + ih * W + iw)] += (*gy)[o] / div;
}

/// torch's avg_pool2d (aten/src/ATen/native/cpu/AvgPoolKernel.cpp): hend = min(hstart + k, H + p),
/// pool_size = (hend - hstart)(wend - wstart) before clipping to the input, then the divisor is
/// pool_size (count_include_pad) or the clipped window's size.
PoolRef avg_pool_ref(const std::vector<double>& x, int64_t P, int64_t H, int64_t W, Int2 k, Int2 s, Int2 p,
                     bool ceil_mode, bool include_pad, const std::vector<double>* gy = nullptr) {
  PoolRef r;
  r.OH = pool_out(H, k.h, s.h, p.h, 1, ceil_mode), r.OW = pool_out(W, k.w, s.w, p.w, 1, ceil_mode);
  r.gx.assign(x.size(), 0.0);
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < r.OH; ++oh)
      for (int64_t ow = 0; ow < r.OW; ++ow) {
        int64_t hs = oh * s.h - p.h, ws = ow * s.w - p.w;
        int64_t he = std::min(hs + k.h, H + p.h), we = std::min(ws + k.w, W + p.w);
        const int64_t pool_size = (he - hs) * (we - ws);
        hs = std::max<int64_t>(hs, 0), ws = std::max<int64_t>(ws, 0);
        he = std::min(he, H), we = std::min(we, W);
        const double div = double(include_pad ? pool_size : (he - hs) * (we - ws));
        average_window(x, pl * H * W, W, {hs, he}, {ws, we}, div, gy, r);
      }
  return r;
}

/// torch's adaptive_avg_pool2d: output o of O averages [floor(o L / O), ceil((o + 1) L / O)).
PoolRef adaptive_ref(const std::vector<double>& x, int64_t P, int64_t H, int64_t W, Int2 out,
                     const std::vector<double>* gy = nullptr) {
  PoolRef r;
  r.OH = out.h, r.OW = out.w;
  r.gx.assign(x.size(), 0.0);
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < out.h; ++oh)
      for (int64_t ow = 0; ow < out.w; ++ow) {
        const int64_t h0 = int64_t(std::floor(double(oh * H) / double(out.h)));
        const int64_t h1 = int64_t(std::ceil(double((oh + 1) * H) / double(out.h)));
        const int64_t w0 = int64_t(std::floor(double(ow * W) / double(out.w)));
        const int64_t w1 = int64_t(std::ceil(double((ow + 1) * W) / double(out.w)));
        average_window(x, pl * H * W, W, {h0, h1}, {w0, w1}, double((h1 - h0) * (w1 - w0)), gy, r);
      }
  return r;
}

/// Small integers in [-2, 2]: many ties in every window, and sums that every dtype holds exactly.
std::vector<double> small_ints(int64_t n, uint64_t seed) {
  std::vector<double> v = random_values(n, seed, -2.0, 3.0);
  for (double& e : v) e = std::floor(e);
  return v;
}

/// A leaf of `s` (N, C, H, W) holding `values` (in (N, C, H, W) order) laid out as `v`.
ViewedLeaf leaf_of(const std::vector<double>& values, const Shape& s, View v, DType dt) {
  const Tensor logical = make_tensor(values, s, kFloat64);
  ViewedLeaf r;
  r.v = v;
  if (v == View::ChannelsLast) {
    r.leaf = logical.permute({0, 2, 3, 1}).contiguous().to(dt);
    r.leaf.requires_grad_();
    r.x = r.leaf.permute({0, 3, 1, 2});
  } else if (v == View::Transposed) {
    r.leaf = logical.transpose(2, 3).contiguous().to(dt);
    r.leaf.requires_grad_();
    r.x = r.leaf.transpose(2, 3);
  } else {
    r.leaf = logical.to(dt);
    r.leaf.requires_grad_();
    r.x = r.leaf;
  }
  return r;
}

// ---- batch norm + ReLU + conv in float64 ------------------------------------------------------

/// relu(batch_norm(y)) per channel of y (N, C, H, W): training normalizes with the batch mean and
/// the biased variance (torch.nn.BatchNorm2d), eval with the running statistics.
std::vector<double> bn_relu_ref(const std::vector<double>& y, const Shape& s, const std::vector<double>& gamma,
                                const std::vector<double>& beta, const std::vector<double>& rm,
                                const std::vector<double>& rv, bool training, double eps,
                                std::vector<double>* mean_out = nullptr, std::vector<double>* var_out = nullptr) {
  const int64_t N = s[0], C = s[1], HW = s[2] * s[3];
  std::vector<double> a(y.size());
  for (int64_t c = 0; c < C; ++c) {
    double mean = rm[size_t(c)], var = rv[size_t(c)];
    if (training) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) sum += y[size_t((n * C + c) * HW + i)];
      mean = sum / double(N * HW);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) {
          const double d = y[size_t((n * C + c) * HW + i)] - mean;
          sq += d * d;
        }
      var = sq / double(N * HW);
    }
    if (mean_out) (*mean_out)[size_t(c)] = mean;
    if (var_out) (*var_out)[size_t(c)] = var;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const size_t at = size_t((n * C + c) * HW + i);
        a[at] = std::max(0.0, (y[at] - mean) / std::sqrt(var + eps) * gamma[size_t(c)] + beta[size_t(c)]);
      }
  }
  return a;
}

}  // namespace

// =============================================================================================
// conv2d
// =============================================================================================

TEST_CASE("probe conv: conv2d and its input/weight/bias gradients over stride x padding x dilation x groups x bias, on views") {
  // Every combination of: stride 1 or (2, 3); padding 0 or (3, 1) (3 > the kernel's 2 rows);
  // dilation 1 or (2, 1); groups 1, depthwise (groups == C == K) or groups == C with channel
  // multiplier 2; bias or none; on a contiguous, channels-last or H/W-transposed input.
  const Shape xs{2, 3, 5, 7};
  struct Grouping {
    int64_t groups, K;
  };
  const Grouping groupings[] = {{1, 4}, {3, 3}, {3, 6}};
  uint64_t seed = 1;
  size_t combo = 0;
  for (Int2 stride : {Int2(1), Int2{2, 3}})
    for (Int2 pad : {Int2(0), Int2{3, 1}})
      for (Int2 dil : {Int2(1), Int2{2, 1}})
        for (const Grouping& gr : groupings)
          for (bool with_bias : {false, true}) {
            const Conv2dOptions o{.stride = stride, .padding = pad, .dilation = dil, .groups = gr.groups};
            check_conv_autograd(xs, {gr.K, 3 / gr.groups, 2, 3}, o, with_bias, kViews[combo++ % 3], seed += 10);
          }
}

TEST_CASE("probe conv: 1x1 kernels with padding or stride, kernels larger than the input, size-1 and odd sizes") {
  struct Case {
    Shape xs, ws;
    Conv2dOptions o;
  };
  const Case cases[] = {
      {{1, 2, 3, 4}, {3, 2, 1, 1}, {.padding = 2}},                               // 1x1 padded: outputs of bias alone
      {{2, 4, 5, 5}, {4, 2, 1, 1}, {.stride = 2, .padding = 1, .groups = 2}},     // 1x1 strided, padded, grouped
      {{1, 4, 3, 3}, {6, 2, 1, 1}, {.dilation = 3, .groups = 2}},                 // 1x1 "dilated": the direct path
      {{1, 2, 2, 3}, {3, 2, 4, 5}, {.padding = 1}},                               // kernel > input, 1x1 output
      {{2, 1, 3, 2}, {2, 1, 5, 5}, {.stride = 2, .padding = 3}},                  // kernel > input, padding > input
      {{3, 2, 1, 9}, {2, 2, 1, 3}, {.stride = {1, 2}, .padding = {0, 1}}},        // H = 1
      {{1, 3, 8, 1}, {3, 1, 3, 1}, {.stride = 3, .padding = {1, 0}, .groups = 3}},  // W = 1, depthwise
      {{1, 1, 2, 2}, {1, 1, 1, 1}, {.stride = 2, .padding = 3}},                  // padding 3 > kernel 1, stride 2
      {{1, 2, 9, 9}, {2, 2, 2, 2}, {.stride = 4, .padding = 1}},                  // stride > kernel: skipped pixels
      {{2, 3, 7, 5}, {4, 3, 3, 2}, {.stride = {3, 2}}},                           // patchify with leftover rows
      {{1, 2, 4, 4}, {3, 2, 4, 4}, {.stride = 4}},                                // patchify: one patch, the input
      {{1, 5, 11, 13}, {10, 1, 3, 5}, {.stride = {2, 3}, .padding = {2, 4}, .dilation = {3, 2}, .groups = 5}},
  };
  uint64_t seed = 1000;
  for (const Case& c : cases)
    for (View v : kViews) check_conv_autograd(c.xs, c.ws, c.o, true, v, seed += 10);
}

TEST_CASE("probe conv: size-0 batch, zero output channels and zero input channels through autograd") {
  // N = 0 in the im2col, 1x1-direct and patchify paths: y (0, K, OH, OW), grad_x (0, C, H, W),
  // and the weight and bias gradients are sums over no samples: 0.
  struct Case {
    Shape xs, ws;
    Conv2dOptions o;
  };
  for (const Case& c : {Case{{0, 3, 5, 6}, {4, 3, 3, 3}, {.padding = 1}}, Case{{0, 4, 5, 6}, {2, 4, 1, 1}, {}},
                        Case{{0, 3, 8, 8}, {4, 3, 4, 4}, {.stride = 4}},
                        Case{{0, 4, 5, 5}, {4, 1, 3, 3}, {.stride = 2, .groups = 4}}}) {
    CAPTURE(conv_name(c.xs, c.ws, c.o, true));
    const Tensor x = leaf(c.xs, 1), w = leaf(c.ws, 2), b = leaf({c.ws[0]}, 3);
    const Tensor y = conv2d(x, w, b, c.o);
    REQUIRE(y.sizes() == Shape{0, c.ws[0], conv_out(c.xs[2], c.ws[2], c.o.stride.h, c.o.padding.h, 1),
                               conv_out(c.xs[3], c.ws[3], c.o.stride.w, c.o.padding.w, 1)});
    sum(y).backward();
    REQUIRE(x.grad().defined());
    CHECK(x.grad().sizes() == c.xs);
    check_close(w.grad(), std::vector<double>(size_t(w.numel()), 0.0), 0, 0, "grad_w over no samples");
    check_close(b.grad(), std::vector<double>(size_t(b.numel()), 0.0), 0, 0, "grad_bias over no samples");
  }
  // K = 0: no output depends on x, so d(anything of y)/dx = 0.
  {
    const Tensor x = leaf({2, 3, 4, 4}, 4), w = leaf({0, 3, 3, 3}, 5);
    const Tensor y = conv2d(x, w, Tensor(), {.padding = 1});
    REQUIRE(y.sizes() == Shape{2, 0, 4, 4});
    sum(y).backward();
    check_close(x.grad(), std::vector<double>(32 * 3, 0.0), 0, 0, "grad_x with no output channels");
  }
  // C = 0: y is the bias everywhere, so d sum(gy y) / d bias[k] = sum of gy over (n, oh, ow).
  {
    const Tensor x = leaf({2, 0, 4, 5}, 6), w = leaf({3, 0, 2, 2}, 7), b = leaf({3}, 8);
    const Tensor y = conv2d(x, w, b, {.stride = {1, 2}});
    REQUIRE(y.sizes() == Shape{2, 3, 3, 2});
    const std::vector<double> bv = values_of(b), yv = values_of(y);
    for (size_t i = 0; i < yv.size(); ++i) CHECK(yv[i] == bv[(i / 6) % 3]);
    const Tensor gy = random_tensor({2, 3, 3, 2}, kFloat64, 9);
    y.backward(gy);
    const std::vector<double> g = values_of(gy);
    std::vector<double> gb(3, 0.0);
    for (size_t i = 0; i < g.size(); ++i) gb[(i / 6) % 3] += g[i];
    check_close(b.grad(), gb, 1e-14, 1e-14, "grad_bias with no input channels");
    CHECK(w.grad().sizes() == Shape{3, 0, 2, 2});
  }
}

TEST_CASE("probe conv: float16/bfloat16 conv2d and its gradients accumulate in float32 and round once, on every path") {
  // A sum B + 1 + 1 + 1 + 1 (+ bias 2) is B + 4 (B + 6), held exactly by the 16-bit type, while a
  // 16-bit running sum stalls at B (B + 1 rounds to even B): B = 2048 for float16 (11-bit
  // significand), 256 for bfloat16 (8-bit). Closed forms; the paths: im2col (a 1x5 kernel,
  // stride 1), the 1x1 direct GEMM, patchify (stride == kernel), and each backward product.
  for (DType t : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    const double B = t == kFloat16 ? 2048.0 : 256.0;
    const std::vector<double> big_then_ones{B, 1, 1, 1, 1};
    auto param = [&](const std::vector<double>& v, const Shape& s) {
      Tensor p = make_tensor(v, s, t);
      p.requires_grad_();
      return p;
    };
    // im2col path: x (1, 1, 1, 5) * w (1, 1, 1, 5) of ones + bias 2.
    {
      const Tensor x = param(big_then_ones, {1, 1, 1, 5}), w = param({1, 1, 1, 1, 1}, {1, 1, 1, 5});
      const Tensor b = param({2}, {1});
      const Tensor y = conv2d(x, w, b);
      check_close(y, {B + 6}, 0, 0, "im2col forward");
      check_close(conv2d(x, w), {B + 4}, 0, 0, "im2col forward, no bias");
      // patchify: the same numbers with stride == kernel (1, 5).
      check_close(conv2d(x, w, b, {.stride = {1, 5}}), {B + 6}, 0, 0, "patchify forward");
    }
    // 1x1 direct: x (1, 5, 1, 1) with channels B, 1, 1, 1, 1; w (1, 5, 1, 1) ones.
    {
      const Tensor x = param(big_then_ones, {1, 5, 1, 1}), w = param({1, 1, 1, 1, 1}, {1, 5, 1, 1});
      check_close(conv2d(x, w, param({2}, {1})), {B + 6}, 0, 0, "1x1 forward");
    }
    // grad_w and grad_bias: y = conv(x of ones (1, 1, 1, 5), w (1, 1, 1, 1)), gy = B, 1, 1, 1, 1:
    // grad_w = sum gy x = B + 4 = grad_bias. Through the 1x1 path and a 1x2-patchify one.
    {
      const Tensor x = param({1, 1, 1, 1, 1}, {1, 1, 1, 5}), w = param({1}, {1, 1, 1, 1}), b = param({0}, {1});
      conv2d(x, w, b).backward(make_tensor(big_then_ones, {1, 1, 1, 5}, t));
      check_close(w.grad(), {B + 4}, 0, 0, "1x1 grad_w");
      check_close(b.grad(), {B + 4}, 0, 0, "grad_bias");
      const Tensor w3 = param({1, 1, 1}, {1, 1, 1, 3}), b3 = param({0}, {1});
      const Tensor x7 = param({1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 7});
      // 1x3 kernel, padding (0, 1): 7 outputs, gy = B, 1, 1, 1, 1, 0, 2 and x of ones:
      // grad_w[j] = sum of gy over the outputs whose tap j is inside: outputs 1..6 (j = 0),
      // all (j = 1), 0..5 (j = 2).
      conv2d(x7, w3, b3, {.padding = {0, 1}}).backward(make_tensor({B, 1, 1, 1, 1, 0, 2}, {1, 1, 1, 7}, t));
      check_close(w3.grad(), {6, B + 6, B + 4}, 0, 0, "im2col grad_w");
      check_close(b3.grad(), {B + 6}, 0, 0, "grad_bias of 7 outputs");
      // patchify (1x5 kernel, stride 5) over 5 patches: grad_w[0] = x[0] + x[5] + ... = B + 4.
      std::vector<double> x25(25, 0.0);
      x25[0] = B, x25[5] = x25[10] = x25[15] = x25[20] = 1;
      const Tensor xp = param(x25, {1, 1, 1, 25}), wp = param({1, 1, 1, 1, 1}, {1, 1, 1, 5});
      conv2d(xp, wp, Tensor(), {.stride = {1, 5}}).backward(make_tensor({1, 1, 1, 1, 1}, {1, 1, 1, 5}, t));
      check_close(wp.grad(), {B + 4, 0, 0, 0, 0}, 0, 0, "patchify grad_w");
    }
    // grad_x: x (1, 1, 1, 1), w (5, 1, 1, 1) ones, gy = B, 1, 1, 1, 1 over the 5 output channels:
    // grad_x = sum_k w[k] gy[k] = B + 4 (the 1x1 path), and through a padded 3x3 im2col.
    {
      const Tensor x = param({3}, {1, 1, 1, 1}), w = param({1, 1, 1, 1, 1}, {5, 1, 1, 1});
      conv2d(x, w).backward(make_tensor(big_then_ones, {1, 5, 1, 1}, t));
      check_close(x.grad(), {B + 4}, 0, 0, "1x1 grad_x");
      const Tensor x3 = param({3}, {1, 1, 1, 1}), w3 = param(std::vector<double>(45, 1.0), {5, 1, 3, 3});
      conv2d(x3, w3, Tensor(), {.padding = 1}).backward(make_tensor(big_then_ones, {1, 5, 1, 1}, t));
      check_close(x3.grad(), {B + 4}, 0, 0, "im2col grad_x");
    }
  }
}

// =============================================================================================
// pooling
// =============================================================================================

TEST_CASE("probe conv: max_pool2d values and gradient routing as torch: first maximum, NaN wins, padding, dilation, ceil_mode") {
  // Inputs of small integers (ties in almost every window), with NaN and -inf in some planes;
  // the gradient of each output goes to torch's maxindex (the first maximum in window order,
  // or the last NaN), every sum exact in every dtype.
  struct Case {
    Int2 k, s, p, d;
    bool ceil;
  };
  const Case cases[] = {
      {2, 1, 0, 1, false},            {3, 1, 1, 1, false},           {3, 2, 1, 1, true},
      {{2, 3}, {1, 2}, {1, 1}, 1, true}, {2, 2, 0, 1, false},         {2, 2, 0, 1, true},
      {3, 3, 0, 1, false},            {2, 1, 1, 2, false},           {3, 2, 1, 2, true},
      {3, 1, 0, 2, false},            {2, 3, 0, 1, false},           {3, 2, 0, 1, true},
      {{3, 1}, {2, 1}, {1, 0}, {1, 3}, true},
  };
  const Shape xs{2, 3, 7, 6};
  const int64_t P = 6, H = 7, W = 6;
  std::vector<double> xv = small_ints(numel_of(xs), 5);
  xv[3] = kNaN, xv[9] = kNaN, xv[10] = kNaN;          // plane 0: a NaN, and two NaNs in one window
  for (int64_t i = 42; i < 84; i += 5) xv[size_t(i)] = -kInf;  // plane 1: scattered -inf
  for (int64_t i = 84; i < 126; ++i) xv[size_t(i)] = -1;        // plane 2: all equal (negative: not the 0 padding)
  uint64_t seed = 50;
  for (const Case& c : cases)
    for (DType t : {kFloat64, kFloat32, kBFloat16})
      for (View v : kViews) {
        CAPTURE(detail::str_cat("kernel", c.k.str(), " stride", c.s.str(), " pad", c.p.str(), " dil", c.d.str(),
                                c.ceil ? " ceil" : ""));
        CAPTURE(dtype_name(t));
        CAPTURE(view_name(v));
        const MaxPool2dOptions o{.stride = c.s, .padding = c.p, .dilation = c.d, .ceil_mode = c.ceil};
        const int64_t OH = pool_out(H, c.k.h, c.s.h, c.p.h, c.d.h, c.ceil);
        const int64_t OW = pool_out(W, c.k.w, c.s.w, c.p.w, c.d.w, c.ceil);
        const std::vector<double> gyv = small_ints(P * OH * OW, ++seed);
        const PoolRef ref = max_pool_ref(xv, P, H, W, c.k, c.s, c.p, c.d, c.ceil, &gyv);
        const ViewedLeaf x = leaf_of(xv, xs, v, t);
        const Tensor y = max_pool2d(x.x, c.k, o);
        REQUIRE(y.sizes() == Shape{2, 3, ref.OH, ref.OW});
        check_close(y, ref.y, 0, 0, "max_pool2d values");
        y.backward(make_tensor(gyv, y.sizes(), t, Layout::Transposed));
        check_close(x.grad(), ref.gx, 0, 0, "max_pool2d gradient routing");
        // The raw op's indices are torch's maxindex too.
        const ops::MaxPool2dResult r = ops::max_pool2d(x.x.detach(), c.k, o);
        check_close(r.out, ref.y, 0, 0, "raw max_pool2d values");
        CHECK(r.indices.contiguous().tolist<int64_t>() == ref.idx);
      }
}

TEST_CASE("probe conv: max_pool2d pads with -inf: all-negative planes and windows over the padded edge") {
  // torch.nn.functional.max_pool2d: "implicit negative infinity padding". A plane of negative
  // values must never pool to 0, with or without ceil_mode's extra window, on every path.
  const Shape xs{1, 2, 5, 5};
  std::vector<double> xv = random_values(50, 3, -9.0, -1.0);
  for (double& e : xv) e = std::floor(e * 8) / 8;  // eighths: held exactly by float16
  for (auto [k, s, p, ceil] : std::vector<std::tuple<Int2, Int2, Int2, bool>>{
           {3, 2, 1, false}, {3, 2, 1, true}, {2, 2, 1, true}, {{3, 2}, {1, 2}, {1, 1}, true}, {2, 3, 1, true}}) {
    CAPTURE(detail::str_cat("kernel", k.str(), " stride", s.str(), " pad", p.str(), ceil ? " ceil" : ""));
    const PoolRef ref = max_pool_ref(xv, 2, 5, 5, k, s, p, 1, ceil);
    for (DType t : {kFloat64, kFloat32, kFloat16}) {
      const Tensor y = max_pool2d(make_tensor(xv, xs, t), k, {.stride = s, .padding = p, .ceil_mode = ceil});
      REQUIRE(y.sizes() == Shape{1, 2, ref.OH, ref.OW});
      check_close(y, ref.y, 0, 0, dtype_name(t));
      CHECK(max_abs(y) > 0);
      for (double e : values_of(y)) CHECK(e < 0);
    }
  }
}

TEST_CASE("probe conv: max_pool2d / avg_pool2d output sizes follow torch's ceil_mode rule: the last window starts inside the input or the left padding") {
  // torch.nn.MaxPool2d docs: with ceil_mode "sliding windows are allowed to go off-bounds if
  // they start within the left padding or the input. Sliding windows that would start in the
  // right padded region are ignored." Each case lists L, k, s, p, d and the expected size,
  // worked out by hand from the windows' start positions.
  struct Case {
    int64_t L, k, s, p, d, out;
  };
  const Case cases[] = {
      {5, 2, 2, 0, 1, 3},  // starts 0, 2, 4: 4 is inside
      {5, 3, 3, 1, 1, 2},  // starts -1, 2, (5 would be the right padding: dropped)
      {6, 3, 3, 1, 1, 3},  // starts -1, 2, 5: 5 is inside
      {8, 4, 3, 2, 1, 4},  // starts -2, 1, 4, 7
      {4, 2, 3, 1, 1, 2},  // starts -1, 2
      {6, 3, 2, 1, 2, 3},  // dilated span 5: starts -1, 1, 3 (taps 3, 5, 7: over the padded edge)
      {7, 3, 2, 1, 2, 3},  // starts -1, 1, 3 (a window at 5 would span 5..9, past the padding)
      {1, 2, 2, 1, 1, 1},  // starts -1, (1 = L: the right padding, dropped)
  };
  for (const Case& c : cases) {
    CAPTURE(detail::str_cat("L=", c.L, " k=", c.k, " s=", c.s, " p=", c.p, " d=", c.d));
    const int64_t expect = c.out;
    const Tensor x = zeros({1, 1, c.L, 3});
    const Tensor y = max_pool2d(x, {c.k, 1}, {.stride = {c.s, 1}, .padding = {c.p, 0}, .dilation = {c.d, 1}, .ceil_mode = true});
    CHECK(y.size(2) == expect);
    if (c.d == 1) {
      const Tensor a = avg_pool2d(x, {c.k, 1}, {.stride = {c.s, 1}, .padding = {c.p, 0}, .ceil_mode = true});
      CHECK(a.size(2) == expect);
    }
  }
}

TEST_CASE("probe conv: avg_pool2d divisors: count_include_pad, ceil_mode windows over the padded edge, gradients on views") {
  struct Case {
    Int2 k, s, p;
    bool ceil;
  };
  const Case cases[] = {
      {3, 2, 1, false}, {3, 2, 1, true},  {{2, 3}, {2, 1}, {1, 1}, true}, {2, 2, 0, true},
      {4, 3, 2, true},  {3, 3, 1, true},  {{1, 3}, {1, 2}, {0, 1}, true}, {5, 1, 2, false},
      {2, 1, 1, true},  {{3, 2}, {3, 1}, {1, 0}, true},
  };
  const Shape xs{2, 2, 8, 7};
  const int64_t P = 4, H = 8, W = 7;
  const std::vector<double> xv = random_values(numel_of(xs), 17);
  uint64_t seed = 70;
  for (const Case& c : cases)
    for (bool include_pad : {true, false})
      for (View v : kViews) {
        CAPTURE(detail::str_cat("kernel", c.k.str(), " stride", c.s.str(), " pad", c.p.str(), c.ceil ? " ceil" : "",
                                include_pad ? " count_include_pad" : ""));
        CAPTURE(view_name(v));
        const AvgPool2dOptions o{.stride = c.s, .padding = c.p, .ceil_mode = c.ceil, .count_include_pad = include_pad};
        const int64_t OH = pool_out(H, c.k.h, c.s.h, c.p.h, 1, c.ceil), OW = pool_out(W, c.k.w, c.s.w, c.p.w, 1, c.ceil);
        const std::vector<double> gyv = random_values(P * OH * OW, ++seed);
        const PoolRef ref = avg_pool_ref(xv, P, H, W, c.k, c.s, c.p, c.ceil, include_pad, &gyv);
        const ViewedLeaf x = leaf_of(xv, xs, v, kFloat64);
        const Tensor y = avg_pool2d(x.x, c.k, o);
        REQUIRE(y.sizes() == Shape{2, 2, ref.OH, ref.OW});
        check_close(y, ref.y, 1e-13, 1e-13, "avg_pool2d");
        y.backward(make_tensor(gyv, y.sizes(), kFloat64, Layout::Transposed));
        check_close(x.grad(), ref.gx, 1e-13, 1e-13, "avg_pool2d gradient");
      }
}

TEST_CASE("probe conv: adaptive_avg_pool2d bins and gradients (global pool on channels-last included), 16-bit sums in float32") {
  const Shape xs{2, 3, 8, 7};
  const int64_t P = 6, H = 8, W = 7;
  const std::vector<double> xv = random_values(numel_of(xs), 23);
  uint64_t seed = 90;
  for (Int2 out : {Int2{3, 5}, Int2{11, 9}, Int2(1), Int2{8, 7}, Int2{5, 2}, Int2{1, 4}, Int2{16, 1}})
    for (View v : kViews)
      for (bool sum_backward : {false, true}) {
        CAPTURE(out.str());
        CAPTURE(view_name(v));
        CAPTURE(sum_backward);
        std::vector<double> gyv = random_values(P * out.h * out.w, ++seed);
        if (sum_backward) std::fill(gyv.begin(), gyv.end(), 1.0);
        const PoolRef ref = adaptive_ref(xv, P, H, W, out, &gyv);
        const ViewedLeaf x = leaf_of(xv, xs, v, kFloat64);
        const Tensor y = adaptive_avg_pool2d(x.x, out);
        REQUIRE(y.sizes() == Shape{2, 3, out.h, out.w});
        check_close(y, ref.y, 1e-13, 1e-13, "adaptive_avg_pool2d");
        if (sum_backward) sum(y).backward();  // an expanded (stride 0) gradient
        else y.backward(make_tensor(gyv, y.sizes(), kFloat64, Layout::Transposed));
        check_close(x.grad(), ref.gx, 1e-13, 1e-13, "adaptive_avg_pool2d gradient");
      }
  // A 64x64 global pool of ones with one 2^12 (float16) / 2^9 (bfloat16) in bfloat16/float16:
  // the mean (4095 + B) / 4096 = 1 + (B - 1) / 4096 needs a float32 sum (a 16-bit running sum
  // stalls at 2048 / 256). Reference rounded once to the type by hand: B = 4096 -> 1.99975...
  // rounds to 2 in float16; B = 512 -> 1.12475... rounds to 1.125 in bfloat16.
  for (auto [t, B, expect] : std::vector<std::tuple<DType, double, double>>{{kFloat16, 4096.0, 2.0},
                                                                             {kBFloat16, 512.0, 1.125}}) {
    CAPTURE(dtype_name(t));
    std::vector<double> v(64 * 64, 1.0);
    v[1000] = B;
    check_close(adaptive_avg_pool2d(make_tensor(v, {1, 1, 64, 64}, t), 1), {expect}, 0, 0, "global pool");
    check_close(avg_pool2d(make_tensor(v, {1, 1, 64, 64}, t), 64), {expect}, 0, 0, "64x64 avg_pool2d");
  }
}

// =============================================================================================
// conv + batch norm fusions, low-rank conv
// =============================================================================================

TEST_CASE("probe conv: bn_relu_conv2d and conv2d_stats against a float64 batch norm + ReLU + conv, with finite-difference gradients") {
  const Shape ys{2, 3, 4, 5};
  const Shape ws{4, 3, 3, 2};
  const Conv2dOptions o{.stride = {2, 1}, .padding = {1, 2}};
  const double eps = 1e-5, momentum = 0.1;
  const std::vector<double> yv = random_values(numel_of(ys), 31), wv = random_values(numel_of(ws), 32);
  const std::vector<double> gamma = random_values(3, 33, 0.5, 1.5), beta = random_values(3, 34, -0.5, 0.5);
  const std::vector<double> rm0 = random_values(3, 35), rv0 = random_values(3, 36, 0.5, 2.0);
  const int64_t count = 2 * 4 * 5;
  for (bool training : {true, false})
    for (View v : kViews) {
      CAPTURE(training);
      CAPTURE(view_name(v));
      const ViewedLeaf y = leaf_of(yv, ys, v, kFloat64);
      const Tensor w = param_tensor(wv, ws, kFloat64);
      const Tensor g = param_tensor(gamma, {3}, kFloat64), b = param_tensor(beta, {3}, kFloat64);
      const Tensor rm = make_tensor(rm0, {3}, kFloat64), rv = make_tensor(rv0, {3}, kFloat64);
      const ConvWithStats in{y.x, Tensor(), Tensor(), y.x.version()};
      const ConvWithStats z = bn_relu_conv2d(in, {rm, rv, g, b, training, momentum, eps}, w, o);
      // Forward: relu(bn(y)) then the convolution, in float64 loops.
      std::vector<double> mean(3), var(3);
      const std::vector<double> a = bn_relu_ref(yv, ys, gamma, beta, rm0, rv0, training, eps, &mean, &var);
      const ConvRef ref = conv_ref(a, ys, wv, ws, nullptr, o);
      REQUIRE(z.out.sizes() == ref.ys);
      check_close(z.out, ref.y, 1e-11, 1e-11, "bn_relu_conv2d");
      // conv2d_stats's sums of z.
      std::vector<double> s(4, 0.0), sq(4, 0.0);
      for (size_t i = 0; i < ref.y.size(); ++i) {
        const size_t k = (i / size_t(ref.ys[2] * ref.ys[3])) % 4;
        s[k] += ref.y[i], sq[k] += ref.y[i] * ref.y[i];
      }
      REQUIRE(z.sum.defined());
      check_close(z.sum, s, 1e-11, 1e-11, "sum of z");
      check_close(z.sq_sum, sq, 1e-11, 1e-11, "sum of z^2");
      // Running statistics (torch.nn.BatchNorm2d): (1 - m) r + m stat, the variance unbiased;
      // untouched in eval.
      std::vector<double> erm = rm0, erv = rv0;
      if (training)
        for (size_t c = 0; c < 3; ++c) {
          erm[c] = (1 - momentum) * rm0[c] + momentum * mean[c];
          erv[c] = (1 - momentum) * rv0[c] + momentum * var[c] * double(count) / double(count - 1);
        }
      check_close(rm, erm, 1e-12, 1e-12, "running_mean");
      check_close(rv, erv, 1e-12, 1e-12, "running_var");
      // Gradients of L = sum(gz z) against central differences of the float64 reference.
      const std::vector<double> gz = random_values(int64_t(ref.y.size()), 37);
      z.out.backward(make_tensor(gz, ref.ys, kFloat64));
      auto loss = [&](const std::vector<double>& y2, const std::vector<double>& g2, const std::vector<double>& b2,
                      const std::vector<double>& w2) {
        const ConvRef r2 = conv_ref(bn_relu_ref(y2, ys, g2, b2, rm0, rv0, training, eps), ys, w2, ws, nullptr, o);
        double l = 0;
        for (size_t i = 0; i < gz.size(); ++i) l += gz[i] * r2.y[i];
        return l;
      };
      auto numeric = [&](int which) {
        std::vector<double> vs[4] = {yv, gamma, beta, wv};
        std::vector<double> grad(vs[which].size());
        const double h = 1e-6;
        for (size_t i = 0; i < grad.size(); ++i) {
          std::vector<double> up[4] = {vs[0], vs[1], vs[2], vs[3]}, dn[4] = {vs[0], vs[1], vs[2], vs[3]};
          up[which][i] += h, dn[which][i] -= h;
          grad[i] = (loss(up[0], up[1], up[2], up[3]) - loss(dn[0], dn[1], dn[2], dn[3])) / (2 * h);
        }
        return grad;
      };
      check_close(y.grad(), numeric(0), 1e-6, 1e-6, "grad of the bn input");
      check_close(g.grad(), numeric(1), 1e-6, 1e-6, "grad of bn weight");
      check_close(b.grad(), numeric(2), 1e-6, 1e-6, "grad of bn bias");
      check_close(w.grad(), numeric(3), 1e-6, 1e-6, "grad of the conv weight");
    }
  // conv2d_stats: conv2d without bias and its channel sums, on a channels-last input.
  const Tensor x = random_tensor({2, 5, 6, 3}, kFloat64, 38).permute({0, 3, 1, 2});  // (2, 3, 5, 6)
  const std::vector<double> xv = values_of(x);
  const ConvWithStats st = conv2d_stats(x, make_tensor(wv, ws, kFloat64), o);
  const ConvRef ref = conv_ref(xv, {2, 3, 5, 6}, wv, ws, nullptr, o);
  check_close(st.out, ref.y, 1e-12, 1e-12, "conv2d_stats out");
  std::vector<double> s(4, 0.0), sq(4, 0.0);
  for (size_t i = 0; i < ref.y.size(); ++i) {
    const size_t k = (i / size_t(ref.ys[2] * ref.ys[3])) % 4;
    s[k] += ref.y[i], sq[k] += ref.y[i] * ref.y[i];
  }
  check_close(st.sum, s, 1e-12, 1e-12, "conv2d_stats sum");
  check_close(st.sq_sum, sq, 1e-12, 1e-12, "conv2d_stats sq_sum");
}

TEST_CASE("probe conv: LowRankConv2d equals the dense convolution of up @ down, for strided, padded, dilated layers with channels-last weights") {
  // down (kh x kw, stride, padding, dilation) then up (1 x 1, bias) is one convolution with the
  // weight up (out, r) @ down (r, in kh kw): a float64 composition. Full rank: the original layer.
  manual_seed(3);
  nn::Conv2d conv(4, 6, {3, 2}, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}});
  conv.to(kFloat64);
  nn::to_channels_last(conv);
  REQUIRE(is_channels_last(conv.weight));
  const Shape ws{6, 4, 3, 2};
  const std::vector<double> wv = values_of(conv.weight), bv = values_of(conv.bias);
  for (View v : kViews) {
    CAPTURE(view_name(v));
    const ViewedLeaf x = viewed_leaf({2, 4, 7, 5}, v, 41);
    const std::vector<double> xv = values_of(x.x);
    for (int64_t rank : {6, 2}) {
      CAPTURE(rank);
      const auto lr = nn::to_low_rank(conv, rank, {.require_saving = false});
      const std::vector<double> up = values_of(lr->up->weight), down = values_of(lr->down->weight);
      std::vector<double> dense(size_t(6 * 24), 0.0);
      for (int64_t o = 0; o < 6; ++o)
        for (int64_t r = 0; r < rank; ++r)
          for (int64_t j = 0; j < 24; ++j) dense[size_t(o * 24 + j)] += up[size_t(o * rank + r)] * down[size_t(r * 24 + j)];
      if (rank == 6) check_close(dense, wv, 1e-10, 1e-10, "full-rank factors multiply back to the weight");
      const ConvRef ref = conv_ref(xv, {2, 4, 7, 5}, dense, ws, &bv, conv.options);
      const Tensor y = lr->forward(x.x);
      REQUIRE(y.sizes() == ref.ys);
      check_close(y, ref.y, 1e-10, 1e-10, "LowRankConv2d forward");
      if (rank == 6) check_close(y, conv_ref(xv, {2, 4, 7, 5}, wv, ws, &bv, conv.options).y, 1e-10, 1e-10, "full rank");
    }
  }
}

TEST_CASE("probe conv: threaded sizes: one large sample, samples in parallel, weight gradients in several chunks") {
  // Note [CPU convolution threading]: one sample threads its GEMM over blocks; chunks of
  // kChunkColumns / L samples run in parallel with their own workspaces; the weight gradient
  // sums the chunks' partials. Each against the float64 loops, in float64 and float32.
  struct Case {
    Shape xs, ws;
    Conv2dOptions o;
  };
  const Case cases[] = {
      {{1, 16, 37, 35}, {24, 16, 3, 3}, {.padding = 1}},
      {{6, 8, 21, 19}, {12, 4, 3, 5}, {.stride = {1, 2}, .padding = {2, 1}, .dilation = {2, 1}, .groups = 2}},
      {{45, 3, 10, 10}, {8, 3, 3, 3}, {.padding = 1}},  // L = 100: 20 samples per chunk, 3 chunks
      {{7, 12, 17, 17}, {12, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 12}},
  };
  uint64_t seed = 3000;
  for (const Case& c : cases) {
    check_conv_autograd(c.xs, c.ws, c.o, true, View::ChannelsLast, seed += 10);
    CAPTURE(conv_name(c.xs, c.ws, c.o, true));
    // float32: the same numbers within float32 rounding of sums of |terms| <= 4 * 4 * C R S.
    const Tensor x = random_tensor(c.xs, kFloat32, seed + 5), w = random_tensor(c.ws, kFloat32, seed + 6);
    const ConvRef ref = conv_ref(values_of(x), c.xs, values_of(w), c.ws, nullptr, c.o);
    check_close(conv2d(x, w, Tensor(), c.o), ref.y, 1e-4, 1e-4, "float32 forward");
  }
}

TEST_CASE("probe conv: bn_relu_conv2d without affine parameters or running statistics, and in float16/bfloat16") {
  const Shape ys{3, 4, 5, 4}, ws{6, 4, 3, 3};
  const Conv2dOptions o{.padding = 1};
  const std::vector<double> yv = random_values(numel_of(ys), 51), wv = random_values(numel_of(ws), 52, -0.5, 0.5);
  const std::vector<double> ones(4, 1.0), zeros4(4, 0.0);
  // affine = False, track_running_stats = False (torch.nn.BatchNorm2d): weight 1, bias 0, batch
  // statistics, nothing to update.
  {
    const Tensor y = param_tensor(yv, ys, kFloat64), w = param_tensor(wv, ws, kFloat64);
    const ConvWithStats z = bn_relu_conv2d({y, Tensor(), Tensor(), y.version()},
                                           {Tensor(), Tensor(), Tensor(), Tensor(), true}, w, o);
    const ConvRef ref = conv_ref(bn_relu_ref(yv, ys, ones, zeros4, zeros4, ones, true, 1e-5), ys, wv, ws, nullptr, o);
    check_close(z.out, ref.y, 1e-11, 1e-11, "no affine, no running stats");
    z.out.backward(ones_like(z.out));
    CHECK(y.grad().defined());
    CHECK(w.grad().defined());
  }
  // 16-bit inputs: the float64 composition of the values as stored, within the types' rounding
  // (float16's scale and shift are rounded to float16 too: Note [Convolution batch-norm fusion]).
  for (DType t : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    const Tensor y = make_tensor(yv, ys, t), w = make_tensor(wv, ws, t);
    const std::vector<double> gamma = random_values(4, 53, 0.5, 1.5), beta = random_values(4, 54, -0.5, 0.5);
    Tensor rm = make_tensor(zeros4, {4}, kFloat32), rv = make_tensor(ones, {4}, kFloat32);
    const ConvWithStats z = bn_relu_conv2d({y, Tensor(), Tensor(), y.version()},
                                           {rm, rv, make_tensor(gamma, {4}, kFloat32), make_tensor(beta, {4}, kFloat32)},
                                           w, o);
    std::vector<double> mean(4), var(4);
    const std::vector<double> yq = values_of(y), wq = values_of(w);
    const ConvRef ref =
        conv_ref(bn_relu_ref(yq, ys, gamma, beta, zeros4, ones, true, 1e-5, &mean, &var), ys, wq, ws, nullptr, o);
    const double tol = t == kFloat16 ? 2e-2 : 8e-2;  // sums of 36 terms of |a w| <= 1.5
    check_close(z.out, ref.y, tol, tol, "16-bit bn_relu_conv2d");
    std::vector<double> erm(4), erv(4);
    for (size_t c = 0; c < 4; ++c) erm[c] = 0.1 * mean[c], erv[c] = 0.9 + 0.1 * var[c] * 60.0 / 59.0;
    check_close(rm, erm, 1e-5, 1e-5, "16-bit running_mean");
    check_close(rv, erv, 1e-5, 1e-5, "16-bit running_var");
  }
}
