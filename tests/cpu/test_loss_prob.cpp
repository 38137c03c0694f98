// binary_cross_entropy and kl_div (autograd/ops/prob_loss.h) against float64 loops of
// PyTorch's formulas (aten's binary_cross_entropy kernels and backward, derivatives.yaml,
// torch.nn.functional.kl_div): every reduction on transposed and strided views, weight and
// target broadcasts, 0-d and size-0 inputs, probabilities of exactly 0 and 1 (the -100 clamp
// and the 1e-12 floor of the backward), the t = 0 target of Note [KL divergence], gradcheck,
// 16-bit inputs, autocast, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/prob_loss.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

const char* reduction_name(Reduction r) { return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean"; }

/// The values of a tensor of `shape` that broadcasts to `out`, read at every element of `out`.
std::vector<double> broadcast_values(const std::vector<double>& v, const Shape& shape, const Shape& out) {
  std::vector<double> r(size_t(numel_of(out)));
  for (int64_t i = 0; i < numel_of(out); ++i) r[size_t(i)] = v[size_t(broadcast_index(unravel(i, out), shape))];
  return r;
}

/// Sums per-element values of `out` into a tensor of `shape` that broadcasts to it (sum_to).
std::vector<double> sum_to_shape(const std::vector<double>& v, const Shape& out, const Shape& shape) {
  std::vector<double> r(size_t(numel_of(shape)), 0.0);
  for (int64_t i = 0; i < numel_of(out); ++i) r[size_t(broadcast_index(unravel(i, out), shape))] += v[size_t(i)];
  return r;
}

// ---- binary_cross_entropy's reference: aten's forward and backward, element by element ----

double bce_loss(double x, double y, double w) {
  return -w * (y * std::max(std::log(x), -100.0) + (1 - y) * std::max(std::log1p(-x), -100.0));
}
double bce_dx(double x, double y, double w) { return w * (x - y) / std::max((1 - x) * x, 1e-12); }
double bce_dy(double x, double w) { return w * (std::max(std::log1p(-x), -100.0) - std::max(std::log(x), -100.0)); }

/// One binary_cross_entropy call against the loops: the loss (after `r`) and both gradients
/// for the upstream gradient `gout` (the loss's shape), in x's dtype within rtol.
void check_bce(const Tensor& x, const Tensor& y, const BceOptions& o, double rtol, const std::string& label) {
  CAPTURE(label);
  CAPTURE(reduction_name(o.reduction));
  const Shape shape = x.sizes();
  const int64_t n = numel_of(shape);
  const std::vector<double> xv = values_of(x), yv = values_of(y);
  const std::vector<double> wv = o.weight.defined() ? broadcast_values(values_of(o.weight), o.weight.sizes(), shape)
                                                    : std::vector<double>(size_t(n), 1.0);
  std::vector<double> loss(static_cast<size_t>(n)), gx(static_cast<size_t>(n)), gy(static_cast<size_t>(n));
  double total = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    loss[i] = bce_loss(xv[i], yv[i], wv[i]);
    total += loss[i];
  }
  const Tensor xl = x.detach().requires_grad_(), yl = y.detach().requires_grad_();
  const Tensor out = binary_cross_entropy(xl, yl, o);
  CHECK(out.dtype() == x.dtype());
  std::vector<double> g(size_t(n), 0.7);  // the upstream gradient, per element
  Tensor gout = from_vector(std::vector<double>{0.7}, {}).to(x.dtype());
  if (o.reduction == Reduction::None) {
    g = random_values(n, 17, -1.5, 1.5);
    gout = from_vector(g, shape).to(x.dtype());
    g = values_of(gout);
    check_close(out, loss, rtol, rtol, label + " loss");
  } else {
    const double scale = o.reduction == Reduction::Mean ? 1.0 / double(n) : 1.0;
    CHECK(out.dim() == 0);
    check_close(out, {total * scale}, rtol, rtol, label + " loss");
    for (double& v : g) v *= scale;
  }
  for (size_t i = 0; i < size_t(n); ++i) {
    gx[i] = g[i] * bce_dx(xv[i], yv[i], wv[i]);
    gy[i] = g[i] * bce_dy(xv[i], wv[i]);
  }
  const TensorList grads = autograd::grad({out}, {xl, yl}, {gout});
  CHECK(grads[0].dtype() == x.dtype());
  CHECK(grads[1].dtype() == y.dtype());
  check_close(grads[0], gx, rtol, rtol, label + " d/dinput");
  check_close(grads[1], gy, rtol, rtol, label + " d/dtarget");
}

}  // namespace

TEST_CASE("binary_cross_entropy: aten's loss and backward for every reduction, weight broadcast and layout") {
  // (3, 5) probabilities with exact 0s and 1s (the -100 clamp forward, the 1e-12 floor backward),
  // values near both ends, and soft labels 0, 1/3, 2/3, 1.
  const int64_t N = 3, C = 5;
  const std::vector<double> xs{0, 1, 1e-3, 0.999, 0.5, 0, 1, 0.25, 1e-30, 0.75, 0.1, 0.9, 0.3, 0.6, 1 - 1e-12};
  std::vector<double> ys(size_t(N * C));
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = double(i % 4) / 3.0;
  const std::vector<Shape> weights{{}, {N, 1}, {C}, {N, C}};
  int64_t cases = 0;
  for (const DType dt : {kFloat64, kFloat32})
    for (const Layout lx : kAllLayouts)
      for (const Shape& ws : weights)
        for (const Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
          const Layout ly = kAllLayouts[(int(lx) + 1) % 3];
          BceOptions o{.reduction = r};
          if (!ws.empty()) o.weight = random_tensor(ws, kFloat64, 5, Layout::Contiguous, 0.5, 2.0);
          const std::string label = name_of(dt, lx) + " input, " + layout_name(ly) + " target, weight " +
                                    (ws.empty() ? "none" : shape_str(ws));
          check_bce(make_tensor(xs, {N, C}, dt, lx), make_tensor(ys, {N, C}, dt, ly), o, dt == kFloat64 ? 1e-14 : 2e-6,
                    label);
          ++cases;
        }
  // The saturated ends in numbers: 100 per element, gradients -1e12 / 1e12 and -100 / 100.
  Tensor x = from_vector<double>({0, 1, 0, 1}, {4}).requires_grad_(), y = from_vector<double>({1, 0, 0, 1}, {4});
  y.requires_grad_();
  const Tensor loss = binary_cross_entropy(x, y, {.reduction = Reduction::None});
  check_close(loss, {100, 100, 0, 0}, 0, 0, "saturated loss");
  const TensorList g = autograd::grad({sum(loss)}, {x, y});
  check_close(g[0], {-1e12, 1e12, 0, 0}, 1e-15, 0, "saturated d/dinput");
  check_close(g[1], {100, -100, 100, -100}, 0, 0, "saturated d/dtarget");
  MESSAGE(cases, " binary_cross_entropy settings");
}

TEST_CASE("binary_cross_entropy: 0-d and size-0 inputs, targets outside [0, 1], gradcheck") {
  // 0-d: -log(0.3) for y = 1; a target outside [0, 1] is refused (PyTorch 1.13 checks only the input).
  check_close(binary_cross_entropy(from_vector<double>({0.3}, {}), from_vector<double>({1.0}, {})), {-std::log(0.3)},
              1e-15, 0, "0-d");
  check_error(
      [] {
        binary_cross_entropy(from_vector<double>({0.5, 0.5}, {2}), from_vector<double>({1.0, -0.5}, {2}));
      },
      {"binary_cross_entropy", "all elements of target should be between 0 and 1", "[1]"});
  // Size-0: none is empty, sum 0, mean NaN (as torch); the backward gives empty gradients.
  Tensor e = zeros({0, 3}, kFloat64).requires_grad_();
  CHECK(binary_cross_entropy(e, zeros({0, 3}, kFloat64), {.reduction = Reduction::None}).sizes() == Shape{0, 3});
  check_close(binary_cross_entropy(e, zeros({0, 3}, kFloat64), {.reduction = Reduction::Sum}), {0.0}, 0, 0, "sum");
  const Tensor mean_empty = binary_cross_entropy(e, zeros({0, 3}, kFloat64));
  CHECK(std::isnan(mean_empty.item<double>()));
  CHECK(autograd::grad({binary_cross_entropy(e, zeros({0, 3}, kFloat64), {.reduction = Reduction::Sum})}, {e})[0]
            .sizes() == Shape{0, 3});
  // Central differences, both inputs, a transposed input and a broadcast weight.
  for (const Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
    CAPTURE(reduction_name(r));
    const BceOptions o{.weight = random_tensor({4, 1}, kFloat64, 3, Layout::Contiguous, 0.5, 2.0), .reduction = r};
    check_gradcheck([&](const TensorList& in) { return binary_cross_entropy(in[0].t(), in[1], o); },
                    {leaf({3, 4}, 11, 0.05, 0.95), leaf({4, 3}, 12, 0.0, 1.0)});
  }
}

TEST_CASE("binary_cross_entropy: an input outside [0, 1] or NaN is an error naming its position") {
  const Tensor y = zeros({2, 3}, kFloat64);
  const std::string range = "all elements of input should be between 0 and 1";
  check_error(
      [&] {
        binary_cross_entropy(from_vector<double>({0.5, 0.2, 0.1, 1.5, 0.3, 0.4}, {2, 3}), y);
      },
      {"binary_cross_entropy", range, "[1, 0]", "float64[2, 3]"});
  // The position is the element's in the view, not in memory: the transpose of (3, 2) has 1.5 at [1, 0] too.
  check_error(
      [&] {
        binary_cross_entropy(from_vector<double>({0.5, 1.5, 0.2, 0.3, 0.1, 0.4}, {3, 2}).t(), y);
      },
      {"binary_cross_entropy", range, "[1, 0]"});
  check_error(
      [&] {
        binary_cross_entropy(from_vector<double>({0.5, -1e-300, 0.1, 0.2, 0.3, 0.4}, {2, 3}), y);
      },
      {range, "[0, 1]"});
  check_error(
      [&] {
        binary_cross_entropy(from_vector<double>({0.5, 0.5, kNaN, 0.2, 0.3, 0.4}, {2, 3}), y);
      },
      {range, "[0, 2]"});
  check_error([&] { binary_cross_entropy(from_vector<float>({1.0f + 1e-7f}, {}), zeros({}, kFloat32)); },
              {range, "float32[]"});
  // -0 and the ends are in range.
  check_close(binary_cross_entropy(from_vector<double>({-0.0, 1.0}, {2}), from_vector<double>({0.0, 1.0}, {2})), {0.0},
              0, 0, "-0 and 1");
}

TEST_CASE("binary_cross_entropy: 16-bit inputs compute in float32, autocast refuses it, bad operands throw") {
  const std::vector<double> xs = random_values(12, 21, 0.02, 0.98), ys = random_values(12, 22, 0.0, 1.0);
  for (const DType dt : {kFloat16, kBFloat16})
    for (const Reduction r : {Reduction::None, Reduction::Mean}) {
      // The reference takes the rounded values: only the result's rounding (and float32 math) differs.
      const Tensor x = make_tensor(xs, {3, 4}, dt, Layout::Transposed), y = make_tensor(ys, {3, 4}, dt);
      check_bce(x, y, {.reduction = r}, dt == kFloat16 ? 2e-3 : 1e-2, name_of(dt, Layout::Transposed));
    }
  // PyTorch bans it under autocast and points to the logits form; frugal does the same.
  {
    AutocastGuard amp(kCPU, kBFloat16);
    check_error([&] { binary_cross_entropy(full({2}, 0.5), full({2}, 1.0)); },
                {"binary_cross_entropy", "unsafe to autocast", "binary_cross_entropy_with_logits"});
  }
  const Tensor p = full({3, 2}, 0.5);
  check_error(
      [&] {
        binary_cross_entropy(p, full({3, 1}, 0.5));
      },
      {"binary_cross_entropy", "float32[3, 1]", "float32[3, 2]"});
  check_error([&] { binary_cross_entropy(p, p.to(kFloat64)); },
              {"binary_cross_entropy", "float32[3, 2]", "float64[3, 2]"});
  check_error([&] { binary_cross_entropy(p.to(kInt64), p.to(kInt64)); }, {"binary_cross_entropy", "int64[3, 2]"});
  check_error([&] { binary_cross_entropy(p, p, {.weight = full({3}, 1.0)}); },
              {"binary_cross_entropy weight", "[3]", "[3, 2]"});
  check_error(
      [&] {
        binary_cross_entropy(p, p, {.weight = full({2, 3, 2}, 1.0)});
      },
      {"binary_cross_entropy weight", "float32[2, 3, 2]", "does not broadcast"});
  check_error(
      [&] {
        binary_cross_entropy(p, p, {.weight = zeros({3, 2}, kInt64)});
      },
      {"binary_cross_entropy weight", "int64[3, 2]", "floating"});
  check_error([&] { binary_cross_entropy(Tensor(), p); }, {"binary_cross_entropy", "undefined"});
}

namespace {

// ---- kl_div's reference: aten's composite, element by element, with the t = 0 convention ----

double kl_pointwise(double x, double t, bool log_target) {
  if (log_target) return std::exp(t) * (t - x);
  return (t == 0 ? 0.0 : t * std::log(t)) - t * x;
}
double kl_dx(double t, bool log_target) { return log_target ? -std::exp(t) : -t; }
double kl_dt(double x, double t, bool log_target) {
  if (log_target) return std::exp(t) * (t - x + 1);
  return t == 0 ? -x : std::log(t) + 1 - x;  // Note [KL divergence]: -x at t = 0
}

const char* kl_reduction_name(KlDivReduction r) {
  switch (r) {
    case KlDivReduction::None: return "none";
    case KlDivReduction::Mean: return "mean";
    case KlDivReduction::Sum: return "sum";
    case KlDivReduction::BatchMean: break;
  }
  return "batchmean";
}

}  // namespace

TEST_CASE("kl_div: aten's composite for every reduction, log_target, broadcasts and layouts, with gradients") {
  struct Shapes {
    Shape input, target;
  };
  // Same shapes, a broadcast target, a broadcast input (BatchMean still divides by
  // input.size(0), as PyTorch), 0-d inputs (BatchMean divides by 1), size-0 ones.
  const std::vector<Shapes> shapes{{{3, 5}, {3, 5}}, {{3, 5}, {5}}, {{3, 1}, {3, 5}},    {{5}, {3, 5}},
                                   {{}, {}},         {{}, {4}},     {{2, 3, 4}, {3, 1}}, {{0, 3}, {0, 3}}};
  int64_t cases = 0;
  for (const Shapes& sh : shapes)
    for (const bool log_target : {false, true})
      for (const KlDivReduction r :
           {KlDivReduction::None, KlDivReduction::Mean, KlDivReduction::Sum, KlDivReduction::BatchMean})
        for (const Layout layout : {Layout::Contiguous, Layout::Transposed}) {
          const Shape out = broadcast_shapes(sh.input, sh.target, "test");
          CAPTURE(shape_str(sh.input));
          CAPTURE(shape_str(sh.target));
          CAPTURE(log_target);
          CAPTURE(kl_reduction_name(r));
          CAPTURE(layout_name(layout));
          const std::vector<double> xv = random_values(numel_of(sh.input), 31, -3, 0);
          std::vector<double> tv = log_target ? random_values(numel_of(sh.target), 32, -3, 0.5)
                                              : random_values(numel_of(sh.target), 32, 0, 1);
          if (!log_target)  // exact zeros: 0 log 0 = 0
            for (size_t i = 0; i < tv.size(); i += 3) tv[i] = 0;
          Tensor x = make_tensor(xv, sh.input, kFloat64, layout).requires_grad_();
          Tensor t = make_tensor(tv, sh.target, kFloat64, Layout::Strided).requires_grad_();
          const Tensor loss = kl_div(x, t, {.reduction = r, .log_target = log_target});
          const std::vector<double> xo = broadcast_values(xv, sh.input, out), to = broadcast_values(tv, sh.target, out);
          const int64_t n = numel_of(out);
          std::vector<double> pointwise(static_cast<size_t>(n)), g(static_cast<size_t>(n));
          double total = 0;
          for (size_t i = 0; i < size_t(n); ++i) total += pointwise[i] = kl_pointwise(xo[i], to[i], log_target);
          Tensor gout;
          if (r == KlDivReduction::None) {
            CHECK(loss.sizes() == out);
            check_close(loss, pointwise, 1e-14, 1e-14, "none");
            g = random_values(n, 33, -1.5, 1.5);
            gout = from_vector(g, out);
          } else {
            REQUIRE(loss.dim() == 0);
            double scale = 1;
            if (r == KlDivReduction::Mean) scale = 1.0 / double(n);
            if (r == KlDivReduction::BatchMean && !sh.input.empty()) scale = 1.0 / double(sh.input[0]);
            check_close(loss, {total * scale}, 1e-14, 1e-14, "reduced");  // 0 / 0 = NaN matches NaN
            std::fill(g.begin(), g.end(), 0.7 * scale);
            gout = from_vector(std::vector<double>{0.7}, {});
          }
          std::vector<double> gx(static_cast<size_t>(n)), gt(static_cast<size_t>(n));
          for (size_t i = 0; i < size_t(n); ++i) {
            gx[i] = g[i] * kl_dx(to[i], log_target);
            gt[i] = g[i] * kl_dt(xo[i], to[i], log_target);
          }
          const TensorList grads = autograd::grad({loss}, {x, t}, {gout});
          check_close(grads[0], sum_to_shape(gx, out, sh.input), 1e-14, 1e-14, "d/dinput");
          check_close(grads[1], sum_to_shape(gt, out, sh.target), 1e-14, 1e-14, "d/dtarget");
          ++cases;
        }
  MESSAGE(cases, " kl_div settings");
}

TEST_CASE("kl_div: zero targets give finite gradients, gradcheck, promotion, autocast and errors") {
  // t = 0: the loss is 0 - 0 x, the input's gradient -t = 0, the target's -x (PyTorch: NaN).
  Tensor x = from_vector<double>({-0.5, -2.0, -1.0}, {3}).requires_grad_();
  Tensor t = zeros({3}, kFloat64).requires_grad_();
  const Tensor loss = kl_div(x, t, {.reduction = KlDivReduction::Sum});
  check_close(loss, {0.0}, 0, 0, "zero target");
  const TensorList g = autograd::grad({loss}, {x, t});
  check_close(g[0], {0, 0, 0}, 0, 0, "d/dinput at t = 0");
  check_close(g[1], {0.5, 2.0, 1.0}, 0, 0, "d/dtarget at t = 0");
  // A negative target is no distribution: NaN, as xlogy in PyTorch.
  CHECK(std::isnan(kl_div(x.detach(), from_vector<double>({-0.1, 0.2, 0.3}, {3})).item<double>()));
  // Central differences; the target's where t > 0 (t log t has no derivative at 0), the input's at zeros too.
  for (const KlDivReduction r : {KlDivReduction::None, KlDivReduction::Mean, KlDivReduction::BatchMean})
    for (const bool log_target : {false, true}) {
      CAPTURE(kl_reduction_name(r));
      CAPTURE(log_target);
      const KlDivOptions o{.reduction = r, .log_target = log_target};
      check_gradcheck([&](const TensorList& in) { return kl_div(in[0].t(), in[1], o); },
                      {leaf({4, 3}, 41, -3, 0), leaf({3, 1}, 42, log_target ? -2 : 0.05, log_target ? 0.5 : 1)});
      Tensor zero_target = from_vector<double>({0, 0.5, 0, 0.25, 0, 0.25}, {2, 3});
      check_gradcheck([&](const TensorList& in) { return kl_div(in[0], zero_target, o); }, {leaf({2, 3}, 43, -3, 0)});
    }
  // float32 with float64 promotes to float64, as PyTorch; under autocast 16-bit inputs run in float32.
  const Tensor xf = random_tensor({2, 3}, kFloat32, 51, Layout::Contiguous, -3, 0);
  const Tensor td = random_tensor({2, 3}, kFloat64, 52, Layout::Contiguous, 0, 1);
  const Tensor mixed = kl_div(xf, td, {.reduction = KlDivReduction::None});
  CHECK(mixed.dtype() == kFloat64);
  check_close(mixed, values_of(kl_div(xf.to(kFloat64), td, {.reduction = KlDivReduction::None})), 0, 0, "promoted");
  {
    AutocastGuard amp(kCPU, kBFloat16);
    const Tensor under = kl_div(xf.to(kBFloat16), td.to(kBFloat16));
    CHECK(under.dtype() == kFloat32);
    check_close(under, values_of(kl_div(xf.to(kBFloat16).to(kFloat32), td.to(kBFloat16).to(kFloat32))), 0, 0,
                "autocast");
  }
  check_error([&] { kl_div(zeros({3, 2}), zeros({4})); }, {"kl_div", "[3, 2]", "[4]"});
  check_error([&] { kl_div(zeros({3}), zeros({3}, kInt64)); }, {"kl_div", "int64[3]"});
  check_error([&] { kl_div(zeros({3}, kInt64), zeros({3})); }, {"kl_div", "int64[3]"});
  check_error([&] { kl_div(zeros({3}), Tensor()); }, {"kl_div", "undefined"});
}
