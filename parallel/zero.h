#pragma once
// ZeRO stages 1 and 2 (Rajbhandari et al., 2020; llm.c zero.cuh; DeepSpeed's stage 2):
// AdamW whose state (stage 1), and gradients (stage 2), are sharded across the
// data-parallel ranks (see Notes [ZeRO-1 step] and [ZeRO-2] in parallel/zero.cpp). Stage 3
// (parameters sharded too) is parallel::FullyShardedDataParallel (parallel/fsdp.h).
//
//   parallel::ZeroAdamW opt(model->parameters(), dp_comm, {.lr = 3e-4}, {.stage = 2});
//   loss.backward();   // plain backward, no DDP wrapper. Stage 2: buckets reduce-scatter as it runs
//   opt.step();        // (stage 1: reduce-scatter grads), AdamW on this rank's shard, all-gather params
//   opt.zero_grad();
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "optim/adam.h"
#include "parallel/communicator.h"
#include "parallel/grad_buckets.h"

namespace frugal::optim {
class GradScaler;
}

namespace frugal::parallel {

struct ZeroOptions {
  /// 1: optimizer state sharded; the step reduce-scatters the full .grad.
  /// 2: gradients sharded too: buckets reduce-scatter during backward, and after backward
  ///    the parameters' .grad are undefined: the averaged gradient exists only as this
  ///    rank's shard, gradient_shard().
  int stage = 1;
  /// Stage 2: bucket capacity in bytes, as DDP's (Note [Gradient buckets]).
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
};

/// Per-rank bytes of what ZeroAdamW holds or sees (Note [ZeRO-2] has the formulas).
struct ZeroMemoryReport {
  int64_t parameter_bytes = 0;        // the full parameters (every rank) + this rank's shard (the optimizer's leaf)
  int64_t param_grad_bytes = 0;       // the parameters' .grad that are defined now
  int64_t gradient_shard_bytes = 0;   // this rank's (averaged) gradient shard, when defined
  int64_t bucket_bytes = 0;           // stage 2: bucket buffers alive now (flat + reduce-scatter output)
  int64_t bucket_bytes_peak = 0;      // stage 2: their peak since construction (measured at each launch)
  int64_t optimizer_state_bytes = 0;  // exp_avg and exp_avg_sq of the shard, once the first step made them
};

/// AdamW over `params` (one dtype, on the communicator's device) with exp_avg and exp_avg_sq
/// held only for this rank's 1/size of the flattened parameters: optimizer memory drops
/// from 2N to 2N/size per rank, for one reduce-scatter and one all-gather per step (the
/// same bytes as DDP's all-reduce). Stage 2 also keeps only the gradient shard (N/size plus
/// the buckets in flight instead of N). Every rank must run every backward and step. Not
/// copyable or movable (stage 2's backward hooks hold `this`).
///
/// Clipping and loss scaling act on the averaged gradient shard (Note [ZeRO clipping and loss
/// scaling] in parallel/zero.cpp), never on the parameters' .grad:
///
///   optim::GradScaler scaler({.sync_found_inf = opt.found_inf_sync()});
///   scaler.scale(loss).backward();
///   opt.unscale_(scaler);            // reduce into the shard (stage 1), unscale it
///   opt.clip_grad_norm_(1.0);        // the whole model's norm, the same on every rank
///   opt.step(scaler);                // skipped on every rank if any rank's shard overflowed
///   scaler.update();
class ZeroAdamW {
 public:
  ZeroAdamW(std::vector<Tensor> params, std::shared_ptr<Communicator> comm, optim::AdamWOptions options = {},
            ZeroOptions zero = {});
  ~ZeroAdamW();
  ZeroAdamW(const ZeroAdamW&) = delete;
  ZeroAdamW& operator=(const ZeroAdamW&) = delete;

  /// Averages the gradients over the ranks (reduce_gradients(); stage 2 did so during
  /// backward), updates this rank's shard with frugal's AdamW math (optim::AdamW on the
  /// shard), and gathers the updated parameters on every rank.
  void step();
  /// As step(), through `scaler`: scaler.step on the shard (skipped, on every rank, when a
  /// rank's shard had an inf or NaN), then the all-gather. unscale_ first unless done.
  void step(optim::GradScaler& scaler);
  /// Makes this rank's averaged gradient shard now, as step() would (every rank must call
  /// it): stage 1 reduce-scatters the parameters' .grad and drops them, stage 2 waits for the
  /// buckets in flight. Then shard_optimizer()'s one parameter has the shard as its .grad.
  /// Called again before the step, it does nothing; a backward in between is refused (its
  /// gradient would miss the unscale or clip already applied to the shard).
  void reduce_gradients();
  /// optim::clip_grad_norm_ of the whole model: reduce_gradients(), then the ranks' shards'
  /// |g|^p sums are all-reduced before the coefficient is taken, so every rank clips by the
  /// same norm, which it returns (float64). Every rank must call it.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0);
  /// reduce_gradients(), then scaler.unscale_ of the shard. With more than one rank the scaler
  /// must have been made with `.sync_found_inf = found_inf_sync()` (an overflow in one rank's
  /// shard must skip every rank's step, or the shards step apart): refused otherwise.
  void unscale_(optim::GradScaler& scaler);
  /// For optim::GradScalerOptions::sync_found_inf: all-reduces a found_inf flag with Max.
  std::function<void(const Tensor&)> found_inf_sync() const;
  /// Resets the parameters' .grad and the gradient shard (to undefined, or zeros).
  void zero_grad(bool set_to_none = true);

  /// Stage 2: while the returned guard lives, backward only accumulates .grad locally
  /// (full size, as DDP's no_sync); the next backward outside it folds the sum into the shard.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(GradientBuckets& b) : buckets_(b), was_(b.sync_enabled()) { b.set_sync_enabled(false); }
    ~NoSyncGuard() { buckets_.set_sync_enabled(was_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    GradientBuckets& buckets_;
    bool was_;
  };
  [[nodiscard]] NoSyncGuard no_sync();

  /// The AdamW that owns this rank's shard (its param_groups drive lr schedules; its
  /// state_dict is this rank's part of the optimizer state).
  optim::AdamW& shard_optimizer() { return *inner_; }
  /// Elements of the flattened parameters this rank updates: the sum over buckets of
  /// padded bucket / size (stage 1: one bucket of all the parameters).
  int64_t shard_numel() const { return shard_.numel(); }
  /// This rank's averaged gradient shard (shard_numel() elements, bucket by bucket, each
  /// bucket's chunk `rank`); undefined before the first backward after zero_grad(). Stage 1
  /// computes it in reduce_gradients() (or step()).
  const Tensor& gradient_shard() const { return grad_shard_; }
  /// Which parameters each bucket (unit of sharding) holds, reverse parameter order.
  std::vector<std::vector<size_t>> bucket_assignment() const;
  ZeroMemoryReport memory_report() const;
  int stage() const { return stage_; }

 private:
  struct InFlight {  // stage 2: a launched bucket's reduce-scatter
    size_t bucket;
    std::shared_ptr<Work> work;
    Tensor out;  // this rank's chunk of the bucket's mean gradient
  };
  void launch(size_t b);
  void retire_oldest();
  void retire_all();
  /// reduce_gradients(), naming the public method `op` in its errors.
  void reduce(const char* op);
  /// Stage 1: reduce-scatters the parameters' .grad, adds the result into the shard and
  /// drops them.
  void reduce_full_grads(const char* op);
  /// Refuses parameter k unless it had a gradient since the last zero_grad(set_to_none).
  void check_had_grad(size_t k, const char* op) const;
  /// All-gathers the updated shard into every rank's parameters (Note [ZeRO-1 step], 3).
  void gather_params();
  /// Refuses a scaler that does not share overflows across the ranks.
  void check_scaler(const optim::GradScaler& scaler, const char* op) const;
  int64_t live_bucket_bytes() const;

  std::vector<Tensor> params_;
  std::shared_ptr<Communicator> comm_;
  int stage_ = 1;
  std::vector<GradientBucket> layout_;  // the buckets: the units that are sharded
  std::vector<int64_t> shard_offset_;   // per bucket: where its chunk starts in the shard
  Tensor shard_;                        // this rank's slice of the flattened parameters, the inner optimizer's leaf
  Tensor grad_shard_;                   // its averaged gradient
  std::unique_ptr<optim::AdamW> inner_;
  std::unique_ptr<GradientBuckets> buckets_;  // stage 2: the backward hooks
  std::deque<InFlight> in_flight_;
  int64_t bucket_bytes_peak_ = 0;
  int64_t backward_rounds_ = 0;  // stage 2: backward passes that ended (their gradients in the shard)
  // Set by reduce_gradients() until the step or zero_grad(): the shard holds every gradient
  // so far and may since have been unscaled or clipped. Stage 2: backward_rounds_ then.
  bool reduced_ = false;
  // Stage 1, per parameter: had a .grad since the last zero_grad(set_to_none) (stage 2's
  // buckets keep the same: GradientBuckets::received).
  std::vector<bool> had_grad_;
  int64_t reduced_rounds_ = 0;
};

}  // namespace frugal::parallel
