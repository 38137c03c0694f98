// CPU convolution: im2col + Eigen GEMM, per group (Note [Convolution as GEMM] in tensor/ops/conv.h).
//
// Note [CPU convolution threading]
// The forward and the input gradient are independent per sample, so OpenMP threads
// take whole samples, each with its own im2col buffer (slices of one arena tensor);
// Eigen sees it runs inside a parallel region and keeps each GEMM single-threaded.
// With one sample the loop runs serially and Eigen threads the GEMM itself instead.
// The weight gradient sums over the samples: one GEMM per sample accumulates into
// grad_w in sample order and Eigen threads each GEMM, so the result does not depend
// on the thread count. float16/bfloat16 run the float32 code on float32 copies and
// round once on the store (Note [Half types compute in f32]).
#include <Eigen/Core>

#include <algorithm>
#include <type_traits>

#include "core/instrument.h"
#include "core/threads.h"
#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/copy.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace frugal::ops::cpu {

namespace {

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MatrixMap = Eigen::Map<RowMatrix<T>>;
template <typename T>
using ConstMatrixMap = Eigen::Map<const RowMatrix<T>>;
template <typename T>
using ConstVectorMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>;

template <typename T>
constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// A 1x1 kernel with stride 1 and no padding reads the input as it lies: col = x.
bool direct(const Conv2dGeometry& g) { return g.R == 1 && g.S == 1 && g.stride == Int2(1) && g.padding == Int2(0); }

/// The output columns [lo, hi) whose tap (ow * stride + offset) lands inside [0, size).
std::pair<int64_t, int64_t> valid_range(int64_t offset, int64_t stride, int64_t size, int64_t out_size) {
  const int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t hi = size - 1 - offset < 0 ? 0 : std::min(out_size, (size - 1 - offset) / stride + 1);
  return {std::min(lo, out_size), std::max(hi, std::min(lo, out_size))};
}

// col: (Cg * R * S, OH * OW); x: (Cg, H, W), one group of one sample
template <typename T>
void im2col(T* col, const T* x, int64_t Cg, const Conv2dGeometry& g, bool parallel) {
  const int64_t RS = g.R * g.S, rows = Cg * RS, L = g.OH * g.OW;
#pragma omp parallel for schedule(static) if (parallel && rows * L >= kParallelGrain)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t c = row / RS, r = (row / g.S) % g.R, s = row % g.S;
    const int64_t dh = r * g.dilation.h - g.padding.h, dw = s * g.dilation.w - g.padding.w;
    const auto [lo, hi] = valid_range(dw, g.stride.w, g.W, g.OW);
    const T* xc = x + c * g.H * g.W;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      T* o = col + row * L + oh * g.OW;
      const int64_t ih = oh * g.stride.h + dh;
      if (ih < 0 || ih >= g.H) {
        std::fill(o, o + g.OW, T(0));
        continue;
      }
      const T* xr = xc + ih * g.W;
      std::fill(o, o + lo, T(0));
      for (int64_t ow = lo; ow < hi; ++ow) o[ow] = xr[ow * g.stride.w + dw];
      std::fill(o + hi, o + g.OW, T(0));
    }
  }
}

// x: (Cg, H, W) += col2im(col); col: (Cg * R * S, OH * OW). Threads split the channels,
// so no two threads add into the same pixel.
template <typename T>
void col2im_add(T* x, const T* col, int64_t Cg, const Conv2dGeometry& g, bool parallel) {
  const int64_t L = g.OH * g.OW;
#pragma omp parallel for schedule(static) if (parallel && Cg * g.R * g.S * L >= kParallelGrain && Cg > 1)
  for (int64_t c = 0; c < Cg; ++c) {
    T* xc = x + c * g.H * g.W;
    for (int64_t r = 0; r < g.R; ++r)
      for (int64_t s = 0; s < g.S; ++s) {
        const T* src = col + ((c * g.R + r) * g.S + s) * L;
        const int64_t dh = r * g.dilation.h - g.padding.h, dw = s * g.dilation.w - g.padding.w;
        const auto [lo, hi] = valid_range(dw, g.stride.w, g.W, g.OW);
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.stride.h + dh;
          if (ih < 0 || ih >= g.H) continue;
          T* xr = xc + ih * g.W;
          const T* cr = src + oh * g.OW;
          for (int64_t ow = lo; ow < hi; ++ow) xr[ow * g.stride.w + dw] += cr[ow];
        }
      }
  }
}

/// Runs body(n, col, may_thread) for every sample, in parallel over samples when there are
/// several (Note [CPU convolution threading]); col is the thread's im2col buffer (CRS * L
/// elements); may_thread says whether the body may start threads of its own.
template <typename T, typename Body>
void for_each_sample(const Conv2dGeometry& g, bool need_col, Body&& body) {
  const int64_t col_size = need_col ? (g.C / g.groups) * g.R * g.S * g.OH * g.OW : 0;
  const bool parallel = g.N > 1 && get_num_threads() > 1;
  const int64_t slots = parallel ? std::min<int64_t>(get_num_threads(), g.N) : 1;
  Tensor buffer = [&] {                                       // the arena's bytes
    core::CategoryScope category(core::Category::Workspace);  // for the memory profiler
    return empty({std::max<int64_t>(slots * col_size, 1)}, {dtype_of<T>(), kCPU});
  }();
  T* cols = buffer.data_ptr<T>();
  if (!parallel) {
    for (int64_t n = 0; n < g.N; ++n) body(n, cols, true);
    return;
  }
#pragma omp parallel num_threads(int(slots))
  {
#ifdef _OPENMP
    T* col = cols + int64_t(omp_get_thread_num()) * col_size;
#else
    T* col = cols;
#endif
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; ++n) body(n, col, false);
  }
}

// out: (N, K, OH, OW); x: (N, C, H, W); w: (K, Cg, R, S); bias: (K) or null
template <typename T>
void conv2d_forward(T* out, const T* x, const T* w, const T* bias, const Conv2dGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, CRS = Cg * g.R * g.S, L = g.OH * g.OW;
  const bool is_direct = direct(g);
  for_each_sample<T>(g, !is_direct, [&](int64_t n, T* col, bool may_thread) {
    for (int64_t gi = 0; gi < G; ++gi) {
      const T* xg = x + (n * g.C + gi * Cg) * g.H * g.W;
      if (!is_direct) im2col(col, xg, Cg, g, may_thread);
      MatrixMap<T> y(out + (n * g.K + gi * Kg) * L, Kg, L);
      const ConstMatrixMap<T> wg(w + gi * Kg * CRS, Kg, CRS);
      const ConstMatrixMap<T> cols(is_direct ? xg : col, CRS, L);
      if (bias) {  // y = bias, then y += w @ col: the bias rides in the GEMM's accumulation
        y.colwise() = ConstVectorMap<T>(bias + gi * Kg, Kg);
        y.noalias() += wg * cols;
      } else {
        y.noalias() = wg * cols;
      }
    }
  });
}

// gx: (N, C, H, W); gy: (N, K, OH, OW); w: (K, Cg, R, S)
template <typename T>
void conv2d_backward_input(T* gx, const T* gy, const T* w, const Conv2dGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, CRS = Cg * g.R * g.S, L = g.OH * g.OW;
  const bool is_direct = direct(g);
  for_each_sample<T>(g, !is_direct, [&](int64_t n, T* col, bool may_thread) {
    for (int64_t gi = 0; gi < G; ++gi) {
      T* gxg = gx + (n * g.C + gi * Cg) * g.H * g.W;
      const ConstMatrixMap<T> wg(w + gi * Kg * CRS, Kg, CRS);
      const ConstMatrixMap<T> gyg(gy + (n * g.K + gi * Kg) * L, Kg, L);
      if (is_direct) {  // (Cg, H*W) = w^T (Cg, Kg) @ gy (Kg, L), L == H*W
        MatrixMap<T>(gxg, CRS, L).noalias() = wg.transpose() * gyg;
        continue;
      }
      MatrixMap<T>(col, CRS, L).noalias() = wg.transpose() * gyg;
      std::fill(gxg, gxg + Cg * g.H * g.W, T(0));
      col2im_add(gxg, col, Cg, g, may_thread);
    }
  });
}

// gw: (K, Cg, R, S); gy: (N, K, OH, OW); x: (N, C, H, W)
template <typename T>
void conv2d_backward_weight(T* gw, const T* gy, const T* x, const Conv2dGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, CRS = Cg * g.R * g.S, L = g.OH * g.OW;
  const bool is_direct = direct(g);
  Tensor buffer = [&] {
    core::CategoryScope category(core::Category::Workspace);  // for the memory profiler
    return empty({is_direct ? 1 : CRS * L}, {dtype_of<T>(), kCPU});
  }();
  T* col = buffer.data_ptr<T>();
  MatrixMap<T>(gw, g.K, CRS).setZero();
  for (int64_t n = 0; n < g.N; ++n)  // in sample order: see Note [CPU convolution threading]
    for (int64_t gi = 0; gi < G; ++gi) {
      const T* xg = x + (n * g.C + gi * Cg) * g.H * g.W;
      if (!is_direct) im2col(col, xg, Cg, g, /*parallel=*/true);
      const ConstMatrixMap<T> cols(is_direct ? xg : col, CRS, L);
      const ConstMatrixMap<T> gyg(gy + (n * g.K + gi * Kg) * L, Kg, L);
      MatrixMap<T>(gw + gi * Kg * CRS, Kg, CRS).noalias() += gyg * cols.transpose();
    }
}

Tensor to_float32(const Tensor& t) { return t.defined() ? t.to(kFloat32) : t; }

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace

void conv2d_kernel(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g) {
  dispatch_floating(out.dtype(), "conv2d", out.device(), [&]<typename T>() {
    if constexpr (is_half_v<T>) {
      Tensor acc = empty(out.sizes(), {kFloat32, kCPU});
      conv2d_kernel(acc, to_float32(x), to_float32(w), to_float32(bias), g);
      copy_into(out, acc);  // the one rounding
    } else {
      conv2d_forward<T>(out.data_ptr<T>(), x.data_ptr<T>(), w.data_ptr<T>(), ptr_or_null<T>(bias), g);
    }
  });
}

void conv2d_backward_input_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& w,
                                  const Conv2dGeometry& g) {
  dispatch_floating(grad_x.dtype(), "conv2d_backward_input", grad_x.device(), [&]<typename T>() {
    if constexpr (is_half_v<T>) {
      Tensor acc = empty(grad_x.sizes(), {kFloat32, kCPU});
      conv2d_backward_input_kernel(acc, to_float32(grad_out), to_float32(w), g);
      copy_into(grad_x, acc);
    } else {
      conv2d_backward_input<T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), w.data_ptr<T>(), g);
    }
  });
}

void conv2d_backward_weight_kernel(const Tensor& grad_w, const Tensor& grad_out, const Tensor& x,
                                   const Conv2dGeometry& g) {
  dispatch_floating(grad_w.dtype(), "conv2d_backward_weight", grad_w.device(), [&]<typename T>() {
    if constexpr (is_half_v<T>) {
      Tensor acc = empty(grad_w.sizes(), {kFloat32, kCPU});
      conv2d_backward_weight_kernel(acc, to_float32(grad_out), to_float32(x), g);
      copy_into(grad_w, acc);
    } else {
      conv2d_backward_weight<T>(grad_w.data_ptr<T>(), grad_out.data_ptr<T>(), x.data_ptr<T>(), g);
    }
  });
}

}  // namespace frugal::ops::cpu
