#pragma once
// ZeRO stage 1 (Rajbhandari et al., 2020; llm.c zero.cuh): AdamW whose state is sharded
// across the data-parallel ranks (see Note [ZeRO-1 step] in parallel/zero.cpp).
//
//   parallel::ZeroAdamW opt(model->parameters(), dp_comm, {.lr = 3e-4});
//   loss.backward();   // plain backward: no DDP wrapper, the step reduces the gradients
//   opt.step();        // reduce-scatter grads, AdamW on this rank's shard, all-gather params
//   opt.zero_grad();
#include <memory>
#include <vector>

#include "optim/adam.h"
#include "parallel/communicator.h"

namespace frugal::parallel {

/// AdamW over `params` (one dtype, on the communicator's device) with exp_avg and exp_avg_sq
/// held only for this rank's 1/size of the flattened parameters: optimizer memory drops
/// from 2N to 2N/size per rank, for one reduce-scatter and one all-gather per step (the
/// same bytes as DDP's all-reduce). Every parameter must have a gradient at step().
class ZeroAdamW {
 public:
  ZeroAdamW(std::vector<Tensor> params, std::shared_ptr<Communicator> comm, optim::AdamWOptions options = {});

  /// Averages the gradients over the ranks, updates this rank's shard with frugal's AdamW
  /// math (optim::AdamW on the shard), and gathers the updated parameters on every rank.
  void step();
  void zero_grad(bool set_to_none = true);

  /// The AdamW that owns this rank's shard (its param_groups drive lr schedules; its
  /// state_dict is this rank's part of the optimizer state).
  optim::AdamW& shard_optimizer() { return *inner_; }
  /// Elements of the flattened parameters this rank updates (the padded total / size).
  int64_t shard_numel() const { return shard_.numel(); }

 private:
  std::vector<Tensor> params_;
  std::shared_ptr<Communicator> comm_;
  int64_t total_ = 0, padded_ = 0;
  Tensor shard_;  // this rank's slice of the flattened parameters, the inner optimizer's leaf
  std::unique_ptr<optim::AdamW> inner_;
};

}  // namespace frugal::parallel
