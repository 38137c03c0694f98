#pragma once
// Selective checkpointing's hook in the expensive differentiable ops (Note [Selective
// checkpoint] in autograd/selective_checkpoint.cpp). Inside a selective checkpoint's forward
// the op's result is kept; in that checkpoint's recompute the op takes the kept result
// instead of running its kernel, and records its backward node as usual:
//
//   Tensor out = autograd::kept_or_run("linear", {x, weight, bias}, [&] { return ops::linear(x, weight, bias); });
//
// Outside a selective checkpoint kept_or_run is autograd::raw plus one thread-local read.
#include <functional>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "autograd/function.h"
#include "tensor/random.h"

namespace frugal::autograd {

/// Chooses the ops whose outputs a selective checkpoint keeps, by their OpScope name
/// ("matmul", "linear", "conv2d", "flash_attention").
using KeepPredicate = std::function<bool(std::string_view op)>;

/// The GEMM, convolution and fused-attention ops: matmul, linear, gelu_mlp, conv2d,
/// conv_transpose2d, flash_attention (scaled_dot_product_attention reaches one of them). CheckpointPolicy::Selective keeps these.
bool is_expensive_op(std::string_view op);

namespace selective {

/// What a selective checkpoint keeps of one op call: its output tensors and the Philox range
/// it drew (flash attention's dropout; {0, 0} for the others).
struct Kept {
  TensorList tensors;
  Generator::Range range{0, 0};
};

/// What the shape check of a replay compares: one input's presence, sizes, dtype and device.
struct InputSignature {
  bool defined = false;
  Shape sizes;
  DType dtype = kFloat32;
  Device device;
  bool operator==(const InputSignature&) const = default;
};

/// One kept op call, in the order of the forward.
struct KeptCall {
  const char* op;
  std::vector<InputSignature> inputs;
  Kept kept;
  std::vector<uint64_t> versions;  // of kept.tensors when kept: an in-place write since voids them
  /// The counters the call drew, per generator (first: its state before the call's first
  /// draw; count: counters drawn): a replay that skips the call advances each by as many.
  struct Drawn {
    GeneratorState first;
    uint64_t count = 0;
  };
  std::vector<Drawn> drawn;
};

/// The kept outputs of one checkpointed call, owned by its CheckpointBackward.
struct KeptOutputs {
  KeepPredicate keep;
  std::vector<KeptCall> calls;
  size_t next = 0;        // the next call a replay hands out
  bool replayed = false;  // a replay consumes the calls; a later one (retain_graph) recomputes all
  int64_t bytes() const;  // storage bytes of the kept tensors (for tests and reports)
};

/// While alive, the ops that `kept.keep` selects append their results to `kept` (a
/// checkpoint's forward). Scopes nest with ReplayScope as a per-thread stack.
class RecordScope {
 public:
  explicit RecordScope(KeptOutputs& kept);
  ~RecordScope();
  RecordScope(const RecordScope&) = delete;
  RecordScope& operator=(const RecordScope&) = delete;
};

/// While alive, the ops that `kept.keep` selects take their results from `kept`, in order
/// (a checkpoint's recompute); finish() then checks that every kept call was taken.
class ReplayScope {
 public:
  explicit ReplayScope(KeptOutputs& kept);
  ~ReplayScope();
  ReplayScope(const ReplayScope&) = delete;
  ReplayScope& operator=(const ReplayScope&) = delete;
  void finish() const;

 private:
  KeptOutputs& kept_;
};

/// True while a RecordScope or ReplayScope is alive on this thread and no kept op is
/// computing (an op called inside a kept op's kernel is not kept twice).
bool active() noexcept;

/// The result of `op` on `inputs`: the kept one when a replay holds it, else compute()'s
/// (run below autograd), which the recording scopes keep.
Kept run(const char* op, std::initializer_list<Tensor> inputs, const std::function<Kept()>& compute);

}  // namespace selective

/// autograd::raw(compute) for an op that selective checkpointing may keep: one tensor out.
template <typename F>
Tensor kept_or_run(const char* op, std::initializer_list<Tensor> inputs, F&& compute) {
  if (!selective::active()) return raw(compute);
  return selective::run(op, inputs, [&] { return selective::Kept{{raw(compute)}}; }).tensors[0];
}

}  // namespace frugal::autograd
