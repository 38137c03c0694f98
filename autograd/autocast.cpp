// Automatic mixed precision: the thread-local state, the guard, the per-op casts and
// the cache of parameter casts.
//
// Note [Autocast]
// State. Each thread holds one State (enabled, dtype) per DeviceType; AutocastGuard
// sets the state of its device's type and restores the outer one when it dies, so
// guards nest and `AutocastGuard off(dev, dt, false)` switches autocast off inside an
// enabled region. `detail::any_enabled` mirrors "some type is on": it is the only
// thing an op reads outside autocast, so ops outside autocast cost one thread-local load.
//
// Where the policy applies. Every public differentiable op whose inputs autocast may
// change starts with
//     if (auto c = autocast::cast_inputs(Policy::Lower, {&x, &w})) return linear((*c)[0], (*c)[1]);
// cast_inputs returns the inputs cast, or nullopt when nothing changes; given casts the
// op calls itself again with them, and there nothing changes any more. Which tensors are
// cast (as torch.autocast): defined floating tensors other than float64 whose device type
// has autocast on; integer and bool tensors (targets, indices, masks), float64 tensors
// and tensors of other device types pass untouched.
//   Lower   -> the autocast dtype: matmul, linear, conv2d, scaled_dot_product_attention.
//   Float32 -> float16/bfloat16 up to float32: softmax, log_softmax, masked_softmax,
//              layer_norm, rms_norm, group_norm, cross_entropy, nll_loss, mse_loss,
//              kl_div and the other losses, sum, mean, var, std (through var),
//              vector_norm, cumsum, logsumexp, exp, expm1, log, log2, log10,
//              log1p, softplus, pow, rsqrt, reciprocal, tan, asin, acos, sinh, cosh,
//              cosine_similarity, pairwise_distance, triplet_margin_loss,
//              cosine_embedding_loss (numerically sensitive, or reductions whose result
//              needs the range).
//   Refused -> binary_cross_entropy throws under autocast, as PyTorch: its logarithms of
//              16-bit probabilities saturate; binary_cross_entropy_with_logits is the
//              safe spelling.
//   Promote -> the widest floating input (a 0-d one counts only if every floating input
//              is 0-d: Note [0-d operands in promotion] in tensor/dtype.h): add/sub/mul/
//              div/maximum/minimum/pow, where, cat and stack. frugal's kernels already
//              promote mixed inputs (PyTorch's rules), so these ops need no cast: the
//              result is the same and no widened copy is made or saved for backward
//              (MulBackward keeps the narrow input).
//   batch_norm keeps its input dtype: its kernel takes float16/bfloat16 x with float32
//   weight and running statistics and computes the statistics in float32 (Note [Batch
//   norm statistics]), as cuDNN does under PyTorch's autocast.
// A composite op of the Lower list (scaled_dot_product_attention: matmul, masked_softmax,
// matmul) casts its inputs once, then runs its body under an enabled=false guard, so its
// inner softmax stays in the low dtype, as PyTorch's fused kernel does.
//
// Gradients. A cast is the differentiable Tensor::to(dtype) (ToCopyBackward), so the
// gradient of a float32 weight used in float16 comes back through the cast in float32,
// and the optimizer sees float32 gradients of float32 weights.
//
// The cast cache. A weight used by several ops (a shared embedding, a layer applied in a
// loop, checkpoint recompute) would be cast once per use; casts of leaves that require
// grad are therefore kept, keyed by (TensorImpl, dtype), while any AutocastGuard lives on
// the thread, and dropped when the outermost one exits. An entry is valid only while the
// source impl is alive (a weak_ptr: a freed impl's address may be reused), it still has
// the storage that was cast (Module::to and nn::to_channels_last give a parameter new
// storage in place, whose count restarts and may equal the old one's), that storage's
// version is the one cast (an optimizer step in between bumps it), and, if grad mode is
// on now, the cast was recorded (a cast made under NoGradGuard, e.g. in a checkpoint's
// forward, has no graph to the weight). The gradients of all uses meet at the one
// ToCopyBackward node and reach the weight's .grad summed, converted once.
//
// Checkpoint (autograd/checkpoint.cpp) records the state of both device types at the
// forward and replays it with guards around the recompute, so the recomputed graph has
// the dtypes the forward had.
#include "autograd/autocast.h"

#include <array>
#include <map>
#include <memory>

#include "autograd/function.h"
#include "autograd/grad_mode.h"

namespace frugal::autocast {

namespace detail {
constinit thread_local bool any_enabled = false;
}  // namespace detail

namespace {

thread_local std::array<State, 2> states;  // indexed by DeviceType
thread_local int guard_depth = 0;          // AutocastGuards alive on this thread

struct CacheEntry {
  std::weak_ptr<TensorImpl> source;
  std::weak_ptr<Storage> storage;  // the source's storage when cast (Note [Autocast])
  uint64_t version = 0;
  bool recorded = false;  // made with grad mode on: the cast has a graph to the source
  Tensor cast;
};
thread_local std::map<std::pair<const TensorImpl*, DType>, CacheEntry> cache;

State& state_of(DeviceType type) { return states[size_t(type)]; }

void check_dtype(const char* what, DeviceType type, DType dtype) {
  FRUGAL_CHECK(dtype == kFloat16 || dtype == kBFloat16, what, ": autocast dtype must be float16 or bfloat16, got ",
               dtype_name(dtype), " for ", Device(type).str());
}

/// The dtype `t` has under `policy`: its own when autocast leaves it alone.
DType target_dtype(Policy policy, const Tensor& t) {
  if (!t.defined()) return kFloat32;
  const DType own = t.dtype();
  if (!is_floating(own) || own == kFloat64) return own;
  const State& s = state_of(t.device().type);
  if (!s.enabled) return own;
  return policy == Policy::Lower ? s.dtype : kFloat32;
}

/// t.to(dtype), through the cache for leaves that require grad (Note [Autocast]).
Tensor cast(const Tensor& t, DType dtype) {
  if (guard_depth == 0 || !t.is_leaf() || !t.requires_grad()) return t.to(dtype);
  const bool recording = autograd::is_grad_enabled();
  // A cached cast hides its source from the no-grad paths that report a use of a tensor
  // requiring grad (a checkpoint deciding whether to record), and from the read that a
  // checkpoint's replay must find unchanged: report both here.
  if (!recording && autograd::probing_grad_use()) {
    autograd::note_grad_use();
    autograd::detail::note_checkpoint_read(t);
  }
  CacheEntry& e = cache[{t.impl_ptr().get(), dtype}];
  const bool valid = e.source.lock() == t.impl_ptr() && e.storage.lock() == t.impl().storage &&
                     e.version == t.version() && (e.recorded || !recording);
  if (!valid) e = CacheEntry{t.impl_ptr(), t.impl().storage, t.version(), recording, t.to(dtype)};
  return e.cast;
}

}  // namespace

bool is_enabled(DeviceType type) { return state_of(type).enabled; }
DType dtype(DeviceType type) { return state_of(type).dtype; }
State state(DeviceType type) { return state_of(type); }

void set_state(DeviceType type, State s) {
  if (s.enabled) check_dtype("autocast::set_state", type, s.dtype);
  state_of(type) = s;
  detail::any_enabled = states[0].enabled || states[1].enabled;
}

void clear_cache() { cache.clear(); }
size_t cache_size() { return cache.size(); }

bool is_cached_cast(const Tensor& t) {
  if (!t.defined()) return false;
  for (const auto& [key, entry] : cache)
    if (entry.cast.defined() && entry.cast.shares_storage(t)) return true;
  return false;
}

std::optional<std::vector<Tensor>> detail::cast_inputs(Policy policy, std::initializer_list<const Tensor*> inputs) {
  bool any = false;
  for (const Tensor* t : inputs) any = any || (t->defined() && target_dtype(policy, *t) != t->dtype());
  if (!any) return std::nullopt;
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    const DType target = target_dtype(policy, *t);
    out.push_back(t->defined() && target != t->dtype() ? cast(*t, target) : *t);
  }
  return out;
}

}  // namespace frugal::autocast

namespace frugal {

AutocastGuard::AutocastGuard(Device device, DType dtype, bool enabled)
    : type_(device.type), outer_(autocast::state(device.type)) {
  if (enabled) autocast::check_dtype("AutocastGuard", type_, dtype);
  autocast::set_state(type_, {enabled, dtype});
  ++autocast::guard_depth;
}

AutocastGuard::~AutocastGuard() {
  autocast::set_state(type_, outer_);
  if (--autocast::guard_depth == 0) autocast::clear_cache();
}

}  // namespace frugal
