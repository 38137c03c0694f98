// Note [Block memory plan]
// A model is a stem, a chain of blocks and a head, and nearly all of a training step's
// activation memory is saved inside the blocks. Each block can be run in one of a few ways
// that trade that memory for time (BlockMemory), and which way pays differs per block: a
// ResNet's early blocks hold the large feature maps of high resolution at the same FLOPs as
// its late ones, so recomputing them frees the most bytes per millisecond. Models therefore
// take a BlockMemoryPlan, a choice per block, and run block i through run_block(plan, i, ...);
// nn::BlockPlanner picks the plan for a byte budget from what a BlockProbe measured.
//
// The probe. To predict the peak of any plan from a few uniform runs (every block the same
// choice), the planner needs, per block and choice, the bytes the block leaves allocated
// after its forward and the peaks while it runs forward and backward. run_block marks the
// boundaries: ForwardEnter/ForwardExit around fn, and two pass-through backward nodes, one
// on the block's output (its backward runs first: BackwardStart) and one on its input
// (runs once the block's whole backward, every use of the input included, is done:
// BackwardEnd). At each mark the probe reads the allocator's current bytes and the peak
// since the last mark, then resets the peak, so the events split the step's peak into
// segments. The marks cost a stats read each and exist only while a probe is alive; without
// one run_block is a switch over the choice.
#include "nn/block_memory.h"

#include <chrono>

#include "autograd/compress.h"
#include "autograd/function.h"
#include "autograd/node.h"
#include "autograd/offload.h"
#include "autograd/ops/inplace.h"
#include "autograd/recompute_cheap.h"
#include "core/error.h"
#include "core/instrument.h"
#include "core/stream.h"
#include "memory/allocator.h"

namespace frugal::nn {

const char* to_string(BlockMemory choice) {
  switch (choice) {
    case BlockMemory::Keep: return "keep";
    case BlockMemory::Recompute: return "recompute";
    case BlockMemory::Selective: return "selective";
    case BlockMemory::Checkpoint: return "checkpoint";
    case BlockMemory::Compress: return "compress";
    case BlockMemory::Offload: return "offload";
    case BlockMemory::CheckpointOffload: return "checkpoint-offload";
    case BlockMemory::CheckpointRecompute: return "checkpoint-recompute";
  }
  return "?";
}

std::optional<BlockMemory> parse_block_memory(std::string_view name) {
  for (int i = 0; i < kNumBlockMemory; ++i)
    if (name == to_string(static_cast<BlockMemory>(i))) return static_cast<BlockMemory>(i);
  return std::nullopt;
}

bool is_lossy(BlockMemory choice) { return choice == BlockMemory::Compress; }

bool keeps_input(BlockMemory choice) {
  return choice == BlockMemory::Keep || choice == BlockMemory::Selective || choice == BlockMemory::Checkpoint ||
         choice == BlockMemory::CheckpointRecompute;
}

BlockMemoryPlan BlockMemoryPlan::from_checkpoint(bool checkpoint_blocks, autograd::CheckpointPolicy policy) {
  if (!checkpoint_blocks) return uniform(BlockMemory::Keep);
  return uniform(policy == autograd::CheckpointPolicy::Selective ? BlockMemory::Selective : BlockMemory::Checkpoint);
}

void BlockMemoryPlan::check_fits(int64_t num_blocks, const char* model) const {
  FRUGAL_CHECK(int64_t(blocks.size()) <= num_blocks, model, ": memory_plan names ", blocks.size(),
               " blocks, but the model has ", num_blocks,
               " (one choice per block, in forward order; a shorter plan takes its fallback for the rest)");
}

namespace {

thread_local BlockProbe* current_probe = nullptr;

double host_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Passes the gradient through and marks a block boundary of the probe's step.
struct BlockMarkBackward final : autograd::Node {
  BlockProbe* probe = nullptr;
  BlockProbeEvent::Kind kind = BlockProbeEvent::BackwardStart;
  int64_t block = 0;
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    probe->record(kind, block);
    return std::move(grads);
  }
  std::string name() const override { return "BlockMarkBackward"; }
  bool saves_tensors() const override { return false; }
};

// x itself, with a mark in its backward (x unchanged when it needs no gradient).
Tensor marked(const Tensor& x, BlockProbe* probe, BlockProbeEvent::Kind kind, int64_t block) {
  if (!x.defined() || !x.is_floating_point()) return x;
  auto node = autograd::make_node<BlockMarkBackward>({x});
  if (!node) return x;
  // The block's in-place writes to its input, or the caller's to an output that is the input
  // or a tensor the block captured, are refused while x has another holder, rather than
  // missed by its history (Note [Aliases of transform outputs]).
  Tensor out = autograd::alias_for_history(x, /*aliased=*/true);
  node->probe = probe;
  node->kind = kind;
  node->block = block;
  autograd::record(node, {out});
  return out;
}

// The forward runs without grad (nothing to recompute); the replay records, and its norm
// and activation outputs become recipes while the block's backward runs.
Tensor checkpoint_recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  return autograd::checkpoint([fn](const Tensor& in) { return autograd::recompute_cheap(fn, in); }, x);
}

Tensor run_choice(BlockMemory choice, const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  switch (choice) {
    case BlockMemory::Keep: return fn(x);
    case BlockMemory::Recompute: return autograd::recompute_cheap(fn, x);
    case BlockMemory::Compress: return autograd::compress(fn, x);
    case BlockMemory::Offload: return autograd::offload(fn, x);
    case BlockMemory::CheckpointOffload:
      // The deepest choice: the input in host memory, and the replay as CheckpointRecompute's.
      return autograd::offload([fn](const Tensor& in) { return checkpoint_recompute(fn, in); }, x);
    case BlockMemory::CheckpointRecompute: return checkpoint_recompute(fn, x);
    case BlockMemory::Selective: return autograd::checkpoint(fn, x, autograd::CheckpointPolicy::Selective);
    case BlockMemory::Checkpoint: return autograd::checkpoint(fn, x, autograd::CheckpointPolicy::Full);
  }
  FRUGAL_FAIL("run_block: unknown BlockMemory ", static_cast<int>(choice));
}

}  // namespace

Tensor run_block(const BlockMemoryPlan& plan, size_t index, const std::function<Tensor(const Tensor&)>& fn,
                 const Tensor& x) {
  BlockProbe* probe = current_probe;
  if (!probe) return run_choice(plan.at(index), fn, x);
  const auto block = static_cast<int64_t>(index);
  probe->record(BlockProbeEvent::ForwardEnter, block);
  Tensor y = run_choice(plan.at(index), fn, marked(x, probe, BlockProbeEvent::BackwardEnd, block));
  probe->record(BlockProbeEvent::ForwardExit, block, y.defined() ? static_cast<int64_t>(y.impl().storage->nbytes) : 0);
  return marked(y, probe, BlockProbeEvent::BackwardStart, block);
}

BlockProbe::BlockProbe(Device device, bool time_blocks) : device_(device), time_blocks_(time_blocks) {
  FRUGAL_CHECK(current_probe == nullptr, "BlockProbe: a probe is already alive on this thread");
  memory::reset_peak(device_);
  current_probe = this;
}

BlockProbe::~BlockProbe() {
  if (current_probe == this) current_probe = nullptr;
  if (forward_start_) core::release_timing_event(forward_start_);
}

BlockProbe* BlockProbe::current() { return current_probe; }

void BlockProbe::record(BlockProbeEvent::Kind kind, int64_t block, int64_t output_bytes) {
  const memory::MemoryStats s = memory::stats(device_);
  BlockProbeEvent e{kind, block, s.allocated_bytes.current, s.allocated_bytes.peak, output_bytes, 0.0};
  memory::reset_peak(device_);
  if (time_blocks_) {
    // Forward times weigh each block's share of a choice's extra step time. The CPU has no
    // device events; its host clock stands in (the work is synchronous there).
    if (kind == BlockProbeEvent::ForwardEnter) {
      if (device_.is_cuda()) forward_start_ = core::record_timing_event(device_);
      else forward_start_ms_ = host_ms();
    } else if (kind == BlockProbeEvent::ForwardExit) {
      if (device_.is_cuda() && forward_start_) {
        pending_.push_back({events_.size(), forward_start_, core::record_timing_event(device_)});
        forward_start_ = nullptr;
      } else if (!device_.is_cuda()) {
        e.forward_ms = host_ms() - forward_start_ms_;
      }
    }
  }
  events_.push_back(e);
}

std::vector<BlockProbeEvent> BlockProbe::finish() {
  record(BlockProbeEvent::StepEnd, -1);
  if (!pending_.empty()) {
    synchronize(device_);
    for (const PendingTiming& p : pending_) {
      events_[p.event].forward_ms = core::timing_event_elapsed_ms(p.start, p.end);
      core::release_timing_event(p.start);
      core::release_timing_event(p.end);
    }
    pending_.clear();
  }
  if (current_probe == this) current_probe = nullptr;
  return std::move(events_);
}

}  // namespace frugal::nn
