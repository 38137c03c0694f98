// leaky_relu, elu, hardtanh, relu6, hardsigmoid, hardswish, mish, selu, celu, softsign,
// tanhshrink, hardshrink, softshrink and threshold against float64 loops of PyTorch's formulas
// (aten's activation kernels and derivatives.yaml): values and gradients on a grid that hits
// every kink exactly, on transposed views, in every floating dtype; NaN and infinities; size-0;
// the parameter checks; glu and prelu; and the nn modules.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/activation.h"
#include "autograd/ops/all.h"
#include "nn/activation.h"
#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

double ref_hardsigmoid(double x) { return std::min(std::max(x + 3.0, 0.0), 6.0) / 6.0; }

/// One activation: the differentiable op, PyTorch's forward and its gradient (g = 1), each
/// written with aten's comparisons, so a NaN input takes the branch PyTorch's takes.
struct Activation {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> f, df;
};

std::vector<Activation> activations() {
  std::vector<Activation> list;
  for (double slope : {0.01, 0.2, 0.0, -0.5})
    list.push_back({"leaky_relu(" + std::to_string(slope) + ")", [=](const Tensor& x) { return leaky_relu(x, slope); },
                    [=](double x) { return x > 0 ? x : x * slope; }, [=](double x) { return x > 0 ? 1.0 : slope; }});
  for (double alpha : {1.0, 0.5, 2.0})
    list.push_back({"elu(" + std::to_string(alpha) + ")", [=](const Tensor& x) { return elu(x, alpha); },
                    [=](double x) { return x > 0 ? x : alpha * std::expm1(x); },
                    [=](double x) { return x <= 0 ? alpha * std::exp(x) : 1.0; }});
  for (auto [lo, hi] : {std::pair{-1.0, 1.0}, {-0.5, 2.0}, {1.0, 1.0}})
    list.push_back({"hardtanh(" + std::to_string(lo) + ", " + std::to_string(hi) + ")",
                    [=](const Tensor& x) { return hardtanh(x, lo, hi); },
                    [=](double x) { return std::min(std::max(x, lo), hi); },
                    [=](double x) { return x <= lo || x >= hi ? 0.0 : 1.0; }});
  list.push_back({"relu6", [](const Tensor& x) { return relu6(x); },
                  [](double x) { return std::min(std::max(x, 0.0), 6.0); },
                  [](double x) { return x <= 0 || x >= 6 ? 0.0 : 1.0; }});
  list.push_back({"hardsigmoid", [](const Tensor& x) { return hardsigmoid(x); }, ref_hardsigmoid,
                  [](double x) { return x > -3 && x < 3 ? 1.0 / 6 : 0.0; }});
  list.push_back({"hardswish", [](const Tensor& x) { return hardswish(x); },
                  [](double x) { return x * ref_hardsigmoid(x); },
                  [](double x) { return x < -3 ? 0.0 : x <= 3 ? x / 3 + 0.5 : 1.0; }});
  list.push_back({"mish", [](const Tensor& x) { return mish(x); },
                  [](double x) { return x * std::tanh(std::log1p(std::exp(x))); },
                  [](double x) {
                    const double t = std::tanh(std::log1p(std::exp(x))), s = 1 / (1 + std::exp(-x));
                    return t + x * s * (1 - t * t);
                  }});
  const double scale = ops::kSeluScale, alpha = ops::kSeluAlpha;
  list.push_back({"selu", [](const Tensor& x) { return selu(x); },
                  [=](double x) { return x > 0 ? scale * x : scale * alpha * std::expm1(x); },
                  [=](double x) { return x <= 0 ? scale * alpha * std::exp(x) : scale; }});
  for (double a : {1.0, 0.5, 2.0})
    list.push_back({"celu(" + std::to_string(a) + ")", [=](const Tensor& x) { return celu(x, a); },
                    [=](double x) { return x > 0 ? x : a * std::expm1(x / a); },
                    [=](double x) { return x <= 0 ? std::exp(x / a) : 1.0; }});
  // softsign(+-inf) = +-1 where PyTorch's x / (1 + |x|) gives NaN.
  list.push_back({"softsign", [](const Tensor& x) { return softsign(x); },
                  [](double x) { return std::isinf(x) ? std::copysign(1.0, x) : x / (1 + std::fabs(x)); },
                  [](double x) { return 1 / ((1 + std::fabs(x)) * (1 + std::fabs(x))); }});
  list.push_back({"tanhshrink", [](const Tensor& x) { return tanhshrink(x); },
                  [](double x) { return x - std::tanh(x); }, [](double x) { return std::tanh(x) * std::tanh(x); }});
  for (double l : {0.5, 1.0, 0.0})
    list.push_back({"hardshrink(" + std::to_string(l) + ")", [=](const Tensor& x) { return hardshrink(x, l); },
                    [=](double x) { return x >= -l && x <= l ? 0.0 : x; },
                    [=](double x) { return x >= -l && x <= l ? 0.0 : 1.0; }});
  // softshrink(NaN) is NaN, where PyTorch 1.13 gives 0 (Note [NaN stays NaN]).
  for (double l : {0.5, 1.0})
    list.push_back({"softshrink(" + std::to_string(l) + ")", [=](const Tensor& x) { return softshrink(x, l); },
                    [=](double x) {
                      return x > l ? x - l : x < -l ? x + l : std::isnan(x) ? x : 0.0;
                    },
                    [=](double x) { return x >= -l && x <= l ? 0.0 : 1.0; }});
  for (auto [t, v] : {std::pair{0.5, -2.0}, {-1.0, 0.0}})
    list.push_back({"threshold(" + std::to_string(t) + ", " + std::to_string(v) + ")",
                    [=](const Tensor& x) { return threshold(x, t, v); }, [=](double x) { return x <= t ? v : x; },
                    [=](double x) { return x <= t ? 0.0 : 1.0; }});
  return list;
}

/// -7 to 7 in steps of 0.25: every kink (0, +-0.5, +-1, 2, +-3, 6) is hit exactly.
std::vector<double> grid() {
  std::vector<double> v;
  for (int i = -28; i <= 28; ++i) v.push_back(0.25 * i);
  return v;
}

}  // namespace

TEST_CASE("activations: values and gradients equal PyTorch's formulas on a grid through every kink") {
  const std::vector<double> xs = grid();
  const int64_t n = int64_t(xs.size());  // 57 = 3 x 19
  for (const Activation& a : activations())
    for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16}) {
      // (19, 3) stored transposed: the kernels see a non-contiguous input.
      const Tensor base = make_tensor(xs, {3, n / 3}, dt).t();
      const Tensor x = base.detach().requires_grad_();
      const Tensor y = a.op(x);
      CHECK(y.dtype() == dt);
      CHECK(y.sizes() == Shape{n / 3, 3});
      const std::vector<double> xv = values_of(x);  // the grid, as the transposed view reads it
      std::vector<double> want_y, want_g;
      for (double v : xv) want_y.push_back(a.f(v)), want_g.push_back(a.df(v));
      const double tol = dt == kFloat64 ? 1e-14 : default_rtol(dt) * 2;
      check_close(y, want_y, tol, tol, a.name + " " + name_of(dt) + " values");
      sum(y).backward();
      REQUIRE(x.grad().defined());
      check_close(x.grad(), want_g, tol, tol, a.name + " " + name_of(dt) + " gradient");
    }
}

TEST_CASE("activations: finite differences away from the kinks, float64") {
  for (const Activation& a : activations()) {
    std::vector<double> v = random_values(24, 7, -5, 7);
    for (double& e : v)  // off the grid of kinks
      if (std::fabs(e * 4 - std::round(e * 4)) < 0.2) e += 0.07;
    INFO(a.name);
    check_gradcheck([&](const TensorList& in) { return a.op(in[0]); }, {make_tensor(v, {4, 6}, kFloat64).requires_grad_()});
  }
}

TEST_CASE("activations: NaN stays NaN, infinities follow PyTorch's formulas") {
  // PyTorch computes x * slope, alpha * expm1(x), clamp, x * relu6(x + 3) / 6 and
  // x * tanh(softplus(x)) as written, so -inf * 0 is NaN where the formula multiplies by 0.
  const std::vector<double> xs = {kNaN, kInf, -kInf};
  for (const Activation& a : activations()) {
    const Tensor x = make_tensor(xs, {3}, kFloat32);
    const std::vector<double> got = values_of(a.op(x));
    for (size_t i = 0; i < xs.size(); ++i) {
      const double want = double(float(a.f(xs[i])));  // selu(-inf) = -scale alpha, rounded to float32
      CHECK_MESSAGE((std::isnan(want) ? std::isnan(got[i]) : got[i] == want), a.name, " at ", xs[i], ": ", got[i],
                    ", PyTorch's ", want);
    }
  }
  // Gradients at NaN: aten's comparisons are false, so its backward passes g (elu, hardtanh,
  // relu6, hardswish), scales it (leaky_relu: g slope), drops it (hardsigmoid) or gives NaN (mish).
  for (const Activation& a : activations())
    for (DType dt : {kFloat64, kFloat32}) {
      const Tensor x = make_tensor(xs, {3}, dt).requires_grad_();
      sum(a.op(x)).backward();
      // float32 rounds slope (0.01f != 0.01), so the reference is rounded the same way.
      const double got = values_of(x.grad())[0], exact = a.df(kNaN);
      const double want = dt == kFloat32 ? double(float(exact)) : exact;
      CHECK_MESSAGE((std::isnan(want) ? std::isnan(got) : got == want), a.name, " ", name_of(dt),
                    " gradient at NaN: ", got, ", PyTorch's ", want);
    }
}

TEST_CASE("activations: gradients one ulp either side of each kink take PyTorch's branches") {
  // The grid hits the kinks exactly; here the neighbouring doubles, where a formula written
  // with the wrong comparison (< for <=) or a rounded shift (x + 3) would jump a branch.
  const std::vector<double> kinks = {-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0};
  std::vector<double> xs;
  for (double k : kinks) xs.insert(xs.end(), {std::nextafter(k, -kInf), k, std::nextafter(k, kInf)});
  for (const Activation& a : activations()) {
    const Tensor x = make_tensor(xs, {int64_t(xs.size())}, kFloat64).requires_grad_();
    const Tensor y = a.op(x);
    std::vector<double> want_y, want_g;
    for (double v : xs) want_y.push_back(a.f(v)), want_g.push_back(a.df(v));
    check_close(y, want_y, 1e-14, 0, a.name + " values at the kinks");
    sum(y).backward();
    check_close(x.grad(), want_g, 1e-14, 0, a.name + " gradients at the kinks");
  }
}

TEST_CASE("activations: leaky_relu's dense float32 kernel gives the generic loop's bits") {
  // Dense float32 runs a bit blend (tensor/cpu/unary.cpp); a strided view runs unary_math.h's
  // select. Both must agree bit for bit on every kind of value and slope, both directions.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<double> values = {0.0, -0.0, 1.5, -1.5, inf, -inf, nan, tiny, -tiny, 3e38, -3e38, 1e-30, -1e-30};
  for (int i = 0; i < 200; ++i) values.push_back(std::sin(0.37 * i) * std::pow(10.0, (i % 11) - 5));
  const int64_t n = int64_t(values.size());
  const Tensor x = make_tensor(values, {n}, kFloat32);
  const Tensor xs = make_tensor(values, {n}, kFloat32, Layout::Strided);
  std::vector<double> gv(values.rbegin(), values.rend());
  const Tensor g = make_tensor(gv, {n}, kFloat32), gs = make_tensor(gv, {n}, kFloat32, Layout::Strided);
  for (double slope : {0.01, 0.2, 0.0, -0.5, 1.0, 3.0}) {
    CAPTURE(slope);
    CHECK(bytes_of(ops::leaky_relu(x, slope)) == bytes_of(ops::leaky_relu(xs, slope).contiguous()));
    CHECK(bytes_of(ops::unary_backward(ops::UnaryOp::LeakyRelu, g, x, slope)) ==
          bytes_of(ops::unary_backward(ops::UnaryOp::LeakyRelu, gs, xs, slope).contiguous()));
  }
}

TEST_CASE("activations: size-0 inputs give size-0 outputs and gradients") {
  for (const Activation& a : activations()) {
    const Tensor x = zeros({0, 3}, kFloat32).requires_grad_();
    const Tensor y = a.op(x);
    CHECK(y.sizes() == Shape{0, 3});
    sum(y).backward();
    CHECK(x.grad().sizes() == Shape{0, 3});
  }
}

TEST_CASE("activations: bad parameters and inputs are errors that name the op") {
  const Tensor x = zeros({2}, kFloat32);
  check_error([&] { leaky_relu(x, kNaN); }, {"leaky_relu", "negative_slope"});
  check_error([&] { elu(x, kInf); }, {"elu", "alpha"});
  check_error([&] { hardtanh(x, 1.0, -1.0); }, {"hardtanh", "min_val", "max_val"});
  check_error([&] { hardtanh(x, kNaN, 1.0); }, {"hardtanh", "NaN"});
  check_error([&] { hardswish(zeros({2}, kInt64)); }, {"hardswish", "int64"});
  check_error([&] { nn::Hardtanh{2.0, 1.0}; }, {"Hardtanh", "min_val"});
  check_error([&] { nn::LeakyReLU{kNaN}; }, {"LeakyReLU", "negative_slope"});
  check_error([&] { celu(x, 0.0); }, {"celu", "alpha", "nonzero"});
  check_error([&] { softshrink(x, -0.5); }, {"softshrink", "lambd", ">= 0"});
  check_error([&] { hardshrink(x, kNaN); }, {"hardshrink", "NaN"});
  check_error([&] { threshold(x, kNaN, 1.0); }, {"threshold", "NaN"});
  check_error([&] { selu(zeros({2}, kInt32)); }, {"selu", "int32"});
  check_error([&] { nn::CELU{0.0}; }, {"CELU", "alpha"});
  check_error([&] { nn::Softshrink{-1.0}; }, {"Softshrink", "lambd"});
  check_error([&] { glu(zeros({2, 3}, kFloat32)); }, {"glu", "even", "[2, 3]"});
  check_error([&] { glu(zeros({2, 4}, kFloat32), 2); }, {"glu"});
  check_error([&] { prelu(zeros({2, 3}, kFloat32), zeros({2}, kFloat32)); }, {"prelu", "weight", "3"});
  check_error([&] { prelu(zeros({3}, kFloat32), zeros({3}, kFloat32)); }, {"prelu", "1 value"});
  check_error([&] { prelu(zeros({2, 3}, kInt64), zeros({1}, kFloat32)); }, {"prelu", "floating"});
}

TEST_CASE("activations: glu halves along any dim; prelu with one slope or one per channel") {
  // glu: a * sigmoid(b) for x's two halves, against a float64 loop.
  const Tensor x = make_tensor(random_values(2 * 6 * 3, 11, -4, 4), {2, 6, 3}, kFloat64);
  const std::vector<double> xv = values_of(x);
  const Tensor y = glu(x, 1);
  REQUIRE(y.sizes() == Shape{2, 3, 3});
  std::vector<double> want;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t w = 0; w < 3; ++w) {
        const double a = xv[size_t((n * 6 + c) * 3 + w)], b = xv[size_t((n * 6 + c + 3) * 3 + w)];
        want.push_back(a / (1 + std::exp(-b)));
      }
  check_close(y, want, 1e-14, 0, "glu dim 1");
  check_close(glu(x.transpose(1, 2), -1), values_of(y.transpose(1, 2)), 1e-14, 0, "glu of a transposed view");
  // prelu: x > 0 ? x : w x, w along dim 1 (or one in all), against a float64 loop.
  const Tensor p = make_tensor(random_values(2 * 3 * 4, 12, -2, 2), {2, 3, 4}, kFloat64);
  const Tensor w = make_tensor({0.1, -0.5, 2.0}, {3}, kFloat64);
  const std::vector<double> pv = values_of(p);
  std::vector<double> want_per_channel, want_shared;
  for (size_t i = 0; i < pv.size(); ++i) {
    const double slope = values_of(w)[(i / 4) % 3];
    want_per_channel.push_back(pv[i] > 0 ? pv[i] : slope * pv[i]);
    want_shared.push_back(pv[i] > 0 ? pv[i] : 0.25 * pv[i]);
  }
  check_close(prelu(p, w), want_per_channel, 1e-15, 0, "prelu per channel");
  check_close(prelu(p, make_tensor({0.25}, {1}, kFloat64)), want_shared, 1e-15, 0, "prelu shared");
  check_close(prelu(make_tensor({-2.0, 3.0}, {2}, kFloat32), make_tensor({0.5}, {1}, kFloat32)), {-1.0, 3.0}, 0, 0,
              "prelu of a 1-D x");
  // A float32 weight with float16 activations (autocast's case): used in x's dtype.
  const Tensor h = prelu(make_tensor({-2.0, 3.0}, {1, 2}, kFloat16), make_tensor({0.5, 0.25}, {2}, kFloat32));
  CHECK(h.dtype() == kFloat16);
  check_close(h, {-1.0, 3.0}, 0, 0, "prelu float16 x, float32 weight");
  // Gradients, first and second order, in x and the weight.
  Tensor xg = make_tensor(random_values(2 * 4 * 3, 13, -3, 3), {2, 4, 3}, kFloat64).requires_grad_();
  check_gradcheck([](const TensorList& in) { return glu(in[0], 1); }, {xg});
  const autograd::GradcheckResult gg =
      autograd::gradgradcheck([](const TensorList& in) { return glu(in[0], -1); },
                              {make_tensor(random_values(12, 14), {3, 4}, kFloat64).requires_grad_()});
  CHECK_MESSAGE(gg.ok, gg.report);
  std::vector<double> pvals = random_values(2 * 3 * 5, 15, -2, 2);
  for (double& e : pvals) e += e < 0 ? -0.1 : 0.1;  // off the kink at 0
  Tensor pg = make_tensor(pvals, {2, 3, 5}, kFloat64).requires_grad_();
  Tensor wg = make_tensor({0.1, -0.5, 0.3}, {3}, kFloat64).requires_grad_();
  check_gradcheck([](const TensorList& in) { return prelu(in[0], in[1]); }, {pg, wg});
  Tensor w1 = make_tensor({0.2}, {1}, kFloat64).requires_grad_();
  check_gradcheck([](const TensorList& in) { return prelu(in[0], in[1]); }, {pg, w1});
}

TEST_CASE("activations: the nn modules call their functions with their parameters") {
  const Tensor x = make_tensor(grid(), {57}, kFloat64);
  const auto same = [&](nn::UnaryModule& m, const Tensor& want, const std::string& repr) {
    check_close(m.forward(x), values_of(want), 0, 0, m.type_name());
    CHECK(m.extra_repr() == repr);
  };
  nn::LeakyReLU leaky(0.2);
  same(leaky, leaky_relu(x, 0.2), "negative_slope=0.200000");
  nn::ELU elu_module(0.5);
  same(elu_module, elu(x, 0.5), "alpha=0.500000");
  nn::Hardtanh hard(-2.0, 3.0);
  same(hard, hardtanh(x, -2.0, 3.0), "min_val=-2.000000, max_val=3.000000");
  nn::ReLU6 six;
  same(six, relu6(x), "");
  CHECK(six.type_name() == "ReLU6");
  nn::Hardsigmoid hs;
  same(hs, hardsigmoid(x), "");
  nn::Hardswish hw;
  same(hw, hardswish(x), "");
  nn::Mish mish_module;
  same(mish_module, mish(x), "");
  nn::LogSigmoid log_sigmoid;
  same(log_sigmoid, logsigmoid(x), "");
  CHECK(log_sigmoid.type_name() == "LogSigmoid");
  nn::SELU selu_module;
  same(selu_module, selu(x), "");
  nn::CELU celu_module(0.5);
  same(celu_module, celu(x, 0.5), "alpha=0.500000");
  nn::Softsign softsign_module;
  same(softsign_module, softsign(x), "");
  nn::Tanhshrink tanhshrink_module;
  same(tanhshrink_module, tanhshrink(x), "");
  nn::Hardshrink hardshrink_module(1.0);
  same(hardshrink_module, hardshrink(x, 1.0), "lambd=1.000000");
  nn::Softshrink softshrink_module(0.25);
  same(softshrink_module, softshrink(x, 0.25), "lambd=0.250000");
  nn::Threshold threshold_module(0.5, -2.0);
  same(threshold_module, threshold(x, 0.5, -2.0), "threshold=0.500000, value=-2.000000");
  nn::GLU glu_module(0);
  check_close(glu_module.forward(make_tensor(random_values(8, 3), {4, 2}, kFloat64)),
              values_of(glu(make_tensor(random_values(8, 3), {4, 2}, kFloat64), 0)), 0, 0, "GLU");
  CHECK(glu_module.extra_repr() == "dim=0");
  // PReLU: torch's "weight", num_parameters values of `init`.
  nn::PReLU prelu_module(3, 0.1);
  REQUIRE(prelu_module.named_parameters().size() == 1);
  CHECK(prelu_module.named_parameters()[0].first == "weight");
  check_close(prelu_module.weight, {0.1, 0.1, 0.1}, 1e-7, 0, "PReLU init (float32)");
  CHECK(prelu_module.extra_repr() == "num_parameters=3");
  const Tensor px = make_tensor(random_values(2 * 3 * 2, 4), {2, 3, 2}, kFloat32);
  check_close(prelu_module.forward(px), values_of(prelu(px, prelu_module.weight)), 0, 0, "PReLU forward");
  check_error([] { nn::PReLU{0}; }, {"PReLU", "num_parameters"});
}
