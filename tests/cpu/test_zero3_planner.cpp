// The memory planner's search under ZeRO-3 (nn/block_planner.h, parallel/fsdp.h) on thread
// ranks: every rank profiles in lockstep (checked: the ranks issue the same collectives, unit
// by unit), plans for its own budget and runs rank 0's plan (parallel/plan_agreement.h, Note
// [Plan agreement]); three SGD steps under it equal one process under that plan on the whole
// batch (f32, check_equiv). Under FSDP a rank's collectives do not depend on its plan: ranks
// under different plans still meet and train as one process. agree_on_plan's own contract:
// rank 0's plan whatever the others pass; a block-count mismatch throws on every rank,
// naming each rank's count.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "autograd/ops/all.h"
#include "models/vit.h"
#include "nn/block_planner.h"
#include "optim/sgd.h"
#include "parallel/fsdp.h"
#include "parallel/plan_agreement.h"
#include "parallel/thread_communicator.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"
#include "tests/error_text.h"

using namespace frugal;
using namespace frugal::testing;
using CommPtr = std::shared_ptr<parallel::Communicator>;
using nn::BlockMemory;
using parallel::FullyShardedDataParallel;
using parallel::run_ranks;

namespace {

constexpr optim::SGDOptions kSgd{.lr = 0.5};

/// Forwards to `inner`, logging every collective as "<op> <numel>", and an all-gather of
/// FSDP shard u as "... unit u": ranks in lockstep log alike.
class RecordingCommunicator : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  std::vector<std::string> log;
  std::vector<const void*> shards;  // the FSDP wrapper's parameters(), in unit order (float32: gathered as they are)

  std::shared_ptr<parallel::Work> all_reduce(const Tensor& t, parallel::ReduceOp op) override {
    record("all_reduce", t);
    return ForwardingCommunicator::all_reduce(t, op);
  }
  std::shared_ptr<parallel::Work> all_gather(const Tensor& in, const Tensor& out) override {
    record("all_gather", in);
    return ForwardingCommunicator::all_gather(in, out);
  }
  std::shared_ptr<parallel::Work> reduce_scatter(const Tensor& in, const Tensor& out, parallel::ReduceOp op) override {
    record("reduce_scatter", in);
    return ForwardingCommunicator::reduce_scatter(in, out, op);
  }
  std::shared_ptr<parallel::Work> broadcast(const Tensor& t, int root) override {
    record("broadcast", t);
    return ForwardingCommunicator::broadcast(t, root);
  }

 private:
  void record(const char* op, const Tensor& t) {
    std::string entry = std::string(op) + " " + std::to_string(t.numel());
    const auto u = std::find(shards.begin(), shards.end(), t.data());
    if (u != shards.end()) entry += " unit " + std::to_string(u - shards.begin());
    log.push_back(entry);
  }
};

/// FSDP over `vit` with one unit per encoder block, its collectives recorded by `rec`.
std::unique_ptr<FullyShardedDataParallel> shard_blocks(const std::shared_ptr<models::VisionTransformer>& vit,
                                                       const std::shared_ptr<RecordingCommunicator>& rec) {
  auto fsdp = std::make_unique<FullyShardedDataParallel>(
      vit, rec, parallel::FullyShardOptions{.units = parallel::modules_of_type(*vit, "EncoderBlock")});
  for (const Tensor& shard : fsdp->parameters()) rec->shards.push_back(shard.data());
  return fsdp;
}

/// A ViT of 3 encoder blocks on 8x8 images in 2x2 patches (17 tokens): enough activations
/// per block that checkpointing lowers the peak against the gathered parameters.
std::shared_ptr<models::VisionTransformer> small_vit() {
  manual_seed(39);
  return std::make_shared<models::VisionTransformer>(models::ViTConfig{.image_size = 8,
                                                                       .patch_size = 2,
                                                                       .in_channels = 3,
                                                                       .num_layers = 3,
                                                                       .num_heads = 2,
                                                                       .hidden_dim = 8,
                                                                       .mlp_dim = 16,
                                                                       .num_classes = 3});
}

/// One process under `plan` on the whole batch: the weights after each SGD step.
std::vector<std::map<std::string, Tensor>> reference_weights(const nn::BlockMemoryPlan& plan, const Tensor& x,
                                                             const Tensor& y) {
  auto ref = small_vit();
  ref->memory_plan = plan;
  optim::SGD opt(ref->parameters(), kSgd);
  std::vector<std::map<std::string, Tensor>> out;
  for (int64_t s = 0; s < x.size(0); ++s) {
    mse_loss(ref->forward(x[s]), y[s]).backward();
    opt.step();
    opt.zero_grad();
    out.push_back(as_map(ref->state_dict()));
  }
  return out;
}

/// "checkpoint keep offload / keep": the choices, then the fallback.
std::string plan_text(const nn::BlockMemoryPlan& plan) {
  std::string s;
  for (BlockMemory c : plan.blocks) s += std::string(nn::to_string(c)) + " ";
  return s + "/ " + nn::to_string(plan.fallback);
}

}  // namespace

TEST_CASE("zero-3 planner: ranks profile in lockstep, run rank 0's plan for the budget and train as one process") {
  const int p = 2;
  const int64_t per_rank = 8, B = per_rank * p, steps = 3;
  const Tensor x = random_tensor({steps, B, 3, 8, 8}, kFloat32, 371), y = random_tensor({steps, B, 3}, kFloat32, 372);
  std::vector<std::shared_ptr<models::VisionTransformer>> vits;
  for (int r = 0; r < p; ++r) vits.push_back(small_vit());
  const auto initial = as_map(small_vit()->state_dict());

  PerRank<std::vector<std::string>> plans_run(p), profile_log(p), train_log(p);
  PerRank<int64_t> lowest(p), top(p), budget(p), own_peak(p), max_peak(p);
  PerRank<nn::BlockMemoryPlan> own(p), agreed(p);
  PerRank<std::vector<std::map<std::string, Tensor>>> got(p);
  run_ranks(p, [&](const CommPtr& comm) {
    const size_t r = size_t(comm->rank());
    auto& vit = vits[r];
    auto rec = std::make_shared<RecordingCommunicator>(comm);
    auto fsdp = shard_blocks(vit, rec);
    optim::SGD opt(fsdp->parameters(), kSgd);
    auto train_step = [&](int64_t s) {
      mse_loss(fsdp->forward(rows(x[s], int64_t(r), per_rank)), rows(y[s], int64_t(r), per_rank)).backward();
      opt.step();
      opt.zero_grad();
    };
    train_step(0);  // the training loop's warm-up, before the profile (as BlockPlanner::profile asks)
    nn::BlockPlanner planner(
        kCPU, vit->num_blocks(),
        [&](const nn::BlockMemoryPlan& plan) {
          vit->memory_plan = plan;
          plans_run[r].push_back(plan_text(plan));
          train_step(0);
        },
        nn::BlockPlanner::lossless(), /*timing_steps=*/1);
    rec->log.clear();
    planner.profile();
    profile_log[r] = rec->log;
    // The ranks share one CPU arena, so each rank's probe also sees the other's bytes: the
    // ranks' profiles, and often their plans, differ (as two GPUs' would, by less). The
    // budget lies half way from this rank's lowest peak to its default one, never below
    // what its planner can meet (plan() would throw on this rank alone).
    lowest[r] = planner.lowest_peak(), top[r] = planner.default_peak();
    budget[r] = lowest[r] + std::max<int64_t>(0, top[r] - lowest[r]) / 2;
    own[r] = planner.plan(budget[r]);
    agreed[r] = parallel::agree_on_plan(own[r], *rec);
    own_peak[r] = planner.predict_peak(agreed[r]);
    max_peak[r] = parallel::max_predicted_peak(planner, agreed[r], *rec);

    // The profile's steps trained too: start the comparison from the initial weights.
    fsdp->load_full_state_dict(initial);
    vit->memory_plan = agreed[r];
    rec->log.clear();
    for (int64_t s = 0; s < steps; ++s) {
      train_step(s);
      got[r].push_back(as_map(fsdp->full_state_dict()));
    }
    train_log[r] = rec->log;
  });

  // Lockstep: the same uniform plans in the same order (a warm-up, a probed and a timed step
  // each), and so the same collectives, unit by unit.
  CHECK(plans_run[0].size() == 3 * nn::BlockPlanner::lossless().size());
  CHECK(plans_run[0] == plans_run[1]);
  CHECK(profile_log[0].size() > plans_run[0].size());
  CHECK(profile_log[0] == profile_log[1]);
  // Rank 0's budget lies below its default peak, so its plan frees something.
  REQUIRE(lowest[0] < top[0]);
  CHECK(std::any_of(own[0].blocks.begin(), own[0].blocks.end(), [](BlockMemory c) { return c != BlockMemory::Keep; }));
  CHECK(own_peak[0] <= budget[0]);
  for (int r = 0; r < p; ++r) {
    CAPTURE(r);
    CHECK(plan_text(agreed[size_t(r)]) == plan_text(own[0]));
    CHECK(max_peak[size_t(r)] == std::max(own_peak[0], own_peak[1]));
  }
  CHECK(train_log[0] == train_log[1]);
  const auto want = reference_weights(agreed[0], x, y);
  for (int r = 0; r < p; ++r)
    for (size_t s = 0; s < size_t(steps); ++s)
      check_weights(got[size_t(r)][s], want[s], "rank " + std::to_string(r) + " step " + std::to_string(s));
}

TEST_CASE("zero-3 planner: ranks under different plans issue the same collectives and train as one process") {
  // A replayed unit is gathered by the replay and then found gathered by its pre-backward
  // hook (Note [ZeRO-3]): under FSDP the plan changes no collective (Note [Plan agreement]).
  const int p = 2;
  const int64_t per_rank = 2, B = per_rank * p, steps = 2;
  const Tensor x = random_tensor({steps, B, 3, 8, 8}, kFloat32, 381), y = random_tensor({steps, B, 3}, kFloat32, 382);
  const std::vector<nn::BlockMemoryPlan> plans = {
      {{BlockMemory::Keep, BlockMemory::Checkpoint, BlockMemory::Offload}},
      {{BlockMemory::CheckpointOffload, BlockMemory::Keep, BlockMemory::Selective}}};
  std::vector<std::shared_ptr<models::VisionTransformer>> vits;
  for (int r = 0; r < p; ++r) vits.push_back(small_vit());
  PerRank<std::vector<std::string>> logs(p);
  PerRank<std::vector<std::map<std::string, Tensor>>> got(p);
  run_ranks(p, [&](const CommPtr& comm) {
    const size_t r = size_t(comm->rank());
    vits[r]->memory_plan = plans[r];
    auto rec = std::make_shared<RecordingCommunicator>(comm);
    auto fsdp = shard_blocks(vits[r], rec);
    optim::SGD opt(fsdp->parameters(), kSgd);
    for (int64_t s = 0; s < steps; ++s) {
      mse_loss(fsdp->forward(rows(x[s], int64_t(r), per_rank)), rows(y[s], int64_t(r), per_rank)).backward();
      opt.step();
      opt.zero_grad();
      got[r].push_back(as_map(fsdp->full_state_dict()));
    }
    logs[r] = rec->log;
  });
  CHECK(logs[0] == logs[1]);
  const auto want = reference_weights(nn::BlockMemoryPlan{}, x, y);
  for (int r = 0; r < p; ++r)
    for (size_t s = 0; s < size_t(steps); ++s)
      check_weights(got[size_t(r)][s], want[s], "rank " + std::to_string(r) + " step " + std::to_string(s));
}

TEST_CASE("zero-3 planner: agree_on_plan gives every rank rank 0's plan; block counts that differ throw naming each") {
  const int p = 3;
  const std::vector<nn::BlockMemoryPlan> mine = {
      {{BlockMemory::Checkpoint, BlockMemory::Keep, BlockMemory::Offload}, BlockMemory::Keep},
      {{BlockMemory::Keep, BlockMemory::Selective, BlockMemory::Keep}, BlockMemory::Checkpoint},
      {{BlockMemory::Recompute, BlockMemory::Recompute, BlockMemory::CheckpointOffload}, BlockMemory::Selective},
  };
  PerRank<nn::BlockMemoryPlan> agreed(p), uniform(p);
  PerRank<std::string> mismatch(p);
  run_ranks(p, [&](parallel::Communicator& comm) {
    const size_t r = size_t(comm.rank());
    agreed[r] = parallel::agree_on_plan(mine[r], comm);
    // Uniform plans (no per-block choices): the fallback is what is agreed.
    uniform[r] = parallel::agree_on_plan(
        nn::BlockMemoryPlan::uniform(r == 0 ? BlockMemory::Checkpoint : BlockMemory::Keep), comm);
    // Rank 1 plans a model of 4 blocks: every rank throws (none waits in the broadcast).
    nn::BlockMemoryPlan odd = mine[r];
    if (r == 1) odd.blocks.push_back(BlockMemory::Keep);
    mismatch[r] = error_of([&] { parallel::agree_on_plan(odd, comm); });
  });
  for (int r = 0; r < p; ++r) {
    CAPTURE(r);
    CHECK(plan_text(agreed[size_t(r)]) == "checkpoint keep offload / keep");
    CHECK(plan_text(uniform[size_t(r)]) == "/ checkpoint");
    check_contains(mismatch[size_t(r)],
                   {"agree_on_plan", "different numbers of blocks", "rank 0 has 3", "rank 1 has 4", "rank 2 has 3"});
  }
}
