// ZeRO-3 / fully sharded data parallel (parallel/fsdp.h) on the threads backend, 2 and 3
// ranks. Checked against one process running optim::AdamW on the whole batch (f32, 1e-5
// relative: check_equiv): losses and weights after each step, with units covering the model
// or leaving a root unit, with and without checkpointing (the recompute gathers again),
// gradient accumulation (with and without no_sync); per-rank bytes against Note [ZeRO-3]'s
// formulas; sharded save / resume and consolidated save round trips; misuse errors.
// The model (155 parameters; units of 56, 72 and 27) divides by neither 2 nor 3.
#include <doctest/doctest.h>

#include <filesystem>
#include <limits>
#include <map>
#include <string>

#include "autograd/autocast.h"
#include "autograd/meta.h"
#include "autograd/ops/all.h"
#include "models/vit.h"
#include "nn/checkpoint.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "parallel/fsdp.h"
#include "parallel/fsdp_checkpoint.h"
#include "parallel/thread_communicator.h"
#include "parallel/zero.h"
#include "tensor/factory.h"
#include "tensor/ops/fill.h"
#include "tests/cpu/parallel_test_util.h"
#include "tests/error_text.h"

using namespace frugal;
using namespace frugal::testing;
using CommPtr = std::shared_ptr<parallel::Communicator>;
using parallel::FullyShardedDataParallel;
using parallel::run_ranks;

namespace {

constexpr optim::AdamWOptions kOpts{.lr = 0.02, .weight_decay = 0.1};
constexpr optim::SGDOptions kSgd{.lr = 0.5};

/// data_parallel_mlp as child "net", its forward checkpointing every module but the last
/// (checkpoint_sequential with one module per segment), or plain.
class Net : public nn::UnaryModule {
 public:
  Net(std::shared_ptr<nn::Sequential> seq, bool checkpointed) : net(std::move(seq)), checkpointed_(checkpointed) {
    register_module("net", net);
  }
  Tensor forward(const Tensor& x) override {
    return checkpointed_ ? nn::checkpoint_sequential(*net, int64_t(net->size()), x) : (*net)(x);
  }
  std::shared_ptr<nn::Sequential> net;

 private:
  bool checkpointed_;
};

std::shared_ptr<Net> net_model(uint64_t seed, bool checkpointed = false) {
  return std::make_shared<Net>(data_parallel_mlp(seed), checkpointed);
}

/// p models built on the main thread (data_parallel_mlp seeds the process-wide generator):
/// rank 0's from `seed`, the others' from `seed` too, or from other seeds when `differ`.
std::vector<std::shared_ptr<Net>> net_models(int p, uint64_t seed, bool checkpointed = false, bool differ = false) {
  std::vector<std::shared_ptr<Net>> out;
  for (int r = 0; r < p; ++r) out.push_back(net_model(differ && r > 0 ? 1000 + uint64_t(r) : seed, checkpointed));
  return out;
}

bool fsdp_dtype_is_float(const std::map<std::string, Tensor>& state) {
  for (const auto& [name, t] : state)
    if (t.dtype() != kFloat32) return false;
  return true;
}

const std::vector<std::string> kAllUnits = {"net.0", "net.2", "net.4"};  // = modules_of_type(model, "Linear")
const std::vector<std::string> kWithRoot = {"net.0", "net.2"};           // net.4 is the root unit's

/// `model` sharded over `comm` with the units kWithRoot.
std::shared_ptr<FullyShardedDataParallel> sharded(const std::shared_ptr<Net>& model, const CommPtr& comm) {
  return std::make_shared<FullyShardedDataParallel>(model, comm, parallel::FullyShardOptions{.units = kWithRoot});
}

/// One process on the whole batch: the weights after each step (by name) and the losses.
struct Reference {
  std::vector<std::map<std::string, Tensor>> weights;
  std::vector<double> losses;
};
Reference reference_run(uint64_t seed, const Tensor& x, const Tensor& y, double loss_scale = 1.0) {
  auto ref = net_model(seed);
  optim::AdamW opt(ref->parameters(), kOpts);
  Reference out;
  for (int64_t s = 0; s < x.size(0); ++s) {
    Tensor loss = mse_loss(ref->forward(x[s]), y[s]);
    out.losses.push_back(loss.item<double>());
    mul(loss, loss_scale).backward();
    opt.step();
    opt.zero_grad();
    out.weights.push_back(as_map(ref->state_dict()));
  }
  return out;
}

}  // namespace

TEST_CASE("zero-3: losses and AdamW steps equal one process on the whole batch, with and without checkpointing") {
  for (int p : {2, 3})
    for (bool with_root : {false, true})
      for (bool checkpointed : {false, true}) {
        CAPTURE(p);
        CAPTURE(with_root);
        CAPTURE(checkpointed);
        const int64_t per_rank = 2, B = per_rank * p, steps = 3;
        const Tensor x = random_tensor({steps, B, 6}, kFloat32, 301), y = random_tensor({steps, B, 3}, kFloat32, 302);
        const Reference ref = reference_run(30, x, y);
        PerRank<std::vector<std::map<std::string, Tensor>>> weights(static_cast<size_t>(p));
        PerRank<std::vector<double>> losses(static_cast<size_t>(p));
        PerRank<int64_t> freed_numel(static_cast<size_t>(p), -1);
        // Rank 0 starts from the reference's weights, the others elsewhere: the broadcast fixes it.
        const auto models = net_models(p, 30, checkpointed, /*differ=*/true);
        run_ranks(p, [&](const CommPtr& comm) {
          const int r = comm->rank();
          const auto& model = models[size_t(r)];
          auto fsdp = std::make_shared<FullyShardedDataParallel>(
              model, comm, parallel::FullyShardOptions{.units = with_root ? kWithRoot : kAllUnits});
          optim::AdamW opt(fsdp->parameters(), kOpts);
          for (int64_t s = 0; s < steps; ++s) {
            Tensor loss = mse_loss(fsdp->forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank));
            if (s == 0)
              freed_numel[size_t(r)] = model->net->parameters()[2].numel();  // net.2.weight, freed after forward
            losses[size_t(r)].push_back(loss.item<double>());
            loss.backward();
            opt.step();
            opt.zero_grad();
            weights[size_t(r)].push_back(as_map(fsdp->full_state_dict()));
          }
        });
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          CHECK(freed_numel[size_t(r)] == 0);
          for (size_t s = 0; s < size_t(steps); ++s)
            check_weights(weights[size_t(r)][s], ref.weights[s], "step " + std::to_string(s));
        }
        for (size_t s = 0; s < size_t(steps); ++s) {
          double mean = 0;
          for (int r = 0; r < p; ++r) mean += losses[size_t(r)][s] / p;
          check_equiv(std::vector<double>{mean}, std::vector<double>{ref.losses[s]}, "loss");
        }
      }
}

TEST_CASE(
    "zero-3: a ViT with one unit per encoder block (checkpointed, or under a memory plan) trains as one process") {
  const int p = 2;
  const int64_t per_rank = 2, B = per_rank * p, steps = 3;
  const Tensor x = random_tensor({steps, B, 3, 8, 8}, kFloat32, 361), y = random_tensor({steps, B, 3}, kFloat32, 362);
  using nn::BlockMemory;
  struct Setup {
    const char* name;
    bool checkpointed;
    std::vector<BlockMemory> plan;  // empty: the config's (checkpoint_blocks)
  };
  // What nn::BlockPlanner chooses among, one choice per block (the lossless ones): each
  // replays or regenerates inside the unit's backward, where FSDP has gathered it again.
  const Setup setups[] = {
      {"plain", false, {}},
      {"checkpointed", true, {}},
      {"recompute / selective / checkpoint-recompute",
       false,
       {BlockMemory::Recompute, BlockMemory::Selective, BlockMemory::CheckpointRecompute}},
      {"offload / checkpoint-offload / checkpoint",
       false,
       {BlockMemory::Offload, BlockMemory::CheckpointOffload, BlockMemory::Checkpoint}},
  };
  for (const Setup& setup : setups) {
    CAPTURE(setup.name);
    const bool checkpointed = setup.checkpointed;
    const models::ViTConfig config{.image_size = 8,
                                   .patch_size = 4,
                                   .in_channels = 3,
                                   .num_layers = 3,
                                   .num_heads = 2,
                                   .hidden_dim = 8,
                                   .mlp_dim = 16,
                                   .num_classes = 3,
                                   .checkpoint_blocks = checkpointed};
    auto make = [&] {
      manual_seed(38);
      auto vit = std::make_shared<models::VisionTransformer>(config);
      if (!setup.plan.empty()) vit->memory_plan = nn::BlockMemoryPlan{setup.plan};
      return vit;
    };
    auto ref = make();
    std::vector<std::shared_ptr<models::VisionTransformer>> vits;
    for (int r = 0; r < p; ++r) vits.push_back(make());
    // SGD: the key projection's bias has an exactly zero gradient (softmax ignores a shift of
    // every score of a row), which AdamW would turn from rounding noise into lr-sized steps.
    optim::SGD ref_opt(ref->parameters(), kSgd);
    std::vector<std::map<std::string, Tensor>> want;
    for (int64_t s = 0; s < steps; ++s) {
      mse_loss(ref->forward(x[s]), y[s]).backward();
      ref_opt.step();
      ref_opt.zero_grad();
      want.push_back(as_map(ref->state_dict()));
    }
    PerRank<std::vector<std::map<std::string, Tensor>>> got(p);
    PerRank<std::vector<std::string>> units(p);
    PerRank<int> units_peak(p);
    run_ranks(p, [&](const CommPtr& comm) {
      const int r = comm->rank();
      units[size_t(r)] = parallel::modules_of_type(*vits[size_t(r)], "EncoderBlock");
      FullyShardedDataParallel fsdp(vits[size_t(r)], comm, {.units = units[size_t(r)]});
      optim::SGD opt(fsdp.parameters(), kSgd);
      for (int64_t s = 0; s < steps; ++s) {
        mse_loss(fsdp.forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank)).backward();
        opt.step();
        opt.zero_grad();
        got[size_t(r)].push_back(as_map(fsdp.full_state_dict()));
      }
      units_peak[size_t(r)] = fsdp.memory_report().gathered_units_peak;
    });
    for (int r = 0; r < p; ++r) {
      CHECK(units[size_t(r)].size() == 3);
      CHECK(units_peak[size_t(r)] == 2);
      for (size_t s = 0; s < size_t(steps); ++s)
        check_weights(got[size_t(r)][s], want[s], "ViT step " + std::to_string(s));
    }
  }
}

TEST_CASE("zero-3: gradient accumulation over 2 micro-batches per step (and under no_sync) equals the whole batch") {
  for (int p : {2, 3})
    for (bool no_sync : {false, true}) {
      CAPTURE(p);
      CAPTURE(no_sync);
      const int64_t micro = 2, per_mb = 2, B = p * micro * per_mb, steps = 2;
      const Tensor x = random_tensor({steps, B, 6}, kFloat32, 311), y = random_tensor({steps, B, 3}, kFloat32, 312);
      // Each rank sums `micro` micro-batch means; their mean over ranks is micro * the batch mean.
      const Reference ref = reference_run(31, x, y, double(micro));
      PerRank<std::vector<std::map<std::string, Tensor>>> weights(static_cast<size_t>(p));
      PerRank<int64_t> local_grad_bytes(static_cast<size_t>(p));
      const auto models = net_models(p, 31);
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        auto fsdp = sharded(models[size_t(r)], comm);
        optim::AdamW opt(fsdp->parameters(), kOpts);
        for (int64_t s = 0; s < steps; ++s) {
          const Tensor xr = rows(x[s], r, micro * per_mb), yr = rows(y[s], r, micro * per_mb);
          for (int64_t m = 0; m < micro; ++m) {
            auto run = [&] { mse_loss(fsdp->forward(rows(xr, m, per_mb)), rows(yr, m, per_mb)).backward(); };
            if (no_sync && m + 1 < micro) {
              auto guard = fsdp->no_sync();
              run();
              local_grad_bytes[size_t(r)] = fsdp->memory_report().param_grad_bytes;  // full .grad, kept locally
            } else {
              run();
            }
          }
          opt.step();
          opt.zero_grad();
          weights[size_t(r)].push_back(as_map(fsdp->full_state_dict()));
        }
      });
      for (int r = 0; r < p; ++r) {
        CHECK(local_grad_bytes[size_t(r)] == (no_sync ? 155 * 4 : 0));
        for (size_t s = 0; s < size_t(steps); ++s)
          check_weights(weights[size_t(r)][s], ref.weights[s], "step " + std::to_string(s));
      }
    }
}

TEST_CASE("zero-3: bfloat16 gathered parameters under autocast follow one process under autocast") {
  const int p = 2;
  const int64_t per_rank = 4, B = per_rank * p, steps = 2;
  const Tensor x = random_tensor({steps, B, 6}, kFloat32, 341), y = random_tensor({steps, B, 3}, kFloat32, 342);
  auto ref = net_model(36);
  const auto initial = as_map(ref->state_dict());
  optim::SGD ref_opt(ref->parameters(), kSgd);
  for (int64_t s = 0; s < steps; ++s) {
    {
      AutocastGuard amp(kCPU, kBFloat16);
      mse_loss(ref->forward(x[s]), y[s]).backward();
    }
    ref_opt.step();
    ref_opt.zero_grad();
  }
  const auto models = net_models(p, 36);
  PerRank<std::map<std::string, Tensor>> weights(p);
  PerRank<parallel::FullyShardMemoryReport> reports(p);
  PerRank<DType> param_dtype(p, kFloat32);
  run_ranks(p, [&](const CommPtr& comm) {
    const int r = comm->rank();
    FullyShardedDataParallel fsdp(models[size_t(r)], comm, {.units = kWithRoot, .param_dtype = kBFloat16});
    optim::SGD opt(fsdp.parameters(), kSgd);
    for (int64_t s = 0; s < steps; ++s) {
      {
        AutocastGuard amp(kCPU, kBFloat16);
        mse_loss(fsdp.forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank)).backward();
      }
      opt.step();
      opt.zero_grad();
    }
    param_dtype[size_t(r)] = models[size_t(r)]->parameters()[0].dtype();
    reports[size_t(r)] = fsdp.memory_report(&opt);
    weights[size_t(r)] = as_map(fsdp.full_state_dict());
  });
  const auto want = as_map(ref->state_dict());
  for (int r = 0; r < p; ++r) {
    CHECK(param_dtype[size_t(r)] == kBFloat16);                           // the module computes with bf16 parameters
    CHECK(reports[size_t(r)].gathered_bytes_peak == 2 * (28 + 56 + 72));  // root + two units, 2 bytes each
    CHECK(reports[size_t(r)].shard_bytes == 4 * (28 + 56 + 72) / 2);      // float32 master shards
    CHECK(fsdp_dtype_is_float(weights[size_t(r)]));
    // The same bf16 products, but sums over other batch splits round differently: the updates
    // (lr times the gradient; SGD, so that they scale with it) agree to bf16 precision.
    for (const auto& [name, t] : want) {
      const std::vector<double> got = values_of(weights[size_t(r)].at(name)), expected = values_of(t);
      const std::vector<double> start = values_of(initial.at(name));
      std::vector<double> got_update, want_update;
      for (size_t i = 0; i < got.size(); ++i) {
        got_update.push_back(got[i] - start[i]);
        want_update.push_back(expected[i] - start[i]);
      }
      double scale = 0;
      for (double u : want_update) scale = std::max(scale, std::fabs(u));
      check_close(got_update, want_update, 2e-2, 2e-2 * scale, name + " update");
    }
  }
}

TEST_CASE("zero-3: per-rank bytes of parameters, gradients and optimizer state match the formulas") {
  for (int p : {2, 3})
    for (bool with_root : {false, true}) {
      CAPTURE(p);
      CAPTURE(with_root);
      // Units 56, 72, 27 elements, each padded to a multiple of p; the root (net.4) when with_root.
      auto pad = [&](int64_t n) { return (n + p - 1) / p * p; };
      const std::vector<int64_t> named =
          with_root ? std::vector<int64_t>{pad(56), pad(72)} : std::vector<int64_t>{pad(56), pad(72), pad(27)};
      const int64_t root = with_root ? pad(27) : 0;
      int64_t S = root / p, pair = 0;
      for (size_t u = 0; u < named.size(); ++u) {
        S += named[u] / p;
        if (u + 1 < named.size()) pair = std::max(pair, named[u] + named[u + 1]);
      }
      const Tensor x = random_tensor({2 * p, 6}, kFloat32, 321), y = random_tensor({2 * p, 3}, kFloat32, 322);
      PerRank<std::vector<parallel::FullyShardMemoryReport>> reports(static_cast<size_t>(p));
      const auto models = net_models(p, 32);
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        auto fsdp = std::make_shared<FullyShardedDataParallel>(
            models[size_t(r)], comm, parallel::FullyShardOptions{.units = with_root ? kWithRoot : kAllUnits});
        optim::AdamW opt(fsdp->parameters(), kOpts);
        reports[size_t(r)].push_back(fsdp->memory_report(&opt));  // at rest
        mse_loss(fsdp->forward(rows(x, r, 2)), rows(y, r, 2)).backward();
        reports[size_t(r)].push_back(fsdp->memory_report(&opt));  // after backward
        opt.step();
        reports[size_t(r)].push_back(fsdp->memory_report(&opt));  // after the step
      });
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        const auto& at_rest = reports[size_t(r)][0];
        const auto& after_backward = reports[size_t(r)][1];
        const auto& after_step = reports[size_t(r)][2];
        CHECK(at_rest.shard_bytes == 4 * S);
        CHECK(at_rest.gathered_bytes == 0);
        CHECK(at_rest.gradient_shard_bytes == 0);
        CHECK(at_rest.optimizer_state_bytes == 0);
        CHECK(after_backward.gathered_bytes == 0);  // every unit freed, the root too
        CHECK(after_backward.param_grad_bytes == 0);
        CHECK(after_backward.gradient_shard_bytes == 4 * S);
        CHECK(after_backward.gathered_units_peak == 2);
        CHECK(after_backward.gathered_bytes_peak == 4 * (root + pair));  // the root and two adjacent units
        CHECK(after_step.optimizer_state_bytes == 8 * S);
        CHECK(after_step.shard_bytes + after_step.gradient_shard_bytes + after_step.optimizer_state_bytes == 16 * S);
        CHECK(16 * S < 16 * 155);  // DDP: 4 N params + 4 N grads + 8 N moments
      }
    }
}

TEST_CASE("zero-3: a sharded checkpoint resumes to the same steps; a consolidated one loads into the unsharded model") {
  const int p = 2;
  const int64_t per_rank = 2, B = per_rank * p, steps = 4;
  const Tensor x = random_tensor({steps, B, 6}, kFloat32, 331), y = random_tensor({steps, B, 3}, kFloat32, 332);
  const Reference ref = reference_run(33, x, y);
  const std::string dir = temp_path("zero3_sharded", ""), consolidated = temp_path("zero3_full");
  std::filesystem::remove_all(dir);
  PerRank<std::vector<std::map<std::string, Tensor>>> uninterrupted(p), resumed(p);
  auto train = [&](FullyShardedDataParallel& fsdp, optim::AdamW& opt, int64_t s, int r) {
    mse_loss(fsdp.forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank)).backward();
    opt.step();
    opt.zero_grad();
  };
  const auto first = net_models(p, 33), second = net_models(p, 77);
  run_ranks(p, [&](const CommPtr& comm) {
    const int r = comm->rank();
    auto fsdp = std::make_shared<FullyShardedDataParallel>(first[size_t(r)], comm,
                                                           parallel::FullyShardOptions{.units = kWithRoot});
    optim::AdamW opt(fsdp->parameters(), kOpts);
    for (int64_t s = 0; s < steps; ++s) {
      train(*fsdp, opt, s, r);
      if (s == 0) parallel::save_sharded_checkpoint(*fsdp, dir, &opt);  // generation 1, replaced next
      if (s == 1) parallel::save_sharded_checkpoint(*fsdp, dir, &opt);
      if (s >= 2) uninterrupted[size_t(r)].push_back(as_map(fsdp->full_state_dict()));
    }
    parallel::save_consolidated(*fsdp, consolidated);
  });
  // Generation 2 replaced generation 1: its index and its files only.
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(files == std::vector<std::string>{"index.json", "shard-00000-of-00002.g2.safetensors",
                                          "shard-00001-of-00002.g2.safetensors"});

  run_ranks(p, [&](const CommPtr& comm) {  // a fresh run from other weights, resumed after step 1
    const int r = comm->rank();
    auto fsdp = std::make_shared<FullyShardedDataParallel>(second[size_t(r)], comm,
                                                           parallel::FullyShardOptions{.units = kWithRoot});
    optim::AdamW opt(fsdp->parameters(), kOpts);
    parallel::load_sharded_checkpoint(*fsdp, dir, &opt);
    for (int64_t s = 2; s < steps; ++s) {
      train(*fsdp, opt, s, r);
      resumed[size_t(r)].push_back(as_map(fsdp->full_state_dict()));
    }
  });
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < 2; ++i) {
      check_weights(resumed[size_t(r)][i], uninterrupted[size_t(r)][i], "resumed");
      check_weights(resumed[size_t(r)][i], ref.weights[2 + i], "resumed vs one process");
    }

  // The consolidated file is the one-process model's: it loads there and equals the reference.
  auto plain = net_model(5);
  plain->load_state_dict(nn::load_safetensors(consolidated).tensors);
  check_weights(as_map(plain->state_dict()), ref.weights[steps - 1], "consolidated");
  // ... and into a sharded model of another world size.
  PerRank<std::map<std::string, Tensor>> reloaded(3);
  const auto third = net_models(3, 6);
  run_ranks(3, [&](const CommPtr& comm) {
    auto fsdp = std::make_shared<FullyShardedDataParallel>(third[size_t(comm->rank())], comm,
                                                           parallel::FullyShardOptions{.units = kAllUnits});
    fsdp->load_full_state_dict(nn::load_safetensors(consolidated).tensors);
    reloaded[size_t(comm->rank())] = as_map(fsdp->full_state_dict());
  });
  for (int r = 0; r < 3; ++r) check_weights(reloaded[size_t(r)], ref.weights[steps - 1], "consolidated, 3 ranks");
  std::filesystem::remove_all(dir);
  std::filesystem::remove(consolidated);
}

TEST_CASE("zero-3: a load after a forward whose backward never ran serves the loaded weights") {
  // The forward with grad leaves the root unit gathered for a backward that never comes; the
  // load must not leave it serving the weights from before (free_gathered).
  const int p = 2;
  const Tensor x = random_tensor({4, 6}, kFloat32, 391);
  auto other = net_model(39);  // the weights to load, and the expected output
  const auto loaded = as_map(other->state_dict());
  const std::vector<double> want = values_of(other->forward(x));
  const auto models = net_models(p, 30);
  PerRank<std::vector<double>> got(static_cast<size_t>(p));
  run_ranks(p, [&](const CommPtr& comm) {
    const int r = comm->rank();
    FullyShardedDataParallel fsdp(models[size_t(r)], comm, {.units = kWithRoot});
    Tensor unused = fsdp.forward(x);  // requires grad: the root stays gathered
    fsdp.load_full_state_dict(loaded);
    autograd::NoGradGuard no_grad;
    got[size_t(r)] = values_of(fsdp.forward(x));
  });
  for (int r = 0; r < p; ++r) check_close(got[size_t(r)], want, 1e-6, 1e-7, "rank " + std::to_string(r));
}

TEST_CASE("zero-3: a sharded save that fails on one rank leaves the previous checkpoint loadable") {
  const int p = 2;
  const std::string dir = temp_path("zero3_failed_save", "");
  std::filesystem::remove_all(dir);
  const Tensor x = random_tensor({2, 2 * p, 6}, kFloat32, 351), y = random_tensor({2, 2 * p, 3}, kFloat32, 352);
  const auto models = net_models(p, 37), fresh = net_models(p, 78);
  PerRank<std::map<std::string, Tensor>> saved(p), loaded(p);
  const std::string error = error_of([&] {
    run_ranks(p, [&](const CommPtr& comm) {
      const int r = comm->rank();
      FullyShardedDataParallel fsdp(models[size_t(r)], comm, {.units = kWithRoot});
      optim::AdamW opt(fsdp.parameters(), kOpts);
      for (int64_t s = 0; s < 2; ++s) {
        mse_loss(fsdp.forward(rows(x[s], r, 2)), rows(y[s], r, 2)).backward();
        opt.step();
        opt.zero_grad();
        if (s == 0) {
          parallel::save_sharded_checkpoint(fsdp, dir, &opt);
          saved[size_t(r)] = as_map(fsdp.full_state_dict());
        }
      }
      // Rank 1 cannot write generation 2 (a directory stands where its file goes).
      if (r == 1)
        std::filesystem::create_directories(std::filesystem::path(dir) / "shard-00001-of-00002.g2.safetensors/x");
      comm->barrier();
      parallel::save_sharded_checkpoint(fsdp, dir, &opt);
    });
  });
  check_contains(error, {"rank 1", "shard-00001-of-00002.g2.safetensors"});
  run_ranks(p, [&](const CommPtr& comm) {
    const int r = comm->rank();
    FullyShardedDataParallel fsdp(fresh[size_t(r)], comm, {.units = kWithRoot});
    optim::AdamW opt(fsdp.parameters(), kOpts);
    parallel::load_sharded_checkpoint(fsdp, dir, &opt);
    loaded[size_t(r)] = as_map(fsdp.full_state_dict());
  });
  for (int r = 0; r < p; ++r) check_weights(loaded[size_t(r)], saved[size_t(r)], "generation 1 after a failed save");
  std::filesystem::remove_all(dir);
}

TEST_CASE("zero-3: loading a sharded checkpoint checks world size, shard files and shapes") {
  const std::string dir = temp_path("zero3_checks", "");
  std::filesystem::remove_all(dir);
  const auto two = net_models(2, 34), two_more = net_models(2, 34), three = net_models(3, 34), last = net_models(2, 34),
             dup = net_models(2, 34);
  std::vector<std::shared_ptr<Net>> other;  // net.0 is Linear(6, 9)
  for (int r = 0; r < 2; ++r)
    other.push_back(std::make_shared<Net>(
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
            std::make_shared<nn::Linear>(6, 9), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(9, 8),
            std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(8, 3)}),
        false));
  const parallel::FullyShardOptions opts{.units = kAllUnits};
  run_ranks(2, [&](const CommPtr& comm) {
    FullyShardedDataParallel fsdp(two[size_t(comm->rank())], comm, opts);
    parallel::save_sharded_checkpoint(fsdp, dir);
  });
  std::string wrong_world, wrong_shape, missing, no_optim;
  run_ranks(3, [&](const CommPtr& comm) {
    FullyShardedDataParallel fsdp(three[size_t(comm->rank())], comm, opts);
    const std::string e = error_of([&] { parallel::load_sharded_checkpoint(fsdp, dir); });
    if (comm->rank() == 0) wrong_world = e;
  });
  run_ranks(2, [&](const CommPtr& comm) {
    FullyShardedDataParallel fsdp(other[size_t(comm->rank())], comm, opts);
    const std::string e = error_of([&] { parallel::load_sharded_checkpoint(fsdp, dir); });
    if (comm->rank() == 0) wrong_shape = e;
    FullyShardedDataParallel same(two_more[size_t(comm->rank())], comm, opts);
    optim::AdamW opt(same.parameters(), kOpts);
    const std::string e2 = error_of([&] { parallel::load_sharded_checkpoint(same, dir, &opt); });
    if (comm->rank() == 0) no_optim = e2;
  });
  // An index that names rank 0's shard for rank 1 too: the shards have equal sizes, so only the
  // shard's own metadata tells (rank 1 loaded rank 0's values without a word before).
  const std::filesystem::path index = std::filesystem::path(dir) / "index.json";
  std::string original;
  {
    std::ifstream in(index);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string edited = original;
  edited.replace(edited.find("shard-00001-of-00002.g1"), 23, "shard-00000-of-00002.g1");
  std::ofstream(index) << edited;
  std::string other_rank;
  run_ranks(2, [&](const CommPtr& comm) {
    FullyShardedDataParallel fsdp(dup[size_t(comm->rank())], comm, opts);
    const std::string e = error_of([&] { parallel::load_sharded_checkpoint(fsdp, dir); });
    if (comm->rank() == 1) other_rank = e;
  });
  std::ofstream(index) << original;
  check_contains(other_rank, {"shard-00000-of-00002.g1.safetensors", "is not rank 1's shard", "rank = 0"});
  std::filesystem::remove(std::filesystem::path(dir) / "shard-00001-of-00002.g1.safetensors");
  run_ranks(2, [&](const CommPtr& comm) {
    FullyShardedDataParallel fsdp(last[size_t(comm->rank())], comm, opts);
    const std::string e = error_of([&] { parallel::load_sharded_checkpoint(fsdp, dir); });
    if (comm->rank() == 1) missing = e;
  });
  check_contains(wrong_world, {"saved by 2 ranks", "this run has 3"});
  check_contains(wrong_shape, {"shape mismatch", "net.0.weight", "[8, 6] in the checkpoint", "[9, 6] in this model"});
  check_contains(no_optim, {"no optimizer state"});
  check_contains(missing, {"rank 1", "shard-00001-of-00002.g1.safetensors", "is missing"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("zero-3: misuse fails with errors naming the unit or parameter") {
  const auto a = net_models(2, 35), b = net_models(2, 35), c = net_models(2, 35), d = net_models(2, 35);
  for (const auto& m : c) m->to(kFloat64);
  const Tensor x = random_tensor({2, 6}, kFloat32, 1);
  PerRank<std::vector<std::string>> errors(2);
  run_ranks(2, [&](const CommPtr& comm) {
    using Opts = parallel::FullyShardOptions;
    const size_t r = size_t(comm->rank());
    errors[r].push_back(error_of([&] { FullyShardedDataParallel(a[r], comm, Opts{.units = {"net.7"}}); }));
    errors[r].push_back(error_of([&] { FullyShardedDataParallel(b[r], comm, Opts{.units = {"net", "net.2"}}); }));
    errors[r].push_back(error_of([&] { FullyShardedDataParallel(c[r], comm, Opts{.units = {"net.0"}}); }));
    // A unit's parameters exist only while it runs through its hooks: a direct forward fails.
    FullyShardedDataParallel fsdp(d[r], comm, Opts{.units = kAllUnits});
    errors[r].push_back(error_of([&] { (void)(*d[r]->net)[0]->forward(x); }));
    errors[r].push_back(error_of([&] { parallel::ZeroAdamW(a[r]->parameters(), comm, kOpts, {.stage = 3}); }));
  });
  for (size_t r = 0; r < 2; ++r) {
    CHECK(parallel::modules_of_type(*a[r], "Linear") == kAllUnits);
    check_contains(errors[r][0], {"no module named 'net.7'", "'net.0'"});
    check_contains(errors[r][1], {"units 'net' and 'net.2' overlap"});
    check_contains(errors[r][2], {"net.0.weight", "float64", "must be float32"});
    check_contains(errors[r][3], {"linear", "weight", "float32[0]"});
    check_contains(errors[r][4], {"stage must be 1 or 2", "FullyShardedDataParallel"});
  }
}

TEST_CASE("zero-3: two forwards summed into one backward, checkpointed or not, equal one process") {
  // Under checkpoints each forward's replay is a nested backward of its own: the first replay
  // completed a unit's gradients, the unit was reduce-scattered, and the second replay's
  // gradients were refused ("received a gradient after its unit's gradients were
  // reduce-scattered"). A siamese pair or micro-batches summed into one loss do this.
  for (const bool checkpointed : {false, true})
    for (int p : {2, 3}) {
      CAPTURE(checkpointed);
      CAPTURE(p);
      const int64_t micro = 2, per_mb = 2, B = p * micro * per_mb, steps = 2;
      const Tensor x = random_tensor({steps, B, 6}, kFloat32, 331), y = random_tensor({steps, B, 3}, kFloat32, 332);
      const Reference ref = reference_run(33, x, y, double(micro));  // the sum of two equal-size means
      PerRank<std::vector<std::map<std::string, Tensor>>> weights(static_cast<size_t>(p));
      const auto models = net_models(p, 33, checkpointed);
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        auto fsdp = sharded(models[size_t(r)], comm);
        optim::AdamW opt(fsdp->parameters(), kOpts);
        for (int64_t s = 0; s < steps; ++s) {
          const Tensor xr = rows(x[s], r, micro * per_mb), yr = rows(y[s], r, micro * per_mb);
          Tensor loss = mse_loss(fsdp->forward(rows(xr, 0, per_mb)), rows(yr, 0, per_mb));
          loss = add(loss, mse_loss(fsdp->forward(rows(xr, 1, per_mb)), rows(yr, 1, per_mb)));
          loss.backward();
          opt.step();
          opt.zero_grad();
          weights[size_t(r)].push_back(as_map(fsdp->full_state_dict()));
        }
      });
      for (int r = 0; r < p; ++r)
        for (size_t s = 0; s < size_t(steps); ++s)
          check_weights(weights[size_t(r)][s], ref.weights[s], "step " + std::to_string(s));
    }
}

TEST_CASE("zero-3: clip_grad_norm_ takes the whole model's norm across the shards (2-norm and inf-norm)") {
  // optim::clip_grad_norm_(fsdp->parameters()) clips each rank by its own shard's norm (the
  // ranks then step differently); the FSDP method sums the shards' parts first, as PyTorch's.
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity()})
    for (int p : {2, 3}) {
      CAPTURE(p);
      CAPTURE(norm_type);
      const int64_t per_rank = 2, B = per_rank * p, steps = 3;
      const double max_norm = 0.05;  // below every step's norm: each step clips
      const Tensor x = random_tensor({steps, B, 6}, kFloat32, 311), y = random_tensor({steps, B, 3}, kFloat32, 312);
      auto ref = net_model(31);
      optim::AdamW ref_opt(ref->parameters(), kOpts);
      std::vector<double> ref_norms;
      std::vector<std::map<std::string, Tensor>> ref_weights;
      for (int64_t s = 0; s < steps; ++s) {
        mse_loss(ref->forward(x[s]), y[s]).backward();
        ref_norms.push_back(optim::clip_grad_norm_(ref->parameters(), max_norm, norm_type));
        ref_opt.step();
        ref_opt.zero_grad();
        ref_weights.push_back(as_map(ref->state_dict()));
      }
      PerRank<std::vector<double>> norms(static_cast<size_t>(p));
      PerRank<std::vector<std::map<std::string, Tensor>>> weights(static_cast<size_t>(p));
      const auto models = net_models(p, 31);
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        auto fsdp = sharded(models[size_t(r)], comm);
        optim::AdamW opt(fsdp->parameters(), kOpts);
        for (int64_t s = 0; s < steps; ++s) {
          mse_loss(fsdp->forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank)).backward();
          norms[size_t(r)].push_back(fsdp->clip_grad_norm_(max_norm, norm_type));
          opt.step();
          opt.zero_grad();
          weights[size_t(r)].push_back(as_map(fsdp->full_state_dict()));
        }
      });
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        check_equiv(norms[size_t(r)], ref_norms, "total norm");
        for (size_t s = 0; s < size_t(steps); ++s)
          check_weights(weights[size_t(r)][s], ref_weights[s], "step " + std::to_string(s));
      }
    }
}

TEST_CASE("zero-3: a GradScaler with found_inf_sync skips on every rank when one rank's shard overflows") {
  // Step 1 puts an inf in one element of net.0.weight's gradient on rank 0 only: after the
  // reduce-scatter only the rank owning that element sees it. One process skips step 1 and
  // halves the scale; every rank must do the same, or the shards step apart.
  const int p = 2;
  const int64_t per_rank = 2, B = per_rank * p, steps = 3;
  const Tensor x = random_tensor({steps, B, 6}, kFloat32, 321), y = random_tensor({steps, B, 3}, kFloat32, 322);
  const auto poison = [](const Tensor& g) {
    Tensor h = g.clone();
    ops::fill_(h.view({-1}).narrow(0, 3, 1), std::numeric_limits<double>::infinity());
    return h;
  };
  int64_t ref_step = 0;
  auto ref = net_model(32);
  autograd::register_hook(ref->net->parameters()[0],
                          [&](const Tensor& g) { return ref_step == 1 ? poison(g) : Tensor(); });
  optim::AdamW ref_opt(ref->parameters(), kOpts);
  optim::GradScaler ref_scaler({.init_scale = 1024.0});
  std::vector<double> ref_scales;
  std::vector<std::map<std::string, Tensor>> ref_weights;
  for (ref_step = 0; ref_step < steps; ++ref_step) {
    ref_scaler.scale(mse_loss(ref->forward(x[ref_step]), y[ref_step])).backward();
    ref_scaler.step(ref_opt);
    ref_scaler.update();
    ref_opt.zero_grad();
    ref_scales.push_back(ref_scaler.get_scale());
    ref_weights.push_back(as_map(ref->state_dict()));
  }
  REQUIRE(ref_scales == std::vector<double>{1024, 512, 512});
  PerRank<std::vector<double>> scales(static_cast<size_t>(p));
  PerRank<std::vector<std::map<std::string, Tensor>>> weights(static_cast<size_t>(p));
  const auto models = net_models(p, 32);
  run_ranks(p, [&](const CommPtr& comm) {
    const int r = comm->rank();
    const Tensor first_weight = models[size_t(r)]->net->parameters()[0];
    auto fsdp = sharded(models[size_t(r)], comm);
    int64_t step = 0;
    if (r == 0)
      autograd::register_hook(first_weight, [&](const Tensor& g) { return step == 1 ? poison(g) : Tensor(); });
    optim::AdamW opt(fsdp->parameters(), kOpts);
    optim::GradScaler scaler({.init_scale = 1024.0, .sync_found_inf = fsdp->found_inf_sync()});
    for (step = 0; step < steps; ++step) {
      scaler.scale(mse_loss(fsdp->forward(rows(x[step], r, per_rank)), rows(y[step], r, per_rank))).backward();
      scaler.step(opt);
      scaler.update();
      opt.zero_grad();
      scales[size_t(r)].push_back(scaler.get_scale());
      weights[size_t(r)].push_back(as_map(fsdp->full_state_dict()));
    }
  });
  for (int r = 0; r < p; ++r) {
    CAPTURE(r);
    CHECK(scales[size_t(r)] == ref_scales);
    for (size_t s = 0; s < size_t(steps); ++s)
      check_weights(weights[size_t(r)][s], ref_weights[s], "step " + std::to_string(s));
  }
}

TEST_CASE("zero-3: ZeroAdamW refuses a frozen parameter by name (stage 2 failed inside a hook's registration)") {
  run_ranks(2, [&](const CommPtr& comm) {
    const Tensor w = random_tensor({5}, kFloat64, 1).requires_grad_(), frozen = random_tensor({5}, kFloat64, 2);
    for (int stage : {1, 2})
      check_error(
          [&] {
            parallel::ZeroAdamW({w, frozen}, comm, kOpts, {.stage = stage});
          },
          {"ZeroAdamW", "parameter 1", "float64[5]", "does not require grad"});
  });
}

TEST_CASE("zero-3: a tied weight claimed by a unit and used outside it is refused, naming both paths") {
  // Before, every rank failed at its first forward: "linear: weight must be 2-D ... float32[0]".
  // The second layer applies the first one's weight: PyTorch's `second.weight = first.weight`.
  struct TiedLinear : nn::UnaryModule {
    Tensor weight;
    explicit TiedLinear(const Tensor& w) { weight = register_parameter("weight", w); }
    Tensor forward(const Tensor& x) override { return linear(x, weight, Tensor()); }
    std::string type_name() const override { return "TiedLinear"; }
  };
  run_ranks(2, [&](const CommPtr& comm) {
    auto first = std::make_shared<nn::Linear>(8, 8);
    auto seq = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
        first, std::make_shared<nn::Tanh>(), std::make_shared<TiedLinear>(first->weight)});
    check_error([&] { FullyShardedDataParallel(seq, comm, {.units = {"0"}}); },
                {"FullyShardedDataParallel", "parameter '0.weight' of unit '0' is also '2.weight'", "tied weight"});
    // Both users in the root unit: accepted (and trained as one process, per the probe).
    FullyShardedDataParallel ok(seq, comm, {});
    CHECK(ok.layout().size() == 1);
  });
}
