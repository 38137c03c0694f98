// Tensor, pipeline and data parallelism on a BERT-base-shaped encoder (12 layers, hidden
// 768, 12 heads, MLP 3072, sequence 128), f32, one AdamW training step per iteration:
//   frugal-run --nproc 2 build/bench/parallel_bench [--batch 32] [--iters 10]
// Modes, all at the same global batch (strong scaling):
//   1 GPU     the plain layers (TensorParallelEncoderLayer without a communicator), rank 0 alone
//   TP        N-way tensor parallel: heads and MLP split across the N GPUs
//   PP        N pipeline stages, 8 micro-batches, 1F1B
//   DDP       N replicas, batch / N each, gradients all-reduced in 25 MiB buckets
// Prints a table (samples/s, scaling efficiency = samples/s / (N * 1-GPU samples/s), peak
// allocated memory per GPU, measured and theoretical pipeline bubble) and `name: value` lines.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/all.h"
#include "memory/allocator.h"
#include "memory/device.h"
#include "memory/stream.h"
#include "nn/container.h"
#include "optim/adam.h"
#include "parallel/ddp.h"
#include "parallel/init.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "tensor/factory.h"

using namespace frugal;
using namespace frugal::parallel;

namespace {

constexpr int64_t kLayers = 12, kHidden = 768, kHeads = 12, kFfn = 3072, kSeq = 128;

struct EncoderBlock : nn::UnaryModule {
  std::shared_ptr<TensorParallelEncoderLayer> layer;
  explicit EncoderBlock(std::shared_ptr<TensorParallelEncoderLayer> l)
      : layer(register_module("layer", std::move(l))) {}
  Tensor forward(const Tensor& x) override { return layer->forward(x); }
  std::string type_name() const override { return "EncoderBlock"; }
};

/// The encoder, its layers split across `tp` (null: plain layers), on `device`.
std::shared_ptr<nn::Sequential> make_encoder(const CommPtr& tp, Device device, int64_t first = 0,
                                             int64_t last = kLayers) {
  Generator gen(1234);
  auto seq = std::make_shared<nn::Sequential>();
  for (int64_t i = first; i < last; ++i)
    seq->push_back(std::make_shared<EncoderBlock>(std::make_shared<TensorParallelEncoderLayer>(
        kHidden, kHeads, kFfn, tp, TensorParallelEncoderOptions{.generator = &gen})));
  seq->to(device);
  return seq;
}

struct Result {
  std::string mode;
  int gpus = 1;
  int64_t samples = 0;  // per step over all GPUs; 0: the global batch
  double step_s = 0, samples_per_s = 0, peak_gib = 0, bubble_measured = -1, bubble_theory = -1;
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

/// Median seconds of `step` after warm-up; also resets and reads the peak memory.
double time_steps(Device device, int iters, const std::function<void()>& step, double* peak_gib) {
  for (int i = 0; i < 2; ++i) step();
  synchronize(device);
  memory::reset_peak(device);
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    step();
    synchronize(device);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  *peak_gib = double(memory::stats(device).allocated_bytes.peak) / double(1 << 30);
  return median(times);
}

/// The largest value of x over the ranks.
double max_over_ranks(Communicator& world, double x) {
  Tensor t = full({1}, x, {kFloat32, world.device()});
  world.all_reduce(t, ReduceOp::Max)->wait();
  return double(t.cpu().item<float>());
}

}  // namespace

int run(int argc, char** argv) {
  int64_t batch = 32;
  int iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  auto world = init_process_group(std::chrono::minutes(10));
  const int N = world->size(), r = world->rank();
  const Device dev = world->device();
  const Tensor x_full = randn({batch, kSeq, kHidden}, {kFloat32, dev});
  const Tensor y_full = randn({batch, kSeq, kHidden}, {kFloat32, dev});
  auto loss_fn = [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); };
  std::vector<Result> results;

  // Median seconds of an AdamW step of the encoder split across `tp` on the whole batch.
  auto time_whole_batch = [&](const CommPtr& tp, Result& res) {
    auto model = make_encoder(tp, dev);
    optim::AdamW opt(model->parameters(), {.lr = 1e-4});
    res.step_s = time_steps(
        dev, iters,
        [&] {
          loss_fn(model->forward(x_full), y_full).backward();
          opt.step();
          opt.zero_grad();
        },
        &res.peak_gib);
  };
  {  // 1 GPU: rank 0 alone
    Result res{.mode = "1 GPU", .gpus = 1};
    if (r == 0) time_whole_batch(nullptr, res);
    world->barrier();
    results.push_back(res);
  }
  {  // N-way tensor parallel
    Result res{.mode = "TP", .gpus = N};
    time_whole_batch(world, res);
    results.push_back(res);
  }
  {  // N-stage pipeline, 8 micro-batches, 1F1B
    Result res{.mode = "PP 1F1B m=8", .gpus = N};
    const StageBounds bounds = split_by_index(size_t(kLayers), N);
    auto stage_model = make_encoder(nullptr, dev, int64_t(bounds[size_t(r)].first), int64_t(bounds[size_t(r)].second));
    // Throughput without the busy-time timers (they synchronize the device around every
    // forward and backward); then one timed step for the measured bubble.
    PipelineStage stage(stage_model, world,
                        {.schedule = Schedule::OneFOneB, .micro_batches = 8, .measure_busy = false});
    PipelineStage timed_stage(stage_model, world, {.schedule = Schedule::OneFOneB, .micro_batches = 8});
    optim::AdamW opt(stage_model->parameters(), {.lr = 1e-4});
    const Tensor stage_x = stage.is_first() ? x_full : Tensor(), stage_y = stage.is_last() ? y_full : Tensor();
    res.step_s = time_steps(
        dev, iters,
        [&] {
          stage.train_step(stage_x, stage_y, loss_fn);
          opt.step();
          opt.zero_grad();
        },
        &res.peak_gib);
    const PipelineStats measured = timed_stage.train_step(stage_x, stage_y, loss_fn);
    opt.zero_grad();
    res.bubble_measured = max_over_ranks(*world, measured.bubble_measured);
    res.bubble_theory = measured.bubble_theoretical;
    results.push_back(res);
  }
  // N-way data parallel: strong scaling (the global batch split over the ranks) and weak
  // scaling (every rank a whole batch, as DDP is usually measured: what communication costs).
  for (const bool weak : {false, true}) {
    Result res{.mode = weak ? "DDP weak" : "DDP", .gpus = N, .samples = weak ? batch * N : batch};
    auto model = make_encoder(nullptr, dev);
    auto ddp = std::make_shared<DistributedDataParallel>(model, world);
    optim::AdamW opt(ddp->parameters(), {.lr = 1e-4});
    const int64_t per = weak ? batch : batch / N;
    const Tensor x = weak ? x_full : x_full.narrow(0, r * per, per), y = weak ? y_full : y_full.narrow(0, r * per, per);
    res.step_s = time_steps(
        dev, iters,
        [&] {
          loss_fn(ddp->forward(x), y).backward();
          ddp->finish_gradient_sync();
          opt.step();
          opt.zero_grad();
        },
        &res.peak_gib);
    results.push_back(res);
  }

  for (Result& res : results) {
    res.step_s = max_over_ranks(*world, res.step_s);  // the slowest rank sets the pace
    res.peak_gib = max_over_ranks(*world, res.peak_gib);
    res.samples_per_s = double(res.samples ? res.samples : batch) / res.step_s;
  }
  if (r == 0) {
    const double base = results[0].samples_per_s;
    std::printf("BERT-base encoder (12 x 768, 12 heads, 3072, seq %lld), f32, global batch %lld, %d GPU(s)\n",
                (long long)kSeq, (long long)batch, N);
    std::printf("%-14s %5s %10s %11s %11s %14s %12s\n", "mode", "GPUs", "step ms", "samples/s", "efficiency",
                "peak GiB/GPU", "bubble m/t");
    for (const Result& res : results) {
      const double eff = res.samples_per_s / (res.gpus * base);
      char bubble[32] = "-";
      if (res.bubble_theory >= 0)
        std::snprintf(bubble, sizeof bubble, "%.3f/%.3f", res.bubble_measured, res.bubble_theory);
      std::printf("%-14s %5d %10.1f %11.1f %10.1f%% %14.2f %12s\n", res.mode.c_str(), res.gpus, res.step_s * 1e3,
                  res.samples_per_s, 100 * eff, res.peak_gib, bubble);
    }
    for (const Result& res : results) {
      std::string key = res.mode.substr(0, res.mode.find(' '));
      if (key == "1") key = "single";
      if (res.mode == "DDP weak") key = "DDP_weak";
      std::printf("%s_samples_per_s: %.2f\n%s_efficiency: %.4f\n%s_peak_gib: %.3f\n", key.c_str(), res.samples_per_s,
                  key.c_str(), res.samples_per_s / (res.gpus * base), key.c_str(), res.peak_gib);
      if (res.bubble_theory >= 0)
        std::printf("PP_bubble_measured: %.4f\nPP_bubble_theoretical: %.4f\n", res.bubble_measured, res.bubble_theory);
    }
  }
  world->barrier();
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallel_bench: %s\n", e.what());
    return 1;
  }
}
