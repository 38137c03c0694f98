#include "optim/lr_scheduler_plateau.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "tensor/factory.h"

namespace frugal::optim {

namespace {

std::string number(double value) {
  char digits[32];
  return std::string(digits, std::to_chars(digits, digits + sizeof digits, value).ptr);
}

std::vector<double> group_lrs(const Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const ParamGroup& g : optimizer.param_groups()) lrs.push_back(g.lr);
  return lrs;
}

}  // namespace

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : optimizer_(optimizer), options_(std::move(options)), last_lr_(group_lrs(optimizer)) {
  const ReduceLROnPlateauOptions& o = options_;
  FRUGAL_CHECK(o.mode == PlateauMode::Min || o.mode == PlateauMode::Max,
               "ReduceLROnPlateau: mode must be Min or Max, got ", int(o.mode));
  FRUGAL_CHECK(o.threshold_mode == ThresholdMode::Rel || o.threshold_mode == ThresholdMode::Abs,
               "ReduceLROnPlateau: threshold_mode must be Rel or Abs, got ", int(o.threshold_mode));
  FRUGAL_CHECK(o.factor >= 0 && o.factor < 1, "ReduceLROnPlateau: factor must be in [0, 1), got ", o.factor);
  FRUGAL_CHECK(o.patience >= 0, "ReduceLROnPlateau: patience must be non-negative, got ", o.patience);
  FRUGAL_CHECK(o.threshold >= 0, "ReduceLROnPlateau: threshold must be non-negative, got ", o.threshold);
  FRUGAL_CHECK(o.cooldown >= 0, "ReduceLROnPlateau: cooldown must be non-negative, got ", o.cooldown);
  FRUGAL_CHECK(o.eps >= 0, "ReduceLROnPlateau: eps must be non-negative, got ", o.eps);
  const size_t groups = optimizer.param_groups().size();
  FRUGAL_CHECK(o.min_lr.size() == 1 || o.min_lr.size() == groups, "ReduceLROnPlateau: min_lr has ", o.min_lr.size(),
               " values, the optimizer has ", groups, " param groups (give one value, or one per group)");
  for (double m : o.min_lr) FRUGAL_CHECK(m >= 0, "ReduceLROnPlateau: min_lr must be non-negative, got ", m);
  best_ =
      o.mode == PlateauMode::Min ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

bool ReduceLROnPlateau::is_better(double metric) const {
  const ReduceLROnPlateauOptions& o = options_;
  const bool rel = o.threshold_mode == ThresholdMode::Rel;
  if (o.mode == PlateauMode::Min) return metric < (rel ? best_ * (1.0 - o.threshold) : best_ - o.threshold);
  return metric > (rel ? best_ * (o.threshold + 1.0) : best_ + o.threshold);
}

void ReduceLROnPlateau::step(double metric) {
  const ReduceLROnPlateauOptions& o = options_;
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  FRUGAL_CHECK(o.min_lr.size() == 1 || o.min_lr.size() == groups.size(), "ReduceLROnPlateau: the optimizer has ",
               groups.size(), " param groups, min_lr was given for ", o.min_lr.size());
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (in_cooldown()) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad epochs in the cooldown do not count
  }
  if (num_bad_epochs_ > o.patience) {
    for (size_t g = 0; g < groups.size(); ++g) {
      const double old_lr = groups[g].lr;
      const double new_lr = std::max(old_lr * o.factor, o.min_lr[o.min_lr.size() == 1 ? 0 : g]);
      if (old_lr - new_lr > o.eps) groups[g].lr = new_lr;
    }
    cooldown_counter_ = o.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_ = group_lrs(optimizer_);
}

std::string ReduceLROnPlateau::schedule() const {
  const ReduceLROnPlateauOptions& o = options_;
  std::string min_lr = "[";
  for (size_t k = 0; k < o.min_lr.size(); ++k) min_lr += (k ? ", " : "") + number(o.min_lr[k]);
  return "ReduceLROnPlateau(mode=" + std::string(o.mode == PlateauMode::Min ? "min" : "max") +
         ", factor=" + number(o.factor) + ", patience=" + number(double(o.patience)) +
         ", threshold=" + number(o.threshold) +
         ", threshold_mode=" + (o.threshold_mode == ThresholdMode::Rel ? "rel" : "abs") +
         ", cooldown=" + number(double(o.cooldown)) + ", min_lr=" + min_lr + "], eps=" + number(o.eps) + ")";
}

StateDict ReduceLROnPlateau::state_dict() const {
  auto count = [](int64_t n) { return scalar_tensor(double(n), TensorOptions(kInt64)); };
  const std::string text = schedule();
  return {{"last_epoch", count(last_epoch_)},
          {"num_bad_epochs", count(num_bad_epochs_)},
          {"cooldown_counter", count(cooldown_counter_)},
          {"best", scalar_tensor(best_, TensorOptions(kFloat64))},
          {"last_lr", from_vector(last_lr_, {int64_t(last_lr_.size())}, TensorOptions(kFloat64))},
          {"schedule",
           from_vector(std::vector<int32_t>(text.begin(), text.end()), {int64_t(text.size())}, TensorOptions(kInt32))}};
}

void ReduceLROnPlateau::load_state_dict(const StateDict& dict) {
  Tensor epoch, bad, cooldown, best, lrs, saved_schedule;
  for (const auto& [key, t] : dict) {
    if (key == "last_epoch") epoch = t;
    else if (key == "num_bad_epochs") bad = t;
    else if (key == "cooldown_counter") cooldown = t;
    else if (key == "best") best = t;
    else if (key == "last_lr") lrs = t;
    else if (key == "schedule") saved_schedule = t;
    else FRUGAL_FAIL("ReduceLROnPlateau.load_state_dict: unexpected key '", key, "'");
  }
  // A count: a non-negative integer that float64 holds exactly.
  auto count = [](const Tensor& t, const char* name) {
    FRUGAL_CHECK(t.defined() && t.numel() == 1, "ReduceLROnPlateau.load_state_dict: ", name,
                 " must be a one-element tensor");
    const double v = t.to(kCPU, kFloat64).item<double>();
    FRUGAL_CHECK(v >= 0 && v == std::floor(v) && v < 9.007199254740992e15, "ReduceLROnPlateau.load_state_dict: ", name,
                 " must be a non-negative integer below 2^53, got ", v);
    return int64_t(v);
  };
  const int64_t e = count(epoch, "last_epoch"), b = count(bad, "num_bad_epochs"),
                c = count(cooldown, "cooldown_counter");
  FRUGAL_CHECK(best.defined() && best.numel() == 1,
               "ReduceLROnPlateau.load_state_dict: best must be a one-element tensor");
  FRUGAL_CHECK(lrs.defined() && lrs.dim() == 1, "ReduceLROnPlateau.load_state_dict: last_lr must be a 1-d tensor");
  const std::vector<double> l = lrs.to(kCPU, kFloat64).tolist<double>();
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  FRUGAL_CHECK(l.size() == groups.size(), "ReduceLROnPlateau.load_state_dict: the state dict has ", l.size(),
               " lrs, the optimizer has ", groups.size(), " param groups");
  FRUGAL_CHECK(saved_schedule.defined(), "ReduceLROnPlateau.load_state_dict: the state dict has no schedule");
  FRUGAL_CHECK(saved_schedule.dtype() == kInt32 && saved_schedule.dim() == 1,
               "ReduceLROnPlateau.load_state_dict: schedule must be a 1-d int32 tensor (the text's characters), got ",
               saved_schedule.describe());
  const std::vector<int32_t> chars = saved_schedule.tolist<int32_t>();
  const std::string saved(chars.begin(), chars.end()), mine = schedule();
  FRUGAL_CHECK(saved == mine, "ReduceLROnPlateau.load_state_dict: the state dict was saved by ", saved,
               ", this scheduler is ", mine, "; construct the scheduler with the saved settings to resume");
  last_epoch_ = e;
  num_bad_epochs_ = b;
  cooldown_counter_ = c;
  best_ = best.to(kCPU, kFloat64).item<double>();
  for (size_t g = 0; g < groups.size(); ++g)  // Note [Loading a schedule leaves a loaded lr] in lr_scheduler.h
    if (g >= last_lr_.size() || groups[g].lr == last_lr_[g]) groups[g].lr = l[g];
  last_lr_ = group_lrs(optimizer_);
}

}  // namespace frugal::optim
