// The vectorized float32 exact GELU of every x86-64 level this CPU runs (Note [Vectorized GELU]
// in tensor/cpu/gelu_kernel.cpp), forward and backward, against long double erfc/exp: dense
// samples of [-20, 10], every float around the gradient's root and in the far tail, the special
// values unary_apply defines (NaN, +-inf, +-0, denormals, +-1e30), lengths that are not a
// multiple of any vector width (nothing written past the end), and the strided layouts that
// keep the generic path (the same bits as unary_apply).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/threads.h"
#include "tensor/cpu/gelu_kernel.h"
#include "tensor/cpu/gemm.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/unary.h"
#include "tensor/ops/unary_math.h"
#include "tests/cpu_scopes.h"

using namespace frugal;
using namespace frugal::ops::cpu;
using namespace frugal::testing;
using ops::UnaryOp;

namespace {

constexpr long double kInvSqrt2 = 0.707106781186547524400844362104849039L;
constexpr long double kInvSqrt2Pi = 0.398942280401432677939946059934381868L;

long double ref_gelu(float xf) {
  const long double x = xf;
  return x * 0.5L * std::erfc(-x * kInvSqrt2);
}
/// Phi(x) + x phi(x) in long double: its 64-bit significand keeps 35 bits or more where the two
/// terms cancel, at the floats nearest the root x = -0.7518.
long double ref_gelu_grad(float xf) {
  const long double x = xf;
  return 0.5L * std::erfc(-x * kInvSqrt2) + x * kInvSqrt2Pi * std::exp(-0.5L * x * x);
}

/// |got - ref| in units of the float32 ulp at ref (2^-149 below the normal range); NaN only
/// matches NaN, an infinity only itself.
double ulp_error(float got, long double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0.0 : INFINITY;
  if (std::isnan(got)) return INFINITY;
  if (std::isinf(float(ref)) || std::isinf(got)) return got == float(ref) ? 0.0 : INFINITY;
  int e = 0;
  std::frexp(ref, &e);  // |ref| in [2^(e-1), 2^e)
  const long double ulp = std::ldexp(1.0L, std::max(e - 1 - 23, -149));
  return double(std::fabs((long double)got - ref) / ulp);
}

/// The level's kernels called directly on arrays.
void level_gelu(GemmIsa isa, float* y, const float* x, int64_t n) {
  switch (isa) {
    case GemmIsa::X86_64_V4: return v4::gelu_f32(y, x, n);
    case GemmIsa::X86_64_V3: return v3::gelu_f32(y, x, n);
    case GemmIsa::X86_64_V2: return v2::gelu_f32(y, x, n);
  }
}
void level_gelu_backward(GemmIsa isa, float* gi, const float* g, const float* x, int64_t n) {
  switch (isa) {
    case GemmIsa::X86_64_V4: return v4::gelu_backward_f32(gi, g, x, n);
    case GemmIsa::X86_64_V3: return v3::gelu_backward_f32(gi, g, x, n);
    case GemmIsa::X86_64_V2: return v2::gelu_backward_f32(gi, g, x, n);
  }
}

/// The sample points: 1M evenly over [-20, 10], every float in [-0.7522, -0.7514] (the
/// gradient's root), in [-13.4, -13.1] (gelu and its gradient leave the normal range) and in
/// [-1e-3, -9.9e-4], and a run of denormals.
std::vector<float> sample_points() {
  std::vector<float> x;
  const int64_t n = 1000000;
  for (int64_t i = 0; i < n; ++i) x.push_back(float(-20.0 + 30.0 * double(i) / double(n - 1)));
  for (auto [lo, hi] : {std::pair{-0.7522f, -0.7514f}, std::pair{-13.4f, -13.1f}, std::pair{-1e-3f, -9.9e-4f}})
    for (float v = lo; v < hi; v = std::nextafter(v, hi)) x.push_back(v);
  for (uint32_t bits = 1; bits < (1u << 23); bits += bits / 8 + 1) {  // denormals
    x.push_back(std::bit_cast<float>(bits));
    x.push_back(-std::bit_cast<float>(bits));
  }
  return x;
}

std::vector<float> to_vector(const Tensor& t) {
  const Tensor c = t.contiguous();
  const float* p = c.data_ptr<float>();
  return std::vector<float>(p, p + c.numel());
}

bool same_bits_or_nan(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

}  // namespace

TEST_CASE("gelu simd: forward and backward within 1 ulp of long double at every level") {
  const std::vector<float> x = sample_points();
  const int64_t n = int64_t(x.size());
  std::vector<long double> ref_f(x.size()), ref_b(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ref_f[i] = ref_gelu(x[i]);
    ref_b[i] = ref_gelu_grad(x[i]);
  }
  // Random upstream gradients for a second backward pass: g (Phi + x phi) is rounded once.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> g(x.size());
  for (float& v : g) v = u(rng);
  const std::vector<float> ones(x.size(), 1.0f);
  int levels = 0;
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    ++levels;
    LevelScope scope(isa);
    // Through the op (contiguous float32: the level's kernel, on cpu_map's chunks).
    const Tensor xt = from_vector<float>(x, {n});
    const std::vector<float> y = to_vector(ops::unary(UnaryOp::Gelu, xt));
    const std::vector<float> d = to_vector(ops::unary_backward(UnaryOp::Gelu, from_vector<float>(ones, {n}), xt));
    const std::vector<float> dg = to_vector(ops::unary_backward(UnaryOp::Gelu, from_vector<float>(g, {n}), xt));
    double worst_f = 0, worst_b = 0, worst_g = 0;
    float at_f = 0, at_b = 0, at_g = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (double e = ulp_error(y[i], ref_f[i]); e > worst_f) worst_f = e, at_f = x[i];
      if (double e = ulp_error(d[i], ref_b[i]); e > worst_b) worst_b = e, at_b = x[i];
      if (double e = ulp_error(dg[i], (long double)g[i] * ref_b[i]); e > worst_g) worst_g = e, at_g = x[i];
    }
    MESSAGE(gemm_isa_name(isa), ": gelu max ", worst_f, " ulp (x = ", at_f, "), gradient max ", worst_b,
            " ulp (x = ", at_b, "), g * gradient max ", worst_g, " ulp (x = ", at_g, ")");
    CHECK(worst_f <= 1.0);
    CHECK(worst_b <= 1.0);
    CHECK(worst_g <= 1.0);
  }
  CHECK(levels >= 1);
}

TEST_CASE("gelu simd: special values as unary_apply gives them, at every level") {
  const float inf = INFINITY, nan = NAN;
  const std::vector<float> x = {
      nan,   -nan,   inf,     -inf,     0.0f,  -0.0f,  2.8e-45f, -2.8e-45f, 1e-40f, -1e-40f, 1.17549435e-38f,
      1e30f, -1e30f, 3.4e38f, -3.4e38f, 20.0f, -20.0f, 200.0f,   -200.0f};
  // What the generic path (unary_apply / unary_grad in float) gives.
  const ops::UnaryFn<float, UnaryOp::Gelu> generic{0.0f, 0.0f};
  const ops::UnaryBackwardFn<float, UnaryOp::Gelu> generic_grad{0.0f, 0.0f};
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    std::vector<float> y(x.size()), d(x.size()), dn(x.size());
    const std::vector<float> one(x.size(), 1.0f), minus_two(x.size(), -2.0f);
    level_gelu(isa, y.data(), x.data(), int64_t(x.size()));
    level_gelu_backward(isa, d.data(), one.data(), x.data(), int64_t(x.size()));
    level_gelu_backward(isa, dn.data(), minus_two.data(), x.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      CAPTURE(x[i]);
      CHECK(same_bits_or_nan(y[i], generic(x[i])));
      CHECK(same_bits_or_nan(d[i], generic_grad(1.0f, x[i])));
      CHECK(same_bits_or_nan(dn[i], generic_grad(-2.0f, x[i])));
    }
    // Spelled out: gelu(-inf) = -inf * 0 = NaN, gelu(-0) = -0; the gradient is NaN at +-inf.
    CHECK(std::isnan(y[3]));
    CHECK((y[5] == 0.0f && std::signbit(y[5])));
    CHECK(y[2] == inf);
    CHECK((std::isnan(d[2]) && std::isnan(d[3])));
    CHECK((d[11] == 1.0f && d[12] == 0.0f && !std::signbit(d[12])));
  }
}

TEST_CASE("gelu simd: any length, nothing written past the end") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-8.0f, 5.0f);
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    for (int64_t n : {0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 1000, 4099}) {
      CAPTURE(n);
      std::vector<float> x(size_t(n) + 1), g(size_t(n) + 1), y(size_t(n) + 40, -123.0f), d(size_t(n) + 40, -123.0f);
      for (float& v : x) v = u(rng);
      for (float& v : g) v = u(rng);
      // Misaligned by one element, so the kernels' peel and remainder both run.
      level_gelu(isa, y.data() + 1, x.data() + 1, n);
      level_gelu_backward(isa, d.data() + 1, g.data() + 1, x.data() + 1, n);
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        bad += ulp_error(y[size_t(i) + 1], ref_gelu(x[size_t(i) + 1])) > 1.0;
        bad += ulp_error(d[size_t(i) + 1], (long double)g[size_t(i) + 1] * ref_gelu_grad(x[size_t(i) + 1])) > 1.0;
      }
      CHECK(bad == 0);
      CHECK((y[0] == -123.0f && d[0] == -123.0f));
      for (size_t i = size_t(n) + 1; i < y.size(); ++i) CHECK((y[i] == -123.0f && d[i] == -123.0f));
    }
  }
}

TEST_CASE("gelu simd: strided float32 keeps the generic path; threads do not change the bits") {
  const int64_t rows = 300, cols = 257;  // 77100 elements: cpu_map threads them
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-7.0f, 4.0f);
  std::vector<float> xs(size_t(rows * cols)), gs(size_t(rows * cols));
  for (float& v : xs) v = u(rng);
  for (float& v : gs) v = u(rng);
  const Tensor x = from_vector<float>(xs, {rows, cols}), g = from_vector<float>(gs, {rows, cols});
  const ops::UnaryFn<float, UnaryOp::Gelu> generic{0.0f, 0.0f};
  const ops::UnaryBackwardFn<float, UnaryOp::Gelu> generic_grad{0.0f, 0.0f};
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    LevelScope scope(isa);
    // Transposed (inner stride 257) and narrowed (rows with a gap): not dense, so unary_apply.
    for (const Tensor& view : {x.t(), x.narrow(1, 3, 200)}) {
      const Tensor gv = view.sizes() == x.t().sizes() ? g.t() : g.narrow(1, 3, 200);
      const std::vector<float> xv = to_vector(view), gvv = to_vector(gv);
      const std::vector<float> y = to_vector(ops::unary(UnaryOp::Gelu, view));
      const std::vector<float> d = to_vector(ops::unary_backward(UnaryOp::Gelu, gv, view));
      int differ = 0, far = 0;
      for (size_t i = 0; i < xv.size(); ++i) {
        differ += !same_bits_or_nan(y[i], generic(xv[i]));
        differ += !same_bits_or_nan(d[i], generic_grad(gvv[i], xv[i]));
        far += ulp_error(y[i], ref_gelu(xv[i])) > 256;  // the generic path's own error (glibc erfcf)
      }
      CHECK(differ == 0);
      CHECK(far == 0);
    }
    // Dense: the same bits at 1 and 2 threads.
    std::vector<float> y1, y2, d1, d2;
    {
      ThreadScope t(1);
      y1 = to_vector(ops::unary(UnaryOp::Gelu, x));
      d1 = to_vector(ops::unary_backward(UnaryOp::Gelu, g, x));
    }
    {
      ThreadScope t(2);
      y2 = to_vector(ops::unary(UnaryOp::Gelu, x));
      d2 = to_vector(ops::unary_backward(UnaryOp::Gelu, g, x));
    }
    CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)) == 0);
  }
}

// float16 and bfloat16 GELU go through the float32 kernel a chunk of 4096 at a time
// (tensor/cpu/via_float32.h): bit for bit the float32 GELU of the widened values, rounded once,
// across chunk boundaries and in every level; a strided 16-bit tensor keeps the generic loops,
// which agree within one 16-bit ulp.
TEST_CASE("gelu simd: float16 and bfloat16 through the float32 kernel, rounded once") {
  for (DType dt : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const Tensor x = ops::mul(randn({4096 * 2 + 37}), 3.0).to(dt), g = randn({4096 * 2 + 37}).to(dt);
    for (GemmIsa isa : kLevels) {
      if (!cpu_supports(isa)) continue;
      LevelScope level(isa);
      CHECK(ops::unary(ops::UnaryOp::Gelu, x).to(kFloat32).tolist<float>() ==
            ops::unary(ops::UnaryOp::Gelu, x.to(kFloat32)).to(dt).to(kFloat32).tolist<float>());
      CHECK(
          ops::unary_backward(ops::UnaryOp::Gelu, g, x).to(kFloat32).tolist<float>() ==
          ops::unary_backward(ops::UnaryOp::Gelu, g.to(kFloat32), x.to(kFloat32)).to(dt).to(kFloat32).tolist<float>());
    }
    const Tensor strided = x.narrow(0, 0, 4096).view({64, 64}).t();  // the generic loops
    const std::vector<float> generic =
        ops::unary(ops::UnaryOp::Gelu, strided).contiguous().to(kFloat32).tolist<float>();
    const std::vector<float> dense = ops::unary(ops::UnaryOp::Gelu, strided.contiguous()).to(kFloat32).tolist<float>();
    int off = 0;
    const double ulp = dt == kFloat16 ? 0x1p-10 : 0x1p-7;
    for (size_t i = 0; i < dense.size(); ++i)
      off += std::abs(double(dense[i]) - double(generic[i])) > ulp * std::max(std::abs(double(generic[i])), 0x1p-14);
    CHECK(off == 0);
  }
}
