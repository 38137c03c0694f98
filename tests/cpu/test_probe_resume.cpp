// Probes for silent wrong answers in resuming training from a checkpoint (train/checkpoints.h,
// Note [Resumable checkpoint]). The reference is always the uninterrupted run: N steps
// straight against k steps, a save, everything built fresh (model, optimizer, scheduler,
// GradScaler, DataLoader, the default generator reseeded), a load and N - k more steps must
// end bit for bit equal - weights, optimizer state, the loss sequence, the lr, the scale and
// its growth tracker, where the data stands and the generator's offset (dropout masks) - for
// every optimizer (SGD with momentum/nesterov/weight decay, Adam, AdamW with amsgrad, GaLore,
// OffloadAdamW), every LR schedule, a GradScaler that backs off and grows on both sides of
// the save, parameter groups with their own lrs, a frozen parameter, a parameter whose
// gradient is None at most steps, a shuffled loader saved mid-epoch (also through the
// set_epoch loop of the README), and gradient accumulation saved between micro-steps. Then the
// files: truncated, corrupted, of another model, optimizer, loader or schedule, a load that
// fails half-way and a save that fails half-way. A failing case here is a finding.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "autograd/ops/all.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/galore.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/offload_adam.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tensor/ops/random.h"
#include "tensor/random.h"
#include "tests/test_util.h"
#include "train/checkpoints.h"

using namespace frugal;
using namespace frugal::testing;
namespace fs = std::filesystem;

namespace {

// fc1 -> relu -> dropout -> fc2, plus `bonus` added to the logits only at some steps (its
// gradient is None at the others). fc1.bias is frozen and left out of the optimizer.
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
  Tensor bonus;
  Net() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.3));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 4));
    bonus = register_parameter("bonus", zeros({4}));
    fc1->bias.requires_grad_(false);
  }
  /// A buffer safetensors cannot hold (a save of this model fails in the writer).
  void add_inf_buffer() { register_buffer("flags", full({3}, std::numeric_limits<double>::infinity())); }
  Tensor forward(const Tensor& x, bool with_bonus) {
    Tensor logits = (*fc2)((*drop)(relu((*fc1)(x))));
    return with_bonus ? add(logits, bonus) : logits;
  }
};

enum class Opt { SGD, SGDNesterov, Adam, AdamWAmsgrad, GaLore, Offload };
enum class Sched { WarmupCosine, Step, Linear, Cosine, Sequential };

struct Config {
  Opt opt = Opt::AdamWAmsgrad;
  Sched sched = Sched::WarmupCosine;
  int64_t accum = 1;                // micro-steps per optimizer step
  std::set<int64_t> overflow = {};  // micro-steps whose scaled loss overflows: the scaler skips and backs off
  bool grads = false;               // TrainState::grads (saves between micro-steps)
};

std::unique_ptr<optim::Optimizer> make_optimizer(Opt kind, Net& net) {
  // Three groups with their own lrs; fc1.bias (frozen) is in none.
  auto groups = [&] {
    return std::vector<optim::ParamGroup>{{.params = {net.fc1->weight}},
                                          {.params = {net.fc2->weight, net.fc2->bias}, .lr = 0.03},
                                          {.params = {net.bonus}, .lr = 0.2}};
  };
  switch (kind) {
    case Opt::SGD:
      return std::make_unique<optim::SGD>(
          groups(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2});
    case Opt::SGDNesterov:
      return std::make_unique<optim::SGD>(
          groups(), optim::SGDOptions{.lr = 0.05, .momentum = 0.8, .weight_decay = 1e-2, .nesterov = true});
    case Opt::Adam: return std::make_unique<optim::Adam>(groups(), optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1});
    case Opt::AdamWAmsgrad:
      return std::make_unique<optim::AdamW>(groups(),
                                            optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
    case Opt::GaLore:  // fc1.weight (16, 8) is projected to rank 4, refreshed every 3 steps
      return std::make_unique<optim::GaLoreAdamW>(
          groups(), optim::GaLoreOptions{.lr = 1e-2, .weight_decay = 0.1, .rank = 4, .update_proj_gap = 3});
    case Opt::Offload:
      return std::make_unique<optim::OffloadAdamW>(groups(),
                                                   optim::OffloadAdamWOptions{.lr = 1e-2, .chunk_elements = 50});
  }
  return nullptr;
}

// Everything a step depends on, built from scratch with the default generator at `init_seed`.
struct Run {
  Config cfg;
  data::TensorDataset data;
  std::shared_ptr<Net> net;
  std::unique_ptr<optim::Optimizer> opt;
  std::vector<std::shared_ptr<optim::LRScheduler>> subs;  // SequentialLR's parts
  std::unique_ptr<optim::LRScheduler> sched;
  optim::GradScaler scaler{{.init_scale = 1024.0, .growth_interval = 3}};
  std::unique_ptr<data::DataLoader> loader;
  int64_t micro = 0;  // micro-steps done: what the checkpoint's step counts
  std::vector<double> losses, lrs, scales;

  Run(Config c, uint64_t init_seed)
      : cfg(c),
        data(from_vector(random_values(26 * 8, 11), {26, 8}, kFloat32),
             from_vector(
                 std::vector<int64_t>{0, 1, 2, 3, 1, 2, 3, 0, 2, 3, 0, 1, 3, 0, 1, 2, 0, 1, 2, 3, 3, 2, 1, 0, 0, 1},
                 {26})) {
    manual_seed(init_seed);
    net = std::make_shared<Net>();
    opt = make_optimizer(cfg.opt, *net);
    switch (cfg.sched) {
      case Sched::WarmupCosine:
        sched = std::make_unique<optim::WarmupCosineLR>(
            *opt, optim::WarmupCosineLROptions{.warmup_steps = 3, .total_steps = 12, .start_factor = 0.1});
        break;
      case Sched::Step:
        sched = std::make_unique<optim::StepLR>(*opt, optim::StepLROptions{.step_size = 2, .gamma = 0.7});
        break;
      case Sched::Linear:
        sched = std::make_unique<optim::LinearLR>(*opt, optim::LinearLROptions{.start_factor = 0.2, .total_iters = 5});
        break;
      case Sched::Cosine:
        sched = std::make_unique<optim::CosineAnnealingLR>(*opt, optim::CosineAnnealingLROptions{.T_max = 7});
        break;
      case Sched::Sequential:
        subs = {std::make_shared<optim::LinearLR>(*opt, optim::LinearLROptions{.start_factor = 0.5, .total_iters = 2}),
                std::make_shared<optim::StepLR>(*opt, optim::StepLROptions{.step_size = 3, .gamma = 0.5})};
        sched = std::make_unique<optim::SequentialLR>(*opt, subs, std::vector<int64_t>{2});
        break;
    }
    // 26 samples in batches of 4: 7 batches an epoch, the last one short.
    loader = std::make_unique<data::DataLoader>(
        data, data::DataLoaderOptions{.batch_size = 4, .shuffle = true, .seed = 5, .workers = 2});
  }
  train::TrainState state() {
    return {.model = net.get(),
            .optimizer = opt.get(),
            .scaler = &scaler,
            .scheduler = sched.get(),
            .loader = loader.get(),
            .grads = cfg.grads};
  }
  // One micro-step: a batch, its loss, backward; every accum-th one steps.
  void micro_step() {
    data::Batch b;
    while (!loader->next(b)) {}  // an epoch ended: the next call starts the next one
    const int64_t opt_step = micro / cfg.accum;
    Tensor loss = cross_entropy(net->forward(b.inputs, opt_step % 3 == 1), b.targets);
    losses.push_back(loss.item<double>());
    Tensor scaled = mul(loss, 1.0 / double(cfg.accum));
    if (cfg.overflow.count(micro)) scaled = mul(scaled, 1e38);  // * 1024 overflows float32
    scaler.scale(scaled).backward();
    ++micro;
    if (micro % cfg.accum != 0) return;
    scaler.step(*opt);
    scaler.update();
    sched->step();
    opt->zero_grad();
    lrs.push_back(opt->param_groups()[0].lr);
    scales.push_back(scaler.get_scale());
  }
  void micro_steps(int64_t n) {
    for (int64_t i = 0; i < n; ++i) micro_step();
  }
};

std::vector<std::pair<std::string, std::vector<uint8_t>>> bytes_of_dict(const optim::StateDict& dict) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  for (const auto& [k, t] : dict) out.emplace_back(k, bytes_of(t));
  return out;
}

std::vector<std::pair<std::string, std::vector<uint8_t>>> model_bytes(const nn::Module& m) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  for (const auto& [k, t] : m.state_dict()) out.emplace_back(k, bytes_of(t));
  return out;
}

template <typename T>
std::vector<T> tail(const std::vector<T>& v, size_t from) {
  return from >= v.size() ? std::vector<T>{} : std::vector<T>(v.begin() + std::ptrdiff_t(from), v.end());
}

// The two runs agree in everything a later step could read.
void check_same_run(const Run& a, const Run& b) {
  CHECK(model_bytes(*a.net) == model_bytes(*b.net));
  CHECK(bytes_of_dict(a.opt->state_dict()) == bytes_of_dict(b.opt->state_dict()));
  CHECK(bytes_of_dict(a.sched->state_dict()) == bytes_of_dict(b.sched->state_dict()));
  for (size_t g = 0; g < a.opt->param_groups().size(); ++g)
    CHECK(a.opt->param_groups()[g].lr == b.opt->param_groups()[g].lr);
  CHECK(a.scaler.get_scale() == b.scaler.get_scale());
  CHECK(a.scaler.get_growth_tracker() == b.scaler.get_growth_tracker());
  CHECK(a.loader->position().epoch == b.loader->position().epoch);
  CHECK(a.loader->position().batch == b.loader->position().batch);
}

// N micro-steps straight against k, save, a fresh everything, load, N - k: bit for bit.
void check_resume(const Config& cfg, int64_t total, const std::vector<int64_t>& saves) {
  ScratchDir dir("probe_resume");
  Run straight(cfg, 3);
  straight.micro_steps(total);
  const uint64_t offset_after = default_generator().offset();
  for (int64_t k : saves) {
    CAPTURE(k);
    Run first(cfg, 3);
    first.micro_steps(k);
    train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 1});
    ckpt.save(k, first.state());
    ops::uniform_(zeros({37}), 0.0, 1.0);  // draws after the save, which the resumed run must not see

    Run resumed(cfg, 99);  // other initial weights and generator
    REQUIRE(ckpt.resume(resumed.state()) == k);
    resumed.micro = k;
    resumed.micro_steps(total - k);
    CHECK(resumed.losses == tail(straight.losses, size_t(k)));
    CHECK(resumed.lrs == tail(straight.lrs, size_t(k / cfg.accum)));
    CHECK(resumed.scales == tail(straight.scales, size_t(k / cfg.accum)));
    check_same_run(straight, resumed);
    CHECK(default_generator().offset() == offset_after);
    CHECK(default_generator().seed() == 3);
  }
}

}  // namespace

// ============================================================================================
// Bit-exact resume
// ============================================================================================

TEST_CASE("probe resume: every optimizer resumes bit for bit mid-epoch, across scaler backoff and growth") {
  // 7 batches an epoch: saves mid-epoch, at an epoch's end, right after a skipped step and one
  // step before the scale grows (growth_interval 3, tracker 2).
  const Config base{.overflow = {4}};
  for (Opt kind : {Opt::SGD, Opt::SGDNesterov, Opt::Adam, Opt::AdamWAmsgrad, Opt::GaLore, Opt::Offload}) {
    CAPTURE(int(kind));
    Config cfg = base;
    cfg.opt = kind;
    check_resume(cfg, 16, {3, 5, 7, 11});
  }
}

TEST_CASE("probe resume: every LR schedule resumes on schedule") {
  for (Sched s : {Sched::WarmupCosine, Sched::Step, Sched::Linear, Sched::Cosine, Sched::Sequential}) {
    CAPTURE(int(s));
    check_resume({.opt = Opt::Adam, .sched = s}, 12, {1, 2, 4, 9});
  }
}

TEST_CASE("probe resume: the uninterrupted runs differ in what the checkpoint must carry") {
  // The probes above would pass vacuously if nothing moved: the scale backed off and grew, the
  // lr changed, the generator advanced, the bonus parameter has state only once used, the
  // frozen bias never moved.
  Run run({.opt = Opt::AdamWAmsgrad, .overflow = {4}}, 3);
  const std::vector<double> frozen = values_of(run.net->fc1->bias);
  const uint64_t offset0 = default_generator().offset();
  run.micro_steps(8);
  CHECK(run.scales == std::vector<double>{1024, 1024, 2048, 2048, 1024, 1024, 1024, 2048});  // grew, backed off at 4
  CHECK(run.lrs[0] != run.lrs[5]);
  CHECK(default_generator().offset() > offset0);
  CHECK(run.opt->state(run.net->bonus) != nullptr);
  CHECK(run.opt->state(run.net->bonus)->step < run.opt->state(run.net->fc2->bias)->step);
  CHECK(values_of(run.net->fc1->bias) == frozen);
  CHECK(run.opt->state(run.net->fc1->bias) == nullptr);
}

TEST_CASE("probe resume: gradient accumulation saved between micro-steps resumes bit for bit") {
  // Three micro-steps per optimizer step; saves after the first and second micro-step of a
  // step, with the scaled gradients accumulated so far (an overflow among them too).
  for (Opt kind : {Opt::AdamWAmsgrad, Opt::SGD, Opt::Offload}) {
    CAPTURE(int(kind));
    check_resume({.opt = kind, .accum = 3, .overflow = {7}, .grads = true}, 18, {4, 7, 8, 9});
  }
}

TEST_CASE("probe resume: the README loop (set_epoch, then for each batch) resumes mid-epoch where it stopped") {
  // for (epoch = first; ...) { loader.set_epoch(epoch); for (Batch& b : loader) {...} }: the
  // set_epoch of the resumed epoch must not send the loader back to its first batch.
  auto samples = [](data::DataLoader& loader, int64_t stop_after, const std::string& path, bool resume) {
    std::vector<double> seen;
    int64_t done = 0;
    train::CheckpointManager ckpt(fs::path(path).parent_path().string());
    if (resume) done = ckpt.load(path, {.loader = &loader, .rng = false});
    for (int64_t epoch = loader.epoch(); epoch < 3; ++epoch) {
      loader.set_epoch(epoch);
      for (data::Batch& b : loader) {
        const std::vector<double> v = values_of(b.inputs);
        seen.insert(seen.end(), v.begin(), v.end());
        if (++done == stop_after) {
          ckpt.save(done, {.loader = &loader, .rng = false});
          return seen;
        }
      }
    }
    return seen;
  };
  ScratchDir dir("probe_resume_readme");
  data::TensorDataset ds(from_vector(random_values(10, 2), {10, 1}, kFloat32),
                         from_vector(std::vector<int64_t>(10, 0), {10}));
  const data::DataLoaderOptions o{.batch_size = 3, .shuffle = true, .seed = 9};
  const std::string path = (dir.path / "ckpt-00000005.safetensors").string();
  data::DataLoader whole(ds, o), first(ds, o), second(ds, o);
  const std::vector<double> all = samples(whole, -1, path, false);
  REQUIRE(all.size() == 30);
  std::vector<double> joined = samples(first, 5, path, false);  // 4 batches an epoch: stops in epoch 1
  const std::vector<double> rest = samples(second, -1, path, true);
  joined.insert(joined.end(), rest.begin(), rest.end());
  CHECK(joined == all);
}

TEST_CASE("probe resume: a dropout model's masks after resume are the uninterrupted run's") {
  // The generator state alone, against an independent reference: the masks drawn by the
  // resumed run's forward are those the uninterrupted run drew at the same steps.
  ScratchDir dir("probe_resume_rng");
  auto masks = [](Net& net, int n) {
    std::vector<double> out;
    for (int i = 0; i < n; ++i) {
      const std::vector<double> v = values_of((*net.drop)(ones({2, 16})));
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  manual_seed(21);
  Net a;
  const std::vector<double> want = tail(masks(a, 5), 2 * 2 * 16);
  manual_seed(21);
  Net b;
  (void)masks(b, 2);
  train::CheckpointManager ckpt(dir.path.string());
  ckpt.save(2, {.model = &b});
  manual_seed(5);
  Net c;
  ckpt.resume({.model = &c});
  const std::vector<double> got = masks(c, 3);
  CHECK(got == want);
  CHECK(std::count(got.begin(), got.end(), 0.0) > 0);  // some units were dropped
}

// ============================================================================================
// Files that must be refused, and loads and saves that fail half-way
// ============================================================================================

namespace {

// Everything a load could change, to check that a refused one changed nothing.
struct Snapshot {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> model, opt, sched;
  double scale = 0;
  int64_t tracker = 0, epoch = 0, batch = 0;
  uint64_t seed = 0, offset = 0;
  explicit Snapshot(const Run& r)
      : model(model_bytes(*r.net)),
        opt(bytes_of_dict(r.opt->state_dict())),
        sched(bytes_of_dict(r.sched->state_dict())),
        scale(r.scaler.get_scale()),
        tracker(r.scaler.get_growth_tracker()),
        epoch(r.loader->position().epoch),
        batch(r.loader->position().batch),
        seed(default_generator().seed()),
        offset(default_generator().offset()) {}
  bool operator==(const Snapshot&) const = default;
};

// A run of `cfg` after `k` micro-steps, saved by `ckpt`; returns the file.
std::string saved_run(train::CheckpointManager& ckpt, const Config& cfg, int64_t k) {
  Run run(cfg, 3);
  run.micro_steps(k);
  return ckpt.save(k, run.state());
}

// A run of `cfg` that has taken 2 steps of its own (so it has state to lose).
std::unique_ptr<Run> target_run(const Config& cfg) {
  auto run = std::make_unique<Run>(cfg, 77);
  run->micro_steps(2);
  return run;
}

}  // namespace

TEST_CASE("probe resume: a truncated or corrupted checkpoint is refused naming the file, and changes nothing") {
  ScratchDir dir("probe_resume_corrupt");
  train::CheckpointManager ckpt(dir.path.string());
  const Config cfg{.opt = Opt::AdamWAmsgrad};
  const std::string path = saved_run(ckpt, cfg, 5);
  const std::string whole = read_file(path);
  auto target = target_run(cfg);
  const Snapshot before(*target);

  for (size_t cut : {size_t(0), size_t(7), size_t(100), whole.size() / 2, whole.size() - 1}) {
    CAPTURE(cut);
    write_file(path, whole.substr(0, cut));
    check_error([&] { ckpt.load(path, target->state()); }, {path});
    CHECK(Snapshot(*target) == before);
  }
  // A flipped bit in the tensor data (not the header): the values would load as other numbers.
  const nn::SafetensorsFile good = nn::parse_safetensors(reinterpret_cast<const uint8_t*>(whole.data()), whole.size());
  uint64_t header = 0;
  std::memcpy(&header, whole.data(), 8);
  for (size_t at : {size_t(8 + header), size_t(8 + header + 37), whole.size() - 1}) {
    CAPTURE(at);
    std::string bad = whole;
    bad[at] = char(uint8_t(bad[at]) ^ 0x10);
    write_file(path, bad);
    check_error([&] { ckpt.load(path, target->state()); }, {path, "corrupt"});
    CHECK(Snapshot(*target) == before);
  }
  write_file(path, whole);
  CHECK(ckpt.load(path, target->state()) == 5);  // the file itself was good
  (void)good;
}

TEST_CASE(
    "probe resume: a checkpoint of another model, optimizer, param count or loader is refused, changing nothing") {
  ScratchDir dir("probe_resume_wrong");
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 0});
  const Config adamw{.opt = Opt::AdamWAmsgrad};
  auto target = target_run(adamw);
  // Throws naming `parts`, with `target` and the generator as they were.
  auto refused = [&](const std::string& path, const train::TrainState& state, const std::vector<std::string>& parts) {
    const Snapshot before(*target);
    check_error([&] { ckpt.load(path, state); }, parts);
    CHECK(Snapshot(*target) == before);
  };

  SUBCASE("another optimizer type with the same keys (Adam's L2 decay is not AdamW's)") {
    const std::string path = saved_run(ckpt, {.opt = Opt::Adam}, 4);
    refused(path, target->state(), {path, "Adam", "AdamW"});
  }
  SUBCASE("another optimizer type with other keys") {
    const std::string path = saved_run(ckpt, {.opt = Opt::SGD}, 4);
    refused(path, target->state(), {path, "SGD", "AdamW"});
  }
  SUBCASE("another parameter count (the model matches, the optimizer does not)") {
    Run other(adamw, 3);
    auto opt = std::make_unique<optim::AdamW>(
        std::vector<optim::ParamGroup>{{.params = {other.net->fc1->weight, other.net->fc2->weight}}},
        optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
    other.net->fc1->weight.set_grad(ones({16, 8}));
    opt->step();
    train::TrainState s = other.state();
    s.optimizer = opt.get();
    s.scheduler = nullptr;
    const std::string path = ckpt.save(4, s);
    train::TrainState t = target->state();
    t.scheduler = nullptr;
    refused(path, t, {path, "param groups"});
  }
  SUBCASE("another model") {
    nn::Linear other(8, 4);
    const std::string path = ckpt.save(4, {.model = &other, .rng = false});
    refused(path, {.model = target->net.get(), .rng = false}, {path, "fc1.weight", "missing"});
  }
  SUBCASE("a loader over other data or in other batches: the position would name other samples") {
    const std::string path = saved_run(ckpt, adamw, 3);  // epoch 0, batch 3
    for (const data::DataLoaderOptions& o : {data::DataLoaderOptions{.batch_size = 5, .shuffle = true, .seed = 5},
                                             data::DataLoaderOptions{.batch_size = 4, .shuffle = true, .seed = 6},
                                             data::DataLoaderOptions{.batch_size = 4, .shuffle = false, .seed = 5}}) {
      CAPTURE(o.batch_size);
      CAPTURE(o.seed);
      data::DataLoader loader(target->data, o);
      train::TrainState t = target->state();
      t.loader = &loader;
      refused(path, t, {path, "loader"});
      CHECK(loader.position().batch == 0);
    }
    // The same loader over a dataset of another size.
    data::TensorDataset fewer(from_vector(random_values(20 * 8, 1), {20, 8}, kFloat32),
                              from_vector(std::vector<int64_t>(20, 0), {20}));
    data::DataLoader loader(fewer, {.batch_size = 4, .shuffle = true, .seed = 5});
    train::TrainState t = target->state();
    t.loader = &loader;
    refused(path, t, {path, "loader", "26", "20"});
  }
  SUBCASE("a position past the loader's end (a last part that fails after the others loaded)") {
    const std::string path = saved_run(ckpt, adamw, 6);                                    // epoch 0, batch 6
    data::DataLoader loader(target->data, {.batch_size = 8, .shuffle = true, .seed = 5});  // 4 batches
    train::TrainState t = target->state();
    t.loader = &loader;
    refused(path, t, {path, "loader"});
  }
  SUBCASE("another schedule, or the same schedule with other settings (Note [A checkpoint names its schedule])") {
    const std::string step = saved_run(ckpt, {.opt = Opt::AdamWAmsgrad, .sched = Sched::Step}, 4);
    refused(step, target->state(),
            {step, "StepLR(step_size=2, gamma=0.7)",
             "WarmupCosineLR(warmup_steps=3, total_steps=12, start_factor=0.1, eta_min=0)"});
    // --epochs edited before resuming: the cosine would jump to another curve mid-run.
    const std::string path = saved_run(ckpt, adamw, 4);
    optim::WarmupCosineLR longer(*target->opt, {.warmup_steps = 3, .total_steps = 24, .start_factor = 0.1});
    train::TrainState t = target->state();
    t.scheduler = &longer;
    refused(path, t, {path, "total_steps=12", "total_steps=24"});
    CHECK(longer.last_epoch() == 0);
  }
  SUBCASE("a scheduler state the scheduler refuses, after model and optimizer are fine") {
    Run other(adamw, 3);
    other.micro_steps(3);
    const std::string path = ckpt.save(3, other.state());
    nn::SafetensorsFile f = nn::load_safetensors(path);
    f.tensors["scheduler.last_epoch"] = from_vector(std::vector<int64_t>{-4}, Shape{});
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [k, t] : f.tensors) tensors.emplace_back(k, t);
    f.metadata.erase("checksum");  // as a file saved before checksums: only the scheduler can tell
    nn::save_safetensors(path, tensors, f.metadata);
    refused(path, target->state(), {path, "last_epoch"});
  }
}

TEST_CASE("probe resume: a scheduler's dict names its schedule; erased or absent, it loads unchecked") {
  Tensor w = zeros({2}).requires_grad_(true);
  optim::SGD opt(std::vector<Tensor>{w}, {.lr = 0.1});
  auto warm = std::make_shared<optim::LinearLR>(opt, optim::LinearLROptions{.start_factor = 0.25, .total_iters = 4});
  auto cosine = std::make_shared<optim::CosineAnnealingLR>(opt, optim::CosineAnnealingLROptions{.T_max = 90});
  optim::SequentialLR saved(opt, {warm, cosine}, {4});
  for (int i = 0; i < 6; ++i) saved.step();
  CHECK(saved.schedule() ==
        "SequentialLR(milestones=[4], schedulers=[LinearLR(start_factor=0.25, end_factor=1, total_iters=4), "
        "CosineAnnealingLR(T_max=90, eta_min=0)])");
  const optim::StateDict dict = saved.state_dict();

  // Settings that differ in the last digit of a double are other settings.
  optim::StepLR step(opt, {.step_size = 3, .gamma = 0.1});
  optim::StepLR near(opt, {.step_size = 3, .gamma = std::nextafter(0.1, 1.0)});
  CHECK(step.schedule() == "StepLR(step_size=3, gamma=0.1)");
  CHECK(near.schedule() != step.schedule());
  step.load_state_dict(step.state_dict());  // its own dict loads
  check_error([&] { near.load_state_dict(step.state_dict()); }, {"StepLR(step_size=3, gamma=0.1)", "construct"});
  check_error([&] { step.load_state_dict(dict); }, {"SequentialLR(milestones=[4]", "StepLR(step_size=3"});
  CHECK(step.last_epoch() == 0);

  // Erased on purpose (or a dict saved before the entry existed): the epoch and base lrs load.
  optim::StateDict erased;
  for (const auto& [k, t] : dict)
    if (k != "schedule") erased.emplace_back(k, t);
  step.load_state_dict(erased);
  CHECK(step.last_epoch() == 6);
  CHECK(opt.param_groups()[0].lr == doctest::Approx(0.1 * std::pow(0.1, 2)));  // StepLR's own curve at t = 6

  // A user's scheduler that does not describe itself is not checked, nor a SequentialLR holding one.
  struct Halving : optim::LRScheduler {
    explicit Halving(optim::Optimizer& o) : LRScheduler(o) { initial_step(); }
    double lr_at(double base_lr, int64_t t) const override { return base_lr * std::pow(0.5, double(t)); }
  };
  auto mine = std::make_shared<Halving>(opt);
  CHECK(mine->schedule().empty());
  mine->load_state_dict(dict);
  CHECK(mine->last_epoch() == 6);
  optim::SequentialLR mixed(opt, {warm, mine}, {4});
  CHECK(mixed.schedule().empty());
  mixed.load_state_dict(step.state_dict());
}

TEST_CASE("probe resume: generators besides the default one resume their streams when named; unnamed, refused") {
  ScratchDir dir("probe_resume_generators");
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 0});
  // A model whose dropout draws from its own generators (as TensorParallelRng's streams do).
  auto masks = [](Generator& a, Generator& b, int steps) {
    std::vector<std::vector<double>> out;
    for (int i = 0; i < steps; ++i) {
      out.push_back(values_of(dropout(ones({64}), 0.5, true, &a)));
      out.push_back(values_of(dropout(ones({16}), 0.3, true, &b)));
    }
    return out;
  };
  Generator a(11), b(12);
  const auto straight = masks(a, b, 5);

  Generator a1(11), b1(12);
  masks(a1, b1, 2);
  const std::string path = ckpt.save(2, {.rng = false, .generators = {{"drop.a", &a1}, {"drop.b", &b1}}});
  Generator a2(99), b2(98);  // a fresh process: the streams as constructed, other seeds even
  REQUIRE(ckpt.load(path, {.rng = false, .generators = {{"drop.a", &a2}, {"drop.b", &b2}}}) == 2);
  CHECK(a2.seed() == 11);
  CHECK(b2.offset() == b1.offset());
  const auto resumed = masks(a2, b2, 3);
  CHECK(resumed == std::vector<std::vector<double>>(straight.begin() + 4, straight.end()));

  // A run that does not name a saved stream would draw its first masks again: refused, unchanged.
  Generator a3(5);
  check_error([&] { ckpt.load(path, {.rng = false, .generators = {{"drop.a", &a3}}}); },
              {path, "'drop.b'", "TrainState::generators"});
  CHECK(a3.offset() == 0);
  CHECK(a3.seed() == 5);
  // A name the file lacks, and names that cannot be keys.
  check_error([&] { ckpt.load(path, {.rng = false, .generators = {{"drop.a", &a3}, {"drop.b", &b2}, {"c", &b1}}}); },
              {path, "rng.c.seed"});
  check_error([&] { ckpt.save(3, {.rng = false, .generators = {{"x", &a1}, {"x", &b1}}}); }, {"'x' twice"});
  check_error([&] { ckpt.save(3, {.rng = false, .generators = {{"", &a1}}}); }, {"name"});
  check_error([&] { ckpt.save(3, {.generators = {{"d", &default_generator()}}}); }, {"default generator"});
}

TEST_CASE("probe resume: a save that fails half-way leaves the previous checkpoint and prunes nothing") {
  ScratchDir dir("probe_resume_save");
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 1});
  Run run({.opt = Opt::SGD}, 3);
  run.micro_steps(2);
  const std::string good = ckpt.save(2, run.state());
  const std::string good_bytes = read_file(good);
  run.micro_steps(2);
  // A buffer of a diverged run: the save is refused after the tensors were gathered.
  run.net->add_inf_buffer();
  check_error([&] { ckpt.save(4, run.state()); }, {"model.flags", "inf or NaN"});
  CHECK(read_file(good) == good_bytes);
  REQUIRE(ckpt.list().size() == 1);
  CHECK(ckpt.list()[0].step == 2);
  for (const auto& e : fs::directory_iterator(dir.path))
    CHECK_MESSAGE(e.path().filename().string().find(".tmp.") == std::string::npos, "left a temporary ", e.path());
  if (::geteuid() != 0) {  // root writes anywhere
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
    check_error([&] { ckpt.save(6, run.state()); }, {ckpt.path_for(6)});
    fs::permissions(dir.path, fs::perms::owner_all);
    CHECK(read_file(good) == good_bytes);
  }
}
