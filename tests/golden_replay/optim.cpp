// The optimizers' replay of the PyTorch goldens (tests/golden_replay/replay.h): frugal's
// training-loop pieces against PyTorch's own trajectories: SGD, Adam, AdamW and
// OffloadAdamW step for step (every option, param groups, absent gradients, zero_grad, a resume
// from state_dicts mid-run, transposed layouts, float32 and float64), the LR schedulers' lr
// sequences (past T_max and total_steps, across SequentialLR milestones, resumed), clip_grad_norm_
// (norm types 1, 2, 3, 0.5, inf; inf and NaN gradients) and GradScaler loops (growth, backoff,
// skipped steps, unscaled gradients). tools/torch_golden_optim.py writes the goldens
// (tests/golden/optim_torch.safetensors) with PyTorch 1.13; tests/cpu/test_optim.cpp and
// test_grad_scaler.cpp compare with float64 loops written next to the optimizers, so a misreading
// of PyTorch's rules would be in both, and only these catch it.
//
// Note [Golden trajectories]
// Each case of the file's "cases" metadata names its kind (optim, sched, clip, scaler), its
// settings under frugal's option names, and its tensors "<id>.<what>" (the generator's docstring
// lists them). A case replays PyTorch's sequence of calls on frugal's objects - set the gradients,
// zero_grad, clip, step, schedule, update the scale - and compares after every step: parameters
// within rtol |torch| + atol max(1, max |torch|) for the case's dtype (tol_for), lrs within 1e-12
// relative, the loss scale and growth tracker exactly, NaN matching NaN and an infinity the same
// infinity. A resumed case saves the state_dicts through a safetensors file, as a checkpoint does,
// and goes on with new objects: the golden is PyTorch's uninterrupted run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "core/json.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/offload_adam.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tests/golden_replay/golden_file.h"
#include "tests/golden_replay/replay.h"
#include "tests/test_util.h"

namespace frugal::testing {
namespace {

using namespace frugal::optim;

const std::string kGoldenFile = "optim_torch.safetensors";
const std::string kRemake = " (regenerate it: /usr/bin/python3 tools/torch_golden_optim.py)";

GoldenFile read_golden_optim() { return read_golden_file(kGoldenFile, kRemake); }
const GoldenFile& golden() { return golden_once<read_golden_optim>(); }

// ---- reading a case's JSON -----------------------------------------------------------------

const json::Value& array_of(const json::Value& v) {
  FRUGAL_CHECK(v.is_array(), "torch goldens: expected an array, got ", json::type_name(v.type));
  return v;
}
/// A number of `obj`, or `dflt` when absent.
double num_or(const json::Value& obj, const std::string& key, double dflt) {
  const json::Value* v = obj.find(key);
  return v ? num_of(*v) : dflt;
}
/// A per-step (or per-parameter) setting "<n>": value of an optional object, or nullptr.
const json::Value* at_index(const json::Value& c, const std::string& key, int64_t n) {
  const json::Value* m = c.find(key);
  return m && m->is_object() ? m->find(std::to_string(n)) : nullptr;
}

/// A case's tensor "<id>.<what>", checked to exist.
const Tensor& stored(const std::string& id, const std::string& what) {
  const auto& t = golden().tensors;
  auto it = t.find(id + "." + what);
  FRUGAL_CHECK(it != t.end(), "torch goldens: case ", id, " has no tensor \"", what, "\"", kRemake);
  return it->second;
}
bool has(const std::string& id, const std::string& what) { return golden().tensors.count(id + "." + what) == 1; }

/// The name of a case's tensor: `what` and its indices, "g3.1" (step 3, parameter 1).
std::string key(const char* what, int64_t a, int64_t b = -1) {
  std::string k(what);
  k += std::to_string(a);
  if (b >= 0) {
    k += '.';
    k += std::to_string(b);
  }
  return k;
}

/// `t` in the layout the case names for it: "transposed" keeps the values in column-major memory.
Tensor in_layout(const Tensor& t, const json::Value* layout) {
  if (!layout || t.dim() < 2) return t;
  FRUGAL_CHECK(str_of(*layout) == "transposed", "torch goldens: unknown layout ", str_of(*layout));
  return t.transpose(-1, -2).contiguous().transpose(-1, -2);
}

// ---- comparing -----------------------------------------------------------------------------

/// The bound for a trajectory in `dt`: float32's is ten times what the cases need today, so a
/// rule that loses accuracy (or drifts over the steps) shows up too.
Tol tol_for(DType dt) { return dt == kFloat64 ? Tol{1e-12, 1e-13} : Tol{1e-5, 1e-6}; }
const Tol kLrTol{1e-12, 1e-15};

/// One case's comparisons. Once a series (a parameter's trajectory, the lr sequence, the scale)
/// has gone wrong, its later steps usually differ too: only its first mismatch is shown, and
/// finish() says how many more there were.
class Report {
 public:
  explicit Report(std::string title) : title_(std::move(title)) {}
  const std::string& title() const { return title_; }

  /// A CHECK that `message` is empty ("" = agrees); `what` names the comparison (with its step).
  void check(const std::string& series, const std::string& what, const std::string& message) {
    if (!message.empty() && !shown_.insert(series).second) {
      ++hidden_[series];
      return;
    }
    CHECK_MESSAGE(message.empty(), title_ << ": " << what << ": " << message);
  }
  void finish() {
    for (const auto& [series, n] : hidden_)
      CHECK_MESSAGE(false, title_ << ": " << series << ": " << n << " later comparisons differ too (not shown)");
  }

 private:
  std::string title_;
  std::set<std::string> shown_;
  std::map<std::string, int64_t> hidden_;
};

/// What differs between a tensor and PyTorch's (presence, shape, values); "" when they agree.
std::string tensor_error(const Tensor& got, const Tensor& want, Tol tol) {
  if (!got.defined()) return "frugal has none, torch " + shape_str(want.sizes());
  if (got.sizes() != want.sizes()) return "shape " + shape_str(got.sizes()) + ", torch " + shape_str(want.sizes());
  const std::string err = mismatch(values_of(got), values_of(want), want.sizes(), tol);
  return err.empty() ? err : std::string(dtype_name(got.dtype())) + shape_str(want.sizes()) + ": " + err;
}

/// What differs between a number and PyTorch's; "" when they agree.
std::string value_error(double got, double want, Tol tol) { return mismatch({got}, {want}, {}, tol); }

/// Compares every group's lr (the optimizer's and the scheduler's last_lr) with row `t` of "lr".
void check_lrs(Report& r, const Optimizer& opt, const LRScheduler* sched, const Tensor& lrs, int64_t t) {
  const std::vector<double> want = values_of(lrs.select(0, t));
  std::vector<double> got;
  for (const ParamGroup& g : opt.param_groups()) got.push_back(g.lr);
  const std::string at = "lr after " + std::to_string(t) + " scheduler steps";
  r.check("lr", at + " (per group)", mismatch(got, want, {int64_t(want.size())}, kLrTol));
  if (sched) r.check("last_lr", at + ", last_lr()", mismatch(sched->last_lr(), want, {int64_t(want.size())}, kLrTol));
}

// ---- optimizers and schedulers from a case's settings ----------------------------------------

/// A parameter group of a spec: its parameters and the hyperparameters it overrides.
ParamGroup group_of(const json::Value& spec, const std::vector<Tensor>& params) {
  ParamGroup g;
  for (const json::Member& m : spec.members) {
    const json::Value& v = m.value;
    if (m.key == "params") {
      for (const json::Value& i : array_of(v).items) g.params.push_back(params.at(size_t(int_of(i))));
    } else if (m.key == "add_at") {
      continue;  // when the group joins (added_at)
    } else if (m.key == "lr") g.lr = num_of(v);
    else if (m.key == "momentum") g.momentum = num_of(v);
    else if (m.key == "dampening") g.dampening = num_of(v);
    else if (m.key == "weight_decay") g.weight_decay = num_of(v);
    else if (m.key == "beta1") g.beta1 = num_of(v);
    else if (m.key == "beta2") g.beta2 = num_of(v);
    else if (m.key == "eps") g.eps = num_of(v);
    else if (m.key == "nesterov") g.nesterov = bool_of(v);
    else if (m.key == "maximize") g.maximize = bool_of(v);
    else if (m.key == "amsgrad") g.amsgrad = bool_of(v);
    else FRUGAL_FAIL("torch goldens: unknown param group setting \"", m.key, "\"");
  }
  return g;
}

/// The step before which a group joins its optimizer by add_param_group (0: made with it). The
/// cases list such groups after the others, in the order they join, as PyTorch appends them.
int64_t added_at(const json::Value& group) { return group.find("add_at") ? int_of(member(group, "add_at")) : 0; }

/// The optimizer a spec {type, options, groups} names, over `params`, with the groups that
/// join before step `through` + 1.
std::unique_ptr<Optimizer> make_optimizer(const json::Value& spec, const std::vector<Tensor>& params, int64_t through) {
  const std::string type = str_of(member(spec, "type"));
  const json::Value& o = member(spec, "options");
  std::vector<ParamGroup> groups;
  for (const json::Value& g : array_of(member(spec, "groups")).items)
    if (added_at(g) <= through) groups.push_back(group_of(g, params));
  auto flag = [&](const char* k) { return o.find(k) ? bool_of(*o.find(k)) : false; };
  if (type == "SGD") {
    SGDOptions s;
    s.lr = num_or(o, "lr", s.lr), s.momentum = num_or(o, "momentum", 0), s.dampening = num_or(o, "dampening", 0);
    s.weight_decay = num_or(o, "weight_decay", 0), s.nesterov = flag("nesterov"), s.maximize = flag("maximize");
    return std::make_unique<SGD>(std::move(groups), s);
  }
  if (type == "Adam" || type == "AdamW") {
    AdamWOptions a;
    a.lr = num_or(o, "lr", a.lr), a.beta1 = num_or(o, "beta1", a.beta1), a.beta2 = num_or(o, "beta2", a.beta2);
    a.eps = num_or(o, "eps", a.eps), a.amsgrad = flag("amsgrad"), a.maximize = flag("maximize");
    if (type == "AdamW") {
      a.weight_decay = num_or(o, "weight_decay", a.weight_decay);
      return std::make_unique<AdamW>(std::move(groups), a);
    }
    AdamOptions d{.lr = a.lr,
                  .beta1 = a.beta1,
                  .beta2 = a.beta2,
                  .eps = a.eps,
                  .weight_decay = num_or(o, "weight_decay", 0.0),
                  .amsgrad = a.amsgrad,
                  .maximize = a.maximize};
    return std::make_unique<Adam>(std::move(groups), d);
  }
  if (type == "OffloadAdamW") {
    OffloadAdamWOptions a;
    a.lr = num_or(o, "lr", a.lr), a.beta1 = num_or(o, "beta1", a.beta1), a.beta2 = num_or(o, "beta2", a.beta2);
    a.eps = num_or(o, "eps", a.eps), a.weight_decay = num_or(o, "weight_decay", a.weight_decay);
    a.maximize = flag("maximize");
    return std::make_unique<OffloadAdamW>(std::move(groups), a);
  }
  FRUGAL_FAIL("torch goldens: unknown optimizer ", type);
}

/// The scheduler a spec names, on `opt`.
std::shared_ptr<LRScheduler> make_scheduler(const json::Value& spec, Optimizer& opt) {
  const std::string type = str_of(member(spec, "type"));
  auto num = [&](const char* k) { return num_of(member(spec, k)); };
  auto integer = [&](const char* k) { return int_of(member(spec, k)); };
  if (type == "StepLR") return std::make_shared<StepLR>(opt, StepLROptions{integer("step_size"), num("gamma")});
  if (type == "CosineAnnealingLR")
    return std::make_shared<CosineAnnealingLR>(opt, CosineAnnealingLROptions{integer("T_max"), num("eta_min")});
  if (type == "LinearLR")
    return std::make_shared<LinearLR>(opt,
                                      LinearLROptions{num("start_factor"), num("end_factor"), integer("total_iters")});
  if (type == "WarmupCosineLR")
    return std::make_shared<WarmupCosineLR>(opt, WarmupCosineLROptions{integer("warmup_steps"), integer("total_steps"),
                                                                       num("start_factor"), num("eta_min")});
  if (type == "SequentialLR") {
    std::vector<std::shared_ptr<LRScheduler>> subs;
    for (const json::Value& s : array_of(member(spec, "schedulers")).items) subs.push_back(make_scheduler(s, opt));
    std::vector<int64_t> milestones;
    for (const json::Value& m : array_of(member(spec, "milestones")).items) milestones.push_back(int_of(m));
    return std::make_shared<SequentialLR>(opt, std::move(subs), std::move(milestones));
  }
  FRUGAL_FAIL("torch goldens: unknown scheduler ", type);
}

using Optimizers = std::vector<std::unique_ptr<Optimizer>>;

/// The case's optimizers as they are after step `through` (the groups added by then included).
Optimizers make_optimizers(const json::Value& c, const std::vector<Tensor>& params, int64_t through = 0) {
  Optimizers opts;
  for (const json::Value& spec : array_of(member(c, "optimizers")).items)
    opts.push_back(make_optimizer(spec, params, through));
  return opts;
}

/// add_param_group for each group that joins before step `s`.
void add_groups(const json::Value& c, Optimizers& opts, const std::vector<Tensor>& params, int64_t s) {
  const json::Value& specs = array_of(member(c, "optimizers"));
  for (size_t j = 0; j < opts.size(); ++j)
    for (const json::Value& g : array_of(member(specs.items.at(j), "groups")).items)
      if (added_at(g) == s) opts[j]->add_param_group(group_of(g, params));
}

/// The case's parameters before the first step (leaves in their layout), from "p<k>".
std::vector<Tensor> initial_params(const std::string& id, const json::Value& c, Device device) {
  std::vector<Tensor> params;
  const size_t n = array_of(member(c, "shapes")).items.size();
  for (size_t k = 0; k < n; ++k) {
    Tensor p = in_layout(fresh_copy(stored(id, key("p", int64_t(k))), device), at_index(c, "param_layout", int64_t(k)));
    p.requires_grad_();
    params.push_back(p);
  }
  return params;
}

/// Copies of `params` (same values and layout) as new leaves: the model a resumed run rebuilds.
std::vector<Tensor> copied_params(const std::vector<Tensor>& params, const json::Value& c) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor p = in_layout(params[k].detach().clone(), at_index(c, "param_layout", int64_t(k)));
    p.requires_grad_();
    out.push_back(p);
  }
  return out;
}

/// Writes the dicts to one safetensors file (keys prefixed "<n>/") and reads them back, as a
/// checkpoint would: what a resumed run loads.
std::vector<StateDict> through_file(const std::vector<StateDict>& dicts) {
  const std::string path = temp_path("torch_golden_optim_resume");
  std::vector<std::pair<std::string, Tensor>> all;
  for (size_t n = 0; n < dicts.size(); ++n)
    for (const auto& [k, t] : dicts[n]) all.emplace_back(std::to_string(n) + "/" + k, t);
  nn::save_safetensors(path, all);
  const nn::SafetensorsFile f = nn::load_safetensors(path);
  std::filesystem::remove(path);
  std::vector<StateDict> out(dicts.size());
  for (const auto& [k, t] : f.tensors) {
    const size_t slash = k.find('/');
    out.at(std::stoul(k.substr(0, slash))).emplace_back(k.substr(slash + 1), t);
  }
  return out;
}

/// Compares each optimizer's final state with PyTorch's ("o<j>.state.<i>.<name>"), both ways.
void check_state(Report& r, const std::string& id, const Optimizers& opts, Tol tol) {
  for (size_t j = 0; j < opts.size(); ++j) {
    std::map<std::string, Tensor> mine;
    for (const auto& [k, t] : opts[j]->state_dict())
      if (k.starts_with("state.")) mine[k] = t;
    const std::string prefix = id + ".o" + std::to_string(j) + ".";
    const auto& all = golden().tensors;
    std::map<std::string, Tensor> want;
    for (auto it = all.lower_bound(prefix); it != all.end() && it->first.starts_with(prefix); ++it)
      want[it->first.substr(prefix.size())] = it->second;
    const std::string who = "optimizer " + std::to_string(j) + " (" + opts[j]->name() + ") final ";
    for (const auto& [k, w] : want) {
      auto it = mine.find(k);
      if (it == mine.end()) {
        r.check(who + k, who + k, "frugal's state_dict has no such key");
        continue;
      }
      r.check(who + k, who + k, tensor_error(it->second, w, tol));
    }
    std::vector<Tensor> own;  // the optimizer's parameters, in state-index order
    for (const ParamGroup& group : opts[j]->param_groups())
      own.insert(own.end(), group.params.begin(), group.params.end());
    for (const auto& [k, t] : mine) {
      if (want.count(k) == 1) continue;
      // OffloadAdamW keeps a host master copy of a device parameter (optim/offload_adam.h), which
      // torch's AdamW has no need of: it must hold the parameter's values exactly.
      const size_t dot = k.find('.', 6);
      if (std::string_view(opts[j]->name()) == "OffloadAdamW" && k.ends_with(".master_param") &&
          dot != std::string::npos) {
        const size_t i = std::stoul(k.substr(6, dot - 6));
        r.check(who + k, who + k,
                i < own.size() ? tensor_error(t, own[i].detach().to(kCPU, kFloat64), {0, 0}) : "no such parameter");
        continue;
      }
      r.check(who + k, who + k, "torch's state has no such entry");
    }
  }
}

std::string step_name(int64_t s) { return "step " + std::to_string(s); }
std::string param_name(size_t k, const Tensor& p) {
  return "param " + std::to_string(k) + " " + std::string(dtype_name(p.dtype())) + shape_str(p.sizes());
}

// ---- the four kinds of case ------------------------------------------------------------------

/// An optimizer trajectory (Note [Golden trajectories]).
void run_optim(const std::string& id, Report& r, const json::Value& c, Device device) {
  const DType dt = parse_dtype(str_of(member(c, "dtype")));
  const Tol tol = tol_for(dt);
  const int64_t steps = int_of(member(c, "steps"));
  const json::Value* clip = c.find("clip");
  const json::Value* sched_spec = c.find("scheduler");
  const int64_t resume_at = c.find("resume_at") ? int_of(member(c, "resume_at")) : -1;
  std::vector<Tensor> params = initial_params(id, c, device);
  Optimizers opts = make_optimizers(c, params);
  std::shared_ptr<LRScheduler> sched = sched_spec ? make_scheduler(*sched_spec, *opts.at(0)) : nullptr;
  if (sched) check_lrs(r, *opts[0], sched.get(), stored(id, "lr"), 0);
  for (int64_t s = 1; s <= steps; ++s) {
    const std::string at = step_name(s);
    for (size_t k = 0; k < params.size(); ++k) {
      const std::string g = key("g", s, int64_t(k));
      params[k].set_grad(
          has(id, g) ? in_layout(fresh_copy(stored(id, g), device), at_index(c, "grad_layout", int64_t(k))) : Tensor());
    }
    add_groups(c, opts, params, s);
    if (const json::Value* z = at_index(c, "zero_grad", s))
      for (auto& o : opts) o->zero_grad(str_of(*z) == "none");
    if (clip) {
      const double norm =
          clip_grad_norm_(params, num_of(member(*clip, "max_norm")), num_of(member(*clip, "norm_type")));
      r.check("norm", at + ": clip_grad_norm_'s total norm",
              value_error(norm, values_of(stored(id, "norm"))[size_t(s - 1)], tol));
    }
    for (auto& o : opts) o->step();
    if (sched) {
      sched->step();
      check_lrs(r, *opts[0], sched.get(), stored(id, "lr"), s);
    }
    for (size_t k = 0; k < params.size(); ++k)
      r.check(param_name(k, params[k]), at + ", " + param_name(k, params[k]),
              tensor_error(params[k].detach(), stored(id, key("x", s, int64_t(k))), tol));
    if (s == resume_at) {  // a checkpoint: state_dicts through a file, new objects, load, go on
      std::vector<StateDict> dicts;
      for (auto& o : opts) dicts.push_back(o->state_dict());
      if (sched) dicts.push_back(sched->state_dict());
      dicts = through_file(dicts);
      std::vector<Tensor> fresh = copied_params(params, c);
      Optimizers fresh_opts = make_optimizers(c, fresh, s);
      std::shared_ptr<LRScheduler> fresh_sched = sched_spec ? make_scheduler(*sched_spec, *fresh_opts[0]) : nullptr;
      for (size_t j = 0; j < fresh_opts.size(); ++j) fresh_opts[j]->load_state_dict(dicts[j]);
      if (fresh_sched) fresh_sched->load_state_dict(dicts.back());
      sched = std::move(fresh_sched);  // before the optimizers it refers to
      opts = std::move(fresh_opts);
      params = std::move(fresh);
      if (sched) check_lrs(r, *opts[0], sched.get(), stored(id, "lr"), s);
    }
  }
  check_state(r, id, opts, tol);
}

/// An lr sequence on an SGD whose groups start at base_lrs, of the schedulers of "chain" made in
/// order on it and stepped back to back (one, usually).
void run_sched(const std::string& id, Report& r, const json::Value& c) {
  const json::Value& chain = array_of(member(c, "chain"));
  using Chain = std::vector<std::shared_ptr<LRScheduler>>;
  auto make_chain = [&](Optimizer& opt) {
    Chain out;
    for (const json::Value& spec : chain.items) out.push_back(make_scheduler(spec, opt));
    return out;
  };
  const int64_t steps = int_of(member(c, "steps"));
  const int64_t resume_at = c.find("resume_at") ? int_of(member(c, "resume_at")) : -1;
  const Tensor& lrs = stored(id, "lr");
  auto make_opt = [&] {
    std::vector<ParamGroup> groups;
    for (const json::Value& lr : array_of(member(c, "base_lrs")).items) {
      Tensor p = zeros({1});
      p.requires_grad_();
      groups.push_back({.params = {p}, .lr = num_of(lr)});
    }
    return std::make_unique<SGD>(std::move(groups), SGDOptions{});
  };
  std::unique_ptr<SGD> opt = make_opt();
  Chain scheds = make_chain(*opt);
  check_lrs(r, *opt, scheds.back().get(), lrs, 0);
  for (int64_t t = 1; t <= steps; ++t) {
    for (auto& s : scheds) s->step();
    check_lrs(r, *opt, scheds.back().get(), lrs, t);
    if (t == resume_at) {
      std::vector<StateDict> dicts{opt->state_dict()};
      for (auto& s : scheds) dicts.push_back(s->state_dict());
      dicts = through_file(dicts);
      std::unique_ptr<SGD> fresh = make_opt();
      Chain fresh_scheds = make_chain(*fresh);
      fresh->load_state_dict(dicts[0]);
      for (size_t k = 0; k < fresh_scheds.size(); ++k) {
        fresh_scheds[k]->load_state_dict(dicts[k + 1]);
        r.check("last_epoch", "resumed after " + std::to_string(t) + " steps",
                fresh_scheds[k]->last_epoch() == t ? ""
                                                   : "last_epoch " + std::to_string(fresh_scheds[k]->last_epoch()) +
                                                         ", expected " + std::to_string(t));
      }
      scheds = std::move(fresh_scheds);
      opt = std::move(fresh);
      check_lrs(r, *opt, scheds.back().get(), lrs, t);
    }
  }
}

/// One clip_grad_norm_ (and the same through clip_grad_norm_async on copies).
void run_clip(const std::string& id, Report& r, const json::Value& c, Device device) {
  const DType dt = parse_dtype(str_of(member(c, "dtype")));
  const Tol tol = tol_for(dt);
  const double max_norm = num_of(member(c, "max_norm")), norm_type = num_of(member(c, "norm_type"));
  const double want_norm = values_of(stored(id, "norm"))[0];
  for (const bool async : {false, true}) {
    const std::string how = async ? "clip_grad_norm_async: " : "clip_grad_norm_: ";
    std::vector<Tensor> params;
    for (size_t k = 0; k < array_of(member(c, "shapes")).items.size(); ++k) {
      Shape shape;
      for (const json::Value& d : array_of(member(c, "shapes")).items[k].items) shape.push_back(int_of(d));
      Tensor p = zeros(shape, TensorOptions{dt, device});
      p.requires_grad_();
      const std::string g = key("g", int64_t(k));
      if (has(id, g)) p.set_grad(in_layout(fresh_copy(stored(id, g), device), at_index(c, "grad_layout", int64_t(k))));
      params.push_back(p);
    }
    // Both return the norm in the gradients' dtype here, as PyTorch's (optim/clip_grad.h).
    const Tensor async_norm = async ? clip_grad_norm_async(params, max_norm, norm_type) : Tensor();
    if (async)
      r.check(how + "dtype", how + "the norm's dtype",
              async_norm.dtype() == dt ? "" : "norm " + std::string(dtype_name(async_norm.dtype())));
    const double norm = async ? values_of(async_norm)[0] : clip_grad_norm_(params, max_norm, norm_type);
    r.check(how + "norm", how + "the total norm", value_error(norm, want_norm, tol));
    for (size_t k = 0; k < params.size(); ++k) {
      const std::string out = key("out", int64_t(k));
      const std::string what = how + "the gradient of " + param_name(k, params[k]);
      if (has(id, out)) r.check(what, what, tensor_error(params[k].grad(), stored(id, out), tol));
      else r.check(what, what, params[k].grad().defined() ? "frugal made one, torch's stays None" : "");
    }
  }
}

/// A GradScaler loop (see tools/torch_golden_optim.py).
void run_scaler(const std::string& id, Report& r, const json::Value& c, Device device) {
  const Tol tol = tol_for(kFloat32);
  const json::Value& o = member(c, "options");
  const int64_t steps = int_of(member(c, "steps"));
  const bool unscale = bool_of(member(c, "unscale")), check_grads = bool_of(member(c, "check_grads"));
  const json::Value* clip = c.find("clip");
  const int64_t resume_at = c.find("resume_at") ? int_of(member(c, "resume_at")) : -1;
  const std::vector<double> want_scale = values_of(stored(id, "scale")),
                            want_tracker = values_of(stored(id, "tracker"));
  const Tensor& skipped = stored(id, "skipped");  // (steps, optimizers)
  // Which parameters each optimizer steps.
  std::vector<std::vector<size_t>> owned;
  for (const json::Value& spec : array_of(member(c, "optimizers")).items) {
    owned.emplace_back();
    for (const json::Value& g : array_of(member(spec, "groups")).items)
      for (const json::Value& i : array_of(member(g, "params")).items) owned.back().push_back(size_t(int_of(i)));
  }

  std::vector<Tensor> params = initial_params(id, c, device);
  Optimizers opts = make_optimizers(c, params);
  auto scaler =
      std::make_unique<GradScaler>(GradScalerOptions{.init_scale = num_of(member(o, "init_scale")),
                                                     .growth_factor = num_of(member(o, "growth_factor")),
                                                     .backoff_factor = num_of(member(o, "backoff_factor")),
                                                     .growth_interval = int_of(member(o, "growth_interval")),
                                                     .enabled = !o.find("enabled") || bool_of(*o.find("enabled"))});
  auto check_scale = [&](int64_t s) {
    const std::string at = s == 0 ? "before step 1" : "after " + step_name(s);
    r.check("scale", "scale " + at, value_error(scaler->get_scale(), want_scale[size_t(s)], {0, 0}));
    r.check("growth tracker", "growth tracker " + at,
            value_error(double(scaler->get_growth_tracker()), want_tracker[size_t(s)], {0, 0}));
  };
  check_scale(0);
  for (int64_t s = 1; s <= steps; ++s) {
    const std::string at = step_name(s);
    for (auto& opt : opts) opt->zero_grad(true);
    Tensor loss;
    for (size_t k = 0; k < params.size(); ++k) {
      const std::string ck = key("c", s, int64_t(k));
      if (!has(id, ck)) continue;
      const Tensor term = sum(mul(params[k], stored(id, ck).to(device)));
      loss = loss.defined() ? add(loss, term) : term;
    }
    scaler->scale(loss).backward();
    if (unscale)
      for (auto& opt : opts) scaler->unscale_(*opt);
    if (clip) {
      const double norm =
          clip_grad_norm_(params, num_of(member(*clip, "max_norm")), num_of(member(*clip, "norm_type")));
      r.check("norm", at + ": clip_grad_norm_'s total norm",
              value_error(norm, values_of(stored(id, "norm"))[size_t(s - 1)], tol));
    }
    std::vector<Tensor> before;
    for (const Tensor& p : params) before.push_back(p.detach().clone());
    for (auto& opt : opts) scaler->step(*opt);
    if (const json::Value* v = at_index(c, "new_scale", s)) scaler->update(num_of(*v));
    else scaler->update();
    check_scale(s);
    for (size_t j = 0; j < opts.size(); ++j) {
      if (skipped.select(0, s - 1).select(0, int64_t(j)).item<int64_t>() == 0) continue;
      for (size_t k : owned[j])
        r.check("skipped steps", at + ", " + param_name(k, params[k]),
                values_of(params[k]) == values_of(before[k])
                    ? ""
                    : "torch skipped the step of optimizer " + std::to_string(j) +
                          " (an inf or NaN gradient), frugal changed the parameter");
    }
    for (size_t k = 0; k < params.size(); ++k) {
      const std::string ug = key("ug", s, int64_t(k));
      if (check_grads && has(id, ug))
        r.check("unscaled gradient of " + param_name(k, params[k]),
                at + ", unscaled gradient of " + param_name(k, params[k]),
                tensor_error(params[k].grad(), stored(id, ug), tol));
      r.check(param_name(k, params[k]), at + ", " + param_name(k, params[k]),
              tensor_error(params[k].detach(), stored(id, key("x", s, int64_t(k))), tol));
    }
    if (s == resume_at) {  // scaler and optimizers from their state_dicts, into new objects
      std::vector<StateDict> dicts;
      for (auto& opt : opts) dicts.push_back(opt->state_dict());
      dicts.push_back(scaler->state_dict());
      dicts = through_file(dicts);
      std::vector<Tensor> fresh = copied_params(params, c);
      Optimizers fresh_opts = make_optimizers(c, fresh);
      for (size_t j = 0; j < fresh_opts.size(); ++j) fresh_opts[j]->load_state_dict(dicts[j]);
      auto fresh_scaler = std::make_unique<GradScaler>();  // every setting comes from the dict
      fresh_scaler->load_state_dict(dicts.back());
      scaler = std::move(fresh_scaler);
      opts = std::move(fresh_opts);
      params = std::move(fresh);
      check_scale(s);
    }
  }
  check_state(r, id, opts, tol);
}

}  // namespace

void replay_golden_optim(const std::vector<std::string>& families, Device device) {
  replay_families(golden(), families, device, kGoldenFile + kRemake, "optimizer",
                  [&](const json::Value& c, const std::string& title) {
                    const std::string id = str_of(member(c, "id")), kind = str_of(member(c, "kind"));
                    Report r(title);
                    if (kind == "optim") run_optim(id, r, c, device);
                    else if (kind == "sched") run_sched(id, r, c);
                    else if (kind == "clip") run_clip(id, r, c, device);
                    else if (kind == "scaler") run_scaler(id, r, c, device);
                    else FRUGAL_FAIL("torch goldens: unknown case kind \"", kind, "\"");
                    r.finish();
                  });
}

void check_golden_optim_file() {
  const GoldenFile& g = golden();
  const std::vector<std::string> kinds = {"optim", "sched", "clip", "scaler"};
  const std::vector<std::string> families = {"sgd", "adam", "adamw", "offload", "sched", "clip", "scaler", "loop"};
  for (const json::Value& c : g.cases.items) {
    const json::Value* kind = c.find("kind");
    const json::Value* family = c.find("family");
    const bool known = kind && kind->is_string() && family && family->is_string() &&
                       std::count(kinds.begin(), kinds.end(), kind->text) == 1 &&
                       std::count(families.begin(), families.end(), family->text) == 1;
    CHECK_MESSAGE(known, "torch goldens: a case of an unknown kind or family: "
                             << (kind && kind->is_string() ? kind->text : std::string("(no kind)")) << " / "
                             << (family && family->is_string() ? family->text : std::string("(no family)")));
  }
}

}  // namespace frugal::testing
