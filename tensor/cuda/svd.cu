// CUDA SVD on cuSOLVER's Jacobi solvers (gesvdj, gesvdjBatched).
//
// Note [Row-major SVD on a column-major solver]
// cuSOLVER is column-major. The row-major (m, n) A is, byte for byte, the column-major
// (n, m) C = A^T, and C = A^T = V S U^T: the solver's left vectors of C are A's right
// vectors and its right vectors are A's left ones. The solver's U_c (n, k), column-major
// with ld n, is byte for byte the row-major (k, n) Vh, so it is written straight into
// Vh; its V_c (m, k) column-major is the row-major (k, m) U^T, transposed into U by one
// strided copy. No copy of A is made beyond the one the solver overwrites.
//
// Note [gesvdj or gesvdjBatched]
// gesvdj (one-sided Jacobi) is accurate and, unlike gesvd, takes m < n as well as
// m >= n. One call per matrix costs a few launches each, which dominates for small
// matrices; gesvdjBatched solves a whole batch of matrices up to 32 x 32 in one call
// but computes the full square U_c and V_c, whose first k columns are kept. Both sort
// singular values in decreasing order. The solvers report non-convergence through an
// int per matrix on the device; svd reads them back (one sync: SVD is a one-off
// compression step, not a training-loop op) and throws on failure.
#include <cusolverDn.h>

#include <array>
#include <climits>
#include <vector>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/svd.h"

#define FRUGAL_CUSOLVER_CHECK(expr)                                                                                    \
  do {                                                                                                                 \
    cusolverStatus_t frugal_status_ = (expr);                                                                          \
    if (frugal_status_ != CUSOLVER_STATUS_SUCCESS) [[unlikely]]                                                        \
      ::frugal::detail::throw_error(__FILE__, __LINE__,                                                                \
                                    ::frugal::detail::str_cat("cuSOLVER error ", int(frugal_status_), " in ", #expr)); \
  } while (0)

namespace frugal::ops::cuda {

namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kBatchedMaxDim = 32;  // gesvdjBatched's limit on m and n

/// This thread's cuSOLVER handle for `device`, bound to its current stream. Handles are
/// never destroyed, as cuBLAS's (Note [cuBLAS handles] in cublas_handle.cu).
cusolverDnHandle_t cusolver_handle(Device device) {
  FRUGAL_CHECK(device.index >= 0 && device.index < kMaxDevices, "svd: unsupported device ", device.str());
  thread_local std::array<cusolverDnHandle_t, kMaxDevices> handles{};
  cusolverDnHandle_t& h = handles[size_t(device.index)];
  if (!h) FRUGAL_CUSOLVER_CHECK(cusolverDnCreate(&h));
  FRUGAL_CUSOLVER_CHECK(cusolverDnSetStream(h, stream_for(device)));
  return h;
}

/// gesvdj's settings object: default tolerance (machine precision) and sweeps, sorted values.
struct JacobiParams {
  gesvdjInfo_t p = nullptr;
  JacobiParams() { FRUGAL_CUSOLVER_CHECK(cusolverDnCreateGesvdjInfo(&p)); }
  ~JacobiParams() { cusolverDnDestroyGesvdjInfo(p); }
  JacobiParams(const JacobiParams&) = delete;
  JacobiParams& operator=(const JacobiParams&) = delete;
};

// float / double overloads of the four solver entry points.
cusolverStatus_t gesvdj_buffer(cusolverDnHandle_t h, int r, int c, const float* A, const float* S, const float* U,
                               int ldu, const float* V, int ldv, int* lwork, gesvdjInfo_t p) {
  return cusolverDnSgesvdj_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, 1, r, c, A, r, S, U, ldu, V, ldv, lwork, p);
}
cusolverStatus_t gesvdj_buffer(cusolverDnHandle_t h, int r, int c, const double* A, const double* S, const double* U,
                               int ldu, const double* V, int ldv, int* lwork, gesvdjInfo_t p) {
  return cusolverDnDgesvdj_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, 1, r, c, A, r, S, U, ldu, V, ldv, lwork, p);
}
cusolverStatus_t gesvdj(cusolverDnHandle_t h, int r, int c, float* A, float* S, float* U, int ldu, float* V, int ldv,
                        float* work, int lwork, int* info, gesvdjInfo_t p) {
  return cusolverDnSgesvdj(h, CUSOLVER_EIG_MODE_VECTOR, 1, r, c, A, r, S, U, ldu, V, ldv, work, lwork, info, p);
}
cusolverStatus_t gesvdj(cusolverDnHandle_t h, int r, int c, double* A, double* S, double* U, int ldu, double* V,
                        int ldv, double* work, int lwork, int* info, gesvdjInfo_t p) {
  return cusolverDnDgesvdj(h, CUSOLVER_EIG_MODE_VECTOR, 1, r, c, A, r, S, U, ldu, V, ldv, work, lwork, info, p);
}
cusolverStatus_t gesvdj_batched_buffer(cusolverDnHandle_t h, int r, int c, const float* A, const float* S,
                                       const float* U, const float* V, int* lwork, gesvdjInfo_t p, int batch) {
  return cusolverDnSgesvdjBatched_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, r, c, A, r, S, U, r, V, c, lwork, p, batch);
}
cusolverStatus_t gesvdj_batched_buffer(cusolverDnHandle_t h, int r, int c, const double* A, const double* S,
                                       const double* U, const double* V, int* lwork, gesvdjInfo_t p, int batch) {
  return cusolverDnDgesvdjBatched_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, r, c, A, r, S, U, r, V, c, lwork, p, batch);
}
cusolverStatus_t gesvdj_batched(cusolverDnHandle_t h, int r, int c, float* A, float* S, float* U, float* V, float* work,
                                int lwork, int* info, gesvdjInfo_t p, int batch) {
  return cusolverDnSgesvdjBatched(h, CUSOLVER_EIG_MODE_VECTOR, r, c, A, r, S, U, r, V, c, work, lwork, info, p, batch);
}
cusolverStatus_t gesvdj_batched(cusolverDnHandle_t h, int r, int c, double* A, double* S, double* U, double* V,
                                double* work, int lwork, int* info, gesvdjInfo_t p, int batch) {
  return cusolverDnDgesvdjBatched(h, CUSOLVER_EIG_MODE_VECTOR, r, c, A, r, S, U, r, V, c, work, lwork, info, p, batch);
}

/// Throws when any matrix's solver reported a failure (Note [gesvdj or gesvdjBatched]).
void check_info(const Tensor& info, int64_t m, int64_t n) {
  const std::vector<int32_t> flags = info.to(kCPU).tolist<int32_t>();
  for (size_t b = 0; b < flags.size(); ++b)
    FRUGAL_CHECK(flags[b] == 0, "svd: cuSOLVER gesvdj failed on matrix ", b, " of the batch (", m, " x ", n,
                 "), info = ", flags[b],
                 flags[b] > 0 ? " (no convergence: is the input finite and not too ill-conditioned?)" : "");
}

template <typename T>
void svd_typed(const Tensor& a, const Tensor& U, const Tensor& S, const Tensor& Vh) {
  const Device dev = a.device();
  const int64_t B = a.size(0), m = a.size(1), n = a.size(2), k = S.size(1);
  FRUGAL_CHECK(m <= INT_MAX && n <= INT_MAX && B <= INT_MAX, "svd: ", a.describe(), " exceeds cuSOLVER's 32-bit sizes");
  const int r = int(n), c = int(m);  // C = A^T is column-major (r, c); Note [Row-major SVD on a column-major solver]
  cusolverDnHandle_t h = cusolver_handle(dev);
  JacobiParams params;
  Tensor work_a = a.clone();  // the solver overwrites its input
  Tensor info = empty({B}, {kInt32, dev});
  int lwork = 0;

  if (B > 1 && m <= kBatchedMaxDim && n <= kBatchedMaxDim) {
    Tensor Uc = empty({B, n, n}, a.options());  // column-major (n, n) per matrix = row-major rows of V^T
    Tensor Vc = empty({B, m, m}, a.options());  // column-major (m, m) per matrix = row-major rows of U^T
    FRUGAL_CUSOLVER_CHECK(gesvdj_batched_buffer(h, r, c, work_a.data_ptr<T>(), S.data_ptr<T>(), Uc.data_ptr<T>(),
                                                Vc.data_ptr<T>(), &lwork, params.p, int(B)));
    Tensor work = empty({std::max(lwork, 1)}, a.options());
    FRUGAL_CUSOLVER_CHECK(gesvdj_batched(h, r, c, work_a.data_ptr<T>(), S.data_ptr<T>(), Uc.data_ptr<T>(),
                                         Vc.data_ptr<T>(), work.data_ptr<T>(), lwork, info.data_ptr<int32_t>(),
                                         params.p, int(B)));
    copy_into(Vh, Uc.narrow(1, 0, k));
    copy_into(U, Vc.narrow(1, 0, k).transpose(1, 2));
  } else {
    Tensor Vc = empty({B, k, m}, a.options());  // column-major (m, k) per matrix = row-major U^T
    FRUGAL_CUSOLVER_CHECK(gesvdj_buffer(h, r, c, work_a.data_ptr<T>(), S.data_ptr<T>(), Vh.data_ptr<T>(), r,
                                        Vc.data_ptr<T>(), c, &lwork, params.p));
    Tensor work = empty({std::max(lwork, 1)}, a.options());
    for (int64_t b = 0; b < B; ++b) {
      h = cusolver_handle(dev);
      FRUGAL_CUSOLVER_CHECK(gesvdj(h, r, c, work_a.data_ptr<T>() + b * m * n, S.data_ptr<T>() + b * k,
                                   Vh.data_ptr<T>() + b * k * n, r, Vc.data_ptr<T>() + b * k * m, c, work.data_ptr<T>(),
                                   lwork, info.data_ptr<int32_t>() + b, params.p));
    }
    copy_into(U, Vc.transpose(1, 2));
  }
  check_info(info, m, n);
}

}  // namespace

void svd_kernel(const Tensor& a, const Tensor& U, const Tensor& S, const Tensor& Vh) {
  DeviceGuard guard(a.device());
  switch (a.dtype()) {
    case DType::Float32: svd_typed<float>(a, U, S, Vh); break;
    case DType::Float64: svd_typed<double>(a, U, S, Vh); break;
    default: throw_unsupported_dtype("svd", a.dtype(), a.device());
  }
}

}  // namespace frugal::ops::cuda
