// ops::svd on CUDA (cuSOLVER gesvdj / gesvdjBatched) against the CPU (Eigen).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "tensor/factory.h"
#include "tensor/ops/svd.h"
#include "tests/svd_check.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// CUDA vs CPU for every matrix of `a` (on CUDA): S equal; U diag(S) Vh equal to A;
/// U and Vh orthonormal and equal to the CPU's up to sign: |U^T U_cpu| = I, |Vh Vh_cpu^T| = I
/// (random matrices have distinct singular values, so only signs may differ).
void check_vs_cpu(const Tensor& a, double tol) {
  const ops::SVDResult g = ops::svd(a);
  const ops::SVDResult c = ops::svd(a.cpu());
  CHECK(g.U.device() == a.device());
  REQUIRE(g.U.sizes() == c.U.sizes());
  REQUIRE(g.S.sizes() == c.S.sizes());
  REQUIRE(g.Vh.sizes() == c.Vh.sizes());
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const std::vector<double> A = values_of(a), U = values_of(g.U), S = values_of(g.S), V = values_of(g.Vh);
  const std::vector<double> Uc = values_of(c.U), Sc = values_of(c.S), Vc = values_of(c.Vh);
  const int64_t B = a.numel() / (m * n);
  for (int64_t b = 0; b < B; ++b) {
    CAPTURE(b);
    const double* pa = A.data() + b * m * n;
    const double *pu = U.data() + b * m * k, *pv = V.data() + b * k * n, *ps = S.data() + b * k;
    const double *qu = Uc.data() + b * m * k, *qv = Vc.data() + b * k * n, *qs = Sc.data() + b * k;
    const double scale = std::max(qs[0], 1e-300);
    check_close(std::vector<double>(ps, ps + k), std::vector<double>(qs, qs + k), 0, tol * scale, "S vs CPU");
    const double rec = svd_reconstruction_error(pa, pu, ps, pv, m, n, k, scale);
    double du = 0, dv = 0;
    for (int64_t p = 0; p < k; ++p)
      for (int64_t q = 0; q < k; ++q) {
        double uu = 0, vv = 0;
        for (int64_t i = 0; i < m; ++i) uu += pu[i * k + p] * qu[i * k + q];
        for (int64_t j = 0; j < n; ++j) vv += pv[p * n + j] * qv[q * n + j];
        du = std::max(du, std::fabs(std::fabs(uu) - (p == q)));
        dv = std::max(dv, std::fabs(std::fabs(vv) - (p == q)));
      }
    CHECK_MESSAGE(rec <= tol, "reconstruction ", rec);
    // Vectors of close singular values are less well determined: allow a conditioning factor.
    CHECK_MESSAGE(du <= 1e3 * tol, "|U^T U_cpu| - I ", du);
    CHECK_MESSAGE(dv <= 1e3 * tol, "|Vh Vh_cpu^T| - I ", dv);
  }
}

}  // namespace

TEST_CASE("svd cuda: gesvdj and gesvdjBatched match the CPU") {
  // (8, 6, 4) and (5, 32, 32) take gesvdjBatched; the others one gesvdj call per matrix.
  for (const Shape& shape : {Shape{5, 3}, Shape{3, 5}, Shape{40, 25}, Shape{25, 40}, Shape{64, 64}, Shape{1, 7},
                             Shape{8, 6, 4}, Shape{5, 32, 32}, Shape{2, 3, 4, 9}, Shape{3, 40, 20}}) {
    for (DType dt : {kFloat32, kFloat64})
      for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
        CAPTURE(shape_str(shape));
        CAPTURE(dtype_name(dt));
        CAPTURE(layout_name(layout));
        check_vs_cpu(random_tensor(shape, {dt, cuda()}, 13, layout), dt == kFloat32 ? 5e-5 : 1e-11);
      }
  }
}

TEST_CASE("svd cuda: empty inputs and errors") {
  const ops::SVDResult e = ops::svd(empty({0, 4, 3}, {kFloat32, cuda()}));
  CHECK(e.U.sizes() == Shape{0, 4, 3});
  CHECK(e.S.sizes() == Shape{0, 3});
  check_error([] { ops::svd(zeros({3, 3}, {kFloat16, cuda()})); }, {"svd", "float16", "cuda"});
}
