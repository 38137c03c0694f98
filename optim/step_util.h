#pragma once
// Internal to optim/: what every optimizer's step() does around its update rule -
// dense handles in one memory order for the kernels, entries grouped by (device, dtype), dispatch to
// the CPU loops or one fused CUDA launch per group, and the in-place bookkeeping.
#include <cmath>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/graph_capture.h"
#include "optim/multi_tensor.h"
#include "optim/optimizer.h"
#include "optim/update_math.h"
#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/tensor.h"

namespace frugal::optim::detail {

/// The single group of an optimizer made from a plain parameter list.
inline std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  return groups;
}

// Note [Optimizer memory order]
// The update kernels walk a parameter, its gradient and its state flat, element i of each
// together, so the three need one memory order - any dense one, not only row-major:
// ResNet's channels-last convolution weights and their gradients are stepped where they
// lie, and their state buffers are made in the same order (PyTorch's zeros_like with
// preserve_format). Before this, each of those 53 weights was cloned, its gradient copied
// and the clone copied back every step (in GradScaler.unscale_ too): 0.6 of the 0.8 ms
// that ResNet-50 b128's AMP optimizer phase took on an H200, against 0.19 ms of update
// kernels. A parameter that is not dense (a strided view) is still stepped through a
// contiguous copy, and a gradient or state buffer in another order than its parameter's
// (a state dict loaded from elsewhere, a model moved to channels-last after steps) is
// put into that order.

/// One parameter being stepped (Note [Optimizer memory order]): `work` is the parameter
/// itself (detached) when it is dense, else a contiguous copy written back by finish();
/// `grad` is the gradient in work's memory order (itself when it already is).
struct StepTensors {
  Tensor param, work, grad;

  StepTensors(const Tensor& p, const Tensor& g)
      : param(p.detach()),
        work(is_dense(param) ? param : param.clone()),
        grad(same_dense_layout(g, work) ? g.detach() : copy_in_layout(g, work)) {}

  /// Writes a strided parameter back and bumps the version (the storage is shared with
  /// the caller's handle, so autograd sees the in-place change).
  void finish() const {
    if (work.shares_storage(param)) param.bump_version();
    else param.copy_(work);
  }
};

// Note [Finite hyperparameters]
// PyTorch checks only the sign of lr, eps, momentum and weight_decay (`0.0 <= lr`), so an
// inf passes and the first step turns every parameter into inf or NaN, far from the line that
// set it. frugal refuses a NaN or an infinity where the optimizer is built (and where a param
// group is added), as it refuses a negative value: these must be finite. The eps of the norms
// and batch norm's momentum are checked the same way (tensor/ops/norm.cpp, batch_norm.cpp).

/// Throws if an Adam-family group's resolved hyperparameters are invalid; names `opt`
/// and the group `g` (Note [Finite hyperparameters]).
inline void check_adam_group(const char* opt, const ParamGroup& group, size_t g) {
  FRUGAL_CHECK(group.lr >= 0 && std::isfinite(group.lr), opt, ": param group ", g, ": invalid learning rate ", group.lr);
  FRUGAL_CHECK(*group.eps >= 0 && std::isfinite(*group.eps), opt, ": param group ", g, ": invalid eps ", *group.eps);
  FRUGAL_CHECK(*group.beta1 >= 0 && *group.beta1 < 1, opt, ": param group ", g, ": invalid beta1 ", *group.beta1,
               " (must be in [0, 1))");
  FRUGAL_CHECK(*group.beta2 >= 0 && *group.beta2 < 1, opt, ": param group ", g, ": invalid beta2 ", *group.beta2,
               " (must be in [0, 1))");
  FRUGAL_CHECK(*group.weight_decay >= 0 && std::isfinite(*group.weight_decay), opt, ": param group ", g,
               ": invalid weight_decay ", *group.weight_decay);
}

/// Makes `buffer` a state buffer in like's memory order (Note [Optimizer memory order]) with
/// `opts`: an uninitialized one when it is undefined (then returns true), else itself, or a
/// copy in that order, dtype and device when it has another. The kernels read the buffer as
/// `opts` says, so a buffer left in its old dtype after Module::to converted the parameter
/// (float32 state for a parameter now float64) would be misread; it is converted instead,
/// as torch's Optimizer.load_state_dict casts state to its parameter's.
inline bool state_in_layout(Tensor& buffer, const Tensor& like, TensorOptions opts) {
  if (!buffer.defined()) {
    buffer = empty_in_layout(like, opts);
    return true;
  }
  if (!same_dense_layout(buffer, like) || buffer.dtype() != opts.dtype || buffer.device() != opts.device) {
    core::refuse_in_graph_capture("An optimizer state buffer put into its parameter's memory order, dtype or device",
                                  "each replay would copy the buffer as it was at capture (step once before)");
    buffer = copy_in_layout(buffer, like, opts);
  }
  return false;
}

/// One Adam step's entry for `like`, the tensor stepped (Note [Adam update]): counts the
/// step in `st`, creates the moments buffers[0..1] (and, with amsgrad, buffers[2]) on first
/// use with `opts` in like's memory order (the kernel starts them at zero), and fills the
/// scalars from `group`, with `lr` and `weight_decay` given explicitly (GaLore runs Adam on
/// its projected gradient with lr 1 and no decay). `param` and `grad` hold `numel` elements
/// in like's (dense) memory order.
inline AdamEntry adam_entry(const ParamGroup& group, ParamState& st, const Tensor& like, TensorOptions opts, double lr,
                            double weight_decay, bool decoupled, void* param, const void* grad, int64_t numel) {
  const bool amsgrad = group.amsgrad.value_or(false), maximize = group.maximize.value_or(false);
  uint32_t flags = 0;
  const bool fresh = state_in_layout(st.buffers[0], like, opts);
  state_in_layout(st.buffers[1], like, opts);
  if (fresh) flags |= kAdamFreshMoments;
  if (amsgrad) {
    flags |= kAdamAmsgrad;
    if (state_in_layout(st.buffers[2], like, opts)) flags |= kAdamFreshMax;
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
