#pragma once
// Module: the base of every layer and model, named as LibTorch's nn::Module.
//
// Note [Module names]
// A module registers its parameters, buffers and submodules by name, in order.
// named_parameters() joins names with dots, so a BERT built from frugal modules
// yields "encoder.layer.0.attention.self.query.weight": the keys of the
// Hugging Face / torchvision checkpoints, which is what lets state_dict() and
// load_state_dict() exchange weights with PyTorch through safetensors.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/instrument.h"
#include "tensor/tensor.h"

namespace frugal::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The class name shown in printouts ("Linear"); by default the class's own name,
  /// demangled and without namespaces.
  virtual std::string type_name() const;
  /// Layer settings shown in printouts ("in_features=784, out_features=10").
  virtual std::string extra_repr() const { return ""; }

  // ---- contents, in registration order, keys dotted (Note [Module names]) ----
  /// A tensor registered under several names is listed once, under the first (Note [Shared
  /// parameters] in nn/module.cpp); state_dict() lists every name.
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  std::vector<std::shared_ptr<Module>> children() const;
  /// Every module below this one (not itself), with dotted names, depth first. A module
  /// reachable by two paths (a shared submodule) is listed under each, where PyTorch's
  /// named_modules() lists it once: a loop over it that initializes or replaces modules
  /// meets a shared one twice (compress() and FullyShardedDataParallel refuse shared layers).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;
  /// The module at a dotted path below this one ("encoder.layer.3"; "" is this module), as
  /// torch's get_submodule; a path that names no submodule throws, naming the missing part.
  Module& get_submodule(const std::string& path);
  /// Calls fn on every submodule, children before their parents, then on this module, as
  /// torch's Module.apply (`model.apply(init_weights)`); a child registered twice in one module
  /// is visited once there.
  void apply(const std::function<void(Module&)>& fn);
  /// Total number of parameter elements.
  int64_t num_parameters() const;
  /// Puts `module` in place of the direct child `name` (same name, same place) and returns
  /// the old child. A module that also keeps the child in a typed member re-points it in
  /// on_replace_module (as LibTorch's replace_module needs `this->fc = ...`).
  std::shared_ptr<Module> replace_module(const std::string& name, std::shared_ptr<Module> module);

  // ---- modes and placement -----------------------------------------------------
  /// Training mode for this module and all below (dropout, batch norm statistics).
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Moves/converts every parameter and buffer in place: handles held elsewhere
  /// (an optimizer's) see the new data. Conversions apply to floating tensors only.
  void to(Device device);
  void to(DType dtype);
  void to(Device device, DType dtype);
  /// Sets requires_grad on every parameter (freezes them with false), as torch's
  /// Module.requires_grad_; buffers are left alone.
  void requires_grad_(bool on = true);
  /// Clears every parameter's .grad (set_to_none, the default as in PyTorch 2) or fills it
  /// with zeros.
  void zero_grad(bool set_to_none = true);

  // ---- checkpoints ------------------------------------------------------------------
  /// Parameters and persistent buffers by dotted name (the tensors themselves, not copies), in
  /// torch's order: each module's parameters, then its buffers, then its children's (Note [State
  /// dict order] in nn/module.cpp).
  NamedTensors state_dict() const;
  /// What a load_state_dict left out, as PyTorch's _IncompatibleKeys: both empty after a
  /// strict load, which throws instead.
  struct LoadResult {
    std::vector<std::string> missing_keys;     // the model's keys the state lacks (left as they were)
    std::vector<std::string> unexpected_keys;  // the state's keys the model lacks (ignored)
  };
  /// Copies values in, converting dtypes as a cast does. strict: every key must match both
  /// ways; any problem throws one frugal::Error listing missing, unexpected and mismatched
  /// keys. Not strict: returns the keys left out. Shapes must match either way, and a
  /// tensor registered under several names (Note [Shared parameters]) must be given equal
  /// values under each name that the state holds (Note [Loading shared tensors]).
  LoadResult load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  /// The same from a state_dict() (`b.load_state_dict(a.state_dict())`); a key given twice
  /// is an error.
  LoadResult load_state_dict(const NamedTensors& state, bool strict = true);

  /// PyTorch-style tree printout, laid out as torch's Module.__repr__ (Note [Module printout] in
  /// nn/module.cpp); every line after the first is shifted right by `indent` spaces.
  std::string repr(int indent = 0) const;

 protected:
  /// Registers a parameter (made a leaf that requires grad) and returns it. A leaf that has
  /// been part of autograd (another module's parameter, frozen or not) is registered itself,
  /// keeping its requires_grad: tied weights share one tensor, .grad, optimizer state and
  /// frozen flag. Tie through registration: assigning a typed member (lin->weight =
  /// emb->weight) changes what forward reads but not what parameters() and state_dict()
  /// list, as in LibTorch. An
  /// undefined value reserves the name, as torch's register_parameter(name, None) (Note
  /// [Undefined buffers] in nn/module.cpp).
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  /// An undefined value reserves the name and lists nothing, as torch's register_buffer(name,
  /// None) (Note [Undefined buffers] in nn/module.cpp). A buffer that is not persistent is
  /// moved and converted with the module but left out of state_dict()
  /// (Note [Non-persistent buffers] in nn/module.cpp).
  Tensor register_buffer(const std::string& name, Tensor value, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  /// Called by replace_module once `name` is registered as `module`: override to re-point a
  /// typed member; throw if `module` does not fit (the old child is then put back).
  virtual void on_replace_module(const std::string& name, const std::shared_ptr<Module>& module);

  bool training_ = true;

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  NamedTensors collect(const std::string& prefix, bool recurse, NamedTensors Module::*own) const;
  NamedTensors own_persistent_buffers() const;

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::string> non_persistent_;  // names in buffers_ left out of state_dict()
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

/// A module with one input and one output: what Sequential chains.
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  /// Runs forward under this module's name for the memory profiler (a thread-local pointer
  /// write); frugal's modules open it in forward too (Note [Module attribution] in module.cpp).
  /// Runs the forward hooks, if any, around it (Note [Forward hooks] in module.cpp).
  Tensor operator()(const Tensor& x) {
    core::ModuleScope scope(this);
    if (forward_hooks_.empty()) return forward(x);
    return forward_with_hooks(x);
  }

  /// As PyTorch's register_forward_pre_hook and register_forward_hook together: `before`
  /// runs ahead of forward, `after` gets forward's output and returns the output the caller
  /// sees (itself, or a tensor standing for it). Only m(x) runs them, not m.forward(x).
  struct ForwardHooks {
    std::function<void(UnaryModule&)> before;
    std::function<Tensor(UnaryModule&, Tensor output)> after;
  };
  /// Returns an id for remove_forward_hooks. Hooks run in registration order (`after` too).
  uint64_t add_forward_hooks(ForwardHooks hooks);
  /// Removes the hooks registered under `id` (no-op when gone).
  void remove_forward_hooks(uint64_t id);

 private:
  Tensor forward_with_hooks(const Tensor& x);
  std::vector<std::pair<uint64_t, ForwardHooks>> forward_hooks_;
  uint64_t next_hook_id_ = 1;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

/// Whether a and b have one shape and the same values, compared as float64 with NaN equal to
/// NaN (any dtypes and devices): what a tensor stored under two names must hold (Note
/// [Loading shared tensors] in nn/module.cpp).
bool same_values(const Tensor& a, const Tensor& b);

}  // namespace frugal::nn
