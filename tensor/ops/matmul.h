#pragma once
// Matrix products: matmul (NumPy/PyTorch semantics), mm, bmm and linear.
//
// The front-end (tensor/ops/matmul.cpp) reduces every case to one batched GEMM
// on 3-D operands, see Note [Matmul reduction to a batched GEMM] there; the
// kernels (tensor/cpu/matmul.cpp: Eigen, tensor/cuda/matmul.cu: cuBLAS and
// cuBLASLt) read the operands in place, see Note [Matmul operand layout].
#include "tensor/tensor.h"

namespace frugal::ops {

/// Matrix product with torch.matmul's rules:
/// - 1-D @ 1-D: dot product, a 0-d result;
/// - 2-D @ 2-D: the matrix product;
/// - a 1-D first operand is treated as a row (1, K), a 1-D second one as a column
///   (K, 1), and that dim is removed from the result;
/// - N-D: the last two dims are matrices and the leading (batch) dims broadcast,
///   e.g. (B, 1, M, K) @ (1, H, K, N) -> (B, H, M, N).
/// Both operands must have the same floating dtype (as in PyTorch there is no type
/// promotion) and live on the same device. float16/bfloat16 accumulate in float32.
Tensor matmul(const Tensor& a, const Tensor& b);

/// Checks matmul's operands (as matmul does, naming the operands as given) and returns the
/// shape of their product.
Shape check_matmul(const Tensor& a, const Tensor& b);

/// 2-D matrix product: a (M, K) @ b (K, N) -> (M, N).
Tensor mm(const Tensor& a, const Tensor& b);
/// mm with the result in `out_dtype`: a's dtype (plain mm), or float32 for float16/bfloat16
/// operands, where the GEMM's float32 accumulator is written without rounding to 16 bits
/// (on the CPU, the operands are widened first). For float32 weight gradients of float16
/// products (Note [Weight gradients in the master dtype]).
Tensor mm(const Tensor& a, const Tensor& b, DType out_dtype);

/// Batched matrix product without broadcasting: a (B, M, K) @ b (B, K, N) -> (B, M, N).
Tensor bmm(const Tensor& a, const Tensor& b);

/// x @ weight^T + bias, as torch.nn.functional.linear: x (..., in), weight (out, in),
/// bias (out) or an undefined Tensor() for none; result (..., out). On CUDA the bias
/// is added in the GEMM itself (cuBLASLt's bias epilogue, or beta = 1 onto a copy of
/// the bias), never by a separate pass.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

/// Checks linear's operands (as linear does), naming `op` in the error.
void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias);

/// The weight and bias gradients of linear from one GEMM, or two undefined tensors.
struct LinearWeightBiasGrads {
  Tensor weight;  ///< (out, in)
  Tensor bias;    ///< (out)
};

/// Linear's weight and bias gradients in one pass over g: weight = g^T @ x in `weight_dtype`
/// (g's dtype, or float32 for float16/bfloat16 g, as mm's out_dtype) and bias = the sum of
/// g's rows in g's dtype (float32 sums rounded once), for g (M, out) and x (M, in). On CUDA
/// the bias gradient comes out of the GEMM's epilogue (Note [Bias gradient epilogue] in
/// tensor/cuda/matmul.cu). Where that does not apply (on the CPU, float64, M, in or out
/// of 1, no cuBLASLt algorithm) it runs nothing and returns undefined tensors: the caller
/// then uses mm and sum.
LinearWeightBiasGrads linear_backward_weight_bias(const Tensor& g, const Tensor& x, DType weight_dtype);

/// linear_gelu_tanh's results: the activation and the pre-activation its derivative needs.
struct LinearGelu {
  Tensor out;  ///< gelu_tanh(pre), (..., out)
  Tensor pre;  ///< x @ weight^T + bias, (..., out)
};

/// gelu_tanh(linear(x, weight, bias)) with the pre-activation kept: on CUDA from one GEMM whose
/// epilogue applies the GELU (Note [GELU epilogues] in tensor/cuda/matmul.cu), elsewhere, or
/// where the epilogue does not apply or set_gelu_epilogues has it off, linear then gelu_tanh
/// (the same values up to rounding).
LinearGelu linear_gelu_tanh(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

/// What the backward through gelu_tanh(pre) @ weight^T gives from one GEMM, or two undefined tensors.
struct GeluGrads {
  Tensor pre;   ///< (g @ weight) * gelu_tanh'(pre), (M, in)
  Tensor bias;  ///< pre's row sums (the gradient of the bias that made pre), (in); undefined unless asked
};

/// For g (M, out), the output gradient of linear(gelu_tanh(pre), weight) with weight (out, in)
/// and pre (M, in): pre's gradient, and with `with_bias` its row sums, in g's dtype, from one
/// GEMM whose epilogue applies gelu_tanh's derivative (Note [GELU epilogues]). Where that does
/// not apply (the CPU, float64, shapes cuBLASLt declines, or set_gelu_epilogues has it off, the
/// default) it runs nothing and returns undefined tensors: the caller then uses mm,
/// unary_backward and sum.
GeluGrads matmul_gelu_tanh_backward(const Tensor& g, const Tensor& weight, const Tensor& pre, bool with_bias);

/// Which of gelu_mlp's GEMM epilogues may run (Note [GELU epilogues] in tensor/cuda/matmul.cu):
/// the GELU in fc1's forward GEMM (linear_gelu_tanh), its derivative with b1's gradient in the
/// backward's (matmul_gelu_tanh_backward). One that is off runs the composed ops instead. By
/// default the forward one runs and the backward one does not: on the H200 its GEMM was slower
/// than the plain GEMM and the elementwise derivative together (bench/bench_gelu_mlp).
struct GeluEpilogues {
  bool forward = true;
  bool backward = false;
};
/// Sets which GELU epilogues run, process-wide.
void set_gelu_epilogues(GeluEpilogues e);
/// The current setting of set_gelu_epilogues.
GeluEpilogues gelu_epilogues();

/// Lets float32 products on CUDA use TF32 tensor cores (10-bit mantissa inputs, float32
/// accumulation), like torch.backends.cuda.matmul.allow_tf32. Process-wide; default false,
/// so float32 results are accurate to float32.
void set_allow_tf32(bool allow);
/// The current setting of set_allow_tf32.
bool allow_tf32();

}  // namespace frugal::ops

// Backend kernels. The front-end has already validated the operands, allocated `out`
// (contiguous), handled empty results and K == 0, and put each matrix operand in a
// BLAS layout: see Note [Matmul operand layout] in tensor/ops/matmul.cpp.
namespace frugal::ops::cpu {
// out: (B, M, N) contiguous; a: (B, M, K); b: (B, K, N); batch strides may be 0
void bmm_kernel(const Tensor& out, const Tensor& a, const Tensor& b);
// out: (M, N) contiguous; x: (M, K); wt: (K, N) (the transposed weight); bias: (N) contiguous or undefined
void linear_kernel(const Tensor& out, const Tensor& x, const Tensor& wt, const Tensor& bias);
}  // namespace frugal::ops::cpu

namespace frugal::ops::cuda {
// out: (B, M, N) contiguous, in a's dtype or float32 (a, b float16/bfloat16); a: (B, M, K);
// b: (B, K, N); batch strides may be 0
void bmm_kernel(const Tensor& out, const Tensor& a, const Tensor& b);
// out: (M, N) contiguous; x: (M, K); wt: (K, N) (the transposed weight); bias: (N) contiguous or undefined
void linear_kernel(const Tensor& out, const Tensor& x, const Tensor& wt, const Tensor& bias);
// grad_w: (N, K) contiguous, in gt's dtype or float32 (gt float16/bfloat16); grad_bias: (N) contiguous,
// in grad_w's dtype; gt: (N, M) (the transposed output gradient); x: (M, K). grad_w = gt @ x and
// grad_bias = the row sums of gt in one cuBLASLt matmul; false, having run nothing, where it does
// not apply (Note [Bias gradient epilogue]). CUDA only: the CPU has no fused kernel.
bool linear_backward_weight_bias_kernel(const Tensor& grad_w, const Tensor& grad_bias, const Tensor& gt,
                                        const Tensor& x);
// out, pre: (M, N) contiguous; x: (M, K); wt: (K, N); bias: (N) contiguous or undefined. out =
// gelu_tanh(pre), pre = x @ wt + bias, in one cuBLASLt matmul; false, having run nothing, where
// it does not apply (Note [GELU epilogues]).
bool linear_gelu_tanh_kernel(const Tensor& out, const Tensor& pre, const Tensor& x, const Tensor& wt,
                             const Tensor& bias);
// grad_pre, pre: (M, H) contiguous; grad_bias: (H) contiguous in grad_pre's dtype, or undefined;
// g: (M, N); w: (N, H). grad_pre = (g @ w) * gelu_tanh'(pre) and grad_bias = its row sums in
// one cuBLASLt matmul; false, having run nothing, where it does not apply (Note [GELU epilogues]).
bool matmul_dgelu_tanh_kernel(const Tensor& grad_pre, const Tensor& grad_bias, const Tensor& g, const Tensor& w,
                              const Tensor& pre);
}  // namespace frugal::ops::cuda
