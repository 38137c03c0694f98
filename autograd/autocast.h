#pragma once
// Automatic mixed precision (see Note [Autocast] in autograd/autocast.cpp).
//
//   {
//     AutocastGuard amp(kCUDA, DType::Float16);  // matmuls, convs, attention in fp16
//     Tensor loss = criterion(model(x), y);      // softmax, norms, losses in fp32
//   }
//   scaler.scale(loss).backward();               // grads arrive in fp32, like the weights
//
// Per-op policy, as torch.autocast: ops of the "lower" list cast their floating inputs
// to the autocast dtype; ops of the "fp32" list cast low-precision inputs up to float32;
// binary ops promote to the widest input dtype. Casts of leaf tensors that require grad
// (parameters) are cached for the lifetime of the outermost enabled guard, so a weight
// used by many calls is cast once.
#include "memory/device.h"
#include "tensor/tensor.h"

namespace frugal::autocast {

/// Whether autocast is on for `type` on this thread.
bool is_enabled(DeviceType type);
/// The low-precision dtype autocast uses for `type` (Float16 or BFloat16).
DType dtype(DeviceType type);

/// The autocast state of one device type, for code that must replay it (checkpoint).
struct State {
  bool enabled = false;
  DType dtype = DType::Float16;
};
State state(DeviceType type);
void set_state(DeviceType type, State s);

/// Drops the cached casts of parameters (done when the outermost enabled guard exits).
void clear_cache();

}  // namespace frugal::autocast

namespace frugal {

/// Turns autocast on (or, with enabled=false, off) for device.type on this thread while it
/// lives; nests, restoring the outer state. dtype must be Float16 or BFloat16.
class AutocastGuard {
 public:
  AutocastGuard(Device device, DType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType type_;
  autocast::State outer_;
};

}  // namespace frugal
