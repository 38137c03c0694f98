// leaky_relu, elu, hardtanh, relu6, hardsigmoid, hardswish and mish against float64 loops of
// PyTorch's formulas (aten's activation kernels and derivatives.yaml): values and gradients
// on a grid that hits every kink exactly, on transposed views, in every floating dtype; NaN
// and infinities; size-0; the parameter checks; and the nn modules.
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
      const double want = a.f(xs[i]);
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
  const std::vector<double> kinks = {-3.0, -1.0, -0.5, 0.0, 1.0, 2.0, 3.0, 6.0};
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
}
