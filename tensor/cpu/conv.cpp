// CPU convolution: im2col + Eigen GEMM, per group (Note [Convolution as GEMM] in tensor/ops/conv.h).
//
// Note [CPU convolution threading]
// The forward and the input gradient are independent per sample, so OpenMP threads
// take whole samples, handed out one at a time (a thread the OS preempts leaves the rest
// to the others: Note [Chunked parallel loops] in loops.h), each thread with its own
// im2col buffer (slices of one arena tensor); gemm sees it runs inside a parallel region
// and keeps each GEMM single-threaded. With one sample, or too little work for a team,
// the loop runs serially and gemm threads each GEMM over blocks of its output instead
// (Eigen itself never threads: Note [Eigen runs single-threaded] in tensor/cpu/gemm.h).
// The weight gradient sums over the samples. Per-sample GEMMs (K x L times L x CRS) are
// small and each would be one parallel region, so the samples go in fixed chunks of
// kWeightGradColumns / L (at least one): a chunk's im2col columns side by side form one
// (CRS, S L) matrix and its output gradients one (K, S L), so one GEMM with a long inner
// dimension gives the chunk's partial grad_w. Chunks run in parallel into their own
// partials, which are then added in chunk order: the chunks depend only on the shapes, so
// the result does not depend on the thread count or the schedule. float16/bfloat16 run
// the float32 code on float32 copies and round once on the store (Note [Half types
// compute in f32]).
#include <algorithm>
#include <type_traits>

#include "core/instrument.h"
#include "core/threads.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/copy.h"

namespace frugal::ops::cpu {

namespace {

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

// col: (Cg * R * S, OH * OW) with rows `ld` apart; x: (Cg, H, W), one group of one sample.
// Rows split across threads when `parallel` and the copy is large enough.
template <typename T>
void im2col(T* col, int64_t ld, const T* x, int64_t Cg, const Conv2dGeometry& g, bool parallel) {
  const int64_t RS = g.R * g.S, rows = Cg * RS, L = g.OH * g.OW;
  auto copy_rows = [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t c = row / RS, r = (row / g.S) % g.R, s = row % g.S;
      const int64_t dh = r * g.dilation.h - g.padding.h, dw = s * g.dilation.w - g.padding.w;
      const auto [lo, hi] = valid_range(dw, g.stride.w, g.W, g.OW);
      const T* xc = x + c * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        T* o = col + row * ld + oh * g.OW;
        const int64_t ih = oh * g.stride.h + dh;
        if (ih < 0 || ih >= g.H) {
          std::fill(o, o + g.OW, T(0));
          continue;
        }
        const T* xr = xc + ih * g.W;
        std::fill(o, o + lo, T(0));
        if (g.stride.w == 1) std::copy(xr + lo + dw, xr + hi + dw, o + lo);  // a unit-stride run: memcpy
        else
          for (int64_t ow = lo; ow < hi; ++ow) o[ow] = xr[ow * g.stride.w + dw];
        std::fill(o + hi, o + g.OW, T(0));
      }
    }
  };
  if (parallel) parallel_chunks(rows, L, copy_rows);
  else copy_rows(0, rows);
}

// x: (Cg, H, W) += col2im(col); col: (Cg * R * S, OH * OW). Threads split the channels,
// so no two threads add into the same pixel.
template <typename T>
void col2im_add(T* x, const T* col, int64_t Cg, const Conv2dGeometry& g, bool parallel) {
  const int64_t L = g.OH * g.OW;
  auto add_channels = [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      T* xc = x + c * g.H * g.W;
      for (int64_t r = 0; r < g.R; ++r)
        for (int64_t s = 0; s < g.S; ++s) {
          const T* src = col + ((c * g.R + r) * g.S + s) * L;
          const int64_t dh = r * g.dilation.h - g.padding.h, dw = s * g.dilation.w - g.padding.w;
          const auto [lo, hi] = valid_range(dw, g.stride.w, g.W, g.OW);
          for (int64_t oh = 0; oh < g.OH; ++oh) {
            const int64_t ih = oh * g.stride.h + dh;
            if (ih < 0 || ih >= g.H) continue;
            T* __restrict xr = xc + ih * g.W;
            const T* __restrict cr = src + oh * g.OW;
            if (g.stride.w == 1)  // unit stride: a loop the compiler vectorizes
              for (int64_t ow = lo; ow < hi; ++ow) xr[ow + dw] += cr[ow];
            else
              for (int64_t ow = lo; ow < hi; ++ow) xr[ow * g.stride.w + dw] += cr[ow];
          }
        }
    }
  };
  if (parallel) parallel_chunks(Cg, g.R * g.S * L, add_channels);
  else add_channels(0, Cg);
}

/// Multiply-adds of one sample's GEMMs (all groups): the work a thread team must be worth.
int64_t sample_macs(const Conv2dGeometry& g) { return g.K * (g.C / g.groups) * g.R * g.S * g.OH * g.OW; }

/// Runs body(n, col, may_thread) for every sample, in parallel over samples when there are
/// several and the work pays for a team (Note [CPU convolution threading]); col is the
/// thread's im2col buffer (CRS * L elements); may_thread says whether the body may start
/// threads of its own.
template <typename T, typename Body>
void for_each_sample(const Conv2dGeometry& g, bool need_col, Body&& body) {
  const int64_t col_size = need_col ? (g.C / g.groups) * g.R * g.S * g.OH * g.OW : 0;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  const bool parallel = g.N > 1 && threads > 1 && g.N * sample_macs(g) >= 4 * kParallelGrain;
  const int64_t slots = parallel ? std::min<int64_t>(threads, g.N) : 1;
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
    T* col = cols + thread_index() * col_size;
#pragma omp for schedule(dynamic, 1)
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
      if (!is_direct) im2col(col, L, xg, Cg, g, may_thread);
      T* y = out + (n * g.K + gi * Kg) * L;  // (Kg, L)
      // y = bias, then y += w @ col: the bias rides in the GEMM's accumulation
      if (bias)
        for (int64_t k = 0; k < Kg; ++k) std::fill(y + k * L, y + (k + 1) * L, bias[gi * Kg + k]);
      gemm(row_major_matrix(w + gi * Kg * CRS, Kg, CRS), row_major_matrix(is_direct ? xg : col, CRS, L), y, L,
           bias != nullptr);
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
      const GemmOperand<T> wg_t = row_major_matrix(w + gi * Kg * CRS, Kg, CRS).transposed();  // (CRS, Kg)
      const GemmOperand<T> gyg = row_major_matrix(gy + (n * g.K + gi * Kg) * L, Kg, L);
      if (is_direct) {  // (Cg, H*W) = w^T (Cg, Kg) @ gy (Kg, L), L == H*W
        gemm(wg_t, gyg, gxg, L, false);
        continue;
      }
      gemm(wg_t, gyg, col, L, false);  // col: (CRS, L)
      std::fill(gxg, gxg + Cg * g.H * g.W, T(0));
      col2im_add(gxg, col, Cg, g, may_thread);
    }
  });
}

/// The im2col columns of a weight-gradient chunk side by side: kWeightGradColumns / L
/// samples per chunk (Note [CPU convolution threading]).
constexpr int64_t kWeightGradColumns = 2048;

// gw: (K, Cg, R, S); gy: (N, K, OH, OW); x: (N, C, H, W)
template <typename T>
void conv2d_backward_weight(T* gw, const T* gy, const T* x, const Conv2dGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, CRS = Cg * g.R * g.S, L = g.OH * g.OW;
  const int64_t S = std::clamp<int64_t>(kWeightGradColumns / std::max<int64_t>(L, 1), 1, g.N);  // samples per chunk
  const int64_t chunks = (g.N + S - 1) / S, SL = S * L;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  const bool parallel = chunks > 1 && threads > 1 && g.N * sample_macs(g) >= 4 * kParallelGrain;
  const int64_t slots = parallel ? std::min(threads, chunks) : 1;
  // Per slot: the chunk's columns (CRS, S L) and output gradients (Kg, S L); per chunk
  // after the first: its partial grad_w (K, CRS), the first chunk's going to gw itself.
  const int64_t slot_size = (CRS + Kg) * SL, partial_size = g.K * CRS;
  Tensor buffer = [&] {
    core::CategoryScope category(core::Category::Workspace);  // for the memory profiler
    return empty({slots * slot_size + (chunks - 1) * partial_size}, {dtype_of<T>(), kCPU});
  }();
  T* partials = buffer.data_ptr<T>() + slots * slot_size;
  auto chunk = [&](int64_t c, T* slot) {
    const int64_t n0 = c * S, ns = std::min(S, g.N - n0), cols = ns * L;
    T* col = slot;
    T* gyc = slot + CRS * SL;
    T* out = c == 0 ? gw : partials + (c - 1) * partial_size;
    for (int64_t gi = 0; gi < G; ++gi) {
      // col[:, i L:(i+1) L] = im2col(sample n0 + i), gyc[:, i L:(i+1) L] = gy(sample n0 + i)
      for (int64_t i = 0; i < ns; ++i) {
        const int64_t n = n0 + i;
        im2col(col + i * L, cols, x + (n * g.C + gi * Cg) * g.H * g.W, Cg, g, /*parallel=*/false);
        const T* gyn = gy + (n * g.K + gi * Kg) * L;  // (Kg, L)
        for (int64_t k = 0; k < Kg; ++k) std::copy(gyn + k * L, gyn + (k + 1) * L, gyc + k * cols + i * L);
      }
      const GemmOperand<T> colm{col, CRS, cols, cols, true}, gym{gyc, Kg, cols, cols, true};
      gemm(gym, colm.transposed(), out + gi * Kg * CRS, CRS, false);  // (Kg, CRS)
    }
  };
  T* slots_base = buffer.data_ptr<T>();
  if (parallel) {
#pragma omp parallel num_threads(int(slots))
    {
      T* slot = slots_base + thread_index() * slot_size;
#pragma omp for schedule(dynamic, 1)
      for (int64_t c = 0; c < chunks; ++c) chunk(c, slot);
    }
  } else {
    for (int64_t c = 0; c < chunks; ++c) chunk(c, slots_base);
  }
  for (int64_t c = 1; c < chunks; ++c) {  // in chunk order: see Note [CPU convolution threading]
    const T* partial = partials + (c - 1) * partial_size;
    for (int64_t i = 0; i < partial_size; ++i) gw[i] += partial[i];
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
