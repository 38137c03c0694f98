// OffloadAdamW: AdamW with its state in pinned host memory (optim/offload_adam.h).
//
// Note [CPU offload]
// ZeRO-Offload (Ren et al. 2021) keeps on the GPU only what the forward and backward need
// - the compute-dtype parameters and gradients, 2 + 2 bytes per parameter in float16 - and
// moves the float32 master weights and both Adam moments (12 bytes per parameter) to host
// memory, where the update runs. A step of a CUDA parameter goes
//   device --(gradient, compute dtype)--> pinned staging --(CPU AdamW, float32 master)-->
//   staging --(new weights, rounded to the compute dtype)--> device
// over one pinned staging buffer per parameter that carries the gradient down and the
// weights back up (its bytes are read before they are overwritten, element by element).
// Three things overlap:
//   1. gradients leave during backward: a post-accumulate-grad hook (as DDP's buckets,
//      parallel/grad_buckets.cpp) queues each gradient's copy on the device's offload
//      stream (autograd/offload_stream.h, the side stream of offloaded saved tensors) as
//      soon as AccumulateGrad has it, so the copies run while backward computes the rest;
//   2. the CPU update of parameter k starts once its own copy is done (a host wait on its
//      event), while the copies of k+1... still run;
//   3. each parameter is updated in chunks of chunk_elements: as soon as a chunk is done
//      its upload is queued on the offload stream, and the CPU goes on with the next.
// At the end the current (compute) stream waits for the last upload on the device, not
// the host, so step() returns while the last chunks are still in flight and the next
// forward starts after them. Ordering on the one offload stream does the rest: the next
// step's gradient copy into a staging buffer is queued after that buffer's uploads.
// The side stream waits for the compute stream before every copy, so a copy never reads
// a gradient, or overwrites a weight, that queued kernels still use.
//
// Code that changes a gradient in place after backward - GradScaler.unscale_,
// clip_grad_norm_ - bumps its version: step() sees that the copy the hook made is stale
// and copies it again (correct, but that parameter's copy no longer overlaps backward).
// GradScaler.step therefore does not unscale in place: it calls step_scaled(1 / scale)
// (Optimizer::steps_scaled_grads), which checks the staged gradients for inf and NaN on
// the host before any weight changes and multiplies by 1 / scale inside the update, so a
// step with an inf gradient is skipped without touching the host state, and the copies
// stay current. (Only an explicit unscale_, before clipping, takes the in-place path.)
//
// With release_device_grads the hook also drops the gradient from its parameter once its
// copy is queued: the block goes back to the arena when the copy has read it (record_stream
// on the side stream), so backward's gradients never pile up on the device. The staging
// buffer then is the gradient until step() or zero_grad(); a second backward's gradient is
// copied to a second pinned buffer and added on the host, waiting for both copies.
// The staleness check is the storage's version counter, which the Tensor methods and the
// autograd ops bump; a raw kernel call (ops::mul_ on a .grad from library code) does not,
// so such code must bump the version itself (Tensor::bump_version) or the step uses the
// gradient as the hook copied it.
//
// The CPU AdamW (optim/cpu_adam.cpp) is Note [Adam update]'s element rule in float, split
// into one contiguous slice per thread (get_num_threads(): the library's setting, so it
// never oversubscribes) with no cross-element arithmetic: 1 or N threads give bitwise the
// same weights, and float32 weights equal optim::AdamW's bit for bit.
// On the CPU host and device coincide: gradients are read in place, a float32 parameter is
// its own master and a 16-bit one is rounded from its float32 master after each update.
//
// Note [Master weights follow the parameter]
// A 16-bit parameter's float32 master is the truth between steps only while the parameter
// still holds it rounded. Code that writes the parameter after training started - a
// checkpoint loaded into the model, a layer re-initialised, weights copied from an EMA -
// would otherwise be silently undone by the next step, which rounds the stale master back
// into the parameter. So each update records the parameter's storage and version, and a
// step that finds either changed (or follows load_state_dict) compares the parameter with
// its master rounded to the parameter's dtype and takes the parameter's value where they
// differ. Elsewhere the master keeps the precision the parameter lacks, so a model and
// optimizer loaded from one checkpoint resume bit-identically. The compare reads a CUDA
// parameter back to the host, but only on such a step, never in steady training.
#include "optim/offload_adam.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "core/graph_capture.h"
#include "core/instrument.h"
#include "core/threads.h"
#include "memory/allocator.h"
#include "memory/pinned.h"
#include "optim/cpu_adam.h"
#include "optim/step_util.h"
#include "tensor/from_data_ptr.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#if FRUGAL_WITH_CUDA
#include "autograd/offload_stream.h"
#endif

namespace frugal::optim {

namespace {

/// A contiguous tensor of `sizes` in the pinned host pool, zero-filled when asked.
Tensor pinned_empty(const Shape& sizes, DType dtype, bool zero = false) {
  const size_t nbytes = checked_nbytes(numel_of(sizes, "OffloadAdamW"), dtype, "OffloadAdamW", sizes);
  Tensor t = from_data_ptr(memory::allocate_pinned(nbytes), sizes, dtype);
  if (zero && nbytes > 0) std::memset(t.data(), 0, nbytes);
  return t;
}

/// `t` (any device, any floating dtype) as float32 in the pinned host pool.
Tensor pinned_float_copy(const Tensor& t) {
  const Tensor host = t.to(kCPU, kFloat32).contiguous();
  Tensor out = pinned_empty(t.sizes(), kFloat32);
  if (t.numel() > 0) std::memcpy(out.data(), host.data(), size_t(t.numel()) * sizeof(float));
  return out;
}

int64_t nbytes_of(const Tensor& t) { return t.defined() ? t.numel() * int64_t(t.element_size()) : 0; }

/// Takes `param`'s value into `master` (float32, host) wherever the parameter no longer
/// holds the master rounded (Note [Master weights follow the parameter]).
void follow_parameter(const Tensor& param, const Tensor& master) {
  const Tensor now = param.detach().to(kCPU).view(master.sizes());  // param: contiguous (check_group)
  const Tensor changed = ops::ne(master.to(param.dtype()), now);
  ops::copy_into(master, ops::where(changed, now.to(kFloat32), master));
}

/// The float scalars of one AdamW step at step count `step`, from the same double
/// arithmetic as detail::adam_entry, so the update matches optim::AdamW's bit for bit.
detail::AdamCoeffs<float> adamw_coeffs(const ParamGroup& group, int64_t step) {
  const double beta1 = *group.beta1, beta2 = *group.beta2;
  const double bias_correction1 = 1.0 - std::pow(beta1, double(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, double(step));
  detail::AdamEntry e{};
  e.lr = group.lr;
  e.beta1 = beta1;
  e.beta2 = beta2;
  e.eps = *group.eps;
  e.weight_decay = *group.weight_decay;
  e.step_size = group.lr / bias_correction1;
  e.bias_correction2_sqrt = std::sqrt(bias_correction2);
  e.flags = detail::kAdamDecoupled | (group.maximize.value_or(false) ? detail::kAdamMaximize : 0u);
  return detail::AdamCoeffs<float>(e);
}

/// Whether OffloadAdamW can step a parameter of this dtype and device.
bool supported(const Tensor& p) {
  return (p.dtype() == kFloat32 || p.dtype() == kFloat16 || p.dtype() == kBFloat16) &&
         (p.device().is_cpu() || p.device().is_cuda());
}

}  // namespace

struct OffloadAdamW::Transfer {
  Tensor staging;                       // (numel) pinned, the parameter's dtype: gradient down, weights up
  std::weak_ptr<Storage> grad_storage;  // the gradient whose copy is in flight, as it was then:
  int64_t grad_offset = 0;              //   its storage, offset and version
  uint64_t grad_version = 0;
  void* copied = nullptr;  // event completing that copy; null when none is in flight
  // release_device_grads: the staged gradient is the parameter's, which was dropped from it;
  // `accum` (pinned, made on first need) receives a second backward's gradient to add to it.
  bool released = false;
  Tensor accum;

  bool holds(const Tensor& grad) const {
    return copied != nullptr && grad_storage.lock() == grad.impl().storage && grad_offset == grad.storage_offset() &&
           grad_version == grad.version();
  }
};

OffloadAdamW::OffloadAdamW(std::vector<Tensor> params, OffloadAdamWOptions options)
    : OffloadAdamW(detail::one_group(std::move(params)), options) {}

OffloadAdamW::OffloadAdamW(std::vector<ParamGroup> groups, OffloadAdamWOptions options)
    : Optimizer("OffloadAdamW"), options_(options) {
  FRUGAL_CHECK(!groups.empty(), name(), ": got an empty parameter list");
  FRUGAL_CHECK(options_.chunk_elements > 0, name(), ": chunk_elements must be positive, got ", options_.chunk_elements);
  for (ParamGroup& g : groups) add_param_group(std::move(g));
  if (!options_.copy_grads_in_backward && !options_.release_device_grads) return;
  for (const ParamGroup& group : param_groups())
    for (const Tensor& p : group.params)
      if (p.device().is_cuda() && p.requires_grad())
        hooks_.emplace_back(p, autograd::register_post_accumulate_grad_hook(p, [this](const Tensor& leaf) {
                              if (options_.release_device_grads) release_grad_to_host(leaf);
                              else copy_grad_to_host(leaf);
                            }));
}

OffloadAdamW::~OffloadAdamW() {
  for (const auto& [p, id] : hooks_) autograd::remove_post_accumulate_grad_hook(p, id);
#if FRUGAL_WITH_CUDA
  // The staging buffers go back to the pool only once their copies are done (record_stream).
  for (auto& [impl, t] : transfers_)
    if (t->copied) autograd::detail::release_event(t->copied);
#endif
}

void OffloadAdamW::zero_grad(bool set_to_none) {
  Optimizer::zero_grad(set_to_none);
  drop_released();
}

bool OffloadAdamW::holds_released_grads() const {
  std::lock_guard lock(transfers_mutex_);
  return std::any_of(transfers_.begin(), transfers_.end(), [](const auto& kv) { return kv.second->released; });
}

void OffloadAdamW::drop_released() {
  std::lock_guard lock(transfers_mutex_);
  for (auto& [impl, t] : transfers_) {
    if (!t->released) continue;
#if FRUGAL_WITH_CUDA
    autograd::detail::release_event(t->copied);
#endif
    t->copied = nullptr;
    t->released = false;
  }
}

std::vector<Optimizer::HyperParam> OffloadAdamW::hyperparams() const {
  return {{.name = "beta1", .real = &ParamGroup::beta1, .option = options_.beta1},
          {.name = "beta2", .real = &ParamGroup::beta2, .option = options_.beta2},
          {.name = "eps", .real = &ParamGroup::eps, .option = options_.eps},
          {.name = "weight_decay", .real = &ParamGroup::weight_decay, .option = options_.weight_decay},
          {.name = "maximize", .flag = &ParamGroup::maximize, .option = double(options_.maximize)}};
}

void OffloadAdamW::check_group(const ParamGroup& group, size_t g) const {
  detail::check_adam_group(name(), group, g);
  for (size_t k = 0; k < group.params.size(); ++k) {
    const Tensor& p = group.params[k];
    FRUGAL_CHECK(supported(p), name(), ": parameter ", k, " of param group ", g, " is ", p.describe(), "; ", name(),
                 " steps float32, float16 and bfloat16 parameters on the cpu or a cuda device (its master weights "
                 "are float32)");
    FRUGAL_CHECK(p.is_contiguous(), name(), ": parameter ", k, " of param group ", g, " (", p.describe(),
                 ") is not contiguous; its chunks are copied as flat ranges");
  }
}

void OffloadAdamW::check_state(const ParamState& st, const Tensor& /*param*/, const std::string& prefix) const {
  FRUGAL_CHECK(st.buffers[0].defined() == st.buffers[1].defined(), name(), ".load_state_dict: ", prefix, "exp_avg and ",
               prefix, "exp_avg_sq must be given together");
  FRUGAL_CHECK(st.step == 0 || st.buffers[0].defined(), name(), ".load_state_dict: ", prefix, "step is ", st.step,
               " but ", prefix, "exp_avg is missing");
}

Tensor OffloadAdamW::load_state_buffer(const Tensor& t, const Tensor& /*param*/) const {
  return pinned_float_copy(t);  // never on the device: a model that needs offload has no room for it there
}

OffloadAdamW::Transfer& OffloadAdamW::transfer_for(const Tensor& param) {
  std::unique_ptr<Transfer>& t = transfers_[param.impl_ptr().get()];
  if (!t) {
    t = std::make_unique<Transfer>();
    t->staging = pinned_empty({param.numel()}, param.dtype());
#if FRUGAL_WITH_CUDA
    memory::record_stream(t->staging.impl().storage->data, autograd::detail::offload_stream(param.device()));
#endif
  }
  return *t;
}

#if FRUGAL_WITH_CUDA
/// The gradient `param` holds, if the step can use it: on param's device, in its dtype and shape
/// (one that is not is left to step(), whose checked_grads names it); undefined otherwise.
static Tensor matching_cuda_grad(const Tensor& param) {
  const Tensor grad = param.grad();
  if (!grad.defined() || !param.device().is_cuda() || grad.device() != param.device() ||
      grad.dtype() != param.dtype() || grad.sizes() != param.sizes())
    return Tensor();
  return grad;
}

OffloadAdamW::Transfer& OffloadAdamW::landed_transfer(const Tensor& param) {
  std::lock_guard lock(transfers_mutex_);
  Transfer& t = transfer_for(param);
  autograd::detail::wait_on_host(t.copied);
  return t;
}
#endif

void OffloadAdamW::release_grad_to_host(const Tensor& param) {
#if FRUGAL_WITH_CUDA
  const Tensor grad = matching_cuda_grad(param);
  if (!grad.defined()) return;
  const Tensor src = grad.contiguous();
  std::lock_guard lock(transfers_mutex_);
  Transfer& t = transfer_for(param);
  const Stream side = autograd::detail::offload_stream(param.device());
  const size_t nbytes = size_t(nbytes_of(src));
  if (t.released) {
    // A second backward before step(): its gradient is added to the one held, on the host,
    // in the same arithmetic as AccumulateGrad's add_ on the device. This waits for both
    // copies, so accumulating steps lose the copies' overlap with backward.
    if (!t.accum.defined()) {
      t.accum = pinned_empty({param.numel()}, param.dtype());
      memory::record_stream(t.accum.impl().storage->data, side);
    }
    void* copied = autograd::detail::copy_on_offload_stream(t.accum.data(), src.data(), nbytes, param.device());
    memory::record_stream(src.impl().storage->data, side);
    autograd::detail::wait_on_host(t.copied);
    autograd::detail::wait_on_host(copied);
    autograd::detail::release_event(copied);
    cpu::accumulate(param.dtype(), t.staging.data(), t.accum.data(), param.numel(), get_num_threads());
  } else {
    if (t.copied) autograd::detail::release_event(t.copied);
    t.copied = autograd::detail::copy_on_offload_stream(t.staging.data(), src.data(), nbytes, param.device());
    memory::record_stream(src.impl().storage->data, side);  // the block is reused once the copy is done
    t.released = true;
  }
  t.grad_storage.reset();
  param.set_grad(Tensor());  // the device's last reference: freed once the copy has read it
#else
  (void)param;
#endif
}

void OffloadAdamW::copy_grad_to_host(const Tensor& param) {
#if FRUGAL_WITH_CUDA
  const Tensor grad = matching_cuda_grad(param);
  if (!grad.defined()) return;
  std::lock_guard lock(transfers_mutex_);
  Transfer& t = transfer_for(param);
  if (t.holds(grad)) return;
  if (t.copied) autograd::detail::release_event(t.copied);
  const Tensor src = grad.contiguous();
  const Stream side = autograd::detail::offload_stream(param.device());
  t.copied =
      autograd::detail::copy_on_offload_stream(t.staging.data(), src.data(), size_t(nbytes_of(src)), param.device());
  memory::record_stream(src.impl().storage->data, side);  // freed early (zero_grad), reused once copied
  t.grad_storage = grad.impl().storage;
  t.grad_offset = grad.storage_offset();
  t.grad_version = grad.version();
#else
  (void)param;  // a CPU-only build has no CUDA parameters: its gradients are read in place
#endif
}

struct OffloadAdamW::Item {
  Tensor param;      // the group's own tensor: state is keyed by it
  Tensor host_grad;  // a CPU parameter's gradient, contiguous (a CUDA one's is in its staging buffer)
  const ParamGroup* group;
};

std::vector<OffloadAdamW::Item> OffloadAdamW::prepare_step() {
  core::refuse_in_graph_capture("OffloadAdamW.step", "its update runs on the host, which a replay does not run");
  // Check every gradient before any state changes, so a bad one leaves the optimizer as it was.
  const std::vector<Tensor> grads = checked_grads();
  std::vector<Item> items;
  size_t index = 0;
  for (const ParamGroup& group : param_groups())
    for (const Tensor& p : group.params) {
      const Tensor& g = grads[index++];
      if (p.numel() == 0) continue;
      if (!p.device().is_cuda()) {
        if (g.defined()) items.push_back({p, g.detach().contiguous(), &group});
        continue;
      }
      // Every CUDA gradient on its way to the host: the copies the hooks started are kept
      // when still current, the others start now (Note [CPU offload]).
      if (options_.release_device_grads) {
        if (g.defined()) release_grad_to_host(p);  // one the hook did not see (set by hand)
        std::lock_guard lock(transfers_mutex_);
        const auto t = transfers_.find(p.impl_ptr().get());
        if (t == transfers_.end() || !t->second->released) continue;
      } else {
        if (!g.defined()) continue;
        copy_grad_to_host(p);
      }
      items.push_back({p, Tensor(), &group});
    }
  return items;
}

void OffloadAdamW::step() {
  autograd::NoGradGuard no_grad;
  core::CategoryScope category(core::Category::OptimizerState);  // for the profiler: its state and buffers
  core::OpScope op(name());                                      // and its time
  update(prepare_step(), 1.0f);
}

Optimizer::ScaledStep OffloadAdamW::step_scaled(float inv_scale) {
  autograd::NoGradGuard no_grad;
  core::CategoryScope category(core::Category::OptimizerState);
  core::OpScope op(name());
  const std::vector<Item> items = prepare_step();
  if (items.empty()) return ScaledStep::NoGradients;
  // Every gradient is checked where it is, on the host, before any weight changes: the
  // copies must all have landed, which they mostly have by the end of backward.
  const int threads = get_num_threads();
  bool finite = true;
  for (const Item& it : items) {
    const void* grad = it.host_grad.defined() ? it.host_grad.data() : nullptr;
#if FRUGAL_WITH_CUDA
    if (!grad) grad = landed_transfer(it.param).staging.data();
#endif
    if (!cpu::all_finite(it.param.dtype(), grad, it.param.numel(), threads)) {
      finite = false;
      break;
    }
  }
  if (!finite) {
    drop_released();  // as zero_grad would: the step is skipped, its gradients are spent
    return ScaledStep::SkippedNonFinite;
  }
  update(items, inv_scale);
  return ScaledStep::Stepped;
}

void OffloadAdamW::update(const std::vector<Item>& items, float grad_scale) {
  // 1. State on first use, for every parameter before any is updated: running out of
  //    pinned memory then leaves the weights as they were.
  for (const Item& it : items) {
    const Tensor& p = it.param;
    ParamState& st = state_for(p);
    if (!st.buffers[0].defined()) {
      st.buffers[0] = pinned_empty(p.sizes(), kFloat32, /*zero=*/true);
      st.buffers[1] = pinned_empty(p.sizes(), kFloat32, /*zero=*/true);
    }
    const bool own_master = p.device().is_cpu() && p.dtype() == kFloat32;  // a float32 host parameter is its master
    if (!own_master && !st.buffers[2].defined()) st.buffers[2] = pinned_float_copy(p);
    else if (!own_master && !master_in_sync(p)) follow_parameter(p, st.buffers[2]);
  }

  // 2. The update, parameter by parameter and chunk by chunk, each chunk's upload queued
  //    as soon as it is done.
  const int threads = get_num_threads();
  [[maybe_unused]] std::vector<std::pair<Device, void*>> last_upload;  // per device
  for (const Item& it : items) {
    const Tensor& p = it.param;
    const bool on_cuda = p.device().is_cuda();
    const bool own_master = !on_cuda && p.dtype() == kFloat32;
    const int64_t n = p.numel(), es = int64_t(p.element_size());
    ParamState& st = state_for(p);
    st.step += 1;
    const detail::AdamCoeffs<float> coeffs = adamw_coeffs(*it.group, st.step);
    float* master = own_master ? p.data_ptr<float>() : st.buffers[2].data_ptr<float>();
    float* m = st.buffers[0].data_ptr<float>();
    float* v = st.buffers[1].data_ptr<float>();
    const char* grad = nullptr;
    char* out = nullptr;
    Transfer* transfer = nullptr;
    if (on_cuda) {
#if FRUGAL_WITH_CUDA
      transfer = &landed_transfer(p);
      grad = static_cast<const char*>(transfer->staging.data());
      out = static_cast<char*>(transfer->staging.data());
#else
      throw_no_cuda(name(), p.device());
#endif
    } else {
      grad = static_cast<const char*>(it.host_grad.data());
      out = own_master ? nullptr : static_cast<char*>(p.data());
    }
    for (int64_t begin = 0; begin < n; begin += options_.chunk_elements) {
      const int64_t len = std::min(options_.chunk_elements, n - begin);
      cpu::offload_adam_chunk(p.dtype(),
                              {.master = master + begin,
                               .exp_avg = m + begin,
                               .exp_avg_sq = v + begin,
                               .grad = grad + begin * es,
                               .param_out = out ? out + begin * es : nullptr,
                               .n = len,
                               .grad_scale = grad_scale},
                              coeffs, threads);
#if FRUGAL_WITH_CUDA
      if (on_cuda) {
        void* uploaded = autograd::detail::copy_on_offload_stream(static_cast<char*>(p.data()) + begin * es,
                                                                  out + begin * es, size_t(len * es), p.device());
        auto slot =
            std::find_if(last_upload.begin(), last_upload.end(), [&](const auto& d) { return d.first == p.device(); });
        if (slot == last_upload.end()) {
          last_upload.emplace_back(p.device(), uploaded);
        } else {
          autograd::detail::release_event(slot->second);  // the stream is in order: the last one covers it
          slot->second = uploaded;
        }
      }
#endif
    }
    if (transfer) {  // the staging buffer now holds the weights: the gradient copy is used up
#if FRUGAL_WITH_CUDA
      autograd::detail::release_event(transfer->copied);
#endif
      transfer->copied = nullptr;
      transfer->released = false;
      transfer->grad_storage.reset();
    }
    p.bump_version();
    synced_[p.impl_ptr().get()] = {p.impl().storage, p.version()};
  }

  // 3. The next kernels on each device start after its uploads (a device-side wait).
#if FRUGAL_WITH_CUDA
  for (const auto& [device, uploaded] : last_upload) {
    autograd::detail::wait_on_current_stream_untimed(uploaded, device);
    autograd::detail::release_event(uploaded);
  }
#endif
}

int64_t OffloadAdamW::host_state_bytes() const {
  int64_t bytes = 0;
  for (const ParamGroup& group : param_groups())
    for (const Tensor& p : group.params)
      if (const ParamState* st = state(p))
        for (const Tensor& b : st->buffers)
          if (b.defined() && b.device().is_cpu()) bytes += nbytes_of(b);
  for (const auto& [impl, t] : transfers_) bytes += nbytes_of(t->staging);
  return bytes;
}

int64_t OffloadAdamW::device_state_bytes() const {
  int64_t bytes = 0;
  for (const ParamGroup& group : param_groups())
    for (const Tensor& p : group.params)
      if (const ParamState* st = state(p))
        for (const Tensor& b : st->buffers)
          if (b.defined() && !b.device().is_cpu()) bytes += nbytes_of(b);
  return bytes;
}

bool OffloadAdamW::master_in_sync(const Tensor& param) const {
  const auto it = synced_.find(param.impl_ptr().get());
  return it != synced_.end() && it->second.storage.lock() == param.impl().storage &&
         it->second.version == param.version();
}

Tensor OffloadAdamW::master_param(const Tensor& param) const {
  const ParamState* st = state(param);
  if (!st) return Tensor();
  if (st->buffers[2].defined()) return st->buffers[2];
  return param.device().is_cpu() && param.dtype() == kFloat32 ? param.detach() : Tensor();
}

}  // namespace frugal::optim
