// Probes for silent wrong answers on the CPU in the recently added and the nn ops, on the
// inputs users actually pass: gelu_mlp, flash_attention and scaled_dot_product_attention
// (masks, causal, odd and unequal lengths), layer_norm, softmax/log_softmax along non-last
// dims, cross_entropy (spatial, ignore_index, label smoothing), embedding (padding_idx),
// conv2d (stride, padding, dilation, groups), max/avg pooling (ceil_mode, padding),
// reduction gradients along every dim, and raw in-place ops on views. Each input is a
// transposed, narrowed/strided or expanded (stride 0) view, or has size-0/size-1/odd dims;
// every result is compared with float64 loops written here, every gradient with finite
// differences (gradcheck) taken through the same views.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "autograd/recompute_cheap.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/flash_attention.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

std::vector<double> vals(const Tensor& t) { return values_of(t); }

/// A float64 tensor of `s` (seeded values), optionally requiring grad.
Tensor rnd(const Shape& s, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  return random_tensor(s, kFloat64, seed, Layout::Contiguous, lo, hi);
}

/// Row-major offset of multi-index idx in `sizes`.
int64_t lin(const std::vector<int64_t>& idx, const Shape& sizes) {
  int64_t o = 0;
  for (size_t d = 0; d < sizes.size(); ++d) o = o * sizes[d] + idx[d];
  return o;
}

double gelu_tanh_ref(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

/// linear(gelu_tanh(linear(x, w1, b1)), w2, b2) over the rows of x (..., in).
std::vector<double> ref_gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                                 const Tensor& b2) {
  const std::vector<double> xv = vals(x), w1v = vals(w1), w2v = vals(w2);
  const std::vector<double> b1v = b1.defined() ? vals(b1) : std::vector<double>(size_t(w1.size(0)), 0.0);
  const std::vector<double> b2v = b2.defined() ? vals(b2) : std::vector<double>(size_t(w2.size(0)), 0.0);
  const int64_t in = w1.size(1), hid = w1.size(0), out = w2.size(0);
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) M *= x.size(d);
  std::vector<double> y(size_t(M * out));
  std::vector<double> h(static_cast<size_t>(hid));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < hid; ++j) {
      double s = b1v[size_t(j)];
      for (int64_t i = 0; i < in; ++i) s += xv[size_t(m * in + i)] * w1v[size_t(j * in + i)];
      h[size_t(j)] = gelu_tanh_ref(s);
    }
    for (int64_t o = 0; o < out; ++o) {
      double s = b2v[size_t(o)];
      for (int64_t j = 0; j < hid; ++j) s += h[size_t(j)] * w2v[size_t(o * hid + j)];
      y[size_t(m * out + o)] = s;
    }
  }
  return y;
}

/// Attention of q (B, H, L, E) over k (B, H, S, E), v (B, H, S, Ev) in float64 loops. mask:
/// undefined, bool or added, broadcast to (B, H, L, S) by frugal's expand (its copy is probed
/// elsewhere); causal keeps s <= l; a row with no key gives zeros.
std::vector<double> ref_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                                  double scale) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), E = q.size(3), S = k.size(2), Ev = v.size(3);
  const std::vector<double> qv = vals(q), kv = vals(k), vv = vals(v);
  std::vector<double> mv;
  if (mask.defined()) mv = vals(mask.expand({B, H, L, S}));
  std::vector<double> out(size_t(B * H * L * Ev), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l) {
        std::vector<double> sc(size_t(S), -kInf);
        double m = -kInf;
        for (int64_t s = 0; s < S; ++s) {
          if (causal && s > l) continue;
          const size_t mi = size_t(((b * H + h) * L + l) * S + s);
          if (mask.defined() && mask.dtype() == kBool && mv[mi] == 0.0) continue;
          double d = 0;
          for (int64_t e = 0; e < E; ++e)
            d += qv[size_t(((b * H + h) * L + l) * E + e)] * kv[size_t(((b * H + h) * S + s) * E + e)];
          d *= scale;
          if (mask.defined() && mask.dtype() != kBool) d += mv[mi];
          sc[size_t(s)] = d;
          m = std::max(m, d);
        }
        if (m == -kInf) continue;
        double z = 0;
        for (int64_t s = 0; s < S; ++s) z += std::exp(sc[size_t(s)] - m);
        for (int64_t s = 0; s < S; ++s) {
          const double w = std::exp(sc[size_t(s)] - m) / z;
          for (int64_t e = 0; e < Ev; ++e)
            out[size_t(((b * H + h) * L + l) * Ev + e)] += w * vv[size_t(((b * H + h) * S + s) * Ev + e)];
        }
      }
  return out;
}

/// softmax (or log_softmax) of x along dim, row-major.
std::vector<double> ref_softmax(const Tensor& x, int64_t dim, bool log) {
  const std::vector<double> xv = vals(x);
  const Shape s = x.sizes();
  if (dim < 0) dim += x.dim();
  std::vector<double> out(xv.size());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= s[size_t(d)];
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= s[size_t(d)];
  const int64_t n = s[size_t(dim)];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double m = -kInf;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, xv[size_t((o * n + j) * inner + i)]);
      double z = 0;
      for (int64_t j = 0; j < n; ++j) z += std::exp(xv[size_t((o * n + j) * inner + i)] - m);
      for (int64_t j = 0; j < n; ++j) {
        const double a = xv[size_t((o * n + j) * inner + i)] - m;
        out[size_t((o * n + j) * inner + i)] = log ? a - std::log(z) : std::exp(a) / z;
      }
    }
  return out;
}

/// layer_norm over the last `nd` dims.
std::vector<double> ref_layer_norm(const Tensor& x, int64_t nd, const Tensor& w, const Tensor& b, double eps) {
  const std::vector<double> xv = vals(x);
  int64_t n = 1;
  for (int64_t d = x.dim() - nd; d < x.dim(); ++d) n *= x.size(d);
  const std::vector<double> wv = w.defined() ? vals(w) : std::vector<double>(size_t(n), 1.0);
  const std::vector<double> bv = b.defined() ? vals(b) : std::vector<double>(size_t(n), 0.0);
  std::vector<double> out(xv.size());
  const int64_t rows = n == 0 ? 0 : int64_t(xv.size()) / n;
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mu += xv[size_t(r * n + i)];
    mu /= double(n);
    for (int64_t i = 0; i < n; ++i) var += (xv[size_t(r * n + i)] - mu) * (xv[size_t(r * n + i)] - mu);
    var /= double(n);
    for (int64_t i = 0; i < n; ++i)
      out[size_t(r * n + i)] = (xv[size_t(r * n + i)] - mu) / std::sqrt(var + eps) * wv[size_t(i)] + bv[size_t(i)];
  }
  return out;
}

/// cross_entropy of logits (N, C, d...) or (N, C) with targets (N, d...), PyTorch's formula.
std::vector<double> ref_cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore, double eps,
                                      Reduction red) {
  const std::vector<double> xv = vals(logits), tv = vals(target);
  const int64_t N = logits.size(0), C = logits.size(1);
  const int64_t inner = N * C == 0 ? 0 : logits.numel() / (N * C);
  std::vector<double> per(size_t(N * inner));
  double total = 0, count = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t t = int64_t(tv[size_t(n * inner + i)]);
      double loss = 0;
      if (t != ignore) {
        double m = -kInf, mean = 0;
        for (int64_t c = 0; c < C; ++c) m = std::max(m, xv[size_t((n * C + c) * inner + i)]);
        double z = 0;
        for (int64_t c = 0; c < C; ++c) {
          z += std::exp(xv[size_t((n * C + c) * inner + i)] - m);
          mean += xv[size_t((n * C + c) * inner + i)];
        }
        mean /= double(C);
        const double lse = m + std::log(z);
        loss = (1 - eps) * (lse - xv[size_t((n * C + t) * inner + i)]) + (eps == 0.0 ? 0.0 : eps * (lse - mean));
        count += 1;
      }
      per[size_t(n * inner + i)] = loss;
      total += loss;
    }
  if (red == Reduction::None) return per;
  if (red == Reduction::Sum) return {total};
  return {total / count};
}

/// conv2d of x (N, C, H, W) with w (K, C / G, R, S), bias (K) or undefined.
std::vector<double> ref_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, Int2 st, Int2 pad, Int2 dil,
                               int64_t G, Shape* out_shape) {
  const std::vector<double> xv = vals(x), wv = vals(w);
  const std::vector<double> bv = bias.defined() ? vals(bias) : std::vector<double>(size_t(w.size(0)), 0.0);
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), K = w.size(0), Cg = w.size(1),
                R = w.size(2), S = w.size(3);
  const int64_t OH = (H + 2 * pad.h - dil.h * (R - 1) - 1) / st.h + 1;
  const int64_t OW = (W + 2 * pad.w - dil.w * (S - 1) - 1) / st.w + 1;
  *out_shape = {N, K, OH, OW};
  const int64_t Kg = K / G;
  std::vector<double> y(size_t(N * K * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = bv[size_t(k)];
          const int64_t g = k / Kg;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t r = 0; r < R; ++r)
              for (int64_t q = 0; q < S; ++q) {
                const int64_t ih = oh * st.h - pad.h + r * dil.h, iw = ow * st.w - pad.w + q * dil.w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += wv[size_t(((k * Cg + c) * R + r) * S + q)] * xv[size_t(((n * C + g * Cg + c) * H + ih) * W + iw)];
              }
          y[size_t(((n * K + k) * OH + oh) * OW + ow)] = s;
        }
  (void)C;
  return y;
}

int64_t pool_out(int64_t L, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t num = L + 2 * p - d * (k - 1) - 1;
  int64_t o = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
  if (ceil_mode && (o - 1) * s >= L + p) --o;
  return o;
}

/// max (is_max) or average pooling of the planes of x (..., H, W).
std::vector<double> ref_pool(const Tensor& x, Int2 k, Int2 s, Int2 p, Int2 d, bool ceil_mode, bool is_max,
                             bool count_include_pad, Shape* out_shape) {
  const std::vector<double> xv = vals(x);
  const int64_t H = x.size(-2), W = x.size(-1), P = x.numel() / std::max<int64_t>(1, H * W);
  const int64_t OH = pool_out(H, k.h, s.h, p.h, d.h, ceil_mode), OW = pool_out(W, k.w, s.w, p.w, d.w, ceil_mode);
  *out_shape = x.sizes();
  (*out_shape)[out_shape->size() - 2] = OH, out_shape->back() = OW;
  std::vector<double> y(size_t(P * OH * OW));
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double acc = is_max ? -kInf : 0.0;
        const int64_t h0 = oh * s.h - p.h, w0 = ow * s.w - p.w;
        for (int64_t i = 0; i < k.h; ++i)
          for (int64_t j = 0; j < k.w; ++j) {
            const int64_t ih = h0 + i * d.h, iw = w0 + j * d.w;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double xval = xv[size_t((pl * H + ih) * W + iw)];
            acc = is_max ? std::max(acc, xval) : acc + xval;
          }
        if (!is_max) {
          const int64_t he = std::min(h0 + k.h, H + p.h), we = std::min(w0 + k.w, W + p.w);
          int64_t div = (he - h0) * (we - w0);
          if (!count_include_pad)
            div = (std::min(he, H) - std::max<int64_t>(h0, 0)) * (std::min(we, W) - std::max<int64_t>(w0, 0));
          acc /= double(div);
        }
        y[size_t((pl * OH + oh) * OW + ow)] = acc;
      }
  return y;
}

/// A strictly increasing permutation of distinct values (no ties for max pooling / max).
Tensor distinct(const Shape& s, uint64_t seed) {
  const int64_t n = numel_of(s);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i) * 0.37;
  const std::vector<double> r = random_values(n, seed);
  std::vector<size_t> order(static_cast<size_t>(n));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r[a] < r[b]; });
  std::vector<double> out(static_cast<size_t>(n));
  for (size_t i = 0; i < order.size(); ++i) out[order[i]] = v[i] - 0.37 * double(n) / 2;
  return from_vector(out, s, TensorOptions(kFloat64));
}

Tensor make_leaf(const Tensor& t) {
  Tensor c = t.contiguous().clone();
  c.requires_grad_();
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// gelu_mlp
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: gelu_mlp forward on transposed, strided, expanded, 3-D and empty inputs") {
  const int64_t in = 5, hid = 7, out = 3;
  const Tensor w1 = rnd({hid, in}, 1, -1, 1), b1 = rnd({hid}, 2), w2 = rnd({out, hid}, 3, -1, 1), b2 = rnd({out}, 4);
  struct Case {
    const char* name;
    Tensor x, w1, b1, w2, b2;
  };
  const Tensor xbase = rnd({4, 9, 2 * in}, 5);
  std::vector<Case> cases = {
      {"contiguous 2-D", rnd({6, in}, 6), w1, b1, w2, b2},
      {"x transposed (in, M).t()", rnd({in, 6}, 7).t(), w1, b1, w2, b2},
      {"x 3-D strided last dim", xbase.slice(2, 0, 2 * in, 2), w1, b1, w2, b2},
      {"x 3-D permuted", rnd({9, 4, in}, 8).permute({1, 0, 2}), w1, b1, w2, b2},
      {"x expanded rows (stride 0)", rnd({1, in}, 9).expand({5, in}), w1, b1, w2, b2},
      {"x expanded batch 3-D", rnd({1, 3, in}, 10).expand({4, 3, in}), w1, b1, w2, b2},
      {"w1 transposed, w2 transposed", rnd({6, in}, 11), rnd({in, hid}, 12).t(), b1, rnd({hid, out}, 13).t(), b2},
      {"w1 strided rows, b1 strided, b2 expanded", rnd({6, in}, 14), rnd({2 * hid, in}, 15).slice(0, 0, 2 * hid, 2),
       rnd({3 * hid}, 16).slice(0, 1, 3 * hid, 3), w2, rnd({1}, 17).expand({out})},
      {"no biases", rnd({6, in}, 18), w1, Tensor(), w2, Tensor()},
      {"one row", rnd({1, in}, 19), w1, b1, w2, b2},
      {"zero rows", rnd({0, in}, 20), w1, b1, w2, b2},
      {"zero rows 3-D", rnd({2, 0, in}, 21), w1, b1, w2, b2},
      {"hidden 1", rnd({4, in}, 22), rnd({1, in}, 23), rnd({1}, 24), rnd({out, 1}, 25), b2},
      {"in 1 out 1", rnd({5, 1}, 26), rnd({hid, 1}, 27), b1, rnd({1, hid}, 28), rnd({1}, 29)},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const Tensor y = gelu_mlp(c.x, c.w1, c.b1, c.w2, c.b2);
    Shape expect = c.x.sizes();
    expect.back() = c.w2.size(0);
    CHECK(y.sizes() == expect);
    check_close(y, ref_gelu_mlp(c.x, c.w1, c.b1, c.w2, c.b2), 1e-12, 1e-12, c.name);
    // float32 too, the dtype users train in.
    const Tensor y32 = gelu_mlp(c.x.to(kFloat32), c.w1.to(kFloat32), c.b1.defined() ? c.b1.to(kFloat32) : Tensor(),
                                c.w2.to(kFloat32), c.b2.defined() ? c.b2.to(kFloat32) : Tensor());
    check_close(y32, ref_gelu_mlp(c.x, c.w1, c.b1, c.w2, c.b2), 1e-4, 1e-5, std::string(c.name) + " f32");
  }
}

TEST_CASE("probe: gelu_mlp gradients through views match finite differences") {
  const int64_t in = 4, hid = 5, out = 3;
  // Every operand a view of a contiguous leaf: x (3, 2, in) from a permute, w1 transposed,
  // b1 strided, w2 narrowed, b2 expanded.
  const Tensor x = leaf({2, 3, in}, 1), w1 = leaf({in, hid}, 2, -1, 1), b1 = leaf({2 * hid}, 3),
               w2 = leaf({out + 2, hid}, 4, -1, 1), b2 = leaf({1}, 5);
  check_gradcheck(
      [&](const TensorList& t) {
        return gelu_mlp(t[0].permute({1, 0, 2}), t[1].t(), t[2].slice(0, 1, 2 * hid, 2), t[3].narrow(0, 1, out),
                        t[4].expand({out}));
      },
      {x, w1, b1, w2, b2});
  // Without biases, a single row, and x broadcast along rows (its gradient sums the rows).
  const Tensor xr = leaf({1, in}, 6), w1c = leaf({hid, in}, 7), w2c = leaf({out, hid}, 8);
  check_gradcheck(
      [&](const TensorList& t) {
        return gelu_mlp(t[0].expand({4, in}), t[1], Tensor(), t[2], Tensor());
      },
      {xr, w1c, w2c});
  // Only some operands want gradients (the node's skipped branches).
  const Tensor wfix = rnd({hid, in}, 9), b1fix = rnd({hid}, 10);
  const Tensor b2l = leaf({out}, 11);
  check_gradcheck(
      [&](const TensorList& t) {
        return gelu_mlp(t[0], wfix, b1fix, rnd({out, hid}, 12), t[1]);
      },
      {leaf({3, in}, 13), b2l});
  check_gradcheck(
      [&](const TensorList& t) {
        return gelu_mlp(rnd({3, in}, 14), wfix, t[0], rnd({out, hid}, 12), Tensor());
      },
      {leaf({hid}, 15)});
}

TEST_CASE("probe: gelu_mlp on zero rows gives zero weight and bias gradients") {
  const Tensor x = leaf({0, 3}, 1), w1 = leaf({4, 3}, 2), b1 = leaf({4}, 3), w2 = leaf({2, 4}, 4), b2 = leaf({2}, 5);
  const Tensor y = gelu_mlp(x, w1, b1, w2, b2);
  CHECK(y.sizes() == Shape{0, 2});
  sum(y).backward();
  for (const Tensor& p : {w1, b1, w2, b2}) {
    REQUIRE(p.grad().defined());
    check_close(p.grad(), std::vector<double>(size_t(p.numel()), 0.0), 0, 0, "zero-row grads");
  }
}

// ---------------------------------------------------------------------------------------
// flash_attention (CPU kernels) and scaled_dot_product_attention (CPU: composed path)
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: flash_attention forward on views, masks, causal and odd lengths vs float64 loops") {
  for (int64_t L : {1, 7, 77})
    for (int64_t S : {1, 7, 13}) {
      const int64_t B = 2, H = 3, E = 5;
      // q sequence-major (B, L, H, E) -> (B, H, L, E); k shared across heads (stride 0);
      // v strided along S.
      const Tensor q = rnd({B, L, H, E}, uint64_t(L * 100 + S)).permute({0, 2, 1, 3});
      const Tensor k = rnd({B, 1, S, E}, uint64_t(L * 100 + S + 1)).expand({B, H, S, E});
      const Tensor v = rnd({B, H, 2 * S, E}, uint64_t(L * 100 + S + 2)).slice(2, 0, 2 * S, 2);
      // Masks: (L, S) bool with some rows fully masked; (B, 1, 1, S) key padding; float (H, 1, S).
      std::vector<double> mv(size_t(L * S));
      for (int64_t l = 0; l < L; ++l)
        for (int64_t s = 0; s < S; ++s) mv[size_t(l * S + s)] = ((l * 7 + s * 3) % 4 != 0 && l % 5 != 3) ? 1 : 0;
      const Tensor bool_mask = from_vector(mv, {L, S}, TensorOptions(kFloat64)).to(kBool);
      std::vector<double> pad(size_t(B * S));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) pad[size_t(b * S + s)] = s < S - b ? 1 : 0;
      const Tensor pad_mask = from_vector(pad, {B, 1, 1, S}, TensorOptions(kFloat64)).to(kBool);
      const Tensor add_mask = rnd({H, 1, S}, 77, -3, 1);
      struct M {
        const char* name;
        Tensor mask;
        bool causal;
      };
      for (const M& m : {M{"none", Tensor(), false}, M{"causal", Tensor(), true}, M{"bool (L, S)", bool_mask, false},
                         M{"bool pad (B,1,1,S)", pad_mask, false}, M{"float (H,1,S)", add_mask, false},
                         M{"bool pad + causal", pad_mask, true},
                         M{"bool transposed (S, L).t()", bool_mask.t().contiguous().t(), false}}) {
        CAPTURE(L);
        CAPTURE(S);
        CAPTURE(m.name);
        const Tensor out = flash_attention(q, k, v, m.mask, m.causal);
        CHECK(out.sizes() == Shape{B, H, L, E});
        check_close(out, ref_attention(q, k, v, m.mask, m.causal, 1.0 / std::sqrt(double(E))), 1e-12, 1e-12,
                    "flash fwd");
        const Tensor out32 = flash_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32),
                                             m.mask.defined() && m.mask.dtype() != kBool ? m.mask.to(kFloat32) : m.mask,
                                             m.causal, 0.0, 0.3);
        check_close(out32, ref_attention(q, k, v, m.mask, m.causal, 0.3), 1e-5, 1e-5, "flash fwd f32 scale 0.3");
        if (!m.causal || !m.mask.defined()) {
          const Tensor sd = scaled_dot_product_attention(q, k, v, m.mask, m.causal);
          check_close(sd, ref_attention(q, k, v, m.mask, m.causal, 1.0 / std::sqrt(double(E))), 1e-12, 1e-12,
                      "sdpa fwd");
        }
      }
    }
}

TEST_CASE("probe: flash_attention gradients through views (L != S, causal, masks) match finite differences") {
  struct Shp {
    int64_t B, H, L, S, E;
  };
  for (const Shp& s : {Shp{1, 1, 1, 1, 1}, Shp{2, 2, 3, 5, 3}, Shp{1, 2, 7, 2, 4}, Shp{1, 1, 5, 5, 2}}) {
    CAPTURE(s.L);
    CAPTURE(s.S);
    CAPTURE(s.E);
    const Tensor q = leaf({s.B, s.L, s.H, s.E}, 1), k = leaf({s.B, 1, s.S, s.E}, 2), v = leaf({s.B, s.H, s.E, s.S}, 3);
    std::vector<double> mv(size_t(s.L * s.S));
    for (int64_t i = 0; i < s.L * s.S; ++i) mv[size_t(i)] = (i % 3 != 1 || s.S == 1) ? 1 : 0;
    const Tensor bmask = from_vector(mv, {s.L, s.S}, TensorOptions(kFloat64)).to(kBool);
    const Tensor fmask = rnd({s.H, 1, s.S}, 9, -1, 1);
    for (int variant = 0; variant < 4; ++variant) {
      CAPTURE(variant);
      const Tensor mask = variant == 2 ? bmask : variant == 3 ? fmask : Tensor();
      const bool causal = variant == 1;
      auto f = [&](const TensorList& t) {
        // q sequence-major, k expanded across heads, v with a non-contiguous last dim.
        return flash_attention(t[0].permute({0, 2, 1, 3}), t[1].expand({s.B, s.H, s.S, s.E}), t[2].transpose(2, 3),
                               mask, causal);
      };
      check_gradcheck(f, {q, k, v});
      // The composed path on the same views.
      if (!(causal && mask.defined())) {
        auto g = [&](const TensorList& t) {
          return scaled_dot_product_attention(t[0].permute({0, 2, 1, 3}), t[1].expand({s.B, s.H, s.S, s.E}),
                                              t[2].transpose(2, 3), mask, causal);
        };
        check_gradcheck(g, {q, k, v});
      }
    }
  }
}

TEST_CASE("probe: flash_attention and sdpa on size-0 dims") {
  for (const Shape& qs : {Shape{0, 2, 3, 4}, Shape{2, 0, 3, 4}, Shape{2, 2, 0, 4}}) {
    CAPTURE(shape_str(qs));
    const Tensor q = rnd(qs, 1);
    const Tensor k = rnd({qs[0], qs[1], 5, 4}, 2), v = rnd({qs[0], qs[1], 5, 4}, 3);
    CHECK(flash_attention(q, k, v).sizes() == qs);
    CHECK(scaled_dot_product_attention(q, k, v).sizes() == qs);
  }
  // S = 0: no key at all; rows are zeros in both (a row with no key gives zeros).
  const Tensor q = leaf({1, 2, 3, 4}, 4), k = leaf({1, 2, 0, 4}, 5), v = leaf({1, 2, 0, 4}, 6);
  const Tensor out = flash_attention(q, k, v);
  check_close(out, std::vector<double>(24, 0.0), 0, 0, "flash S=0");
  const Tensor sd = scaled_dot_product_attention(q, k, v);
  check_close(sd, std::vector<double>(24, 0.0), 0, 0, "sdpa S=0");
  sum(out).backward();
  REQUIRE(q.grad().defined());
  check_close(q.grad(), std::vector<double>(24, 0.0), 0, 0, "flash S=0 dq");
}

TEST_CASE("probe: sdpa composed path: 3-D and 2-D inputs, Ev != E, causal with L != S, broadcast batch") {
  for (int64_t L : {1, 7, 10})
    for (int64_t S : {1, 4, 9}) {
      CAPTURE(L);
      CAPTURE(S);
      const int64_t E = 3, Ev = 5;
      const Tensor q = rnd({2, E, L}, 1).transpose(1, 2);  // (2, L, E) non-contiguous
      const Tensor k = rnd({1, S, E}, 2).expand({2, S, E});
      const Tensor v = rnd({2, S, 2 * Ev}, 3).narrow(2, 1, Ev);
      for (bool causal : {false, true}) {
        const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), causal);
        const std::vector<double> ref =
            ref_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), Tensor(), causal, 1.0 / std::sqrt(3.0));
        check_close(out, ref, 1e-12, 1e-12, causal ? "sdpa causal" : "sdpa");
      }
      // 2-D inputs (L, E) and a float (L, S) mask with -inf entries (some rows fully -inf).
      std::vector<double> mv(size_t(L * S));
      for (int64_t i = 0; i < L * S; ++i) mv[size_t(i)] = (i / S) % 3 == 2 ? -kInf : (i % 2 ? -kInf : 0.5);
      const Tensor mask = from_vector(mv, {L, S}, TensorOptions(kFloat64));
      const Tensor q2 = q.select(0, 1), k2 = k.select(0, 0), v2 = v.select(0, 1);
      const Tensor out2 = scaled_dot_product_attention(q2, k2, v2, mask);
      const std::vector<double> ref2 = ref_attention(q2.unsqueeze(0).unsqueeze(0), k2.unsqueeze(0).unsqueeze(0),
                                                     v2.unsqueeze(0).unsqueeze(0), mask, false, 1.0 / std::sqrt(3.0));
      check_close(out2, ref2, 1e-12, 1e-12, "sdpa 2-D -inf mask");
      const Tensor f2 =
          flash_attention(q2.unsqueeze(0).unsqueeze(0), k2.unsqueeze(0).unsqueeze(0), rnd({1, 1, S, E}, 4), mask);
      check_close(f2,
                  ref_attention(q2.unsqueeze(0).unsqueeze(0), k2.unsqueeze(0).unsqueeze(0), rnd({1, 1, S, E}, 4), mask,
                                false, 1.0 / std::sqrt(3.0)),
                  1e-12, 1e-12, "flash -inf mask");
    }
}

// ---------------------------------------------------------------------------------------
// layer_norm
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: layer_norm on permuted, strided, expanded inputs and size-0/1 dims") {
  struct Case {
    const char* name;
    Tensor x;
    Shape ns;
    Tensor w, b;
  };
  std::vector<Case> cases = {
      {"permuted 3-D, last dim", rnd({5, 3, 4}, 1).permute({1, 2, 0}), {5}, rnd({5}, 2), rnd({5}, 3)},
      {"permuted 3-D, last two dims", rnd({5, 3, 4}, 4).permute({1, 0, 2}), {5, 4}, rnd({5, 4}, 5), rnd({5, 4}, 6)},
      {"transposed 2-D", rnd({6, 3}, 7).t(), {6}, Tensor(), Tensor()},
      {"strided last dim", rnd({4, 14}, 8).slice(1, 0, 14, 2), {7}, rnd({14}, 9).slice(0, 1, 14, 2), Tensor()},
      {"expanded rows (stride 0)", rnd({1, 7}, 10).expand({3, 7}), {7}, rnd({7}, 11), rnd({7}, 12)},
      {"expanded inner (stride 0)", rnd({3, 1}, 13).expand({3, 4}), {4}, Tensor(), Tensor()},
      {"weight transposed (4,5).t()", rnd({2, 5, 4}, 14), {5, 4}, rnd({4, 5}, 15).t(), rnd({4, 5}, 16).t()},
      {"normalized size 1", rnd({3, 1}, 17), {1}, rnd({1}, 18), rnd({1}, 19)},
      {"zero rows", rnd({0, 5}, 20), {5}, rnd({5}, 21), rnd({5}, 22)},
      {"odd 77", rnd({3, 77}, 23), {77}, rnd({77}, 24), rnd({77}, 25)},
      {"whole tensor", rnd({3, 4}, 26).t(), {4, 3}, Tensor(), Tensor()},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const Tensor y = layer_norm(c.x, c.ns, c.w, c.b, 1e-5);
    CHECK(y.sizes() == c.x.sizes());
    check_close(y, ref_layer_norm(c.x, int64_t(c.ns.size()), c.w, c.b, 1e-5), 1e-10, 1e-10, c.name);
    const Tensor y32 = layer_norm(c.x.to(kFloat32), c.ns, c.w.defined() ? c.w.to(kFloat32) : Tensor(),
                                  c.b.defined() ? c.b.to(kFloat32) : Tensor(), 1e-5);
    check_close(y32, ref_layer_norm(c.x, int64_t(c.ns.size()), c.w, c.b, 1e-5), 1e-4, 1e-4,
                std::string(c.name) + " f32");
  }
}

TEST_CASE("probe: layer_norm gradients through views match finite differences") {
  const Tensor x = leaf({4, 3, 5}, 1), w = leaf({5, 3}, 2), b = leaf({10}, 3);
  check_gradcheck(
      [&](const TensorList& t) {
        return layer_norm(t[0].permute({2, 0, 1}), {3}, t[1].select(0, 2), t[2].slice(0, 0, 6, 2));
      },
      {x, w, b});
  check_gradcheck(
      [&](const TensorList& t) {
        return layer_norm(t[0].transpose(0, 2), {4, 3}, t[1].expand({4, 3}));
      },
      {leaf({3, 4, 2}, 4), leaf({1, 3}, 5)});
  check_gradcheck(
      [&](const TensorList& t) {
        return layer_norm(t[0].expand({3, 4}), {4}, t[1], t[2]);
      },
      {leaf({1, 4}, 6), leaf({4}, 7), leaf({4}, 8)});
}

// ---------------------------------------------------------------------------------------
// softmax / log_softmax along non-last dims
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: softmax and log_softmax along every dim of views, forward and gradient") {
  const Tensor base = rnd({3, 5, 2 * 7}, 1, -4, 4);
  const std::vector<std::pair<const char*, Tensor>> views = {
      {"permute(2,0,1) of (3,5,7)", rnd({3, 5, 7}, 2, -4, 4).permute({2, 0, 1})},
      {"strided last", base.slice(2, 1, 14, 2)},
      {"expanded middle", rnd({3, 1, 7}, 3).expand({3, 4, 7})},
      {"size-1 middle", rnd({6, 1, 5}, 4).transpose(0, 2)},
      {"odd 77 along dim 0", rnd({3, 77}, 5).t()},
      {"size-0 dim", rnd({3, 0, 4}, 6)},
  };
  for (const auto& [name, x] : views)
    for (int64_t d = -x.dim(); d < x.dim(); ++d) {
      CAPTURE(name);
      CAPTURE(d);
      check_close(softmax(x, d), ref_softmax(x, d, false), 1e-12, 1e-14, "softmax");
      check_close(log_softmax(x, d), ref_softmax(x, d, true), 1e-12, 1e-12, "log_softmax");
      check_close(softmax(x.to(kFloat32), d), ref_softmax(x, d, false), 1e-5, 1e-6, "softmax f32");
    }
  for (int64_t d : {0, 1, 2}) {
    CAPTURE(d);
    check_gradcheck([&](const TensorList& t) { return softmax(t[0].permute({2, 0, 1}), d); }, {leaf({3, 4, 5}, 7)});
    check_gradcheck([&](const TensorList& t) { return log_softmax(t[0].permute({2, 0, 1}), d); }, {leaf({3, 4, 5}, 8)});
    check_gradcheck([&](const TensorList& t) { return log_softmax(t[0].expand({3, 4, 5}), d); }, {leaf({3, 1, 5}, 9)});
  }
}

// ---------------------------------------------------------------------------------------
// cross_entropy
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: cross_entropy spatial logits on views, ignore_index, label smoothing, every reduction") {
  const int64_t N = 2, C = 5, H = 3, W = 4;
  // Logits (N, C, H, W) from a channels-last (N, H, W, C) buffer: the layout a conv net makes.
  const Tensor logits = rnd({N, H, W, C}, 1, -3, 3).permute({0, 3, 1, 2});
  std::vector<int64_t> tv(size_t(N * H * W));
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = i % 5 == 3 ? -7 : int64_t((i * 3) % C);
  const Tensor target_c = from_vector(tv, {N, H, W}, TensorOptions(kInt64));
  const Tensor target = target_c.transpose(1, 2).contiguous().transpose(1, 2);  // non-contiguous targets
  for (double eps : {0.0, 0.1, 1.0})
    for (Reduction red : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
      CAPTURE(eps);
      CAPTURE(int(red));
      const CrossEntropyOptions o{.ignore_index = -7, .label_smoothing = eps, .reduction = red};
      check_close(cross_entropy(logits, target, o), ref_cross_entropy(logits, target, -7, eps, red), 1e-12, 1e-12,
                  "ce spatial");
      check_close(cross_entropy(logits.to(kFloat32), target.to(kInt32), o),
                  ref_cross_entropy(logits, target, -7, eps, red), 1e-5, 1e-5, "ce spatial f32 int32");
      // 2-D logits transposed (C, N).t() and strided targets.
      const Tensor l2 = rnd({C, 9}, 2).t();
      const Tensor t2 = from_vector(std::vector<int64_t>{0, 9, 4, 9, 1, 9, 2, 9, 3, 9, 4, 9, 0, 9, 9, 9, 1, 9}, {18},
                                    TensorOptions(kInt64))
                            .slice(0, 0, 18, 2);
      const CrossEntropyOptions o2{.ignore_index = 9, .label_smoothing = eps, .reduction = red};
      check_close(cross_entropy(l2, t2, o2), ref_cross_entropy(l2, t2, 9, eps, red), 1e-12, 1e-12, "ce 2-D views");
      // Gradients through the permute and with a broadcast (expanded) logits row.
      check_gradcheck(
          [&](const TensorList& t) {
            return cross_entropy(t[0].permute({0, 3, 1, 2}), target, o);
          },
          {leaf({N, H, W, C}, 3)});
      check_gradcheck(
          [&](const TensorList& t) {
            return cross_entropy(t[0].expand({9, C}), t2, o2);
          },
          {leaf({1, C}, 4)});
    }
}

TEST_CASE("probe: cross_entropy size-1 class dim, one sample, and (C) logits") {
  const Tensor x = rnd({4, 1}, 1);
  const Tensor t = zeros({4}, TensorOptions(kInt64));
  check_close(cross_entropy(x, t), ref_cross_entropy(x, t, -100, 0.0, Reduction::Mean), 1e-12, 1e-12, "C=1");
  check_close(cross_entropy(x, t, {.label_smoothing = 0.3}), ref_cross_entropy(x, t, -100, 0.3, Reduction::Mean), 1e-12,
              1e-12, "C=1 smooth");
  const Tensor x1 = rnd({6}, 2).slice(0, 0, 6, 2);  // (C) = 3, strided
  const Tensor t1 = scalar_tensor(2, TensorOptions(kInt64));
  check_close(cross_entropy(x1, t1, {.label_smoothing = 0.2}),
              ref_cross_entropy(x1.unsqueeze(0), t1.unsqueeze(0), -100, 0.2, Reduction::Mean), 1e-12, 1e-12, "(C)");
  check_gradcheck(
      [&](const TensorList& a) { return cross_entropy(a[0].slice(0, 0, 6, 2), t1, {.label_smoothing = 0.2}); },
      {leaf({6}, 3)});
}

// ---------------------------------------------------------------------------------------
// embedding
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: embedding with padding_idx on transposed weights and strided indices") {
  const int64_t V = 6, D = 4;
  const Tensor wt = rnd({D, V}, 1);  // weight (V, D) = wt.t(): non-contiguous rows
  const Tensor idx =
      from_vector(std::vector<int64_t>{5, 0, 2, 2, 3, 0, 1, 5, 4, 2, 0, 3}, {3, 4}, TensorOptions(kInt64))
          .t();  // (4, 3) transposed
  const Tensor e = embedding(wt.t(), idx, 2);
  const std::vector<double> wv = vals(wt.t()), iv = vals(idx);
  std::vector<double> ref;
  for (double i : iv)
    for (int64_t d = 0; d < D; ++d) ref.push_back(wv[size_t(int64_t(i) * D + d)]);
  check_close(e, ref, 0, 0, "embedding");
  // padding_idx makes its row non-differentiable on purpose, so finite differences check none.
  check_gradcheck([&](const TensorList& t) { return embedding(t[0].t(), idx); }, {leaf({D, V}, 2)});
  check_gradcheck([&](const TensorList& t) { return embedding(t[0].slice(0, 0, 2 * V, 2), idx.select(1, 0)); },
                  {leaf({2 * V, D}, 3)});
  for (const std::optional<int64_t> pad : {std::optional<int64_t>(), std::optional<int64_t>(0), std::optional<int64_t>(2),
                                          std::optional<int64_t>(5), std::optional<int64_t>(-1), std::optional<int64_t>(-V)}) {
    CAPTURE(pad.value_or(V));
    // The padding row's gradient is exactly zero, the others count their uses; a negative
    // padding_idx counts from the end, as torch.nn.functional.embedding (-1: row V - 1).
    const int64_t pad_row = !pad ? -1 : *pad < 0 ? *pad + V : *pad;
    Tensor w = leaf({V, D}, 4);
    sum(embedding(w, idx, pad)).backward();
    std::vector<double> g(size_t(V * D), 0.0);
    for (double i : iv)
      if (int64_t(i) != pad_row)
        for (int64_t d = 0; d < D; ++d) g[size_t(int64_t(i) * D + d)] += 1;
    check_close(w.grad(), g, 0, 0, "embedding grad counts");
  }
  // Empty indices.
  const Tensor none = zeros({0, 3}, TensorOptions(kInt64));
  CHECK(embedding(wt.t(), none, 1).sizes() == Shape{0, 3, D});
}

// ---------------------------------------------------------------------------------------
// conv2d
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: conv2d with stride, padding, dilation, groups on non-contiguous operands") {
  struct Case {
    int64_t N, C, H, W, K, R, S, G;
    Int2 st, pad, dil;
  };
  const std::vector<Case> cases = {
      {2, 4, 7, 9, 6, 3, 2, 2, {2, 1}, {1, 0}, {1, 2}},
      {1, 3, 5, 5, 3, 3, 3, 3, {1, 1}, {2, 2}, {2, 1}},
      {2, 2, 1, 7, 4, 1, 3, 1, {1, 3}, {0, 1}, {1, 1}},
      {1, 6, 8, 8, 4, 2, 2, 2, {3, 2}, {1, 1}, {3, 2}},
      {3, 1, 4, 3, 2, 4, 3, 1, {1, 1}, {0, 0}, {1, 1}},
      {1, 4, 6, 6, 8, 1, 1, 4, {2, 2}, {0, 0}, {1, 1}},
      {1, 2, 3, 3, 2, 1, 1, 1, {1, 1}, {1, 1}, {1, 1}},
      // 1x1, stride 1, no padding (no im2col), with groups and dilation.
      {2, 4, 3, 5, 6, 1, 1, 2, {1, 1}, {0, 0}, {2, 3}},
      {2, 3, 4, 4, 5, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}},
      // Patchify (stride == kernel, no padding): whole and partial last patches.
      {2, 3, 8, 8, 4, 2, 2, 1, {2, 2}, {0, 0}, {1, 1}},
      {2, 3, 7, 9, 5, 2, 3, 1, {2, 3}, {0, 0}, {1, 1}},
      {1, 2, 5, 8, 3, 1, 4, 1, {1, 4}, {0, 0}, {1, 1}},
      {3, 1, 4, 4, 2, 4, 4, 1, {4, 4}, {0, 0}, {1, 1}},
      {1, 4, 6, 6, 4, 3, 3, 2, {3, 3}, {0, 0}, {1, 1}},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    CAPTURE(ci);
    const Conv2dOptions o{.stride = c.st, .padding = c.pad, .dilation = c.dil, .groups = c.G};
    // x: a W-strided view; a channels-last permute of (N, H, W, C); a transposed (W, H) view.
    const std::vector<std::pair<const char*, Tensor>> xs = {
        {"contiguous", rnd({c.N, c.C, c.H, c.W}, 1)},
        {"strided W", rnd({c.N, c.C, c.H, 2 * c.W}, 2).slice(3, 1, 2 * c.W, 2)},
        {"NHWC permute", rnd({c.N, c.H, c.W, c.C}, 3).permute({0, 3, 1, 2})},
        {"H/W transposed", rnd({c.N, c.C, c.W, c.H}, 4).transpose(2, 3)},
        {"expanded batch", rnd({1, c.C, c.H, c.W}, 5).expand({c.N, c.C, c.H, c.W})},
        {"NHWC of a channel-strided buffer",
         rnd({c.N, c.H, c.W, 2 * c.C}, 11).slice(3, 0, 2 * c.C, 2).permute({0, 3, 1, 2})},
        {"NHWC narrowed in W", rnd({c.N, c.H, c.W + 3, c.C}, 12).narrow(2, 2, c.W).permute({0, 3, 1, 2})},
    };
    const Tensor w = rnd({c.K, c.C / c.G, c.S, c.R}, 6).transpose(2, 3);  // non-contiguous weight
    const Tensor bias = rnd({2 * c.K}, 7).slice(0, 0, 2 * c.K, 2);
    for (const auto& [name, x] : xs) {
      CAPTURE(name);
      Shape os;
      const std::vector<double> ref = ref_conv2d(x, w, bias, c.st, c.pad, c.dil, c.G, &os);
      const Tensor y = conv2d(x, w, bias, o);
      CHECK(y.sizes() == os);
      check_close(y, ref, 1e-11, 1e-11, "conv2d");
      check_close(conv2d(x.to(kFloat32), w.to(kFloat32), bias.to(kFloat32), o), ref, 1e-4, 1e-4, "conv2d f32");
    }
    check_gradcheck(
        [&](const TensorList& t) {
          return conv2d(t[0].permute({0, 3, 1, 2}), t[1].transpose(2, 3), t[2].slice(0, 0, 2 * c.K, 2), o);
        },
        {leaf({c.N, c.H, c.W, c.C}, 8), leaf({c.K, c.C / c.G, c.S, c.R}, 9), leaf({2 * c.K}, 10)});
  }
}

TEST_CASE("probe: conv2d unbatched (C, H, W) view and empty batch") {
  const Tensor x = rnd({5, 4, 3}, 1).permute({2, 1, 0});  // (3, 4, 5)
  const Tensor w = rnd({2, 3, 2, 2}, 2);
  Shape os;
  const std::vector<double> ref = ref_conv2d(x.unsqueeze(0), w, Tensor(), 1, 1, 1, 1, &os);
  const Tensor y = conv2d(x, w, Tensor(), {.padding = 1});
  CHECK(y.sizes() == Shape{os[1], os[2], os[3]});
  check_close(y, ref, 1e-12, 1e-12, "unbatched conv");
  const Tensor x0 = leaf({0, 3, 4, 5}, 3), w0 = leaf({2, 3, 2, 2}, 4), b0 = leaf({2}, 5);
  const Tensor y0 = conv2d(x0, w0, b0);
  CHECK(y0.sizes() == Shape{0, 2, 3, 4});
  sum(y0).backward();
  REQUIRE(w0.grad().defined());
  check_close(w0.grad(), std::vector<double>(24, 0.0), 0, 0, "empty batch dw");
  check_close(b0.grad(), std::vector<double>(2, 0.0), 0, 0, "empty batch db");
}

// ---------------------------------------------------------------------------------------
// pooling
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: max_pool2d / avg_pool2d with ceil_mode and padding on views") {
  struct Case {
    int64_t H, W;
    Int2 k, s, p, d;
    bool ceil;
  };
  const std::vector<Case> cases = {
      {7, 7, 3, 2, 1, 1, true},
      {5, 8, 2, 2, 0, 1, true},
      {6, 5, {3, 2}, {2, 3}, {1, 1}, 1, true},
      {1, 7, {1, 3}, {1, 2}, {0, 1}, 1, false},
      {9, 4, 2, 3, 1, 1, true},
      {8, 8, 3, 1, 1, 2, true},
      {4, 4, 4, 4, 2, 1, false},
      {10, 3, {4, 1}, {3, 1}, {2, 0}, 1, true},
      // Windows inside the plane (the unchecked fast paths): dilated, 2x2/2 on odd sizes, 3x3/3, non-square.
      {9, 8, 3, 1, 0, 2, false},
      {7, 9, 2, 2, 0, 2, false},
      {5, 7, 2, 2, 0, 1, false},
      {9, 10, 3, 3, 0, 1, false},
      {6, 7, {2, 3}, {1, 2}, 0, 1, false},
      {5, 5, 2, 2, 0, 1, true},
      {8, 6, 3, 2, 0, {1, 2}, false},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    CAPTURE(ci);
    const std::vector<std::pair<const char*, Tensor>> xs = {
        {"contiguous", distinct({2, 3, c.H, c.W}, 1)},
        {"NHWC permute", distinct({2, c.H, c.W, 3}, 2).permute({0, 3, 1, 2})},
        {"transposed H/W", distinct({2, 3, c.W, c.H}, 3).transpose(2, 3)},
        {"strided W", distinct({3, c.H, 2 * c.W}, 4).slice(2, 0, 2 * c.W, 2)},
    };
    for (const auto& [name, x] : xs) {
      CAPTURE(name);
      Shape os;
      const std::vector<double> mref = ref_pool(x, c.k, c.s, c.p, c.d, c.ceil, true, true, &os);
      const Tensor m = max_pool2d(x, c.k, {.stride = c.s, .padding = c.p, .dilation = c.d, .ceil_mode = c.ceil});
      CHECK(m.sizes() == os);
      check_close(m, mref, 0, 0, "max_pool2d");
      if (c.d == Int2(1))
        for (bool cip : {true, false}) {
          CAPTURE(cip);
          const std::vector<double> aref = ref_pool(x, c.k, c.s, c.p, 1, c.ceil, false, cip, &os);
          const Tensor a =
              avg_pool2d(x, c.k, {.stride = c.s, .padding = c.p, .ceil_mode = c.ceil, .count_include_pad = cip});
          CHECK(a.sizes() == os);
          check_close(a, aref, 1e-12, 1e-12, "avg_pool2d");
        }
    }
    check_gradcheck(
        [&](const TensorList& t) {
          return max_pool2d(t[0].permute({0, 3, 1, 2}), c.k,
                            {.stride = c.s, .padding = c.p, .dilation = c.d, .ceil_mode = c.ceil});
        },
        {make_leaf(distinct({1, c.H, c.W, 2}, 5))});
    if (c.d == Int2(1))
      for (bool cip : {true, false})
        check_gradcheck(
            [&](const TensorList& t) {
              return avg_pool2d(t[0].transpose(1, 2), c.k,
                                {.stride = c.s, .padding = c.p, .ceil_mode = c.ceil, .count_include_pad = cip});
            },
            {leaf({2, c.W, c.H}, 6)});
  }
}

// ---------------------------------------------------------------------------------------
// reductions: gradients along every dim, keepdim, on views
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: reduction gradients along every dim and keepdim of views match finite differences") {
  for (bool keepdim : {false, true})
    for (int64_t d = -3; d < 3; ++d) {
      CAPTURE(keepdim);
      CAPTURE(d);
      auto view = [](const Tensor& t) { return t.permute({1, 2, 0}).slice(2, 0, 4, 1); };  // (4, 5, 3)
      const Tensor x = make_leaf(distinct({3, 4, 5}, uint64_t(d + 10)));
      check_gradcheck([&](const TensorList& t) { return sum(view(t[0]), {d}, keepdim); }, {x});
      check_gradcheck([&](const TensorList& t) { return mean(view(t[0]), {d}, keepdim); }, {x});
      check_gradcheck([&](const TensorList& t) { return var(view(t[0]), {d}, 1, keepdim); }, {x});
      check_gradcheck([&](const TensorList& t) { return var(view(t[0]), {d}, 0, keepdim); }, {x});
      check_gradcheck([&](const TensorList& t) { return amax(view(t[0]), {d}, keepdim); }, {x});
      check_gradcheck([&](const TensorList& t) { return amin(view(t[0]), {d}, keepdim); }, {x});
      check_gradcheck([&](const TensorList& t) { return max(view(t[0]), d, keepdim).values; }, {x});
      check_gradcheck([&](const TensorList& t) { return min(view(t[0]), d, keepdim).values; }, {x});
      check_gradcheck(
          [&](const TensorList& t) {
            return sum(t[0].transpose(0, 2).expand({2, 5, 4, 3}), {d}, keepdim);
          },
          {x});
    }
  // Multi-dim reductions and std as sqrt(var) along a transposed view.
  const Tensor x = make_leaf(distinct({3, 4, 5}, 99));
  check_gradcheck([&](const TensorList& t) { return var(t[0].transpose(0, 2), {0, 2}, 1, true); }, {x});
  check_gradcheck([&](const TensorList& t) { return sqrt(var(t[0].transpose(0, 1), {1})); }, {x});
  check_gradcheck([&](const TensorList& t) { return amax(t[0].permute({2, 0, 1}), {0, 1}); }, {x});
}

TEST_CASE("probe: argmax/argmin and max indices along every dim of transposed and expanded views") {
  const Tensor b = distinct({4, 6, 5}, 3);
  for (const Tensor& x :
       {b.permute({2, 0, 1}), b.slice(1, 1, 6, 2).transpose(0, 2), b.select(1, 2).unsqueeze(1).expand({4, 3, 5})})
    for (int64_t d = 0; d < x.dim(); ++d)
      for (bool keepdim : {false, true}) {
        CAPTURE(d);
        CAPTURE(keepdim);
        const std::vector<double> xv = vals(x);
        const Shape s = x.sizes();
        Shape os = s;
        os[size_t(d)] = 1;
        std::vector<double> amx(size_t(numel_of(os))), amn(size_t(numel_of(os)));
        for (int64_t o = 0; o < numel_of(os); ++o) {
          std::vector<int64_t> idx = unravel(o, os);
          int64_t bi = 0, si = 0;
          double bv = -kInf, sv = kInf;
          for (int64_t j = 0; j < s[size_t(d)]; ++j) {
            idx[size_t(d)] = j;
            const double v = xv[size_t(lin(idx, s))];
            if (v > bv) bv = v, bi = j;
            if (v < sv) sv = v, si = j;
          }
          amx[size_t(o)] = double(bi), amn[size_t(o)] = double(si);
        }
        const Tensor am = argmax(x, d, keepdim);
        check_close(am, amx, 0, 0, "argmax");
        check_close(argmin(x, d, keepdim), amn, 0, 0, "argmin");
        check_close(max(x, d, keepdim).indices, amx, 0, 0, "max.indices");
        if (keepdim) CHECK(am.sizes() == os);
      }
}

// ---------------------------------------------------------------------------------------
// raw in-place ops on views
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: raw in-place ops through views write the base where the view points") {
  // x.t().add_(y): the base sees y transposed.
  {
    const Tensor base = rnd({3, 4}, 1);
    const std::vector<double> bv = vals(base);
    const Tensor y = rnd({4, 3}, 2);
    const std::vector<double> yv = vals(y);
    ops::add_(base.t(), y, 2.0);
    std::vector<double> ref = bv;
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j) ref[size_t(i * 4 + j)] += 2.0 * yv[size_t(j * 3 + i)];
    check_close(base, ref, 1e-15, 1e-15, "t().add_");
  }
  // A strided column block: mul_ by a broadcast row (stride-0 operand), sub_ a scalar.
  {
    const Tensor base = rnd({5, 8}, 3);
    const std::vector<double> bv = vals(base);
    const Tensor view = base.slice(1, 1, 8, 3).slice(0, 0, 5, 2);  // rows 0,2,4; cols 1,4,7
    const Tensor r = rnd({3}, 4);
    const std::vector<double> rv = vals(r);
    ops::mul_(view, r.unsqueeze(0).expand({3, 3}));
    ops::sub_(view, 0.5);
    std::vector<double> ref = bv;
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        double& e = ref[size_t((2 * i) * 8 + 1 + 3 * j)];
        e = e * rv[size_t(j)] - 0.5;
      }
    check_close(base, ref, 1e-15, 1e-15, "strided block mul_/sub_");
  }
  // A permuted 3-D view, add_ of a transposed operand; then a select'ed column div_.
  {
    const Tensor base = rnd({2, 3, 4}, 5);
    const std::vector<double> bv = vals(base);
    const Tensor o = rnd({3, 4, 2}, 6);
    const std::vector<double> ov = vals(o);
    ops::add_(base.permute({1, 2, 0}), o.permute({0, 1, 2}));
    std::vector<double> ref = bv;
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t c = 0; c < 4; ++c) ref[size_t((a * 3 + b) * 4 + c)] += ov[size_t((b * 4 + c) * 2 + a)];
    check_close(base, ref, 1e-15, 1e-15, "permute add_");
    ops::div_(base.select(2, 1), 4.0);
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b) ref[size_t((a * 3 + b) * 4 + 1)] /= 4.0;
    check_close(base, ref, 1e-15, 1e-15, "select div_");
  }
  // A view at an offset added to a disjoint view of the same storage.
  {
    const Tensor base = rnd({6, 4}, 7);
    std::vector<double> ref = vals(base);
    ops::add_(base.narrow(0, 0, 3), base.narrow(0, 3, 3));
    for (int64_t i = 0; i < 12; ++i) ref[size_t(i)] += ref[size_t(i + 12)];
    check_close(base, ref, 1e-15, 1e-15, "disjoint halves");
  }
  // Autograd: an in-place op through a view of a tensor in the graph must not be silent.
  {
    const Tensor x = leaf({3, 4}, 8);
    const Tensor y = x * 2.0;
    check_error([&] { add_(y.t(), rnd({4, 3}, 9)); }, {"add_"});
  }
}

// ---------------------------------------------------------------------------------------
// 16-bit dtypes and sizes large enough to split across threads
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: 16-bit inputs on views: gelu_mlp, flash_attention, layer_norm, softmax dim 0, conv2d, pools, ce") {
  for (DType dt : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const double tol = dt == kFloat16 ? 1e-2 : 6e-2;
    auto r16 = [&](const Tensor& t) { return t.to(dt).to(kFloat64); };  // the values the op sees
    {
      const Tensor x = r16(rnd({5, 6}, 1, -1, 1)), w1 = r16(rnd({7, 5}, 2, -1, 1)), b1 = r16(rnd({7}, 3)),
                   w2 = r16(rnd({3, 7}, 4, -1, 1)), b2 = r16(rnd({3}, 5));
      const Tensor y = gelu_mlp(x.to(dt).t(), w1.to(dt), b1.to(dt), w2.to(dt), b2.to(dt));
      check_close(y, ref_gelu_mlp(x.t(), w1, b1, w2, b2), tol, tol, "gelu_mlp 16");
    }
    {
      const Tensor q = r16(rnd({1, 9, 2, 4}, 6)).permute({0, 2, 1, 3}), k = r16(rnd({1, 2, 5, 4}, 7)),
                   v = r16(rnd({1, 2, 5, 8}, 8)).narrow(3, 2, 4);
      for (bool causal : {false, true})
        check_close(flash_attention(q.to(dt), k.to(dt), v.to(dt), Tensor(), causal),
                    ref_attention(q, k, v, Tensor(), causal, 0.5), tol, tol, "flash 16");
    }
    {
      const Tensor x = r16(rnd({6, 3, 5}, 9)).permute({1, 2, 0});
      const Tensor w = r16(rnd({6}, 10)), b = r16(rnd({6}, 11));
      check_close(layer_norm(x.to(dt), {6}, w.to(dt), b.to(dt)), ref_layer_norm(x, 1, w, b, 1e-5), tol, tol, "ln 16");
      check_close(softmax(x.to(dt), 0), ref_softmax(x, 0, false), tol, tol / 10, "softmax 16 dim 0");
      check_close(log_softmax(x.to(dt), 1), ref_softmax(x, 1, true), tol, tol, "log_softmax 16 dim 1");
    }
    {
      const Tensor x = r16(rnd({2, 5, 6, 4}, 12)).permute({0, 3, 1, 2}), w = r16(rnd({6, 2, 3, 3}, 13, -0.5, 0.5));
      Shape os;
      const std::vector<double> ref = ref_conv2d(x, w, Tensor(), 2, 1, 1, 2, &os);
      check_close(conv2d(x.to(dt), w.to(dt), Tensor(), {.stride = 2, .padding = 1, .groups = 2}), ref, tol, tol,
                  "conv 16");
      const std::vector<double> mref = ref_pool(x, 3, 2, 1, 1, true, true, true, &os);
      check_close(max_pool2d(x.to(dt), 3, {.stride = 2, .padding = 1, .ceil_mode = true}), mref, 0, 0, "maxpool 16");
      const std::vector<double> aref = ref_pool(x, 3, 2, 1, 1, true, false, false, &os);
      check_close(avg_pool2d(x.to(dt), 3, {.stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false}),
                  aref, tol, tol, "avgpool 16");
    }
    {
      const Tensor l = r16(rnd({4, 7}, 14, -3, 3)).t();  // (7, 4)
      const Tensor t = from_vector(std::vector<int64_t>{0, 3, -100, 2, 1, 1, 3}, {7}, TensorOptions(kInt64));
      check_close(cross_entropy(l.to(dt), t, {.label_smoothing = 0.1}),
                  ref_cross_entropy(l, t, -100, 0.1, Reduction::Mean), tol, tol, "ce 16");
    }
  }
}

TEST_CASE("probe: threaded sizes: softmax dim 0, layer_norm, flash_attention, cross_entropy, conv2d, pools") {
  {
    const Tensor x = rnd({257, 300}, 1, -5, 5).t();  // (300, 257), softmax along dim 0 and 1
    for (int64_t d : {0, 1}) {
      check_close(softmax(x, d), ref_softmax(x, d, false), 1e-12, 1e-15, "softmax large");
      check_close(log_softmax(x.to(kFloat32), d), ref_softmax(x, d, true), 1e-5, 1e-5, "log_softmax large f32");
    }
    const Tensor x3 = rnd({40, 33, 65}, 2).permute({1, 0, 2});
    check_close(softmax(x3, 1), ref_softmax(x3, 1, false), 1e-12, 1e-15, "softmax 3-D middle large");
  }
  {
    const Tensor x = rnd({1025, 131}, 3).t();  // rows of 1025, non-contiguous
    const Tensor w = rnd({1025}, 4), b = rnd({1025}, 5);
    check_close(layer_norm(x, {1025}, w, b), ref_layer_norm(x, 1, w, b, 1e-5), 1e-10, 1e-10, "ln large");
    check_close(layer_norm(x.to(kFloat32), {1025}, w.to(kFloat32), b.to(kFloat32)), ref_layer_norm(x, 1, w, b, 1e-5),
                1e-4, 1e-4, "ln large f32");
  }
  {
    const Tensor q = rnd({2, 150, 3, 16}, 6).permute({0, 2, 1, 3}), k = rnd({2, 3, 131, 16}, 7),
                 v = rnd({2, 1, 131, 16}, 8).expand({2, 3, 131, 16});
    check_close(flash_attention(q, k, v, Tensor(), true), ref_attention(q, k, v, Tensor(), true, 0.25), 1e-12, 1e-12,
                "flash large causal");
    check_close(scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32)),
                ref_attention(q, k, v, Tensor(), false, 0.25), 1e-5, 1e-5, "sdpa large f32");
  }
  {
    const Tensor l = rnd({3, 37, 29, 11}, 9, -4, 4).permute({0, 3, 1, 2});  // (3, 11, 37, 29) classes 11
    std::vector<int64_t> tv(size_t(3 * 37 * 29));
    for (size_t i = 0; i < tv.size(); ++i) tv[i] = i % 7 == 0 ? -100 : int64_t((i * 5) % 11);
    const Tensor t = from_vector(tv, {3, 37, 29}, TensorOptions(kInt64));
    for (Reduction red : {Reduction::Mean, Reduction::None})
      check_close(cross_entropy(l, t, {.label_smoothing = 0.05, .reduction = red}),
                  ref_cross_entropy(l, t, -100, 0.05, red), 1e-11, 1e-11, "ce large spatial");
    const Tensor l2 = rnd({1031, 600}, 10).t();  // (600, 1031), C = 1031
    std::vector<int64_t> t2(600);
    for (size_t i = 0; i < t2.size(); ++i) t2[i] = int64_t((i * 37) % 1031);
    const Tensor tt2 = from_vector(t2, {600}, TensorOptions(kInt64));
    check_close(cross_entropy(l2, tt2, {.label_smoothing = 0.2}),
                ref_cross_entropy(l2, tt2, -100, 0.2, Reduction::Mean), 1e-11, 1e-11, "ce large C");
  }
  {
    const Tensor x = rnd({3, 20, 21, 8}, 11).permute({0, 3, 1, 2});
    const Tensor w = rnd({12, 4, 3, 3}, 12);
    Shape os;
    const std::vector<double> ref = ref_conv2d(x, w, Tensor(), {2, 1}, {1, 2}, {2, 1}, 2, &os);
    check_close(conv2d(x, w, Tensor(), {.stride = {2, 1}, .padding = {1, 2}, .dilation = {2, 1}, .groups = 2}), ref,
                1e-11, 1e-11, "conv large");
    const std::vector<double> mref = ref_pool(x, 3, 2, 1, 1, true, true, true, &os);
    check_close(max_pool2d(x, 3, {.stride = 2, .padding = 1, .ceil_mode = true}), mref, 0, 0, "maxpool large");
  }
}

// ---------------------------------------------------------------------------------------
// backward with the gradients users' losses produce (stride-0 from sum(), transposed)
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: flash_attention, gelu_mlp, layer_norm, conv2d backward from sum() and transposed losses") {
  // sum() hands backward an expanded (all strides 0) gradient; a loss through .transpose a
  // non-contiguous one. Both must give the gradcheck-verified gradients of the same function.
  auto compare = [](const std::function<Tensor(const TensorList&)>& f, const TensorList& in, const char* what) {
    CAPTURE(what);
    // d/dx sum(f(x) * c) with c a fixed random tensor (non-contiguous upstream gradient)...
    const Tensor y = f(in);
    const Tensor c = rnd(y.sizes(), 42);
    const TensorList ga = autograd::grad({sum(y * c)}, in);
    const TensorList gb = autograd::grad({sum(f(in))}, in);
    // ...against finite differences of the same projections.
    const double eps = 1e-6;
    for (size_t k = 0; k < in.size(); ++k) {
      std::vector<double> na(size_t(in[k].numel())), nb(size_t(in[k].numel()));
      {
        NoGradGuard ng;
        double* data = in[k].data_ptr<double>();
        for (int64_t i = 0; i < in[k].numel(); ++i) {
          const double o = data[i];
          data[i] = o + eps;
          const Tensor yp = f(in);
          const double pa = ops::sum(ops::mul(yp, c)).item<double>(), pb = ops::sum(yp).item<double>();
          data[i] = o - eps;
          const Tensor ym = f(in);
          const double ma = ops::sum(ops::mul(ym, c)).item<double>(), mb = ops::sum(ym).item<double>();
          data[i] = o;
          na[size_t(i)] = (pa - ma) / (2 * eps), nb[size_t(i)] = (pb - mb) / (2 * eps);
        }
      }
      check_close(ga[k], na, 1e-5, 1e-7, "grad of sum(f * c)");
      check_close(gb[k], nb, 1e-5, 1e-7, "grad of sum(f)");
    }
  };
  compare(
      [](const TensorList& t) {
        return flash_attention(t[0].permute({0, 2, 1, 3}), t[1], t[2], Tensor(), true).transpose(1, 2);
      },
      {leaf({1, 4, 2, 3}, 1), leaf({1, 2, 5, 3}, 2), leaf({1, 2, 5, 3}, 3)}, "flash");
  compare([](const TensorList& t) { return gelu_mlp(t[0].t(), t[1], t[2], t[3], t[4]).t(); },
          {leaf({3, 4}, 4), leaf({5, 3}, 5), leaf({5}, 6), leaf({2, 5}, 7), leaf({2}, 8)}, "gelu_mlp");
  compare([](const TensorList& t) { return layer_norm(t[0].t(), {3}, t[1], t[2]).t(); },
          {leaf({3, 4}, 9), leaf({3}, 10), leaf({3}, 11)}, "layer_norm");
  compare(
      [](const TensorList& t) {
        return conv2d(t[0], t[1], t[2], {.stride = 2, .padding = 1}).permute({0, 2, 3, 1});
      },
      {leaf({2, 2, 5, 5}, 12), leaf({3, 2, 3, 3}, 13), leaf({3}, 14)}, "conv2d");
  compare(
      [](const TensorList& t) {
        return conv2d(t[0], t[1], t[2], {.stride = 2}).permute({0, 2, 3, 1});
      },
      {leaf({2, 2, 5, 4}, 15), leaf({3, 2, 2, 2}, 16), leaf({3}, 17)}, "conv2d patchify");
  compare([](const TensorList& t) { return max_pool2d(t[0], 2, {.ceil_mode = true}).transpose(2, 3); },
          {make_leaf(distinct({1, 2, 5, 5}, 18))}, "max_pool2d");
  compare(
      [](const TensorList& t) {
        return avg_pool2d(t[0], 3, {.stride = 2, .padding = 1, .ceil_mode = true}).transpose(2, 3);
      },
      {leaf({1, 2, 6, 5}, 19)}, "avg_pool2d");
  compare([](const TensorList& t) { return softmax(t[0], 0).t(); }, {leaf({4, 3}, 20)}, "softmax");
}

// ---------------------------------------------------------------------------------------
// checkpointing the new ops: full, selective (keeps gelu_mlp / flash outputs), recompute_cheap
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: gelu_mlp, flash_attention, layer_norm under checkpoint policies give plain gradients") {
  const Tensor w1 = leaf({6, 4}, 1), b1 = leaf({6}, 2), w2 = leaf({4, 6}, 3), b2 = leaf({4}, 4), g = leaf({4}, 5);
  auto block = [&](const Tensor& x) {
    // A transformer block's shape: ln -> attention over a transposed view -> mlp, residuals.
    const Tensor h = layer_norm(x, {4}, g);
    const Tensor q = h.unsqueeze(1);  // (B, 1, T, 4)
    const Tensor a = flash_attention(q, q, q.transpose(2, 3).contiguous().transpose(2, 3), Tensor(), true).squeeze(1);
    const Tensor r = x + a;
    return r + gelu_mlp(layer_norm(r, {4}), w1, b1, w2, b2);
  };
  for (int mode = 0; mode < 4; ++mode) {
    CAPTURE(mode);
    check_gradcheck(
        [&](const TensorList& t) {
          const Tensor x = t[0].transpose(0, 1);  // (2, 3, 4) from a (3, 2, 4) leaf
          if (mode == 1) return autograd::checkpoint(block, x, autograd::CheckpointPolicy::Full);
          if (mode == 2) return autograd::checkpoint(block, x, autograd::CheckpointPolicy::Selective);
          if (mode == 3) return autograd::recompute_cheap(block, x);
          return block(x);
        },
        {leaf({3, 2, 4}, 6), w1, b1, w2, b2, g});
  }
}

// ---------------------------------------------------------------------------------------
// more losses and attention options users pass
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: cross_entropy with ignore_index a real class (pad id 0, C-1), smoothing, gradients") {
  const int64_t N = 7, C = 4;
  const Tensor logits = rnd({C, N}, 1, -3, 3).t();
  const Tensor t = from_vector(std::vector<int64_t>{0, 1, 3, 0, 2, 3, 1}, {N}, TensorOptions(kInt64));
  for (int64_t ign : {0, 3})
    for (double eps : {0.0, 0.25})
      for (Reduction red : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
        CAPTURE(ign);
        CAPTURE(eps);
        CAPTURE(int(red));
        const CrossEntropyOptions o{.ignore_index = ign, .label_smoothing = eps, .reduction = red};
        check_close(cross_entropy(logits, t, o), ref_cross_entropy(logits, t, ign, eps, red), 1e-12, 1e-12, "ce");
        check_gradcheck([&](const TensorList& a) { return cross_entropy(a[0].t(), t, o); }, {leaf({C, N}, 2)});
        if (red != Reduction::None) {
          const Tensor x = rnd({2, N, 5}, 3).transpose(0, 1);  // (N, 2, 5) -> rows of 5 features
          const Tensor w = rnd({5, C}, 4).t();
          const Tensor tt = t.unsqueeze(1).expand({N, 2});
          for (int64_t chunk : {0, 1, 3}) {
            CAPTURE(chunk);
            const LinearCrossEntropyOptions lo{.loss = o, .chunk_rows = chunk};
            const Tensor fused = linear_cross_entropy(x, w, rnd({C}, 5), tt, lo);
            const Tensor plain = cross_entropy(linear(x, w, rnd({C}, 5)).reshape({2 * N, C}), tt.reshape({2 * N}), o);
            check_close(fused, vals(plain), 1e-12, 1e-12, "linear_cross_entropy");
            check_gradcheck(
                [&](const TensorList& a) { return linear_cross_entropy(a[0].transpose(0, 1), a[1].t(), a[2], tt, lo); },
                {leaf({2, N, 5}, 6), leaf({5, C}, 7), leaf({C}, 8)});
          }
        }
      }
}

TEST_CASE("probe: scaled_dot_product_attention: a float mask that requires grad, scale, dropout_p = 1") {
  const int64_t B = 2, H = 2, L = 3, S = 4, E = 3;
  const Tensor q = leaf({B, H, L, E}, 1), k = leaf({B, H, S, E}, 2), v = leaf({B, H, S, E}, 3);
  const Tensor m = leaf({L, S}, 4, -1, 1);
  check_gradcheck(
      [&](const TensorList& t) {
        return scaled_dot_product_attention(t[0], t[1], t[2], t[3].t().t(), false, 0.0, 0.3);
      },
      {q, k, v, m});
  check_gradcheck(
      [&](const TensorList& t) {
        return scaled_dot_product_attention(t[0], t[1], t[2], t[3].expand({B, 1, L, S}));
      },
      {q, k, v, leaf({1, S}, 5)});
  // p = 1 drops every weight: zeros, as torch.
  const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), false, 1.0);
  check_close(out, std::vector<double>(size_t(B * H * L * E), 0.0), 0, 0, "dropout 1");
  // scale given explicitly on the flash path agrees with the composed one, causal L > S.
  const Tensor q2 = rnd({1, 1, 6, E}, 6), k2 = rnd({1, 1, 2, E}, 7), v2 = rnd({1, 1, 2, E}, 8);
  check_close(flash_attention(q2, k2, v2, Tensor(), true, 0.0, 2.5), ref_attention(q2, k2, v2, Tensor(), true, 2.5),
              1e-12, 1e-12, "flash scale 2.5 causal L > S");
  check_close(scaled_dot_product_attention(q2, k2, v2, Tensor(), true, 0.0, 2.5),
              ref_attention(q2, k2, v2, Tensor(), true, 2.5), 1e-12, 1e-12, "sdpa scale 2.5 causal L > S");
  // causal with L < S: query l sees keys 0..l only (top-left), not the last keys.
  const Tensor q3 = rnd({1, 1, 2, E}, 9), k3 = rnd({1, 1, 6, E}, 10), v3 = rnd({1, 1, 6, E}, 11);
  check_close(flash_attention(q3, k3, v3, Tensor(), true),
              ref_attention(q3, k3, v3, Tensor(), true, 1 / std::sqrt(3.0)), 1e-12, 1e-12, "flash causal L < S");
  check_close(scaled_dot_product_attention(q3, k3, v3, Tensor(), true),
              ref_attention(q3, k3, v3, Tensor(), true, 1 / std::sqrt(3.0)), 1e-12, 1e-12, "sdpa causal L < S");
  // A float mask plus causal on the flash path (allowed there).
  const Tensor fm = rnd({6, 2}, 12, -2, 2);
  check_close(flash_attention(q2, k2, v2, fm, true), ref_attention(q2, k2, v2, fm, true, 1 / std::sqrt(3.0)), 1e-12,
              1e-12, "flash float mask + causal");
}

TEST_CASE("probe: recorded in-place ops on non-leaf tensors with broadcast, transposed and aliased operands") {
  check_gradcheck(
      [&](const TensorList& t) {
        Tensor y = t[0] * 1.0;         // (3, 4), not a view
        add_(y, t[1].t(), 0.5);        // transposed operand
        mul_(y, t[2].expand({3, 4}));  // broadcast operand that requires grad
        sub_(y, t[1].t());
        return y;
      },
      {leaf({3, 4}, 1), leaf({4, 3}, 2), leaf({1, 4}, 3)});
  check_gradcheck(
      [&](const TensorList& t) {
        Tensor y = t[0] * 1.0;
        mul_(y, y);  // other is self: d(y^2) = 2 y
        div_(y, t[0] + 3.0);
        return y;
      },
      {leaf({5}, 4, 0.5, 2)});
}

// ---------------------------------------------------------------------------------------
// dropout inside attention under checkpoints; layouts of conv/pool/elementwise operands
// ---------------------------------------------------------------------------------------

TEST_CASE("probe: attention dropout under full and selective checkpoints gives the plain gradients") {
  const Tensor x = leaf({2, 5, 4}, 1);
  for (int path = 0; path < 2; ++path) {
    CAPTURE(path);
    auto block = [&](const Tensor& h) {
      const Tensor q = h.unsqueeze(1);  // (2, 1, 5, 4)
      const Tensor kv = (h * 0.5).unsqueeze(1).transpose(2, 3).contiguous().transpose(2, 3);
      const Tensor a = path == 0 ? flash_attention(q, kv, kv, Tensor(), true, 0.4)
                                 : scaled_dot_product_attention(q, kv, kv, Tensor(), true, 0.4);
      return a.squeeze(1) * h;
    };
    std::vector<std::vector<double>> grads, outs;
    for (int mode = 0; mode < 3; ++mode) {
      CAPTURE(mode);
      manual_seed(1234);
      const Tensor y = mode == 0   ? block(x.transpose(0, 1).transpose(0, 1))
                       : mode == 1 ? autograd::checkpoint(block, x, autograd::CheckpointPolicy::Full)
                                   : autograd::checkpoint(block, x, autograd::CheckpointPolicy::Selective);
      outs.push_back(vals(y));
      const Tensor c = rnd(y.sizes(), 7);
      grads.push_back(vals(autograd::grad({sum(y * c)}, {x})[0]));
    }
    check_close(outs[1], outs[0], 1e-14, 1e-14, "full checkpoint out");
    check_close(outs[2], outs[0], 1e-14, 1e-14, "selective checkpoint out");
    check_close(grads[1], grads[0], 1e-12, 1e-12, "full checkpoint grad");
    check_close(grads[2], grads[0], 1e-12, 1e-12, "selective checkpoint grad");
  }
}

TEST_CASE("probe: conv2d with a channels-last weight or gradient, and C = 1 / H = W = 1 (ambiguous) operands") {
  const Tensor x = rnd({2, 4, 5, 6}, 1);
  const Tensor w_cl = rnd({6, 3, 3, 2}, 2).permute({0, 3, 1, 2});  // (6, 2, 3, 3) channels-last
  Shape os;
  const std::vector<double> ref = ref_conv2d(x, w_cl, Tensor(), 1, 1, 1, 2, &os);
  check_close(conv2d(x, w_cl, Tensor(), {.padding = 1, .groups = 2}), ref, 1e-12, 1e-12, "cl weight");
  check_gradcheck(
      [&](const TensorList& t) {
        return conv2d(t[0], t[1].permute({0, 3, 1, 2}), Tensor(), {.padding = 1, .groups = 2});
      },
      {leaf({1, 4, 3, 4}, 3), leaf({6, 3, 3, 2}, 4)});
  // Upstream gradient channels-last (a loss through permute) into a contiguous conv.
  check_gradcheck(
      [&](const TensorList& t) {
        return conv2d(t[0], t[1], t[2], {.stride = {1, 2}}).permute({0, 2, 3, 1});
      },
      {leaf({2, 3, 4, 5}, 5), leaf({2, 3, 2, 2}, 6), leaf({2}, 7)});
  // Ambiguous layouts: C = 1 from an NHWC buffer, H = W = 1, N = 1.
  for (const Tensor& xa : {rnd({2, 5, 6, 1}, 8).permute({0, 3, 1, 2}), rnd({3, 1, 1, 4}, 9).permute({0, 3, 1, 2}),
                           rnd({1, 5, 6, 4}, 10).permute({0, 3, 1, 2})}) {
    CAPTURE(shape_str(xa.sizes()));
    const Tensor wa = rnd({3, xa.size(1), 1, 1}, 11);
    check_close(conv2d(xa, wa), ref_conv2d(xa, wa, Tensor(), 1, 0, 1, 1, &os), 1e-12, 1e-12, "ambiguous conv");
    check_close(
        relu(xa) + xa.contiguous(),
        [&] {
          std::vector<double> v = vals(xa);
          for (double& e : v) e = std::max(e, 0.0) + e;
          return v;
        }(),
        1e-15, 1e-15, "ambiguous elementwise");
    const std::vector<double> aref = ref_pool(xa, {1, 1}, 1, 0, 1, false, false, true, &os);
    check_close(avg_pool2d(xa, 1), aref, 1e-15, 1e-15, "ambiguous avg_pool2d");
    check_close(adaptive_avg_pool2d(xa, {1, 1}), vals(ops::mean(xa, {2, 3}, true)), 1e-14, 1e-14, "adaptive 1x1");
  }
}

TEST_CASE("probe: adaptive_avg_pool2d on views, shrinking and growing, with gradients") {
  const Tensor x = rnd({2, 7, 5, 3}, 1).permute({0, 3, 1, 2});  // (2, 3, 7, 5) channels-last
  for (Int2 o : {Int2(3), Int2{4, 2}, Int2{9, 7}, Int2{1, 5}}) {
    CAPTURE(o.str());
    std::vector<double> ref;
    const std::vector<double> xv = vals(x);
    const int64_t H = 7, W = 5;
    for (int64_t p = 0; p < 6; ++p)
      for (int64_t oh = 0; oh < o.h; ++oh)
        for (int64_t ow = 0; ow < o.w; ++ow) {
          const int64_t h0 = oh * H / o.h, h1 = ((oh + 1) * H + o.h - 1) / o.h;
          const int64_t w0 = ow * W / o.w, w1 = ((ow + 1) * W + o.w - 1) / o.w;
          double s = 0;
          for (int64_t i = h0; i < h1; ++i)
            for (int64_t j = w0; j < w1; ++j) s += xv[size_t((p * H + i) * W + j)];
          ref.push_back(s / double((h1 - h0) * (w1 - w0)));
        }
    check_close(adaptive_avg_pool2d(x, o), ref, 1e-12, 1e-12, "adaptive");
    check_gradcheck(
        [&](const TensorList& t) {
          return adaptive_avg_pool2d(t[0].permute({0, 3, 1, 2}), o);
        },
        {leaf({1, 7, 5, 2}, 2)});
  }
}

TEST_CASE("probe: binary ops and in-place ops on mixed 4-D layouts and broadcasts") {
  const Tensor a_cl = rnd({2, 4, 3, 5}, 1, -2, 2).permute({0, 3, 1, 2});  // (2, 5, 4, 3) channels-last
  const Tensor b_t = rnd({2, 5, 3, 4}, 2).transpose(2, 3);                // H/W transposed
  const Tensor c_b = rnd({5, 1, 1}, 3);                                   // per-channel broadcast
  const std::vector<double> av = vals(a_cl), bv = vals(b_t), cv = vals(c_b);
  std::vector<double> ref(av.size());
  for (size_t i = 0; i < av.size(); ++i) {
    const int64_t ch = (int64_t(i) / 12) % 5;
    ref[i] = av[i] * bv[i] + cv[size_t(ch)] - av[i] / (std::fabs(bv[i]) + 1);
  }
  check_close(ops::sub(ops::add(ops::mul(a_cl, b_t), c_b), ops::div(a_cl, ops::add(ops::abs(b_t), 1.0))), ref, 1e-14,
              1e-14, "mixed layouts");
  check_close(ops::sub(ops::add(ops::mul(b_t, a_cl), c_b), ops::div(a_cl, ops::add(ops::abs(b_t), 1.0))), ref, 1e-14,
              1e-14, "mixed layouts, transposed first");
  // In place: a contiguous self and a channels-last other, and the reverse.
  {
    const Tensor s = b_t.contiguous();
    ops::add_(s, a_cl);
    std::vector<double> r(av.size());
    for (size_t i = 0; i < av.size(); ++i) r[i] = bv[i] + av[i];
    check_close(s, r, 1e-15, 1e-15, "contig += cl");
    const Tensor s2 = a_cl.clone();
    ops::mul_(s2, b_t);
    for (size_t i = 0; i < av.size(); ++i) r[i] = av[i] * bv[i];
    check_close(s2, r, 1e-15, 1e-15, "clone(cl) *= transposed");
  }
  // An NHWC base written through its NCHW permute, then read as NHWC.
  {
    const Tensor base = rnd({2, 4, 3, 5}, 4);
    const std::vector<double> bb = vals(base);
    ops::mul_(base.permute({0, 3, 1, 2}), c_b);
    std::vector<double> r = bb;
    for (size_t i = 0; i < r.size(); ++i) r[i] *= cv[i % 5];
    check_close(base, r, 1e-15, 1e-15, "NHWC base via permute");
  }
  // to(dtype) and clone of channels-last and ambiguous tensors keep the values.
  check_close(a_cl.to(kFloat32), av, 1e-6, 1e-6, "to f32 cl");
  check_close(a_cl.clone(), av, 0, 0, "clone cl");
  const Tensor amb = rnd({3, 1, 1, 4}, 5).permute({0, 3, 1, 2});
  check_close(amb.to(kFloat32).to(kFloat64), vals(amb), 1e-6, 1e-6, "to ambiguous");
}

TEST_CASE("probe: rows with no key left (all-false bool mask, all -inf float mask) give zero outputs and gradients") {
  const int64_t L = 3, S = 4, E = 2;
  const Tensor bmask =
      from_vector(std::vector<double>{1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0}, {L, S}, TensorOptions(kFloat64)).to(kBool);
  const Tensor fmask =
      from_vector(std::vector<double>{0, -kInf, 0, 0, -kInf, -kInf, -kInf, -kInf, -kInf, 0, -kInf, -kInf}, {L, S},
                  TensorOptions(kFloat64));
  for (const Tensor& m : {bmask, fmask}) {
    CAPTURE(dtype_name(m.dtype()));
    const Tensor q = leaf({1, 1, L, E}, 1), k = leaf({1, 1, S, E}, 2), v = leaf({1, 1, S, E}, 3);
    for (int path = 0; path < 2; ++path) {
      CAPTURE(path);
      auto f = [&](const TensorList& t) {
        return path == 0 ? flash_attention(t[0], t[1], t[2], m) : scaled_dot_product_attention(t[0], t[1], t[2], m);
      };
      const Tensor out = f({q, k, v});
      check_close(out, ref_attention(q, k, v, m, false, 1 / std::sqrt(2.0)), 1e-12, 1e-12, "fwd");
      check_gradcheck(f, {q, k, v});
      const TensorList g = autograd::grad({sum(out)}, {q, k, v});
      for (const Tensor& gi : g)
        for (double e : vals(gi)) CHECK(std::isfinite(e));
    }
  }
}

TEST_CASE("probe: cross_entropy with -inf logits on non-target classes (a masked vocabulary)") {
  const Tensor x =
      from_vector(std::vector<double>{1.0, -kInf, 0.5, -kInf, 2.0, -kInf, -kInf, 0.1}, {2, 4}, TensorOptions(kFloat64));
  const Tensor t = from_vector(std::vector<int64_t>{2, 3}, {2}, TensorOptions(kInt64));
  check_close(cross_entropy(x.t().contiguous().t(), t), ref_cross_entropy(x, t, -100, 0.0, Reduction::Mean), 1e-12,
              1e-12, "ce -inf");
  const Tensor xl = x.clone();
  xl.requires_grad_();
  cross_entropy(xl, t).backward();
  const std::vector<double> g = vals(xl.grad());
  // softmax - onehot, / 2 rows
  const double z0 = std::exp(1.0) + std::exp(0.5), z1 = std::exp(2.0) + std::exp(0.1);
  check_close(g,
              {std::exp(1.0) / z0 / 2, 0, (std::exp(0.5) / z0 - 1) / 2, 0, std::exp(2.0) / z1 / 2, 0, 0,
               (std::exp(0.1) / z1 - 1) / 2},
              1e-12, 1e-14, "ce -inf grad");
}

TEST_CASE("probe: gelu_mlp, flash_attention, layer_norm and conv2d under CPU autocast (bfloat16) on views") {
  const Tensor x = rnd({6, 4}, 1, -1, 1).to(kFloat32), w1 = rnd({5, 4}, 2, -1, 1).to(kFloat32),
               b1 = rnd({5}, 3).to(kFloat32), w2 = rnd({3, 5}, 4, -1, 1).to(kFloat32), b2 = rnd({3}, 5).to(kFloat32);
  for (const Tensor& p : {w1, b1, w2, b2}) p.requires_grad_();
  const Tensor xt = x.t().contiguous().t();  // same values, transposed memory
  Tensor y;
  {
    AutocastGuard amp(kCPU, kBFloat16);
    y = gelu_mlp(xt, w1, b1, w2, b2);
  }
  check_close(y, ref_gelu_mlp(x, w1.detach(), b1.detach(), w2.detach(), b2.detach()), 5e-2, 5e-2, "autocast gelu_mlp");
  sum(y).backward();
  for (const Tensor& p : {w1, b1, w2, b2}) {
    REQUIRE(p.grad().defined());
    CHECK(p.grad().dtype() == kFloat32);
    CHECK(p.grad().sizes() == p.sizes());
  }
  // The weight gradients agree with float32's.
  const Tensor w1c = w1.detach().clone(), b1c = b1.detach().clone(), w2c = w2.detach().clone(),
               b2c = b2.detach().clone();
  for (const Tensor& p : {w1c, b1c, w2c, b2c}) p.requires_grad_();
  sum(gelu_mlp(xt, w1c, b1c, w2c, b2c)).backward();
  check_close(w1.grad(), vals(w1c.grad()), 5e-2, 5e-2, "autocast dw1");
  check_close(b1.grad(), vals(b1c.grad()), 5e-2, 5e-2, "autocast db1");
  check_close(w2.grad(), vals(w2c.grad()), 5e-2, 5e-2, "autocast dw2");
  check_close(b2.grad(), vals(b2c.grad()), 5e-2, 5e-2, "autocast db2");
  {
    AutocastGuard amp(kCPU, kBFloat16);
    const Tensor q = rnd({1, 7, 2, 4}, 6).to(kFloat32).permute({0, 2, 1, 3});
    const Tensor o = scaled_dot_product_attention(q, q, q, Tensor(), true);
    check_close(o, ref_attention(q.to(kFloat64), q.to(kFloat64), q.to(kFloat64), Tensor(), true, 0.5), 5e-2, 5e-2,
                "autocast sdpa");
    const Tensor ln = layer_norm(q, {4});
    check_close(ln, ref_layer_norm(q.to(kFloat64), 1, Tensor(), Tensor(), 1e-5), 1e-4, 1e-4, "autocast layer_norm");
  }
}
