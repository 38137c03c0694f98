#pragma once
// Internal to optim/: what every optimizer's step() does around its update rule -
// contiguous handles for the kernels, entries grouped by (device, dtype), dispatch to
// the CPU loops or one fused CUDA launch per group, and the in-place bookkeeping.
#include <utility>
#include <vector>

#include "core/device.h"
#include "optim/multi_tensor.h"
#include "optim/optimizer.h"
#include "tensor/device_dispatch.h"
#include "tensor/tensor.h"

namespace frugal::optim::detail {

/// The single group of an optimizer made from a plain parameter list.
inline std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  return groups;
}

/// One parameter being stepped. The kernels need contiguous memory: `work` is the
/// parameter itself (detached) unless it is strided, in which case it is a contiguous
/// copy written back by finish(); `grad` is the gradient, made contiguous if needed.
struct StepTensors {
  Tensor param, work, grad;

  StepTensors(const Tensor& p, const Tensor& g)
      : param(p.detach()),
        work(param.is_contiguous() ? param : param.clone()),
        grad(g.is_contiguous() ? g.detach() : g.contiguous()) {}

  /// Writes a strided parameter back and bumps the version (the storage is shared with
  /// the caller's handle, so autograd sees the in-place change).
  void finish() const {
    if (work.shares_storage(param)) param.bump_version();
    else param.copy_(work);
  }
};

/// Entries grouped by (device, dtype): one CPU call or one fused launch per group.
template <typename Entry>
class Batches {
 public:
  void add(Device device, DType dtype, const Entry& e) {
    for (auto& b : batches_)
      if (b.device == device && b.dtype == dtype) return b.entries.push_back(e);
    batches_.push_back({device, dtype, {e}});
  }
  /// Calls cpu_fn(dtype, entries) or cuda_fn(device, dtype, entries) for each group. Pass
  /// cuda_fn as a generic lambda so that a CPU-only build never instantiates its body.
  template <typename CpuFn, typename CudaFn>
  void run(const char* op, CpuFn&& cpu_fn, CudaFn&& cuda_fn) {
    for (auto& b : batches_) {
      if (b.device.is_cpu()) {
        cpu_fn(b.dtype, b.entries);
      } else {
#ifdef FRUGAL_WITH_CUDA
        cuda_fn(b.device, b.dtype, b.entries);
#else
        (void)cuda_fn;
        throw_no_cuda(op, b.device);
#endif
      }
    }
  }

 private:
  struct Batch {
    Device device;
    DType dtype;
    std::vector<Entry> entries;
  };
  std::vector<Batch> batches_;
};

}  // namespace frugal::optim::detail
