// Compresses a trained ViT-like Fashion-MNIST classifier with SVD low-rank layers
// (nn/low_rank.h) at several energies, fine-tunes each briefly, and prints what it
// buys: parameters, peak training memory, inference memory, step time and test
// accuracy, each against the uncompressed model given the same fine-tuning.
//
//   build/bench/svd_compress [--device cpu|cuda[:N]] [--epochs N] [--finetune-steps N]
//       [--train-limit N] [--batch-size N] [--dim D] [--depth N] [--heads H] [--lr X] [--seed N]
//
// Memory figures come from the allocator's statistics (memory/allocator.h), counted
// from what was allocated before each model was built, so the dataset does not count.
// Each factorized layer saves one more activation for backward, its (B, T, rank)
// middle, so where activations outweigh weights (small widths, large batches) peak
// training memory can rise while parameters and optimizer state shrink.
// The model is make_model() below: swap it (e.g. for models/vit) and adjust
// kCompressPatterns; nothing else depends on its structure.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/reduce.h"
#include "bench/bench_util.h"
#include "examples/flags.h"
#include "examples/mnist_train.h"
#include "memory/allocator.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/data/dataloader.h"
#include "nn/data/idx.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/low_rank.h"
#include "optim/adam.h"
#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tensor/random.h"
#include "train/evaluate.h"
#include "train/progress.h"

using namespace frugal;

namespace {

struct Args {
  std::string device = "cpu", data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = -1, finetune_steps = -1, train_limit = -1, batch_size = 128;  // -1: the device's default
  int64_t dim = 64, depth = 2, heads = 4;
  double lr = 2e-3;
  uint64_t seed = 0;
};

const char* kUsage =
    "usage: svd_compress [--device cpu|cuda[:N]] [--epochs N] [--finetune-steps N]\n"
    "       [--train-limit N (0 = all 60000)] [--batch-size N] [--dim D] [--depth N] [--heads H]\n"
    "       [--lr X] [--seed N] [--data-dir DIR]\n";

Args parse(int argc, char** argv) {
  Args a;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--device")) a.device = flags.text();
    else if (flags.is("--epochs")) a.epochs = flags.positive();
    else if (flags.is("--finetune-steps")) a.finetune_steps = flags.positive();
    else if (flags.is("--train-limit")) a.train_limit = flags.non_negative();
    else if (flags.is("--batch-size")) a.batch_size = flags.positive();
    else if (flags.is("--dim")) a.dim = flags.positive();
    else if (flags.is("--depth")) a.depth = flags.positive();
    else if (flags.is("--heads")) a.heads = flags.positive();
    else if (flags.is("--lr")) a.lr = flags.positive_real();
    else if (flags.is("--seed")) a.seed = flags.seed();
    else if (flags.is("--data-dir")) a.data_dir = flags.text();
    else flags.unknown();
  }
  return a;
}

// ---- The model: a small ViT (pre-norm encoder blocks, mean-pooled tokens) -----------

/// Self-attention with separate query/key/value/out projections, so each is a Linear
/// that compress() can replace; they are held as UnaryModule and re-pointed on
/// replacement (see Note [Replacing a layer in place] in nn/low_rank.cpp).
class SelfAttention : public nn::UnaryModule {
 public:
  SelfAttention(int64_t dim, int64_t heads) : heads_(heads) {
    for (auto [name, slot] : slots()) *slot = register_module(name, std::make_shared<nn::Linear>(dim, dim));
  }
  Tensor forward(const Tensor& x) override {  // x: (B, T, D)
    const int64_t B = x.size(0), T = x.size(1), D = x.size(2), H = heads_;
    auto split = [&](const Tensor& t) { return t.view({B, T, H, D / H}).transpose(1, 2); };  // (B, H, T, D/H)
    const Tensor a =
        scaled_dot_product_attention(split(query->forward(x)), split(key->forward(x)), split(value->forward(x)));
    return out->forward(a.transpose(1, 2).reshape({B, T, D}));
  }
  std::string type_name() const override { return "SelfAttention"; }
  std::shared_ptr<nn::UnaryModule> query, key, value, out;

 protected:
  void on_replace_module(const std::string& name, const std::shared_ptr<nn::Module>& m) override {
    for (auto [n, slot] : slots())
      if (n == name) *slot = std::dynamic_pointer_cast<nn::UnaryModule>(m);
  }

 private:
  std::vector<std::pair<std::string, std::shared_ptr<nn::UnaryModule>*>> slots() {
    return {{"query", &query}, {"key", &key}, {"value", &value}, {"out", &out}};
  }
  int64_t heads_;
};

class EncoderBlock : public nn::UnaryModule {
 public:
  EncoderBlock(int64_t dim, int64_t heads) {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(Shape{dim}));
    attn = register_module("attn", std::make_shared<SelfAttention>(dim, heads));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(Shape{dim}));
    mlp = register_module("mlp", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<UnaryModule>>{
                                     std::make_shared<nn::Linear>(dim, 4 * dim), std::make_shared<nn::GELU>(),
                                     std::make_shared<nn::Linear>(4 * dim, dim)}));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = add(x, attn->forward(ln1->forward(x)));
    return add(h, mlp->forward(ln2->forward(h)));
  }
  std::string type_name() const override { return "EncoderBlock"; }
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<nn::Sequential> mlp;
};

/// 28x28 images as 16 patches of 7x7, embedded by a Linear, plus learned positions.
class TinyViT : public nn::UnaryModule {
 public:
  TinyViT(int64_t dim, int64_t depth, int64_t heads) {
    patch_embed = register_module("patch_embed", std::make_shared<nn::Linear>(49, dim));
    pos = register_parameter("pos_embed", randn({16, dim}));
    {
      autograd::NoGradGuard no_grad;
      pos.copy_(ops::affine(pos, 0.02, 0.0));
    }
    blocks = register_module("blocks", std::make_shared<nn::ModuleList<EncoderBlock>>());
    for (int64_t i = 0; i < depth; ++i) blocks->push_back(std::make_shared<EncoderBlock>(dim, heads));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{dim}));
    head = register_module("head", std::make_shared<nn::Linear>(dim, 10));
  }
  Tensor forward(const Tensor& x) override {  // x: (B, 1, 28, 28)
    const int64_t B = x.size(0);
    const Tensor patches = x.reshape({B, 4, 7, 4, 7}).permute({0, 1, 3, 2, 4}).reshape({B, 16, 49});
    Tensor h = add(patch_embed->forward(patches), pos);  // (B, 16, D)
    for (const auto& block : *blocks) h = block->forward(h);
    return head->forward(mean(norm->forward(h), {1}));
  }
  std::string type_name() const override { return "TinyViT"; }
  std::shared_ptr<nn::Linear> patch_embed, head;
  std::shared_ptr<nn::ModuleList<EncoderBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  Tensor pos;
};

std::shared_ptr<nn::UnaryModule> make_model(const Args& a) {
  return std::make_shared<TinyViT>(a.dim, a.depth, a.heads);
}
const std::vector<std::string> kCompressPatterns = {"blocks.*.attn.*", "blocks.*.mlp.*"};

// ---- Measurement --------------------------------------------------------------------

double mib(int64_t bytes) { return double(bytes) / double(1 << 20); }

struct Variant {
  std::string name;
  int64_t params = 0, min_rank = 0, max_rank = 0, replaced = 0, matched = 0;
  int64_t train_peak = 0, infer_peak = 0;
  double step_ms = 0, acc_before = 0, acc_after = 0;
};

/// Fine-tunes for `steps` steps; returns the median step time in ms (device synced per step).
double finetune(nn::UnaryModule& model, optim::Optimizer& opt, data::DataLoader& loader, int64_t steps, Device device,
                const std::string& label) {
  model.train();
  std::vector<double> times;
  data::Batch batch;
  const double start = bench::now_seconds();
  for (int64_t step = 0; step < steps; ++step) {
    if (!loader.next(batch)) {
      loader.set_epoch(loader.epoch());
      loader.next(batch);
    }
    const double t0 = bench::now_seconds();
    Tensor loss = cross_entropy(model.forward(batch.inputs), batch.targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    synchronize(device);
    times.push_back(bench::now_seconds() - t0);
    if ((step + 1) % 20 == 0 || step + 1 == steps) {
      const double secs = bench::now_seconds() - start, rate = double(step + 1) / secs;
      std::printf("\r  fine-tune %-10s step %lld/%lld  loss %.4f  %.1f steps/s  ETA %s   ", label.c_str(),
                  (long long)step + 1, (long long)steps, loss.item<double>(), rate,
                  train::format_clock(double(steps - step - 1) / rate).c_str());
      std::fflush(stdout);
    }
  }
  std::printf("\n");
  return 1e3 * bench::median(times);
}

}  // namespace

int main(int argc, char** argv) {
  Args args = cli::parse_or_exit("svd_compress", kUsage, [&] { return parse(argc, argv); });
  try {
    const Device device(args.device);
    const bool gpu = device.is_cuda();
    if (args.epochs < 0) args.epochs = gpu ? 5 : 1;
    if (args.finetune_steps < 0) args.finetune_steps = gpu ? 300 : 60;
    if (args.train_limit < 0) args.train_limit = gpu ? 0 : 12000;
    manual_seed(args.seed);

    data::FashionMnist ds = data::load_fashion_mnist(args.data_dir);
    examples::standardize(ds);
    if (args.train_limit > 0 && args.train_limit < ds.train_images.size(0)) {
      ds.train_images = ds.train_images.narrow(0, 0, args.train_limit).contiguous();
      ds.train_labels = ds.train_labels.narrow(0, 0, args.train_limit).contiguous();
    }
    data::TensorDataset train(ds.train_images, ds.train_labels);
    data::DataLoader loader(train,
                            {.batch_size = args.batch_size, .shuffle = true, .seed = args.seed, .device = device});

    const auto test = examples::test_loader(ds, device);

    // 1. Train the dense model.
    auto model = make_model(args);
    model->to(device);
    std::printf("svd_compress: %s, %lld parameters, on %s; %lld epochs over %lld images, batch %lld, AdamW lr %g\n",
                model->type_name().c_str(), (long long)model->num_parameters(), device.str().c_str(),
                (long long)args.epochs, (long long)ds.train_images.size(0), (long long)args.batch_size, args.lr);
    {
      optim::AdamW opt(model->parameters(), {.lr = args.lr});
      train::Progress progress({.epochs = args.epochs});
      for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
        loader.set_epoch(epoch);
        progress.start_epoch(epoch, loader.size());
        progress.end_epoch(examples::train_epoch(*model, opt, loader, &progress, 10).mean_loss);
      }
    }
    std::map<std::string, Tensor> trained;
    for (auto& [name, t] : model->state_dict()) trained[name] = t.detach().clone();
    model.reset();

    // 2. Each variant starts from the trained weights, is compressed (or not), fine-tuned, measured.
    const std::vector<double> energies = {0.0, 0.99, 0.95, 0.9, 0.8};  // 0: the dense model
    const Tensor probe = ds.test_images.narrow(0, 0, 256).to(device);
    std::vector<Variant> rows;
    for (double energy : energies) {
      Variant v;
      char name[32];
      std::snprintf(name, sizeof name, "%.2f", energy);
      v.name = energy == 0 ? "dense" : name;
      synchronize(device);
      const int64_t base = memory::stats(device).allocated_bytes.current;
      auto m = make_model(args);
      m->to(device);
      m->load_state_dict(trained);
      if (energy > 0) {
        const nn::CompressReport report = nn::compress(*m, {.patterns = kCompressPatterns, .energy = {energy}});
        std::printf("energy %s:\n%s", v.name.c_str(), report.table().c_str());
        v.min_rank = INT64_MAX;
        v.matched = int64_t(report.layers.size());
        for (const auto& l : report.layers) {
          if (!l.replaced) continue;
          ++v.replaced;
          v.min_rank = std::min(v.min_rank, l.rank);
          v.max_rank = std::max(v.max_rank, l.rank);
        }
      }
      v.params = m->num_parameters();
      v.acc_before = train::evaluate(*m, *test).accuracy;
      {
        optim::AdamW opt(m->parameters(), {.lr = args.lr * 0.25});
        loader.set_epoch(1000);
        synchronize(device);
        memory::reset_peak(device);
        v.step_ms = finetune(*m, opt, loader, args.finetune_steps, device, v.name);
        synchronize(device);
        v.train_peak = memory::stats(device).allocated_bytes.peak - base;
      }
      v.acc_after = train::evaluate(*m, *test).accuracy;
      {
        autograd::NoGradGuard no_grad;
        m->eval();
        synchronize(device);
        memory::reset_peak(device);
        Tensor logits = m->forward(probe);
        synchronize(device);
        v.infer_peak = memory::stats(device).allocated_bytes.peak - base;
      }
      rows.push_back(v);
    }

    // 3. The table: each figure and its ratio to the dense model.
    const Variant& d = rows.front();
    std::printf(
        "\nSVD compression of %s on %s (attention and MLP projections; %lld fine-tune steps each, batch %lld)\n",
        "TinyViT", device.str().c_str(), (long long)args.finetune_steps, (long long)args.batch_size);
    std::printf("%-7s %-8s %-9s %16s %20s %18s %16s %9s %16s\n", "energy", "replaced", "ranks", "params",
                "peak train MiB", "inference MiB", "step ms", "acc(SVD)", "acc(tuned)");
    for (const Variant& v : rows) {
      char ranks[24] = "-", replaced[24] = "-";
      if (v.matched) std::snprintf(replaced, sizeof replaced, "%lld/%lld", (long long)v.replaced, (long long)v.matched);
      if (v.replaced) std::snprintf(ranks, sizeof ranks, "%lld-%lld", (long long)v.min_rank, (long long)v.max_rank);
      std::printf(
          "%-7s %-8s %-9s %9lld (%4.2fx) %12.2f (%4.2fx) %10.2f (%4.2fx) %8.2f (%4.2fx) %8.2f%% %8.2f%% (%+.2f)\n",
          v.name.c_str(), replaced, ranks, (long long)v.params, double(v.params) / double(d.params), mib(v.train_peak),
          double(v.train_peak) / double(d.train_peak), mib(v.infer_peak), double(v.infer_peak) / double(d.infer_peak),
          v.step_ms, v.step_ms / d.step_ms, 100 * v.acc_before, 100 * v.acc_after, 100 * (v.acc_after - d.acc_after));
    }
    std::printf(
        "replaced: layers factorized / matched (a layer whose rank saves nothing is kept); ranks: of those replaced\n"
        "acc(SVD): test accuracy right after compression; acc(tuned): after fine-tuning (vs dense, also tuned)\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "svd_compress: %s\n", e.what());
    return 1;
  }
  return 0;
}
