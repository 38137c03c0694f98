// The multi-threaded, vectorised CPU AdamW of OffloadAdamW (see Note [CPU offload] in
// optim/offload_adam.cpp). Compiled with -fno-math-errno (optim/meson.build): GCC otherwise
// keeps a libm call for sqrt of a negative argument (to set errno), control flow that stops
// the update loop vectorising. sqrt is correctly rounded either way (sqrtps and sqrtf
// agree), so the results stay bitwise those of optim::AdamW's loop.
#include "optim/cpu_adam.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/error.h"
#include "tensor/cpu/loops.h"  // in_parallel_region
#include "tensor/half.h"

namespace frugal::optim::cpu {

namespace {

/// The chunk's elements [begin, end). The flags of `c` are loop-invariant; `Decay` and
/// `Maximize` are hoisted into the template so the loop body has no branch left and GCC
/// vectorises it (sqrt and division included).
template <typename T, bool Decay, bool Maximize>
void adam_range(const OffloadAdamChunk& k, const detail::AdamCoeffs<float>& c, int64_t begin, int64_t end) {
  float* __restrict master = k.master;
  float* __restrict m = k.exp_avg;
  float* __restrict v = k.exp_avg_sq;
  const T* __restrict g = static_cast<const T*>(k.grad);
  // Not __restrict: for a CUDA parameter `out` is the staging buffer `g` came in (the rounded
  // weights go back up through it), written only after the update loop has read all of g.
  T* out = static_cast<T*>(k.param_out);
  const float scale = k.grad_scale;
  detail::AdamCoeffs<float> fixed = c;
  fixed.use_wd = Decay;
  fixed.decoupled = true;
  fixed.maximize = Maximize;
  fixed.amsgrad = false;
  for (int64_t i = begin; i < end; ++i) {
    float p = master[i], mi = m[i], vi = v[i], unused = 0.0f;
    detail::adam_update<float>(p, float(g[i]) * scale, mi, vi, unused, fixed);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
  if (out)  // rounding apart: float16/bfloat16 conversion is scalar code and would stop the loop above vectorising
    for (int64_t i = begin; i < end; ++i) out[i] = T(master[i]);
}

template <typename T>
void adam_range_dispatch(const OffloadAdamChunk& k, const detail::AdamCoeffs<float>& c, int64_t begin, int64_t end) {
  if (c.use_wd) {
    if (c.maximize) adam_range<T, true, true>(k, c, begin, end);
    else adam_range<T, true, false>(k, c, begin, end);
  } else {
    if (c.maximize) adam_range<T, false, true>(k, c, begin, end);
    else adam_range<T, false, false>(k, c, begin, end);
  }
}

/// Splits [0, n) into contiguous slices of whole cache lines, one per thread of a team
/// sized by kOffloadAdamGrain (one thread inside a parallel region), and runs body on each.
template <typename Body>
void split_over_threads(int64_t n, int threads, const Body& body) {
  const int64_t team =
      ops::cpu::in_parallel_region() ? 1 : std::clamp<int64_t>(n / kOffloadAdamGrain, 1, std::max(threads, 1));
  if (team == 1) return body(0, n);
  // Slices are multiples of 16 elements (a cache line of float) so no two threads share one.
  const int64_t slice = ((n + team - 1) / team + 15) / 16 * 16;
#pragma omp parallel for schedule(static) num_threads(int(team))
  for (int64_t t = 0; t < team; ++t) body(std::min(n, t * slice), std::min(n, (t + 1) * slice));
}

template <typename T>
bool range_finite(const T* x, int64_t begin, int64_t end) {
  bool finite = true;
  for (int64_t i = begin; i < end; ++i) finite &= std::isfinite(float(x[i]));  // no early exit: it vectorises
  return finite;
}

template <typename T>
void range_accumulate(T* dst, const T* src, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) dst[i] = T(float(dst[i]) + float(src[i]));
}

void check_dtype(DType dtype, const char* what) {
  FRUGAL_CHECK(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, "OffloadAdamW: ", what,
               " not implemented for ", dtype_name(dtype), " on cpu");
}

}  // namespace

bool all_finite(DType dtype, const void* data, int64_t n, int threads) {
  check_dtype(dtype, "the finiteness check is");
  std::atomic<bool> finite{true};
  split_over_threads(n, threads, [&](int64_t begin, int64_t end) {
    bool ok = true;
    if (dtype == kFloat32) ok = range_finite(static_cast<const float*>(data), begin, end);
    else if (dtype == kFloat16) ok = range_finite(static_cast<const Half*>(data), begin, end);
    else ok = range_finite(static_cast<const BFloat16*>(data), begin, end);
    if (!ok) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load();
}

void accumulate(DType dtype, void* dst, const void* src, int64_t n, int threads) {
  check_dtype(dtype, "host gradient accumulation is");
  split_over_threads(n, threads, [&](int64_t begin, int64_t end) {
    if (dtype == kFloat32) range_accumulate(static_cast<float*>(dst), static_cast<const float*>(src), begin, end);
    else if (dtype == kFloat16) range_accumulate(static_cast<Half*>(dst), static_cast<const Half*>(src), begin, end);
    else range_accumulate(static_cast<BFloat16*>(dst), static_cast<const BFloat16*>(src), begin, end);
  });
}

void offload_adam_chunk(DType dtype, const OffloadAdamChunk& chunk, const detail::AdamCoeffs<float>& coeffs,
                        int threads) {
  FRUGAL_CHECK(coeffs.decoupled && !coeffs.amsgrad, "OffloadAdamW: the CPU kernel runs AdamW without amsgrad");
  FRUGAL_CHECK(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, "OffloadAdamW: not implemented for ",
               dtype_name(dtype), " parameters on cpu");
  auto run = [&](int64_t begin, int64_t end) {  // (no throw below: it would run inside the OpenMP team)
    if (dtype == kFloat32) adam_range_dispatch<float>(chunk, coeffs, begin, end);
    else if (dtype == kFloat16) adam_range_dispatch<Half>(chunk, coeffs, begin, end);
    else adam_range_dispatch<BFloat16>(chunk, coeffs, begin, end);
  };
  split_over_threads(chunk.n, threads, run);
}

}  // namespace frugal::optim::cpu
