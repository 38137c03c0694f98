#pragma once
// Dynamic loss scaling for mixed-precision training, as torch.amp.GradScaler.
//
//   optim::GradScaler scaler;                 // init_scale 2^16, x2 every 2000 clean steps
//   for (...) {
//     opt.zero_grad();
//     Tensor loss = ...;                      // forward under autocast
//     scaler.scale(loss).backward();          // gradients are scale * dloss/dparam
//     scaler.unscale_(opt);                   // optional: before clip_grad_norm_
//     scaler.step(opt);                       // skipped if any gradient is inf or NaN
//     scaler.update();                        // back off on overflow, grow when clean
//   }
//
// Note [Dynamic loss scaling]
// Small gradients underflow in float16. Multiplying the loss by a large `scale` moves
// every gradient up by the same factor (exactly: scale is a power of two unless the user
// picks otherwise), and unscale_ divides it back out before the optimizer sees it. If
// the scale is too large some gradient overflows to inf (or becomes NaN): then the step
// is skipped and update() multiplies the scale by backoff_factor. After growth_interval
// consecutive steps without overflow, update() multiplies it by growth_factor (kept
// unless the product overflows float32). The rule, PyTorch's _amp_update_scale_:
//   found_inf:  scale *= backoff_factor; growth_tracker = 0
//   otherwise:  if (++growth_tracker == growth_interval) { scale *= growth_factor; growth_tracker = 0; }
// The scale is a float32 and its products are rounded to float32, as PyTorch's.
//
// Note [GradScaler host state]
// The scale and the growth tracker start on the host (PyTorch keeps them in device
// tensors). scale(loss) is then a multiply by a host scalar, unscale_ passes 1/scale as
// a kernel argument, and update() is host arithmetic: none of them waits for the device.
// What the host cannot know without waiting is whether a gradient overflowed: unscale_
// writes that into a device-side found_inf flag (a 0-d float32 per device, set to 1 by
// any thread that sees inf or NaN), and an optimizer that must know on the host (Adam
// without capturable, a CPU optimizer) has step() read it - the one host sync per step,
// the same one PyTorch makes with `.item()` in GradScaler.step. update() reuses the value
// step() read; only when update() follows unscale_ without a step() does it read the flag
// itself (still one sync).
// Where the flag need not reach the host, the step has no sync at all: with an optimizer
// that skips its step on a device flag (SGD; Adam/AdamW made with capturable) and every
// parameter on the one CUDA device that has gradients, step() queues
// opt.step_skipping_if(found_inf), and update() runs the update on the device as a
// captured update does (Note [GradScaler in a CUDA graph]; the device copies own the scale
// from then on). The host then queues the optimizer while the device still runs the
// backward, instead of waiting for it and leaving the device idle for the optimizer's
// host time (ResNet-50 b128 AMP on an H200: 0.8 of a 19.8 ms step).
//
// Note [GradScaler in a CUDA graph]
// A captured kernel keeps the scalar arguments it had (Note [CUDA graphs]), so scale(loss)
// inside a capture multiplies by a 0-d float32 copy of the scale in device memory instead:
// made by the first scale() outside a capture on that device (warm-up), rewritten by
// update(), update(new_scale) and load_state_dict whenever the scale changes (a fill queued
// on the current stream, so it lands before the next replay), and read by each replay's
// backward. For a power-of-two scale both multiplies give the same bits.
// The whole step may be captured too, as PyTorch's capturable optimizers allow, with an
// optimizer that can skip its step on a device flag (Optimizer::skips_on_device_flag: SGD):
// - unscale_ (or step's) passes the kernel the device scale, whose reciprocal it takes as
//   the host would, and its found_inf flag is zeroed by the captured work of each replay;
// - step calls opt.step_skipping_if(found_inf): the fused kernel returns when it is set;
// - update runs PyTorch's _amp_update_scale_ on the device copy of the scale and a device
//   copy of the growth tracker (made with the scale's), one thread, no host read.
// From the first replay of a captured update on (or the first eager update made on the
// device, Note [GradScaler host state]), the device copies are the truth (device_owns_): a
// replay check writes the host's values into them before that replay (the eager warm-up
// steps moved them since the copies were made), and afterwards get_scale,
// get_growth_tracker and state_dict read them back (a host sync), as do scale() of a CPU
// loss and update(new_scale) (which keeps the tracker); an eager update that cannot run on
// the device reads them, updates on the host and writes them back; update(new_scale) and
// load_state_dict write them. A scale multiplied on the device keeps the loss's dtype. Inside a capture the scaler
// takes one optimizer and one device per update, and it must outlive the graph (the replay check refers to it). Outside
// these rules unscale_, step and update refuse inside a capture, naming the rule.
//
// Note [Fused unscale]
// unscale_ walks every gradient of every param group of the optimizer and, per (device,
// dtype), makes ONE multi-tensor launch (Note [Multi-tensor launch] in optim/multi_tensor.h)
// that multiplies each element by inv_scale = float(1 / double(scale)) in opmath_t (float
// for 16-bit gradients, double for float64 ones; a multiply by 1 is skipped) and raises
// the device's found_inf flag on a non-finite element - PyTorch's
// _amp_foreach_non_finite_check_and_unscale_. The CPU runs the same rule in a loop. A
// gradient that is not dense (Note [Optimizer memory order]) is unscaled through a contiguous
// copy that is written back.
// Unlike PyTorch, float16 gradients are accepted (PyTorch refuses them in unscale_
// because a float16 master weight is a mistake; here 16-bit parameters are allowed and
// their update is computed in float, see Note [Optimizer state dtype]).
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "optim/multi_tensor.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace frugal::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;     ///< the first scale (> 0, finite); stored as float32
  double growth_factor = 2.0;      ///< > 1
  double backoff_factor = 0.5;     ///< in (0, 1)
  int64_t growth_interval = 2000;  ///< clean steps between growths, >= 1
  bool enabled = true;             ///< false: every method is a pass-through (step() just steps)
  /// Sharded training: called by unscale_ with each device's found_inf flag (0-d float32, 1
  /// where this process saw a non-finite gradient) before anything reads it. FSDP's shards
  /// see only their part of each gradient, so an inf in one rank's shard must reach every
  /// rank, or that rank alone skips its step (PyTorch's ShardedGradScaler all-reduces it):
  /// pass FullyShardedDataParallel::found_inf_sync(). Every rank must have gradients on the
  /// same devices; not inside a CUDA graph capture.
  std::function<void(const Tensor& found_inf)> sync_found_inf{};
};

/// Dynamic loss scaler (see Note [Dynamic loss scaling]). Works with any number of
/// optimizers: each may be unscaled and stepped once between two update() calls.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// loss * scale, differentiable (the backward multiplies every gradient by scale).
  /// Returns `loss` itself when disabled.
  Tensor scale(const Tensor& loss) const;

  /// Divides every gradient of `opt` by the scale in place and records, on the device,
  /// whether any was inf or NaN (Note [Fused unscale]); no host sync. Throws if called
  /// twice for `opt` since the last update(), or after step(opt).
  void unscale_(Optimizer& opt);

  /// unscale_(opt) unless already done, then opt.step() unless a gradient was inf or NaN:
  /// one host sync, or none with an optimizer that skips on the device flag (Note
  /// [GradScaler host state]). Throws if called twice for `opt` since
  /// the last update(), or if `opt` has no gradient at all.
  void step(Optimizer& opt);

  /// Adjusts the scale (Note [Dynamic loss scaling]) from every optimizer unscaled since
  /// the last update() and starts a new iteration. Throws if none was.
  void update();
  /// Sets the scale to `new_scale` (> 0, finite) instead, and starts a new iteration; the
  /// growth tracker is kept, as in PyTorch's update(new_scale).
  void update(double new_scale);

  /// The current scale (1.0 when disabled); once the device owns it (scale_on_device()), read from
  /// the device (Note [GradScaler in a CUDA graph]).
  double get_scale() const;
  /// Consecutive clean steps since the last growth or backoff (read as get_scale).
  int64_t get_growth_tracker() const;
  bool is_enabled() const { return options_.enabled; }
  /// Whether the device copies hold the scale (Note [GradScaler host state]): then
  /// get_scale() and get_growth_tracker() wait for the device.
  bool scale_on_device() const { return device_owns_; }
  const GradScalerOptions& options() const { return options_; }

  /// PyTorch's keys, as 0-d tensors: scale, growth_factor, backoff_factor (float64),
  /// growth_interval, _growth_tracker (int64). Empty when disabled.
  StateDict state_dict() const;
  /// Loads a state_dict(): all five keys and no others. Checks everything first and
  /// changes nothing when it throws. A no-op when disabled; an empty dict throws.
  void load_state_dict(const StateDict& dict);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  /// What this iteration did to one optimizer.
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    std::vector<Tensor> found_inf;  ///< one 0-d float32 flag per device that had gradients
    int found = -1;                 ///< the flags read on the host: -1 not yet, else 0 or 1
  };
  /// Reads (once) whether any of `st`'s flags is set: the host sync.
  static bool read_found_inf(PerOptimizer& st);
  /// Whether step() can leave the skip to `opt`'s kernel: it skips on a device flag, and
  /// its gradients and parameters are on the one CUDA device of `st`'s flag.
  static bool skips_on_device(const Optimizer& opt, const PerOptimizer& st);
  /// An eager update() without a host sync, when this iteration recorded one CUDA flag the
  /// host has not read and the scale has one device copy: false (nothing done) otherwise.
  bool update_on_device();
  /// The scale as a 0-d float32 on `device` (Note [GradScaler in a CUDA graph]).
  Tensor device_scale(Device device) const;
  /// Writes scale_ into every device copy, when it differs from what they hold (or, once
  /// the device owns the scale, writes both scale_ and growth_tracker_: push()).
  void refresh_device_scales() const;
  /// Once the device owns the scale: reads it and the growth tracker into scale_ and
  /// growth_tracker_ (a host sync); a no-op otherwise.
  void pull() const;
  /// Writes scale_ and growth_tracker_ into the device copies.
  void push() const;
  /// update() inside a capture (Note [GradScaler in a CUDA graph]).
  void captured_update();

  GradScalerOptions options_;
  mutable float scale_;  // mutable: pull() refreshes them from the device
  mutable int64_t growth_tracker_ = 0;
  std::unordered_map<const Optimizer*, PerOptimizer> per_optimizer_;
  mutable std::vector<Tensor> device_scales_;  // Note [GradScaler in a CUDA graph]
  mutable Tensor device_tracker_;              // 0-d int64 beside the first device copy
  mutable float device_value_ = 0.0f;          // the scale every device copy holds
  bool device_owns_ = false;                   // the device copies hold the scale (Note [GradScaler in a CUDA graph])
  const void* checked_capture_ = nullptr;      // the capture whose replay check is registered
};

}  // namespace frugal::optim

// ---- backends of unscale_ (internal to optim/) --------------------------------------

namespace frugal::optim::cpu {
/// x = x * inv_scale for every entry's (numel) elements of `dtype` (skipped when inv_scale
/// is 1); *found_inf = 1 if any element was inf or NaN before scaling.
void non_finite_check_and_unscale(DType dtype, const std::vector<detail::NormEntry>& entries, float inv_scale,
                                  float* found_inf);
}  // namespace frugal::optim::cpu

namespace frugal::optim::cuda {
/// The same in one fused kernel over every entry (all on `device`); found_inf is a 0-d
/// float32 in device memory. With device_scale (the scale in device memory) the kernel
/// computes the reciprocal itself and inv_scale is unused. Asynchronous on the device's
/// current stream.
void non_finite_check_and_unscale(Device device, DType dtype, std::vector<detail::NormEntry>& entries, float inv_scale,
                                  float* found_inf, const float* device_scale = nullptr);
/// Note [Dynamic loss scaling]'s update of *scale and *growth_tracker (device memory) from
/// *found_inf, in one single-thread kernel: the update of a captured step.
void update_scale(Device device, float* scale, int64_t* growth_tracker, const float* found_inf, double growth_factor,
                  double backoff_factor, int64_t growth_interval);
}  // namespace frugal::optim::cuda
