#pragma once
// Element types and PyTorch's type-promotion rules.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/half.h"

namespace frugal {

// Note [Storage-only uint8]
// UInt8 holds bytes that are not numbers to compute with: the codes of a quantized tensor
// and packed bit masks (Note [Compressed saved tensors] in autograd/compress.h). Tensors
// of it are created, viewed, moved between devices (contiguous) and read through
// data_ptr<uint8_t>(); the compute ops reject it through the dispatch default case
// ("add: not implemented for uint8 on cpu"), and promotion is not defined for it. It comes
// after Bool so the codes of the other dtypes (in files and messages) stay as they were.
enum class DType : uint8_t { Float32, Float16, BFloat16, Float64, Int32, Int64, Bool, UInt8 };
/// How many dtypes there are: the codes 0 .. kNumDTypes - 1 (a dtype read from a file or
/// a message is checked against it).
inline constexpr int kNumDTypes = int(DType::UInt8) + 1;  // UInt8 stays last

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kBool = DType::Bool;
inline constexpr DType kUInt8 = DType::UInt8;  // storage only: Note [Storage-only uint8]

constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::Float32:
    case DType::Int32: return 4;
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Float64:
    case DType::Int64: return 8;
    case DType::Bool:
    case DType::UInt8: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64;
}
/// The dtype arithmetic on dtype t computes in, opmath_t's runtime twin: float32 for the
/// 16-bit types (Note [Half types compute in f32]), t itself otherwise.
constexpr DType opmath_dtype(DType t) { return t == DType::Float16 || t == DType::BFloat16 ? DType::Float32 : t; }
constexpr bool is_integral(DType t) { return t == DType::Int32 || t == DType::Int64; }  // bool excluded

const char* dtype_name(DType t);  // "float32", "float16", ...
/// Parses "float32"/"f32"/"float", "float16"/"f16"/"half", "bfloat16"/"bf16", ...
DType parse_dtype(const std::string& name);

/// PyTorch's promote_types: bool < integers < floats; f16 with bf16 gives f32.
DType promote_types(DType a, DType b);
/// Result of `tensor op scalar`: a scalar only lifts the category (an int tensor
/// with a float scalar gives float32), never the width, as in PyTorch.
DType promote_with_scalar(DType tensor, bool scalar_is_floating);

// Note [0-d operands in promotion]
// torch.result_type ranks a 0-d tensor below a dimensioned one (any tensor with dim() > 0,
// size-0 ones included): beside a dimensioned operand, a 0-d operand counts only when its
// category (bool < integer < floating) is higher. So f16[N] * f32[] is float16 and
// int32[N] + int64[] is int32 (wrapping in int32), while int32[N] + f64[] is float64; two 0-d
// operands, or two dimensioned ones, promote with promote_types. Without this, a 0-d factor
// (a norm, a learned temperature, a loss weight) would silently turn a float16 activation
// into float32 and compare or wrap in a different dtype than PyTorch. The 0-d operand is
// converted to the result dtype like any other operand (Note [Dynamic casting] in
// tensor/ops/binary_math.h).

/// torch.result_type of two tensor operands of dtypes a and b, where a_zero_dim / b_zero_dim
/// say whether each is 0-d (Note [0-d operands in promotion]).
DType result_type(DType a, bool a_zero_dim, DType b, bool b_zero_dim);

/// Maps C++ types to DType: dtype_of<float>() == kFloat32.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::Float32;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::Float16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::BFloat16;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::Float64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::Int32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::Int64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::Bool;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::UInt8;
}

}  // namespace frugal
