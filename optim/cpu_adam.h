#pragma once
// The CPU half of OffloadAdamW (optim/offload_adam.h): AdamW over one contiguous chunk of
// float32 master weights and moments, vectorised and split across threads. The element
// rule is Note [Adam update]'s adam_update<float>, the same expression optim::AdamW's CPU
// loop and fused CUDA kernel evaluate, so the three agree bit for bit on float32.
#include <cstdint>

#include "optim/update_math.h"
#include "tensor/dtype.h"

namespace frugal::optim::cpu {

/// One contiguous chunk of an offloaded parameter. The gradient and the output have the
/// parameter's (compute) dtype: float32, float16 or bfloat16.
struct OffloadAdamChunk {
  float* master;      // (n) float32 master weights, updated in place
  float* exp_avg;     // (n) float32 first moment
  float* exp_avg_sq;  // (n) float32 second moment
  const void* grad;   // (n) gradient
  void* param_out;    // (n) receives the updated weights rounded to the dtype; null when `master` is the param
  int64_t n;
  float grad_scale = 1.0f;  // the gradient used is float(grad) * grad_scale (a GradScaler's 1 / scale)
};

/// Applies the AdamW rule `coeffs` (decoupled, not amsgrad) to every element of `chunk`,
/// on up to `threads` threads. Each thread takes a contiguous slice whose bounds depend
/// only on n and `threads`, and every element is computed independently, so any thread
/// count gives bitwise the same result. `dtype` is the gradient's and output's.
void offload_adam_chunk(DType dtype, const OffloadAdamChunk& chunk, const detail::AdamCoeffs<float>& coeffs,
                        int threads);

/// Whether all n elements of `data` (float32, float16 or bfloat16) are finite, on up to
/// `threads` threads.
bool all_finite(DType dtype, const void* data, int64_t n, int threads);

/// dst[i] = dtype(float(dst[i]) + float(src[i])) for n elements of `dtype` (float32, float16,
/// bfloat16): a gradient accumulated on the host as AccumulateGrad's add_ would on a device.
void accumulate(DType dtype, void* dst, const void* src, int64_t n, int threads);

/// Elements per thread below which one thread does the whole chunk (a team costs more).
constexpr int64_t kOffloadAdamGrain = 1 << 15;

}  // namespace frugal::optim::cpu
