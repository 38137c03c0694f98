// The tensor-parallel BertForMaskedLM (models/bert_tp.h) on the threads backend, 2 and 4
// ranks, against models::BertForMaskedLM in one process: with the reference's weights
// loaded (from its state dict or a safetensors file), the gathered logits, the loss and
// the full gradients gathered from the shards equal the reference's (f32, 1e-5
// relative); keys are Hugging Face's; split tensors hold 1 / size of the elements. Each
// layer run as memory_plan says (Note [Tensor-parallel block memory]): checkpoint_blocks
// with dropout trains bit for bit as without it at 1, 2 and 4 ranks, equals the reference
// without dropout, and every lossless BlockMemory gives the plain run's gradients.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "autograd/ops/all.h"
#include "models/bert.h"
#include "models/bert_tp.h"
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

/// small_bert() with hidden and attention dropout 0.1, each layer checkpointed (with
/// `policy`) when `checkpointed`.
models::BertConfig dropout_bert(bool checkpointed, autograd::CheckpointPolicy policy) {
  models::BertConfig c = small_bert();
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.1;
  c.checkpoint_blocks = checkpointed;
  c.checkpoint_policy = policy;
  return c;
}

/// train_tp_steps (parallel_test_util.h) on bert_batch().
Results train_steps(models::TensorParallelBertForMaskedLM& tp) {
  const BertBatch b = bert_batch();
  return train_tp_steps(tp, [&] { return tp.forward(b.ids, b.mask, b.types, b.labels).loss; });
}

std::map<std::string, Tensor> reference_state() {
  std::map<std::string, Tensor> full;
  for (const auto& [k, t] : bert_reference_model()->state_dict()) full[k] = t.detach();
  return full;
}

}  // namespace

TEST_CASE("tensor-parallel BERT: logits, loss and gradients equal BertForMaskedLM's at 2 and 4 ranks") {
  auto ref = bert_reference_model();
  const BertBatch b = bert_batch();
  const models::BertMlmOutput want = ref->forward(b.ids, b.mask, b.types, b.labels, {.logits = true});
  want.loss.backward();
  std::map<std::string, Tensor> full_state, ref_grads;
  for (const auto& [k, t] : ref->named_parameters()) ref_grads[k] = t.grad();
  for (const auto& [k, t] : ref->state_dict()) full_state[k] = t.detach();
  // Round-trip the weights through a safetensors file as save_pretrained writes it (the
  // tied aliases dropped): the TP model loads it with one rank's slice each.
  nn::NamedTensors untied;
  for (const auto& [k, t] : ref->state_dict())
    if (k.rfind("cls.predictions.decoder.", 0) != 0) untied.emplace_back(k, t);
  const std::string path = temp_path("frugal_test_bert_tp");
  nn::save_safetensors(path, untied);

  for (int p : {2, 4}) {
    CAPTURE(p);
    const size_t n = static_cast<size_t>(p);
    PerRank<Results> grads(n), weights(n), outs(n);
    PerRank<std::map<std::string, int64_t>> numels(n);
    run_ranks(p, [&](const CommPtr& comm) {
      const size_t r = size_t(comm->rank());
      models::TensorParallelBertForMaskedLM tp(small_bert(), comm, /*seed=*/3);
      if (p == 2) models::load_full_state_dict(tp, full_state);
      else models::load_full_safetensors(tp, path);
      const models::TensorParallelMlmOutput out = tp.forward(b.ids, b.mask, b.types, b.labels);
      out.loss.backward();
      outs[r]["logits"] = tp.gather_logits(out.local_logits).detach();
      outs[r]["loss"] = out.loss.detach();
      for (const auto& [k, t] : tp.named_parameters()) {
        grads[r][k] = tp.gather_full(k, t.grad());
        numels[r][k] = t.numel();
      }
      for (const auto& [k, t] : models::gather_full_state_dict(tp)) weights[r][k] = t;
    });
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      check_equiv(outs[size_t(r)].at("logits"), want.logits.detach(), "logits");
      check_equiv(outs[size_t(r)].at("loss"), want.loss.detach(), "loss");
      // the same keys as the reference, the same full gradients
      const nn::NamedTensors ref_params = ref->named_parameters();
      REQUIRE(grads[size_t(r)].size() == ref_params.size());
      for (const auto& [k, t] : ref_params) {
        REQUIRE_MESSAGE(grads[size_t(r)].count(k), k);
        if (const std::string q = bert_zero_grad_scale_key(k); !q.empty()) {  // ~1e-12 here
          CHECK(max_abs(grads[size_t(r)].at(k)) < 1e-6 * max_abs(ref_grads.at(q)));
          CHECK(max_abs(t.grad()) < 1e-6 * max_abs(ref_grads.at(q)));
          continue;
        }
        check_equiv(grads[size_t(r)].at(k), t.grad(), k + ".grad");
      }
      // gather_full_state_dict gives back the reference's state dict, every key
      REQUIRE(weights[size_t(r)].size() == full_state.size());
      for (const auto& [k, t] : full_state) {
        REQUIRE_MESSAGE(weights[size_t(r)].count(k), k);
        CHECK_MESSAGE(values_of(weights[size_t(r)].at(k)) == values_of(t), k);
      }
    }
    // split tensors hold 1 / p of the elements, replicated ones all of them
    int64_t split = 0;
    for (const auto& [k, t] : ref->named_parameters()) {
      const int64_t local = numels[0].at(k);
      const bool is_split = k.find("word_embeddings") != std::string::npos || k == "cls.predictions.bias" ||
                            k.find(".attention.self.") != std::string::npos ||
                            k.find("intermediate.dense") != std::string::npos ||
                            (k.find("output.dense.weight") != std::string::npos);
      CAPTURE(k);
      CHECK(local * (is_split ? p : 1) == t.numel());
      if (is_split) split += t.numel();
    }
    CHECK(split > ref->num_parameters() / 2);  // most of the model is split
  }
  std::filesystem::remove(path);
}

TEST_CASE("tensor-parallel BERT: init is replicated where it must be, and bad configs are rejected") {
  const int p = 2;
  PerRank<Results> got(static_cast<size_t>(p));
  run_ranks(p, [&](const CommPtr& comm) {
    models::TensorParallelBertForMaskedLM tp(small_bert(), comm, /*seed=*/11);
    for (const auto& [k, t] : models::gather_full_state_dict(tp)) got[size_t(comm->rank())][k] = t;
  });
  for (const auto& [k, t] : got[0]) {
    CAPTURE(k);
    CHECK(values_of(got[1].at(k)) == values_of(t));  // every rank sees one full model
  }
  const std::vector<double> pad_row = values_of(got[0].at("bert.embeddings.word_embeddings.weight").select(0, 0));
  CHECK(pad_row == std::vector<double>(64, 0.0));
  CHECK(values_of(got[0].at("cls.predictions.bias")) == std::vector<double>(96, 0.0));

  models::BertConfig odd = small_bert();
  odd.vocab_size = 95;
  CHECK_THROWS_WITH_AS(run_ranks(2, [&](const CommPtr& comm) { models::TensorParallelBertForMaskedLM tp(odd, comm); }),
                       doctest::Contains("vocab_size (95)"), Error);
  models::BertConfig with_dropout = small_bert();
  with_dropout.hidden_dropout_prob = 1.0;
  CHECK_THROWS_WITH_AS(
      run_ranks(2, [&](const CommPtr& comm) { models::TensorParallelBertForMaskedLM tp(with_dropout, comm); }),
      doctest::Contains("hidden_dropout_prob and attention_probs_dropout_prob must be in [0, 1), got 1 and 0"), Error);
  run_ranks(2, [&](const CommPtr& comm) {
    models::TensorParallelBertForMaskedLM tp(small_bert(), comm);
    std::map<std::string, Tensor> state;
    for (const auto& [k, t] : models::gather_full_state_dict(tp)) state[k] = t;
    state.erase("bert.encoder.layer.1.output.dense.weight");
    state["bert.embeddings.position_embeddings.weight"] = zeros({8, 64});
    CHECK_THROWS_WITH_AS(models::load_full_state_dict(tp, state),
                         doctest::Contains("Missing: 'bert.encoder.layer.1.output.dense.weight'"), Error);
    CHECK_THROWS_WITH_AS(models::load_full_state_dict(tp, state),
                         doctest::Contains("'bert.embeddings.position_embeddings.weight' (float32[8, 64]"), Error);
  });
}

TEST_CASE("tensor-parallel BERT: checkpoint_blocks with dropout trains bit for bit as without it at 1, 2 and 4 ranks") {
  // Dropout inside a checkpointed layer draws from the model's TensorParallelRng; the replay
  // rewinds those streams (Note [Draws under a record]) and its all-reduces pair up on every
  // rank (Note [Tensor-parallel block memory]).
  const std::map<std::string, Tensor> full = reference_state();
  check_checkpointed_like_plain(
      [&](bool checkpointed, autograd::CheckpointPolicy policy, nn::BlockMemory choice, const CommPtr& comm) {
        models::TensorParallelBertForMaskedLM tp(dropout_bert(checkpointed, policy), comm, /*seed=*/3);
        CHECK(tp.memory_plan.at(1) == choice);
        models::load_full_state_dict(tp, full);
        return train_steps(tp);
      });
}

TEST_CASE("tensor-parallel BERT: with checkpoint_blocks, loss and gradients equal BertForMaskedLM's at 2 and 4 ranks") {
  auto ref = bert_reference_model();
  const BertBatch b = bert_batch();
  const Tensor want = ref->forward(b.ids, b.mask, b.types, b.labels).loss;
  want.backward();
  std::map<std::string, Tensor> full, ref_grads;
  for (const auto& [k, t] : ref->state_dict()) full[k] = t.detach();
  for (const auto& [k, t] : ref->named_parameters()) ref_grads[k] = t.grad();
  for (autograd::CheckpointPolicy policy : {autograd::CheckpointPolicy::Full, autograd::CheckpointPolicy::Selective}) {
    for (int p : {2, 4}) {
      CAPTURE(autograd::to_string(policy));
      CAPTURE(p);
      PerRank<Results> got(static_cast<size_t>(p));
      run_ranks(p, [&](const CommPtr& comm) {
        models::BertConfig c = small_bert();
        c.checkpoint_blocks = true;
        c.checkpoint_policy = policy;
        models::TensorParallelBertForMaskedLM tp(c, comm, /*seed=*/3);
        models::load_full_state_dict(tp, full);
        const Tensor loss = tp.forward(b.ids, b.mask, b.types, b.labels).loss;
        loss.backward();
        Results& out = got[size_t(comm->rank())];
        out["loss"] = loss.detach();
        for (const auto& [k, t] : tp.named_parameters()) out[k] = tp.gather_full(k, t.grad());
      });
      for (const Results& out : got) {
        check_equiv(out.at("loss"), want.detach(), "loss");
        for (const auto& [k, t] : ref->named_parameters()) {
          REQUIRE_MESSAGE(out.count(k), k);
          if (const std::string q = bert_zero_grad_scale_key(k); !q.empty()) {  // ~0 in exact arithmetic
            CHECK(max_abs(out.at(k)) < 1e-6 * max_abs(ref_grads.at(q)));
            continue;
          }
          check_equiv(out.at(k), t.grad(), k + ".grad");
        }
      }
    }
  }
}

TEST_CASE("tensor-parallel BERT: every lossless memory_plan choice gives the plain run's loss and gradients") {
  // recompute and offload replay no collective; the checkpoint-* choices do, as checkpoint.
  const std::map<std::string, Tensor> full = reference_state();
  check_lossless_plans_like_keep(
      [&](const nn::BlockMemoryPlan& plan, const CommPtr& comm) {
        models::TensorParallelBertForMaskedLM tp(dropout_bert(false, autograd::CheckpointPolicy::Full), comm, 3);
        models::load_full_state_dict(tp, full);
        tp.memory_plan = plan;
        const BertBatch b = bert_batch();
        const Tensor loss = tp.forward(b.ids, b.mask, b.types, b.labels).loss;
        loss.backward();
        Results out{{"loss", loss.detach()}};
        for (const auto& [k, t] : tp.named_parameters()) out[k] = t.grad();
        return out;
      },
      bert_zero_grad_scale_key);
}
