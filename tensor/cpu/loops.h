#pragma once
// CPU elementwise loops over an ElementwiseLayout (see Note [Elementwise layout]).
//
//   cpu_map<float, float, float>(L, [](float a, float b) { return a + b; });
//
// Operand 0 is the output. The linear index range is cut into chunks run by
// OpenMP threads when the op is large enough to pay for it; inside a chunk the
// innermost dim is a tight strided loop (a unit-stride loop the compiler
// vectorizes when the layout is contiguous).
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>

#include "tensor/elementwise.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace frugal::ops::cpu {

constexpr int64_t kParallelGrain = 32768;  // elements per thread below which threads cost more than they save

/// for (i = 0; i < n; ++i) body(i), across OpenMP threads only when `parallel`.
/// `#pragma omp parallel for if (false)` still enters libgomp and builds a team of
/// one (an allocation and a few hundred ns), which on small tensors costs more than
/// the loop; a plain loop on that path costs nothing (bench/op_overhead).
template <typename Body>
void parallel_for_if(bool parallel, int64_t n, Body&& body) {
  if (parallel) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

/// omp_in_parallel() and omp_get_thread_num(); false and 0 in a build without OpenMP.
inline bool in_parallel_region() {
#ifdef _OPENMP
  return omp_in_parallel();
#else
  return false;
#endif
}
inline int64_t thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Note [Chunked parallel loops]
// A kernel whose items cost very different amounts, or that runs on a machine whose
// cores other processes also use, loses most to a static schedule: the team waits at the
// loop's end for its slowest thread, and a thread the OS preempts for one time slice
// (milliseconds) stalls the whole op for that long, which is how a 5 ms convolution
// backward took 0.5-1 s on the loaded 2-core development machine. parallel_chunks cuts
// [0, n) into chunks of at least kParallelGrain work and hands them out dynamically, at
// most kChunksPerThread per thread, so a preempted thread's unstarted chunks go to the
// others; work under 2 kParallelGrain, one thread, or a call from inside a parallel
// region runs as one serial chunk (no team at all). The chunk bounds depend on n, the
// work and the thread count, never on timing, so a body that writes disjoint outputs per
// item gives the same result for every schedule.
constexpr int64_t kChunksPerThread = 4;

/// Runs body(begin, end) over chunks covering [0, n), in parallel when n items of
/// `work_per_item` elementary steps each are worth it (Note [Chunked parallel loops]).
template <typename Body>
void parallel_chunks(int64_t n, int64_t work_per_item, Body&& body) {
  if (n <= 0) return;
  const int64_t work = n * std::max<int64_t>(work_per_item, 1);
#ifdef _OPENMP
  const int64_t threads = in_parallel_region() ? 1 : omp_get_max_threads();
#else
  const int64_t threads = 1;
#endif
  const int64_t chunks = std::min({n, work / kParallelGrain, threads * kChunksPerThread});
  if (threads < 2 || chunks < 2) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(int(std::min(threads, chunks)))
  for (int64_t c = 0; c < chunks; ++c) body(c * n / chunks, (c + 1) * n / chunks);
}

/// Calls run(ptrs, strides_bytes, count) for runs of the innermost dim covering [begin, end).
template <typename Run>
void for_each_run(const ElementwiseLayout& L, int64_t begin, int64_t end, Run&& run) {
  const int n = L.noperands;
  char* ptrs[kMaxOperands];
  int64_t inner[kMaxOperands];
  if (L.contiguous || L.ndim <= 1) {
    for (int k = 0; k < n; ++k) {
      const int64_t es = int64_t(element_size(L.dtypes[k]));
      const int64_t s = L.contiguous ? 1 : (L.ndim == 1 ? L.strides[k][0] : 0);
      inner[k] = s * es;
      ptrs[k] = L.data[k] + begin * inner[k];
    }
    run(ptrs, inner, end - begin);
    return;
  }
  const int last = L.ndim - 1;
  int64_t idx[kMaxDims];
  int64_t rem = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rem % L.sizes[d];
    rem /= L.sizes[d];
  }
  for (int k = 0; k < n; ++k) inner[k] = L.strides[k][last] * int64_t(element_size(L.dtypes[k]));
  int64_t pos = begin;
  while (pos < end) {
    for (int k = 0; k < n; ++k) {
      int64_t off = 0;
      for (int d = 0; d <= last; ++d) off += idx[d] * L.strides[k][d];
      ptrs[k] = L.data[k] + off * int64_t(element_size(L.dtypes[k]));
    }
    const int64_t count = std::min(L.sizes[last] - idx[last], end - pos);
    run(ptrs, inner, count);
    pos += count;
    idx[last] += count;
    for (int d = last; d > 0 && idx[d] == L.sizes[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

/// Splits [0, numel) across threads and calls for_each_run on each part.
template <typename Run>
void parallel_runs(const ElementwiseLayout& L, Run&& run) {
  const int64_t n = L.numel;
  if (n < 2 * kParallelGrain) {
    for_each_run(L, 0, n, run);
    return;
  }
#pragma omp parallel
  {
#ifdef _OPENMP
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
    const int64_t nt = 1, t = 0;
#endif
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    if (b < e) for_each_run(L, b, e, run);
  }
}

namespace detail {
template <typename Out, typename... In, typename F, size_t... I>
void map_run(char** p, const int64_t* s, int64_t count, F& f, std::index_sequence<I...>) {
  const bool unit = ((s[0] == int64_t(sizeof(Out))) && ... && (s[I + 1] == int64_t(sizeof(In))));
  if (unit) {
    Out* out = reinterpret_cast<Out*>(p[0]);
    std::tuple<const In*...> in{reinterpret_cast<const In*>(p[I + 1])...};
    for (int64_t i = 0; i < count; ++i) out[i] = Out(f(std::get<I>(in)[i]...));
  } else {
    for (int64_t i = 0; i < count; ++i)
      *reinterpret_cast<Out*>(p[0] + i * s[0]) = Out(f(*reinterpret_cast<const In*>(p[I + 1] + i * s[I + 1])...));
  }
}
}  // namespace detail

/// out[i] = f(in_1[i], ..., in_k[i]) for every element of the layout.
template <typename Out, typename... In, typename F>
void cpu_map(const ElementwiseLayout& L, F f) {
  parallel_runs(L, [&](char** p, const int64_t* s, int64_t count) {
    detail::map_run<Out, In...>(p, s, count, f, std::index_sequence_for<In...>{});
  });
}

}  // namespace frugal::ops::cpu
