#pragma once
// Thread-local autograd modes (the only global mutable state besides autocast).
namespace frugal::autograd {

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

namespace detail {
/// The thread's whole grad mode, which the guards save and restore: bit 0, ops record; bit 1,
/// they would record but for an active GradUseProbe (Note [Probed grad mode]).
unsigned grad_mode_word();
void set_grad_mode_word(unsigned word);
}  // namespace detail

/// Disables graph recording for its scope (inference, optimizer steps).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(detail::grad_mode_word()) { set_grad_enabled(false); }
  ~NoGradGuard() { detail::set_grad_mode_word(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  unsigned prev_;
};

/// Re-enables recording inside a NoGradGuard (checkpoint recompute uses it).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(detail::grad_mode_word()) { set_grad_enabled(true); }
  ~EnableGradGuard() { detail::set_grad_mode_word(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  unsigned prev_;
};

/// Runs its scope with grad mode off, noting on this thread whether an op there that would
/// have recorded was handed a tensor that requires grad (a trainable parameter the code
/// captured): checkpoint runs its function under one and records a node only when the function
/// used one or an input requires grad (Note [Checkpoint recompute]). A use under a NoGradGuard
/// inside the scope is no use, as it would record nothing (Note [Probed grad mode]). Nested
/// probes report to the enclosing one.
class GradUseProbe {
 public:
  GradUseProbe();
  ~GradUseProbe();
  GradUseProbe(const GradUseProbe&) = delete;
  GradUseProbe& operator=(const GradUseProbe&) = delete;
  bool saw_grad() const { return saw_; }

 private:
  friend void note_grad_use();
  bool saw_ = false;
  GradUseProbe* outer_;
  unsigned prev_mode_;
};

/// True while a GradUseProbe is active on this thread (the no-grad paths of make_node and
/// needs_grad then look at their inputs).
bool probing_grad_use();
/// Tells the active probe that a tensor requiring grad was used (ignored under a NoGradGuard
/// opened inside the probe's scope).
void note_grad_use();

/// Anomaly mode: when on, a NaN or Inf produced in backward throws, naming the
/// forward op whose backward produced it.
bool is_anomaly_enabled();
void set_anomaly_enabled(bool enabled);

class AnomalyGuard {
 public:
  AnomalyGuard() : prev_(is_anomaly_enabled()) { set_anomaly_enabled(true); }
  ~AnomalyGuard() { set_anomaly_enabled(prev_); }
  AnomalyGuard(const AnomalyGuard&) = delete;
  AnomalyGuard& operator=(const AnomalyGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace frugal::autograd

namespace frugal {
using autograd::NoGradGuard;
}
