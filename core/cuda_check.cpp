// The slow path of FRUGAL_CUDA_CHECK (core/cuda_check.h).
#include "core/cuda_check.h"

namespace frugal::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  // Clear the error so a later FRUGAL_CUDA_CHECK_LAUNCH does not report it again
  // (sticky errors, which poison the context, stay whatever we do).
  (void)cudaGetLastError();
  throw_error(file, line, str_cat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", expr));
}

}  // namespace frugal::detail
