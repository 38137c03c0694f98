// ZeRO-1: optimizer state sharded across data-parallel ranks.
//
// Note [ZeRO-1 step]
// The parameters are viewed as one flat vector of N elements, padded with zeros to a
// multiple of the world size P; rank r owns elements [r * N/P, (r + 1) * N/P). A step:
//   1. flatten the gradients; reduce_scatter(avg): rank r receives the mean gradient of
//      its slice only (the same bytes as half of a ring all-reduce);
//   2. optim::AdamW steps the slice (a leaf tensor holding this rank's parameter values),
//      so the moments exist only for the slice: the update is elementwise, so stepping a
//      slice is exactly stepping those elements of the full model;
//   3. all_gather the updated slices and copy them back into the parameters (the other
//      half of the all-reduce).
// The padding is zero in parameters and gradients, and stays zero under AdamW.
#include "parallel/zero.h"

#include "autograd/grad_mode.h"
#include "tensor/factory.h"

namespace frugal::parallel {

ZeroAdamW::ZeroAdamW(std::vector<Tensor> params, std::shared_ptr<Communicator> comm, optim::AdamWOptions options)
    : params_(std::move(params)), comm_(std::move(comm)) {
  FRUGAL_CHECK(comm_, "ZeroAdamW: needs a communicator");
  FRUGAL_CHECK(!params_.empty(), "ZeroAdamW: got an empty parameter list");
  for (const Tensor& p : params_) {
    FRUGAL_CHECK(p.dtype() == params_[0].dtype() && p.device() == comm_->device() && p.is_floating_point(),
                 "ZeroAdamW: every parameter must be floating, of one dtype and on the communicator's device ",
                 comm_->device().str(), "; got ", p.describe(), " next to ", params_[0].describe());
    total_ += p.numel();
  }
  const int64_t P = comm_->size();
  padded_ = (total_ + P - 1) / P * P;
  autograd::NoGradGuard no_grad;
  Tensor flat = zeros({padded_}, params_[0].options());
  int64_t offset = 0;
  for (const Tensor& p : params_) {
    flat.narrow(0, offset, p.numel()).view(p.sizes()).copy_(p);
    offset += p.numel();
  }
  const int64_t n = padded_ / P;
  shard_ = flat.narrow(0, comm_->rank() * n, n).clone();
  inner_ = std::make_unique<optim::AdamW>(std::vector<Tensor>{shard_}, options);
}

void ZeroAdamW::step() {
  autograd::NoGradGuard no_grad;
  Tensor flat_grad = zeros({padded_}, params_[0].options());
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const Tensor g = p.grad();
    FRUGAL_CHECK(g.defined(), "ZeroAdamW.step: parameter ", i, " (", p.describe(),
                 ") has no gradient; every parameter of a sharded step needs one");
    flat_grad.narrow(0, offset, p.numel()).view(p.sizes()).copy_(g);
    offset += p.numel();
  }
  Tensor shard_grad = empty({shard_.numel()}, shard_.options());
  comm_->reduce_scatter(flat_grad, shard_grad, ReduceOp::Avg)->wait();
  shard_.set_grad(shard_grad);
  inner_->step();
  Tensor flat = empty({padded_}, params_[0].options());
  comm_->all_gather(shard_, flat)->wait();
  offset = 0;
  for (const Tensor& p : params_) {
    p.detach().copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
}

void ZeroAdamW::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else g.detach().copy_(zeros_like(g));
  }
}

}  // namespace frugal::parallel
