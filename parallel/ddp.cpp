// DistributedDataParallel: gradient all-reduce in buckets, overlapped with backward.
//
// Note [Gradient buckets]
// Backward produces gradients roughly in reverse parameter order (the last layer's
// first), so parameters are packed, in reverse order, into buckets of about
// bucket_cap_bytes (one dtype per bucket). A post-accumulate-grad hook on every
// parameter (autograd::register_post_accumulate_grad_hook, run by AccumulateGrad right
// after .grad received this backward's contribution) copies the gradient into its slot of
// the bucket's flat buffer; when a bucket's last slot is filled its all-reduce (average)
// is launched asynchronously and backward goes on computing earlier layers' gradients
// while it runs: communication hides behind computation, and one large collective per
// bucket instead of one per parameter amortises the latency.
// Every rank must issue the same collectives in the same order, but the order in which
// buckets fill can differ between ranks (a parameter unused on one rank); so buckets
// launch strictly in index order: a full bucket waits until all earlier ones launched.
// finish_gradient_sync() fills what backward never reached with the parameter's .grad or
// zeros (an unused parameter contributes nothing to the mean), launches the rest, waits,
// and copies the averaged buffer back into each .grad.
// It runs by itself at the end of backward, as in PyTorch: the first hook that fires in a
// backward queues it with autograd::queue_callback(CallbackRun::Outermost) (Note [Backward
// callbacks] in autograd/engine.cpp), so it runs after the engine's last node, before
// backward() returns. Outermost, not the current run: a hook firing inside a checkpoint's
// recompute runs in a nested engine run, which ends before the outer run reaches the other
// parameters. The queued lambda owns a token that clears callback_queued_ when the engine
// destroys it, run or dropped (a node threw), so the next backward queues afresh. Calling
// finish_gradient_sync() explicitly afterwards finds no round active: a no-op.
// no_sync(): the hooks do nothing (no callback either), so .grad accumulates locally; the
// next synced backward copies the accumulated .grad (all micro-batches' sum) into the bucket.
#include "parallel/ddp.h"

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "tensor/factory.h"

namespace frugal::parallel {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<Communicator> comm,
                                                 DistributedDataParallelOptions options)
    : module_(std::move(module)), comm_(std::move(comm)) {
  FRUGAL_CHECK(module_ && comm_, "DistributedDataParallel: needs a module and a communicator");
  FRUGAL_CHECK(options.bucket_cap_bytes > 0, "DistributedDataParallel: bucket_cap_bytes must be positive, got ",
               options.bucket_cap_bytes);
  register_module("module", module_);
  for (const Tensor& p : module_->parameters())
    if (p.requires_grad()) {
      FRUGAL_CHECK(p.device() == comm_->device(), "DistributedDataParallel: parameter ", p.describe(),
                   " is not on the communicator's device ", comm_->device().str());
      params_.push_back(p);
    }

  if (options.broadcast_at_start) {
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : module_->parameters()) comm_->broadcast(p.detach(), 0)->wait();
    for (const auto& [name, b] : module_->named_buffers()) comm_->broadcast(b.detach(), 0)->wait();
  }

  // Buckets in reverse parameter order (Note [Gradient buckets]).
  bucket_of_.resize(params_.size());
  slot_in_bucket_.resize(params_.size());
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const int64_t nbytes = p.numel() * int64_t(p.element_size());
    const bool fresh = buckets_.empty() || bytes + nbytes > options.bucket_cap_bytes ||
                       params_[buckets_.back().params.front()].dtype() != p.dtype();
    if (fresh) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    bucket_of_[k] = buckets_.size() - 1;
    slot_in_bucket_[k] = b.params.size();
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel());
    b.params.push_back(k);
    bytes += nbytes;
  }
  for (Bucket& b : buckets_) {
    const Tensor& last = params_[b.params.back()];
    b.flat = empty({b.offsets.back() + last.numel()}, last.options());
  }
  ready_.assign(params_.size(), false);
  for (size_t k = 0; k < params_.size(); ++k)
    hook_ids_.push_back(
        autograd::register_post_accumulate_grad_hook(params_[k], [this, k](const Tensor&) { on_grad_ready(k); }));
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t k = 0; k < params_.size(); ++k) autograd::remove_post_accumulate_grad_hook(params_[k], hook_ids_[k]);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  auto* unary = dynamic_cast<nn::UnaryModule*>(module_.get());
  FRUGAL_CHECK(unary, "DistributedDataParallel.forward: the wrapped ", module_->type_name(),
               " is not a UnaryModule; call its forward through module()");
  return unary->forward(x);
}

namespace {
/// The slot of parameter p in its bucket's flat buffer, shaped as p.
Tensor slot_view(const Tensor& flat, int64_t offset, const Tensor& p) {
  return flat.narrow(0, offset, p.numel()).view(p.sizes());
}
}  // namespace

void DistributedDataParallel::queue_sync_at_end_of_backward() {
  if (callback_queued_) return;
  struct QueuedFlag {  // clears the flag when the engine destroys the callback, run or dropped
    bool& queued;
    ~QueuedFlag() { queued = false; }
  };
  auto token = std::make_shared<QueuedFlag>(QueuedFlag{callback_queued_});
  callback_queued_ = true;
  autograd::queue_callback([this, token] { finish_gradient_sync(); }, autograd::CallbackRun::Outermost);
}

void DistributedDataParallel::on_grad_ready(size_t k) {
  if (!sync_enabled_) return;
  queue_sync_at_end_of_backward();
  round_active_ = true;
  Bucket& b = buckets_[bucket_of_[k]];
  FRUGAL_CHECK(!b.work, "DistributedDataParallel: the gradient of parameter ", k, " (", params_[k].describe(),
               ") arrived again after its bucket was launched (a parameter reached twice in one backward, e.g. "
               "inside and outside a checkpoint?)");
  autograd::NoGradGuard no_grad;
  slot_view(b.flat, b.offsets[slot_in_bucket_[k]], params_[k]).copy_(params_[k].grad());
  if (!ready_[k]) {
    ready_[k] = true;
    ++b.pending;
  }
  launch_ready_buckets();
}

void DistributedDataParallel::launch(Bucket& b) { b.work = comm_->all_reduce(b.flat, ReduceOp::Avg); }

void DistributedDataParallel::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() &&
         buckets_[next_to_launch_].pending == buckets_[next_to_launch_].params.size())
    launch(buckets_[next_to_launch_++]);
}

void DistributedDataParallel::finish_gradient_sync() {
  if (!round_active_) return;
  autograd::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (ready_[k]) continue;
    Bucket& b = buckets_[bucket_of_[k]];
    const Tensor slot = slot_view(b.flat, b.offsets[slot_in_bucket_[k]], params_[k]);
    const Tensor g = params_[k].grad();
    if (g.defined()) slot.copy_(g);
    else slot.copy_(zeros(params_[k].sizes(), params_[k].options()));
    ready_[k] = true;
    ++b.pending;
  }
  launch_ready_buckets();
  for (Bucket& b : buckets_) b.work->wait();
  for (size_t k = 0; k < params_.size(); ++k) {
    const Bucket& b = buckets_[bucket_of_[k]];
    const Tensor averaged = slot_view(b.flat, b.offsets[slot_in_bucket_[k]], params_[k]);
    const Tensor g = params_[k].grad();
    if (g.defined()) g.copy_(averaged);
    else params_[k].set_grad(averaged.clone());
  }
  for (Bucket& b : buckets_) {
    b.work.reset();
    b.pending = 0;
  }
  ready_.assign(params_.size(), false);
  next_to_launch_ = 0;
  round_active_ = false;
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : buckets_) out.push_back(b.params);
  return out;
}

}  // namespace frugal::parallel
