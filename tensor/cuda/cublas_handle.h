#pragma once
// cuBLAS and cuBLASLt handles, their workspace, and FRUGAL_CUBLAS_CHECK.
// Include only from CUDA translation units (see Note [cuBLAS handles] in cublas_handle.cu).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstddef>

#include "core/device.h"
#include "core/error.h"

namespace frugal::ops::cuda {

/// "CUBLAS_STATUS_NOT_SUPPORTED" and the like.
const char* cublas_status_name(cublasStatus_t status);

/// This thread's cuBLAS handle for `device`, bound to the device's current stream
/// (stream_for(device)) and to the workspace of that stream. Call it right before
/// each cuBLAS call, under a DeviceGuard for `device`: the current stream may change
/// between calls.
cublasHandle_t cublas_handle(Device device);

/// This thread's cuBLASLt handle for `device`. cuBLASLt takes the stream and the
/// workspace per call: pass stream_for(device) and cublas_workspace(device).
cublasLtHandle_t cublaslt_handle(Device device);

/// Scratch memory for cuBLAS/cuBLASLt work on `device`'s current stream, from the arena.
struct CublasWorkspace {
  void* ptr = nullptr;
  size_t size = 0;
};
CublasWorkspace cublas_workspace(Device device);

namespace detail {
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line);
}

}  // namespace frugal::ops::cuda

/// Checks a cuBLAS/cuBLASLt call; throws frugal::Error naming the status, the call, the file and the line.
#define FRUGAL_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                            \
    cublasStatus_t frugal_status_ = (expr);                                                       \
    if (frugal_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                     \
      ::frugal::ops::cuda::detail::throw_cublas_error(frugal_status_, #expr, __FILE__, __LINE__); \
  } while (0)
