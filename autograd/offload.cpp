// Offloaded saved tensors: saved-tensor hooks that move a block's activations to pinned
// host memory during forward and bring them back, one block ahead, during backward.
//
// Note [Offloaded saved tensors]
// A block run under offload() saves its tensors through SavedTensorHooks (Note [Saved
// tensor hooks]) whose pack copies each one to a pinned host buffer (memory/pinned.h) and
// keeps only that: the saved tensor then holds no device reference, so the activation's
// device memory goes as soon as the forward's own handles do. Parameters (a leaf that
// requires grad, SavedTensorHooks::packing_parameter), autocast's cached weight casts and
// tensors under OffloadOptions::min_bytes stay on the device (their memory is held anyway,
// or too small to be worth a copy); so do host tensors unless OffloadOptions::host_tensors.
//
// Streams. On CUDA every copy, both ways, runs on a side stream, one per device
// (autograd/offload_stream.h), so it overlaps the kernels of the compute stream (the
// current stream). Before each copy the side stream waits on an event recorded on the
// compute stream: a copy to the host starts after the kernel that produced its source, a
// copy back after the kernels that last used its destination's block. Nothing waits on the
// host. The source block is freed while its copy may still be queued, so it is marked used
// on the side stream (memory::record_stream): the allocator parks it until the copy is done
// (Note [Stream-aware reuse] in memory/caching_allocator.h); the pinned buffer is marked too,
// for the copies out of it. A copy back allocates its device block on the compute stream,
// which uses it; the unpack that hands it out makes the compute stream wait on the event
// recorded after the copy (cudaStreamWaitEvent: no host sync), or on nothing when the copy is
// already done. On the CPU (host_tensors) both copies are memcpy through the pinned pool:
// no overlap, the same bookkeeping, so the mechanism is tested without a GPU.
//
// Prefetch. offload() records one node, OffloadBackward, on the block's output: the engine
// runs it before any node of the block (they all need its gradient). It issues the copies
// back of its group and of the group made just before it on the same thread (the previous
// block, whose backward runs next), so the next block's restore overlaps this block's
// backward, as in PyTorch's activation offloading with prefetch. A restored copy is held by
// its OffloadedTensor until every saved tensor sharing it was unpacked, then dropped: the
// device holds at most about two blocks of activations at a time. An unpack with nothing
// in flight restores on demand (a group used without offload(), or a graph whose nodes run
// in another order); both kinds are counted (OffloadStats::prefetched, on_demand).
//
// Dedupe. A tensor saved twice (the same storage, offset, sizes, strides, dtype and
// version), in its group or the group before (a block's input is often the previous
// block's saved output), is copied once and shared. The version makes a tensor written in
// place between two saves a new copy; either save's in-place check still runs in
// SavedValue::unpack, before the hook.
//
// Layout. A saved view comes back with its strides: its span is copied whole, gaps
// included (q, k and v sliced from one projection: each three times its size), unless the
// span is over kMaxGaps times the view, which is then made contiguous first. Kernels choose
// their path by layout (a transposed GEMM operand, a contiguous fast path), and the same
// path is what makes the gradients bit for bit those of the plain run.
//
// Alignment. A view's data pointer is restored at the same offset from a 512-byte boundary
// as it had (the copy back leaves a gap before the span it copies): kernels whose path
// depends on alignment (SIMD peeling on the CPU, cuBLASLt's plans on CUDA) then take the
// path they took in the forward, so the gradients are bit for bit those of the plain run.
//
// A retained graph (retain_graph) restores again on its next backward: the host copy lives
// as long as its saved tensors, the device copy only until it is used.
#include "autograd/offload.h"

#include <chrono>
#include <cstring>
#include <mutex>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/inplace.h"
#include "memory/allocator.h"
#include "memory/pinned.h"
#include "tensor/factory.h"

#if FRUGAL_WITH_CUDA
#include "autograd/offload_stream.h"
#endif

namespace frugal::autograd {

namespace {

std::mutex stats_mutex;
OffloadStats totals;

template <typename F>
void add_to_stats(F&& f) {
  std::lock_guard lock(stats_mutex);
  f(totals);
}

// The group the next one made on this thread follows (Note [Offloaded saved tensors], prefetch).
thread_local std::weak_ptr<OffloadGroup> last_group;

// The elements [first, first + count) of its storage that a view touches (strides >= 0).
struct Span {
  int64_t first = 0, count = 0;
};
Span span_of(const Tensor& t) {
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {t.storage_offset(), last - t.storage_offset() + 1};
}
bool has_negative_stride(const Tensor& t) {
  for (int64_t s : t.strides())
    if (s < 0) return true;
  return false;
}

char* storage_base(const Tensor& t) { return static_cast<char*>(t.impl().storage->data.get()); }

// Storage blocks start 512-byte aligned (Note [Sizes and pools] in memory/caching_allocator.h).
constexpr int64_t kAlignment = 512;
// A saved view is copied with the gaps of its span (keeping its layout) up to this many
// times its own size (a q, k or v slice of a fused projection: 3).
constexpr int64_t kMaxGaps = 4;

}  // namespace

// ---- one offloaded tensor ---------------------------------------------------------

// A saved tensor's bytes in pinned host memory, and its copy back while one is in flight.
// Shared by the saved tensors of one view (dedupe); the host copy goes with the last.
class OffloadedTensor {
 public:
  // Copies the span of t's storage that t views to a pinned buffer, gaps included, so the
  // copy back has t's layout; a view whose span is over kMaxGaps times its elements is
  // made contiguous first, on the device.
  explicit OffloadedTensor(const Tensor& t)
      : storage_(t.impl().storage),
        offset_(t.storage_offset()),
        strides_(t.strides()),
        version_(t.version()),
        sizes_(t.sizes()),
        dtype_(t.dtype()),
        device_(t.device()) {
    Tensor src = t;
    Span span = span_of(t);
    if (span.count > kMaxGaps * t.numel() || has_negative_stride(t)) {  // mostly gaps: copy only the elements
      src = t.contiguous();
      span = span_of(src);
    }
    // The copy back starts as far into a 512-byte-aligned block as the span's start was
    // (Note [Offloaded saved tensors], alignment).
    lead_ = span.first % (kAlignment / int64_t(t.element_size()));
    view_strides_ = src.strides();
    view_offset_ = lead_ + src.storage_offset() - span.first;
    span_elements_ = span.count;
    nbytes_ = size_t(span.count) * t.element_size();
    host_ = memory::allocate_pinned(nbytes_);
    const char* from = storage_base(src) + span.first * int64_t(t.element_size());
    if (device_.is_cpu()) {
      std::memcpy(host_.get(), from, nbytes_);
    } else {
#if FRUGAL_WITH_CUDA
      detail::release_event(detail::copy_on_offload_stream(host_.get(), from, nbytes_, device_));
      const Stream side = detail::offload_stream(device_);
      memory::record_stream(src.impl().storage->data, side);  // freed now, reused once copied
      memory::record_stream(host_, side);                     // by the copies out and back
#else
      FRUGAL_FAIL("offload: frugal was built without CUDA (", t.describe(), ")");
#endif
    }
    users_ = unpacks_left_ = 1;
  }

  ~OffloadedTensor() { drop_restored(); }
  OffloadedTensor(const OffloadedTensor&) = delete;
  OffloadedTensor& operator=(const OffloadedTensor&) = delete;

  // Whether t is the view this copy was made of, as it was then.
  bool holds(const Tensor& t) const {
    return storage_.lock() == t.impl().storage && offset_ == t.storage_offset() && sizes_ == t.sizes() &&
           strides_ == t.strides() && dtype_ == t.dtype() && version_ == t.version();
  }
  // One more saved tensor shares this copy.
  void add_user() {
    std::lock_guard lock(mutex_);
    ++users_;
    ++unpacks_left_;
  }
  int64_t nbytes() const { return int64_t(nbytes_); }

  // Issues the copy back unless one is in flight (Note [Offloaded saved tensors], prefetch).
  void prefetch() {
    std::lock_guard lock(mutex_);
    if (!restored_.defined()) restore(/*ahead=*/true);
  }

  // The saved tensor on its device, ready for the current stream.
  Tensor unpack() {
    std::lock_guard lock(mutex_);
    if (!restored_.defined()) restore(/*ahead=*/false);
    Tensor t = restored_;
#if FRUGAL_WITH_CUDA
    if (ready_) detail::wait_on_current_stream(ready_, device_);
#endif
    if (--unpacks_left_ <= 0) {  // every user has it: the device copy goes with the last
      drop_restored();
      unpacks_left_ = users_;  // a retained graph's next backward restores again
    }
    return t;
  }

 private:
  // Allocates the device copy on the current stream and fills it from the host.
  void restore(bool ahead) {
    const auto start = std::chrono::steady_clock::now();
    Tensor base = empty({lead_ + span_elements_}, {dtype_, device_});
    char* to = static_cast<char*>(base.data()) + lead_ * int64_t(element_size(dtype_));
    if (device_.is_cpu()) {
      std::memcpy(to, host_.get(), nbytes_);
    } else {
#if FRUGAL_WITH_CUDA
      ready_ = detail::copy_on_offload_stream(to, host_.get(), nbytes_, device_);
      memory::record_stream(base.impl().storage->data, detail::offload_stream(device_));
#endif
    }
    restored_ = base.as_strided(sizes_, view_strides_, view_offset_);
    const double ms = device_.is_cpu()
                          ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()
                          : 0.0;
    add_to_stats([&](OffloadStats& s) {
      s.bytes_restored += int64_t(nbytes_);
      ++(ahead ? s.prefetched : s.on_demand);
      if (!ahead) s.wait_ms += ms;  // the unpack waited for it (CUDA: measured on the stream)
    });
  }

  void drop_restored() {
    restored_ = Tensor();
#if FRUGAL_WITH_CUDA
    if (ready_) detail::release_event(ready_);
#endif
    ready_ = nullptr;
  }

  // What was saved, to recognise a second save of it.
  std::weak_ptr<Storage> storage_;
  int64_t offset_;
  Shape strides_;
  uint64_t version_;
  // The host copy: span_elements_ elements, the saved view at view_offset_ with view_strides_.
  Shape sizes_;
  DType dtype_;
  Device device_;
  Shape view_strides_;
  int64_t lead_ = 0, view_offset_ = 0, span_elements_ = 0;  // the copy back: lead_ elements, then the span
  size_t nbytes_ = 0;
  DataPtr host_;

  std::mutex mutex_;  // guards what follows: prefetch and unpack may come from different threads
  int users_ = 0, unpacks_left_ = 0;
  Tensor restored_;        // the copy back, from its issue until its last user's unpack
  void* ready_ = nullptr;  // CUDA: completes with the copy into restored_
};

// ---- a group --------------------------------------------------------------------------

OffloadGroup::OffloadGroup(OffloadOptions options) : options_(options) {
  FRUGAL_CHECK(options_.min_bytes >= 0, "offload: min_bytes must be >= 0, got ", options_.min_bytes);
}

std::shared_ptr<OffloadedTensor> OffloadGroup::find(const Tensor& t) const {
  std::lock_guard lock(mutex_);
  auto [first, last] = tensors_.equal_range(t.impl().storage.get());
  for (auto it = first; it != last; ++it)
    if (auto e = it->second.lock(); e && e->holds(t)) return e;
  return nullptr;
}

PackedTensor OffloadGroup::pack(const Tensor& t) {
  const int64_t nbytes = t.numel() * int64_t(t.element_size());
  const bool keep = t.numel() == 0 || nbytes < options_.min_bytes || SavedTensorHooks::packing_parameter() ||
                    (t.device().is_cpu() && !options_.host_tensors) || autocast::is_cached_cast(t);
  if (keep) {
    add_to_stats([&](OffloadStats& s) { s.bytes_kept_on_device += nbytes; });
    return t;
  }
  std::shared_ptr<OffloadedTensor> e = find(t);
  if (!e)
    if (std::shared_ptr<OffloadGroup> before = previous()) e = before->find(t);
  if (e) {
    e->add_user();
    add_to_stats([](OffloadStats& s) { ++s.deduplicated; });
  } else {
    e = std::make_shared<OffloadedTensor>(t);
    add_to_stats([&](OffloadStats& s) {
      ++s.tensors_offloaded;
      s.bytes_offloaded += e->nbytes();
    });
  }
  {
    std::lock_guard lock(mutex_);
    bool listed = false;
    auto [first, last] = tensors_.equal_range(t.impl().storage.get());
    for (auto it = first; it != last && !listed; ++it) listed = it->second.lock() == e;
    if (!listed) {
      tensors_.emplace(t.impl().storage.get(), e);
      order_.push_back(e);
    }
  }
  return e;
}

void OffloadGroup::prefetch() {
  std::vector<std::shared_ptr<OffloadedTensor>> live;
  {
    std::lock_guard lock(mutex_);
    // Backward uses a block's tensors in about the reverse order of saving: issue them so.
    for (auto it = order_.rbegin(); it != order_.rend(); ++it)
      if (auto e = it->lock()) live.push_back(std::move(e));
  }
  for (const auto& e : live) e->prefetch();
}

int64_t OffloadGroup::host_bytes() const {
  std::lock_guard lock(mutex_);
  int64_t total = 0;
  for (const auto& w : order_)
    if (auto e = w.lock()) total += e->nbytes();
  return total;
}

namespace {
Tensor unpack_offloaded(const PackedTensor& packed) {
  if (const auto* e = std::any_cast<std::shared_ptr<OffloadedTensor>>(&packed)) return (*e)->unpack();
  return std::any_cast<const Tensor&>(packed);  // kept on the device
}

}  // namespace

SavedTensorHooks::Pack OffloadGroup::Scope::pack_into(const std::shared_ptr<OffloadGroup>& group) {
  FRUGAL_CHECK(group != nullptr, "OffloadGroup::Scope: the group is null");
  return [group](const Tensor& t) { return group->pack(t); };
}

OffloadGroup::Scope::Scope(const std::shared_ptr<OffloadGroup>& group) : hooks_(pack_into(group), unpack_offloaded) {
  group->previous_ = last_group;
  last_group = group;
}

// ---- offload() -------------------------------------------------------------------

namespace {
// Passes the gradient through; its only work is the prefetch (Note [Offloaded saved tensors]).
struct OffloadBackward final : Node {
  std::shared_ptr<OffloadGroup> group;

  std::string name() const override { return "OffloadBackward"; }
  bool saves_tensors() const override { return false; }  // runs again on a retained graph

  TensorList apply(TensorList&& grads) override {
    group->prefetch();
    if (std::shared_ptr<OffloadGroup> before = group->previous()) before->prefetch();
    return std::move(grads);
  }
};
}  // namespace

Tensor offload(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, OffloadOptions options) {
  FRUGAL_CHECK(fn != nullptr, "offload: the function to run is empty");
  auto group = std::make_shared<OffloadGroup>(options);
  Tensor y;
  {
    OffloadGroup::Scope scope(group);
    y = fn(x);
  }
  if (!y.defined()) return y;
  if (auto node = make_node<OffloadBackward>({y})) {
    node->group = std::move(group);
    // A new handle: y may be x itself, or any tensor fn captured, whose history must stay.
    // fn recorded its ops, so nothing tells those from its own results: the handle refuses
    // in-place writes while another tensor holds its storage (Note [Aliases of transform outputs]).
    Tensor out = alias_for_history(y, /*aliased=*/true);
    record(node, {out});
    return out;
  }
  return y;
}

// ---- statistics ----------------------------------------------------------------------

OffloadStats offload_stats() {
#if FRUGAL_WITH_CUDA
  const double stalled = detail::take_stall_ms();
#else
  const double stalled = 0;
#endif
  std::lock_guard lock(stats_mutex);
  totals.wait_ms += stalled;
  return totals;
}

void reset_offload_stats() {
#if FRUGAL_WITH_CUDA
  (void)detail::take_stall_ms();
#endif
  std::lock_guard lock(stats_mutex);
  totals = OffloadStats{};
}

}  // namespace frugal::autograd
