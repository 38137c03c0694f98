// memory_matrix: what each memory technique saves, and what it costs, on one training loop.
//
//   build/bench/memory_matrix [--device cpu|cuda] [--model mlp|cnn|lm|all] [--steps N]
//
// For each model, every technique trains a fresh copy (same seed, SGD) for 1 warm-up step
// and N measured ones; the table gives the peak allocated and reserved bytes over the
// measured steps (absolute: weights, data and gradients included), the median step time,
// and each against the fp32 row. Rows: fp32; AMP fp16 (with GradScaler); AMP bf16;
// checkpoint_sequential with round(sqrt(n)) segments; AMP fp16 + that checkpointing;
// gradient accumulation (the same batch as 4 micro-batches); the MemoryPlanner's greedy
// plan for a budget of 50% of the fp32 peak (its report is printed first); and AMP fp16 with
// the last Linear and the loss fused (linear_cross_entropy, Note [Fused linear cross
// entropy]; for models whose last module is a Linear); and the round(sqrt(n)) segments run
// under autograd::offload, their saved activations in pinned host memory (Note [Offloaded
// saved tensors]; on the CPU only in a process without a GPU, where it moves bytes from the
// CPU arena to the pinned pool); the same segments under autograd::recompute_cheap (norm and
// activation outputs regenerated in backward, Note [Recomputable outputs]) and, with AMP
// fp16, under autograd::compress (saved activations as FP8 codes, lossy).
// Models: a deep MLP (64 x Linear + ReLU), a small CNN, and a language-model-like stack
// (tokens through 2 x (Linear + GELU) into a vocabulary-sized head). The batch is large
// against the width so that activations, the target of every technique here, dominate.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/compress.h"
#include "autograd/offload.h"
#include "autograd/ops/all.h"
#include "autograd/recompute_cheap.h"
#include "bench/bench_util.h"
#include "core/error.h"
#include "core/stream.h"
#include "examples/flags.h"
#include "memory/allocator.h"
#include "nn/activation.h"
#include "nn/checkpoint.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/memory_planner.h"
#include "nn/pooling.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tensor/random.h"

using namespace frugal;
using bench::fmt;

namespace {

struct Options {
  Device device = kCPU;
  std::string model = "all";
  int steps = 4;
  int warmup = 1;
};

// (N, C, H, W) -> (N, C*H*W): the CNN's bridge to its classifier.
class Flatten : public nn::UnaryModule {
 public:
  Tensor forward(const Tensor& x) override { return x.flatten(1); }
  std::string type_name() const override { return "Flatten"; }
};

struct Workload {
  std::string name;
  std::function<std::shared_ptr<nn::Sequential>()> build;  // same weights on every call
  Shape input_shape;
  int64_t classes;
  std::string describe;
};

Workload mlp_workload(const Options& o) {
  const bool cuda = o.device.is_cuda();
  const int64_t depth = 64, width = cuda ? 1024 : 32, batch = cuda ? 8192 : 512;
  Device dev = o.device;
  return {"mlp",
          [=] {
            manual_seed(1);
            auto seq = std::make_shared<nn::Sequential>();
            for (int64_t i = 0; i < depth; ++i) {
              seq->push_back(std::make_shared<nn::Linear>(width, width));
              seq->push_back(std::make_shared<nn::ReLU>());
            }
            seq->to(dev);
            return seq;
          },
          {batch, width},
          width,
          fmt("deep MLP: %lld x (Linear(%lld, %lld) + ReLU), batch %lld", (long long)depth, (long long)width,
              (long long)width, (long long)batch)};
}

Workload cnn_workload(const Options& o) {
  const bool cuda = o.device.is_cuda();
  const int64_t c = cuda ? 64 : 8, batch = cuda ? 256 : 16, hw = 32;
  Device dev = o.device;
  return {"cnn",
          [=] {
            manual_seed(2);
            const nn::Conv2dModuleOptions pad1{.padding = 1};
            auto seq = std::make_shared<nn::Sequential>();
            seq->push_back(std::make_shared<nn::Conv2d>(3, c, 3, pad1));
            seq->push_back(std::make_shared<nn::ReLU>());
            seq->push_back(std::make_shared<nn::Conv2d>(c, c, 3, pad1));
            seq->push_back(std::make_shared<nn::ReLU>());
            seq->push_back(std::make_shared<nn::MaxPool2d>(2));
            seq->push_back(std::make_shared<nn::Conv2d>(c, 2 * c, 3, pad1));
            seq->push_back(std::make_shared<nn::ReLU>());
            seq->push_back(std::make_shared<nn::Conv2d>(2 * c, 2 * c, 3, pad1));
            seq->push_back(std::make_shared<nn::ReLU>());
            seq->push_back(std::make_shared<nn::MaxPool2d>(2));
            seq->push_back(std::make_shared<nn::Conv2d>(2 * c, 4 * c, 3, pad1));
            seq->push_back(std::make_shared<nn::ReLU>());
            seq->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
            seq->push_back(std::make_shared<Flatten>());
            seq->push_back(std::make_shared<nn::Linear>(4 * c, 10));
            seq->to(dev);
            return seq;
          },
          {batch, 3, hw, hw},
          10,
          fmt("small CNN: 5 conv3x3 (%lld..%lld channels) + ReLU, 2 max pools, avg pool, Linear; batch %lld, %lldx%lld",
              (long long)c, (long long)(4 * c), (long long)batch, (long long)hw, (long long)hw)};
}

Workload lm_workload(const Options& o) {
  const bool cuda = o.device.is_cuda();
  const int64_t width = cuda ? 768 : 64, vocab = cuda ? 32768 : 4096, tokens = cuda ? 8192 : 512;
  Device dev = o.device;
  return {"lm",
          [=] {
            manual_seed(3);
            auto seq = std::make_shared<nn::Sequential>();
            for (int i = 0; i < 2; ++i) {
              seq->push_back(std::make_shared<nn::Linear>(width, width));
              seq->push_back(std::make_shared<nn::GELU>());
            }
            seq->push_back(std::make_shared<nn::Linear>(width, vocab));
            seq->to(dev);
            return seq;
          },
          {tokens, width},
          vocab,
          fmt("LM-like: %lld tokens x 2 x (Linear(%lld, %lld) + GELU), then a Linear(%lld, %lld) head",
              (long long)tokens, (long long)width, (long long)width, (long long)width, (long long)vocab)};
}

enum class Amp { Off, Fp16, Bf16 };
/// What each of the sqrt(n) segments runs under: nothing, or one of the saved-tensor techniques.
enum class Wrap { None, Offload, Recompute, Compress };

struct Technique {
  std::string name;
  Amp amp = Amp::Off;
  bool checkpoint = false;
  int64_t micro_batches = 1;
  bool planner = false;
  bool fused_head = false;  // the last Linear and the loss as one linear_cross_entropy
  Wrap wrap = Wrap::None;   // segments as for checkpointing, each under autograd::offload / recompute_cheap / compress
};

struct Result {
  std::string note;  // non-empty: the row did not run (why)
  int64_t peak_allocated = 0, peak_reserved = 0;
  double step_seconds = 0;
};

struct Data {
  Tensor x, y;
};

// seq's modules in `segments` runs of consecutive modules, each run under `wrap`'s technique.
Tensor wrapped_sequential(const nn::Sequential& seq, int64_t segments, const Tensor& x, Wrap wrap) {
  const int64_t n = int64_t(seq.size()), per = (n + segments - 1) / segments;
  Tensor h = x;
  for (int64_t first = 0; first < n; first += per) {
    const int64_t last = std::min(n, first + per);
    const std::function<Tensor(const Tensor&)> run = [&seq, first, last](const Tensor& in) {
      Tensor out = in;
      for (int64_t i = first; i < last; ++i) out = (*seq[size_t(i)])(out);
      return out;
    };
    switch (wrap) {
      case Wrap::Offload: h = autograd::offload(run, h); break;
      case Wrap::Recompute: h = autograd::recompute_cheap(run, h); break;
      case Wrap::Compress: h = autograd::compress(run, h); break;
      case Wrap::None: h = run(h); break;
    }
  }
  return h;
}

Data make_data(const Workload& w, Device dev) {
  Generator gen(7);
  Tensor x = randn(w.input_shape, {kFloat32, dev}, &gen);
  Tensor y = randint(0, w.classes, {w.input_shape[0]}, {kInt64, dev}, &gen);
  return {x, y};
}

Result run_technique(const Workload& w, const Technique& t, const Options& o, int64_t fp32_peak,
                     bench::KeyFigures& figures) {
  Result r;
  const Device dev = o.device;
  synchronize(dev);
  memory::empty_cache(dev);
  auto model = w.build();
  const Data data = make_data(w, dev);
  optim::SGD opt(model->parameters(), {.lr = 1e-3});
  optim::GradScaler scaler({.enabled = t.amp == Amp::Fp16});
  const int64_t segments = std::llround(std::sqrt(double(model->size())));
  std::unique_ptr<nn::MemoryPlanner> planner;
  std::optional<nn::MemoryPlan> plan;

  std::shared_ptr<nn::Linear> head;
  auto body = std::make_shared<nn::Sequential>();
  if (t.fused_head) {
    head = std::dynamic_pointer_cast<nn::Linear>((*model)[model->size() - 1]);
    if (!head) return {"no Linear head"};
    for (size_t i = 0; i + 1 < model->size(); ++i) body->push_back((*model)[i]);
  }

  auto forward = [&](const Tensor& x) {
    if (plan) return planner->forward(*plan, x);
    if (t.wrap != Wrap::None) return wrapped_sequential(*model, segments, x, t.wrap);
    return t.checkpoint ? nn::checkpoint_sequential(*model, segments, x) : model->forward(x);
  };
  auto loss_of = [&](const Tensor& x, const Tensor& y) {
    AutocastGuard amp(dev, t.amp == Amp::Fp16 ? kFloat16 : kBFloat16, /*enabled=*/t.amp != Amp::Off);
    if (head) return linear_cross_entropy(body->forward(x), head->weight, head->bias, y);
    return cross_entropy(forward(x), y);
  };
  auto step = [&] {
    opt.zero_grad();
    const int64_t n = data.x.size(0), m = n / t.micro_batches;
    for (int64_t k = 0; k < t.micro_batches; ++k) {
      Tensor loss = loss_of(data.x.narrow(0, k * m, m), data.y.narrow(0, k * m, m));
      if (t.micro_batches > 1) loss = loss / double(t.micro_batches);
      scaler.scale(loss).backward();
    }
    scaler.step(opt);
    scaler.update();
  };

  for (int i = 0; i < o.warmup; ++i) step();
  if (t.planner) {
    opt.zero_grad();  // the resting state between steps
    auto loss_fn = [y = data.y](const Tensor& out) { return cross_entropy(out, y); };
    planner = std::make_unique<nn::MemoryPlanner>(*model, data.x, loss_fn);
    const int64_t budget = fp32_peak / 2;
    try {
      plan = planner->plan(budget);
    } catch (const Error& e) {
      std::printf("\n%s: planner at 50%% of the fp32 peak: %s\n", w.name.c_str(), e.what());
      return {"infeasible"};
    }
    const int64_t measured = planner->measure_step(*plan);
    synchronize(dev);
    memory::empty_cache(dev);  // profiling ran an unplanned step: its segments are not this row's
    std::printf("\n%s: planner at 50%% of the fp32 peak (%s)\n%s", w.name.c_str(), memory::format_bytes(budget).c_str(),
                planner->report(*plan, measured).c_str());
    const std::string prefix = w.name == "mlp" ? "" : w.name + "_";
    figures.add(prefix + "planner_predicted_over_measured", double(plan->predicted_peak) / double(measured));
    figures.add(prefix + "planner_segments", double(plan->segments.size()), "%.0f");
    figures.add(prefix + "planner_checkpointed", double(plan->checkpointed_count()), "%.0f");
  }

  synchronize(dev);
  memory::reset_peak(dev);
  memory::reset_pinned_peak();
  autograd::reset_offload_stats();
  std::vector<double> times;
  for (int i = 0; i < o.steps; ++i) {
    const double t0 = bench::now_seconds();
    step();
    synchronize(dev);
    times.push_back(bench::now_seconds() - t0);
  }
  const memory::MemoryStats s = memory::stats(dev);
  r.peak_allocated = s.allocated_bytes.peak;
  r.peak_reserved = s.reserved_bytes.peak;
  r.step_seconds = bench::median(times);
  if (t.wrap == Wrap::Offload) {
    const autograd::OffloadStats os = autograd::offload_stats();
    const int64_t pinned_peak = memory::pinned_stats().allocated_bytes.peak;
    std::printf(
        "\n%s: offload per step: %s to the host in %lld tensors (%s left on the device), %s back, %lld of "
        "%lld restores prefetched, compute stalled %.2f ms; pinned host peak %s\n",
        w.name.c_str(), memory::format_bytes(os.bytes_offloaded / o.steps).c_str(),
        (long long)(os.tensors_offloaded / o.steps), memory::format_bytes(os.bytes_kept_on_device / o.steps).c_str(),
        memory::format_bytes(os.bytes_restored / o.steps).c_str(), (long long)os.prefetched,
        (long long)(os.prefetched + os.on_demand), os.wait_ms / o.steps, memory::format_bytes(pinned_peak).c_str());
    const std::string prefix = w.name == "mlp" ? "" : w.name + "_";
    figures.add(prefix + "offload_stall_ms", os.wait_ms / o.steps, "%.2f");
    figures.add(prefix + "offload_pinned_peak_mib", double(pinned_peak) / double(1 << 20), "%.1f");
  }
  return r;
}

void run_workload(const Workload& w, const Options& o, bench::KeyFigures& figures) {
  std::printf("\n%s (%s, %d warm-up + %d measured steps)\n", w.describe.c_str(), o.device.str().c_str(), o.warmup,
              o.steps);
  const std::vector<Technique> techniques = {
      {"fp32"},
      {"AMP fp16", Amp::Fp16},
      {"AMP bf16", Amp::Bf16},
      {"fp32 + checkpointing (sqrt n)", Amp::Off, true},
      {"AMP fp16 + checkpointing", Amp::Fp16, true},
      {"grad accumulation x4", Amp::Off, false, 4},
      {"planner (50% of fp32 peak)", Amp::Off, false, 1, true},
      {"AMP fp16 + fused linear head and loss", Amp::Fp16, false, 1, false, true},
      {"fp32 + offload (sqrt n segments)", Amp::Off, false, 1, false, false, Wrap::Offload},
      {"fp32 + recompute cheap outputs", Amp::Off, false, 1, false, false, Wrap::Recompute},
      {"AMP fp16 + FP8 saved activations (lossy)", Amp::Fp16, false, 1, false, false, Wrap::Compress},
  };
  std::vector<Result> results;
  for (const Technique& t : techniques) {
    results.push_back(run_technique(w, t, o, results.empty() ? 0 : results[0].peak_allocated, figures));
    std::fflush(stdout);
  }
  const Result& base = results[0];
  bench::Table table(
      w.name + ": peak memory and step time per technique (ratios to fp32)",
      {"technique", "peak allocated", "peak reserved", "step ms", "alloc ratio", "reserved ratio", "time ratio"});
  for (size_t i = 0; i < techniques.size(); ++i) {
    const Result& r = results[i];
    if (!r.note.empty()) {
      table.add({techniques[i].name, r.note, "", "", "", "", ""});
      continue;
    }
    table.add({techniques[i].name, memory::format_bytes(r.peak_allocated), memory::format_bytes(r.peak_reserved),
               fmt("%.2f", r.step_seconds * 1e3), fmt("%.3f", double(r.peak_allocated) / double(base.peak_allocated)),
               fmt("%.3f", double(r.peak_reserved) / double(base.peak_reserved)),
               fmt("%.3f", r.step_seconds / base.step_seconds)});
  }
  table.print();

  const std::string prefix = w.name == "mlp" ? "" : w.name + "_";
  const char* keys[] = {nullptr,
                        "amp_peak_ratio",
                        "amp_bf16_peak_ratio",
                        "checkpoint_peak_ratio",
                        "amp_checkpoint_peak_ratio",
                        "accum_peak_ratio",
                        "planner_peak_ratio",
                        "fused_head_peak_ratio",
                        "offload_peak_ratio",
                        "recompute_peak_ratio",
                        "amp_compress_peak_ratio"};
  for (size_t i = 1; i < techniques.size(); ++i) {
    if (!results[i].note.empty()) continue;
    figures.add(prefix + keys[i], double(results[i].peak_allocated) / double(base.peak_allocated));
  }
  if (results[3].note.empty())
    figures.add(prefix + "checkpoint_time_ratio", results[3].step_seconds / base.step_seconds);
  if (results[1].note.empty()) figures.add(prefix + "amp_time_ratio", results[1].step_seconds / base.step_seconds);
  if (results[6].note.empty()) figures.add(prefix + "planner_time_ratio", results[6].step_seconds / base.step_seconds);
  if (results[8].note.empty()) figures.add(prefix + "offload_time_ratio", results[8].step_seconds / base.step_seconds);
  if (results[7].note.empty())  // against AMP fp16 alone: what fusing the head adds to AMP
    figures.add(prefix + "fused_head_over_amp_peak",
                double(results[7].peak_allocated) / double(results[1].peak_allocated));
}

const char* kUsage = "usage: memory_matrix [--device cpu|cuda] [--model mlp|cnn|lm|all] [--steps N]\n";

Options parse(int argc, char** argv) {
  Options o;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--device")) {
      const std::string d = flags.text();
      if (d != "cpu" && d != "cuda") throw cli::UsageError("--device: expected cpu or cuda, got \"" + d + "\"");
      if (d == "cuda") o.device = Device{DeviceType::CUDA, 0};
    } else if (flags.is("--model")) {
      o.model = flags.text();
      if (o.model != "mlp" && o.model != "cnn" && o.model != "lm" && o.model != "all")
        throw cli::UsageError("--model: expected mlp, cnn, lm or all, got \"" + o.model + "\"");
    } else if (flags.is("--steps")) {
      o.steps = int(flags.integer(1, 1 << 20));
    } else {
      flags.unknown();
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = cli::parse_or_exit("memory_matrix", kUsage, [&] { return parse(argc, argv); });
  if (o.device.is_cuda() && cuda_device_count() == 0) {
    std::printf("memory_matrix: --device cuda, but no CUDA device is available in this build or machine\n");
    return 1;
  }
  bench::KeyFigures figures;
  if (o.model == "mlp" || o.model == "all") run_workload(mlp_workload(o), o, figures);
  if (o.model == "cnn" || o.model == "all") run_workload(cnn_workload(o), o, figures);
  if (o.model == "lm" || o.model == "all") run_workload(lm_workload(o), o, figures);
  figures.print();
  return 0;
}
