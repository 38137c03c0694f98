#include "optim/optimizer.h"

#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <string_view>
#include <type_traits>

#include "autograd/grad_mode.h"
#include "core/graph_capture.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/fill.h"

namespace frugal::optim {

namespace {

Tensor f64_scalar(double v) { return scalar_tensor(v, TensorOptions(kFloat64)); }

/// Parses a non-negative decimal index; false on anything else.
bool parse_index(std::string_view s, size_t& out) {
  if (s.empty() || s.size() > 12) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

/// The value of a 0-d (or one-element) numeric tensor from a state dict.
double scalar_of(const std::string& key, const Tensor& t, const char* opt) {
  FRUGAL_CHECK(t.defined() && t.numel() == 1 && t.dtype() != kBool, opt, ".load_state_dict: ", key,
               " must be a one-element number, got ", t.defined() ? t.describe() : std::string("an undefined tensor"));
  return t.to(kCPU, kFloat64).item<double>();
}

}  // namespace

void Optimizer::zero_grad(bool set_to_none) {
  autograd::NoGradGuard no_grad;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      if (set_to_none) p.set_grad(Tensor());
      else ops::zero_(g);
    }
  }
}

void Optimizer::freeze_hyperparams_for_replay() const {
  core::GraphCapture* capture = core::current_graph_capture();
  if (!capture) return;
  auto values = [this] {
    std::vector<double> v;
    for (const ParamGroup& g : groups_) {
      v.push_back(g.lr);
      for (const HyperParam& h : hyperparams())
        v.push_back(h.real ? (g.*h.real).value_or(h.option) : double((g.*h.flag).value_or(h.option != 0)));
    }
    return v;
  };
  capture->replay_checks.push_back(
      [this, alive = std::weak_ptr<int>(alive_), frozen = values(), values, generation = state_generation_] {
        if (alive.expired()) return;  // the optimizer is gone; the graph goes on with what it froze
        FRUGAL_CHECK(values() == frozen, "CudaGraph.replay: ", name(),
                     "'s learning rate or another hyperparameter changed since the capture froze it into the graph "
                     "(an LR scheduler?); capture a new graph after changing them");
        // The graph's kernels hold the addresses of the state buffers it was captured with.
        FRUGAL_CHECK(state_generation_ == generation, "CudaGraph.replay: ", name(),
                     "'s state was replaced by load_state_dict since the capture, and the graph would update the "
                     "freed buffers; capture a new graph after loading");
      });
}

void Optimizer::step_on_device_flag(const Tensor& found_inf, bool makes_state,
                                    const std::function<void(const float*)>& step) {
  FRUGAL_CHECK(found_inf.defined() && found_inf.is_cuda() && found_inf.dtype() == kFloat32 && found_inf.numel() == 1,
               name_, ".step_skipping_if: found_inf must be a one-element float32 CUDA tensor, got ",
               found_inf.defined() ? found_inf.describe() : std::string("an undefined tensor"));
  for (const ParamGroup& group : groups_)
    for (const Tensor& p : group.params)
      FRUGAL_CHECK(p.device() == found_inf.device(), name_, ".step_skipping_if: parameter ", p.describe(),
                   " is not on found_inf's device ", found_inf.device().str());
  if (makes_state && !core::current_graph_capture()) {
    if (found_inf.item<float>() == 0.0f) step(nullptr);
    return;
  }
  step(found_inf.data_ptr<float>());
}

Optimizer::ScaledStep Optimizer::step_scaled(float /*inv_scale*/) {
  FRUGAL_FAIL(name(),
              ".step_scaled: this optimizer does not unscale gradients in its step; GradScaler.step calls "
              "unscale_() and step() for it");
}

void Optimizer::step_skipping_if(const Tensor& /*found_inf*/) {
  FRUGAL_FAIL(name(),
              ".step_skipping_if: this optimizer cannot skip its step on a device flag; inside a CUDA graph "
              "capture GradScaler.step needs one that can (SGD, or Adam/AdamW made with capturable), otherwise call "
              "scaler.step and update after "
              "replay()");
}

void Optimizer::add_param_group(ParamGroup group) {
  const size_t g = groups_.size();
  FRUGAL_CHECK(!group.params.empty(), name_, ": param group ", g, " has no parameters");
  std::set<const TensorImpl*> seen;
  for (const ParamGroup& other : groups_)
    for (const Tensor& p : other.params) seen.insert(p.impl_ptr().get());
  for (size_t k = 0; k < group.params.size(); ++k) {
    const Tensor& p = group.params[k];
    FRUGAL_CHECK(p.defined(), name_, ": param group ", g, " holds an undefined tensor at position ", k);
    FRUGAL_CHECK(p.is_floating_point(), name_, ": can only optimize floating tensors, got ", p.describe(),
                 " in param group ", g);
    FRUGAL_CHECK(p.is_leaf(), name_, ": can't optimize a non-leaf tensor (", p.describe(), ", made by ",
                 p.grad_fn_name(), ") in param group ", g);
    FRUGAL_CHECK(seen.insert(p.impl_ptr().get()).second, name_, ": parameter ", k, " of param group ", g, " (",
                 p.describe(), ") appears in more than one place");
  }
  if (group.lr == ParamGroup::kOptimizerLr) group.lr = default_lr();
  const std::vector<HyperParam> hypers = hyperparams();
  // Fields this optimizer does not read must stay unset: a silently ignored option is a bug.
  auto uses = [&](auto field) {
    for (const HyperParam& h : hypers)
      if constexpr (std::is_same_v<decltype(field), std::optional<double> ParamGroup::*>) {
        if (h.real == field) return true;
      } else {
        if (h.flag == field) return true;
      }
    return false;
  };
  const std::pair<const char*, std::optional<double> ParamGroup::*> reals[] = {
      {"momentum", &ParamGroup::momentum},
      {"dampening", &ParamGroup::dampening},
      {"weight_decay", &ParamGroup::weight_decay},
      {"beta1", &ParamGroup::beta1},
      {"beta2", &ParamGroup::beta2},
      {"eps", &ParamGroup::eps}};
  const std::pair<const char*, std::optional<bool> ParamGroup::*> flags[] = {
      {"nesterov", &ParamGroup::nesterov}, {"maximize", &ParamGroup::maximize}, {"amsgrad", &ParamGroup::amsgrad}};
  for (const auto& [n, f] : reals)
    FRUGAL_CHECK(!(group.*f).has_value() || uses(f), name_, ": param group ", g, " sets ", n, ", which ", name_,
                 " does not use");
  for (const auto& [n, f] : flags)
    FRUGAL_CHECK(!(group.*f).has_value() || uses(f), name_, ": param group ", g, " sets ", n, ", which ", name_,
                 " does not use");
  for (const HyperParam& h : hypers) {
    if (h.real && !(group.*h.real)) group.*h.real = h.option;
    if (h.flag && !(group.*h.flag)) group.*h.flag = h.option != 0.0;
  }
  check_group(group, g);
  groups_.push_back(std::move(group));
}

const ParamState* Optimizer::state(const Tensor& param) const {
  auto it = state_.find(param.impl_ptr().get());
  if (it == state_.end()) return nullptr;
  refresh_state(param, it->second);
  return &it->second;
}

Tensor Optimizer::checked_grad(const Tensor& param, size_t i) const {
  Tensor grad = param.grad();
  if (!grad.defined()) return grad;
  FRUGAL_CHECK(grad.dtype() == param.dtype() && grad.sizes() == param.sizes() && grad.device() == param.device(), name_,
               ".step: parameter ", i, " (", param.describe(), ") has a gradient ", grad.describe(),
               "; it must match the parameter's dtype, shape and device");
  return grad;
}

std::vector<Tensor> Optimizer::checked_grads() const {
  std::vector<Tensor> grads;
  for (const ParamGroup& group : param_groups())
    for (const Tensor& p : group.params) grads.push_back(checked_grad(p, grads.size()));
  return grads;
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [impl, st] : state_)
    for (const Tensor& b : st.buffers)
      if (b.defined()) bytes += b.numel() * int64_t(b.element_size());
  return bytes;
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  const std::vector<const char*> names = state_names();
  const std::vector<HyperParam> hypers = hyperparams();
  size_t i = 0;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      if (const ParamState* st = state(p)) {
        const std::string prefix = "state." + std::to_string(i) + ".";
        if (counts_steps()) out.emplace_back(prefix + "step", scalar_tensor(double(st->step), TensorOptions(kInt64)));
        for (size_t b = 0; b < names.size(); ++b)
          if (st->buffers[b].defined()) out.emplace_back(prefix + names[b], st->buffers[b]);
      }
      ++i;
    }
  }
  i = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    out.emplace_back(prefix + "lr", f64_scalar(group.lr));
    for (const HyperParam& h : hypers)
      out.emplace_back(prefix + h.name, f64_scalar(h.real ? *(group.*h.real) : double(*(group.*h.flag))));
    if (group.initial_lr) out.emplace_back(prefix + "initial_lr", f64_scalar(*group.initial_lr));
    std::vector<int64_t> idx(group.params.size());
    for (auto& v : idx) v = int64_t(i++);
    out.emplace_back(prefix + "params", from_vector(idx, {int64_t(idx.size())}, TensorOptions(kInt64)));
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& dict) {
  const char* op = name_;
  std::vector<const Tensor*> params;  // every parameter, numbered across groups
  for (const ParamGroup& group : groups_)
    for (const Tensor& p : group.params) params.push_back(&p);

  // Sort the keys into groups and per-parameter state, rejecting strangers.
  std::map<size_t, KeysByName> group_keys, state_keys;
  for (const auto& [key, t] : dict) {
    const std::string_view k = key;
    const bool is_group = k.starts_with("param_groups."), is_state = k.starts_with("state.");
    const std::string_view rest = k.substr(is_group ? 13 : is_state ? 6 : 0);
    const size_t dot = rest.find('.');
    size_t index = 0;
    FRUGAL_CHECK((is_group || is_state) && dot != std::string_view::npos && parse_index(rest.substr(0, dot), index), op,
                 ".load_state_dict: unexpected key '", key, "' (expected state.<i>.<name> or param_groups.<g>.<name>)");
    auto& slot = (is_group ? group_keys : state_keys)[index][std::string(rest.substr(dot + 1))];
    FRUGAL_CHECK(slot == nullptr, op, ".load_state_dict: key '", key, "' appears twice");
    slot = &t;
  }

  FRUGAL_CHECK(
      group_keys.size() == groups_.size() && (group_keys.empty() || group_keys.rbegin()->first + 1 == groups_.size()),
      op, ".load_state_dict: the state dict has ", group_keys.size(), " param groups, the optimizer has ",
      groups_.size());
  std::vector<ParamGroup> loaded;
  size_t first = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    loaded.push_back(load_group(g, group_keys[g], first));
    first += groups_[g].params.size();
  }

  std::unordered_map<const TensorImpl*, ParamState> state;
  for (const auto& [i, keys] : state_keys) {
    FRUGAL_CHECK(i < params.size(), op, ".load_state_dict: state.", i, ".* refers to parameter ", i,
                 ", but the optimizer has ", params.size(), " parameters");
    state[params[i]->impl_ptr().get()] = load_param_state(i, keys, *params[i]);
  }

  // Nothing has changed up to here: a throw above leaves the optimizer as it was.
  groups_ = std::move(loaded);
  state_ = std::move(state);
  ++state_generation_;
  state_loaded();
}

ParamGroup Optimizer::load_group(size_t g, KeysByName keys, size_t first) const {
  const char* op = name_;
  const std::string prefix = "param_groups." + std::to_string(g) + ".";
  auto take = [&](const std::string& n) -> const Tensor& {
    auto it = keys.find(n);
    FRUGAL_CHECK(it != keys.end(), op, ".load_state_dict: missing key '", prefix, n, "'");
    const Tensor& t = *it->second;
    keys.erase(it);
    return t;
  };
  const Tensor& idx = take("params");
  const size_t n = groups_[g].params.size();
  FRUGAL_CHECK(idx.defined() && idx.dim() == 1 && (idx.dtype() == kInt64 || idx.dtype() == kInt32), op,
               ".load_state_dict: ", prefix, "params must be a 1-d integer tensor, got ",
               idx.defined() ? idx.describe() : std::string("an undefined tensor"));
  FRUGAL_CHECK(size_t(idx.numel()) == n, op, ".load_state_dict: param group ", g, " has ", idx.numel(),
               " parameters in the state dict and ", n, " in the optimizer");
  const std::vector<int64_t> ids = idx.to(kCPU, kInt64).tolist<int64_t>();
  for (size_t k = 0; k < n; ++k)
    FRUGAL_CHECK(ids[k] == int64_t(first + k), op, ".load_state_dict: ", prefix, "params[", k, "] is ", ids[k],
                 ", expected ", first + k, " (parameters are numbered across groups in order)");
  ParamGroup group = groups_[g];
  group.lr = scalar_of(prefix + "lr", take("lr"), op);
  for (const HyperParam& h : hyperparams()) {
    const double v = scalar_of(prefix + h.name, take(h.name), op);
    if (h.real) group.*h.real = v;
    else group.*h.flag = v != 0.0;
  }
  if (keys.count("initial_lr")) group.initial_lr = scalar_of(prefix + "initial_lr", take("initial_lr"), op);
  else group.initial_lr.reset();
  FRUGAL_CHECK(keys.empty(), op, ".load_state_dict: unexpected key '", prefix, keys.begin()->first, "'");
  check_group(group, g);
  return group;
}

Tensor Optimizer::load_state_buffer(const Tensor& t, const Tensor& param) const {
  Tensor copy = t.to(param.device(), state_dtype(param.dtype()));  // on the parameter's device
  // Never the caller's storage; in the parameter's memory order when it has its shape
  // (Note [Optimizer memory order] in optim/step_util.h).
  if (copy.sizes() == param.sizes() && is_dense(param)) {
    return copy.shares_storage(t) || !same_dense_layout(copy, param) ? copy_in_layout(copy, param) : copy;
  }
  if (copy.shares_storage(t) || !copy.is_contiguous()) copy = copy.clone();
  return copy;
}

ParamState Optimizer::load_param_state(size_t i, const KeysByName& keys, const Tensor& param) const {
  const char* op = name_;
  const std::string prefix = "state." + std::to_string(i) + ".";
  const std::vector<const char*> names = state_names();
  ParamState st;
  bool has_step = false;
  for (const auto& [n, t] : keys) {
    if (n == "step" && counts_steps()) {
      const double s = scalar_of(prefix + n, *t, op);
      FRUGAL_CHECK(s >= 0 && s == std::floor(s) && s < 9.007199254740992e15, op, ".load_state_dict: ", prefix,
                   "step must be a non-negative integer, got ", s);
      st.step = int64_t(s);
      has_step = true;
      continue;
    }
    size_t b = 0;
    while (b < names.size() && n != names[b]) ++b;
    FRUGAL_CHECK(b < names.size(), op, ".load_state_dict: unexpected key '", prefix, n, "'");
    FRUGAL_CHECK(t->defined() && state_shape_ok(b, t->sizes(), param) && t->is_floating_point(), op,
                 ".load_state_dict: ", prefix, n, " is ", t->defined() ? t->describe() : std::string("undefined"),
                 ", but parameter ", i, " is ", param.describe());
    st.buffers[b] = load_state_buffer(*t, param);
  }
  FRUGAL_CHECK(has_step || !counts_steps(), op, ".load_state_dict: ", prefix, "step is missing");
  check_state(st, param, prefix);
  return st;
}

}  // namespace frugal::optim
