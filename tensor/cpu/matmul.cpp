// CPU matrix products on Eigen's GEMM, reading the operands where they lie.
//
// Note [Eigen GEMM on mapped operands]
// Each matrix operand is a GemmOperand over the tensor's own memory, row-major or
// column-major with a leading dimension as its strides say (see Note [Matmul operand
// layout] in tensor/ops/matmul.cpp), so transposed and sliced views cost no copy and the
// kernel (tensor/cpu/gemm_kernel.cpp) maps them as Eigen matrices and runs Eigen's blocked,
// packed, vectorized GEMM directly. One product is split into blocks of its output rows or
// columns run in parallel (gemm); a batch of products runs one product per OpenMP thread,
// handed out dynamically (gemm_serial); Eigen itself never threads (Note [Eigen runs
// single-threaded] in tensor/cpu/gemm.h). float16/bfloat16 are converted to float32,
// multiplied, and rounded once on the store (Note [Half types compute in f32]); bfloat16 on a CPU
// with AVX512-BF16 is multiplied where it lies, in float32 accumulators, and rounded once too
// (Note [bfloat16 GEMM] in tensor/cpu/gemm_bf16_kernel.cpp).
#include <algorithm>
#include <type_traits>

#include "core/threads.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/loops.h"  // in_parallel_region
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/matmul.h"

namespace frugal::ops::cpu {

namespace {

/// One (rows, cols) matrix per batch entry of a (B, rows, cols) operand in a BLAS layout.
template <typename T>
struct MatrixOperand {
  GemmOperand<T> first;  // batch entry 0
  int64_t batch_stride;

  explicit MatrixOperand(const Tensor& t)  // t: (B, rows, cols) or (rows, cols)
      : first{t.data_ptr<T>(), t.size(-2), t.size(-1), t.stride(-1) == 1 ? t.stride(-2) : t.stride(-1),
              t.stride(-1) == 1},
        batch_stride(t.dim() == 3 ? t.stride(0) : 0) {}

  GemmOperand<T> at(int64_t batch) const {
    GemmOperand<T> m = first;
    m.data += batch * batch_stride;
    return m;
  }
};

// out: (B, M, N) contiguous, = a @ b, or += a @ b when `accumulate` (Out: T, or float32 for
// bfloat16 operands on the native kernel)
template <typename T, typename Out>
void gemm_batch(Out* out, int64_t batch, const MatrixOperand<T>& a, const MatrixOperand<T>& b, bool accumulate) {
  const int64_t M = a.first.rows, N = b.first.cols;
  if (batch == 1) return gemm(a.at(0), b.at(0), out, N, accumulate);
  auto one = [&](int64_t i) { gemm_serial(a.at(i), b.at(i), out + i * M * N, N, accumulate); };
  if (batch * M * N * a.first.cols >= kGemmBlockMacs && get_num_threads() > 1 && !in_parallel_region()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < batch; ++i) one(i);
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);
  }
}

template <typename T>
constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// `t` (B, R, C) or (R, C) converted to float32: in its own memory order when it is the
/// transpose of a dense matrix (a weight's .t()), so the conversion runs over contiguous memory
/// in bulk (Note [Bulk float16 conversion] in tensor/cpu/half_convert_kernel.cpp) and the GEMM
/// reads the copy column-major as it would read t; else row-major. A batch broadcast with
/// stride 0 is converted once and stays broadcast.
Tensor to_float32(const Tensor& t) {
  if (t.dim() == 3 && t.size(0) > 1 && t.stride(0) == 0) return to_float32(t.narrow(0, 0, 1)).expand(t.sizes());
  if (t.dim() >= 2 && !t.is_contiguous() && t.transpose(-1, -2).is_contiguous())
    return t.transpose(-1, -2).to(kFloat32).transpose(-1, -2);
  return t.to(kFloat32);
}

/// bfloat16 operands on AVX512-BF16 (Note [bfloat16 GEMM]): read where they lie, no float32 copies.
template <typename T>
constexpr bool maybe_native_v = std::is_same_v<T, BFloat16>;

}  // namespace

void bmm_kernel(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.dtype() != a.dtype()) {  // a float32 result of 16-bit operands (mm's widening form)
    if (a.dtype() == kBFloat16 && gemm_bf16_native())
      return gemm_batch<BFloat16>(out.data_ptr<float>(), out.size(0), MatrixOperand<BFloat16>(a),
                                  MatrixOperand<BFloat16>(b), false);
    return bmm_kernel(out, to_float32(a), to_float32(b));
  }
  dispatch_floating(out.dtype(), "matmul", out.device(), [&]<typename T>() {
    if constexpr (maybe_native_v<T>) {
      if (gemm_bf16_native()) {
        Tensor acc = empty(out.sizes(), {kFloat32, kCPU});
        gemm_batch<T>(acc.data_ptr<float>(), out.size(0), MatrixOperand<T>(a), MatrixOperand<T>(b), false);
        return copy_into(out, acc);  // the one rounding
      }
    }
    if constexpr (is_half_v<T>) {
      Tensor acc = empty(out.sizes(), {kFloat32, kCPU});
      bmm_kernel(acc, to_float32(a), to_float32(b));
      copy_into(out, acc);  // the one rounding
    } else {
      gemm_batch<T>(out.data_ptr<T>(), out.size(0), MatrixOperand<T>(a), MatrixOperand<T>(b), false);
    }
  });
}

void linear_kernel(const Tensor& out, const Tensor& x, const Tensor& wt, const Tensor& bias) {
  dispatch_floating(out.dtype(), "linear", out.device(), [&]<typename T>() {
    if constexpr (maybe_native_v<T>) {
      if (gemm_bf16_native()) {
        const int64_t M = out.size(0), N = out.size(1);
        Tensor acc = bias.defined() ? bias.to(kFloat32).expand({M, N}).contiguous() : empty({M, N}, {kFloat32, kCPU});
        gemm_batch<T>(acc.data_ptr<float>(), 1, MatrixOperand<T>(x), MatrixOperand<T>(wt), bias.defined());
        return copy_into(out, acc);
      }
    }
    if constexpr (is_half_v<T>) {
      Tensor acc = empty(out.sizes(), {kFloat32, kCPU});
      linear_kernel(acc, to_float32(x), to_float32(wt), bias.defined() ? bias.to(kFloat32) : Tensor());
      copy_into(out, acc);
    } else {
      const int64_t M = out.size(0), N = out.size(1);
      T* o = out.data_ptr<T>();
      if (bias.defined()) {  // out = bias, then out += x @ wt: the bias rides in the GEMM's accumulation
        const T* b = bias.data_ptr<T>();
        for (int64_t i = 0; i < M; ++i) std::copy(b, b + N, o + i * N);
      }
      gemm_batch<T>(o, 1, MatrixOperand<T>(x), MatrixOperand<T>(wt), bias.defined());
    }
  });
}

}  // namespace frugal::ops::cpu
