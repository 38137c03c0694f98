// Probes for silent wrong answers in NUMERICAL ACCURACY: inputs on which a naive algorithm
// loses precision (a large offset under a variance or a normalization, saturated softmax and
// cross entropy, long float16/bfloat16 dot products, the tails of the activations, tiny
// AdamW gradients, norms of huge gradients). Every reference is a float64 (or exact integer)
// computation written here from the op's definition, on the already-rounded inputs; every
// tolerance is derived from the storage dtype's unit roundoff u (2^-24 for float32, 2^-11
// for float16, 2^-8 for bfloat16), the size, and where the problem is ill-conditioned its
// condition number, and each case says how. The 16-bit sums and the NaN/inf edge values
// were probed in test_probe_values.cpp and are not repeated.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/batch_norm.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/norm.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/softmax.h"
#include "autograd/ops/unary.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "tensor/factory.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;
using ops::UnaryOp;

constexpr double kU32 = 0x1p-24;  // float32 unit roundoff (half an ulp of 1)
constexpr double kEps32 = 0x1p-23;

/// Normal(0, 1) samples from random_values (Box-Muller), independent of frugal's RNG.
Values normal_values(int64_t n, uint64_t seed) {
  const Values u = random_values(2 * n, seed, 0.0, 1.0);
  Values v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = std::sqrt(-2.0 * std::log(1.0 - u[size_t(2 * i)])) * std::cos(6.283185307179586 * u[size_t(2 * i + 1)]);
  return v;
}

/// The significand bits and smallest normal exponent of a floating dtype.
struct Format {
  int mant, emin;
  double max_finite;
};
Format format_of(DType dt) {
  switch (dt) {
    case DType::Float16: return {10, -14, 65504.0};
    case DType::BFloat16: return {7, -126, 3.3895313892515355e38};
    default: return {23, -126, double(FLT_MAX)};
  }
}

/// The spacing of dt's values at |r| (the subnormal spacing below the smallest normal).
double ulp_of(DType dt, double r) {
  const Format f = format_of(dt);
  const int e = r == 0.0 ? f.emin : std::max(std::ilogb(r), f.emin);
  return std::ldexp(1.0, e - f.mant);
}

/// x rounded to dt (through float32, which cannot double-round a float64 reference here by
/// more than the float32 rounding, far below dt's half ulp).
double round_to(DType dt, double x) {
  return values_of(from_vector(Values{x}, {1}, TensorOptions(kFloat64)).to(dt))[0];
}

/// Every element's float64 value after rounding `v` to dt: the inputs the references use.
Values rounded(const Values& v, DType dt) { return values_of(make_tensor(v, {int64_t(v.size())}, dt)); }

}  // namespace

// ---------------------------------------------------------------------------------------
// Variance and sums.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe numerics: var of float32 data at offsets 1e4 and 1e8 is accurate (no E[x^2] - E[x]^2), rows and columns") {
  // Reference: the two-pass variance in float64 of the float32 inputs. Data c + N(0, s^2)
  // with c/s = 1e4..1e6: the one-pass E[x^2] - E[x]^2 loses (c/s)^2 * u of the result, even in
  // float64 (1e12 * 1.1e-16 = 1e-4 relative), and in float32 everything. Welford or two passes
  // in float64 err by ~n * 1e-16 relative; the float32 result is then within its rounding:
  // bound 2u relative (the store, plus float64 slack). std = sqrt(var) the same, 2u.
  struct Case {
    double offset, scale;
    int64_t n;
  };
  for (const Case c : {Case{1e4, 1.0, 4097}, Case{1e8, 100.0, 10001}, Case{1e8, 100.0, 1 << 20}}) {
    CAPTURE(c.offset);
    CAPTURE(c.n);
    Values v = normal_values(c.n, 7);
    for (double& x : v) x = c.offset + c.scale * x;
    v = rounded(v, kFloat32);
    double mean = 0;
    for (double x : v) mean += x;
    mean /= double(c.n);
    double ss = 0;
    for (double x : v) ss += (x - mean) * (x - mean);
    for (int64_t corr : {int64_t(0), int64_t(1)}) {
      const double want = ss / double(c.n - corr);
      const Tensor x = make_tensor(v, {c.n}, kFloat32);
      check_close(ops::var(x, {}, corr), {want}, 2 * kU32, 0, "var row, correction " + std::to_string(corr));
      check_close(frugal::sqrt(frugal::var(x, {}, corr)), {std::sqrt(want)}, 2 * kU32, 0, "std");
      // The same data as a column of a (n, 2) tensor (the column-reduction path), and through a
      // transposed view (2, n) reduced along dim 1.
      Values two(size_t(2 * c.n));
      for (int64_t i = 0; i < c.n; ++i) two[size_t(2 * i)] = two[size_t(2 * i + 1)] = v[size_t(i)];
      const Tensor col = make_tensor(two, {c.n, 2}, kFloat32);
      check_close(ops::var(col, {0}, corr), {want, want}, 2 * kU32, 0, "var column");
      check_close(ops::var(col.transpose(0, 1), {1}, corr), {want, want}, 2 * kU32, 0, "var of a transposed view");
    }
  }
}

TEST_CASE("probe numerics: var's gradient at offset 1e4 is 2 (x - mean) / (n - 1) within the mean's rounding") {
  // grad_i = 2 (x_i - mean) / (n - c). With the mean held in float32, x_i - mean is off by at
  // most half an ulp of the mean (u * |mean|) plus the subtraction's and the scale's roundings:
  // bound 2/(n-c) * (u |mean| + 3u |x_i - mean|). PyTorch's var_backward does the same
  // (self - self.mean()) in the input dtype. A float32 mean computed by a naive float32 running
  // sum would be off by ~n u |mean| instead.
  const int64_t n = 50000;
  Values v = normal_values(n, 11);
  for (double& x : v) x = 1e4 + x;
  v = rounded(v, kFloat32);
  double mean = 0;
  for (double x : v) mean += x;
  mean /= double(n);
  Tensor x = make_tensor(v, {n}, kFloat32);
  x.requires_grad_();
  frugal::var(x).backward();
  const Values g = values_of(x.grad());
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = v[size_t(i)] - mean, want = 2 * d / double(n - 1);
    const double tol = 2.0 / double(n - 1) * (kU32 * std::fabs(mean) + 3 * kU32 * std::fabs(d));
    bad += std::fabs(g[size_t(i)] - want) > tol;
  }
  CHECK(bad == 0);
}

TEST_CASE("probe numerics: sum and mean of 1e7 float32 values 1 + k 2^-23 are correctly rounded, rows and columns") {
  // Each element is 1 + k * 2^-23 (k = i mod 7), exact in float32; the exact sum is
  // n + 2^-23 * sum(k), an integer count of 2^-23 held exactly in int64. A float32 running sum
  // stalls (1e7 + 1 + 2^-23 rounds the small part away: ~2.5% low); pairwise float32 errs by
  // ~log2(n) u. A float64 accumulator errs by < n * 2^-53 relative (1e-9), so the stored
  // float32 result must be within half an ulp of the exact value plus that.
  const int64_t n = 10'000'000;
  Values v(static_cast<size_t>(n));
  int64_t ticks = 0;  // the exact sum in units of 2^-23
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i % 7;
    v[size_t(i)] = 1.0 + std::ldexp(double(k), -23);
    ticks += (int64_t(1) << 23) + k;
  }
  const double exact = std::ldexp(double(ticks), -23);
  const double tol = 0.5 * ulp_of(kFloat32, exact) + 1e-9 * exact;
  const Tensor x = make_tensor(v, {n}, kFloat32);
  CHECK(std::fabs(ops::sum(x).item<double>() - exact) <= tol);
  CHECK(std::fabs(ops::mean(x).item<double>() - exact / double(n)) <= 0.5 * ulp_of(kFloat32, 1.0) + 1e-9);
  // (n/2, 2) reduced over dim 0 (a column reduction split across threads): each column holds
  // the even or the odd elements.
  const Tensor cols = x.reshape({n / 2, 2});
  int64_t even = 0, odd = 0;
  for (int64_t i = 0; i < n; ++i) (i % 2 ? odd : even) += (int64_t(1) << 23) + i % 7;
  const Values s = values_of(ops::sum(cols, {0}));
  CHECK(std::fabs(s[0] - std::ldexp(double(even), -23)) <= tol);
  CHECK(std::fabs(s[1] - std::ldexp(double(odd), -23)) <= tol);
}

// ---------------------------------------------------------------------------------------
// Normalizations at a large mean.
// ---------------------------------------------------------------------------------------

namespace {

/// float64 layer norm of one row and its input gradient for upstream g, weight w, bias b.
struct LayerNormRef {
  Values y, gx;
  double mean, rstd, c2, mean_abs_dxhat;
  Values xhat, dxhat;
  double c1;
};
LayerNormRef layer_norm_ref(const Values& x, const Values& w, const Values& b, const Values& g, double eps) {
  const size_t n = x.size();
  LayerNormRef r;
  r.mean = 0;
  for (double v : x) r.mean += v;
  r.mean /= double(n);
  double ss = 0;
  for (double v : x) ss += (v - r.mean) * (v - r.mean);
  r.rstd = 1.0 / std::sqrt(ss / double(n) + eps);
  r.c1 = 0, r.c2 = 0, r.mean_abs_dxhat = 0;
  for (size_t j = 0; j < n; ++j) {
    r.xhat.push_back((x[j] - r.mean) * r.rstd);
    r.y.push_back(r.xhat[j] * w[j] + b[j]);
    r.dxhat.push_back(g[j] * w[j]);
    r.c1 += r.dxhat[j] / double(n);
    r.c2 += r.dxhat[j] * r.xhat[j] / double(n);
    r.mean_abs_dxhat += std::fabs(r.dxhat[j]) / double(n);
  }
  for (size_t j = 0; j < n; ++j) r.gx.push_back(r.rstd * (r.dxhat[j] - r.c1 - r.xhat[j] * r.c2));
  return r;
}

}  // namespace

TEST_CASE("probe numerics: layer_norm of rows at mean 1e4 (float32) and 1e3/1e2 (float16/bfloat16), forward and backward") {
  // Reference: float64 layer norm of the rounded inputs. Error bound, first order: the mean is
  // kept in float32 (as PyTorch's CPU kernel keeps it), so x - mean is off by up to
  // u32 |mean| (+ u32 |x - mean| for the subtraction): xhat is off by
  // dxhat = rstd * u32 * (|mean| + |x - mean|) + 2 u32 |xhat|. Then
  //   |dy| <= |w| dxhat + 3 u32 |y| + half an ulp of the output dtype,
  //   |dgx| <= rstd * ((|c2| + |xhat| mean|dxhat|) dxhat_max + 8 u32 (|dxhat| + |c1| + |xhat c2|))
  //            + half an ulp of the output dtype.
  // With |mean|/std = 1e4 the forward bound is ~6e-4 absolute in float32: a one-pass
  // E[x^2] - E[x]^2 variance in float32 gives garbage (1e8 * 6e-8 = 6 relative), in float64 it
  // would pass; a float32 running mean over the row adds ~N u32 |mean| and fails.
  struct Case {
    DType dt;
    double offset;
  };
  const int64_t rows = 3, N = 1536;
  for (const Case c : {Case{kFloat32, 1e4}, Case{kFloat16, 1e3}, Case{kBFloat16, 1e2}}) {
    const std::string what = name_of(c.dt, Layout::Contiguous) + " offset " + std::to_string(c.offset);
    CAPTURE(what);
    Values xv = normal_values(rows * N, 3);
    for (int64_t i = 0; i < rows * N; ++i) xv[size_t(i)] = c.offset * (1 + 0.1 * double(i / N)) + xv[size_t(i)];
    xv = rounded(xv, c.dt);
    const Values wv = rounded(random_values(N, 4, 0.5, 1.5), c.dt), bv = rounded(random_values(N, 5), c.dt);
    const Values gv = rounded(random_values(rows * N, 6), c.dt);
    Tensor x = make_tensor(xv, {rows, N}, c.dt), w = make_tensor(wv, {N}, c.dt), b = make_tensor(bv, {N}, c.dt);
    x.requires_grad_();
    const Tensor y = frugal::layer_norm(x, {N}, w, b);
    y.backward(make_tensor(gv, {rows, N}, c.dt));
    const Values yo = values_of(y), go = values_of(x.grad());
    int64_t bad_y = 0, bad_g = 0;
    double worst_y = 0, worst_g = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = [&](const Values& v) { return Values(v.begin() + r * N, v.begin() + (r + 1) * N); };
      const LayerNormRef ref = layer_norm_ref(row(xv), wv, bv, row(gv), 1e-5);
      double dxhat_max = 0;
      for (int64_t j = 0; j < N; ++j)
        dxhat_max = std::max(dxhat_max, ref.rstd * kU32 * (std::fabs(ref.mean) + std::fabs(xv[size_t(r * N + j)] - ref.mean)) +
                                            2 * kU32 * std::fabs(ref.xhat[size_t(j)]));
      for (int64_t j = 0; j < N; ++j) {
        const size_t k = size_t(r * N + j), jj = size_t(j);
        const double ty = std::fabs(wv[jj]) * dxhat_max + 3 * kU32 * std::fabs(ref.y[jj]) + 0.5 * ulp_of(c.dt, ref.y[jj]);
        const double tg = ref.rstd * ((std::fabs(ref.c2) + std::fabs(ref.xhat[jj]) * ref.mean_abs_dxhat) * dxhat_max +
                                      8 * kU32 * (std::fabs(ref.dxhat[jj]) + std::fabs(ref.c1) + std::fabs(ref.xhat[jj] * ref.c2))) +
                          0.5 * ulp_of(c.dt, ref.gx[jj]);
        worst_y = std::max(worst_y, std::fabs(yo[k] - ref.y[jj]) / ty);
        worst_g = std::max(worst_g, std::fabs(go[k] - ref.gx[jj]) / tg);
        bad_y += std::fabs(yo[k] - ref.y[jj]) > ty;
        bad_g += std::fabs(go[k] - ref.gx[jj]) > tg;
      }
    }
    CAPTURE(worst_y);
    CAPTURE(worst_g);
    CHECK(bad_y == 0);
    CHECK(bad_g == 0);
  }
}

TEST_CASE("probe numerics: batch_norm statistics and output of float32 channels at mean 1e4, training") {
  // Reference: float64 batch statistics of the float32 input (biased variance for the
  // normalization, unbiased for running_var, as torch.nn.functional.batch_norm). Bound as for
  // layer norm: the float32 mean is off by u32 |mean|, so |dy| <= |w| rstd u32 (|mean| + |x - mean|)
  // + 4 u32 |y|; running_var = 0.9 * 1 + 0.1 * var_unbiased within 4 u32 relative (its
  // float32 store and the momentum products). A one-pass float32 variance is off by ~1e8 u32 relative.
  const int64_t N = 8, C = 3, HW = 17 * 19;
  Values xv = normal_values(N * C * HW, 21);
  for (int64_t i = 0; i < N * C * HW; ++i) xv[size_t(i)] = 1e4 * double(1 + (i / HW) % C) + 2.0 * xv[size_t(i)];
  xv = rounded(xv, kFloat32);
  const Values wv = rounded(random_values(C, 22, 0.5, 1.5), kFloat32), bv = rounded(random_values(C, 23), kFloat32);
  Tensor x = make_tensor(xv, {N, C, 17, 19}, kFloat32);
  Tensor rm = zeros({C}, kFloat32), rv = ones({C}, kFloat32);
  const Tensor y = frugal::batch_norm(x, rm, rv, make_tensor(wv, {C}, kFloat32), make_tensor(bv, {C}, kFloat32), true);
  const Values yo = values_of(y), rvo = values_of(rv), rmo = values_of(rm);
  for (int64_t c = 0; c < C; ++c) {
    CAPTURE(c);
    double mean = 0, ss = 0;
    const double M = double(N * HW);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < HW; ++j) mean += xv[size_t((n * C + c) * HW + j)] / M;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < HW; ++j) ss += std::pow(xv[size_t((n * C + c) * HW + j)] - mean, 2);
    const double rstd = 1.0 / std::sqrt(ss / M + 1e-5);
    CHECK(std::fabs(rvo[size_t(c)] - (0.9 + 0.1 * ss / (M - 1))) <= 4 * kU32 * (0.9 + 0.1 * ss / (M - 1)));
    CHECK(std::fabs(rmo[size_t(c)] - 0.1 * mean) <= 4 * kU32 * 0.1 * mean);
    int64_t bad = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < HW; ++j) {
        const size_t k = size_t((n * C + c) * HW + j);
        const double want = (xv[k] - mean) * rstd * wv[size_t(c)] + bv[size_t(c)];
        const double tol = std::fabs(wv[size_t(c)]) * rstd * kU32 * (std::fabs(mean) + std::fabs(xv[k] - mean)) +
                           4 * kU32 * (std::fabs(want) + std::fabs(bv[size_t(c)]));
        bad += std::fabs(yo[k] - want) > tol;
      }
    CHECK(bad == 0);
  }
}

// ---------------------------------------------------------------------------------------
// Softmax and cross entropy: saturated rows, a 50k vocabulary, huge logits.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe numerics: softmax and log_softmax of 50257-wide rows at offsets 0, 1e4 and tiny logits, both dims") {
  // Reference: float64 softmax of the float32 logits. softmax_i = exp(x_i - m) / S: x_i - m
  // carries up to u32 |x_i - m| (it is exact when the two are within a factor 2), exp and the
  // products a few u32: relative bound u32 (|x_i - m| + 8). log_softmax_i = (x_i - m) - log S:
  // absolute bound u32 (|x_i - m| + log S + 4) + half an ulp. A float32 sum of 50257 exps in a
  // running loop would add ~C u32 (3e-3) relative: it fails the softmax bound.
  const int64_t C = 50257;
  struct Case {
    double offset, scale;
  };
  for (const Case c : {Case{0.0, 8.0}, Case{1e4, 8.0}, Case{0.0, 1e-30}}) {
    CAPTURE(c.offset);
    CAPTURE(c.scale);
    Values v = random_values(2 * C, 31, -1, 1);
    for (double& x : v) x = c.offset + c.scale * x;
    v[5] = c.offset + 40 * c.scale;  // one saturating logit in row 0
    v = rounded(v, kFloat32);
    const Tensor x = make_tensor(v, {2, C}, kFloat32);
    Values want_p, want_lp, tol_p, tol_lp;
    for (int64_t r = 0; r < 2; ++r) {
      double m = -INFINITY, S = 0;
      for (int64_t j = 0; j < C; ++j) m = std::max(m, v[size_t(r * C + j)]);
      for (int64_t j = 0; j < C; ++j) S += std::exp(v[size_t(r * C + j)] - m);
      for (int64_t j = 0; j < C; ++j) {
        const double d = v[size_t(r * C + j)] - m, lp = d - std::log(S);
        want_p.push_back(std::exp(lp));
        want_lp.push_back(lp);
        tol_p.push_back(kU32 * (std::fabs(d) + 8) * std::exp(lp) + 1e-45);
        tol_lp.push_back(kU32 * (std::fabs(d) + std::log(S) + 4) + 0.5 * ulp_of(kFloat32, lp));
      }
    }
    const auto check = [&](const Values& got, const Values& want, const Values& tol, const std::string& what) {
      int64_t bad = 0, first = -1;
      for (size_t i = 0; i < got.size(); ++i)
        if (std::fabs(got[i] - want[i]) > tol[i] && bad++ == 0) first = int64_t(i);
      CHECK_MESSAGE(bad == 0, what, ": ", bad, " bad, first ", first, " got ", first >= 0 ? got[size_t(first)] : 0.0,
                    " want ", first >= 0 ? want[size_t(first)] : 0.0);
    };
    check(values_of(frugal::softmax(x, 1)), want_p, tol_p, "softmax dim 1");
    check(values_of(frugal::log_softmax(x, 1)), want_lp, tol_lp, "log_softmax dim 1");
    // The same along dim 0 of the transposed (C, 2) view, and of a contiguous (C, 2) copy.
    const Tensor xt = x.transpose(0, 1);
    check(values_of(frugal::softmax(xt, 0).transpose(0, 1)), want_p, tol_p, "softmax dim 0 of a view");
    check(values_of(frugal::log_softmax(xt.contiguous(), 0).transpose(0, 1)), want_lp, tol_lp, "log_softmax dim 0");
  }
}

namespace {

/// float64 cross entropy of one row (PyTorch's formula: (1 - e) nll + e mean_c(-log_softmax)),
/// its gradient, and the first-order effect of rounding every logit by u32 (the conditioning:
/// no float32 implementation can be held to less than this).
struct CrossEntropyRef {
  double loss, cond_loss;
  Values grad, cond_grad, p;
};
CrossEntropyRef cross_entropy_ref(const Values& x, int64_t t, double e) {
  const size_t C = x.size();
  double m = -INFINITY, S = 0, sx = 0;
  for (double v : x) m = std::max(m, v);
  for (double v : x) S += std::exp(v - m), sx += v;
  const double lse_rel = std::log(S);  // lse - m
  CrossEntropyRef r;
  // (lse - x_t) = (m - x_t) + log S, without forming lse (which would round at |m|).
  r.loss = (1 - e) * ((m - x[size_t(t)]) + lse_rel) + e * ((m + lse_rel) - sx / double(C));
  r.cond_loss = 0;
  Values p(C);
  double sum_px = 0;
  for (size_t c = 0; c < C; ++c) p[c] = std::exp(x[c] - m - lse_rel), sum_px += p[c] * std::fabs(x[c]);
  for (size_t c = 0; c < C; ++c) {
    r.grad.push_back(p[c] - (int64_t(c) == t ? 1 - e : 0.0) - e / double(C));
    r.cond_loss += kU32 * std::fabs(x[c]) * std::fabs(r.grad[c]);
    // dp_c = p_c ((1 - p_c) dx_c - sum_{j != c} p_j dx_j), |dx_j| <= u32 |x_j|.
    r.cond_grad.push_back(kU32 * p[c] * ((1 - p[c]) * std::fabs(x[c]) + (sum_px - p[c] * std::fabs(x[c]))));
    r.p.push_back(p[c]);
  }
  return r;
}

}  // namespace

TEST_CASE("probe numerics: cross_entropy of saturated rows: loss and gradient stay accurate at large logits") {
  // A confident row (target logit 10 above the rest): loss = log(1 + sum exp(x_c - x_t)) ~ 4.5e-5
  // and the target's gradient p_t - 1 ~ -4.5e-5, however large the logits. Bounds (float32):
  //   |dloss| <= 8 u32 (|loss| + log C + 1) + cond,  cond = sum_c u32 |x_c| |dloss/dx_c|
  // (computing log S relative to the row max costs ~u32 (log C + 1) absolute, as PyTorch's
  // log_softmax does; cond is what rounding the logits themselves moves the loss by), and
  //   |dgrad_c| <= 8 u32 (p_c + (1 - e)[c = t] + e/C) + cond_c,
  //   cond_c = u32 p_c ((1 - p_c) |x_c| + sum_{j != c} p_j |x_j|)  (dp_c under logit rounding).
  // Forming lse = m + log S in float32 first rounds it by u32 |lse|: at |lse| = 1000 that is
  // 6e-5, more than the whole loss, which then reads 0 (and the gradient 0).
  struct Case {
    double top, rest;
    int64_t C;
    double smoothing;
  };
  for (const Case c : {Case{30, 20, 5, 0.0}, Case{100, 90, 5, 0.0}, Case{1000, 990, 7, 0.0}, Case{1e4, 1e4 - 12, 50257, 0.0},
                       Case{100, 90, 50257, 0.1}, Case{-50, -60, 3, 0.0}}) {
    CAPTURE(c.top);
    CAPTURE(c.C);
    CAPTURE(c.smoothing);
    const int64_t R = 2;
    Values v = random_values(R * c.C, 41, -1, 0);
    for (double& x : v) x = c.rest + x;
    v[1] = c.top;           // row 0: target 1 dominates
    v[size_t(c.C + 0)] = c.top;  // row 1: target 2 is one of the rest, class 0 dominates
    v = rounded(v, kFloat32);
    const std::vector<int64_t> targets = {1, 2};
    Tensor x = make_tensor(v, {R, c.C}, kFloat32);
    x.requires_grad_();
    CrossEntropyOptions o;
    o.label_smoothing = c.smoothing;
    o.reduction = Reduction::None;
    const Tensor loss = frugal::cross_entropy(x, from_vector(targets, {R}, TensorOptions(kInt64)), o);
    frugal::sum(loss).backward();
    const Values l = values_of(loss), g = values_of(x.grad());
    for (int64_t r = 0; r < R; ++r) {
      const Values row(v.begin() + r * c.C, v.begin() + (r + 1) * c.C);
      const int64_t t = targets[size_t(r)];
      const CrossEntropyRef ref = cross_entropy_ref(row, t, c.smoothing);
      const double tol_loss = 8 * kU32 * (std::fabs(ref.loss) + std::log(double(c.C)) + 1) + ref.cond_loss;
      CHECK_MESSAGE(std::fabs(l[size_t(r)] - ref.loss) <= tol_loss, "row ", r, " loss ", l[size_t(r)], " want ",
                    ref.loss, " tol ", tol_loss);
      int64_t bad = 0, first = -1;
      for (int64_t j = 0; j < c.C; ++j) {
        const size_t jj = size_t(j);
        const double tol = 8 * kU32 * (ref.p[jj] + (j == t ? 1 - c.smoothing : 0) + c.smoothing / double(c.C)) +
                           ref.cond_grad[jj] + 1e-45;
        if (std::fabs(g[size_t(r * c.C + j)] - ref.grad[jj]) > tol && bad++ == 0) first = j;
      }
      CHECK_MESSAGE(bad == 0, "row ", r, ": ", bad, " gradient entries off; first ", first, " got ",
                    first >= 0 ? g[size_t(r * c.C + first)] : 0.0, " want ", first >= 0 ? ref.grad[size_t(first)] : 0.0);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Long float16/bfloat16 dot products: the accumulation must be float32.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe numerics: float16/bfloat16 matmul, linear and conv2d with K = 8192 and 65536 accumulate in float32") {
  // Positive operands a in [0, 1), b in [0, 1/4): the dot products grow to K/16, so a float16
  // (or bfloat16) accumulator stalls once its half ulp passes the terms (at 2^9 for float16):
  // errors of tens of percent. Float32 accumulation in any order errs by at most
  // gamma_K sum|a b| ~ K u32 sum|ab| (the worst-case bound; 4e-3 at K = 65536); the result is
  // then rounded once to the output dtype: bound half an ulp + K u32 sum|ab|. And since
  // float32's error is in practice ~sqrt(K) u32 (1.5e-5 relative), nearly every output must be
  // the correctly rounded float64 result: at least 85% of them, the rest one ulp away.
  struct Case {
    int64_t K;
    DType dt;
  };
  for (const Case c : {Case{8192, kFloat16}, Case{65536, kFloat16}, Case{8192, kBFloat16}, Case{65536, kBFloat16}}) {
    const std::string what = std::string(dtype_name(c.dt)) + " K=" + std::to_string(c.K);
    CAPTURE(what);
    const int64_t M = 6, N = 5;
    const Values av = rounded(random_values(M * c.K, 51, 0.0, 1.0), c.dt);
    const Values bv = rounded(random_values(c.K * N, 52, 0.0, 0.25), c.dt);
    Values want(size_t(M * N)), tol(size_t(M * N));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, sa = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = av[size_t(i * c.K + k)] * bv[size_t(k * N + j)];
          s += p;
          sa += std::fabs(p);
        }
        want[size_t(i * N + j)] = s;
        tol[size_t(i * N + j)] = 0.5 * ulp_of(c.dt, s) + double(c.K) * kU32 * sa;
      }
    const auto check = [&](const Tensor& out, const std::string& op) {
      const Values got = values_of(out);
      REQUIRE(got.size() == want.size());
      int64_t bad = 0, exact = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        bad += !(std::fabs(got[i] - want[i]) <= tol[i]) || std::fabs(got[i] - want[i]) > ulp_of(c.dt, want[i]);
        exact += got[i] == round_to(c.dt, want[i]);
      }
      CHECK_MESSAGE(bad == 0, op, ": ", bad, " outputs beyond the float32-accumulation bound; [0] got ", got[0],
                    " want ", want[0]);
      CHECK_MESSAGE(exact * 100 >= int64_t(got.size()) * 85, op, ": only ", exact, " of ", got.size(),
                    " correctly rounded");
    };
    const Tensor a = make_tensor(av, {M, c.K}, c.dt);
    const Tensor b = make_tensor(bv, {c.K, N}, c.dt);
    check(frugal::matmul(a, b), "matmul");
    check(frugal::matmul(a, make_tensor(bv, {c.K, N}, c.dt, Layout::Transposed)), "matmul, b transposed in memory");
    // linear(x, w) = x w^T with w = b^T (N, K).
    check(frugal::linear(a, b.transpose(0, 1).contiguous()), "linear");
    // conv2d: a 1x1 convolution of K channels (x: (M, K, 1, 1), w: (N, K, 1, 1)) is the same product.
    check(frugal::conv2d(a.reshape({M, c.K, 1, 1}), b.transpose(0, 1).contiguous().reshape({N, c.K, 1, 1}))
              .reshape({M, N}),
          "conv2d 1x1");
  }
}

// ---------------------------------------------------------------------------------------
// Activations over the whole float range.
// ---------------------------------------------------------------------------------------

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440, kSqrt2OverPi = 0.79788456080286535588, kCoeff = 0.044715;

/// f(x) and its derivative in float64, written in forms that stay accurate in the tails
/// (erfc, not 1 + erf; a logistic, not 1 + tanh), and |x f'(x) / f(x)|, the condition number.
struct Fn {
  const char* name;
  UnaryOp op;
  double (*f)(double);
  double (*df)(double);
};
double gelu_tanh_u(double x) { return kSqrt2OverPi * (x + kCoeff * x * x * x); }
const Fn kFns[] = {
    {"gelu", UnaryOp::Gelu, [](double x) { return 0.5 * x * std::erfc(-x * kInvSqrt2); },
     [](double x) { return 0.5 * std::erfc(-x * kInvSqrt2) + x * 0.39894228040143267794 * std::exp(-0.5 * x * x); }},
    {"gelu_tanh", UnaryOp::GeluTanh, [](double x) { return x / (1 + std::exp(-2 * gelu_tanh_u(x))); },
     [](double x) {
       const double u = gelu_tanh_u(x), s = 1 / (1 + std::exp(-2 * u));
       const double du = kSqrt2OverPi * (1 + 3 * kCoeff * x * x);
       return s + x * 2 * s * (1 - s) * du;
     }},
    {"silu", UnaryOp::Silu, [](double x) { return x / (1 + std::exp(-x)); },
     [](double x) {
       const double s = 1 / (1 + std::exp(-x));
       return s * (1 + x * (1 - s));
     }},
    {"sigmoid", UnaryOp::Sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); },
     [](double x) {
       const double s = 1 / (1 + std::exp(-x));
       return s * (1 - s);
     }},
    {"tanh", UnaryOp::Tanh, [](double x) { return std::tanh(x); }, [](double x) { return 1 - std::tanh(x) * std::tanh(x); }},
    {"exp", UnaryOp::Exp, [](double x) { return std::exp(x); }, [](double x) { return std::exp(x); }},
    {"log", UnaryOp::Log, [](double x) { return std::log(x); }, [](double x) { return 1 / x; }},
};

/// Every finite float32 value whose bit pattern is a multiple of `step`, both signs.
std::vector<float> float_sweep(uint32_t step) {
  std::vector<float> v;
  for (uint64_t b = 0; b < 0x7f800000u; b += step)
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t bits = uint32_t(b) | sign;
      float f;
      std::memcpy(&f, &bits, 4);
      v.push_back(f);
    }
  return v;
}

}  // namespace

TEST_CASE("probe numerics: gelu, gelu_tanh, silu, sigmoid, tanh, exp, log over a dense float32 sweep, in ulps") {
  // 4.2 million float32 inputs spread over every binade (bit patterns step 1021, both signs),
  // against float64 references written in tail-safe forms. Bound per input:
  // (4 + 2 cond(x)) ulps of the result, cond = |x f'(x) / f(x)|: an implementation whose
  // every step is within a few ulps, whose internal argument (x/sqrt 2, x + 0.044715 x^3, -x)
  // carries a relative error of ~u32, may be off by that much more. Results below float32's
  // smallest normal (1.2e-38) may flush to 0 (PyTorch's vectorized CPU paths do). 0.5 x
  // (1 + erf(x / sqrt 2)) and 0.5 x (1 + tanh(...)) cancel for x < -3: 1 + erf is then below
  // erf's ulp, so the result loses all its digits (gelu(-5) = -1.4e-6 comes out 30% off, and 0
  // from x = -5.9, where the true value is -1e-8).
  const std::vector<float> xs = float_sweep(1021);
  const Tensor x = from_vector(Values(xs.begin(), xs.end()), {int64_t(xs.size())}, TensorOptions(kFloat64)).to(kFloat32);
  for (const Fn& fn : kFns) {
    const std::string fn_name = fn.name;
    CAPTURE(fn_name);
    const std::vector<float> y = ops::unary(fn.op, x).tolist<float>();
    int64_t bad = 0;
    double worst = 0, worst_x = 0, worst_y = 0, worst_r = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double xd = xs[i];
      if (fn.op == UnaryOp::Log && xd < 0) continue;
      const double r = fn.f(xd), yd = y[i];
      if (std::fabs(r) > double(FLT_MAX)) {  // overflows: inf of the same sign (exp(89))
        bad += !(std::isinf(yd) && (yd > 0) == (r > 0));
        continue;
      }
      if (std::isinf(r)) continue;
      const double cond = r == 0 ? 0 : std::fabs(xd * fn.df(xd) / r);
      const double tol = std::fabs(r) < double(FLT_MIN) ? double(FLT_MIN) : ulp_of(kFloat32, r) * (4 + 2 * cond);
      const double err = std::fabs(yd - r) / tol;
      if (!(err <= 1)) {
        ++bad;
        if (!(err <= worst)) worst = std::isnan(err) ? 1e300 : err, worst_x = xd, worst_y = yd, worst_r = r;
      }
    }
    CHECK_MESSAGE(bad == 0, fn.name, ": ", bad, " inputs beyond the bound; worst at x = ", worst_x, ": got ", worst_y,
                  " want ", worst_r);
  }
}

TEST_CASE("probe numerics: gelu, gelu_tanh, silu, sigmoid, tanh, exp, log in float16/bfloat16 are within one ulp everywhere") {
  // Every one of the 65536 bit patterns. The op computes in float32 and rounds once
  // (Note [Half types compute in f32]): the float32 error (a few ulps of float32, times the
  // condition number below 300 where these results are representable) is < 2^-13 of a
  // 16-bit ulp, so the result must be the correctly rounded value or, at a near tie, the
  // neighbour: |y - f(x)| <= 1 ulp of the 16-bit type. Overflows must give inf.
  for (const DType dt : {kFloat16, kBFloat16}) {
    Tensor x = empty({65536}, dt);
    auto* bits = static_cast<uint16_t*>(x.data());
    for (uint32_t b = 0; b < 65536; ++b) bits[b] = uint16_t(b);
    const Values xs = values_of(x);
    for (const Fn& fn : kFns) {
      const std::string what = std::string(dtype_name(dt)) + " " + fn.name;
      CAPTURE(what);
      const Values y = values_of(ops::unary(fn.op, x));
      int64_t bad = 0;
      double bx = 0, by = 0, br = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const double xd = xs[i];
        if (!std::isfinite(xd) || (fn.op == UnaryOp::Log && xd < 0)) continue;
        const double r = fn.f(xd), rr = round_to(dt, r), yd = y[i];
        const bool ok = std::isinf(rr) ? yd == rr : std::fabs(yd - r) <= ulp_of(dt, r);
        if (!ok && bad++ == 0) bx = xd, by = yd, br = r;
      }
      CHECK_MESSAGE(bad == 0, what, ": ", bad, " inputs more than one ulp off; first x = ", bx, ": got ", by, " want ",
                    br);
    }
  }
}

TEST_CASE("probe numerics: gelu, gelu_tanh and silu derivatives in float32 over [-20, 20] are accurate in the tails") {
  // unary_backward with upstream 1 against f'(x) in float64. f' is a sum of two terms
  // (Phi(x) + x phi(x); s + 2 x s (1 - s) u'(x); s (1 + x (1 - s))) that cancel near f's
  // minimum, so the bound is per term: u32 (|t1| + |t2|) (8 + 2 c(x)), with c(x) = x^2 +
  // 2 |x u'(x)| the condition of the exps inside (their arguments carry u32 relative error).
  // 0.5 (1 + erf(x / sqrt 2)) for Phi(x) and 1 + tanh for 2s lose every digit for x < -5.
  std::vector<float> xs;
  for (int i = -200000; i <= 200000; ++i) xs.push_back(float(i) * 1e-4f);
  const Tensor x = from_vector(Values(xs.begin(), xs.end()), {int64_t(xs.size())}, TensorOptions(kFloat64)).to(kFloat32);
  const Tensor g = ones({int64_t(xs.size())}, kFloat32);
  for (const Fn& fn : kFns) {
    if (fn.op != UnaryOp::Gelu && fn.op != UnaryOp::GeluTanh && fn.op != UnaryOp::Silu) continue;
    const std::string fn_name = fn.name;
    CAPTURE(fn_name);
    const Values d = values_of(ops::unary_backward(fn.op, g, x));
    int64_t bad = 0;
    double bx = 0, bd = 0, br = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double xd = xs[i], r = fn.df(xd);
      double t1, t2, c;
      if (fn.op == UnaryOp::Gelu) {
        t1 = 0.5 * std::erfc(-xd * kInvSqrt2), t2 = xd * 0.39894228040143267794 * std::exp(-0.5 * xd * xd);
        c = xd * xd;
      } else if (fn.op == UnaryOp::GeluTanh) {
        const double u = gelu_tanh_u(xd), s = 1 / (1 + std::exp(-2 * u)), du = kSqrt2OverPi * (1 + 3 * kCoeff * xd * xd);
        t1 = s, t2 = xd * 2 * s * (1 - s) * du;
        c = 4 * std::fabs(xd * du) + 4 * std::fabs(u);
      } else {
        const double s = 1 / (1 + std::exp(-xd));
        t1 = s, t2 = s * xd * (1 - s);
        c = 2 * std::fabs(xd);
      }
      const double tol = kU32 * (std::fabs(t1) + std::fabs(t2)) * (8 + 2 * c) + double(FLT_MIN);
      if (!(std::fabs(d[i] - r) <= tol) && bad++ == 0) bx = xd, bd = d[i], br = r;
    }
    CHECK_MESSAGE(bad == 0, fn.name, "': ", bad, " inputs beyond the bound; first x = ", bx, ": got ", bd, " want ",
                  br);
  }
}

TEST_CASE("probe numerics: exp and log at the float32 overflow/underflow edges, log of subnormals, pow with large exponents") {
  // IEEE float32: exp overflows past log(FLT_MAX) = 88.7228; exp(-103.97) is the smallest
  // subnormal; log of the subnormal 2^-149 is -149 log 2. Bounds 2 ulps (libm's expf/logf
  // are within 1), relative to the float64 value; powf the same at exponents 100 and -100.
  const Values xe = {88.72f, 88.7228f, 88.73f, -87.33f, -100.0f, -103.9f, -104.0f};
  const Values ye = values_of(ops::unary(UnaryOp::Exp, make_tensor(xe, {7}, kFloat32)));
  for (size_t i = 0; i < xe.size(); ++i) {
    CAPTURE(xe[i]);
    const double r = std::exp(double(float(xe[i])));
    if (r > double(FLT_MAX)) CHECK(std::isinf(ye[i]));
    else CHECK(std::fabs(ye[i] - r) <= 2 * ulp_of(kFloat32, r));
  }
  const Values xl = {0x1p-149, 0x1p-140, 3 * 0x1p-149, 0x1p-127 * 1.5, double(FLT_MIN), double(FLT_MAX)};
  const Values yl = values_of(ops::unary(UnaryOp::Log, make_tensor(xl, {6}, kFloat32)));
  for (size_t i = 0; i < xl.size(); ++i) {
    CAPTURE(xl[i]);
    CHECK(std::fabs(yl[i] - std::log(xl[i])) <= 2 * ulp_of(kFloat32, std::log(xl[i])));
  }
  const Values xp = {1.1, 0.9, 2.0, -1.01, 1.0000001};
  for (double e : {100.0, -100.0, 127.0}) {
    CAPTURE(e);
    const Values yp = values_of(ops::unary(UnaryOp::Pow, make_tensor(xp, {5}, kFloat32), e));
    for (size_t i = 0; i < xp.size(); ++i) {
      const double r = std::pow(double(float(xp[i])), e);
      if (std::fabs(r) > double(FLT_MAX)) CHECK(std::isinf(yp[i]));
      else CHECK(std::fabs(yp[i] - r) <= 2 * ulp_of(kFloat32, r) + (std::fabs(r) < FLT_MIN ? FLT_MIN : 0));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Losses, optimizers and clipping at extreme magnitudes.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe numerics: mse_loss of differences near 1e19 keeps a representable mean; its gradient too") {
  // (x - t)^2 = 1e38 is below FLT_MAX (3.4e38), so is the mean over 64 elements; their sum
  // (6.4e39) is not, and is inf (float32 overflow of the exact value, as it must be). A
  // float32 running sum would overflow and make the mean inf too. Bound: the mean's float32
  // rounding of a float64 sum of exact float32 squares: 2 u32; the gradient 2 (x - t) / n: 2 u32.
  const int64_t n = 64;
  Values xv = rounded(random_values(n, 61, 0.9e19, 1.1e19), kFloat32), tv(size_t(n), 0.0);
  double want = 0;
  for (int64_t i = 0; i < n; ++i) want += double(float(xv[size_t(i)] * xv[size_t(i)])) / double(n);
  Tensor x = make_tensor(xv, {n}, kFloat32);
  x.requires_grad_();
  const Tensor loss = frugal::mse_loss(x, make_tensor(tv, {n}, kFloat32));
  CHECK(std::fabs(loss.item<double>() - want) <= 2 * kU32 * want);
  CHECK(std::isinf(ops::mse_loss(x.detach(), make_tensor(tv, {n}, kFloat32), Reduction::Sum).item<double>()));
  loss.backward();
  Values gw;
  for (double v : xv) gw.push_back(2 * v / double(n));
  check_close(x.grad(), gw, 2 * kU32, 0, "mse_loss gradient");
}

TEST_CASE("probe numerics: AdamW in float32 with tiny gradients (eps-dominated) follows float64 over 2000 steps") {
  // Gradients 1e-20..1e-30: g^2 is subnormal or 0 in float32, so sqrt(v_hat) << eps and each
  // step is ~ lr m_hat / eps (1e-15..1e-25 per step). Reference: torch.optim.AdamW's single-
  // tensor formula (Note [Adam update]) run in float64 on the same gradients. Each float32
  // step is within ~8 u32 of its float64 value (the underflowed v changes sqrt(v_hat) + eps by
  // < 1e-12 relative); summed over n steps of one sign the parameter, starting at 0, is within
  // (8 + n) u32 of the float64 trajectory's sum of |updates| (the float32 running sum's bound).
  const int64_t n = 2000;
  const Values scales = {1e-20, -1e-25, 1e-30, 3e-22};
  Tensor p = param_tensor(Values(scales.size(), 0.0), {int64_t(scales.size())}, kFloat32);
  optim::AdamW opt({p}, {.lr = 1e-3, .weight_decay = 0.0});
  Values p64(scales.size(), 0.0), m(scales.size(), 0.0), v(scales.size(), 0.0), moved(scales.size(), 0.0);
  for (int64_t t = 1; t <= n; ++t) {
    Values g;
    for (size_t i = 0; i < scales.size(); ++i) g.push_back(double(float(scales[i] * (1.0 + 0.5 * std::sin(double(t))))));
    p.set_grad(make_tensor(g, {int64_t(g.size())}, kFloat32));
    opt.step();
    const double c1 = 1 - std::pow(0.9, double(t)), c2 = 1 - std::pow(0.999, double(t));
    for (size_t i = 0; i < g.size(); ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      const double step = 1e-3 / c1 * m[i] / (std::sqrt(v[i]) / std::sqrt(c2) + 1e-8);
      p64[i] -= step;
      moved[i] += std::fabs(step);
    }
  }
  const Values got = values_of(p);
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] != 0.0);
    CHECK(std::fabs(got[i] - p64[i]) <= (8 + double(n)) * kU32 * moved[i]);
  }
}

TEST_CASE("probe numerics: clip_grad_norm_ of 1e4 float32 gradients of 1e19 each: the norm 1e21 does not overflow") {
  // The total norm sqrt(1e4 * 1e38) = 1e21 is a float32 value, but its square (1e42) and the
  // sum of four squares are not: a float32 sum of squares returns inf and clipping then zeroes
  // every gradient (max_norm / inf). frugal sums squares in float64 (optim/clip_grad.cpp), so
  // the norm must be 1e21 within float64 summation error (1e-12 relative), and each gradient
  // 1e19 * max_norm / (1e21 + 1e-6) = 1e-2 * max_norm within the float32 product (2 u32).
  // (torch.nn.utils.clip_grad_norm_ takes per-tensor torch.linalg.vector_norm's; whether a
  // float32 CPU norm accumulates wider is an implementation detail we do not rely on.)
  std::vector<Tensor> params;
  for (int k = 0; k < 4; ++k) {
    Tensor p = zeros({2500}, kFloat32);
    p.requires_grad_();
    p.set_grad(full({2500}, k % 2 ? -1e19 : 1e19, kFloat32));
    params.push_back(p);
  }
  const double g = double(float(1e19));
  const double norm = optim::clip_grad_norm_(params, 5.0);
  CHECK(std::fabs(norm - 100 * g) <= 1e-12 * 100 * g);
  for (size_t k = 0; k < params.size(); ++k) {
    const double want = (k % 2 ? -1 : 1) * g * 5.0 / (100 * g + 1e-6);
    check_close(params[k].grad(), Values(2500, want), 2 * kU32, 0, "clipped gradient " + std::to_string(k));
  }
}
