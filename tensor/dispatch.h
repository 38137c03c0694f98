#pragma once
// Dtype dispatch: one visitor per set of types, calling a templated lambda with
// the C++ element type. The default case throws, naming the op, the dtype and
// the device (docs/design.md, "Errors"), so no op ever falls through silently.
//
//   dispatch_floating(x.dtype(), "exp", x.device(), [&]<typename T>() { exp_kernel<T>(...); });
#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/error.h"
#include "tensor/dtype.h"

namespace frugal {

[[noreturn]] void throw_unsupported_dtype(const char* op, DType t, Device d);

#define FRUGAL_DTYPE_CASE(DT, CT) \
  case DType::DT: return f.template operator()<CT>();

/// float32, float64, float16, bfloat16
template <typename F>
decltype(auto) dispatch_floating(DType t, const char* op, Device d, F&& f) {
  switch (t) {
    FRUGAL_DTYPE_CASE(Float32, float)
    FRUGAL_DTYPE_CASE(Float64, double)
    FRUGAL_DTYPE_CASE(Float16, Half)
    FRUGAL_DTYPE_CASE(BFloat16, BFloat16)
    default: throw_unsupported_dtype(op, t, d);
  }
}

/// floating types + int32, int64
template <typename F>
decltype(auto) dispatch_numeric(DType t, const char* op, Device d, F&& f) {
  switch (t) {
    FRUGAL_DTYPE_CASE(Float32, float)
    FRUGAL_DTYPE_CASE(Float64, double)
    FRUGAL_DTYPE_CASE(Float16, Half)
    FRUGAL_DTYPE_CASE(BFloat16, BFloat16)
    FRUGAL_DTYPE_CASE(Int32, int32_t)
    FRUGAL_DTYPE_CASE(Int64, int64_t)
    default: throw_unsupported_dtype(op, t, d);
  }
}

/// every dtype
template <typename F>
decltype(auto) dispatch_all(DType t, const char* op, Device d, F&& f) {
  switch (t) {
    FRUGAL_DTYPE_CASE(Float32, float)
    FRUGAL_DTYPE_CASE(Float64, double)
    FRUGAL_DTYPE_CASE(Float16, Half)
    FRUGAL_DTYPE_CASE(BFloat16, BFloat16)
    FRUGAL_DTYPE_CASE(Int32, int32_t)
    FRUGAL_DTYPE_CASE(Int64, int64_t)
    FRUGAL_DTYPE_CASE(Bool, bool)
    case DType::UInt8: break;  // storage only: Note [Storage-only uint8] in tensor/dtype.h
  }
  throw_unsupported_dtype(op, t, d);
}

/// int32, int64 (index tensors)
template <typename F>
decltype(auto) dispatch_index(DType t, const char* op, Device d, F&& f) {
  switch (t) {
    FRUGAL_DTYPE_CASE(Int32, int32_t)
    FRUGAL_DTYPE_CASE(Int64, int64_t)
    default: throw_unsupported_dtype(op, t, d);
  }
}

/// f.template operator()<U>() with U the unsigned integer of `bytes` bytes: for kernels that
/// only move elements (gathers, masked_select), which need their size, not their type.
template <typename F>
void dispatch_bytes(size_t bytes, const char* op, F&& f) {
  switch (bytes) {
    case 1: return f.template operator()<uint8_t>();
    case 2: return f.template operator()<uint16_t>();
    case 4: return f.template operator()<uint32_t>();
    case 8: return f.template operator()<uint64_t>();
  }
  FRUGAL_FAIL(op, ": no kernel for elements of ", bytes, " bytes");
}

}  // namespace frugal
