#include "tensor/ops/index.h"

#include <algorithm>
#include <cstdint>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"

namespace frugal::ops::cpu {

namespace {

// Runs body(begin, end, err) over parts of [0, n) on OpenMP threads and returns the bad
// index with the lowest position (see Note [Index validation]); nothing may throw inside.
template <typename Body>
IndexError parallel_checked(int64_t n, Body&& body) {
  IndexError result;
  if (n < 2 * kParallelGrain) {
    body(int64_t(0), n, result);
    return result;
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
    IndexError local;
    if (b < e) body(b, e, local);
    if (local.found) {
#pragma omp critical(frugal_index_error)
      if (!result.found || local.position < result.position) result = local;
    }
  }
  return result;
}

// Operands: 0 = out, 1 = index, 2 = table (stride 0 at the indexed dim); step = its stride there, in bytes.
template <typename T, typename I>
void gather_range(const ElementwiseLayout& L, int64_t begin, int64_t end, int64_t dim_size, int64_t step,
                  IndexError& err) {
  int64_t pos = begin;  // row-major position of the run's first element
  for_each_run(L, begin, end, [&](char** p, const int64_t* s, int64_t count) {
    if (err.found) return;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t v = int64_t(*reinterpret_cast<const I*>(p[1] + j * s[1]));
      if (v < 0 || v >= dim_size) [[unlikely]] {
        err = {true, v, pos + j, {}};
        return;
      }
      *reinterpret_cast<T*>(p[0] + j * s[0]) = *reinterpret_cast<const T*>(p[2] + j * s[2] + v * step);
    }
    pos += count;
  });
}

// Operands: 0 = acc (stride 0 at the indexed dim), 1 = index, 2 = src. Serial: see Note [Scatter accumulation].
template <typename Acc, typename S, typename I>
IndexError scatter_add_all(const ElementwiseLayout& L, int64_t dim_size, int64_t step, int64_t skip) {
  IndexError err;
  int64_t pos = 0;
  for_each_run(L, 0, L.numel, [&](char** p, const int64_t* s, int64_t count) {
    if (err.found) return;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t v = int64_t(*reinterpret_cast<const I*>(p[1] + j * s[1]));
      if (v < 0 || v >= dim_size) [[unlikely]] {  // before the skip test: skip = -1 means "none", not "index -1"
        err = {true, v, pos + j, {}};
        return;
      }
      if (v == skip) continue;
      *reinterpret_cast<Acc*>(p[0] + j * s[0] + v * step) +=
          Acc(static_cast<opmath_t<S>>(*reinterpret_cast<const S*>(p[2] + j * s[2])));
    }
    pos += count;
  });
  return err;
}

}  // namespace

void index_gather_kernel(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim_size,
                         int64_t dim_stride, IndexError& err) {
  // out, index, src: the iteration shape; src: stride 0 at the indexed dim
  const ElementwiseLayout L = make_elementwise_layout("index_gather", out, {index, src});
  dispatch_bytes(out.element_size(), "index_gather", [&]<typename T>() {
    dispatch_index(index.dtype(), "index_gather", index.device(), [&]<typename I>() {
      const int64_t step = dim_stride * int64_t(sizeof(T));
      err = parallel_checked(L.numel, [&](int64_t b, int64_t e, IndexError& local) {
        gather_range<T, I>(L, b, e, dim_size, step, local);
      });
    });
  });
}

void index_scatter_add_kernel(const Tensor& acc, const Tensor& index, const Tensor& src, int64_t dim_size,
                              int64_t dim_stride, int64_t skip, IndexError& err) {
  // acc, index, src: the iteration shape; acc: stride 0 at the indexed dim, dtype opmath(src)
  const ElementwiseLayout L = make_elementwise_layout("index_scatter_add", acc, {index, src});
  dispatch_numeric(src.dtype(), "index_scatter_add", src.device(), [&]<typename S>() {
    using Acc = opmath_t<S>;
    FRUGAL_CHECK(acc.dtype() == dtype_of<Acc>(), "index_scatter_add: accumulator ", acc.describe(),
                 " does not match src ", src.describe());
    dispatch_index(index.dtype(), "index_scatter_add", index.device(), [&]<typename I>() {
      err = scatter_add_all<Acc, S, I>(L, dim_size, dim_stride * int64_t(sizeof(Acc)), skip);
    });
  });
}

void pad_source_indices_kernel(const Tensor& out, int64_t n, int64_t left, PadIndexMode mode) {
  int64_t* p = out.data_ptr<int64_t>();
  for (int64_t o = 0; o < out.numel(); ++o) p[o] = pad_source_index(o, n, left, mode);
}

}  // namespace frugal::ops::cpu
