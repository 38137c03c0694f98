#pragma once
// Per-block memory choices: what each block of a model (a ResNet bottleneck, a transformer
// layer) does with the activations it saves for backward, and the one function models call
// to run a block that way (see Note [Block memory plan] in nn/block_memory.cpp).
//
//   nn::BlockMemoryPlan plan{.blocks = {BlockMemory::Checkpoint, BlockMemory::Selective, BlockMemory::Keep}};
//   h = nn::run_block(plan, i, [&](const Tensor& in) { return block->forward(in); }, h);
//
// nn::BlockPlanner (nn/block_planner.h) chooses a plan for a memory budget.
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "autograd/checkpoint.h"
#include "tensor/tensor.h"

namespace frugal::nn {

/// What one block keeps for backward, roughly cheapest in time first.
enum class BlockMemory : uint8_t {
  Keep,                 ///< everything its ops save (no extra work)
  Recompute,            ///< not the outputs of its norms and activations, which backward regenerates from what
                        ///< it keeps anyway (autograd::recompute_cheap, Note [Recomputable outputs])
  Selective,            ///< its GEMM, convolution and attention outputs; the rest is replayed in backward
                        ///< (autograd::checkpoint with CheckpointPolicy::Selective)
  Checkpoint,           ///< its input only; the whole block runs again in backward (autograd::checkpoint)
  Compress,             ///< what it saves, as FP8 codes with per-block scales (autograd::compress; lossy)
  Offload,              ///< what it saves, in pinned host memory, copied back one block ahead in backward
                        ///< (autograd::offload)
  CheckpointOffload,    ///< CheckpointRecompute, with the one input it keeps in host memory (the least
                        ///< device memory of all: nothing of the block stays between its forward and backward)
  CheckpointRecompute,  ///< Checkpoint, whose replay in backward runs under recompute_cheap: the
                        ///< block's own backward then holds fewer activations at once
};
inline constexpr int kNumBlockMemory = 8;

/// "keep", "recompute", "selective", "checkpoint", "compress", "offload", "checkpoint-offload",
/// "checkpoint-recompute".
const char* to_string(BlockMemory choice);
/// The choice named as to_string names it; nullopt for anything else.
std::optional<BlockMemory> parse_block_memory(std::string_view name);
/// True for choices whose gradients differ from Keep's beyond rounding (Compress).
bool is_lossy(BlockMemory choice);
/// False for choices under which the block may not keep its input alive itself (it saves a
/// recipe, codes or a host copy instead): then the tensor between it and the block before
/// lives on only if that block keeps it (Note [Block planner]).
bool keeps_input(BlockMemory choice);

/// A choice per block, in forward order. Blocks past the end of `blocks` use `fallback`.
struct BlockMemoryPlan {
  std::vector<BlockMemory> blocks;
  BlockMemory fallback = BlockMemory::Keep;

  BlockMemory at(size_t i) const { return i < blocks.size() ? blocks[i] : fallback; }
  /// Throws, naming `model`, when the plan names more blocks than the model's `num_blocks`
  /// (a plan written for another model, or one that left out ResNet's stem, block 0, would
  /// otherwise apply each choice to the wrong block). Fewer take the fallback.
  void check_fits(int64_t num_blocks, const char* model) const;
  /// Every block `choice`.
  static BlockMemoryPlan uniform(BlockMemory choice) { return {{}, choice}; }
  /// The plan the models' older switches name: checkpoint_blocks with its policy, else Keep.
  static BlockMemoryPlan from_checkpoint(bool checkpoint_blocks, autograd::CheckpointPolicy policy);
};

/// fn(x) for block `index` of a model, run as plan.at(index) says. While a BlockProbe is
/// alive on this thread (the planner's profiling), the block's forward and backward are
/// also measured. The closure must own what backward replays (Checkpoint and Selective
/// call it again after forward returned).
Tensor run_block(const BlockMemoryPlan& plan, size_t index, const std::function<Tensor(const Tensor&)>& fn,
                 const Tensor& x);

/// What a profiled step saw at its block boundaries (Note [Block memory plan]): allocated
/// bytes at each boundary and the peak since the boundary before it.
struct BlockProbeEvent {
  enum Kind : uint8_t { ForwardEnter, ForwardExit, BackwardStart, BackwardEnd, StepEnd } kind;
  int64_t block = -1;        ///< -1 for StepEnd
  int64_t allocated = 0;     ///< allocated bytes on the probe's device at the event
  int64_t peak_before = 0;   ///< the peak allocated bytes since the previous event (or the probe's start)
  int64_t output_bytes = 0;  ///< ForwardExit: the block output's storage bytes
  double forward_ms = 0;     ///< ForwardExit: the block's forward time (device time on CUDA)
};

/// While alive, run_block records a BlockProbeEvent at every block boundary of `device`'s
/// allocator (it resets the device's peak statistics as it goes). One per thread.
class BlockProbe {
 public:
  explicit BlockProbe(Device device, bool time_blocks = false);
  ~BlockProbe();
  BlockProbe(const BlockProbe&) = delete;
  BlockProbe& operator=(const BlockProbe&) = delete;

  /// Ends the step: records StepEnd and returns every event in order.
  std::vector<BlockProbeEvent> finish();

  /// Called by run_block and its backward nodes.
  void record(BlockProbeEvent::Kind kind, int64_t block, int64_t output_bytes = 0);
  static BlockProbe* current();

 private:
  Device device_;
  bool time_blocks_;
  std::vector<BlockProbeEvent> events_;
  struct PendingTiming {
    size_t event;  // the ForwardExit whose forward_ms it gives
    void* start;
    void* end;
  };
  void* forward_start_ = nullptr;  // CUDA: timing event of the open block forward
  double forward_start_ms_ = 0;    // CPU: host clock at its start
  std::vector<PendingTiming> pending_;
};

}  // namespace frugal::nn
