// CPU batch norm (Note [Batch norm statistics] in tensor/ops/batch_norm.h).
//
// Channels run in parallel; each channel's sums run over its N rows of HW contiguous
// values in double (two passes for the variance: the mean, then the squared
// deviations), so the CPU is a tight reference for the CUDA kernels. The elementwise
// passes run in parallel over the (n, c) rows.
//
// Note [Batch norm lane sums]
// One double accumulator per channel makes each sum a chain of dependent additions, one
// add's latency (4 cycles) per value: ResNet-50's batch norms at batch 8 spent ~120 ms of
// a 1.2 s CPU step in the forward's two passes and ~90 ms in the backward's. So a channel's
// values are summed into kLanes partial sums, value j of a row into lane j % kLanes (a
// row's tail too), which the compiler keeps in vector registers; the lanes are then added
// in a fixed pairwise order. Still double, still two passes: the result differs from the
// one-accumulator sum only in the rounding of a float64 sum of float32 values (far below
// float32's), and it depends on the shapes alone, never on the thread count.
#include <array>
#include <cmath>
#include <utility>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/batch_norm.h"

namespace frugal::ops::cpu {

namespace {

/// Partial sums per channel (Note [Batch norm lane sums]).
constexpr int64_t kLanes = 16;
using Lanes = std::array<double, kLanes>;

/// lanes[j % kLanes] += f(j) for j in [0, n).
template <typename F>
inline void add_lanes(Lanes& lanes, int64_t n, F&& f) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += f(j + k);
  for (int64_t k = 0; j + k < n; ++k) lanes[k] += f(j + k);
}

/// The same for two sums at once: (a, b)[j % kLanes] += f(j), f returning a pair.
template <typename F>
inline void add_lanes2(Lanes& a, Lanes& b, int64_t n, F&& f) {
  auto add = [&](int64_t k, int64_t j) {
    const auto [fa, fb] = f(j);
    a[k] += fa;
    b[k] += fb;
  };
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) add(k, j + k);
  for (int64_t k = 0; j + k < n; ++k) add(k, j + k);
}

/// The lanes' total, added pairwise in a fixed order.
inline double lane_total(Lanes lanes) {
  for (int64_t width = kLanes / 2; width >= 1; width /= 2)
    for (int64_t k = 0; k < width; ++k) lanes[k] += lanes[k + width];
  return lanes[0];
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* mut_ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// x: (N, C, HW); mean, invstd: (C); rm, rv: (C) or null
template <typename T>
void stats(opmath_t<T>* mean, opmath_t<T>* invstd, opmath_t<T>* rm, opmath_t<T>* rv, const T* x, int64_t N, int64_t C,
           int64_t HW, double momentum, double eps) {
  using Acc = opmath_t<T>;
  const double M = double(N * HW);
#pragma omp parallel for schedule(static) if (N * C * HW >= kParallelGrain && C > 1)
  for (int64_t c = 0; c < C; ++c) {
    Lanes s{};
    for (int64_t n = 0; n < N; ++n) {
      const T* row = x + (n * C + c) * HW;
      add_lanes(s, HW, [&](int64_t j) { return double(Acc(row[j])); });
    }
    const double mu = lane_total(s) / M;
    Lanes sq{};
    for (int64_t n = 0; n < N; ++n) {
      const T* row = x + (n * C + c) * HW;
      add_lanes(sq, HW, [&](int64_t j) {
        const double dv = double(Acc(row[j])) - mu;
        return dv * dv;
      });
    }
    const double ss = lane_total(sq);
    mean[c] = Acc(mu);
    invstd[c] = Acc(1.0 / std::sqrt(ss / M + eps));
    if (rm) {
      rm[c] = Acc((1.0 - momentum) * double(rm[c]) + momentum * mu);
      rv[c] = Acc((1.0 - momentum) * double(rv[c]) + momentum * ss / (M - 1.0));
    }
  }
}

// out, x, r (or null): (N, C, HW); mean, invstd: (C); w, b: (C) or null
template <typename T>
void apply(T* out, const T* x, const T* r, bool relu, const opmath_t<T>* mean, const opmath_t<T>* invstd,
           const opmath_t<T>* w, const opmath_t<T>* b, int64_t N, int64_t C, int64_t HW) {
  using Acc = opmath_t<T>;
#pragma omp parallel for schedule(static) if (N * C * HW >= kParallelGrain && N * C > 1)
  for (int64_t row = 0; row < N * C; ++row) {
    const int64_t c = row % C;
    const Acc m = mean[c], is = invstd[c], wc = w ? w[c] : Acc(1), bc = b ? b[c] : Acc(0);
    const T* xr = x + row * HW;
    const T* rr = r ? r + row * HW : nullptr;
    T* yr = out + row * HW;
    for (int64_t j = 0; j < HW; ++j) {
      Acc v = (Acc(xr[j]) - m) * is * wc + bc;
      if (rr) v += Acc(rr[j]);
      yr[j] = T(relu && v < Acc(0) ? Acc(0) : v);  // rounded once (Note [Batch norm add ReLU]); NaN passes
    }
  }
}

// gx (or null), gy, x: (N, C, HW); gw, gb (or null), mean, invstd, w (or null): (C)
template <typename T>
void backward(T* gx, opmath_t<T>* gw, opmath_t<T>* gb, const T* gy, const T* x, const opmath_t<T>* mean,
              const opmath_t<T>* invstd, const opmath_t<T>* w, bool training, int64_t N, int64_t C, int64_t HW) {
  using Acc = opmath_t<T>;
  const double M = double(N * HW);
  const bool sums = gw || gb || (gx && training);  // eval's grad_x needs no reduction
#pragma omp parallel for schedule(static) if (N * C * HW >= kParallelGrain && C > 1)
  for (int64_t c = 0; c < C; ++c) {
    const Acc m = mean[c], is = invstd[c], wc = w ? w[c] : Acc(1);
    double sum_g = 0, sum_g_xhat = 0;
    if (sums) {
      Lanes lg{}, lgx{};
      for (int64_t n = 0; n < N; ++n) {
        const T* xr = x + (n * C + c) * HW;
        const T* gr = gy + (n * C + c) * HW;
        add_lanes2(lg, lgx, HW, [&](int64_t j) {
          const double g = double(Acc(gr[j]));
          return std::pair{g, g * double((Acc(xr[j]) - m) * is)};
        });
      }
      sum_g = lane_total(lg), sum_g_xhat = lane_total(lgx);
    }
    if (gw) gw[c] = Acc(sum_g_xhat);
    if (gb) gb[c] = Acc(sum_g);
    if (!gx) continue;
    const Acc scale = wc * is, mean_g = Acc(sum_g / M), mean_g_xhat = Acc(sum_g_xhat / M);
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + (n * C + c) * HW;
      const T* gr = gy + (n * C + c) * HW;
      T* out = gx + (n * C + c) * HW;
      if (training) {
        for (int64_t j = 0; j < HW; ++j) {
          const Acc xhat = (Acc(xr[j]) - m) * is;
          out[j] = T(scale * (Acc(gr[j]) - mean_g - xhat * mean_g_xhat));
        }
      } else {
        for (int64_t j = 0; j < HW; ++j) out[j] = T(scale * Acc(gr[j]));
      }
    }
  }
}

}  // namespace

void batch_norm_stats_kernel(const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& x, int64_t N, int64_t C, int64_t HW,
                             double momentum, double eps) {
  dispatch_floating(x.dtype(), "batch_norm", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    stats<T>(mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(), mut_ptr_or_null<Acc>(running_mean),
             mut_ptr_or_null<Acc>(running_var), x.data_ptr<T>(), N, C, HW, momentum, eps);
  });
}

void batch_norm_apply_kernel(const Tensor& out, const Tensor& x, const Tensor& residual, bool relu, const Tensor& mean,
                             const Tensor& invstd, const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                             int64_t HW) {
  dispatch_floating(x.dtype(), "batch_norm", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    apply<T>(out.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<T>(residual), relu, mean.data_ptr<Acc>(),
             invstd.data_ptr<Acc>(), ptr_or_null<Acc>(weight), ptr_or_null<Acc>(bias), N, C, HW);
  });
}

void batch_norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                const Tensor& weight, bool training, int64_t N, int64_t C, int64_t HW) {
  dispatch_floating(x.dtype(), "batch_norm_backward", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    backward<T>(mut_ptr_or_null<T>(grad_x), mut_ptr_or_null<Acc>(grad_weight), mut_ptr_or_null<Acc>(grad_bias),
                grad_out.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(),
                ptr_or_null<Acc>(weight), training, N, C, HW);
  });
}

}  // namespace frugal::ops::cpu
