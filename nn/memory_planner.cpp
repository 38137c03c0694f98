// The memory-budget planner: measure a chain, predict a step's peak, choose checkpoints.
//
// Note [Memory plan]
// Profile. One instrumented training step on the sample, holding only the newest
// activation as a training loop does. Around each module's forward the allocator's
// statistics give
//   activation_bytes  allocated after - before, the input handle dropped: what the
//                     module's graph keeps plus its output, less an input nobody keeps;
//   forward_extra     the peak during it above the state before it.
// Between modules an identity "probe" node is spliced into the graph; in backward it
// runs right after the next module's backward has finished, reads the peak since the
// previous probe and resets it. So each module's backward peak is measured in place,
// and backward_extra is that peak above the forward's state after the module
// (base + the activation_bytes up to it): it holds the incoming gradient, the input
// gradient, temporaries and the parameter gradients allocated so far. The probe also
// reads the allocated bytes as the module's backward starts: backward_start_extra,
// above the same state. Both can be below the true live set's share: a module's output
// that its own graph does not keep (Conv2d's, MaxPool2d's) is dead by its backward,
// freed in forward by the next module or in backward by the next module's node.
// A no-grad pass gives forward_extra_no_grad and the forward times; one grad-mode
// pass per module, its output dropped while its graph is held, gives output_released
// (0 when the graph keeps the output). By construction, predicting the plan without
// checkpoints replays the measured step and gives its measured peak.
// Under autocast, the cast cache (Note [Autocast]) keeps each parameter cast until the
// outermost AutocastGuard exits: the forward's guard before the backward, a checkpoint
// replay's guard when its recompute ends, before its nested backward. Clearing the
// cache right after a module in those two passes gives what only the cache holds:
// cached_casts (grad mode: a Linear's bias cast; its graph saves the weight cast)
// and cached_casts_no_grad (every cast). activation_bytes includes
// cached_casts, so the backward's extras are taken above the states less them.
//
// Predict. A plan is a list of contiguous segments. The forward state after a plain
// segment grows by its modules' activation_bytes; after a checkpointed one it grows
// only by its output (its input stays, saved by CheckpointBackward). The peak is the
// largest of these events:
//   forward of module j, plain:         state before j + cached + forward_extra_j
//   forward of module j, checkpointed:  segment start + cached + current input + forward_extra_no_grad_j
//   loss forward and backward:          end state (+ cached in forward) + the loss's measured extras
// where the states count no cast the cache alone holds, and `cached` is those casts so
// far: cached_casts of plain modules, cached_casts_no_grad of checkpointed ones.
// (Without it the prediction is low: by up to 650 KiB for bf16 Linear(256)s whose .grad
// exists, where the forward's end is the peak.)
//   backward of a plain module j:       plan state after j + backward_extra_j
//   recompute of a checkpointed [a, b): segment start + backward_start_extra_{b-1}
//       (the incoming gradient, the parameter gradients so far, the loss) + the
//       recomputed activations so far + forward_extra_j; then its backward, module by
//       module, plan state + recomputed activations up to j + backward_extra_j, plus
//       for j < b-1 the segment's incoming gradient, which CheckpointBackward holds
//       through its nested backward. The recomputed output exists where the plain graph
//       had freed it, so output_released_{b-1} is added to the recompute; it is let go
//       before the nested backward (autograd::nested_gradients). (Without the
//       first, a segment ending in a Conv2d is predicted one activation low: its input
//       gradient + im2col peak.)
//       The recompute holds the segment's cached_casts; its backward no longer does.
// Measure. measure_step runs forward(plan, sample): a plain segment module by module,
// each input dropped once its module has run, as in the profile. (Run through a closure,
// the segment's input would stay alive to the segment's end: up to one activation above
// the prediction, with or without checkpoints.)
// One approximation remains: a segment ending in a module whose graph keeps its output
// (ReLU) before a module that does not keep its input is predicted to keep that output,
// where checkpointing actually frees it, so the prediction errs high (safe for a budget).
//
// Side effects. Profiling and measure_step run the chain's forward several times in its
// training mode: batch norm would fold the sample's statistics into its running ones (and
// count the batches) five times, and dropout would advance the generators. Both runs put
// the chain's buffers and the generators' states back as they found them (Note [Profiling
// side effects] in nn/profile_state.cpp). Parameter gradients are GradState's: left
// undefined or zeroed.
//
// Choose. The sqrt(n) baseline is checkpoint_sequential's split into round(sqrt(n))
// segments (Chen et al. 2016): O(sqrt(n)) saved boundaries plus one recomputed segment.
// The greedy method tries every segment count k: it cuts the chain into k segments of
// about equal activation bytes and checkpoints them in order of (activation bytes
// freed) / (forward seconds to recompute) until the predicted peak fits the budget.
// Of the fitting plans it keeps the one with the least recompute time.
#include "nn/memory_planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "autograd/ops/reduce.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "nn/profile_state.h"
#include "tensor/ops/fill.h"

namespace frugal::nn {

namespace {

int64_t allocated_now(Device d) { return memory::stats(d).allocated_bytes.current; }
int64_t allocated_peak(Device d) { return memory::stats(d).allocated_bytes.peak; }

// The allocated bytes a contiguous tensor of t's size takes (the allocator's rounding included).
int64_t allocation_of(const Tensor& t) {
  if (!t.defined()) return 0;
  const Device d = t.device();
  const int64_t before = allocated_now(d);
  DataPtr p = memory::allocate(d, size_t(t.numel()) * t.element_size());
  return allocated_now(d) - before;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Identity in forward; in backward, records the allocator's peak since the last probe
// and resets it (Note [Memory plan]).
struct ProbeBackward final : autograd::Node {
  Device device = kCPU;
  int64_t* reading = nullptr;
  int64_t* current = nullptr;  // allocated now: the state as the previous module's backward starts
  std::string name() const override { return "MemoryProbeBackward"; }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    *reading = allocated_peak(device);
    *current = allocated_now(device);
    memory::reset_peak(device);
    return std::move(grads);
  }
};

// GCC 12-14 at -O3 take the store to node->device (the first byte past the Node base) for a
// write past the end of the base object: a false -Wstringop-overflow, silenced here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
Tensor probe(const Tensor& y, int64_t* reading, int64_t* current) {
  auto node = autograd::make_node<ProbeBackward>({y});
  if (!node) return y;  // nothing upstream needs a gradient: no backward runs here
  node->device = y.device();
  node->reading = reading;
  node->current = current;
  Tensor out = y.detach();  // a new handle on the same storage: no bytes
  autograd::record(node, {out});
  return out;
}
#pragma GCC diagnostic pop

// Which parameters had a .grad before a measurement, to put them back afterwards.
class GradState {
 public:
  explicit GradState(const Sequential& seq) : params_(seq.parameters()) {
    for (const Tensor& p : params_) had_.push_back(p.grad().defined());
  }
  ~GradState() {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!had_[i]) params_[i].set_grad(Tensor());
      else if (params_[i].grad().defined()) ops::zero_(params_[i].grad());
    }
  }
  GradState(const GradState&) = delete;
  GradState& operator=(const GradState&) = delete;

 private:
  std::vector<Tensor> params_;
  std::vector<bool> had_;
};

std::string bytes_str(int64_t b) {
  return b < 0 ? std::string("-").append(memory::format_bytes(-b)) : memory::format_bytes(b);
}

}  // namespace

int64_t MemoryPlan::checkpointed_count() const {
  return std::count_if(segments.begin(), segments.end(), [](const Segment& s) { return s.checkpointed; });
}

MemoryPlanner::MemoryPlanner(Sequential& seq, Tensor sample, LossFn loss, std::optional<DType> autocast)
    : seq_(seq), sample_(std::move(sample)), loss_(std::move(loss)), autocast_(autocast) {
  FRUGAL_CHECK(seq_.size() > 0, "MemoryPlanner: the Sequential is empty; there is nothing to plan");
  FRUGAL_CHECK(sample_.defined(), "MemoryPlanner: the sample input is undefined");
  profile();
}

Tensor MemoryPlanner::loss_of(const Tensor& y) const { return loss_ ? loss_(y) : sum(y); }

void MemoryPlanner::enter_autocast(std::optional<AutocastGuard>& guard) const {
  if (autocast_) guard.emplace(sample_.device(), *autocast_);
}

void MemoryPlanner::profile() {
  const ProfileStateGuard state(&seq_);  // Note [Profiling side effects]
  const auto n = int64_t(seq_.size());
  MemoryProfile prof;
  prof.modules.resize(size_t(n));
  for (int64_t j = 0; j < n; ++j) prof.modules[j].name = std::to_string(j) + " " + seq_[j]->type_name();
  profile_forward(prof);
  profile_output_release(prof);
  profile_grad_bytes(prof);
  prof.measured_plain_peak = profile_step(prof);
  profile_ = std::move(prof);
}

void MemoryPlanner::profile_forward(MemoryProfile& prof) const {
  const Device dev = sample_.device();
  const auto n = int64_t(seq_.size());
  for (auto& m : prof.modules) m.forward_seconds = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    NoGradGuard no_grad;
    std::optional<AutocastGuard> amp;
    enter_autocast(amp);
    Tensor h = sample_;
    for (int64_t j = 0; j < n; ++j) {
      ModuleMemory& m = prof.modules[j];
      synchronize(dev);
      const int64_t before = allocated_now(dev);
      memory::reset_peak(dev);
      const double t0 = seconds_now();
      Tensor y = (*seq_[j])(h);
      synchronize(dev);
      m.forward_seconds = std::min(m.forward_seconds, seconds_now() - t0);
      m.forward_extra_no_grad = allocated_peak(dev) - before;
      m.input_bytes = allocation_of(h);
      m.output_bytes = allocation_of(y);
      const int64_t with_casts = allocated_now(dev);
      autocast::clear_cache();  // only the cache holds casts made without grad
      m.cached_casts_no_grad = with_casts - allocated_now(dev);
      h = y;
    }
  }
}

void MemoryPlanner::profile_output_release(MemoryProfile& prof) const {
  const Device dev = sample_.device();
  const auto n = int64_t(seq_.size());
  std::optional<AutocastGuard> amp;
  enter_autocast(amp);
  Tensor h = sample_;
  for (int64_t j = 0; j < n; ++j) {
    Tensor y = (*seq_[j])(h);
    autograd::Edge graph = autograd::gradient_edge(y);
    const bool needs_grad = autograd::requires_grad(y);
    Tensor next = autograd::raw([&] { return y.clone(); });
    synchronize(dev);
    const int64_t with_output = allocated_now(dev);
    y = Tensor();
    prof.modules[j].output_released = with_output - allocated_now(dev);
    const int64_t with_casts = allocated_now(dev);
    autocast::clear_cache();  // what the graph does not keep goes
    prof.modules[j].cached_casts = with_casts - allocated_now(dev);
    graph = {};
    h = next;
    if (needs_grad) h.requires_grad_(true);
  }
}

void MemoryPlanner::profile_grad_bytes(MemoryProfile& prof) const {
  const auto n = int64_t(seq_.size());
  std::set<const void*> seen;
  for (int64_t j = 0; j < n; ++j) {
    ModuleMemory& m = prof.modules[j];
    m.grad_bytes = 0;
    for (const Tensor& p : seq_[j]->parameters())
      if (p.requires_grad() && !p.grad().defined() && seen.insert(p.data()).second) m.grad_bytes += allocation_of(p);
  }
}

int64_t MemoryPlanner::profile_step(MemoryProfile& prof) const {
  const Device dev = sample_.device();
  const auto n = int64_t(seq_.size());
  std::vector<int64_t> readings(size_t(n) + 1, -1);  // readings[j]: probe after module j (n: the loss's)
  std::vector<int64_t> currents(size_t(n), -1);      // currents[j]: allocated as module j's backward starts
  int64_t step_peak = 0;
  {
    GradState grads(seq_);
    synchronize(dev);
    prof.base_bytes = allocated_now(dev);
    std::optional<AutocastGuard> amp;  // exits before the backward (and drops its cast cache there)
    enter_autocast(amp);
    Tensor h = sample_;
    for (int64_t j = 0; j < n; ++j) {
      ModuleMemory& m = prof.modules[j];
      const int64_t before = allocated_now(dev);
      memory::reset_peak(dev);
      Tensor y = (*seq_[j])(h);
      m.forward_extra = allocated_peak(dev) - before;
      step_peak = std::max(step_peak, allocated_peak(dev));
      const int64_t with_input = allocated_now(dev);
      h = Tensor();
      const int64_t after = allocated_now(dev);
      m.input_released = with_input - after;
      m.activation_bytes = after - before;
      h = probe(y, &readings[size_t(j)], &currents[size_t(j)]);
    }
    const int64_t end_state = allocated_now(dev);
    memory::reset_peak(dev);
    Tensor loss = loss_of(h);
    prof.loss_forward_extra = allocated_peak(dev) - end_state;
    step_peak = std::max(step_peak, allocated_peak(dev));
    h = Tensor();
    amp.reset();
    memory::reset_peak(dev);
    loss.backward();
    synchronize(dev);
    readings[size_t(n)] = allocated_peak(dev);
    // readings[n - 1] covers the loss's backward, readings[j - 1] module j's, readings[n]
    // module 0's. A probe that never fired (nothing before it needs a gradient) folds its
    // module into the next reading, which then counts for both (an overestimate).
    FRUGAL_CHECK(readings[size_t(n) - 1] >= 0, "MemoryPlanner: the loss's backward never reached the chain's output; ",
                 "the loss must depend on the output and something in the chain must require grad");
    // The backward's extras are above the forward's states less the casts that the cast
    // cache alone held: it was dropped when the forward's autocast ended.
    int64_t prefix = 0;
    for (const ModuleMemory& m : prof.modules) prefix += m.activation_bytes - m.cached_casts;
    prof.loss_backward_extra = readings[size_t(n) - 1] - prof.base_bytes - prefix;
    step_peak = std::max(step_peak, readings[size_t(n) - 1]);
    auto reading_of = [&](int64_t j) { return j == 0 ? readings[size_t(n)] : readings[size_t(j - 1)]; };
    prefix = 0;
    for (int64_t j = 0; j < n; ++j) {
      prefix += prof.modules[j].activation_bytes - prof.modules[j].cached_casts;
      int64_t reading = -1;
      for (int64_t k = j; reading < 0 && k >= 0; --k) reading = reading_of(k);
      prof.modules[j].backward_extra = reading - prof.base_bytes - prefix;
      // A probe that never fired: its backward never starts; the peak bounds the start.
      prof.modules[j].backward_start_extra =
          currents[size_t(j)] >= 0 ? currents[size_t(j)] - prof.base_bytes - prefix : prof.modules[j].backward_extra;
      step_peak = std::max(step_peak, reading);
    }
  }
  return step_peak;
}

namespace {
// Segments that run every module of a chain of n once, in order; `who` names the caller.
void check_segments(const std::vector<Segment>& segments, int64_t n, const char* who) {
  int64_t expect = 0;
  for (const Segment& s : segments) {
    FRUGAL_CHECK(s.begin == expect && s.end > s.begin && s.end <= n, who, ": segments must be contiguous, ",
                 "non-empty and cover modules [0, ", n, "); got [", s.begin, ", ", s.end, ") where ", expect,
                 " was expected to begin");
    expect = s.end;
  }
  FRUGAL_CHECK(expect == n, who, ": the segments must cover modules [0, ", n, ") but end at module ", expect,
               " (a plan made for another chain?)");
}
}  // namespace

int64_t MemoryPlanner::predict_peak(const std::vector<Segment>& segments) const {
  const auto& mods = profile_.modules;
  const auto n = int64_t(mods.size());
  check_segments(segments, n, "MemoryPlanner");

  int64_t peak = 0;
  auto event = [&peak](int64_t v) { peak = std::max(peak, v); };
  std::vector<int64_t> start(segments.size());  // plan state (above base) before each segment
  int64_t state = 0;
  int64_t cached = 0;  // parameter casts only the autocast cache holds, until the forward's autocast ends
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment& seg = segments[s];
    start[s] = state;
    if (!seg.checkpointed) {
      for (int64_t j = seg.begin; j < seg.end; ++j) {
        event(state + cached + mods[j].forward_extra);
        state += mods[j].activation_bytes - mods[j].cached_casts;
        cached += mods[j].cached_casts;
      }
    } else {
      for (int64_t j = seg.begin; j < seg.end; ++j) {
        event(start[s] + cached + (j > seg.begin ? mods[j].input_bytes : 0) + mods[j].forward_extra_no_grad);
        cached += mods[j].cached_casts_no_grad;
      }
      state = start[s] + mods[seg.end - 1].output_bytes;
    }
  }
  event(state + cached + profile_.loss_forward_extra);
  event(state + profile_.loss_backward_extra);

  for (size_t s = segments.size(); s-- > 0;) {
    const Segment& seg = segments[s];
    if (!seg.checkpointed) {
      int64_t after = state;
      for (int64_t j = seg.end - 1; j >= seg.begin; --j) {
        event(after + mods[j].backward_extra);
        after -= mods[j].activation_bytes - mods[j].cached_casts;
      }
    } else {
      const ModuleMemory& last = mods[seg.end - 1];
      const int64_t kept_input = mods[seg.begin].input_released;  // CheckpointBackward keeps it
      // When it starts: the plain backward's state at this point (incoming gradient, parameter
      // gradients so far, the loss), plus the output that the plain graph has freed by then
      // and CheckpointBackward holds recomputed through its nested backward.
      const int64_t entry = last.backward_start_extra + last.output_released;
      // The replay's autocast cache holds its casts until the recompute ends.
      int64_t recomputed = 0;
      for (int64_t j = seg.begin; j < seg.end; ++j) {
        event(start[s] + entry + recomputed + (j > seg.begin ? kept_input : 0) + mods[j].forward_extra);
        recomputed += mods[j].activation_bytes;
      }
      for (int64_t j = seg.begin; j < seg.end; ++j) recomputed -= mods[j].cached_casts;
      for (int64_t j = seg.end - 1; j >= seg.begin; --j) {
        // The segment's incoming gradient, held through the nested backward (at the last
        // module it is in backward_extra). The recomputed output is let go before that
        // backward starts (autograd::nested_gradients), unless its graph keeps it.
        const int64_t held = j < seg.end - 1 ? last.output_bytes : 0;
        event(start[s] + recomputed + kept_input + mods[j].backward_extra + held);
        recomputed -= mods[j].activation_bytes - mods[j].cached_casts;
      }
    }
    state = start[s];
  }
  return profile_.base_bytes + peak;
}

MemoryPlan MemoryPlanner::make_plan(std::string method, std::vector<Segment> segments, int64_t budget) const {
  MemoryPlan p;
  p.method = std::move(method);
  p.segments = std::move(segments);
  p.budget = budget;
  p.predicted_peak = predict_peak(p.segments);
  for (const Segment& s : p.segments)
    if (s.checkpointed)
      for (int64_t j = s.begin; j < s.end; ++j) p.recompute_seconds += profile_.modules[j].forward_seconds;
  return p;
}

MemoryPlan MemoryPlanner::plan_none() const { return make_plan("none", {Segment{0, int64_t(seq_.size()), false}}, 0); }

MemoryPlan MemoryPlanner::plan_uniform(int64_t k) const {
  const auto n = int64_t(seq_.size());
  FRUGAL_CHECK(k >= 1 && k <= n, "MemoryPlanner::plan_uniform: segments must be in [1, ", n, "] for a chain of ", n,
               " modules, got ", k);
  const int64_t chunk = n / k;  // as checkpoint_sequential
  std::vector<Segment> segs;
  int64_t begin = 0;
  for (int64_t s = 0; s + 1 < k; ++s, begin += chunk) segs.push_back({begin, begin + chunk, true});
  segs.push_back({begin, n, false});
  return make_plan("uniform(" + std::to_string(k) + ")", std::move(segs), 0);
}

MemoryPlan MemoryPlanner::plan_sqrt() const {
  const auto n = int64_t(seq_.size());
  MemoryPlan p = plan_uniform(std::clamp<int64_t>(std::llround(std::sqrt(double(n))), 1, n));
  p.method = "sqrt(n)";
  return p;
}

MemoryPlan MemoryPlanner::plan(int64_t budget) const {
  FRUGAL_CHECK(budget > 0, "MemoryPlanner::plan: the budget must be positive, got ", budget, " bytes");
  const auto& mods = profile_.modules;
  const auto n = int64_t(mods.size());
  MemoryPlan none = plan_none();
  if (none.predicted_peak <= budget) {
    none.method = "greedy";
    none.budget = budget;
    return none;
  }
  // Cut points for k segments of about equal (positive) activation bytes.
  std::vector<int64_t> weight_prefix(size_t(n) + 1, 0);
  for (int64_t j = 0; j < n; ++j)
    weight_prefix[j + 1] = weight_prefix[j] + std::max<int64_t>(mods[j].activation_bytes, 1);
  const double total = double(weight_prefix[n]);

  bool found = false;
  MemoryPlan best;
  int64_t lowest = none.predicted_peak;
  std::set<std::vector<int64_t>> tried;
  for (int64_t k = 2; k <= n; ++k) {
    std::vector<int64_t> cuts{0};
    for (int64_t s = 1; s < k; ++s) {
      const double target = total * double(s) / double(k);
      auto it = std::lower_bound(weight_prefix.begin(), weight_prefix.end(), int64_t(std::ceil(target)));
      const int64_t cut = std::clamp<int64_t>(it - weight_prefix.begin(), cuts.back() + 1, n - 1);
      if (cut > cuts.back()) cuts.push_back(cut);
    }
    cuts.push_back(n);
    if (!tried.insert(cuts).second) continue;
    std::vector<Segment> segs;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) segs.push_back({cuts[c], cuts[c + 1], false});
    // Order by activation bytes freed per second of recompute.
    std::vector<std::pair<double, size_t>> order;
    for (size_t s = 0; s < segs.size(); ++s) {
      int64_t freed = -mods[segs[s].end - 1].output_bytes;
      double seconds = 1e-9;
      for (int64_t j = segs[s].begin; j < segs[s].end; ++j) {
        freed += mods[j].activation_bytes;
        seconds += mods[j].forward_seconds;
      }
      if (freed > 0) order.push_back({double(freed) / seconds, s});
    }
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [score, s] : order) {
      segs[s].checkpointed = true;
      const int64_t peak = predict_peak(segs);
      lowest = std::min(lowest, peak);
      if (peak <= budget) {
        MemoryPlan p = make_plan("greedy", segs, budget);
        if (!found || p.recompute_seconds < best.recompute_seconds ||
            (p.recompute_seconds == best.recompute_seconds && p.predicted_peak < best.predicted_peak))
          best = std::move(p);
        found = true;
        break;
      }
    }
  }
  FRUGAL_CHECK(found, "MemoryPlanner::plan: no checkpointing plan fits a budget of ", memory::format_bytes(budget),
               " (", budget, " bytes): the lowest predicted peak over every segmentation tried is ",
               memory::format_bytes(lowest), ", of which ", memory::format_bytes(profile_.base_bytes),
               " are allocated before the step (weights, data, optimizer state); without checkpointing the peak is ",
               memory::format_bytes(none.predicted_peak));
  return best;
}

Tensor MemoryPlanner::forward(const MemoryPlan& plan, const Tensor& x) const {
  Sequential* seq = &seq_;  // the closures outlive the planner's call: they run again in backward
  // A plan that skips a module would silently run part of the chain.
  check_segments(plan.segments, int64_t(seq->size()), "MemoryPlanner::forward");
  Tensor h = x;
  for (const Segment& s : plan.segments) {
    // m(x), as Sequential runs it: with its forward hooks (Note [Forward hooks]).
    auto run = [seq, begin = s.begin, end = s.end](const Tensor& in) {
      Tensor y = in;
      for (int64_t i = begin; i < end; ++i) y = (*(*seq)[size_t(i)])(y);
      return y;
    };
    if (s.checkpointed) {
      h = autograd::checkpoint(run, h);
      continue;
    }
    // Not through `run`: its caller would hold the segment's input until the segment ends,
    // where the profiled step (and a plain training loop) drops each module's input.
    for (int64_t i = s.begin; i < s.end; ++i) h = (*(*seq)[size_t(i)])(h);
  }
  return h;
}

int64_t MemoryPlanner::measure_step(const MemoryPlan& plan) const {
  const Device dev = sample_.device();
  const ProfileStateGuard state(&seq_);  // Note [Profiling side effects]
  GradState grads(seq_);
  synchronize(dev);
  memory::reset_peak(dev);
  Tensor loss;
  {
    std::optional<AutocastGuard> amp;
    enter_autocast(amp);
    loss = loss_of(forward(plan, sample_));  // the output is dropped before backward, as in a training loop
  }
  loss.backward();
  synchronize(dev);
  return allocated_peak(dev);
}

std::string MemoryPlanner::report(const MemoryPlan& plan, int64_t measured_peak) const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "memory plan '%s': %zu segments, %lld checkpointed, recompute %.3f ms\n",
                plan.method.c_str(), plan.segments.size(), static_cast<long long>(plan.checkpointed_count()),
                plan.recompute_seconds * 1e3);
  out += line;
  std::snprintf(line, sizeof line, "  %-9s  %-28s  %12s  %12s  %s\n", "segment", "modules", "activations", "kept",
                "checkpointed");
  out += line;
  const auto& mods = profile_.modules;
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    const Segment& seg = plan.segments[s];
    int64_t act = 0;
    std::set<std::string> types;
    for (int64_t j = seg.begin; j < seg.end; ++j) {
      act += mods[j].activation_bytes;
      types.insert(seq_[size_t(j)]->type_name());
    }
    std::string kinds;
    for (const std::string& t : types) kinds += (kinds.empty() ? "" : "+") + t;
    const std::string range = std::to_string(seg.begin) + "-" + std::to_string(seg.end - 1) + " " + kinds;
    const int64_t kept = seg.checkpointed ? mods[seg.end - 1].output_bytes : act;
    std::snprintf(line, sizeof line, "  %-9zu  %-28s  %12s  %12s  %s\n", s, range.c_str(), bytes_str(act).c_str(),
                  bytes_str(kept).c_str(), seg.checkpointed ? "yes" : "no");
    out += line;
  }
  std::snprintf(line, sizeof line, "  resting state (before the step): %s\n",
                memory::format_bytes(profile_.base_bytes).c_str());
  out += line;
  if (plan.budget > 0) {
    std::snprintf(line, sizeof line, "  budget:                          %s\n",
                  memory::format_bytes(plan.budget).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  predicted peak allocated:        %s\n",
                memory::format_bytes(plan.predicted_peak).c_str());
  out += line;
  if (measured_peak > 0) {
    std::snprintf(line, sizeof line, "  measured peak allocated:         %s (predicted / measured = %.3f)\n",
                  memory::format_bytes(measured_peak).c_str(), double(plan.predicted_peak) / double(measured_peak));
    out += line;
  }
  return out;
}

}  // namespace frugal::nn
