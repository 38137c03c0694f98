#pragma once
// Checked CUDA runtime calls. Include only from CUDA translation units
// (files built when FRUGAL_WITH_CUDA is defined).
#include <cuda_runtime.h>

#include "core/error.h"

namespace frugal::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
}

#define FRUGAL_CUDA_CHECK(expr)                                                   \
  do {                                                                            \
    cudaError_t frugal_err_ = (expr);                                             \
    if (frugal_err_ != cudaSuccess) [[unlikely]]                                  \
      ::frugal::detail::throw_cuda_error(frugal_err_, #expr, __FILE__, __LINE__); \
  } while (0)

/// After every kernel launch: a bad launch configuration surfaces here, at its line.
#define FRUGAL_CUDA_CHECK_LAUNCH() FRUGAL_CUDA_CHECK(cudaGetLastError())
