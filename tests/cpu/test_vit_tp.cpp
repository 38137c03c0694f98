// The tensor-parallel VisionTransformer (models/vit_tp.h) on the threads backend, 2 and 4
// ranks, against models::VisionTransformer in one process: with the reference's weights
// loaded (from its state dict or a safetensors file), the logits, the loss and the full
// gradients gathered from the shards equal the reference's (f32, 1e-5 relative); keys are
// torchvision's; split tensors hold 1 / size of the elements, in_proj's shard being this
// rank's rows of each of q, k and v. Each block run as memory_plan says (Note
// [Tensor-parallel block memory]): checkpoint_blocks with dropout trains bit for bit as
// without it at 1, 2 and 4 ranks, equals the reference without dropout, and every lossless
// BlockMemory gives the plain run's gradients.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>

#include "autograd/ops/all.h"
#include "models/vit.h"
#include "models/vit_tp.h"
#include "nn/block_memory.h"
#include "nn/block_planner.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/thread_communicator.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"
#include "tests/tp_model_fixtures.h"

using namespace frugal;
using namespace frugal::testing;
using parallel::CommPtr;
using parallel::run_ranks;

namespace {

bool is_split_key(const std::string& k) {
  return k.find("in_proj") != std::string::npos || k.find("out_proj.weight") != std::string::npos ||
         k.find("mlp.0.") != std::string::npos || k.find("mlp.3.weight") != std::string::npos;
}

/// small_vit() with dropout and attention dropout 0.1, each block checkpointed (with
/// `policy`) when `checkpointed`.
models::ViTConfig dropout_vit(bool checkpointed, autograd::CheckpointPolicy policy) {
  models::ViTConfig c = small_vit();
  c.dropout = 0.1;
  c.attention_dropout = 0.1;
  c.checkpoint_blocks = checkpointed;
  c.checkpoint_policy = policy;
  return c;
}

/// The batch the checkpoint tests train on: three images (the same on every call) and labels.
Tensor train_images() { return random_tensor({3, 3, 16, 16}, kFloat32, 50); }
Tensor train_labels() { return from_vector<int64_t>({7, 0, 3}, {3}); }

/// train_tp_steps (parallel_test_util.h) on train_images().
Results train_steps(models::TensorParallelVisionTransformer& tp) {
  return train_tp_steps(tp, [&] { return cross_entropy(tp.forward(train_images()), train_labels()); });
}

std::map<std::string, Tensor> reference_state() {
  std::map<std::string, Tensor> full;
  for (const auto& [k, t] : vit_reference_model()->state_dict()) full[k] = t.detach();
  return full;
}

}  // namespace

TEST_CASE("tensor-parallel ViT: logits, loss and gradients equal VisionTransformer's at 2 and 4 ranks") {
  auto ref = vit_reference_model();
  const Tensor images = randn({3, 3, 16, 16});
  const Tensor labels = from_vector<int64_t>({7, 0, 3}, {3});
  const Tensor want_logits = ref->forward(images);
  const Tensor want_loss = cross_entropy(want_logits, labels);
  want_loss.backward();
  std::map<std::string, Tensor> full_state;
  for (const auto& [k, t] : ref->state_dict()) full_state[k] = t.detach();
  const std::string path = temp_path("frugal_test_vit_tp");
  nn::save_safetensors(path, ref->state_dict());

  for (int p : {2, 4}) {
    CAPTURE(p);
    const size_t n = static_cast<size_t>(p);
    PerRank<Results> grads(n), weights(n), outs(n), locals(n);
    run_ranks(p, [&](const CommPtr& comm) {
      const size_t r = size_t(comm->rank());
      models::TensorParallelVisionTransformer tp(small_vit(), comm, /*seed=*/3);
      if (p == 2) models::load_full_state_dict(tp, full_state);
      else models::load_full_safetensors(tp, path);
      const Tensor logits = tp.forward(images);
      const Tensor loss = cross_entropy(logits, labels);
      loss.backward();
      outs[r]["logits"] = logits.detach();
      outs[r]["loss"] = loss.detach();
      for (const auto& [k, t] : tp.named_parameters()) {
        grads[r][k] = tp.gather_full(k, t.grad());
        locals[r][k] = t.detach().clone();
      }
      for (const auto& [k, t] : models::gather_full_state_dict(tp)) weights[r][k] = t;
    });
    const nn::NamedTensors ref_params = ref->named_parameters();
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const size_t ri = size_t(r);
      check_equiv(outs[ri].at("logits"), want_logits.detach(), "logits");
      check_equiv(outs[ri].at("loss"), want_loss.detach(), "loss");
      // the same keys as the reference, the same full gradients (in_proj_bias's key block
      // is ~0 in both, softmax ignoring a shift: check_equiv's floor of 1e-6 of the
      // tensor's largest magnitude covers it)
      REQUIRE(grads[ri].size() == ref_params.size());
      for (const auto& [k, t] : ref_params) {
        REQUIRE_MESSAGE(grads[ri].count(k), k);
        check_equiv(grads[ri].at(k), t.grad(), k + ".grad");
      }
      // gather_full_state_dict gives back the reference's state dict, every key
      REQUIRE(weights[ri].size() == full_state.size());
      for (const auto& [k, t] : full_state) {
        REQUIRE_MESSAGE(weights[ri].count(k), k);
        CHECK_MESSAGE(values_of(weights[ri].at(k)) == values_of(t), k);
      }
      // in_proj's shard: this rank's rows of each of the q, k and v blocks, concatenated
      const int64_t E = 32, rows = E / p;
      for (const std::string layer : {"0", "1"}) {
        const std::string key = "encoder.layers.encoder_layer_" + layer + ".self_attention.in_proj_weight";
        const Tensor full = full_state.at(key);
        const Tensor want = cat({full.narrow(0, r * rows, rows), full.narrow(0, E + r * rows, rows),
                                 full.narrow(0, 2 * E + r * rows, rows)},
                                0);
        CHECK_MESSAGE(values_of(locals[ri].at(key)) == values_of(want), key);
      }
    }
    // split tensors hold 1 / p of the elements, replicated ones all of them
    int64_t split = 0;
    for (const auto& [k, t] : ref_params) {
      CAPTURE(k);
      CHECK(locals[0].at(k).numel() * (is_split_key(k) ? p : 1) == t.numel());
      if (is_split_key(k)) split += t.numel();
    }
    CHECK(split > ref->num_parameters() / 2);  // most of the model is split
  }
  std::filesystem::remove(path);
}

TEST_CASE("tensor-parallel ViT: init is replicated where it must be, and bad configs are rejected") {
  const int p = 2;
  PerRank<Results> got(static_cast<size_t>(p));
  run_ranks(p, [&](const CommPtr& comm) {
    models::TensorParallelVisionTransformer tp(small_vit(), comm, /*seed=*/11);
    CHECK(tp.split_dim("encoder.layers.encoder_layer_1.self_attention.in_proj_bias") == 0);
    CHECK(tp.split_dim("encoder.layers.encoder_layer_1.self_attention.out_proj.weight") == 1);
    CHECK(tp.split_dim("encoder.layers.encoder_layer_1.self_attention.out_proj.bias") == -1);
    CHECK(tp.split_dim("conv_proj.weight") == -1);
    for (const auto& [k, t] : models::gather_full_state_dict(tp)) got[size_t(comm->rank())][k] = t;
  });
  // every rank sees one full model, with VisionTransformer's keys and shapes
  const models::VisionTransformer plain(small_vit());
  const nn::NamedTensors plain_state = plain.state_dict();
  REQUIRE(got[0].size() == plain_state.size());
  for (const auto& [k, t] : plain_state) {
    CAPTURE(k);
    REQUIRE(got[0].count(k));
    CHECK(got[0].at(k).sizes() == t.sizes());
    CHECK(values_of(got[1].at(k)) == values_of(got[0].at(k)));
  }
  CHECK(values_of(got[0].at("heads.head.weight")) == std::vector<double>(10 * 32, 0.0));  // torchvision's zero head
  CHECK(values_of(got[0].at("class_token")) == std::vector<double>(32, 0.0));

  auto refused = [](const models::ViTConfig& c, int ranks, const std::string& message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(
        run_ranks(ranks, [&](const CommPtr& comm) { models::TensorParallelVisionTransformer tp(c, comm); }),
        doctest::Contains(message.c_str()), Error);
  };
  refused(small_vit(), 3, "num_heads (4) and mlp_dim (64) must be divisible by the tensor-parallel size 3");
  models::ViTConfig bad = small_vit();
  bad.mlp_dim = 66;
  refused(bad, 4, "mlp_dim (66)");
  bad = small_vit();
  bad.attention_dropout = -0.1;
  refused(bad, 2, "dropout and attention_dropout must be in [0, 1), got dropout = 0 and attention_dropout = -0.1");

  run_ranks(2, [&](const CommPtr& comm) {
    models::TensorParallelVisionTransformer tp(small_vit(), comm);
    std::map<std::string, Tensor> state;
    for (const auto& [k, t] : models::gather_full_state_dict(tp)) state[k] = t;
    state.erase("encoder.layers.encoder_layer_1.mlp.3.weight");
    state["encoder.layers.encoder_layer_0.self_attention.in_proj_weight"] = zeros({48, 32});
    state["encoder.layers.encoder_layer_0.self_attention.in_proj.weight"] = zeros({96, 32});
    CHECK_THROWS_WITH_AS(models::load_full_state_dict(tp, state),
                         doctest::Contains("Missing: 'encoder.layers.encoder_layer_1.mlp.3.weight'"), Error);
    CHECK_THROWS_WITH_AS(
        models::load_full_state_dict(tp, state),
        doctest::Contains("Unexpected: 'encoder.layers.encoder_layer_0.self_attention.in_proj.weight'"), Error);
    CHECK_THROWS_WITH_AS(
        models::load_full_state_dict(tp, state),
        doctest::Contains("'encoder.layers.encoder_layer_0.self_attention.in_proj_weight' (float32[48, 32]"), Error);
  });
}

TEST_CASE("tensor-parallel ViT: checkpoint_blocks with dropout trains bit for bit as without it at 1, 2 and 4 ranks") {
  // Dropout inside a checkpointed block draws from the model's TensorParallelRng; the replay
  // rewinds those streams (Note [Draws under a record]) and its all-reduces pair up on every
  // rank (Note [Tensor-parallel block memory]).
  const std::map<std::string, Tensor> full = reference_state();
  check_checkpointed_like_plain(
      [&](bool checkpointed, autograd::CheckpointPolicy policy, nn::BlockMemory choice, const CommPtr& comm) {
        models::TensorParallelVisionTransformer tp(dropout_vit(checkpointed, policy), comm, /*seed=*/3);
        CHECK(tp.memory_plan.at(1) == choice);
        models::load_full_state_dict(tp, full);
        return train_steps(tp);
      });
}

TEST_CASE(
    "tensor-parallel ViT: with checkpoint_blocks, loss and gradients equal VisionTransformer's at 2 and 4 ranks") {
  auto ref = vit_reference_model();
  const Tensor want = cross_entropy(ref->forward(train_images()), train_labels());
  want.backward();
  std::map<std::string, Tensor> full;
  for (const auto& [k, t] : ref->state_dict()) full[k] = t.detach();
  for (autograd::CheckpointPolicy policy : {autograd::CheckpointPolicy::Full, autograd::CheckpointPolicy::Selective}) {
    for (int p : {2, 4}) {
      CAPTURE(autograd::to_string(policy));
      CAPTURE(p);
      PerRank<Results> got(static_cast<size_t>(p));
      run_ranks(p, [&](const CommPtr& comm) {
        models::ViTConfig c = small_vit();
        c.checkpoint_blocks = true;
        c.checkpoint_policy = policy;
        models::TensorParallelVisionTransformer tp(c, comm, /*seed=*/3);
        models::load_full_state_dict(tp, full);
        const Tensor loss = cross_entropy(tp.forward(train_images()), train_labels());
        loss.backward();
        Results& out = got[size_t(comm->rank())];
        out["loss"] = loss.detach();
        for (const auto& [k, t] : tp.named_parameters()) out[k] = tp.gather_full(k, t.grad());
      });
      for (const Results& out : got) {
        check_equiv(out.at("loss"), want.detach(), "loss");
        for (const auto& [k, t] : ref->named_parameters()) {
          REQUIRE_MESSAGE(out.count(k), k);
          check_equiv(out.at(k), t.grad(), k + ".grad");
        }
      }
    }
  }
}

TEST_CASE("tensor-parallel ViT: every lossless memory_plan choice gives the plain run's loss and gradients") {
  // recompute and offload replay no collective; the checkpoint-* choices do, as checkpoint.
  const std::map<std::string, Tensor> full = reference_state();
  check_lossless_plans_like_keep(
      [&](const nn::BlockMemoryPlan& plan, const CommPtr& comm) {
        models::TensorParallelVisionTransformer tp(dropout_vit(false, autograd::CheckpointPolicy::Full), comm, 3);
        models::load_full_state_dict(tp, full);
        tp.memory_plan = plan;
        const Tensor loss = cross_entropy(tp.forward(train_images()), train_labels());
        loss.backward();
        Results out{{"loss", loss.detach()}};
        for (const auto& [k, t] : tp.named_parameters()) out[k] = t.grad();
        return out;
      },
      [](const std::string&) { return std::string(); });
}
