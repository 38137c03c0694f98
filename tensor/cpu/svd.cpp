// CPU SVD on Eigen.
//
// Note [Eigen SVD choice]
// JacobiSVD (one-sided Jacobi after a QR preconditioner) is the most accurate of
// Eigen's SVDs and fast for small matrices; BDCSVD (bidiagonalisation, then divide
// and conquer) is the fast one for large matrices and as accurate in practice. Eigen's
// BDCSVD itself switches to Jacobi below 16 columns; the switch is made explicit here
// on k = min(m, n) so the choice is visible. Both return singular values in
// decreasing order. A batch runs one matrix per OpenMP thread.
// Eigen 3.4's triangular matrix-vector product (inside the SVDs' QR) trips GCC's
// -Wmaybe-uninitialized on a variable it does initialise; the warning is Eigen's, not ours.
// The SVDs' products never thread inside Eigen (Note [Eigen runs single-threaded] in
// tensor/cpu/gemm.h): a batch threads over its matrices instead.
#define EIGEN_DONT_PARALLELIZE
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/SVD>
#pragma GCC diagnostic pop

#include <exception>

#include "tensor/dispatch.h"
#include "tensor/ops/svd.h"

namespace frugal::ops::cpu {

namespace {

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

constexpr int64_t kJacobiMaxK = 16;

template <typename T, typename Solver>
void store(const Solver& solver, T* u, T* s, T* vh, int64_t m, int64_t n, int64_t k) {
  Eigen::Map<RowMatrix<T>>(u, m, k) = solver.matrixU();
  Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>(s, k) = solver.singularValues();
  Eigen::Map<RowMatrix<T>>(vh, k, n) = solver.matrixV().transpose();
}

// a: (m, n) row-major; u: (m, k); s: (k); vh: (k, n)
template <typename T>
void svd_one(const T* a, T* u, T* s, T* vh, int64_t m, int64_t n) {
  const int64_t k = std::min(m, n);
  const Matrix<T> A = Eigen::Map<const RowMatrix<T>>(a, m, n);
  FRUGAL_CHECK(A.allFinite(), "svd: input (", m, ", ", n, ") contains NaN or Inf");
  constexpr unsigned thin = Eigen::ComputeThinU | Eigen::ComputeThinV;
  if (k <= kJacobiMaxK) store(Eigen::JacobiSVD<Matrix<T>>(A, thin), u, s, vh, m, n, k);
  else store(Eigen::BDCSVD<Matrix<T>>(A, thin), u, s, vh, m, n, k);
}

}  // namespace

void svd_kernel(const Tensor& a, const Tensor& U, const Tensor& S, const Tensor& Vh) {
  const int64_t B = a.size(0), m = a.size(1), n = a.size(2), k = S.size(1);
  auto run = [&]<typename T>() {
    const T* pa = a.data_ptr<T>();
    T *pu = U.data_ptr<T>(), *ps = S.data_ptr<T>(), *pv = Vh.data_ptr<T>();
    // Exceptions must not leave an OpenMP region: the first error is kept and rethrown.
    std::exception_ptr error;
#pragma omp parallel for schedule(dynamic) if (B > 1)
    for (int64_t b = 0; b < B; ++b) {
      try {
        svd_one<T>(pa + b * m * n, pu + b * m * k, ps + b * k, pv + b * k * n, m, n);
      } catch (...) {
#pragma omp critical
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  };
  switch (a.dtype()) {
    case DType::Float32: run.operator()<float>(); break;
    case DType::Float64: run.operator()<double>(); break;
    default: throw_unsupported_dtype("svd", a.dtype(), a.device());
  }
}

}  // namespace frugal::ops::cpu
