// CUDA matrix products on cuBLAS (cublasGemmStridedBatchedEx) and cuBLASLt (linear's bias epilogue,
// and its backward's bias-gradient epilogue).
//
// Note [Row-major products on a column-major BLAS]
// cuBLAS is column-major; frugal is row-major. A row-major (R, C) matrix with leading
// dimension ld is, byte for byte, the column-major (C, R) matrix - its transpose -
// with the same ld. So out = a @ b is computed as out^T = b^T a^T: cuBLAS gets b
// where it expects "A" and a where it expects "B", m = N, n = M, k = K, and writes
// the column-major (N, M) out^T, which is the row-major (M, N) out with ldc = N. An
// operand stored column-major (a transposed view) is the matrix itself in cuBLAS's
// eyes and gets CUBLAS_OP_T: no copy either way (see Note [Matmul operand layout]).
// Batches use one stride per operand; a stride of 0 reuses one matrix for the
// whole batch.
//
// Note [Matmul precision on CUDA]
// float16/bfloat16 use CUBLAS_COMPUTE_32F: products and sums in float32, rounded
// once to the output (and the handle forbids reduced-precision split-K reductions,
// see Note [cuBLAS handles]). float32 uses CUBLAS_COMPUTE_32F, true float32, unless
// set_allow_tf32(true) chose CUBLAS_COMPUTE_32F_FAST_TF32 (tensor cores with inputs
// rounded to 10 mantissa bits). float64 uses CUBLAS_COMPUTE_64F.
#include <climits>
#include <cstdint>
#include <memory>

#include "tensor/cuda/cublas_handle.h"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/matmul.h"

namespace frugal::ops::cuda {

namespace {

struct BlasTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;  // type of alpha and beta
};

BlasTypes blas_types(const char* op, DType t, Device d) {
  switch (t) {
    case DType::Float16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::BFloat16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::Float32:
      return {CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::Float64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    default: throw_unsupported_dtype(op, t, d);
  }
}

/// alpha and beta in the scale type: float, or double for float64.
struct Scalars {
  float f[2];
  double d[2];
  Scalars(double alpha, double beta) : f{float(alpha), float(beta)}, d{alpha, beta} {}
  const void* alpha(cudaDataType_t scale) const { return scale == CUDA_R_64F ? (const void*)&d[0] : &f[0]; }
  const void* beta(cudaDataType_t scale) const { return scale == CUDA_R_64F ? (const void*)&d[1] : &f[1]; }
};

/// One operand of out^T = b^T a^T as cuBLAS sees it (Note [Row-major products on a column-major BLAS]).
struct ColumnMajor {
  const char* ptr;
  cublasOperation_t op;
  int64_t ld;
  int64_t batch_stride;  // elements
};

ColumnMajor column_major(const Tensor& t) {  // t: (B, R, C) or (R, C) in a BLAS layout
  const bool row_major = t.stride(-1) == 1;
  return {static_cast<const char*>(t.data()), row_major ? CUBLAS_OP_N : CUBLAS_OP_T,
          row_major ? t.stride(-2) : t.stride(-1), t.dim() == 3 ? t.stride(0) : 0};
}

int as_int(const char* op, int64_t v, const char* what) {
  FRUGAL_CHECK(v <= INT_MAX, op, ": ", what, " = ", v, " exceeds cuBLAS's 32-bit limit");
  return int(v);
}

constexpr int64_t kMaxBatchPerCall = 65535;  // stay within the grid's y/z limits of every cuBLAS kernel

// out: (B, M, N) contiguous; a: (B, M, K); b: (B, K, N). out = a @ b, or out += a @ b when `accumulate`.
// out is in a's dtype, or float32 for float16/bfloat16 operands (the accumulator unrounded).
void gemm(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, bool accumulate) {
  const int64_t batch = out.size(0), M = out.size(1), N = out.size(2), K = a.size(2);
  const BlasTypes types = blas_types(op, a.dtype(), out.device());
  const cudaDataType_t out_type =
      out.dtype() == a.dtype() ? types.data : blas_types(op, out.dtype(), out.device()).data;
  const ColumnMajor A = column_major(b), B = column_major(a);  // out^T = b^T a^T
  const int m = as_int(op, N, "N"), n = as_int(op, M, "M"), k = as_int(op, K, "K");
  const int lda = as_int(op, A.ld, "leading dimension"), ldb = as_int(op, B.ld, "leading dimension");
  const Scalars s(1.0, accumulate ? 1.0 : 0.0);
  const int64_t es = int64_t(a.element_size()), out_es = int64_t(out.element_size());
  DeviceGuard guard(out.device());
  cublasHandle_t h = cublas_handle(out.device());
  for (int64_t first = 0; first < batch; first += kMaxBatchPerCall) {
    const int count = int(std::min(kMaxBatchPerCall, batch - first));
    const char* pa = A.ptr + first * A.batch_stride * es;
    const char* pb = B.ptr + first * B.batch_stride * es;
    char* pc = static_cast<char*>(out.data()) + first * M * N * out_es;
    if (count == 1) {
      FRUGAL_CUBLAS_CHECK(cublasGemmEx(h, A.op, B.op, m, n, k, s.alpha(types.scale), pa, types.data, lda, pb,
                                       types.data, ldb, s.beta(types.scale), pc, out_type, m, types.compute,
                                       CUBLAS_GEMM_DEFAULT));
    } else {
      FRUGAL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          h, A.op, B.op, m, n, k, s.alpha(types.scale), pa, types.data, lda, A.batch_stride, pb, types.data, ldb,
          B.batch_stride, s.beta(types.scale), pc, out_type, m, M * N, count, types.compute, CUBLAS_GEMM_DEFAULT));
    }
  }
}

// ---- cuBLASLt: linear's bias, and its backward's bias gradient, in the epilogue -------

template <typename T, cublasStatus_t (*Destroy)(T)>
struct LtDeleter {
  void operator()(T p) const { Destroy(p); }
};
using MatmulDesc =
    std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDeleter<cublasLtMatmulDesc_t, &cublasLtMatmulDescDestroy>>;
using MatrixLayout =
    std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtDeleter<cublasLtMatrixLayout_t, &cublasLtMatrixLayoutDestroy>>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t,
                                   LtDeleter<cublasLtMatmulPreference_t, &cublasLtMatmulPreferenceDestroy>>;

template <typename V>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  FRUGAL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}
template <typename V>
void set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
  FRUGAL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

/// The column-major (rows, cols) layout that `c` stores before its op is applied.
MatrixLayout layout_of(cudaDataType_t type, const ColumnMajor& c, int64_t rows_after_op, int64_t cols_after_op) {
  const bool t = c.op == CUBLAS_OP_T;
  cublasLtMatrixLayout_t l = nullptr;
  FRUGAL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, uint64_t(t ? cols_after_op : rows_after_op),
                                                 uint64_t(t ? rows_after_op : cols_after_op), c.ld));
  return MatrixLayout(l);
}

/// What cuBLASLt may assume of an operand's address.
uint32_t alignment_of(const void* p) { return uint32_t(pointer_alignment(p, 256)); }

/// Whether cuBLASLt's epilogues take products of `t` (float64 goes to plain cuBLAS).
bool lt_dtype(DType t) { return t == kFloat16 || t == kBFloat16 || t == kFloat32; }

/// Like PyTorch's addmm, epilogues only where every GEMM dim is > 1 and below 65535 * 32:
/// cuBLASLt has had epilogue bugs on the other shapes (see Note [Linear bias epilogue]).
bool lt_dims(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMaxDim = 65535 * 32;
  return m > 1 && n > 1 && k > 1 && m < kMaxDim && n < kMaxDim && k < kMaxDim;
}

/// What an epilogue adds to a cuBLASLt matmul: its kind, its bias vector (read for the BIAS
/// kinds, written for the BGRAD kinds) in D's type, and for the GELU
/// kinds the auxiliary (m, n) matrix in D's type and layout, leading dimension `aux_ld`
/// (written by GELU_AUX, read by DGELU).
struct Epilogue {
  cublasLtEpilogue_t kind;
  void* bias;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

/// out^T = A B plus `epilogue` as one cuBLASLt matmul (beta = 0), in the transposed problem of
/// Note [Row-major products on a column-major BLAS]: A (m, k) and B (k, n) after their ops,
/// D the column-major (m, n) `out` (ld m) in `out_type`. Returns false, having run nothing,
/// when cuBLASLt has no algorithm for the problem and the pointers' alignment. Call it under
/// a DeviceGuard for out's device.
bool lt_matmul(const BlasTypes& types, const ColumnMajor& A, const ColumnMajor& B, int64_t m, int64_t n, int64_t k,
               const Tensor& out, cudaDataType_t out_type, const Epilogue& epilogue) {
  cublasLtMatmulDesc_t raw_desc = nullptr;
  FRUGAL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, types.compute, types.scale));
  const MatmulDesc desc(raw_desc);
  set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(A.op));
  set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(B.op));
  set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(epilogue.kind));
  // Also read by the heuristic: the bias vector's alignment narrows the algorithms.
  set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, epilogue.bias);
  if (epilogue.aux != nullptr) {
    set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, epilogue.aux);
    set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, epilogue.aux_ld);
  }
  const MatrixLayout la = layout_of(types.data, A, m, k), lb = layout_of(types.data, B, k, n);
  const MatrixLayout lc = layout_of(out_type, {nullptr, CUBLAS_OP_N, m, 0}, m, n);

  const CublasWorkspace ws = cublas_workspace(out.device());
  cublasLtMatmulPreference_t raw_pref = nullptr;
  FRUGAL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
  const Preference pref(raw_pref);
  set(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(ws.size));
  set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(A.ptr));
  set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(B.ptr));
  set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(out.data()));
  set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(out.data()));
  if (types.data != CUDA_R_32F)  // split-K partial sums in float32 only (Note [Matmul precision on CUDA])
    set(raw_pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
        uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));

  cublasLtHandle_t lt = cublaslt_handle(out.device());
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt, raw_desc, la.get(), lb.get(), lc.get(), lc.get(), raw_pref, 1, &result,
                                     &found) != CUBLAS_STATUS_SUCCESS ||
      found == 0)
    return false;
  const Scalars s(1.0, 0.0);
  FRUGAL_CUBLAS_CHECK(cublasLtMatmul(lt, raw_desc, s.alpha(types.scale), A.ptr, la.get(), B.ptr, lb.get(),
                                     s.beta(types.scale), out.data(), lc.get(), out.data(), lc.get(), &result.algo,
                                     ws.ptr, ws.size, stream_for(out.device())));
  return true;
}

// Note [Linear bias epilogue]
// out = x @ wt + bias runs as one cuBLASLt matmul with CUBLASLT_EPILOGUE_BIAS: in the
// transposed problem of Note [Row-major products on a column-major BLAS] the bias
// (N) is one value per row of out^T (N, M), which is exactly what the epilogue adds.
// It is used for float16 and float32, and bfloat16 without a bias (below), and like PyTorch's addmm only when every
// dim is > 1 and below 65535 * 32 (shapes on which cuBLASLt has had bias-epilogue
// bugs). When it does not apply, or cuBLASLt finds no algorithm for the pointers'
// alignment, linear copies the bias into out and runs the GEMM with beta = 1: the
// bias is still added by the GEMM, not by another pass over out.
// Either way the bias joins the float32 sum before its one rounding. With a bfloat16
// bias the epilogue did not: it added the bias to the product already rounded to
// bfloat16, so an output that cancels to near 0 was off by half an ulp of the product
// (found by op_fuzz; "the bias is added before the one rounding" in
// tests/gpu/test_matmul_cuda.cpp). Handing it the bias as float32 fixed that but cost
// speed: cuBLASLt 13.1's algorithms for a float32 bias with bfloat16 D took GPT-2 small's
// fc1 (8192 x 768 x 3072) from 0.071 ms without a bias to 0.184 ms (float16 with its
// bias: 0.072). So a bfloat16 linear with a bias takes the copy and beta = 1 instead
// (the copy runs at bandwidth: Note [Vectorized elementwise]).
/// out^T (N, M) = wt^T x^T (+ bias) with `kind`'s epilogue (BIAS, or a GELU_AUX kind writing
/// `aux`): A = wt, B = x; not for a bfloat16 bias (see the Note).
bool linear_with_epilogue(const char* op, const Tensor& out, const Tensor& x, const Tensor& wt, const Tensor& bias,
                          cublasLtEpilogue_t kind, void* aux = nullptr) {
  const DType dt = out.dtype();
  if (!lt_dtype(dt) || (dt == kBFloat16 && bias.defined())) return false;
  const int64_t M = out.size(0), N = out.size(1), K = x.size(1);
  if (!lt_dims(M, N, K)) return false;
  const BlasTypes types = blas_types(op, dt, out.device());
  DeviceGuard guard(out.device());
  return lt_matmul(types, column_major(wt), column_major(x), N, M, K, out, types.data,
                   {kind, bias.defined() ? bias.data() : nullptr, aux, N});
}

bool linear_lt(const Tensor& out, const Tensor& x, const Tensor& wt, const Tensor& bias) {
  return linear_with_epilogue("linear", out, x, wt, bias, CUBLASLT_EPILOGUE_BIAS);
}

}  // namespace

// Note [Bias gradient epilogue]
// Linear's backward needs grad_w = g^T @ x and grad_bias = the sum of g's rows (g: (M, N),
// x: (M, K)). grad_w is the product out (N, K) = gt (N, M) @ x (M, K), so in the transposed
// problem of Note [Row-major products on a column-major BLAS] cuBLAS's "A" is x, its "B"
// is gt, and after B's op (a transpose of the transposed view: no copy) B is g itself,
// (k = M, n = N). CUBLASLT_EPILOGUE_BGRADB writes the sum of op(B) over the GEMM's k
// dimension, one value per column of D (n = N): exactly grad_bias, computed from the g
// tiles the GEMM loads anyway, where ops::sum would read all of g once more. (BGRADA
// would sum the rows of op(A) = x^T: x's column sums, not a gradient of anything here.)
// Precision, as checked on an H200 with cuBLASLt 13.1: the bias gradient is summed in float32
// from B's values (not rounded to TF32 when TF32 is allowed) and rounded once to its type.
// Its type must be D's type: cuBLASLt refused every other CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
// for BGRADB (float32 with 16-bit D, 16-bit with float32 D). So it is g's dtype, as ops::sum
// gives, except for a float32 weight gradient of 16-bit operands (Note [Weight gradients in
// the master dtype]): there it comes out in float32 and ops::linear_backward_weight_bias
// rounds it once to g's dtype, N values instead of a pass over (M, N).
// LinearBackward asks for it when it needs both gradients. It applies where linear's bias
// epilogue does (16- and 32-bit types, every GEMM dim > 1 and below 65535 * 32, so M = 1
// does not) and cuBLASLt has an algorithm for the pointers' alignment; otherwise nothing
// runs and LinearBackward takes its separate GEMM and ops::sum, as on the CPU.
bool linear_backward_weight_bias_kernel(const Tensor& grad_w, const Tensor& grad_bias, const Tensor& gt,
                                        const Tensor& x) {
  const DType dt = gt.dtype();
  if (!lt_dtype(dt) || grad_bias.dtype() != grad_w.dtype()) return false;
  const int64_t N = grad_w.size(0), K = grad_w.size(1), M = x.size(0);
  if (!lt_dims(K, N, M)) return false;
  const BlasTypes types = blas_types("linear_backward_weight_bias", dt, grad_w.device());
  const cudaDataType_t out_type = grad_w.dtype() == dt
                                      ? types.data
                                      : blas_types("linear_backward_weight_bias", grad_w.dtype(), grad_w.device()).data;
  DeviceGuard guard(grad_w.device());
  // grad_w^T (K, N) = x^T gt^T: A = x, B = gt, whose sums over k are grad_bias (see the Note).
  return lt_matmul(types, column_major(x), column_major(gt), K, N, M, grad_w, out_type,
                   {CUBLASLT_EPILOGUE_BGRADB, grad_bias.data()});
}

// Note [GELU epilogues]
// gelu_mlp (autograd/ops/matmul.h) computes fc2(gelu_tanh(fc1(x))) with the GELU inside fc1's
// GEMM and its derivative inside the GEMM of fc2's input gradient, as llm.c and Transformer
// Engine do, so neither direction makes an elementwise pass over the (M, hidden) activations:
//   forward   CUBLASLT_EPILOGUE_GELU_AUX_BIAS: h = gelu_tanh(x w1^T + b1), and as the aux output
//             the pre-activation x w1^T + b1 the backward needs (both in D's type);
//   backward  CUBLASLT_EPILOGUE_DGELU_BGRAD: grad_pre = (g w2) * gelu_tanh'(pre), pre read as
//             the aux input, and b1's gradient (grad_pre's row sums) in the bias buffer.
// cuBLASLt's GELU is the tanh approximation (PyTorch's approximate='tanh', ops::gelu_tanh): the
// exact GELU of BERT and ViT cannot use it. In the transposed problem of Note [Row-major
// products on a column-major BLAS] D is h^T (hidden, M), pre has the same layout (aux ld =
// hidden), and the bias (gradient) has one value per row of D, i.e. per hidden feature, summed
// over the M columns. cuBLASLt wants the aux ld a multiple of 8. Where an epilogue does not
// apply (that, a bfloat16 forward with a bias, what Note [Linear bias epilogue] declines, no
// algorithm, or ops::set_gelu_epilogues turned it off) nothing runs and the caller composes
// linear, gelu_tanh, mm, unary_backward and sum instead.
// Measured on the H200 (cuBLASLt 13.1, bench/bench_gelu_mlp, 8192 tokens, float16): the forward
// epilogue takes GPT-2 small's block forward from 0.164 to 0.155 ms (medium: 0.247 to 0.240),
// but DGELU_BGRAD's GEMM made the backward slower, fwd+bwd 0.607 against 0.501 ms (medium
// 0.952 against 0.723), the plain GEMM and our elementwise derivative being faster than what
// cuBLASLt's heuristic picks with that epilogue. So the forward one is on by default and the
// backward one off; both stay tested, and set_gelu_epilogues turns either on or off.
bool linear_gelu_tanh_kernel(const Tensor& out, const Tensor& pre, const Tensor& x, const Tensor& wt,
                             const Tensor& bias) {
  // (bfloat16 with a bias declines in linear_with_epilogue: cuBLASLt had no GELU_AUX_BIAS
  // algorithm for a float32 bias with bfloat16 D, H200 13.1, and adds a bfloat16 one after the
  // rounding: Note [Linear bias epilogue].)
  if (out.size(1) % 8 != 0) return false;
  return linear_with_epilogue("gelu_mlp", out, x, wt, bias,
                              bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX,
                              pre.data());
}

bool matmul_dgelu_tanh_kernel(const Tensor& grad_pre, const Tensor& grad_bias, const Tensor& g, const Tensor& w,
                              const Tensor& pre) {
  const DType dt = grad_pre.dtype();
  const int64_t M = grad_pre.size(0), H = grad_pre.size(1), N = g.size(1);
  if (!lt_dtype(dt) || !lt_dims(H, M, N) || H % 8 != 0) return false;
  const BlasTypes types = blas_types("gelu_mlp", dt, grad_pre.device());
  DeviceGuard guard(grad_pre.device());
  // grad_pre^T (H, M) = w^T g^T: A = w (N, H), B = g (M, N); the bias gradient in D's type
  // (as BGRADB's, Note [Bias gradient epilogue]).
  const bool with_bias = grad_bias.defined();
  return lt_matmul(types, column_major(w), column_major(g), H, M, N, grad_pre, types.data,
                   {with_bias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU,
                    with_bias ? grad_bias.data() : nullptr, const_cast<void*>(pre.data()), H});
}

void bmm_kernel(const Tensor& out, const Tensor& a, const Tensor& b) { gemm("matmul", out, a, b, false); }

void linear_kernel(const Tensor& out, const Tensor& x, const Tensor& wt, const Tensor& bias) {
  if (!bias.defined()) {
    gemm("linear", out.unsqueeze(0), x.unsqueeze(0), wt.unsqueeze(0), false);
    return;
  }
  if (linear_lt(out, x, wt, bias)) return;
  copy_into(out, bias);  // broadcasts over the rows; then out += x @ wt (Note [Linear bias epilogue])
  gemm("linear", out.unsqueeze(0), x.unsqueeze(0), wt.unsqueeze(0), true);
}

}  // namespace frugal::ops::cuda
