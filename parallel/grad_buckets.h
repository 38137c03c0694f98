#pragma once
// Gradient buckets filled by backward hooks: the mechanism DistributedDataParallel
// (all-reduce per bucket) and ZeRO-2 (reduce-scatter per bucket) share. See Note
// [Gradient buckets] in parallel/grad_buckets.cpp.
//
//   GradientBuckets buckets(params, {.bucket_cap_bytes = 25 << 20},
//                           [&](size_t b) { work[b] = comm.all_reduce(buckets.bucket(b).flat); },
//                           [&] { /* wait, copy back */ });
//   loss.backward();  // launch(b) fires per full bucket, in index order; end_of_round() before it returns
#include <cstdint>
#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::parallel {

struct GradientBucketOptions {
  /// Bucket capacity in bytes (PyTorch's bucket_cap_mb = 25). A parameter larger than
  /// this gets a bucket of its own.
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
  /// Each bucket's flat buffer holds a multiple of this many elements, the tail zero
  /// (ZeRO-2: the world size, so the buffer reduce-scatters in equal chunks).
  int64_t pad_to = 1;
  /// Drop a parameter's .grad once it is copied into its bucket (ZeRO-2: the full
  /// gradient does not outlive the hook). Under no_sync the hooks do nothing, so .grad stays.
  bool release_grads = false;
};

/// One bucket: parameters (indices into the parameter list, reverse order) packed into
/// one flat buffer.
struct GradientBucket {
  std::vector<size_t> params;
  std::vector<int64_t> offsets;  // element offset of each parameter's slot in flat
  int64_t numel = 0;             // the parameters' elements
  int64_t padded = 0;            // numel rounded up to pad_to
  /// The bucket's gradients (padded elements), allocated when the first gradient arrives
  /// if undefined; a client may keep it (DDP) or reset it after its collective (ZeRO-2).
  Tensor flat;
};

/// Packs `params` in reverse order into buckets of about cap bytes, one dtype each.
std::vector<GradientBucket> assign_buckets(const std::vector<Tensor>& params, int64_t bucket_cap_bytes,
                                           int64_t pad_to = 1);

/// A gradient that arrived after its bucket was launched (Note [Late gradients] in
/// parallel/grad_buckets.cpp): `flat` is laid out as bucket `b`, holding the late parameters'
/// gradients (with release_grads, what arrived since the launch; otherwise their whole .grad)
/// and zeros elsewhere; `params` lists the late parameters.
using LateGradients = std::function<void(size_t b, const Tensor& flat, const std::vector<size_t>& params)>;

/// Registers a post-accumulate-grad hook on every parameter (removed by the destructor).
/// During a backward, each hook copies the parameter's gradient into its bucket's slot;
/// a full bucket is passed to launch(b) once every earlier bucket was (index order, the
/// same on every rank). The first hook queues finish() at the end of the outermost
/// backward run, so the round ends before backward() returns. A gradient arriving after its
/// bucket was launched goes to `late` after end_of_round (refused without one). Not copyable
/// or movable (the hooks hold `this`).
class GradientBuckets {
 public:
  GradientBuckets(std::vector<Tensor> params, GradientBucketOptions options, std::function<void(size_t)> launch,
                  std::function<void()> end_of_round, LateGradients late = {});
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  /// Fills the slots backward did not reach with the parameter's .grad, or zeros when it
  /// has none; launches the remaining buckets, calls end_of_round() and resets the round.
  /// A no-op when no gradient arrived since the last round.
  void finish();

  /// While false, the hooks do nothing (no_sync: .grad accumulates locally).
  bool sync_enabled() const { return sync_enabled_; }
  void set_sync_enabled(bool on) { sync_enabled_ = on; }

  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  GradientBucket& bucket(size_t b) { return buckets_[b]; }
  /// Parameter k's slot in its bucket's flat buffer, shaped as the parameter.
  Tensor slot(size_t k) const;
  /// Parameter k's slot in `flat`, a buffer laid out as k's bucket.
  Tensor slot_in(const Tensor& flat, size_t k) const;
  /// Which parameters each bucket holds, in launch order.
  std::vector<std::vector<size_t>> assignment() const;
  /// Whether parameter k has had a gradient in a round since clear_received() (slots of
  /// parameters without one are filled with zeros).
  bool received(size_t k) const { return received_[k]; }
  void clear_received() { received_.assign(params_.size(), false); }

 private:
  void on_grad_ready(size_t k);
  void note_late(size_t k);
  void fill(size_t k, const Tensor& grad);
  void queue_finish_at_end_of_backward();
  void launch_ready_buckets();

  std::vector<Tensor> params_;
  GradientBucketOptions options_;
  std::function<void(size_t)> launch_;
  std::function<void()> end_of_round_;
  LateGradients late_;
  std::vector<GradientBucket> buckets_;
  std::vector<uint64_t> hook_ids_;
  std::vector<size_t> bucket_of_;                 // param index -> bucket
  std::vector<size_t> slot_in_bucket_;            // param index -> position in its bucket
  std::vector<size_t> pending_;                   // per bucket: slots filled this round
  std::vector<bool> ready_;                       // this round: the param's gradient is in its bucket
  std::vector<bool> received_;                    // since clear_received(): the param had a gradient
  std::vector<Tensor> late_flat_;                 // per bucket: this round's late gradients
  std::vector<std::vector<size_t>> late_params_;  // per bucket: the parameters in late_flat_
  size_t next_to_launch_ = 0;
  bool round_active_ = false;
  bool callback_queued_ = false;  // finish is queued on the running backward
  bool sync_enabled_ = true;
};

}  // namespace frugal::parallel
