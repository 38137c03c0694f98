// Note [Plan agreement]
// Data-parallel ranks must run one memory plan: under FSDP a unit's choice decides whether
// its backward gathers it through a replay or through its pre-backward hook, and so the
// order of the rank's all-gathers (Note [ZeRO-3] in parallel/fsdp.cpp); ranks whose
// collectives differ deadlock or pair up mismatched buffers. Each rank's BlockPlanner
// profiles on its own, so plan(budget) may differ between ranks.
//
// Two ways to agree: every rank plans from the same profile (say the maximum over ranks of
// each measured number), or every rank takes one rank's plan. The search reads step times as
// well as bytes (the greedy move is the most bytes freed per ms added, and undoing moves
// goes by the time saved), and times differ between ranks far more than bytes; one search on
// every rank needs every number of every ChoiceProfile reduced first, a reduction that
// reaches into the planner's internals and must be redone whenever the profile grows a
// field. Taking rank 0's plan is one broadcast and holds whatever the ranks measured. The
// ranks run the same shapes, so rank 0's prediction stands for the others up to measurement
// noise; where another rank measured more, max_predicted_peak says so: each rank predicts
// the agreed plan's peak from its own profile and the largest is returned, to be checked
// against the budget on every rank alike (and re-planned together if it does not fit).
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
