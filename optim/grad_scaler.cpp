#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/ops/binary.h"
#include "core/graph_capture.h"
#include "optim/step_util.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/fill.h"

namespace frugal::optim {

namespace {

/// Throws unless `o` is a valid configuration (the scale is checked separately).
void check_options(const GradScalerOptions& o, const char* op) {
  FRUGAL_CHECK(o.growth_factor > 1.0 && std::isfinite(o.growth_factor), op,
               ": growth_factor must be a finite number > 1, got ", o.growth_factor);
  FRUGAL_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, op, ": backoff_factor must be in (0, 1), got ",
               o.backoff_factor);
  FRUGAL_CHECK(o.growth_interval >= 1, op, ": growth_interval must be >= 1, got ", o.growth_interval);
}

/// The scale as a float32, checked positive and finite.
float checked_scale(double s, const char* op, const char* what) {
  const float f = float(s);
  FRUGAL_CHECK(f > 0.0f && std::isfinite(f), op, ": ", what, " must be positive and finite in float32, got ", s);
  return f;
}

/// The value of a one-element numeric tensor from a state dict.
double scalar_of(const std::string& key, const Tensor& t) {
  FRUGAL_CHECK(t.defined() && t.numel() == 1 && t.dtype() != kBool, "GradScaler.load_state_dict: ", key,
               " must be a one-element number, got ", t.defined() ? t.describe() : std::string("an undefined tensor"));
  return t.to(kCPU, kFloat64).item<double>();
}

/// An integer value from a state dict (growth_interval, _growth_tracker).
int64_t integer_of(const std::string& key, const Tensor& t) {
  const double v = scalar_of(key, t);
  FRUGAL_CHECK(v == std::floor(v) && std::fabs(v) < 9.007199254740992e15, "GradScaler.load_state_dict: ", key,
               " must be an integer, got ", v);
  return int64_t(v);
}

// What a captured step needs (Note [GradScaler in a CUDA graph]).
constexpr const char* kCaptureRule =
    "inside a CUDA graph capture GradScaler takes one optimizer that skips its step on the device (SGD, or Adam/AdamW "
    "made with capturable) and "
    "gradients on the captured device; otherwise capture the forward and scaler.scale(loss).backward(), and call "
    "scaler.step and update after replay()";

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  check_options(options_, "GradScaler");
  scale_ = checked_scale(options_.init_scale, "GradScaler", "init_scale");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  FRUGAL_CHECK(loss.defined(), "GradScaler.scale: got an undefined tensor");
  if (!options_.enabled) return loss;
  FRUGAL_CHECK(loss.is_floating_point(), "GradScaler.scale: the loss must be floating point, got ", loss.describe());
  if (loss.device().is_cuda()) {  // Note [GradScaler in a CUDA graph]
    const Tensor s = device_scale(loss.device());
    if (core::current_graph_capture() || device_owns_) {  // read on the device
      // In the loss's dtype, as the host scalar's multiply (a 0-d float32 would promote a 16-bit loss).
      const Tensor scaled = frugal::mul(loss, s);
      return scaled.dtype() == loss.dtype() ? scaled : scaled.to(loss.dtype());
    }
  }
  pull();                                    // a CPU loss once the device owns the scale
  return frugal::mul(loss, double(scale_));  // differentiable: backward multiplies by scale_
}

Tensor GradScaler::device_scale(Device device) const {
  for (const Tensor& s : device_scales_)
    if (s.device() == device) return s;
  core::refuse_in_graph_capture("GradScaler.scale's first call on a device",
                                "the device copy of the scale is made outside a capture (warm up at least one step)");
  pull();                          // once the device owns the scale, a new copy starts from its value
  device_value_ = scale_;          // what the other copies hold too (refresh_device_scales)
  if (!device_tracker_.defined())  // for a captured update; written before its first replay
    device_tracker_ = full({}, double(growth_tracker_), TensorOptions(kInt64, device));
  return device_scales_.emplace_back(full({}, double(scale_), TensorOptions(kFloat32, device)));
}

void GradScaler::refresh_device_scales() const {
  if (device_owns_) return push();
  if (device_scales_.empty() || device_value_ == scale_) return;         // most updates leave the scale as it was
  for (const Tensor& s : device_scales_) ops::fill_(s, double(scale_));  // queued before the next replay
  device_value_ = scale_;
}

void GradScaler::pull() const {
  if (!device_owns_) return;
  scale_ = device_scales_.front().item<float>();  // the host sync
  growth_tracker_ = device_tracker_.item<int64_t>();
  device_value_ = scale_;
}

void GradScaler::push() const {
  for (const Tensor& s : device_scales_) ops::fill_(s, double(scale_));
  if (device_tracker_.defined()) ops::fill_(device_tracker_, double(growth_tracker_));
  device_value_ = scale_;
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  pull();
  return double(scale_);
}

int64_t GradScaler::get_growth_tracker() const {
  pull();
  return growth_tracker_;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!options_.enabled) return;
  static constexpr const char* kOp = "GradScaler.unscale_";
  const core::GraphCapture* capture = core::current_graph_capture();
  auto it = per_optimizer_.find(&opt);
  if (it != per_optimizer_.end()) {
    FRUGAL_CHECK(it->second.stage != Stage::Unscaled, kOp, ": unscale_() has already been called on this optimizer (",
                 opt.name(), ") since the last update()");
    FRUGAL_CHECK(it->second.stage != Stage::Stepped, kOp,
                 ": unscale_() is being called after step() on this optimizer (", opt.name(), "); call update() first");
  }
  FRUGAL_CHECK(!opt.holds_released_grads(), kOp, ": ", opt.name(),
               " holds this step's gradients in host memory "
               "(release_device_grads), out of unscale_'s reach; call step() without unscale_ (the optimizer unscales "
               "them itself), or keep the gradients on the device to clip them");
  autograd::NoGradGuard no_grad;

  // Every gradient of every group, checked before anything changes.
  std::vector<Tensor> grads;
  size_t index = 0;
  for (const ParamGroup& group : opt.param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor g = p.grad();
      if (g.defined()) {
        FRUGAL_CHECK(g.is_floating_point(), kOp, ": parameter ", index, " (", p.describe(),
                     ") has a non-floating gradient ", g.describe());
        FRUGAL_CHECK(!capture || (g.is_cuda() && g.device() == capture->device), kOp, ": parameter ", index,
                     " has its gradient on ", g.device().str(), ", not on the captured ", capture->device.str(), "; ",
                     kCaptureRule);
        grads.push_back(g.detach());
      }
      ++index;
    }
  }

  // One found_inf flag per device (Note [GradScaler host state]); one batch per (device, dtype).
  PerOptimizer st;
  auto flag_for = [&](Device d) -> float* {
    for (const Tensor& f : st.found_inf)
      if (f.device() == d) return f.data_ptr<float>();
    return st.found_inf.emplace_back(zeros({}, TensorOptions(kFloat32, d))).data_ptr<float>();
  };
  detail::Batches<detail::NormEntry> batches;
  std::vector<std::pair<Tensor, Tensor>> strided;  // (gradient, its contiguous working copy)
  for (const Tensor& g : grads) {
    flag_for(g.device());
    if (g.numel() == 0) continue;
    Tensor work = g;
    if (!is_dense(g)) work = strided.emplace_back(g, g.contiguous()).second;  // any dense order walks flat
    batches.add(g.device(), g.dtype(), {.data = work.data(), .numel = g.numel(), .chunk_begin = 0, .flags = 0});
  }

  // As PyTorch: the reciprocal in double, rounded to float32 (exact for powers of two). In a
  // capture, or once the device owns the scale, the kernel takes it from the device copy.
  const bool on_device = capture != nullptr || device_owns_;
  const bool any_cpu = std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.device().is_cpu(); });
  if (device_owns_ && any_cpu) pull();  // CPU gradients need the host value
  const float inv_scale = float(1.0 / double(scale_));
  batches.run(
      kOp,
      [&](DType dtype, const std::vector<detail::NormEntry>& entries) {
        cpu::non_finite_check_and_unscale(dtype, entries, inv_scale, flag_for(kCPU));
      },
      // (a generic lambda: a CPU-only build never instantiates the CUDA call)
      [&](auto device, auto dtype, auto& entries) {
        const float* scale_here = on_device ? device_scale(device).template data_ptr<float>() : nullptr;
        cuda::non_finite_check_and_unscale(device, dtype, entries, inv_scale, flag_for(device), scale_here);
      });
  for (const auto& [g, work] : strided) g.copy_(work);
  for (const Tensor& g : grads)
    if (is_dense(g)) g.bump_version();
  if (options_.sync_found_inf) {
    FRUGAL_CHECK(!capture, kOp, ": sync_found_inf (sharded training) cannot run inside a CUDA graph capture");
    for (const Tensor& flag : st.found_inf) options_.sync_found_inf(flag);
  }

  st.stage = Stage::Unscaled;
  per_optimizer_[&opt] = std::move(st);
}

bool GradScaler::read_found_inf(PerOptimizer& st) {
  if (st.found < 0) {
    st.found = 0;
    for (const Tensor& f : st.found_inf)  // the host sync: one per device with gradients
      if (f.item<float>() != 0.0f) st.found = 1;
  }
  return st.found == 1;
}

void GradScaler::step(Optimizer& opt) {
  if (!options_.enabled) return opt.step();
  auto it = per_optimizer_.find(&opt);
  FRUGAL_CHECK(it == per_optimizer_.end() || it->second.stage != Stage::Stepped,
               "GradScaler.step: step() has already been called on this optimizer (", opt.name(),
               ") since the last update()");
  if (core::current_graph_capture()) {  // Note [GradScaler in a CUDA graph]
    FRUGAL_CHECK(opt.skips_on_device_flag(), "GradScaler.step: ", opt.name(), " cannot skip its step on the device; ",
                 kCaptureRule);
    if (it == per_optimizer_.end() || it->second.stage == Stage::Ready) unscale_(opt);
    PerOptimizer& st = per_optimizer_[&opt];
    FRUGAL_CHECK(st.found_inf.size() == 1, "GradScaler.step: ", opt.name(), " has gradients on ", st.found_inf.size(),
                 " devices; ", kCaptureRule);
    opt.step_skipping_if(st.found_inf.front());
    st.stage = Stage::Stepped;
    return;
  }
  // An optimizer that unscales and checks in its own step (Optimizer::steps_scaled_grads)
  // gets 1 / scale; for the others the flags come from unscale_.
  const bool ready = it == per_optimizer_.end() || it->second.stage == Stage::Ready;
  std::optional<Optimizer::ScaledStep> scaled;
  if (ready && opt.steps_scaled_grads()) {
    pull();  // its host update needs the scale on the host
    scaled = opt.step_scaled(float(1.0 / double(scale_)));
  } else if (ready) unscale_(opt);
  PerOptimizer& st = per_optimizer_[&opt];
  FRUGAL_CHECK(scaled ? *scaled != Optimizer::ScaledStep::NoGradients : !st.found_inf.empty(),
               "GradScaler.step: no inf checks were recorded for this optimizer (", opt.name(), " has no gradients)");
  if (scaled) st.found = *scaled == Optimizer::ScaledStep::SkippedNonFinite ? 1 : 0;
  else if (skips_on_device(opt, st)) opt.step_skipping_if(st.found_inf.front());  // no host sync
  else if (!read_found_inf(st)) opt.step();
  st.stage = Stage::Stepped;
}

bool GradScaler::skips_on_device(const Optimizer& opt, const PerOptimizer& st) {
  if (!opt.skips_on_device_flag() || st.found_inf.size() != 1 || !st.found_inf.front().is_cuda()) return false;
  const Device device = st.found_inf.front().device();
  for (const ParamGroup& group : opt.param_groups())
    for (const Tensor& p : group.params)
      if (p.device() != device) return false;
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (core::current_graph_capture()) return captured_update();
  if (update_on_device()) return;
  bool recorded = false, found = false;
  for (auto& [opt, st] : per_optimizer_) {
    if (st.stage == Stage::Ready || (st.found_inf.empty() && st.found < 0)) continue;
    recorded = true;
    found = read_found_inf(st) || found;
  }
  FRUGAL_CHECK(recorded,
               "GradScaler.update: no inf checks were recorded prior to update() (call step() or unscale_() on "
               "an optimizer with gradients first)");
  pull();  // after replays of a captured update, the device holds the current values
  // PyTorch's _amp_update_scale_: products in double, rounded to float32.
  if (found) {
    scale_ = float(double(scale_) * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    const float grown = float(double(scale_) * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  per_optimizer_.clear();
  refresh_device_scales();
}

bool GradScaler::update_on_device() {
  const Tensor* flag = nullptr;
  for (const auto& [opt, st] : per_optimizer_) {
    if (st.stage == Stage::Ready) continue;
    if (st.found >= 0 || st.found_inf.size() != 1 || flag != nullptr) return false;  // read, or more than one flag
    flag = &st.found_inf.front();
  }
  if (flag == nullptr || !flag->is_cuda()) return false;
  const Tensor scale = device_scale(flag->device());
  if (device_scales_.size() != 1) return false;
  if (!device_owns_) {  // the device copies become the truth, as after a captured update
    push();
    device_owns_ = true;
  }
#ifdef FRUGAL_WITH_CUDA
  cuda::update_scale(flag->device(), scale.data_ptr<float>(), device_tracker_.data_ptr<int64_t>(),
                     flag->data_ptr<float>(), options_.growth_factor, options_.backoff_factor,
                     options_.growth_interval);
#endif
  per_optimizer_.clear();
  return true;
}

void GradScaler::captured_update() {
  static constexpr const char* kOp = "GradScaler.update";
  std::vector<Tensor> flags;
  for (const auto& [opt, st] : per_optimizer_)
    if (st.stage != Stage::Ready) flags.insert(flags.end(), st.found_inf.begin(), st.found_inf.end());
  FRUGAL_CHECK(flags.size() == 1, kOp, ": ", flags.size(), " inf flags were recorded in this capture; ", kCaptureRule);
  const Device device = flags.front().device();
  const Tensor scale = device_scale(device);
  FRUGAL_CHECK(device_scales_.size() == 1, kOp, ": the scale has copies on ", device_scales_.size(), " devices; ",
               kCaptureRule);
#ifdef FRUGAL_WITH_CUDA
  cuda::update_scale(device, scale.data_ptr<float>(), device_tracker_.data_ptr<int64_t>(),
                     flags.front().data_ptr<float>(), options_.growth_factor, options_.backoff_factor,
                     options_.growth_interval);
#else
  FRUGAL_FAIL(kOp, ": a captured update needs a CUDA build");
#endif
  core::GraphCapture* capture = core::current_graph_capture();
  if (checked_capture_ != capture->pool_key) {  // once per graph: the host values go in before its first replay
    checked_capture_ = capture->pool_key;
    capture->replay_checks.push_back([this] {
      if (device_owns_) return;
      push();
      device_owns_ = true;
    });
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  core::refuse_in_graph_capture("GradScaler.update(new_scale)",
                                "the new scale would be frozen into the graph; call it between replays");
  pull();  // the growth tracker is kept: the device's, once it owns it
  scale_ = checked_scale(new_scale, "GradScaler.update", "new_scale");
  per_optimizer_.clear();
  refresh_device_scales();
}

StateDict GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  pull();
  const TensorOptions f64(kFloat64), i64(kInt64);
  return {{"scale", scalar_tensor(double(scale_), f64)},
          {"growth_factor", scalar_tensor(options_.growth_factor, f64)},
          {"backoff_factor", scalar_tensor(options_.backoff_factor, f64)},
          {"growth_interval", scalar_tensor(double(options_.growth_interval), i64)},
          {"_growth_tracker", scalar_tensor(double(growth_tracker_), i64)}};
}

void GradScaler::load_state_dict(const StateDict& dict) {
  if (!options_.enabled) return;
  static constexpr const char* kOp = "GradScaler.load_state_dict";
  FRUGAL_CHECK(!dict.empty(), kOp,
               ": the state dict is empty, possibly because it was saved from a disabled GradScaler");
  std::map<std::string, const Tensor*> keys;
  for (const auto& [key, t] : dict) {
    FRUGAL_CHECK(key == "scale" || key == "growth_factor" || key == "backoff_factor" || key == "growth_interval" ||
                     key == "_growth_tracker",
                 kOp, ": unexpected key '", key, "'");
    FRUGAL_CHECK(keys.emplace(key, &t).second, kOp, ": key '", key, "' appears twice");
  }
  auto take = [&](const char* k) -> const Tensor& {
    auto it = keys.find(k);
    FRUGAL_CHECK(it != keys.end(), kOp, ": missing key '", k, "'");
    return *it->second;
  };
  GradScalerOptions o = options_;
  o.growth_factor = scalar_of("growth_factor", take("growth_factor"));
  o.backoff_factor = scalar_of("backoff_factor", take("backoff_factor"));
  o.growth_interval = integer_of("growth_interval", take("growth_interval"));
  const int64_t tracker = integer_of("_growth_tracker", take("_growth_tracker"));
  const float s = checked_scale(scalar_of("scale", take("scale")), kOp, "scale");
  check_options(o, kOp);
  FRUGAL_CHECK(tracker >= 0 && tracker < o.growth_interval, kOp,
               ": _growth_tracker must be in [0, growth_interval = ", o.growth_interval, "), got ", tracker);
  options_ = o;
  scale_ = s;
  growth_tracker_ = tracker;
  refresh_device_scales();
}

// ---- the CPU backend -----------------------------------------------------------------

namespace cpu {

void non_finite_check_and_unscale(DType dtype, const std::vector<detail::NormEntry>& entries, float inv_scale,
                                  float* found_inf) {
  constexpr int64_t kGrain = 1 << 16;  // elements below which threads cost more than they save
  dispatch_floating(dtype, "GradScaler.unscale_", kCPU, [&]<typename T>() {
    using M = opmath_t<T>;
    const M inv = M(inv_scale);  // float32 inv_scale widened for float64 gradients, as PyTorch
    const bool scale = inv_scale != 1.0f;
    int bad = 0;
    for (const detail::NormEntry& e : entries) {
      T* x = static_cast<T*>(e.data);  // x: (numel) gradient elements
      const int64_t n = e.numel;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= 2 * kGrain)
      for (int64_t i = 0; i < n; ++i) {
        const M v = M(x[i]);
        bad |= !std::isfinite(v);
        if (scale) x[i] = T(v * inv);
      }
    }
    if (bad) *found_inf = 1.0f;
  });
}

}  // namespace cpu

}  // namespace frugal::optim
