// Binary elementwise ops (tensor/ops/binary.h): broadcasting, mixed dtypes through the
// promotion rules (written out again here), scalar forms and in-place forms, the
// last also on an output that aliases an input; atan2, hypot, logaddexp and the
// division-like ops (integer division by zero must throw).
#include <cmath>

#include "tensor/ops/binary.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

// FloatMath: computes in a floating dtype (integers give float32), as Div; Divide: the
// division-like ops, integers stay integers (Note [Division-like ops]).
enum class Kind { Arith, Div, MinMax, Pow, Compare, Logical, FloatMath, Divide };

struct BinarySpec {
  const char* name;
  Kind kind;
  Tensor (*call)(const Tensor& a, const Tensor& b, double alpha);
  double (*f)(double a, double b, double alpha);
  bool alpha = false;
};

double int_pow(double base, double e) {  // Note: math::int_pow's rules for negative exponents
  if (e < 0) return base == 1 ? 1.0 : base == -1 ? (int64_t(e) % 2 ? -1.0 : 1.0) : 0.0;
  return std::pow(base, e);
}

/// The division-like op `name` on integers, exactly: truncated quotient and remainder, then
/// floored where the signs differ (Python's // and %).
double int_divide(const std::string& name, double a, double b) {
  const int64_t x = int64_t(a), y = int64_t(b), q = x / y, r = x % y;
  const bool floored = r != 0 && ((r < 0) != (y < 0));
  if (name.rfind("remainder", 0) == 0) return double(floored ? r + y : r);
  if (name.rfind("fmod", 0) == 0) return double(r);
  if (name.rfind("floor_divide", 0) == 0) return double(floored ? q - 1 : q);
  return double(q);  // div_trunc
}

// clang-format off
const BinarySpec kBinary[] = {
  {"add", Kind::Arith, [](const Tensor& a, const Tensor& b, double al) { return ops::add(a, b, al); },
   [](double a, double b, double al) { return a + al * b; }, true},
  {"sub", Kind::Arith, [](const Tensor& a, const Tensor& b, double al) { return ops::sub(a, b, al); },
   [](double a, double b, double al) { return a - al * b; }, true},
  {"mul", Kind::Arith, [](const Tensor& a, const Tensor& b, double) { return ops::mul(a, b); },
   [](double a, double b, double) { return a * b; }},
  {"div", Kind::Div, [](const Tensor& a, const Tensor& b, double) { return ops::div(a, b); },
   [](double a, double b, double) { return a / b; }},
  {"maximum", Kind::MinMax, [](const Tensor& a, const Tensor& b, double) { return ops::maximum(a, b); },
   [](double a, double b, double) { return std::isnan(a) || a > b ? a : b; }},
  {"minimum", Kind::MinMax, [](const Tensor& a, const Tensor& b, double) { return ops::minimum(a, b); },
   [](double a, double b, double) { return std::isnan(a) || a < b ? a : b; }},
  {"pow", Kind::Pow, [](const Tensor& a, const Tensor& b, double) { return ops::pow(a, b); },
   [](double a, double b, double) { return std::pow(a, b); }},
  {"eq", Kind::Compare, [](const Tensor& a, const Tensor& b, double) { return ops::eq(a, b); },
   [](double a, double b, double) { return double(a == b); }},
  {"ne", Kind::Compare, [](const Tensor& a, const Tensor& b, double) { return ops::ne(a, b); },
   [](double a, double b, double) { return double(a != b); }},
  {"lt", Kind::Compare, [](const Tensor& a, const Tensor& b, double) { return ops::lt(a, b); },
   [](double a, double b, double) { return double(a < b); }},
  {"le", Kind::Compare, [](const Tensor& a, const Tensor& b, double) { return ops::le(a, b); },
   [](double a, double b, double) { return double(a <= b); }},
  {"gt", Kind::Compare, [](const Tensor& a, const Tensor& b, double) { return ops::gt(a, b); },
   [](double a, double b, double) { return double(a > b); }},
  {"ge", Kind::Compare, [](const Tensor& a, const Tensor& b, double) { return ops::ge(a, b); },
   [](double a, double b, double) { return double(a >= b); }},
  {"logical_and", Kind::Logical, [](const Tensor& a, const Tensor& b, double) { return ops::logical_and(a, b); },
   [](double a, double b, double) { return double(a != 0 && b != 0); }},
  {"logical_or", Kind::Logical, [](const Tensor& a, const Tensor& b, double) { return ops::logical_or(a, b); },
   [](double a, double b, double) { return double(a != 0 || b != 0); }},
  {"atan2", Kind::FloatMath, [](const Tensor& a, const Tensor& b, double) { return ops::atan2(a, b); },
   [](double a, double b, double) { return std::atan2(a, b); }},
  {"hypot", Kind::FloatMath, [](const Tensor& a, const Tensor& b, double) { return ops::hypot(a, b); },
   [](double a, double b, double) { return std::sqrt(a * a + b * b); }},
  {"logaddexp", Kind::FloatMath, [](const Tensor& a, const Tensor& b, double) { return ops::logaddexp(a, b); },
   [](double a, double b, double) { return std::log(std::exp(a) + std::exp(b)); }},
  {"remainder", Kind::Divide, [](const Tensor& a, const Tensor& b, double) { return ops::remainder(a, b); },
   [](double a, double b, double) { return a - b * std::floor(a / b); }},
  {"fmod", Kind::Divide, [](const Tensor& a, const Tensor& b, double) { return ops::fmod(a, b); },
   [](double a, double b, double) { return std::fmod(a, b); }},
  {"floor_divide", Kind::Divide, [](const Tensor& a, const Tensor& b, double) { return ops::floor_divide(a, b); },
   [](double a, double b, double) { return std::floor(a / b); }},
  {"div_trunc", Kind::Divide, [](const Tensor& a, const Tensor& b, double) { return ops::div(a, b, "trunc"); },
   [](double a, double b, double) { return std::trunc(a / b); }},
};
// clang-format on

/// Values for operand `which` (0: left, 1: right) of an op of `kind`.
Values operand_values(Kind kind, int which, DType t) {
  const bool fl = is_floating(t);
  switch (kind) {
    case Kind::Div:
    case Kind::Divide:
      return which == 1 ? Values{fl ? -3.0 : -5.0, fl ? 3.0 : 5.0, fl ? 0.0 : 1.0, fl ? 0.25 : 1.0}
                        : values_for(t, kind == Kind::Divide ? -6.0 : -2.0, kind == Kind::Divide ? 6.0 : 2.0);
    case Kind::Arith: return values_for(t);
    case Kind::MinMax:
    case Kind::Compare: return fl ? Values{-2, 2, 0.5} : Values{-3, 3, 1};
    case Kind::Logical: return Values{-1, 1, 1};
    case Kind::Pow:
      if (which == 0) return fl ? Values{0.25, 3} : Values{-3, 3, 1};
      return fl ? Values{-2, 2} : Values{-2, 4, 1};
    default: return values_for(t);
  }
}

/// The other operand's dtype: the case's with p = 0.65, else any.
DType partner_dtype(Rng& rng, DType dt) { return rng.chance(0.35) ? rng.pick(kAll) : dt; }

/// PyTorch's can_cast, as binary.cpp documents it for in-place results.
bool can_cast(DType from, DType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != kBool && to == kBool) return false;
  return true;
}

/// The compute dtype of `kind` on `promoted`; throws MustThrow for arithmetic on bool.
DType compute_of(Kind kind, DType promoted) {
  if (kind == Kind::Div || kind == Kind::FloatMath) return is_floating(promoted) ? promoted : kFloat32;
  if ((kind == Kind::Arith || kind == Kind::MinMax || kind == Kind::Pow || kind == Kind::Divide) && promoted == kBool)
    throw MustThrow{"arithmetic on bool"};
  return promoted;
}

/// sub (sub_, sub_scalar, sub_scalar_) refuses a bool operand, as PyTorch's sub_check.
void check_sub_dtypes(const char* name, DType a, DType b) {
  if (std::string(name).rfind("sub", 0) == 0 && (a == kBool || b == kBool))
    throw MustThrow{"subtraction with a bool tensor"};
}

/// The value of `spec` on (a, b), as the compute dtype defines it.
double apply(const BinarySpec& spec, DType compute, double a, double b, double alpha) {
  if (spec.kind == Kind::Pow && !is_floating(compute)) return int_pow(a, b);
  if (spec.kind == Kind::Divide && !is_floating(compute)) return int_divide(spec.name, a, b);
  if (compute == kInt32 && spec.kind == Kind::Arith) {  // exact in int64, then two's-complement wrap
    const int64_t x = int64_t(a), y = int64_t(b), k = int64_t(alpha);
    const std::string name = spec.name;
    const int64_t r = name == "mul" ? x * y : name == "sub" ? x - k * y : x + k * y;
    return double(int32_t(uint32_t(uint64_t(r))));
  }
  return spec.f(a, b, alpha);
}

Tol result_tol(Kind kind, DType out) {
  if (kind == Kind::Compare || kind == Kind::Logical || kind == Kind::MinMax) return {};
  return tol_for(out);
}

double draw_alpha(Rng& rng) { return rng.pick(std::vector<double>{1.0, 2.0, -1.0, 0.5}); }

/// An elementwise shape of up to 6 dims.
Shape out_shape(Rng& rng) {
  if (rng.chance(0.015)) return big_shape(rng);
  return random_shape(rng, {.min_dims = 0, .max_dims = 6, .max_size = 7, .max_numel = 500});
}

void add_tensor_tensor(std::vector<OpEntry>& t, const BinarySpec& spec) {
  t.push_back({spec.name, kAll, [spec](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = out_shape(rng);
                 DType ta = dt, tb = partner_dtype(rng, dt);
                 if (rng.chance(0.5)) std::swap(ta, tb);
                 // NaN and infinities where the op defines them (max/min, comparisons, sums).
                 const bool specials = spec.kind == Kind::MinMax || spec.kind == Kind::Compare ||
                                       spec.kind == Kind::Logical || std::string(spec.name) == "add";
                 const bool wrap = spec.kind == Kind::Arith && ta == kInt32 && tb == kInt32 && rng.chance(0.15);
                 // x / 0: inf, NaN; an integer division's must throw
                 const bool zeros = (spec.kind == Kind::Div || spec.kind == Kind::Divide) && rng.chance(0.2);
                 auto values = [&](int which, DType t) {
                   Values v = operand_values(spec.kind, which, t);
                   if (wrap) v = {-2147483648.0, 2147483647.0, 1.0};  // int32 overflow wraps around
                   if (zeros) v.min_abs = 0;
                   return specials ? with_specials(rng, v) : v;
                 };
                 s.inputs = {random_input(rng, broadcast_operand(rng, shape), ta, values(0, ta)),
                             random_input(rng, broadcast_operand(rng, shape), tb, values(1, tb))};
                 const double alpha = spec.alpha ? draw_alpha(rng) : 1.0;
                 if (spec.alpha) s.params = cat_str("alpha=", alpha);
                 s.run = [spec, alpha](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{spec.call(in[0], in[1], alpha)};
                 };
                 s.reference = [spec, alpha, ta, tb](const std::vector<Host>& in) {
                   check_sub_dtypes(spec.name, ta, tb);
                   const DType result = ref_result_type(ta, in[0].sizes.empty(), tb, in[1].sizes.empty());
                   const DType compute = compute_of(spec.kind, result);
                   // Both operands are converted to a floating result dtype first (a 0-d float32
                   // beside bfloat16 is rounded to bfloat16, as torch): Note [0-d operands in promotion].
                   const auto operand = [result](double v) { return is_floating(result) ? round_to(result, v) : v; };
                   if (spec.alpha && !is_floating(compute) && alpha != std::trunc(alpha))
                     throw MustThrow{"a fractional alpha with an integer result"};
                   const bool pred = spec.kind == Kind::Compare || spec.kind == Kind::Logical;
                   const DType out = pred ? kBool : compute;
                   const Shape shape = broadcast(in[0].sizes, in[1].sizes);
                   if (spec.kind == Kind::Divide && !is_floating(compute) && numel_of(shape) > 0)
                     for (double v : in[1].v)
                       if (v == 0) throw MustThrow{"integer division by zero"};
                   return std::vector<Expected>{
                       make_expected(shape, out, result_tol(spec.kind, out), [&](const std::vector<int64_t>& idx) {
                         return apply(spec, compute, operand(in[0].at_broadcast(idx)), operand(in[1].at_broadcast(idx)),
                                      alpha);
                       })};
                 };
                 return s;
               }});
}

struct ScalarSpec {
  const char* name;
  Kind kind;
  Tensor (*call)(const Tensor& x, double s);
  const Tensor& (*call_)(const Tensor& x, double s);  // the in-place form, or null
  double (*f)(double x, double s);
};

// clang-format off
const ScalarSpec kScalar[] = {
  {"add_scalar", Kind::Arith, [](const Tensor& x, double s) { return ops::add(x, s); },
   [](const Tensor& x, double s) -> const Tensor& { return ops::add_(x, s); }, [](double x, double s) { return x + s; }},
  {"sub_scalar", Kind::Arith, [](const Tensor& x, double s) { return ops::sub(x, s); },
   [](const Tensor& x, double s) -> const Tensor& { return ops::sub_(x, s); }, [](double x, double s) { return x - s; }},
  {"mul_scalar", Kind::Arith, [](const Tensor& x, double s) { return ops::mul(x, s); },
   [](const Tensor& x, double s) -> const Tensor& { return ops::mul_(x, s); }, [](double x, double s) { return x * s; }},
  {"div_scalar", Kind::Div, [](const Tensor& x, double s) { return ops::div(x, s); },
   [](const Tensor& x, double s) -> const Tensor& { return ops::div_(x, s); }, [](double x, double s) { return x / s; }},
  {"eq_scalar", Kind::Compare, [](const Tensor& x, double s) { return ops::eq(x, s); }, nullptr,
   [](double x, double s) { return double(x == s); }},
  {"ne_scalar", Kind::Compare, [](const Tensor& x, double s) { return ops::ne(x, s); }, nullptr,
   [](double x, double s) { return double(x != s); }},
  {"lt_scalar", Kind::Compare, [](const Tensor& x, double s) { return ops::lt(x, s); }, nullptr,
   [](double x, double s) { return double(x < s); }},
  {"le_scalar", Kind::Compare, [](const Tensor& x, double s) { return ops::le(x, s); }, nullptr,
   [](double x, double s) { return double(x <= s); }},
  {"gt_scalar", Kind::Compare, [](const Tensor& x, double s) { return ops::gt(x, s); }, nullptr,
   [](double x, double s) { return double(x > s); }},
  {"ge_scalar", Kind::Compare, [](const Tensor& x, double s) { return ops::ge(x, s); }, nullptr,
   [](double x, double s) { return double(x >= s); }},
  {"remainder_scalar", Kind::Divide, [](const Tensor& x, double s) { return ops::remainder(x, s); }, nullptr,
   [](double x, double s) { return x - s * std::floor(x / s); }},
  {"fmod_scalar", Kind::Divide, [](const Tensor& x, double s) { return ops::fmod(x, s); }, nullptr,
   [](double x, double s) { return std::fmod(x, s); }},
  {"floor_divide_scalar", Kind::Divide, [](const Tensor& x, double s) { return ops::floor_divide(x, s); }, nullptr,
   [](double x, double s) { return std::floor(x / s); }},
};
// clang-format on

bool is_integral_value(double s) { return std::isfinite(s) && s == std::trunc(s); }

double draw_scalar(Rng& rng, Kind kind) {
  double s = rng.chance(0.5) ? double(rng.range(-3, 3)) : rng.pick(std::vector<double>{0.5, -1.25, 0.1, 2.75, -0.3});
  if (kind == Kind::Div && s == 0) s = 2;
  return s;
}

void add_scalar_entries(std::vector<OpEntry>& t, const ScalarSpec& spec) {
  for (bool inplace : {false, true}) {
    if (inplace && !spec.call_) continue;
    const std::string name = std::string(spec.name) + (inplace ? "_" : "");
    t.push_back(
        {name, kAll, [spec, inplace](Rng& rng, DType dt) {
           Sample s;
           const Values v =
               spec.kind == Kind::Compare ? with_specials(rng, operand_values(Kind::Compare, 0, dt)) : values_for(dt);
           s.inputs = {random_input(rng, out_shape(rng), dt, v, {.expand = !inplace})};
           const double k = draw_scalar(rng, spec.kind);
           s.params = cat_str("scalar=", k);
           if (inplace) s.mutates = {0};
           s.run = [spec, k, inplace](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{inplace ? spec.call_(in[0], k) : spec.call(in[0], k)};
           };
           s.reference = [spec, k, dt, inplace](const std::vector<Host>& in) {
             check_sub_dtypes(spec.name, dt, dt);
             const DType compute = compute_of(spec.kind, ref_promote_scalar(dt, !is_integral_value(k)));
             const DType out = spec.kind == Kind::Compare ? kBool : inplace ? dt : compute;
             if (inplace && !can_cast(compute, dt)) throw MustThrow{"the result does not cast to self"};
             // A comparison rounds the scalar to the compute type first, arithmetic to its opmath
             // type (binary_scalar_value), which the division-like ops' steps can tell apart
             // (floor(1 / float(0.1)) = 9).
             const double rhs = spec.kind == Kind::Compare  ? round_to(compute, k)
                                : spec.kind == Kind::Divide ? round_to(compute == kFloat64 ? kFloat64 : kFloat32, k)
                                                            : k;
             const bool int_division = spec.kind == Kind::Divide && !is_floating(compute);
             if (int_division && k == 0) throw MustThrow{"integer division by zero"};
             return std::vector<Expected>{
                 make_expected(in[0].sizes, out, result_tol(spec.kind, out), [&](const auto& idx) {
                   return int_division ? int_divide(spec.name, in[0].at(idx), rhs) : spec.f(in[0].at(idx), rhs);
                 })};
           };
           return s;
         }});
  }
}

struct InplaceSpec {
  const char* name;
  Kind kind;
  const Tensor& (*call)(const Tensor& a, const Tensor& b, double alpha);
  double (*f)(double a, double b, double alpha);
  bool alpha = false;
};

// clang-format off
const InplaceSpec kInplace[] = {
  {"add_", Kind::Arith, [](const Tensor& a, const Tensor& b, double al) -> const Tensor& { return ops::add_(a, b, al); },
   [](double a, double b, double al) { return a + al * b; }, true},
  {"sub_", Kind::Arith, [](const Tensor& a, const Tensor& b, double al) -> const Tensor& { return ops::sub_(a, b, al); },
   [](double a, double b, double al) { return a - al * b; }, true},
  {"mul_", Kind::Arith, [](const Tensor& a, const Tensor& b, double) -> const Tensor& { return ops::mul_(a, b); },
   [](double a, double b, double) { return a * b; }},
  {"div_", Kind::Div, [](const Tensor& a, const Tensor& b, double) -> const Tensor& { return ops::div_(a, b); },
   [](double a, double b, double) { return a / b; }},
};
// clang-format on

void add_inplace(std::vector<OpEntry>& t, const InplaceSpec& spec) {
  t.push_back(
      {spec.name, kAll, [spec](Rng& rng, DType dt) {
         Sample s;
         const Shape shape = out_shape(rng);
         const DType tb = partner_dtype(rng, dt);
         Tensor self = random_input(rng, shape, dt, operand_values(spec.kind, 0, dt), {.expand = false});
         s.mutates = {0};
         const double u = rng.uniform(0, 1);
         if (u < 0.08 && spec.kind != Kind::Div) {  // a += a: the same view
           s.inputs = {self, self};
           s.mutates = {0, 1};
           s.params = "other is self; ";
         } else if (u < 0.14 && shape.size() == 2 && shape[0] == shape[1] && spec.kind != Kind::Div) {
           s.inputs = {self, self.transpose(0, 1)};  // overlapping, another layout: copied first
           s.mutates = {0, 1};
           s.params = "other is self.t(); ";
         } else {
           s.inputs = {self, random_input(rng, broadcast_operand(rng, shape), tb, operand_values(spec.kind, 1, tb))};
         }
         const double alpha = spec.alpha ? draw_alpha(rng) : 1.0;
         s.params += cat_str("alpha=", alpha);
         s.run = [spec, alpha](const std::vector<Tensor>& in) {
           return std::vector<Tensor>{spec.call(in[0], in[1], alpha)};
         };
         const DType other_dtype = s.inputs[1].dtype();
         s.reference = [spec, alpha, dt, other_dtype](const std::vector<Host>& in) {
           check_sub_dtypes(spec.name, dt, other_dtype);
           const DType compute =
               compute_of(spec.kind, ref_result_type(dt, in[0].sizes.empty(), other_dtype, in[1].sizes.empty()));
           if (spec.alpha && !is_floating(compute) && alpha != std::trunc(alpha))
             throw MustThrow{"a fractional alpha with an integer result"};
           if (!can_cast(compute, dt)) throw MustThrow{"the result does not cast to self"};
           // The operand is converted to a floating result dtype first, as in the out-of-place
           // reference (a 0-d float16 beside bfloat16 self is rounded to bfloat16, as torch).
           const DType result = ref_result_type(dt, in[0].sizes.empty(), other_dtype, in[1].sizes.empty());
           const auto operand = [result](double v) { return is_floating(result) ? round_to(result, v) : v; };
           return std::vector<Expected>{make_expected(in[0].sizes, dt, tol_for(dt), [&](const auto& idx) {
             return spec.f(in[0].at(idx), operand(in[1].at_broadcast(idx)), alpha);
           })};
         };
         return s;
       }});
}

Values fill_values(DType dt) { return dt == kBool ? Values{0, 1, 1} : values_for(dt); }

double draw_fill(Rng& rng, DType dt) {
  if (dt == kBool) return double(rng.range(0, 1));
  if (!is_floating(dt)) return double(rng.range(-9, 9));
  return rng.pick(std::vector<double>{-1.5, 0.25, 3.0, -0.0, 7.5});
}

}  // namespace

void add_binary_ops(std::vector<OpEntry>& t) {
  for (const BinarySpec& b : kBinary) add_tensor_tensor(t, b);
  for (const ScalarSpec& b : kScalar) add_scalar_entries(t, b);
  for (const InplaceSpec& b : kInplace) add_inplace(t, b);

  t.push_back({"logical_not", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 s.inputs = {random_input(rng, out_shape(rng), dt, Values{-1, 1, 1})};
                 s.run = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::logical_not(in[0])}; };
                 s.reference = [](const std::vector<Host>& in) {
                   return std::vector<Expected>{make_expected(
                       in[0].sizes, kBool, {}, [&](const auto& idx) { return double(in[0].at(idx) == 0); })};
                 };
                 return s;
               }});

  t.push_back({"where", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = out_shape(rng);
                 const DType tb = partner_dtype(rng, dt);
                 s.inputs = {random_input(rng, broadcast_operand(rng, shape), kBool),
                             random_input(rng, broadcast_operand(rng, shape), dt, fill_values(dt)),
                             random_input(rng, broadcast_operand(rng, shape), tb, fill_values(tb))};
                 s.run = [](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::where(in[0], in[1], in[2])};
                 };
                 s.reference = [dt, tb](const std::vector<Host>& in) {
                   const Shape shape = broadcast(broadcast(in[0].sizes, in[1].sizes), in[2].sizes);
                   const DType out = ref_result_type(dt, in[1].sizes.empty(), tb, in[2].sizes.empty());
                   return std::vector<Expected>{make_expected(shape, out, {}, [&](const auto& idx) {
                     return in[0].at_broadcast(idx) != 0 ? in[1].at_broadcast(idx) : in[2].at_broadcast(idx);
                   })};
                 };
                 return s;
               }});

  for (bool inplace : {false, true}) {
    t.push_back({inplace ? "masked_fill_" : "masked_fill", kAll, [inplace](Rng& rng, DType dt) {
                   Sample s;
                   const Shape shape = out_shape(rng);
                   const bool mask_bigger = !inplace && rng.chance(0.3);
                   s.inputs = {random_input(rng, mask_bigger ? broadcast_operand(rng, shape) : shape, dt,
                                            fill_values(dt), {.expand = !inplace}),
                               random_input(rng, broadcast_operand(rng, shape), kBool)};
                   if (inplace) s.mutates = {0};
                   if (inplace && dt == kBool && rng.chance(0.3)) {  // the mask is x itself, or x.t()
                     const bool square = shape.size() == 2 && shape[0] == shape[1];
                     s.inputs[1] = square && rng.chance(0.5) ? s.inputs[0].t() : s.inputs[0];
                   }
                   const double value = draw_fill(rng, dt);
                   s.params = cat_str("value=", value);
                   s.run = [inplace, value](const std::vector<Tensor>& in) {
                     return std::vector<Tensor>{inplace ? ops::masked_fill_(in[0], in[1], value)
                                                        : ops::masked_fill(in[0], in[1], value)};
                   };
                   s.reference = [dt, value](const std::vector<Host>& in) {
                     const Shape shape = broadcast(in[0].sizes, in[1].sizes);
                     return std::vector<Expected>{make_expected(shape, dt, {}, [&](const auto& idx) {
                       return in[1].at_broadcast(idx) != 0 ? value : in[0].at_broadcast(idx);
                     })};
                   };
                   return s;
                 }});
  }
}

}  // namespace frugal::optest
