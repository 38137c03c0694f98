#pragma once
// Data parallelism: DistributedDataParallel, as torch.nn.parallel.DistributedDataParallel
// (see Note [Gradient buckets] in parallel/grad_buckets.cpp).
//
//   auto ddp = std::make_shared<parallel::DistributedDataParallel>(model, comm);
//   optim::AdamW opt(ddp->parameters());
//   for (...) {
//     Tensor loss = loss_fn(ddp->forward(x_shard), y_shard);
//     loss.backward();  // buckets all-reduce while it runs; on return every .grad is the mean over ranks
//     opt.step();
//     opt.zero_grad();
//   }
//
// Gradient accumulation: run the first k-1 micro-batches inside { auto guard = ddp->no_sync(); ... }
// (gradients only accumulate locally) and the last one outside; its sync averages the sum.
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/module.h"
#include "parallel/communicator.h"
#include "parallel/grad_buckets.h"

namespace frugal::parallel {

struct DistributedDataParallelOptions {
  /// Bucket capacity in bytes (PyTorch's bucket_cap_mb = 25). A parameter larger than
  /// this gets a bucket of its own.
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
  /// Broadcast rank 0's parameters and buffers at construction, so every replica starts equal.
  bool broadcast_at_start = true;
};

/// Wraps `module` (registered as child "module", so keys read "module.<name>" as in
/// PyTorch). Gradient sync finishes by itself at the end of backward, as PyTorch's DDP: the
/// first gradient hook of a backward queues finish_gradient_sync() on the engine
/// (autograd::queue_callback), so backward() returns with averaged gradients. Every rank
/// must therefore run backward (the ranks meet inside it).
class DistributedDataParallel : public nn::UnaryModule {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<Communicator> comm,
                          DistributedDataParallelOptions options = {});
  ~DistributedDataParallel() override;

  /// The wrapped module's forward (it must be an nn::UnaryModule; other modules are run
  /// through module() directly: the gradient hooks work whatever forward is called).
  Tensor forward(const Tensor& x) override;
  const std::shared_ptr<nn::Module>& module() const { return module_; }

  /// Launches the buckets that backward did not complete (parameters that got no gradient
  /// contribute zeros), waits for every all-reduce and writes the averaged gradients into
  /// the parameters' .grad. Backward calls it at its end; calling it again is harmless: a
  /// no-op when no gradient arrived since the last sync (kept for explicit-sync code).
  void finish_gradient_sync();

  /// While the returned guard lives, backward only accumulates .grad locally.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), was_(ddp.buckets_->sync_enabled()) {
      ddp.buckets_->set_sync_enabled(false);
    }
    ~NoSyncGuard() { ddp_.buckets_->set_sync_enabled(was_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool was_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  /// Which parameters (indices into module()->parameters()) each bucket holds, in launch order.
  std::vector<std::vector<size_t>> bucket_assignment() const;
  std::string type_name() const override { return "DistributedDataParallel"; }

 private:
  void end_of_round();

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<Communicator> comm_;
  std::vector<Tensor> params_;
  std::unique_ptr<GradientBuckets> buckets_;  // the hooks (Note [Gradient buckets])
  std::vector<std::shared_ptr<Work>> works_;  // per bucket: this round's all-reduce
};

}  // namespace frugal::parallel
