#pragma once
// Pipeline parallelism: an nn::Sequential cut into contiguous stages, one per rank of a
// pipeline communicator, fed with micro-batches on the GPipe (fill-drain) or the 1F1B
// schedule (see Note [Pipeline schedules] in parallel/pipeline.cpp).
//
//   auto bounds = parallel::split_by_cost(parallel::parameter_costs(*model), pp->size());
//   parallel::PipelineStage stage(parallel::make_stage(*model, bounds[pp->rank()]), pp,
//                                 {.schedule = parallel::Schedule::OneFOneB, .micro_batches = 8});
//   auto stats = stage.train_step(x, y, loss_fn);   // x on the first stage, y on the last
//   opt.step();                                      // this stage's parameters
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "nn/container.h"
#include "parallel/communicator.h"

namespace frugal::parallel {

/// Module ranges [begin, end) of a Sequential, one per stage, in order.
using StageBounds = std::vector<std::pair<size_t, size_t>>;

/// Splits n modules into `stages` contiguous ranges of (as nearly as possible) equal count.
StageBounds split_by_index(size_t num_modules, int stages);
/// Splits modules with the given costs into `stages` contiguous non-empty ranges that
/// minimise the largest stage cost (the pipeline's throughput bound).
StageBounds split_by_cost(const std::vector<double>& costs, int stages);
/// Cost per module = its number of parameter elements (+1, so parameter-free modules count).
std::vector<double> parameter_costs(const nn::Sequential& model);
/// Cost per module = measured seconds of forward + backward on `sample` passed through the
/// model (median of `reps` runs, after one warm-up); the model's .grad are cleared after.
std::vector<double> time_costs(const nn::Sequential& model, const Tensor& sample, int reps = 3);
/// A Sequential holding (sharing, not copying) modules [range.first, range.second).
std::shared_ptr<nn::Sequential> make_stage(const nn::Sequential& model, std::pair<size_t, size_t> range);

enum class Schedule { GPipe, OneFOneB };

struct PipelineOptions {
  Schedule schedule = Schedule::OneFOneB;
  int micro_batches = 4;
  /// Recompute each micro-batch's stage forward in backward (autograd::checkpoint): the
  /// stage keeps only its input per micro-batch in flight.
  bool recompute = false;
  /// Time each forward and backward (CUDA events on the stream, the host clock on the CPU:
  /// Note [Pipeline busy time] in pipeline.cpp) to report busy time and the measured
  /// bubble. Off, busy_seconds, bubble_measured and stage_bubble are -1.
  bool measure_busy = true;
};

/// Loss of one micro-batch (its mean); the step's loss is the mean over micro-batches.
using PipelineLoss = std::function<Tensor(const Tensor& output, const Tensor& target)>;

struct PipelineStats {
  double loss = 0.0;                // the step's mean loss (every stage gets the last stage's)
  double step_seconds = 0.0;        // wall time of train_step on this stage
  double busy_seconds = 0.0;        // forward + backward compute of this stage
  double bubble_measured = 0.0;     // idle share of all stages' time: 1 - sum(busy) / (p * longest step)
  double stage_bubble = 0.0;        // (step - busy) / step on this stage
  double bubble_theoretical = 0.0;  // (p - 1) / (m + p - 1)
  int64_t peak_in_flight = 0;       // most micro-batches whose activations this stage held at once
};

/// This rank's stage of a pipeline. Activations go forward and their gradients backward
/// with comm send/recv; the first activation of each step is preceded by a small header
/// with its dtype and shape, so stages need not know each other's shapes (every
/// micro-batch of a step has the first one's shape: the sender checks it).
class PipelineStage {
 public:
  PipelineStage(std::shared_ptr<nn::UnaryModule> module, std::shared_ptr<Communicator> comm,
                PipelineOptions options = {});

  /// Forward and backward of one batch over the micro-batches: `input` (first stage only;
  /// split along dim 0) and `target` (last stage only; split along dim 0, with the input's
  /// batch size, which the activation header carries down to check it). Accumulates
  /// the stage's parameters' .grad as a full-batch mean loss would; the caller steps the
  /// optimizer afterwards. Every stage of the pipeline calls it together.
  PipelineStats train_step(const Tensor& input, const Tensor& target, const PipelineLoss& loss_fn);

  bool is_first() const { return comm_->rank() == 0; }
  bool is_last() const { return comm_->rank() == comm_->size() - 1; }
  const std::shared_ptr<nn::UnaryModule>& module() const { return module_; }

 private:
  std::shared_ptr<nn::UnaryModule> module_;
  std::shared_ptr<Communicator> comm_;
  PipelineOptions options_;
};

}  // namespace frugal::parallel
