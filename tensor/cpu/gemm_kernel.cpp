// One instruction-set level's GEMM kernels: built once per level, each time with that level's
// -march, FRUGAL_GEMM_ISA naming it (v2, v3, v4) and nothing else in the translation unit
// (Note [GEMM kernels per instruction set] in tensor/cpu/gemm.cpp).
#include "tensor/cpu/gemm.h"  // first, and free of Eigen: Eigen below gets this level's name

#ifndef FRUGAL_GEMM_ISA
#error "gemm_kernel.cpp is built with -DFRUGAL_GEMM_ISA=v2|v3|v4 (tensor/meson.build)"
#endif

#define FRUGAL_GEMM_CONCAT_(a, b) a##b
#define FRUGAL_GEMM_CONCAT(a, b) FRUGAL_GEMM_CONCAT_(a, b)
// Every Eigen template this file instantiates lands in a namespace of this level's own, so the
// linker never merges an AVX-512 instantiation with the SSE4.2 one of the same name.
#define Eigen FRUGAL_GEMM_CONCAT(frugal_eigen_, FRUGAL_GEMM_ISA)
// GCC 12 warns of an uninitialized register inside its own AVX-512 intrinsics as Eigen's
// products inline them (a don't-care operand), and of unused variables in Eigen's AVX packet
// code: the warnings are theirs, not ours.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include <Eigen/Core>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace frugal::ops::cpu::FRUGAL_GEMM_ISA {

namespace {

template <typename T, int Order>
using ConstMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned,
                          Eigen::OuterStride<>>;

template <typename T, int Order>
ConstMap<T, Order> map(const GemmOperand<T>& m) {
  return ConstMap<T, Order>(m.data, m.rows, m.cols, Eigen::OuterStride<>(m.ld));
}

// Note [GEMM packing buffers]
// Eigen's product packs panels of A and B into buffers it allocates for each product and frees
// after it (hundreds of KB to a few MB). glibc serves them from the heap's top and trims the top
// back to the system on free, so every product paid page faults to map the buffers again: a
// quarter of a one-thread WGAN-GP critic step (bench/bench_double_backward) was in the kernel's
// page-fault handler under gemm_pack_rhs. Each thread now keeps its two buffers (grown to the
// largest product it has run, a few MB, held until the thread exits) and hands them to Eigen's
// blocked GEMM through a level3_blocking, as gemm_blocking_space would after allocating them.
// The products Eigen sends elsewhere (coefficient-based for tiny shapes, GEMV for vectors) go
// through its expression as before.
template <typename T>
class CachedBlocking : public Eigen::internal::level3_blocking<T, T> {
 public:
  /// For a row-major (m, n) result with depth k: Eigen runs it as the column-major transpose,
  /// so its "rows" are n and its "columns" m (gemm_blocking_space<RowMajor, ...>).
  CachedBlocking(Eigen::Index m, Eigen::Index n, Eigen::Index k) {
    this->m_mc = n, this->m_nc = m, this->m_kc = k;
    Eigen::internal::computeProductBlockingSizes<T, T, 1>(this->m_kc, this->m_mc, this->m_nc, Eigen::Index(1));
    thread_local Buffers buffers;
    this->m_blockA = buffers.a.reserve(size_t(this->m_mc * this->m_kc));
    this->m_blockB = buffers.b.reserve(size_t(this->m_kc * this->m_nc));
  }

 private:
  struct Buffer {
    T* data = nullptr;
    size_t capacity = 0;
    Buffer() = default;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { std::free(data); }
    T* reserve(size_t n) {
      if (n > capacity) {
        std::free(data);
        const size_t bytes = (std::max<size_t>(n, 1) * sizeof(T) + 63) / 64 * 64;  // AVX-512 loads: 64-byte aligned
        data = static_cast<T*>(std::aligned_alloc(64, bytes));
        if (!data) throw std::bad_alloc();  // no FRUGAL_CHECK: its templates would leave this level's code shared
        capacity = n;
      }
      return data;
    }
  };
  struct Buffers {
    Buffer a, b;
  };
};

template <typename T, int OrderA, int OrderB>
void product(const GemmOperand<T>& a, const GemmOperand<T>& b, T* out, int64_t ldc, bool accumulate) {
  const Eigen::Index M = a.rows, N = b.cols, K = a.cols;
  if (M + N + K < 20 || M == 1 || N == 1 || K == 0) {  // Eigen's lazy product or GEMV: no packing buffers
    OutMap<T> c(out, M, N, Eigen::OuterStride<>(ldc));
    if (accumulate) c.noalias() += map<T, OrderA>(a) * map<T, OrderB>(b);
    else c.noalias() = map<T, OrderA>(a) * map<T, OrderB>(b);
    return;
  }
  if (!accumulate)  // the GEMM adds into its result
    for (Eigen::Index i = 0; i < M; ++i) std::fill(out + i * ldc, out + i * ldc + N, T(0));
  CachedBlocking<T> blocking(M, N, K);
  Eigen::internal::general_matrix_matrix_product<Eigen::Index, T, OrderA, false, T, OrderB, false, Eigen::RowMajor,
                                                 1>::run(M, N, K, a.data, a.ld, b.data, b.ld, out, 1, ldc, T(1),
                                                         blocking, nullptr);
}

template <typename T>
void gemm_any_order(const GemmOperand<T>& a, const GemmOperand<T>& b, T* out, int64_t ldc, bool accumulate) {
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (a.row_major) {
    if (b.row_major) product<T, R, R>(a, b, out, ldc, accumulate);
    else product<T, R, C>(a, b, out, ldc, accumulate);
  } else {
    if (b.row_major) product<T, C, R>(a, b, out, ldc, accumulate);
    else product<T, C, C>(a, b, out, ldc, accumulate);
  }
}

}  // namespace

// Built without OpenMP: Eigen's products here never thread (Note [Eigen runs single-threaded]).
void gemm(const GemmOperand<float>& a, const GemmOperand<float>& b, float* out, int64_t ldc, bool accumulate) {
  gemm_any_order(a, b, out, ldc, accumulate);
}
void gemm(const GemmOperand<double>& a, const GemmOperand<double>& b, double* out, int64_t ldc, bool accumulate) {
  gemm_any_order(a, b, out, ldc, accumulate);
}

}  // namespace frugal::ops::cpu::FRUGAL_GEMM_ISA
