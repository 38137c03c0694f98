#pragma once
// One memory plan for every rank. Each rank's nn::BlockPlanner profiles on its own and
// measures slightly different peaks and step times, so plan(budget) can differ between
// ranks. They should run one plan: its peak must fit every rank, a step waits for the
// slowest rank's plan, and a block whose forward issues collectives (a tensor-parallel
// all-reduce) issues them again in a Checkpoint replay, so ranks with different plans would
// deadlock or pair mismatched collectives. Every rank runs rank 0's plan (Note [Plan
// agreement] in parallel/plan_agreement.cpp says why rank 0's).
//
//   nn::BlockPlanner planner(kGpu, vit->num_blocks(), [&](const nn::BlockMemoryPlan& p) {
//     vit->memory_plan = p;
//     fsdp_train_step();  // every rank: forward, loss, backward, optimizer step, zero_grad
//   });
//   planner.profile();  // every rank, in lockstep: the profiled steps meet in FSDP's collectives
//   vit->memory_plan = parallel::agree_on_plan(planner.plan(budget), *comm);
//   const int64_t peak = parallel::max_predicted_peak(planner, vit->memory_plan, *comm);
//   if (peak > budget) ...  // rank 0's plan is predicted to exceed the budget on some rank
//
// plan(budget) throws where nothing fits; a rank that throws before agree_on_plan leaves the
// others waiting in it, so give every rank a budget its planner can meet (>= lowest_peak()).
#include <cstdint>

#include "nn/block_memory.h"
#include "nn/block_planner.h"
#include "parallel/communicator.h"

namespace frugal::parallel {

/// Collective: rank 0's plan (its per-block choices and its fallback), on every rank of
/// `comm`, which should hold every rank that runs these blocks (with tensor parallelism, the
/// tensor-parallel peers as well as the data-parallel ones). Throws frugal::Error on every
/// rank, naming each rank's block count, when the ranks' plans have different numbers of
/// blocks (ranks running different models, or a uniform plan on some).
nn::BlockMemoryPlan agree_on_plan(const nn::BlockMemoryPlan& mine, Communicator& comm);

/// Collective: the largest over the ranks of planner.predict_peak(plan), each rank predicting
/// from its own profile: whether an agreed plan is predicted to fit every rank's budget.
int64_t max_predicted_peak(const nn::BlockPlanner& planner, const nn::BlockMemoryPlan& plan, Communicator& comm);

}  // namespace frugal::parallel
