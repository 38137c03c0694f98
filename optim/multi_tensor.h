#pragma once
// The backend interface of the optimizers: one entry per parameter (raw pointers
// and host-computed scalars), applied by a CPU loop or by one fused CUDA kernel for
// a whole list of entries.
//
// Note [Multi-tensor launch]
// A CUDA step packs the entries of every parameter of one (device, dtype) - all
// groups together, since the hyperparameters travel per entry - into one table, which
// reaches the device through a single cudaMemcpyAsync from pinned host memory. One
// kernel then walks all of them: each tensor is cut into chunks of kChunk elements,
// the chunks of all tensors are numbered consecutively (entry.chunk_begin is the first
// chunk of the entry), and each block takes chunks in a grid-stride loop, finding its
// entry by binary search over chunk_begin. So a step is one copy and one launch
// whatever the number of parameters, with no per-parameter launch and no host sync:
// scalars that depend on the step count (bias corrections) are computed on the host
// from the step counts it keeps and travel in the table. Temporaries come from the
// arenas (memory::allocate_pinned / memory::allocate) on the current stream, so the
// table may be freed as soon as the kernel is queued (see Note [Stream-aware reuse]).
// This is PyTorch's multi_tensor_apply, with the table in device memory rather than
// in kernel arguments (which would cap the tensors per launch).
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "tensor/dtype.h"

namespace frugal::optim::detail {

/// Elements per chunk: a multiple of 4 (vector width) x 256 (threads per block).
constexpr int64_t kChunk = 16384;

/// Set by the CUDA launchers on an entry whose pointers all allow 4-wide vector access.
constexpr uint32_t kVec4 = 1u << 31;

enum AdamFlags : uint32_t {
  kAdamDecoupled = 1u << 0,     // AdamW: p *= 1 - lr * wd (else Adam: g += wd * p)
  kAdamMaximize = 1u << 1,      // ascend: g = -g
  kAdamAmsgrad = 1u << 2,       // use max(v_max, v) in the denominator
  kAdamFreshMoments = 1u << 3,  // first step: exp_avg and exp_avg_sq start at zero (not read)
  kAdamFreshMax = 1u << 4,      // max_exp_avg_sq starts at zero (not read)
};

/// One Adam/AdamW parameter. Pointers: `numel` contiguous elements each; param and grad
/// in the parameter dtype, the state in float (float64 for float64 parameters).
struct AdamEntry {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  void* max_exp_avg_sq;  // null unless amsgrad
  int64_t numel;
  int64_t chunk_begin;  // set by the CUDA launcher
  double lr, beta1, beta2, eps, weight_decay;
  double step_size = 0;              // lr / (1 - beta1^t): set_bias_corrections
  double bias_correction2_sqrt = 0;  // sqrt(1 - beta2^t): set_bias_corrections
  uint32_t flags;                    // AdamFlags
  // Capturable Adam (Note [Capturable Adam]): the steps taken so far, in device memory; the
  // kernel computes the two above from it (t = *device_step + 1). Null: they are set here.
  const int64_t* device_step = nullptr;
};

enum SgdFlags : uint32_t {
  kSgdNesterov = 1u << 0,
  kSgdMaximize = 1u << 1,
  kSgdFreshBuffer = 1u << 2,  // first step with momentum: buf = d_p (not read)
};

/// One SGD parameter; momentum_buffer is null when momentum == 0.
struct SgdEntry {
  void* param;
  const void* grad;
  void* momentum_buffer;
  int64_t numel;
  int64_t chunk_begin;
  double lr, momentum, dampening, weight_decay;
  uint32_t flags;  // SgdFlags
};

/// One tensor for the gradient-norm and scaling kernels.
struct NormEntry {
  void* data;  // (numel) contiguous, in the launch's dtype
  int64_t numel;
  int64_t chunk_begin;
  uint32_t flags;  // kVec4 or 0
};

/// Fused optimizer kernel launches issued so far in this process (every CUDA
/// multi-tensor kernel of optim/ counts one). Tests use it to check one launch per step.
int64_t fused_launch_count();
void count_fused_launch();

}  // namespace frugal::optim::detail

namespace frugal::optim::cpu {
/// Applies each entry in a loop (OpenMP inside large tensors); `dtype` is the parameters'.
void adam_step(DType dtype, const std::vector<detail::AdamEntry>& entries);
void sgd_step(DType dtype, const std::vector<detail::SgdEntry>& entries);
}  // namespace frugal::optim::cpu

namespace frugal::optim::cuda {
/// One fused kernel over every entry (all on `device`, parameters of `dtype`).
/// skip_if as for sgd_step; entries with a device_step get it raised by one after the update
/// (unless skipped).
void adam_step(Device device, DType dtype, std::vector<detail::AdamEntry>& entries, const float* skip_if = nullptr);
/// skip_if (nullable, a float in device memory): the kernel returns at once when it is nonzero.
void sgd_step(Device device, DType dtype, std::vector<detail::SgdEntry>& entries, const float* skip_if = nullptr);
/// partials[k] for the k-th chunk (chunks numbered from chunk_offset) = sum of |x|^p over
/// it, or max |x| when p is infinite; `partials` is a float64 device array.
void norm_partials(Device device, DType dtype, std::vector<detail::NormEntry>& entries, double p, double* partials,
                   int64_t chunk_offset);
/// From the reduced partial (one float64: a sum or a max) writes the total norm into `total`
/// (one float32 or float64, as total_dtype says) and the clip coefficient min(1, max_norm /
/// (total + 1e-6)) (NaN stays NaN), computed in total_dtype, into the float64 `coef`.
void clip_coefficient(Device device, const double* reduced, double p, double max_norm, DType total_dtype, void* total,
                      double* coef);
/// x *= *coef for every entry, in opmath_t of the dtype (skipped on the device when *coef == 1).
void scale(Device device, DType dtype, std::vector<detail::NormEntry>& entries, const double* coef);
}  // namespace frugal::optim::cuda
