// Probes for silent wrong answers in the reductions on the CPU (tensor/ops/reduce.h and the
// differentiable autograd/ops/reduce.h): NaN propagation per output (sum/mean/var give NaN,
// amax/amin/max/min/argmax/argmin pick the first NaN) without leaking into other rows, short
// and long rows alike (8-lane folds, chunked long rows, chunked columns); +/-inf (inf - inf is
// NaN, an all -inf max is -inf, not the identity); ties and signed zeros (the first index of
// the extreme, torch.max's "the indices of the first maximal value are returned"); var's
// correction including N <= correction (NaN or inf, as torch.var) and large offsets; dims
// lists (negative, unsorted, repeated, empty meaning all, keepdim) on raw and autograd ops;
// size-0 and 0-d inputs; integer and bool dtypes (int64 sums, exact past 2^53, wrapping on
// overflow; mean and var refuse integers; max of int64 exact past 2^53); float16/bfloat16
// accumulating wider than their own type; 1e6-element rows against a float64 reference;
// gradients of sum/mean (broadcast back), amax/amin (shared among ties, thousands of float16
// ties included: Note [Tie counts in float32]) vs max/min (the returned index only), and var;
// in-place changes of what a reduction saved. Views and thread counts are left to
// test_probe_views.cpp and test_probe_determinism.cpp. Every expectation is a float64 (long double for sums)
// loop written here, a closed form, or torch's documented rule, named where used.
// frugal has no std, logsumexp, norm or cumulative reductions, so none are probed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/reduce.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

constexpr DType kFloats[] = {kFloat64, kFloat32, kFloat16, kBFloat16};

/// The outputs of a reduction of a row-major `shape` over `dims` (empty: all; negative from
/// the end), each with its elements in row-major order of the reduced dims, and the
/// linear input index of each element.
struct Groups {
  Shape out_shape;
  std::vector<std::vector<double>> values;
  std::vector<std::vector<int64_t>> where;
};
Groups groups_of(const std::vector<double>& v, const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t nd = int64_t(shape.size());
  std::vector<bool> mask(size_t(nd), dims.empty());
  for (int64_t d : dims)
    if (nd > 0) mask[size_t(d < 0 ? d + nd : d)] = true;
  Groups g;
  int64_t outs = 1;
  for (int64_t d = 0; d < nd; ++d) {
    if (!mask[size_t(d)]) g.out_shape.push_back(shape[size_t(d)]), outs *= shape[size_t(d)];
    else if (keepdim) g.out_shape.push_back(1);
  }
  g.values.resize(size_t(outs));
  g.where.resize(size_t(outs));
  for (int64_t i = 0; i < int64_t(v.size()); ++i) {
    const std::vector<int64_t> idx = unravel(i, shape);
    int64_t o = 0;
    for (int64_t d = 0; d < nd; ++d)
      if (!mask[size_t(d)]) o = o * shape[size_t(d)] + idx[size_t(d)];
    g.values[size_t(o)].push_back(v[size_t(i)]);
    g.where[size_t(o)].push_back(i);
  }
  return g;
}

double ref_sum(const std::vector<double>& xs) {
  long double s = 0;
  for (double x : xs) s += x;
  return double(s);
}
double ref_mean(const std::vector<double>& xs) { return ref_sum(xs) / double(xs.size()); }
/// torch.var: sum((x - mean)^2) / max(0, N - correction), two passes in long double.
double ref_var(const std::vector<double>& xs, int64_t correction) {
  const long double m = ref_sum(xs) / (long double)(xs.size());
  long double q = 0;
  for (double x : xs) q += (x - m) * (x - m);
  return double(q) / double(std::max<int64_t>(0, int64_t(xs.size()) - correction));
}
/// torch.max(dim)/argmax: the first NaN, else the first occurrence of the extreme.
int64_t ref_arg(const std::vector<double>& xs, bool is_max) {
  int64_t best = 0;
  for (int64_t i = 0; i < int64_t(xs.size()); ++i) {
    if (std::isnan(xs[size_t(i)])) return i;
    if (is_max ? xs[size_t(i)] > xs[size_t(best)] : xs[size_t(i)] < xs[size_t(best)]) best = i;
  }
  return best;
}

enum class Op { Sum, Mean, Max, Min, Var0, Var1, Var2 };
std::vector<double> ref_reduce(const Groups& g, Op op) {
  std::vector<double> out;
  for (const auto& xs : g.values) {
    switch (op) {
      case Op::Sum: out.push_back(ref_sum(xs)); break;
      case Op::Mean: out.push_back(ref_mean(xs)); break;
      case Op::Max: out.push_back(xs[size_t(ref_arg(xs, true))]); break;
      case Op::Min: out.push_back(xs[size_t(ref_arg(xs, false))]); break;
      case Op::Var0: out.push_back(ref_var(xs, 0)); break;
      case Op::Var1: out.push_back(ref_var(xs, 1)); break;
      case Op::Var2: out.push_back(ref_var(xs, 2)); break;
    }
  }
  return out;
}

std::vector<int64_t> ref_args(const Groups& g, bool is_max) {
  std::vector<int64_t> out;
  for (const auto& xs : g.values) out.push_back(ref_arg(xs, is_max));
  return out;
}

/// Values rounded to `dt` (what a tensor of that dtype stores), as float64.
std::vector<double> stored(const std::vector<double>& v, DType dt) {
  return values_of(from_vector(v, {int64_t(v.size())}, TensorOptions(dt)));
}

/// A (rows, R) tensor reduced along dim 1 (row layout) or an (R, rows) one reduced along
/// dim 0 (column layout), built from row-major (rows, R) values.
struct Lined {
  Tensor x;
  int64_t dim;
};
Lined lined(const std::vector<double>& rowmajor, int64_t rows, int64_t R, DType dt, bool columns) {
  if (!columns) return {make_tensor(rowmajor, {rows, R}, dt), 1};
  std::vector<double> t(rowmajor.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < R; ++k) t[size_t(k * rows + r)] = rowmajor[size_t(r * R + k)];
  return {make_tensor(t, {R, rows}, dt), 0};
}

std::vector<std::vector<double>> split_rows(const std::vector<double>& v, int64_t rows, int64_t R) {
  std::vector<std::vector<double>> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) out[size_t(r)].assign(v.begin() + r * R, v.begin() + (r + 1) * R);
  return out;
}

/// The float64 references of every row: sum, mean, var (with `correction`), max, min and
/// the first index of each extreme.
struct RowRefs {
  std::vector<double> sum, mean, var, mx, mn;
  std::vector<int64_t> amx, amn;
};
RowRefs row_refs(const std::vector<std::vector<double>>& rows, int64_t correction) {
  RowRefs r;
  for (const auto& row : rows) {
    r.sum.push_back(ref_sum(row)), r.mean.push_back(ref_mean(row)), r.var.push_back(ref_var(row, correction));
    r.amx.push_back(ref_arg(row, true)), r.amn.push_back(ref_arg(row, false));
    r.mx.push_back(row[size_t(r.amx.back())]), r.mn.push_back(row[size_t(r.amn.back())]);
  }
  return r;
}

// Row lengths that reach every path of tensor/cpu/reduce.cpp: fewer than the 8 lanes, a
// lane multiple, one over, odd, and past 2 * kRowChunk (65536), where rows are chunked.
constexpr int64_t kLengths[] = {1, 2, 7, 8, 9, 33, 1000, 70001};

}  // namespace

// ---------------------------------------------------------------------------------------
// NaN and infinities
// ---------------------------------------------------------------------------------------

TEST_CASE("probe reduce: a NaN poisons its own output of every reduction and no other") {
  int64_t cases = 0;
  for (DType dt : kFloats) {
    for (int64_t R : kLengths) {
      if (R > 1000 && (dt == kFloat16 || dt == kBFloat16)) continue;  // values stay in range below
      for (int64_t p : {int64_t(0), R / 2, R - 1}) {
        for (bool columns : {false, true}) {
          const int64_t rows = 4;
          std::vector<double> v = random_values(rows * R, uint64_t(R * 7 + p), -2.0, 2.0);
          v[size_t(1 * R + p)] = kNaN;  // row 1: a NaN at p, and another after it
          if (p + 3 < R) v[size_t(1 * R + p + 3)] = kNaN;
          v[size_t(3 * R + R - 1)] = kInf;  // row 3: +inf last (amax must not take it over a NaN elsewhere)
          v = stored(v, dt);
          const Lined l = lined(v, rows, R, dt, columns);
          CAPTURE(dtype_name(dt));
          CAPTURE(R);
          CAPTURE(p);
          CAPTURE(columns);
          const auto rs = split_rows(v, rows, R);
          const auto [sum, mean, var, mx, mn, amx, amn] = row_refs(rs, 1);
          REQUIRE(std::isnan(sum[1]));
          REQUIRE(amx[1] == p);
          const double tol = default_rtol(dt);
          check_close(ops::sum(l.x, {l.dim}), sum, tol, 1e-6, "sum");
          check_close(ops::mean(l.x, {l.dim}), mean, tol, 1e-6, "mean");
          check_close(ops::var(l.x, {l.dim}), var, 10 * tol, 1e-6, "var");
          check_close(ops::amax(l.x, {l.dim}), mx, 0, 0, "amax");
          check_close(ops::amin(l.x, {l.dim}), mn, 0, 0, "amin");
          const ops::ValuesIndices a = ops::max(l.x, l.dim), b = ops::min(l.x, l.dim);
          check_close(a.values, mx, 0, 0, "max.values");
          check_close(b.values, mn, 0, 0, "min.values");
          CHECK(a.indices.tolist<int64_t>() == amx);
          CHECK(b.indices.tolist<int64_t>() == amn);
          CHECK(ops::argmax(l.x, l.dim).tolist<int64_t>() == amx);
          CHECK(ops::argmin(l.x, l.dim).tolist<int64_t>() == amn);
          ++cases;
        }
      }
    }
  }
  // The full reduction of a tensor with one NaN anywhere is NaN (all four ops).
  for (DType dt : kFloats) {
    for (int64_t n : {int64_t(3), int64_t(17), int64_t(70001)}) {
      std::vector<double> v(size_t(n), 1.0);
      v[size_t(n - 2)] = kNaN;
      const Tensor x = make_tensor(v, {n}, dt);
      CAPTURE(dtype_name(dt));
      CAPTURE(n);
      CHECK(std::isnan(ops::sum(x).to(kFloat64).item<double>()));
      CHECK(std::isnan(ops::amax(x).to(kFloat64).item<double>()));
      CHECK(std::isnan(ops::amin(x).to(kFloat64).item<double>()));
      CHECK(std::isnan(ops::var(x).to(kFloat64).item<double>()));
      ++cases;
    }
  }
  MESSAGE(cases, " NaN placements checked over sum/mean/var/amax/amin/max/min/argmax/argmin");
}

TEST_CASE("probe reduce: +/-inf: inf - inf is NaN, an all -inf max is -inf, not the fold's identity") {
  int64_t cases = 0;
  for (DType dt : kFloats) {
    for (int64_t R : {int64_t(1), int64_t(5), int64_t(8), int64_t(20), int64_t(70001)}) {
      for (bool columns : {false, true}) {
        // row 0: all -inf; row 1: all +inf; row 2: +inf first and -inf last (different
        // lanes and, at 70001, different chunks); row 3: +inf among finite values;
        // row 4: -inf and a NaN.
        const int64_t rows = 5;
        std::vector<double> v(size_t(rows * R), 1.0);
        for (int64_t k = 0; k < R; ++k) v[size_t(k)] = -kInf, v[size_t(R + k)] = kInf;
        v[size_t(2 * R)] = kInf;
        v[size_t(2 * R + R - 1)] = R > 1 ? -kInf : kInf;
        v[size_t(3 * R + R / 2)] = kInf;
        v[size_t(4 * R)] = -kInf;
        v[size_t(4 * R + R - 1)] = R > 1 ? kNaN : -kInf;
        const Lined l = lined(v, rows, R, dt, columns);
        CAPTURE(dtype_name(dt));
        CAPTURE(R);
        CAPTURE(columns);
        const auto rs = split_rows(v, rows, R);
        const auto [sum, mean, var, mx, mn, amx, amn] = row_refs(rs, 0);
        REQUIRE(mx[0] == -kInf);
        REQUIRE(mn[1] == kInf);
        check_close(ops::sum(l.x, {l.dim}), sum, 0, 0, "sum");
        check_close(ops::mean(l.x, {l.dim}), mean, 0, 0, "mean");
        check_close(ops::var(l.x, {l.dim}, 0), var, 0, 0, "var");  // any inf: (inf - inf)^2 is NaN
        check_close(ops::amax(l.x, {l.dim}), mx, 0, 0, "amax");
        check_close(ops::amin(l.x, {l.dim}), mn, 0, 0, "amin");
        const ops::ValuesIndices a = ops::max(l.x, l.dim), b = ops::min(l.x, l.dim);
        check_close(a.values, mx, 0, 0, "max.values");
        check_close(b.values, mn, 0, 0, "min.values");
        CHECK(a.indices.tolist<int64_t>() == amx);
        CHECK(b.indices.tolist<int64_t>() == amn);
        ++cases;
      }
    }
  }
  // float16 sums past 65504 overflow to inf in the result, as torch (float accumulation,
  // then a cast to half); an intermediate past 65504 that comes back in range does not.
  const Tensor over = make_tensor({30000, 30000, 30000}, {3}, kFloat16);
  CHECK(ops::sum(over).dtype() == kFloat16);
  CHECK(ops::sum(over).to(kFloat64).item<double>() == kInf);
  const Tensor back = make_tensor({60000, 60000, -60000}, {3}, kFloat16);
  CHECK(ops::sum(back).to(kFloat64).item<double>() == 60000.0);
  CHECK(ops::mean(make_tensor({60000, 60000}, {2}, kFloat16)).to(kFloat64).item<double>() == 60000.0);
  CHECK(ops::var(make_tensor({-60000, 60000}, {2}, kFloat16), {}, 0).to(kFloat64).item<double>() == kInf);
  MESSAGE(cases, " inf layouts checked");
}

// ---------------------------------------------------------------------------------------
// Ties and signed zeros
// ---------------------------------------------------------------------------------------

TEST_CASE("probe reduce: ties go to the first index (torch.max: 'the indices of the first maximal value')") {
  int64_t cases = 0;
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt32, kInt64}) {
    for (int64_t R : kLengths) {
      for (bool columns : {false, true}) {
        const int64_t rows = 3;
        std::vector<double> v = random_values(rows * R, uint64_t(R + 11), 0.0, 4.0);
        for (double& x : v) x = std::floor(x);  // 0..3: many ties everywhere
        // Row 2: the extremes only late, each twice, so that the first is in a later lane or chunk.
        for (int64_t k = 0; k < R; ++k) v[size_t(2 * R + k)] = 1.0;
        if (R >= 4) {
          v[size_t(2 * R + R - 3)] = 3.0, v[size_t(2 * R + R - 1)] = 3.0;
          v[size_t(2 * R + R - 4)] = 0.0, v[size_t(2 * R + R - 2)] = 0.0;
        }
        const Lined l = lined(v, rows, R, dt, columns);
        CAPTURE(dtype_name(dt));
        CAPTURE(R);
        CAPTURE(columns);
        std::vector<int64_t> amx, amn;
        std::vector<double> mx, mn;
        for (const auto& row : split_rows(v, rows, R)) {
          amx.push_back(ref_arg(row, true)), amn.push_back(ref_arg(row, false));
          mx.push_back(row[size_t(amx.back())]), mn.push_back(row[size_t(amn.back())]);
        }
        const ops::ValuesIndices a = ops::max(l.x, l.dim), b = ops::min(l.x, l.dim);
        CHECK(a.indices.tolist<int64_t>() == amx);
        CHECK(b.indices.tolist<int64_t>() == amn);
        CHECK(ops::argmax(l.x, l.dim).tolist<int64_t>() == amx);
        CHECK(ops::argmin(l.x, l.dim).tolist<int64_t>() == amn);
        check_close(a.values, mx, 0, 0, "max.values");
        check_close(b.values, mn, 0, 0, "min.values");
        CHECK(a.values.dtype() == dt);
        CHECK(a.indices.dtype() == kInt64);
        ++cases;
      }
    }
  }
  // -0.0 == 0.0: equal values, so the first index wins whichever sign comes first, and the
  // value is a zero (IEEE: neither is larger).
  for (DType dt : kFloats) {
    CAPTURE(dtype_name(dt));
    const Tensor nz = make_tensor({-0.0, 0.0, -0.0}, {3}, dt), zn = make_tensor({0.0, -0.0, 0.0}, {3}, dt);
    for (const Tensor& x : {nz, zn}) {
      CHECK(ops::argmax(x, 0).item<int64_t>() == 0);
      CHECK(ops::argmin(x, 0).item<int64_t>() == 0);
      CHECK(ops::max(x, 0).indices.item<int64_t>() == 0);
      CHECK(ops::amax(x).to(kFloat64).item<double>() == 0.0);
      CHECK(ops::amin(x).to(kFloat64).item<double>() == 0.0);
      CHECK(ops::sum(x).to(kFloat64).item<double>() == 0.0);
      CHECK(ops::var(x).to(kFloat64).item<double>() == 0.0);
    }
    // max(dim) returns the value at the index it reports, sign included.
    CHECK(std::signbit(ops::max(nz, 0).values.to(kFloat64).item<double>()));
    CHECK(!std::signbit(ops::max(zn, 0).values.to(kFloat64).item<double>()));
    ++cases;
  }
  MESSAGE(cases, " tie layouts checked");
}

// ---------------------------------------------------------------------------------------
// var
// ---------------------------------------------------------------------------------------

TEST_CASE("probe reduce: var's correction, N <= correction (NaN or inf, as torch.var) and large offsets") {
  int64_t cases = 0;
  // torch.var divides by max(0, N - correction): 0/0 = NaN for constant data or N = 0 dof, and
  // m2/0 = inf otherwise ("degrees of freedom is <= 0" is a warning, not an error).
  for (DType dt : {kFloat64, kFloat32}) {
    for (int64_t N : {int64_t(1), int64_t(2), int64_t(3), int64_t(4), int64_t(7), int64_t(100)}) {
      for (int64_t c : {int64_t(0), int64_t(1), int64_t(2), int64_t(3), int64_t(5)}) {
        for (bool constant : {false, true}) {
          const int64_t rows = 3;
          std::vector<double> v = random_values(rows * N, uint64_t(N * 31 + c), -3.0, 3.0);
          if (constant) std::fill(v.begin(), v.end(), 1.25);
          v = stored(v, dt);
          CAPTURE(dtype_name(dt));
          CAPTURE(N);
          CAPTURE(c);
          CAPTURE(constant);
          std::vector<double> expect;
          for (const auto& row : split_rows(v, rows, N)) expect.push_back(ref_var(row, c));
          for (bool columns : {false, true}) {
            const Lined l = lined(v, rows, N, dt, columns);
            check_close(ops::var(l.x, {l.dim}, c), expect, dt == kFloat32 ? 1e-5 : 1e-12, 0, "var");
            check_close(frugal::var(l.x, {l.dim}, c), expect, dt == kFloat32 ? 1e-5 : 1e-12, 0, "autograd var");
          }
          if (constant && N > c) check_close(ops::var(make_tensor(v, {rows, N}, dt), {1}, c), expect, 0, 0, "exact 0");
          ++cases;
        }
      }
    }
  }
  // Large offsets: var(1e8 + noise) in float64 and (1e4 + noise) in float32, against a two-pass
  // reference on the stored values; the naive E[x^2] - E[x]^2 would lose every digit (and go
  // negative). Constant 1e8 in float32 must give exactly 0.
  for (DType dt : {kFloat64, kFloat32}) {
    const double offset = dt == kFloat64 ? 1e8 : 1e4;
    for (int64_t n : {int64_t(10), int64_t(1000), int64_t(70001)}) {
      std::vector<double> v = random_values(n, uint64_t(n), 0.0, 1.0);
      for (double& x : v) x += offset;
      v = stored(v, dt);
      for (int64_t c : {int64_t(0), int64_t(1)}) {
        CAPTURE(dtype_name(dt));
        CAPTURE(n);
        const double e = ref_var(v, c);
        const double got = ops::var(make_tensor(v, {n}, dt), {}, c).to(kFloat64).item<double>();
        CHECK_MESSAGE(std::fabs(got - e) <= (dt == kFloat64 ? 1e-7 : 1e-6) * e, "var ", got, " expected ", e);
        ++cases;
      }
    }
    const double big = ops::var(full({1001}, 1e8, dt)).to(kFloat64).item<double>();
    CHECK(big == 0.0);
  }
  // float16 data near 1000 (ulp 0.5): exact values, a var the reference gets exactly.
  const std::vector<double> h = {1000, 1000.5, 1001, 1000, 1000.5};
  check_close(ops::var(make_tensor(h, {5}, kFloat16), {}, 0), {ref_var(h, 0)}, 2e-3, 0, "f16 var");
  check_close(ops::var(make_tensor(h, {5}, kBFloat16).to(kFloat32), {}, 1), {ref_var(stored(h, kBFloat16), 1)}, 1e-6, 0,
              "bf16-rounded var");
  // Multi-dim var with correction 2 over unsorted, negative dims.
  const std::vector<double> v = random_values(3 * 4 * 5, 9);
  const Tensor x = make_tensor(v, {3, 4, 5}, kFloat64);
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{2, 0}, {-1, -3}, {1, 2}, {}, {-2}}) {
    CAPTURE(shape_str(dims));
    for (bool keepdim : {false, true}) {
      const Groups g = groups_of(v, x.sizes(), dims, keepdim);
      const Tensor r = ops::var(x, dims, 2, keepdim);
      CHECK(r.sizes() == g.out_shape);
      check_close(r, ref_reduce(g, Op::Var2), 1e-12, 1e-14, "var c=2");
      ++cases;
    }
  }
  // frugal refuses a negative correction and names the op.
  check_error([&] { ops::var(x, {0}, -1); }, {"var", "correction"});
  MESSAGE(cases, " var cases checked");
}

// ---------------------------------------------------------------------------------------
// dims lists and keepdim
// ---------------------------------------------------------------------------------------

TEST_CASE("probe reduce: every dims list of a 4-d tensor, negative and unsorted, with keepdim, raw and autograd") {
  const Shape shape = {2, 3, 4, 5};
  const std::vector<double> v = random_values(numel_of(shape), 21);
  const Tensor x = make_tensor(v, shape, kFloat64);
  int64_t cases = 0;
  for (int mask = 0; mask < 16; ++mask) {
    std::vector<int64_t> pos, neg, rev;
    for (int64_t d = 0; d < 4; ++d)
      if (mask & (1 << d)) pos.push_back(d), neg.push_back(d - 4);
    rev.assign(pos.rbegin(), pos.rend());
    std::vector<int64_t> mixed = neg;
    for (size_t k = 0; k < mixed.size(); k += 2) mixed[k] += 4;  // some positive, some negative
    std::reverse(mixed.begin(), mixed.end());
    for (const auto& dims : {pos, neg, rev, mixed}) {
      // An empty list means every dim; mask 0 is that case, 15 the explicit list of all four.
      for (bool keepdim : {false, true}) {
        CAPTURE(shape_str(dims));
        CAPTURE(keepdim);
        const Groups g = groups_of(v, shape, dims, keepdim);
        const struct {
          const char* name;
          Tensor raw, grad;
          Op op;
        } rows[] = {
            {"sum", ops::sum(x, dims, keepdim), frugal::sum(x, dims, keepdim), Op::Sum},
            {"mean", ops::mean(x, dims, keepdim), frugal::mean(x, dims, keepdim), Op::Mean},
            {"amax", ops::amax(x, dims, keepdim), frugal::amax(x, dims, keepdim), Op::Max},
            {"amin", ops::amin(x, dims, keepdim), frugal::amin(x, dims, keepdim), Op::Min},
            {"var", ops::var(x, dims, 1, keepdim), frugal::var(x, dims, 1, keepdim), Op::Var1},
            {"var0", ops::var(x, dims, 0, keepdim), frugal::var(x, dims, 0, keepdim), Op::Var0},
        };
        for (const auto& r : rows) {
          CAPTURE(r.name);
          CHECK(r.raw.sizes() == g.out_shape);
          CHECK(r.grad.sizes() == g.out_shape);
          const std::vector<double> e = ref_reduce(g, r.op);
          check_close(r.raw, e, 1e-12, 1e-13, r.name);
          check_close(r.grad, e, 1e-12, 1e-13, std::string("autograd ") + r.name);
          ++cases;
        }
      }
    }
  }
  // Single dims for max/min/argmax/argmin, positive and negative, keepdim.
  for (int64_t d = -4; d < 4; ++d) {
    for (bool keepdim : {false, true}) {
      CAPTURE(d);
      CAPTURE(keepdim);
      const Groups g = groups_of(v, shape, {d}, keepdim);
      const ops::ValuesIndices a = frugal::max(x, d, keepdim), b = ops::min(x, d, keepdim);
      CHECK(a.values.sizes() == g.out_shape);
      CHECK(a.indices.sizes() == g.out_shape);
      CHECK(b.indices.sizes() == g.out_shape);
      CHECK(ops::argmax(x, d, keepdim).sizes() == g.out_shape);
      CHECK(frugal::argmin(x, d, keepdim).sizes() == g.out_shape);
      check_close(a.values, ref_reduce(g, Op::Max), 0, 0, "max");
      check_close(b.values, ref_reduce(g, Op::Min), 0, 0, "min");
      CHECK(a.indices.tolist<int64_t>() == ref_args(g, true));
      CHECK(frugal::argmin(x, d, keepdim).tolist<int64_t>() == ref_args(g, false));
      ++cases;
    }
  }
  // torch: "dim 0 appears multiple times in the list of dims"; also after wrapping.
  for (const std::vector<int64_t>& dup :
       std::vector<std::vector<int64_t>>{{0, 0}, {1, -3}, {3, -1}, {-4, 0}, {2, 1, 2}}) {
    CAPTURE(shape_str(dup));
    check_error([&] { ops::sum(x, dup); }, {"sum", "appears"});
    check_error([&] { ops::mean(x, dup); }, {"mean", "appears"});
    check_error([&] { ops::amax(x, dup); }, {"amax", "appears"});
    check_error([&] { ops::amin(x, dup); }, {"amin", "appears"});
    check_error([&] { ops::var(x, dup); }, {"var", "appears"});
    check_error([&] { frugal::sum(x, dup); }, {"sum", "appears"});
    ++cases;
  }
  for (const std::vector<int64_t>& bad : std::vector<std::vector<int64_t>>{{4}, {-5}, {0, 4}, {100}}) {
    CAPTURE(shape_str(bad));
    check_error([&] { ops::sum(x, bad); }, {"sum", "out of range"});
    check_error([&] { ops::amax(x, bad, true); }, {"amax", "out of range"});
    check_error([&] { frugal::var(x, bad); }, {"var", "out of range"});
    ++cases;
  }
  check_error([&] { ops::max(x, 4); }, {"max"});
  check_error([&] { ops::argmin(x, -5); }, {"argmin"});
  MESSAGE(cases, " dims lists checked");
}

// ---------------------------------------------------------------------------------------
// Size-0 and 0-d
// ---------------------------------------------------------------------------------------

TEST_CASE("probe reduce: size-0 inputs: sum 0, mean/var NaN, max over an empty dim throws, over a full one is empty") {
  const Tensor x = zeros({2, 0, 3}, kFloat32);
  for (bool keepdim : {false, true}) {
    CAPTURE(keepdim);
    const Shape s1 = keepdim ? Shape{2, 1, 3} : Shape{2, 3};
    CHECK(ops::sum(x, {1}, keepdim).sizes() == s1);
    check_close(ops::sum(x, {1}, keepdim), std::vector<double>(6, 0.0), 0, 0, "sum over the empty dim");
    check_close(ops::mean(x, {1}, keepdim), std::vector<double>(6, kNaN), 0, 0, "mean over the empty dim");
    for (int64_t c : {0, 1})
      check_close(ops::var(x, {1}, c, keepdim), std::vector<double>(6, kNaN), 0, 0, "var over the empty dim");
    check_close(ops::sum(x, {}, keepdim), {0.0}, 0, 0, "sum of all");
    CHECK(ops::sum(x, {}, keepdim).sizes() == (keepdim ? Shape{1, 1, 1} : Shape{}));
    check_close(ops::mean(x, {-2, 0}, keepdim), {kNaN, kNaN, kNaN}, 0, 0, "mean over {-2, 0}");
    // Reducing a non-empty dim of an empty tensor: an empty result of the right shape, for
    // every op, amax/max included (torch returns an empty tensor too).
    const Shape s0 = keepdim ? Shape{1, 0, 3} : Shape{0, 3};
    CHECK(ops::sum(x, {0}, keepdim).sizes() == s0);
    CHECK(ops::mean(x, {0}, keepdim).sizes() == s0);
    CHECK(ops::var(x, {0}, 1, keepdim).sizes() == s0);
    CHECK(ops::amax(x, {0}, keepdim).sizes() == s0);
    CHECK(ops::amin(x, {0, 2}, keepdim).sizes() == (keepdim ? Shape{1, 0, 1} : Shape{0}));
    CHECK(ops::max(x, 0, keepdim).values.sizes() == s0);
    CHECK(ops::max(x, 0, keepdim).indices.sizes() == s0);
    CHECK(ops::max(x, 0, keepdim).indices.dtype() == kInt64);
    CHECK(ops::argmin(x, -1, keepdim).sizes() == (keepdim ? Shape{2, 0, 1} : Shape{2, 0}));
    // torch: "Expected reduction dim 1 to have non-zero size"; also when the output is empty.
    check_error([&] { ops::amax(x, {1}, keepdim); }, {"amax", "[2, 0, 3]"});
    check_error([&] { ops::amin(x, {}, keepdim); }, {"amin"});
    check_error([&] { ops::amax(x, {0, 1}, keepdim); }, {"amax"});
    check_error([&] { ops::max(x, 1, keepdim); }, {"max"});
    check_error([&] { ops::min(x, -2, keepdim); }, {"min"});
    check_error([&] { ops::argmax(x, 1, keepdim); }, {"argmax"});
    check_error([&] { ops::amax(zeros({0, 0}), {1}, keepdim); }, {"amax"});
  }
  // Integer and bool: an empty sum is an int64 0.
  for (DType dt : {kInt32, kInt64, kBool}) {
    const Tensor e = zeros({0, 4}, dt);
    CAPTURE(dtype_name(dt));
    CHECK(ops::sum(e).dtype() == kInt64);
    CHECK(ops::sum(e).item<int64_t>() == 0);
    CHECK(ops::sum(e, {0}).tolist<int64_t>() == std::vector<int64_t>(4, 0));
  }
  for (DType dt : {kFloat16, kBFloat16}) {
    CHECK(ops::sum(zeros({0}, dt)).dtype() == dt);
    CHECK(std::isnan(ops::mean(zeros({0}, dt)).to(kFloat64).item<double>()));
  }
  // Gradients through empty reductions: the right (empty or zero) shapes, no crash.
  Tensor leaf = zeros({2, 0, 3}, kFloat64);
  leaf.requires_grad_();
  frugal::sum(leaf, {1}).backward(ones({2, 3}, kFloat64));
  CHECK(leaf.grad().sizes() == Shape{2, 0, 3});
  Tensor leaf2 = zeros({2, 0, 3}, kFloat64);
  leaf2.requires_grad_();
  frugal::mean(leaf2, {0}).backward(zeros({0, 3}, kFloat64));
  CHECK(leaf2.grad().sizes() == Shape{2, 0, 3});
  Tensor leaf3 = zeros({2, 0, 3}, kFloat64);
  leaf3.requires_grad_();
  frugal::amax(leaf3, {0, 2}, true).backward(zeros({1, 0, 1}, kFloat64));
  CHECK(leaf3.grad().sizes() == Shape{2, 0, 3});
}

TEST_CASE("probe reduce: 0-d inputs take dim 0 and -1 and stay 0-d, with and without keepdim") {
  int64_t cases = 0;
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32}) {
    const Tensor s = scalar_tensor(2.5, dt);
    const double val = is_floating(dt) ? 2.5 : 2.0;
    CAPTURE(dtype_name(dt));
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}}) {
      for (bool keepdim : {false, true}) {
        CAPTURE(shape_str(dims));
        CAPTURE(keepdim);
        const Tensor sm = ops::sum(s, dims, keepdim);
        CHECK(sm.dim() == 0);
        CHECK(sm.dtype() == (is_floating(dt) ? dt : kInt64));
        CHECK(sm.to(kFloat64).item<double>() == val);
        CHECK(ops::amax(s, dims, keepdim).dim() == 0);
        CHECK(ops::amax(s, dims, keepdim).to(kFloat64).item<double>() == val);
        CHECK(ops::amin(s, dims, keepdim).to(kFloat64).item<double>() == val);
        if (is_floating(dt)) {
          CHECK(ops::mean(s, dims, keepdim).to(kFloat64).item<double>() == val);
          CHECK(ops::var(s, dims, 0, keepdim).to(kFloat64).item<double>() == 0.0);
          CHECK(std::isnan(ops::var(s, dims, 1, keepdim).to(kFloat64).item<double>()));  // torch: nan, 1 element
        }
        ++cases;
      }
    }
    for (int64_t d : {0, -1}) {
      for (bool keepdim : {false, true}) {
        const ops::ValuesIndices m = ops::max(s, d, keepdim);
        CHECK(m.values.dim() == 0);
        CHECK(m.indices.dim() == 0);
        CHECK(m.values.to(kFloat64).item<double>() == val);
        CHECK(m.indices.item<int64_t>() == 0);
        CHECK(ops::argmin(s, d, keepdim).item<int64_t>() == 0);
        CHECK(ops::argmin(s, d, keepdim).dim() == 0);
        ++cases;
      }
    }
    check_error([&] { ops::sum(s, {1}); }, {"sum", "out of range"});
    check_error([&] { ops::amax(s, {-2}); }, {"amax", "out of range"});
    check_error([&] { ops::sum(s, {0, -1}); }, {"sum", "appears"});
    check_error([&] { ops::max(s, 1); }, {"max"});
    check_error([&] { ops::argmax(s, -2); }, {"argmax"});
  }
  // Gradients of a 0-d input are the upstream gradient (var with correction 0: zero).
  for (int which = 0; which < 5; ++which) {
    Tensor s = scalar_tensor(1.5, kFloat64);
    s.requires_grad_();
    Tensor y = which == 0   ? frugal::sum(s, {0})
               : which == 1 ? frugal::mean(s, {-1}, true)
               : which == 2 ? frugal::amax(s, {})
               : which == 3 ? frugal::max(s, 0).values
                            : frugal::var(s, {}, 0);
    y.backward(scalar_tensor(3.0, kFloat64));
    CAPTURE(which);
    REQUIRE(s.grad().defined());
    CHECK(s.grad().dim() == 0);
    CHECK(s.grad().item<double>() == (which == 4 ? 0.0 : 3.0));
    ++cases;
  }
  MESSAGE(cases, " 0-d cases checked");
}

// ---------------------------------------------------------------------------------------
// Integer, bool and 16-bit dtypes
// ---------------------------------------------------------------------------------------

TEST_CASE("probe reduce: integers and bool: int64 sums (exact, wrapping), no mean/var, exact int64 max") {
  const int64_t i32max = std::numeric_limits<int32_t>::max();
  const int64_t i64max = std::numeric_limits<int64_t>::max(), i64min = std::numeric_limits<int64_t>::min();
  // int32 sums past int32's range are exact in int64 (torch.sum of int32 gives int64).
  const Tensor big32 =
      from_vector(std::vector<int32_t>{int32_t(i32max), int32_t(i32max), int32_t(i32max)}, {3}, kInt32);
  CHECK(ops::sum(big32).dtype() == kInt64);
  CHECK(ops::sum(big32).item<int64_t>() == 3 * i32max);
  CHECK(frugal::sum(big32).dtype() == kInt64);
  CHECK(frugal::sum(big32).item<int64_t>() == 3 * i32max);
  // A long row and a long column of int32 values whose sum needs 33+ bits.
  for (bool columns : {false, true}) {
    const int64_t n = 70001;
    std::vector<int32_t> v(size_t(n), 100000);
    v[5] = -7;
    const Tensor x = columns ? from_vector(v, {n, 1}, kInt32).expand({n, 2}) : from_vector(v, {1, n}, kInt32);
    const int64_t expect = 100000 * (n - 1) - 7;
    CAPTURE(columns);
    const Tensor s = ops::sum(x, {columns ? 0 : 1});
    CHECK(s.dtype() == kInt64);
    CHECK(s.tolist<int64_t>() == std::vector<int64_t>(size_t(columns ? 2 : 1), expect));
  }
  // int64 sums are exact past 2^53 (no detour through double) and wrap around on overflow,
  // as torch's two's complement int64 arithmetic does.
  const int64_t p53 = int64_t(1) << 53;
  CHECK(ops::sum(from_vector(std::vector<int64_t>{p53, 1, 1, 1}, {4}, kInt64)).item<int64_t>() == p53 + 3);
  CHECK(ops::sum(from_vector(std::vector<int64_t>{i64max, 1}, {2}, kInt64)).item<int64_t>() == i64min);
  CHECK(ops::sum(from_vector(std::vector<int64_t>{i64min, -1}, {2}, kInt64)).item<int64_t>() == i64max);
  // int64 max/min: exact past 2^53 (the compare must not go through double), and the fold's
  // identity (lowest/highest) never shows through.
  const Tensor near = from_vector(std::vector<int64_t>{p53, p53 + 1, p53 + 1, p53}, {4}, kInt64);
  CHECK(ops::amax(near).item<int64_t>() == p53 + 1);
  CHECK(ops::amin(near).item<int64_t>() == p53);
  CHECK(ops::argmax(near, 0).item<int64_t>() == 1);
  CHECK(ops::min(near, 0).indices.item<int64_t>() == 0);
  CHECK(ops::argmin(from_vector(std::vector<int64_t>{p53 + 1, p53, p53}, {3}, kInt64), 0).item<int64_t>() == 1);
  const Tensor lows = full({9}, double(i64min), kInt64),
               highs = from_vector(std::vector<int64_t>(9, i64max), {9}, kInt64);
  CHECK(ops::amax(lows).item<int64_t>() == i64min);
  CHECK(ops::amin(highs).item<int64_t>() == i64max);
  CHECK(ops::max(lows, 0).indices.item<int64_t>() == 0);
  CHECK(ops::amax(highs).item<int64_t>() == i64max);
  const Tensor lows32 = full({11}, double(std::numeric_limits<int32_t>::min()), kInt32);
  CHECK(ops::amax(lows32).dtype() == kInt32);
  CHECK(ops::amax(lows32).item<int64_t>() == std::numeric_limits<int32_t>::min());
  // bool: sum counts (int64), amax is any, amin is all, dtype kept.
  std::vector<bool> bv(70001, false);
  for (size_t i = 0; i < bv.size(); i += 3) bv[i] = true;
  const Tensor b = from_vector(bv, {int64_t(bv.size())}, kBool);
  CHECK(ops::sum(b).dtype() == kInt64);
  CHECK(ops::sum(b).item<int64_t>() == 23334);
  CHECK(ops::amax(b).dtype() == kBool);
  CHECK(ops::amax(b).item<bool>() == true);
  CHECK(ops::amin(b).item<bool>() == false);
  CHECK(ops::amax(zeros({5}, kBool)).item<bool>() == false);
  CHECK(ops::amin(ones({5}, kBool)).item<bool>() == true);
  // torch: "mean(): could not infer output dtype. Input dtype must be either a floating point
  // or complex dtype"; var of an integer tensor is refused the same way.
  for (DType dt : {kInt32, kInt64, kBool}) {
    CAPTURE(dtype_name(dt));
    const Tensor x = ones({3, 2}, dt);
    check_error([&] { ops::mean(x); }, {"mean", dtype_name(dt)});
    check_error([&] { ops::mean(x, {0}); }, {"mean", dtype_name(dt)});
    check_error([&] { frugal::mean(x); }, {"mean", dtype_name(dt)});
    check_error([&] { ops::var(x); }, {"var", dtype_name(dt)});
    check_error([&] { frugal::var(x, {1}); }, {"var", dtype_name(dt)});
  }
}

TEST_CASE("probe reduce: float16 and bfloat16 accumulate wider than themselves and keep their dtype") {
  // A float16 running sum of 1s stalls at 2048 (2049 is not a float16); bfloat16's at 256.
  // torch accumulates both in float32 and rounds once, so every count below is exact.
  int64_t cases = 0;
  for (DType dt : {kFloat16, kBFloat16}) {
    const int64_t n = dt == kFloat16 ? 4096 : 1024;  // representable totals
    CAPTURE(dtype_name(dt));
    const Tensor row = ones({3, n}, dt);
    const Tensor col = ones({n, 3}, dt);
    CHECK(ops::sum(row, {1}).dtype() == dt);
    check_close(ops::sum(row, {1}), std::vector<double>(3, double(n)), 0, 0, "row sum of 1s");
    check_close(ops::sum(col, {0}), std::vector<double>(3, double(n)), 0, 0, "column sum of 1s");
    check_close(ops::sum(ones({n}, dt)), {double(n)}, 0, 0, "full sum of 1s");
    check_close(frugal::sum(row, {-1}), std::vector<double>(3, double(n)), 0, 0, "autograd sum of 1s");
    check_close(ops::mean(row, {1}), {1, 1, 1}, 0, 0, "mean of 1s");
    check_close(ops::var(col, {0}), {0, 0, 0}, 0, 0, "var of 1s");
    CHECK(ops::mean(row, {1}).dtype() == dt);
    CHECK(ops::var(row, {1}).dtype() == dt);
    CHECK(ops::amax(row, {1}).dtype() == dt);
    // Mean and sum of many small values: the float64 mean of the stored values, rounded once.
    for (int64_t len : {int64_t(10000), int64_t(70001)}) {
      const std::vector<double> v = stored(random_values(len, uint64_t(len), 0.0, 0.25), dt);
      const Tensor x = make_tensor(v, {len}, dt);
      const double rt = dt == kFloat16 ? 1.0 / 1024 : 1.0 / 128;  // one rounding of the result
      CAPTURE(len);
      check_close(ops::sum(x), {ref_sum(v)}, rt, 0, "sum of small values");
      check_close(ops::mean(x), {ref_mean(v)}, rt, 0, "mean of small values");
      check_close(ops::var(x), {ref_var(v, 1)}, rt, 0, "var of small values");
      ++cases;
    }
    // Gradients of a 16-bit reduction come back in the input's dtype.
    Tensor leaf = ones({4, 5}, dt);
    leaf.requires_grad_();
    frugal::mean(leaf, {1}).backward(ones({4}, dt));
    CHECK(leaf.grad().dtype() == dt);
    check_close(leaf.grad(), std::vector<double>(20, 0.2), default_rtol(dt), 0, "mean grad");
    // Many ties: amax/amin share g among 2049 and 100000 equal values. The count must not
    // be taken in float16 (2049 rounds to 2048, 100000 overflows to inf and gave a zero
    // gradient): Note [Tie counts in float32] in autograd/ops/reduce.cpp.
    for (int64_t ties : {int64_t(2049), int64_t(100000)}) {
      for (bool is_max : {true, false}) {
        CAPTURE(ties);
        CAPTURE(is_max);
        Tensor t = full({ties}, -1.5, dt);
        t.requires_grad_();
        (is_max ? frugal::amax(t) : frugal::amin(t)).backward(scalar_tensor(1.0, dt));
        CHECK(t.grad().dtype() == dt);
        const std::vector<double> gv = values_of(t.grad());
        const double share = stored({1.0 / double(ties)}, dt)[0];
        CHECK_MESSAGE(gv[0] == share, "tie share ", gv[0], " expected ", share);
        CHECK_MESSAGE(std::fabs(ref_sum(gv) - 1.0) < 0.01, "ties' gradients sum to ", ref_sum(gv));
      }
    }
    Tensor big = ones({100000}, dt);
    big.requires_grad_();
    frugal::mean(big).backward(scalar_tensor(1.0, dt));
    CHECK(std::fabs(values_of(big.grad())[0] - 1e-5) < 6e-8);
    ++cases;
  }
  MESSAGE(cases, " 16-bit cases checked");
}

TEST_CASE("probe reduce: 1e6-element sums, means and variances against float64") {
  const int64_t n = 1000000;
  std::vector<double> v = stored(random_values(n, 77, 0.0, 1.0), kFloat32);
  double worst = 0.0;
  auto rel = [&](const Tensor& t, double e) {
    const double r = std::fabs(t.to(kFloat64).item<double>() - e) / std::fabs(e);
    worst = std::max(worst, r);
    return r;
  };
  const double s = ref_sum(v), m = ref_mean(v), var1 = ref_var(v, 1);
  // One row, a full reduction of a (1000, 1000), a column reduction of (1000, 1000) summed
  // again, and a strided column of an (n, 2) buffer.
  const Tensor row = make_tensor(v, {1, n}, kFloat32);
  CHECK(rel(ops::sum(row, {1}), s) < 2e-7);
  CHECK(rel(ops::mean(row, {1}), m) < 2e-7);
  CHECK(rel(ops::var(row, {1}), var1) < 2e-7);
  const Tensor sq = make_tensor(v, {1000, 1000}, kFloat32);
  CHECK(rel(ops::sum(sq), s) < 2e-7);
  CHECK(rel(ops::sum(sq, {0, 1}), s) < 2e-7);
  CHECK(rel(ops::mean(sq, {-1, -2}), m) < 2e-7);
  CHECK(rel(ops::var(sq), var1) < 2e-7);
  const Tensor col = make_tensor(v, {n, 1}, kFloat32).expand({n, 2});
  const std::vector<double> cs = values_of(ops::sum(col, {0}));
  CHECK(std::fabs(cs[0] - s) / s < 2e-7);
  CHECK(cs[0] == cs[1]);
  const Tensor col2 = make_tensor(v, {n / 2, 2}, kFloat32);  // two interleaved columns
  std::vector<double> even, odd;
  for (int64_t i = 0; i < n; ++i) (i % 2 ? odd : even).push_back(v[size_t(i)]);
  check_close(ops::sum(col2, {0}), {ref_sum(even), ref_sum(odd)}, 2e-7, 0, "column sums");
  check_close(ops::var(col2, {0}, 0), {ref_var(even, 0), ref_var(odd, 0)}, 2e-7, 0, "column vars");
  // Cancellation: 1e8, 1, -1e8 repeated: the exact sum is the count of 1s; a float32 running
  // sum would lose the 1s entirely (1e8 + 1 == 1e8 in float32).
  std::vector<double> canc;
  for (int64_t i = 0; i < n / 3; ++i) canc.insert(canc.end(), {1e8, 1.0, -1e8});
  const Tensor c32 = make_tensor(canc, {int64_t(canc.size())}, kFloat32);
  CHECK(ops::sum(c32).item<float>() == float(n / 3));
  // float64: ~1e-16 relative.
  const Tensor row64 = make_tensor(v, {n}, kFloat64);
  const double r64 = std::fabs(ops::sum(row64).item<double>() - s) / s;
  CHECK(r64 < 1e-14);
  MESSAGE("1e6 floats: worst relative error over sum/mean/var of float32 results ", worst,
          " (one float32 rounding is 6e-8); float64 sum ", r64);
}

// ---------------------------------------------------------------------------------------
// Gradients
// ---------------------------------------------------------------------------------------

TEST_CASE("probe reduce: sum and mean gradients broadcast the upstream gradient back over the reduced dims") {
  const Shape shape = {2, 3, 4};
  int64_t cases = 0;
  for (int mask = 0; mask < 8; ++mask) {
    std::vector<int64_t> dims;
    for (int64_t d = 2; d >= 0; --d)
      if (mask & (1 << d)) dims.push_back(mask == 5 ? d - 3 : d);  // unsorted, some negative
    for (bool keepdim : {false, true}) {
      for (bool is_mean : {false, true}) {
        CAPTURE(shape_str(dims));
        CAPTURE(keepdim);
        CAPTURE(is_mean);
        Tensor x = leaf(shape, uint64_t(mask * 4 + keepdim));
        const Groups g = groups_of(values_of(x), shape, dims, keepdim);
        const Tensor y = is_mean ? frugal::mean(x, dims, keepdim) : frugal::sum(x, dims, keepdim);
        REQUIRE(y.sizes() == g.out_shape);
        const std::vector<double> up = random_values(numel_of(g.out_shape), uint64_t(mask + 100));
        y.backward(make_tensor(up, g.out_shape, kFloat64));
        std::vector<double> expect(size_t(numel_of(shape)));
        for (size_t o = 0; o < g.where.size(); ++o)
          for (int64_t i : g.where[o]) expect[size_t(i)] = up[o] / (is_mean ? double(g.where[o].size()) : 1.0);
        REQUIRE(x.grad().defined());
        CHECK(x.grad().sizes() == shape);
        check_close(x.grad(), expect, 1e-15, 0, "grad");
        ++cases;
      }
    }
  }
  // Two backward passes into one leaf accumulate.
  Tensor x = leaf({3, 4}, 5);
  frugal::sum(x, {0}).backward(full({4}, 2.0, kFloat64));
  frugal::mean(x, {1}, true).backward(ones({3, 1}, kFloat64));
  check_close(x.grad(), std::vector<double>(12, 2.0 + 0.25), 1e-15, 0, "two reductions");
  MESSAGE(cases, " sum/mean gradients checked");
}

TEST_CASE("probe reduce: amax/amin share the gradient among ties, max/min send it to the returned index") {
  // torch: amax/amin "evenly distributes gradient between equal values"; max(dim)/min(dim)
  // backpropagate through the returned indices only.
  const std::vector<double> v = {1,    3,   3,  2,  3,    0,     // row 0: three maxima
                                 5,    1,   1,  1,  2,    4,     // row 1: three minima
                                 0,    0,   0,  0,  0,    0,     // row 2: all equal
                                 -0.0, 0.0, -1, -1, -0.0, 0.0};  // row 3: signed zeros tie
  const Shape shape = {4, 6};
  const std::vector<double> up = {10, 20, 30, 40};
  int64_t cases = 0;
  for (bool is_max : {true, false}) {
    for (bool keepdim : {false, true}) {
      CAPTURE(is_max);
      CAPTURE(keepdim);
      const Groups g = groups_of(v, shape, {1}, keepdim);
      const Tensor upt = make_tensor(up, g.out_shape, kFloat64);
      // amax / amin: g / (number of ties) at each tie.
      Tensor x = make_tensor(v, shape, kFloat64);
      x.requires_grad_();
      (is_max ? frugal::amax(x, {1}, keepdim) : frugal::amin(x, {1}, keepdim)).backward(upt);
      std::vector<double> share(v.size(), 0.0), first(v.size(), 0.0);
      for (size_t o = 0; o < 4; ++o) {
        const double ext = g.values[o][size_t(ref_arg(g.values[o], is_max))];
        int64_t count = 0;
        for (double e : g.values[o]) count += e == ext;
        for (size_t k = 0; k < 6; ++k)
          if (g.values[o][k] == ext) share[o * 6 + k] = up[o] / double(count);
        first[o * 6 + size_t(ref_arg(g.values[o], is_max))] = up[o];
      }
      check_close(x.grad(), share, 1e-15, 0, is_max ? "amax grad" : "amin grad");
      // max / min over dim 1: everything to the first index.
      Tensor x2 = make_tensor(v, shape, kFloat64);
      x2.requires_grad_();
      (is_max ? frugal::max(x2, 1, keepdim) : frugal::min(x2, 1, keepdim)).values.backward(upt);
      check_close(x2.grad(), first, 0, 0, is_max ? "max grad" : "min grad");
      ++cases;
    }
  }
  // Ties across several reduced dims share too: amax over {0, 2} of a (2, 2, 3) with four maxima.
  {
    std::vector<double> w(12, 0.0);
    for (int64_t i : {0, 2, 7, 11}) w[size_t(i)] = 9.0;
    Tensor x = make_tensor(w, {2, 2, 3}, kFloat64);
    x.requires_grad_();
    frugal::amax(x, {0, -1}).backward(make_tensor({6, 8}, {2}, kFloat64));
    // (a, b, c) of element i is (i / 6, i / 3 % 2, i % 3): output b = 0 holds maxima 0, 2
    // and 7, output b = 1 only 11.
    std::vector<double> e(12, 0.0);
    e[0] = e[2] = e[7] = 6.0 / 3;
    e[11] = 8.0;
    check_close(x.grad(), e, 1e-15, 0, "amax over {0, -1}");
    ++cases;
  }
  // A NaN row: its gradient stays in that row (frugal sends it to the NaNs, Note on
  // AmaxAminBackward; torch gives the row NaN); the other rows are untouched.
  {
    std::vector<double> w = {1, 2, 2, 0, kNaN, 3, 5, kNaN, 4};
    Tensor x = make_tensor(w, {3, 3}, kFloat64);
    x.requires_grad_();
    frugal::amax(x, {1}).backward(make_tensor({1, 2, 3}, {3}, kFloat64));
    const std::vector<double> gx = values_of(x.grad());
    check_close(std::vector<double>(gx.begin(), gx.begin() + 3), {0, 0.5, 0.5}, 0, 0, "row 0");
    check_close(std::vector<double>(gx.begin() + 3, gx.begin() + 6), {0, 2, 0}, 0, 0, "NaN row 1");
    check_close(std::vector<double>(gx.begin() + 6, gx.end()), {0, 3, 0}, 0, 0, "NaN row 2");
    Tensor x2 = make_tensor(w, {3, 3}, kFloat64);
    x2.requires_grad_();
    frugal::max(x2, 1).values.backward(make_tensor({1, 2, 3}, {3}, kFloat64));
    check_close(x2.grad(), {0, 1, 0, 0, 2, 0, 0, 3, 0}, 0, 0, "max grad with NaN rows");
    ++cases;
  }
  // Central differences away from ties agree with both.
  for (int64_t d : {0, 1, -1}) {
    CAPTURE(d);
    check_gradcheck([&](const TensorList& in) { return frugal::amax(in[0], {d}); },
                    {leaf({3, 4, 5}, uint64_t(d + 40))});
    check_gradcheck(
        [&](const TensorList& in) {
          return frugal::amin(in[0], {d, d < 0 ? 0 : 2}, true);
        },
        {leaf({3, 4, 5}, uint64_t(d + 50))});
    check_gradcheck([&](const TensorList& in) { return frugal::max(in[0], d).values; },
                    {leaf({3, 4, 5}, uint64_t(d + 60))});
    check_gradcheck([&](const TensorList& in) { return frugal::min(in[0], d, true).values; },
                    {leaf({3, 4, 5}, uint64_t(d + 70))});
    ++cases;
  }
  MESSAGE(cases, " amax/amin/max/min gradient cases checked");
}

TEST_CASE("probe reduce: var gradient 2 (x - mean) / (N - correction), gradcheck over dims and corrections") {
  const Shape shape = {3, 4, 5};
  int64_t cases = 0;
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {2, 0}, {1, -1}, {0, 1, 2}}) {
    for (int64_t c : {0, 1, 2}) {
      for (bool keepdim : {false, true}) {
        CAPTURE(shape_str(dims));
        CAPTURE(c);
        CAPTURE(keepdim);
        Tensor x = leaf(shape, uint64_t(c * 10 + dims.size()));
        const Groups g = groups_of(values_of(x), shape, dims, keepdim);
        const std::vector<double> up = random_values(numel_of(g.out_shape), uint64_t(c + 3));
        frugal::var(x, dims, c, keepdim).backward(make_tensor(up, g.out_shape, kFloat64));
        std::vector<double> expect(size_t(numel_of(shape)));
        for (size_t o = 0; o < g.where.size(); ++o) {
          const double m = ref_mean(g.values[o]), n = double(g.values[o].size());
          for (size_t k = 0; k < g.where[o].size(); ++k)
            expect[size_t(g.where[o][k])] = up[o] * 2.0 * (g.values[o][k] - m) / (n - double(c));
        }
        check_close(x.grad(), expect, 1e-12, 1e-14, "var grad");
        ++cases;
      }
      if (dims.size() <= 1)
        check_gradcheck([&](const TensorList& in) { return frugal::var(in[0], dims, c); }, {leaf(shape, uint64_t(c))});
    }
  }
  // One element with correction 1: the value is NaN and so is the gradient (torch: NaN).
  Tensor one = leaf({4, 1}, 8);
  frugal::var(one, {1}).backward(ones({4}, kFloat64));
  for (double gv : values_of(one.grad())) CHECK(std::isnan(gv));
  // Constant data: the gradient is exactly 0 (x - mean = 0).
  Tensor flat = full({2, 6}, 3.0, kFloat64);
  flat.requires_grad_();
  frugal::var(flat, {1}).backward(ones({2}, kFloat64));
  check_close(flat.grad(), std::vector<double>(12, 0.0), 0, 0, "constant var grad");
  MESSAGE(cases, " var gradient cases checked");
}

TEST_CASE("probe reduce: saved tensors and shared inputs: in-place changes after a reduction, expanded leaves, bool") {
  // amax/amin save their input and result and var its input: an in-place change of either
  // before backward must throw and name the node (torch: "one of the variables needed for
  // gradient computation has been modified by an inplace operation"). max(dim) saves only
  // its indices and sum/mean nothing, so a later in-place change is harmless there (torch too).
  for (int which = 0; which < 6; ++which) {
    CAPTURE(which);
    Tensor x = leaf({3, 4}, uint64_t(which + 200));
    const Tensor h = frugal::mul(x, 1.0);  // a non-leaf that may be changed in place
    Tensor y = which == 0   ? frugal::amax(h, {1})
               : which == 1 ? frugal::amin(h, {0})
               : which == 2 ? frugal::var(h, {1})
               : which == 3 ? frugal::max(h, 1).values
               : which == 4 ? frugal::sum(h, {0})
                            : frugal::mean(h, {1});
    const std::vector<double> xv = values_of(x);
    frugal::add_(h, 1.0);
    const Tensor g = ones(y.sizes(), kFloat64);
    if (which <= 2) {
      check_error([&] { y.backward(g); }, {which == 0 ? "AmaxBackward" : which == 1 ? "AminBackward" : "VarBackward"});
      continue;
    }
    y.backward(g);
    std::vector<double> e(12, 0.0);
    for (int64_t r = 0; r < 3; ++r) {
      const std::vector<double> row(xv.begin() + r * 4, xv.begin() + r * 4 + 4);
      for (int64_t k = 0; k < 4; ++k) e[size_t(r * 4 + k)] = which == 4 ? 1.0 : which == 5 ? 0.25 : 0.0;
      if (which == 3) e[size_t(r * 4 + ref_arg(row, true))] = 1.0;
    }
    check_close(x.grad(), e, 1e-15, 0, "grad after an in-place change");
  }
  // The result of amax changed in place: its saved copy is stale, backward throws.
  {
    Tensor x = leaf({2, 5}, 300);
    Tensor y = frugal::amax(x, {1});
    const Tensor z = frugal::mul(y, 1.0);
    frugal::mul_(y, 2.0);
    check_error([&] { frugal::sum(z).backward(); }, {"AmaxBackward"});
  }
  // An expanded leaf: amax over the expanded dim sees 4 ties, each gets g / 4, and expand's
  // backward sums them back to g; max(dim) sends g to index 0 only, which sums to g as well.
  for (bool amax : {true, false}) {
    Tensor x = leaf({3, 1}, 310);
    const Tensor xe = x.expand({3, 4});
    (amax ? frugal::amax(xe, {1}) : frugal::max(xe, 1).values).backward(make_tensor({1, 2, 3}, {3}, kFloat64));
    check_close(x.grad(), {1, 2, 3}, 1e-15, 0, amax ? "amax of an expand" : "max of an expand");
    Tensor w = leaf({1, 5}, 311);
    frugal::var(w.expand({4, 5}), {0}, 0).backward(ones({5}, kFloat64));
    check_close(w.grad(), std::vector<double>(5, 0.0), 0, 0, "var across copies");
    const Tensor plain = make_tensor(values_of(w), {1, 5}, kFloat64);  // raw ops take no grad-requiring input
    check_close(ops::var(plain.expand({4, 5}), {0}), std::vector<double>(5, 0.0), 0, 0, "var of copies is 0");
  }
  // bool max/min over long rows and columns: the first true (false) and its index.
  for (bool columns : {false, true}) {
    const int64_t R = 70001, rows = 2;
    std::vector<double> v(size_t(rows * R), 0.0);
    v[size_t(R - 5)] = 1.0, v[size_t(R - 2)] = 1.0;  // row 0: first true near the end
    for (int64_t k = 0; k < R; ++k) v[size_t(R + k)] = 1.0;
    v[size_t(R + 40000)] = 0.0;  // row 1: one false in a later chunk
    const Lined l = lined(v, rows, R, kBool, columns);
    CAPTURE(columns);
    CHECK(ops::amax(l.x, {l.dim}).tolist<bool>() == std::vector<bool>{true, true});
    CHECK(ops::amin(l.x, {l.dim}).tolist<bool>() == std::vector<bool>{false, false});
    CHECK(ops::max(l.x, l.dim).indices.tolist<int64_t>() == std::vector<int64_t>{R - 5, 0});
    CHECK(ops::min(l.x, l.dim).indices.tolist<int64_t>() == std::vector<int64_t>{0, 40000});
    CHECK(ops::max(l.x, l.dim).values.dtype() == kBool);
  }
}
