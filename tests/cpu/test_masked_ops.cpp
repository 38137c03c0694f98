// isnan / isinf / isfinite (tensor/ops/unary.h), nonzero and masked_select (tensor/ops/masked.h)
// and lerp / lerp_ (tensor/ops/binary.h): against naive float64 loops in every dtype and layout,
// against PyTorch 1.13's values (tools/torch_golden_masked.py prints them), and their gradients
// against finite differences and PyTorch; the errors and the refusal inside a graph capture.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/masked.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/graph_capture.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/masked.h"
#include "tensor/ops/unary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/fake_capture.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr DType kFloating[] = {kFloat64, kFloat32, kFloat16, kBFloat16};

/// tools/torch_golden_masked.py's special(): zeros of both signs, NaN, infinities, a denormal.
std::vector<double> special_values() { return {0.0, -0.0, 1.5, kNaN, kInf, -kInf, 0.0, -2.0, kNaN, 3.0, -0.0, 1e-40}; }

/// tools/torch_golden_masked.py's ramp(): 0.25 (i % 7) - 0.6 in row-major order.
Tensor ramp(const Shape& shape, DType dt = kFloat64) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25 * double(i % 7) - 0.6;
  return from_vector(v, shape, TensorOptions(kFloat64)).to(dt);
}

/// Element-by-element equality, NaN equal to NaN and -0 told from +0.
void check_same_bits(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": ", got.size(), " elements vs ", want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = (std::isnan(got[i]) && std::isnan(want[i])) ||
                      (got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]));
    CHECK_MESSAGE(same, what, " [", i, "]: ", got[i], " vs ", want[i]);
  }
}

/// Layouts of a tensor of `shape` holding `values` row-major: contiguous, transposed, strided.
std::vector<std::pair<std::string, Tensor>> layouts_of(const std::vector<double>& values, const Shape& shape,
                                                       DType dt) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (Layout l : kAllLayouts) out.emplace_back(name_of(dt, l), make_tensor(values, shape, dt, l));
  return out;
}

/// A float64 leaf for gradcheck (which takes contiguous leaves) and the view of it an op gets:
/// contiguous (r, c), transposed (the .t() of a (c, r) leaf) or strided (every other column of
/// an (r, 2c) leaf).
std::pair<Tensor, std::function<Tensor(const Tensor&)>> leaf_in_layout(int64_t r, int64_t c, Layout l, uint64_t seed) {
  if (l == Layout::Transposed) return {leaf({c, r}, seed), [](const Tensor& t) { return t.t(); }};
  if (l == Layout::Strided) return {leaf({r, 2 * c}, seed), [c](const Tensor& t) { return t.slice(1, 0, 2 * c, 2); }};
  return {leaf({r, c}, seed), [](const Tensor& t) { return t; }};
}

/// The naive references: row-major walks over the logical indices.
std::vector<int64_t> nonzero_reference(const std::vector<double>& v, const Shape& shape) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < int64_t(v.size()); ++i) {
    if (v[size_t(i)] == 0.0) continue;  // NaN != 0: counted
    for (int64_t c : unravel(i, shape)) out.push_back(c);
  }
  return out;
}

std::vector<double> masked_select_reference(const std::vector<double>& x, const Shape& xs, const std::vector<double>& m,
                                            const Shape& ms) {
  const Shape shape = broadcast_shapes(xs, ms, "reference");
  std::vector<double> out;
  for (int64_t i = 0; i < numel_of(shape); ++i) {
    const std::vector<int64_t> idx = unravel(i, shape);
    if (m[size_t(broadcast_index(idx, ms))] != 0.0) out.push_back(x[size_t(broadcast_index(idx, xs))]);
  }
  return out;
}

double lerp_reference(double s, double e, double w) { return w < 0.5 ? s + w * (e - s) : e - (e - s) * (1.0 - w); }

}  // namespace

// ---- isnan, isinf, isfinite ---------------------------------------------------------

TEST_CASE("isnan / isinf / isfinite: PyTorch's values on NaN, infinities and -0, every floating dtype and layout") {
  // torch.isnan(special().t()) and so on (tools/torch_golden_masked.py).
  const std::vector<double> want_nan = {0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0};
  const std::vector<double> want_inf = {0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<double> want_finite = {1, 0, 0, 1, 0, 1, 1, 1, 1, 0, 1, 1};
  for (DType dt : kFloating) {
    const Tensor x = from_vector(special_values(), {3, 4}, TensorOptions(kFloat64)).to(dt);
    const Tensor xt = x.t();  // non-contiguous
    for (auto [name, fn, want] :
         {std::tuple{"isnan", &ops::isnan, want_nan}, std::tuple{"isinf", &ops::isinf, want_inf},
          std::tuple{"isfinite", &ops::isfinite, want_finite}}) {
      const Tensor r = fn(xt);
      CHECK(r.dtype() == kBool);
      CHECK(r.sizes() == Shape{4, 3});
      check_same_bits(values_of(r), want, std::string(name) + " " + dtype_name(dt));
    }
    // The differentiable layer forwards them (nothing recorded).
    check_same_bits(values_of(isnan(xt)), want_nan, "frugal::isnan");
    check_same_bits(values_of(isinf(xt)), want_inf, "frugal::isinf");
    check_same_bits(values_of(isfinite(xt)), want_finite, "frugal::isfinite");
  }
}

TEST_CASE("isnan / isinf / isfinite: naive reference on random layouts with specials; integer, bool, size-0 inputs") {
  std::vector<double> v = random_values(6 * 10, 11, -1e4, 1e4);
  for (size_t i = 0; i < v.size(); i += 5) v[i] = (i / 5) % 3 == 0 ? kNaN : (i / 5) % 3 == 1 ? kInf : -kInf;
  for (DType dt : kFloating) {
    for (auto& [what, x] : layouts_of(v, {6, 10}, dt)) {
      const std::vector<double> xv = values_of(x);  // after rounding to dt (1e4 stays finite in float16)
      std::vector<double> n, f, inf;
      for (double e : xv) {
        n.push_back(std::isnan(e));
        inf.push_back(std::isinf(e));
        f.push_back(std::isfinite(e));
      }
      check_same_bits(values_of(ops::isnan(x)), n, "isnan " + what);
      check_same_bits(values_of(ops::isinf(x)), inf, "isinf " + what);
      check_same_bits(values_of(ops::isfinite(x)), f, "isfinite " + what);
    }
  }
  // A strided slice of a 3-D tensor and an expanded one.
  const Tensor big = from_vector(v, {3, 4, 5}, TensorOptions(kFloat32));
  const Tensor sl = big.slice(2, 1, 5, 2).slice(0, 0, 3, 2);
  const std::vector<double> slv = values_of(sl);
  std::vector<double> want;
  for (double e : slv) want.push_back(std::isnan(e));
  check_same_bits(values_of(ops::isnan(sl)), want, "isnan of a strided slice");
  const Tensor ex = from_vector(std::vector<double>{kNaN, 1.0}, {2, 1}, TensorOptions(kFloat32)).expand({2, 3});
  check_same_bits(values_of(ops::isnan(ex)), {1, 1, 1, 0, 0, 0}, "isnan of an expanded tensor");
  // Integer and bool inputs: never NaN or infinite.
  for (DType dt : {kInt32, kInt64, kBool, kUInt8}) {
    const Tensor x = make_tensor({0, 1, 1, 0, 1, 1}, {2, 3}, dt, Layout::Contiguous);
    CHECK(values_of(ops::isnan(x.t())) == std::vector<double>(6, 0.0));
    CHECK(values_of(ops::isinf(x)) == std::vector<double>(6, 0.0));
    CHECK(values_of(ops::isfinite(x)) == std::vector<double>(6, 1.0));
    CHECK(ops::isfinite(x.t()).sizes() == Shape{3, 2});
    CHECK(ops::isnan(x).dtype() == kBool);
  }
  for (DType dt : {kFloat32, kInt64}) {
    const Tensor e = empty({3, 0, 2}, dt);
    CHECK(ops::isnan(e).sizes() == Shape{3, 0, 2});
    CHECK(ops::isfinite(e).dtype() == kBool);
  }
  CHECK(ops::isinf(scalar_tensor(-kInf, kFloat64)).item<bool>());
  check_error([] { ops::isnan(Tensor()); }, {"isnan", "undefined"});
}

// ---- nonzero ----------------------------------------------------------------------

TEST_CASE("nonzero: PyTorch's indices on a transposed and a strided view (NaN counts, -0 does not), every dtype") {
  for (DType dt : kFloating) {
    const Tensor x = from_vector(special_values(), {3, 4}, TensorOptions(kFloat64)).to(dt);
    const Tensor r = ops::nonzero(x.t());
    CHECK(r.dtype() == kInt64);
    std::vector<int64_t> want = {0, 1, 0, 2, 1, 1, 1, 2, 2, 0, 3, 0, 3, 1, 3, 2};
    if (dt == kFloat16) want.resize(14);  // 1e-40 (the last row) is 0 in float16, as torch's .half() gives
    CHECK(r.sizes() == Shape{int64_t(want.size()) / 2, 2});
    CHECK(r.tolist<int64_t>() == want);
    CHECK(ops::nonzero(x.slice(1, 0, 4, 2)).tolist<int64_t>() == std::vector<int64_t>{0, 1, 1, 0, 2, 0});
    CHECK(nonzero(x.t()).tolist<int64_t>() == r.tolist<int64_t>());  // frugal::nonzero forwards
  }
}

TEST_CASE("nonzero: naive reference in every dtype and layout; 0-d, size-0, all-false and all-true inputs") {
  const DType all[] = {kFloat64, kFloat32, kFloat16, kBFloat16, kInt32, kInt64, kBool, kUInt8};
  std::vector<double> v = random_values(5 * 7, 3, 0.0, 1.0);
  for (double& e : v) e = e < 0.6 ? 0.0 : std::floor(e * 10.0);
  for (DType dt : all) {
    for (auto& [what, x] : layouts_of(v, {5, 7}, dt)) {
      const Tensor r = ops::nonzero(x);
      const std::vector<int64_t> want = nonzero_reference(values_of(x), x.sizes());
      CHECK_MESSAGE((r.sizes() == Shape{int64_t(want.size()) / 2, 2}), what);
      CHECK_MESSAGE(r.tolist<int64_t>() == want, what);
    }
  }
  // 3-D with an expanded dim.
  const Tensor e3 = from_vector(std::vector<double>{1, 0, 2}, {3, 1, 1}, TensorOptions(kFloat32)).expand({3, 2, 2});
  CHECK(ops::nonzero(e3).tolist<int64_t>() == nonzero_reference(values_of(e3), {3, 2, 2}));
  // 0-d: (1, 0) or (0, 0), as torch.
  CHECK(ops::nonzero(scalar_tensor(5.0, kFloat32)).sizes() == Shape{1, 0});
  CHECK(ops::nonzero(scalar_tensor(0.0, kInt64)).sizes() == Shape{0, 0});
  CHECK(ops::nonzero(empty({2, 0, 3}, kFloat32)).sizes() == Shape{0, 3});
  CHECK(ops::nonzero(zeros({4, 5}, kFloat32)).sizes() == Shape{0, 2});
  const Tensor ones_ = full({3, 2}, 1.0, kBool);
  CHECK(ops::nonzero(ones_).tolist<int64_t>() == std::vector<int64_t>{0, 0, 0, 1, 1, 0, 1, 1, 2, 0, 2, 1});
  // Large enough for the parallel chunks: every 3rd element.
  std::vector<double> big(300001, 0.0);
  for (size_t i = 0; i < big.size(); i += 3) big[i] = 1.0;
  const Tensor rb = ops::nonzero(from_vector(big, {300001}, TensorOptions(kFloat32)));
  REQUIRE(rb.sizes() == Shape{100001, 1});
  const std::vector<int64_t> rbv = rb.tolist<int64_t>();
  bool ordered = true;
  for (size_t k = 0; k < rbv.size(); ++k) ordered = ordered && rbv[k] == int64_t(3 * k);
  CHECK(ordered);
  check_error([] { ops::nonzero(Tensor()); }, {"nonzero", "undefined"});
}

// ---- masked_select ------------------------------------------------------------------

TEST_CASE("masked_select: PyTorch's values and gradients, a transposed input and a broadcast mask or input") {
  // x (2, 3, 4) seen as (4, 3, 2), mask (3, 1) broadcast (tools/torch_golden_masked.py).
  Tensor x = ramp({2, 3, 4});
  x.requires_grad_();
  const Tensor mask = from_vector(std::vector<double>{1, 0, 1}, {3, 1}, TensorOptions(kFloat64)).to(kBool);
  const Tensor y = masked_select(x.transpose(0, 2), mask);
  check_close(y, {-0.6, 0.65, -0.35, 0.9, -0.35, 0.9, -0.1, -0.6, -0.1, -0.6, 0.15, -0.35, 0.15, -0.35, 0.4, -0.1},
              1e-15, 1e-15, "masked_select values");
  y.backward(ops::mul(ramp({y.numel()}), 2.0));
  // PyTorch 1.13's own masked_select gradient on this transposed input is wrong (it scatters in
  // the input's memory order); these are its values through a contiguous copy and through
  // boolean indexing, which agree (tools/torch_golden_masked.py asserts both).
  check_close(x.grad(), {-1.2, 0.8, -0.7, 1.3, 0.0, 0.0, 0.0, 0.0, -0.2, 1.8,  0.3, -1.2,
                         -0.7, 1.3, -0.2, 1.8, 0.0, 0.0, 0.0, 0.0, 0.3,  -1.2, 0.8, -0.7},
              1e-14, 1e-14, "masked_select gradient");
  // x (3, 1) broadcast by the mask (2, 3, 4): the gradient is summed back over the broadcast dims.
  Tensor xb = ramp({3, 1});
  xb.requires_grad_();
  std::vector<double> mv(24);
  for (size_t i = 0; i < mv.size(); ++i) mv[i] = (i * 5) % 3 == 0;
  const Tensor mb = from_vector(mv, {2, 3, 4}, TensorOptions(kFloat64)).to(kBool);
  const Tensor yb = masked_select(xb, mb);
  check_close(yb, {-0.6, -0.6, -0.35, -0.1, -0.6, -0.6, -0.35, -0.1}, 1e-15, 1e-15, "broadcast input values");
  yb.backward(ramp({yb.numel()}));
  check_close(xb.grad(), {0.1, 0.8, -0.45}, 1e-14, 1e-14, "broadcast input gradient");
}

TEST_CASE("masked_select: naive reference in every dtype, layout and broadcast; all-false, all-true, size-0") {
  const DType all[] = {kFloat64, kFloat32, kFloat16, kBFloat16, kInt32, kInt64, kBool, kUInt8};
  std::vector<double> xv = random_values(4 * 6, 5, -3.0, 3.0);
  xv[1] = kNaN, xv[2] = -0.0, xv[3] = kInf;
  for (double& e : xv) e = std::isfinite(e) ? std::round(e * 4.0) / 4.0 : e;  // exact in every dtype
  std::vector<double> mv = random_values(4 * 6, 6, 0.0, 1.0);
  for (double& e : mv) e = e < 0.4;
  for (DType dt : all) {
    std::vector<double> xd = xv;
    if (!is_floating(dt))
      for (double& e : xd) e = std::isfinite(e) ? std::fabs(std::trunc(e)) : 1.0;
    for (auto& [what, x] : layouts_of(xd, {4, 6}, dt)) {
      for (Layout ml : kAllLayouts) {
        const Tensor m = make_tensor(mv, {4, 6}, kBool, ml);
        const Tensor r = ops::masked_select(x, m);
        CHECK(r.dtype() == dt);
        check_same_bits(values_of(r), masked_select_reference(values_of(x), {4, 6}, mv, {4, 6}),
                        what + " mask " + layout_name(ml));
      }
      // Broadcasts both ways: a (6) mask row, a (4, 1) mask column, x (4, 6) against a (3, 4, 6) mask.
      const std::vector<double> row = {1, 0, 0, 1, 1, 0}, col = {0, 1, 1, 0};
      const std::vector<double> m3 = random_values(72, 8, 0.0, 1.0);
      std::vector<double> m3b;
      for (double e : m3) m3b.push_back(e < 0.3);
      const std::vector<std::pair<std::vector<double>, Shape>> masks = {{row, {6}}, {col, {4, 1}}, {m3b, {3, 4, 6}}};
      for (const auto& [mvals, mshape] : masks) {
        const Tensor m = from_vector(mvals, mshape, TensorOptions(kFloat64)).to(kBool);
        check_same_bits(values_of(ops::masked_select(x, m)),
                        masked_select_reference(values_of(x), {4, 6}, mvals, mshape),
                        what + " mask " + shape_str(mshape));
      }
    }
  }
  const Tensor x = ramp({3, 5}, kFloat32);
  CHECK(ops::masked_select(x, zeros({3, 5}, kBool)).sizes() == Shape{0});
  CHECK(values_of(ops::masked_select(x, full({5}, 1.0, kBool))) == values_of(x));
  CHECK(ops::masked_select(empty({0, 5}, kFloat32), full({5}, 1.0, kBool)).sizes() == Shape{0});
  CHECK(ops::masked_select(x, empty({0, 1, 5}, kBool)).sizes() == Shape{0});
  CHECK(ops::masked_select(scalar_tensor(2.5, kFloat64), scalar_tensor(1.0, kBool)).tolist<double>() ==
        std::vector<double>{2.5});
  // Large enough for the parallel chunks, every 7th element.
  std::vector<double> big(400003), bigm(400003);
  for (size_t i = 0; i < big.size(); ++i) big[i] = double(i), bigm[i] = i % 7 == 0;
  const Tensor rb = ops::masked_select(from_vector(big, {400003}, TensorOptions(kFloat64)),
                                       from_vector(bigm, {400003}, TensorOptions(kFloat64)).to(kBool));
  REQUIRE(rb.numel() == (400003 + 6) / 7);  // i = 0, 7, ..., 400001
  const std::vector<double> rbv = rb.tolist<double>();
  bool ordered = true;
  for (size_t k = 0; k < rbv.size(); ++k) ordered = ordered && rbv[k] == double(7 * k);
  CHECK(ordered);
}

TEST_CASE("masked_select: gradcheck in layouts and broadcasts; the backward scatter against a naive one") {
  const Tensor m46 = from_vector(std::vector<double>{1, 0, 0, 1, 1, 0}, {6}, TensorOptions(kFloat64)).to(kBool);
  const Tensor m3 = ops::lt(random_tensor({3, 4, 6}, kFloat64, 2, Layout::Contiguous, 0.0, 1.0), 0.4);
  for (Layout l : kAllLayouts) {
    const auto [x, view] = leaf_in_layout(4, 6, l, 9);
    check_gradcheck([&](const TensorList& in) { return masked_select(view(in[0]), m46); }, {x});
    check_gradcheck([&](const TensorList& in) { return masked_select(view(in[0]), m3); }, {x});
  }
  Tensor xb = leaf({4, 1}, 3);
  check_gradcheck([&](const TensorList& in) { return masked_select(in[0], m3); }, {xb});
  check_gradcheck([&](const TensorList& in) { return masked_select(in[0], zeros({4, 6}, kBool)); }, {leaf({4, 6}, 4)});
  // masked_select_backward: the gradient at the true positions in order, 0 elsewhere (+0).
  const Tensor g = from_vector(std::vector<double>{1, 2, 3}, {3}, TensorOptions(kFloat32));
  const Tensor mk = from_vector(std::vector<double>{0, 1, 0, 1, 1, 0}, {2, 3}, TensorOptions(kFloat64)).to(kBool);
  // mk.t() is [[0, 1], [1, 1], [0, 0]]: true at 1, 2 and 3 in row-major order.
  check_same_bits(values_of(ops::masked_select_backward(g, mk.t(), {3, 2})), {0, 1, 2, 3, 0, 0}, "scatter");
  check_error([&] { ops::masked_select_backward(g, mk, {2, 2}); }, {"masked_select_backward", "broadcast"});
  check_error(
      [&] {
        ops::masked_select_backward(ops::mul(g, 1.0).slice(0, 0, 2), mk, {2, 3});
      },
      {"one element per true mask element"});
}

TEST_CASE("masked_select, nonzero: errors name the op, shapes and dtypes; a graph capture refuses them") {
  const Tensor x = ramp({2, 3}, kFloat32);
  check_error(
      [&] {
        ops::masked_select(x, ones({2, 3}, kFloat32));
      },
      {"masked_select", "mask must be bool", "float32[2, 3] cpu"});
  check_error([&] { ops::masked_select(x, full({4}, 1.0, kBool)); }, {"masked_select", "[2, 3]", "[4]"});
  check_error([&] { masked_select(x, full({2, 2}, 1.0, kBool)); }, {"masked_select", "[2, 2]"});
  check_error([&] { ops::masked_select(Tensor(), full({2}, 1.0, kBool)); }, {"masked_select", "undefined"});
  const Tensor m = full({2, 3}, 1.0, kBool);
  int key = 0;
  memory::begin_graph_pool(kCPU, &key);
  {
    FakeCapture capture(&key);
    check_error([&] { ops::masked_select(x, m); }, {"masked_select cannot run inside a CUDA graph capture", "count"});
    check_error([&] { ops::nonzero(x); }, {"nonzero cannot run inside a CUDA graph capture"});
  }
  memory::release_graph_pool(kCPU, &key, Stream{nullptr, kCPU});
  CHECK(ops::masked_select(x, m).numel() == 6);  // after the capture
}

// ---- lerp ---------------------------------------------------------------------------

TEST_CASE("lerp: PyTorch's values and gradients with a broadcast tensor weight (float64)") {
  Tensor s = ramp({3, 4});
  Tensor e = ops::add(ops::mul(ramp({4}), 3.0), 0.1);
  Tensor w = from_vector(std::vector<double>{-0.7, 0.3, 1.25}, {3, 1}, TensorOptions(kFloat64));
  for (Tensor* t : {&s, &e, &w}) t->requires_grad_();
  const Tensor out = lerp(s, e, w);
  check_close(out, {0.17, 0.07, -0.03, -0.13, -0.23, 0.17, 0.57, -0.255, -2.0375, -1.1625, -0.2875, 0.5875}, 1e-14,
              1e-15, "lerp values");
  out.backward(ops::add(ramp({3, 4}), 1.0));
  check_close(s.grad(), {0.68, 1.105, 1.53, 1.955, 0.98, 1.155, 1.33, 0.28, -0.1625, -0.225, -0.2875, -0.35}, 1e-14,
              1e-15, "start gradient");
  check_close(e.grad(), {0.9525, 1.165, 1.3775, 1.065}, 1e-14, 1e-15, "end gradient");
  check_close(w.grad(), {-0.46, -7.21, -1.835}, 1e-14, 1e-15, "weight gradient");
}

TEST_CASE("lerp: PyTorch's values for scalar weights on both sides of 0.5, and NaN, infinities and -0") {
  const std::vector<double> weights = {-0.7, 0.3, 0.5, 0.7, 1.3};
  // torch.lerp(ramp(8), 5 ramp(8) + 0.3, w) in float64, float32 and bfloat16.
  const std::vector<std::vector<double>> f64 = {
      {0.87, 0.42000000000000004, -0.030000000000000037, -0.4799999999999999, -0.9299999999999998, -1.38,
       -1.8299999999999998, 0.87},
      {-1.23, -0.6799999999999999, -0.12999999999999995, 0.42000000000000004, 0.97, 1.52, 2.07, -1.23},
      {-1.6500000000000001, -0.8999999999999999, -0.14999999999999994, 0.6000000000000001, 1.3499999999999999,
       2.0999999999999996, 2.8499999999999996, -1.6500000000000001},
      {-2.07, -1.1199999999999999, -0.16999999999999993, 0.78, 1.7299999999999998, 2.6799999999999997, 3.63, -2.07},
      {-3.3300000000000005, -1.78, -0.22999999999999987, 1.32, 2.8699999999999997, 4.42, 5.97, -3.3300000000000005}};
  const std::vector<std::vector<double>> bf16 = {
      {0.87109375, 0.421875, -0.03076171875, -0.4765625, -0.92578125, -1.3828125, -1.84375, 0.87109375},
      {-1.234375, -0.6796875, -0.1298828125, 0.419921875, 0.96875, 1.515625, 2.078125, -1.234375},
      {-1.65625, -0.90234375, -0.1494140625, 0.59765625, 1.3515625, 2.09375, 2.859375, -1.65625},
      {-2.078125, -1.125, -0.169921875, 0.77734375, 1.7265625, 2.671875, 3.640625, -2.078125},
      {-3.328125, -1.78125, -0.228515625, 1.3125, 2.859375, 4.40625, 6.0, -3.328125}};
  for (size_t k = 0; k < weights.size(); ++k) {
    for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
      const Tensor s = ramp({8}, dt);
      const Tensor e = ops::add(ops::mul(s, 5.0), 0.3);
      const Tensor r = ops::lerp(s, e, weights[k]);
      CHECK(r.dtype() == dt);
      const std::string what = std::string(dtype_name(dt)) + " w=" + std::to_string(weights[k]);
      // float64 to the last bits (PyTorch fuses an FMA: Note [Lerp formula]); float32 within a
      // rounding of the same; bfloat16 within one bfloat16 step.
      if (dt == kFloat64) check_close(r, f64[k], 4e-16, 4e-16, what);
      else if (dt == kFloat32) check_close(r, f64[k], 3e-7, 3e-7, what);
      else check_close(r, bf16[k], 8e-3, 1e-3, what);
    }
  }
  const std::vector<double> a = {0.0, -0.0, kInf, 1.0, kNaN, -kInf, 2.0};
  const std::vector<double> b = {-0.0, -0.0, 1.0, kInf, 1.0, kInf, kNaN};
  const std::vector<std::pair<double, std::vector<double>>> special = {
      {0.0, {0.0, 0.0, kNaN, kNaN, kNaN, kNaN, kNaN}},
      {0.3, {0.0, 0.0, kNaN, kInf, kNaN, kNaN, kNaN}},
      {0.7, {0.0, -0.0, kInf, kNaN, kNaN, kNaN, kNaN}},
      {1.0, {0.0, -0.0, kNaN, kNaN, kNaN, kNaN, kNaN}}};
  for (DType dt : kFloating) {
    const Tensor ta = from_vector(a, {7}, TensorOptions(kFloat64)).to(dt);
    const Tensor tb = from_vector(b, {7}, TensorOptions(kFloat64)).to(dt);
    for (const auto& [w, want] : special) {
      const std::string what = std::string("special ") + dtype_name(dt) + " w=" + std::to_string(w);
      check_same_bits(values_of(ops::lerp(ta, tb, w)), want, what);
      check_same_bits(values_of(ops::lerp(ta, tb, full({7}, w, dt))), want, what + " (tensor weight)");
    }
  }
}

TEST_CASE("lerp: naive reference in every floating dtype, layout and broadcast; in place; size-0") {
  const std::vector<double> sv = random_values(4 * 5, 21, -3, 3), ev = random_values(4 * 5, 22, -3, 3);
  const std::vector<double> wv = random_values(4 * 5, 23, -1, 2);
  for (DType dt : kFloating) {
    const double tol = dt == kFloat64 ? 1e-15 : dt == kFloat32 ? 1e-6 : 2 * default_rtol(dt);
    for (Layout l : kAllLayouts) {
      const Tensor s = make_tensor(sv, {4, 5}, dt, l), e = make_tensor(ev, {4, 5}, dt, Layout::Transposed);
      const Tensor w = make_tensor(wv, {4, 5}, dt, Layout::Strided);
      const std::vector<double> s_, e_ = values_of(e), w_ = values_of(w);
      const std::vector<double> sr = values_of(s);
      std::vector<double> want, want_scalar, want_row;
      for (size_t i = 0; i < sr.size(); ++i) {
        want.push_back(lerp_reference(sr[i], e_[i], w_[i]));
        want_scalar.push_back(lerp_reference(sr[i], e_[i], 0.8));
        want_row.push_back(lerp_reference(sr[i], e_[i % 5], w_[i % 5]));  // end, weight: row 0, broadcast
      }
      const std::string what = name_of(dt, l);
      check_close(ops::lerp(s, e, w), want, tol, tol, what);
      check_close(ops::lerp(s, e, 0.8), want_scalar, tol, tol, what + " scalar");
      check_close(ops::lerp(s, e.select(0, 0), w.select(0, 0)), want_row, tol, tol, what + " broadcast");
      // In place: into a copy of s in its layout; end and weight broadcast.
      const Tensor self = make_tensor(sv, {4, 5}, dt, l);
      const int64_t v0 = self.version();
      ops::lerp_(self, e.select(0, 0), w.select(0, 0));
      CHECK(self.version() > v0);
      check_close(self, want_row, tol, tol, what + " lerp_");
      const Tensor self2 = make_tensor(sv, {4, 5}, dt, l);
      ops::lerp_(self2, e, 0.8);
      check_close(self2, want_scalar, tol, tol, what + " lerp_ scalar");
      // Aliased: self as its own end (lerp(x, x, w) = x).
      const Tensor self3 = make_tensor(sv, {4, 5}, dt, l);
      ops::lerp_(self3, self3, w);
      check_close(self3, sr, tol, tol, what + " lerp_(x, x, w)");
    }
  }
  // start broadcast up by end: (3, 1) with (4,) and a 0-d weight gives (3, 4).
  const Tensor r = ops::lerp(ramp({3, 1}), ramp({4}), scalar_tensor(0.25, kFloat64));
  CHECK(r.sizes() == Shape{3, 4});
  CHECK(ops::lerp(empty({0, 3}, kFloat32), empty({3}, kFloat32), 0.5).sizes() == Shape{0, 3});
  CHECK(ops::lerp(empty({2, 0}), empty({2, 0}), empty({1, 0})).sizes() == Shape{2, 0});
}

TEST_CASE("lerp: gradcheck (tensor and scalar weight, broadcasts, layouts); lerp_ recorded and as an EMA") {
  for (Layout l : kAllLayouts) {
    const auto [s, view] = leaf_in_layout(3, 4, l, 31);
    const Tensor e = leaf({4}, 32), w = leaf({3, 1}, 33, -1.0, 2.0);
    check_gradcheck([&](const TensorList& in) { return lerp(view(in[0]), in[1], in[2]); }, {s, e, w});
    check_gradcheck([&](const TensorList& in) { return lerp(view(in[0]), in[1], 0.3); }, {s, e});
    check_gradcheck([&](const TensorList& in) { return lerp(view(in[0]), in[1], 0.9); }, {s, e});
    check_gradcheck(
        [&](const TensorList& in) {
          Tensor self = mul(view(in[0]), 1.0);  // a non-leaf: may be written in place
          lerp_(self, in[1], in[2]);
          return self;
        },
        {s, e, w});
    check_gradcheck(
        [&](const TensorList& in) {
          Tensor self = mul(view(in[0]), 1.0);
          lerp_(self, in[1], 0.7);
          return self;
        },
        {s, e});
  }
  // lerp_ where only the weight requires grad is still recorded.
  {
    Tensor w = leaf({3, 4}, 34);
    Tensor self = ramp({3, 4});
    lerp_(self, ops::add(ramp({3, 4}), 1.0), w);
    REQUIRE(self.requires_grad());
    sum(self).backward();
    check_close(w.grad(), std::vector<double>(12, 1.0), 1e-15, 1e-15, "d/dw of lerp_(s, s + 1, w)");
  }
  // An EMA of weights: a leaf that requires grad may be written under NoGradGuard only.
  Tensor ema = ramp({4}, kFloat32);
  ema.requires_grad_();
  Tensor p = ops::add(ramp({4}, kFloat32), 1.0);
  check_error([&] { lerp_(ema, p, 0.1); }, {"lerp_", "leaf tensor that requires grad"});
  {
    autograd::NoGradGuard no_grad;
    for (int i = 0; i < 3; ++i) lerp_(ema, p, 0.1);
  }
  std::vector<double> want = values_of(ramp({4}, kFloat32));
  for (double& v : want) v += 1.0 - 0.9 * 0.9 * 0.9;
  check_close(ema, want, 1e-6, 1e-6, "EMA after three steps");
  CHECK(ema.grad_fn_name().empty());
}

TEST_CASE("lerp: errors name the op, the dtypes, shapes and the in-place output") {
  const Tensor a = ramp({2, 3}, kFloat32);
  check_error(
      [&] {
        ops::lerp(a, ramp({2, 3}, kFloat64), 0.5);
      },
      {"lerp", "expected dtype float32 for end", "float64[2, 3] cpu"});
  check_error([&] { ops::lerp(a, a, ramp({2, 3}, kFloat64)); }, {"lerp", "expected dtype float32 for weight"});
  check_error([&] { ops::lerp(a.to(kInt32), a.to(kInt32), 0.5); }, {"lerp", "floating", "int32"});
  check_error([&] { ops::lerp(a, ramp({4}, kFloat32), 0.5); }, {"lerp", "[2, 3]", "[4]"});
  check_error([&] { ops::lerp_(ramp({3}, kFloat32), a, 0.5); }, {"lerp_", "in-place output", "float32[3] cpu"});
  check_error([&] { ops::lerp_(ramp({1, 3}, kFloat32), a, ramp({1, 3}, kFloat32)); }, {"lerp_", "in-place output"});
  check_error([&] { ops::lerp_(ramp({3}, kFloat32).expand({2, 3}), a, 0.5); }, {"lerp_"});
  check_error([&] { lerp(a, Tensor(), 0.5); }, {"lerp", "undefined"});
}
