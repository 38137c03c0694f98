#pragma once
// Device dispatch for raw ops: the front-end (tensor/ops/<op>.cpp) validates,
// allocates the output and calls ops::cpu::<kernel> or ops::cuda::<kernel>.
// In a CPU-only build the CUDA branch becomes a clear error, never a link failure.
#include "core/device.h"
#include "core/error.h"

namespace frugal {
[[noreturn]] void throw_no_cuda(const char* op, Device d);
}

#ifdef FRUGAL_WITH_CUDA
#define FRUGAL_DEVICE_DISPATCH(op, device, kernel, ...) \
  ((void)(op), (device).is_cuda() ? ::frugal::ops::cuda::kernel(__VA_ARGS__) : ::frugal::ops::cpu::kernel(__VA_ARGS__))
#else
#define FRUGAL_DEVICE_DISPATCH(op, device, kernel, ...) \
  ((device).is_cuda() ? ::frugal::throw_no_cuda(op, device) : ::frugal::ops::cpu::kernel(__VA_ARGS__))
#endif
