#pragma once
// The modes of bench/parallel_bench (single device, tensor, pipeline, data parallel,
// ZeRO-1, ZeRO-2, ZeRO-3 (fully sharded), tensor x pipeline grid) on a BERT-shaped encoder, written against a
// Communicator so the same code runs one process per GPU over NCCL and as thread ranks
// over CPU tensors (the cpu suite's test_parallel_bench.cpp drives it that way).
//
//   BenchOptions opts{.model = model_config("tiny"), .batch = 8, .modes = {"single", "grid"}};
//   std::vector<ModeResult> results = run_modes(world, opts);   // every rank calls it
//   if (world->rank() == 0) print_report(results, opts, *world);
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace frugal::bench {

/// Layer i of the encoder is drawn from Generator(kInitSeed + i), the batch (input, then
/// target) from Generator(kDataSeed), on every rank (Note [Same model in every mode]).
inline constexpr uint64_t kInitSeed = 1234, kDataSeed = 42;
/// AdamW's learning rate in every mode.
inline constexpr double kLearningRate = 1e-4;

/// The encoder's shape: `layers` post-norm encoder layers, no embeddings, f32.
struct ModelConfig {
  std::string name;  // "BERT-base", "BERT-large", "tiny"
  int64_t layers = 0, hidden = 0, heads = 0, ffn = 0, seq = 0;
};
/// "base" (12 x 768, 12 heads, 3072, seq 128), "large" (24 x 1024, 16 heads, 4096, seq 128)
/// or "tiny" (4 x 64, 4 heads, 128, seq 16: the CPU smoke size). Throws on another name.
ModelConfig model_config(const std::string& name);

struct BenchOptions {
  ModelConfig model = model_config("base");
  int64_t batch = 32;  // the global batch of every mode but ddp-weak (batch per rank)
  int iters = 10;      // timed steps per mode, after 2 warm-up steps
  int micro_batches = 8;
  /// Mode names, run in this order: single, tp, pp, ddp, ddp-weak, zero1, zero2, zero3, offload, grid.
  std::vector<std::string> modes;
};

/// Every mode that applies to `world_size` ranks: single alone for one rank; with more,
/// tp (when the heads split evenly), pp (when there are enough layers), ddp, ddp-weak,
/// zero1, zero2, zero3, and grid (2-way TP x world_size / 2 stages) when world_size is even and >= 4.
std::vector<std::string> default_modes(const ModelConfig& model, int world_size);
/// A comma list of mode names; throws naming an unknown one.
std::vector<std::string> parse_modes(const std::string& list);

struct ModeResult {
  std::string mode;   // the mode's name (parse_modes)
  std::string label;  // the table's row label
  std::string key;    // the prefix of its `name: value` lines
  int ranks = 1;
  int64_t samples = 0;  // per step over all ranks
  double step_s = 0, samples_per_s = 0, peak_gib = 0;
  double param_mib = 0;                             // the parameters one rank holds (the most over the ranks), MiB
  /// Data-parallel modes: the parameters, gradients (as backward leaves them) and AdamW
  /// moments one rank holds (the most over the ranks), MiB; -1 for the other modes.
  double state_mib = -1;
  double gathered_mib = -1;                         // zero3: peak of gathered units' parameters per rank, MiB
  double host_state_mib = -1;                       // offload: AdamW state in this rank's pinned host memory, MiB
  double efficiency = -1;                           // samples/s / (ranks * single's samples/s); -1 without single
  int stages = 0;                                   // pipeline modes: the number of stages
  double bubble_measured = -1, bubble_theory = -1;  // pipeline modes only (PipelineStats)
  double worst_stage_bubble = -1;                   // the largest stage_bubble
  /// Pipeline modes: one micro-batch's activation exchanged both ways between adjacent
  /// stages (a send_recv, as the 1F1B steady state does), ms, and its size in MiB.
  double exchange_ms = -1, exchange_mib = 0;
  /// The global batch's loss at the first step and after one AdamW step (the second
  /// step's forward), identical on every rank: what makes the modes comparable.
  double loss_first = 0, loss_second = 0;
};

/// Runs opts.modes on `world` (every rank calls it with the same options) and returns
/// every rank the same results: step time and peak memory are the maxima over the ranks.
/// Checks up front that each mode fits (heads, layers, batch divisible as it needs).
std::vector<ModeResult> run_modes(const std::shared_ptr<parallel::Communicator>& world, const BenchOptions& opts);

/// The header line, the table and the `name: value` lines, on stdout.
void print_report(const std::vector<ModeResult>& results, const BenchOptions& opts,
                  const parallel::Communicator& world);

}  // namespace frugal::bench
