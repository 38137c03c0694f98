// CPU convolution: im2col + Eigen GEMM, per group (Note [Convolution as GEMM] in tensor/ops/conv.h).
//
// Note [CPU convolution threading]
// Every product runs on chunks of samples: kChunkColumns / L of them (at least one), whose
// im2col columns side by side form one (CRS, S L) matrix, so a deep layer's small maps
// (ResNet-50's 14x14 and 7x7) make GEMMs of hundreds of columns instead of 49 each, and the
// weight is packed once per chunk, not once per sample. The forward multiplies a chunk into a
// (Kg, S L) product that is then scattered to the samples' outputs; the input gradient
// gathers the chunk's output gradients into (Kg, S L) and col2im's each sample's columns. A
// chunk of one sample (maps of more than kChunkColumns / 2 pixels) reads its operands where
// they lie: the output is written in place, and a direct (1x1, stride 1, unpadded)
// convolution needs no columns at all, in any of the three products.
// Chunks are independent in the forward and the input gradient, so OpenMP threads take whole
// chunks, handed out one at a time (a thread the OS preempts leaves the rest to the others:
// Note [Chunked parallel loops] in loops.h), each thread with its own workspace (slices of one
// arena tensor); gemm sees it runs inside a parallel region and keeps each GEMM
// single-threaded. With one chunk, or too little work for a team, the chunks run serially and
// gemm threads each GEMM over blocks of its output instead (Eigen itself never threads: Note
// [Eigen runs single-threaded] in tensor/cpu/gemm.h). The weight gradient sums over the
// chunks: one GEMM with the long inner dimension S L gives a chunk's partial grad_w; chunks
// run in parallel into their own partials, which are then added in chunk order. The chunks
// depend only on the shapes, so no result depends on the thread count or the schedule.
// float16/bfloat16 run the float32 code on float32 copies and round once on the store (Note
// [Half types compute in f32]).
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

// x: (Cg, H, W) += col2im(col); col: (Cg * R * S, OH * OW) with rows `ld` apart. Threads
// split the channels, so no two threads add into the same pixel.
template <typename T>
void col2im_add(T* x, const T* col, int64_t ld, int64_t Cg, const Conv2dGeometry& g, bool parallel) {
  const int64_t L = g.OH * g.OW;
  auto add_channels = [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      T* xc = x + c * g.H * g.W;
      for (int64_t r = 0; r < g.R; ++r)
        for (int64_t s = 0; s < g.S; ++s) {
          const T* src = col + ((c * g.R + r) * g.S + s) * ld;
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

/// The columns (output pixels) a chunk of samples puts side by side in one GEMM: about
/// kChunkColumns / L samples (Note [CPU convolution threading]).
constexpr int64_t kChunkColumns = 2048;

/// Samples per chunk: kChunkColumns / L, at least one, at most N.
int64_t chunk_samples(const Conv2dGeometry& g) {
  return std::clamp<int64_t>(kChunkColumns / std::max<int64_t>(g.OH * g.OW, 1), 1, g.N);
}

/// Runs body(n0, ns, slot, may_thread) for the chunks [n0, n0 + ns) of S samples, in parallel
/// over the chunks when there are several and the work pays for a team (Note [CPU
/// convolution threading]); slot is the thread's workspace of slot_size elements; may_thread
/// says whether the body may start threads of its own.
template <typename T, typename Body>
void for_each_chunk(const Conv2dGeometry& g, int64_t S, int64_t slot_size, Body&& body) {
  const int64_t chunks = (g.N + S - 1) / S;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  const bool parallel = chunks > 1 && threads > 1 && g.N * sample_macs(g) >= 4 * kParallelGrain;
  const int64_t slots = parallel ? std::min<int64_t>(threads, chunks) : 1;
  Tensor buffer = [&] {                                       // the arena's bytes
    core::CategoryScope category(core::Category::Workspace);  // for the memory profiler
    return empty({std::max<int64_t>(slots * slot_size, 1)}, {dtype_of<T>(), kCPU});
  }();
  T* slots_base = buffer.data_ptr<T>();
  auto chunk = [&](int64_t c, T* slot, bool may_thread) {
    const int64_t n0 = c * S;
    body(n0, std::min(S, g.N - n0), slot, may_thread);
  };
  if (!parallel) {
    for (int64_t c = 0; c < chunks; ++c) chunk(c, slots_base, true);
    return;
  }
#pragma omp parallel num_threads(int(slots))
  {
    T* slot = slots_base + thread_index() * slot_size;
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < chunks; ++c) chunk(c, slot, false);
  }
}

// out: (N, K, OH, OW); x: (N, C, H, W); w: (K, Cg, R, S); bias: (K) or null
template <typename T>
void conv2d_forward(T* out, const T* x, const T* w, const T* bias, const Conv2dGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, CRS = Cg * g.R * g.S, L = g.OH * g.OW;
  const bool is_direct = direct(g);
  const int64_t S = chunk_samples(g);
  // A chunk of one sample multiplies into the output in place (col: (CRS, L), none when
  // direct); of several, into the columns (CRS, S L) and a product (Kg, S L), then scattered.
  const int64_t slot_size = S == 1 ? (is_direct ? 0 : CRS * L) : (CRS + Kg) * S * L;
  for_each_chunk<T>(g, S, slot_size, [&](int64_t n0, int64_t ns, T* slot, bool may_thread) {
    const int64_t cols = ns * L;
    for (int64_t gi = 0; gi < G; ++gi) {
      const GemmOperand<T> wg = row_major_matrix(w + gi * Kg * CRS, Kg, CRS);
      const T* bg = bias ? bias + gi * Kg : nullptr;
      auto fill_bias = [&](T* y, int64_t ld) {  // y = bias: the bias rides in the GEMM's accumulation
        for (int64_t k = 0; k < Kg; ++k) std::fill(y + k * ld, y + k * ld + cols, bg[k]);
      };
      if (ns == 1) {
        const T* xg = x + (n0 * g.C + gi * Cg) * g.H * g.W;
        if (!is_direct) im2col(slot, L, xg, Cg, g, may_thread);
        T* y = out + (n0 * g.K + gi * Kg) * L;  // (Kg, L)
        if (bg) fill_bias(y, L);
        gemm(wg, row_major_matrix(is_direct ? xg : slot, CRS, L), y, L, bg != nullptr);
        continue;
      }
      T* col = slot;               // (CRS, cols): sample n0 + i in columns [i L, (i + 1) L)
      T* yc = slot + CRS * S * L;  // (Kg, cols)
      for (int64_t i = 0; i < ns; ++i)
        im2col(col + i * L, cols, x + ((n0 + i) * g.C + gi * Cg) * g.H * g.W, Cg, g, may_thread);
      if (bg) fill_bias(yc, cols);
      gemm(wg, GemmOperand<T>{col, CRS, cols, cols, true}, yc, cols, bg != nullptr);
      for (int64_t i = 0; i < ns; ++i)
        for (int64_t k = 0; k < Kg; ++k)
          std::copy(yc + k * cols + i * L, yc + k * cols + (i + 1) * L, out + ((n0 + i) * g.K + gi * Kg + k) * L);
    }
  });
}

// gx: (N, C, H, W); gy: (N, K, OH, OW); w: (K, Cg, R, S)
template <typename T>
void conv2d_backward_input(T* gx, const T* gy, const T* w, const Conv2dGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, CRS = Cg * g.R * g.S, L = g.OH * g.OW;
  const bool is_direct = direct(g);
  const int64_t S = chunk_samples(g);
  // As the forward: a chunk of one sample reads gy in place (col: (CRS, L), none when
  // direct); of several, gathers gy into (Kg, S L) and multiplies into columns (CRS, S L).
  const int64_t slot_size = S == 1 ? (is_direct ? 0 : CRS * L) : (CRS + Kg) * S * L;
  for_each_chunk<T>(g, S, slot_size, [&](int64_t n0, int64_t ns, T* slot, bool may_thread) {
    const int64_t cols = ns * L;
    for (int64_t gi = 0; gi < G; ++gi) {
      const GemmOperand<T> wg_t = row_major_matrix(w + gi * Kg * CRS, Kg, CRS).transposed();  // (CRS, Kg)
      if (ns == 1) {
        T* gxg = gx + (n0 * g.C + gi * Cg) * g.H * g.W;
        const GemmOperand<T> gyg = row_major_matrix(gy + (n0 * g.K + gi * Kg) * L, Kg, L);
        if (is_direct) {  // (Cg, H*W) = w^T (Cg, Kg) @ gy (Kg, L), L == H*W
          gemm(wg_t, gyg, gxg, L, false);
          continue;
        }
        gemm(wg_t, gyg, slot, L, false);  // col: (CRS, L)
        std::fill(gxg, gxg + Cg * g.H * g.W, T(0));
        col2im_add(gxg, slot, L, Cg, g, may_thread);
        continue;
      }
      T* col = slot;                // (CRS, cols): sample n0 + i in columns [i L, (i + 1) L)
      T* gyc = slot + CRS * S * L;  // (Kg, cols)
      for (int64_t i = 0; i < ns; ++i) {
        const T* gyn = gy + ((n0 + i) * g.K + gi * Kg) * L;  // (Kg, L)
        for (int64_t k = 0; k < Kg; ++k) std::copy(gyn + k * L, gyn + (k + 1) * L, gyc + k * cols + i * L);
      }
      gemm(wg_t, GemmOperand<T>{gyc, Kg, cols, cols, true}, col, cols, false);
      for (int64_t i = 0; i < ns; ++i) {
        T* gxg = gx + ((n0 + i) * g.C + gi * Cg) * g.H * g.W;
        if (is_direct) {  // col's rows are gx's channels (CRS == Cg, L == H*W)
          for (int64_t c = 0; c < Cg; ++c) std::copy(col + c * cols + i * L, col + c * cols + (i + 1) * L, gxg + c * L);
          continue;
        }
        std::fill(gxg, gxg + Cg * g.H * g.W, T(0));
        col2im_add(gxg, col + i * L, cols, Cg, g, may_thread);
      }
    }
  });
}

// gw: (K, Cg, R, S); gy: (N, K, OH, OW); x: (N, C, H, W)
template <typename T>
void conv2d_backward_weight(T* gw, const T* gy, const T* x, const Conv2dGeometry& g) {
  const int64_t G = g.groups, Cg = g.C / G, Kg = g.K / G, CRS = Cg * g.R * g.S, L = g.OH * g.OW;
  const bool is_direct = direct(g);
  const int64_t S = chunk_samples(g), chunks = (g.N + S - 1) / S, SL = S * L;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  const bool parallel = chunks > 1 && threads > 1 && g.N * sample_macs(g) >= 4 * kParallelGrain;
  const int64_t slots = parallel ? std::min(threads, chunks) : 1;
  // Per slot: the chunk's columns (CRS, S L) and output gradients (Kg, S L), both read in
  // place for one sample a chunk (the columns too when direct); per chunk after the first:
  // its partial grad_w (K, CRS), the first chunk's going to gw itself.
  const int64_t slot_size = S == 1 ? (is_direct ? 0 : CRS * L) : (CRS + Kg) * SL, partial_size = g.K * CRS;
  Tensor buffer = [&] {
    core::CategoryScope category(core::Category::Workspace);  // for the memory profiler
    return empty({std::max<int64_t>(slots * slot_size + (chunks - 1) * partial_size, 1)}, {dtype_of<T>(), kCPU});
  }();
  T* partials = buffer.data_ptr<T>() + slots * slot_size;
  auto chunk = [&](int64_t c, T* slot) {
    const int64_t n0 = c * S, ns = std::min(S, g.N - n0), cols = ns * L;
    T* col = slot;
    T* gyc = slot + CRS * SL;
    T* out = c == 0 ? gw : partials + (c - 1) * partial_size;
    for (int64_t gi = 0; gi < G; ++gi) {
      if (S == 1) {  // gy (and x when direct) as they lie
        const T* xg = x + (n0 * g.C + gi * Cg) * g.H * g.W;
        if (!is_direct) im2col(col, L, xg, Cg, g, /*parallel=*/false);
        const GemmOperand<T> colm = row_major_matrix(is_direct ? xg : col, CRS, L);
        const GemmOperand<T> gym = row_major_matrix(gy + (n0 * g.K + gi * Kg) * L, Kg, L);
        gemm(gym, colm.transposed(), out + gi * Kg * CRS, CRS, false);  // (Kg, CRS)
        continue;
      }
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
