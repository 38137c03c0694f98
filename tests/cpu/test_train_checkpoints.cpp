// train::CheckpointManager (train/checkpoints.h): a run stopped after k steps and resumed
// from its checkpoint ends bit for bit where the uninterrupted run ends (Note [Resumable
// checkpoint]: model, optimizer, GradScaler, LR schedule, RNG and data position); keep_last
// prunes the oldest files; a failed save leaves the previous checkpoints as they were; resume()
// falls back past damaged checkpoints, but not past one that does not fit the run.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "autograd/ops/all.h"
#include "golden_dir.h"  // FRUGAL_GOLDEN_DIR (tests/meson.build)
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/ops/random.h"
#include "tensor/random.h"
#include "tests/test_util.h"
#include "train/checkpoints.h"

using namespace frugal;
using namespace frugal::testing;
namespace fs = std::filesystem;

namespace {

std::vector<double> weights_of(const nn::Module& m) {
  std::vector<double> all;
  for (const Tensor& p : m.parameters()) {
    const std::vector<double> v = values_of(p);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// Everything a step depends on: an MLP with dropout (the RNG), Adam, a GradScaler whose scale
// grows every 2 steps, a per-step StepLR and a shuffling loader of 4 batches an epoch.
struct Run {
  data::TensorDataset data;
  std::shared_ptr<nn::Sequential> model = std::make_shared<nn::Sequential>();
  std::unique_ptr<optim::Adam> opt;
  optim::GradScaler scaler{{.init_scale = 1024.0, .growth_interval = 2}};
  std::unique_ptr<optim::StepLR> schedule;
  std::unique_ptr<data::DataLoader> loader;

  explicit Run(uint64_t init_seed)
      : data(from_vector(random_values(40 * 8, 11), {40, 8}, kFloat32),
             from_vector(std::vector<int64_t>{0, 1, 2, 3, 1, 2, 3, 0, 2, 3, 0, 1, 3, 0, 1, 2, 0, 1, 2, 3,
                                              3, 2, 1, 0, 0, 1, 2, 3, 1, 0, 3, 2, 2, 3, 0, 1, 0, 2, 1, 3},
                         {40})) {
    manual_seed(init_seed);
    for (auto m : std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
             std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.3),
             std::make_shared<nn::Linear>(16, 4)})
      model->push_back(m);
    opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-2});
    schedule = std::make_unique<optim::StepLR>(*opt, optim::StepLROptions{.step_size = 3, .gamma = 0.5});
    loader =
        std::make_unique<data::DataLoader>(data, data::DataLoaderOptions{.batch_size = 10, .shuffle = true, .seed = 7});
  }
  train::TrainState state() {
    return {.model = model.get(),
            .optimizer = opt.get(),
            .scaler = &scaler,
            .scheduler = schedule.get(),
            .loader = loader.get()};
  }
  void steps(int64_t n) {
    data::Batch b;
    for (int64_t done = 0; done < n;) {
      if (!loader->next(b)) continue;  // an epoch ended: the next call starts the next one
      Tensor loss = cross_entropy((*model)(b.inputs), b.targets);
      opt->zero_grad();
      scaler.scale(loss).backward();
      scaler.step(*opt);
      scaler.update();
      schedule->step();
      ++done;
    }
  }
};

}  // namespace

TEST_CASE("CheckpointManager: k steps + save + resume + the rest == the uninterrupted run, bit for bit") {
  ScratchDir dir("frugal_ckpt_resume");
  const int64_t total = 11;
  Run straight(3);
  straight.steps(total);
  const uint64_t rng_after = default_generator().offset();  // dropout drew from it

  for (int64_t k : {2, 4, 6}) {  // mid-epoch, at an epoch's end, mid-epoch of the second
    CAPTURE(k);
    Run first(3);
    first.steps(k);
    train::CheckpointManager ckpt(dir.path.string());
    ckpt.save(k, first.state(), {{"note", "k steps"}});
    // Draws after the save (which the resumed run must not see) and another seed.
    ops::uniform_(zeros({100}), 0.0, 1.0);

    Run resumed(99);
    CHECK(weights_of(*resumed.model) != weights_of(*first.model));
    REQUIRE(ckpt.resume(resumed.state()) == k);
    CHECK(ckpt.metadata(ckpt.path_for(k)).at("note") == "k steps");
    resumed.steps(total - k);
    CHECK(weights_of(*resumed.model) == weights_of(*straight.model));
    CHECK(resumed.scaler.get_scale() == straight.scaler.get_scale());
    CHECK(resumed.opt->param_groups()[0].lr == straight.opt->param_groups()[0].lr);
    CHECK(default_generator().offset() == rng_after);
    CHECK(default_generator().seed() == 3);
  }
  CHECK(straight.scaler.get_scale() > 1024.0);  // the scale grew: its state mattered
}

TEST_CASE("CheckpointManager: keep_last keeps the newest k files and touches no other file") {
  ScratchDir dir("frugal_ckpt_keep");
  std::ofstream(dir.path / "notes.txt") << "mine";
  std::ofstream(dir.path / "ckpt-abc.safetensors") << "not a checkpoint";
  std::ofstream(dir.path / "ckpt-1.safetensors") << "x";  // digits, but not a name save() gives
  std::ofstream(dir.path / "ckpt-000000007.safetensors") << "x";
  Run run(1);
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 2});
  CHECK(!ckpt.latest());
  for (int64_t step : {5, 10, 15, 20, 100}) ckpt.save(step, run.state());
  const std::vector<train::CheckpointFile> files = ckpt.list();
  REQUIRE(files.size() == 2);
  CHECK(files[0].step == 20);
  CHECK(files[1].step == 100);
  CHECK(files[1].path == (dir.path / "ckpt-00000100.safetensors").string());
  for (int64_t gone : {5, 10, 15}) CHECK(!fs::exists(ckpt.path_for(gone)));
  CHECK(read_file((dir.path / "notes.txt").string()) == "mine");
  CHECK(fs::exists(dir.path / "ckpt-abc.safetensors"));
  CHECK(fs::exists(dir.path / "ckpt-1.safetensors"));
  CHECK(fs::exists(dir.path / "ckpt-000000007.safetensors"));
  CHECK(ckpt.latest()->step == 100);

  train::CheckpointManager all(dir.path.string(), {.keep_last = 0, .prefix = "all"});
  for (int64_t step = 0; step < 4; ++step) all.save(step, {.model = run.model.get()});
  CHECK(all.list().size() == 4);
  CHECK(ckpt.list().size() == 2);  // another prefix: another run
}

TEST_CASE("CheckpointManager: a failed save throws naming the file and leaves the previous checkpoint") {
  ScratchDir dir("frugal_ckpt_fail");
  Run run(2);
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 1});
  const std::string good = ckpt.save(1, run.state());
  const std::string good_bytes = read_file(good);

  if (::geteuid() != 0) {  // root writes anywhere
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
    check_error([&] { ckpt.save(2, run.state()); }, {"CheckpointManager::save", ckpt.path_for(2), "is not writable"});
    fs::permissions(dir.path, fs::perms::owner_all);
    CHECK(read_file(good) == good_bytes);
  }
  // A directory that is gone: the error names it.
  train::CheckpointManager missing((dir.path / "no_such_dir").string());
  check_error([&] { missing.save(1, run.state()); }, {"CheckpointManager::save", "no_such_dir' does not exist"});

  // Weights gone NaN: refused, and keep_last = 1 did not prune the good file.
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : run.model->state_dict()) state[name] = t;
  state["3.bias"] = from_vector(std::vector<float>{0, NAN, 0, 0}, {4});
  run.model->load_state_dict(state);
  check_error([&] { ckpt.save(2, run.state()); },
              {"not saving " + ckpt.path_for(2), "'model.3.bias' holds inf or NaN"});
  CHECK(!fs::exists(ckpt.path_for(2)));
  CHECK(read_file(good) == good_bytes);
  CHECK(ckpt.list().size() == 1);
}

TEST_CASE("CheckpointManager: load checks that the file holds each part asked for, before loading any") {
  ScratchDir dir("frugal_ckpt_parts");
  Run saved(4), other(5);
  train::CheckpointManager ckpt(dir.path.string());
  const std::string path = ckpt.save(3, {.model = saved.model.get(), .optimizer = saved.opt.get()});
  const std::vector<double> before = weights_of(*other.model);
  check_error([&] { ckpt.load(path, other.state()); }, {"CheckpointManager::load: " + path, "no GradScaler state"});
  CHECK(weights_of(*other.model) == before);
  CHECK(ckpt.load(path, {.model = other.model.get(), .optimizer = other.opt.get(), .rng = false}) == 3);
  CHECK(weights_of(*other.model) == weights_of(*saved.model));

  nn::save_safetensors(path, {{"model.x", zeros({1})}});
  check_error([&] { ckpt.load(path, other.state()); }, {"has no 'step' metadata"});
  check_error([&] { ckpt.save(-1, other.state()); }, {"CheckpointManager::save: step must be in [0, 10^18), got -1"});
  check_error([] { train::CheckpointManager("d", {.prefix = "a/b"}); }, {"prefix 'a/b'"});
}

TEST_CASE("DataLoader: position() and set_position() resume a pass at its batch") {
  Run a(1), b(1);
  data::Batch x, y;
  for (int i = 0; i < 3; ++i) a.loader->next(x);
  CHECK(a.loader->position().epoch == 0);
  CHECK(a.loader->position().batch == 3);
  a.loader->next(x);
  CHECK(a.loader->position().epoch == 1);  // the pass is done: the next starts epoch 1
  CHECK(a.loader->position().batch == 0);
  CHECK(!a.loader->next(x));  // the end of epoch 0
  a.loader->next(x);
  a.loader->next(x);  // epoch 1, batch 1
  b.loader->set_position({1, 1});
  b.loader->next(y);
  CHECK(values_of(x.inputs) == values_of(y.inputs));
  check_error([&] { b.loader->set_position({0, 5}); }, {"DataLoader::set_position: batch 5 is outside [0, 4]"});
}

// ---- resume() past damaged checkpoints (Note [Resume falls back past damaged checkpoints]) ----

namespace {

// What a resume restores, bit for bit: parameters, Adam's state, scale, lr, schedule, loader, RNG.
struct Snapshot {
  std::vector<std::vector<uint8_t>> tensors;
  double scale, lr;
  int64_t epoch, batch;
  uint64_t seed, offset;
  explicit Snapshot(Run& r)
      : scale(r.scaler.get_scale()),
        lr(r.opt->param_groups()[0].lr),
        epoch(r.loader->position().epoch),
        batch(r.loader->position().batch),
        seed(default_generator().seed()),
        offset(default_generator().offset()) {
    for (const Tensor& p : r.model->parameters()) tensors.push_back(testing::bytes_of(p));
    for (const auto& [name, t] : r.opt->state_dict()) tensors.push_back(testing::bytes_of(t));
    for (const auto& [name, t] : r.schedule->state_dict()) tensors.push_back(testing::bytes_of(t));
  }
  bool operator==(const Snapshot&) const = default;
};

// Runs `body` with stderr sent to a file; returns what it wrote there.
template <typename F>
std::string stderr_of(F&& body) {
  const std::string path = temp_path("frugal_stderr", ".txt");
  std::fflush(stderr);
  const int saved = ::dup(2);
  FILE* f = std::fopen(path.c_str(), "w");
  ::dup2(::fileno(f), 2);
  try {
    body();
  } catch (...) {
    std::fflush(stderr), ::dup2(saved, 2), ::close(saved), std::fclose(f);
    throw;
  }
  std::fflush(stderr), ::dup2(saved, 2), ::close(saved), std::fclose(f);
  const std::string text = read_file(path);
  std::remove(path.c_str());
  return text;
}

// Each way a file can be damaged; `whole` is what save() wrote.
enum class Damage { Truncated, FlippedByte, FlippedMetadata, Garbage, Empty };
void damage(const std::string& path, Damage how) {
  const std::string whole = read_file(path);
  uint64_t header = 0;
  std::memcpy(&header, whole.data(), 8);
  std::string bad = whole;
  switch (how) {
    case Damage::Truncated: bad = whole.substr(0, whole.size() / 2); break;
    case Damage::FlippedByte: bad[8 + header + 5] = char(uint8_t(bad[8 + header + 5]) ^ 0x04); break;  // the data
    case Damage::FlippedMetadata: {  // the optimizer's name: "Adam" -> "Aeam", in the header
      const size_t at = bad.find("\"Adam\"");
      REQUIRE(at < 8 + header);
      bad[at + 2] = char(uint8_t(bad[at + 2]) ^ 0x01);
      break;
    }
    case Damage::Garbage: bad = "this is not a safetensors file\n"; break;
    case Damage::Empty: bad.clear(); break;
  }
  write_file(path, bad);
}

}  // namespace

TEST_CASE("CheckpointManager: resume skips a damaged newest checkpoint and continues the older one bit for bit") {
  const int64_t total = 11;
  Run straight(3);
  straight.steps(total);
  const std::vector<std::pair<Damage, std::string>> cases = {{Damage::Truncated, "exceeds"},
                                                             {Damage::FlippedByte, "corrupt"},
                                                             {Damage::FlippedMetadata, "tensors and metadata hash"},
                                                             {Damage::Garbage, "header length"},
                                                             {Damage::Empty, "too short"}};
  for (const auto& [how, reason] : cases) {
    CAPTURE(int(how));
    ScratchDir dir("frugal_ckpt_fallback");
    train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 3});
    Run first(3);
    first.steps(4);
    const std::string older = ckpt.save(4, first.state());
    first.steps(2);
    const std::string newest = ckpt.save(6, first.state());
    damage(newest, how);
    const std::string bad_bytes = read_file(newest);

    Run resumed(99);
    train::ResumeResult r;
    const std::string warnings = stderr_of([&] { r = ckpt.resume(resumed.state(), {}); });
    REQUIRE(r.step == 4);
    CHECK(r.path == older);
    REQUIRE(r.skipped.size() == 1);
    CHECK(r.skipped[0].path == newest);
    CHECK(r.skipped[0].reason.find(newest) != std::string::npos);
    CHECK_MESSAGE(r.skipped[0].reason.find(reason) != std::string::npos, r.skipped[0].reason);
    CHECK(warnings.find("skipping damaged " + newest + ": " + r.skipped[0].reason + "\n") != std::string::npos);
    // Renamed aside, bytes kept: out of list()'s way.
    CHECK(r.skipped[0].moved_to == newest + ".damaged");
    CHECK(!fs::exists(newest));
    CHECK(read_file(newest + ".damaged") == bad_bytes);
    CHECK(ckpt.latest()->step == 4);

    // The state is a load of the older file itself, and continues as the uninterrupted run.
    const Snapshot after(resumed);
    Run direct(55);
    CHECK(ckpt.load(older, direct.state()) == 4);
    CHECK(Snapshot(direct) == after);
    resumed.steps(total - 4);
    CHECK(weights_of(*resumed.model) == weights_of(*straight.model));
    CHECK(resumed.scaler.get_scale() == straight.scaler.get_scale());
    CHECK(resumed.opt->param_groups()[0].lr == straight.opt->param_groups()[0].lr);
  }
}

TEST_CASE("CheckpointManager: a directory or an unreadable file named as the newest checkpoint") {
  ScratchDir dir("frugal_ckpt_fallback_dir");
  train::CheckpointManager ckpt(dir.path.string());
  Run first(3);
  first.steps(2);
  ckpt.save(2, first.state());
  fs::create_directory(ckpt.path_for(9));  // not a file: never a checkpoint to list() or prune
  Run resumed(99);
  const train::ResumeResult r = ckpt.resume(resumed.state(), {});
  CHECK(r.step == 2);
  CHECK(r.skipped.empty());
  CHECK(fs::is_directory(ckpt.path_for(9)));
  if (::geteuid() != 0) {  // root reads anything
    first.steps(1);
    const std::string locked = ckpt.save(3, first.state());
    fs::permissions(locked, fs::perms::none);
    Run again(98);
    train::ResumeResult s;
    stderr_of([&] { s = ckpt.resume(again.state(), {}); });
    CHECK(s.step == 2);
    REQUIRE(s.skipped.size() == 1);
    CHECK(s.skipped[0].reason.find("Permission denied") != std::string::npos);
    CHECK(fs::exists(locked + ".damaged"));
  }
}

TEST_CASE("CheckpointManager: resume past two damaged checkpoints; every one damaged is an error naming each") {
  ScratchDir dir("frugal_ckpt_fallback_many");
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 0});
  Run first(3);
  for (int64_t step : {2, 4, 6, 8}) {
    first.steps(2);
    ckpt.save(step, first.state());
  }
  damage(ckpt.path_for(8), Damage::Truncated);
  damage(ckpt.path_for(6), Damage::FlippedByte);
  {
    Run resumed(99);
    train::ResumeResult r;
    stderr_of([&] { r = ckpt.resume(resumed.state(), {}); });
    CHECK(r.step == 4);
    REQUIRE(r.skipped.size() == 2);
    CHECK(r.skipped[0].path == ckpt.path_for(8));  // newest first
    CHECK(r.skipped[1].path == ckpt.path_for(6));
    CHECK(r.skipped[1].reason.find("corrupt") != std::string::npos);
    const std::vector<train::CheckpointFile> left = ckpt.list();
    REQUIRE(left.size() == 2);
    CHECK(left.back().step == 4);
  }
  // Now 2 and 4 damaged as well: an error listing every file and why, nothing changed or renamed.
  damage(ckpt.path_for(4), Damage::Garbage);
  damage(ckpt.path_for(2), Damage::Empty);
  write_file(ckpt.path_for(8), "x");  // a new damaged newest beside the .damaged one
  Run target(77);
  target.steps(1);
  const Snapshot before(target);
  stderr_of([&] {
    check_error([&] { ckpt.resume(target.state()); },
                {"CheckpointManager::resume: every checkpoint in " + dir.path.string() + " is damaged",
                 "\n  " + ckpt.path_for(8) + ": ", "\n  " + ckpt.path_for(4) + ": ", "\n  " + ckpt.path_for(2) + ": "});
  });
  CHECK(Snapshot(target) == before);
  CHECK(ckpt.list().size() == 3);
  CHECK(!fs::exists(ckpt.path_for(4) + ".damaged"));
}

TEST_CASE("CheckpointManager: an intact newest checkpoint that does not fit the run is an error, not a fallback") {
  ScratchDir dir("frugal_ckpt_fallback_misfit");
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 0});
  Run first(3);
  first.steps(2);
  ckpt.save(2, first.state(), {{"model", "mlp"}});
  first.steps(2);
  // Step 4 from a run whose loader has other batches (its position would name other samples).
  data::DataLoader other_loader(first.data, {.batch_size = 5, .shuffle = true, .seed = 7});
  train::TrainState other = first.state();
  other.loader = &other_loader;
  const std::string misfit = ckpt.save(4, other, {{"model", "mlp"}});
  const std::string damaged = ckpt.save(6, first.state(), {{"model", "mlp"}});
  damage(damaged, Damage::Truncated);

  Run target(77);
  target.steps(1);
  const Snapshot before(target);
  stderr_of([&] { check_error([&] { ckpt.resume(target.state()); }, {misfit, "loader", "batch_size"}); });
  CHECK(Snapshot(target) == before);
  CHECK(fs::exists(damaged));  // not renamed: nothing was resumed
  CHECK(ckpt.list().size() == 3);

  // Metadata the run expects, on the newest intact file: the same, not a fallback.
  fs::remove(misfit);
  stderr_of([&] {
    check_error(
        [&] {
          ckpt.resume(target.state(), {.expect_metadata = {{"model", "cnn"}}});
        },
        {ckpt.path_for(2), "model = \"mlp\"", "expects \"cnn\""});
    check_error(
        [&] {
          ckpt.resume(target.state(), {.expect_metadata = {{"size", "big"}}});
        },
        {ckpt.path_for(2), "no metadata 'size'"});
  });
  CHECK(Snapshot(target) == before);
  train::ResumeResult r;
  stderr_of([&] { r = ckpt.resume(target.state(), {.expect_metadata = {{"model", "mlp"}}}); });
  CHECK(r.step == 2);
}

TEST_CASE("CheckpointManager: after a fallback, the run's saves and keep_last see no damaged file") {
  ScratchDir dir("frugal_ckpt_fallback_prune");
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 2});
  Run first(3);
  for (int64_t step : {2, 4, 6}) {
    first.steps(2);
    ckpt.save(step, first.state());
  }
  damage(ckpt.path_for(6), Damage::FlippedByte);
  write_file(ckpt.path_for(6) + ".damaged", "an earlier one");  // never overwritten
  Run resumed(99);
  train::ResumeResult r;
  stderr_of([&] { r = ckpt.resume(resumed.state(), {}); });
  REQUIRE(r.step == 4);
  CHECK(r.skipped.at(0).moved_to == ckpt.path_for(6) + ".damaged.1");
  CHECK(read_file(ckpt.path_for(6) + ".damaged") == "an earlier one");

  // The resumed run saves 5: keep_last 2 keeps 4 and 5 (a damaged 6 would have pushed out 4),
  // and says nothing of a later step.
  resumed.steps(1);
  const std::string warnings = stderr_of([&] { ckpt.save(5, resumed.state()); });
  CHECK(warnings.empty());
  std::vector<train::CheckpointFile> files = ckpt.list();
  REQUIRE(files.size() == 2);
  CHECK(files[0].step == 4);
  CHECK(files[1].step == 5);
  resumed.steps(1);
  ckpt.save(6, resumed.state());  // a new step 6, written over nothing
  files = ckpt.list();
  REQUIRE(files.size() == 2);
  CHECK(files[0].step == 5);
  CHECK(files[1].step == 6);
  CHECK(fs::exists(ckpt.path_for(6) + ".damaged.1"));  // left for a look; never pruned

  Run again(98);
  train::ResumeResult s = ckpt.resume(again.state(), {});
  CHECK(s.step == 6);
  CHECK(s.skipped.empty());
  CHECK(Snapshot(again) == Snapshot(resumed));
}

// A probe of 2026-12-05: a newest file whose metadata says another step than its name (a
// flipped bit in the header, an older checkpoint copied over it) resumed at that step with the
// file's weights, and list() and keep_last still ranked it by its name. It is damaged now.
TEST_CASE("CheckpointManager: a checkpoint whose metadata step is not its name's is skipped as damaged") {
  ScratchDir dir("frugal_ckpt_step_name");
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 3});
  Run first(3);
  first.steps(2);
  const std::string older = ckpt.save(2, first.state());
  first.steps(3);
  const std::string newest = ckpt.save(5, first.state());
  fs::copy_file(older, newest, fs::copy_options::overwrite_existing);  // step 2's file named as step 5
  Run resumed(99);
  train::ResumeResult r;
  stderr_of([&] { r = ckpt.resume(resumed.state(), {}); });
  REQUIRE(r.step == 2);
  CHECK(r.path == older);
  REQUIRE(r.skipped.size() == 1);
  CHECK(r.skipped[0].path == newest);
  CHECK_MESSAGE(r.skipped[0].reason.find("its metadata says step 2 but its name says 5") != std::string::npos,
                r.skipped[0].reason);
  CHECK(!fs::exists(newest));
}

// Note [Checkpoint checksum]: the checksum covers the metadata too ("v2-..."); a file saved
// before that (tests/golden/checkpoint_v1_linear_sgd.safetensors: a Linear(3, 2) and SGD with
// momentum after two steps, its checksum of the tensors alone) still loads, checked as it was
// saved, and a file without a checksum loads with a warning.
TEST_CASE("CheckpointManager: the checksum covers the metadata; older files load checked as they were saved") {
  ScratchDir dir("frugal_ckpt_checksum");
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 0});
  auto fresh = [] {
    manual_seed(1);
    return std::make_shared<nn::Linear>(3, 2);
  };
  SUBCASE("a file of the first format") {
    const std::string path = ckpt.path_for(2);
    fs::copy_file(std::string(FRUGAL_GOLDEN_DIR) + "/checkpoint_v1_linear_sgd.safetensors", path);
    const std::string whole = read_file(path);
    REQUIRE(ckpt.metadata(path).at("checksum").size() == 16);  // bare hex: the tensors alone
    auto net = fresh();
    optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
    const std::vector<double> before = weights_of(*net);
    CHECK(ckpt.load(path, {.model = net.get(), .optimizer = &opt}) == 2);
    CHECK(weights_of(*net) != before);
    CHECK(ckpt.metadata(path).at("model_kind") == "linear3x2");

    uint64_t header = 0;
    std::memcpy(&header, whole.data(), 8);
    std::string bad = whole;
    bad[8 + header + 90] = char(uint8_t(bad[8 + header + 90]) ^ 0x08);  // model.weight's bytes
    write_file(path, bad);
    auto other = fresh();
    optim::SGD other_opt(other->parameters(), {.lr = 0.1, .momentum = 0.9});
    check_error([&] { ckpt.load(path, {.model = other.get(), .optimizer = &other_opt}); },
                {path, "is corrupt: its tensors hash to", "d69f1d245cd00980"});
    CHECK(weights_of(*other) == weights_of(*fresh()));
  }
  SUBCASE("a user's metadata value or the format mark flipped is damage; no checksum loads with a warning") {
    auto net = fresh();
    optim::SGD opt(net->parameters(), {.lr = 0.1});
    const std::string path = ckpt.save(3, {.model = net.get(), .optimizer = &opt}, {{"model_kind", "linear3x2"}});
    const std::string whole = read_file(path);
    CHECK(ckpt.metadata(path).at("checksum").starts_with("v2-"));
    for (const std::string& text : {std::string("linear3x2"), std::string("\"v2-")}) {
      CAPTURE(text);
      std::string bad = whole;
      const size_t at = bad.find(text);
      REQUIRE(at != std::string::npos);
      bad[at + 1] = char(uint8_t(bad[at + 1]) ^ 0x02);  // "lanear3x2" / "t2-..."
      write_file(path, bad);
      check_error([&] { ckpt.load(path, {.model = net.get(), .optimizer = &opt}); }, {path, "is corrupt"});
    }
    write_file(path, whole);
    nn::SafetensorsFile f = nn::load_safetensors(path);
    f.metadata.erase("checksum");
    std::vector<std::pair<std::string, Tensor>> tensors(f.tensors.begin(), f.tensors.end());
    nn::save_safetensors(path, tensors, f.metadata);
    int64_t step = -1;
    const std::string warning = stderr_of([&] { step = ckpt.load(path, {.model = net.get(), .optimizer = &opt}); });
    CHECK(step == 3);
    CHECK(warning == "CheckpointManager: " + path + " has no checksum (saved before frugal wrote one?); loading it " +
                         "unchecked\n");
  }
}
