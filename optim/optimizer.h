#pragma once
// The optimizer base: parameter groups, per-parameter state, zero_grad and the
// flat state dict, as torch.optim.Optimizer.
//
// Note [Optimizer state dict]
// state_dict() flattens everything a resumed run needs into string keys, so the
// nn layer can write it to safetensors next to the model weights:
//   param_groups.<g>.lr, .<hyperparameter>...  0-d float64 (flags as 0 or 1)
//   param_groups.<g>.initial_lr               0-d float64, once an LR scheduler set it
//   param_groups.<g>.params                   int64 [n]: the indices of the group's params
//   state.<i>.step                            0-d int64 (optimizers that count steps)
//   state.<i>.<buffer>                        the buffer itself (e.g. exp_avg)
// Parameters are numbered across groups in order (group 0's first param is 0), as in
// PyTorch; a parameter that has never been stepped has no state.* keys. The buffers
// are the live state (no copy: save them, or clone them, before the next step()).
// load_state_dict() checks the whole dict first (group and parameter counts, every
// key, shapes, dtypes) and changes nothing when it throws; then it replaces every
// group's hyperparameters (not its params) and all state with copies of the dict's,
// so training resumes bit-identically.
//
// Note [Optimizer state dtype]
// State buffers live on their parameter's device. They have the parameter's dtype for
// float32 and float64 parameters; for float16 and bfloat16 parameters they are float32
// (the moments of a 16-bit parameter lose too much in 16 bits), and the update is
// computed in float and rounded once into the parameter. Gradients must have their
// parameter's dtype.
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::optim {

/// A flat state dict: (key, tensor) pairs (see Note [Optimizer state dict]).
using StateDict = std::vector<std::pair<std::string, Tensor>>;

/// A group of parameters sharing hyperparameters. A field left unset takes the
/// optimizer's option; once the group is in an optimizer, every field that optimizer
/// uses is set (and the others must stay unset), so `*group.momentum` is the value used.
///
///   optim::AdamW opt({{.params = decay}, {.params = no_decay, .weight_decay = 0.0}}, {.lr = 3e-4});
struct ParamGroup {
  std::vector<Tensor> params;
  /// Unset: the group takes the optimizer's lr. A sentinel no one types: a mistyped negative
  /// lr must be refused (as PyTorch does), not read as "unset".
  static constexpr double kOptimizerLr = -std::numeric_limits<double>::infinity();
  /// Learning rate; kOptimizerLr (the default) means the optimizer's lr. LR schedulers write it.
  double lr = kOptimizerLr;
  // SGD
  std::optional<double> momentum{};
  std::optional<double> dampening{};
  // SGD, Adam, AdamW
  std::optional<double> weight_decay{};
  std::optional<bool> nesterov{};  // SGD only
  std::optional<bool> maximize{};
  // Adam, AdamW
  std::optional<double> beta1{};
  std::optional<double> beta2{};
  std::optional<double> eps{};
  std::optional<bool> amsgrad{};
  /// The lr schedules start from (PyTorch's 'initial_lr'): set by the first LR scheduler
  /// made on the optimizer, so later ones start from the same value.
  std::optional<double> initial_lr{};
};

/// Per-parameter state: the step count and up to three buffers that the optimizer names
/// (state_names()); a buffer is undefined until the optimizer creates it.
struct ParamState {
  int64_t step = 0;
  std::array<Tensor, 3> buffers;
};

/// Base of every optimizer. Not copyable or movable (LR schedulers hold a reference).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient (the others are skipped), in
  /// place (bumping versions), with grad mode off.
  virtual void step() = 0;

  /// Drops every gradient (set_to_none) or zeroes it in place. set_to_none is the default, as
  /// in PyTorch 2 (1.13's default was false): a parameter that then gets no gradient in a step
  /// is skipped by step(), where a zeroed one would still take momentum and weight decay.
  virtual void zero_grad(bool set_to_none = true);

  /// What step_scaled did (see there).
  enum class ScaledStep { Stepped, SkippedNonFinite, NoGradients };
  /// Whether this optimizer checks and unscales loss-scaled gradients itself, in its step
  /// (PyTorch's _step_supports_amp_scaling): GradScaler.step then calls step_scaled
  /// instead of unscale_ + step. OffloadAdamW does: an in-place unscale of device gradients
  /// would make its in-flight host copies stale, and released gradients are not on the device.
  virtual bool steps_scaled_grads() const { return false; }
  /// One step on gradients * inv_scale unless a gradient is inf or NaN; then weights and
  /// state stay as they were (gradients held on the device stay, scaled; gradients the
  /// optimizer holds elsewhere are dropped). Only for optimizers whose
  /// steps_scaled_grads() is true; the base throws.
  virtual ScaledStep step_scaled(float inv_scale);
  /// True while the optimizer holds gradients it took off the parameters (OffloadAdamW with
  /// release_device_grads): code that reads .grad - GradScaler.unscale_, clip_grad_norm_ -
  /// does not see them.
  virtual bool holds_released_grads() const { return false; }
  /// Whether step_skipping_if may run inside a CUDA graph capture: its step reads a device
  /// flag and skips itself on the device (Note [GradScaler in a CUDA graph]).
  virtual bool skips_on_device_flag() const { return false; }
  /// step(), skipped on the device, weights and state untouched, when `found_inf` (a 0-d
  /// float32 on the parameters' device) is nonzero: no host sync. Only for optimizers whose
  /// skips_on_device_flag() is true; the base throws.
  virtual void step_skipping_if(const Tensor& found_inf);

  /// The groups; mutable so LR schedulers (and users) can change hyperparameters.
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  /// Adds a group (unset fields take the optimizer's options). Throws if it is empty,
  /// shares a parameter with another group, holds a non-floating or non-leaf tensor, or
  /// has an invalid hyperparameter.
  void add_param_group(ParamGroup group);

  /// See Note [Optimizer state dict].
  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);

  /// The state of a parameter, or nullptr before its first step.
  const ParamState* state(const Tensor& param) const;

  /// Bytes held by the per-parameter state buffers (moments, momentum buffers, GaLore's
  /// projections), summed over every parameter stepped so far; step counts not included.
  int64_t state_bytes() const;

  /// "SGD", "Adam", "AdamW", "GaLoreAdamW".
  const char* name() const { return name_; }

 protected:
  explicit Optimizer(const char* name) : name_(name) {}

  /// A hyperparameter of a group: its state-dict name, the field that holds it (exactly
  /// one of real/flag) and the optimizer's option, used when the group leaves it unset.
  struct HyperParam {
    // Aliases, not `T ParamGroup::*real` in place: nvcc's rewrite of that declaration makes
    // GCC warn about parentheses in every CUDA file that includes this header.
    using RealField = std::optional<double> ParamGroup::*;
    using FlagField = std::optional<bool> ParamGroup::*;
    const char* name;
    RealField real = nullptr;
    FlagField flag = nullptr;
    double option = 0.0;
  };
  /// Inside a CUDA graph capture (core/graph_capture.h), registers a check run before every
  /// replay: that each group's lr and hyperparameters are still those this step froze into
  /// the graph's kernels (a replay would otherwise go on with the old values unseen).
  void freeze_hyperparams_for_replay() const;
  /// step_skipping_if's common part: checks found_inf and the parameters' devices, then runs
  /// step(skip_if) with found_inf's pointer - or, while `makes_state` (a first step that makes
  /// state a skipped kernel would leave unset; refused inside a capture anyway), reads the
  /// flag on the host as GradScaler's eager step does and runs step(nullptr) unless it is set.
  void step_on_device_flag(const Tensor& found_inf, bool makes_state, const std::function<void(const float*)>& step);

  /// The hyperparameters this optimizer reads, besides lr.
  virtual std::vector<HyperParam> hyperparams() const = 0;
  /// The optimizer's lr option.
  virtual double default_lr() const = 0;
  /// Names of ParamState::buffers (at most three), e.g. {"exp_avg", "exp_avg_sq", ...}.
  virtual std::vector<const char*> state_names() const = 0;
  /// True when ParamState::step is meaningful (and saved).
  virtual bool counts_steps() const = 0;
  /// Throws if a group's (resolved) hyperparameter values are invalid; `g` indexes the group.
  virtual void check_group(const ParamGroup& group, size_t g) const = 0;
  /// Throws if a loaded state is inconsistent (e.g. a missing buffer) for `param`; `prefix`
  /// is "state.<i>.".
  virtual void check_state(const ParamState& /*state*/, const Tensor& /*param*/, const std::string& /*prefix*/) const {}
  /// Brings `state` (of `param`) up to date before state() or state_dict() hand it out: a
  /// capturable Adam's step counts live on the device (Note [Capturable Adam]).
  virtual void refresh_state(const Tensor& /*param*/, ParamState& /*state*/) const {}
  /// Called after load_state_dict has replaced the state.
  virtual void state_loaded() {}
  /// Whether a loaded buffer `b` of shape `sizes` may belong to `param`: by default it has
  /// the parameter's shape (GaLore's low-rank state does not; its check_state checks it).
  virtual bool state_shape_ok(size_t /*b*/, const Shape& sizes, const Tensor& param) const {
    return sizes == param.sizes();
  }

  /// A loaded state buffer `t` (already checked against `param`) as the optimizer keeps it:
  /// by default a fresh copy on the parameter's device in state_dtype (Note [Optimizer state
  /// dtype]), in the parameter's memory order when it has its shape (Note [Optimizer memory
  /// order] in optim/step_util.h), else contiguous. OffloadAdamW keeps its state in pinned host memory instead.
  virtual Tensor load_state_buffer(const Tensor& t, const Tensor& param) const;

  /// The state of `param` as stored (not refreshed), or nullptr before its first step.
  const ParamState* stored_state(const Tensor& param) const {
    auto it = state_.find(param.impl_ptr().get());
    return it == state_.end() ? nullptr : &it->second;
  }
  /// The state of `param`, created (step 0, no buffers) on first use.
  ParamState& state_for(const Tensor& param) { return state_[param.impl_ptr().get()]; }

  /// The dtype of state buffers for a parameter of dtype `t` (Note [Optimizer state dtype]).
  static DType state_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

  /// The gradient of `param` (index `i` across groups, for messages) checked against it,
  /// or an undefined tensor when it has none.
  Tensor checked_grad(const Tensor& param, size_t i) const;

  /// checked_grad of every parameter, in param_groups() order: a step takes these before
  /// any state changes, so a bad gradient leaves the optimizer as it was.
  std::vector<Tensor> checked_grads() const;

 private:
  /// A state dict's keys below one "param_groups.<g>." or "state.<i>." prefix, by the rest.
  using KeysByName = std::map<std::string, const Tensor*>;
  /// The phases of load_state_dict; each checks what it reads and changes nothing.
  /// Group `g` from its keys (consumed), its parameters numbered from `first`.
  ParamGroup load_group(size_t g, KeysByName keys, size_t first) const;
  /// The state of parameter `i` (`param`) from its keys.
  ParamState load_param_state(size_t i, const KeysByName& keys, const Tensor& param) const;

  const char* name_;
  std::vector<ParamGroup> groups_;
  // Expires with the optimizer: a graph replay check outliving it then does nothing.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
  // mutable: state() refreshes what the device holds newer (refresh_state).
  mutable std::unordered_map<const TensorImpl*, ParamState> state_;
  int64_t state_generation_ = 0;  // load_state_dict's count: a graph captured before refuses to replay
};

}  // namespace frugal::optim
