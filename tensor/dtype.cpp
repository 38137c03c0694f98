#include "tensor/dtype.h"

#include "core/error.h"

namespace frugal {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float64: return "float64";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "float32" || s == "f32" || s == "float") return kFloat32;
  if (s == "float16" || s == "f16" || s == "half" || s == "fp16") return kFloat16;
  if (s == "bfloat16" || s == "bf16") return kBFloat16;
  if (s == "float64" || s == "f64" || s == "double") return kFloat64;
  if (s == "int32" || s == "i32" || s == "int") return kInt32;
  if (s == "int64" || s == "i64" || s == "long") return kInt64;
  if (s == "bool") return kBool;
  if (s == "uint8" || s == "u8") return kUInt8;
  FRUGAL_FAIL("parse_dtype: unknown dtype '", s,
              "' (expected float32, float16, bfloat16, float64, int32, int64, bool, uint8)");
}

namespace {
int category(DType t) { return t == DType::Bool ? 0 : is_integral(t) ? 1 : 2; }
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  FRUGAL_CHECK(a != DType::UInt8 && b != DType::UInt8, "promote_types: uint8 is a storage-only dtype (codes, masks) ",
               "and does not promote with ", dtype_name(a == DType::UInt8 ? b : a),
               " (Note [Storage-only uint8] in tensor/dtype.h)");
  const int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 1) return DType::Int64;  // int32 with int64
  // Two different floating types.
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  return DType::Float32;  // f32 with a 16-bit type, or f16 with bf16
}

DType result_type(DType a, bool a_zero_dim, DType b, bool b_zero_dim) {
  // uint8 takes no part in promotion: promote_types refuses it with its message.
  if (a_zero_dim == b_zero_dim || a == DType::UInt8 || b == DType::UInt8) return promote_types(a, b);
  const DType dimensioned = a_zero_dim ? b : a, zero_dim = a_zero_dim ? a : b;
  return category(zero_dim) > category(dimensioned) ? promote_types(dimensioned, zero_dim) : dimensioned;
}

DType promote_with_scalar(DType t, bool scalar_is_floating) {
  if (scalar_is_floating && !is_floating(t)) return DType::Float32;
  if (!scalar_is_floating && t == DType::Bool) return DType::Int64;
  return t;
}

}  // namespace frugal
