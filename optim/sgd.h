#pragma once
// Stochastic gradient descent with momentum, dampening, Nesterov momentum, weight
// decay and maximize, as torch.optim.SGD. On CUDA a step is one fused multi-tensor
// kernel per (device, dtype) (Note [Multi-tensor launch]). State per parameter (with
// momentum only): momentum_buffer, set to the first step's gradient (PyTorch's rule),
// float32 for 16-bit parameters (Note [Optimizer state dtype]).
#include <vector>

#include "optim/optimizer.h"

namespace frugal::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
  bool maximize = false;
};

///   optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9, .nesterov = true});
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGD(std::vector<ParamGroup> groups, SGDOptions options);

  void step() override;
  /// The fused kernel itself returns when *found_inf != 0 (CUDA parameters only); while a
  /// momentum buffer is still to be made, the flag is read on the host instead.
  bool skips_on_device_flag() const override { return true; }
  void step_skipping_if(const Tensor& found_inf) override;
  const SGDOptions& options() const { return options_; }

 protected:
  std::vector<HyperParam> hyperparams() const override;
  double default_lr() const override { return options_.lr; }
  std::vector<const char*> state_names() const override { return {"momentum_buffer"}; }
  bool counts_steps() const override { return false; }
  void check_group(const ParamGroup& group, size_t g) const override;

 private:
  /// step() with the CUDA kernels skipping themselves when *skip_if != 0 (null: never).
  void step_impl(const float* skip_if);
  /// Whether a parameter with a gradient still lacks its momentum buffer.
  bool needs_fresh_buffer() const;

  SGDOptions options_;
};

}  // namespace frugal::optim
