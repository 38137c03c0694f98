// One full training step of ResNet-50, BERT-base (masked LM) or ViT-B/16 on a fixed
// synthetic batch: forward (under float16 autocast with --amp, bfloat16 with --amp-dtype
// bfloat16), loss, backward through GradScaler (float16 only), optimizer step, zero_grad. Prints the median step time,
// throughput, peak memory and MFU; tools/train_step_torch.py runs the same rows in PyTorch and compares.
//
//   train_step --model resnet50|bert_base|bert_large|bert_mlm|vit_b16 --batch N [--amp [--amp-dtype float16|bfloat16]]
//              [--checkpoint [full|selective]]
//              [--steps S] [--warmup W] [--optim sgd|adamw|galore|offload_adamw[_release]] [--galore-rank R]
//              [--device cuda|cpu]
//              [--channels-last auto|on|off] [--fused-bn-relu auto|on|off]
//              [--image-size P] [--seq-len T] [--cudnn-benchmark on|off] [--profile DIR]
//              [--profile-rows N] [--memory-budget SIZE] [--memory-plan CHOICES] [--plan-choices CHOICES]
//              [--cuda-graph [--cuda-graph-eager-scaler]]
//
// --cuda-graph captures the step once, after the warm-up, in a CudaGraph and replays it
// (Note [CUDA graphs] in tensor/cuda_graph.h), SGD or a capturable AdamW (Note [Capturable Adam]); with --amp the graph
// holds the whole step too, GradScaler's unscale, skip and update included (Note [GradScaler in a CUDA graph]);
// --cuda-graph-eager-scaler keeps GradScaler's step and update out of it, run after each replay instead (the way before
// the captured update).
// --channels-last auto: on for ResNet with --amp on CUDA (NHWC is what cuDNN's float16
// kernels want). --fused-bn-relu auto: on whenever ResNet runs channels-last (cuDNN's
// fused BN+ReLU and BN+add+ReLU). --fused-conv-bn on folds each block's inner batch norms into
// the convolutions (cuDNN's conv + statistics and scale-bias-ReLU + conv graphs: Note
// [Convolution batch-norm fusion]); auto: off. --image-size / --seq-len shrink the inputs for CPU smoke
// runs (ResNet and ViT at 224, BERT at 128 tokens by default). --model bert_mlm is the small BERT
// examples/bert_mlm trains by default (4 layers, hidden 256, 4 heads, intermediate 1024, vocab 8000,
// 128 positions): tools/cpu_bert_vs_torch.py times it on the CPU against PyTorch. --cudnn-benchmark on (the
// default) picks convolution algorithms by timing them during warm-up, as the PyTorch rows
// run with torch.backends.cudnn.benchmark = True. --checkpoint (or --checkpoint full)
// recomputes each block in backward; --checkpoint selective keeps the blocks' GEMM,
// convolution and attention outputs and recomputes only the cheap ops (Note [Selective
// checkpoint]). --profile DIR runs one more step under the
// memory profiler after the timed ones and prints its per-op time table (host and device ms:
// where a step's time goes) and what is live at the peak (its N largest groups,
// --profile-rows, 12 by default); DIR gets trace.json and
// timeline.svg. --memory-budget SIZE (3GiB, 512MiB, or 0.5x: that fraction of the default
// plan's peak) profiles each block choice (Note [Block planner]), picks the fastest per-block
// plan predicted to fit, prints it and then times it; --plan-choices names what it may choose
// from (default: the lossless keep, recompute, selective, checkpoint, offload,
// checkpoint-offload and checkpoint-recompute; add compress to allow FP8 activations). --memory-plan CHOICES runs a
// given plan: one choice for every block, or one per block separated by commas. --tf32 lets float32 convolutions and
// matmuls use TF32 tensor cores (PyTorch's default for cuDNN convolutions; off by default here). "fwd+bwd host ms" is
// how long the host took to queue forward and backward (GradScaler's inf check, the step's one synchronization with
// an optimizer that reads it on the host, comes after; SGD and a capturable AdamW make none: Note [GradScaler host
// state]): near "step ms" means the host sets the pace. --optim galore steps with GaLoreAdamW (Note [GaLore]) at
// rank --galore-rank (128 by default); every run prints optimizer_state_bytes, the bytes of its moments and
// projections. --optim offload_adamw steps with OffloadAdamW (Note [CPU offload]): its master weights and moments
// live in pinned host memory, printed as optimizer_host_bytes, next to optimizer_device_bytes (0);
// offload_adamw_release also moves each gradient to the host during backward (release_device_grads).
#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/ops/all.h"
#include "bench/bench_util.h"
#include "core/instrument.h"
#include "core/stream.h"
#include "examples/flags.h"
#include "memory/allocator.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/block_planner.h"
#include "nn/channels_last.h"
#include "optim/adam.h"
#include "optim/galore.h"
#include "optim/grad_scaler.h"
#include "optim/offload_adam.h"
#include "optim/sgd.h"
#include "profiler/session.h"
#include "tensor/cuda_graph.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/matmul.h"
#include "train/checks.h"

using namespace frugal;

namespace {

// The float16 dense GEMM throughput measured on the H200 (cuBLAS, large square matmuls):
// the denominator of MFU. The datasheet's 989 TFLOPS (dense) is not reached in practice;
// MFU against the measured peak says how close a step comes to what the GEMMs can do.
constexpr double kPeakFlops = 755e12;

// ResNet-50's forward at 224x224: 4.1 G multiply-adds per image (torchvision's "4.09
// GFLOPS" counts multiply-adds), 2 FLOPs each. A training step is ~3x the forward
// (backward computes gradients for both inputs and weights).
constexpr double kResNet50ForwardFlops224 = 2 * 4.1e9;

struct Args {
  std::string model,
      optim = "sgd", device = "cuda", channels_last = "auto", fused_bn_relu = "auto", fused_conv_bn = "auto",
      cudnn_benchmark = "on", profile_dir, memory_budget, memory_plan,
      plan_choices = "keep,recompute,selective,checkpoint,offload,checkpoint-offload,checkpoint-recompute";
  int64_t batch = 0, steps = 10, warmup = 3, image_size = 224, seq_len = 128, profile_rows = 12, galore_rank = 128;
  DType amp_dtype = kFloat16;  // --amp-dtype: bfloat16 runs without loss scaling, as torch.autocast's
  bool amp = false, checkpoint = false, tf32 = false, cuda_graph = false, cuda_graph_eager_scaler = false;
  bool padding = false;  // BERT: odd batches' last quarter of tokens padded (attention_mask 0)
  autograd::CheckpointPolicy checkpoint_policy = autograd::CheckpointPolicy::Full;  // with --checkpoint
};

const char* kUsage =
    "usage: train_step --model resnet50|bert_base|bert_large|bert_mlm|vit_b16 --batch N [--amp [--amp-dtype "
    "float16|bfloat16]]\n"
    "                  [--checkpoint [full|selective]] [--tf32] [--steps S] [--warmup W]\n"
    "                  [--optim sgd|adamw|galore|offload_adamw[_release]] [--galore-rank R] [--device cuda|cpu]\n"
    "                  [--channels-last auto|on|off] [--fused-bn-relu auto|on|off] [--fused-conv-bn auto|on|off]\n"
    "                  [--cudnn-benchmark on|off] [--profile DIR] [--profile-rows N]\n"
    "                  [--image-size P] [--seq-len T] [--padding] [--memory-budget SIZE|FRACTIONx]\n"
    "                  [--memory-plan CHOICE[,CHOICE...]] [--plan-choices CHOICE,CHOICE...]\n"
    "                  [--cuda-graph [--cuda-graph-eager-scaler]]\n";

Args parse(int argc, char** argv) {
  Args a;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--model")) a.model = flags.choice({"resnet50", "bert_base", "bert_large", "bert_mlm", "vit_b16"});
    else if (flags.is("--batch")) a.batch = flags.positive();
    else if (flags.is("--amp")) a.amp = true;
    else if (flags.is("--amp-dtype"))
      a.amp_dtype = flags.choice({"float16", "bfloat16"}) == "bfloat16" ? kBFloat16 : kFloat16;
    else if (flags.is("--checkpoint")) {
      a.checkpoint = true;
      if (const std::optional<std::string> policy = flags.optional_text()) {
        const auto parsed = autograd::parse_checkpoint_policy(*policy);
        a.checkpoint_policy = cli::expect(parsed, "--checkpoint", *policy, "full or selective");
      }
    } else if (flags.is("--tf32")) a.tf32 = true;
    else if (flags.is("--cuda-graph")) a.cuda_graph = true;
    else if (flags.is("--cuda-graph-eager-scaler")) a.cuda_graph_eager_scaler = true;
    else if (flags.is("--steps")) a.steps = flags.positive();
    else if (flags.is("--warmup")) a.warmup = flags.non_negative();
    else if (flags.is("--optim"))
      a.optim = flags.choice({"sgd", "adamw", "galore", "offload_adamw", "offload_adamw_release"});
    else if (flags.is("--galore-rank")) a.galore_rank = flags.positive();
    else if (flags.is("--device")) a.device = flags.device();
    else if (flags.is("--channels-last")) a.channels_last = flags.choice({"auto", "on", "off"});
    else if (flags.is("--fused-bn-relu")) a.fused_bn_relu = flags.choice({"auto", "on", "off"});
    else if (flags.is("--fused-conv-bn")) a.fused_conv_bn = flags.choice({"auto", "on", "off"});
    else if (flags.is("--cudnn-benchmark")) a.cudnn_benchmark = flags.choice({"on", "off"});
    else if (flags.is("--profile")) a.profile_dir = flags.text();
    else if (flags.is("--profile-rows")) a.profile_rows = flags.positive();
    else if (flags.is("--image-size")) a.image_size = flags.positive();
    else if (flags.is("--seq-len")) a.seq_len = flags.positive();
    else if (flags.is("--padding")) a.padding = true;
    else if (flags.is("--memory-budget")) a.memory_budget = flags.text();
    else if (flags.is("--memory-plan")) a.memory_plan = flags.text();
    else if (flags.is("--plan-choices")) a.plan_choices = flags.text();
    else flags.unknown();
  }
  if (a.model.empty()) throw cli::UsageError("--model is required");
  if (a.batch <= 0) throw cli::UsageError("--batch is required");
  return a;
}

/// A model and the loss of its fixed synthetic batch.
struct Workload {
  std::shared_ptr<nn::Module> module;
  int64_t num_blocks = 0;                                    // residual blocks or encoder layers
  std::function<void(const nn::BlockMemoryPlan&)> set_plan;  // what each block keeps (Note [Block memory plan])
  std::function<Tensor()> loss;
  double flops_per_step = 0;  // analytic model FLOPs of forward + backward
  std::string layout = "NCHW";
};

/// examples/bert_mlm's default model, at its largest vocabulary.
models::BertConfig bert_mlm_config() {
  return {.vocab_size = 8000,
          .hidden_size = 256,
          .num_hidden_layers = 4,
          .num_attention_heads = 4,
          .intermediate_size = 1024,
          .max_position_embeddings = 128};
}

/// Transformer training FLOPs: 6 x params x tokens (the matmuls of forward and backward)
/// plus attention's score and context matmuls, 4 T^2 d per layer and sequence forward, x3.
double transformer_flops(int64_t params, int64_t sequences, int64_t tokens, int64_t layers, int64_t hidden) {
  const double t = double(tokens), n = double(sequences);
  return 6.0 * double(params) * n * t + 3.0 * 4.0 * double(layers) * t * t * double(hidden) * n;
}

/// Labels (B, T) for masked LM: round(15%) of each sequence's positions (at least one) hold
/// a random token, the others -100 (ignored), as a data collator with mlm_probability 0.15.
Tensor mlm_labels(int64_t batch, int64_t tokens, int64_t vocab, Device device) {
  std::mt19937_64 rng(1234);
  std::vector<int64_t> labels(size_t(batch * tokens), -100);
  std::vector<int64_t> positions(static_cast<size_t>(tokens));
  const int64_t labelled = std::max<int64_t>(1, (tokens * 15 + 50) / 100);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < tokens; ++t) positions[size_t(t)] = t;
    std::shuffle(positions.begin(), positions.end(), rng);
    for (int64_t k = 0; k < labelled; ++k)
      labels[size_t(b * tokens + positions[size_t(k)])] = int64_t(rng() % uint64_t(vocab));
  }
  return from_vector<int64_t>(labels, {batch, tokens}).to(device);
}

/// A BERT attention_mask (B, T) of 1 (attend) and 0 (padding): every odd sequence loses its
/// last quarter of tokens, as tools/train_step_torch.py --padding and bench_attention's padding row.
Tensor padding_mask(int64_t batch, int64_t tokens, Device device) {
  std::vector<int64_t> keep(size_t(batch * tokens), 1);
  for (int64_t b = 1; b < batch; b += 2)
    for (int64_t t = tokens * 3 / 4; t < tokens; ++t) keep[size_t(b * tokens + t)] = 0;
  return from_vector<int64_t>(keep, {batch, tokens}).to(device);
}

Workload make_workload(const Args& a, Device device) {
  Workload w;
  const int64_t B = a.batch;
  if (a.model == "resnet50") {
    const bool channels_last = a.channels_last == "on" || (a.channels_last == "auto" && a.amp && device.is_cuda());
    const bool fused = a.fused_bn_relu == "on" || (a.fused_bn_relu == "auto" && channels_last);
    const bool conv_bn = a.fused_conv_bn == "on";
    auto net = models::resnet50({.checkpoint_blocks = a.checkpoint,
                                 .checkpoint_policy = a.checkpoint_policy,
                                 .fused_bn_relu = fused,
                                 .fused_conv_bn = conv_bn});
    net->to(device);
    Tensor x = randn({B, 3, a.image_size, a.image_size}, device);
    if (channels_last) {
      nn::to_channels_last(*net);
      x = to_channels_last(x);
      w.layout = "NHWC";
    }
    if (fused) w.layout += "+fused_bn_relu";
    if (conv_bn) w.layout += "+fused_conv_bn";
    const Tensor y = randint(0, 1000, {B}, TensorOptions(kInt64, device));
    w.module = net;
    w.num_blocks = net->num_blocks();
    w.set_plan = [net](const nn::BlockMemoryPlan& p) { net->memory_plan = p; };
    w.loss = [net, x, y] { return cross_entropy(net->forward(x), y); };
    const double scale = double(a.image_size * a.image_size) / (224.0 * 224.0);
    w.flops_per_step = 3.0 * kResNet50ForwardFlops224 * scale * double(B);
  } else if (a.model == "vit_b16") {
    models::ViTConfig c = models::vit_b_16();
    c.image_size = a.image_size;
    c.checkpoint_blocks = a.checkpoint;
    c.checkpoint_policy = a.checkpoint_policy;
    auto net = std::make_shared<models::VisionTransformer>(c);
    net->to(device);
    const Tensor x = randn({B, 3, a.image_size, a.image_size}, device);
    const Tensor y = randint(0, 1000, {B}, TensorOptions(kInt64, device));
    w.module = net;
    w.num_blocks = net->num_blocks();
    w.set_plan = [net](const nn::BlockMemoryPlan& p) { net->memory_plan = p; };
    w.loss = [net, x, y] { return cross_entropy(net->forward(x), y); };
    const int64_t patches = (a.image_size / c.patch_size) * (a.image_size / c.patch_size);
    w.flops_per_step = transformer_flops(net->num_parameters(), B, patches + 1, c.num_layers, c.hidden_dim);
  } else if (a.model == "bert_base" || a.model == "bert_large" || a.model == "bert_mlm") {
    models::BertConfig c = a.model == "bert_base"    ? models::bert_base()
                           : a.model == "bert_large" ? models::bert_large()
                                                     : bert_mlm_config();
    c.checkpoint_blocks = a.checkpoint;
    c.checkpoint_policy = a.checkpoint_policy;
    FRUGAL_CHECK(a.seq_len <= c.max_position_embeddings, "--seq-len must be <= ", c.max_position_embeddings, ", got ",
                 a.seq_len);
    auto net = std::make_shared<models::BertForMaskedLM>(c);
    net->to(device);
    const Tensor ids = randint(0, c.vocab_size, {B, a.seq_len}, TensorOptions(kInt64, device));
    const Tensor labels = mlm_labels(B, a.seq_len, c.vocab_size, device);
    const Tensor mask = a.padding ? padding_mask(B, a.seq_len, device) : Tensor();
    w.module = net;
    w.num_blocks = net->bert->num_blocks();
    w.set_plan = [net](const nn::BlockMemoryPlan& p) { net->bert->memory_plan = p; };
    w.loss = [net, ids, mask, labels] { return net->forward(ids, mask, Tensor(), labels).loss; };
    w.flops_per_step = transformer_flops(net->num_parameters(), B, a.seq_len, c.num_hidden_layers, c.hidden_size);
  } else {
    FRUGAL_FAIL("unknown --model '", a.model, "'");  // parse() takes only the models above
  }
  w.module->train();
  return w;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Args& a, nn::Module& m) {
  if (a.optim == "adamw")  // capturable under --cuda-graph (Note [Capturable Adam])
    return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions{.lr = 1e-4, .capturable = a.cuda_graph});
  if (a.optim == "offload_adamw")  // AdamW with its state in pinned host memory (Note [CPU offload])
    return std::make_unique<optim::OffloadAdamW>(m.parameters(), optim::OffloadAdamWOptions{.lr = 1e-4});
  if (a.optim == "offload_adamw_release")  // and the gradients moved to the host during backward
    return std::make_unique<optim::OffloadAdamW>(m.parameters(),
                                                 optim::OffloadAdamWOptions{.lr = 1e-4, .release_device_grads = true});
  if (a.optim == "galore")  // the paper's T = 200 and alpha = 0.25; AdamW's default decay
    return std::make_unique<optim::GaLoreAdamW>(
        m.parameters(), optim::GaLoreOptions{.lr = 1e-4, .weight_decay = 1e-2, .rank = a.galore_rank});
  return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
}

/// CUDA events at a step's phase boundaries (0 start, 1 forward done, 2 backward queued,
/// 3 optimizer done): the device's milliseconds per phase, gaps included: a phase whose
/// device time far exceeds its kernels' time waited for the host.
class PhaseEvents {
 public:
  ~PhaseEvents() {
    for (void* e : events_)
      if (e != nullptr) core::release_timing_event(e);
  }
  void mark(Device device, int i) {
    if (!device.is_cuda()) return;
    if (events_[size_t(i)] != nullptr) core::release_timing_event(events_[size_t(i)]);
    events_[size_t(i)] = core::record_timing_event(device);
  }
  double elapsed_ms(int from, int to) const {
    return core::timing_event_elapsed_ms(events_[size_t(from)], events_[size_t(to)]);
  }

 private:
  std::array<void*, 4> events_{};
};

double gib(int64_t bytes) { return double(bytes) / double(1ull << 30); }

/// "keep,selective" -> the choices; each name as nn::to_string(BlockMemory) spells it.
std::vector<nn::BlockMemory> parse_choices(const std::string& text, const char* flag) {
  std::vector<nn::BlockMemory> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string name = text.substr(start, comma - start);
    const std::optional<nn::BlockMemory> c = nn::parse_block_memory(name);
    FRUGAL_CHECK(c, flag, " takes keep, recompute, selective, checkpoint, compress, offload, ",
                 "checkpoint-offload or checkpoint-recompute (comma-separated), got '", name, "' in '", text, "'");
    out.push_back(*c);
    start = comma + 1;
  }
  return out;
}

/// The plan --memory-plan names: one choice for every block, or one per block.
nn::BlockMemoryPlan plan_from_flag(const std::string& text, int64_t num_blocks) {
  std::vector<nn::BlockMemory> c = parse_choices(text, "--memory-plan");
  if (c.size() == 1) return nn::BlockMemoryPlan::uniform(c[0]);
  FRUGAL_CHECK(int64_t(c.size()) == num_blocks, "--memory-plan names ", c.size(), " choices, but the model has ",
               num_blocks, " blocks (give one, or one per block)");
  return {std::move(c), nn::BlockMemory::Keep};
}

std::string plan_text(const nn::BlockMemoryPlan& plan, int64_t num_blocks) {
  std::string s;
  for (int64_t i = 0; i < num_blocks; ++i) s += std::string(i ? "," : "") + nn::to_string(plan.at(size_t(i)));
  return s;
}

// One step under the profiler: the per-op time table and the peak's contents, printed, and
// the Chrome trace and SVG timeline written into a.profile_dir.
void profile_one_step(const Args& a, Device device, nn::Module& model, optim::Optimizer& opt,
                      const std::function<void()>& step) {
  profiler::Session session({.device = device});
  session.attach(model);
  session.attach(opt);
  session.start();
  step();
  session.stop();
  session.write_files(a.profile_dir);
  std::printf("%s\n%s\nwrote %s/trace.json and %s/timeline.svg\n\n", session.op_time_table(25).c_str(),
              session.top_allocations_table(size_t(a.profile_rows)).c_str(), a.profile_dir.c_str(),
              a.profile_dir.c_str());
}

int run(const Args& a) {
  const Device device(a.device);
  if (!a.profile_dir.empty()) train::require_writable_dir(a.profile_dir, "--profile");  // now, not after the steps
  ops::set_cudnn_benchmark(a.cudnn_benchmark == "on");
  ops::set_allow_tf32(a.tf32);
  manual_seed(0);
  Workload w = make_workload(a, device);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(a, *w.module);
  optim::GradScaler scaler({.enabled = a.amp && a.amp_dtype == kFloat16});

  double backward_queued = 0;  // host clock when backward() returned: before GradScaler's sync, if any
  PhaseEvents phases;          // CUDA only: the device's time in forward, backward and optimizer
  const bool mark = device.is_cuda() && !a.cuda_graph;  // (a captured step's events would be the graph's)
  auto forward_backward = [&] {
    if (mark) phases.mark(device, 0);
    opt->zero_grad(/*set_to_none=*/true);
    Tensor loss;
    {
      AutocastGuard autocast(device, a.amp_dtype, a.amp);
      loss = w.loss();
    }
    if (mark) phases.mark(device, 1);
    scaler.scale(loss).backward();
    backward_queued = bench::now_seconds();
    if (mark) phases.mark(device, 2);
  };
  auto optimizer_step = [&] {
    scaler.step(*opt);
    scaler.update();
    if (mark) phases.mark(device, 3);
  };
  auto step = [&] {
    forward_backward();
    optimizer_step();
  };

  // A step GradScaler skipped (its scale fell) made no optimizer state, and SGD's first step
  // with momentum cannot be captured: with --cuda-graph the warm-up goes on until one went through.
  bool stepped = !a.cuda_graph || !a.amp;
  for (int64_t i = 0; i < a.warmup || (!stepped && i < a.warmup + 32); ++i) {
    const double scale = scaler.get_scale();
    step();
    stepped = stepped || scaler.get_scale() >= scale;
  }
  synchronize(device);

  // The memory plan: given, or chosen for a budget (Note [Block planner]).
  std::optional<nn::BlockPlanner> planner;
  std::optional<nn::BlockMemoryPlan> plan;
  int64_t budget = 0;
  if (!a.memory_plan.empty()) plan = plan_from_flag(a.memory_plan, w.num_blocks);
  if (!a.memory_budget.empty()) {
    FRUGAL_CHECK(!plan, "give --memory-budget or --memory-plan, not both");
    planner.emplace(
        device, w.num_blocks,
        [&](const nn::BlockMemoryPlan& p) {
          w.set_plan(p);
          step();
        },
        parse_choices(a.plan_choices, "--plan-choices"));
    const double t0 = bench::now_seconds();
    planner->profile(*w.module);  // its batch-norm statistics and random streams put back as found
    budget = nn::parse_memory_budget(a.memory_budget, planner->default_peak());
    plan = planner->plan(budget);
    std::printf("memory planner: profiled %zu choices in %.1f s; budget %.3f GiB\n", planner->profiles().size(),
                bench::now_seconds() - t0, gib(budget));
  }
  if (plan) {
    w.set_plan(*plan);
    step();  // the plan's own first step (its recompute's algorithm searches) stays out of the figures
    synchronize(device);
  }
  // --cuda-graph: the step captured once (after the warm-up above) and replayed, GradScaler's
  // step included unless --cuda-graph-eager-scaler (Note [GradScaler in a CUDA graph]).
  // Its peak counts from before the capture: a replay allocates nothing (its blocks were
  // taken from the graph's pool while capturing), so a peak reset after the capture would
  // show only what lives between steps.
  const bool graph_holds_step = !a.cuda_graph_eager_scaler;
  std::optional<CudaGraph> graph;
  memory::reset_peak(device);
  if (a.cuda_graph) {
    FRUGAL_CHECK(device.is_cuda() && (a.optim == "sgd" || a.optim == "adamw") && !planner && a.profile_dir.empty(),
                 "--cuda-graph needs --device cuda and --optim sgd or adamw, without --memory-budget or "
                 "--profile");
    graph.emplace(device);
    graph->capture(graph_holds_step ? std::function<void()>(step) : std::function<void()>(forward_backward),
                   {.warmup = 0});
    synchronize(device);
  }
  const memory::MemoryStats before = memory::stats(device);
  std::vector<double> times, host_times;
  std::array<std::vector<double>, 3> phase_ms;  // forward, backward, optimizer on the device
  for (int64_t i = 0; i < a.steps; ++i) {
    const double t0 = bench::now_seconds();
    if (graph) {
      graph->replay();
      backward_queued = bench::now_seconds();  // the host's share: one launch
      if (!graph_holds_step) optimizer_step();
    } else {
      step();
    }
    synchronize(device);                         // each step timed to completion on the device
    host_times.push_back(backward_queued - t0);  // near the step time: the host is the bottleneck
    times.push_back(bench::now_seconds() - t0);
    for (int p = 0; p < 3 && mark; ++p) phase_ms[size_t(p)].push_back(phases.elapsed_ms(p, p + 1));
  }
  const memory::MemoryStats st = memory::stats(device);
  if (!a.profile_dir.empty()) profile_one_step(a, device, *w.module, *opt, step);
  if (planner) std::printf("%s\n", planner->report(*plan, st.allocated_bytes.peak, bench::median(times) * 1e3).c_str());

  const double step_s = bench::median(times), host_s = bench::median(host_times);
  if (mark)
    std::printf("device ms per phase (median): forward %.2f, backward %.2f, optimizer %.2f\n",
                bench::median(phase_ms[0]), bench::median(phase_ms[1]), bench::median(phase_ms[2]));
  const double samples_per_s = double(a.batch) / step_s;
  const double mfu = w.flops_per_step / step_s / kPeakFlops;
  const int64_t params = w.module->num_parameters();
  const char* amp = !a.amp ? "fp32" : a.amp_dtype == kBFloat16 ? "bf16 amp" : "fp16 amp";

  bench::Table table(bench::fmt("train_step on %s (%s, %s, median of %lld steps after %lld warm-up)", a.device.c_str(),
                                a.optim.c_str(), w.layout.c_str(), (long long)a.steps, (long long)a.warmup),
                     {"model", "batch", "precision", "ckpt", "step ms", "fwd+bwd host ms", "samples/s",
                      "peak alloc GiB", "peak reserved GiB", "params", "MFU"});
  table.add({a.model, std::to_string(a.batch), amp,
             plan           ? "plan"
             : a.checkpoint ? autograd::to_string(a.checkpoint_policy)
                            : "no",
             bench::fmt("%.2f", step_s * 1e3), bench::fmt("%.2f", host_s * 1e3), bench::fmt("%.1f", samples_per_s),
             bench::fmt("%.3f", gib(st.allocated_bytes.peak)), bench::fmt("%.3f", gib(st.reserved_bytes.peak)),
             std::to_string(params), bench::fmt("%.3f", mfu)});
  table.print();

  std::printf("\nkey figures\n");
  std::printf("model: %s\n", a.model.c_str());
  std::printf("batch: %lld\n", (long long)a.batch);
  std::printf("amp: %d\n", a.amp ? 1 : 0);
  std::printf("checkpoint: %d\n", a.checkpoint ? 1 : 0);
  std::printf("cuda_graph: %d\n", a.cuda_graph ? 1 : 0);
  std::printf("checkpoint_selective: %d\n",
              a.checkpoint && a.checkpoint_policy == autograd::CheckpointPolicy::Selective ? 1 : 0);
  std::printf("step_ms: %.3f\n", step_s * 1e3);
  std::printf("host_ms: %.3f\n", host_s * 1e3);
  std::printf("samples_per_s: %.2f\n", samples_per_s);
  std::printf("peak_allocated_gib: %.4f\n", gib(st.allocated_bytes.peak));
  std::printf("peak_reserved_gib: %.4f\n", gib(st.reserved_bytes.peak));
  std::printf("parameters: %lld\n", (long long)params);
  std::printf("mfu: %.4f\n", mfu);
  // Moments, momentum buffers and GaLore's projections (Note [GaLore]): AdamW's 2 floats a
  // parameter against GaLore's low-rank state.
  std::printf("optimizer: %s\n", a.optim.c_str());
  if (a.optim == "galore") std::printf("galore_rank: %lld\n", (long long)a.galore_rank);
  std::printf("optimizer_state_bytes: %lld\n", (long long)opt->state_bytes());
  if (const auto* offload = dynamic_cast<const optim::OffloadAdamW*>(opt.get()))
    std::printf("optimizer_host_bytes: %lld\noptimizer_device_bytes: %lld\n", (long long)offload->host_state_bytes(),
                (long long)offload->device_state_bytes());
  // Where the allocator went to the system during the timed steps (each cudaMalloc costs
  // time; a retry frees the cache, which synchronizes the device).
  std::printf("segment_allocs: %lld\n", (long long)(st.num_segment_allocs - before.num_segment_allocs));
  std::printf("alloc_retries: %lld\n", (long long)(st.num_alloc_retries - before.num_alloc_retries));
  if (plan) std::printf("memory_plan: %s\n", plan_text(*plan, w.num_blocks).c_str());
  if (planner) {
    std::printf("memory_budget_gib: %.4f\n", gib(budget));
    std::printf("predicted_peak_gib: %.4f\n", gib(planner->predict_peak(*plan)));
    std::printf("predicted_step_ms: %.3f\n", planner->predict_ms(*plan));
    std::printf("default_peak_gib: %.4f\n", gib(planner->default_peak()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = cli::parse_or_exit("train_step", kUsage, [&] { return parse(argc, argv); });
    return run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 1;
  }
}
