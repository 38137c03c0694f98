#pragma once
// Thread-local autograd modes (the only global mutable state besides autocast).
namespace frugal::autograd {

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

/// Disables graph recording for its scope (inference, optimizer steps).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Re-enables recording inside a NoGradGuard (checkpoint recompute uses it).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

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
