// The float64 convolution reference shared by the conv tests and probes: a direct
// cross-correlation loop, written independently of every kernel it checks; and the
// comparison scaled by each sum's terms.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/ops/conv.h"
#include "tensor/shape.h"

namespace frugal::testing {

/// torch.nn.Conv2d's documented output size: floor((L + 2 p - d (k - 1) - 1) / s) + 1 (floor,
/// not C++'s truncation, so a kernel larger than the padded input gives a size <= 0).
inline int64_t conv_out(int64_t L, int64_t k, int64_t s, int64_t p, int64_t d) {
  return int64_t(std::floor(double(L + 2 * p - d * (k - 1) - 1) / double(s))) + 1;
}

struct ConvRef {
  Shape ys;
  /// y, and sum |x w| per output (the scale of its rounding error); with gy, the gradients.
  std::vector<double> y, scale, gx, gw, gb;
};

/// Direct cross-correlation y[n, k, oh, ow] = b[k] + sum_{c, i, j} x[n, g Cg + c, ...] w[k, c, i, j]
/// (g = k / (K / G)); with gy, the gradients by the chain rule applied to every product.
inline ConvRef conv_ref(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w, const Shape& ws,
                        const std::vector<double>* b, const Conv2dOptions& o, const std::vector<double>* gy = nullptr) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], K = ws[0], Cg = ws[1], R = ws[2], S = ws[3];
  const int64_t Kg = K / o.groups;
  const int64_t OH = conv_out(H, R, o.stride.h, o.padding.h, o.dilation.h);
  const int64_t OW = conv_out(W, S, o.stride.w, o.padding.w, o.dilation.w);
  ConvRef r;
  r.ys = {N, K, OH, OW};
  r.y.assign(size_t(N * K * OH * OW), 0.0);
  r.scale.assign(r.y.size(), 0.0);
  r.gx.assign(x.size(), 0.0);
  r.gw.assign(w.size(), 0.0);
  r.gb.assign(size_t(K), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const size_t yi = size_t(((n * K + k) * OH + oh) * OW + ow);
          double s = b ? (*b)[size_t(k)] : 0.0, a = std::fabs(s);
          const double g = gy ? (*gy)[yi] : 0.0;
          r.gb[size_t(k)] += g;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < R; ++i)
              for (int64_t j = 0; j < S; ++j) {
                const int64_t ih = oh * o.stride.h - o.padding.h + i * o.dilation.h;
                const int64_t iw = ow * o.stride.w - o.padding.w + j * o.dilation.w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const size_t xi = size_t(((n * C + (k / Kg) * Cg + c) * H + ih) * W + iw);
                const size_t wi = size_t(((k * Cg + c) * R + i) * S + j);
                s += x[xi] * w[wi];
                a += std::fabs(x[xi] * w[wi]);
                r.gx[xi] += g * w[wi];
                r.gw[wi] += g * x[xi];
              }
          r.y[yi] = s;
          r.scale[yi] = a;
        }
  return r;
}

/// |actual - expected| <= rtol (scale + |expected|) elementwise: rounding errors of a sum grow
/// with the sum of the magnitudes of its terms, not with the (possibly cancelled) result.
inline void check_scaled(const std::vector<double>& actual, const std::vector<double>& expected,
                         const std::vector<double>& scale, double rtol, const std::string& what) {
  REQUIRE(actual.size() == expected.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < actual.size(); ++i)
    if (!(std::fabs(actual[i] - expected[i]) <= rtol * (scale[i] + std::fabs(expected[i])) + 1e-300))
      if (bad++ == 0) first = int64_t(i);
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", actual.size(), " differ; first at ", first, ": got ",
                first >= 0 ? actual[size_t(first)] : 0.0, " expected ", first >= 0 ? expected[size_t(first)] : 0.0);
}

}  // namespace frugal::testing
