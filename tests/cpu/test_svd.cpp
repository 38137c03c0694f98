// ops::svd on the CPU: reconstruction, orthonormality and ordering checked in float64
// loops written here, singular values against Eigen's JacobiSVD in float64.
#include <doctest/doctest.h>

#include <Eigen/SVD>
#include <cmath>
#include <limits>

#include "tensor/factory.h"
#include "tensor/ops/svd.h"
#include "tests/svd_check.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using MatrixXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Singular values of the row-major (m, n) matrix at `a` by Eigen's JacobiSVD in float64.
std::vector<double> jacobi_singular_values(const double* a, int64_t m, int64_t n) {
  const MatrixXd A = Eigen::Map<const MatrixXd>(a, m, n);
  const Eigen::VectorXd s = Eigen::JacobiSVD<MatrixXd>(A).singularValues();
  return std::vector<double>(s.data(), s.data() + s.size());
}

/// Checks every property of U, S, Vh for each matrix of `a` (..., m, n) with naive
/// double loops: shapes, A = U diag(S) Vh, U^T U = I, Vh Vh^T = I, S >= 0 descending
/// and equal to JacobiSVD's. `tol` is relative to the largest singular value.
void check_svd(const Tensor& a, double tol) {
  const ops::SVDResult r = ops::svd(a);
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const Shape batch(a.sizes().begin(), a.sizes().end() - 2);
  auto with = [&](std::initializer_list<int64_t> tail) {
    Shape s = batch;
    s.insert(s.end(), tail);
    return s;
  };
  REQUIRE(r.U.sizes() == with({m, k}));
  REQUIRE(r.S.sizes() == with({k}));
  REQUIRE(r.Vh.sizes() == with({k, n}));
  CHECK(r.U.dtype() == a.dtype());
  const std::vector<double> A = values_of(a), U = values_of(r.U), S = values_of(r.S), V = values_of(r.Vh);
  const int64_t B = numel_of(batch);
  for (int64_t b = 0; b < B; ++b) {
    CAPTURE(b);
    const double* pa = A.data() + b * m * n;
    const double* pu = U.data() + b * m * k;
    const double* ps = S.data() + b * k;
    const double* pv = V.data() + b * k * n;
    const double scale = std::max(ps[0], 1e-300);
    for (int64_t i = 0; i < k; ++i) {
      CHECK(ps[i] >= 0);
      if (i > 0) CHECK(ps[i] <= ps[i - 1]);
    }
    const double worst_rec = svd_reconstruction_error(pa, pu, ps, pv, m, n, k, scale);
    double worst_u = 0, worst_v = 0;
    for (int64_t p = 0; p < k; ++p)
      for (int64_t q = 0; q < k; ++q) {
        double uu = 0, vv = 0;
        for (int64_t i = 0; i < m; ++i) uu += pu[i * k + p] * pu[i * k + q];
        for (int64_t j = 0; j < n; ++j) vv += pv[p * n + j] * pv[q * n + j];
        worst_u = std::max(worst_u, std::fabs(uu - (p == q)));
        worst_v = std::max(worst_v, std::fabs(vv - (p == q)));
      }
    CHECK_MESSAGE(worst_rec <= tol, "reconstruction ", worst_rec);
    CHECK_MESSAGE(worst_u <= tol, "U^T U - I ", worst_u);
    CHECK_MESSAGE(worst_v <= tol, "Vh Vh^T - I ", worst_v);
    const std::vector<double> ref = jacobi_singular_values(pa, m, n);
    check_close(std::vector<double>(ps, ps + k), ref, 0, tol * scale, "singular values vs JacobiSVD");
  }
}

}  // namespace

TEST_CASE("svd: tall, wide, square and batched matrices in float32 and float64") {
  // k <= 16 takes JacobiSVD, above it BDCSVD (Note [Eigen SVD choice]).
  for (const Shape& shape : {Shape{5, 3}, Shape{3, 5}, Shape{4, 4}, Shape{1, 6}, Shape{6, 1}, Shape{40, 25},
                             Shape{25, 40}, Shape{33, 33}, Shape{3, 2, 6, 4}, Shape{2, 30, 20}}) {
    for (DType dt : {kFloat32, kFloat64}) {
      CAPTURE(shape_str(shape));
      CAPTURE(dtype_name(dt));
      check_svd(random_tensor(shape, dt, 11), dt == kFloat32 ? 2e-5 : 1e-12);
    }
  }
}

TEST_CASE("svd: non-contiguous inputs") {
  for (Layout layout : {Layout::Transposed, Layout::Strided}) {
    CAPTURE(layout_name(layout));
    check_svd(random_tensor({2, 7, 19}, kFloat64, 3, layout), 1e-12);
    check_svd(random_tensor({19, 7}, kFloat32, 4, layout), 2e-5);
  }
}

TEST_CASE("svd: rank-deficient matrices have zero trailing singular values") {
  // A = X Y with X (m, r), Y (r, n): rank r, so s_r ... s_{k-1} vanish.
  const int64_t m = 12, n = 20, r = 4;
  const std::vector<double> X = random_values(m * r, 5), Y = random_values(r * n, 6);
  std::vector<double> A(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < r; ++l) A[size_t(i * n + j)] += X[size_t(i * r + l)] * Y[size_t(l * n + j)];
  for (DType dt : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dt));
    const Tensor a = make_tensor(A, {m, n}, dt);
    const double tol = dt == kFloat32 ? 2e-5 : 1e-12;
    check_svd(a, tol);
    const std::vector<double> s = values_of(ops::svd(a).S);
    CHECK(s[r - 1] > 0.1);
    for (int64_t i = r; i < m; ++i) CHECK_MESSAGE(s[size_t(i)] <= tol * s[0], "s[", i, "] = ", s[size_t(i)]);
  }
  // The zero matrix: all singular values 0, U and Vh still orthonormal.
  check_svd(zeros({5, 3}, kFloat64), 1e-12);
}

TEST_CASE("svd: empty inputs give empty factors") {
  const ops::SVDResult a = ops::svd(empty({0, 3}));
  CHECK(a.U.sizes() == Shape{0, 0});
  CHECK(a.S.sizes() == Shape{0});
  CHECK(a.Vh.sizes() == Shape{0, 3});
  const ops::SVDResult b = ops::svd(empty({0, 4, 2}, kFloat64));
  CHECK(b.U.sizes() == Shape{0, 4, 2});
  CHECK(b.S.sizes() == Shape{0, 2});
  CHECK(b.Vh.sizes() == Shape{0, 2, 2});
}

TEST_CASE("svd: errors name the op, the input and the problem") {
  check_error([] { ops::svd(zeros({4})); }, {"svd", "float32[4]", "2 dims"});
  check_error([] { ops::svd(zeros({3, 3}, kFloat16)); }, {"svd", "float16", "float32, float64"});
  check_error([] { ops::svd(zeros({3, 3}, kInt64)); }, {"svd", "int64"});
  check_error([] { ops::svd(Tensor()); }, {"svd", "undefined"});
  const Tensor bad = full({2, 3}, std::numeric_limits<double>::quiet_NaN());
  check_error([&] { ops::svd(bad); }, {"svd", "NaN"});
}
