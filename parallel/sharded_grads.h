#pragma once
// Clipping and loss-scale checks for gradients sharded across data-parallel ranks (ZeRO's
// gradient shards, FSDP's parameter shards): each rank holds a disjoint part of the model's
// gradient, so a norm or an overflow seen by one rank must be combined over all of them.
#include <functional>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace frugal::parallel {

/// optim::clip_grad_norm_ over the whole model when `shards` (this rank's part) and the other
/// ranks' parts hold each gradient element exactly once: the ranks' sums of |g|^p (maxima for
/// p = inf) are all-reduced before the root is taken, so every rank clips by the same total
/// norm, which it returns (float64). Every rank must call it; one all_reduce and one host read.
double sharded_clip_grad_norm_(const std::vector<Tensor>& shards, const std::shared_ptr<Communicator>& comm,
                               double max_norm, double norm_type);

/// For optim::GradScalerOptions::sync_found_inf: all-reduces a found_inf flag with Max over
/// `comm`, so every rank skips a step any rank's shard overflowed in (PyTorch's
/// ShardedGradScaler).
std::function<void(const Tensor&)> sharded_found_inf_sync(std::shared_ptr<Communicator> comm);

}  // namespace frugal::parallel
