#pragma once
// OffloadAdamW: AdamW whose state lives in host memory (ZeRO-Offload, Ren et al. 2021;
// DeepSpeed's DeepSpeedCPUAdam). The float32 master weights and both moments are in the
// pinned host pool (memory/pinned.h), so a GPU holds only the compute-dtype parameters and
// gradients: 16 bytes per parameter leave the device, which lets a model about four times
// larger than AdamW allows train on it. The update runs on the CPU (optim/cpu_adam.h) and
// overlaps the copies both ways; see Note [CPU offload] in optim/offload_adam.cpp.
//
//   optim::OffloadAdamW opt(model.parameters(), {.lr = 1e-4, .weight_decay = 0.01});
//   scaler.scale(loss).backward();   // gradients start for the host as backward makes them
//   scaler.step(opt);                // GradScaler, clip_grad_norm_ and LR schedulers work as with AdamW
//
// State per parameter (Note [Optimizer state dict]): step, exp_avg, exp_avg_sq (float32)
// and master_param, the float32 master weights - absent for a float32 parameter on the CPU,
// which is its own master. A CPU-only build is the same optimizer with host = device: a
// multi-threaded CPU AdamW that keeps float32 masters for 16-bit parameters.
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "optim/optimizer.h"

namespace frugal::optim {

struct OffloadAdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p *= 1 - lr * weight_decay
  bool maximize = false;
  /// Elements per pipeline chunk: the host updates one chunk while the last one uploads.
  int64_t chunk_elements = int64_t(1) << 20;
  /// Start each CUDA gradient's copy to the host as soon as backward has accumulated it
  /// (a post-accumulate-grad hook), so the copies overlap the rest of backward.
  bool copy_grads_in_backward = true;
  /// Also drop each CUDA gradient from its parameter once its copy is queued (ZeRO-Offload's
  /// gradient offload): the device then holds the compute-dtype weights and only the
  /// gradients still in flight, 2 bytes per parameter in float16 instead of 4. The optimizer
  /// keeps the gradients in host memory until step() (or zero_grad()); a second backward
  /// before step() adds into them on the host. What reads .grad after backward does not see
  /// them: GradScaler.step unscales them inside the step (GradScaler.unscale_ throws), and
  /// clip_grad_norm_ has nothing to clip, so keep this off to clip gradients.
  bool release_device_grads = false;
};

/// AdamW (Note [Adam update], decoupled weight decay, no amsgrad) with float32 master
/// weights and moments in pinned host memory. Parameters: float32, float16 or bfloat16,
/// contiguous, on the CPU or a CUDA device.
class OffloadAdamW : public Optimizer {
 public:
  OffloadAdamW(std::vector<Tensor> params, OffloadAdamWOptions options = {});
  OffloadAdamW(std::vector<ParamGroup> groups, OffloadAdamWOptions options = {});
  ~OffloadAdamW() override;

  void step() override;
  /// Also drops the gradients held in host memory (release_device_grads).
  void zero_grad(bool set_to_none = true) override;
  /// GradScaler.step's path (Optimizer::steps_scaled_grads): gradients are checked for inf
  /// and NaN on the host, where they are, and unscaled inside the update, so the copies that
  /// backward started stay current.
  bool steps_scaled_grads() const override { return true; }
  ScaledStep step_scaled(float inv_scale) override;
  bool holds_released_grads() const override;
  const OffloadAdamWOptions& options() const { return options_; }

  /// Bytes of host memory the optimizer holds: master weights, moments and the staging
  /// buffers that carry gradients down and parameters up (CUDA parameters only).
  int64_t host_state_bytes() const;
  /// Bytes of device (non-CPU) memory the optimizer holds: 0, as the design intends.
  int64_t device_state_bytes() const;
  /// The float32 master weights of `param` (a host tensor), or `param` itself for a
  /// float32 CPU parameter; undefined before its first step.
  Tensor master_param(const Tensor& param) const;

 protected:
  std::vector<HyperParam> hyperparams() const override;
  double default_lr() const override { return options_.lr; }
  std::vector<const char*> state_names() const override { return {"exp_avg", "exp_avg_sq", "master_param"}; }
  bool counts_steps() const override { return true; }
  void check_group(const ParamGroup& group, size_t g) const override;
  void check_state(const ParamState& state, const Tensor& param, const std::string& prefix) const override;
  Tensor load_state_buffer(const Tensor& t, const Tensor& param) const override;
  /// A loaded master is checked against its parameter at the next step.
  void state_loaded() override { synced_.clear(); }

 private:
  /// Host-side transfer state of one CUDA parameter.
  struct Transfer;
  /// The parameter's Transfer, made on first use.
  Transfer& transfer_for(const Tensor& param);
  /// The parameter's Transfer once its gradient's copy has landed in the staging buffer
  /// (the host waits for it); CUDA builds only.
  Transfer& landed_transfer(const Tensor& param);
  /// Starts copying `param`'s gradient to its staging buffer unless the copy already
  /// started holds the gradient as it is now.
  void copy_grad_to_host(const Tensor& param);
  /// release_device_grads: copies `param`'s gradient to the host (adding it to a gradient
  /// held there already) and drops it from the parameter.
  void release_grad_to_host(const Tensor& param);
  /// One parameter's step: the parameter, its gradient where it is read from, its group.
  struct Item;
  /// Checks the gradients, starts every copy still missing, creates state on first use.
  std::vector<Item> prepare_step();
  /// The update of every item with gradients float(grad) * grad_scale.
  void update(const std::vector<Item>& items, float grad_scale);
  /// Forgets the gradients held in host memory (after a step, or a skipped one).
  void drop_released();
  /// Whether `param` is as the last update left it: same storage, same version (Note
  /// [Master weights follow the parameter] in optim/offload_adam.cpp).
  bool master_in_sync(const Tensor& param) const;

  OffloadAdamWOptions options_;
  mutable std::mutex transfers_mutex_;  // the hooks run on the backward thread
  std::unordered_map<const TensorImpl*, std::unique_ptr<Transfer>> transfers_;
  std::vector<std::pair<Tensor, uint64_t>> hooks_;  // (parameter, hook id)
  /// Each parameter's storage and version as its last update left them.
  struct Synced {
    std::weak_ptr<Storage> storage;
    uint64_t version = 0;
  };
  std::unordered_map<const TensorImpl*, Synced> synced_;
};

}  // namespace frugal::optim
