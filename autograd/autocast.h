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
// binary ops, where, cat and stack promote natively, as torch.result_type (Note [0-d
// operands in promotion] in tensor/dtype.h). Casts of
// leaf tensors that require grad (parameters) are cached while an AutocastGuard is alive,
// so a weight used by many calls is cast once.
#include <initializer_list>
#include <optional>
#include <vector>

#include "core/device.h"
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

/// Drops the cached casts of parameters (done when the outermost guard exits).
void clear_cache();
/// How many parameter casts are cached (for tests and memory accounting).
size_t cache_size();
/// True when `t` views the storage of a parameter cast cached on this thread: memory the
/// cache holds anyway, so saved-tensor hooks that move or compress tensors leave it alone
/// (autograd/offload.h, Note [Compressed saved tensors] in autograd/compress.h).
bool is_cached_cast(const Tensor& t);

/// What an op does with its floating inputs under autocast (Note [Autocast]).
enum class Policy {
  Lower,    ///< to the autocast dtype: matmul, linear, conv2d, attention
  Float32,  ///< float16/bfloat16 up to float32: softmax, norms, losses, sums, exp/log/pow
};

namespace detail {
extern thread_local constinit bool any_enabled;  // autocast is on for some device type on this thread
std::optional<std::vector<Tensor>> cast_inputs(Policy policy, std::initializer_list<const Tensor*> inputs);
}  // namespace detail

/// The inputs cast as `policy` says, or nullopt when nothing changes (autocast off on this
/// thread, or every input already fine); then the op goes on with its own arguments. Only
/// floating tensors (not float64) on a device type with autocast on are cast; undefined
/// ones stay undefined. Each op calls it first and, given casts, calls itself again:
///   if (auto c = autocast::cast_inputs(Policy::Lower, {&x, &w})) return linear((*c)[0], (*c)[1]);
inline std::optional<std::vector<Tensor>> cast_inputs(Policy policy, std::initializer_list<const Tensor*> inputs) {
  if (!detail::any_enabled) return std::nullopt;  // the whole cost outside autocast
  return detail::cast_inputs(policy, inputs);
}

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
