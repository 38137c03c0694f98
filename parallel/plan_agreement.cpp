// Note [Plan agreement]
// Why one plan. A plan decides the job's memory (its peak must fit every rank) and its time
// (a step waits for the slowest rank, so a rank whose measurements picked a slower plan
// slows all). It can also decide the collectives: a block whose forward communicates (a
// tensor-parallel layer's all-reduce) communicates again in a Checkpoint replay, so ranks
// with different plans issue different collectives. Under FullyShardedDataParallel as
// written a unit's choice does not change them: a replayed unit is gathered by the replay's
// pre-hook and its pre-backward hook then finds it gathered (Note [ZeRO-3]), so every
// lossless choice issues the same all-gathers in the same order (the cpu suite checks it,
// tests/cpu/test_zero3_planner.cpp); agreement keeps that from being a requirement.
//
// Which plan. Either every rank plans from one profile (say the maximum over the ranks of
// each measured number), or every rank takes one rank's plan. The search reads step times as
// well as bytes (the greedy move is the most bytes freed per ms added, and undoing moves
// goes by the time saved), and times differ between ranks far more than bytes; one search on
// every rank needs every number of every ChoiceProfile reduced first, a reduction that
// reaches into the planner's internals and must follow every field the profile gains.
// Taking rank 0's plan is one broadcast and holds whatever the ranks measured. The ranks run
// the same shapes, so rank 0's prediction stands for the others up to measurement noise;
// where another rank measured more, max_predicted_peak says so: each rank predicts the agreed
// plan's peak from its own profile and the largest is returned, so every rank checks the
// same number against the budget (and re-plans together if it does not fit).
#include "parallel/plan_agreement.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/factory.h"

namespace frugal::parallel {

namespace {

// Every rank's `value`, in rank order (one all-gather).
std::vector<int64_t> gather_values(int64_t value, Communicator& comm) {
  const Tensor mine = from_vector<int64_t>({value}, {1}).to(comm.device());
  const Tensor all = empty({comm.size()}, {kInt64, comm.device()});
  comm.all_gather(mine, all)->wait();
  return all.tolist<int64_t>();
}

}  // namespace

nn::BlockMemoryPlan agree_on_plan(const nn::BlockMemoryPlan& mine, Communicator& comm) {
  // Every rank learns every count, so a mismatch throws the same error on every rank (none
  // is left waiting in the broadcast below).
  const int64_t n = static_cast<int64_t>(mine.blocks.size());
  const std::vector<int64_t> counts = gather_values(n, comm);
  bool equal = true;
  std::string listed;
  for (size_t r = 0; r < counts.size(); ++r) {
    equal = equal && counts[r] == counts[0];
    listed += detail::str_cat(r > 0 ? ", " : "", "rank ", r, " has ", counts[r]);
  }
  FRUGAL_CHECK(equal, "agree_on_plan: the ranks' plans have different numbers of blocks (", listed,
               "): every rank must plan the same model");

  // The choices, then the fallback, as rank 0 has them.
  std::vector<int64_t> codes;
  for (nn::BlockMemory c : mine.blocks) codes.push_back(static_cast<int64_t>(c));
  codes.push_back(static_cast<int64_t>(mine.fallback));
  const Tensor t = from_vector(codes, {n + 1}).to(comm.device());
  comm.broadcast(t, 0)->wait();
  codes = t.tolist<int64_t>();

  auto choice = [](int64_t code) {
    FRUGAL_CHECK(code >= 0 && code < nn::kNumBlockMemory, "agree_on_plan: rank 0 sent choice code ", code,
                 ", which names no BlockMemory (", nn::kNumBlockMemory, " exist)");
    return static_cast<nn::BlockMemory>(code);
  };
  nn::BlockMemoryPlan agreed;
  for (int64_t b = 0; b < n; ++b) agreed.blocks.push_back(choice(codes[size_t(b)]));
  agreed.fallback = choice(codes[size_t(n)]);
  return agreed;
}

int64_t max_predicted_peak(const nn::BlockPlanner& planner, const nn::BlockMemoryPlan& plan, Communicator& comm) {
  const Tensor peak = from_vector<int64_t>({planner.predict_peak(plan)}, {1}).to(comm.device());
  comm.all_reduce(peak, ReduceOp::Max)->wait();
  return peak.tolist<int64_t>()[0];
}

}  // namespace frugal::parallel
