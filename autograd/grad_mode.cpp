#include "autograd/grad_mode.h"

namespace frugal::autograd {

// Note [Probed grad mode]
// checkpoint() runs its function with nothing recorded, yet must know whether the function
// used a tensor that requires grad (a captured parameter) in an op that would have recorded
// it. A NoGradGuard the function opens itself (an EMA of a weight, a statistic) makes the uses
// inside it no uses: PyTorch's checkpoint records nothing for them either. So the mode is a
// word of two bits, kRecords and kProbed (records but for the probe): a GradUseProbe turns
// kRecords into kProbed, a NoGradGuard clears both, EnableGradGuard sets kRecords, and every
// guard restores the whole word it found, so a use after the function's own guard closed
// counts again.

namespace {
constexpr unsigned kRecords = 1, kProbed = 2;
thread_local unsigned grad_mode = kRecords;
thread_local bool anomaly_enabled = false;
thread_local GradUseProbe* active_probe = nullptr;  // the innermost on this thread
}  // namespace

bool is_grad_enabled() { return (grad_mode & kRecords) != 0; }
void set_grad_enabled(bool enabled) { grad_mode = enabled ? kRecords : 0; }
unsigned detail::grad_mode_word() { return grad_mode; }
void detail::set_grad_mode_word(unsigned word) { grad_mode = word; }

GradUseProbe::GradUseProbe() : outer_(active_probe), prev_mode_(grad_mode) {
  active_probe = this;
  grad_mode = grad_mode != 0 ? kProbed : 0;  // recording off; a use counts where it would have recorded
}
GradUseProbe::~GradUseProbe() {
  active_probe = outer_;
  grad_mode = prev_mode_;
  if (outer_ && saw_) outer_->saw_ = true;
}
bool probing_grad_use() { return active_probe != nullptr; }
void note_grad_use() {
  if (active_probe && (grad_mode & kProbed) != 0) active_probe->saw_ = true;
}
bool is_anomaly_enabled() { return anomaly_enabled; }
void set_anomaly_enabled(bool enabled) { anomaly_enabled = enabled; }

}  // namespace frugal::autograd
