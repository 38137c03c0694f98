// Dropout in the tensor-parallel layers and models (Note [Tensor-parallel dropout] in
// parallel/tensor_parallel.cpp) on the threads backend, 1 (null communicator), 2 and 4
// ranks: the replicated stream drops the same elements on every rank and the split stream
// different ones; the encoder layer in training mode equals a single-process layer written
// here with explicit dropout calls from the same streams (so dropout sits exactly where
// BERT's and torchvision ViT's layers put it); replicated outputs and replicated
// parameters' gradients stay bitwise equal across ranks; eval mode drops nothing; the TP
// BERT and ViT train with dropout.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "models/bert_tp.h"
#include "models/vit_tp.h"
#include "parallel/tensor_parallel.h"
#include "parallel/thread_communicator.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"
#include "tests/tp_model_fixtures.h"

using namespace frugal;
using namespace frugal::testing;
using parallel::CommPtr;

namespace {

/// Runs f on p thread ranks, or once with a null communicator when p == 1.
template <typename F>
void run_on(int p, F&& f) {
  if (p == 1) f(CommPtr());
  else parallel::run_ranks(p, f);
}

/// Runs f(comm, this rank's results) on p thread ranks (once with a null communicator when
/// p == 1) and returns every rank's results.
PerRank<Results> each_rank(int p, const std::function<void(const CommPtr&, Results&)>& f) {
  PerRank<Results> got(static_cast<size_t>(p));
  run_on(p, [&](const CommPtr& comm) { f(comm, got[size_t(parallel::tp_rank(comm))]); });
  return got;
}

/// Fraction of exact zeros in t.
double zero_fraction(const Tensor& t) {
  const std::vector<double> v = values_of(t);
  double zeros = 0.0;
  for (double x : v) zeros += x == 0.0 ? 1.0 : 0.0;
  return zeros / double(v.size());
}

/// |fraction - p| within 5 binomial standard deviations of n draws.
void check_drop_rate(double fraction, double p, int64_t n, const std::string& what) {
  CAPTURE(what);
  CAPTURE(fraction);
  CHECK(std::fabs(fraction - p) <= 5.0 * std::sqrt(p * (1.0 - p) / double(n)));
}

/// The full weights of one encoder layer (nn::Linear layout), non-trivial norms.
struct FullEncoder {
  int64_t E, H, F;
  Tensor wq, bq, wk, bk, wv, bv, wo, bo, wi, bi, wf, bf, g1, b1, g2, b2;
  FullEncoder(int64_t e, int64_t h, int64_t f) : E(e), H(h), F(f) {
    uint64_t seed = 300;
    auto r = [&](const Shape& s, double lo, double hi) {
      return random_tensor(s, kFloat32, seed++, Layout::Contiguous, lo, hi);
    };
    const double a = 1.0 / std::sqrt(double(e)), c = 1.0 / std::sqrt(double(f));
    wq = r({e, e}, -a, a), bq = r({e}, -0.1, 0.1), wk = r({e, e}, -a, a), bk = r({e}, -0.1, 0.1);
    wv = r({e, e}, -a, a), bv = r({e}, -0.1, 0.1), wo = r({e, e}, -a, a), bo = r({e}, -0.1, 0.1);
    wi = r({f, e}, -a, a), bi = r({f}, -0.1, 0.1), wf = r({e, f}, -c, c), bf = r({e}, -0.1, 0.1);
    g1 = r({e}, 0.5, 1.5), b1 = r({e}, -0.5, 0.5), g2 = r({e}, 0.5, 1.5), b2 = r({e}, -0.5, 0.5);
  }
  void load_into(parallel::TensorParallelEncoderLayer& layer) const {
    layer.query->load_full(wq, bq), layer.key->load_full(wk, bk), layer.value->load_full(wv, bv);
    layer.attention_output->load_full(wo, bo);
    layer.intermediate->load_full(wi, bi), layer.output->load_full(wf, bf);
    autograd::NoGradGuard no_grad;
    layer.attention_norm->weight.detach().copy_(g1), layer.attention_norm->bias.detach().copy_(b1);
    layer.output_norm->weight.detach().copy_(g2), layer.output_norm->bias.detach().copy_(b2);
  }

  /// The layer in one process with its dropouts spelled out: BertLayer's (post-norm) or
  /// torchvision EncoderBlock's (pre-norm) places, rank r's heads and MLP columns from
  /// Generator(seed + 2718 + r), the hidden outputs from Generator(seed).
  Tensor forward(const Tensor& x, const Tensor& mask, bool pre_norm, int p, double ph, double pa, uint64_t seed) const {
    const int64_t B = x.size(0), T = x.size(1), D = E / H, hp = H / p, fp = F / p;
    Generator replicated(seed);
    std::vector<std::unique_ptr<Generator>> split;
    for (int r = 0; r < p; ++r) split.push_back(std::make_unique<Generator>(seed + 2718 + uint64_t(r)));
    auto heads = [&](const Tensor& y) { return y.unflatten(-1, {H, D}).transpose(1, 2); };
    auto attention = [&](const Tensor& h) {
      const Tensor q = heads(linear(h, wq, bq)), k = heads(linear(h, wk, bk)), v = heads(linear(h, wv, bv));
      std::vector<Tensor> ctx;
      for (int r = 0; r < p; ++r) {
        auto mine = [&](const Tensor& t) { return t.narrow(1, r * hp, hp); };
        ctx.push_back(scaled_dot_product_attention(mine(q), mine(k), mine(v), mask, false, pa, {}, split[r].get()));
      }
      const Tensor merged = cat(ctx, 1).transpose(1, 2).reshape({B, T, E});
      return dropout(linear(merged, wo, bo), ph, true, &replicated);
    };
    auto mlp = [&](const Tensor& h) {
      Tensor a = gelu(linear(h, wi, bi));
      if (pre_norm) {
        std::vector<Tensor> cols;
        for (int r = 0; r < p; ++r)
          cols.push_back(dropout(a.narrow(-1, r * fp, fp).contiguous(), ph, true, split[r].get()));
        a = cat(cols, -1);
      }
      return dropout(linear(a, wf, bf), ph, true, &replicated);
    };
    auto ln = [&](const Tensor& t, const Tensor& g, const Tensor& b) { return layer_norm(t, {E}, g, b, 1e-12); };
    if (pre_norm) {
      const Tensor h = add(x, attention(ln(x, g1, b1)));
      return add(h, mlp(ln(h, g2, b2)));
    }
    const Tensor h = ln(add(x, attention(x)), g1, b1);
    return ln(add(h, mlp(h)), g2, b2);
  }
};

/// A TP model (BERT or ViT) from `config` and the same one from `config` without dropout,
/// both holding this rank's shards of `full`.
template <typename Model, typename Config>
std::pair<std::unique_ptr<Model>, std::unique_ptr<Model>> with_and_without_dropout(
    const Config& config, const Config& no_dropout, const CommPtr& comm, const std::map<std::string, Tensor>& full) {
  auto with = std::make_unique<Model>(config, comm, /*seed=*/3), without = std::make_unique<Model>(no_dropout, comm, 3);
  models::load_full_state_dict(*with, full);
  models::load_full_state_dict(*without, full);
  return {std::move(with), std::move(without)};
}

/// Keys of the encoder layer's parameters that every rank holds whole.
bool replicated_param(const std::string& k) {
  return k.find("norm") != std::string::npos || k == "attention_output.bias" || k == "output.bias";
}

}  // namespace

TEST_CASE("tensor parallel dropout: the replicated stream is shared by the ranks, the split streams differ") {
  const double p = 0.3;
  const int64_t n = 20000;
  for (int ranks : {2, 4}) {
    CAPTURE(ranks);
    PerRank<Results> got(static_cast<size_t>(ranks));
    parallel::run_ranks(ranks, [&](const CommPtr& comm) {
      parallel::TensorParallelRng rng(77, comm);
      CHECK(rng.replicated.seed() == 77);
      CHECK(rng.split.seed() == 77 + 2718 + uint64_t(comm->rank()));
      Results& out = got[size_t(comm->rank())];
      out["replicated"] = dropout(ones({n}), p, true, &rng.replicated);
      out["split"] = dropout(ones({n}), p, true, &rng.split);
    });
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      const Results& out = got[size_t(r)];
      check_drop_rate(zero_fraction(out.at("replicated")), p, n, "replicated");
      check_drop_rate(zero_fraction(out.at("split")), p, n, "split");
      CHECK(values_of(out.at("replicated")) == values_of(got[0].at("replicated")));
      for (int s = 0; s < r; ++s) CHECK(values_of(out.at("split")) != values_of(got[size_t(s)].at("split")));
    }
  }
  parallel::TensorParallelRng single(5, nullptr);  // a null communicator is rank 0
  CHECK(single.split.seed() == 5 + 2718);
}

TEST_CASE("tensor parallel dropout: the encoder layer in training equals one process with the same streams") {
  const int64_t E = 16, H = 4, F = 32, B = 2, T = 6;
  const double ph = 0.2, pa = 0.3;
  const uint64_t seed = 91;
  const FullEncoder full(E, H, F);
  const Tensor x = random_tensor({B, T, E}, kFloat32, 41);
  const Tensor c = random_tensor({B, T, E}, kFloat32, 42);
  Tensor mask = ones({B, 1, 1, T}, kBool);
  mask.narrow(0, 1, 1).narrow(3, T - 2, 2).copy_(zeros({1, 1, 1, 2}, kBool));
  for (bool pre_norm : {false, true}) {
    for (int p : {1, 2, 4}) {
      CAPTURE(pre_norm);
      CAPTURE(p);
      const Tensor want = full.forward(x, mask, pre_norm, p, ph, pa, seed);
      const Tensor plain = full.forward(x, mask, pre_norm, p, 0.0, 0.0, seed);
      PerRank<Results> got(static_cast<size_t>(p));
      run_on(p, [&](const CommPtr& comm) {
        Results& out = got[size_t(parallel::tp_rank(comm))];
        parallel::TensorParallelEncoderLayer layer(
            E, H, F, comm, {.pre_norm = pre_norm, .hidden_dropout = ph, .attention_dropout = pa, .dropout_seed = seed});
        full.load_into(layer);
        Tensor xi = x.detach().clone();
        xi.requires_grad_();
        const Tensor y = layer.forward(xi, mask);
        sum(mul(y, c)).backward();
        out["y"] = y.detach(), out["xg"] = xi.grad();
        for (const auto& [k, t] : layer.named_parameters())
          if (replicated_param(k)) out[k] = t.grad();
        layer.eval();
        out["eval"] = layer.forward(x, mask).detach();
      });
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        const Results& out = got[size_t(r)];
        check_equiv(out.at("y"), want.detach(), "training output");
        // bitwise replicated: the output, the input gradient, the replicated parameters' grads
        for (const auto& [k, t] : out)
          if (k != "eval") CHECK_MESSAGE(values_of(t) == values_of(got[0].at(k)), k);
        // eval drops nothing: exactly the p = 0 result of the same layer
        check_equiv(out.at("eval"), plain.detach(), "eval output");
      }
      CHECK(values_of(got[0].at("y")) != values_of(got[0].at("eval")));  // dropout did act in training
    }
  }
}

TEST_CASE("tensor parallel dropout: eval mode with dropout gives the p = 0 layer's outputs bitwise") {
  const int64_t E = 16, H = 4, F = 32;
  const FullEncoder full(E, H, F);
  const Tensor x = random_tensor({2, 5, E}, kFloat32, 43);
  for (bool pre_norm : {false, true}) {
    CAPTURE(pre_norm);
    PerRank<Results> got(2);
    parallel::run_ranks(2, [&](const CommPtr& comm) {
      parallel::TensorParallelEncoderLayer with(
          E, H, F, comm, {.pre_norm = pre_norm, .hidden_dropout = 0.5, .attention_dropout = 0.5});
      parallel::TensorParallelEncoderLayer without(E, H, F, comm, {.pre_norm = pre_norm});
      full.load_into(with), full.load_into(without);
      with.eval();
      got[size_t(comm->rank())]["with"] = with.forward(x).detach();
      got[size_t(comm->rank())]["without"] = without.forward(x).detach();
      CHECK(with.dropout.rng->replicated.offset() == 0);  // nothing was drawn
      CHECK(with.dropout.rng->split.offset() == 0);
    });
    for (const Results& out : got) CHECK(values_of(out.at("with")) == values_of(out.at("without")));
  }
}

TEST_CASE("tensor parallel dropout: the hidden dropout drops a fraction p, the same elements on every rank") {
  // Attention output weight 0 and bias 1, MLP output 0: a pre-norm layer returns
  // x + dropout(1), so y - x is the replicated mask scaled by 1 / (1 - p).
  const int64_t E = 16, H = 4, F = 32, B = 4, T = 32;
  const double ph = 0.3;
  const Tensor x = random_tensor({B, T, E}, kFloat32, 44);
  for (int p : {2, 4}) {
    CAPTURE(p);
    PerRank<Tensor> got(static_cast<size_t>(p));
    parallel::run_ranks(p, [&](const CommPtr& comm) {
      parallel::TensorParallelEncoderLayer layer(E, H, F, comm, {.pre_norm = true, .hidden_dropout = ph});
      layer.attention_output->load_full(zeros({E, E}), ones({E}));
      layer.output->load_full(zeros({E, F}), zeros({E}));
      got[size_t(comm->rank())] = sub(layer.forward(x), x).detach();
    });
    check_drop_rate(zero_fraction(got[0]), ph, B * T * E, "hidden dropout");
    for (double v : values_of(got[0]))
      if (v != 0.0) CHECK(v == doctest::Approx(1.0 / (1.0 - ph)).epsilon(1e-5));
    for (int r = 1; r < p; ++r) CHECK(values_of(got[size_t(r)]) == values_of(got[0]));
  }
}

TEST_CASE("tensor parallel dropout: each rank's heads and MLP columns get their own masks") {
  // Every rank's shard of q, k, v (and of the MLP's first layer) is the same block, so the
  // ranks' attention contexts (MLP activations) are equal without split-region dropout; a
  // rank's gradient of its attention_output (output) weight shard is g^T ctx (g^T act),
  // g replicated: equal shards without dropout, different ones when each rank drops its own.
  const int64_t E = 16, H = 4, F = 32, B = 2, T = 8;
  const int p = 2;
  const Tensor x = random_tensor({B, T, E}, kFloat32, 45);
  auto tiled = [&](const Tensor& block) { return cat({block, block}, 0); };
  const Tensor w = tiled(random_tensor({E / p, E}, kFloat32, 46)), b = tiled(random_tensor({E / p}, kFloat32, 47));
  const Tensor wi = tiled(random_tensor({F / p, E}, kFloat32, 48)), bi = tiled(random_tensor({F / p}, kFloat32, 49));
  struct Case {
    bool pre_norm;
    double ph, pa;
    bool attention_masks_differ, mlp_masks_differ;
  };
  const Case cases[] = {{false, 0.0, 0.0, false, false},  // the control: equal shards
                        {false, 0.0, 0.4, true, false},   // attention probabilities: split
                        {false, 0.4, 0.0, false, false},  // BERT's hidden dropout: replicated only
                        {true, 0.4, 0.0, false, true}};   // ViT's mlp.2: split
  for (const Case& cs : cases) {
    CAPTURE(cs.pre_norm);
    CAPTURE(cs.ph);
    CAPTURE(cs.pa);
    PerRank<Results> got(p);
    parallel::run_ranks(p, [&](const CommPtr& comm) {
      Generator init(9);  // the same full weights on every rank (the default generator is shared by the threads)
      parallel::TensorParallelEncoderLayer layer(
          E, H, F, comm,
          {.pre_norm = cs.pre_norm, .generator = &init, .hidden_dropout = cs.ph, .attention_dropout = cs.pa});
      layer.query->load_full(w, b), layer.key->load_full(w, b), layer.value->load_full(w, b);
      layer.intermediate->load_full(wi, bi);
      sum(layer.forward(x)).backward();
      got[size_t(comm->rank())]["attention"] = layer.attention_output->weight.grad();
      got[size_t(comm->rank())]["mlp"] = layer.output->weight.grad();
    });
    CHECK((values_of(got[0].at("attention")) != values_of(got[1].at("attention"))) == cs.attention_masks_differ);
    CHECK((values_of(got[0].at("mlp")) != values_of(got[1].at("mlp"))) == cs.mlp_masks_differ);
  }
}

TEST_CASE("tensor parallel dropout: the TP BERT trains with dropout; loss and replicated grads equal across ranks") {
  models::BertConfig c = small_bert();
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.1;
  std::map<std::string, Tensor> full_state;
  for (const auto& [k, t] : bert_reference_model()->state_dict()) full_state[k] = t.detach();
  const BertBatch batch = bert_batch();
  for (int p : {2, 4}) {
    CAPTURE(p);
    const PerRank<Results> got = each_rank(p, [&](const CommPtr& comm, Results& out) {
      auto [tp_model, plain_model] =
          with_and_without_dropout<models::TensorParallelBertForMaskedLM>(c, small_bert(), comm, full_state);
      models::TensorParallelBertForMaskedLM &tp = *tp_model, &plain = *plain_model;
      out["plain"] = plain.forward(batch.ids, batch.mask, batch.types, batch.labels).local_logits.detach();
      tp.eval();
      out["eval"] = tp.forward(batch.ids, batch.mask, batch.types, batch.labels).local_logits.detach();
      tp.train();
      for (int step = 0; step < 2; ++step) {  // forward, backward, SGD, then once more
        const Tensor loss = tp.forward(batch.ids, batch.mask, batch.types, batch.labels).loss;
        loss.backward();
        out["loss" + std::to_string(step)] = loss.detach();
        autograd::NoGradGuard no_grad;
        for (const auto& [k, t] : tp.named_parameters()) {
          if (tp.split_dim(k) < 0 && step == 0) out["grad " + k] = t.grad().clone();
          t.detach().copy_(sub(t.detach(), mul(t.grad(), 0.1)));
        }
        tp.zero_grad();
      }
      out["plain loss"] = plain.forward(batch.ids, batch.mask, batch.types, batch.labels).loss.detach();
    });
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const Results& out = got[size_t(r)];
      CHECK(values_of(out.at("eval")) == values_of(out.at("plain")));  // eval drops nothing
      for (const auto& [k, t] : out) {
        CAPTURE(k);
        for (double v : values_of(t)) CHECK(std::isfinite(v));
        if (k != "eval" && k != "plain") CHECK(values_of(t) == values_of(got[0].at(k)));  // logits are split
      }
    }
    CHECK(got[0].size() > 20);                                                   // the replicated grads are there
    CHECK(values_of(got[0].at("loss0")) != values_of(got[0].at("plain loss")));  // dropout acted
    CHECK(values_of(got[0].at("loss1")) != values_of(got[0].at("loss0")));       // new weights, new masks
  }
}

TEST_CASE("tensor parallel dropout: the TP ViT trains with dropout; eval equals the dropout-free model") {
  models::ViTConfig c = small_vit();
  c.dropout = 0.1;
  c.attention_dropout = 0.1;
  std::map<std::string, Tensor> full_state;
  for (const auto& [k, t] : vit_reference_model()->state_dict()) full_state[k] = t.detach();
  const Tensor images = random_tensor({3, 3, 16, 16}, kFloat32, 50);
  const Tensor labels = from_vector<int64_t>({7, 0, 3}, {3});
  for (int p : {2, 4}) {
    CAPTURE(p);
    const PerRank<Results> got = each_rank(p, [&](const CommPtr& comm, Results& out) {
      auto [tp_model, plain_model] =
          with_and_without_dropout<models::TensorParallelVisionTransformer>(c, small_vit(), comm, full_state);
      models::TensorParallelVisionTransformer &tp = *tp_model, &plain = *plain_model;
      tp.eval();
      out["eval"] = tp.forward(images).detach();
      out["plain"] = plain.forward(images).detach();
      tp.train();
      const Tensor loss = cross_entropy(tp.forward(images), labels);
      loss.backward();
      out["loss"] = loss.detach();
      out["plain loss"] = cross_entropy(out.at("plain"), labels);
      for (const auto& [k, t] : tp.named_parameters())
        if (tp.split_dim(k) < 0) out["grad " + k] = t.grad();
    });
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const Results& out = got[size_t(r)];
      CHECK(values_of(out.at("eval")) == values_of(out.at("plain")));
      CHECK(std::isfinite(out.at("loss").item<double>()));
      CHECK(values_of(out.at("loss")) != values_of(out.at("plain loss")));
      for (const auto& [k, t] : out) CHECK_MESSAGE(values_of(t) == values_of(got[0].at(k)), k);
    }
  }
}
