// Note [Block planner]
// The planner predicts the peak of a mixed plan from uniform runs, one per choice, each
// split by a BlockProbe into segments at the block boundaries (Note [Block memory plan]).
// Call kept_c(i) the bytes block i leaves allocated after its forward when every block runs
// choice c, and P_c(s) the peak of segment s in that run. A segment inside block b's forward
// or backward has blocks 0..b-1 holding what they kept (the blocks after b have not run yet,
// or have released their saved tensors after their backward), so under a plan p (choice p_i
// for block i) its peak is the uniform-p_b run's peak less what the earlier blocks keep
// there beyond what they keep under p:
//
//   peak_p(b) = P_{p_b}(b) - sum_{i<b} (kept_{p_b}(i) - kept_{p_i}(i))
//
// The head (last forward to first backward) has every block alive: P_c(head) - sum_i
// (kept_c(i) - kept_{p_i}(i)), taken over every profiled c (they agree up to the allocator's
// rounding; the largest is the safe one). The stem before the blocks and everything after
// the first block's backward (the stem's backward, the optimizer) do not depend on the plan:
// the largest over the runs. The predicted peak is the largest of all these.
//
// This is exact where the blocks' savings add up, which holds when each block's kept bytes
// depend on its own choice only. The one coupling is the tensor between two blocks: it
// lives on if either block keeps it. Keep saves it in the block's first ops, Selective and
// Checkpoint as the checkpoint's input; Recompute, Compress and Offload may save a recipe,
// codes or a host copy instead, so in their uniform runs it dies once the next block has
// run, while after a block of another choice it may live on (that block's last op saved it,
// or it was made outside a Recompute scope and so has no recipe). Each boundary where the
// choice changes to one of those adds that tensor to the prediction, an upper bound.
//
// Time: a choice's extra step time (its uniform run's median step less Keep's) is shared
// among the blocks by their forward time in the Keep run, since the recompute, the replay
// and the copies all scale with what the block computes. The search is greedy: from every
// block Keep, take the move (one block to one costlier choice) that frees the most peak
// bytes per ms until the prediction fits, then undo moves that are no longer needed, the
// costliest first. Predictions and measurements are printed side by side by report().
#include "nn/block_planner.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "memory/pinned.h"
#include "nn/profile_state.h"

namespace frugal::nn {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(bytes) / kGiB);
  return buf;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The uniform run's events, cut into its ChoiceProfile (Note [Block planner]).
ChoiceProfile segments_of(BlockMemory choice, int64_t n, const std::vector<BlockProbeEvent>& events) {
  ChoiceProfile p;
  p.choice = choice;
  p.kept.assign(n, 0);
  p.forward_peak.assign(n, 0);
  p.backward_peak.assign(n, 0);
  std::vector<int64_t> enter(n + 1, -1), exit(n, -1);
  std::vector<bool> started(n, false);
  bool backward_started = false;
  for (const BlockProbeEvent& e : events) {
    p.measured_peak = std::max(p.measured_peak, e.peak_before);
    FRUGAL_CHECK(e.kind == BlockProbeEvent::StepEnd || (e.block >= 0 && e.block < n),
                 "BlockPlanner: the step ran block ", e.block, ", but the planner was told of ", n, " blocks");
    switch (e.kind) {
      case BlockProbeEvent::ForwardEnter:
        // The segment before a block's forward: the stem, or the caller between two blocks.
        if (e.block == 0) p.before_blocks_peak = std::max(p.before_blocks_peak, e.peak_before);
        else p.forward_peak[e.block] = std::max(p.forward_peak[e.block], e.peak_before);
        enter[e.block] = e.allocated;
        break;
      case BlockProbeEvent::ForwardExit:
        p.forward_peak[e.block] = std::max(p.forward_peak[e.block], e.peak_before);
        exit[e.block] = e.allocated;
        break;
      case BlockProbeEvent::BackwardStart:
        // Before the first backward mark: the head, the loss and its backward.
        if (!backward_started) p.head_peak = std::max(p.head_peak, e.peak_before);
        else p.backward_peak[e.block] = std::max(p.backward_peak[e.block], e.peak_before);
        backward_started = true;
        started[e.block] = true;
        break;
      case BlockProbeEvent::BackwardEnd:
        p.backward_peak[e.block] = std::max(p.backward_peak[e.block], e.peak_before);
        break;
      // A block whose input needs no gradient (a stem fed the data) has no BackwardEnd: its
      // backward's peak lands here, which does not depend on the other blocks' choices.
      case BlockProbeEvent::StepEnd: p.after_blocks_peak = std::max(p.after_blocks_peak, e.peak_before); break;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    FRUGAL_CHECK(enter[i] >= 0 && exit[i] >= 0, "BlockPlanner: block ", i, " did not run through run_block");
    FRUGAL_CHECK(started[i], "BlockPlanner: the step must run every block's backward; block ", i,
                 "'s did not start (does the loss depend on it?)");
    // Until the next block starts, the caller still holds block i's input: what block i
    // keeps of it shows only at the next entry. The last block's is its exit.
    p.kept[i] = (i + 1 < n ? enter[i + 1] : exit[i]) - enter[i];
  }
  return p;
}

}  // namespace

std::vector<BlockMemory> BlockPlanner::lossless() {
  std::vector<BlockMemory> c;
  for (int i = 0; i < kNumBlockMemory; ++i)
    if (!is_lossy(static_cast<BlockMemory>(i))) c.push_back(static_cast<BlockMemory>(i));
  return c;
}

BlockPlanner::BlockPlanner(Device device, int64_t num_blocks, Step step, std::vector<BlockMemory> choices,
                           int timing_steps)
    : device_(device),
      num_blocks_(num_blocks),
      step_(std::move(step)),
      choices_(std::move(choices)),
      timing_steps_(timing_steps) {
  FRUGAL_CHECK(num_blocks_ > 0, "BlockPlanner: a model with blocks is needed, got ", num_blocks_, " blocks");
  FRUGAL_CHECK(step_ != nullptr, "BlockPlanner: the step function is empty");
  FRUGAL_CHECK(timing_steps_ > 0, "BlockPlanner: timing_steps must be positive, got ", timing_steps_);
  if (std::find(choices_.begin(), choices_.end(), BlockMemory::Keep) == choices_.end())
    choices_.insert(choices_.begin(), BlockMemory::Keep);
  std::sort(choices_.begin(), choices_.end());
  choices_.erase(std::unique(choices_.begin(), choices_.end()), choices_.end());
}

void BlockPlanner::profile() { profile(nullptr); }
void BlockPlanner::profile(const Module& model) { profile(&model); }

void BlockPlanner::profile(const Module* model) {
  const ProfileStateGuard state(model);  // Note [Profiling side effects]
  profiles_.clear();
  for (BlockMemory choice : choices_) {
    const BlockMemoryPlan plan = BlockMemoryPlan::uniform(choice);
    step_(plan);  // warm-up: the choice's own first-time work (its recompute's algorithm searches)
    synchronize(device_);
    std::vector<BlockProbeEvent> events;
    {
      BlockProbe probe(device_, /*time_blocks=*/choice == BlockMemory::Keep);
      step_(plan);
      events = probe.finish();
    }
    ChoiceProfile p = segments_of(choice, num_blocks_, events);
    if (choice == BlockMemory::Keep) {
      output_bytes_.assign(num_blocks_, 0);
      forward_ms_.assign(num_blocks_, 0);
      for (const BlockProbeEvent& e : events)
        if (e.kind == BlockProbeEvent::ForwardExit) {
          output_bytes_[e.block] = e.output_bytes;
          forward_ms_[e.block] = std::max(e.forward_ms, 0.0);
        }
      total_forward_ms_ = 0;
      for (double f : forward_ms_) total_forward_ms_ += f;
    }
    std::vector<double> ms;
    for (int k = 0; k < timing_steps_; ++k) {
      synchronize(device_);
      const auto t0 = std::chrono::steady_clock::now();
      step_(plan);
      synchronize(device_);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    p.step_ms = median(ms);
    profiles_.push_back(std::move(p));
  }
  // The runs cached blocks sized for plans that will not run (uniform offload alone pins GiBs
  // of host memory); the chosen plan starts from empty caches, as a fresh process would.
  memory::empty_cache(device_);
  memory::empty_pinned_cache();
}

const ChoiceProfile& BlockPlanner::profile_of(BlockMemory choice) const {
  for (const ChoiceProfile& p : profiles_)
    if (p.choice == choice) return p;
  FRUGAL_FAIL("BlockPlanner: choice '", to_string(choice), "' was not profiled (call profile() first; the planner's ",
              "choices are fixed at construction)");
}

std::vector<BlockMemory> BlockPlanner::choices_of(const BlockMemoryPlan& plan) const {
  std::vector<BlockMemory> c(num_blocks_);
  for (int64_t i = 0; i < num_blocks_; ++i) c[i] = plan.at(i);
  return c;
}

int64_t BlockPlanner::predict_peak(const std::vector<BlockMemory>& p) const {
  FRUGAL_CHECK(!profiles_.empty(), "BlockPlanner: call profile() before predicting");
  // Bytes the blocks before b keep under plan p, less what they keep in the uniform-c run.
  auto kept_before = [&](BlockMemory c, int64_t b) {
    const ChoiceProfile& u = profile_of(c);
    int64_t extra = 0;
    for (int64_t i = 0; i < b; ++i) extra += profile_of(p[i]).kept[i] - u.kept[i];
    return extra;
  };
  int64_t peak = 0;
  for (const ChoiceProfile& u : profiles_) {
    peak = std::max({peak, u.before_blocks_peak, u.after_blocks_peak});
    peak = std::max(peak, u.head_peak + kept_before(u.choice, num_blocks_));
  }
  int64_t margin = 0;  // the tensors between blocks that live on beyond what the uniform runs show
  for (int64_t b = 0; b < num_blocks_; ++b) {
    const ChoiceProfile& u = profile_of(p[b]);
    const int64_t shift = kept_before(p[b], b);
    peak = std::max({peak, u.forward_peak[b] + shift, u.backward_peak[b] + shift});
    if (b > 0 && p[b] != p[b - 1] && !keeps_input(p[b])) margin += output_bytes_[b - 1];
  }
  // What the additive model cannot see on CUDA: which cached block serves a request (an
  // unsplit remainder counts as allocated) and cuBLAS/cuDNN workspaces differ from run to
  // run. A plan for ViT-B/16 on the H200 measured 14 MiB (0.5%) above its sum; this slack
  // covers that. The CPU arena serves the same sequence of requests the same way each step.
  const int64_t slack = device_.is_cuda() ? profile_of(BlockMemory::Keep).measured_peak / 200 : 0;
  return peak + margin + slack;
}

double BlockPlanner::added_ms(int64_t b, BlockMemory choice) const {
  // Blocks without a timed forward (a host clock too coarse) share the extra evenly.
  const double share = total_forward_ms_ > 0 ? forward_ms_[b] / total_forward_ms_ : 1.0 / num_blocks_;
  return std::max(0.0, profile_of(choice).step_ms - profile_of(BlockMemory::Keep).step_ms) * share;
}

double BlockPlanner::predict_ms(const std::vector<BlockMemory>& p) const {
  double ms = profile_of(BlockMemory::Keep).step_ms;
  for (int64_t b = 0; b < num_blocks_; ++b) ms += added_ms(b, p[b]);
  return ms;
}

int64_t BlockPlanner::predict_peak(const BlockMemoryPlan& plan) const { return predict_peak(choices_of(plan)); }
double BlockPlanner::predict_ms(const BlockMemoryPlan& plan) const { return predict_ms(choices_of(plan)); }
int64_t BlockPlanner::default_peak() const { return profile_of(BlockMemory::Keep).measured_peak; }

std::pair<std::vector<BlockMemory>, bool> BlockPlanner::search(int64_t budget) const {
  std::vector<BlockMemory> p(num_blocks_, BlockMemory::Keep);
  auto kept_sum = [&](const std::vector<BlockMemory>& q) {
    int64_t s = 0;
    for (int64_t i = 0; i < num_blocks_; ++i) s += profile_of(q[i]).kept[i];
    return s;
  };
  // The plan one move from p (one block to another choice) that scores highest, if any scores > 0.
  auto best_move = [&](const std::function<double(const std::vector<BlockMemory>&)>& score) {
    double best_score = 0;
    std::vector<BlockMemory> best;
    for (int64_t b = 0; b < num_blocks_; ++b)
      for (BlockMemory c : choices_) {
        if (c == p[b]) continue;
        std::vector<BlockMemory> q = p;
        q[b] = c;
        const double s = score(q);
        if (s > best_score) best_score = s, best = std::move(q);
      }
    return best;
  };
  int64_t peak = predict_peak(p);
  while (peak > budget) {
    const double ms = predict_ms(p);
    const int64_t kept = kept_sum(p);
    std::vector<BlockMemory> next = best_move([&](const std::vector<BlockMemory>& q) {
      const int64_t freed = peak - predict_peak(q);
      // Ties in the peak (two segments at the top) are broken by the bytes kept overall,
      // so the search can lower one segment and then the other.
      const double gain = static_cast<double>(freed) + 1e-3 * static_cast<double>(kept - kept_sum(q));
      return freed < 0 || gain <= 0 ? 0.0 : gain / std::max(predict_ms(q) - ms, 1e-3);
    });
    if (next.empty()) break;
    p = std::move(next);
    peak = predict_peak(p);
  }
  if (peak > budget) return {p, false};
  // Undo what the fit no longer needs: the move back that saves the most time first.
  while (true) {
    const double ms = predict_ms(p);
    std::vector<BlockMemory> next = best_move(
        [&](const std::vector<BlockMemory>& q) { return predict_peak(q) <= budget ? ms - predict_ms(q) : 0.0; });
    if (next.empty()) break;
    p = std::move(next);
  }
  return {p, true};
}

BlockMemoryPlan BlockPlanner::plan(int64_t budget) const {
  auto [choices, fits] = search(budget);
  FRUGAL_CHECK(fits, "BlockPlanner: no plan fits a budget of ", gib(budget), " (", budget,
               " bytes); the lowest predicted peak is ", gib(lowest_peak()), ", with every block at its most frugal ",
               "choice among those allowed; the default plan's peak is ", gib(default_peak()));
  return {std::move(choices), BlockMemory::Keep};
}

int64_t BlockPlanner::lowest_peak() const {
  auto [choices, fits] = search(0);
  return predict_peak(choices);
}

std::string BlockPlanner::report(const BlockMemoryPlan& plan, int64_t measured_peak, double measured_ms) const {
  const std::vector<BlockMemory> p = choices_of(plan);
  const ChoiceProfile& keep = profile_of(BlockMemory::Keep);
  std::ostringstream os;
  char line[160];
  // The choice column fits the longest name, "checkpoint-recompute".
  std::snprintf(line, sizeof line, "%-6s %-20s %11s %11s %10s\n", "block", "choice", "kept MiB", "saved MiB",
                "added ms");
  os << line;
  for (int64_t b = 0; b < num_blocks_; ++b) {
    const ChoiceProfile& u = profile_of(p[b]);
    std::snprintf(line, sizeof line, "%-6lld %-20s %11.1f %11.1f %10.2f\n", static_cast<long long>(b), to_string(p[b]),
                  u.kept[b] / kMiB, (keep.kept[b] - u.kept[b]) / kMiB, added_ms(b, p[b]));
    os << line;
  }
  std::snprintf(line, sizeof line, "predicted: peak %.3f GiB, step %.2f ms (default plan: %.3f GiB, %.2f ms)\n",
                predict_peak(p) / kGiB, predict_ms(p), keep.measured_peak / kGiB, keep.step_ms);
  os << line;
  if (measured_peak > 0 || measured_ms > 0) {
    std::snprintf(line, sizeof line, "measured:  peak %.3f GiB, step %.2f ms\n", measured_peak / kGiB, measured_ms);
    os << line;
  }
  return os.str();
}

int64_t parse_memory_budget(const std::string& text, int64_t default_peak) {
  const char* begin = text.c_str();
  double value = 0;  // from_chars: the same in every locale (strtod reads "1.5" as 1 under de_DE)
  const char* end = std::from_chars(begin, begin + text.size(), value).ptr;
  const std::string unit(end);
  double bytes = -1;
  if (end != begin && std::isfinite(value) && value > 0) {
    if (unit == "x") bytes = value * static_cast<double>(default_peak);
    else if (unit.empty() || unit == "B") bytes = value;
    else if (unit == "KiB") bytes = value * 1024.0;
    else if (unit == "MiB") bytes = value * kMiB;
    else if (unit == "GiB") bytes = value * kGiB;
    else if (unit == "KB") bytes = value * 1e3;
    else if (unit == "MB") bytes = value * 1e6;
    else if (unit == "GB") bytes = value * 1e9;
  }
  FRUGAL_CHECK(bytes >= 1 && bytes < 9.2e18, "memory budget: expected a size such as 3GiB, 512MiB, 2.5GB or 1e9, ",
               "or a fraction of the default plan's peak such as 0.5x; got '", text, "'");
  return static_cast<int64_t>(bytes);
}

}  // namespace frugal::nn
