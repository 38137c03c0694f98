#include "optim/lr_scheduler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <string_view>
#include <utility>

#include "tensor/factory.h"

namespace frugal::optim {

// ---- LRScheduler ----------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {}

void LRScheduler::initial_step() {
  base_lrs_.clear();
  for (ParamGroup& g : optimizer_.param_groups()) {
    if (!g.initial_lr) g.initial_lr = g.lr;
    base_lrs_.push_back(*g.initial_lr);
  }
  last_epoch_ = 0;
  apply(true);
}

void LRScheduler::step() {
  ++last_epoch_;
  try {
    apply(true);
  } catch (...) {  // lr_at refused the epoch (OneCycleLR past its end): nothing changed
    --last_epoch_;
    throw;
  }
}

void LRScheduler::apply(bool chain) {
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  FRUGAL_CHECK(groups.size() == base_lrs_.size(), "LRScheduler: the optimizer has ", groups.size(),
               " param groups, the scheduler was made for ", base_lrs_.size());
  const int64_t t = last_epoch_;
  std::vector<double> lrs(groups.size());  // all computed before any is set: lr_at may throw
  for (size_t g = 0; g < groups.size(); ++g) {
    const double base = base_lrs_[g], after = lr_at(base, t), lr = groups[g].lr;
    const double before = t == 0 ? base : lr_at(base, t - 1);
    double next = after;                       // the closed form: nothing else has moved this group's lr
    if (chain && chains(t) && lr != before) {  // Note [Chained schedulers]
      const double a = chain_anchor(t);
      next = after == before ? lr : before == a ? lr + (after - before) : a + (lr - a) * (after - a) / (before - a);
    }
    lrs[g] = next;
  }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].lr = lrs[g];
  last_lr_ = std::move(lrs);
}

// Note [A checkpoint names its schedule]
// A resumed run whose scheduler differs from the saved one (another class, or another T_max
// after --epochs was edited) would go on from last_epoch under the new schedule: the lr jumps
// and the run is no longer the one that was saved, with no error. PyTorch's load_state_dict
// copies the saved attributes over the new scheduler's, so there the saved T_max silently
// wins, and a scheduler of another class keeps its own settings. frugal saves schedule() as
// text and refuses a dict whose text differs, naming both, so the fix is plain: construct the
// scheduler as it was saved. To change the schedule on purpose when resuming, erase the
// "schedule" entry before loading; dicts saved before the entry existed have none and load
// unchecked, as do schedulers whose schedule() is "".

namespace {

/// A number in its shortest round-trip form.
std::string number(double value) {
  char digits[32];
  return std::string(digits, std::to_chars(digits, digits + sizeof digits, value).ptr);
}

/// "[a, b, ...]" of numbers in their shortest round-trip form.
template <typename T>
std::string list(const std::vector<T>& values) {
  std::string out = "[";
  for (size_t k = 0; k < values.size(); ++k) out += (k ? ", " : "") + number(double(values[k]));
  return out + "]";
}

/// "Name(key=value, ...)" with each number in its shortest round-trip form, so that equal
/// settings give equal text and different ones different text.
std::string describe(std::string_view name, std::initializer_list<std::pair<std::string_view, double>> settings) {
  std::string out(name);
  out += '(';
  bool first = true;
  for (const auto& [key, value] : settings) {
    out.append(first ? "" : ", ").append(key).append("=").append(number(value));
    first = false;
  }
  return out + ')';
}

}  // namespace

StateDict LRScheduler::state_dict() const {
  StateDict dict{{"last_epoch", scalar_tensor(double(last_epoch_), TensorOptions(kInt64))},
                 {"base_lrs", from_vector(base_lrs_, {int64_t(base_lrs_.size())}, TensorOptions(kFloat64))}};
  const std::string text = schedule();
  if (!text.empty())
    dict.emplace_back("schedule", from_vector(std::vector<int32_t>(text.begin(), text.end()), {int64_t(text.size())},
                                              TensorOptions(kInt32)));  // safetensors has no uint8 here
  return dict;
}

void LRScheduler::load_state_dict(const StateDict& dict) {
  Tensor epoch, bases, saved_schedule;
  for (const auto& [key, t] : dict) {
    if (key == "last_epoch") epoch = t;
    else if (key == "base_lrs") bases = t;
    else if (key == "schedule") saved_schedule = t;
    else FRUGAL_FAIL("LRScheduler.load_state_dict: unexpected key '", key, "'");
  }
  FRUGAL_CHECK(epoch.defined() && epoch.numel() == 1,
               "LRScheduler.load_state_dict: last_epoch must be a one-element tensor");
  FRUGAL_CHECK(bases.defined() && bases.dim() == 1, "LRScheduler.load_state_dict: base_lrs must be a 1-d tensor");
  const std::vector<double> b = bases.to(kCPU, kFloat64).tolist<double>();
  FRUGAL_CHECK(b.size() == optimizer_.param_groups().size(), "LRScheduler.load_state_dict: the state dict has ",
               b.size(), " base lrs, the optimizer has ", optimizer_.param_groups().size(), " param groups");
  const double e = epoch.to(kCPU, kFloat64).item<double>();
  FRUGAL_CHECK(e >= 0 && e == std::floor(e) && e < 9.007199254740992e15,  // a step count float64 holds exactly
               "LRScheduler.load_state_dict: last_epoch must be a non-negative integer below 2^53, got ", e);
  if (saved_schedule.defined()) {  // Note [A checkpoint names its schedule]
    FRUGAL_CHECK(saved_schedule.dtype() == kInt32 && saved_schedule.dim() == 1,
                 "LRScheduler.load_state_dict: schedule must be a 1-d int32 tensor (the text's characters), got ",
                 saved_schedule.describe());
    const std::vector<int32_t> chars = saved_schedule.tolist<int32_t>();
    const std::string saved(chars.begin(), chars.end()), mine = schedule();
    FRUGAL_CHECK(mine.empty() || saved == mine, "LRScheduler.load_state_dict: the state dict was saved by ", saved,
                 ", this scheduler is ", mine, "; construct the scheduler with the saved settings to resume, or erase ",
                 "the dict's \"schedule\" entry to change the schedule on purpose");
  }
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  std::vector<double> now(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) now[g] = groups[g].lr;
  const std::vector<double> set_by_me = last_lr_;
  std::vector<double> old_bases = std::exchange(base_lrs_, b);
  const int64_t old_epoch = std::exchange(last_epoch_, int64_t(e));
  try {
    apply(false);
  } catch (...) {  // an epoch the schedule does not reach: nothing changed
    base_lrs_ = std::move(old_bases);
    last_epoch_ = old_epoch;
    throw;
  }
  for (size_t g = 0; g < groups.size(); ++g) {  // Note [Loading a schedule leaves a loaded lr]
    if (g < set_by_me.size() && now[g] != set_by_me[g]) groups[g].lr = now[g];
    last_lr_[g] = groups[g].lr;
  }
}

// ---- the schedules ----------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, StepLROptions options) : LRScheduler(optimizer), options_(options) {
  FRUGAL_CHECK(options.step_size > 0, "StepLR: step_size must be positive, got ", options.step_size);
  initial_step();
}

double StepLR::lr_at(double base_lr, int64_t t) const {
  return base_lr * std::pow(options_.gamma, double(t / options_.step_size));
}

std::string StepLR::schedule() const {
  return describe("StepLR", {{"step_size", double(options_.step_size)}, {"gamma", options_.gamma}});
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, CosineAnnealingLROptions options)
    : LRScheduler(optimizer), options_(options) {
  FRUGAL_CHECK(options.T_max > 0, "CosineAnnealingLR: T_max must be positive, got ", options.T_max);
  initial_step();
}

double CosineAnnealingLR::lr_at(double base_lr, int64_t t) const {
  const double eta_min = options_.eta_min;
  return eta_min + (base_lr - eta_min) * (1.0 + std::cos(std::numbers::pi * double(t) / double(options_.T_max))) / 2.0;
}

std::string CosineAnnealingLR::schedule() const {
  return describe("CosineAnnealingLR", {{"T_max", double(options_.T_max)}, {"eta_min", options_.eta_min}});
}

LinearLR::LinearLR(Optimizer& optimizer, LinearLROptions options) : LRScheduler(optimizer), options_(options) {
  FRUGAL_CHECK(options.start_factor > 0 && options.start_factor <= 1, "LinearLR: start_factor must be in (0, 1], got ",
               options.start_factor);
  FRUGAL_CHECK(options.end_factor >= 0 && options.end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got ",
               options.end_factor);
  FRUGAL_CHECK(options.total_iters > 0, "LinearLR: total_iters must be positive, got ", options.total_iters);
  initial_step();
}

double LinearLR::lr_at(double base_lr, int64_t t) const {
  const LinearLROptions& o = options_;
  return base_lr * (o.start_factor +
                    (o.end_factor - o.start_factor) * double(std::min(o.total_iters, t)) / double(o.total_iters));
}

std::string LinearLR::schedule() const {
  const LinearLROptions& o = options_;
  return describe(
      "LinearLR",
      {{"start_factor", o.start_factor}, {"end_factor", o.end_factor}, {"total_iters", double(o.total_iters)}});
}

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  FRUGAL_CHECK(!schedulers_.empty(), "SequentialLR: needs at least one scheduler");
  FRUGAL_CHECK(milestones_.size() + 1 == schedulers_.size(), "SequentialLR: expected ", schedulers_.size() - 1,
               " milestones for ", schedulers_.size(), " schedulers, got ", milestones_.size());
  for (size_t k = 0; k < schedulers_.size(); ++k)
    FRUGAL_CHECK(schedulers_[k] && &schedulers_[k]->optimizer() == &optimizer, "SequentialLR: scheduler ", k,
                 " is not made on the same optimizer");
  for (size_t k = 0; k < milestones_.size(); ++k)
    FRUGAL_CHECK(milestones_[k] > (k == 0 ? 0 : milestones_[k - 1]), "SequentialLR: milestones must be positive and ",
                 "increasing, got ", milestones_[k], " at position ", k);
  // The parts' own initial steps moved the lr; PyTorch's SequentialLR puts it back to the
  // initial lr before its own first step, which is the first part's.
  for (ParamGroup& g : optimizer.param_groups())
    if (g.initial_lr) g.lr = *g.initial_lr;
  initial_step();
}

std::pair<const LRScheduler*, int64_t> SequentialLR::part_at(int64_t t) const {
  const size_t k = size_t(std::upper_bound(milestones_.begin(), milestones_.end(), t) - milestones_.begin());
  return {schedulers_[k].get(), k == 0 ? t : t - milestones_[k - 1]};
}

double SequentialLR::lr_at(double base_lr, int64_t t) const {
  const auto [part, local] = part_at(t);
  return part->lr_at(base_lr, local);
}

double SequentialLR::chain_anchor(int64_t t) const {
  const auto [part, local] = part_at(t);
  return part->chain_anchor(local);
}

bool SequentialLR::chains(int64_t t) const {
  const auto [part, local] = part_at(t);
  // At a milestone PyTorch steps the next part with step(0), which sets its closed form: a
  // decay another scheduler applied before the milestone is dropped there, not carried on.
  if (t > 0 && local == 0) return false;
  return part->chains(local);
}

std::string SequentialLR::schedule() const {
  std::string out = "SequentialLR(milestones=[";
  for (size_t k = 0; k < milestones_.size(); ++k) out += (k ? ", " : "") + std::to_string(milestones_[k]);
  out += "], schedulers=[";
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    const std::string part = schedulers_[k]->schedule();
    if (part.empty()) return "";  // a part that does not describe itself: the whole is not checked
    out += (k ? ", " : "") + part;
  }
  return out + "])";
}

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, WarmupCosineLROptions options)
    : LRScheduler(optimizer), options_(options) {
  FRUGAL_CHECK(options.warmup_steps >= 0 && options.total_steps > options.warmup_steps,
               "WarmupCosineLR: needs 0 <= warmup_steps < total_steps, got warmup_steps ", options.warmup_steps,
               " and total_steps ", options.total_steps);
  FRUGAL_CHECK(options.start_factor > 0 && options.start_factor <= 1,
               "WarmupCosineLR: start_factor must be in (0, 1], got ", options.start_factor);
  initial_step();
}

double WarmupCosineLR::lr_at(double base_lr, int64_t t) const {
  const WarmupCosineLROptions& o = options_;
  const int64_t w = o.warmup_steps;
  if (t < w) return base_lr * (o.start_factor + (1.0 - o.start_factor) * double(t) / double(w));
  const double T = double(o.total_steps - w);
  return o.eta_min + (base_lr - o.eta_min) * (1.0 + std::cos(std::numbers::pi * double(t - w) / T)) / 2.0;
}

std::string WarmupCosineLR::schedule() const {
  const WarmupCosineLROptions& o = options_;
  return describe("WarmupCosineLR", {{"warmup_steps", double(o.warmup_steps)},
                                     {"total_steps", double(o.total_steps)},
                                     {"start_factor", o.start_factor},
                                     {"eta_min", o.eta_min}});
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, ExponentialLROptions options)
    : LRScheduler(optimizer), options_(options) {
  FRUGAL_CHECK(options.gamma > 0, "ExponentialLR: gamma must be positive, got ", options.gamma);
  initial_step();
}

double ExponentialLR::lr_at(double base_lr, int64_t t) const { return base_lr * std::pow(options_.gamma, double(t)); }

std::string ExponentialLR::schedule() const { return describe("ExponentialLR", {{"gamma", options_.gamma}}); }

MultiStepLR::MultiStepLR(Optimizer& optimizer, MultiStepLROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  std::vector<int64_t>& m = options_.milestones;
  std::sort(m.begin(), m.end());
  // A negative milestone is never reached by PyTorch's steps but counts in its closed form.
  FRUGAL_CHECK(m.empty() || m.front() >= 0, "MultiStepLR: milestones must be non-negative, got ", m.front());
  initial_step();
}

double MultiStepLR::lr_at(double base_lr, int64_t t) const {
  const std::vector<int64_t>& m = options_.milestones;
  return base_lr * std::pow(options_.gamma, double(std::upper_bound(m.begin(), m.end(), t) - m.begin()));
}

std::string MultiStepLR::schedule() const {
  return "MultiStepLR(milestones=" + list(options_.milestones) + ", gamma=" + number(options_.gamma) + ")";
}

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(Optimizer& optimizer,
                                                         CosineAnnealingWarmRestartsOptions options)
    : LRScheduler(optimizer), options_(options) {
  FRUGAL_CHECK(options.T_0 > 0, "CosineAnnealingWarmRestarts: T_0 must be positive, got ", options.T_0);
  FRUGAL_CHECK(options.T_mult >= 1, "CosineAnnealingWarmRestarts: T_mult must be >= 1, got ", options.T_mult);
  initial_step();
}

double CosineAnnealingWarmRestarts::lr_at(double base_lr, int64_t t) const {
  const CosineAnnealingWarmRestartsOptions& o = options_;
  // PyTorch's step(): T_cur += 1, and at T_cur == T_i a restart (T_cur = 0, T_i *= T_mult);
  // counted in integers, not through its step(epoch) logarithm, which can round across a restart.
  int64_t T_i = o.T_0, T_cur = t;
  if (o.T_mult == 1) T_cur = t % o.T_0;
  else
    while (T_cur >= T_i) {
      T_cur -= T_i;
      T_i = T_i > std::numeric_limits<int64_t>::max() / o.T_mult ? std::numeric_limits<int64_t>::max() : T_i * o.T_mult;
    }
  return o.eta_min + (base_lr - o.eta_min) * (1.0 + std::cos(std::numbers::pi * double(T_cur) / double(T_i))) / 2.0;
}

std::string CosineAnnealingWarmRestarts::schedule() const {
  const CosineAnnealingWarmRestartsOptions& o = options_;
  return describe("CosineAnnealingWarmRestarts",
                  {{"T_0", double(o.T_0)}, {"T_mult", double(o.T_mult)}, {"eta_min", o.eta_min}});
}

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleLROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const OneCycleLROptions& o = options_;
  std::vector<ParamGroup>& groups = optimizer.param_groups();
  FRUGAL_CHECK(o.max_lr.size() == 1 || o.max_lr.size() == groups.size(), "OneCycleLR: max_lr has ", o.max_lr.size(),
               " values, the optimizer has ", groups.size(), " param groups (give one value, or one per group)");
  for (double m : o.max_lr) FRUGAL_CHECK(m > 0, "OneCycleLR: max_lr must be positive, got ", m);
  FRUGAL_CHECK(o.total_steps > 0, "OneCycleLR: total_steps must be positive, got ", o.total_steps);
  FRUGAL_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "OneCycleLR: pct_start must be in [0, 1], got ", o.pct_start);
  FRUGAL_CHECK(o.anneal_strategy == AnnealStrategy::Cos || o.anneal_strategy == AnnealStrategy::Linear,
               "OneCycleLR: anneal_strategy must be Cos or Linear, got ", int(o.anneal_strategy));
  FRUGAL_CHECK(o.div_factor > 0, "OneCycleLR: div_factor must be positive, got ", o.div_factor);
  FRUGAL_CHECK(o.final_div_factor > 0, "OneCycleLR: final_div_factor must be positive, got ", o.final_div_factor);
  lr_at(1.0, 0);  // throws, changing nothing, for an empty first phase (pct_start * total_steps == 1)
  // As PyTorch, the cycle sets the base itself, over any initial_lr an earlier scheduler set.
  for (size_t g = 0; g < groups.size(); ++g)
    groups[g].initial_lr = o.max_lr[o.max_lr.size() == 1 ? 0 : g] / o.div_factor;
  initial_step();
}

double OneCycleLR::lr_at(double base_lr, int64_t t) const {
  const OneCycleLROptions& o = options_;
  FRUGAL_CHECK(t <= o.total_steps, "OneCycleLR: tried to step ", t, " times, past the end of the cycle (total_steps ",
               o.total_steps, "); make the scheduler with total_steps covering every step");
  const double initial = base_lr, peak = base_lr * o.div_factor, low = base_lr / o.final_div_factor;
  const double T = double(o.total_steps), p = o.pct_start;
  struct Phase {
    double end_step, start_lr, end_lr;
  };
  // PyTorch's _schedule_phases, in its arithmetic.
  const Phase two[] = {{p * T - 1, initial, peak}, {T - 1, peak, low}};
  const Phase three[] = {{p * T - 1, initial, peak}, {2 * p * T - 2, peak, initial}, {T - 1, initial, low}};
  const Phase* phases = o.three_phase ? three : two;
  const size_t n = o.three_phase ? 3 : 2;
  double start = 0;
  for (size_t i = 0;; ++i) {
    const Phase& phase = phases[i];
    if (double(t) <= phase.end_step || i + 1 == n) {
      FRUGAL_CHECK(phase.end_step != start, "OneCycleLR: step ", t, " falls in phase ", i,
                   " of the cycle, which has no steps (pct_start * total_steps = ", p * T, ")");
      const double pct = (double(t) - start) / (phase.end_step - start);
      return o.anneal_strategy == AnnealStrategy::Cos
                 ? phase.end_lr + (phase.start_lr - phase.end_lr) / 2.0 * (std::cos(std::numbers::pi * pct) + 1)
                 : (phase.end_lr - phase.start_lr) * pct + phase.start_lr;
    }
    start = phase.end_step;
  }
}

std::string OneCycleLR::schedule() const {
  const OneCycleLROptions& o = options_;
  const std::string rest = describe("", {{"total_steps", double(o.total_steps)},
                                         {"pct_start", o.pct_start},
                                         {"div_factor", o.div_factor},
                                         {"final_div_factor", o.final_div_factor},
                                         {"three_phase", double(o.three_phase)}});
  return "OneCycleLR(max_lr=" + list(o.max_lr) +
         ", anneal_strategy=" + (o.anneal_strategy == AnnealStrategy::Cos ? "cos" : "linear") + ", " + rest.substr(1);
}

}  // namespace frugal::optim
