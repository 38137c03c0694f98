#include "nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>
#include <typeinfo>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/meta.h"  // meta_of: Note [Shared parameters]
#include "core/instrument.h"
#include "memory/trace.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"

// Note [Module attribution]
// The memory profiler charges an allocation to the module whose forward is running on the
// thread: core::ModuleScope, a thread-local pointer (Note [Zero-cost attribution]). A
// user may call a module as m(x) or as m.forward(x) (README's Writing a model does the
// latter), and the profile must not depend on which: so every forward of frugal's own
// modules opens ModuleScope(this) as its first line, and UnaryModule::operator() opens it
// as well, for user modules whose forward does not. Through m(x) the scope then opens
// twice for the same module, which nests to the same answer. The multi-input forwards
// (attention, BERT) open it the same way.
//
// Note [Forward hooks]
// A UnaryModule called as m(x) runs its forward hooks around forward: what fully sharded data
// parallel needs to gather a unit's parameters just before the unit runs and free them right
// after (Note [ZeRO-3] in parallel/fsdp.cpp), as PyTorch's fully_shard registers module
// hooks. Sequential runs its modules through m(x), and so does checkpoint_sequential, so a
// checkpoint's recompute runs the hooks again. Without hooks m(x) costs one empty() test; a
// hook list is copied before it runs, so a hook may remove hooks. An exception from forward
// skips the `after` hooks.

namespace frugal::nn {

void Module::check_new_name(const std::string& name) const {
  FRUGAL_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(), ": invalid name '", name,
               "' (non-empty, no dots)");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& kv) { return kv.first == name; });
  };
  FRUGAL_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name(), ": name '", name,
               "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name);
  if (!value.defined()) {  // torch's register_parameter(name, None): Note [Undefined buffers]
    params_.emplace_back(name, value);
    return value;
  }
  // A parameter is always a leaf. A leaf that has been part of autograd (another module's
  // parameter: tied weights, frozen or not) is registered itself, not a detached alias, and
  // keeps its requires_grad, so the two names share one tensor, one .grad, one optimizer state
  // and one frozen flag (Note [Shared parameters]); a fresh tensor is made to require grad.
  if (value.is_leaf() && autograd::meta_of(value)) {
    FRUGAL_CHECK(requires_grad || !value.requires_grad(), type_name(), ".register_parameter: '", name,
                 "' is a tensor that already requires grad (another parameter: a tied weight) and requires_grad "
                 "= false was asked; freeze the shared tensor with requires_grad_(false) instead");
  } else {
    value = value.detach();
    if (requires_grad) value.requires_grad_();
  }
  // Made before it was a parameter (by init, a factory, a load): it is one from now on.
  memory::relabel(value.device(), value.impl().storage->data.get(), core::Category::Parameters);
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value, bool persistent) {
  check_new_name(name);
  if (value.defined()) memory::relabel(value.device(), value.impl().storage->data.get(), core::Category::Parameters);
  buffers_.emplace_back(name, value);
  if (!persistent) non_persistent_.push_back(name);
  return value;
}

// Note [Non-persistent buffers]
// register_buffer(name, t, /*persistent=*/false) is torch's: a tensor that belongs to the module
// (to() moves and converts it, named_buffers() lists it) but is derived, not learned or
// tracked, so a checkpoint need not hold it: a rotary embedding's cos/sin table, a causal
// mask, position ids. state_dict() leaves it out, so load_state_dict neither expects it nor
// accepts it (a state holding its key reports the key unexpected, as torch's does).
NamedTensors Module::own_persistent_buffers() const {
  NamedTensors out = collect("", false, &Module::buffers_);
  std::erase_if(out, [&](const auto& kv) {
    return std::find(non_persistent_.begin(), non_persistent_.end(), kv.first) != non_persistent_.end();
  });
  return out;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  FRUGAL_CHECK(module != nullptr, type_name(), ": submodule '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

// Note [Undefined buffers]
// register_buffer takes an undefined tensor, as torch's register_buffer(name, None): the name
// is reserved and the buffer is absent from everything that lists tensors. register_parameter
// does the same with an undefined value (torch's register_parameter(name, None), what a layer
// without bias registers), for a parameter the state dict has no entry for. torch's
// _named_members skips None and _save_to_state_dict saves no None buffer, so named_buffers(),
// state_dict() and to() pass it by, and load_state_dict reports a state's key for it as
// unexpected (torch's local_state holds no None either). Listing it would put an undefined
// tensor in front of every loop over a module's tensors (save_safetensors, load_state_dict of
// the model's own state_dict() threw "use of an undefined tensor").

// Own entries first, then each child's under "<child>.", depth first; undefined entries left
// out (Note [Undefined buffers]).
NamedTensors Module::collect(const std::string& prefix, bool recurse, NamedTensors Module::*own) const {
  NamedTensors out;
  for (const auto& [name, t] : this->*own)
    if (t.defined()) out.emplace_back(prefix + name, t);
  if (recurse)
    for (const auto& [name, child] : children_) {
      NamedTensors sub = child->collect(prefix + name + ".", true, own);
      out.insert(out.end(), sub.begin(), sub.end());
    }
  return out;
}

// Note [Shared parameters]
// A tensor may be registered under several names: a decoder weight tied to the embedding
// (register_parameter("weight", emb->weight)), or a submodule registered twice. As torch's
// named_parameters() (remove_duplicate=True), named_parameters() and named_buffers() list it
// once, under its first name, so parameters() steps it once in an optimizer, counts it once
// in num_parameters() and clip_grad_norm_, and it gets one .grad, the sum of every use.
// state_dict() keeps every name (torch does too); load_state_dict writes the one tensor once
// per name.
namespace {
NamedTensors without_repeats(NamedTensors list) {
  std::set<const TensorImpl*> seen;
  std::erase_if(list, [&](const auto& kv) { return kv.second.defined() && !seen.insert(&kv.second.impl()).second; });
  return list;
}
}  // namespace

NamedTensors Module::named_parameters(bool recurse) const {
  return without_repeats(collect("", recurse, &Module::params_));
}
NamedTensors Module::named_buffers(bool recurse) const {
  return without_repeats(collect("", recurse, &Module::buffers_));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& kv : named_parameters(recurse)) out.push_back(kv.second);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& kv : named_buffers(recurse)) out.push_back(kv.second);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& kv : children_) out.push_back(kv.second);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [name, child] : children_) {
    out.emplace_back(name, child);
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(name + "." + sub, m);
  }
  return out;
}

std::shared_ptr<Module> Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  FRUGAL_CHECK(module != nullptr, type_name(), ": replace_module('", name, "') with a null module");
  auto it = std::find_if(children_.begin(), children_.end(), [&](const auto& kv) { return kv.first == name; });
  FRUGAL_CHECK(it != children_.end(), type_name(), ": replace_module: no submodule named '", name, "'");
  std::shared_ptr<Module> old = std::exchange(it->second, module);
  try {
    on_replace_module(name, it->second);
  } catch (...) {
    it->second = old;
    throw;
  }
  return old;
}

Module& Module::get_submodule(const std::string& path) {
  Module* m = this;
  std::string walked;
  size_t start = 0;
  while (!path.empty() && start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string part = path.substr(start, dot - start);
    auto it = std::find_if(m->children_.begin(), m->children_.end(), [&](const auto& kv) { return kv.first == part; });
    FRUGAL_CHECK(it != m->children_.end(), "get_submodule('", path, "'): ", m->type_name(),
                 walked.empty() ? "" : " at '" + walked + "'", " has no submodule '", part, "'");
    m = it->second.get();
    walked += (walked.empty() ? "" : ".") + part;
    start = dot + 1;
  }
  return *m;
}

// torch's apply recurses through children(), which yields a child registered under two names
// of one module once; a child shared between two parents is visited from each.
void Module::apply(const std::function<void(Module&)>& fn) {
  std::set<const Module*> seen;
  for (const auto& [name, child] : children_)
    if (seen.insert(child.get()).second) child->apply(fn);
  fn(*this);
}

void Module::on_replace_module(const std::string&, const std::shared_ptr<Module>&) {}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& kv : children_) kv.second->train(on);
}

namespace {
// Replaces t's data in place (same TensorImpl), so every handle to t sees it.
void convert_in_place(const Tensor& t, Device device, DType dtype) {
  if (!t.defined() || (t.device() == device && t.dtype() == dtype)) return;
  Tensor moved;
  {
    autograd::NoGradGuard no_grad;
    moved = t.detach().to(device, dtype);
  }
  TensorImpl& impl = t.impl();
  impl.storage = moved.impl().storage;
  impl.offset = moved.impl().offset;
  impl.sizes = moved.impl().sizes;
  impl.strides = moved.impl().strides;
  impl.dtype = moved.impl().dtype;
}

// Missing device or dtype: each tensor keeps its own. Only floating tensors change dtype.
void convert_all(Module& m, std::optional<Device> device, std::optional<DType> dtype) {
  auto convert = [&](const Tensor& t, DType own, core::Category category) {
    core::CategoryScope scope(category);  // for the memory profiler
    convert_in_place(t, device.value_or(t.device()), dtype && is_floating(own) ? *dtype : own);
  };
  for (auto& [name, p] : m.named_parameters()) {
    const DType own = p.dtype();
    convert(p, own, core::Category::Parameters);
    if (p.grad().defined()) convert(p.grad(), own, core::Category::Gradients);
  }
  for (auto& [name, b] : m.named_buffers()) convert(b, b.dtype(), core::Category::Parameters);
}
}  // namespace

void Module::to(Device device) { convert_all(*this, device, std::nullopt); }
void Module::to(DType dtype) { convert_all(*this, std::nullopt, dtype); }
void Module::to(Device device, DType dtype) { convert_all(*this, device, dtype); }

void Module::requires_grad_(bool on) {
  for (const Tensor& p : parameters()) p.requires_grad_(on);
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else ops::zero_(p.grad());
  }
}

// Note [State dict order]
// state_dict() lists keys in torch's order: Module.state_dict calls _save_to_state_dict (the
// module's own parameters, then its own buffers) and only then recurses into each child in
// registration order. So a BatchNorm's running_mean follows its bias, before the next layer's
// weight, and a module's own buffer comes before its children's parameters; named_parameters()
// and named_buffers() list the two kinds apart, as torch's do. Every name is kept (Note
// [Shared parameters]) but non-persistent buffers' (Note [Non-persistent buffers]), and
// missing keys of load_state_dict follow this order too.
NamedTensors Module::state_dict() const {
  NamedTensors out = collect("", false, &Module::params_);
  NamedTensors bufs = own_persistent_buffers();
  out.insert(out.end(), bufs.begin(), bufs.end());
  for (const auto& [name, child] : children_)
    for (auto& [key, t] : child->state_dict()) out.emplace_back(name + "." + key, std::move(t));
  return out;
}

std::string Module::type_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  if (const size_t colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  return name;
}

Module::LoadResult Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, t] : state)
    FRUGAL_CHECK(by_name.emplace(name, t).second, "load_state_dict: key '", name, "' is given twice");
  return load_state_dict(by_name, strict);
}

// Note [Loading shared tensors]
// A tensor registered under several names (Note [Shared parameters]: BERT's decoder weight
// and word embeddings) is written once per name that the state holds, so with two different
// values under its names the last write would win, silently, and which one is last depends
// on registration order. load_state_dict refuses that instead, naming both keys: a state that
// was saved from a model with the tie holds equal values, and one that holds different values
// is not a checkpoint of this model. Equal means equal as float64 values, NaN equal to NaN
// (a tensor saved twice may be stored in two dtypes).
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  const std::vector<double> x = a.to(kCPU, kFloat64).contiguous().tolist<double>();
  const std::vector<double> y = b.to(kCPU, kFloat64).contiguous().tolist<double>();
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
  return true;
}

// A floating value loaded into an integer buffer (BatchNorm's num_batches_tracked) converts as a
// cast does, and a cast of NaN, of 2.5 or of 1e30 to int64 stores a number the checkpoint never
// held: load_state_dict refuses those instead.
namespace {
bool fits_integer_buffer(const Tensor& value, const Tensor& target) {
  if (!is_floating(value.dtype()) || is_floating(target.dtype()) || target.dtype() == kBool) return true;
  const double lo = target.dtype() == kInt64 ? -0x1p63 : target.dtype() == kInt32 ? -0x1p31 : 0.0;
  const double hi = target.dtype() == kInt64 ? 0x1p63 : target.dtype() == kInt32 ? 0x1p31 : 256.0;
  for (double v : value.to(kCPU, kFloat64).contiguous().tolist<double>())
    if (!(std::isfinite(v) && v == std::trunc(v) && v >= lo && v < hi)) return false;
  return true;
}
}  // namespace

Module::LoadResult Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  std::vector<std::string> missing, unexpected, mismatched, conflicting;
  const NamedTensors mine = state_dict();
  std::map<std::string, Tensor> by_name(mine.begin(), mine.end());
  for (const auto& [name, t] : mine) {
    auto it = state.find(name);
    if (it == state.end()) missing.push_back(name);
    else if (!it->second.defined())
      mismatched.push_back(name + " (checkpoint undefined, model " + shape_str(t.sizes()) + ")");
    else if (it->second.sizes() != t.sizes())
      mismatched.push_back(name + " (checkpoint " + shape_str(it->second.sizes()) + ", model " + shape_str(t.sizes()) +
                           ")");
    else if (!fits_integer_buffer(it->second, t))
      mismatched.push_back(name + " (checkpoint holds a value that is not an integer " + dtype_name(t.dtype()) +
                           " can store: " + it->second.describe() + ")");
  }
  for (const auto& [name, t] : state)
    if (!by_name.count(name)) unexpected.push_back(name);
  std::map<const TensorImpl*, std::string> first_name;  // Note [Loading shared tensors]
  for (const auto& [name, t] : mine) {
    auto it = state.find(name);
    if (!t.defined() || it == state.end() || !it->second.defined() || it->second.sizes() != t.sizes()) continue;
    auto [first, inserted] = first_name.emplace(&t.impl(), name);
    if (!inserted && !same_values(state.at(first->second), it->second))
      conflicting.push_back(name + " and " + first->second);
  }
  const bool bad = !mismatched.empty() || !conflicting.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (bad) {
    std::ostringstream msg;
    msg << "load_state_dict: checkpoint does not match " << type_name();
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      msg << "\n  " << what << " (" << keys.size() << "):";
      for (const auto& k : keys) msg << "\n    " << k;
    };
    list("missing keys", missing);
    list("unexpected keys", unexpected);
    list("shape mismatches", mismatched);
    list("names of one tensor given different values", conflicting);
    FRUGAL_FAIL(msg.str());
  }
  autograd::NoGradGuard no_grad;
  for (const auto& [name, t] : mine) {
    auto it = state.find(name);
    if (it == state.end()) continue;
    ops::copy_into(t, it->second);  // converts dtype and device as needed
    t.bump_version();
  }
  return {missing, unexpected};
}

// Note [Module printout]
// repr() follows torch's Module.__repr__: the lines are extra_repr() split at newlines, then
// "(name): " + the child's printout for each child; one settings line and no children print on
// one line ("Linear(in_features=4, out_features=3, bias=true)"), anything else as
// "Name(\n  line\n  line\n)", every line after a child's first shifted two spaces
// (torch's _addindent). So a module with settings and children prints its settings on a line
// of their own, and a multi-line extra_repr keeps its indentation.
namespace {
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl = s.find('\n'); nl != std::string::npos; nl = s.find('\n', start)) {
    lines.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  lines.push_back(s.substr(start));
  return lines;
}

// torch's _addindent: every line but the first shifted right by `spaces`.
std::string indent_after_first(const std::string& s, int spaces) {
  std::string out;
  for (const char c : s) {
    out += c;
    if (c == '\n') out.append(size_t(spaces), ' ');
  }
  return out;
}
}  // namespace

std::string Module::repr(int indent) const {
  std::vector<std::string> lines;
  if (const std::string extra = extra_repr(); !extra.empty()) lines = split_lines(extra);
  const size_t extra_lines = lines.size();
  for (const auto& [name, child] : children_)
    lines.push_back('(' + name + "): " + indent_after_first(child->repr(), 2));
  std::string out = type_name() + '(';
  if (extra_lines == 1 && children_.empty()) {
    out += lines[0];
  } else if (!lines.empty()) {
    for (const auto& line : lines) out += "\n  " + line;
    out += '\n';
  }
  out += ')';
  return indent_after_first(out, indent);
}

uint64_t UnaryModule::add_forward_hooks(ForwardHooks hooks) {
  const uint64_t id = next_hook_id_++;
  forward_hooks_.emplace_back(id, std::move(hooks));
  return id;
}

void UnaryModule::remove_forward_hooks(uint64_t id) {
  std::erase_if(forward_hooks_, [id](const auto& entry) { return entry.first == id; });
}

Tensor UnaryModule::forward_with_hooks(const Tensor& x) {
  const auto hooks = forward_hooks_;
  for (const auto& [id, h] : hooks)
    if (h.before) h.before(*this);
  Tensor out = forward(x);
  for (const auto& [id, h] : hooks)
    if (h.after) out = h.after(*this, std::move(out));
  return out;
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.repr(); }

}  // namespace frugal::nn
