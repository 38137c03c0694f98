#include "parallel/sharded_grads.h"

#include "optim/clip_grad.h"
#include "tensor/factory.h"

namespace frugal::parallel {

double sharded_clip_grad_norm_(const std::vector<Tensor>& shards, const std::shared_ptr<Communicator>& comm,
                               double max_norm, double norm_type) {
  return optim::clip_grad_norm_(shards, max_norm, norm_type, [&comm](double part, bool is_max) {
    const Tensor t = scalar_tensor(part, TensorOptions(kFloat64, comm->device()));
    comm->all_reduce(t, is_max ? ReduceOp::Max : ReduceOp::Sum)->wait();
    return t.item<double>();
  });
}

std::function<void(const Tensor&)> sharded_found_inf_sync(std::shared_ptr<Communicator> comm) {
  return [comm = std::move(comm)](const Tensor& found_inf) { comm->all_reduce(found_inf, ReduceOp::Max)->wait(); };
}

}  // namespace frugal::parallel
