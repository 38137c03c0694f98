// CPU cross entropy forward and backward (see Note [Fused cross entropy]).
// Rows run in parallel; the row sums accumulate in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/loss.h"

namespace frugal::ops::cpu {

namespace {

// loss: (R); lse: (R) float64 (Note [Cross entropy keeps lse in float64]); x: (R, C); target: (R).
// Returns the first bad target position, or -1.
template <typename T, typename I>
int64_t cross_entropy_rows(opmath_t<T>* loss, double* lse, const T* x, const I* target, int64_t R, int64_t C,
                           int64_t ignore_index, double smoothing) {
  using Acc = opmath_t<T>;
  int64_t first_bad = -1;
#pragma omp parallel for schedule(static) if (R * C >= kParallelGrain && R > 1)
  for (int64_t r = 0; r < R; ++r) {
    const T* xr = x + r * C;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < C; ++c) {
      const double v = double(Acc(xr[c]));
      m = (v > m || v != v) ? v : m;  // NaN wins
    }
    double se = 0, sx = 0;
    if (m != -std::numeric_limits<double>::infinity()) {
      for (int64_t c = 0; c < C; ++c) {
        const double v = double(Acc(xr[c]));
        se += std::exp(v - m);
        sx += v;
      }
    }
    // log(se) = lse - m in [0, log C]: the loss's terms are formed from it and m - x, never
    // from lse itself, which would cancel (Note [Cross entropy keeps lse in float64]).
    const double lrel = std::log(se);
    const double l = m == -std::numeric_limits<double>::infinity() ? m : m + lrel;
    lse[r] = l;
    const int64_t t = int64_t(target[r]);
    if (t == ignore_index) {
      loss[r] = Acc(0);
      continue;
    }
    if (t < 0 || t >= C) {
#pragma omp critical(frugal_cross_entropy_bad_target)
      if (first_bad < 0 || r < first_bad) first_bad = r;
      loss[r] = Acc(0);
      continue;
    }
    double v = (1.0 - smoothing) * ((m - double(Acc(xr[t]))) + lrel);
    if (smoothing > 0) v += smoothing * ((m - sx / double(C)) + lrel);
    loss[r] = Acc(v);
  }
  return first_bad;
}

// g, x: (R, C); target: (R); lse: (R) float64; scale: (R) with stride scale_stride (0: one value)
template <typename T, typename I>
void cross_entropy_backward_rows(T* g, const T* x, const I* target, const double* lse, const opmath_t<T>* scale,
                                 int64_t scale_stride, int64_t R, int64_t C, int64_t ignore_index, double smoothing) {
  using Acc = opmath_t<T>;
  const Acc on = Acc(1.0 - smoothing), off = Acc(smoothing / double(C));
#pragma omp parallel for schedule(static) if (R * C >= kParallelGrain && R > 1)
  for (int64_t r = 0; r < R; ++r) {
    T* gr = g + r * C;
    const T* xr = x + r * C;
    const int64_t t = int64_t(target[r]);
    if (t == ignore_index) {
      std::fill(gr, gr + C, T(Acc(0)));
      continue;
    }
    const Acc s = scale[r * scale_stride];
    const double l = lse[r];
    for (int64_t c = 0; c < C; ++c) {
      const Acc p = std::exp(Acc(double(Acc(xr[c])) - l));  // x - lse in float64, then rounded
      gr[c] = T(s * (p - (c == t ? on : Acc(0)) - off));
    }
  }
}

}  // namespace

void cross_entropy_kernel(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                          int64_t ignore_index, double label_smoothing, IndexError& err) {
  const int64_t R = logits.size(0), C = logits.size(1);
  dispatch_floating(logits.dtype(), "cross_entropy", logits.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    dispatch_index(target.dtype(), "cross_entropy", target.device(), [&]<typename I>() {
      const I* tp = target.data_ptr<I>();
      const int64_t bad = cross_entropy_rows<T, I>(loss.data_ptr<Acc>(), lse.data_ptr<double>(), logits.data_ptr<T>(), tp,
                                                   R, C, ignore_index, label_smoothing);
      if (bad >= 0) err = IndexError{true, int64_t(tp[bad]), bad, {}};
    });
  });
}

void cross_entropy_backward_kernel(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                   const Tensor& scale, int64_t scale_stride, int64_t ignore_index,
                                   double label_smoothing) {
  const int64_t R = logits.size(0), C = logits.size(1);
  dispatch_floating(logits.dtype(), "cross_entropy_backward", logits.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    dispatch_index(target.dtype(), "cross_entropy_backward", target.device(), [&]<typename I>() {
      cross_entropy_backward_rows<T, I>(grad.data_ptr<T>(), logits.data_ptr<T>(), target.data_ptr<I>(),
                                        lse.data_ptr<double>(), scale.data_ptr<Acc>(), scale_stride, R, C, ignore_index,
                                        label_smoothing);
    });
  });
}

}  // namespace frugal::ops::cpu
