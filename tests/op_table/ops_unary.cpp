// Unary elementwise ops (tensor/ops/unary.h) and their backward, against std:: math in double.
#include <cmath>

#include "tensor/ops/unary.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

using ops::UnaryOp;

double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double softplus(double x, double beta, double threshold) {
  return beta * x > threshold ? x : std::log1p(std::exp(beta * x)) / beta;  // torch's formula
}

double hardsigmoid(double x) { return std::min(std::max(x + 3.0, 0.0), 6.0) / 6.0; }
double mish(double x) { return x * std::tanh(std::log1p(std::exp(x))); }
double sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : x == 0 ? 0.0 : x; }  // NaN stays NaN

double selu(double x) { return x > 0 ? ops::kSeluScale * x : ops::kSeluScale * ops::kSeluAlpha * std::expm1(x); }
double softsign(double x) { return std::isinf(x) ? std::copysign(1.0, x) : x / (1 + std::fabs(x)); }

/// What a, b mean for an op: nothing, pow's exponent, affine's (scale, shift), clamp's (lo, hi),
/// softplus's (beta, threshold), leaky_relu's slope or elu's alpha (a), hardtanh's (lo <= hi),
/// celu's alpha (a != 0), the shrinks' lambd (a >= 0), threshold's (threshold, value).
enum class Params { None, Exponent, Affine, Clamp, Softplus, Slope, Bounds, Alpha, Lambd, Threshold };

void draw_params(Rng& rng, Params p, double& a, double& b) {
  a = b = 0.0;
  if (p == Params::Exponent) a = rng.pick(std::vector<double>{0.0, 0.5, 1.5, 2.0, 3.0, -1.0, -0.5});
  if (p == Params::Affine) a = rng.uniform(-3, 3), b = rng.uniform(-3, 3);
  if (p == Params::Clamp) a = 0.25 * double(rng.range(-8, 6)), b = 0.25 * double(rng.range(-6, 8));  // lo > hi too
  if (p == Params::Softplus)
    a = rng.pick(std::vector<double>{1.0, 2.0, 0.5, -1.5}), b = rng.pick(std::vector<double>{20.0, 1.0, 0.0, -2.0});
  if (p == Params::Slope) a = rng.pick(std::vector<double>{0.01, 0.2, 1.0, 0.0, -0.5, 2.0});
  if (p == Params::Bounds) a = 0.25 * double(rng.range(-8, 0)), b = a + 0.25 * double(rng.range(0, 12));  // lo == hi too
  if (p == Params::Alpha) a = rng.pick(std::vector<double>{1.0, 0.5, 2.0, -1.5});
  if (p == Params::Lambd) a = rng.pick(std::vector<double>{0.5, 0.0, 1.0, 0.25});
  if (p == Params::Threshold)
    a = rng.pick(std::vector<double>{0.0, 0.5, -1.0}), b = rng.pick(std::vector<double>{-2.0, 0.0, 7.5});
}

struct UnarySpec {
  const char* name;
  UnaryOp op;
  bool ints;
  Values values;
  Params params;
  double (*f)(double x, double a, double b);
};

// clang-format off
const UnarySpec kUnary[] = {
  {"neg", UnaryOp::Neg, true, {}, Params::None, [](double x, double, double) { return -x; }},
  {"exp", UnaryOp::Exp, false, {-3, 3}, Params::None, [](double x, double, double) { return std::exp(x); }},
  {"log", UnaryOp::Log, false, {0.05, 4}, Params::None, [](double x, double, double) { return std::log(x); }},
  {"sqrt", UnaryOp::Sqrt, false, {0, 4}, Params::None, [](double x, double, double) { return std::sqrt(x); }},
  {"rsqrt", UnaryOp::Rsqrt, false, {0.05, 4}, Params::None, [](double x, double, double) { return 1 / std::sqrt(x); }},
  {"tanh", UnaryOp::Tanh, false, {-4, 4}, Params::None, [](double x, double, double) { return std::tanh(x); }},
  {"sigmoid", UnaryOp::Sigmoid, false, {-6, 6}, Params::None, [](double x, double, double) { return sigmoid(x); }},
  {"relu", UnaryOp::Relu, true, {}, Params::None, [](double x, double, double) { return x < 0 ? 0.0 : x; }},
  {"gelu", UnaryOp::Gelu, false, {-4, 4}, Params::None, [](double x, double, double) { return gelu(x); }},
  {"gelu_tanh", UnaryOp::GeluTanh, false, {-4, 4}, Params::None, [](double x, double, double) { return gelu_tanh(x); }},
  {"silu", UnaryOp::Silu, false, {-4, 4}, Params::None, [](double x, double, double) { return x * sigmoid(x); }},
  {"abs", UnaryOp::Abs, true, {}, Params::None, [](double x, double, double) { return std::fabs(x); }},
  {"square", UnaryOp::Square, true, {}, Params::None, [](double x, double, double) { return x * x; }},
  {"reciprocal", UnaryOp::Reciprocal, false, {-3, 3, 0, 0.1}, Params::None, [](double x, double, double) { return 1 / x; }},
  {"sin", UnaryOp::Sin, false, {-4, 4}, Params::None, [](double x, double, double) { return std::sin(x); }},
  {"cos", UnaryOp::Cos, false, {-4, 4}, Params::None, [](double x, double, double) { return std::cos(x); }},
  {"pow_scalar", UnaryOp::Pow, false, {0.1, 3}, Params::Exponent, [](double x, double a, double) { return std::pow(x, a); }},
  {"affine", UnaryOp::Affine, false, {}, Params::Affine, [](double x, double a, double b) { return x * a + b; }},
  {"clamp", UnaryOp::Clamp, false, {}, Params::Clamp, [](double x, double a, double b) { return std::min(std::max(x, a), b); }},
  {"log1p", UnaryOp::Log1p, false, {-0.9, 4}, Params::None, [](double x, double, double) { return std::log1p(x); }},
  {"softplus", UnaryOp::Softplus, false, {-30, 30}, Params::Softplus, softplus},
  {"leaky_relu", UnaryOp::LeakyRelu, false, {-2, 2, 0.5}, Params::Slope, [](double x, double a, double) { return x > 0 ? x : x * a; }},
  {"elu", UnaryOp::Elu, false, {-6, 3}, Params::Slope, [](double x, double a, double) { return x > 0 ? x : a * std::expm1(x); }},
  {"hardtanh", UnaryOp::Hardtanh, false, {-2.5, 2.5, 0.25}, Params::Bounds, [](double x, double a, double b) { return std::min(std::max(x, a), b); }},
  {"hardsigmoid", UnaryOp::Hardsigmoid, false, {-5, 5, 0.5}, Params::None, [](double x, double, double) { return hardsigmoid(x); }},
  {"hardswish", UnaryOp::Hardswish, false, {-5, 5, 0.5}, Params::None, [](double x, double, double) { return x * hardsigmoid(x); }},
  {"mish", UnaryOp::Mish, false, {-8, 8}, Params::None, [](double x, double, double) { return mish(x); }},
  {"selu", UnaryOp::Selu, false, {-6, 3}, Params::None, [](double x, double, double) { return selu(x); }},
  {"celu", UnaryOp::Celu, false, {-6, 3}, Params::Alpha, [](double x, double a, double) { return x > 0 ? x : a * std::expm1(x / a); }},
  {"softsign", UnaryOp::Softsign, false, {-5, 5}, Params::None, [](double x, double, double) { return softsign(x); }},
  {"tanhshrink", UnaryOp::Tanhshrink, false, {-4, 4}, Params::None, [](double x, double, double) { return x - std::tanh(x); }},
  {"hardshrink", UnaryOp::Hardshrink, false, {-2, 2, 0.25}, Params::Lambd, [](double x, double a, double) { return x >= -a && x <= a ? 0.0 : x; }},
  {"softshrink", UnaryOp::Softshrink, false, {-2, 2, 0.25}, Params::Lambd, [](double x, double a, double) {
     return x > a ? x - a : x < -a ? x + a : std::isnan(x) ? x : 0.0; }},
  {"threshold", UnaryOp::Threshold, false, {-2, 2, 0.25}, Params::Threshold, [](double x, double a, double b) { return x <= a ? b : x; }},
  {"tan", UnaryOp::Tan, false, {-1.2, 1.2}, Params::None, [](double x, double, double) { return std::tan(x); }},
  {"asin", UnaryOp::Asin, false, {-1, 1}, Params::None, [](double x, double, double) { return std::asin(x); }},
  {"acos", UnaryOp::Acos, false, {-1, 1}, Params::None, [](double x, double, double) { return std::acos(x); }},
  {"atan", UnaryOp::Atan, false, {-5, 5}, Params::None, [](double x, double, double) { return std::atan(x); }},
  {"sinh", UnaryOp::Sinh, false, {-4, 4}, Params::None, [](double x, double, double) { return std::sinh(x); }},
  {"cosh", UnaryOp::Cosh, false, {-4, 4}, Params::None, [](double x, double, double) { return std::cosh(x); }},
  {"asinh", UnaryOp::Asinh, false, {-5, 5}, Params::None, [](double x, double, double) { return std::asinh(x); }},
  {"acosh", UnaryOp::Acosh, false, {1, 5}, Params::None, [](double x, double, double) { return std::acosh(x); }},
  {"atanh", UnaryOp::Atanh, false, {-0.95, 0.95}, Params::None, [](double x, double, double) { return std::atanh(x); }},
  {"erf", UnaryOp::Erf, false, {-4, 4}, Params::None, [](double x, double, double) { return std::erf(x); }},
  {"erfc", UnaryOp::Erfc, false, {-4, 4}, Params::None, [](double x, double, double) { return std::erfc(x); }},
  {"expm1", UnaryOp::Expm1, false, {-3, 3}, Params::None, [](double x, double, double) { return std::expm1(x); }},
  {"exp2", UnaryOp::Exp2, false, {-5, 5}, Params::None, [](double x, double, double) { return std::exp2(x); }},
  {"log2", UnaryOp::Log2, false, {0.05, 8}, Params::None, [](double x, double, double) { return std::log2(x); }},
  {"log10", UnaryOp::Log10, false, {0.05, 8}, Params::None, [](double x, double, double) { return std::log10(x); }},
  {"logsigmoid", UnaryOp::LogSigmoid, false, {-30, 30}, Params::None, [](double x, double, double) { return -std::log1p(std::exp(-x)); }},
  {"floor", UnaryOp::Floor, true, {-4, 4}, Params::None, [](double x, double, double) { return std::floor(x); }},
  {"ceil", UnaryOp::Ceil, true, {-4, 4}, Params::None, [](double x, double, double) { return std::ceil(x); }},
  {"trunc", UnaryOp::Trunc, true, {-4, 4}, Params::None, [](double x, double, double) { return std::trunc(x); }},
  {"round", UnaryOp::Round, true, {-4, 4, 0.25}, Params::None, [](double x, double, double) { return std::nearbyint(x); }},
  {"sign", UnaryOp::Sign, true, {-2, 2, 1}, Params::None, [](double x, double, double) { return sign(x); }},
};
// clang-format on

/// The public function of each op (pow(x, 2) takes the square path, which is worth covering).
Tensor call_unary(UnaryOp op, const Tensor& x, double a, double b) {
  switch (op) {
    case UnaryOp::Pow: return ops::pow(x, a);
    case UnaryOp::Affine: return ops::affine(x, a, b);
    case UnaryOp::Clamp: return ops::clamp(x, a, b);
    case UnaryOp::Softplus: return ops::softplus(x, a, b);
    case UnaryOp::LeakyRelu: return ops::leaky_relu(x, a);
    case UnaryOp::Elu: return ops::elu(x, a);
    case UnaryOp::Hardtanh: return ops::hardtanh(x, a, b);
    case UnaryOp::Celu: return ops::celu(x, a);
    case UnaryOp::Hardshrink: return ops::hardshrink(x, a);
    case UnaryOp::Softshrink: return ops::softshrink(x, a);
    case UnaryOp::Threshold: return ops::threshold(x, a, b);
    case UnaryOp::Relu: return ops::relu(x);
    case UnaryOp::Neg: return ops::neg(x);
    default: return ops::unary(op, x);
  }
}

struct GradSpec {
  UnaryOp op;
  Values values;  // of x, or of y where the derivative is taken from the output
  double (*df)(double g, double v, double a, double b);
};

// clang-format off
const GradSpec kGrads[] = {
  {UnaryOp::Neg, {}, [](double g, double, double, double) { return -g; }},
  {UnaryOp::Affine, {}, [](double g, double, double a, double) { return g * a; }},
  {UnaryOp::Exp, {0.1, 3}, [](double g, double y, double, double) { return g * y; }},
  {UnaryOp::Log, {0.2, 3}, [](double g, double x, double, double) { return g / x; }},
  {UnaryOp::Sqrt, {0.2, 2}, [](double g, double y, double, double) { return g / (2 * y); }},
  {UnaryOp::Rsqrt, {0.2, 2}, [](double g, double y, double, double) { return -0.5 * g * y * y * y; }},
  {UnaryOp::Tanh, {-0.99, 0.99}, [](double g, double y, double, double) { return g * (1 - y * y); }},
  {UnaryOp::Sigmoid, {0.01, 0.99}, [](double g, double y, double, double) { return g * y * (1 - y); }},
  {UnaryOp::Relu, {}, [](double g, double y, double, double) { return y <= 0 ? 0.0 : g; }},
  {UnaryOp::Gelu, {-4, 4}, [](double g, double x, double, double) {
     return g * (0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI)); }},
  {UnaryOp::GeluTanh, {-4, 4}, [](double g, double x, double, double) {
     const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
     return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)); }},
  {UnaryOp::Silu, {-4, 4}, [](double g, double x, double, double) { const double s = sigmoid(x); return g * s * (1 + x * (1 - s)); }},
  {UnaryOp::Abs, {}, [](double g, double x, double, double) { return x > 0 ? g : x < 0 ? -g : 0.0; }},
  {UnaryOp::Square, {}, [](double g, double x, double, double) { return 2 * x * g; }},
  {UnaryOp::Reciprocal, {-3, 3, 0, 0.1}, [](double g, double y, double, double) { return -g * y * y; }},
  {UnaryOp::Sin, {-4, 4}, [](double g, double x, double, double) { return g * std::cos(x); }},
  {UnaryOp::Cos, {-4, 4}, [](double g, double x, double, double) { return -g * std::sin(x); }},
  {UnaryOp::Pow, {0.2, 3}, [](double g, double x, double a, double) { return a == 0 ? 0.0 : g * a * std::pow(x, a - 1); }},
  {UnaryOp::Clamp, {}, [](double g, double x, double a, double b) { return x >= a && x <= b ? g : 0.0; }},
  {UnaryOp::Log1p, {-0.9, 3}, [](double g, double x, double, double) { return g / (1 + x); }},
  {UnaryOp::Softplus, {-30, 30}, [](double g, double x, double a, double b) { return a * x > b ? g : g * sigmoid(a * x); }},
  // PyTorch's conventions at the kinks (derivatives.yaml and its activation kernels).
  {UnaryOp::LeakyRelu, {-2, 2, 0.5}, [](double g, double x, double a, double) { return x > 0 ? g : g * a; }},
  {UnaryOp::Elu, {-6, 3}, [](double g, double x, double a, double) { return x <= 0 ? g * a * std::exp(x) : g; }},
  {UnaryOp::Hardtanh, {-2.5, 2.5, 0.25}, [](double g, double x, double a, double b) { return x <= a || x >= b ? 0.0 : g; }},
  {UnaryOp::Hardsigmoid, {-5, 5, 0.5}, [](double g, double x, double, double) { return x > -3 && x < 3 ? g / 6 : 0.0; }},
  {UnaryOp::Hardswish, {-5, 5, 0.5}, [](double g, double x, double, double) { return x < -3 ? 0.0 : x <= 3 ? g * (x / 3 + 0.5) : g; }},
  {UnaryOp::Mish, {-8, 8}, [](double g, double x, double, double) {
     const double t = std::tanh(std::log1p(std::exp(x))); return g * (t + x * sigmoid(x) * (1 - t * t)); }},
  {UnaryOp::Selu, {-6, 3}, [](double g, double x, double, double) {
     return x <= 0 ? g * ops::kSeluScale * ops::kSeluAlpha * std::exp(x) : g * ops::kSeluScale; }},
  {UnaryOp::Celu, {-6, 3}, [](double g, double x, double a, double) { return x <= 0 ? g * std::exp(x / a) : g; }},
  {UnaryOp::Softsign, {-5, 5}, [](double g, double x, double, double) { return g / ((1 + std::fabs(x)) * (1 + std::fabs(x))); }},
  {UnaryOp::Tanhshrink, {-4, 4}, [](double g, double x, double, double) { return g * std::tanh(x) * std::tanh(x); }},
  {UnaryOp::Hardshrink, {-2, 2, 0.25}, [](double g, double x, double a, double) { return x >= -a && x <= a ? 0.0 : g; }},
  {UnaryOp::Softshrink, {-2, 2, 0.25}, [](double g, double x, double a, double) { return x >= -a && x <= a ? 0.0 : g; }},
  {UnaryOp::Threshold, {-2, 2, 0.25}, [](double g, double x, double a, double) { return x <= a ? 0.0 : g; }},
  // derivatives.yaml's; tan, expm1 and exp2 from y.
  {UnaryOp::Tan, {-3, 3}, [](double g, double y, double, double) { return g * (1 + y * y); }},
  {UnaryOp::Asin, {-0.95, 0.95}, [](double g, double x, double, double) { return g / std::sqrt(1 - x * x); }},
  {UnaryOp::Acos, {-0.95, 0.95}, [](double g, double x, double, double) { return -g / std::sqrt(1 - x * x); }},
  {UnaryOp::Atan, {-5, 5}, [](double g, double x, double, double) { return g / (1 + x * x); }},
  {UnaryOp::Sinh, {-4, 4}, [](double g, double x, double, double) { return g * std::cosh(x); }},
  {UnaryOp::Cosh, {-4, 4}, [](double g, double x, double, double) { return g * std::sinh(x); }},
  {UnaryOp::Asinh, {-5, 5}, [](double g, double x, double, double) { return g / std::sqrt(x * x + 1); }},
  {UnaryOp::Acosh, {1.05, 5}, [](double g, double x, double, double) { return g / std::sqrt(x * x - 1); }},
  {UnaryOp::Atanh, {-0.9, 0.9}, [](double g, double x, double, double) { return g / (1 - x * x); }},
  {UnaryOp::Erf, {-3, 3}, [](double g, double x, double, double) { return g * 2 / std::sqrt(M_PI) * std::exp(-x * x); }},
  {UnaryOp::Erfc, {-3, 3}, [](double g, double x, double, double) { return -g * 2 / std::sqrt(M_PI) * std::exp(-x * x); }},
  {UnaryOp::Expm1, {-0.5, 5}, [](double g, double y, double, double) { return g * (y + 1); }},
  {UnaryOp::Exp2, {0.1, 8}, [](double g, double y, double, double) { return g * y * M_LN2; }},
  {UnaryOp::Log2, {0.2, 8}, [](double g, double x, double, double) { return g / (x * M_LN2); }},
  {UnaryOp::Log10, {0.2, 8}, [](double g, double x, double, double) { return g / (x * M_LN10); }},
  {UnaryOp::LogSigmoid, {-30, 30}, [](double g, double x, double, double) { return g * sigmoid(-x); }},
  {UnaryOp::Floor, {}, [](double, double, double, double) { return 0.0; }},
  {UnaryOp::Ceil, {}, [](double, double, double, double) { return 0.0; }},
  {UnaryOp::Trunc, {}, [](double, double, double, double) { return 0.0; }},
  {UnaryOp::Round, {}, [](double, double, double, double) { return 0.0; }},
  {UnaryOp::Sign, {}, [](double, double, double, double) { return 0.0; }},
};
// clang-format on

Params params_of(UnaryOp op) {
  return op == UnaryOp::Pow      ? Params::Exponent
         : op == UnaryOp::Affine ? Params::Affine
         : op == UnaryOp::Clamp    ? Params::Clamp
         : op == UnaryOp::Softplus ? Params::Softplus
         : op == UnaryOp::LeakyRelu || op == UnaryOp::Elu ? Params::Slope
         : op == UnaryOp::Hardtanh ? Params::Bounds
         : op == UnaryOp::Celu     ? Params::Alpha
         : op == UnaryOp::Hardshrink || op == UnaryOp::Softshrink ? Params::Lambd
         : op == UnaryOp::Threshold                               ? Params::Threshold
                                                                  : Params::None;
}

Shape elementwise_shape(Rng& rng) {
  if (rng.chance(0.015)) return big_shape(rng);
  return random_shape(rng, {.min_dims = 0, .max_dims = 8, .max_size = 9, .max_numel = 700});
}

}  // namespace

void add_unary_ops(std::vector<OpEntry>& t) {
  for (const UnarySpec& u : kUnary) {
    t.push_back({u.name, u.ints ? kNumeric : kFloats, [u](Rng& rng, DType dt) {
                   Sample s;
                   Values v = is_floating(dt) ? u.values : values_for(dt, -2, 2);
                   const UnaryOp op = u.op;  // the ops whose NaN / inf handling the header defines
                   if (op == UnaryOp::Relu || op == UnaryOp::Clamp || op == UnaryOp::Abs || op == UnaryOp::Neg ||
                       op == UnaryOp::Square || op == UnaryOp::Exp || op == UnaryOp::LeakyRelu || op == UnaryOp::Elu ||
                       op == UnaryOp::Hardtanh || op == UnaryOp::Hardsigmoid || op == UnaryOp::Hardswish ||
                       op >= UnaryOp::Mish)  // (every op listed from mish on)
                     v = with_specials(rng, v);
                   if (dt == kInt32 && rng.chance(0.15)) v = {-2147483648.0, 2147483647.0, 1.0};  // wraps around
                   s.inputs = {random_input(rng, elementwise_shape(rng), dt, v)};
                   double a, b;
                   draw_params(rng, u.params, a, b);
                   if (u.params != Params::None) s.params = cat_str("a=", a, " b=", b);
                   s.run = [op = u.op, a, b](const std::vector<Tensor>& in) {
                     return std::vector<Tensor>{call_unary(op, in[0], a, b)};
                   };
                   s.reference = [u, a, b, dt](const std::vector<Host>& in) {
                     return std::vector<Expected>{make_expected(in[0].sizes, dt, tol_for(dt), [&](const auto& idx) {
                       const double x = in[0].at(idx);
                       if (dt != kInt32) return u.f(x, a, b);
                       const int64_t i = int64_t(x), r = u.op == UnaryOp::Square ? i * i : int64_t(u.f(x, a, b));
                       return double(int32_t(uint32_t(uint64_t(r))));  // exact in int64, then wrapped
                     })};
                   };
                   return s;
                 }});
  }
  for (const GradSpec& g : kGrads) {
    const std::string name = std::string(ops::unary_op_name(g.op)) + "_backward";
    t.push_back(
        {name, kFloats, [g](Rng& rng, DType dt) {
           Sample s;
           const Shape shape = elementwise_shape(rng);
           const ops::UnaryGradFrom from = ops::unary_grad_from(g.op);
           const bool needs_v = from != ops::UnaryGradFrom::Nothing && from != ops::UnaryGradFrom::Zero;
           s.inputs = {random_input(rng, shape, dt), needs_v ? random_input(rng, shape, dt, g.values) : Tensor()};
           double a, b;
           draw_params(rng, params_of(g.op), a, b);
           s.params = cat_str("a=", a, " b=", b);
           s.run = [op = g.op, a, b](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{ops::unary_backward(op, in[0], in[1], a, b)};
           };
           s.reference = [g, a, b, dt, needs_v](const std::vector<Host>& in) {
             return std::vector<Expected>{make_expected(in[0].sizes, dt, tol_for(dt), [&](const auto& idx) {
               return g.df(in[0].at(idx), needs_v ? in[1].at(idx) : 0.0, a, b);
             })};
           };
           return s;
         }});
  }
}

}  // namespace frugal::optest
