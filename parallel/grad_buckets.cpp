// Gradient buckets filled by backward hooks (DistributedDataParallel, ZeRO-2).
//
// Note [Gradient buckets]
// Backward produces gradients roughly in reverse parameter order (the last layer's
// first), so parameters are packed, in reverse order, into buckets of about
// bucket_cap_bytes (one dtype per bucket). A post-accumulate-grad hook on every
// parameter (autograd::register_post_accumulate_grad_hook, run by AccumulateGrad right
// after .grad received this backward's contribution) copies the gradient into its slot of
// the bucket's flat buffer; when a bucket's last slot is filled its collective is launched
// asynchronously (DDP: all-reduce; ZeRO-2: reduce-scatter, Note [ZeRO-2] in
// parallel/zero.cpp) and backward goes on computing earlier layers' gradients while it
// runs: communication hides behind computation, and one large collective per bucket
// instead of one per parameter amortises the latency.
// Every rank must issue the same collectives in the same order, but the order in which
// buckets fill can differ between ranks (a parameter unused on one rank); so buckets
// launch strictly in index order: a full bucket waits until all earlier ones launched.
// finish() fills what backward never reached with the parameter's .grad or zeros (an
// unused parameter contributes nothing to the mean), launches the rest and hands over to
// the client's end_of_round (DDP: wait, copy the averaged buffer back into each .grad).
// It runs by itself at the end of backward, as in PyTorch: the first hook that fires in a
// backward queues it with autograd::queue_callback(CallbackRun::Outermost) (Note [Backward
// callbacks] in autograd/engine.cpp), so it runs after the engine's last node, before
// backward() returns. Outermost, not the current run: a hook firing inside a checkpoint's
// recompute runs in a nested engine run, which ends before the outer run reaches the other
// parameters. The queued lambda owns a token that clears callback_queued_ when the engine
// destroys it, run or dropped (a node threw), so the next backward queues afresh. Calling
// finish() explicitly afterwards finds no round active: a no-op.
// no_sync (sync disabled): the hooks do nothing (no callback either), so .grad accumulates
// locally; the next synced backward copies the accumulated .grad (all micro-batches' sum)
// into the bucket.
//
// Note [Late gradients]
// A checkpoint's replay is a nested backward of its own, so a parameter used by two
// checkpointed forwards summed into one loss (a siamese pair, micro-batches in one loss)
// gets its gradient accumulated twice in one backward, the second time after its bucket
// was launched with the first. (A plain run, and PyTorch's non-reentrant checkpoint, sum
// the uses first; PyTorch's reentrant one refuses: "mark a variable ready only once".)
// Such a late gradient goes to a second buffer laid out as its bucket: with release_grads
// (ZeRO-2) what arrived since the slot was filled, which adds up, since the client sums the
// reduce-scatters; otherwise (DDP) the parameter's whole .grad, which replaces the slot's
// value. After end_of_round, each bucket that had one is handed to the client's late
// callback, in index order (every rank runs the same program, so every rank has the same
// late buckets): DDP all-reduces it and copies the late parameters' slots into their .grad;
// ZeRO-2 reduce-scatters it into its shard.
#include "parallel/grad_buckets.h"

#include <algorithm>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/fill.h"

namespace frugal::parallel {

std::vector<GradientBucket> assign_buckets(const std::vector<Tensor>& params, int64_t bucket_cap_bytes,
                                           int64_t pad_to) {
  FRUGAL_CHECK(bucket_cap_bytes > 0 && pad_to > 0, "assign_buckets: bucket_cap_bytes (", bucket_cap_bytes,
               ") and pad_to (", pad_to, ") must be positive");
  std::vector<GradientBucket> buckets;
  int64_t bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const Tensor& p = params[k];
    const int64_t nbytes = p.numel() * int64_t(p.element_size());
    const bool fresh = buckets.empty() || bytes + nbytes > bucket_cap_bytes ||
                       params[buckets.back().params.front()].dtype() != p.dtype();
    if (fresh) {
      buckets.emplace_back();
      bytes = 0;
    }
    GradientBucket& b = buckets.back();
    b.offsets.push_back(b.numel);
    b.params.push_back(k);
    b.numel += p.numel();
    bytes += nbytes;
  }
  for (GradientBucket& b : buckets) b.padded = (b.numel + pad_to - 1) / pad_to * pad_to;
  return buckets;
}

GradientBuckets::GradientBuckets(std::vector<Tensor> params, GradientBucketOptions options,
                                 std::function<void(size_t)> launch, std::function<void()> end_of_round,
                                 LateGradients late)
    : params_(std::move(params)),
      options_(options),
      launch_(std::move(launch)),
      end_of_round_(std::move(end_of_round)),
      late_(std::move(late)),
      buckets_(assign_buckets(params_, options.bucket_cap_bytes, options.pad_to)) {
  bucket_of_.resize(params_.size());
  slot_in_bucket_.resize(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t j = 0; j < buckets_[b].params.size(); ++j) {
      bucket_of_[buckets_[b].params[j]] = b;
      slot_in_bucket_[buckets_[b].params[j]] = j;
    }
  pending_.assign(buckets_.size(), 0);
  ready_.assign(params_.size(), false);
  received_.assign(params_.size(), false);
  late_flat_.resize(buckets_.size());
  late_params_.resize(buckets_.size());
  for (size_t k = 0; k < params_.size(); ++k)
    hook_ids_.push_back(
        autograd::register_post_accumulate_grad_hook(params_[k], [this, k](const Tensor&) { on_grad_ready(k); }));
}

GradientBuckets::~GradientBuckets() {
  for (size_t k = 0; k < params_.size(); ++k) autograd::remove_post_accumulate_grad_hook(params_[k], hook_ids_[k]);
}

Tensor GradientBuckets::slot(size_t k) const { return slot_in(buckets_[bucket_of_[k]].flat, k); }

Tensor GradientBuckets::slot_in(const Tensor& flat, size_t k) const {
  const GradientBucket& b = buckets_[bucket_of_[k]];
  return flat.narrow(0, b.offsets[slot_in_bucket_[k]], params_[k].numel()).view(params_[k].sizes());
}

std::vector<std::vector<size_t>> GradientBuckets::assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const GradientBucket& b : buckets_) out.push_back(b.params);
  return out;
}

void GradientBuckets::queue_finish_at_end_of_backward() {
  if (callback_queued_) return;
  struct QueuedFlag {  // clears the flag when the engine destroys the callback, run or dropped
    bool& queued;
    ~QueuedFlag() { queued = false; }
  };
  auto token = std::make_shared<QueuedFlag>(QueuedFlag{callback_queued_});
  callback_queued_ = true;
  autograd::queue_callback([this, token] { finish(); }, autograd::CallbackRun::Outermost);
}

void GradientBuckets::fill(size_t k, const Tensor& grad) {
  GradientBucket& b = buckets_[bucket_of_[k]];
  if (!b.flat.defined()) {
    b.flat = empty({b.padded}, params_[k].options());
    if (b.padded > b.numel) ops::zero_(b.flat.narrow(0, b.numel, b.padded - b.numel));
  }
  if (grad.defined() && ready_[k] && options_.release_grads) ops::add_(slot(k), grad);  // reached twice, before launch
  else if (grad.defined()) slot(k).copy_(grad);
  else slot(k).copy_(zeros(params_[k].sizes(), params_[k].options()));
  if (options_.release_grads && grad.defined()) params_[k].set_grad(Tensor());
  if (grad.defined()) received_[k] = true;
  if (!ready_[k]) {
    ready_[k] = true;
    ++pending_[bucket_of_[k]];
  }
}

void GradientBuckets::on_grad_ready(size_t k) {
  if (!sync_enabled_) return;
  queue_finish_at_end_of_backward();
  round_active_ = true;
  autograd::NoGradGuard no_grad;
  if (bucket_of_[k] < next_to_launch_) return note_late(k);
  fill(k, params_[k].grad());
  launch_ready_buckets();
}

void GradientBuckets::note_late(size_t k) {
  FRUGAL_CHECK(late_ != nullptr, "gradient buckets: the gradient of parameter ", k, " (", params_[k].describe(),
               ") arrived again after its bucket was launched (a parameter reached twice in one backward, e.g. "
               "inside and outside a checkpoint?)");
  const size_t b = bucket_of_[k];
  const Tensor grad = params_[k].grad();
  if (!grad.defined()) return;
  if (!late_flat_[b].defined()) late_flat_[b] = zeros({buckets_[b].padded}, params_[k].options());
  std::vector<size_t>& late = late_params_[b];
  const bool first = std::find(late.begin(), late.end(), k) == late.end();
  if (first) late.push_back(k);
  // Released: .grad is what arrived since the slot was filled, and adds up. Kept (DDP): .grad
  // is the whole local sum, and replaces what the slot had.
  if (options_.release_grads && !first) ops::add_(slot_in(late_flat_[b], k), grad);
  else slot_in(late_flat_[b], k).copy_(grad);
  if (options_.release_grads) params_[k].set_grad(Tensor());
  received_[k] = true;
}

void GradientBuckets::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && pending_[next_to_launch_] == buckets_[next_to_launch_].params.size())
    launch_(next_to_launch_++);
}

void GradientBuckets::finish() {
  if (!round_active_) return;
  {
    autograd::NoGradGuard no_grad;
    for (size_t k = 0; k < params_.size(); ++k)
      if (!ready_[k]) fill(k, params_[k].grad());
  }
  launch_ready_buckets();
  // The round is over whatever end_of_round does (it may throw: a peer failed).
  pending_.assign(buckets_.size(), 0);
  ready_.assign(params_.size(), false);
  next_to_launch_ = 0;
  round_active_ = false;
  std::vector<Tensor> late_flat(buckets_.size());
  std::vector<std::vector<size_t>> late_params(buckets_.size());
  late_flat.swap(late_flat_);
  late_params.swap(late_params_);
  end_of_round_();
  for (size_t b = 0; b < buckets_.size(); ++b)  // index order, the same on every rank
    if (late_flat[b].defined()) late_(b, late_flat[b], late_params[b]);
}

}  // namespace frugal::parallel
