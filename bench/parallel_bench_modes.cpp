// The modes of bench/parallel_bench; see parallel_bench_modes.h.
//
// Note [Same model in every mode]
// Layer i of the encoder is drawn from its own Generator(kInitSeed + i), and tensor-parallel
// layers draw the full weight before keeping their shard, so every mode - whatever stages
// and shards it cuts the encoder into - trains the same model on the same data (drawn from
// kDataSeed on every rank). Their losses at a step therefore agree up to rounding, which
// the cpu suite checks; speed alone differs.
#include "bench/parallel_bench_modes.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "autograd/ops/all.h"
#include "bench/bench_util.h"
#include "core/error.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "nn/container.h"
#include "optim/adam.h"
#include "optim/offload_adam.h"
#include "parallel/ddp.h"
#include "parallel/fsdp.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "tensor/factory.h"

namespace frugal::bench {

using namespace frugal::parallel;

namespace {

const char* const kAllModes[] = {"single", "tp", "pp", "ddp", "ddp-weak", "zero1", "zero2", "zero3", "offload", "grid"};

struct EncoderBlock : nn::UnaryModule {
  std::shared_ptr<TensorParallelEncoderLayer> layer;
  explicit EncoderBlock(std::shared_ptr<TensorParallelEncoderLayer> l)
      : layer(register_module("layer", std::move(l))) {}
  Tensor forward(const Tensor& x) override { return layer->forward(x); }
  std::string type_name() const override { return "EncoderBlock"; }
};

/// Layers [first, last) of the encoder, split across `tp` (null: plain layers), on `device`
/// (see Note [Same model in every mode]).
std::shared_ptr<nn::Sequential> make_encoder(const ModelConfig& m, const CommPtr& tp, Device device, int64_t first,
                                             int64_t last) {
  auto seq = std::make_shared<nn::Sequential>();
  for (int64_t i = first; i < last; ++i) {
    Generator gen(kInitSeed + uint64_t(i));
    seq->push_back(std::make_shared<EncoderBlock>(std::make_shared<TensorParallelEncoderLayer>(
        m.hidden, m.heads, m.ffn, tp, TensorParallelEncoderOptions{.generator = &gen})));
  }
  seq->to(device);
  return seq;
}

/// One training step; returns the global batch's loss when asked (a host sync, so only
/// the untimed warm-up steps ask), else 0.
using Step = std::function<double(bool want_loss)>;

/// The step of a model whose forward runs whole on this rank: mean-squared error on (x, y),
/// backward (under DDP it returns with the gradients averaged), `opt`'s step; `global`
/// turns this rank's loss into the global batch's.
template <typename Optimizer>
Step whole_model_step(nn::UnaryModule& model, const Tensor& x, const Tensor& y, Optimizer& opt,
                      std::function<double(const Tensor&)> global) {
  return [&model, x, y, &opt, global](bool want_loss) {
    Tensor loss = mse_loss(model.forward(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return want_loss ? global(loss) : 0.0;
  };
}

/// Seconds for one send_recv of `t` between pipeline neighbours (ranks 2j and 2j + 1;
/// an odd last rank idles), median of 20 after 3 warm-ups, device synchronized around each.
double time_exchange(Communicator& pp, const Tensor& t) {
  const int peer = pp.rank() ^ 1;
  const Tensor in = empty_like(t);
  std::vector<double> times;
  for (int i = 0; i < 23; ++i) {
    pp.barrier();
    synchronize(t.device());
    const auto t0 = std::chrono::steady_clock::now();
    if (peer < pp.size()) pp.send_recv(t, peer, in, peer).second->wait();
    synchronize(t.device());
    if (i >= 3) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(std::move(times));
}

/// Times `step` into res (median seconds, this rank's peak memory) after two warm-up steps,
/// whose losses are res.loss_first and res.loss_second.
void time_steps(Device device, int iters, const Step& step, ModeResult& res) {
  res.loss_first = step(true);
  res.loss_second = step(true);
  synchronize(device);
  memory::reset_peak(device);
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    step(false);
    synchronize(device);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  res.step_s = median(std::move(times));
  res.peak_gib = double(memory::stats(device).allocated_bytes.peak) / double(1 << 30);
}

/// MiB of `model`'s parameters: what tensor parallelism and pipeline stages divide.
double parameter_mib(nn::Module& model) {
  int64_t bytes = 0;
  for (const Tensor& p : model.parameters()) bytes += p.numel() * int64_t(element_size(p.dtype()));
  return double(bytes) / double(1 << 20);
}

/// Bytes of `opt`'s state (AdamW: exp_avg, exp_avg_sq) for `params`.
int64_t optimizer_state_bytes(const optim::Optimizer& opt, const std::vector<Tensor>& params) {
  int64_t bytes = 0;
  for (const Tensor& p : params)
    if (const optim::ParamState* s = opt.state(p))
      for (const Tensor& t : s->buffers)
        if (t.defined()) bytes += t.numel() * int64_t(element_size(t.dtype()));
  return bytes;
}

constexpr double kMiB = double(1 << 20);

/// x reduced over the ranks of `comm`.
double reduce_over(Communicator& comm, double x, ReduceOp op) {
  Tensor t = full({1}, x, {kFloat64, comm.device()});
  comm.all_reduce(t, op)->wait();
  return t.cpu().item<double>();
}

double broadcast_from_0(Communicator& comm, double x) {
  Tensor t = full({1}, x, {kFloat64, comm.device()});
  comm.broadcast(t, 0)->wait();
  return t.cpu().item<double>();
}

/// Throws when `mode` cannot run on `n` ranks with these options.
void check_fits(const std::string& mode, const BenchOptions& o, int n) {
  const ModelConfig& m = o.model;
  const char* why = "parallel_bench";
  if (mode == "tp")
    FRUGAL_CHECK(m.heads % n == 0 && m.ffn % n == 0, why, ": tp needs heads (", m.heads, ") and MLP (", m.ffn,
                 ") divisible by the ", n, " ranks");
  if (mode == "pp" || mode == "grid") {
    const int stages = mode == "pp" ? n : n / 2;
    if (mode == "grid")
      FRUGAL_CHECK(n >= 4 && n % 2 == 0 && m.heads % 2 == 0 && m.ffn % 2 == 0, why,
                   ": grid (2-way TP x world / 2 stages) needs an even world size >= 4 (got ", n,
                   ") and heads and MLP divisible by 2");
    FRUGAL_CHECK(m.layers >= stages, why, ": ", mode, " needs at least one layer per stage: ", m.layers, " layers, ",
                 stages, " stages");
    FRUGAL_CHECK(o.micro_batches >= 1 && o.batch % o.micro_batches == 0, why, ": ", mode, " needs the batch (", o.batch,
                 ") divisible by the micro-batches (", o.micro_batches, ")");
  }
  if (mode == "ddp" || mode == "zero1" || mode == "zero2" || mode == "zero3" || mode == "offload")
    FRUGAL_CHECK(o.batch % n == 0, why, ": ", mode, " splits the batch (", o.batch, ") over the ", n,
                 " ranks: it must divide evenly");
}

}  // namespace

ModelConfig model_config(const std::string& name) {
  if (name == "base") return {"BERT-base", 12, 768, 12, 3072, 128};
  if (name == "large") return {"BERT-large", 24, 1024, 16, 4096, 128};
  if (name == "tiny") return {"tiny", 4, 64, 4, 128, 16};
  FRUGAL_CHECK(false, "parallel_bench: --model must be base, large or tiny, got '", name, "'");
  return {};
}

std::vector<std::string> default_modes(const ModelConfig& model, int world_size) {
  if (world_size == 1) return {"single"};
  std::vector<std::string> modes = {"single"};
  if (model.heads % world_size == 0 && model.ffn % world_size == 0) modes.push_back("tp");
  if (model.layers >= world_size) modes.push_back("pp");
  for (const char* m : {"ddp", "ddp-weak", "zero1", "zero2", "zero3", "offload"}) modes.push_back(m);
  if (world_size >= 4 && world_size % 2 == 0 && model.heads % 2 == 0 && model.layers >= world_size / 2)
    modes.push_back("grid");
  return modes;
}

std::vector<std::string> parse_modes(const std::string& list) {
  std::vector<std::string> modes;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string name = list.substr(begin, end - begin);
    FRUGAL_CHECK(std::find(std::begin(kAllModes), std::end(kAllModes), name) != std::end(kAllModes),
                 "parallel_bench: unknown mode '", name, "' in --modes ", list,
                 " (single, tp, pp, ddp, ddp-weak, zero1, zero2, zero3, offload, grid)");
    modes.push_back(name);
    begin = end + 1;
  }
  return modes;
}

std::vector<ModeResult> run_modes(const std::shared_ptr<Communicator>& world, const BenchOptions& opts) {
  const ModelConfig& m = opts.model;
  const int N = world->size(), r = world->rank();
  const int M = opts.micro_batches;
  const Device dev = world->device();
  for (const std::string& mode : opts.modes) check_fits(mode, opts, N);

  Generator data_gen(kDataSeed);  // every rank draws the same batch
  const Tensor x_full = randn({opts.batch, m.seq, m.hidden}, {kFloat32, dev}, &data_gen);
  const Tensor y_full = randn({opts.batch, m.seq, m.hidden}, {kFloat32, dev}, &data_gen);
  auto loss_fn = [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); };
  std::vector<ModeResult> results;

  // An AdamW step of the whole encoder, split across `tp`, on the whole batch.
  auto time_whole_batch = [&](const CommPtr& tp, ModeResult& res) {
    auto model = make_encoder(m, tp, dev, 0, m.layers);
    res.param_mib = parameter_mib(*model);
    optim::AdamW opt(model->parameters(), {.lr = kLearningRate});
    time_steps(dev, opts.iters,
               whole_model_step(*model, x_full, y_full, opt, [](const Tensor& l) { return l.item<double>(); }), res);
  };
  // `pp`'s stages of the encoder (each split across `tp`), 1F1B over M micro-batches.
  auto time_pipeline = [&](const CommPtr& tp, const CommPtr& pp, ModeResult& res) {
    const StageBounds bounds = split_by_index(size_t(m.layers), pp->size());
    const auto [first, last] = bounds[size_t(pp->rank())];
    auto stage_model = make_encoder(m, tp, dev, int64_t(first), int64_t(last));
    res.param_mib = parameter_mib(*stage_model);
    // Throughput without the busy-time timers; then the measured bubble, the median of three
    // timed steps (Note [Pipeline busy time]: events on the stream, the same schedule).
    PipelineStage stage(stage_model, pp, {.schedule = Schedule::OneFOneB, .micro_batches = M, .measure_busy = false});
    PipelineStage timed_stage(stage_model, pp, {.schedule = Schedule::OneFOneB, .micro_batches = M});
    optim::AdamW opt(stage_model->parameters(), {.lr = kLearningRate});
    const Tensor stage_x = stage.is_first() ? x_full : Tensor(), stage_y = stage.is_last() ? y_full : Tensor();
    time_steps(
        dev, opts.iters,
        [&](bool) {
          const PipelineStats s = stage.train_step(stage_x, stage_y, loss_fn);
          opt.step();
          opt.zero_grad();
          return s.loss;  // every stage gets the last one's
        },
        res);
    std::vector<double> bubbles, stage_bubbles;
    PipelineStats measured;
    for (int i = 0; i < 3; ++i) {
      measured = timed_stage.train_step(stage_x, stage_y, loss_fn);
      opt.zero_grad();
      bubbles.push_back(measured.bubble_measured);
      stage_bubbles.push_back(measured.stage_bubble);
    }
    res.stages = pp->size();
    const Tensor act = zeros({opts.batch / M, m.seq, m.hidden}, {kFloat32, dev});
    res.exchange_ms = 1e3 * reduce_over(*world, time_exchange(*pp, act), ReduceOp::Max);
    res.exchange_mib = double(act.numel() * int64_t(element_size(act.dtype()))) / double(1 << 20);
    res.bubble_measured = reduce_over(*world, median(std::move(bubbles)), ReduceOp::Max);  // equal on all
    res.worst_stage_bubble = reduce_over(*world, median(std::move(stage_bubbles)), ReduceOp::Max);
    res.bubble_theory = measured.bubble_theoretical;
  };
  // Data parallel over the world: strong scaling splits the global batch over the ranks,
  // weak gives every rank a whole batch. zero_stage 1 shards AdamW's state instead of
  // wrapping the model in DDP (its step reduce-scatters the gradients); 2 also the
  // gradients (reduce-scattered in buckets during backward); 3 also the parameters (fully
  // sharded data parallel, each encoder layer a unit). res.state_mib: the parameters,
  // gradients (as backward leaves them) and AdamW moments this rank holds on its device.
  // offload: DDP with optim::OffloadAdamW (ZeRO-Offload's CPU AdamW, Note [CPU offload]), the
  // moments (and float32 masters of 16-bit weights) in pinned host memory: res.host_state_mib.
  auto time_data_parallel = [&](bool weak, int zero_stage, bool offload, ModeResult& res) {
    auto model = make_encoder(m, nullptr, dev, 0, m.layers);
    res.param_mib = parameter_mib(*model);
    const int64_t per = weak ? opts.batch : opts.batch / N;
    const Tensor x = weak ? x_full : x_full.narrow(0, r * per, per);
    const Tensor y = weak ? y_full : y_full.narrow(0, r * per, per);
    // The global loss: the mean of the ranks' (equal-sized) shard losses.
    auto global = [&](const Tensor& loss) { return reduce_over(*world, loss.item<double>(), ReduceOp::Avg); };
    const double param_bytes = res.param_mib * kMiB;
    if (zero_stage == 3) {
      auto fsdp = std::make_shared<FullyShardedDataParallel>(
          model, world, FullyShardOptions{.units = modules_of_type(*model, "EncoderBlock")});
      optim::AdamW opt(fsdp->parameters(), {.lr = kLearningRate});
      time_steps(dev, opts.iters, whole_model_step(*fsdp, x, y, opt, global), res);
      const FullyShardMemoryReport mem = fsdp->memory_report(&opt);
      res.param_mib = double(mem.shard_bytes) / kMiB;
      res.state_mib = double(2 * mem.shard_bytes + mem.optimizer_state_bytes) / kMiB;  // shards, their grads, moments
      res.gathered_mib = double(mem.gathered_bytes_peak) / kMiB;
    } else if (zero_stage > 0) {
      ZeroAdamW opt(model->parameters(), world, {.lr = kLearningRate}, {.stage = zero_stage});
      time_steps(dev, opts.iters, whole_model_step(*model, x, y, opt, global), res);
      const ZeroMemoryReport mem = opt.memory_report();
      const double grads = zero_stage == 1 ? param_bytes + double(opt.shard_numel() * 4) : double(opt.shard_numel() * 4);
      res.state_mib = (double(mem.parameter_bytes) + grads + double(mem.optimizer_state_bytes)) / kMiB;
    } else {
      auto ddp = std::make_shared<DistributedDataParallel>(model, world);
      if (offload) {
        optim::OffloadAdamW opt(ddp->parameters(), {.lr = kLearningRate});
        time_steps(dev, opts.iters, whole_model_step(*ddp, x, y, opt, global), res);
        res.state_mib = 2 * param_bytes / kMiB;  // the weights and their gradients
        res.host_state_mib = double(opt.host_state_bytes()) / kMiB;
      } else {
        optim::AdamW opt(ddp->parameters(), {.lr = kLearningRate});
        time_steps(dev, opts.iters, whole_model_step(*ddp, x, y, opt, global), res);
        res.state_mib = (2 * param_bytes + double(optimizer_state_bytes(opt, ddp->parameters()))) / kMiB;
      }
    }
  };

  const std::string mb = " m=" + std::to_string(M);
  for (const std::string& mode : opts.modes) {
    ModeResult res{.mode = mode, .label = "", .key = "", .ranks = N, .samples = opts.batch};
    if (mode == "single") {  // rank 0 alone
      res.label = dev.is_cpu() ? "1 rank" : "1 GPU";
      res.key = "single";
      res.ranks = 1;
      if (r == 0) time_whole_batch(nullptr, res);
      world->barrier();
    } else if (mode == "tp") {
      res.label = "TP" + std::to_string(N);
      res.key = "TP";
      time_whole_batch(world, res);
    } else if (mode == "pp") {
      res.label = "PP" + std::to_string(N) + " 1F1B" + mb;
      res.key = "PP";
      time_pipeline(nullptr, world, res);
    } else if (mode == "ddp" || mode == "ddp-weak") {
      const bool weak = mode == "ddp-weak";
      res.label = weak ? "DDP weak" : "DDP";
      res.key = weak ? "DDP_weak" : "DDP";
      if (weak) res.samples = opts.batch * N;
      time_data_parallel(weak, 0, false, res);
    } else if (mode == "zero1" || mode == "zero2" || mode == "zero3") {
      const int stage = mode[4] - '0';
      res.label = "ZeRO-" + std::to_string(stage);
      res.key = "ZeRO" + std::to_string(stage);
      time_data_parallel(false, stage, false, res);
    } else if (mode == "offload") {
      res.label = "DDP + offload";
      res.key = "offload";
      time_data_parallel(false, 0, true, res);
    } else if (mode == "grid") {
      const ParallelGroups g = make_groups(world, /*tp=*/2, /*pp=*/N / 2, /*dp=*/1);
      res.label = "TP2xPP" + std::to_string(N / 2) + mb;
      res.key = "grid";
      time_pipeline(g.tensor, g.pipeline, res);
    }
    results.push_back(res);
  }

  double single = -1;
  for (ModeResult& res : results) {
    res.step_s = reduce_over(*world, res.step_s, ReduceOp::Max);  // the slowest rank sets the pace
    res.peak_gib = reduce_over(*world, res.peak_gib, ReduceOp::Max);
    res.param_mib = reduce_over(*world, res.param_mib, ReduceOp::Max);
    res.state_mib = reduce_over(*world, res.state_mib, ReduceOp::Max);
    res.gathered_mib = reduce_over(*world, res.gathered_mib, ReduceOp::Max);
    res.host_state_mib = reduce_over(*world, res.host_state_mib, ReduceOp::Max);
    res.loss_first = broadcast_from_0(*world, res.loss_first);  // rank 0 holds every mode's global loss
    res.loss_second = broadcast_from_0(*world, res.loss_second);
    res.samples_per_s = double(res.samples) / res.step_s;
    if (res.mode == "single") single = res.samples_per_s;
  }
  if (single > 0)
    for (ModeResult& res : results) res.efficiency = res.samples_per_s / (res.ranks * single);
  return results;
}

void print_report(const std::vector<ModeResult>& results, const BenchOptions& opts, const Communicator& world) {
  const ModelConfig& m = opts.model;
  const std::string backend = world.backend();
  const std::string ranks = backend == "threads"      ? "thread rank(s) on the CPU (memory: the process's)"
                            : world.device().is_cpu() ? "process rank(s) on the CPU over " + backend
                                                      : "GPU(s)";
  std::printf("%s encoder (%lld x %lld, %lld heads, %lld, seq %lld), f32, global batch %lld, %d %s\n", m.name.c_str(),
              (long long)m.layers, (long long)m.hidden, (long long)m.heads, (long long)m.ffn, (long long)m.seq,
              (long long)opts.batch, world.size(), ranks.c_str());
  std::printf("%-16s %5s %10s %11s %11s %14s %15s %15s %12s\n", "mode", "ranks", "step ms", "samples/s",
              "efficiency", "peak GiB/rank", "param MiB/rank", "state MiB/rank", "bubble m/t");
  for (const ModeResult& res : results) {
    char eff[32] = "-", bubble[32] = "-", state[32] = "-";
    if (res.efficiency >= 0) std::snprintf(eff, sizeof eff, "%.1f%%", 100 * res.efficiency);
    if (res.bubble_theory >= 0)
      std::snprintf(bubble, sizeof bubble, "%.3f/%.3f", res.bubble_measured, res.bubble_theory);
    if (res.state_mib >= 0) std::snprintf(state, sizeof state, "%.2f", res.state_mib);
    std::printf("%-16s %5d %10.1f %11.1f %11s %14.2f %15.2f %15s %12s\n", res.label.c_str(), res.ranks,
                res.step_s * 1e3, res.samples_per_s, eff, res.peak_gib, res.param_mib, state, bubble);
  }
  for (const ModeResult& res : results)
    if (res.exchange_ms >= 0)
      std::printf(
          "%s: bubble of the worst stage %.3f; one micro-batch's activation (%.2f MiB) exchanged both "
          "ways between stages in %.3f ms\n",
          res.label.c_str(), res.worst_stage_bubble, res.exchange_mib, res.exchange_ms);
  for (const ModeResult& res : results) {
    const char* k = res.key.c_str();
    std::printf("%s_samples_per_s: %.2f\n", k, res.samples_per_s);
    if (res.efficiency >= 0) std::printf("%s_efficiency: %.4f\n", k, res.efficiency);
    std::printf("%s_peak_gib: %.3f\n%s_param_mib: %.2f\n%s_loss_after_step: %.6f\n", k, res.peak_gib, k, res.param_mib,
                k, res.loss_second);
    if (res.state_mib >= 0) std::printf("%s_state_mib: %.3f\n", k, res.state_mib);
    if (res.gathered_mib >= 0) std::printf("%s_gathered_peak_mib: %.3f\n", k, res.gathered_mib);
    if (res.host_state_mib >= 0) std::printf("%s_host_state_mib: %.3f\n", k, res.host_state_mib);
    if (res.bubble_theory >= 0)
      std::printf("%s_bubble_measured: %.4f\n%s_bubble_theoretical: %.4f\n", k, res.bubble_measured, k,
                  res.bubble_theory);
    if (res.exchange_ms >= 0)
      std::printf("%s_worst_stage_bubble: %.4f\n%s_exchange_ms: %.4f\n", k, res.worst_stage_bubble, k, res.exchange_ms);
  }
}

}  // namespace frugal::bench
