#pragma once
// The cuDNN handle of each thread and device, and FRUGAL_CUDNN_CHECK.
// Include only from CUDA translation units (see Note [cuDNN handles] in cudnn_handle.cu).
#include <cudnn.h>

#include "core/device.h"
#include "core/error.h"

namespace frugal::ops::cuda {

/// This thread's cuDNN handle for `device`, bound to the device's current stream
/// (stream_for(device)). Call it right before each cuDNN call, under a DeviceGuard for
/// `device`: the current stream may change between calls.
cudnnHandle_t cudnn_handle(Device device);

namespace detail {
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line);
}

}  // namespace frugal::ops::cuda

/// Checks a cuDNN call; throws frugal::Error naming the status (cudnnGetErrorString), cuDNN's
/// own account of the failure when it has one, the call, the file and the line.
#define FRUGAL_CUDNN_CHECK(expr)                                                                 \
  do {                                                                                           \
    cudnnStatus_t frugal_status_ = (expr);                                                       \
    if (frugal_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                     \
      ::frugal::ops::cuda::detail::throw_cudnn_error(frugal_status_, #expr, __FILE__, __LINE__); \
  } while (0)
