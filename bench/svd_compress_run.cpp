#include "bench/svd_compress_run.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include "autograd/grad_mode.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/reduce.h"
#include "bench/bench_util.h"
#include "core/stream.h"
#include "examples/mnist_train.h"
#include "memory/allocator.h"
#include "nn/data/dataloader.h"
#include "nn/data/idx.h"
#include "nn/data/transforms.h"
#include "nn/low_rank.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "train/evaluate.h"
#include "train/progress.h"

namespace frugal::bench::svd {

namespace {

const std::vector<std::string> kCompressPatterns = {"blocks.*.attn.*", "blocks.*.mlp.*"};

double mib(int64_t bytes) { return double(bytes) / double(1 << 20); }

/// Fashion-MNIST when installed; for quick runs without it (and always for vitb16),
/// random images of the model's shape with random labels: speed and memory only.
/// The dataset, standardized; `raw_train` gets the training images as loaded (in [0, 1]),
/// for augmentation that pads with black before it standardizes.
data::FashionMnist dataset(const Options& o, const PatchViTConfig& c, std::ostream& log, Tensor& raw_train) {
  const bool have = std::filesystem::exists(o.data_dir);
  if (o.model != "vitb16" && (have || !o.quick)) {
    data::FashionMnist ds = data::load_fashion_mnist(o.data_dir);
    auto cut = [](Tensor& t, int64_t n) {
      if (n > 0 && n < t.size(0)) t = t.narrow(0, 0, n).contiguous();
    };
    cut(ds.train_images, o.train_limit);
    raw_train = ds.train_images;
    examples::standardize(ds);
    cut(ds.train_labels, o.train_limit);
    cut(ds.test_images, o.test_limit), cut(ds.test_labels, o.test_limit);
    return ds;
  }
  log << "svd_compress: random " << c.channels << "x" << c.image << "x" << c.image
      << " images with random labels (accuracy means nothing)\n";
  const int64_t n = std::max<int64_t>(64, 2 * o.batch_size);
  auto labels = [&](int64_t k) { return randint(0, c.classes, {k}, TensorOptions(kInt64)); };
  return {randn({n, c.channels, c.image, c.image}), labels(n), randn({64, c.channels, c.image, c.image}), labels(64)};
}

/// Fine-tunes for `steps` steps; returns the median step time in ms (device synced per step).
double finetune(nn::UnaryModule& model, optim::Optimizer& opt, optim::LRScheduler* schedule, data::DataLoader& loader,
                int64_t steps, Device device, const std::string& label, std::ostream& log) {
  model.train();
  std::vector<double> times;
  data::Batch batch;
  const double start = now_seconds();
  for (int64_t step = 0; step < steps; ++step) {
    if (!loader.next(batch)) {
      loader.set_epoch(loader.epoch());  // as before the split: the README's small-model numbers
      loader.next(batch);
    }
    const double t0 = now_seconds();
    Tensor loss = cross_entropy(model.forward(batch.inputs), batch.targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (schedule) schedule->step();
    synchronize(device);
    times.push_back(now_seconds() - t0);
    if ((step + 1) % 20 == 0 || step + 1 == steps) {
      const double rate = double(step + 1) / (now_seconds() - start);
      char line[160];
      std::snprintf(line, sizeof line, "\r  fine-tune %-6s step %lld/%lld  loss %.4f  %.1f steps/s  ETA %s   ",
                    label.c_str(), (long long)step + 1, (long long)steps, loss.item<double>(), rate,
                    train::format_clock(double(steps - step - 1) / rate).c_str());
      log << line << std::flush;
    }
  }
  log << "\n";
  return 1e3 * median(times);
}

}  // namespace

PatchViTConfig model_config(const Options& o) {
  PatchViTConfig c;
  if (o.model == "small") c = {.image = 28, .channels = 1, .patch = 7, .dim = 64, .depth = 2, .heads = 4, .mlp = 256};
  else if (o.model == "vit21m")
    c = {.image = 28, .channels = 1, .patch = 4, .dim = 384, .depth = 12, .heads = 6, .mlp = 1536};
  else if (o.model == "vitb16")
    c = {.image = 224, .channels = 3, .patch = 16, .dim = 768, .depth = 12, .heads = 12, .mlp = 3072, .classes = 1000};
  else FRUGAL_FAIL("svd_compress: unknown model '", o.model, "' (small, vit21m or vitb16)");
  if (o.quick) {
    c.dim = 32, c.heads = 2, c.mlp = 128, c.depth = 2;
    if (o.model == "vitb16") c.image = 32, c.patch = 8, c.classes = 10;
  }
  return c;
}

/// vit21m's parameter budgets, which vitb16 repeats so that its memory and speed columns
/// stand beside the trained model's rows.
const std::vector<double> kVit21mBudgets = {0.7, 0.65, 0.6, 0.5};

Options defaults(const std::string& model, Device device, bool quick) {
  Options o;
  o.model = model, o.device = device, o.quick = quick;
  const bool gpu = device.is_cuda();
  o.budgets = {0.7, 0.5};
  if (model == "small") {
    o.energies = {0.99, 0.95, 0.9, 0.8};
    o.epochs = gpu ? 5 : 1, o.finetune_steps = gpu ? 300 : 60, o.train_limit = gpu ? 0 : 12000;
  } else if (model == "vit21m") {
    o.energies = {0.95, 0.9, 0.8};
    o.budgets = kVit21mBudgets;
    o.finetune_decay = true, o.augment = true;
    o.epochs = gpu ? 20 : 1, o.finetune_steps = gpu ? 300 : 20, o.train_limit = gpu ? 0 : 2000, o.lr = 5e-4;
  } else if (model == "vitb16") {
    // Random weights have flat spectra: energies would keep nearly full rank. Budgets only,
    // vit21m's, whose rows' parameter ratios are the budgets themselves (its matched layers
    // hold 99% of its parameters).
    o.budgets = kVit21mBudgets;
    o.epochs = 0, o.finetune_steps = gpu ? 20 : 2, o.batch_size = 32;
  }
  if (quick) {
    o.epochs = o.model == "vitb16" ? 0 : 1, o.finetune_steps = 8, o.train_limit = 1024, o.test_limit = 1000;
    o.batch_size = 64, o.throughput_reps = 2;
  }
  (void)model_config(o);  // rejects an unknown model here
  return o;
}

std::vector<Row> run_table(const Options& o, std::ostream& log) {
  const PatchViTConfig c = model_config(o);
  const Device device = o.device;
  const bool trains = o.model != "vitb16";
  manual_seed(o.seed);
  Tensor raw_train;
  data::FashionMnist ds = dataset(o, c, log, raw_train);
  data::DataLoader loader(data::TensorDataset(ds.train_images, ds.train_labels),
                          {.batch_size = o.batch_size, .shuffle = true, .seed = o.seed, .device = device});
  const auto test = examples::test_loader(ds, device);
  // The same probe images for every row, allocated before any model (not counted).
  const Tensor probe32 =
      (ds.test_images.size(0) >= 32 ? ds.test_images.narrow(0, 0, 32) : randn({32, c.channels, c.image, c.image}))
          .to(device);
  const Tensor probe1 = probe32.narrow(0, 0, 1);

  // 1. The dense model, trained (vitb16: as initialized).
  auto model = std::make_shared<PatchViT>(c);
  model->to(device);
  log << "svd_compress: " << o.model << " (" << c.depth << " x " << c.dim << ", mlp " << c.mlp << ", " << c.tokens()
      << " tokens), " << model->num_parameters() << " parameters, on " << device.str() << "\n";
  if (trains) {
    // Training batches, augmented when asked (random crop 28 padding 2, horizontal flip, as
    // train_resnet --augment); fine-tuning reads the plain `loader`.
    std::optional<data::DataLoader> augmented;
    if (o.augment)
      augmented.emplace(
          std::make_shared<data::TransformedDataset>(
              std::make_shared<data::TensorDataset>(raw_train, ds.train_labels),
              data::Compose({data::RandomCrop(c.image, 2), data::RandomHorizontalFlip(0.5),
                             data::Normalize({examples::kFashionMnistMean}, {examples::kFashionMnistStd})}),
              o.seed),
          data::DataLoaderOptions{.batch_size = o.batch_size,
                                  .shuffle = true,
                                  .seed = o.seed,
                                  .device = device,
                                  .prefetch = 4,
                                  .workers = 4});
    data::DataLoader& train_loader = augmented ? *augmented : loader;
    // train_vit's recipe: AdamW with weight decay, warm-up then cosine decay, label
    // smoothing, float16 autocast on CUDA (a constant lr left the 21M model short of the
    // small ViT's accuracy).
    optim::AdamW opt(model->parameters(), {.lr = o.lr, .weight_decay = 0.05});
    const int64_t total = std::max<int64_t>(1, o.epochs * train_loader.size());
    optim::WarmupCosineLR schedule(opt, {.warmup_steps = total / 20, .total_steps = total + 1, .start_factor = 0.01});
    optim::GradScaler scaler({.enabled = device.is_cuda()});
    examples::AmpRun run{.device = device, .amp = device.is_cuda(), .report_every = 10};
    train::Progress progress({.epochs = o.epochs, .unit = "img"});
    const auto loss_fn = [](const Tensor& logits, const Tensor& targets) {
      return cross_entropy(logits, targets, {.label_smoothing = 0.1});
    };
    for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
      train_loader.set_epoch(epoch);
      examples::train_amp_epoch(*model, loss_fn, opt, scaler, schedule, train_loader, epoch, run, progress);
    }
  }
  std::map<std::string, Tensor> trained;
  for (auto& [name, t] : model->state_dict()) trained[name] = t.detach().clone();
  model.reset();

  // 2. Each row starts from those weights, is compressed (or not), measured, fine-tuned.
  struct Plan {
    std::string name;
    double energy = 0, budget = 0;
  };
  std::vector<Plan> plans = {{"dense"}};
  for (double e : o.energies) plans.push_back({fmt("e%.2f", e), e, 0});
  for (double b : o.budgets) plans.push_back({fmt("p%.2f", b), 0, b});
  std::vector<Row> rows;
  for (const Plan& plan : plans) {
    Row r{.name = plan.name};
    synchronize(device);
    const int64_t base = memory::stats(device).allocated_bytes.current;
    auto m = std::make_shared<PatchViT>(c);
    m->to(device);
    m->load_state_dict(trained);
    if (plan.name != "dense") {
      nn::CompressPolicy policy{.patterns = kCompressPatterns};
      if (plan.budget > 0) policy.param_budget = plan.budget;
      else policy.energy = {plan.energy};
      const nn::CompressReport report = nn::compress(*m, policy);
      log << plan.name << ":\n" << report.table();
      r.matched = int64_t(report.layers.size()), r.min_rank = INT64_MAX, r.energy_kept = 0;
      for (const auto& l : report.layers) {
        r.energy_kept += l.energy_kept / double(r.matched);
        if (!l.replaced) continue;
        ++r.replaced, r.min_rank = std::min(r.min_rank, l.rank), r.max_rank = std::max(r.max_rank, l.rank);
      }
    }
    if (device.is_cuda()) {
      // Measured as the model loaded for inference would be, its weights laid out afresh.
      // In place, the factors land in cached blocks that the SVD's temporaries and the
      // dense weights left, and the allocated count includes whatever part of such a block
      // was not split off (memory/caching_allocator.h): e0.90 of vit21m measured 1.09x the
      // dense batch-1 peak with 0.95x the parameters. (How much each cause adds was not
      // measured; the fresh layout removed the excess.)
      m->to(kCPU);
      memory::empty_cache(device);
      m->to(device);
    }
    r.params = m->num_parameters();
    {  // Inference: weights plus one forward's activations, before any gradient exists.
      autograd::NoGradGuard no_grad;
      m->eval();
      for (auto [probe, peak] : {std::pair{&probe1, &r.infer_peak_1}, std::pair{&probe32, &r.infer_peak_32}}) {
        synchronize(device);
        memory::reset_peak(device);
        Tensor logits = m->forward(*probe);
        synchronize(device);
        *peak = memory::stats(device).allocated_bytes.peak - base;
      }
      const double secs = time_median(
          [&] {
            Tensor logits = m->forward(probe32);
            synchronize(device);
          },
          1, int(o.throughput_reps));
      r.images_per_s = 32 / secs;
    }
    if (trains) r.acc_before = train::evaluate(*m, *test).accuracy;
    {
      optim::AdamW opt(m->parameters(), {.lr = o.lr * 0.25});
      std::optional<optim::CosineAnnealingLR> decay;
      if (o.finetune_decay) decay.emplace(opt, optim::CosineAnnealingLROptions{.T_max = o.finetune_steps});
      loader.set_epoch(1000);
      synchronize(device);
      memory::reset_peak(device);
      r.step_ms = finetune(*m, opt, decay ? &*decay : nullptr, loader, o.finetune_steps, device, r.name, log);
      synchronize(device);
      r.train_peak = memory::stats(device).allocated_bytes.peak - base;
    }
    if (trains) r.acc_after = train::evaluate(*m, *test).accuracy;
    rows.push_back(r);
  }
  return rows;
}

void print_table(const Options& o, const std::vector<Row>& rows, std::ostream& os) {
  const PatchViTConfig c = model_config(o);
  const Row& d = rows.front();
  auto ratio = [](double v, double dense) { return fmt("(%.2fx)", dense > 0 ? v / dense : 0.0); };
  Table t("SVD compression of " + o.model + " (" + std::to_string(c.depth) + " x " + std::to_string(c.dim) + ", mlp " +
              std::to_string(c.mlp) + ", " + std::to_string(c.tokens()) + " tokens) on " + o.device.str() +
              ": attention and MLP projections; " + std::to_string(o.finetune_steps) + " fine-tune steps each, batch " +
              std::to_string(o.batch_size),
          {"row", "replaced", "ranks", "energy", "params", "", "infer b1 MiB", "", "infer b32 MiB", "", "train MiB", "",
           "step ms", "", "img/s b32", "", "acc(SVD)", "acc(tuned)", ""});
  for (const Row& r : rows) {
    const bool trained = !std::isnan(r.acc_after);
    t.add({r.name, r.matched ? std::to_string(r.replaced) + "/" + std::to_string(r.matched) : "-",
           r.replaced ? std::to_string(r.min_rank) + "-" + std::to_string(r.max_rank) : "-", fmt("%.3f", r.energy_kept),
           std::to_string(r.params), ratio(double(r.params), double(d.params)), fmt("%.2f", mib(r.infer_peak_1)),
           ratio(double(r.infer_peak_1), double(d.infer_peak_1)), fmt("%.2f", mib(r.infer_peak_32)),
           ratio(double(r.infer_peak_32), double(d.infer_peak_32)), fmt("%.2f", mib(r.train_peak)),
           ratio(double(r.train_peak), double(d.train_peak)), fmt("%.2f", r.step_ms), ratio(r.step_ms, d.step_ms),
           fmt("%.1f", r.images_per_s), ratio(r.images_per_s, d.images_per_s),
           trained ? fmt("%.2f%%", 100 * r.acc_before) : "-", trained ? fmt("%.2f%%", 100 * r.acc_after) : "-",
           trained ? fmt("(%+.2f)", 100 * (r.acc_after - d.acc_after)) : ""});
  }
  t.print();  // to stdout, as every bench table
  os << "rows: eX = one energy X for every layer, pX = parameter budget X of the matched weights "
        "(nn/low_rank_budget.h); replaced: factorized / matched; energy: mean kept\n"
        "infer: peak allocated during one forward at batch 1 / 32, weights included; train: fine-tuning peak "
        "(weights, grads, AdamW state, activations)\n"
        "acc(SVD): test accuracy right after compression; acc(tuned): after fine-tuning (vs dense, also tuned)\n";
}

int best_row(const std::vector<Row>& rows, double tolerance) {
  int best = -1;
  for (size_t i = 1; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const bool trained = !std::isnan(r.acc_after);
    if (r.params >= rows.front().params) continue;  // nothing factorized (or nothing saved)
    if (trained && r.acc_after < rows.front().acc_after - tolerance) continue;
    if (best < 0 || r.infer_peak_1 < rows[size_t(best)].infer_peak_1) best = int(i);
  }
  return best;
}

std::string summary(const std::vector<Row>& rows, double tolerance) {
  std::ostringstream os;
  int b = best_row(rows, tolerance);
  std::string why;
  if (b < 0) {  // none close enough: the most accurate compressed row, said as such
    for (size_t i = 1; i < rows.size(); ++i)
      if (rows[i].params < rows.front().params && (b < 0 || rows[i].acc_after > rows[size_t(b)].acc_after)) b = int(i);
    if (b < 0) return "best_row: none (no row has fewer parameters than dense)\n";
    why = " (none within " + fmt("%g", 100 * tolerance) +
          " points of the dense accuracy: the most accurate compressed row)";
  }
  const Row &r = rows[size_t(b)], &d = rows.front();
  char line[256];
  std::snprintf(line, sizeof line,
                "param_ratio: %.4f\ninference_memory_ratio: %.4f\ninference_memory_ratio_b32: %.4f\n",
                double(r.params) / double(d.params), double(r.infer_peak_1) / double(d.infer_peak_1),
                double(r.infer_peak_32) / double(d.infer_peak_32));
  os << "best_row: " << r.name << why << "\n" << line;
  return os.str();
}

void linear_microbench(Device device, int64_t tokens, int64_t dims_scale, int reps, std::ostream& os) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{768, 768}, {768, 3072}, {3072, 768}};
  Table t("Linear forward / forward+backward, dense against factorized (two thin GEMMs), " + std::to_string(tokens) +
              " tokens, float32, " + device.str(),
          {"in->out", "rank", "params", "fwd ms", "dense fwd ms", "fwd ratio", "f+b ms", "dense f+b ms", "f+b ratio"});
  for (auto [in, out] : shapes) {
    in /= dims_scale, out /= dims_scale;
    const Tensor x = randn({tokens, in}, TensorOptions(device));
    auto time_layer = [&](nn::UnaryModule& layer, bool backward) {
      return 1e3 * time_median(
                       [&] {
                         if (backward) {  // as in a training step: grads written afresh, dx too
                           layer.zero_grad();
                           sum(layer.forward(x.detach().requires_grad_())).backward();
                         } else {
                           autograd::NoGradGuard no_grad;
                           Tensor y = layer.forward(x);
                         }
                         synchronize(device);
                       },
                       1, reps);
    };
    nn::Linear dense(in, out);
    dense.to(device);
    const double dense_fwd = time_layer(dense, false), dense_fb = time_layer(dense, true);
    for (int64_t rank : {64, 128, 256, 384}) {
      rank /= dims_scale;
      if (rank < 1 || rank > std::min(in, out)) continue;
      nn::LowRankLinear lr(in, out, rank);
      lr.to(device);
      const double fwd = time_layer(lr, false), fb = time_layer(lr, true);
      t.add({std::to_string(in) + "->" + std::to_string(out), std::to_string(rank),
             fmt("%.2fx", double(rank * (in + out)) / double(in * out)), fmt("%.3f", fwd), fmt("%.3f", dense_fwd),
             fmt("%.2fx", fwd / dense_fwd), fmt("%.3f", fb), fmt("%.3f", dense_fb), fmt("%.2fx", fb / dense_fb)});
    }
  }
  t.print();
  os << "params: rank * (in + out) / (in * out); ratio < 1: the factorized layer is faster\n";
}

}  // namespace frugal::bench::svd
