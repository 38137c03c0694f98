// Probes for silent wrong answers on the CPU: reductions, indexing, joins, matmul,
// autograd and losses on the inputs users actually pass (non-contiguous views, storage
// offsets, stride-0 broadcasts, overlapping as_strided windows, size-0 and size-1 dims,
// odd lengths, negative dims, dtype mixes). Every result is compared with an independent
// reference written here: float64 loops that read the input through its own
// sizes/strides/offset (host_view), or finite differences for gradients.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/index.h"
#include "autograd/ops/join.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/norm.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/softmax.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/index.h"
#include "tensor/ops/join.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/norm.h"
#include "tensor/ops/random.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/softmax.h"
#include "tensor/ops/unary.h"
#include "tensor/random.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

/// check_error that names the probe's line in the report.
#define CHECK_ERROR_AT(...)        \
  do {                             \
    INFO("probe line ", __LINE__); \
    check_error(__VA_ARGS__);      \
  } while (0)

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

/// A contiguous float64 base of n values (seeded) and its host copy.
struct Base {
  std::vector<double> v;
  Tensor t;
};
Base make_base(int64_t n, uint64_t seed, DType dt = kFloat64, double lo = -2.0, double hi = 2.0) {
  std::vector<double> v = random_values(n, seed, lo, hi);
  Tensor t = from_vector(v, {n}, TensorOptions(kFloat64)).to(dt);
  v = values_of(t);  // rounded to dt
  return {v, t};
}

/// The row-major values of view `t` of a 1-D contiguous base holding `base`, read through
/// t's own sizes, strides and storage offset: a reference independent of frugal's copies.
std::vector<double> host_view(const std::vector<double>& base, const Tensor& t) {
  std::vector<double> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const std::vector<int64_t> idx = unravel(i, t.sizes());
    int64_t off = t.storage_offset();
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
    out[size_t(i)] = base[size_t(off)];
  }
  return out;
}

enum class R { Sum, Mean, Max, Min, Var, ArgMax, ArgMin };

/// Reference reduction of row-major `v` of `shape` over `dims` (empty: all).
std::vector<double> ref_reduce(const std::vector<double>& v, const Shape& shape, std::vector<int64_t> dims, R r,
                               int64_t correction = 1) {
  const int64_t nd = int64_t(shape.size());
  std::vector<bool> mask(size_t(nd), dims.empty());
  for (int64_t d : dims) mask[size_t(d < 0 ? d + nd : d)] = true;
  int64_t nout = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (!mask[size_t(d)]) nout *= shape[size_t(d)];
  std::vector<std::vector<double>> g(static_cast<size_t>(nout));
  for (int64_t i = 0; i < int64_t(v.size()); ++i) {
    const auto idx = unravel(i, shape);
    int64_t o = 0;
    for (int64_t d = 0; d < nd; ++d)
      if (!mask[size_t(d)]) o = o * shape[size_t(d)] + idx[size_t(d)];
    g[size_t(o)].push_back(v[size_t(i)]);
  }
  std::vector<double> out;
  for (const auto& xs : g) {
    const double n = double(xs.size());
    double s = 0;
    for (double x : xs) s += x;
    switch (r) {
      case R::Sum: out.push_back(s); break;
      case R::Mean: out.push_back(s / n); break;
      case R::Var: {
        double q = 0;
        for (double x : xs) q += (x - s / n) * (x - s / n);
        out.push_back(q / std::max(0.0, n - double(correction)));
        break;
      }
      default: {
        const bool is_max = r == R::Max || r == R::ArgMax;
        size_t best = 0;
        for (size_t i = 0; i < xs.size(); ++i) {
          if (std::isnan(xs[best])) break;
          if (std::isnan(xs[i]) || (is_max ? xs[i] > xs[best] : xs[i] < xs[best])) best = i;
        }
        out.push_back((r == R::ArgMax || r == R::ArgMin) ? double(best) : xs[best]);
      }
    }
  }
  return out;
}

/// Views of a base of 400 float64 values that users make: each with a name.
struct NamedView {
  const char* name;
  Tensor t;
};
std::vector<NamedView> awkward_views(const Tensor& b) {
  return {
      {"permute(2,0,1) of (3,4,5)", b.narrow(0, 0, 60).view({3, 4, 5}).permute({2, 0, 1})},
      {"transpose(0,2) of (3,4,5) at offset 7", b.narrow(0, 7, 60).view({3, 4, 5}).transpose(0, 2)},
      {"slice step 2 on dim 1, step 3 on dim 0", b.view({20, 20}).slice(0, 1, 20, 3).slice(1, 3, 20, 2)},
      {"expand (stride 0) middle dim", b.narrow(0, 5, 7).view({7, 1}).unsqueeze(0).expand({3, 7, 5})},
      {"expand leading dim", b.narrow(0, 11, 17).view({1, 17}).expand({3, 17})},
      {"as_strided overlapping windows", b.as_strided({6, 5}, {3, 1}, 9)},
      {"size-1 dims with odd strides", b.as_strided({1, 7, 1, 3}, {999, 5, 1234, 1}, 2)},
      {"select then transpose", b.view({4, 10, 10}).select(1, 3).t()},
      {"odd 1-D length 17 at offset", b.narrow(0, 3, 17)},
      {"1-D strided 1023-ish (step 3 of 400)", b.slice(0, 0, 400, 3)},
  };
}

}  // namespace

// ---------------------------------------------------------------------------------------
// 1. Reductions
// ---------------------------------------------------------------------------------------

TEST_CASE("probe reduce: sum/mean/amax/amin/var over every dim and keepdim on awkward views") {
  const Base base = make_base(400, 1);
  for (const NamedView& nv : awkward_views(base.t)) {
    const Tensor& x = nv.t;
    const std::vector<double> xv = host_view(base.v, x);
    const int64_t nd = x.dim();
    std::vector<std::vector<int64_t>> dim_sets = {{}};
    for (int64_t d = -nd; d < nd; ++d) dim_sets.push_back({d});
    if (nd >= 2) dim_sets.push_back({0, nd - 1});
    if (nd >= 3) dim_sets.push_back({-1, 1});
    for (const auto& dims : dim_sets) {
      for (bool keepdim : {false, true}) {
        CAPTURE(nv.name);
        CAPTURE(shape_str(dims));
        CAPTURE(keepdim);
        check_close(ops::sum(x, dims, keepdim), ref_reduce(xv, x.sizes(), dims, R::Sum), 1e-12, 1e-12, "sum");
        check_close(ops::mean(x, dims, keepdim), ref_reduce(xv, x.sizes(), dims, R::Mean), 1e-12, 1e-12, "mean");
        check_close(ops::amax(x, dims, keepdim), ref_reduce(xv, x.sizes(), dims, R::Max), 0, 0, "amax");
        check_close(ops::amin(x, dims, keepdim), ref_reduce(xv, x.sizes(), dims, R::Min), 0, 0, "amin");
        check_close(ops::var(x, dims, 1, keepdim), ref_reduce(xv, x.sizes(), dims, R::Var), 1e-10, 1e-12, "var");
        check_close(ops::var(x, dims, 0, keepdim), ref_reduce(xv, x.sizes(), dims, R::Var, 0), 1e-10, 1e-12, "var0");
        if (dims.size() == 1) {
          const ops::ValuesIndices mx = ops::max(x, dims[0], keepdim), mn = ops::min(x, dims[0], keepdim);
          check_close(mx.values, ref_reduce(xv, x.sizes(), dims, R::Max), 0, 0, "max.values");
          check_close(mx.indices, ref_reduce(xv, x.sizes(), dims, R::ArgMax), 0, 0, "max.indices");
          check_close(mn.values, ref_reduce(xv, x.sizes(), dims, R::Min), 0, 0, "min.values");
          check_close(mn.indices, ref_reduce(xv, x.sizes(), dims, R::ArgMin), 0, 0, "min.indices");
          check_close(ops::argmax(x, dims[0], keepdim), ref_reduce(xv, x.sizes(), dims, R::ArgMax), 0, 0, "argmax");
        }
      }
    }
  }
}

TEST_CASE("probe reduce: 16-bit and integer views, ties, NaN") {
  for (DType dt : {kFloat16, kBFloat16, kFloat32}) {
    const Base base = make_base(400, 2, dt);
    for (const NamedView& nv : awkward_views(base.t)) {
      const Tensor& x = nv.t;
      const std::vector<double> xv = host_view(base.v, x);
      CAPTURE(nv.name);
      CAPTURE(dtype_name(dt));
      for (int64_t d = 0; d < x.dim(); ++d) {
        const double tol = default_rtol(dt);
        check_close(ops::sum(x, {d}), ref_reduce(xv, x.sizes(), {d}, R::Sum), tol, tol, "sum16");
        check_close(ops::mean(x, {d}), ref_reduce(xv, x.sizes(), {d}, R::Mean), tol, tol, "mean16");
        check_close(ops::amax(x, {d}), ref_reduce(xv, x.sizes(), {d}, R::Max), 0, 0, "amax16");
        check_close(ops::argmin(x, d), ref_reduce(xv, x.sizes(), {d}, R::ArgMin), 0, 0, "argmin16");
      }
    }
  }
  // int64 and bool on a transposed expand.
  const Tensor xi = arange(12).view({3, 4}).t().unsqueeze(0).expand({2, 4, 3});
  std::vector<double> xv = values_of(xi);
  for (int64_t d = 0; d < 3; ++d) {
    CHECK(ops::sum(xi, {d}).dtype() == kInt64);
    check_close(ops::sum(xi, {d}), ref_reduce(xv, xi.sizes(), {d}, R::Sum), 0, 0, "int sum");
    check_close(ops::amax(xi, {d}), ref_reduce(xv, xi.sizes(), {d}, R::Max), 0, 0, "int amax");
    check_close(ops::argmax(xi, d), ref_reduce(xv, xi.sizes(), {d}, R::ArgMax), 0, 0, "int argmax");
  }
  const Tensor xb = ops::gt(xi, 5.0);
  check_close(ops::sum(xb, {1}), ref_reduce(values_of(xb), xb.sizes(), {1}, R::Sum), 0, 0, "bool sum");
  // Ties: argmax/argmin give the first occurrence, on a strided view.
  const Tensor ties = from_vector(std::vector<double>{1, 9, 3, 9, 3, 9, 1, 0, 1, 0}, {10}, kFloat32).slice(0, 1, 10, 2);
  CHECK(ops::argmax(ties, 0).item<int64_t>() == 0);  // 9, 9, 9, 0, 0
  CHECK(ops::argmin(ties, 0).item<int64_t>() == 3);
  // NaN wins for amax/amin/max/argmax, even in a strided, transposed view.
  Tensor withnan = from_vector(std::vector<double>{1, 2, 3, 4, 5, kNaN, 7, 8, 9}, {3, 3}, kFloat32).t();
  check_close(ops::amax(withnan, {0}), {3, kNaN, 9}, 0, 0, "amax nan col");
  check_close(ops::amax(withnan, {1}), {7, 8, kNaN}, 0, 0, "amax nan row");
  check_close(ops::amin(withnan, {1}), {1, 2, kNaN}, 0, 0, "amin nan row");
  CHECK(ops::argmax(withnan, 1).tolist<int64_t>() == std::vector<int64_t>{2, 2, 1});
  CHECK(ops::argmin(withnan, 1).tolist<int64_t>() == std::vector<int64_t>{0, 0, 1});
}

TEST_CASE("probe reduce: size-0 and size-1 dims") {
  const Tensor e = zeros({0, 3});
  CHECK(ops::sum(e, {0}).sizes() == Shape{3});
  check_close(ops::sum(e, {0}), {0, 0, 0}, 0, 0, "sum of empty");
  check_close(ops::sum(e), {0}, 0, 0, "sum of all empty");
  check_close(ops::mean(e, {0}), {kNaN, kNaN, kNaN}, 0, 0, "mean of empty");
  check_close(ops::mean(e), {kNaN}, 0, 0, "mean of all empty");
  CHECK(ops::sum(e, {1}).sizes() == Shape{0});
  CHECK(ops::sum(e, {1}, true).sizes() == Shape{0, 1});
  CHECK(ops::amax(e, {1}).sizes() == Shape{0});  // nothing reduced over an empty dim
  CHECK(ops::max(e, 1).indices.sizes() == Shape{0});
  check_error([&] { ops::amax(e, {0}); }, {"amax"});
  check_error([&] { ops::amin(e); }, {"amin"});
  check_error([&] { ops::max(e, 0); }, {"max"});
  check_error([&] { ops::argmin(e, 0); }, {});
  check_close(ops::sum(zeros({0}, kInt64)), {0}, 0, 0, "int sum of empty");
  CHECK(ops::sum(zeros({0}, kInt64)).dtype() == kInt64);
  // Size-0 in a non-reduced position of a view at an offset.
  const Tensor big = arange(0.0, 30.0, 1.0, kFloat32).view({5, 6});
  const Tensor ev = big.narrow(0, 2, 0).t();  // (6, 0)
  CHECK(ops::sum(ev, {0}).sizes() == Shape{0});
  check_close(ops::sum(ev, {1}), std::vector<double>(6, 0.0), 0, 0, "sum over an empty narrow");
  // var: N - correction <= 0
  const Tensor one = full({3, 1}, 2.0, kFloat32);
  check_close(ops::var(one, {1}), {kNaN, kNaN, kNaN}, 0, 0, "var of one value");
  check_close(ops::var(one, {1}, 0), {0, 0, 0}, 0, 0, "var(c=0) of one value");
  // 0-d input: sum over {} and over dim 0 / -1
  const Tensor s = scalar_tensor(3.5, kFloat64);
  check_close(ops::sum(s), {3.5}, 0, 0, "sum 0-d");
  check_close(ops::sum(s, {0}), {3.5}, 0, 0, "sum 0-d dim 0");
  check_close(ops::amax(s, {-1}), {3.5}, 0, 0, "amax 0-d dim -1");
  CHECK(ops::argmax(s, 0).item<int64_t>() == 0);
  // Bad dims.
  check_error([&] { ops::sum(big, {2}); }, {"sum"});
  check_error([&] { ops::sum(big, {-3}); }, {"sum"});
  check_error([&] { ops::sum(big, {0, -2}); }, {"sum"});
  check_error([&] { ops::max(big, 2); }, {"max"});
}

TEST_CASE("probe reduce: long odd rows (1023) and a full reduction of a view") {
  const Base base = make_base(3 * 1023, 5, kFloat32);
  const Tensor x = base.t.view({3, 1023}).t();  // (1023, 3) column-major
  const std::vector<double> xv = host_view(base.v, x);
  check_close(ops::sum(x, {0}), ref_reduce(xv, x.sizes(), {0}, R::Sum), 1e-5, 1e-4, "sum 1023");
  check_close(ops::var(x, {0}), ref_reduce(xv, x.sizes(), {0}, R::Var), 1e-5, 1e-5, "var 1023");
  check_close(ops::sum(x), ref_reduce(xv, x.sizes(), {}, R::Sum), 1e-5, 1e-3, "sum all");
  check_close(ops::argmax(x, 0), ref_reduce(xv, x.sizes(), {0}, R::ArgMax), 0, 0, "argmax 1023");
  // float16 sum of 1023 ones: exact in a float accumulator, 1023 is representable.
  check_close(ops::sum(ones({1023, 1}, kFloat16).expand({1023, 4}), {0}), {1023, 1023, 1023, 1023}, 0, 0,
              "f16 sum 1023");
}

// ---------------------------------------------------------------------------------------
// 2. Indexing
// ---------------------------------------------------------------------------------------

TEST_CASE("probe index: gather / index_select / scatter_add / index_add on views, repeated indices") {
  const Base base = make_base(400, 7);
  const Tensor x = base.t.narrow(0, 3, 60).view({3, 4, 5}).permute({2, 0, 1});  // (5, 3, 4)
  const std::vector<double> xv = host_view(base.v, x);
  const Shape xs = x.sizes();
  auto at = [&](int64_t i, int64_t j, int64_t k) { return xv[size_t((i * 3 + j) * 4 + k)]; };
  // index_select with repeats on each dim, index a strided view.
  for (int64_t dim = -3; dim < 3; ++dim) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    // Indices with repeats, read through a step-2 view of a longer index tensor.
    const std::vector<int64_t> iv = {2 % xs[size_t(d)], 0, 1 % xs[size_t(d)], 0};
    const Tensor idx2 =
        from_vector(std::vector<int64_t>{iv[0], 99, iv[1], 99, iv[2], 99, iv[3], 99}, {8}).slice(0, 0, 8, 2);
    const Tensor out = ops::index_select(x, dim, idx2);
    std::vector<double> ref;
    Shape os = xs;
    os[size_t(d)] = 4;
    for (int64_t i = 0; i < numel_of(os); ++i) {
      auto id = unravel(i, os);
      id[size_t(d)] = iv[size_t(id[size_t(d)])];
      ref.push_back(at(id[0], id[1], id[2]));
    }
    CAPTURE(dim);
    check_close(out, ref, 0, 0, "index_select");
  }
  // gather along dim 0 with an expanded (stride-0) index smaller than x.
  const Tensor gidx = from_vector(std::vector<int64_t>{4, 0, 4, 1}, {1, 1, 4}).expand({2, 3, 4});
  const Tensor g = ops::gather(x, 0, gidx);
  REQUIRE(g.sizes() == Shape{2, 3, 4});
  std::vector<double> gref;
  const int64_t gi[] = {4, 0, 4, 1};
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) gref.push_back(at(gi[k], j, k));
  check_close(g, gref, 0, 0, "gather expanded index");
  // gather along the last dim (-1) of a transposed view.
  const Tensor xt = x.transpose(1, 2);  // (5, 4, 3)
  const Tensor gidx2 = from_vector(std::vector<int64_t>{2, 2, 0, 1, 0, 2, 1, 1}, {2, 2, 2});
  const Tensor g2 = ops::gather(xt, -1, gidx2);
  std::vector<double> g2ref;
  const std::vector<int64_t> giv = gidx2.tolist<int64_t>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 2; ++k) g2ref.push_back(at(i, giv[size_t((i * 2 + j) * 2 + k)], j));
  check_close(g2, g2ref, 0, 0, "gather dim -1 on transposed");
  // scatter_add into a transposed view with repeated indices.
  Tensor self_base = zeros({4, 5}, kFloat64);
  const Tensor self = self_base.t();  // (5, 4)
  const Tensor src = from_vector(random_values(12, 3), {3, 4}, kFloat64);
  const Tensor sidx = from_vector(std::vector<int64_t>{1, 1, 4, 0, 1, 3, 4, 0, 1, 1, 1, 1}, {3, 4});
  ops::scatter_add_(self, 0, sidx, src);
  std::vector<double> sref(20, 0.0);
  const auto sv = values_of(src);
  const auto siv = sidx.tolist<int64_t>();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t k = 0; k < 4; ++k) sref[size_t(siv[size_t(i * 4 + k)] * 4 + k)] += sv[size_t(i * 4 + k)];
  check_close(self, sref, 1e-12, 1e-12, "scatter_add_ into transposed view");
  // scatter_add_ where src aliases self (documented: read as before the op).
  Tensor acc = from_vector(std::vector<double>{1, 2, 3, 4}, {4}, kFloat64);
  ops::scatter_add_(acc, 0, from_vector(std::vector<int64_t>{1, 2, 3, 0}, {4}), acc);
  check_close(acc, {1 + 4, 2 + 1, 3 + 2, 4 + 3}, 0, 0, "scatter_add_ with src == self");
  // index_add with repeats along dim 1 of a sliced view.
  const Tensor ia_self = base.t.view({20, 20}).slice(0, 0, 20, 5).slice(1, 1, 8, 1);  // (4, 7)
  const Tensor ia_src = from_vector(random_values(12, 9), {4, 3}, kFloat64);
  const std::vector<int64_t> iav = {6, 0, 6};
  const Tensor ia = ops::index_add(ia_self, 1, from_vector(iav, {3}), ia_src);
  std::vector<double> iaref = host_view(base.v, ia_self);
  const auto iasv = values_of(ia_src);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t k = 0; k < 3; ++k) iaref[size_t(r * 7 + iav[size_t(k)])] += iasv[size_t(r * 3 + k)];
  check_close(ia, iaref, 1e-12, 1e-12, "index_add repeated along dim 1");
  // Out-of-range and negative indices throw.
  check_error([&] { ops::index_select(x, 0, from_vector(std::vector<int64_t>{5}, {1})); }, {"index_select"});
  check_error([&] { ops::index_select(x, 0, from_vector(std::vector<int64_t>{-1}, {1})); }, {"index_select"});
  check_error([&] { ops::gather(x, 1, full({1, 1, 1}, 3.0, kInt64)); }, {"gather"});
  check_error([&] { ops::gather(x, 1, full({1, 1, 1}, -1.0, kInt64)); }, {"gather"});
  check_error([&] { ops::scatter_add(zeros({3}), 0, from_vector(std::vector<int64_t>{3}, {1}), ones({1})); },
              {"scatter_add"});
  check_error([&] { ops::index_add(zeros({3}), 0, from_vector(std::vector<int64_t>{-1}, {1}), ones({1})); },
              {"index_add"});
  check_error([&] { ops::embedding(zeros({3, 2}), from_vector(std::vector<int64_t>{0, 3}, {2})); }, {"embedding"});
  // index.size(d) <= x.size(d) only for d != dim (torch.gather): a longer index along dim is fine.
  CHECK(ops::gather(x, 0, zeros({6, 1, 1}, kInt64)).sizes() == Shape{6, 1, 1});
  check_error([&] { ops::gather(x, 0, zeros({1, 4, 1}, kInt64)); }, {"gather"});
}

TEST_CASE("probe index: embedding on views, int32 indices, padding_idx gradient") {
  const Base base = make_base(60, 8);
  const Tensor w = base.t.view({6, 10}).t().slice(0, 0, 10, 2);  // (5, 6), non-contiguous
  const std::vector<double> wv = host_view(base.v, w);
  const Tensor ids = from_vector(std::vector<int32_t>{4, 0, 4, 2, 1, 1}, {3, 2}, kInt32).t();  // (2, 3)
  const Tensor e = ops::embedding(w, ids);
  REQUIRE(e.sizes() == Shape{2, 3, 6});
  std::vector<double> ref;
  for (int64_t id : std::vector<int64_t>{4, 4, 1, 0, 2, 1})
    for (int64_t c = 0; c < 6; ++c) ref.push_back(wv[size_t(id * 6 + c)]);
  check_close(e, ref, 0, 0, "embedding on transposed ids and strided weight");
  // Gradient: repeated ids accumulate, padding row gets nothing.
  const Tensor wl = from_vector(random_values(30, 4), {5, 6}, kFloat64);
  wl.requires_grad_();
  Tensor out = embedding(wl, ids, 1);
  sum(mul(out, out)).backward();
  std::vector<double> gref(30, 0.0);
  const auto wlv = values_of(wl);
  for (int64_t id : std::vector<int64_t>{4, 4, 1, 0, 2, 1})
    if (id != 1)
      for (int64_t c = 0; c < 6; ++c) gref[size_t(id * 6 + c)] += 2 * wlv[size_t(id * 6 + c)];
  check_close(wl.grad(), gref, 1e-12, 1e-12, "embedding grad with padding_idx");
}

TEST_CASE("probe index: where / masked_fill on broadcast, non-contiguous, mixed dtypes") {
  const Base base = make_base(100, 10);
  const Tensor a = base.t.view({10, 10}).slice(1, 1, 10, 3).t();  // (3, 10)
  const std::vector<double> av = host_view(base.v, a);
  const Tensor cond = ops::gt(from_vector(random_values(10, 11), {1, 10}, kFloat32), 0.0).expand({3, 10});
  const auto cv = values_of(cond);
  const Tensor b = from_vector(std::vector<int64_t>{7, -7, 3}, {3, 1}, kInt64);
  const Tensor w = ops::where(cond, a, b);
  CHECK(w.dtype() == kFloat64);
  std::vector<double> wref;
  const double bv[] = {7, -7, 3};
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 10; ++j) wref.push_back(cv[size_t(i * 10 + j)] ? av[size_t(i * 10 + j)] : bv[i]);
  check_close(w, wref, 0, 0, "where broadcast mixed dtypes");
  // float16 with float32 promotes to float32.
  const Tensor h = a.to(kFloat16), f = a.to(kFloat32);
  CHECK(ops::where(cond, h, f).dtype() == kFloat32);
  // masked_fill on a transposed view with a broadcast mask.
  const Tensor mf = ops::masked_fill(a, cond.narrow(0, 0, 1), -1.5);
  std::vector<double> mref;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 10; ++j) mref.push_back(cv[size_t(j)] ? -1.5 : av[size_t(i * 10 + j)]);
  check_close(mf, mref, 0, 0, "masked_fill transposed");
  // masked_fill_ in place on a strided view writes only the view's elements.
  Tensor buf = zeros({4, 6}, kFloat32);
  Tensor v = buf.slice(1, 1, 6, 2);  // cols 1, 3, 5
  ops::masked_fill_(v, from_vector(std::vector<bool>{true, false, true}, {3}, kBool), 9.0);
  std::vector<double> bref(24, 0.0);
  for (int64_t i = 0; i < 4; ++i) bref[size_t(i * 6 + 1)] = bref[size_t(i * 6 + 5)] = 9.0;
  check_close(buf, bref, 0, 0, "masked_fill_ strided view");
  // int64 masked_fill keeps dtype, bool mask on an expand.
  const Tensor xi = arange(6).view({2, 3});
  const Tensor mi = ops::masked_fill(xi, from_vector(std::vector<bool>{false, true, false}, {3}, kBool), 100.0);
  CHECK(mi.dtype() == kInt64);
  CHECK(mi.tolist<int64_t>() == std::vector<int64_t>{0, 100, 2, 3, 100, 5});
}

// ---------------------------------------------------------------------------------------
// 3. Joins and splits
// ---------------------------------------------------------------------------------------

TEST_CASE("probe join: cat/stack/split/chunk on views, size-0 pieces, negative dims, dtype mixes") {
  const Base base = make_base(400, 12);
  const Tensor a = base.t.view({20, 20}).slice(0, 0, 6, 2).slice(1, 0, 8, 1);  // (3, 8) rows 0,2,4
  const Tensor b = base.t.narrow(0, 100, 24).view({8, 3}).t();                 // (3, 8)
  const Tensor c = base.t.narrow(0, 200, 8).view({1, 8}).expand({3, 8});       // stride 0
  const Tensor e = zeros({3, 0}, kFloat64);
  const auto av = host_view(base.v, a), bv = host_view(base.v, b), cv = host_view(base.v, c);
  for (int64_t dim : {0, 1, -1, -2}) {
    const int64_t d = dim < 0 ? dim + 2 : dim;
    const Tensor out = ops::cat({a, b, c}, dim);
    std::vector<double> ref;
    if (d == 0) {
      ref = av;
      ref.insert(ref.end(), bv.begin(), bv.end());
      ref.insert(ref.end(), cv.begin(), cv.end());
    } else {
      for (int64_t i = 0; i < 3; ++i)
        for (const auto* v : {&av, &bv, &cv})
          for (int64_t j = 0; j < 8; ++j) ref.push_back((*v)[size_t(i * 8 + j)]);
    }
    CAPTURE(dim);
    check_close(out, ref, 0, 0, "cat");
  }
  // size-0 piece along the cat dim, and the legacy (0,) skip.
  check_close(ops::cat({a, e, b}, 1), values_of(ops::cat({a, b}, 1)), 0, 0, "cat with (3,0)");
  check_close(ops::cat({zeros({0}, kFloat64), a}, 0), av, 0, 0, "cat skips (0,)");
  // dtype mix: float32 + int64 -> float32; bool + int64 -> int64.
  const Tensor mix = ops::cat({a.to(kFloat32), arange(8).view({1, 8})}, 0);
  CHECK(mix.dtype() == kFloat32);
  check_close(mix.narrow(0, 3, 1), {0, 1, 2, 3, 4, 5, 6, 7}, 0, 0, "cat int into float");
  // stack at every position, incl. negative.
  for (int64_t dim = -3; dim <= 2; ++dim) {
    const Tensor s = ops::stack({a, b}, dim);
    const int64_t d = dim < 0 ? dim + 3 : dim;
    std::vector<double> ref;
    for (int64_t i = 0; i < s.numel(); ++i) {
      auto id = unravel(i, s.sizes());
      const int64_t which = id[size_t(d)];
      id.erase(id.begin() + d);
      ref.push_back((which == 0 ? av : bv)[size_t(id[0] * 8 + id[1])]);
    }
    CAPTURE(dim);
    check_close(s, ref, 0, 0, "stack");
  }
  // split/chunk of a transposed view: pieces must read the right elements.
  const Tensor t = b.t();  // (8, 3) contiguous-ish base order
  const auto tv = host_view(base.v, t);
  const std::vector<Tensor> pieces = ops::split(b, 3, -1);  // 8 -> 3, 3, 2
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[2].sizes() == Shape{3, 2});
  check_close(pieces[2], {bv[6], bv[7], bv[14], bv[15], bv[22], bv[23]}, 0, 0, "split last piece");
  const auto ch = ops::chunk(b, 3, 1);
  REQUIRE(ch.size() == 3);
  CHECK(ch[0].sizes() == Shape{3, 3});
  check_close(ch[2], {bv[6], bv[7], bv[14], bv[15], bv[22], bv[23]}, 0, 0, "chunk last piece");
  // torch.chunk(6 elements, 4) gives 3 pieces of 2; chunk(5, 4) gives 2, 2, 1.
  CHECK(ops::chunk(zeros({6}), 4).size() == 3);
  CHECK(ops::chunk(zeros({5}), 4).size() == 3);
  const auto ec = ops::chunk(zeros({0, 2}), 3, 0);
  REQUIRE(ec.size() == 3);
  CHECK(ec[2].sizes() == Shape{0, 2});
  const auto sws = ops::split_with_sizes(t, {0, 5, 0, 3}, 0);
  REQUIRE(sws.size() == 4);
  CHECK(sws[0].sizes() == Shape{0, 3});
  check_close(sws[3], std::vector<double>(tv.begin() + 15, tv.end()), 0, 0, "split_with_sizes");
  check_error([&] { ops::split_with_sizes(t, {4, 5}, 0); }, {"split"});
  check_error([&] { ops::cat({a, zeros({2, 7}, kFloat64)}, 0); }, {"cat"});
  check_error([&] { ops::stack({a, a.t()}, 0); }, {"stack"});
}

// ---------------------------------------------------------------------------------------
// 4. Matrix products
// ---------------------------------------------------------------------------------------

namespace {

/// Reference batched product of row-major a (..., M, K) and b (..., K, N) already broadcast
/// to the same batch count `nb`.
std::vector<double> ref_bmm(const std::vector<double>& a, const std::vector<double>& b, int64_t nb, int64_t m,
                            int64_t k, int64_t n) {
  std::vector<double> out(size_t(nb * m * n), 0.0);
  for (int64_t q = 0; q < nb; ++q)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += a[size_t((q * m + i) * k + p)] * b[size_t((q * k + p) * n + j)];
        out[size_t((q * m + i) * n + j)] = s;
      }
  return out;
}

}  // namespace

TEST_CASE("probe matmul: transposed, broadcast, strided batch operands; K = 0; 1-D operands") {
  const Base base = make_base(2000, 20);
  for (int64_t m : {1, 3, 7}) {
    for (int64_t k : {1, 3, 17}) {
      for (int64_t n : {1, 4}) {
        // a: (2, 1, M, K) as a transposed view; b: (1, 3, K, N) as an expanded, strided view.
        const Tensor a = base.t.narrow(0, 1, 2 * m * k).view({2, 1, k, m}).transpose(-1, -2);
        const Tensor b0 = base.t.narrow(0, 500, 2 * k * n * 2).view({k, 2 * n, 2}).select(2, 1).slice(1, 0, 2 * n, 2);
        const Tensor b = b0.unsqueeze(0).unsqueeze(0).expand({1, 3, k, n});
        const Tensor out = ops::matmul(a, b);
        REQUIRE(out.sizes() == Shape{2, 3, m, n});
        const auto av = host_view(base.v, a.expand({2, 3, m, k}));
        const auto bv = host_view(base.v, b.expand({2, 3, k, n}));
        CAPTURE(m);
        CAPTURE(k);
        CAPTURE(n);
        check_close(out, ref_bmm(av, bv, 6, m, k, n), 1e-12, 1e-12, "broadcast matmul");
        // bmm of the same operands made 3-D (b's batch stride 0).
        const Tensor a3 = a.expand({2, 3, m, k}).reshape({6, m, k});
        const Tensor b3 = b0.unsqueeze(0).expand({6, k, n});
        check_close(ops::bmm(a3, b3), ref_bmm(av, bv, 6, m, k, n), 1e-12, 1e-12, "bmm stride-0 batch");
        // 2-D @ 1-D and 1-D @ 2-D with strided vectors.
        const Tensor v = base.t.slice(0, 1000, 1000 + 3 * k, 3);  // (K)
        const auto vv = host_view(base.v, v);
        const Tensor a2 = a.select(0, 1).select(0, 0);  // (M, K) transposed
        const auto a2v = host_view(base.v, a2);
        const Tensor mv = ops::matmul(a2, v);
        REQUIRE(mv.sizes() == Shape{m});
        check_close(mv, ref_bmm(a2v, vv, 1, m, k, 1), 1e-12, 1e-12, "matrix @ vector");
        const Tensor b2 = b0;  // (K, N)
        const Tensor vm = ops::matmul(v, b2);
        REQUIRE(vm.sizes() == Shape{n});
        check_close(vm, ref_bmm(vv, host_view(base.v, b2), 1, 1, k, n), 1e-12, 1e-12, "vector @ matrix");
        // 1-D @ batched: (K) @ (2, 3, K, N) -> (2, 3, N)
        const Tensor vb = ops::matmul(v, b.expand({2, 3, k, n}));
        REQUIRE(vb.sizes() == Shape{2, 3, n});
        std::vector<double> vbr;
        for (int64_t q = 0; q < 6; ++q)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) s += vv[size_t(p)] * bv[size_t((q * k + p) * n + j)];
            vbr.push_back(s);
          }
        check_close(vb, vbr, 1e-12, 1e-12, "vector @ batch");
        // batched (2, 3, M, K) @ (K): (2, 3, M)
        const Tensor bvv = ops::matmul(a.expand({2, 3, m, k}), v);
        REQUIRE(bvv.sizes() == Shape{2, 3, m});
        std::vector<double> bvr;
        for (int64_t q = 0; q < 6; ++q)
          for (int64_t i = 0; i < m; ++i) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) s += av[size_t((q * m + i) * k + p)] * vv[size_t(p)];
            bvr.push_back(s);
          }
        check_close(bvv, bvr, 1e-12, 1e-12, "batch @ vector");
      }
    }
  }
  // dot of strided vectors, 0-d result.
  const Tensor x = base.t.slice(0, 0, 21, 3), y = base.t.slice(0, 100, 107);
  const Tensor d = ops::matmul(x, y);
  CHECK(d.dim() == 0);
  double dr = 0;
  const auto xv = host_view(base.v, x), yv = host_view(base.v, y);
  for (size_t i = 0; i < 7; ++i) dr += xv[i] * yv[i];
  check_close(d, {dr}, 1e-12, 1e-12, "dot");
  // K = 0: zeros, also for a result that is a view target of garbage memory.
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    check_close(ops::matmul(empty({3, 0}, dt), empty({0, 4}, dt)), std::vector<double>(12, 0.0), 0, 0, "K=0 mm");
    check_close(ops::bmm(empty({2, 3, 0}, dt), empty({2, 0, 2}, dt)), std::vector<double>(12, 0.0), 0, 0, "K=0 bmm");
    check_close(ops::matmul(empty({0}, dt), empty({0}, dt)), {0.0}, 0, 0, "K=0 dot");
    check_close(ops::linear(empty({2, 0}, dt), empty({3, 0}, dt), full({3}, 1.5, dt)), std::vector<double>(6, 1.5), 0,
                0, "K=0 linear with bias");
    CHECK(ops::matmul(empty({0, 3}, dt), empty({3, 4}, dt)).sizes() == Shape{0, 4});
    CHECK(ops::matmul(empty({2, 0, 3, 5}, dt), empty({5, 1}, dt)).sizes() == Shape{2, 0, 3, 1});
  }
  // Shape and dtype errors.
  check_error([&] { ops::matmul(zeros({2, 3}), zeros({4, 2})); }, {"matmul"});
  check_error([&] { ops::matmul(zeros({2, 3}), zeros({3, 2}, kFloat64)); }, {"matmul"});
  check_error([&] { ops::matmul(zeros({2, 2, 3}), zeros({3, 3, 2})); }, {"matmul"});
  check_error([&] { ops::matmul(scalar_tensor(1.0), zeros({3})); }, {"matmul"});
  check_error([&] { ops::bmm(zeros({2, 2, 3}), zeros({1, 3, 2})); }, {"bmm"});
}

TEST_CASE("probe matmul: linear on views (3-D input, transposed weight, strided bias) and 16-bit") {
  const Base base = make_base(2000, 21);
  const Tensor x = base.t.narrow(0, 3, 2 * 5 * 7).view({7, 5, 2}).permute({2, 1, 0});  // (2, 5, 7)
  const Tensor w = base.t.narrow(0, 300, 7 * 3).view({7, 3}).t();                      // (3, 7)
  const Tensor bias = base.t.slice(0, 900, 906, 2);                                    // (3)
  const auto xv = host_view(base.v, x), wv = host_view(base.v, w), bv = host_view(base.v, bias);
  std::vector<double> ref;
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t o = 0; o < 3; ++o) {
      double s = bv[size_t(o)];
      for (int64_t i = 0; i < 7; ++i) s += xv[size_t(r * 7 + i)] * wv[size_t(o * 7 + i)];
      ref.push_back(s);
    }
  check_close(ops::linear(x, w, bias), ref, 1e-12, 1e-12, "linear on views");
  for (DType dt : {kFloat16, kBFloat16, kFloat32}) {
    const Tensor xh = x.to(dt), wh = w.to(dt), bh = bias.to(dt);
    std::vector<double> r16;
    const auto xhv = values_of(xh), whv = values_of(wh), bhv = values_of(bh);
    for (int64_t r = 0; r < 10; ++r)
      for (int64_t o = 0; o < 3; ++o) {
        double s = bhv[size_t(o)];
        for (int64_t i = 0; i < 7; ++i) s += xhv[size_t(r * 7 + i)] * whv[size_t(o * 7 + i)];
        r16.push_back(s);
      }
    CAPTURE(dtype_name(dt));
    check_close(ops::linear(xh, wh, bh), r16, default_rtol(dt), default_rtol(dt) * 4, "linear 16-bit");
    check_close(ops::matmul(xh, wh.t()), values_of(ops::matmul(xh.to(kFloat64), wh.t().to(kFloat64))), default_rtol(dt),
                default_rtol(dt) * 4, "matmul 16-bit");
  }
  // 1-D input to linear: (in) -> (out).
  const Tensor x1 = x.select(0, 1).select(0, 2);  // (7) strided
  CHECK(ops::linear(x1, w, bias).sizes() == Shape{3});
  check_close(ops::linear(x1, w, bias), std::vector<double>(ref.begin() + 21, ref.begin() + 24), 1e-12, 1e-12,
              "linear 1-D input");
}

// ---------------------------------------------------------------------------------------
// 5. Autograd through views, in place, accumulation, grad(), retain_graph
// ---------------------------------------------------------------------------------------

TEST_CASE("probe autograd: gradients through views match finite differences") {
  const Tensor x = leaf({6, 5}, 30);
  const Tensor w = leaf({5, 3}, 31);
  auto f_views = [](const TensorList& in) {
    const Tensor& a = in[0];
    const Tensor& b = in[1];
    Tensor y = matmul(a.t().t().slice(0, 1, 6, 2), b);       // x[1::2] @ w: (3, 3)
    Tensor z = mul(y, a.narrow(1, 1, 3).slice(0, 0, 6, 2));  // times x[::2, 1:4]
    Tensor e = add(z, b.narrow(0, 2, 1).expand({3, 3}));     // plus an expanded row of w
    return sum(mul(e.t(), e.permute({1, 0})), {0});
  };
  check_gradcheck(f_views, {x, w});
  auto f_select = [](const TensorList& in) {
    Tensor y = in[0].unsqueeze(0).expand({2, 6, 5}).select(2, 3);  // (2, 6): stride 0 on dim 0
    return mul(y, y.flatten().view({2, 6}));
  };
  check_gradcheck(f_select, {x});
  auto f_reduce = [](const TensorList& in) {
    const Tensor v = in[0].t();  // (5, 6)
    return add(add(var(v, {1}), mean(v.slice(1, 0, 6, 3), {-1})), amax(v, {1}));
  };
  check_gradcheck(f_reduce, {x});
  auto f_index = [](const TensorList& in) {
    const Tensor idx = from_vector(std::vector<int64_t>{2, 0, 2, 4}, {4});
    Tensor a = index_select(in[0].t(), 1, idx);                                           // (5, 4)
    Tensor g = gather(in[0].t(), 0, from_vector(std::vector<int64_t>{4, 4, 0}, {1, 3}));  // (1, 3)
    Tensor s = index_add(in[1].t(), 1, from_vector(std::vector<int64_t>{1, 1}, {2}), a.narrow(1, 0, 2).narrow(0, 0, 3));
    return add(sum(mul(a, a)), add(sum(g), sum(mul(s, s))));
  };
  check_gradcheck(f_index, {x, w});
  auto f_join = [](const TensorList& in) {
    const auto parts = chunk(in[0].t(), 3, 1);                              // (5, 2) x 3
    Tensor c = cat({parts[2], parts[0], in[1], in[1].narrow(1, 0, 0)}, 1);  // (5, 7), with a size-0 piece
    Tensor s = stack({parts[1], parts[2].slice(0, 0, 5, 1)}, -1);           // (5, 2, 2)
    const auto sp = split(in[1], 2, 1);                                     // (5, 2), (5, 1); only sp[1] used
    return add(sum(mul(c, c), {1}), add(sum(s, {1, 2}), sum(mul(sp[1], sp[1]), {1})));
  };
  check_gradcheck(f_join, {x, w});
  auto f_where = [](const TensorList& in) {
    const Tensor cond = ops::gt(from_vector(random_values(5, 77), {5}, kFloat64), 0.0);
    Tensor a = where(cond, in[0].t().narrow(1, 0, 3).t(), in[1].t());  // (3, 5) both sides
    Tensor b = masked_fill(in[0].slice(0, 0, 6, 2), cond, 0.25);       // (3, 5)
    return mul(a, b);
  };
  check_gradcheck(f_where, {x, w});
  auto f_mm = [](const TensorList& in) {
    Tensor a = in[0].t().unsqueeze(0).expand({2, 5, 6});                        // (2, 5, 6) broadcast batch
    Tensor c = matmul(a.transpose(1, 2), in[1]);                                // (2, 6, 3)
    Tensor l = linear(in[0].slice(0, 0, 6, 2), in[1].t(), in[1].select(0, 4));  // (3, 3)
    return add(sum(mul(c, c), {0}).narrow(0, 0, 3), l);
  };
  check_gradcheck(f_mm, {x, w});
  auto f_loss = [](const TensorList& in) {
    const Tensor target = from_vector(std::vector<int64_t>{2, -100, 0, 2, 1}, {5});
    CrossEntropyOptions o;
    o.label_smoothing = 0.2;
    o.reduction = Reduction::None;
    Tensor a = cross_entropy(in[0].t().narrow(1, 1, 3), target, o);  // logits (5, 3) non-contiguous
    Tensor b = mse_loss(in[1].t(), in[0].narrow(0, 0, 1).narrow(1, 0, 5).t().narrow(0, 0, 3), Reduction::None);
    return add(sum(a), sum(b));
  };
  check_gradcheck(f_loss, {x, w});
  auto f_softmax = [](const TensorList& in) {
    Tensor a = softmax(in[0].t(), 0);
    Tensor b = log_softmax(in[0].slice(1, 0, 5, 2), -1);
    return add(sum(mul(a, a), {0}), sum(b, {0}).narrow(0, 0, 1));
  };
  check_gradcheck(f_softmax, {x});
}

TEST_CASE("probe autograd: .grad accumulation across backward calls, also after a broadcast gradient") {
  const Tensor x = leaf({3, 4}, 40);
  sum(x).backward();  // the gradient of sum is g broadcast back (a stride-0 view)
  check_close(x.grad(), std::vector<double>(12, 1.0), 0, 0, "first grad");
  sum(mul(x, 2.0)).backward();
  check_close(x.grad(), std::vector<double>(12, 3.0), 0, 0, "accumulated grad after a broadcast gradient");
  sum(x.t()).backward();
  check_close(x.grad(), std::vector<double>(12, 4.0), 0, 0, "accumulated grad after a transposed one");
  // The stored .grad must be writable element by element (optimizers and zeroing write into it).
  {
    autograd::NoGradGuard ng;
    const Tensor g = x.grad();
    ops::mul_(g, from_vector(std::vector<double>{1, 2, 3, 4}, {4}, kFloat64));
  }
  check_close(x.grad(), {4, 8, 12, 16, 4, 8, 12, 16, 4, 8, 12, 16}, 0, 0, "in-place scaling of .grad");
  // A leaf used twice gets both contributions; one used through an expand gets the sum.
  const Tensor y = leaf({1, 3}, 41);
  const Tensor z = add(mul(y.expand({4, 3}), y), y.squeeze(0));
  sum(z).backward();
  const auto yv = values_of(y);
  check_close(y.grad(), {8 * yv[0] + 4, 8 * yv[1] + 4, 8 * yv[2] + 4}, 1e-12, 1e-12, "leaf used twice");
  // A non-contiguous leaf gets its gradient in logical order.
  const Tensor xt = random_tensor({3, 5}, kFloat64, 42, Layout::Transposed);
  xt.requires_grad_();
  sum(mul(xt, from_vector(std::vector<double>{1, 2, 3, 4, 5}, {5}, kFloat64))).backward();
  check_close(xt.grad(), {1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5}, 0, 0, "transposed leaf's grad");
  // float32 leaf mixed with a float64 operand: gradient in float32.
  const Tensor f = random_tensor({4}, kFloat32, 43);
  f.requires_grad_();
  sum(mul(f, full({4}, 3.0, kFloat64))).backward();
  CHECK(f.grad().dtype() == kFloat32);
  check_close(f.grad(), {3, 3, 3, 3}, 0, 0, "mixed dtype grad");
}

TEST_CASE("probe autograd: grad() leaves .grad alone; retain_graph; in-place rules on views") {
  const Tensor x = leaf({4}, 50), w = leaf({4}, 51);
  Tensor y = sum(mul(exp(x), w));
  const TensorList g = autograd::grad({y}, {x}, {}, true);
  const auto xv = values_of(x), wv = values_of(w);
  std::vector<double> gref;
  for (size_t i = 0; i < 4; ++i) gref.push_back(std::exp(xv[i]) * wv[i]);
  check_close(g[0], gref, 1e-12, 1e-12, "grad()");
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  y.backward(Tensor(), true);
  y.backward();
  std::vector<double> g2;
  for (double v : gref) g2.push_back(2 * v);
  check_close(x.grad(), g2, 1e-12, 1e-12, "backward twice with retain_graph");
  check_error([&] { y.backward(); }, {});                             // the graph was freed by the last backward
  check_error([&] { autograd::grad({sum(mul(x, 2.0))}, {w}); }, {});  // w unused
  const TensorList gu = autograd::grad({sum(mul(x, 2.0))}, {w, x}, {}, false, true);
  CHECK_FALSE(gu[0].defined());
  check_close(gu[1], {2, 2, 2, 2}, 0, 0, "allow_unused");
  // In place on a view of a leaf that requires grad: throws.
  check_error([&] { add_(x.slice(0, 0, 4, 2), 1.0); }, {});
  check_error([&] { mul_(x.t().t(), 2.0); }, {});
  check_error([&] { add_(x, 1.0); }, {});
  // In place on a view of a non-leaf: throws (frugal does not track views).
  Tensor h = mul(x, 2.0);
  check_error([&] { add_(h.narrow(0, 1, 2), 1.0); }, {});
  // In place on a tensor a node saved: backward throws.
  Tensor e = exp(x);
  add_(e, 1.0);  // exp saved its output e
  check_error([&] { sum(mul(e, e)).backward(); }, {});
  // In place on a non-leaf that nobody saved: the gradient is right.
  const Tensor u = leaf({3}, 52);
  Tensor v = mul(u, 3.0);
  mul_(v, v);  // v = (3u)^2 (other aliases self: copied first, per Note)
  sum(v).backward();
  const auto uv = values_of(u);
  check_close(u.grad(), {18 * uv[0], 18 * uv[1], 18 * uv[2]}, 1e-12, 1e-12, "mul_(v, v)");
}

TEST_CASE("probe inplace: raw in-place ops whose operands alias the output") {
  // a += a^T reads the old a.
  Tensor a = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3}, kFloat64);
  ops::add_(a, a.t());
  check_close(a, {2, 6, 10, 6, 10, 14, 10, 14, 18}, 0, 0, "a += a.t()");
  // A shifted window of the same storage.
  Tensor b = arange(0.0, 8.0, 1.0, kFloat64);
  ops::add_(b.narrow(0, 1, 7), b.narrow(0, 0, 7));
  check_close(b, {0, 1, 3, 5, 7, 9, 11, 13}, 0, 0, "b[1:] += b[:-1]");
  Tensor c = arange(0.0, 8.0, 1.0, kFloat64);
  ops::mul_(c.narrow(0, 0, 7), c.narrow(0, 1, 7));
  check_close(c, {0, 2, 6, 12, 20, 30, 42, 7}, 0, 0, "c[:-1] *= c[1:]");
  // Broadcast other that lives inside self.
  Tensor d = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64);
  ops::sub_(d, d.select(0, 0));
  check_close(d, {0, 0, 0, 3, 3, 3}, 0, 0, "d -= d[0]");
  Tensor d2 = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64);
  ops::div_(d2, d2.narrow(1, 2, 1));
  check_close(d2, {1.0 / 3, 2.0 / 3, 1, 4.0 / 6, 5.0 / 6, 1}, 1e-15, 0, "d2 /= d2[:, 2:3]");
  // masked_fill_ with a mask computed from x itself on a strided view.
  Tensor m = arange(0.0, 10.0, 1.0, kFloat32);
  ops::masked_fill_(m.slice(0, 0, 10, 3), ops::gt(m.slice(0, 0, 10, 3), 2.0), -1.0);
  check_close(m, {0, 1, 2, -1, 4, 5, -1, 7, 8, -1}, 0, 0, "masked_fill_ strided");
  // copy_ between overlapping windows: the result must be the old source (or an error).
  Tensor s = arange(0.0, 6.0, 1.0, kFloat64);
  bool threw = false;
  try {
    ops::copy_into(s.narrow(0, 1, 5), s.narrow(0, 0, 5));
  } catch (const Error&) { threw = true; }
  if (!threw) check_close(s, {0, 0, 1, 2, 3, 4}, 0, 0, "overlapping copy");
  // Writing in place into a tensor with internal overlap (stride 0): PyTorch refuses;
  // here it must throw or give the right value (each element once).
  Tensor one = zeros({1}, kFloat64);
  threw = false;
  try {
    ops::add_(one.expand({4}), 1.0);
  } catch (const Error&) { threw = true; }
  if (!threw) check_close(one, {1}, 0, 0, "add_ into an expanded tensor");
  Tensor two = zeros({1}, kFloat64);
  threw = false;
  try {
    ops::add_(two.expand({4}), from_vector(std::vector<double>{1, 2, 3, 4}, {4}, kFloat64));
  } catch (const Error&) { threw = true; }
  CHECK_MESSAGE(threw, "add_ of 4 distinct values into one element through an expand gave ", values_of(two)[0]);
}

// ---------------------------------------------------------------------------------------
// Random as_strided fuzz: any sizes (0..4, up to 4 dims), strides (0..7, overlapping or
// not), offsets, against host_view references.
// ---------------------------------------------------------------------------------------

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

/// A random strided view of a base holding at least 2000 elements.
Tensor random_view(const Tensor& base, Rng& rng, bool allow_empty = true) {
  const int64_t nd = rng.below(5);
  Shape sizes(static_cast<size_t>(nd)), strides(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) {
    sizes[size_t(d)] = rng.below(allow_empty ? 5 : 4) + (allow_empty ? 0 : 1);
    if (rng.below(6) == 0) sizes[size_t(d)] = 1;
    strides[size_t(d)] = rng.below(8);
    if (rng.below(3) == 0) strides[size_t(d)] = 1;
    if (rng.below(4) == 0 && d > 0) strides[size_t(d)] = sizes[size_t(d - 1)] * strides[size_t(d - 1)] + 1;
  }
  return base.as_strided(sizes, strides, rng.below(50));
}

}  // namespace

TEST_CASE("probe fuzz: reductions of random strided views") {
  const Base base = make_base(4000, 60);
  Rng rng{12345};
  for (int iter = 0; iter < 400; ++iter) {
    const Tensor x = random_view(base.t, rng);
    const std::vector<double> xv = host_view(base.v, x);
    const int64_t nd = x.dim();
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < nd; ++d)
      if (rng.below(2)) dims.push_back(rng.below(2) ? d : d - nd);
    const bool keepdim = rng.below(2);
    CAPTURE(shape_str(x.sizes()));
    CAPTURE(shape_str(x.strides()));
    CAPTURE(x.storage_offset());
    CAPTURE(shape_str(dims));
    CAPTURE(keepdim);
    check_close(ops::sum(x, dims, keepdim), ref_reduce(xv, x.sizes(), dims, R::Sum), 1e-12, 1e-12, "sum");
    check_close(ops::mean(x, dims, keepdim), ref_reduce(xv, x.sizes(), dims, R::Mean), 1e-12, 1e-12, "mean");
    check_close(ops::var(x, dims, 1, keepdim), ref_reduce(xv, x.sizes(), dims, R::Var), 1e-9, 1e-12, "var");
    bool empty_reduced = false;
    for (int64_t d = 0; d < nd; ++d)
      if (x.size(d) == 0 &&
          (dims.empty() || std::count(dims.begin(), dims.end(), d) || std::count(dims.begin(), dims.end(), d - nd)))
        empty_reduced = true;
    if (x.numel() == 0 && dims.empty()) empty_reduced = true;
    if (empty_reduced) {
      check_error([&] { ops::amax(x, dims, keepdim); }, {"amax"});
    } else {
      check_close(ops::amax(x, dims, keepdim), ref_reduce(xv, x.sizes(), dims, R::Max), 0, 0, "amax");
      check_close(ops::amin(x, dims, keepdim), ref_reduce(xv, x.sizes(), dims, R::Min), 0, 0, "amin");
    }
    if (nd > 0) {
      const int64_t d = rng.below(nd);
      if (x.size(d) > 0) {
        const ops::ValuesIndices m = ops::max(x, d, keepdim);
        check_close(m.values, ref_reduce(xv, x.sizes(), {d}, R::Max), 0, 0, "max.values");
        check_close(m.indices, ref_reduce(xv, x.sizes(), {d}, R::ArgMax), 0, 0, "max.indices");
        check_close(ops::argmin(x, d, keepdim), ref_reduce(xv, x.sizes(), {d}, R::ArgMin), 0, 0, "argmin");
      }
    }
  }
}

TEST_CASE("probe fuzz: elementwise, copies, softmax and index_select on random strided views") {
  const Base base = make_base(4000, 61);
  const Base base32 = make_base(4000, 62, kFloat32);
  Rng rng{777};
  for (int iter = 0; iter < 300; ++iter) {
    const Tensor x = random_view(base.t, rng);
    const std::vector<double> xv = host_view(base.v, x);
    CAPTURE(shape_str(x.sizes()));
    CAPTURE(shape_str(x.strides()));
    CAPTURE(x.storage_offset());
    check_close(x.contiguous(), xv, 0, 0, "contiguous");
    check_close(x.to(kFloat32), values_of(from_vector(xv, {int64_t(xv.size())}, kFloat64).to(kFloat32)), 0, 0,
                "to(float32)");
    // Binary with a second random view broadcast against it (a trailing slice of x's shape).
    Shape bs = x.sizes();
    if (!bs.empty() && rng.below(2)) bs[0] = 1;
    if (bs.size() > 1 && rng.below(2)) bs.erase(bs.begin());
    const Tensor y = base32.t.as_strided(bs, contiguous_strides(bs), rng.below(100));
    const std::vector<double> yv = host_view(base32.v, y);
    const Tensor z = ops::add(x, y, 0.5);
    CHECK(z.dtype() == kFloat64);
    std::vector<double> zref(xv.size());
    for (size_t i = 0; i < xv.size(); ++i)
      zref[i] = xv[i] + 0.5 * yv[size_t(broadcast_index(unravel(int64_t(i), x.sizes()), bs))];
    check_close(z, zref, 1e-15, 1e-15, "add broadcast mixed dtype");
    const Tensor mx = ops::maximum(y, x);
    std::vector<double> mref(xv.size());
    for (size_t i = 0; i < xv.size(); ++i)
      mref[i] = std::max(xv[i], yv[size_t(broadcast_index(unravel(int64_t(i), x.sizes()), bs))]);
    check_close(mx, mref, 0, 0, "maximum");
    check_close(
        ops::exp(x),
        [&] {
          std::vector<double> r;
          for (double v : xv) r.push_back(std::exp(v));
          return r;
        }(),
        1e-14, 0, "exp");
    if (x.dim() > 0) {
      const int64_t d = rng.below(x.dim());
      if (x.numel() > 0) {
        // softmax along d
        const Tensor sm = ops::softmax(x, d);
        const Tensor lsm = ops::log_softmax(x, d - x.dim());
        std::vector<double> sref(xv.size()), lref(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) {
          auto idx = unravel(int64_t(i), x.sizes());
          double mxv = -1e300, s = 0;
          for (int64_t k = 0; k < x.size(d); ++k) {
            idx[size_t(d)] = k;
            int64_t lin = 0;
            for (size_t q = 0; q < idx.size(); ++q) lin = lin * x.sizes()[q] + idx[q];
            mxv = std::max(mxv, xv[size_t(lin)]);
          }
          for (int64_t k = 0; k < x.size(d); ++k) {
            idx[size_t(d)] = k;
            int64_t lin = 0;
            for (size_t q = 0; q < idx.size(); ++q) lin = lin * x.sizes()[q] + idx[q];
            s += std::exp(xv[size_t(lin)] - mxv);
          }
          sref[i] = std::exp(xv[i] - mxv) / s;
          lref[i] = xv[i] - mxv - std::log(s);
        }
        check_close(sm, sref, 1e-12, 1e-14, "softmax");
        check_close(lsm, lref, 1e-12, 1e-12, "log_softmax");
      }
      if (x.size(d) > 0) {
        const std::vector<int64_t> iv = {x.size(d) - 1, 0, x.size(d) - 1};
        const Tensor is = ops::index_select(x, d, from_vector(iv, {3}));
        Shape os = x.sizes();
        os[size_t(d)] = 3;
        std::vector<double> iref;
        for (int64_t i = 0; i < numel_of(os); ++i) {
          auto idx = unravel(i, os);
          idx[size_t(d)] = iv[size_t(idx[size_t(d)])];
          int64_t lin = 0;
          for (size_t q = 0; q < idx.size(); ++q) lin = lin * x.sizes()[q] + idx[q];
          iref.push_back(xv[size_t(lin)]);
        }
        check_close(is, iref, 0, 0, "index_select");
        // cat of x with itself along d, and a split back
        const Tensor c = ops::cat({x, x.narrow(d, 0, 1), x}, d);
        check_close(c.narrow(d, x.size(d) + 1, x.size(d)), xv, 0, 0, "cat third piece");
        check_close(c.narrow(d, x.size(d), 1), values_of(x.narrow(d, 0, 1).contiguous()), 0, 0, "cat middle");
      }
    }
  }
}

TEST_CASE("probe fuzz: matmul on random strided operands") {
  const Base base = make_base(4000, 63);
  Rng rng{4242};
  for (int iter = 0; iter < 200; ++iter) {
    const int64_t m = rng.below(4) + (rng.below(4) == 0 ? 0 : 1), k = rng.below(5), n = rng.below(4) + 1;
    const int64_t batch = rng.below(3) + 1;
    // Random strides (possibly 0, possibly overlapping) for a (batch, M, K) and b (batch or 1, K, N).
    auto rand_view = [&](int64_t b0, int64_t r, int64_t c) {
      return base.t.as_strided({b0, r, c}, {rng.below(3) * 17, rng.below(6), rng.below(6)}, rng.below(40));
    };
    const Tensor a = rand_view(batch, m, k);
    const Tensor b = rand_view(rng.below(2) ? batch : 1, k, n);
    CAPTURE(shape_str(a.sizes()));
    CAPTURE(shape_str(a.strides()));
    CAPTURE(shape_str(b.sizes()));
    CAPTURE(shape_str(b.strides()));
    const auto av = host_view(base.v, a), bv = host_view(base.v, b.expand({batch, k, n}));
    check_close(ops::matmul(a, b), ref_bmm(av, bv, batch, m, k, n), 1e-12, 1e-12, "matmul");
    if (b.size(0) == batch) check_close(ops::bmm(a, b), ref_bmm(av, bv, batch, m, k, n), 1e-12, 1e-12, "bmm");
    const Tensor w = base.t.as_strided({n, k}, {rng.below(6), rng.below(6)}, rng.below(40));
    const auto wv = host_view(base.v, w);
    std::vector<double> lref;
    for (int64_t q = 0; q < batch * m; ++q)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += av[size_t(q * k + p)] * wv[size_t(j * k + p)];
        lref.push_back(s);
      }
    check_close(ops::linear(a, w), lref, 1e-12, 1e-12, "linear");
  }
}

// ---------------------------------------------------------------------------------------
// 6. Losses
// ---------------------------------------------------------------------------------------

namespace {

/// Reference cross entropy rows of row-major (R, C) logits: {loss per row, valid}.
std::vector<double> ref_ce_rows(const std::vector<double>& z, int64_t R, int64_t C, const std::vector<int64_t>& t,
                                int64_t ignore, double eps) {
  std::vector<double> out;
  for (int64_t r = 0; r < R; ++r) {
    if (t[size_t(r)] == ignore) {
      out.push_back(0.0);
      continue;
    }
    if (t[size_t(r)] < 0 || t[size_t(r)] >= C) {  // a bad target: the op must throw; no row to read
      out.push_back(std::nan(""));
      continue;
    }
    double mx = -1e300, s = 0, mean = 0;
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, z[size_t(r * C + c)]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(z[size_t(r * C + c)] - mx), mean += z[size_t(r * C + c)] / C;
    const double lse = mx + std::log(s);
    out.push_back((1 - eps) * (lse - z[size_t(r * C + t[size_t(r)])]) + eps * (lse - mean));
  }
  return out;
}

}  // namespace

TEST_CASE("probe loss: cross_entropy on views, ignore_index, label smoothing, reductions, empty batches") {
  const Base base = make_base(2000, 70);
  // logits (N=4, C=3, d1=5) built as a permuted view; target (4, 5) transposed int32.
  const Tensor logits = base.t.narrow(0, 9, 60).view({5, 4, 3}).permute({1, 2, 0});  // (4, 3, 5)
  const auto lv = host_view(base.v, logits);
  std::vector<int32_t> tv_t = {0, 2, -100, 1, 2, 1, 1, 0, -100, 2, 0, 0, 2, 1, 1, 1, -100, 2, 0, 2};  // (5, 4)
  const Tensor target = from_vector(tv_t, {5, 4}, kInt32).t();                                        // (4, 5)
  std::vector<int64_t> tv;
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t d = 0; d < 5; ++d) tv.push_back(tv_t[size_t(d * 4 + n)]);
  // rows (n, d) with classes last
  std::vector<double> z;
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t d = 0; d < 5; ++d)
      for (int64_t c = 0; c < 3; ++c) z.push_back(lv[size_t((n * 3 + c) * 5 + d)]);
  for (double eps : {0.0, 0.3}) {
    for (int64_t ignore : {int64_t(-100), int64_t(2)}) {
      const auto rows = ref_ce_rows(z, 20, 3, tv, ignore, eps);
      double total = 0;
      int64_t count = 0;
      for (size_t r = 0; r < rows.size(); ++r) total += rows[r], count += tv[r] != ignore;
      CrossEntropyOptions o;
      o.ignore_index = ignore;
      o.label_smoothing = eps;
      CAPTURE(eps);
      CAPTURE(ignore);
      if (ignore == 2) {
        // -100 is now an ordinary (bad) target: it must throw.
        check_error([&] { ops::cross_entropy(logits, target, o); }, {"cross_entropy"});
        continue;
      }
      o.reduction = Reduction::None;
      check_close(ops::cross_entropy(logits, target, o).loss, rows, 1e-12, 1e-12, "none");
      o.reduction = Reduction::Sum;
      check_close(ops::cross_entropy(logits, target, o).loss, {total}, 1e-12, 1e-12, "sum");
      o.reduction = Reduction::Mean;
      check_close(ops::cross_entropy(logits, target, o).loss, {total / double(count)}, 1e-12, 1e-12, "mean");
    }
  }
  // ignore_index = 2 with only valid targets.
  {
    CrossEntropyOptions o;
    o.ignore_index = 2;
    o.label_smoothing = 0.1;
    const Tensor t2 = ops::masked_fill(target.to(kInt64), ops::lt(target, 0.0), 1.0);
    const auto t2v = t2.tolist<int64_t>();
    const auto rows = ref_ce_rows(z, 20, 3, t2v, 2, 0.1);
    double total = 0;
    int64_t count = 0;
    for (size_t r = 0; r < rows.size(); ++r) total += rows[r], count += t2v[r] != 2;
    check_close(ops::cross_entropy(logits, t2, o).loss, {total / double(count)}, 1e-12, 1e-12, "ignore 2 mean");
  }
  // All ignored: mean NaN (as torch), sum 0, none zeros; gradient zeros for sum, NaN-free for none.
  const Tensor all_ignored = full({3}, -100.0, kInt64);
  const Tensor l2 = base.t.narrow(0, 0, 12).view({4, 3}).t();  // (3, 4)
  CrossEntropyOptions o;
  check_close(ops::cross_entropy(l2, all_ignored, o).loss, {kNaN}, 0, 0, "all ignored mean");
  o.reduction = Reduction::Sum;
  check_close(ops::cross_entropy(l2, all_ignored, o).loss, {0}, 0, 0, "all ignored sum");
  o.reduction = Reduction::None;
  check_close(ops::cross_entropy(l2, all_ignored, o).loss, {0, 0, 0}, 0, 0, "all ignored none");
  // Empty batch.
  o.reduction = Reduction::Mean;
  check_close(ops::cross_entropy(zeros({0, 3}), zeros({0}, kInt64), o).loss, {kNaN}, 0, 0, "empty mean");
  o.reduction = Reduction::Sum;
  check_close(ops::cross_entropy(zeros({0, 3}), zeros({0}, kInt64), o).loss, {0}, 0, 0, "empty sum");
  // 1-D logits with a 0-d target; C = 1.
  o.reduction = Reduction::Mean;
  const Tensor l1 = base.t.slice(0, 0, 9, 2);  // (5)
  const auto l1v = host_view(base.v, l1);
  check_close(ops::cross_entropy(l1, scalar_tensor(3.0, kInt64), o).loss, ref_ce_rows(l1v, 1, 5, {3}, -100, 0), 1e-12,
              1e-12, "1-D logits");
  check_close(ops::cross_entropy(ones({4, 1}), zeros({4}, kInt64), o).loss, {0}, 0, 1e-7, "C = 1");
  check_error([&] { ops::cross_entropy(ones({4, 3}), full({4}, 3.0, kInt64), o); }, {"cross_entropy"});
  check_error([&] { ops::cross_entropy(ones({4, 3}), full({4}, -1.0, kInt64), o); }, {"cross_entropy"});
}

TEST_CASE("probe loss: cross_entropy and mse_loss gradients, incl. all-ignored and non-contiguous grad_loss") {
  // Gradient of sum(loss_none * W^T) with the loss (N, d1) transposed: the incoming grad is a
  // non-contiguous (transposed) tensor.
  const Tensor logits = leaf({3, 4, 5}, 80);
  const Tensor target = from_vector(std::vector<int64_t>{0, 3, -100, 1, 2, 3, 3, 0, -100, 1, 2, 2, 0, 0, 1}, {3, 5});
  const Tensor W = from_vector(random_values(15, 81), {5, 3}, kFloat64);
  auto f = [&](const TensorList& in) {
    CrossEntropyOptions o;
    o.reduction = Reduction::None;
    o.label_smoothing = 0.15;
    Tensor l = cross_entropy(in[0], target, o);  // (3, 5)
    return sum(mul(l.t(), W), {1});
  };
  check_gradcheck(f, {logits});
  auto fm = [&](const TensorList& in) {
    CrossEntropyOptions o;
    o.label_smoothing = 0.15;
    return cross_entropy(in[0].permute({0, 2, 1}).contiguous().permute({0, 2, 1}), target, o);
  };
  check_gradcheck(fm, {logits});
  // All ignored, mean: the loss is NaN; the logits' gradient is 0 * (1/0) per row. PyTorch
  // gives NaN too (0/0); what matters is that sum/none give exact zeros.
  const Tensor l = leaf({2, 3}, 82);
  CrossEntropyOptions os;
  os.reduction = Reduction::Sum;
  cross_entropy(l, full({2}, -100.0, kInt64), os).backward();
  check_close(l.grad(), std::vector<double>(6, 0.0), 0, 0, "all-ignored sum grad");
  // mse_loss: broadcast target, reductions, both gradients.
  const Tensor a = leaf({4, 3}, 83), b = leaf({3}, 84);
  for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
    auto fl = [r](const TensorList& in) { return mse_loss(in[0].t(), in[1].unsqueeze(1), r); };  // (3,4) vs (3,1)
    check_gradcheck(fl, {a, b});
  }
  const auto av = values_of(a), bv = values_of(b);
  double s = 0;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      s += (av[size_t(i * 3 + j)] - bv[size_t(j)]) * (av[size_t(i * 3 + j)] - bv[size_t(j)]);
  check_close(ops::mse_loss(a.detach().t(), b.detach().unsqueeze(1), Reduction::Mean), {s / 12}, 1e-12, 1e-12,
              "mse mean");
  check_close(ops::mse_loss(a.detach().t(), b.detach().unsqueeze(1), Reduction::Sum), {s}, 1e-12, 1e-12, "mse sum");
  check_close(ops::mse_loss(zeros({0, 2}), zeros({0, 2}), Reduction::Mean), {kNaN}, 0, 0, "mse empty mean");
  // 16-bit cross entropy matches float64 on the rounded logits.
  for (DType dt : {kFloat16, kBFloat16}) {
    const Tensor lh = random_tensor({5, 7}, dt, 85, Layout::Transposed);
    const Tensor th = from_vector(std::vector<int64_t>{6, 0, -100, 3, 3}, {5});
    CrossEntropyOptions o;
    o.label_smoothing = 0.05;
    const auto rows = ref_ce_rows(values_of(lh), 5, 7, th.tolist<int64_t>(), -100, 0.05);
    double tot = 0;
    for (double v : rows) tot += v;
    CAPTURE(dtype_name(dt));
    check_close(ops::cross_entropy(lh, th, o).loss, {tot / 4}, default_rtol(dt), 0, "16-bit ce");
  }
}

TEST_CASE("probe autograd: reduction gradients with ties, empty dims, max indices on views") {
  // amax gradient shared evenly among ties, read through a strided view.
  const Tensor x = from_vector(std::vector<double>{3, 0, 1, 0, 3, 0, 2, 0}, {8}, kFloat64);
  x.requires_grad_();
  amax(x.slice(0, 0, 8, 2), {0}).backward();  // view: 3, 1, 3, 2 -> ties at 0 and 2
  check_close(x.grad(), {0.5, 0, 0, 0, 0.5, 0, 0, 0}, 0, 0, "amax ties through a slice");
  const Tensor y = from_vector(std::vector<double>{1, 5, 5, 2, 5, 0}, {2, 3}, kFloat64);
  y.requires_grad_();
  sum(max(y.t(), 1).values).backward();  // rows of y^T: (1,2), (5,5), (5,0): first max
  check_close(y.grad(), {0, 1, 1, 1, 0, 0}, 0, 0, "max values grad to the first index");
  const Tensor yy = from_vector(std::vector<double>{1, 5, 5, 2, 5, 0}, {2, 3}, kFloat64);
  yy.requires_grad_();
  sum(amin(yy, {0, 1}, true)).backward();
  check_close(yy.grad(), {0, 0, 0, 0, 0, 1}, 0, 0, "amin all dims keepdim");
  // Empty reductions: sum over an empty dim gives zero gradient of the right shape.
  const Tensor e = zeros({0, 3}, kFloat64);
  e.requires_grad_();
  sum(sum(e, {0})).backward();
  CHECK(e.grad().sizes() == Shape{0, 3});
  const Tensor e2 = zeros({2, 0}, kFloat64);
  e2.requires_grad_();
  sum(mean(e2, {0})).backward();
  CHECK(e2.grad().sizes() == Shape{2, 0});
  // var with correction: gradcheck on a strided view.
  check_gradcheck([](const TensorList& in) { return var(in[0].slice(1, 0, 7, 3), {-1}, 0, true); }, {leaf({4, 7}, 90)});
  check_gradcheck([](const TensorList& in) { return var(in[0].t(), {}, 1); }, {leaf({3, 2}, 91)});
}

// ---------------------------------------------------------------------------------------
// Dtype edges: int64 beyond 2^53 must stay exact; promotion rules; bool arithmetic.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe dtype: int64 beyond 2^53 stays exact through ops that take integers") {
  const int64_t big = (int64_t(1) << 53) + 1;                                             // not representable in double
  const Tensor x = from_vector(std::vector<int64_t>{big, -big, big + 2, 5}, {2, 2}).t();  // transposed view
  // x^T = [[big, big+2], [-big, 5]]
  CHECK(ops::add(x, 1.0).tolist<int64_t>() == std::vector<int64_t>{big + 1, big + 3, -big + 1, 6});
  CHECK(ops::sub(x, x, 1.0).tolist<int64_t>() == std::vector<int64_t>{0, 0, 0, 0});
  CHECK(ops::add(x, ones({2, 2}, kInt64), 2.0).tolist<int64_t>() ==
        std::vector<int64_t>{big + 2, big + 4, -big + 2, 7});
  CHECK(ops::mul(x, 1.0).tolist<int64_t>() == std::vector<int64_t>{big, big + 2, -big, 5});
  CHECK(ops::add(x, ones({1}, kInt32)).tolist<int64_t>() == std::vector<int64_t>{big + 1, big + 3, -big + 1, 6});
  CHECK(ops::maximum(x, full({1}, 3.0, kInt64)).tolist<int64_t>() == std::vector<int64_t>{big, big + 2, 3, 5});
  CHECK(ops::eq(x, double(big - 1)).tolist<bool>() == std::vector<bool>{false, false, false, false});
  CHECK(ops::gt(x.select(1, 1), x.select(1, 0)).tolist<bool>() == std::vector<bool>{true, true});
  CHECK(ops::neg(x).tolist<int64_t>() == std::vector<int64_t>{-big, -big - 2, big, -5});
  CHECK(ops::abs(x).tolist<int64_t>() == std::vector<int64_t>{big, big + 2, big, 5});
  CHECK(ops::relu(x).tolist<int64_t>() == std::vector<int64_t>{big, big + 2, 0, 5});
  // Reductions.
  CHECK(ops::sum(x, {1}).tolist<int64_t>() == std::vector<int64_t>{2 * big + 2, -big + 5});
  CHECK(ops::amax(x, {1}).tolist<int64_t>() == std::vector<int64_t>{big + 2, 5});
  CHECK(ops::amin(x, {0}).tolist<int64_t>() == std::vector<int64_t>{-big, 5});
  const Tensor near = from_vector(std::vector<int64_t>{big - 1, big, big + 1, big}, {4});
  CHECK(ops::argmax(near, 0).item<int64_t>() == 2);  // big+1 > big in int64 (equal in double)
  CHECK(ops::max(near, 0).values.item<int64_t>() == big + 1);
  CHECK(ops::argmin(near, 0).item<int64_t>() == 0);
  // Data movement.
  CHECK(ops::where(ops::gt(x, 0.0), x, ops::neg(x)).tolist<int64_t>() == std::vector<int64_t>{big, big + 2, big, 5});
  CHECK(ops::cat({x, x}, 0).tolist<int64_t>() == std::vector<int64_t>{big, big + 2, -big, 5, big, big + 2, -big, 5});
  CHECK(ops::index_select(x, 1, from_vector(std::vector<int64_t>{1}, {1})).tolist<int64_t>() ==
        std::vector<int64_t>{big + 2, 5});
  CHECK(ops::gather(x, 0, from_vector(std::vector<int64_t>{1, 0}, {1, 2})).tolist<int64_t>() ==
        std::vector<int64_t>{-big, big + 2});
  CHECK(x.contiguous().tolist<int64_t>() == std::vector<int64_t>{big, big + 2, -big, 5});
  CHECK(ops::scatter_add(zeros({2}, kInt64), 0, from_vector(std::vector<int64_t>{1, 1}, {2}),
                         from_vector(std::vector<int64_t>{big, 1}, {2}))
            .tolist<int64_t>() == std::vector<int64_t>{0, big + 1});
  CHECK(ops::index_add(zeros({2}, kInt64), 0, from_vector(std::vector<int64_t>{0, 0}, {2}),
                       from_vector(std::vector<int64_t>{big, 1}, {2}))
            .tolist<int64_t>() == std::vector<int64_t>{big + 1, 0});
}

TEST_CASE("probe dtype: promotion of mixed tensors and scalars, bool arithmetic") {
  const Tensor i32 = from_vector(std::vector<int32_t>{7, -7, 3}, {3});
  const Tensor i64 = from_vector(std::vector<int64_t>{2, 2, -2}, {3});
  const Tensor b = from_vector(std::vector<bool>{true, false, true}, {3});
  const Tensor h = from_vector(std::vector<double>{0.5, 1.5, -2.5}, {3}, kFloat16);
  const Tensor bf = from_vector(std::vector<double>{0.5, 1.5, -2.5}, {3}, kBFloat16);
  CHECK(ops::add(i32, i64).dtype() == kInt64);
  CHECK(ops::add(i32, i64).tolist<int64_t>() == std::vector<int64_t>{9, -5, 1});
  const Tensor q = ops::div(i32, i64);
  CHECK(q.dtype() == kFloat32);
  check_close(q, {3.5, -3.5, -1.5}, 0, 0, "int / int true division");
  CHECK(ops::add(h, bf).dtype() == kFloat32);
  CHECK(ops::add(h, i64).dtype() == kFloat16);
  check_close(ops::add(h, i64), {2.5, 3.5, -4.5}, 0, 0, "f16 + i64");
  CHECK(ops::add(b, 1.0).dtype() == kInt64);
  CHECK(ops::add(b, 1.0).tolist<int64_t>() == std::vector<int64_t>{2, 1, 2});
  CHECK(ops::mul(b, 2.5).dtype() == kFloat32);
  check_close(ops::mul(b, 2.5), {2.5, 0, 2.5}, 0, 0, "bool * 2.5");
  CHECK(ops::add(i32, 0.5).dtype() == kFloat32);
  check_close(ops::add(i32, 0.5), {7.5, -6.5, 3.5}, 0, 0, "int + 0.5");
  CHECK(ops::mul(i32, 2.0).dtype() == kInt32);
  CHECK(ops::add(b, i32).dtype() == kInt32);
  CHECK(ops::add(b, i32).tolist<int32_t>() == std::vector<int32_t>{8, -7, 4});
  check_error([&] { ops::add(b, b); }, {"add"});
  CHECK(ops::div(i32, 2.0).dtype() == kFloat32);
  check_close(ops::div(i32, 2.0), {3.5, -3.5, 1.5}, 0, 0, "int / 2.0");
  CHECK(ops::div(b, b).dtype() == kFloat32);
  // Integer pow: exact; a negative exponent is an error in PyTorch for integers.
  CHECK(ops::pow(i64, from_vector(std::vector<int64_t>{10, 0, 3}, {3})).tolist<int64_t>() ==
        std::vector<int64_t>{1024, 1, -8});
  // f16 comparisons against an f32 operand compare in f32.
  CHECK(ops::eq(h, from_vector(std::vector<double>{0.5, 1.5, -2.5}, {3}, kFloat32)).tolist<bool>() ==
        std::vector<bool>{true, true, true});
  // Comparisons with a non-integral scalar against an int tensor compare as floats.
  CHECK(ops::lt(i32, 3.5).tolist<bool>() == std::vector<bool>{false, true, true});
  CHECK(ops::eq(i32, 3.5).tolist<bool>() == std::vector<bool>{false, false, false});
  CHECK(ops::ge(i32, -7.0).tolist<bool>() == std::vector<bool>{true, true, true});
  // where with a 0-d operand, masked_fill with a non-integral value into int: PyTorch truncates? It errors
  // for a float value into an int tensor only in newer versions; frugal documents "dtype of x".
  CHECK(ops::where(b, scalar_tensor(1.0, kFloat64), i32).dtype() == kFloat64);
  check_close(ops::where(b, scalar_tensor(1.0, kFloat64), i32), {1, -7, 1}, 0, 0, "where 0-d");
  check_error([&] { ops::where(ops::add(b, 1.0), i32, i32); }, {"where"});
}

// ---------------------------------------------------------------------------------------
// View construction: bounds, errors, and gradients of every view op.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe views: slice/narrow/select/view/reshape/squeeze bounds and values") {
  const Base base = make_base(120, 100);
  const Tensor x = base.t.view({4, 5, 6});
  auto hv = [&](const Tensor& t) { return host_view(base.v, t); };
  // python-like slice bounds
  CHECK(x.slice(1, -2, 5).sizes() == Shape{4, 2, 6});
  CHECK(x.slice(1, 3, 2).sizes() == Shape{4, 0, 6});
  CHECK(x.slice(1, 0, 100, 7).sizes() == Shape{4, 1, 6});
  CHECK(x.slice(2, -100, 100, 4).sizes() == Shape{4, 5, 2});
  CHECK(x.slice(-1, 1, 6, 2).sizes() == Shape{4, 5, 3});
  check_close(
      x.slice(-1, 1, 6, 2),
      [&] {
        std::vector<double> r;
        for (int64_t i = 0; i < 4; ++i)
          for (int64_t j = 0; j < 5; ++j)
            for (int64_t k = 1; k < 6; k += 2) r.push_back(base.v[size_t((i * 5 + j) * 6 + k)]);
        return r;
      }(),
      0, 0, "slice step 2 on dim -1");
  CHECK_ERROR_AT([&] { x.slice(1, 0, 5, 0); }, {});
  CHECK_ERROR_AT([&] { x.slice(1, 0, 5, -1); }, {});
  // select negative index
  check_close(x.select(1, -1), hv(x.select(1, 4)), 0, 0, "select -1");
  CHECK_ERROR_AT([&] { x.select(1, 5); }, {});
  CHECK_ERROR_AT([&] { x.select(1, -6); }, {});
  CHECK_ERROR_AT([&] { x.narrow(1, 3, 3); }, {});
  CHECK_ERROR_AT([&] { x.narrow(1, 0, -1); }, {});
  // view: allowed on compatible strides, refused otherwise; reshape copies then.
  CHECK_ERROR_AT([&] { x.transpose(0, 1).view({-1}); }, {});
  CHECK_ERROR_AT([&] { x.slice(1, 0, 5, 2).view({12, 6}); }, {});  // strides (30, 12, 1): no dims merge
  CHECK_ERROR_AT([&] { x.slice(1, 0, 5, 2).view({4, 18}); }, {});
  check_close(x.slice(2, 0, 6, 2).view({4, 15}), hv(x.slice(2, 0, 6, 2)), 0, 0, "legal view of a step-2 slice");
  CHECK(x.slice(0, 0, 4, 2).view({2, 30}).sizes() == Shape{2, 30});  // rows merge: legal view
  check_close(x.slice(0, 0, 4, 2).view({2, 30}), hv(x.slice(0, 0, 4, 2)), 0, 0, "view of a row slice");
  const Tensor r = x.transpose(0, 2).reshape({6, 20});
  check_close(r, hv(x.transpose(0, 2)), 0, 0, "reshape of a transpose");
  check_close(x.permute({2, 0, 1}).flatten(1), hv(x.permute({2, 0, 1})), 0, 0, "flatten(1) of a permute");
  check_close(x.permute({1, 2, 0}).flatten(), hv(x.permute({1, 2, 0})), 0, 0, "flatten of a permute");
  // view with size-1 dims of odd strides, and an expanded tensor viewed (merging stride-0 dims).
  const Tensor e = base.t.narrow(0, 3, 4).view({4, 1}).expand({4, 3});  // strides (1, 0)
  check_close(e.reshape({12}), hv(e), 0, 0, "reshape of an expand");
  const Tensor e2 = base.t.narrow(0, 3, 4).view({1, 4}).expand({3, 4});  // strides (0, 1)
  check_close(e2.reshape({2, 6}), hv(e2), 0, 0, "reshape of a leading expand");
  check_close(e2.unsqueeze(1).reshape({3, 2, 2}), hv(e2), 0, 0, "reshape of an expand into (3,2,2)");
  // squeeze(dim) on a non-1 dim is a no-op; squeeze() drops every 1.
  CHECK(x.squeeze(1).sizes() == Shape{4, 5, 6});
  CHECK(x.unsqueeze(-1).sizes() == Shape{4, 5, 6, 1});
  CHECK(x.unsqueeze(0).unsqueeze(2).squeeze().sizes() == Shape{4, 5, 6});
  CHECK(x.unflatten(2, {2, 3}).sizes() == Shape{4, 5, 2, 3});
  CHECK(x.unflatten(-1, {-1, 2}).sizes() == Shape{4, 5, 3, 2});
  check_close(x.transpose(1, 2).unflatten(1, {3, 2}), hv(x.transpose(1, 2)), 0, 0, "unflatten of a transpose");
  // expand errors and -1
  CHECK(base.t.narrow(0, 0, 3).view({3, 1}).expand({2, -1, 4}).sizes() == Shape{2, 3, 4});
  CHECK_ERROR_AT([&] { x.expand({4, 6, 6}); }, {});
  CHECK_ERROR_AT([&] { x.expand({5, 6}); }, {});
  // as_strided beyond the storage throws.
  CHECK_ERROR_AT([&] { base.t.as_strided({11, 11}, {11, 1}, 0); }, {});
  CHECK_ERROR_AT([&] { base.t.as_strided({2}, {1}, 119); }, {});
  CHECK(base.t.as_strided({0, 5}, {1000, 1000}, 120).numel() == 0);
  CHECK_ERROR_AT([&] { x.permute({0, 0, 1}); }, {});
  CHECK_ERROR_AT([&] { x.permute({0, 1}); }, {});
  CHECK_ERROR_AT([&] { x.transpose(0, 3); }, {});
  check_close(x.transpose(-1, -3), hv(x.transpose(2, 0)), 0, 0, "transpose negative dims");
}

TEST_CASE("probe views: gradients of view ops, overlapping as_strided included") {
  // as_strided is not differentiable here: it must say so rather than give a wrong gradient.
  const Tensor x = leaf({6}, 111);
  check_error([&] { x.as_strided({3, 3}, {1, 1}, 0); }, {"as_strided"});
  check_gradcheck([](const TensorList& in) { return in[0].transpose(0, 2).reshape({4, 6}); }, {leaf({2, 3, 4}, 113)});
  check_gradcheck(
      [](const TensorList& in) {
        return in[0].permute({1, 2, 0}).flatten(0, 1).unflatten(0, {2, 6});
      },
      {leaf({2, 3, 4}, 114)});
  check_gradcheck(
      [](const TensorList& in) {
        return in[0].unsqueeze(1).expand({2, 5, 3, 4}).select(2, -1).squeeze();
      },
      {leaf({2, 3, 4}, 115)});
  check_gradcheck([](const TensorList& in) { return in[0].slice(2, -3, 4, 2).narrow(1, 1, 2).select(0, 1); },
                  {leaf({2, 3, 4}, 116)});
  check_gradcheck(
      [](const TensorList& in) {
        return in[0].view({6, 4}).t().contiguous().view({2, 12});
      },
      {leaf({2, 3, 4}, 117)});
  const Tensor xf = leaf({2, 3}, 119);
  sum(mul(xf.t().to(kFloat32), from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}, kFloat32))).backward();
  CHECK(xf.grad().dtype() == kFloat64);
  check_close(xf.grad(), {1, 3, 5, 2, 4, 6}, 0, 0, "gradient through to(float32) of a transpose");
  // clone of a view, then in place on the clone: the leaf's gradient sees the clone's op.
  check_gradcheck(
      [](const TensorList& in) {
        Tensor c = in[0].t().clone();
        mul_(c, 3.0);
        add_(c.narrow(0, 0, 1).clone(), 1.0);  // on a clone of a view: does not touch c
        return c;
      },
      {leaf({3, 2}, 118)});
}

// ---------------------------------------------------------------------------------------
// Extras: infinities in softmax/cross entropy, layer_norm and masked_softmax on views,
// 16-bit scatter accumulation, one_hot edges.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe extras: -inf entries, layer_norm and masked_softmax on views, 16-bit scatter") {
  const double inf = std::numeric_limits<double>::infinity();
  // softmax with -inf entries and an all -inf row (NaN as torch).
  const Tensor s = from_vector(std::vector<double>{0, -inf, -inf, 1, -inf, -inf, 2, 2, -inf}, {3, 3}, kFloat32).t();
  // s: rows (0, 1, 2), (-inf, -inf, 2), (-inf, -inf, -inf)
  const double e = std::exp(1.0), e2 = std::exp(2.0), z = 1 + e + e2;
  check_close(ops::softmax(s, 1), {1 / z, e / z, e2 / z, 0, 0, 1, kNaN, kNaN, kNaN}, 1e-6, 1e-7, "softmax -inf");
  check_close(ops::log_softmax(s, 1).narrow(0, 1, 1), {-inf, -inf, 0}, 0, 0, "log_softmax -inf");
  // masked_softmax: an all-masked row gives zeros (documented), on a transposed score view.
  const Tensor mask = from_vector(std::vector<bool>{true, false, false, true, false, false}, {2, 3});
  const Tensor sc = from_vector(std::vector<double>{1, 4, 2, 5, 3, 6}, {3, 2}, kFloat64).t();  // (2, 3): 1 2 3 / 4 5 6
  check_close(ops::masked_softmax(sc, mask), {1, 0, 0, 1, 0, 0}, 0, 0, "masked_softmax one kept");
  check_close(ops::masked_softmax(sc, ops::logical_not(ops::logical_or(mask, ops::logical_not(mask)))),
              std::vector<double>(6, 0.0), 0, 0, "masked_softmax all masked");
  // causal, scale, on an expanded batch
  const Tensor sq = from_vector(random_values(9, 120), {1, 3, 3}, kFloat64).expand({2, 3, 3});
  const auto sqv = values_of(sq);
  std::vector<double> cref;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t l = 0; l < 3; ++l) {
      double mx = -1e300, tot = 0;
      for (int64_t c = 0; c <= l; ++c) mx = std::max(mx, 0.5 * sqv[size_t(l * 3 + c)]);
      for (int64_t c = 0; c <= l; ++c) tot += std::exp(0.5 * sqv[size_t(l * 3 + c)] - mx);
      for (int64_t c = 0; c < 3; ++c) cref.push_back(c <= l ? std::exp(0.5 * sqv[size_t(l * 3 + c)] - mx) / tot : 0.0);
    }
  check_close(ops::masked_softmax(sq, Tensor(), true, 0.5), cref, 1e-12, 1e-14, "causal masked_softmax");
  // cross entropy with -inf on non-target classes: finite; -inf on the target: inf.
  const Tensor lg = from_vector(std::vector<double>{0, -inf, 1, 3, -inf, 2}, {2, 3}, kFloat64);
  CrossEntropyOptions o;
  o.reduction = Reduction::None;
  check_close(ops::cross_entropy(lg, from_vector(std::vector<int64_t>{0, 0}, {2}), o).loss,
              {std::log(1 + e), std::log(1 + std::exp(-1.0))}, 1e-12, 0, "ce with -inf logits");
  check_close(ops::cross_entropy(lg, from_vector(std::vector<int64_t>{1, 0}, {2}), o).loss.narrow(0, 0, 1), {inf}, 0, 0,
              "ce with -inf target logit");
  // layer_norm over the last two dims of a permuted view, with strided weight/bias.
  const Base base = make_base(400, 121);
  const Tensor x = base.t.narrow(0, 5, 60).view({5, 3, 4}).permute({1, 2, 0});  // (3, 4, 5)
  const Tensor w = base.t.slice(0, 100, 140, 2).view({4, 5});
  const Tensor bb = base.t.narrow(0, 200, 20).view({5, 4}).t();
  const auto xv = host_view(base.v, x), wv = host_view(base.v, w), bv = host_view(base.v, bb);
  std::vector<double> lref;
  for (int64_t r = 0; r < 3; ++r) {
    double m = 0, q = 0;
    for (int64_t i = 0; i < 20; ++i) m += xv[size_t(r * 20 + i)] / 20;
    for (int64_t i = 0; i < 20; ++i) q += (xv[size_t(r * 20 + i)] - m) * (xv[size_t(r * 20 + i)] - m) / 20;
    for (int64_t i = 0; i < 20; ++i)
      lref.push_back((xv[size_t(r * 20 + i)] - m) / std::sqrt(q + 1e-5) * wv[size_t(i)] + bv[size_t(i)]);
  }
  check_close(ops::layer_norm(x, {4, 5}, w, bb).out, lref, 1e-12, 1e-12, "layer_norm on views");
  check_gradcheck(
      [&](const TensorList& in) {
        return layer_norm(in[0].permute({1, 2, 0}), {4, 5}, in[1].t(), in[2]);
      },
      {leaf({5, 3, 4}, 122), leaf({5, 4}, 123), leaf({4, 5}, 124)});
  // 16-bit scatter_add / index_add / embedding_backward with many duplicates: the sum of
  // 300 copies of 0.1 must be near 30 (one rounding), not stuck where float16 steps exceed 0.1.
  for (DType dt : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const Tensor src = full({300, 2}, 0.1, dt);
    const Tensor r1 = ops::scatter_add(zeros({1, 2}, dt), 0, zeros({300, 2}, kInt64), src);
    check_close(r1, {30, 30}, 2 * default_rtol(dt), 0, "scatter_add 16-bit duplicates");
    const Tensor r2 = ops::index_add(zeros({1, 2}, dt), 0, zeros({300}, kInt64), src);
    check_close(r2, {30, 30}, 2 * default_rtol(dt), 0, "index_add 16-bit duplicates");
    const Tensor r3 = ops::embedding_backward(src, zeros({300}, kInt32), 2, -1);
    check_close(r3, {30, 30, 0, 0}, 2 * default_rtol(dt), 0, "embedding_backward 16-bit duplicates");
    check_close(ops::sum(src, {0}), {30, 30}, 2 * default_rtol(dt), 0, "sum 16-bit");
  }
  // one_hot: inferred classes, explicit, out of range, empty.
  const Tensor oh = ops::one_hot(from_vector(std::vector<int64_t>{2, 0, 2}, {3, 1}).t());  // (1, 3) -> (1, 3, 3)
  CHECK(oh.sizes() == Shape{1, 3, 3});
  CHECK(oh.tolist<int64_t>() == std::vector<int64_t>{0, 0, 1, 1, 0, 0, 0, 0, 1});
  check_error([&] { ops::one_hot(from_vector(std::vector<int64_t>{3}, {1}), 3); }, {"one_hot"});
  check_error([&] { ops::one_hot(from_vector(std::vector<int64_t>{-1}, {1}), 3); }, {"one_hot"});
  CHECK(ops::one_hot(zeros({0}, kInt64), 4).sizes() == Shape{0, 4});
}

TEST_CASE("probe autograd: user-set .grad layouts, non-contiguous grad_outputs, detach aliasing") {
  const Tensor w = from_vector(std::vector<double>{1, 2, 3}, {3}, kFloat64);
  // A .grad the user set to a stride-0 tensor: accumulation must throw or be right.
  const Tensor x = leaf({3}, 130);
  x.set_grad(zeros({1}, kFloat64).expand({3}));
  bool threw = false;
  try {
    sum(mul(x, w)).backward();
  } catch (const Error&) { threw = true; }
  if (!threw) check_close(x.grad(), {1, 2, 3}, 0, 0, "accumulation into a user-set expanded .grad");
  // A .grad set to a transposed tensor accumulates in logical order.
  const Tensor y = leaf({2, 3}, 131);
  y.set_grad(from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}, kFloat64).t());  // [[1,3,5],[2,4,6]]
  sum(mul(y, w)).backward();
  check_close(y.grad(), {2, 5, 8, 3, 6, 9}, 0, 0, "accumulation into a transposed .grad");
  // backward with a non-contiguous, broadcast gradient.
  const Tensor z = leaf({2, 3}, 132);
  mul(z, 2.0).backward(from_vector(std::vector<double>{1, 2, 3}, {3}, kFloat64).unsqueeze(0).expand({2, 3}));
  check_close(z.grad(), {2, 4, 6, 2, 4, 6}, 0, 0, "backward with an expanded gradient");
  check_error([&] { mul(z, 2.0).backward(); }, {});                        // not one element, no gradient
  check_error([&] { mul(z, 2.0).backward(ones({3, 2}, kFloat64)); }, {});  // wrong shape
  // grad() with a transposed grad_output.
  const Tensor u = leaf({2, 3}, 133);
  const TensorList g =
      autograd::grad({mul(u, u)}, {u}, {from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}, kFloat64).t()});
  const auto uv = values_of(u);
  const double go[] = {1, 3, 5, 2, 4, 6};
  std::vector<double> gref;
  for (size_t i = 0; i < 6; ++i) gref.push_back(2 * uv[i] * go[i]);
  check_close(g[0], gref, 1e-12, 1e-12, "grad() with a transposed grad_output");
  // In place through a detached alias of a saved tensor: backward must throw, not use the new value.
  const Tensor v = leaf({3}, 134);
  Tensor ev = exp(v);
  Tensor d = ev.detach();
  ops::add_(d, 1.0);
  check_error(
      [&] {
        sum(ev).backward();
        sum(mul(ev, ev)).backward();
      },
      {});
  // retain_grad on a non-leaf view.
  const Tensor p = leaf({2, 3}, 135);
  Tensor pt = mul(p, 1.0).t();
  pt.retain_grad();
  sum(mul(pt, from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}, kFloat64))).backward();
  check_close(pt.grad(), {1, 2, 3, 4, 5, 6}, 0, 0, "retained grad of a transposed non-leaf");
  check_close(p.grad(), {1, 3, 5, 2, 4, 6}, 0, 0, "leaf grad through the transpose");
  // NoGradGuard: nothing recorded.
  {
    autograd::NoGradGuard ng;
    CHECK_FALSE(mul(p, 2.0).requires_grad());
  }
}

// ---------------------------------------------------------------------------------------
// Sizes past the CPU kernels' parallel grain (32768 elements), on views: the threaded
// split of rows, columns and long reductions.
// ---------------------------------------------------------------------------------------

TEST_CASE("probe large: threaded reductions, elementwise, joins and indexing on views") {
  const Base base = make_base(3 * 70001 + 64, 140, kFloat32);
  // Long rows (few outputs, R = 70001), transposed and offset: (70001, 3) viewed both ways.
  const Tensor cols = base.t.narrow(0, 7, 3 * 70001).view({70001, 3});
  const Tensor rows = cols.t();  // (3, 70001) with stride (1, 3)
  const auto rv = host_view(base.v, rows);
  for (const Tensor& x : {rows, cols}) {
    const auto xv = x.sizes()[0] == 3 ? rv : host_view(base.v, x);
    CAPTURE(shape_str(x.sizes()));
    for (int64_t d : {0, 1}) {
      CAPTURE(d);
      check_close(ops::sum(x, {d}), ref_reduce(xv, x.sizes(), {d}, R::Sum), 1e-5, 1e-3, "sum");
      check_close(ops::var(x, {d}), ref_reduce(xv, x.sizes(), {d}, R::Var), 1e-5, 1e-5, "var");
      check_close(ops::amax(x, {d}), ref_reduce(xv, x.sizes(), {d}, R::Max), 0, 0, "amax");
      check_close(ops::argmin(x, d), ref_reduce(xv, x.sizes(), {d}, R::ArgMin), 0, 0, "argmin");
    }
    check_close(ops::sum(x), ref_reduce(xv, x.sizes(), {}, R::Sum), 1e-5, 1e-2, "sum all");
    check_close(ops::argmax(x.flatten(), 0), ref_reduce(values_of(x.flatten()), {x.numel()}, {0}, R::ArgMax), 0, 0,
                "argmax flat");
  }
  // Elementwise with a broadcast operand, and a contiguous copy of the transpose.
  const Tensor bias = base.t.slice(0, 0, 3 * 70001, 70001).unsqueeze(1);  // (3, 1), stride 70001
  const auto bv = host_view(base.v, bias);
  const Tensor sum2 = ops::add(rows, bias);
  std::vector<double> ref(rv.size());
  for (size_t i = 0; i < rv.size(); ++i) ref[i] = double(float(rv[i] + bv[i / 70001]));
  check_close(sum2, ref, 1e-7, 1e-7, "add broadcast large");
  check_close(rows.contiguous(), rv, 0, 0, "contiguous of a large transpose");
  check_close(
      ops::exp(rows.to(kFloat64)),
      [&] {
        std::vector<double> r;
        for (double v : rv) r.push_back(std::exp(v));
        return r;
      }(),
      1e-14, 0, "exp large");
  // softmax / log_softmax over long rows and over many short rows.
  for (int64_t d : {0, 1}) {
    const Tensor sm = ops::softmax(cols, d);
    CAPTURE(d);
    check_close(ops::sum(sm, {d}), std::vector<double>(size_t(cols.size(1 - d)), 1.0), 1e-4, 0, "softmax sums to 1");
  }
  // cat along both dims, index_select and gather with many indices.
  const Tensor c = ops::cat({rows, rows.narrow(1, 5, 11)}, 1);
  check_close(c.narrow(1, 70001, 11), values_of(rows.narrow(1, 5, 11)), 0, 0, "cat large tail");
  check_close(c.narrow(1, 0, 70001), rv, 0, 0, "cat large head");
  std::vector<int64_t> idx(50000);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int64_t((i * 7919) % 70001);
  const Tensor is = ops::index_select(rows, 1, from_vector(idx, {int64_t(idx.size())}));
  std::vector<double> isr;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i : idx) isr.push_back(rv[size_t(r * 70001 + i)]);
  check_close(is, isr, 0, 0, "index_select large");
  const Tensor ga = ops::gather(cols, 0, from_vector(idx, {int64_t(idx.size()), 1}).expand({int64_t(idx.size()), 3}));
  std::vector<double> gar;
  for (int64_t i : idx)
    for (int64_t r = 0; r < 3; ++r) gar.push_back(rv[size_t(r * 70001 + i)]);
  check_close(ga, gar, 0, 0, "gather large");
  // scatter_add with many duplicates into few rows.
  std::vector<int64_t> sidx(60000);
  for (size_t i = 0; i < sidx.size(); ++i) sidx[i] = int64_t(i % 5);
  const Tensor src = ones({60000, 2}, kFloat64);
  const Tensor sa = ops::scatter_add(zeros({5, 2}, kFloat64), 0, from_vector(sidx, {60000, 1}).expand({60000, 2}), src);
  check_close(sa, std::vector<double>(10, 12000.0), 0, 0, "scatter_add large");
  // cross entropy and layer_norm with many rows.
  const Tensor lg = base.t.narrow(0, 0, 40000 * 5).view({5, 40000}).t().to(kFloat64);  // (40000, 5)
  std::vector<int64_t> tg(40000);
  for (size_t i = 0; i < tg.size(); ++i) tg[i] = i % 7 == 0 ? -100 : int64_t(i % 5);
  const auto lgv = values_of(lg);
  const auto rowsr = ref_ce_rows(lgv, 40000, 5, tg, -100, 0.1);
  double tot = 0;
  int64_t cnt = 0;
  for (size_t i = 0; i < rowsr.size(); ++i) tot += rowsr[i], cnt += tg[i] != -100;
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  check_close(ops::cross_entropy(lg, from_vector(tg, {40000}), o).loss, {tot / double(cnt)}, 1e-12, 0, "ce large");
  const Tensor ln = ops::layer_norm(lg, {5}).out;
  check_close(ops::mean(ln, {1}), std::vector<double>(40000, 0.0), 0, 1e-12, "layer_norm large mean 0");
  // matmul with a large batch of tiny transposed matrices.
  const Tensor a = lg.view({8000, 5, 5}).transpose(1, 2);
  const auto av = values_of(a);
  check_close(ops::bmm(a, a), ref_bmm(av, av, 8000, 5, 5, 5), 1e-12, 1e-12, "bmm large batch");
}

TEST_CASE("probe edges: 0-d keepdim, chunk counts, split sizes") {
  const Tensor s = scalar_tensor(2.5, kFloat32);
  CHECK(ops::sum(s, {0}, true).dim() == 0);
  CHECK(ops::mean(s, {-1}, true).dim() == 0);
  CHECK(ops::max(s, 0, true).indices.dim() == 0);
  const auto ch = ops::chunk(arange(3), 5);
  REQUIRE(ch.size() == 3);
  CHECK(ch[2].tolist<int64_t>() == std::vector<int64_t>{2});
  check_error([&] { ops::chunk(arange(3), 0); }, {"chunk"});
  check_error([&] { ops::split(arange(3), 0); }, {"split"});
  CHECK(ops::split(zeros({0}), 0).size() == 1);
  const auto sp = ops::split(arange(7).slice(0, 0, 7, 2), 3);  // 0 2 4 6 -> (0 2 4), (6)
  REQUIRE(sp.size() == 2);
  CHECK(sp[1].tolist<int64_t>() == std::vector<int64_t>{6});
}

TEST_CASE("probe views: writes into an expanded view are refused naming the op; fill_ and zero_ are allowed") {
  // base.expand(4, 3) has 12 elements over 3 memory locations: copy_ kept only the last row
  // written (9, 10, 11) and uniform_ wrote its draws over each other, with no error. PyTorch
  // refuses both ("more than one element of the written-to tensor refers to a single memory
  // location"); fill_ writes one value everywhere, which is well defined, and is allowed.
  const Tensor base = zeros({3});
  const Tensor e = base.expand({4, 3});
  const Tensor rows = arange(0, 12).reshape({4, 3}).to(kFloat32);
  const uint64_t offset = default_generator().offset();
  check_error([&] { ops::copy_into(e, rows); }, {"copy_", "float32[4, 3]", "expanded view", "clone()"});
  check_error([&] { e.copy_(rows); }, {"copy_", "expanded view"});
  check_error([&] { ops::uniform_(e, 0.0, 1.0); }, {"uniform_", "expanded view"});
  check_error([&] { ops::normal_(e, 0.0, 1.0); }, {"normal_", "expanded view"});
  check_error([&] { ops::random_int_(e, 0, 5); }, {"randint", "expanded view"});
  check_error([&] { ops::masked_fill_(e, ones({4, 3}, kBool), 2.0); }, {"masked_fill_", "expanded view"});
  check_error([&] { ops::add_(e, rows); }, {"add_", "expanded view"});
  CHECK(values_of(base) == std::vector<double>{0.0, 0.0, 0.0});
  CHECK(default_generator().offset() == offset);  // a refused fill draws nothing
  ops::fill_(e, 5.0);
  CHECK(values_of(base) == std::vector<double>{5.0, 5.0, 5.0});
  // A size-1 dimension with stride 0 shares nothing: writes go through.
  const Tensor one = zeros({1, 3}).expand({1, 3});
  ops::copy_into(one, rows.narrow(0, 1, 1));
  CHECK(values_of(one) == std::vector<double>{3.0, 4.0, 5.0});
}
