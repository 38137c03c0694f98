// Probes for silent wrong answers in the normalizations and softmaxes on the CPU: layer_norm
// over multi-dim normalized shapes, every layout (reversed dims, channels-last, an offset
// strided view whose gaps hold NaN), weight and bias each absent or present, constant rows
// (variance 0: the output is the bias, the gradient finite), means of 1e8 that a one-pass
// E[x^2] - E[x]^2 variance would destroy, size-0 batches, normalized size 1, float16/bfloat16
// inputs whose sums overflow their own type; batch_norm in training and eval (the running
// update with the unbiased variance and torch's momentum, running statistics in strided
// views, one value per channel, size-0 batches, huge means over N*H*W = 16384 values),
// nn::BatchNorm2d over several batches (num_batches_tracked, momentum=None's cumulative
// average, affine and track_running_stats off) and nn::LayerNorm; softmax and log_softmax
// along every dim of permuted, strided, offset and expanded inputs, with -inf, +inf, NaN,
// 1e30 and very negative entries; masked_softmax's contract (Note [Masked softmax]: bool and
// added masks broadcast through any strides, is_causal top-left aligned, all-masked rows give
// zeros). Every expectation is a float64 (long double where cancellation matters) loop
// written here, a closed form, or PyTorch's documented behaviour (named where used);
// gradients are compared with the closed forms or with central differences in float64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "nn/batch_norm.h"
#include "nn/layers.h"
#include "tensor/factory.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/norm.h"
#include "tensor/ops/softmax.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
using LD = long double;

// ---- layouts ---------------------------------------------------------------------------------

/// How an input reaches an op: dense, dims reversed in memory (column-major), dim 1 moved
/// last in memory (channels-last for any rank), or an offset view striding over a buffer
/// whose gaps hold NaN (any read outside the view poisons the result).
enum class Lay { Contiguous, Reversed, ChannelsLast, OffsetStrided };
constexpr Lay kLays[] = {Lay::Contiguous, Lay::Reversed, Lay::ChannelsLast, Lay::OffsetStrided};
const char* lay_name(Lay l) {
  return l == Lay::Contiguous ? "contiguous"
         : l == Lay::Reversed ? "reversed"
         : l == Lay::ChannelsLast ? "channels-last"
                                  : "offset-strided";
}

/// A tensor of shape s and dtype dt holding v (row-major) in layout l.
Tensor laid(const std::vector<double>& v, const Shape& s, DType dt, Lay l) {
  const Tensor dense = from_vector(v, s, TensorOptions(kFloat64));
  const int64_t n = int64_t(s.size());
  if (l == Lay::Contiguous || n == 0) return dense.to(dt);
  if (l == Lay::OffsetStrided) {
    if (n == 1) {
      const Tensor mem = full({2 * s[0] + 1}, kNaN, dt);
      const Tensor view = mem.slice(0, 1, 2 * s[0] + 1, 2);
      view.copy_(dense);
      return view;
    }
    Shape big = s;
    big[0] += 1;
    big.back() *= 2;
    const Tensor mem = full(big, kNaN, dt);
    const Tensor view = mem.narrow(0, 1, s[0]).slice(n - 1, 0, big.back(), 2);
    view.copy_(dense);
    return view;
  }
  std::vector<int64_t> p(static_cast<size_t>(n)), q(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = l == Lay::Reversed ? n - 1 - i : i;
  if (l == Lay::ChannelsLast && n >= 2) {
    p.assign(1, 0);
    for (int64_t i = 2; i < n; ++i) p.push_back(i);
    p.push_back(1);
  }
  for (int64_t i = 0; i < n; ++i) q[size_t(p[size_t(i)])] = i;
  return dense.permute(p).contiguous().to(dt).permute(q);
}

/// ulp of float32 at |v|.
double ulp32(double v) {
  const float f = float(std::fabs(v));
  return double(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
}

// ---- layer norm references -------------------------------------------------------------------

struct LnRef {
  std::vector<double> y, mean, rstd;
};

/// torch.nn.functional.layer_norm in long double over rows of N: biased variance, two passes.
/// w, b: empty when absent.
LnRef ln_ref(const std::vector<double>& x, int64_t N, const std::vector<double>& w, const std::vector<double>& b,
             double eps) {
  LnRef r;
  const int64_t M = N == 0 ? 0 : int64_t(x.size()) / N;
  r.y.resize(x.size());
  for (int64_t i = 0; i < M; ++i) {
    LD s = 0;
    for (int64_t j = 0; j < N; ++j) s += x[size_t(i * N + j)];
    const LD mu = s / N;
    LD ss = 0;
    for (int64_t j = 0; j < N; ++j) ss += (x[size_t(i * N + j)] - mu) * (x[size_t(i * N + j)] - mu);
    const LD rs = 1 / std::sqrt(ss / N + LD(eps));
    r.mean.push_back(double(mu));
    r.rstd.push_back(double(rs));
    for (int64_t j = 0; j < N; ++j) {
      LD v = (x[size_t(i * N + j)] - mu) * rs;
      if (!w.empty()) v *= w[size_t(j)];
      if (!b.empty()) v += b[size_t(j)];
      r.y[size_t(i * N + j)] = double(v);
    }
  }
  return r;
}

struct LnGrads {
  std::vector<double> x, w, b;
};

/// layer_norm's gradients by their closed form, in long double, with the exact statistics.
LnGrads ln_grad_ref(const std::vector<double>& g, const std::vector<double>& x, int64_t N,
                    const std::vector<double>& w, double eps) {
  const LnRef f = ln_ref(x, N, {}, {}, eps);
  const int64_t M = N == 0 ? 0 : int64_t(x.size()) / N;
  LnGrads r;
  r.x.resize(x.size());
  r.w.assign(size_t(N), 0.0);
  r.b.assign(size_t(N), 0.0);
  std::vector<LD> gw(size_t(N), 0), gb(size_t(N), 0);
  for (int64_t i = 0; i < M; ++i) {
    LD s1 = 0, s2 = 0;
    for (int64_t j = 0; j < N; ++j) {
      const size_t k = size_t(i * N + j);
      const LD xhat = LD(f.y[k]);
      const LD d = LD(g[k]) * (w.empty() ? 1 : LD(w[size_t(j)]));
      s1 += d, s2 += d * xhat;
      gw[size_t(j)] += LD(g[k]) * xhat;
      gb[size_t(j)] += g[k];
    }
    for (int64_t j = 0; j < N; ++j) {
      const size_t k = size_t(i * N + j);
      const LD d = LD(g[k]) * (w.empty() ? 1 : LD(w[size_t(j)]));
      r.x[k] = double(LD(f.rstd[size_t(i)]) * (d - s1 / N - LD(f.y[k]) * s2 / N));
    }
  }
  for (int64_t j = 0; j < N; ++j) r.w[size_t(j)] = double(gw[size_t(j)]), r.b[size_t(j)] = double(gb[size_t(j)]);
  return r;
}

// ---- batch norm references -------------------------------------------------------------------

struct BnRef {
  std::vector<double> y, mean, invstd, rm, rv;
  std::vector<double> gx, gw, gb;  // when a grad_out was given
};

/// torch.nn.functional.batch_norm on x (N, C, *) in long double: training normalizes with the
/// batch mean and biased variance and moves rm/rv (when not empty) by
/// new = (1 - momentum) old + momentum stat with the UNBIASED variance; eval uses rm/rv.
/// With gy, the gradients by their closed forms (eval: the statistics are constants).
BnRef bn_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w, const std::vector<double>& b,
             std::vector<double> rm, std::vector<double> rv, bool training, double momentum, double eps,
             const std::vector<double>* gy = nullptr) {
  const int64_t N = xs[0], C = xs[1], L = N * C == 0 ? 0 : numel_of(xs) / (N * C);
  const int64_t M = N * L;
  BnRef r;
  r.y.resize(x.size());
  if (gy) r.gx.resize(x.size());
  auto at = [&](int64_t n, int64_t c, int64_t j) { return size_t((n * C + c) * L + j); };
  for (int64_t c = 0; c < C; ++c) {
    LD mean, var;
    if (training) {
      LD s = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < L; ++j) s += x[at(n, c, j)];
      mean = s / M;
      LD ss = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < L; ++j) ss += (x[at(n, c, j)] - mean) * (x[at(n, c, j)] - mean);
      var = ss / M;
      if (!rm.empty()) {
        rm[size_t(c)] = double((1 - LD(momentum)) * rm[size_t(c)] + LD(momentum) * mean);
        rv[size_t(c)] = double((1 - LD(momentum)) * rv[size_t(c)] + LD(momentum) * ss / (M - 1));
      }
    } else {
      mean = rm[size_t(c)], var = rv[size_t(c)];
    }
    const LD is = 1 / std::sqrt(var + LD(eps));
    const LD wc = w.empty() ? 1 : LD(w[size_t(c)]), bc = b.empty() ? 0 : LD(b[size_t(c)]);
    r.mean.push_back(double(mean));
    r.invstd.push_back(double(is));
    LD sg = 0, sgx = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < L; ++j) {
        const LD xhat = (x[at(n, c, j)] - mean) * is;
        r.y[at(n, c, j)] = double(xhat * wc + bc);
        if (gy) sg += (*gy)[at(n, c, j)], sgx += (*gy)[at(n, c, j)] * xhat;
      }
    if (!gy) continue;
    r.gw.push_back(double(sgx));
    r.gb.push_back(double(sg));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < L; ++j) {
        const LD xhat = (x[at(n, c, j)] - mean) * is, g = (*gy)[at(n, c, j)];
        r.gx[at(n, c, j)] = double(training ? wc * is * (g - sg / M - xhat * sgx / M) : wc * is * g);
      }
  }
  r.rm = rm, r.rv = rv;
  return r;
}

// ---- softmax references ----------------------------------------------------------------------

/// softmax / log_softmax of x (shape s) along dim in plain IEEE double arithmetic, which is
/// PyTorch's documented result for special values: m = max (NaN if any NaN), d = x - m,
/// softmax = exp(d) / sum(exp(d)), log_softmax = d - log(sum(exp(d))). So an all -inf slice
/// (d = NaN) and a slice with +inf (inf - inf = NaN in the sum) give NaN everywhere, and -inf
/// entries beside a finite one give 0 (log: -inf).
std::vector<double> softmax_ref(const std::vector<double>& x, const Shape& s, int64_t dim, bool log) {
  int64_t outer = 1, D = 1, inner = 1;
  const int64_t n = int64_t(s.size());
  if (dim < 0) dim += std::max<int64_t>(n, 1);
  for (int64_t k = 0; k < n; ++k) (k < dim ? outer : k == dim ? D : inner) *= s[size_t(k)];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return size_t((o * D + j) * inner + i); };
      double m = -kInf;
      bool nan = false;
      for (int64_t j = 0; j < D; ++j) nan |= std::isnan(x[at(j)]), m = std::max(m, x[at(j)]);
      if (nan) m = kNaN;
      LD sum = 0;
      for (int64_t j = 0; j < D; ++j) sum += std::exp(LD(x[at(j)]) - LD(m));
      for (int64_t j = 0; j < D; ++j) {
        const LD d = LD(x[at(j)]) - LD(m);
        y[at(j)] = double(log ? d - std::log(sum) : std::exp(d) / sum);
      }
    }
  return y;
}

/// masked_softmax's contract (Note [Masked softmax]) in long double: z = scale * x + mask
/// (float mask), -inf where a bool mask is false or (is_causal) key s > query l; a row with
/// no finite z gives zeros (torch's _safe_softmax); else plain softmax of z. mask: the mask's
/// values broadcast to x's shape (empty: none).
std::vector<double> masked_ref(const std::vector<double>& x, const Shape& s, const std::vector<double>& mask,
                               bool is_bool, bool causal, double scale) {
  const int64_t S = s.back(), L = s.size() >= 2 ? s[s.size() - 2] : 1, rows = S == 0 ? 0 : int64_t(x.size()) / S;
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<LD> z(static_cast<size_t>(S));
    LD m = -kInf;
    for (int64_t j = 0; j < S; ++j) {
      const size_t k = size_t(r * S + j);
      LD v = LD(x[k]) * LD(scale);
      if (!mask.empty()) {
        if (is_bool) v = mask[k] != 0 ? v : -LD(kInf);
        else v += mask[k];
      }
      if (causal && j > r % L) v = -LD(kInf);
      z[size_t(j)] = v;
      m = std::isnan(v) || std::isnan(m) ? LD(kNaN) : std::max(m, v);
    }
    if (m == -LD(kInf)) continue;  // zeros
    LD sum = 0;
    for (LD v : z) sum += std::exp(v - m);
    for (int64_t j = 0; j < S; ++j) y[size_t(r * S + j)] = double(std::exp(z[size_t(j)] - m) / sum);
  }
  return y;
}

/// The values of a tensor of `small` shape broadcast (numpy rules) to `big`, row-major.
std::vector<double> broadcast_values(const std::vector<double>& v, const Shape& small, const Shape& big) {
  std::vector<double> out(size_t(numel_of(big)));
  for (int64_t i = 0; i < int64_t(out.size()); ++i) out[size_t(i)] = v[size_t(broadcast_index(unravel(i, big), small))];
  return out;
}

/// Counts the sub-cases a test ran, for its MESSAGE.
struct Count {
  int n = 0;
  void operator++() { ++n; }
};

}  // namespace

// =============================================================================================
// layer_norm
// =============================================================================================

TEST_CASE("probe norm: layer_norm matches float64 loops over multi-dim shapes, layouts, affine and eps") {
  struct Case {
    Shape xs, ns;
  };
  const Case cases[] = {{{4, 3, 5}, {5}},       {{2, 3, 4, 5}, {4, 5}}, {{3, 4, 5}, {3, 4, 5}}, {{6, 1}, {1}},
                        {{0, 5}, {5}},          {{2, 0, 3}, {3}},       {{5, 7}, {7}},          {{3, 1, 4}, {1, 4}},
                        {{2, 3, 2, 2}, {3, 2, 2}}};
  Count count;
  uint64_t seed = 1000;
  for (const Case& c : cases)
    for (Lay l : kLays)
      for (DType dt : {kFloat64, kFloat32})
        for (int affine = 0; affine < 4; ++affine)
          for (double eps : {1e-5, 0.5, 0.0}) {
            const int64_t N = numel_of(c.ns);
            if (eps == 0.0 && N == 1) continue;  // var 0 / 0: NaN in torch too
            CAPTURE(shape_str(c.xs));
            CAPTURE(shape_str(c.ns));
            CAPTURE(lay_name(l));
            CAPTURE(dtype_name(dt));
            CAPTURE(affine);
            CAPTURE(eps);
            ++seed;
            const Tensor x = laid(random_values(numel_of(c.xs), seed, -3, 5), c.xs, dt, l);
            const Tensor w = (affine & 1) ? laid(random_values(N, seed + 1, 0.5, 2), c.ns, dt, l) : Tensor();
            const Tensor b = (affine & 2) ? laid(random_values(N, seed + 2), c.ns, dt, l) : Tensor();
            const std::vector<double> xv = values_of(x), wv = w.defined() ? values_of(w) : std::vector<double>(),
                                      bv = b.defined() ? values_of(b) : std::vector<double>();
            const LnRef ref = ln_ref(xv, N, wv, bv, eps);
            const double rtol = dt == kFloat64 ? 1e-12 : 2e-5, atol = dt == kFloat64 ? 1e-12 : 2e-5;
            const ops::LayerNormResult r = ops::layer_norm(x, c.ns, w, b, eps);
            REQUIRE(r.out.sizes() == c.xs);
            const Shape rows(c.xs.begin(), c.xs.end() - int64_t(c.ns.size()));
            CHECK(r.mean.sizes() == rows);
            CHECK(r.mean.dtype() == dt);  // float32 statistics for float32, float64 for float64
            check_close(r.out, ref.y, rtol, atol, "ops::layer_norm out");
            check_close(r.mean, ref.mean, rtol, atol, "mean");
            check_close(r.rstd, ref.rstd, eps == 0.0 ? 1e-4 : rtol, atol, "rstd");
            check_close(frugal::layer_norm(x, c.ns, w, b, eps), ref.y, rtol, atol, "frugal::layer_norm");
            ++count;
          }
  MESSAGE(count.n, " layer_norm forwards checked");
}

TEST_CASE("probe norm: layer_norm statistics survive huge offsets; constant rows give the bias") {
  // float64 rows 1e8 + k / 1024 (k in [-60, 60]): every value, sum and deviation is exact, so
  // the reference is exact; E[x^2] - E[x]^2 would have lost the variance (~1e-3) to the ulp of
  // 1e16 (2). float32 rows 1e8 + 8k: representable; with pairs +-k the mean is exactly 1e8
  // (tight), else the float32 mean carries up to half an ulp (4) of error, i.e. 4 rstd in xhat.
  Count count;
  for (int64_t N : {8, 64, 1000})
    for (bool symmetric : {true, false})
      for (DType dt : {kFloat64, kFloat32}) {
        CAPTURE(N);
        CAPTURE(symmetric);
        CAPTURE(dtype_name(dt));
        const int64_t M = 3;
        std::vector<double> xv;
        const std::vector<double> noise = random_values(M * N, uint64_t(N) + (symmetric ? 7 : 9), -60, 60);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double k = std::round(noise[size_t(i * N + j)]);
            if (symmetric && j % 2 == 1) k = -std::round(noise[size_t(i * N + j - 1)]);
            if (symmetric && N % 2 == 1 && j == N - 1) k = 0;
            xv.push_back(dt == kFloat64 ? 1e8 + k / 1024.0 : 1e8 + 8.0 * k);
          }
        const std::vector<double> wv = random_values(N, 3, 0.5, 2), bv = random_values(N, 4);
        const Tensor x = make_tensor(xv, {M, N}, dt, Layout::Strided);
        const LnRef ref = ln_ref(xv, N, wv, bv, 1e-5);
        double atol = dt == kFloat64 ? 1e-9 : 1e-4;
        if (!symmetric) {  // the stored mean is 1e8 + noise rounded to dt: half an ulp of 1e8 off
          double worst_rstd = 0;
          for (double r : ref.rstd) worst_rstd = std::max(worst_rstd, r);
          const double ulp = dt == kFloat64 ? std::nextafter(1e8, 2e8) - 1e8 : ulp32(1e8);
          atol += 0.5 * ulp * worst_rstd * 2.0;  // |w| < 2
        }
        const ops::LayerNormResult r = ops::layer_norm(x, {N}, make_tensor(wv, {N}, dt), make_tensor(bv, {N}, dt));
        check_close(r.out, ref.y, dt == kFloat64 ? 1e-9 : 1e-4, atol, "out");
        check_close(r.rstd, ref.rstd, dt == kFloat64 ? 1e-9 : 1e-4, 0, "rstd (the variance)");
        ++count;
      }
  // Constant rows: var = 0 exactly, so xhat = 0 and out = bias whatever rstd = 1/sqrt(eps) is;
  // the gradient is finite: grad_x = rstd (dxhat - mean(dxhat)), grad_weight = sum(g xhat) = 0.
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
    for (double value : {0.0, 0.1, -3.75, 1e4, 1e8})
      for (int64_t N : {1, 3, 7, 256}) {
        if ((dt == kFloat16 && value > 6e4)) continue;
        CAPTURE(dtype_name(dt));
        CAPTURE(value);
        CAPTURE(N);
        const int64_t M = 2;
        const Tensor x = full({M, N}, value, dt);
        const std::vector<double> wv = random_values(N, 11, 0.5, 2), bv = random_values(N, 12);
        const Tensor w = make_tensor(wv, {N}, dt), b = make_tensor(bv, {N}, dt);
        const Tensor xl = x.clone();
        xl.requires_grad_();
        const Tensor wl = w.clone(), bl = b.clone();
        wl.requires_grad_();
        bl.requires_grad_();
        const Tensor y = frugal::layer_norm(xl, {N}, wl, bl);
        std::vector<double> expect_y;
        for (int64_t i = 0; i < M; ++i) expect_y.insert(expect_y.end(), bv.begin(), bv.end());
        const double tol = dt == kFloat64 ? 1e-12 : default_rtol(dt);
        check_close(y, values_of(make_tensor(expect_y, {M, N}, dt)), tol, tol, "constant row: out = bias");
        const std::vector<double> gv = random_values(M * N, 13);
        y.backward(make_tensor(gv, {M, N}, dt));
        const double rs = 1.0 / std::sqrt(1e-5);
        std::vector<double> gx(size_t(M * N)), gb(size_t(N), 0.0);
        const std::vector<double> wr = values_of(w), gr = values_of(make_tensor(gv, {M, N}, dt));
        for (int64_t i = 0; i < M; ++i) {
          double s1 = 0;
          for (int64_t j = 0; j < N; ++j) s1 += gr[size_t(i * N + j)] * wr[size_t(j)];
          for (int64_t j = 0; j < N; ++j) {
            gx[size_t(i * N + j)] = rs * (gr[size_t(i * N + j)] * wr[size_t(j)] - s1 / double(N));
            gb[size_t(j)] += gr[size_t(i * N + j)];
          }
        }
        // var is 0 exactly when the mean of N copies of v is v: true for these values.
        check_close(xl.grad(), gx, tol, tol * rs * 4, "constant row: grad_x");
        check_close(wl.grad(), std::vector<double>(size_t(N), 0.0), 0, tol * 4, "constant row: grad_weight");
        check_close(bl.grad(), gb, tol, tol, "constant row: grad_bias");
        ++count;
      }
  MESSAGE(count.n, " huge-offset and constant-row layer norms checked");
}

TEST_CASE("probe norm: layer_norm gradients match central differences and the closed form") {
  struct Case {
    Shape xs, ns;
  };
  const Case cases[] = {{{3, 4}, {4}}, {{2, 3, 4}, {3, 4}}, {{2, 2, 3}, {2, 2, 3}}, {{4, 1}, {1}}, {{2, 3, 2, 2}, {2, 2}}};
  Count count;
  uint64_t seed = 2000;
  for (const Case& c : cases)
    for (int affine = 0; affine < 4; ++affine)
      for (bool permuted : {false, true}) {
        CAPTURE(shape_str(c.xs));
        CAPTURE(shape_str(c.ns));
        CAPTURE(affine);
        CAPTURE(permuted);
        ++seed;
        const int64_t n = int64_t(c.xs.size());
        // The op sees leaf.permute(rev) (dims reversed in memory) when permuted.
        std::vector<int64_t> rev;
        Shape ls = c.xs;
        if (permuted) {
          for (int64_t i = n - 1; i >= 0; --i) rev.push_back(i);
          std::reverse(ls.begin(), ls.end());
        }
        const Tensor xl = leaf(ls, seed);
        const Tensor w = leaf(c.ns, seed + 1, 0.5, 2), b = leaf(c.ns, seed + 2);
        const double eps = affine == 3 ? 0.3 : 1e-5;
        TensorList inputs{xl};
        if (affine & 1) inputs.push_back(w);
        if (affine & 2) inputs.push_back(b);
        check_gradcheck(
            [&](const TensorList& in) {
              size_t k = 1;
              const Tensor wi = (affine & 1) ? in[k++] : Tensor();
              const Tensor bi = (affine & 2) ? in[k++] : Tensor();
              return frugal::layer_norm(permuted ? in[0].permute(rev) : in[0], c.ns, wi, bi, eps);
            },
            inputs);
        // One backward on fresh leaves against the closed form, with a transposed grad_out.
        const Tensor xl2 = xl.detach().clone(), w2 = w.detach().clone(), b2 = b.detach().clone();
        xl2.requires_grad_(), w2.requires_grad_(), b2.requires_grad_();
        const Tensor x = permuted ? xl2.permute(rev) : xl2;
        const Tensor y = frugal::layer_norm(x, c.ns, (affine & 1) ? w2 : Tensor(), (affine & 2) ? b2 : Tensor(), eps);
        const Tensor gy = random_tensor(c.xs, kFloat64, seed + 3, Layout::Transposed);
        y.backward(gy);
        const LnGrads ref = ln_grad_ref(values_of(gy), values_of(x), numel_of(c.ns),
                                        (affine & 1) ? values_of(w2) : std::vector<double>(), eps);
        check_close(permuted ? xl2.grad().permute(rev) : xl2.grad(), ref.x, 1e-10, 1e-10, "grad_x");
        if (affine & 1) check_close(w2.grad(), ref.w, 1e-10, 1e-10, "grad_weight");
        if (affine & 2) check_close(b2.grad(), ref.b, 1e-10, 1e-10, "grad_bias");
        ++count;
      }
  // A size-0 batch: empty grad_x, zero parameter gradients (sums over no rows).
  const Tensor x0 = leaf({0, 4}, 1), w0 = leaf({4}, 2), b0 = leaf({4}, 3);
  frugal::layer_norm(x0, {4}, w0, b0).backward(zeros({0, 4}, kFloat64));
  CHECK(x0.grad().sizes() == Shape{0, 4});
  check_close(w0.grad(), std::vector<double>(4, 0.0), 0, 0, "size-0 batch: grad_weight");
  check_close(b0.grad(), std::vector<double>(4, 0.0), 0, 0, "size-0 batch: grad_bias");
  MESSAGE(count.n, " layer_norm gradchecks");
}

TEST_CASE("probe norm: layer_norm in float16/bfloat16 keeps float32 statistics; nn::LayerNorm") {
  // float16 rows near 60000 (ulp 32): a float16 sum of 512 of them overflows to inf; bfloat16
  // rows near 3e4 (ulp 128) likewise lose everything in a bfloat16 sum. torch computes
  // half-precision layer norm in float32 ("statistics in float32", acc_type) and rounds y once.
  Count count;
  for (DType dt : {kFloat16, kBFloat16})
    for (int64_t N : {5, 64, 512})
      for (Lay l : kLays)
        for (bool affine : {false, true}) {
          CAPTURE(dtype_name(dt));
          CAPTURE(N);
          CAPTURE(lay_name(l));
          CAPTURE(affine);
          const int64_t M = 3;
          const double base = dt == kFloat16 ? 60000 : 30000, step = dt == kFloat16 ? 32 : 128;
          std::vector<double> xv = random_values(M * N, uint64_t(N) * 3 + 1, -40, 40);
          for (double& v : xv) v = base + step * std::round(v);
          const Tensor x = laid(xv, {M, N}, dt, l);
          const Tensor w = affine ? make_tensor(random_values(N, 5, 0.5, 2), {N}, dt) : Tensor();
          const Tensor b = affine ? make_tensor(random_values(N, 6), {N}, dt) : Tensor();
          const LnRef ref = ln_ref(values_of(x), N, affine ? values_of(w) : std::vector<double>(),
                                   affine ? values_of(b) : std::vector<double>(), 1e-5);
          const ops::LayerNormResult r = ops::layer_norm(x, {N}, w, b);
          CHECK(r.out.dtype() == dt);
          CHECK(r.mean.dtype() == kFloat32);
          CHECK(r.rstd.dtype() == kFloat32);
          check_close(r.mean, ref.mean, 1e-6, 0, "mean (float32)");
          check_close(r.rstd, ref.rstd, 1e-5, 0, "rstd (float32)");
          check_close(r.out, ref.y, default_rtol(dt), default_rtol(dt), "out, rounded once");
          // The backward in the half type against the closed form on the rounded values.
          const Tensor xl = x.clone();
          xl.requires_grad_();
          const Tensor gy = random_tensor({M, N}, dt, 17);
          frugal::layer_norm(xl, {N}, w, b).backward(gy);
          const LnGrads g = ln_grad_ref(values_of(gy), values_of(x), N, affine ? values_of(w) : std::vector<double>(),
                                        1e-5);
          double scale = 0;
          for (double v : g.x) scale = std::max(scale, std::fabs(v));
          check_close(xl.grad(), g.x, 2 * default_rtol(dt), 4 * default_rtol(dt) * scale, "grad_x");
          ++count;
        }
  // nn::LayerNorm: torch.nn.LayerNorm(normalized_shape, eps, elementwise_affine).
  for (bool affine : {true, false})
    for (double eps : {1e-5, 1e-2}) {
      nn::LayerNorm m({3, 4}, {.eps = eps, .elementwise_affine = affine});
      CHECK(m.weight.defined() == affine);
      std::vector<double> wv, bv;
      if (affine) {
        autograd::NoGradGuard ng;
        wv = random_values(12, 21, 0.5, 2), bv = random_values(12, 22);
        m.weight.copy_(from_vector(wv, {3, 4}, TensorOptions(kFloat64)));
        m.bias.copy_(from_vector(bv, {3, 4}, TensorOptions(kFloat64)));
      }
      const Tensor x = laid(random_values(2 * 5 * 12, 23, -2, 6), {2, 5, 3, 4}, kFloat32, Lay::Reversed);
      check_close(m.forward(x), ln_ref(values_of(x), 12, wv, bv, eps).y, 2e-5, 2e-5, "nn::LayerNorm");
      ++count;
    }
  MESSAGE(count.n, " half-precision layer norms and modules checked");
}

// =============================================================================================
// batch_norm
// =============================================================================================

TEST_CASE("probe norm: batch_norm training matches torch: batch statistics, unbiased running update, momentum") {
  const Shape shapes[] = {{4, 3}, {3, 2, 5}, {2, 3, 4, 5}, {1, 2, 3, 3}, {5, 1, 1, 1}, {2, 2, 1, 3}};
  Count count;
  uint64_t seed = 3000;
  for (const Shape& xs : shapes)
    for (Lay l : kLays)
      for (DType dt : {kFloat64, kFloat32})
        for (double momentum : {0.1, 0.0, 1.0, 0.37})
          for (int affine = 0; affine < 3; ++affine)  // none, weight+bias, bias only
            for (int running = 0; running < 4; ++running) {  // none, contiguous, strided, offset views
              CAPTURE(shape_str(xs));
              CAPTURE(lay_name(l));
              CAPTURE(dtype_name(dt));
              CAPTURE(momentum);
              CAPTURE(affine);
              CAPTURE(running);
              ++seed;
              const int64_t C = xs[1];
              const Tensor x = laid(random_values(numel_of(xs), seed, -1, 4), xs, dt, l);
              const std::vector<double> wv = affine == 1 ? random_values(C, seed + 1, 0.5, 2) : std::vector<double>();
              const std::vector<double> bv = affine >= 1 ? random_values(C, seed + 2) : std::vector<double>();
              const Tensor w = wv.empty() ? Tensor() : make_tensor(wv, {C}, dt);
              const Tensor b = bv.empty() ? Tensor() : make_tensor(bv, {C}, dt);
              std::vector<double> rm0, rv0;
              Tensor rm, rv;
              if (running) {
                rm0 = random_values(C, seed + 3), rv0 = random_values(C, seed + 4, 0.5, 3);
                auto place = [&](const std::vector<double>& v) {
                  if (running == 1) return make_tensor(v, {C}, dt);
                  if (running == 2) return laid(v, {C}, dt, Lay::OffsetStrided);
                  const Tensor mem = full({C + 3}, kNaN, dt);  // a contiguous view at offset 2
                  const Tensor view = mem.narrow(0, 2, C);
                  view.copy_(make_tensor(v, {C}, kFloat64));
                  return view;
                };
                rm = place(rm0), rv = place(rv0);
                rm0 = values_of(rm), rv0 = values_of(rv);
              }
              const BnRef ref = bn_ref(values_of(x), xs, wv, bv, rm0, rv0, true, momentum, 1e-5);
              const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
              const ops::BatchNormResult r = ops::batch_norm(x, rm, rv, w, b, true, momentum);
              REQUIRE(r.out.sizes() == xs);
              check_close(r.out, ref.y, tol, tol, "out");
              check_close(r.mean, ref.mean, tol, tol, "saved mean");
              check_close(r.invstd, ref.invstd, tol, tol, "saved invstd");
              if (running) {
                check_close(rm, ref.rm, tol, tol, "running_mean");
                check_close(rv, ref.rv, tol, tol, "running_var (unbiased, momentum)");
              }
              ++count;
            }
  MESSAGE(count.n, " batch_norm training forwards checked");
}

TEST_CASE("probe norm: batch_norm eval normalizes with the given running statistics and leaves them") {
  Count count;
  uint64_t seed = 4000;
  for (const Shape& xs : {Shape{4, 3}, Shape{1, 3}, Shape{2, 3, 5}, Shape{2, 3, 4, 5}, Shape{1, 2, 1, 1}})
    for (Lay l : kLays)
      for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
        for (bool affine : {false, true}) {
          CAPTURE(shape_str(xs));
          CAPTURE(lay_name(l));
          CAPTURE(dtype_name(dt));
          CAPTURE(affine);
          ++seed;
          const int64_t C = xs[1];
          // Half types may keep float32 parameters and statistics (torch's mixed batch norm).
          const DType pdt = (dt == kFloat16 || dt == kBFloat16) && seed % 2 ? kFloat32 : dt;
          const Tensor x = laid(random_values(numel_of(xs), seed, -1, 4), xs, dt, l);
          const Tensor rm = make_tensor(random_values(C, seed + 1), {C}, pdt);
          const Tensor rv = make_tensor(random_values(C, seed + 2, 0.2, 3), {C}, pdt);
          const Tensor w = affine ? make_tensor(random_values(C, seed + 3, 0.5, 2), {C}, pdt) : Tensor();
          const Tensor b = affine ? make_tensor(random_values(C, seed + 4), {C}, pdt) : Tensor();
          const std::vector<double> rm0 = values_of(rm), rv0 = values_of(rv);
          const std::vector<double> gyv = random_values(numel_of(xs), seed + 5);
          const Tensor gy = laid(gyv, xs, dt, Lay::Reversed);
          const std::vector<double> gyr = values_of(gy);
          const BnRef ref = bn_ref(values_of(x), xs, affine ? values_of(w) : std::vector<double>(),
                                   affine ? values_of(b) : std::vector<double>(), rm0, rv0, false, 0.1, 1e-5, &gyr);
          const double tol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 2e-5 : 2 * default_rtol(dt);
          const Tensor xl = x.clone();
          xl.requires_grad_();
          const Tensor wl = affine ? w.clone() : Tensor(), bl = affine ? b.clone() : Tensor();
          if (affine) wl.requires_grad_(), bl.requires_grad_();
          const Tensor y = frugal::batch_norm(xl, rm, rv, wl, bl, false, 0.1);
          check_close(y, ref.y, tol, tol, "eval out");
          check_close(rm, rm0, 0, 0, "eval leaves running_mean");
          check_close(rv, rv0, 0, 0, "eval leaves running_var");
          y.backward(gy);
          check_close(xl.grad(), ref.gx, tol, tol, "eval grad_x = weight invstd g");
          if (affine) {
            double scale = 1;
            for (double v : ref.gw) scale = std::max(scale, std::fabs(v));
            check_close(wl.grad(), ref.gw, tol, tol * scale, "eval grad_weight (running mean)");
            check_close(bl.grad(), ref.gb, tol, tol * numel_of(xs), "eval grad_bias");
          }
          ++count;
        }
  MESSAGE(count.n, " batch_norm eval forwards and backwards checked");
}

TEST_CASE("probe norm: batch_norm variance survives huge means over many values per channel") {
  // 16384 values per channel around 1e4 (float32 ulp 1e-3) and 1e8 (ulp 8), and in float64
  // around 1e8 with noise k / 1024 (exact). A one-pass E[x^2] - E[x]^2 in float32 is off by
  // thousands of percent here. The float32 mean carries at most half an ulp of error.
  Count count;
  for (DType dt : {kFloat32, kFloat64})
    for (double base : {1e4, 1e8})
      for (Lay l : {Lay::Contiguous, Lay::ChannelsLast}) {
        CAPTURE(dtype_name(dt));
        CAPTURE(base);
        CAPTURE(lay_name(l));
        const Shape xs{4, 2, 64, 64};
        std::vector<double> xv = random_values(numel_of(xs), uint64_t(base) % 97 + 5, -50, 50);
        const double step = dt == kFloat64 ? 1.0 / 1024 : base > 1e5 ? 8.0 : 1.0 / 512;
        for (double& v : xv) v = base + step * std::round(v);
        const Tensor x = laid(xv, xs, dt, l);
        const Tensor rm = zeros({2}, dt), rv = ones({2}, dt);
        const BnRef ref = bn_ref(values_of(x), xs, {}, {}, {0, 0}, {1, 1}, true, 0.5, 1e-5);
        const ops::BatchNormResult r = ops::batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.5);
        double atol = dt == kFloat64 ? 1e-9 : 1e-4;
        if (dt == kFloat32) atol += 0.5 * ulp32(base) * std::max(ref.invstd[0], ref.invstd[1]);
        check_close(r.out, ref.y, 1e-4, atol, "out");
        check_close(r.invstd, ref.invstd, dt == kFloat64 ? 1e-10 : 1e-5, 0, "invstd (the batch variance)");
        check_close(rv, ref.rv, dt == kFloat64 ? 1e-10 : 1e-5, 0, "running_var");
        ++count;
      }
  MESSAGE(count.n, " huge-mean batch norms checked");
}

TEST_CASE("probe norm: batch_norm with one value per channel and size-0 batches, as torch") {
  // torch: "Expected more than 1 value per channel when training" when N * prod(spatial) == 1
  // (F.batch_norm's _verify_batch_size); eval takes one value; a size-0 batch returns an empty
  // output and leaves the running statistics alone (aten's _batch_norm_impl_index).
  for (const Shape& xs : {Shape{1, 3}, Shape{1, 3, 1}, Shape{1, 3, 1, 1}}) {
    CAPTURE(shape_str(xs));
    const Tensor x = random_tensor(xs, kFloat32, 5);
    check_error([&] { ops::batch_norm(x, zeros({3}), ones({3}), Tensor(), Tensor(), true); },
                {"batch_norm", "more than 1 value per channel"});
    check_error([&] { frugal::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true); },
                {"batch_norm", "more than 1 value per channel"});
    const Tensor rm = make_tensor({0.5, -1, 2}, {3}, kFloat32), rv = make_tensor({4, 0.25, 1}, {3}, kFloat32);
    const BnRef ref = bn_ref(values_of(x), xs, {}, {}, values_of(rm), values_of(rv), false, 0.1, 1e-5);
    check_close(ops::batch_norm(x, rm, rv, Tensor(), Tensor(), false).out, ref.y, 1e-6, 1e-6, "eval, one value");
  }
  // Two values per channel are enough (the unbiased variance divides by 1).
  {
    const Tensor x = make_tensor({1, 5, 3, 9}, {2, 2}, kFloat64);
    const Tensor rm = zeros({2}, kFloat64), rv = zeros({2}, kFloat64);
    ops::batch_norm(x, rm, rv, Tensor(), Tensor(), true, 1.0);
    check_close(rm, {2, 7}, 1e-15, 0, "two values: running_mean");
    check_close(rv, {2, 8}, 1e-15, 0, "two values: running_var = unbiased variance");
  }
  for (bool training : {true, false})
    for (const Shape& xs : {Shape{0, 3}, Shape{0, 3, 4, 4}, Shape{2, 3, 0}}) {
      CAPTURE(training);
      CAPTURE(shape_str(xs));
      const Tensor rm = make_tensor({0.5, -1, 2}, {3}, kFloat32), rv = make_tensor({4, 0.25, 1}, {3}, kFloat32);
      const Tensor xl = zeros(xs, kFloat32);
      xl.requires_grad_();
      const Tensor w = ones({3}, kFloat32);
      w.requires_grad_();
      // Note [Size-0 batch norm]: an empty step, running statistics untouched.
      const Tensor y = frugal::batch_norm(xl, rm, rv, w, Tensor(), training, 0.1);
      CHECK(y.sizes() == xs);
      check_close(rm, {0.5, -1, 2}, 0, 0, "size-0 batch leaves running_mean");
      check_close(rv, {4, 0.25, 1}, 0, 0, "size-0 batch leaves running_var");
      y.backward(zeros(xs, kFloat32));
      CHECK(xl.grad().sizes() == xs);
      check_close(w.grad(), {0, 0, 0}, 0, 0, "size-0 batch: grad_weight is a sum over nothing");
    }
}

TEST_CASE("probe norm: nn::BatchNorm2d over several batches matches torch.nn.BatchNorm2d") {
  Count count;
  for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>(0.6), std::optional<double>()})
    for (bool affine : {true, false})
      for (Lay l : {Lay::Contiguous, Lay::ChannelsLast, Lay::Reversed}) {
        CAPTURE(momentum.value_or(-1));
        CAPTURE(affine);
        CAPTURE(lay_name(l));
        const int64_t C = 3;
        nn::BatchNorm2d bn(C, {.eps = 1e-3, .momentum = momentum, .affine = affine});
        std::vector<double> wv, bv;
        if (affine) {
          autograd::NoGradGuard ng;
          wv = random_values(C, 31, 0.5, 2), bv = random_values(C, 32);
          bn.weight.copy_(from_vector(wv, {C}, TensorOptions(kFloat64)));
          bn.bias.copy_(from_vector(bv, {C}, TensorOptions(kFloat64)));
        }
        std::vector<double> rm(size_t(C), 0.0), rv(size_t(C), 1.0);
        for (int step = 1; step <= 3; ++step) {
          CAPTURE(step);
          const Shape xs{2 + step, C, 3, 2};
          const Tensor x = laid(random_values(numel_of(xs), uint64_t(40 + step), -2, 3 + step), xs, kFloat32, l);
          // torch: exponential_average_factor = momentum, or 1 / num_batches_tracked when None.
          const double m = momentum ? *momentum : 1.0 / step;
          const BnRef ref = bn_ref(values_of(x), xs, wv, bv, rm, rv, true, m, 1e-3);
          check_close(bn.forward(x), ref.y, 2e-5, 2e-5, "training out");
          rm = ref.rm, rv = ref.rv;
          check_close(bn.running_mean, rm, 2e-6, 2e-6, "running_mean");
          check_close(bn.running_var, rv, 2e-6, 2e-6, "running_var");
          CHECK(bn.num_batches_tracked.item<int64_t>() == step);
        }
        bn.eval();
        const std::vector<double> rm_stored = values_of(bn.running_mean);
        const Shape xs{2, C, 2, 3};
        const Tensor x = laid(random_values(numel_of(xs), 50, -2, 3), xs, kFloat32, l);
        check_close(bn.forward(x), bn_ref(values_of(x), xs, wv, bv, rm, rv, false, 0, 1e-3).y, 2e-5, 2e-5,
                    "eval out (running statistics)");
        CHECK(bn.num_batches_tracked.item<int64_t>() == 3);  // eval counts nothing
        check_close(bn.running_mean, rm_stored, 0, 0, "eval leaves running_mean");
        ++count;
      }
  // track_running_stats=false: no buffers, batch statistics in eval too.
  nn::BatchNorm2d bn(2, {.track_running_stats = false});
  bn.eval();
  CHECK(!bn.running_mean.defined());
  const Tensor x = random_tensor({3, 2, 2, 2}, kFloat32, 60);
  check_close(bn.forward(x), bn_ref(values_of(x), {3, 2, 2, 2}, {1, 1}, {0, 0}, {}, {}, true, 0.1, 1e-5).y, 2e-5,
              2e-5, "track_running_stats=false: batch statistics in eval");
  MESSAGE(count.n, " BatchNorm2d sequences checked");
}

TEST_CASE("probe norm: batch_norm gradients match central differences and the closed forms") {
  Count count;
  uint64_t seed = 5000;
  for (const Shape& xs : {Shape{4, 3}, Shape{3, 2, 4}, Shape{2, 3, 2, 3}, Shape{1, 2, 2, 2}})
    for (bool training : {true, false})
      for (int affine = 0; affine < 3; ++affine)
        for (bool permuted : {false, true}) {
          CAPTURE(shape_str(xs));
          CAPTURE(training);
          CAPTURE(affine);
          CAPTURE(permuted);
          ++seed;
          const int64_t C = xs[1], n = int64_t(xs.size());
          std::vector<int64_t> rev;
          Shape ls = xs;
          if (permuted) {
            for (int64_t i = n - 1; i >= 0; --i) rev.push_back(i);
            std::reverse(ls.begin(), ls.end());
          }
          const Tensor xl = leaf(ls, seed, -1, 3);
          const Tensor w = leaf({C}, seed + 1, 0.5, 2), b = leaf({C}, seed + 2);
          const Tensor rm = make_tensor(random_values(C, seed + 3), {C}, kFloat64);
          const Tensor rv = make_tensor(random_values(C, seed + 4, 0.5, 2), {C}, kFloat64);
          TensorList inputs{xl};
          if (affine >= 1) inputs.push_back(w);
          if (affine == 2) inputs.push_back(b);
          check_gradcheck(
              [&](const TensorList& in) {
                const Tensor wi = affine >= 1 ? in[1] : Tensor(), bi = affine == 2 ? in[2] : Tensor();
                // Training without running statistics: gradcheck's many forwards move nothing.
                return frugal::batch_norm(permuted ? in[0].permute(rev) : in[0], training ? Tensor() : rm,
                                          training ? Tensor() : rv, wi, bi, training, 0.1, 1e-3);
              },
              inputs);
          // float32 backward against the closed form, grad_out transposed.
          const Tensor xf = laid(values_of(permuted ? xl.permute(rev) : xl), xs, kFloat32, permuted ? Lay::Reversed : Lay::Contiguous);
          const Tensor xfl = xf.detach();
          xfl.requires_grad_();
          const Tensor wf = w.detach().to(kFloat32), bf = b.detach().to(kFloat32);
          const Tensor wfl = wf.clone(), bfl = bf.clone();
          wfl.requires_grad_();
          bfl.requires_grad_();
          const Tensor gy = laid(random_values(numel_of(xs), seed + 5), xs, kFloat32, Lay::Reversed);
          const Tensor y = frugal::batch_norm(xfl, training ? Tensor() : rm.to(kFloat32),
                                              training ? Tensor() : rv.to(kFloat32), affine >= 1 ? wfl : Tensor(),
                                              affine == 2 ? bfl : Tensor(), training, 0.1, 1e-3);
          y.backward(gy);
          const std::vector<double> gyv = values_of(gy);
          const BnRef ref = bn_ref(values_of(xf), xs, affine >= 1 ? values_of(wf) : std::vector<double>(),
                                   affine == 2 ? values_of(bf) : std::vector<double>(), values_of(rm), values_of(rv),
                                   training, 0.1, 1e-3, &gyv);
          check_close(xfl.grad(), ref.gx, 1e-4, 1e-4, "float32 grad_x");
          if (affine >= 1) check_close(wfl.grad(), ref.gw, 1e-4, 1e-4, "float32 grad_weight");
          if (affine == 2) check_close(bfl.grad(), ref.gb, 1e-4, 1e-4, "float32 grad_bias");
          ++count;
        }
  MESSAGE(count.n, " batch_norm gradchecks");
}

TEST_CASE("probe norm: batch_norm_relu, batch_norm_add_relu and the apply recipes match their definitions") {
  // relu(bn(x) + residual): ReLU's gradient passes g where the output is > 0 (torch's
  // threshold_backward), grad_residual = that masked g, and bn's gradients follow from it.
  // batch_norm_apply / layer_norm_apply regenerate a forward's output bit for bit from its
  // statistics (Note [Recomputable outputs]), in every layout.
  Count count;
  uint64_t seed = 5500;
  for (const Shape& xs : {Shape{3, 2, 2, 3}, Shape{4, 3}, Shape{2, 3, 5}})
    for (bool training : {true, false})
      for (bool with_residual : {false, true})
        for (Lay l : {Lay::Contiguous, Lay::ChannelsLast, Lay::Reversed}) {
          CAPTURE(shape_str(xs));
          CAPTURE(training);
          CAPTURE(with_residual);
          CAPTURE(lay_name(l));
          ++seed;
          const int64_t C = xs[1];
          const Tensor x = laid(random_values(numel_of(xs), seed, -2, 2), xs, kFloat64, l).detach();
          x.requires_grad_();
          const Tensor r = with_residual ? laid(random_values(numel_of(xs), seed + 1), xs, kFloat64, l) : Tensor();
          if (r.defined()) r.requires_grad_();
          const Tensor w = leaf({C}, seed + 2, 0.5, 2), b = leaf({C}, seed + 3);
          const Tensor rm = make_tensor(random_values(C, seed + 4), {C}, kFloat64);
          const Tensor rv = make_tensor(random_values(C, seed + 5, 0.5, 2), {C}, kFloat64);
          const std::vector<double> rm0 = values_of(rm), rv0 = values_of(rv);
          const Tensor y = with_residual ? frugal::batch_norm_add_relu(x, r, rm, rv, w, b, training, 0.2)
                                         : frugal::batch_norm_relu(x, rm, rv, w, b, training, 0.2);
          const BnRef f = bn_ref(values_of(x), xs, values_of(w), values_of(b), rm0, rv0, training, 0.2, 1e-5);
          const std::vector<double> rvv = r.defined() ? values_of(r) : std::vector<double>(f.y.size(), 0.0);
          std::vector<double> expect(f.y.size());
          for (size_t i = 0; i < expect.size(); ++i) expect[i] = std::max(0.0, f.y[i] + rvv[i]);
          check_close(y, expect, 1e-12, 1e-12, "relu(bn(x) + r)");
          if (training) {
            check_close(rm, f.rm, 1e-12, 1e-12, "running_mean");
            check_close(rv, f.rv, 1e-12, 1e-12, "running_var");
          }
          const std::vector<double> gv = random_values(numel_of(xs), seed + 6);
          std::vector<double> gz(gv.size());
          for (size_t i = 0; i < gz.size(); ++i) gz[i] = expect[i] > 0 ? gv[i] : 0.0;
          y.backward(make_tensor(gv, xs, kFloat64));
          const BnRef g = bn_ref(values_of(x), xs, values_of(w), values_of(b), rm0, rv0, training, 0.2, 1e-5, &gz);
          check_close(x.grad(), g.gx, 1e-10, 1e-10, "grad_x");
          check_close(w.grad(), g.gw, 1e-10, 1e-10, "grad_weight");
          check_close(b.grad(), g.gb, 1e-10, 1e-10, "grad_bias");
          if (r.defined()) check_close(r.grad(), gz, 0, 0, "grad_residual = g (out > 0)");
          // The apply recipe, from the statistics a float32 forward returned.
          const Tensor xf = laid(values_of(x), xs, kFloat32, l);
          const Tensor rf = r.defined() ? laid(values_of(r), xs, kFloat32, l) : Tensor();
          const Tensor wf = w.detach().to(kFloat32), bf = b.detach().to(kFloat32);
          const ops::BatchNormResult fr = with_residual
                                              ? ops::batch_norm_add_relu(xf, rf, rm.to(kFloat32), rv.to(kFloat32), wf,
                                                                         bf, training, 0.2)
                                              : ops::batch_norm(xf, rm.to(kFloat32), rv.to(kFloat32), wf, bf, training);
          const Tensor again = ops::batch_norm_apply(xf, rf, with_residual, fr.mean, fr.invstd, wf, bf);
          CHECK_MESSAGE(bytes_of(again) == bytes_of(fr.out), "batch_norm_apply differs from the forward");
          ++count;
        }
  for (Lay l : kLays)
    for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
      CAPTURE(lay_name(l));
      CAPTURE(dtype_name(dt));
      const Tensor x = laid(random_values(2 * 3 * 4 * 5, 77, -3, 3), {2, 3, 4, 5}, dt, l);
      const Tensor w = laid(random_values(20, 78), {4, 5}, dt, l), b = laid(random_values(20, 79), {4, 5}, dt, l);
      const ops::LayerNormResult fr = ops::layer_norm(x, {4, 5}, w, b);
      CHECK_MESSAGE(bytes_of(ops::layer_norm_apply(x, {4, 5}, fr.mean, fr.rstd, w, b)) == bytes_of(fr.out),
                    "layer_norm_apply differs from the forward");
      ++count;
    }
  MESSAGE(count.n, " fused batch norms and apply recipes checked");
}

// =============================================================================================
// softmax / log_softmax
// =============================================================================================

TEST_CASE("probe norm: softmax and log_softmax along every dim of permuted, strided, offset, expanded inputs") {
  const Shape shapes[] = {{3, 4, 5}, {2, 1, 6}, {1, 7, 1}, {4, 0, 3}, {2, 3, 300}, {300, 2, 3}, {2, 300, 2}};
  Count count;
  uint64_t seed = 6000;
  for (const Shape& s : shapes)
    for (Lay l : kLays)
      for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
        for (int64_t dim : {0, 1, 2, -1, -3})
          for (bool log : {false, true}) {
            CAPTURE(shape_str(s));
            CAPTURE(lay_name(l));
            CAPTURE(dtype_name(dt));
            CAPTURE(dim);
            CAPTURE(log);
            ++seed;
            const Tensor x = laid(random_values(numel_of(s), seed, -8, 8), s, dt, l);
            const std::vector<double> ref = softmax_ref(values_of(x), s, dim, log);
            const double rtol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : 2 * default_rtol(dt);
            const double atol = log ? rtol * 8 : rtol;
            const Tensor y = log ? ops::log_softmax(x, dim) : ops::softmax(x, dim);
            REQUIRE(y.sizes() == s);
            CHECK(y.dtype() == dt);
            check_close(y, ref, rtol, atol, "raw");
            check_close(log ? frugal::log_softmax(x, dim) : frugal::softmax(x, dim), ref, rtol, atol, "autograd");
            ++count;
          }
  // Inputs expanded with stride 0, along the softmax dim and beside it.
  for (int64_t edim : {0, 1, 2})
    for (int64_t dim : {0, 1, 2})
      for (bool log : {false, true}) {
        CAPTURE(edim);
        CAPTURE(dim);
        CAPTURE(log);
        Shape base{3, 4, 5};
        base[size_t(edim)] = 1;
        const Tensor b = random_tensor(base, kFloat32, uint64_t(70 + edim));
        const Tensor x = b.expand({3, 4, 5});
        check_close(log ? ops::log_softmax(x, dim) : ops::softmax(x, dim),
                    softmax_ref(values_of(x), {3, 4, 5}, dim, log), 1e-5, 1e-5, "expanded input");
        ++count;
      }
  // A 0-d tensor is one slice of one element (dim 0 or -1): softmax 1, log_softmax 0.
  const Tensor s0 = scalar_tensor(3.5, kFloat32);
  check_close(ops::softmax(s0, 0), {1.0}, 0, 0, "0-d softmax");
  check_close(ops::log_softmax(s0, -1), {0.0}, 0, 0, "0-d log_softmax");
  MESSAGE(count.n, " softmax / log_softmax slices checked");
}

TEST_CASE("probe norm: softmax special values: -inf masks, all -inf, +inf, NaN, 1e30, very negative logs") {
  // Rows as (value list); torch's results follow from plain IEEE arithmetic (softmax_ref).
  const std::vector<std::vector<double>> rows = {
      {1, -kInf, 2, -kInf},          // -inf: weight 0, log -inf
      {-kInf, -kInf, -kInf, -kInf},  // all -inf: NaN (torch)
      {1, kInf, 2, 0},               // +inf: NaN everywhere
      {kInf, kInf, 0, 0},            // NaN
      {1, kNaN, 2, 3},               // NaN poisons the slice
      {1e30, 1e30, -1e30, 0},        // no overflow: 0.5, 0.5, 0, 0
      {-1e30, -1e30, -1e30, -1e30},  // uniform 0.25
      {0, -1000, -5000, -90},        // log_softmax -1000, -5000: finite (log(softmax) is -inf)
      {-100, -200, -300, -100},      // exp underflows in float32 for the smaller ones
      {3e38, -3e38, 0, 1},           // near float32's max, differences overflow: still 1, 0, 0, 0
  };
  Count count;
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
    for (size_t ri = 0; ri < rows.size(); ++ri)
      for (int64_t dim : {1, 0})  // the row along the last dim, or down a column of a (4, 3) tensor
        for (bool log : {false, true}) {
          CAPTURE(dtype_name(dt));
          CAPTURE(ri);
          CAPTURE(dim);
          CAPTURE(log);
          // Three copies of the row: along dim 1 as (3, 4), along dim 0 as its transpose (4, 3).
          std::vector<double> v;
          for (int k = 0; k < 3; ++k) v.insert(v.end(), rows[ri].begin(), rows[ri].end());
          const Tensor x3 = make_tensor(v, {3, 4}, dt);
          const Tensor x = dim == 1 ? x3 : x3.transpose(0, 1);
          const std::vector<double> xv = values_of(x);
          // Rounded to dt: log_softmax's 3e38 - (-3e38) = -6e38 is -inf in float32.
          const std::vector<double> ref =
              values_of(make_tensor(softmax_ref(xv, x.sizes(), dim, log), x.sizes(), TensorOptions(kFloat64))
                            .to(dt == kFloat64 ? kFloat64 : kFloat32));
          const double rtol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-6 : 2 * default_rtol(dt);
          check_close(log ? ops::log_softmax(x, dim) : ops::softmax(x, dim), ref, rtol, 1e-30, "raw");
          check_close(log ? frugal::log_softmax(x, dim) : frugal::softmax(x, dim), ref, rtol, 1e-30, "autograd");
          ++count;
        }
  MESSAGE(count.n, " special-value slices checked");
}

TEST_CASE("probe norm: softmax and log_softmax gradients match central differences and closed forms") {
  Count count;
  uint64_t seed = 7000;
  for (const Shape& s : {Shape{3, 4, 5}, Shape{2, 1, 3}, Shape{4, 3, 2}})
    for (int64_t dim : {0, 1, 2, -1})
      for (bool log : {false, true})
        for (bool permuted : {false, true}) {
          CAPTURE(shape_str(s));
          CAPTURE(dim);
          CAPTURE(log);
          CAPTURE(permuted);
          ++seed;
          Shape ls = s;
          if (permuted) std::reverse(ls.begin(), ls.end());
          const Tensor xl = leaf(ls, seed, -3, 3);
          check_gradcheck(
              [&](const TensorList& in) {
                const Tensor x = permuted ? in[0].permute({2, 1, 0}) : in[0];
                return log ? frugal::log_softmax(x, dim) : frugal::softmax(x, dim);
              },
              {xl});
          ++count;
        }
  // -inf entries: softmax's gradient there is 0 (y = 0); log_softmax's is g - exp(-inf) sum(g) = g
  // (torch's log_softmax_backward_data). float32 and float64, along dim 1 and dim 0.
  for (DType dt : {kFloat64, kFloat32})
    for (int64_t dim : {1, 0})
      for (bool log : {false, true}) {
        CAPTURE(dtype_name(dt));
        CAPTURE(dim);
        CAPTURE(log);
        const std::vector<double> row = {0.5, -kInf, 2, -kInf, -1};
        std::vector<double> v;
        for (int k = 0; k < 2; ++k) v.insert(v.end(), row.begin(), row.end());
        const Tensor base = make_tensor(v, {2, 5}, dt);
        const Tensor xl = (dim == 1 ? base : base.transpose(0, 1).contiguous()).clone();
        xl.requires_grad_();
        const Tensor y = log ? frugal::log_softmax(xl, dim) : frugal::softmax(xl, dim);
        const std::vector<double> gv = random_values(10, 77);
        const Tensor g = make_tensor(gv, xl.sizes(), dt);
        y.backward(g);
        const std::vector<double> yv = softmax_ref(values_of(xl), xl.sizes(), dim, log), gr = values_of(g);
        // Closed forms per slice.
        const Shape sz = xl.sizes();
        const int64_t D = sz[size_t(dim)], slices = 10 / D;
        std::vector<double> expect(10);
        for (int64_t sl = 0; sl < slices; ++sl) {
          auto at = [&](int64_t j) { return size_t(dim == 1 ? sl * D + j : j * slices + sl); };
          double dot = 0, sum = 0;
          for (int64_t j = 0; j < D; ++j) dot += gr[at(j)] * yv[at(j)], sum += gr[at(j)];
          for (int64_t j = 0; j < D; ++j)
            expect[at(j)] = log ? gr[at(j)] - std::exp(yv[at(j)]) * sum : yv[at(j)] * (gr[at(j)] - dot);
        }
        check_close(xl.grad(), expect, 1e-5, 1e-5, "gradient beside -inf");
        ++count;
      }
  MESSAGE(count.n, " softmax gradients checked");
}

// =============================================================================================
// masked_softmax
// =============================================================================================

TEST_CASE("probe norm: masked_softmax matches its contract: broadcast masks, causal, scale, all-masked rows") {
  struct MaskCase {
    Shape shape;
    bool transposed;  // the mask is a transposed view of its buffer (last two dims)
    bool expanded;    // the mask is handed over already expanded (stride 0) to the scores' shape
  };
  const Shape ss{2, 3, 4, 5};
  const MaskCase masks[] = {{{5}, false, false},          {{4, 5}, false, false},    {{4, 5}, true, false},
                            {{1, 1, 4, 5}, false, false}, {{2, 1, 1, 5}, false, false}, {{2, 1, 1, 5}, false, true},
                            {{2, 3, 4, 5}, true, false},  {{3, 1, 5}, false, false},   {{1}, false, false}};
  Count count;
  uint64_t seed = 8000;
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
    for (const MaskCase& mc : masks)
      for (bool is_bool : {true, false})
        for (bool causal : {false, true})
          for (double scale : {1.0, 0.35})
            for (bool scores_transposed : {false, true}) {
              CAPTURE(dtype_name(dt));
              CAPTURE(shape_str(mc.shape));
              CAPTURE(mc.transposed);
              CAPTURE(mc.expanded);
              CAPTURE(is_bool);
              CAPTURE(causal);
              CAPTURE(scale);
              CAPTURE(scores_transposed);
              ++seed;
              const Tensor x = make_tensor(random_values(numel_of(ss), seed, -4, 4), ss, dt,
                                           scores_transposed ? Layout::Transposed : Layout::Contiguous);
              // Mask values: bool keeps ~70% (first row of the mask all false: an all-masked row
              // where the mask has rows); float: values in [-2, 2] with some -inf.
              std::vector<double> mv = random_values(numel_of(mc.shape), seed + 1, 0, 1);
              const size_t S = size_t(mc.shape.back());
              const bool hide_first = mv.size() > S;  // the mask has rows: hide its first one
              for (size_t i = 0; i < mv.size(); ++i) {
                if (is_bool) mv[i] = (hide_first && i < S) || mv[i] >= 0.7 ? 0 : 1;
                else mv[i] = (hide_first && i < S) || mv[i] < 0.2 ? -kInf : 4 * mv[i] - 2;
              }
              const DType mdt = is_bool ? kBool : dt;
              const Tensor dense_mask = from_vector(mv, mc.shape, TensorOptions(kFloat64));
              Tensor mask = mc.transposed ? dense_mask.transpose(-1, -2).contiguous().to(mdt).transpose(-1, -2)
                                          : dense_mask.to(mdt);
              if (mc.expanded) mask = mask.expand(ss);
              REQUIRE(mask.dtype() == mdt);
              const std::vector<double> full_mask = broadcast_values(values_of(mask), mask.sizes(), ss);
              const std::vector<double> ref = masked_ref(values_of(x), ss, full_mask, is_bool, causal, scale);
              const double tol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 2e-6 : 2 * default_rtol(dt);
              check_close(ops::masked_softmax(x, mask, causal, scale), ref, tol, tol, "raw");
              check_close(frugal::masked_softmax(x, mask, causal, scale), ref, tol, tol, "autograd");
              ++count;
            }
  // Causal with L != S: top-left aligned (keys s <= l), and no mask at all.
  for (const Shape& s : {Shape{5, 3}, Shape{2, 3, 6}, Shape{1, 1}, Shape{4}})
    for (bool causal : {false, true}) {
      if (causal && s.size() < 2) continue;
      CAPTURE(shape_str(s));
      CAPTURE(causal);
      const Tensor x = random_tensor(s, kFloat32, 90);
      check_close(ops::masked_softmax(x, Tensor(), causal, 0.5), masked_ref(values_of(x), s, {}, false, causal, 0.5),
                  2e-6, 2e-6, "causal / unmasked");
      ++count;
    }
  // Size-0 dims: empty results.
  CHECK(ops::masked_softmax(zeros({2, 0, 3}), Tensor(), true).sizes() == Shape{2, 0, 3});
  CHECK(ops::masked_softmax(zeros({2, 3, 0}), zeros({3, 0}, kBool)).sizes() == Shape{2, 3, 0});
  MESSAGE(count.n, " masked_softmax configurations checked");
}

TEST_CASE("probe norm: masked_softmax gradients: scores and a broadcast float mask, all-masked rows get zero") {
  Count count;
  uint64_t seed = 9000;
  for (const Shape& ms : {Shape{4, 5}, Shape{2, 1, 1, 5}, Shape{5}, Shape{2, 3, 4, 5}})
    for (bool causal : {false, true})
      for (double scale : {1.0, 0.4}) {
        CAPTURE(shape_str(ms));
        CAPTURE(causal);
        CAPTURE(scale);
        ++seed;
        const Tensor xl = leaf({2, 3, 4, 5}, seed, -2, 2), ml = leaf(ms, seed + 1, -1, 1);
        check_gradcheck([&](const TensorList& in) { return frugal::masked_softmax(in[0], in[1], causal, scale); },
                        {xl, ml});
        ++count;
      }
  // A bool mask hiding whole rows: those rows' outputs are 0 and so are their gradients
  // (torch's _safe_softmax masks them after the softmax); other rows get y (g - sum(g y)) scale.
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    const Shape s{2, 3, 4};
    const Tensor xl = random_tensor(s, dt, 95);
    xl.requires_grad_();
    std::vector<double> mv(12, 1.0);
    for (int j = 0; j < 4; ++j) mv[size_t(4 + j)] = 0;  // row 1 of the (3, 4) mask hidden
    mv[0] = 0;
    const Tensor mask = make_tensor(mv, {3, 4}, kFloat64).to(kBool);
    const Tensor y = frugal::masked_softmax(xl, mask, false, 0.8);
    const std::vector<double> gv = random_values(24, 96);
    y.backward(make_tensor(gv, s, dt));
    const std::vector<double> yv = masked_ref(values_of(xl), s, broadcast_values(mv, {3, 4}, s), true, false, 0.8);
    std::vector<double> expect(24);
    for (int r = 0; r < 6; ++r) {
      double dot = 0;
      for (int j = 0; j < 4; ++j) dot += gv[size_t(r * 4 + j)] * yv[size_t(r * 4 + j)];
      for (int j = 0; j < 4; ++j) expect[size_t(r * 4 + j)] = 0.8 * yv[size_t(r * 4 + j)] * (gv[size_t(r * 4 + j)] - dot);
    }
    check_close(xl.grad(), expect, 1e-5, 1e-6, "grad beside all-masked rows");
    for (int j = 0; j < 4; ++j) CHECK(values_of(xl.grad())[size_t(4 + j)] == 0.0);
    ++count;
  }
  MESSAGE(count.n, " masked_softmax gradients checked");
}
