// ZeRO-1 and ZeRO-2: optimizer state, and gradients, sharded across data-parallel ranks.
//
// Note [ZeRO-1 step]
// The parameters are packed, as DDP's gradient buckets are (Note [Gradient buckets] in
// parallel/grad_buckets.cpp: reverse order, one flat vector per bucket), into buckets each
// padded with zeros to a multiple of the world size P; rank r owns chunk r of every
// bucket, and its shard is those chunks end to end. Stage 1 uses one bucket of all N
// elements, so rank r owns about N/P of them. A step:
//   1. flatten the gradients; reduce_scatter(avg): rank r receives the mean gradient of
//      its chunk only (the same bytes as half of a ring all-reduce);
//   2. optim::AdamW steps the shard (a leaf tensor holding this rank's parameter values),
//      so the moments exist only for the shard: the update is elementwise, so stepping a
//      slice is exactly stepping those elements of the full model;
//   3. all_gather each bucket's updated chunks and copy them back into the parameters
//      (the other half of the all-reduce), the next bucket's gather in flight while one
//      is copied.
// The padding is zero in parameters and gradients, and stays zero under AdamW.
//
// Note [ZeRO-2]
// Stage 2 shards the gradients too, so that no rank ever holds all of them. The buckets
// are DDP's (bucket_cap_bytes, reverse parameter order), and so are the hooks: a
// GradientBuckets copies each parameter's gradient into its bucket as AccumulateGrad
// produces it and then drops the parameter's .grad (release_grads); a full bucket (in
// index order on every rank) launches an asynchronous reduce_scatter(avg) of its padded
// flat buffer into a chunk of padded/P elements, while backward computes earlier layers.
// A launched bucket is retired - its Work waited, its chunk added into this rank's
// gradient shard, its flat buffer freed - as soon as its reduce-scatter has completed, and
// at the latest when more than kMaxInFlight buckets are in flight (bounding memory) or at
// the end of backward (the engine callback that ends the round). Over NCCL, completed()
// polls an event and wait() only orders the compute stream after the collective (no host
// sync), and the freed flat buffer is reused on that stream only, after the collective
// read it (Note [Stream-aware reuse]). What lives when:
//   during backward: the shard (once the first bucket retired), the bucket being filled,
//     at most kMaxInFlight launched ones (flat + chunk), and the .grad of the parameter
//     whose hook is running (AccumulateGrad's output, dropped by the hook);
//   after backward: the shard only. Every parameter's .grad is undefined; the mean
//     gradient of this rank's elements is gradient_shard() (DeepSpeed stage 2 likewise
//     keeps only the partition; a parameter's full gradient exists nowhere);
//   step: shard.grad = the gradient shard, AdamW on the shard, then the all-gather of
//     Note [ZeRO-1 step] (one bucket's gathered buffer at a time, two with the prefetch).
// Gradient accumulation: every backward reduce-scatters its own gradient and adds it into
// the shard, so k backward passes before one step give the sum of k means, as DDP's
// accumulated .grad. Under no_sync() the hooks do nothing and .grad accumulates locally in
// full; the next synced backward copies that sum into the buckets (DDP's no_sync).
// Bytes per rank, for N parameters of e bytes, P ranks, buckets b of n_b elements padded
// to m_b = ceil(n_b / P) * P, S = sum_b m_b / P (shard_numel(), N/P plus < 1 per bucket):
//   parameters: N e (every rank holds the full model for forward) + S e (the shard leaf);
//   gradients at rest: S e; transient during backward: up to (kMaxInFlight + 1) buckets
//     of (m_b + m_b / P) e, plus one parameter's .grad;
//   optimizer state: 2 S e (exp_avg, exp_avg_sq).
// Against stage 1's N e of .grad (plus S e) and DDP's N e of .grad and 2 N e of state.
//
// Note [ZeRO clipping and loss scaling]
// After the reduce-scatter each rank holds the averaged gradient of its own elements only,
// each element on exactly one rank (the padding is zero). The parameters' .grad are no use:
// stage 2 has none, and stage 1's are this rank's own, unaveraged. So clipping and loss
// scaling act on the shard, as DeepSpeed's stage 1/2 and PyTorch's FSDP do:
// - reduce_gradients() makes the shard before the step (stage 1 reduce-scatters and drops
//   the full .grad then, which also frees N e bytes before the optimizer's step) and sets it
//   as the .grad of shard_optimizer()'s parameter;
// - clip_grad_norm_ all-reduces the ranks' sums of |g|^p (maxima for p = inf) so each rank
//   scales its shard by the whole model's coefficient (parallel/sharded_grads.h);
// - a GradScaler unscales the shard, and its found_inf flags must be all-reduced (Max)
//   before they are read: an inf in the gradient lands in one rank's chunk, and that rank
//   alone would skip its step, after which the shards hold different models.
// The shard, once unscaled or clipped, must not receive more gradient: a backward between
// reduce_gradients() and the step would add scaled, unclipped values to it, so it is refused.
// When the scaler skips a step the all-gather still runs (every rank has skipped; it copies
// the unchanged shard back), which keeps every rank's sequence of collectives the same.
#include "parallel/zero.h"

#include <limits>

#include "autograd/grad_mode.h"
#include "optim/grad_scaler.h"
#include "parallel/sharded_grads.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/fill.h"

namespace frugal::parallel {

namespace {
/// Launched buckets a stage-2 rank keeps before it waits for the oldest (Note [ZeRO-2]).
constexpr size_t kMaxInFlight = 2;

int64_t bytes_of(const Tensor& t) { return t.defined() ? t.numel() * int64_t(t.element_size()) : 0; }

/// Parameter k's slot (shaped as the parameter) in `flat`, a buffer laid out as bucket b.
Tensor slot_in(const Tensor& flat, const GradientBucket& b, size_t j, const Tensor& p) {
  return flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
}
}  // namespace

ZeroAdamW::ZeroAdamW(std::vector<Tensor> params, std::shared_ptr<Communicator> comm, optim::AdamWOptions options,
                     ZeroOptions zero)
    : params_(std::move(params)), comm_(std::move(comm)), stage_(zero.stage) {
  FRUGAL_CHECK(comm_, "ZeroAdamW: needs a communicator");
  FRUGAL_CHECK(!params_.empty(), "ZeroAdamW: got an empty parameter list");
  FRUGAL_CHECK(stage_ == 1 || stage_ == 2, "ZeroAdamW: stage must be 1 or 2, got ", stage_,
               " (stage 3, sharded parameters too, wraps the model: parallel::FullyShardedDataParallel in "
               "parallel/fsdp.h)");
  for (const Tensor& p : params_)
    FRUGAL_CHECK(p.dtype() == params_[0].dtype() && p.device() == comm_->device() && p.is_floating_point(),
                 "ZeroAdamW: every parameter must be floating, of one dtype and on the communicator's device ",
                 comm_->device().str(), "; got ", p.describe(), " next to ", params_[0].describe());
  for (size_t k = 0; k < params_.size(); ++k)  // (frozen ones would have no gradient to shard)
    FRUGAL_CHECK(params_[k].requires_grad(), "ZeroAdamW: parameter ", k, " (", params_[k].describe(),
                 ") does not require grad; pass only the trainable parameters");
  const int64_t P = comm_->size();
  if (stage_ == 2) {
    buckets_ = std::make_unique<GradientBuckets>(
        params_, GradientBucketOptions{.bucket_cap_bytes = zero.bucket_cap_bytes, .pad_to = P, .release_grads = true},
        [this](size_t b) { launch(b); },
        [this] {
          retire_all();
          ++backward_rounds_;
        },
        [this](size_t b, const Tensor& flat, const std::vector<size_t>&) {  // Note [Late gradients]
          const int64_t n = layout_[b].padded / comm_->size();
          Tensor out = empty({n}, shard_.options());
          comm_->reduce_scatter(flat, out, ReduceOp::Avg)->wait();
          autograd::NoGradGuard no_grad;
          if (!grad_shard_.defined()) grad_shard_ = zeros({shard_.numel()}, shard_.options());
          ops::add_(grad_shard_.narrow(0, shard_offset_[b], n), out);
        });
    layout_ = buckets_->buckets();
  } else {
    layout_ = assign_buckets(params_, std::numeric_limits<int64_t>::max(), P);
  }
  int64_t shard = 0;
  for (const GradientBucket& b : layout_) {
    shard_offset_.push_back(shard);
    shard += b.padded / P;
  }
  autograd::NoGradGuard no_grad;
  shard_ = empty({shard}, params_[0].options());
  for (size_t i = 0; i < layout_.size(); ++i) {
    const GradientBucket& b = layout_[i];
    Tensor flat = zeros({b.padded}, params_[0].options());
    for (size_t j = 0; j < b.params.size(); ++j) slot_in(flat, b, j, params_[b.params[j]]).copy_(params_[b.params[j]]);
    const int64_t n = b.padded / P;
    shard_.narrow(0, shard_offset_[i], n).copy_(flat.narrow(0, comm_->rank() * n, n));
  }
  inner_ = std::make_unique<optim::AdamW>(std::vector<Tensor>{shard_}, options);
  had_grad_.assign(params_.size(), false);
}

ZeroAdamW::~ZeroAdamW() = default;

ZeroAdamW::NoSyncGuard ZeroAdamW::no_sync() {
  FRUGAL_CHECK(stage_ == 2, "ZeroAdamW.no_sync: only stage 2 syncs in backward; stage 1 syncs in step()");
  return NoSyncGuard(*buckets_);
}

int64_t ZeroAdamW::live_bucket_bytes() const {
  int64_t bytes = 0;
  if (buckets_)
    for (const GradientBucket& b : buckets_->buckets()) bytes += bytes_of(b.flat);
  for (const InFlight& f : in_flight_) bytes += bytes_of(f.out);
  return bytes;
}

void ZeroAdamW::launch(size_t b) {
  const int64_t n = layout_[b].padded / comm_->size();
  InFlight f{b, nullptr, empty({n}, shard_.options())};
  f.work = comm_->reduce_scatter(buckets_->bucket(b).flat, f.out, ReduceOp::Avg);
  in_flight_.push_back(std::move(f));
  bucket_bytes_peak_ = std::max(bucket_bytes_peak_, live_bucket_bytes());
  while (!in_flight_.empty() && (in_flight_.size() > kMaxInFlight || in_flight_.front().work->completed()))
    retire_oldest();
}

void ZeroAdamW::retire_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  f.work->wait();
  buckets_->bucket(f.bucket).flat = Tensor();  // the bucket's full gradient is gone once the chunk is ours
  autograd::NoGradGuard no_grad;
  if (!grad_shard_.defined()) grad_shard_ = zeros({shard_.numel()}, shard_.options());
  ops::add_(grad_shard_.narrow(0, shard_offset_[f.bucket], f.out.numel()), f.out);
}

void ZeroAdamW::retire_all() {
  while (!in_flight_.empty()) retire_oldest();
}

void ZeroAdamW::reduce_full_grads(const char* op) {
  const int64_t P = comm_->size();
  Tensor reduced = empty({shard_.numel()}, shard_.options());
  for (size_t i = 0; i < layout_.size(); ++i) {
    const GradientBucket& b = layout_[i];
    Tensor flat = zeros({b.padded}, params_[0].options());
    for (size_t j = 0; j < b.params.size(); ++j) {
      const size_t k = b.params[j];
      const Tensor g = params_[k].grad();
      if (g.defined()) {
        slot_in(flat, b, j, params_[k]).copy_(g);
        had_grad_[k] = true;
      } else {
        check_had_grad(k, op);  // zeros since a zero_grad(set_to_none = false), as .grad was
      }
    }
    comm_->reduce_scatter(flat, reduced.narrow(0, shard_offset_[i], b.padded / P), ReduceOp::Avg)->wait();
  }
  // Added, not assigned: a step without zero_grad() since the last one sums, as .grad does.
  if (grad_shard_.defined()) ops::add_(grad_shard_, reduced);
  else grad_shard_ = reduced;
  for (const Tensor& p : params_) p.set_grad(Tensor());
}

void ZeroAdamW::reduce(const char* op) {
  autograd::NoGradGuard no_grad;
  if (stage_ == 1) {
    if (reduced_) {  // Note [ZeRO clipping and loss scaling]: nothing may arrive after it
      for (size_t k = 0; k < params_.size(); ++k)
        FRUGAL_CHECK(!params_[k].grad().defined(), "ZeroAdamW.", op, ": parameter ", k, " (", params_[k].describe(),
                     ") got a gradient after the gradients were reduced (reduce_gradients, unscale_ or "
                     "clip_grad_norm_) for this step; run every backward of a step before them");
      return;
    }
    reduce_full_grads(op);
  } else {
    buckets_->finish();  // a no-op after a backward (its callback finished the round)
    retire_all();
    FRUGAL_CHECK(!reduced_ || backward_rounds_ == reduced_rounds_, "ZeroAdamW.", op,
                 ": a backward ran after the gradients were reduced (reduce_gradients, unscale_ or "
                 "clip_grad_norm_) for this step; run every backward of a step before them");
    FRUGAL_CHECK(grad_shard_.defined(), "ZeroAdamW.", op,
                 " (stage 2): no gradient shard; run a backward outside "
                 "no_sync() since the last zero_grad() before stepping");
    for (size_t k = 0; k < params_.size(); ++k) check_had_grad(k, op);
  }
  reduced_ = true;
  reduced_rounds_ = backward_rounds_;
  shard_.set_grad(grad_shard_);
}

void ZeroAdamW::reduce_gradients() { reduce("reduce_gradients"); }

void ZeroAdamW::check_had_grad(size_t k, const char* op) const {
  // One process's AdamW skips a parameter without .grad; a shard cannot skip part of itself,
  // and stepping zeros would apply weight decay and the moments' decay to it.
  FRUGAL_CHECK(buckets_ ? buckets_->received(k) : bool(had_grad_[k]), "ZeroAdamW.", op, ": parameter ", k, " (",
               params_[k].describe(), ") has no gradient; every parameter of a sharded step needs one");
}

double ZeroAdamW::clip_grad_norm_(double max_norm, double norm_type) {
  reduce("clip_grad_norm_");
  return sharded_clip_grad_norm_({shard_}, comm_, max_norm, norm_type);
}

std::function<void(const Tensor&)> ZeroAdamW::found_inf_sync() const { return sharded_found_inf_sync(comm_); }

void ZeroAdamW::check_scaler(const optim::GradScaler& scaler, const char* op) const {
  FRUGAL_CHECK(comm_->size() == 1 || !scaler.is_enabled() || scaler.options().sync_found_inf, "ZeroAdamW.", op,
               ": over ", comm_->size(),
               " ranks the GradScaler must be made with .sync_found_inf = found_inf_sync(): an overflow lands in one "
               "rank's gradient shard, and that rank alone would skip its step");
}

void ZeroAdamW::unscale_(optim::GradScaler& scaler) {
  check_scaler(scaler, "unscale_");
  reduce("unscale_");
  scaler.unscale_(*inner_);
}

void ZeroAdamW::step() {
  reduce("step");
  inner_->step();
  gather_params();
}

void ZeroAdamW::step(optim::GradScaler& scaler) {
  check_scaler(scaler, "step");
  reduce("step");
  scaler.step(*inner_);
  gather_params();
}

void ZeroAdamW::gather_params() {
  autograd::NoGradGuard no_grad;
  reduced_ = false;
  const int64_t P = comm_->size();
  // All-gather bucket by bucket, the next one's gather in flight while one is copied out.
  auto gather = [&](size_t i) {
    Tensor flat = empty({layout_[i].padded}, shard_.options());
    auto work = comm_->all_gather(shard_.detach().narrow(0, shard_offset_[i], layout_[i].padded / P), flat);
    return std::make_pair(flat, work);
  };
  auto next = gather(0);
  for (size_t i = 0; i < layout_.size(); ++i) {
    auto [flat, work] = next;
    if (i + 1 < layout_.size()) next = gather(i + 1);
    work->wait();
    const GradientBucket& b = layout_[i];
    for (size_t j = 0; j < b.params.size(); ++j)
      params_[b.params[j]].detach().copy_(slot_in(flat, b, j, params_[b.params[j]]));
  }
}

void ZeroAdamW::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else ops::zero_(g.detach());
  }
  shard_.set_grad(Tensor());
  reduced_ = false;
  if (set_to_none) {  // otherwise every parameter has a gradient of zeros, as .grad would
    if (buckets_) buckets_->clear_received();
    else had_grad_.assign(params_.size(), false);
  }
  if (set_to_none || !grad_shard_.defined()) grad_shard_ = Tensor();
  else ops::zero_(grad_shard_);
}

std::vector<std::vector<size_t>> ZeroAdamW::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const GradientBucket& b : layout_) out.push_back(b.params);
  return out;
}

ZeroMemoryReport ZeroAdamW::memory_report() const {
  ZeroMemoryReport r;
  for (const Tensor& p : params_) {
    r.parameter_bytes += bytes_of(p);
    r.param_grad_bytes += bytes_of(p.grad());
  }
  r.parameter_bytes += bytes_of(shard_);
  r.gradient_shard_bytes = bytes_of(grad_shard_);
  r.bucket_bytes = live_bucket_bytes();
  r.bucket_bytes_peak = bucket_bytes_peak_;
  if (const optim::ParamState* s = inner_->state(shard_))
    for (const Tensor& t : s->buffers) r.optimizer_state_bytes += bytes_of(t);
  return r;
}

}  // namespace frugal::parallel
