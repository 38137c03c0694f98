#pragma once
// Adam and AdamW, as torch.optim.Adam / torch.optim.AdamW (see Note [Adam update] in
// optim/update_math.h for the rule). On CUDA a step is one fused multi-tensor kernel per
// (device, dtype) (Note [Multi-tensor launch]); on the CPU, a loop per parameter.
// State per parameter: step, exp_avg, exp_avg_sq and, with amsgrad, max_exp_avg_sq
// (float32 for 16-bit parameters: Note [Optimizer state dtype]).
#include <unordered_map>
#include <vector>

#include "optim/optimizer.h"

namespace frugal::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2: added to the gradient
  bool amsgrad = false;
  bool maximize = false;
  bool capturable = false;  // CUDA graphs: Note [Capturable Adam]
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p *= 1 - lr * weight_decay
  bool amsgrad = false;
  bool maximize = false;
  bool capturable = false;  // CUDA graphs: Note [Capturable Adam]
};

/// Adam (Kingma & Ba) with L2 weight decay added to the gradient.
///
///   optim::Adam opt(model.parameters(), {.lr = 1e-3, .amsgrad = true});
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups, AdamOptions options = {});

  void step() override;
  /// With capturable (CUDA parameters): the kernels return when *found_inf != 0, and the
  /// step counts stay on the device; while a moment is still to be made, the flag is read
  /// on the host instead.
  bool skips_on_device_flag() const override { return options_.capturable; }
  void step_skipping_if(const Tensor& found_inf) override;
  const AdamOptions& options() const { return options_; }

 protected:
  /// For AdamW: the same optimizer with decoupled weight decay.
  Adam(const char* name, std::vector<ParamGroup> groups, AdamOptions options, bool decoupled);

  std::vector<HyperParam> hyperparams() const override;
  double default_lr() const override { return options_.lr; }
  std::vector<const char*> state_names() const override { return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; }
  bool counts_steps() const override { return true; }
  void check_group(const ParamGroup& group, size_t g) const override;
  void check_state(const ParamState& state, const Tensor& param, const std::string& prefix) const override;
  void refresh_state(const Tensor& param, ParamState& state) const override;
  void state_loaded() override { device_steps_.clear(); }

 private:
  /// step() with the CUDA kernels skipping themselves when *skip_if != 0 (null: never).
  void step_impl(const float* skip_if);
  /// Whether a parameter with a gradient still lacks its moments (or its device step count).
  bool needs_fresh_state() const;

  AdamOptions options_;
  bool decoupled_;
  // capturable: each CUDA parameter's step count, a 0-d int64 on its device, by parameter.
  std::unordered_map<const TensorImpl*, Tensor> device_steps_;
};

/// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, p *= 1 - lr * wd
/// before the Adam update. Same state and state dict as Adam.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
};

}  // namespace frugal::optim
