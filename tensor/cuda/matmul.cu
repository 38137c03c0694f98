// CUDA matrix products on cuBLAS (cublasGemmStridedBatchedEx) and cuBLASLt (linear's bias epilogue).
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

// ---- cuBLASLt: linear with the bias in the epilogue ---------------------------------

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

// Note [Linear bias epilogue]
// out = x @ wt + bias runs as one cuBLASLt matmul with CUBLASLT_EPILOGUE_BIAS: in the
// transposed problem of Note [Row-major products on a column-major BLAS] the bias
// (N) is one value per row of out^T (N, M), which is exactly what the epilogue adds.
// It is used for the 16- and 32-bit types, and like PyTorch's addmm only when every
// dim is > 1 and below 65535 * 32 (shapes on which cuBLASLt has had bias-epilogue
// bugs). When it does not apply, or cuBLASLt finds no algorithm for the pointers'
// alignment, linear copies the bias into out and runs the GEMM with beta = 1: the
// bias is still added by the GEMM, not by another pass over out.
// Either way the bias joins the float32 sum before its one rounding. With a bfloat16
// bias the epilogue did not: it added the bias to the product already rounded to
// bfloat16, so an output that cancels to near 0 was off by half an ulp of the product
// (found by op_fuzz; "the bias is added before the one rounding" in
// tests/gpu/test_matmul_cuda.cpp). A bfloat16 bias is therefore given to the epilogue
// as float32 (N values, converted on the stream).
bool linear_lt(const Tensor& out, const Tensor& x, const Tensor& wt, const Tensor& bias) {
  const DType dt = out.dtype();
  if (dt != kFloat16 && dt != kBFloat16 && dt != kFloat32) return false;
  const int64_t M = out.size(0), N = out.size(1), K = x.size(1);
  constexpr int64_t kMaxDim = 65535 * 32;
  if (M <= 1 || N <= 1 || K <= 1 || M >= kMaxDim || N >= kMaxDim || K >= kMaxDim) return false;
  const BlasTypes types = blas_types("linear", dt, out.device());
  const ColumnMajor A = column_major(wt), B = column_major(x);  // out^T = wt^T x^T + bias
  DeviceGuard guard(out.device());

  cublasLtMatmulDesc_t raw_desc = nullptr;
  FRUGAL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, types.compute, types.scale));
  const MatmulDesc desc(raw_desc);
  set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(A.op));
  set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(B.op));
  set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS));
  // A bfloat16 bias goes in as float32, or it is added after the rounding (see the Note).
  const Tensor epilogue_bias = dt == kBFloat16 ? bias.to(kFloat32) : bias;
  if (dt == kBFloat16) set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F));
  set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, epilogue_bias.data());
  const MatrixLayout la = layout_of(types.data, A, N, K), lb = layout_of(types.data, B, K, M);
  const MatrixLayout lc = layout_of(types.data, {nullptr, CUBLAS_OP_N, N, 0}, N, M);

  const CublasWorkspace ws = cublas_workspace(out.device());
  cublasLtMatmulPreference_t raw_pref = nullptr;
  FRUGAL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
  const Preference pref(raw_pref);
  set(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(ws.size));
  set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(A.ptr));
  set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(B.ptr));
  set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(out.data()));
  set(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(out.data()));
  if (dt != kFloat32)  // split-K partial sums in float32 only (Note [Matmul precision on CUDA])
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

}  // namespace

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
