// DistributedDataParallel: gradient all-reduce in buckets, overlapped with backward.
// The buckets and their backward hooks are parallel/grad_buckets.h's (Note [Gradient
// buckets] in parallel/grad_buckets.cpp); here a full bucket launches an asynchronous
// all-reduce (average), and the end of the round waits for them all and copies each
// parameter's averaged slot back into its .grad.
#include "parallel/ddp.h"

#include "autograd/grad_mode.h"

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

  buckets_ = std::make_unique<GradientBuckets>(
      params_, GradientBucketOptions{.bucket_cap_bytes = options.bucket_cap_bytes},
      [this](size_t b) { works_[b] = comm_->all_reduce(buckets_->bucket(b).flat, ReduceOp::Avg); },
      [this] { end_of_round(); },
      [this](size_t, const Tensor& flat, const std::vector<size_t>& late) {  // Note [Late gradients]
        comm_->all_reduce(flat, ReduceOp::Avg)->wait();
        autograd::NoGradGuard no_grad;
        for (size_t k : late) params_[k].grad().copy_(buckets_->slot_in(flat, k));
      });
  works_.resize(buckets_->buckets().size());
}

DistributedDataParallel::~DistributedDataParallel() = default;

Tensor DistributedDataParallel::forward(const Tensor& x) {
  auto* unary = dynamic_cast<nn::UnaryModule*>(module_.get());
  FRUGAL_CHECK(unary, "DistributedDataParallel.forward: the wrapped ", module_->type_name(),
               " is not a UnaryModule; call its forward through module()");
  return unary->forward(x);
}

void DistributedDataParallel::finish_gradient_sync() { buckets_->finish(); }

void DistributedDataParallel::end_of_round() {
  std::vector<std::shared_ptr<Work>> works;
  works.swap(works_);
  works_.resize(works.size());
  for (const auto& w : works) w->wait();
  autograd::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor averaged = buckets_->slot(k);
    const Tensor g = params_[k].grad();
    if (g.defined()) g.copy_(averaged);
    else params_[k].set_grad(averaged.clone());
  }
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_assignment() const { return buckets_->assignment(); }

}  // namespace frugal::parallel
