#pragma once
// Internal to optim/: what every optimizer's step() does around its update rule -
// contiguous handles for the kernels, entries grouped by (device, dtype), dispatch to
// the CPU loops or one fused CUDA launch per group, and the in-place bookkeeping.
#include <cmath>
#include <utility>
#include <vector>

#include "core/device.h"
#include "optim/multi_tensor.h"
#include "optim/optimizer.h"
#include "optim/update_math.h"
#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
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

/// Throws if an Adam-family group's resolved hyperparameters are invalid; names `opt`
/// and the group `g`.
inline void check_adam_group(const char* opt, const ParamGroup& group, size_t g) {
  FRUGAL_CHECK(group.lr >= 0, opt, ": param group ", g, ": invalid learning rate ", group.lr);
  FRUGAL_CHECK(*group.eps >= 0, opt, ": param group ", g, ": invalid eps ", *group.eps);
  FRUGAL_CHECK(*group.beta1 >= 0 && *group.beta1 < 1, opt, ": param group ", g, ": invalid beta1 ", *group.beta1,
               " (must be in [0, 1))");
  FRUGAL_CHECK(*group.beta2 >= 0 && *group.beta2 < 1, opt, ": param group ", g, ": invalid beta2 ", *group.beta2,
               " (must be in [0, 1))");
  FRUGAL_CHECK(*group.weight_decay >= 0, opt, ": param group ", g, ": invalid weight_decay ", *group.weight_decay);
}

/// One Adam step's entry for a tensor of `sizes` (Note [Adam update]): counts the step in
/// `st`, creates the moments buffers[0..1] (and, with amsgrad, buffers[2]) on first use
/// with `opts` (the kernel starts them at zero), and fills the scalars from `group`, with
/// `lr` and `weight_decay` given explicitly (GaLore runs Adam on its projected gradient
/// with lr 1 and no decay). `param` and `grad` hold `numel` contiguous elements.
inline AdamEntry adam_entry(const ParamGroup& group, ParamState& st, const Shape& sizes, TensorOptions opts, double lr,
                            double weight_decay, bool decoupled, void* param, const void* grad, int64_t numel) {
  const bool amsgrad = group.amsgrad.value_or(false), maximize = group.maximize.value_or(false);
  uint32_t flags = 0;
  if (!st.buffers[0].defined()) {
    st.buffers[0] = empty(sizes, opts);
    st.buffers[1] = empty(sizes, opts);
    flags |= kAdamFreshMoments;
  }
  if (amsgrad) {
    flags |= kAdamAmsgrad;
    if (!st.buffers[2].defined()) {
      st.buffers[2] = empty(sizes, opts);
      flags |= kAdamFreshMax;
    }
  }
  if (decoupled) flags |= kAdamDecoupled;
  if (maximize) flags |= kAdamMaximize;
  st.step += 1;
  AdamEntry e{.param = param,
              .grad = grad,
              .exp_avg = st.buffers[0].data(),
              .exp_avg_sq = st.buffers[1].data(),
              .max_exp_avg_sq = amsgrad ? st.buffers[2].data() : nullptr,
              .numel = numel,
              .chunk_begin = 0,
              .lr = lr,
              .beta1 = *group.beta1,
              .beta2 = *group.beta2,
              .eps = *group.eps,
              .weight_decay = weight_decay,
              .flags = flags};
  set_bias_corrections(e, st.step);
  return e;
}

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
        (void)op;  // named only in the CPU-only build's error
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
