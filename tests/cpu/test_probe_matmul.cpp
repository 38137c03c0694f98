// Probes for silent wrong answers in the matrix products on the CPU: matmul over every rank
// combination of torch.matmul (dot to a 0-d result, vector-matrix, matrix-vector, N-D with a
// vector on either side, broadcast batch dims), mm, bmm, linear, gelu_mlp (linear_gelu_tanh)
// and linear_cross_entropy, raw (frugal::ops) and differentiable (frugal), with their
// gradients: size-0 dims everywhere (K = 0 must give zeros and zero gradients), operands that
// are transposed, permuted, narrowed with an offset, stepped by odd strides or expanded with
// stride 0, sizes straddling the CPU kernel's blocking and threading thresholds (kGemmBlockMacs
// in tensor/cpu/gemm.h, Eigen's small-product and GEMV paths), float16/bfloat16 inputs
// that only a float32 accumulation gets right, IEEE NaN/inf propagation (0 * inf = NaN, a NaN
// poisons only its rows), and the refusals of mixed and integer dtypes and of bad shapes.
// The spec is torch.matmul's documented rules (torch.matmul, torch.mm, torch.bmm,
// torch.nn.functional.linear, nn.GELU(approximate='tanh'), F.cross_entropy). Every expected
// value is a float64 loop written here (products and their gradients scattered back through the
// views' strides), a closed form, or central differences in float64 (autograd::gradcheck);
// never frugal's own ops. Where frugal refuses what torch accepts (integer matmul) the probe
// checks that the refusal names the op and the operands (docs/design.md, "Errors").
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/all.h"
#include "autograd/ops/linear_cross_entropy.h"
#include "autograd/ops/matmul.h"
#include "core/threads.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// ---- torch.matmul in float64 loops ---------------------------------------------------------

/// torch's broadcast of two batch shapes (aligned on the right, sizes equal or 1).
Shape broadcast_batch(const Shape& x, const Shape& y) {
  const size_t n = std::max(x.size(), y.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = i < n - x.size() ? 1 : x[i - (n - x.size())];
    const int64_t b = i < n - y.size() ? 1 : y[i - (n - y.size())];
    REQUIRE_MESSAGE((a == b || a == 1 || b == 1), "test bug: batch shapes do not broadcast");
    out[i] = a == 1 ? b : a;
  }
  return out;
}

struct MatmulRef {
  Shape out;                   // torch.matmul's result shape
  std::vector<double> y;       // the product, row-major
  std::vector<double> absy;    // |a| @ |b|: the scale of each element's rounding error
  std::vector<double> ga, gb;  // with a gradient g of `out`: dL/da, dL/db (summed over broadcast dims)
  int64_t K = 0;
};

/// torch.matmul(a, b) for row-major values of shapes as, bs, by its documented rules: a 1-D
/// first operand is a row (1, K), a 1-D second one a column (K, 1), and the added dim is removed
/// from the result; the batch dims broadcast. With g, the gradients scatter every product back.
MatmulRef matmul_ref(const std::vector<double>& a, const Shape& as, const std::vector<double>& b, const Shape& bs,
                     const std::vector<double>* g = nullptr) {
  const Shape a2 = as.size() == 1 ? Shape{1, as[0]} : as;
  const Shape b2 = bs.size() == 1 ? Shape{bs[0], 1} : bs;
  const int64_t M = a2[a2.size() - 2], K = a2.back(), N = b2.back();
  REQUIRE_MESSAGE(b2[b2.size() - 2] == K, "test bug: inner dims differ");
  const Shape ba(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const Shape batch = broadcast_batch(ba, bb);
  MatmulRef r;
  r.K = K;
  r.out = batch;
  if (as.size() > 1) r.out.push_back(M);
  if (bs.size() > 1) r.out.push_back(N);
  const int64_t B = numel_of(batch);
  r.y.assign(size_t(B * M * N), 0.0);
  r.absy.assign(r.y.size(), 0.0);
  if (g) r.ga.assign(a.size(), 0.0), r.gb.assign(b.size(), 0.0);
  for (int64_t i = 0; i < B; ++i) {
    const std::vector<int64_t> idx = unravel(i, batch);
    const int64_t ia = idx.empty() ? 0 : broadcast_index(idx, ba), ib = idx.empty() ? 0 : broadcast_index(idx, bb);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t o = (i * M + m) * N + n;
        double s = 0, sa = 0;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t pa = (ia * M + m) * K + k, pb = (ib * K + k) * N + n;
          s += a[pa] * b[pb];
          sa += std::fabs(a[pa] * b[pb]);
          if (g) r.ga[pa] += (*g)[o] * b[pb], r.gb[pb] += a[pa] * (*g)[o];
        }
        r.y[o] = s, r.absy[o] = sa;
      }
  }
  return r;
}

/// Checks computed values against float64 ones: NaN where NaN, the same inf where inf, and
/// elsewhere |got - want| <= atol + rtol * scale (scale: the sum of |terms| of each element).
void check_ieee(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& scale,
                double rtol, double atol, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": ", got.size(), " values vs ", want.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = got[i], e = want[i];
    const bool ok = std::isnan(e)   ? std::isnan(x)
                    : std::isinf(e) ? x == e
                                    : std::isfinite(x) && std::fabs(x - e) <= atol + rtol * scale[i];
    if (!ok && bad++ == 0) first = int64_t(i);
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " values differ; first at ", first, ": got ",
                first >= 0 ? got[size_t(first)] : 0.0, " expected ", first >= 0 ? want[size_t(first)] : 0.0);
}

/// float64 rounding to a 16-bit float: `p` significand bits, `emin` the frexp exponent of the
/// smallest normal (round to nearest even; subnormals keep fewer bits). Overflow is not modelled.
double round_bits(double x, int p, int emin) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);
  e = std::max(e, emin);
  const double scale = std::ldexp(1.0, p - e);
  return std::nearbyint(x * scale) / scale;
}
double round_to(DType dt, double x) {
  if (dt == kFloat16) return round_bits(x, 11, -13);
  if (dt == kBFloat16) return round_bits(x, 8, -125);
  if (dt == kFloat32) return double(float(x));
  return x;
}
/// The spacing of dt's numbers at |x| (one unit in the last place).
double ulp_of(DType dt, double x) {
  const int p = dt == kFloat16 ? 11 : dt == kBFloat16 ? 8 : dt == kFloat32 ? 24 : 53;
  const int emin = dt == kFloat16 ? -13 : dt == kBFloat16 ? -125 : dt == kFloat32 ? -125 : -1021;
  int e = 0;
  std::frexp(x == 0 ? 1e-300 : x, &e);
  return std::ldexp(1.0, std::max(e, emin) - p);
}

// ---- operands as views ----------------------------------------------------------------------

/// How an operand of a given logical shape lies in memory.
enum class View { Contiguous, Transposed, Reversed, Narrowed, Stepped, ExpandFirst, ExpandLast };
constexpr View kViews[] = {View::Contiguous, View::Transposed,  View::Reversed,  View::Narrowed,
                           View::Stepped,    View::ExpandFirst, View::ExpandLast};
const char* view_name(View v) {
  switch (v) {
    case View::Contiguous: return "contiguous";
    case View::Transposed: return "transposed (last two dims)";
    case View::Reversed: return "permuted (all dims reversed)";
    case View::Narrowed: return "narrowed (offset, ld > cols)";
    case View::Stepped: return "stepped (stride 3 last, 2 elsewhere, offset)";
    case View::ExpandFirst: return "expanded dim 0 (stride 0)";
    default: return "expanded last dim (stride 0)";
  }
}

/// A float64 leaf `base` (contiguous, offset 0, so a storage position is its flat index) and
/// the view of it with the logical shape the op sees.
struct Operand {
  Tensor base, view;
  /// The base's gradient from the view's: every view element scatters its gradient to the
  /// storage position its strides name (expanded elements add up).
  std::vector<double> base_grad(const std::vector<double>& gview) const {
    std::vector<double> out(size_t(base.numel()), 0.0);
    for (int64_t i = 0; i < view.numel(); ++i) {
      const std::vector<int64_t> idx = unravel(i, view.sizes());
      int64_t pos = view.storage_offset();
      for (size_t d = 0; d < idx.size(); ++d) pos += idx[d] * view.stride(int64_t(d));
      out[size_t(pos)] += gview[size_t(i)];
    }
    return out;
  }
};

/// The operand of shape s laid out as v, or an undefined base when v does not apply to s.
Operand make_operand(const Shape& s, View v, uint64_t seed, DType dt = kFloat64, bool grad = true) {
  const int64_t nd = int64_t(s.size());
  Operand o;
  Shape bs = s;
  switch (v) {
    case View::Contiguous: break;
    case View::Transposed:
      if (nd < 2) return o;
      std::swap(bs[size_t(nd - 1)], bs[size_t(nd - 2)]);
      break;
    case View::Reversed:
      if (nd < 3) return o;
      std::reverse(bs.begin(), bs.end());
      break;
    case View::Narrowed:
      bs.back() += 3;
      if (nd >= 2) bs[0] += 1;
      break;
    case View::Stepped:
      for (int64_t d = 0; d < nd; ++d) bs[size_t(d)] = s[size_t(d)] * (d == nd - 1 ? 3 : 2) + 1;
      break;
    case View::ExpandFirst: bs[0] = 1; break;
    case View::ExpandLast: bs.back() = 1; break;
  }
  o.base = random_tensor(bs, dt, seed);
  if (grad) o.base.requires_grad_();
  switch (v) {
    case View::Contiguous: o.view = o.base; break;
    case View::Transposed: o.view = o.base.transpose(-1, -2); break;
    case View::Reversed: {
      std::vector<int64_t> perm;
      for (int64_t d = nd - 1; d >= 0; --d) perm.push_back(d);
      o.view = o.base.permute(perm);
      break;
    }
    case View::Narrowed:
      o.view = o.base.narrow(-1, 2, s.back());
      if (nd >= 2) o.view = o.view.narrow(0, 1, s[0]);
      break;
    case View::Stepped:
      o.view = o.base;
      for (int64_t d = 0; d < nd; ++d) {
        const int64_t step = d == nd - 1 ? 3 : 2;
        o.view = o.view.slice(d, 1, 1 + s[size_t(d)] * step, step);
      }
      break;
    case View::ExpandFirst:
    case View::ExpandLast: o.view = o.base.expand(s); break;
  }
  REQUIRE(o.view.sizes() == s);
  return o;
}

std::string pair_name(const Shape& as, const Shape& bs) { return shape_str(as) + " @ " + shape_str(bs); }

/// Runs raw and differentiable matmul on the two operands (float64) and checks the result's
/// shape and values, and the bases' gradients for a random output gradient, against matmul_ref.
void check_matmul_case(const Operand& a, const Operand& b, uint64_t seed, bool grad_a = true, bool grad_b = true) {
  const Shape as = a.view.sizes(), bs = b.view.sizes();
  const std::vector<double> av = values_of(a.view), bv = values_of(b.view);
  const MatmulRef probe = matmul_ref(av, as, bv, bs);
  const Tensor g = random_tensor(probe.out, kFloat64, seed);
  const std::vector<double> gv = values_of(g);
  const MatmulRef r = matmul_ref(av, as, bv, bs, &gv);

  const Tensor raw = ops::matmul(a.view.detach(), b.view.detach());
  REQUIRE_MESSAGE(raw.sizes() == r.out, "ops::matmul shape ", shape_str(raw.sizes()), " vs torch's ", shape_str(r.out));
  check_ieee(values_of(raw), r.y, r.absy, 1e-14, 1e-300, "ops::matmul values");

  a.base.requires_grad_(grad_a);
  b.base.requires_grad_(grad_b);
  const Tensor y = frugal::matmul(a.view, b.view);
  REQUIRE_MESSAGE(y.sizes() == r.out, "matmul shape ", shape_str(y.sizes()), " vs torch's ", shape_str(r.out));
  check_ieee(values_of(y), r.y, r.absy, 1e-14, 1e-300, "matmul values");
  if (!grad_a && !grad_b) return;
  y.backward(g);
  if (grad_a) {
    REQUIRE(a.base.grad().defined());
    check_close(a.base.grad(), a.base_grad(r.ga), 1e-12, 1e-12, "grad a");
  }
  if (grad_b) {
    REQUIRE(b.base.grad().defined());
    check_close(b.base.grad(), b.base_grad(r.gb), 1e-12, 1e-12, "grad b");
  }
}

/// The same data cut from the graph, for the raw ops (undefined stays undefined): a raw op
/// called on a tensor that requires grad records its internal views, and its as_strided ones
/// throw (see the report of this probe).
Tensor plain(const Tensor& t) { return t.defined() ? t.detach() : t; }

/// Allocates and drops a NaN-filled tensor of n elements, so that a result taken from the
/// allocator's cache without being written shows NaN instead of a lucky zero.
void poison_cache(int64_t n, DType dt = kFloat64) { (void)full({std::max<int64_t>(n, 1)}, kNaN, dt); }

// ---- linear, GELU and cross entropy in float64 loops -----------------------------------------

struct LinearRef {
  std::vector<double> y, absy, gx, gw, gb;
};

/// x (M, K) rows, w (N, K), bias (N) or empty: y = x w^T + b; with g (M, N) the gradients.
LinearRef linear_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& bias,
                     int64_t M, int64_t K, int64_t N, const std::vector<double>* g = nullptr) {
  LinearRef r;
  r.y.assign(size_t(M * N), 0.0), r.absy.assign(size_t(M * N), 0.0);
  r.gx.assign(size_t(M * K), 0.0), r.gw.assign(size_t(N * K), 0.0), r.gb.assign(size_t(N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bias.empty() ? 0.0 : bias[size_t(n)], sa = std::fabs(s);
      for (int64_t k = 0; k < K; ++k) {
        s += x[size_t(m * K + k)] * w[size_t(n * K + k)];
        sa += std::fabs(x[size_t(m * K + k)] * w[size_t(n * K + k)]);
      }
      r.y[size_t(m * N + n)] = s, r.absy[size_t(m * N + n)] = sa;
      if (g) {
        const double gg = (*g)[size_t(m * N + n)];
        r.gb[size_t(n)] += gg;
        for (int64_t k = 0; k < K; ++k) {
          r.gx[size_t(m * K + k)] += gg * w[size_t(n * K + k)];
          r.gw[size_t(n * K + k)] += gg * x[size_t(m * K + k)];
        }
      }
    }
  return r;
}

// nn.GELU(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) and its derivative.
double gelu_tanh_ref(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad_ref(double x) {
  const double c = std::sqrt(2.0 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

const std::vector<double> kNoBias;

}  // namespace

// ---- the cases ----------------------------------------------------------------------------

TEST_CASE("probe matmul: every rank combination of torch.matmul: result shapes, values and gradients") {
  // torch.matmul's rules: 1-D @ 1-D is a dot (0-d result); a 1-D first operand is a prepended
  // row and a 1-D second one an appended column, removed from the result; N-D operands
  // broadcast their batch dims, e.g. (2, 1, 3, 4) @ (5, 4, 2) -> (2, 5, 3, 2).
  struct Case {
    Shape a, b, out;
  };
  const Case cases[] = {
      {{5}, {5}, {}},
      {{1}, {1}, {}},
      {{4}, {4, 3}, {3}},
      {{4}, {4, 1}, {1}},
      {{3, 4}, {4}, {3}},
      {{1, 4}, {4}, {1}},
      {{3, 4}, {4, 2}, {3, 2}},
      {{2, 3, 4}, {4}, {2, 3}},
      {{2, 1, 3, 4}, {4}, {2, 1, 3}},
      {{4}, {2, 4, 3}, {2, 3}},
      {{4}, {3, 2, 4, 5}, {3, 2, 5}},
      {{4}, {2, 4, 1}, {2, 1}},
      {{2, 1, 4}, {4}, {2, 1}},
      {{2, 3, 4}, {4, 5}, {2, 3, 5}},
      {{3, 4}, {2, 4, 5}, {2, 3, 5}},
      {{2, 1, 3, 4}, {5, 4, 2}, {2, 5, 3, 2}},
      {{1, 3, 4}, {2, 4, 5}, {2, 3, 5}},
      {{2, 1, 1, 3, 4}, {3, 1, 4, 2}, {2, 3, 1, 3, 2}},
      {{3, 1, 2, 4}, {1, 5, 4, 3}, {3, 5, 2, 3}},
      {{1, 1, 3, 4}, {4, 2}, {1, 1, 3, 2}},
      {{2, 3, 1, 4}, {2, 3, 4, 1}, {2, 3, 1, 1}},
      {{1, 2, 1, 1, 2, 3, 4}, {2, 1, 2, 1, 4, 1}, {1, 2, 1, 2, 2, 3, 1}},
  };
  int subcases = 0;
  uint64_t seed = 100;
  for (const Case& c : cases) {
    CAPTURE(pair_name(c.a, c.b));
    // Which operands ask for a gradient: both, a only, b only.
    for (int which = 0; which < 3; ++which) {
      const Operand a = make_operand(c.a, View::Contiguous, seed += 3),
                    b = make_operand(c.b, View::Contiguous, seed + 1);
      CHECK(matmul_ref(values_of(a.view), c.a, values_of(b.view), c.b).out == c.out);  // the table is torch's
      check_matmul_case(a, b, seed + 2, which != 2, which != 1);
      ++subcases;
    }
    // A 0-d dot result backpropagates from .backward() with no gradient argument.
    if (c.a.size() == 1 && c.b.size() == 1) {
      const Operand a = make_operand(c.a, View::Contiguous, seed += 3),
                    b = make_operand(c.b, View::Contiguous, seed + 1);
      const Tensor y = frugal::matmul(a.view, b.view);
      CHECK(y.dim() == 0);
      y.backward();
      check_close(a.base.grad(), values_of(b.base), 0, 0, "d(a.b)/da = b");
      check_close(b.base.grad(), values_of(a.base), 0, 0, "d(a.b)/db = a");
    }
  }
  MESSAGE(subcases, " rank combinations x gradient subsets checked against torch's rules and float64 loops");
}

TEST_CASE("probe matmul: size-0 dims: K = 0 gives zeros and zero gradients, M, N or batch 0 give empty results") {
  // A sum over nothing is 0 (torch.matmul of (3, 0) @ (0, 4) is zeros(3, 4)); the result is
  // taken from an allocator cache poisoned with NaN first, so an unwritten result shows.
  const std::pair<Shape, Shape> cases[] = {
      {{0}, {0}},
      {{0}, {0, 5}},
      {{5, 0}, {0}},
      {{3, 0}, {0, 4}},
      {{0, 3}, {3, 4}},
      {{3, 4}, {4, 0}},
      {{0, 3}, {3, 0}},
      {{0}, {0, 0}},
      {{0, 3}, {3}},
      {{3}, {3, 0}},
      {{0, 3, 4}, {4, 5}},
      {{2, 0, 4}, {2, 4, 5}},
      {{2, 3, 0}, {2, 0, 5}},
      {{2, 3, 0}, {0, 5}},
      {{2, 3, 0}, {0}},
      {{0}, {2, 0, 5}},
      {{2, 1, 3, 0}, {5, 0, 2}},
      {{2, 1, 3, 4}, {0, 4, 2}},
      {{0, 1, 3, 4}, {5, 4, 2}},
      {{1, 3, 0}, {4, 0, 2}},
  };
  int subcases = 0;
  uint64_t seed = 400;
  for (const auto& [as, bs] : cases)
    for (View va : {View::Contiguous, View::Transposed})
      for (View vb : {View::Contiguous, View::Transposed}) {
        CAPTURE(pair_name(as, bs));
        CAPTURE(view_name(va));
        CAPTURE(view_name(vb));
        const Operand a = make_operand(as, va, seed += 2), b = make_operand(bs, vb, seed + 1);
        if (!a.base.defined() || !b.base.defined()) continue;
        const MatmulRef r = matmul_ref(values_of(a.view), as, values_of(b.view), bs);
        poison_cache(numel_of(r.out));
        check_matmul_case(a, b, seed + 7);
        ++subcases;
      }
  // Every floating dtype, and mm, bmm, linear and gelu_mlp with an inner size of 0.
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    poison_cache(12, dt);
    check_close(ops::matmul(empty({3, 0}, dt), empty({0, 4}, dt)), std::vector<double>(12, 0.0), 0, 0, "matmul K=0");
    poison_cache(12, dt);
    check_close(ops::mm(empty({3, 0}, dt), empty({0, 4}, dt)), std::vector<double>(12, 0.0), 0, 0, "mm K=0");
    poison_cache(24, dt);
    check_close(ops::bmm(empty({2, 3, 0}, dt), empty({2, 0, 4}, dt)), std::vector<double>(24, 0.0), 0, 0, "bmm K=0");
    poison_cache(6, dt);
    check_close(ops::linear(empty({2, 3, 0}, dt), empty({1, 0}, dt)), std::vector<double>(6, 0.0), 0, 0,
                "linear K=0 without bias");
    if (dt != kFloat64) {
      poison_cache(12, kFloat32);
      check_close(ops::mm(empty({3, 0}, dt), empty({0, 4}, dt), kFloat32), std::vector<double>(12, 0.0), 0, 0,
                  "mm K=0 to float32");
    }
    subcases += 5;
  }
  CHECK(ops::bmm(empty({0, 3, 2}, kFloat32), empty({0, 2, 4}, kFloat32)).sizes() == Shape{0, 3, 4});
  CHECK(ops::linear(empty({0, 3}, kFloat32), empty({4, 3}, kFloat32), zeros({4}, kFloat32)).sizes() == Shape{0, 4});
  CHECK(ops::linear(empty({2, 3}, kFloat32), empty({0, 3}, kFloat32), empty({0}, kFloat32)).sizes() == Shape{2, 0});

  // linear with in_features = 0 through autograd: y is the bias broadcast, grad_x empty,
  // grad_w (N, 0), grad_bias the column sums of g; with no rows, grad_w and grad_bias are zeros.
  for (const auto& [xs, N] : std::vector<std::pair<Shape, int64_t>>{{{3, 0}, 4}, {{2, 3, 0}, 2}, {{0}, 3}}) {
    CAPTURE(shape_str(xs));
    const Tensor x = leaf(xs, 1), w = leaf({N, 0}, 2), bias = leaf({N}, 3);
    Shape ys(xs.begin(), xs.end() - 1);
    ys.push_back(N);
    const Tensor g = random_tensor(ys, kFloat64, 4);
    const int64_t M = numel_of(ys) / N;
    const std::vector<double> bv = values_of(bias), gv = values_of(g);
    const LinearRef r = linear_ref({}, {}, bv, M, 0, N, &gv);
    poison_cache(numel_of(ys));
    const Tensor y = frugal::linear(x, w, bias);
    REQUIRE(y.sizes() == ys);
    check_close(y, r.y, 0, 0, "linear K=0 is the bias");
    y.backward(g);
    CHECK(x.grad().sizes() == xs);
    CHECK(w.grad().sizes() == Shape{N, 0});
    check_close(bias.grad(), r.gb, 1e-14, 1e-14, "grad_bias");
    ++subcases;
  }
  for (const auto& [xs, N] : std::vector<std::pair<Shape, int64_t>>{{{0, 3}, 4}, {{2, 0, 3}, 2}}) {
    CAPTURE(shape_str(xs));
    const Tensor x = leaf(xs, 1), w = leaf({N, 3}, 2), bias = leaf({N}, 3);
    Shape ys(xs.begin(), xs.end() - 1);
    ys.push_back(N);
    poison_cache(N * 3);
    const Tensor y = frugal::linear(x, w, bias);
    CHECK(y.sizes() == ys);
    y.backward(zeros(ys, kFloat64));
    check_close(w.grad(), std::vector<double>(size_t(N * 3), 0.0), 0, 0, "grad_w over no rows");
    check_close(bias.grad(), std::vector<double>(size_t(N), 0.0), 0, 0, "grad_bias over no rows");
    ++subcases;
  }
  // gelu_mlp with in_features = 0: h = gelu(b1), y = h w2^T + b2 on every row.
  {
    const Tensor x = leaf({2, 0}, 5), w1 = leaf({3, 0}, 6), b1 = leaf({3}, 7), w2 = leaf({2, 3}, 8), b2 = leaf({2}, 9);
    const std::vector<double> b1v = values_of(b1), w2v = values_of(w2), b2v = values_of(b2);
    std::vector<double> want;
    for (int m = 0; m < 2; ++m)
      for (int n = 0; n < 2; ++n) {
        double s = b2v[size_t(n)];
        for (int h = 0; h < 3; ++h) s += gelu_tanh_ref(b1v[size_t(h)]) * w2v[size_t(n * 3 + h)];
        want.push_back(s);
      }
    poison_cache(6);
    const Tensor y = frugal::gelu_mlp(x, w1, b1, w2, b2);
    check_close(y, want, 1e-13, 1e-13, "gelu_mlp with in_features 0");
    frugal::sum(y).backward();
    CHECK(w1.grad().sizes() == Shape{3, 0});
    CHECK(x.grad().sizes() == Shape{2, 0});
    ++subcases;
  }
  MESSAGE(subcases, " size-0 cases checked");
}

TEST_CASE(
    "probe matmul: operands as views on both sides: transposed, permuted, narrowed, stepped, expanded (stride 0)") {
  // Note [Matmul operand layout]: a BLAS layout is read in place, anything else copied once;
  // size-1 dims may carry any stride. The gradients reach each base through the view's
  // strides (an expanded operand's gradient sums over the expanded dim).
  const std::pair<Shape, Shape> shapes[] = {
      {{3, 4}, {4, 5}},       {{1, 5}, {5, 3}},          {{4, 1}, {1, 3}},        {{3, 5}, {5, 1}},
      {{2, 3, 4}, {2, 4, 5}}, {{2, 1, 5}, {2, 5, 1}},    {{3, 2, 4}, {4, 3}},     {{4}, {3, 4, 2}},
      {{3, 2, 4}, {4}},       {{2, 1, 3, 4}, {5, 4, 2}}, {{3, 17, 5}, {3, 5, 2}},
  };
  int subcases = 0;
  uint64_t seed = 700;
  for (const auto& [as, bs] : shapes)
    for (View va : kViews)
      for (View vb : kViews) {
        CAPTURE(pair_name(as, bs));
        CAPTURE(view_name(va));
        CAPTURE(view_name(vb));
        const Operand a = make_operand(as, va, seed += 2), b = make_operand(bs, vb, seed + 1);
        if (!a.base.defined() || !b.base.defined()) continue;
        check_matmul_case(a, b, seed + 5);
        ++subcases;
      }
  // The same through bmm and mm (raw ops), where the shapes fit them, in float32.
  int raw = 0;
  for (View va : kViews)
    for (View vb : kViews) {
      CAPTURE(view_name(va));
      CAPTURE(view_name(vb));
      const Operand a3 = make_operand({3, 7, 5}, va, seed += 2, kFloat32, false);
      const Operand b3 = make_operand({3, 5, 6}, vb, seed + 1, kFloat32, false);
      const MatmulRef r3 = matmul_ref(values_of(a3.view), {3, 7, 5}, values_of(b3.view), {3, 5, 6});
      check_ieee(values_of(ops::bmm(a3.view, b3.view)), r3.y, r3.absy, 5 * 6e-8, 0, "bmm float32");
      const Operand a2 = make_operand({7, 5}, va, seed + 3, kFloat32, false);
      const Operand b2 = make_operand({5, 6}, vb, seed + 4, kFloat32, false);
      if (!a2.base.defined() || !b2.base.defined()) continue;
      const MatmulRef r2 = matmul_ref(values_of(a2.view), {7, 5}, values_of(b2.view), {5, 6});
      check_ieee(values_of(ops::mm(a2.view, b2.view)), r2.y, r2.absy, 5 * 6e-8, 0, "mm float32");
      raw += 2;
    }
  // Overlapping and hand-made strides: a sliding window over one buffer (rows overlap), and a
  // matrix whose row stride is smaller than its row (not a BLAS layout: must be copied).
  {
    const Tensor buf = random_tensor({40}, kFloat64, seed + 9);
    const Tensor win = buf.as_strided({6, 5}, {3, 1}, 2);  // rows overlap by 2 elements
    const Tensor colwin = buf.as_strided({5, 6}, {1, 3}, 1);
    const Tensor m = random_tensor({5, 4}, kFloat64, seed + 10);
    const MatmulRef r1 = matmul_ref(values_of(win), {6, 5}, values_of(m), {5, 4});
    check_ieee(values_of(ops::matmul(win, m)), r1.y, r1.absy, 1e-14, 1e-300, "overlapping rows");
    const MatmulRef r2 = matmul_ref(values_of(m.t()), {4, 5}, values_of(colwin), {5, 6});
    check_ieee(values_of(ops::matmul(m.t(), colwin)), r2.y, r2.absy, 1e-14, 1e-300, "overlapping columns");
    const Tensor batched = buf.as_strided({3, 4, 5}, {7, 5, 1}, 0);  // batches overlap
    const MatmulRef r3 = matmul_ref(values_of(batched), {3, 4, 5}, values_of(m), {5, 4});
    check_ieee(values_of(ops::matmul(batched, m)), r3.y, r3.absy, 1e-14, 1e-300, "overlapping batches");
    const MatmulRef r4 = matmul_ref(values_of(m.t()), {4, 5}, values_of(batched.transpose(1, 2)), {3, 5, 4});
    check_ieee(values_of(ops::matmul(m.t(), batched.transpose(1, 2))), r4.y, r4.absy, 1e-14, 1e-300,
               "overlapping batches, second operand");
    raw += 4;
  }
  MESSAGE(subcases, " view pairs through matmul and its gradients, ", raw, " through bmm/mm/overlapping strides");
}

TEST_CASE(
    "probe matmul: sizes straddling Eigen's paths and the blocking/threading thresholds, same bits at 1 and 2 "
    "threads") {
  // tensor/cpu/gemm.cpp: gemm splits one product into clamp(min(dim / 16,
  // MNK / 2^18), 1, 8) blocks of rows (M >= N) or columns; a batch runs one product per thread
  // when B M N K >= 2^18. Eigen itself switches to a coefficient loop for small products and to
  // GEMV for a size-1 side. Each against float64 loops, at 1 and 2 threads with equal bits.
  struct Case {
    Shape a, b;
  };
  std::vector<Case> cases;
  for (int64_t M : {1, 3, 17, 65})
    for (int64_t K : {1, 3, 16, 17, 65})
      for (int64_t N : {1, 3, 17, 65}) cases.push_back({{M, K}, {K, N}});
  for (const Case& c : std::vector<Case>{
           {{129, 65}, {65, 65}},          // 545k MACs: 2 row blocks
           {{65, 65}, {65, 129}},          // 2 column blocks
           {{257, 257}, {257, 33}},        // 8 row blocks of 32 or 33 rows
           {{33, 257}, {257, 257}},        // 8 column blocks
           {{31, 300}, {300, 31}},         // dim / 16 = 1: one block despite 288k MACs
           {{5, 40, 40}, {5, 40, 40}},     // 320k MACs over a batch: one product per thread
           {{3, 33, 65}, {3, 65, 17}},     // below the batch threshold
           {{7, 19, 65}, {65, 47}},        // (B, M, K) @ (K, N): folded into one (133, 65) product
           {{2, 3, 1, 65}, {3, 65, 129}},  // broadcast batch over threads
           {{9, 1, 300}, {9, 300, 100}},   // batched GEMV, 270k MACs
       })
    cases.push_back(c);
  const int threads = get_num_threads();
  int subcases = 0;
  uint64_t seed = 1000;
  for (const Case& c : cases)
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(pair_name(c.a, c.b));
      CAPTURE(dtype_name(dt));
      for (Layout la : {Layout::Contiguous, Layout::Transposed}) {
        const Tensor a = random_tensor(c.a, dt, seed += 2, la), b = random_tensor(c.b, dt, seed + 1);
        const MatmulRef r = matmul_ref(values_of(a), c.a, values_of(b), c.b);
        const double u = dt == kFloat64 ? 1.2e-16 : 6e-8;
        set_num_threads(1);
        const Tensor y1 = ops::matmul(a, b);
        set_num_threads(2);
        const Tensor y2 = ops::matmul(a, b);
        set_num_threads(threads);
        check_ieee(values_of(y2), r.y, r.absy, double(r.K) * u, 0, "matmul");
        CHECK_MESSAGE(bytes_of(y1) == bytes_of(y2), "1 and 2 threads give different bits");
        ++subcases;
      }
    }
  // linear at the same thresholds: the bias is the accumulator's start (linear_kernel).
  for (const auto& [M, K, N] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 65, 17}, {17, 1, 65}, {129, 65, 65}, {65, 65, 129}, {257, 257, 33}, {3, 17, 1}})
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(M);
      CAPTURE(K);
      CAPTURE(N);
      const Tensor x = random_tensor({M, K}, dt, seed += 3), w = random_tensor({N, K}, dt, seed + 1),
                   bias = random_tensor({N}, dt, seed + 2);
      const LinearRef r = linear_ref(values_of(x), values_of(w), values_of(bias), M, K, N);
      set_num_threads(1);
      const Tensor y1 = ops::linear(x, w, bias);
      set_num_threads(2);
      const Tensor y2 = ops::linear(x, w, bias);
      set_num_threads(threads);
      check_ieee(values_of(y2), r.y, r.absy, double(K + 1) * (dt == kFloat64 ? 1.2e-16 : 6e-8), 0, "linear");
      CHECK(bytes_of(y1) == bytes_of(y2));
      ++subcases;
    }
  MESSAGE(subcases, " sized products checked at 1 and 2 threads");
}

TEST_CASE("probe matmul: float16/bfloat16 accumulate in float32 and round once, forward and gradients") {
  // torch's CPU matmul for 16-bit inputs accumulates in float32 (at::opmath_type). Rows of
  // [4096, 1, ..., 1, -4096] against ones sum to K - 2 exactly in float32, but a 16-bit
  // accumulator drops every 1 added to 4096 (its spacing there is 4 or 32); 4096 ones stall a
  // float16 accumulator at 2048 and a bfloat16 one at 256.
  int subcases = 0;
  for (DType dt : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const int64_t K = 40, M = 3, N = 5;
    std::vector<double> av(size_t(M * K), 1.0);
    for (int64_t m = 0; m < M; ++m) av[size_t(m * K)] = 4096, av[size_t(m * K + K - 1)] = -4096;
    const Tensor a = make_tensor(av, {M, K}, dt), b = ones({K, N}, dt);
    const std::vector<double> want(size_t(M * N), double(K - 2));
    check_close(ops::matmul(a, b), want, 0, 0, "matmul cancellation");
    check_close(ops::mm(a, b), want, 0, 0, "mm cancellation");
    check_close(ops::mm(a, b, kFloat32), want, 0, 0, "mm to float32 cancellation");
    check_close(ops::bmm(a.unsqueeze(0).expand({2, M, K}), b.unsqueeze(0).expand({2, K, N})),
                std::vector<double>(size_t(2 * M * N), double(K - 2)), 0, 0, "bmm cancellation");
    check_close(ops::matmul(a.select(0, 1), b), std::vector<double>(size_t(N), double(K - 2)), 0, 0,
                "vector-matrix cancellation");
    check_close(ops::matmul(b.t(), a.select(0, 2)), std::vector<double>(size_t(N), double(K - 2)), 0, 0,
                "matrix-vector cancellation");
    check_close(ops::matmul(a.select(0, 0), ones({K}, dt)), {double(K - 2)}, 0, 0, "dot cancellation");
    check_close(ops::linear(a, b.t(), zeros({N}, dt)), want, 0, 0, "linear cancellation");
    check_close(ops::linear(a, b.t()), want, 0, 0, "linear without bias cancellation");
    check_close(ops::matmul(ones({1, 4096}, dt), ones({4096, 3}, dt)), std::vector<double>(3, 4096.0), 0, 0,
                "4096 ones");
    check_close(ops::linear(ones({2, 4096}, dt), ones({3, 4096}, dt), ones({3}, dt)), std::vector<double>(6, 4097.0), 0,
                ulp_of(dt, 4097.0) / 2, "4096 ones plus a bias");
    subcases += 11;

    // The gradients: y = a @ b with a, b leaves; grad_a = g @ b^T sums over N and grad_b =
    // a^T @ g over M: both given the cancelling pattern.
    const int64_t R = 40;
    std::vector<double> gv(size_t(3 * R), 1.0);
    for (int64_t i = 0; i < 3; ++i) gv[size_t(i * R)] = 4096, gv[size_t(i * R + R - 1)] = -4096;
    {
      const Tensor x = ones({3, 2}, dt), w = ones({2, R}, dt);
      x.requires_grad_(), w.requires_grad_();
      frugal::matmul(x, w).backward(make_tensor(gv, {3, R}, dt));
      check_close(x.grad(), std::vector<double>(6, double(R - 2)), 0, 0, "matmul grad_a = g @ b^T");
    }
    {
      std::vector<double> gcol(size_t(R * 3), 1.0);
      for (int64_t j = 0; j < 3; ++j) gcol[size_t(j)] = 4096, gcol[size_t((R - 1) * 3 + j)] = -4096;
      const Tensor x = ones({R, 2}, dt), w = ones({2, 3}, dt);
      x.requires_grad_(), w.requires_grad_();
      frugal::matmul(x, w).backward(make_tensor(gcol, {R, 3}, dt));
      check_close(w.grad(), std::vector<double>(6, double(R - 2)), 0, 0, "matmul grad_b = a^T @ g");
      // linear: x (R, 2), weight (3, 2): grad_w = g^T @ x sums over the R rows, grad_bias too.
      const Tensor lx = ones({R, 2}, dt), lw = ones({3, 2}, dt), lb = zeros({3}, dt);
      lx.requires_grad_(), lw.requires_grad_(), lb.requires_grad_();
      frugal::linear(lx, lw, lb).backward(make_tensor(gcol, {R, 3}, dt));
      check_close(lw.grad(), std::vector<double>(6, double(R - 2)), 0, 0, "linear grad_w");
      check_close(lb.grad(), std::vector<double>(3, double(R - 2)), 0, 0, "linear grad_bias");
    }
    {
      const Tensor lx = ones({3, 2}, dt), lw = ones({R, 2}, dt);
      lx.requires_grad_(), lw.requires_grad_();
      frugal::linear(lx, lw).backward(make_tensor(gv, {3, R}, dt));
      check_close(lx.grad(), std::vector<double>(6, double(R - 2)), 0, 0, "linear grad_x = g @ w");
    }
    subcases += 5;

    // Random values: the float32-accumulated product of the rounded inputs, rounded once:
    // within one 16-bit ulp of the exact product (the float32 sum's own error is far smaller).
    for (const auto& [as, bs] : std::vector<std::pair<Shape, Shape>>{
             {{9, 300}, {300, 7}}, {{2, 3, 65}, {65, 17}}, {{300}, {300, 5}}, {{4, 1, 33, 129}, {3, 129, 2}}})
      for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Strided}) {
        CAPTURE(pair_name(as, bs));
        CAPTURE(layout_name(l));
        const Tensor x = random_tensor(as, dt, 77, l), y = random_tensor(bs, dt, 78, l);
        const MatmulRef r = matmul_ref(values_of(x), as, values_of(y), bs);
        const std::vector<double> got = values_of(ops::matmul(x, y));
        REQUIRE(got.size() == r.y.size());
        int64_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i)
          if (std::fabs(got[i] - r.y[i]) > ulp_of(dt, r.y[i]) + double(r.K) * 6e-8 * r.absy[i]) ++bad;
        CHECK_MESSAGE(bad == 0, bad, " values off by more than one ulp");
        ++subcases;
      }
  }
  MESSAGE(subcases, " 16-bit accumulation checks");
}

TEST_CASE(
    "probe matmul: mixed dtypes are refused naming the op, shapes and dtypes; integer matmul is refused clearly") {
  // torch refuses mixed dtypes in matmul/mm/bmm/linear ("expected m1 and m2 to have the same
  // dtype"); frugal must too (no silent promotion or reinterpretation of the bits). torch does
  // compute int64 matmul on the CPU; frugal refuses integer products, which is only acceptable
  // with a message that says so (never a silent wrong value).
  const DType floats[] = {kFloat64, kFloat32, kFloat16, kBFloat16};
  int subcases = 0;
  for (DType da : floats)
    for (DType db : floats) {
      if (da == db) continue;
      CAPTURE(dtype_name(da));
      CAPTURE(dtype_name(db));
      const Tensor a = ones({2, 3}, da), b = ones({3, 4}, db);
      const std::string sa = a.describe(), sb = b.describe();
      check_error([&] { ops::matmul(a, b); }, {"matmul", sa, sb});
      check_error([&] { frugal::matmul(a, b); }, {"matmul", sa, sb});
      check_error([&] { ops::mm(a, b); }, {"mm", sa, sb});
      check_error([&] { ops::bmm(a.unsqueeze(0), b.unsqueeze(0)); }, {"bmm", dtype_name(da), dtype_name(db)});
      check_error([&] { ops::linear(a, b.t()); }, {"linear", sa, dtype_name(db)});
      check_error([&] { frugal::linear(a, b.t()); }, {"linear", sa, dtype_name(db)});
      check_error([&] { ops::linear(a, ones({4, 3}, da), ones({4}, db)); }, {"linear", "bias", dtype_name(db)});
      check_error(
          [&] {
            frugal::gelu_mlp(a, ones({5, 3}, da), Tensor(), ones({2, 5}, db), Tensor());
          },
          {"gelu_mlp", dtype_name(db)});
      check_error(
          [&] {
            frugal::gelu_mlp(a, ones({5, 3}, db), Tensor(), ones({2, 5}, da), Tensor());
          },
          {"gelu_mlp", dtype_name(db)});
      subcases += 9;
    }
  for (DType it : {kInt64, kInt32, kBool}) {
    CAPTURE(dtype_name(it));
    const Tensor a = ones({2, 3}, it), b = ones({3, 4}, it);
    const std::string name = dtype_name(it);
    check_error([&] { ops::matmul(a, b); }, {"matmul", "not implemented for " + name});
    check_error([&] { frugal::matmul(a, b); }, {"matmul", "not implemented for " + name});
    check_error([&] { ops::matmul(ones({3}, it), ones({3}, it)); }, {"matmul", name});
    check_error([&] { ops::mm(a, b); }, {"mm", name});
    check_error([&] { ops::bmm(a.unsqueeze(0), b.unsqueeze(0)); }, {"bmm", name});
    check_error([&] { ops::linear(a, b.t()); }, {"linear", name});
    check_error([&] { frugal::linear(a, b.t(), ones({4}, it)); }, {"linear", name});
    // Integer operands with a floating one: still a mixed-dtype refusal.
    check_error([&] { ops::matmul(ones({2, 3}, kFloat32), b); }, {"matmul", name, "float32"});
    subcases += 8;
  }
  // mm's float32 result is only for 16-bit operands.
  check_error([&] { ops::mm(ones({2, 3}, kFloat32), ones({3, 4}, kFloat32), kFloat16); }, {"mm", "float16"});
  check_error([&] { ops::mm(ones({2, 3}, kFloat64), ones({3, 4}, kFloat64), kFloat32); }, {"mm", "float32"});
  subcases += 2;
  MESSAGE(subcases, " dtype refusals checked");
}

TEST_CASE("probe matmul: shape errors name the op and the shapes: inner dims, batch broadcast, bmm, mm, linear, 0-d") {
  const Tensor m23 = ones({2, 3}, kFloat32), m43 = ones({4, 3}, kFloat32), v3 = ones({3}, kFloat32),
               v4 = ones({4}, kFloat32), s = scalar_tensor(1.0, kFloat32);
  int n = 0;
  auto err = [&](auto&& f, std::vector<std::string> parts) {
    check_error(f, parts);
    ++n;
  };
  err([&] { ops::matmul(m23, m43); }, {"matmul", "[2, 3]", "[4, 3]"});
  err([&] { frugal::matmul(m23, m43); }, {"matmul", "[2, 3]", "[4, 3]"});
  // A 1-D operand is named as the caller gave it, not as the (1, K) or (K, 1) matrix the
  // differentiable matmul makes of it (regression: frugal::matmul named float32[1, 3] and
  // float32[4, 1] for (3) @ (4)).
  const std::string d3 = v3.describe(), d4 = v4.describe(), d23 = m23.describe();
  err([&] { ops::matmul(v3, v4); }, {"matmul", d3, d4});
  err([&] { frugal::matmul(v3, v4); }, {"matmul: inner dimensions do not match", d3, d4});
  err([&] { ops::matmul(v4, m23); }, {"matmul", d4, d23});
  err([&] { ops::matmul(m23, v4); }, {"matmul", d23, d4});
  err([&] { frugal::matmul(v4, m23); }, {"matmul: inner dimensions do not match", d4, d23});
  err([&] { frugal::matmul(m23, v4); }, {"matmul: inner dimensions do not match", d23, d4});
  err([&] { frugal::matmul(v3, ones({3, 4}, kFloat64)); }, {"matmul", "same dtype", d3, "float64[3, 4] cpu"});
  err(
      [&] {
        frugal::matmul(ones({2, 4, 3}, kFloat32), ones({3}, kFloat64));
      },
      {"matmul", "same dtype", "float32[2, 4, 3] cpu", "float64[3] cpu"});
  err([&] { ops::matmul(s, v3); }, {"matmul"});
  err([&] { frugal::matmul(s, v3); }, {"matmul"});
  err([&] { frugal::matmul(v3, s); }, {"matmul"});
  err([&] { frugal::matmul(s, s); }, {"matmul"});
  err([&] { ops::matmul(ones({2, 4, 3}, kFloat32), ones({3, 3, 5}, kFloat32)); }, {"matmul", "[2, 4, 3]", "[3, 3, 5]"});
  err([&] { frugal::matmul(ones({2, 4, 3}, kFloat32), ones({3, 3, 5}, kFloat32)); }, {"matmul", "[2, 4, 3]"});
  err([&] { ops::mm(ones({2, 2, 3}, kFloat32), ones({3, 4}, kFloat32)); }, {"mm", "[2, 2, 3]"});
  err([&] { ops::mm(v3, ones({3, 4}, kFloat32)); }, {"mm", "[3]"});
  err([&] { ops::mm(m23, m43); }, {"mm", "[2, 3]", "[4, 3]"});
  err([&] { ops::bmm(m23, ones({3, 4}, kFloat32)); }, {"bmm", "[2, 3]"});
  err([&] { ops::bmm(ones({2, 2, 3}, kFloat32), ones({3, 3, 4}, kFloat32)); }, {"bmm", "[2, 2, 3]", "[3, 3, 4]"});
  err([&] { ops::bmm(ones({1, 2, 3}, kFloat32), ones({3, 3, 4}, kFloat32)); }, {"bmm", "[1, 2, 3]"});  // no broadcast
  err([&] { ops::bmm(ones({2, 2, 3}, kFloat32), ones({2, 4, 4}, kFloat32)); }, {"bmm", "[2, 4, 4]"});
  err([&] { ops::linear(m23, ones({4, 2}, kFloat32)); }, {"linear", "[2, 3]", "[4, 2]"});
  err([&] { frugal::linear(m23, ones({4, 2}, kFloat32)); }, {"linear", "[2, 3]", "[4, 2]"});
  err([&] { ops::linear(m23, v3); }, {"linear", "weight"});
  err([&] { ops::linear(m23, m43, ones({3}, kFloat32)); }, {"linear", "bias", "[3]"});
  err([&] { ops::linear(m23, m43, ones({1, 4}, kFloat32)); }, {"linear", "bias", "[1, 4]"});
  err([&] { ops::linear(s, m43); }, {"linear"});
  err(
      [&] {
        frugal::gelu_mlp(m23, ones({5, 3}, kFloat32), Tensor(), ones({2, 4}, kFloat32), Tensor());
      },
      {"gelu_mlp", "[2, 4]"});
  err(
      [&] {
        frugal::gelu_mlp(m23, ones({5, 3}, kFloat32), ones({4}, kFloat32), ones({2, 5}, kFloat32), Tensor());
      },
      {"gelu_mlp", "bias"});
  err(
      [&] {
        frugal::gelu_mlp(m23, ones({5, 3}, kFloat32), Tensor(), ones({2, 5}, kFloat32), ones({5}, kFloat32));
      },
      {"gelu_mlp", "bias"});
  err([&] { ops::matmul(Tensor(), m23); }, {"matmul"});
  MESSAGE(n, " shape errors checked");
}

TEST_CASE(
    "probe matmul: linear as torch.nn.functional.linear: 1-D to 4-D inputs, bias or none, views of every operand") {
  // F.linear(x, W, b) = x W^T + b over the last dim of x (..., in) -> (..., out); a 1-D x gives
  // a 1-D result. Gradients: grad_x = g W, grad_W = sum over rows g^T x, grad_b = sum of g's rows.
  const Shape xshapes[] = {{5}, {1, 5}, {3, 5}, {2, 3, 5}, {2, 1, 3, 5}, {1}, {4, 1}, {70, 33}};
  int subcases = 0;
  uint64_t seed = 2000;
  for (const Shape& xs : xshapes)
    for (int64_t N : {1, 4})
      for (int bias_kind = 0; bias_kind < 4; ++bias_kind)  // none, contiguous, stepped, expanded from one value
        for (View vx : {View::Contiguous, View::Transposed, View::Stepped, View::ExpandFirst})
          for (View vw : {View::Contiguous, View::Transposed, View::Narrowed, View::ExpandLast}) {
            const int64_t K = xs.back();
            CAPTURE(shape_str(xs));
            CAPTURE(N);
            CAPTURE(bias_kind);
            CAPTURE(view_name(vx));
            CAPTURE(view_name(vw));
            const Operand x = make_operand(xs, vx, seed += 4), w = make_operand({N, K}, vw, seed + 1);
            if (!x.base.defined()) continue;
            Operand b;
            if (bias_kind == 1) b = make_operand({N}, View::Contiguous, seed + 2);
            if (bias_kind == 2) b = make_operand({N}, View::Stepped, seed + 2);
            if (bias_kind == 3) {
              b.base = leaf({1}, seed + 2);
              b.view = b.base.expand({N});
            }
            const int64_t M = x.view.numel() / K;
            Shape ys(xs.begin(), xs.end() - 1);
            ys.push_back(N);
            const Tensor g = random_tensor(ys, kFloat64, seed + 3, Layout::Transposed);
            const std::vector<double> gv = values_of(g), bv = b.view.defined() ? values_of(b.view) : kNoBias;
            const LinearRef r = linear_ref(values_of(x.view), values_of(w.view), bv, M, K, N, &gv);
            const Tensor raw = ops::linear(plain(x.view), plain(w.view), plain(b.view));
            REQUIRE(raw.sizes() == ys);
            check_ieee(values_of(raw), r.y, r.absy, 1e-14, 1e-300, "ops::linear");
            const Tensor y = frugal::linear(x.view, w.view, b.view);
            REQUIRE(y.sizes() == ys);
            check_ieee(values_of(y), r.y, r.absy, 1e-14, 1e-300, "linear");
            y.backward(g);
            check_close(x.base.grad(), x.base_grad(r.gx), 1e-12, 1e-12, "grad_x");
            check_close(w.base.grad(), w.base_grad(r.gw), 1e-12, 1e-12, "grad_w");
            if (b.view.defined()) check_close(b.base.grad(), b.base_grad(r.gb), 1e-12, 1e-12, "grad_bias");
            ++subcases;
          }
  // float32 and 16-bit linear against the loops, with the weight a transposed view.
  for (DType dt : {kFloat32, kFloat16, kBFloat16})
    for (const Shape& xs : {Shape{3, 7, 33}, Shape{33}, Shape{130, 65}}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(shape_str(xs));
      const int64_t K = xs.back(), N = 9, M = numel_of(xs) / K;
      const Tensor x = random_tensor(xs, dt, seed += 3), w = random_tensor({K, N}, dt, seed + 1).t(),
                   b = random_tensor({N}, dt, seed + 2);
      const LinearRef r = linear_ref(values_of(x), values_of(w), values_of(b), M, K, N);
      const std::vector<double> got = values_of(ops::linear(x, w, b));
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (std::fabs(got[i] - r.y[i]) > (dt == kFloat32 ? 0.0 : ulp_of(dt, r.y[i])) + double(K + 1) * 6e-8 * r.absy[i])
          ++bad;
      CHECK_MESSAGE(bad == 0, bad, " of ", got.size(), " values off");
      ++subcases;
    }
  MESSAGE(subcases, " linear cases checked");
}

TEST_CASE("probe matmul: NaN and inf propagate as IEEE: a NaN poisons only its rows, 0 * inf = NaN") {
  // torch (and any BLAS that does not skip zeros) gives NaN for 0 * inf and for inf - inf; a
  // NaN in row m of A makes row m of A @ B NaN and leaves the other rows finite. The float64
  // loop computes exactly that; Eigen's small, GEMV and blocked GEMM paths each get a case.
  struct Case {
    int64_t M, K, N;
  };
  const Case cases[] = {{2, 3, 2}, {1, 17, 9}, {9, 17, 1}, {1, 300, 1}, {7, 40, 5}, {65, 70, 33}, {129, 65, 65}};
  int subcases = 0;
  uint64_t seed = 3000;
  for (const Case& c : cases)
    for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
      for (int kind = 0; kind < 4;
           ++kind) {  // NaN in A, inf in A against a zero, inf in B against a zero, +inf and -inf
        CAPTURE(c.M);
        CAPTURE(c.K);
        CAPTURE(c.N);
        CAPTURE(dtype_name(dt));
        CAPTURE(kind);
        std::vector<double> av = random_values(c.M * c.K, seed += 2, -1, 1),
                            bv = random_values(c.K * c.N, seed + 1, -1, 1);
        for (double& v : av) v = round_to(dt, v);
        for (double& v : bv) v = round_to(dt, v);
        const int64_t m = c.M / 2, k = c.K / 3, n = c.N - 1;
        if (kind == 0) av[size_t(m * c.K + k)] = kNaN;
        if (kind == 1) av[size_t(m * c.K + k)] = kInf, bv[size_t(k * c.N + n)] = 0.0;
        if (kind == 2) bv[size_t(k * c.N + n)] = -kInf, av[size_t(m * c.K + k)] = 0.0;
        if (kind == 3) {
          av[size_t(m * c.K + k)] = kInf, bv[size_t(k * c.N + n)] = 1.0;
          const int64_t k2 = (k + 1) % c.K;
          if (k2 != k) av[size_t(m * c.K + k2)] = -kInf, bv[size_t(k2 * c.N + n)] = 1.0;
        }
        const Tensor a = make_tensor(av, {c.M, c.K}, dt), b = make_tensor(bv, {c.K, c.N}, dt);
        const MatmulRef r = matmul_ref(av, {c.M, c.K}, bv, {c.K, c.N});
        const double tol = dt == kFloat64 ? 1e-14 : dt == kFloat32 ? 1e-5 : dt == kFloat16 ? 2e-3 : 1.6e-2;
        check_ieee(values_of(ops::matmul(a, b)), r.y, r.absy, tol, 0, "matmul");
        check_ieee(values_of(ops::mm(a.t().contiguous().t(), b)), r.y, r.absy, tol, 0, "mm, column-major A");
        check_ieee(values_of(ops::linear(a, b.t().contiguous())), r.y, r.absy, tol, 0, "linear");
        check_ieee(values_of(ops::linear(a, b.t().contiguous(), zeros({c.N}, dt))), r.y, r.absy, tol, 0,
                   "linear with bias");
        check_ieee(
            values_of(
                ops::bmm(a.unsqueeze(0).expand({2, c.M, c.K}), b.unsqueeze(0).expand({2, c.K, c.N})).select(0, 1)),
            r.y, r.absy, tol, 0, "bmm, broadcast batch");
        subcases += 5;
      }
  // Gradients: with B holding an inf, grad_a = g @ B^T is NaN wherever g is 0 against it (0 * inf).
  {
    const Tensor a = leaf({2, 3}, 1), b = make_tensor({1, kInf, 2, 0, 1, 1}, {3, 2}, kFloat64);
    b.requires_grad_();
    frugal::matmul(a, b).backward(make_tensor({0, 1, 1, 1}, {2, 2}, kFloat64));
    // grad_a[0, k] = sum_n g[0, n] b[k, n] = 0 * b[k, 0] + 1 * b[k, 1]: b[0, 1] = inf -> inf.
    const std::vector<double> ga = values_of(a.grad());
    CHECK(std::isinf(ga[0]));
    // grad_a[1, 0] = b[0, 0] + b[0, 1] = inf; no NaN anywhere: 0 * b[0, 0] = 0 is fine.
    CHECK(std::isinf(ga[3]));
    const Tensor a2 = leaf({2, 3}, 1);
    const Tensor b2 = make_tensor({kInf, 1, 2, 0, 1, 1}, {3, 2}, kFloat64);
    frugal::matmul(a2, b2).backward(make_tensor({0, 1, 1, 1}, {2, 2}, kFloat64));
    // grad_a2[0, 0] = 0 * inf + 1 * 1 = NaN (IEEE), grad_a2[1, 0] = inf + 1 = inf.
    const std::vector<double> ga2 = values_of(a2.grad());
    CHECK(std::isnan(ga2[0]));
    CHECK(std::isinf(ga2[3]));
    CHECK(std::isfinite(ga2[1]));
    CHECK(std::isfinite(ga2[4]));
    subcases += 2;
  }
  MESSAGE(subcases, " NaN/inf products checked");
}

TEST_CASE("probe matmul: gradients by central differences: broadcast batch dims, vectors, linear, gelu_mlp") {
  // Independent of the loops above: autograd::gradcheck in float64.
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {{{4}, {4}},
                        {{4}, {4, 3}},
                        {{3, 4}, {4}},
                        {{2, 3, 4}, {4}},
                        {{4}, {2, 4, 3}},
                        {{2, 1, 3, 4}, {5, 4, 2}},
                        {{1, 3, 4}, {2, 4, 2}},
                        {{3, 1, 2}, {2, 1}},
                        {{2, 3, 0}, {0, 2}},
                        {{2, 1, 1, 4}, {1, 3, 4, 1}}};
  int subcases = 0;
  uint64_t seed = 4000;
  for (const Case& c : cases) {
    CAPTURE(pair_name(c.a, c.b));
    check_gradcheck([](const TensorList& in) { return frugal::matmul(in[0], in[1]); },
                    {leaf(c.a, seed += 2), leaf(c.b, seed + 1)});
    // Through views: the transposed and the expanded operand.
    check_gradcheck(
        [&](const TensorList& in) {
          Tensor av = in[0];
          if (c.a.size() >= 2) av = av.transpose(-1, -2).contiguous().transpose(-1, -2);
          return frugal::matmul(av, in[1].expand(c.b));
        },
        {leaf(c.a, seed + 3), leaf(Shape(c.b.size(), 1), seed + 4)});
    subcases += 2;
  }
  for (const Shape& xs : {Shape{4}, Shape{3, 4}, Shape{2, 3, 4}, Shape{2, 1, 2, 4}}) {
    CAPTURE(shape_str(xs));
    check_gradcheck([](const TensorList& in) { return frugal::linear(in[0], in[1], in[2]); },
                    {leaf(xs, seed += 3), leaf({3, 4}, seed + 1), leaf({3}, seed + 2)});
    check_gradcheck([](const TensorList& in) { return frugal::linear(in[0], in[1].t()); },
                    {leaf(xs, seed += 3), leaf({4, 3}, seed + 1)});
    check_gradcheck([](const TensorList& in) { return frugal::gelu_mlp(in[0], in[1], in[2], in[3], in[4]); },
                    {leaf(xs, seed += 5), leaf({5, 4}, seed + 1), leaf({5}, seed + 2), leaf({3, 5}, seed + 3),
                     leaf({3}, seed + 4)});
    check_gradcheck([](const TensorList& in) { return frugal::gelu_mlp(in[0], in[1], Tensor(), in[2], Tensor()); },
                    {leaf(xs, seed += 5), leaf({5, 4}, seed + 1), leaf({3, 5}, seed + 3)});
    subcases += 4;
  }
  // Double use: the same tensor on both sides (its gradient adds both paths).
  check_gradcheck([](const TensorList& in) { return frugal::matmul(in[0], in[0].transpose(-1, -2)); },
                  {leaf({2, 3, 4}, seed + 10)});
  check_gradcheck([](const TensorList& in) { return frugal::matmul(in[0], in[0]); }, {leaf({5}, seed + 11)});
  check_gradcheck([](const TensorList& in) { return frugal::linear(in[0], in[0]); }, {leaf({3, 3}, seed + 12)});
  subcases += 3;
  MESSAGE(subcases, " gradchecks");
}

TEST_CASE("probe matmul: gelu_mlp and linear_gelu_tanh against float64 loops: values and all five gradients") {
  // gelu_mlp(x, w1, b1, w2, b2) = linear(gelu_tanh(linear(x, w1, b1)), w2, b2), with
  // nn.GELU(approximate='tanh'); each bias may be absent; x (..., in).
  int subcases = 0;
  uint64_t seed = 5000;
  for (const Shape& xs : {Shape{4}, Shape{3, 4}, Shape{2, 3, 4}, Shape{1, 17}, Shape{70, 17}})
    for (int biases = 0; biases < 4; ++biases)
      for (View vx : {View::Contiguous, View::Transposed, View::Stepped})
        for (View vw : {View::Contiguous, View::Transposed}) {
          const int64_t K = xs.back(), H = 6, N = 3, M = numel_of(xs) / K;
          CAPTURE(shape_str(xs));
          CAPTURE(biases);
          CAPTURE(view_name(vx));
          CAPTURE(view_name(vw));
          const Operand x = make_operand(xs, vx, seed += 6);
          if (!x.base.defined()) continue;
          const Operand w1 = make_operand({H, K}, vw, seed + 1), w2 = make_operand({N, H}, vw, seed + 2);
          const Tensor b1 = biases & 1 ? leaf({H}, seed + 3) : Tensor(),
                       b2 = biases & 2 ? leaf({N}, seed + 4) : Tensor();
          Shape ys(xs.begin(), xs.end() - 1);
          ys.push_back(N);
          const Tensor g = random_tensor(ys, kFloat64, seed + 5);
          const std::vector<double> xv = values_of(x.view), w1v = values_of(w1.view), w2v = values_of(w2.view),
                                    b1v = b1.defined() ? values_of(b1) : kNoBias,
                                    b2v = b2.defined() ? values_of(b2) : kNoBias, gv = values_of(g);
          const LinearRef fc1 = linear_ref(xv, w1v, b1v, M, K, H);
          std::vector<double> h(fc1.y.size());
          for (size_t i = 0; i < h.size(); ++i) h[i] = gelu_tanh_ref(fc1.y[i]);
          const LinearRef fc2 = linear_ref(h, w2v, b2v, M, H, N, &gv);
          std::vector<double> gpre(h.size());
          for (size_t i = 0; i < h.size(); ++i) gpre[i] = fc2.gx[i] * gelu_tanh_grad_ref(fc1.y[i]);
          const LinearRef back1 = linear_ref(xv, w1v, b1v, M, K, H, &gpre);

          const ops::LinearGelu raw = ops::linear_gelu_tanh(plain(x.view), plain(w1.view), plain(b1));
          Shape hs(xs.begin(), xs.end() - 1);
          hs.push_back(H);
          REQUIRE(raw.pre.sizes() == hs);
          REQUIRE(raw.out.sizes() == hs);
          check_close(raw.pre, fc1.y, 1e-13, 1e-13, "linear_gelu_tanh pre");
          check_close(raw.out, h, 1e-13, 1e-13, "linear_gelu_tanh out");
          const Tensor y = frugal::gelu_mlp(x.view, w1.view, b1, w2.view, b2);
          REQUIRE(y.sizes() == ys);
          check_close(y, fc2.y, 1e-13, 1e-13, "gelu_mlp");
          y.backward(g);
          check_close(x.base.grad(), x.base_grad(back1.gx), 1e-12, 1e-12, "grad_x");
          check_close(w1.base.grad(), w1.base_grad(back1.gw), 1e-12, 1e-12, "grad_w1");
          check_close(w2.base.grad(), w2.base_grad(fc2.gw), 1e-12, 1e-12, "grad_w2");
          if (b1.defined()) check_close(b1.grad(), back1.gb, 1e-12, 1e-12, "grad_b1");
          if (b2.defined()) check_close(b2.grad(), fc2.gb, 1e-12, 1e-12, "grad_b2");
          ++subcases;
        }
  // Only some inputs asking for gradients.
  for (int mask = 1; mask < 32; mask += 3) {
    CAPTURE(mask);
    const Tensor x = random_tensor({3, 4}, kFloat64, 1), w1 = random_tensor({5, 4}, kFloat64, 2),
                 b1 = random_tensor({5}, kFloat64, 3), w2 = random_tensor({2, 5}, kFloat64, 4),
                 b2 = random_tensor({2}, kFloat64, 5);
    const Tensor in[] = {x, w1, b1, w2, b2};
    for (int i = 0; i < 5; ++i)
      if (mask & (1 << i)) in[i].requires_grad_();
    const std::vector<double> xv = values_of(x), w1v = values_of(w1), w2v = values_of(w2), b1v = values_of(b1),
                              b2v = values_of(b2), gv(6, 1.0);
    const LinearRef fc1 = linear_ref(xv, w1v, b1v, 3, 4, 5);
    std::vector<double> h(fc1.y.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = gelu_tanh_ref(fc1.y[i]);
    const LinearRef fc2 = linear_ref(h, w2v, b2v, 3, 5, 2, &gv);
    std::vector<double> gpre(h.size());
    for (size_t i = 0; i < h.size(); ++i) gpre[i] = fc2.gx[i] * gelu_tanh_grad_ref(fc1.y[i]);
    const LinearRef back1 = linear_ref(xv, w1v, b1v, 3, 4, 5, &gpre);
    frugal::sum(frugal::gelu_mlp(x, w1, b1, w2, b2)).backward();
    const std::vector<double>* want[] = {&back1.gx, &back1.gw, &back1.gb, &fc2.gw, &fc2.gb};
    for (int i = 0; i < 5; ++i) {
      CAPTURE(i);
      if (mask & (1 << i)) check_close(in[i].grad(), *want[i], 1e-12, 1e-12, "grad");
      else CHECK(!in[i].grad().defined());
    }
    ++subcases;
  }
  MESSAGE(subcases, " gelu_mlp cases checked");
}

TEST_CASE("probe matmul: linear_cross_entropy equals float64 linear + log-softmax + NLL at every chunk size") {
  // F.cross_entropy(F.linear(x, W, b), t, ignore_index, label_smoothing): per kept row
  // (1 - e) (lse - z_t) + e (lse - mean_c z_c); Mean divides by the kept rows; the logits'
  // gradient is softmax - (1 - e) onehot - e / C.
  int subcases = 0;
  uint64_t seed = 6000;
  struct Case {
    Shape xs;
    int64_t C;
  };
  for (const Case& c : {Case{{7, 5}, 6}, Case{{2, 3, 4}, 3}, Case{{4}, 5}, Case{{9, 3}, 1}})
    for (double eps : {0.0, 0.3})
      for (Reduction red : {Reduction::Mean, Reduction::Sum})
        for (int64_t chunk : {0, 1, 2, 3, 100})
          for (bool with_bias : {false, true})
            for (bool ignore_some : {false, true}) {
              const int64_t H = c.xs.back(), C = c.C, R = numel_of(c.xs) / H;
              CAPTURE(shape_str(c.xs));
              const int red_i = int(red);
              CAPTURE(C);
              CAPTURE(eps);
              CAPTURE(red_i);
              CAPTURE(chunk);
              CAPTURE(with_bias);
              CAPTURE(ignore_some);
              const Tensor x = leaf(c.xs, seed += 4), w = leaf({C, H}, seed + 1);
              const Tensor b = with_bias ? leaf({C}, seed + 2) : Tensor();
              std::vector<int64_t> tv(static_cast<size_t>(R));
              for (int64_t i = 0; i < R; ++i) tv[size_t(i)] = ignore_some && i % 3 == 1 ? -100 : (i * 7 + 1) % C;
              const Shape ts(c.xs.begin(), c.xs.end() - 1);
              const Tensor t = from_vector(tv, ts);
              const std::vector<double> xv = values_of(x), wv = values_of(w), bv = with_bias ? values_of(b) : kNoBias;
              const LinearRef lin = linear_ref(xv, wv, bv, R, H, C);
              double loss = 0;
              int64_t kept = 0;
              std::vector<double> gz(size_t(R * C), 0.0);
              for (int64_t i = 0; i < R; ++i) {
                if (tv[size_t(i)] == -100) continue;
                ++kept;
                const double* z = &lin.y[size_t(i * C)];
                double mx = -kInf, mean = 0;
                for (int64_t j = 0; j < C; ++j) mx = std::max(mx, z[j]), mean += z[j] / double(C);
                double se = 0;
                for (int64_t j = 0; j < C; ++j) se += std::exp(z[j] - mx);
                const double lse = mx + std::log(se);
                loss += (1 - eps) * (lse - z[tv[size_t(i)]]) + eps * (lse - mean);
                for (int64_t j = 0; j < C; ++j)
                  gz[size_t(i * C + j)] =
                      std::exp(z[j] - lse) - (1 - eps) * (j == tv[size_t(i)] ? 1.0 : 0.0) - eps / double(C);
              }
              const double scale = red == Reduction::Mean ? 1.0 / double(kept) : 1.0;
              for (double& v : gz) v *= scale;
              const LinearRef back = linear_ref(xv, wv, bv, R, H, C, &gz);
              LinearCrossEntropyOptions o;
              o.loss.label_smoothing = eps;
              o.loss.reduction = red;
              o.chunk_rows = chunk;
              const Tensor l = linear_cross_entropy(x, w, b, t, o);
              CHECK(l.dim() == 0);
              CHECK(l.item<double>() == doctest::Approx(loss * scale).epsilon(1e-12));
              l.backward();
              check_close(x.grad(), back.gx, 1e-11, 1e-12, "grad_x");
              check_close(w.grad(), back.gw, 1e-11, 1e-12, "grad_w");
              if (with_bias) check_close(b.grad(), back.gb, 1e-11, 1e-12, "grad_b");
              ++subcases;
            }
  MESSAGE(subcases, " linear_cross_entropy cases checked");
}

TEST_CASE(
    "probe matmul: under autocast the products run in 16 bits accumulated in float32; weight gradients stay float32") {
  // torch.autocast runs matmul and linear in the low dtype on inputs rounded to it (float32
  // accumulation, one rounding of the result); the float32 leaves get float32 gradients. frugal
  // documents (Note [Weight gradients in the master dtype]) that linear's weight and input
  // gradients of such casts are its GEMM's float32 accumulator, not rounded to 16 bits, and that
  // the bias gradient and matmul's gradients are rounded to 16 bits once.
  int subcases = 0;
  for (DType dt : {kBFloat16, kFloat16}) {
    CAPTURE(dtype_name(dt));
    const int64_t M = 6, K = 33, N = 5;
    const Tensor x = random_tensor({M, K}, kFloat32, 11), w = random_tensor({N, K}, kFloat32, 12),
                 b = random_tensor({N}, kFloat32, 13);
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_();
    auto rounded = [&](const Tensor& t) {
      std::vector<double> v = values_of(t);
      for (double& e : v) e = round_to(dt, e);
      return v;
    };
    const std::vector<double> xr = rounded(x), wr = rounded(w), br = rounded(b);
    std::vector<double> gv = random_values(M * N, 14);
    for (double& e : gv) e = round_to(dt, e);
    const LinearRef r = linear_ref(xr, wr, br, M, K, N, &gv);
    Tensor y;
    {
      AutocastGuard guard(kCPU, dt);
      y = frugal::linear(x, w, b);
    }
    REQUIRE(y.dtype() == dt);
    const std::vector<double> yv = values_of(y);
    int64_t bad = 0;
    for (size_t i = 0; i < yv.size(); ++i)
      if (std::fabs(yv[i] - r.y[i]) > ulp_of(dt, r.y[i]) + double(K + 1) * 6e-8 * r.absy[i]) ++bad;
    CHECK_MESSAGE(bad == 0, bad, " linear values off by more than one ulp");
    y.backward(make_tensor(gv, {M, N}, dt));
    REQUIRE(w.grad().dtype() == kFloat32);
    REQUIRE(x.grad().dtype() == kFloat32);
    REQUIRE(b.grad().dtype() == kFloat32);
    // |grad| sums of at most M (weight) or N (input) products of values below 2 in magnitude.
    check_close(w.grad(), r.gw, 0, 2e-5, "grad_w in float32, not rounded to 16 bits");
    check_close(x.grad(), r.gx, 0, 2e-5, "grad_x in float32, not rounded to 16 bits");
    const std::vector<double> gb = values_of(b.grad());
    bad = 0;
    for (size_t i = 0; i < gb.size(); ++i)
      if (std::fabs(gb[i] - r.gb[i]) > ulp_of(dt, r.gb[i]) + double(M) * 6e-8 * 2) ++bad;
    CHECK_MESSAGE(bad == 0, bad, " grad_bias values off by more than one ulp");
    ++subcases;

    // matmul with broadcast batch dims: values and both gradients within one 16-bit ulp.
    const Tensor a = random_tensor({2, 1, 3, 17}, kFloat32, 15), c = random_tensor({4, 17, 2}, kFloat32, 16);
    a.requires_grad_(), c.requires_grad_();
    const std::vector<double> ar = rounded(a), cr = rounded(c);
    std::vector<double> g2 = random_values(2 * 4 * 3 * 2, 17);
    for (double& e : g2) e = round_to(dt, e);
    const MatmulRef mr = matmul_ref(ar, {2, 1, 3, 17}, cr, {4, 17, 2}, &g2);
    Tensor z;
    {
      AutocastGuard guard(kCPU, dt);
      z = frugal::matmul(a, c);
    }
    REQUIRE(z.dtype() == dt);
    REQUIRE(z.sizes() == mr.out);
    const std::vector<double> zv = values_of(z);
    bad = 0;
    for (size_t i = 0; i < zv.size(); ++i)
      if (std::fabs(zv[i] - mr.y[i]) > ulp_of(dt, mr.y[i]) + 17 * 6e-8 * mr.absy[i]) ++bad;
    CHECK_MESSAGE(bad == 0, bad, " matmul values off by more than one ulp");
    z.backward(make_tensor(g2, mr.out, dt));
    REQUIRE(a.grad().dtype() == kFloat32);
    REQUIRE(c.grad().dtype() == kFloat32);
    // grad_a sums 4 batches x 2 columns, grad_c 2 batches x 3 rows, each rounded at most twice.
    const std::vector<double> ga = values_of(a.grad()), gc = values_of(c.grad());
    bad = 0;
    for (size_t i = 0; i < ga.size(); ++i)
      if (std::fabs(ga[i] - mr.ga[i]) > 4 * ulp_of(dt, 8.0) * 1.0 + 1e-6) ++bad;
    for (size_t i = 0; i < gc.size(); ++i)
      if (std::fabs(gc[i] - mr.gb[i]) > 4 * ulp_of(dt, 8.0) * 1.0 + 1e-6) ++bad;
    CHECK_MESSAGE(bad == 0, bad, " matmul gradients off");
    ++subcases;
  }
  MESSAGE(subcases, " autocast products checked");
}

// A matrix shared by every batch entry of the other operand (a projection over a batch)
// gets its gradient from one GEMM over the folded batch, as PyTorch's: the bfloat16 weight
// gradient of (3, 70, 515) @ (515, 150) was three products each rounded to bfloat16 and then
// summed (1.7x PyTorch's error; a probe of 2026-12-05). Bit for bit the folded mm here; under
// autocast it comes back float32-accurate as linear's; float64 against per-batch sums; every
// size-0 shape.
TEST_CASE("probe matmul: a matrix shared across a batch gets its gradient from one GEMM over the batch") {
  manual_seed(21);
  for (DType dt : {kBFloat16, kFloat16, kFloat32}) {
    CAPTURE(dtype_name(dt));
    const Tensor a = randn({3, 70, 515}).to(dt).requires_grad_(), b = randn({515, 150}).to(dt).requires_grad_();
    const Tensor g = randn({3, 70, 150}).to(dt);
    frugal::matmul(a, b).backward(g);
    CHECK(values_of(b.grad()) == values_of(ops::mm(a.detach().reshape({210, 515}).t(), g.reshape({210, 150}))));
    const Tensor a2 = randn({70, 515}).to(dt).requires_grad_(), b3 = randn({3, 515, 150}).to(dt).requires_grad_();
    frugal::matmul(a2, b3).backward(g);
    const Tensor g_rows = g.permute({1, 0, 2}).reshape({70, 450});
    const Tensor b_rows = b3.detach().transpose(-1, -2).reshape({450, 515});
    CHECK(values_of(a2.grad()) == values_of(ops::mm(g_rows, b_rows)));
  }
  {  // float64: the folded GEMM is the per-batch sum, batch dims of two levels
    const Tensor a = randn({2, 3, 4, 5}, kFloat64).requires_grad_(), b = randn({5, 6}, kFloat64).requires_grad_();
    const Tensor g = randn({2, 3, 4, 6}, kFloat64);
    frugal::matmul(a, b).backward(g);
    std::vector<double> want(30, 0.0);
    const std::vector<double> av = values_of(a), gv = values_of(g);
    for (int64_t r = 0; r < 24; ++r)
      for (int64_t k = 0; k < 5; ++k)
        for (int64_t n = 0; n < 6; ++n) want[size_t(k * 6 + n)] += av[size_t(r * 5 + k)] * gv[size_t(r * 6 + n)];
    check_close(b.grad(), want, 1e-12, 1e-12, "folded weight gradient");
    const Tensor a2 = randn({4, 5}, kFloat64).requires_grad_(), b4 = randn({2, 3, 5, 6}, kFloat64).requires_grad_();
    frugal::matmul(a2, b4).backward(g);
    check_close(a2.grad(), values_of(ops::sum(ops::matmul(g, b4.detach().transpose(-1, -2)), {0, 1})), 1e-12, 1e-12,
                "folded input gradient");
  }
  {  // under bfloat16 autocast a float32 weight's gradient is float32-accurate
    const Tensor x = randn({3, 70, 515}), w = randn({515, 150}).requires_grad_();
    const Tensor g = randn({3, 70, 150});
    Tensor y;
    {
      AutocastGuard guard(kCPU, kBFloat16);
      y = frugal::matmul(x, w);
    }
    y.backward(g.to(y.dtype()));
    CHECK(w.grad().dtype() == kFloat32);
    const Tensor exact =
        ops::mm(x.to(kBFloat16).to(kFloat64).reshape({210, 515}).t(), g.to(kBFloat16).to(kFloat64).reshape({210, 150}));
    check_close(values_of(w.grad()), values_of(exact), 1e-4, 1e-3, "autocast weight gradient in float32");
  }
  for (const auto& [as, bs] : std::vector<std::pair<Shape, Shape>>{{{0, 4, 5}, {5, 6}},
                                                                   {{3, 0, 5}, {5, 6}},
                                                                   {{3, 4, 0}, {0, 6}},
                                                                   {{3, 4, 5}, {5, 0}},
                                                                   {{4, 5}, {0, 5, 6}},
                                                                   {{0, 5}, {3, 5, 6}},
                                                                   {{4, 0}, {3, 0, 6}},
                                                                   {{4, 5}, {3, 5, 0}}}) {
    CAPTURE(shape_str(as));
    CAPTURE(shape_str(bs));
    const Tensor a = randn(as, kFloat64).requires_grad_(), b = randn(bs, kFloat64).requires_grad_();
    const Tensor y = frugal::matmul(a, b);
    y.backward(zeros(y.sizes(), kFloat64));
    CHECK(a.grad().sizes() == as);
    CHECK(b.grad().sizes() == bs);
  }
}
