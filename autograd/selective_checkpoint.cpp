// Selective checkpointing: keep the expensive ops' outputs, recompute the cheap ones.
//
// Note [Selective checkpoint]
// Full recompute (Note [Checkpoint recompute]) runs a block's forward twice, and the
// GEMMs, convolutions and attention kernels are most of its time. Korthikanti et al. (2022)
// keep exactly those outputs and recompute the rest; PyTorch's
// create_selective_checkpoint_contexts does the same with a per-op policy. Here:
//  - checkpoint(fn, inputs, policy) with CheckpointPolicy::Selective (or a KeepPredicate
//    over op names) runs fn's forward under a RecordScope over the node's KeptOutputs: every
//    selected op (is_expensive_op: matmul, linear, gelu_mlp, conv2d, flash_attention) appends its
//    result, in call order, with its inputs' signature (sizes, dtype, device), its outputs'
//    versions and the counters it drew from each generator (Note [Draws under a record]).
//  - The recompute runs fn under a ReplayScope over the same list: each selected op takes
//    the next kept call instead of running its kernel, and still records its node (saving its
//    inputs as usual), so gradients flow through it. The cheap ops (elementwise, norms,
//    softmax, GELU, dropout through the replayed generator) run again. A call whose op name
//    or input signature differs from the kept one throws, naming both ops: fn is not
//    deterministic. A skipped op that drew random numbers (flash attention's dropout) advances
//    each generator it drew from (the default one, or one it was given) by the kept count, so
//    the ops after it draw what they drew in the forward; its kept range reproduces its own
//    mask in backward.
//  - The hook sits in each op's wrapper after autocast and the rank-changing recursion, at
//    the one place its kernel runs (autograd::kept_or_run replaces autograd::raw), so one
//    call keeps one result. While a kept op computes, active() is false: an op called inside
//    its kernel is not kept a second time.
//  - A kept output written in place after it was kept (its version moved) is not handed
//    out: the op recomputes it from the replayed inputs, which is lossless; the kept copy is
//    dropped. Gradients never depend on which of the two happened.
//  - The replay consumes the list (each call moves its tensors out), so a kept output lives
//    only as long as the recomputed graph needs it, and the node drops what is left when the
//    engine releases its saved state. A second replay (backward with retain_graph) finds the
//    list consumed and recomputes everything, as a full checkpoint.
//  - Nesting: scopes form a per-thread stack. An op takes its result from the innermost
//    replay whose predicate selects it and is kept by every recording scope inside that
//    replay. An inner checkpoint under an outer one's forward runs without grad and records
//    nothing of its own, so the outer list holds the inner ops too; in the outer replay the
//    inner checkpoint's forward takes them from the outer list and keeps them in its own.
// Memory: the block keeps its GEMM, convolution and attention outputs (and flash
// attention's row statistics), none of its norm or activation outputs and none of the
// tensors the cheap ops save; the recompute costs only the cheap ops. Where attention
// cannot take the fused kernels, scaled_dot_product_attention is matmul, masked_softmax and
// dropout, and Selective keeps both matmuls, the (B, H, L, S) scores among them; the
// predicate {linear, conv2d, flash_attention} keeps the projections and recomputes that
// attention core instead (what Korthikanti et al. recompute). Limits: kept outputs are not
// passed through saved-tensor hooks (Note [Saved tensor hooks]), and the generator count of
// a kept call, like the generator replay itself, assumes that no other thread draws from
// the same generator meanwhile (Note [Checkpoint recompute]).
#include "autograd/selective_checkpoint.h"

#include <cstring>
#include <sstream>

#include "core/error.h"

namespace frugal::autograd {

bool is_expensive_op(std::string_view op) {
  return op == "matmul" || op == "linear" || op == "gelu_mlp" || op == "conv2d" || op == "conv_transpose2d" ||
         op == "flash_attention";
}

namespace selective {

namespace {

struct Frame {
  KeptOutputs* kept;
  bool replay;
};

thread_local std::vector<Frame> t_frames;
thread_local int t_computing = 0;  // kept ops computing on this thread (see active())

// Marks a kept op's kernel as running: ops it calls are not kept again.
struct Computing {
  Computing() { ++t_computing; }
  ~Computing() { --t_computing; }
};

std::vector<InputSignature> signature_of(std::initializer_list<Tensor> inputs) {
  std::vector<InputSignature> sig;
  sig.reserve(inputs.size());
  for (const Tensor& x : inputs) {
    if (x.defined()) sig.push_back({true, x.sizes(), x.dtype(), x.device()});
    else sig.push_back({});
  }
  return sig;
}

std::string call_str(const char* op, const std::vector<InputSignature>& inputs) {
  std::ostringstream s;
  s << op << "(";
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) s << ", ";
    const InputSignature& x = inputs[i];
    if (x.defined) s << dtype_name(x.dtype) << shape_str(x.sizes) << " " << x.device.str();
    else s << "undefined";
  }
  return s.str() + ")";
}

std::vector<uint64_t> versions_of(const TensorList& tensors) {
  std::vector<uint64_t> v;
  for (const Tensor& t : tensors) v.push_back(t.defined() ? t.version() : 0);
  return v;
}

bool unchanged_since_kept(const KeptCall& call) {
  for (size_t i = 0; i < call.kept.tensors.size(); ++i)
    if (call.kept.tensors[i].defined() && call.kept.tensors[i].version() != call.versions[i]) return false;
  return true;
}

}  // namespace

int64_t KeptOutputs::bytes() const {
  int64_t total = 0;
  for (const KeptCall& c : calls)
    for (const Tensor& t : c.kept.tensors)
      if (t.defined()) total += t.numel() * int64_t(t.element_size());
  return total;
}

RecordScope::RecordScope(KeptOutputs& kept) { t_frames.push_back({&kept, false}); }
RecordScope::~RecordScope() { t_frames.pop_back(); }

ReplayScope::ReplayScope(KeptOutputs& kept) : kept_(kept) {
  kept.replayed = true;
  t_frames.push_back({&kept, true});
}
ReplayScope::~ReplayScope() { t_frames.pop_back(); }

void ReplayScope::finish() const {
  FRUGAL_CHECK(kept_.next == kept_.calls.size(), "CheckpointBackward: the recompute called ", kept_.next, " of the ",
               kept_.calls.size(), " kept ops of the forward (the next one was ",
               call_str(kept_.calls[kept_.next].op, kept_.calls[kept_.next].inputs),
               "); a checkpointed function must be deterministic");
}

bool active() noexcept { return t_computing == 0 && !t_frames.empty(); }

Kept run(const char* op, std::initializer_list<Tensor> inputs, const std::function<Kept()>& compute) {
  const std::vector<InputSignature> sig = signature_of(inputs);
  // The innermost replay that selects op supplies the result (see Note [Selective checkpoint]).
  size_t first_recorder = 0;
  KeptOutputs* source = nullptr;
  for (size_t i = t_frames.size(); i-- > 0;)
    if (t_frames[i].replay && t_frames[i].kept->keep(op)) {
      source = t_frames[i].kept;
      first_recorder = i + 1;
      break;
    }

  Kept result;
  bool have = false;
  std::vector<KeptCall::Drawn> drawn;
  if (source) {
    FRUGAL_CHECK(source->next < source->calls.size(), "CheckpointBackward: the recompute called ", call_str(op, sig),
                 " after the ", source->calls.size(),
                 " kept ops of the forward; a checkpointed function must be deterministic");
    KeptCall call = std::move(source->calls[source->next++]);  // consumed: see Note [Selective checkpoint]
    FRUGAL_CHECK(std::strcmp(call.op, op) == 0 && call.inputs == sig, "CheckpointBackward: kept op ", source->next,
                 " of ", source->calls.size(), " was ", call_str(call.op, call.inputs),
                 " in the forward but the recompute called ", call_str(op, sig),
                 "; a checkpointed function must be deterministic");
    drawn = std::move(call.drawn);
    if (unchanged_since_kept(call)) {
      result = std::move(call.kept);
      for (Tensor& t : result.tensors)
        if (t.defined()) t = t.detach();  // a fresh handle: the op records its own node on it
      for (const KeptCall::Drawn& d : drawn) {
        Generator* g = d.first.generator();
        FRUGAL_CHECK(g != nullptr, "CheckpointBackward: the Generator kept op ", call_str(op, sig),
                     " drew from in the forward was destroyed before backward");
        (void)g->reserve(d.count);  // the counters the skipped kernel drew
      }
      have = true;
    }
  }
  if (!have) {
    Computing computing;
    DrawRecord draws;
    result = compute();
    drawn.clear();
    for (const GeneratorState& s : draws.first_states())
      if (Generator* g = s.generator()) drawn.push_back({s, g->offset() - s.offset});
  }
  for (size_t i = first_recorder; i < t_frames.size(); ++i) {
    KeptOutputs& kept = *t_frames[i].kept;
    if (t_frames[i].replay || !kept.keep(op)) continue;
    kept.calls.push_back({op, sig, result, versions_of(result.tensors), drawn});
  }
  return result;
}

}  // namespace selective

}  // namespace frugal::autograd
