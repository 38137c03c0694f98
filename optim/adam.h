#pragma once
// Adam and AdamW, as torch.optim.Adam / torch.optim.AdamW (see Note [Adam update] in
// optim/update_math.h for the rule). On CUDA a step is one fused multi-tensor kernel per
// (device, dtype) (Note [Multi-tensor launch]); on the CPU, a loop per parameter.
// State per parameter: step, exp_avg, exp_avg_sq and, with amsgrad, max_exp_avg_sq
// (float32 for 16-bit parameters: Note [Optimizer state dtype]).
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
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p *= 1 - lr * weight_decay
  bool amsgrad = false;
  bool maximize = false;
};

/// Adam (Kingma & Ba) with L2 weight decay added to the gradient.
///
///   optim::Adam opt(model.parameters(), {.lr = 1e-3, .amsgrad = true});
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups, AdamOptions options = {});

  void step() override;
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

 private:
  AdamOptions options_;
  bool decoupled_;
};

/// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, p *= 1 - lr * wd
/// before the Adam update. Same state and state dict as Adam.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
};

}  // namespace frugal::optim
