#pragma once
// Offloaded saved tensors: the activations a block saves for backward wait in pinned host
// memory instead of on the device (see Note [Offloaded saved tensors] in autograd/offload.cpp).
//
//   // Each block's saved activations go to the host during forward and come back, one
//   // block ahead, during backward.
//   for (auto& block : blocks) h = autograd::offload([&](const Tensor& x) { return block->forward(x); }, h);
//   loss(h).backward();
//   autograd::OffloadStats s = autograd::offload_stats();  // bytes moved, prefetches, stalls
//
// Built on the saved-tensor hooks (Note [Saved tensor hooks] in autograd/saved_tensor.h):
// gradients are those of the plain run, bit for bit, and the version check is kept.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "autograd/node.h"
#include "autograd/saved_tensor.h"
#include "core/device.h"

namespace frugal::autograd {

/// Which saved tensors an offload group moves to the host.
struct OffloadOptions {
  /// Saved tensors smaller than this stay on the device.
  int64_t min_bytes = 1 << 20;
  /// Whether tensors on the host (CPU tensors) go through the pinned pool too. It frees
  /// nothing, but runs the whole mechanism where there is no GPU, so it can be tested there;
  /// by default it is on exactly when this process sees no CUDA device.
  bool host_tensors = cuda_device_count() == 0;
};

/// Process-wide totals since the last reset_offload_stats().
struct OffloadStats {
  int64_t tensors_offloaded = 0;     ///< distinct saved tensors copied to the host
  int64_t bytes_offloaded = 0;       ///< bytes copied to the host
  int64_t bytes_restored = 0;        ///< bytes copied back (again on each backward of a retained graph)
  int64_t bytes_kept_on_device = 0;  ///< bytes of saved tensors left where they were (small, parameters)
  int64_t deduplicated = 0;          ///< saves that shared an earlier copy of the same tensor
  int64_t prefetched = 0;            ///< restores whose copy was issued ahead (prefetch), not on demand
  int64_t on_demand = 0;             ///< restores issued by the unpack that needed them
  /// Time unpack waited for copies, 0 when they were fully overlapped: on the CPU the host
  /// time of on-demand copies; on CUDA the time the compute stream stalled on a copy that
  /// was not done (event-measured; offload_stats() waits for those events).
  double wait_ms = 0;
};
OffloadStats offload_stats();
void reset_offload_stats();

class OffloadedTensor;

/// The saved tensors of one block, on the host. Tensors saved while an OffloadGroup::Scope
/// lives go to its group; prefetch() issues the copies back of those still on the host.
/// Each group knows the group made before it on the same thread, which offload() prefetches
/// one block ahead. Owned through shared_ptr: by the scope's hooks, which every saved
/// tensor of the group keeps, and by the backward node offload() records.
class OffloadGroup {
 public:
  explicit OffloadGroup(OffloadOptions options = {});
  OffloadGroup(const OffloadGroup&) = delete;
  OffloadGroup& operator=(const OffloadGroup&) = delete;

  /// Starts restoring every tensor of the group that is on the host and not yet restoring:
  /// on CUDA the copies go on the side stream and unpack makes the compute stream wait for
  /// them; on the CPU they are done on return.
  void prefetch();
  /// The group made before this one on this thread, while it lives.
  std::shared_ptr<OffloadGroup> previous() const { return previous_.lock(); }
  const OffloadOptions& options() const { return options_; }
  /// Bytes of the group's saved tensors now held on the host.
  int64_t host_bytes() const;

  /// Sends the tensors saved on this thread while it lives to `group` (guards nest; the
  /// innermost applies) and makes `group` the one the next group on this thread follows.
  class Scope {
   public:
    explicit Scope(const std::shared_ptr<OffloadGroup>& group);
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    static SavedTensorHooks::Pack pack_into(const std::shared_ptr<OffloadGroup>& group);
    SavedTensorHooks hooks_;
  };

 private:
  friend class OffloadedTensor;
  PackedTensor pack(const Tensor& t);
  std::shared_ptr<OffloadedTensor> find(const Tensor& t) const;

  OffloadOptions options_;
  std::weak_ptr<OffloadGroup> previous_;
  mutable std::mutex mutex_;  // guards what follows (saves and prefetches may be on different threads)
  // The group's offloaded tensors, in the order they were saved and by the storage they
  // view (a second save of the same view shares the copy). Weak: a copy lives as long as
  // the saved tensors that use it.
  std::vector<std::weak_ptr<OffloadedTensor>> order_;
  std::unordered_multimap<const Storage*, std::weak_ptr<OffloadedTensor>> tensors_;
};

/// fn(x) with the tensors its forward saves for backward offloaded to pinned host memory
/// (those of at least options.min_bytes that are not parameters). When backward reaches
/// the block's output, the copies back of this block and of the block offloaded just
/// before it on this thread are issued, so the next block's restore overlaps this one's
/// backward. The output refuses in-place writes while another tensor holds its storage (it
/// may be x or a tensor fn captured: Note [Aliases of transform outputs]).
Tensor offload(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, OffloadOptions options = {});

}  // namespace frugal::autograd
