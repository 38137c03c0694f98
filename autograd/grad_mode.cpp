#include "autograd/grad_mode.h"

namespace frugal::autograd {

namespace {
thread_local bool grad_enabled = true;
thread_local bool anomaly_enabled = false;
thread_local GradUseProbe* active_probe = nullptr;  // the innermost on this thread
}  // namespace

bool is_grad_enabled() { return grad_enabled; }

GradUseProbe::GradUseProbe() : outer_(active_probe) { active_probe = this; }
GradUseProbe::~GradUseProbe() {
  active_probe = outer_;
  if (outer_ && saw_) outer_->saw_ = true;
}
bool probing_grad_use() { return active_probe != nullptr; }
void note_grad_use() {
  if (active_probe) active_probe->saw_ = true;
}
void set_grad_enabled(bool enabled) { grad_enabled = enabled; }
bool is_anomaly_enabled() { return anomaly_enabled; }
void set_anomaly_enabled(bool enabled) { anomaly_enabled = enabled; }

}  // namespace frugal::autograd
