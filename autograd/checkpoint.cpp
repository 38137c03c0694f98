// Recompute checkpointing: one CheckpointBackward node in place of a block's graph.
//
// Note [Checkpoint recompute]
// checkpoint(fn, inputs) runs fn under NoGradGuard: no nodes are created inside
// fn, so none of its intermediate activations are saved. One CheckpointBackward
// node stands in for the whole block; it saves only the inputs (SavedTensors,
// so an in-place write to an input before backward throws naming
// CheckpointBackward, Note [Saved tensor versions]) and the generators' states:
// the default generator's (seed, offset) at the start of fn, and every other
// generator fn draws from (a TensorParallelRng's streams, one given to dropout)
// as it stood before fn's first draw from it, which a DrawRecord notes (Note
// [Draws under a record] in tensor/random.h).
//
// Backward replays the block: it moves each saved generator back to its saved
// state, runs fn again with grad enabled on detached copies of the inputs (each
// a fresh leaf that requires grad exactly when the original did), then puts the
// generators back where they stood before the replay, so the outer random
// streams are untouched. Dropout inside fn therefore draws the same mask as in
// the forward (Note [Dropout mask from counters]), from whichever generator. A
// generator destroyed before backward cannot be replayed: the replay refuses,
// naming CheckpointBackward. A nested engine run,
// autograd::backward(recomputed outputs, incoming grads), then
//  - accumulates into the detached inputs' .grad: these are the gradients this
//    node returns to the outer graph;
//  - accumulates into every leaf that fn captured (a module's weights). The
//    outer graph has no edge to those leaves through this node (the forward
//    recorded nothing), so this is the one and only accumulation for this use;
//    a parameter also used outside the block is reached by the outer run
//    separately, and the two contributions add, as in a plain run.
// The replay also runs under the autocast state (both device types) that fn saw in
// the forward, so the recomputed ops have the forward's dtypes whatever autocast
// region backward runs in (Note [Autocast]).
// The recomputed graph lives only for that nested run, so the peak memory of
// a checkpointed network is the saved inputs of every block plus the
// activations of one block at a time. The recomputed outputs themselves are let
// go before that run starts (autograd::nested_gradients): the run needs
// their graph edges, not their values (a ViT block's fp32 output: 74 MiB at batch 128).
//
// A selective policy keeps the expensive ops' outputs through the forward and hands them to
// the replay, which then runs only the cheap ops (Note [Selective checkpoint]).
//
// Which outputs require grad: the forward records nothing, so it cannot see the
// leaves fn captures through edges; a GradUseProbe notes instead whether any op in
// fn was handed a tensor that requires grad (make_node's and needs_grad's no-grad
// paths look at their inputs while one is active; not under fn's own NoGradGuard: Note
// [Probed grad mode] in autograd/grad_mode.cpp). When an input requires grad or
// fn used such a tensor, every floating output is recorded as an output of the
// node: this is what makes checkpoint_sequential's first segment work, whose input
// is data but whose weights need gradients; on replay, an output that turns out
// not to depend on anything requiring grad takes no part in the nested backward.
// When neither (a frozen backbone on data), the outputs are returned as plain
// tensors, as a plain run under the same flags would give them: no node, no saved
// inputs, no replay in backward (PyTorch's reentrant checkpoint does the same from
// its inputs alone, and so misses captured parameters; its non-reentrant one records
// through saved-tensor hooks).
//
// Inputs written in place: fn runs on the caller's tensors, so a write to an input inside fn
// (relu_ as a block's first op) lands in the tensor the node saves, and the replay would
// start from the written values and write them again (weight gradients from 4x where the
// forward used 2x); the caller's tensor would also keep its history without the write. The
// plain run rebases that history, which a region that records nothing cannot do, so
// checkpoint compares each input's version before and after fn and refuses the write.
//
// State updated in the forward: batch norm in training folds the batch's statistics into its
// running ones, and nn::BatchNorm2d counts the batch. Replayed, the block would do both
// again - momentum applied twice to one batch, num_batches_tracked two ahead - so running
// statistics drifted from the plain run's under checkpointing (PyTorch's checkpoint does the
// same), and the memory planners' "lossless" choices were not. While the recompute runs,
// in_checkpoint_recompute() is true on its thread, and those updates are skipped: the
// recomputed outputs are the forward's (batch statistics normalize in training either way),
// and the buffers end the step as the plain run leaves them.
//
// Tensors fn captures and writes in place: a buffer fn updates (a step counter, an average
// of what it saw) is written once by the forward and again by the replay, and unlike batch
// norm's, such a write is the caller's, so checkpoint cannot skip it. The replay refuses it
// instead: storages are numbered as they are made (Storage::serial), and a recorded in-place
// op inside a recompute (autograd's add_, mul_, copy_, ...) whose tensor was made before the
// recompute started throws, naming the op and the tensor (check_recompute_write). The
// tensors fn makes itself are newer; its inputs cannot be written (above); a selective
// checkpoint's kept outputs are handed back only if the forward did not write them. A caller
// who wants the write once guards it with in_checkpoint_recompute(), as batch norm does.
//
// Note [What a replay must find unchanged]
// The replay recomputes the region from its saved inputs and the generators' saved states;
// anything else the forward depended on that changed since makes it compute other values,
// and the gradients come out wrong with no error:
// - the modes of its ops. Batch norm in training normalizes by the batch's statistics, in
//   eval by the running ones; dropout drops in training only. A train()/eval() between the
//   forward and backward (an evaluation pass before the step) made the replay differ from
//   the forward (ResNet's gradients 100% off, ViT's 30-50%). Each mode-dependent op calls
//   note_mode(op, flag): the forward's notes are kept, and the replay's k-th note of an op
//   must equal the forward's k-th of that op (counted per op, not overall: a selective
//   replay skips the kept ops);
// - tensors older than the region that its ops read (a captured mask, a parameter). An
//   in-place write between forward and backward (an optimizer step, a refilled buffer) makes
//   the replay read the new values. A plain run refuses such a write where an op saved the
//   tensor; the region saved nothing, so its forward notes each storage made before it whose
//   data is read (Tensor::data() reports to it, tensor/read_observer.h: differentiable
//   inputs, masks, indices, targets, the source of an autocast cast alike) with its version,
//   and the replay refuses one whose version moved, as the plain run would. A storage fn
//   writes itself (a running statistic, a counter guarded by in_checkpoint_recompute()) is
//   fn's state, not an input: the replay skips or refuses that write, so later writes by
//   others are not checked.
// PyTorch's checkpoint computes the wrong gradients in both cases (its non-reentrant one
// fails the first with an internal "saved ... multiple times" error).
//
// Limits (documented in the header): fn must be deterministic given its inputs
// and the generators it draws from, and draw on the thread that calls checkpoint
// (draws on other threads are not noted); the default generator is
// process-wide, so two threads replaying checkpoints at once race on it. Under autograd::grad the
// replay's run touches no .grad either (autograd::nested_gradients, Note
// [Gradients without .grad]): a requested parameter used inside the region gets its
// gradient, unlike PyTorch's reentrant checkpoint.
#include "autograd/checkpoint.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/ops/inplace.h"
#include "tensor/random.h"
#include "tensor/read_observer.h"

namespace frugal::autograd {

namespace {

thread_local int recompute_depth = 0;  // checkpoint recomputes running on this thread
// The first Storage::serial the innermost of them made: older storages are not its own.
thread_local uint64_t recompute_first_serial = 0;

// A read storage, its version as the forward read it, and the tensor it was read as.
struct ReadVersion {
  std::weak_ptr<Storage> storage;
  uint64_t version;
  OutputMeta meta;
};

// What a recording forward's ops noted (Note [What a replay must find unchanged]).
struct ForwardLog {
  uint64_t first_serial = Storage::serial_now();  // storages from here on are fn's own
  std::vector<std::pair<const char*, bool>> modes;
  std::vector<ReadVersion> reads;  // each older storage read, at its version as first read
  std::unordered_set<const Storage*> seen;
};
// The innermost recording forward on this thread (a nested checkpoint that records nothing
// leaves its ops' notes to the enclosing one).
thread_local ForwardLog* forward_log = nullptr;

// A replay's check of the modes, per op: the forward's flags in order and how many were met.
struct ModeCheck {
  std::map<std::string_view, std::vector<bool>> forward;
  std::map<std::string_view, size_t> met;
};
thread_local ModeCheck* mode_check = nullptr;

// Tensor::data() reports every read to the forward log while a recording forward runs: a
// mask, an index, a target or the source of an autocast cast is read by no make_node input.
class ReadObserverScope {
 public:
  explicit ReadObserverScope(bool on)
      : outer_(on ? frugal::detail::set_read_observer(&detail::note_checkpoint_read) : nullptr), on_(on) {}
  ~ReadObserverScope() {
    if (on_) frugal::detail::set_read_observer(outer_);
  }
  ReadObserverScope(const ReadObserverScope&) = delete;
  ReadObserverScope& operator=(const ReadObserverScope&) = delete;

 private:
  frugal::detail::ReadObserver outer_;
  bool on_;
};

// Sets a thread-local pointer for its scope.
template <typename T>
class ScopedPointer {
 public:
  ScopedPointer(T*& slot, T* value) : slot_(slot), outer_(slot) { slot_ = value; }
  ~ScopedPointer() { slot_ = outer_; }
  ScopedPointer(const ScopedPointer&) = delete;
  ScopedPointer& operator=(const ScopedPointer&) = delete;

 private:
  T*& slot_;
  T* outer_;
};

// in_checkpoint_recompute() for its scope.
struct RecomputeScope {
  RecomputeScope() : outer_first_serial(recompute_first_serial) {
    ++recompute_depth;
    recompute_first_serial = Storage::serial_now();
  }
  ~RecomputeScope() {
    --recompute_depth;
    recompute_first_serial = outer_first_serial;
  }
  uint64_t outer_first_serial;
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

// Moves each generator to its saved state for its scope, then back to where it stood before
// (see Note [Checkpoint recompute]).
class GeneratorReplay {
 public:
  explicit GeneratorReplay(const std::vector<GeneratorState>& saved) {
    std::vector<Generator*> gens;
    for (const GeneratorState& s : saved) {
      gens.push_back(s.generator());
      FRUGAL_CHECK(gens.back() != nullptr, "CheckpointBackward: a Generator the checkpointed function drew from ",
                   "in the forward was destroyed before backward, so the recompute cannot draw the forward's ",
                   "random numbers again; keep the generator alive until backward");
    }
    for (size_t i = 0; i < saved.size(); ++i) {
      now_.push_back(gens[i]->state());
      gens[i]->set_state(saved[i].seed, saved[i].offset);
    }
  }
  ~GeneratorReplay() {
    for (auto it = now_.rbegin(); it != now_.rend(); ++it)
      if (Generator* g = it->generator()) g->set_state(it->seed, it->offset);
  }
  GeneratorReplay(const GeneratorReplay&) = delete;
  GeneratorReplay& operator=(const GeneratorReplay&) = delete;

 private:
  std::vector<GeneratorState> now_;
};

// The autocast state of both device types for its scope (guards: they nest, and the
// parameter casts made during the replay are dropped with the outermost one).
class AutocastReplay {
 public:
  AutocastReplay(autocast::State cpu, autocast::State cuda)
      : cpu_(kCPU, cpu.dtype, cpu.enabled), cuda_(frugal::cuda(), cuda.dtype, cuda.enabled) {}

 private:
  AutocastGuard cpu_, cuda_;
};

// grad_inputs = d(fn(inputs))/d(inputs) * grads, from a replay of fn with grad enabled;
// leaves captured by fn accumulate their .grad during the replay.
struct CheckpointBackward final : Node {
  SavedState<std::function<TensorList(const TensorList&)>> fn{this};  // freed too: the closure may hold tensors
  SavedTensorList inputs{this};
  std::vector<bool> input_requires_grad;
  // The default generator when fn started, then each other generator fn drew from, as it
  // stood before its first draw there (Note [Draws under a record]).
  std::vector<GeneratorState> rng;
  autocast::State amp_cpu, amp_cuda;  // the autocast state when fn started
  // A selective policy's kept outputs (null for a full checkpoint): Note [Selective checkpoint].
  SavedState<std::shared_ptr<selective::KeptOutputs>> kept{this};
  // Note [What a replay must find unchanged]: the forward's mode-dependent ops and the older
  // storages its ops read.
  std::vector<std::pair<const char*, bool>> modes;
  std::vector<ReadVersion> reads;

  std::string name() const override { return "CheckpointBackward"; }
  bool runs_nested_backward() const override { return true; }

  TensorList apply(TensorList&& grads) override {
    FRUGAL_CHECK(*fn != nullptr, name(),
                 ": its saved tensors were freed by an earlier backward; call backward(..., retain_graph=true) "
                 "the first time to backward through the graph twice");
    // Fresh leaves over the saved values: the replay's graph ends at them.
    TensorList leaves;
    leaves.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor x = inputs[i].unpack(name());
      if (x.defined()) {
        x = x.detach();
        if (input_requires_grad[i]) x.requires_grad_();
      }
      leaves.push_back(x);
    }
    for (const ReadVersion& r : reads)
      if (const std::shared_ptr<Storage> s = r.storage.lock()) {
        const uint64_t now = s->version.load(std::memory_order_relaxed);
        FRUGAL_CHECK(now == r.version, name(), ": ", dtype_name(r.meta.dtype), shape_str(r.meta.sizes), " ",
                     r.meta.device.str(),
                     ", which the checkpointed function read, was modified by an in-place operation after the "
                     "forward (version ",
                     now, ", read at version ", r.version,
                     "); the recompute would read the new values and give other gradients. Write it after "
                     "backward, or pass a clone() into the region");
      }
    ModeCheck check;
    for (const auto& [op, flag] : modes) check.forward[op].push_back(flag);

    TensorList recomputed;
    {
      ScopedPointer<ModeCheck> check_modes(mode_check, &check);
      GeneratorReplay replay(rng);
      AutocastReplay amp(amp_cpu, amp_cuda);
      EnableGradGuard grad_on;
      RecomputeScope recompute;  // forward-only state updates are skipped (see the Note)
      if (*kept && !(*kept)->replayed) {
        selective::ReplayScope take_kept(**kept);
        recomputed = (*fn)(leaves);
        take_kept.finish();
      } else {
        recomputed = (*fn)(leaves);
      }
    }
    FRUGAL_CHECK(recomputed.size() == outputs.size(), name(), ": the recomputed function returned ", recomputed.size(),
                 " tensors but the forward returned ", outputs.size(),
                 "; a checkpointed function must be deterministic");

    TensorList roots, root_grads;
    for (size_t k = 0; k < recomputed.size(); ++k) {
      const Tensor& out = recomputed[k];
      if (!out.defined() || !requires_grad(out) || k >= grads.size() || !grads[k].defined()) continue;
      FRUGAL_CHECK(out.sizes() == outputs[k].sizes, name(), ": output ", k, " was recomputed with shape ",
                   shape_str(out.sizes()), " but had shape ", shape_str(outputs[k].sizes),
                   " in the forward; a checkpointed function must be deterministic");
      roots.push_back(out);
      root_grads.push_back(grads[k]);
    }
    grads.clear();
    recomputed.clear();  // outputs not taking part release their graphs now
    // The recomputed outputs' values are not needed, only their graph: their storage is
    // free for the region's backward (see Note [Checkpoint recompute]).
    TensorList grad_inputs(leaves.size());
    if (roots.empty()) return grad_inputs;
    const TensorList got = nested_gradients(std::move(roots), root_grads, leaves);
    for (size_t i = 0; i < leaves.size(); ++i)
      if (input_requires_grad[i] && wants_grad(*this, i)) grad_inputs[i] = got[i];
    return grad_inputs;
  }
};

}  // namespace

const char* to_string(CheckpointPolicy policy) { return policy == CheckpointPolicy::Selective ? "selective" : "full"; }

std::optional<CheckpointPolicy> parse_checkpoint_policy(std::string_view name) {
  if (name == "full") return CheckpointPolicy::Full;
  if (name == "selective") return CheckpointPolicy::Selective;
  return std::nullopt;
}

KeepPredicate keep_predicate(CheckpointPolicy policy) {
  if (policy == CheckpointPolicy::Selective) return is_expensive_op;
  return {};
}

TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
                      CheckpointPolicy policy) {
  return checkpoint(fn, inputs, keep_predicate(policy));
}

bool in_checkpoint_recompute() { return recompute_depth > 0; }

void note_mode(const char* op, bool flag) {
  if (forward_log) forward_log->modes.emplace_back(op, flag);
  if (!mode_check) return;
  const auto it = mode_check->forward.find(op);
  size_t& k = mode_check->met[op];
  if (it != mode_check->forward.end() && k < it->second.size()) {
    const bool then = it->second[k];
    FRUGAL_CHECK(then == flag, "CheckpointBackward: ", op, " ran in ", then ? "training" : "eval",
                 " mode in the forward and in ", flag ? "training" : "eval",
                 " mode in the recompute: a module's train()/eval() changed between the forward and backward of a ",
                 "checkpointed region, and the recompute would compute other values than the forward did. ",
                 "Switch modes after backward (Note [What a replay must find unchanged])");
  }
  ++k;
}

void detail::note_checkpoint_read(const Tensor& x) {
  if (!forward_log) return;
  const Storage* s = x.impl().storage.get();
  if (s == nullptr || s->serial >= forward_log->first_serial || !forward_log->seen.insert(s).second) return;
  // the shape kept, formatted only for an error: a step reads many
  forward_log->reads.push_back(
      {x.impl().storage, s->version.load(std::memory_order_relaxed), {x.sizes(), x.dtype(), x.device()}});
}

void check_recompute_write(const char* op, const Tensor& self) {
  if (recompute_depth == 0 || !self.defined()) return;
  FRUGAL_CHECK(self.impl().storage->serial >= recompute_first_serial, op, ": a checkpoint's recompute would write ",
               self.describe(), " in place a second time: the checkpointed function writes a tensor it did not ",
               "make (a buffer it captures), which the forward wrote already. Make the write outside the ",
               "function, or skip it while autograd::in_checkpoint_recompute() is true (Note [Checkpoint recompute])");
}

TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
                      KeepPredicate keep) {
  FRUGAL_CHECK(fn != nullptr, "checkpoint: the function to checkpoint is empty");
  std::vector<GeneratorState> rng{default_generator().state()};
  const bool records = is_grad_enabled();
  // Without grad nothing is recorded and nothing kept: the ops inside fn are seen by an
  // outer checkpoint's scope, if any (Note [Selective checkpoint], nesting).
  std::shared_ptr<selective::KeptOutputs> kept;
  if (records && keep) {
    kept = std::make_shared<selective::KeptOutputs>();
    kept->keep = std::move(keep);
  }
  // An input written in place by fn would be saved with the write, and the replay would
  // apply it a second time (see "Inputs written in place" in Note [Checkpoint recompute]).
  std::vector<uint64_t> versions;
  if (records)
    for (const Tensor& x : inputs) versions.push_back(x.defined() ? x.version() : 0);
  TensorList outputs;
  bool used_grad = false;  // fn handed a tensor that requires grad to an op (a captured parameter)
  ForwardLog log;
  {
    ScopedPointer<ForwardLog> note_forward(forward_log, records ? &log : forward_log);
    ReadObserverScope note_reads(records);
    GradUseProbe probe;               // the point: nothing inside fn is recorded or saved; the
                                      // probe sees the parameters fn captures, which no edge shows
    std::optional<DrawRecord> draws;  // the generators fn draws from (Note [Checkpoint recompute])
    if (records) draws.emplace();
    if (kept) {
      selective::RecordScope keep_outputs(*kept);
      outputs = fn(inputs);
    } else {
      outputs = fn(inputs);
    }
    if (records)
      for (const GeneratorState& s : draws->first_states())
        if (s.generator() != &default_generator()) rng.push_back(s);
    used_grad = probe.saw_grad();
    // What fn wrote itself is its own state (a running statistic, a guarded counter): the
    // replay skips or refuses that write, and other writes before backward do not matter.
    std::erase_if(log.reads, [](const ReadVersion& r) {
      const std::shared_ptr<Storage> s = r.storage.lock();
      return !s || s->version.load(std::memory_order_relaxed) != r.version;
    });
  }
  const bool input_needs_grad =
      std::any_of(inputs.begin(), inputs.end(), [](const Tensor& x) { return x.defined() && requires_grad(x); });
  // A region of frozen layers on data (fine-tuning under checkpointing) has nothing to
  // differentiate: its outputs are plain tensors, so nothing is held and nothing is replayed.
  if (!records || !(input_needs_grad || used_grad)) return outputs;
  for (size_t i = 0; i < inputs.size(); ++i)
    FRUGAL_CHECK(!inputs[i].defined() || inputs[i].version() == versions[i], "checkpoint: the checkpointed function ",
                 "wrote its input ", i, " (", inputs[i].describe(), ") in place; backward would replay it from the ",
                 "written values, and the caller's tensor would keep a history without the write. Write a clone() ",
                 "of the input inside the function, or use the out-of-place op");

  auto node = std::make_shared<CheckpointBackward>();
  node->fn = fn;
  node->kept = std::move(kept);
  node->rng = std::move(rng);
  node->amp_cpu = autocast::state(DeviceType::CPU);
  node->amp_cuda = autocast::state(DeviceType::CUDA);
  node->modes = std::move(log.modes);
  node->reads = std::move(log.reads);
  node->next_edges.reserve(inputs.size());
  for (const Tensor& x : inputs) {
    const bool rg = x.defined() && requires_grad(x);
    node->next_edges.push_back(rg ? gradient_edge(x) : Edge{});
    node->input_requires_grad.push_back(rg);
    node->inputs.push_back(x);
  }
  for (uint32_t k = 0; k < outputs.size(); ++k) {
    Tensor& out = outputs[k];
    if (!out.defined()) {
      node->outputs.push_back({});
      continue;
    }
    // A new handle: fn may return one of its inputs (or a view sharing its meta), whose
    // history must not be overwritten; one that may alias another tensor refuses in-place
    // writes (Note [Aliases of transform outputs]). Under NoGradGuard fn made nothing that
    // requires grad: such an output came from outside (an input, a captured parameter).
    bool aliased = requires_grad(out);
    for (size_t j = 0; j < outputs.size() && !aliased; ++j)
      aliased = j != k && outputs[j].defined() && outputs[j].shares_storage(out);
    for (size_t i = 0; i < inputs.size() && !aliased; ++i)
      aliased = inputs[i].defined() && inputs[i].shares_storage(out);
    out = alias_for_history(out, aliased);
    node->outputs.push_back({out.sizes(), out.dtype(), out.device()});
    if (out.is_floating_point()) set_history(out, node, k);
  }
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, CheckpointPolicy policy) {
  return checkpoint(fn, x, keep_predicate(policy));
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, KeepPredicate keep) {
  FRUGAL_CHECK(fn != nullptr, "checkpoint: the function to checkpoint is empty");
  return checkpoint([fn](const TensorList& in) { return TensorList{fn(in[0])}; }, TensorList{x}, std::move(keep))[0];
}

}  // namespace frugal::autograd
