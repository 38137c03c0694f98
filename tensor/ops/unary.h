#pragma once
// Unary elementwise ops: y = f(x), same shape and dtype as x, a fresh contiguous tensor.
//
// Every op here runs through one enum-driven kernel per backend (unary_kernel), and
// its derivative through a second one (unary_backward_kernel, for autograd); the
// scalar formulas of both live in tensor/ops/unary_math.h, shared by the CPU and CUDA
// kernels so both compute the same thing. Floating dtypes only, except neg, abs,
// relu, square, floor, ceil, trunc, round and sign, which also take int32 and int64.
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal::ops {

/// -x
Tensor neg(const Tensor& x);
/// e^x
Tensor exp(const Tensor& x);
/// Natural logarithm.
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
/// 1 / sqrt(x)
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
/// 1 / (1 + e^-x)
Tensor sigmoid(const Tensor& x);
/// max(x, 0); NaN stays NaN.
Tensor relu(const Tensor& x);
/// x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the exact GELU.
Tensor gelu(const Tensor& x);
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's gelu(approximate='tanh').
Tensor gelu_tanh(const Tensor& x);
/// x * sigmoid(x) (a.k.a. swish).
Tensor silu(const Tensor& x);
/// log(1 + x), accurate for small x (where log(1 + x) rounds 1 + x first).
Tensor log1p(const Tensor& x);
/// log(1 + exp(beta x)) / beta, and x itself where beta x > threshold, as
/// torch.nn.functional.softplus; beta finite and nonzero, threshold not NaN (inf: never x).
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
/// x where x > 0, else negative_slope * x (torch.nn.functional.leaky_relu); slope finite.
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
/// x where x > 0, else alpha * (e^x - 1) (torch.nn.functional.elu); alpha finite.
Tensor elu(const Tensor& x, double alpha = 1.0);
/// min(max(x, min_val), max_val) with hardtanh's gradient (0 at both bounds, unlike clamp's);
/// min_val <= max_val, neither NaN. relu6 is hardtanh(x, 0, 6), as in PyTorch.
Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);
Tensor relu6(const Tensor& x);
/// relu6(x + 3) / 6
Tensor hardsigmoid(const Tensor& x);
/// x * relu6(x + 3) / 6 (MobileNetV3)
Tensor hardswish(const Tensor& x);
/// x * tanh(softplus(x)) (Misra 2019)
Tensor mish(const Tensor& x);
/// SELU's constants (Klambauer et al. 2017), torch.nn.functional.selu's.
inline constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
inline constexpr double kSeluScale = 1.0507009873554804934193349852946;
/// scale (x > 0 ? x : alpha (e^x - 1)) with SELU's alpha and scale.
Tensor selu(const Tensor& x);
/// x > 0 ? x : alpha (e^(x / alpha) - 1) (torch.nn.functional.celu); alpha finite and nonzero.
Tensor celu(const Tensor& x, double alpha = 1.0);
/// x / (1 + |x|); +-inf gives +-1 (PyTorch's x / (1 + |x|) gives NaN there).
Tensor softsign(const Tensor& x);
/// x - tanh(x)
Tensor tanhshrink(const Tensor& x);
/// 0 where -lambd <= x <= lambd, else x (torch.nn.functional.hardshrink); lambd not NaN.
Tensor hardshrink(const Tensor& x, double lambd = 0.5);
/// x - lambd above lambd, x + lambd below -lambd, else 0 (torch.nn.functional.softshrink);
/// lambd >= 0. NaN stays NaN (PyTorch 1.13 gives 0 there: Note [NaN stays NaN]).
Tensor softshrink(const Tensor& x, double lambd = 0.5);
/// x <= threshold ? value : x (torch.nn.functional.threshold); NaN stays NaN; threshold not NaN.
Tensor threshold(const Tensor& x, double threshold, double value);
Tensor abs(const Tensor& x);
/// x * x
Tensor square(const Tensor& x);
/// 1 / x
Tensor reciprocal(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
/// tan, and the inverse and hyperbolic functions, as std:: / torch: NaN outside the domain
/// (asin, acos and atanh of |x| > 1, acosh of x < 1); atanh(+-1) = +-inf.
Tensor tan(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor asinh(const Tensor& x);
Tensor acosh(const Tensor& x);
Tensor atanh(const Tensor& x);
/// The error function and its complement 1 - erf(x) (accurate where erf(x) is near 1).
Tensor erf(const Tensor& x);
Tensor erfc(const Tensor& x);
/// e^x - 1, accurate for small x (where e^x rounds to 1 first).
Tensor expm1(const Tensor& x);
/// 2^x
Tensor exp2(const Tensor& x);
/// Base-2 and base-10 logarithms.
Tensor log2(const Tensor& x);
Tensor log10(const Tensor& x);
/// log(sigmoid(x)) = -softplus(-x), without overflow or cancellation at either end
/// (torch.nn.functional.logsigmoid).
Tensor logsigmoid(const Tensor& x);
/// Rounding to an integral value, in x's dtype: floor, ceil, trunc (toward 0) and round (to the
/// nearest, ties to even, as torch.round). Integer tensors come back unchanged (a copy). The
/// gradient is 0 (as PyTorch's), so a value that went through them carries none.
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor trunc(const Tensor& x);
Tensor round(const Tensor& x);
/// -1, 0 or 1 in x's dtype (any numeric dtype); sign(-0) = 0. sign(NaN) is NaN: PyTorch gives
/// 0 there, which turns a NaN into a plausible number (Note [NaN stays NaN] in unary_math.h).
Tensor sign(const Tensor& x);
/// x ^ exponent (exponent 2 runs as square; 0.5 and -0.5 as sqrt and rsqrt, as PyTorch: see
/// Note [pow of 0.5 and -0.5] in unary_math.h).
Tensor pow(const Tensor& x, double exponent);
/// x * scale + shift in one pass (one rounding for 16-bit types).
Tensor affine(const Tensor& x, double scale, double shift);
/// min(max(x, lo), hi): hi wherever lo > hi (as PyTorch); NaN stays NaN, and a NaN bound
/// makes every element NaN (as PyTorch).
Tensor clamp(const Tensor& x, double lo, double hi);

/// Bool tensors of x's shape, as torch.isnan / isinf / isfinite: any dtype; integer and
/// bool inputs are never NaN or infinite (every element finite). -0 is finite.
Tensor isnan(const Tensor& x);
Tensor isinf(const Tensor& x);
Tensor isfinite(const Tensor& x);

// ---- backend interface -----------------------------------------------------

// X-macro over every unary op: X(Enumerator, "name", integer dtypes allowed).
// It defines the enum, the names and the compile-time visitor, so adding an op
// is one line here plus its formula in unary_math.h.
#define FRUGAL_UNARY_OPS(X)          \
  X(Neg, "neg", true)                \
  X(Exp, "exp", false)               \
  X(Log, "log", false)               \
  X(Sqrt, "sqrt", false)             \
  X(Rsqrt, "rsqrt", false)           \
  X(Tanh, "tanh", false)             \
  X(Sigmoid, "sigmoid", false)       \
  X(Relu, "relu", true)              \
  X(Gelu, "gelu", false)             \
  X(GeluTanh, "gelu_tanh", false)    \
  X(Silu, "silu", false)             \
  X(Abs, "abs", true)                \
  X(Square, "square", true)          \
  X(Reciprocal, "reciprocal", false) \
  X(Sin, "sin", false)               \
  X(Cos, "cos", false)               \
  X(Pow, "pow", false)               \
  X(Affine, "affine", false)         \
  X(Clamp, "clamp", false)           \
  X(Log1p, "log1p", false)           \
  X(Softplus, "softplus", false)     \
  X(LeakyRelu, "leaky_relu", false)  \
  X(Elu, "elu", false)               \
  X(Hardtanh, "hardtanh", false)     \
  X(Hardsigmoid, "hardsigmoid", false) \
  X(Hardswish, "hardswish", false)   \
  X(Mish, "mish", false)             \
  X(Selu, "selu", false)             \
  X(Celu, "celu", false)             \
  X(Softsign, "softsign", false)     \
  X(Tanhshrink, "tanhshrink", false) \
  X(Hardshrink, "hardshrink", false) \
  X(Softshrink, "softshrink", false) \
  X(Threshold, "threshold", false)   \
  X(Tan, "tan", false)               \
  X(Asin, "asin", false)             \
  X(Acos, "acos", false)             \
  X(Atan, "atan", false)             \
  X(Sinh, "sinh", false)             \
  X(Cosh, "cosh", false)             \
  X(Asinh, "asinh", false)           \
  X(Acosh, "acosh", false)           \
  X(Atanh, "atanh", false)           \
  X(Erf, "erf", false)               \
  X(Erfc, "erfc", false)             \
  X(Expm1, "expm1", false)           \
  X(Exp2, "exp2", false)             \
  X(Log2, "log2", false)             \
  X(Log10, "log10", false)           \
  X(LogSigmoid, "logsigmoid", false) \
  X(Floor, "floor", true)            \
  X(Ceil, "ceil", true)              \
  X(Trunc, "trunc", true)            \
  X(Round, "round", true)            \
  X(Sign, "sign", true)

/// Which unary op a kernel runs. Pow uses a = exponent; Affine a = scale, b = shift;
/// Clamp a = lo, b = hi; Softplus a = beta, b = threshold; LeakyRelu a = negative slope;
/// Elu a = alpha; Hardtanh a = min_val, b = max_val; Celu a = alpha; Hardshrink and Softshrink
/// a = lambd; Threshold a = threshold, b = value; the others ignore a and b.
enum class UnaryOp : uint8_t {
#define FRUGAL_UNARY_ENUM(E, name, ints) E,
  FRUGAL_UNARY_OPS(FRUGAL_UNARY_ENUM)
#undef FRUGAL_UNARY_ENUM
};

/// "gelu_tanh" for UnaryOp::GeluTanh.
constexpr const char* unary_op_name(UnaryOp op) {
  switch (op) {
#define FRUGAL_UNARY_NAME(E, name, ints) \
  case UnaryOp::E: return name;
    FRUGAL_UNARY_OPS(FRUGAL_UNARY_NAME)
#undef FRUGAL_UNARY_NAME
  }
  return "?";
}
/// True for the ops that also take int32/int64 tensors.
constexpr bool unary_op_allows_integers(UnaryOp op) {
  switch (op) {
#define FRUGAL_UNARY_INTS(E, name, ints) \
  case UnaryOp::E: return ints;
    FRUGAL_UNARY_OPS(FRUGAL_UNARY_INTS)
#undef FRUGAL_UNARY_INTS
  }
  return false;
}

/// Calls f.template operator()<kOp>() with the op as a compile-time constant, so a
/// backend instantiates one specialized loop per op from one generic body.
template <typename F>
decltype(auto) visit_unary_op(UnaryOp op, F&& f) {
  switch (op) {
#define FRUGAL_UNARY_CASE(E, name, ints) \
  case UnaryOp::E: return f.template operator()<UnaryOp::E>();
    FRUGAL_UNARY_OPS(FRUGAL_UNARY_CASE)
#undef FRUGAL_UNARY_CASE
  }
  FRUGAL_FAIL("visit_unary_op: invalid UnaryOp ", int(op));
}

/// The generic entry behind every op above: validates, allocates and dispatches.
Tensor unary(UnaryOp op, const Tensor& x, double a = 0.0, double b = 0.0);

/// Which class of floating value a predicate kernel tests for (isnan, isinf, isfinite).
enum class FloatClass : uint8_t { Nan, Inf, Finite };
/// The op that tests for `c`: "isnan", "isinf" or "isfinite".
inline const char* float_class_name(FloatClass c) {
  return c == FloatClass::Nan ? "isnan" : c == FloatClass::Inf ? "isinf" : "isfinite";
}

// ---- backward ----------------------------------------------------------------

/// Which forward value the derivative of an op is computed from (see unary_backward).
enum class UnaryGradFrom : uint8_t {
  Zero,     // floor, ceil, trunc, round, sign: 0 wherever the derivative exists (as PyTorch)
  Nothing,  // neg, affine: a constant factor
  Input,    // x
  Output,   // y = f(x): exp, sqrt, rsqrt, tanh, sigmoid, reciprocal, relu
};

/// What unary_backward(op, ...) must be given. Output where the derivative is cheaper
/// from y (exp: y, tanh: 1 - y^2, sqrt: 1 / 2y, rsqrt: -y^3 / 2, reciprocal: -y^2,
/// sigmoid: y (1 - y), expm1: y + 1, exp2: y ln 2, tan: 1 + y^2) or equally cheap (relu:
/// y > 0 exactly where x > 0), so the
/// autograd op can keep y, which the next op usually keeps too; Input otherwise.
constexpr UnaryGradFrom unary_grad_from(UnaryOp op) {
  switch (op) {
    case UnaryOp::Floor:
    case UnaryOp::Ceil:
    case UnaryOp::Trunc:
    case UnaryOp::Round:
    case UnaryOp::Sign: return UnaryGradFrom::Zero;
    case UnaryOp::Neg:
    case UnaryOp::Affine: return UnaryGradFrom::Nothing;
    case UnaryOp::Exp:
    case UnaryOp::Expm1:
    case UnaryOp::Exp2:
    case UnaryOp::Tan:
    case UnaryOp::Sqrt:
    case UnaryOp::Rsqrt:
    case UnaryOp::Tanh:
    case UnaryOp::Sigmoid:
    case UnaryOp::Reciprocal:
    case UnaryOp::Relu: return UnaryGradFrom::Output;
    default: return UnaryGradFrom::Input;
  }
}

/// grad * f'(x) in one fused kernel (llm.c's gelu_backward style), where f = `op` with
/// parameters a, b as in unary(). `x_or_out` is the forward input x or output y, as
/// unary_grad_from(op) says (undefined is fine for neg, affine and the rounding ops, whose
/// gradient is zeros); it has grad's shape
/// and dtype (any strides). Floating dtypes; 16-bit types compute in float. The result
/// is a fresh contiguous tensor of grad's shape and dtype. Conventions at the kinks, as
/// PyTorch: relu' = 0 at 0, abs' = 0 at 0, clamp passes the gradient where lo <= x <= hi,
/// pow(x, 0)' = 0, leaky_relu' = slope at 0, hardtanh' = 0 at both bounds, hardsigmoid' = 0
/// at +-3, hardswish' = 0 below -3 and x / 3 + 1 / 2 on [-3, 3].
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x_or_out, double a = 0.0, double b = 0.0);

}  // namespace frugal::ops

namespace frugal::ops::cpu {
// out, x: same shape (any strides); out.dtype() == x.dtype()
void unary_kernel(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b);
// grad_in, grad, v: same shape and floating dtype (grad, v any strides); v = x or y as
// unary_grad_from(op) says; op is not neg, affine or a rounding op (unary_grad_from: Zero).
void unary_backward_kernel(UnaryOp op, const Tensor& grad_in, const Tensor& grad, const Tensor& v, double a, double b);
// out: bool, x: floating, same shape (any strides); out = x is in class `c`.
void float_class_kernel(FloatClass c, const Tensor& out, const Tensor& x);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void unary_kernel(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b);
void unary_backward_kernel(UnaryOp op, const Tensor& grad_in, const Tensor& grad, const Tensor& v, double a, double b);
void float_class_kernel(FloatClass c, const Tensor& out, const Tensor& x);
}  // namespace frugal::ops::cuda
