#pragma once
// The attention formula in float64 naive loops, forward and backward, written from the
// definition (not from Note [Flash attention]'s identities): the reference of the CPU and
// CUDA flash attention tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tests/test_util.h"

namespace frugal::testing {

/// Attention's sizes: q (B, H, L, E), k and v (B, H, S, E).
struct AttentionCase {
  int64_t B, H, L, S, E;
};

/// q, k, v, dout drawn on the CPU in dt, uniform in [-1, 1] (the reference reads the very
/// same values).
struct AttentionInputs {
  Tensor q, k, v, g;
};
inline AttentionInputs attention_inputs(const AttentionCase& c, DType dt, uint64_t seed) {
  return {random_tensor({c.B, c.H, c.L, c.E}, {dt}, seed, Layout::Contiguous, -1.0, 1.0),
          random_tensor({c.B, c.H, c.S, c.E}, {dt}, seed + 1, Layout::Contiguous, -1.0, 1.0),
          random_tensor({c.B, c.H, c.S, c.E}, {dt}, seed + 2, Layout::Contiguous, -1.0, 1.0),
          random_tensor({c.B, c.H, c.L, c.E}, {dt}, seed + 3, Layout::Contiguous, -1.0, 1.0)};
}

struct AttentionReference {
  std::vector<double> out, lse;    // (B, H, L, E), (B, H, L)
  std::vector<double> dq, dk, dv;  // given dout
};

/// The factor dropout() applies to each weight of a (B, H, L, S) tensor over `range`:
/// 0 or 1 / (1 - p) (empty when p == 0).
inline std::vector<double> dropout_factors(const Shape& bhls, double p, Generator::Range range) {
  if (p == 0.0) return {};
  return values_of(ops::dropout_with_range(ones(bhls, {kFloat64}), p, range));
}

/// q (B, H, L, E), k, v (B, H, S, E) any dtype/device; mask undefined, bool (true = attend) or
/// added, broadcastable to (B, H, L, S); factors from dropout_factors; dout undefined or
/// (B, H, L, E).
inline AttentionReference attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                              bool causal, double scale, const std::vector<double>& factors,
                                              const Tensor& dout = Tensor()) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), E = q.size(3);
  const std::vector<double> qv = values_of(q), kv = values_of(k), vv = values_of(v);
  std::vector<double> mv;
  if (mask.defined()) mv = values_of(mask.expand({B, H, L, S}));
  const bool bool_mask = mask.defined() && mask.dtype() == kBool;
  const double inf = std::numeric_limits<double>::infinity();
  AttentionReference r;
  r.out.assign(size_t(B * H * L * E), 0.0);
  r.lse.assign(size_t(B * H * L), -inf);
  std::vector<double> P(size_t(B * H * L * S), 0.0);  // softmax weights before dropout
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t l = 0; l < L; ++l) {
      std::vector<double> z(size_t(S), -inf);
      double mx = -inf;
      for (int64_t s = 0; s < S; ++s) {
        const size_t mi = size_t((bh * L + l) * S + s);
        if (causal && s > l) continue;
        if (bool_mask && mv[mi] == 0.0) continue;
        double dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += qv[size_t((bh * L + l) * E + e)] * kv[size_t((bh * S + s) * E + e)];
        z[size_t(s)] = dot * scale + (mask.defined() && !bool_mask ? mv[mi] : 0.0);
        mx = std::max(mx, z[size_t(s)]);
      }
      if (mx == -inf) continue;  // no key: zeros, lse -inf
      double sum = 0;
      for (int64_t s = 0; s < S; ++s) sum += std::exp(z[size_t(s)] - mx);
      r.lse[size_t(bh * L + l)] = mx + std::log(sum);
      for (int64_t s = 0; s < S; ++s) {
        const size_t pi = size_t((bh * L + l) * S + s);
        P[pi] = std::exp(z[size_t(s)] - mx) / sum;
        const double w = P[pi] * (factors.empty() ? 1.0 : factors[pi]);
        for (int64_t e = 0; e < E; ++e) r.out[size_t((bh * L + l) * E + e)] += w * vv[size_t((bh * S + s) * E + e)];
      }
    }
  }
  if (!dout.defined()) return r;
  const std::vector<double> gv = values_of(dout);
  r.dq.assign(qv.size(), 0.0), r.dk.assign(kv.size(), 0.0), r.dv.assign(vv.size(), 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t l = 0; l < L; ++l) {
      // dW = g v^T (dropped weights W = P f), dP = dW f, dZ = P (dP - sum_s P dP)
      std::vector<double> dP(size_t(S), 0.0);
      double inner = 0;
      for (int64_t s = 0; s < S; ++s) {
        const size_t pi = size_t((bh * L + l) * S + s);
        const double f = factors.empty() ? 1.0 : factors[pi];
        double dW = 0;
        for (int64_t e = 0; e < E; ++e) {
          const double g = gv[size_t((bh * L + l) * E + e)];
          dW += g * vv[size_t((bh * S + s) * E + e)];
          r.dv[size_t((bh * S + s) * E + e)] += P[pi] * f * g;
        }
        dP[size_t(s)] = dW * f;
        inner += P[pi] * dP[size_t(s)];
      }
      for (int64_t s = 0; s < S; ++s) {
        const double dz = P[size_t((bh * L + l) * S + s)] * (dP[size_t(s)] - inner) * scale;
        for (int64_t e = 0; e < E; ++e) {
          r.dq[size_t((bh * L + l) * E + e)] += dz * kv[size_t((bh * S + s) * E + e)];
          r.dk[size_t((bh * S + s) * E + e)] += dz * qv[size_t((bh * L + l) * E + e)];
        }
      }
    }
  }
  return r;
}

/// Largest |actual - expected| over the largest |expected|, or over 1e-3 when every expected
/// value is smaller (a softmax over one key has exactly zero dq and dk; a few f32 roundings
/// of error then are no failure). Infinities must match. (The CUDA attention tests' measure.)
inline double relative_error(const Tensor& actual, const std::vector<double>& expected, const std::string& what) {
  const std::vector<double> a = values_of(actual);
  REQUIRE_MESSAGE(a.size() == expected.size(), what, ": size ", a.size(), " vs ", expected.size());
  double err = 0, mag = 1e-3;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(expected[i])) {
      CHECK_MESSAGE(a[i] == expected[i], what, "[", i, "]: got ", a[i], " expected ", expected[i]);
      continue;
    }
    REQUIRE_MESSAGE(std::isfinite(a[i]), what, "[", i, "] is ", a[i], " (expected ", expected[i], ")");
    err = std::max(err, std::fabs(a[i] - expected[i]));
    mag = std::max(mag, std::fabs(expected[i]));
  }
  return err / mag;
}

// Tolerances of the 16-bit CUDA kernels: f32 accumulation; P and dS rounded to the 16-bit type
// once before their products.
inline double out_tol(DType dt) { return dt == kFloat16 ? 4e-3 : 3e-2; }
inline double grad_tol(DType dt) { return dt == kFloat16 ? 1e-2 : 6e-2; }

}  // namespace frugal::testing
