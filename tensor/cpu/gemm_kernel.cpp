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

template <typename T, int OrderA, int OrderB>
void product(const GemmOperand<T>& a, const GemmOperand<T>& b, T* out, int64_t ldc, bool accumulate) {
  OutMap<T> c(out, a.rows, b.cols, Eigen::OuterStride<>(ldc));
  if (accumulate) c.noalias() += map<T, OrderA>(a) * map<T, OrderB>(b);
  else c.noalias() = map<T, OrderA>(a) * map<T, OrderB>(b);
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
