// CPU matrix products on Eigen's GEMM, reading the operands where they lie.
//
// Note [Eigen GEMM on mapped operands]
// Each matrix operand is an Eigen::Map over the tensor's own memory, row-major or
// column-major with an OuterStride as its strides say (see Note [Matmul operand
// layout] in tensor/ops/matmul.cpp), so transposed and sliced views cost no copy
// and `C.noalias() = A * B` runs Eigen's blocked, packed, vectorized GEMM directly;
// the only overhead over a hand-written Eigen product is the dispatch. One product is
// split into blocks of its output rows or columns run in parallel (blocked_product);
// a batch of products runs one product per OpenMP thread, handed out dynamically;
// Eigen itself never threads (Note [Eigen runs single-threaded]). float16/bfloat16 are converted to float32,
// multiplied, and rounded once on the store (Note [Half types compute in f32]).
#include <Eigen/Core>

#include <type_traits>

#include "core/threads.h"
#include "tensor/cpu/eigen_gemm.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/matmul.h"

namespace frugal::ops::cpu {

namespace {

template <typename T, int Order>
using ConstMatrixMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using OutMatrixMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

/// One (rows, cols) matrix per batch entry of a (B, rows, cols) operand in a BLAS layout.
template <typename T>
struct MatrixOperand {
  const T* data;
  int64_t batch_stride, rows, cols, ld;
  bool row_major;

  explicit MatrixOperand(const Tensor& t)  // t: (B, rows, cols) or (rows, cols)
      : data(t.data_ptr<T>()),
        batch_stride(t.dim() == 3 ? t.stride(0) : 0),
        rows(t.size(-2)),
        cols(t.size(-1)),
        ld(t.stride(-1) == 1 ? t.stride(-2) : t.stride(-1)),
        row_major(t.stride(-1) == 1) {}

  template <int Order>
  ConstMatrixMap<T, Order> map(int64_t batch) const {
    return ConstMatrixMap<T, Order>(data + batch * batch_stride, rows, cols, Eigen::OuterStride<>(ld));
  }
};

// out: (B, M, N) contiguous, = a @ b, or += a @ b when `accumulate`
template <typename T, int OrderA, int OrderB>
void gemm_batch(T* out, int64_t batch, const MatrixOperand<T>& a, const MatrixOperand<T>& b, bool accumulate) {
  const int64_t M = a.rows, N = b.cols;
  serial_eigen();
  if (batch == 1) {
    OutMatrixMap<T> C(out, M, N);
    blocked_product(C, a.template map<OrderA>(0), b.template map<OrderB>(0), accumulate);
    return;
  }
  auto one = [&](int64_t i) {
    OutMatrixMap<T> C(out + i * M * N, M, N);
    if (accumulate) C.noalias() += a.template map<OrderA>(i) * b.template map<OrderB>(i);
    else C.noalias() = a.template map<OrderA>(i) * b.template map<OrderB>(i);
  };
  if (batch * M * N * a.cols >= kGemmBlockMacs && get_num_threads() > 1 && !in_parallel_region()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < batch; ++i) one(i);
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);
  }
}

template <typename T>
void gemm(T* out, int64_t batch, const MatrixOperand<T>& a, const MatrixOperand<T>& b, bool accumulate) {
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (a.row_major) {
    if (b.row_major) gemm_batch<T, R, R>(out, batch, a, b, accumulate);
    else gemm_batch<T, R, C>(out, batch, a, b, accumulate);
  } else {
    if (b.row_major) gemm_batch<T, C, R>(out, batch, a, b, accumulate);
    else gemm_batch<T, C, C>(out, batch, a, b, accumulate);
  }
}

template <typename T>
constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// `t` (B, R, C) converted to float32 in row-major; a batch broadcast with stride 0
/// is converted once and stays broadcast.
Tensor to_float32(const Tensor& t) {
  if (t.dim() == 3 && t.size(0) > 1 && t.stride(0) == 0) return t.narrow(0, 0, 1).to(kFloat32).expand(t.sizes());
  return t.to(kFloat32);
}

}  // namespace

void bmm_kernel(const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_floating(out.dtype(), "matmul", out.device(), [&]<typename T>() {
    if constexpr (is_half_v<T>) {
      Tensor acc = empty(out.sizes(), {kFloat32, kCPU});
      bmm_kernel(acc, to_float32(a), to_float32(b));
      copy_into(out, acc);  // the one rounding
    } else {
      gemm<T>(out.data_ptr<T>(), out.size(0), MatrixOperand<T>(a), MatrixOperand<T>(b), false);
    }
  });
}

void linear_kernel(const Tensor& out, const Tensor& x, const Tensor& wt, const Tensor& bias) {
  dispatch_floating(out.dtype(), "linear", out.device(), [&]<typename T>() {
    if constexpr (is_half_v<T>) {
      Tensor acc = empty(out.sizes(), {kFloat32, kCPU});
      linear_kernel(acc, x.to(kFloat32), wt.to(kFloat32), bias.defined() ? bias.to(kFloat32) : Tensor());
      copy_into(out, acc);
    } else {
      const int64_t M = out.size(0), N = out.size(1);
      if (bias.defined()) {  // out = bias, then out += x @ wt: the bias rides in the GEMM's accumulation
        OutMatrixMap<T>(out.data_ptr<T>(), M, N).rowwise() =
            Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias.data_ptr<T>(), N);
      }
      gemm<T>(out.data_ptr<T>(), 1, MatrixOperand<T>(x), MatrixOperand<T>(wt), bias.defined());
    }
  });
}

}  // namespace frugal::ops::cpu
