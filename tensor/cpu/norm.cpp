// CPU layer norm forward and backward (see Note [Layer norm statistics]); with mean null,
// RMS norm (Note [RMS norm is layer norm around zero]).
//
// Rows run in parallel. Row sums accumulate in double (cheap here, and it keeps the
// CPU a tight reference for the CUDA kernels); elementwise math is in opmath_t<T>
// from the stored (rounded) statistics, so forward and backward see the same xhat.
// The parameter gradients are summed over rows in a fixed number of row blocks, each
// into its own partial sums, then added block by block in order: deterministic for
// any number of threads, and dx is written in the same pass over the data. float32 rows run on the
// vectorized kernels of the CPU's level (Note [Vectorized layer norm] in tensor/cpu/norm_kernel.cpp).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cpu/gemm.h"  // gemm_isa: the level of the layer norm kernels too
#include "tensor/cpu/loops.h"
#include "tensor/cpu/norm_kernel.h"
#include "tensor/dispatch.h"
#include "tensor/ops/norm.h"

namespace frugal::ops::cpu {

namespace {

/// The level's float32 rows (norm_kernel.h), or null for the generic loops.
struct NormRowsF32 {
  void (*forward)(float*, float*, float*, const float*, const float*, const float*, int64_t, double) = nullptr;
  void (*backward)(float*, double*, double*, const float*, const float*, float, float, const float*, int64_t,
                   bool) = nullptr;
};

NormRowsF32 norm_rows_f32() {
  switch (gemm_isa()) {
    case GemmIsa::X86_64_V4: return {v4::layer_norm_row_f32, v4::layer_norm_backward_row_f32};
    case GemmIsa::X86_64_V3: return {v3::layer_norm_row_f32, v3::layer_norm_backward_row_f32};
    case GemmIsa::X86_64_V2: return {v2::layer_norm_row_f32, v2::layer_norm_backward_row_f32};
  }
  return {};
}

// x, y: (M, N); w, b: (N) or null; mean (null: RMS norm), rstd: (M)
template <typename T>
void layer_norm_rows(T* y, opmath_t<T>* mean, opmath_t<T>* rstd, const T* x, const T* w, const T* b, int64_t M,
                     int64_t N, double eps, NormRowsF32 simd) {
  using Acc = opmath_t<T>;
#pragma omp parallel for schedule(static) if (M * N >= kParallelGrain && M > 1)
  for (int64_t r = 0; r < M; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      if (simd.forward) {
        simd.forward(y + r * N, mean ? mean + r : nullptr, rstd + r, x + r * N, w, b, N, eps);
        continue;
      }
    }
    const T* xr = x + r * N;
    double mu = 0;  // RMS norm: deviations from zero
    if (mean) {
      for (int64_t j = 0; j < N; ++j) mu += double(Acc(xr[j]));
      mu /= double(N);
    }
    double ss = 0;
    for (int64_t j = 0; j < N; ++j) {
      const double d = double(Acc(xr[j])) - mu;
      ss += d * d;
    }
    const Acc m = Acc(mu), rs = Acc(1.0 / std::sqrt(ss / double(N) + eps));
    if (mean) mean[r] = m;
    rstd[r] = rs;
    T* yr = y + r * N;
    for (int64_t j = 0; j < N; ++j) {
      Acc v = (Acc(xr[j]) - m) * rs;
      if (w) v *= Acc(w[j]);
      if (b) v += Acc(b[j]);
      yr[j] = T(v);
    }
  }
}

// y, x: (M, N); mean (null: RMS norm), rstd: (M); w, b: (N) or null. layer_norm_rows' write,
// from given statistics.
template <typename T>
void layer_norm_apply_rows(T* y, const T* x, const opmath_t<T>* mean, const opmath_t<T>* rstd, const T* w, const T* b,
                           int64_t M, int64_t N) {
  using Acc = opmath_t<T>;
#pragma omp parallel for schedule(static) if (M * N >= kParallelGrain && M > 1)
  for (int64_t r = 0; r < M; ++r) {
    const T* xr = x + r * N;
    T* yr = y + r * N;
    const Acc m = mean ? mean[r] : Acc(0), rs = rstd[r];
    for (int64_t j = 0; j < N; ++j) {
      Acc v = (Acc(xr[j]) - m) * rs;
      if (w) v *= Acc(w[j]);
      if (b) v += Acc(b[j]);
      yr[j] = T(v);
    }
  }
}

// gx (or null), g, x: (M, N); mean (null: RMS norm), rstd: (M); w: (N) or null; gw, gb: (N) or null
template <typename T>
void layer_norm_backward_rows(T* gx, T* gw, T* gb, const T* g, const T* x, const opmath_t<T>* mean,
                              const opmath_t<T>* rstd, const T* w, int64_t M, int64_t N, NormRowsF32 simd) {
  using Acc = opmath_t<T>;
  const bool params = gw || gb;
  // Row blocks for the parameter sums: enough for the threads, partials bounded to ~4M doubles.
  const int64_t blocks =
      params ? std::clamp<int64_t>(std::min<int64_t>((M + 255) / 256, (int64_t(1) << 22) / (2 * N)), 1, 64)
             : std::min<int64_t>(M, 64);
  const int64_t rows_per_block = (M + blocks - 1) / blocks;
  std::vector<double> partial(params ? size_t(blocks * 2 * N) : 0, 0.0);  // per block: dweight (N), dbias (N)
#pragma omp parallel for schedule(static) if (M * N >= kParallelGrain && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double* pw = params ? partial.data() + blk * 2 * N : nullptr;
    double* pb = params ? pw + N : nullptr;
    const int64_t r1 = std::min(M, (blk + 1) * rows_per_block);
    for (int64_t r = blk * rows_per_block; r < r1; ++r) {
      const T* xr = x + r * N;
      const T* gr = g + r * N;
      const Acc m = mean ? mean[r] : Acc(0), rs = rstd[r];
      if constexpr (std::is_same_v<T, float>) {
        if (simd.backward) {
          simd.backward(gx ? gx + r * N : nullptr, pw, pb, gr, xr, m, rs, w, N, mean != nullptr);
          continue;
        }
      }
      if (params) {
        for (int64_t j = 0; j < N; ++j) {
          const double gv = double(Acc(gr[j]));
          pw[j] += gv * double((Acc(xr[j]) - m) * rs);
          pb[j] += gv;
        }
      }
      if (!gx) continue;
      double s1 = 0, s2 = 0;  // sum(dxhat), sum(dxhat * xhat)
      for (int64_t j = 0; j < N; ++j) {
        const double dxhat = double(Acc(gr[j])) * (w ? double(Acc(w[j])) : 1.0);
        s1 += dxhat;
        s2 += dxhat * double((Acc(xr[j]) - m) * rs);
      }
      // RMS norm: no mean was subtracted, so no mean(dxhat) term.
      const Acc c1 = mean ? Acc(s1 / double(N)) : Acc(0), c2 = Acc(s2 / double(N));
      T* gxr = gx + r * N;
      for (int64_t j = 0; j < N; ++j) {
        const Acc dxhat = w ? Acc(gr[j]) * Acc(w[j]) : Acc(gr[j]);
        const Acc xhat = (Acc(xr[j]) - m) * rs;
        gxr[j] = T(rs * (dxhat - c1 - xhat * c2));
      }
    }
  }
  if (!params) return;
  for (int64_t j = 0; j < N; ++j) {
    double sw = 0, sb = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sw += partial[size_t(blk * 2 * N + j)];
      sb += partial[size_t(blk * 2 * N + N + j)];
    }
    if (gw) gw[j] = T(Acc(sw));
    if (gb) gb[j] = T(Acc(sb));
  }
}

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

void layer_norm_rows_any(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                         const Tensor& weight, const Tensor& bias, int64_t M, int64_t N, double eps, NormRowsF32 simd) {
  dispatch_floating(x.dtype(), "layer_norm", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    layer_norm_rows<T>(out.data_ptr<T>(), ptr_or_null<Acc>(mean), rstd.data_ptr<Acc>(), x.data_ptr<T>(),
                       ptr_or_null<T>(weight), ptr_or_null<T>(bias), M, N, eps, simd);
  });
}

void layer_norm_backward_rows_any(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                  const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& weight, int64_t M, int64_t N, NormRowsF32 simd) {
  dispatch_floating(x.dtype(), "layer_norm_backward", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    layer_norm_backward_rows<T>(ptr_or_null<T>(grad_x), ptr_or_null<T>(grad_weight), ptr_or_null<T>(grad_bias),
                                grad_out.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<Acc>(mean), rstd.data_ptr<Acc>(),
                                ptr_or_null<T>(weight), M, N, simd);
  });
}

}  // namespace

void layer_norm_kernel(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, int64_t M, int64_t N, double eps) {
  layer_norm_rows_any(out, mean, rstd, x, weight, bias, M, N, eps, norm_rows_f32());
}

void layer_norm_kernel_generic(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                               const Tensor& weight, const Tensor& bias, int64_t M, int64_t N, double eps) {
  layer_norm_rows_any(out, mean, rstd, x, weight, bias, M, N, eps, {});
}

void layer_norm_apply_kernel(const Tensor& out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                             const Tensor& weight, const Tensor& bias, int64_t M, int64_t N) {
  dispatch_floating(x.dtype(), "layer_norm_apply", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    layer_norm_apply_rows<T>(out.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<Acc>(mean), rstd.data_ptr<Acc>(),
                             ptr_or_null<T>(weight), ptr_or_null<T>(bias), M, N);
  });
}

void layer_norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                const Tensor& weight, int64_t M, int64_t N) {
  layer_norm_backward_rows_any(grad_x, grad_weight, grad_bias, grad_out, x, mean, rstd, weight, M, N, norm_rows_f32());
}

void layer_norm_backward_kernel_generic(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                        const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& weight, int64_t M, int64_t N) {
  layer_norm_backward_rows_any(grad_x, grad_weight, grad_bias, grad_out, x, mean, rstd, weight, M, N, {});
}

}  // namespace frugal::ops::cpu
