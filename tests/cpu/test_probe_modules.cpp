// Probes for silent wrong answers on the CPU in the nn/ and optim/ layers, against what
// PyTorch documents: a parameter shared by two modules (tied weights, a shared submodule,
// BERT's MLM decoder) listed once, stepped once and kept shared by to(); Module::to(dtype)
// on floating and integer buffers; BatchNorm2d's running statistics (momentum, cumulative
// average, unbiased variance, the counter, eval); train()/eval() through nested children;
// Dropout, LayerNorm without affine, Embedding's padding_idx; optimizer param groups,
// skipped parameters, a tensor in two groups, zero_grad, SGD/Adam/AdamW with every option
// against float64 loops, a mid-training state dict round trip, and a step after the model
// changed dtype under the optimizer. Every value is checked against a float64 reference
// computed here. A failing case here is a finding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "models/bert.h"
#include "nn/batch_norm.h"
#include "nn/container.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tests/optimizer_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;

Tensor f64(const Values& v, const Shape& shape) { return from_vector(v, shape, TensorOptions(kFloat64)); }

Tensor f64_param(const Values& v, const Shape& shape) {
  Tensor t = f64(v, shape);
  t.requires_grad_();
  return t;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  const Values x = values_of(a), y = values_of(b);
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

// ---- tied weights: a decoder whose weight is an embedding's (BERT's MLM head, GPT's lm_head) ----

struct Encoder : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  Encoder() { emb = register_module("emb", std::make_shared<nn::Embedding>(5, 3)); }
  std::string type_name() const override { return "Encoder"; }
};

struct Decoder : nn::Module {
  Tensor weight, bias;
  explicit Decoder(const Tensor& tied) {
    weight = register_parameter("weight", tied);  // the very tensor, as `decoder.weight = emb.weight` in torch
    bias = register_parameter("bias", zeros({5}));
  }
  std::string type_name() const override { return "Decoder"; }
};

struct TiedLM : nn::Module {
  std::shared_ptr<Encoder> enc;
  std::shared_ptr<Decoder> dec;
  TiedLM() {
    enc = register_module("enc", std::make_shared<Encoder>());
    dec = register_module("dec", std::make_shared<Decoder>(enc->emb->weight));
  }
  /// sum(linear(emb(ids), W, b)) with W used twice.
  Tensor loss(const Tensor& ids) { return sum(linear((*enc->emb)(ids), dec->weight, dec->bias)); }
  std::string type_name() const override { return "TiedLM"; }
};

/// d loss / d W for TiedLM::loss (W: (V, D), ids: N indices): the decoder's use gives every
/// row sum_n W[ids[n]]; the embedding's use gives row ids[n] the column sums of W, once per n.
Values tied_grad_ref(const Values& w, int64_t V, int64_t D, const std::vector<int64_t>& ids) {
  Values h_sum(size_t(D), 0.0), col(size_t(D), 0.0), g(size_t(V * D), 0.0);
  for (int64_t n : ids)
    for (int64_t d = 0; d < D; ++d) h_sum[d] += w[n * D + d];
  for (int64_t j = 0; j < V; ++j)
    for (int64_t d = 0; d < D; ++d) col[d] += w[j * D + d];
  for (int64_t j = 0; j < V; ++j)
    for (int64_t d = 0; d < D; ++d) g[j * D + d] = h_sum[d];
  for (int64_t n : ids)
    for (int64_t d = 0; d < D; ++d) g[n * D + d] += col[d];
  return g;
}

}  // namespace

// ============================================================================================
// Shared parameters
// ============================================================================================

TEST_CASE("probe nn: a parameter registered in two modules is listed once and aliased in state_dict") {
  manual_seed(11);
  TiedLM m;
  // torch: named_parameters() / parameters() skip a tensor already seen; state_dict() keeps every key.
  CHECK(m.dec->weight.impl_ptr() == m.enc->emb->weight.impl_ptr());
  CHECK(names_of(m.named_parameters()) == std::vector<std::string>{"enc.emb.weight", "dec.bias"});
  CHECK(m.parameters().size() == 2);
  CHECK(m.num_parameters() == 5 * 3 + 5);
  const nn::NamedTensors sd = m.state_dict();
  CHECK(names_of(sd) == std::vector<std::string>{"enc.emb.weight", "dec.weight", "dec.bias"});
  CHECK(entry(sd, "dec.weight").impl_ptr() == entry(sd, "enc.emb.weight").impl_ptr());

  // A state dict round trip writes the one tensor (both keys hold the same values).
  TiedLM other;
  other.load_state_dict(m.state_dict());
  CHECK(bit_equal(other.enc->emb->weight, m.enc->emb->weight));
  CHECK(other.dec->weight.impl_ptr() == other.enc->emb->weight.impl_ptr());

  // to() converts the one tensor: the two modules still share it afterwards.
  m.to(kFloat64);
  CHECK(m.dec->weight.dtype() == kFloat64);
  CHECK(m.enc->emb->weight.dtype() == kFloat64);
  CHECK(m.dec->weight.shares_storage(m.enc->emb->weight));
}

TEST_CASE("probe nn: a tied weight gets the sum of both uses' gradients and one optimizer step") {
  manual_seed(12);
  const std::vector<int64_t> ids{1, 3, 1};
  for (const char* opt_name : {"SGD", "Adam"}) {
    CAPTURE(opt_name);
    TiedLM m;
    m.to(kFloat64);
    const Values w0 = values_of(m.enc->emb->weight);
    std::unique_ptr<optim::Optimizer> opt;
    if (std::string(opt_name) == "SGD")
      opt = std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1});
    else opt = std::make_unique<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = 0.1});
    m.loss(from_vector<int64_t>(ids, {3})).backward();
    const Values g = tied_grad_ref(w0, 5, 3, ids);
    REQUIRE(m.enc->emb->weight.grad().defined());
    check_close(m.enc->emb->weight.grad(), g, 1e-12, 1e-12, "tied weight's gradient");
    opt->step();
    Values want = w0;
    if (std::string(opt_name) == "SGD") {
      SgdReference ref{.lr = 0.1};
      ref.step(want, g);
    } else {
      AdamReference ref{.lr = 0.1};
      ref.step(want, g);
    }
    check_close(m.enc->emb->weight, want, 1e-12, 1e-12, "tied weight after one step");
    check_close(m.dec->weight, want, 1e-12, 1e-12, "the decoder sees the same weight");
  }
}

TEST_CASE("probe nn: a submodule used twice is listed once; clip_grad_norm_ counts its gradient once") {
  struct Twice : nn::Module {
    std::shared_ptr<nn::Linear> a, b;
    Twice() {
      a = register_module("a", std::make_shared<nn::Linear>(2, 2));
      b = register_module("b", a);  // torch: self.b = self.a
    }
    std::string type_name() const override { return "Twice"; }
  };
  Twice m;
  CHECK(names_of(m.named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
  CHECK(m.state_dict().size() == 4);  // a.weight, a.bias, b.weight, b.bias (torch keeps all four)
  m.to(kFloat64);
  m.a->weight.set_grad(f64({3, 0, 0, 0}, {2, 2}));
  m.a->bias.set_grad(f64({0, 4}, {2}));
  CHECK(optim::clip_grad_norm_(m.parameters(), 100.0) == doctest::Approx(5.0).epsilon(1e-12));
  const Values b0 = values_of(m.a->bias);
  optim::SGD opt(m.parameters(), {.lr = 1.0});  // torch accepts model.parameters() here
  opt.step();
  check_close(m.b->bias, {b0[0], b0[1] - 4.0}, 1e-15, 0, "stepped once");
}

TEST_CASE("probe nn: BertForMaskedLM's parameters hold every tensor once; the tie survives to()") {
  models::BertConfig c;
  c.vocab_size = 30, c.hidden_size = 8, c.num_hidden_layers = 1, c.num_attention_heads = 2;
  c.intermediate_size = 16, c.max_position_embeddings = 8, c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  manual_seed(3);
  models::BertForMaskedLM mlm(c);
  std::set<const void*> storages;
  for (const Tensor& p : mlm.parameters())
    CHECK_MESSAGE(storages.insert(p.impl().storage.get()).second, "two parameters share storage: ", p.describe());
  mlm.to(kFloat64);
  const nn::NamedTensors sd = mlm.state_dict();
  CHECK(entry(sd, "cls.predictions.decoder.weight").impl_ptr() ==
        entry(sd, "bert.embeddings.word_embeddings.weight").impl_ptr());
  CHECK(entry(sd, "cls.predictions.decoder.weight").dtype() == kFloat64);
  CHECK(entry(sd, "cls.predictions.decoder.bias").impl_ptr() == entry(sd, "cls.predictions.bias").impl_ptr());
}

// ============================================================================================
// Module modes, dtypes and layers
// ============================================================================================

TEST_CASE("probe nn: to(dtype) converts parameters, gradients and floating buffers; integer buffers keep theirs") {
  nn::BatchNorm2d bn(2);
  bn.to(kFloat64);
  const Tensor x = random_tensor({2, 2, 2, 1}, kFloat64, 5);
  bn(x);
  bn(x);
  bn.weight.set_grad(f64({0.5, -0.25}, {2}));
  const Values rm = values_of(bn.running_mean);
  Tensor held = bn.running_var;  // a handle taken before the conversion
  bn.to(kFloat32);
  CHECK(bn.weight.dtype() == kFloat32);
  CHECK(bn.weight.grad().dtype() == kFloat32);
  check_close(bn.weight.grad(), {0.5, -0.25}, 0, 0, "gradient converted");
  CHECK(bn.running_mean.dtype() == kFloat32);
  CHECK(held.dtype() == kFloat32);
  CHECK(bn.num_batches_tracked.dtype() == kInt64);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);
  check_close(bn.running_mean, rm, 1e-6, 1e-7, "running_mean converted");
  bn.to(kBFloat16);
  CHECK(bn.num_batches_tracked.dtype() == kInt64);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);
}

TEST_CASE("probe nn: BatchNorm2d running statistics follow PyTorch's momentum rule with unbiased variance") {
  const int64_t N = 2, C = 3, H = 2, W = 2, M = N * H * W;
  struct Case {
    std::optional<double> momentum;
  };
  for (const Case k : {Case{0.1}, Case{0.5}, Case{std::nullopt}, Case{0.0}}) {
    CAPTURE(k.momentum.value_or(-1.0));
    nn::BatchNorm2d bn(C, {.momentum = k.momentum});
    bn.to(kFloat64);
    {
      autograd::NoGradGuard no_grad;
      bn.weight.copy_(f64({1.5, -0.5, 2.0}, {C}));
      bn.bias.copy_(f64({0.25, 1.0, -3.0}, {C}));
    }
    Values rm(C, 0.0), rv(C, 1.0);
    for (int b = 0; b < 3; ++b) {
      const Values xv = random_values(N * C * H * W, 40 + b, -3.0, 5.0);
      const Tensor x = f64(xv, {N, C, H, W});
      const Tensor y = bn(x);
      const double mom = k.momentum ? *k.momentum : 1.0 / double(b + 1);
      Values want(xv.size());
      for (int64_t c = 0; c < C; ++c) {
        double s = 0, ss = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < H * W; ++j) s += xv[(n * C + c) * H * W + j];
        const double mu = s / M;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < H * W; ++j) ss += std::pow(xv[(n * C + c) * H * W + j] - mu, 2);
        const double w = values_of(bn.weight)[c], bi = values_of(bn.bias)[c];
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < H * W; ++j) {
            const size_t i = (n * C + c) * H * W + j;
            want[i] = (xv[i] - mu) / std::sqrt(ss / M + 1e-5) * w + bi;  // biased variance
          }
        rm[c] = (1 - mom) * rm[c] + mom * mu;
        rv[c] = (1 - mom) * rv[c] + mom * ss / (M - 1);  // unbiased
      }
      check_close(y, want, 1e-12, 1e-12, "training output, batch " + std::to_string(b));
      check_close(bn.running_mean, rm, 1e-12, 1e-12, "running_mean after batch " + std::to_string(b));
      check_close(bn.running_var, rv, 1e-12, 1e-12, "running_var after batch " + std::to_string(b));
      CHECK(bn.num_batches_tracked.item<int64_t>() == b + 1);
    }
    // eval: the running statistics, untouched, and the counter stays.
    bn.eval();
    const Values mean_before_eval = values_of(bn.running_mean);
    const Values xv = random_values(N * C * H * W, 77);
    const Tensor y = bn(f64(xv, {N, C, H, W}));
    Values want(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      const size_t c = (i / (H * W)) % C;
      want[i] = (xv[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * values_of(bn.weight)[c] + values_of(bn.bias)[c];
    }
    check_close(y, want, 1e-12, 1e-12, "eval output");
    CHECK(values_of(bn.running_mean) == mean_before_eval);  // eval leaves running_mean, bit for bit
    CHECK(bn.num_batches_tracked.item<int64_t>() == 3);
  }
}

TEST_CASE("probe nn: BatchNorm2d without running statistics normalizes with the batch's in eval too") {
  nn::BatchNorm2d bn(2, {.affine = false, .track_running_stats = false});
  CHECK(bn.parameters().empty());
  CHECK(bn.state_dict().empty());
  bn.eval();
  const Tensor x = f64({1, 3, 10, 20, 5, 7, 30, 40}, {2, 2, 2, 1});
  // channel 0: {1, 3, 5, 7}: mean 4, biased var 5; channel 1: {10, 20, 30, 40}: mean 25, var 125
  Values want{1, 3, 10, 20, 5, 7, 30, 40};
  for (size_t i = 0; i < want.size(); ++i) {
    const bool c1 = (i / 2) % 2 == 1;
    want[i] = (want[i] - (c1 ? 25.0 : 4.0)) / std::sqrt((c1 ? 125.0 : 5.0) + 1e-5);
  }
  check_close(bn(x), want, 1e-12, 1e-12, "eval without running stats");
}

TEST_CASE("probe nn: train()/eval() reach every nested child; Dropout in eval is the identity") {
  struct Inner : nn::Module {
    std::shared_ptr<nn::Sequential> seq;
    Inner() {
      seq = register_module("seq",
                            std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                                std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::Dropout>(1.0)}));
    }
    std::string type_name() const override { return "Inner"; }
  };
  struct Outer : nn::Module {
    std::shared_ptr<Inner> inner;
    Outer() { inner = register_module("inner", std::make_shared<Inner>()); }
    std::string type_name() const override { return "Outer"; }
  };
  Outer m;
  m.eval();
  for (const auto& [name, child] : m.named_modules()) CHECK_MESSAGE(!child->is_training(), name);
  const Tensor x = random_tensor({4, 5}, kFloat64, 9);
  CHECK(bit_equal((*m.inner->seq)(x), x));
  m.train();
  for (const auto& [name, child] : m.named_modules()) CHECK_MESSAGE(child->is_training(), name);
  CHECK(values_of((*m.inner->seq)(x)) == Values(20, 0.0));  // p = 1 drops everything
  // p = 0.5: each element is 0 or 2x.
  const Values y = values_of((*(*m.inner->seq)[0])(x)), xv = values_of(x);
  for (size_t i = 0; i < y.size(); ++i) CHECK((y[i] == 0.0 || y[i] == 2.0 * xv[i]));
}

TEST_CASE("probe nn: LayerNorm without elementwise_affine has no parameters and normalizes the trailing dims") {
  nn::LayerNorm ln({3, 2}, {.eps = 1e-3, .elementwise_affine = false});
  CHECK(ln.parameters().empty());
  CHECK(ln.state_dict().empty());
  const Values xv = random_values(2 * 3 * 2, 21, -4, 4);
  const Tensor y = ln(f64(xv, {2, 3, 2}));
  Values want(xv.size());
  for (int r = 0; r < 2; ++r) {
    double s = 0, ss = 0;
    for (int j = 0; j < 6; ++j) s += xv[r * 6 + j];
    const double mu = s / 6;
    for (int j = 0; j < 6; ++j) ss += std::pow(xv[r * 6 + j] - mu, 2);
    for (int j = 0; j < 6; ++j) want[r * 6 + j] = (xv[r * 6 + j] - mu) / std::sqrt(ss / 6 + 1e-3);
  }
  check_close(y, want, 1e-12, 1e-12, "layer norm without affine");
}

TEST_CASE("probe nn: Embedding's padding row starts at zero and gets no gradient; repeated indices accumulate") {
  manual_seed(4);
  nn::Embedding emb(5, 2, {.padding_idx = -2});  // python-style: row 3
  CHECK(values_of(emb.weight.select(0, 3)) == Values{0.0, 0.0});
  emb.to(kFloat64);
  const Tensor coeff = f64({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  sum(emb(from_vector<int64_t>({1, 3, 1, 4}, {4})) * coeff).backward();
  check_close(emb.weight.grad(), {0, 0, 1 + 5, 2 + 6, 0, 0, 0, 0, 7, 8}, 0, 0, "embedding gradient");
}

TEST_CASE("probe nn: Embedding's padding_idx -1 is the last row, as torch's; unset is none; out of range is refused") {
  manual_seed(5);
  nn::Embedding last(4, 3, {.padding_idx = -1});
  CHECK(values_of(last.weight.select(0, 3)) == Values{0.0, 0.0, 0.0});
  CHECK(last.extra_repr().find("padding_idx=3") != std::string::npos);
  sum(last(from_vector<int64_t>({3, 0}, {2}))).backward();
  CHECK(values_of(last.weight.grad().select(0, 3)) == Values{0.0, 0.0, 0.0});
  CHECK(values_of(last.weight.grad().select(0, 0)) == Values{1.0, 1.0, 1.0});
  nn::Embedding none(4, 3);
  sum(none(from_vector<int64_t>({3}, {1}))).backward();
  CHECK(values_of(none.weight.grad().select(0, 3)) == Values{1.0, 1.0, 1.0});
  check_error([] { nn::Embedding bad(4, 3, {.padding_idx = -5}); }, {"Embedding", "padding_idx", "-5"});
  check_error([] { nn::Embedding bad(4, 3, {.padding_idx = 4}); }, {"Embedding", "padding_idx", "4"});
}

TEST_CASE("probe nn: Linear on an empty batch gives an empty output; in_features 0 is refused, not garbage") {
  nn::Linear fc(3, 2);
  const Tensor y = fc(zeros({0, 3}));
  CHECK(y.sizes() == Shape{0, 2});
  check_error([] { nn::Linear bad(0, 2); }, {"Linear", "in=0"});
}

// ============================================================================================
// Optimizers
// ============================================================================================

TEST_CASE("probe optim: param groups step with their own lr and weight decay; options fill the rest") {
  Tensor a = f64_param({1.0, -2.0}, {2}), b = f64_param({0.5, 3.0}, {2});
  optim::SGD opt({{.params = {a}}, {.params = {b}, .lr = 0.01, .weight_decay = 0.5}},
                 {.lr = 0.1, .momentum = 0.9, .dampening = 0.25});
  SgdReference ra{.lr = 0.1, .momentum = 0.9, .dampening = 0.25},
      rb{.lr = 0.01, .momentum = 0.9, .dampening = 0.25, .wd = 0.5};
  Values pa = values_of(a), pb = values_of(b);
  for (int s = 0; s < 3; ++s) {
    const Values ga = random_values(2, 100 + s), gb = random_values(2, 200 + s);
    a.set_grad(f64(ga, {2}));
    b.set_grad(f64(gb, {2}));
    ra.step(pa, ga);
    rb.step(pb, gb);
    opt.step();
    check_close(a, pa, 1e-13, 1e-13, "group 0, step " + std::to_string(s));
    check_close(b, pb, 1e-13, 1e-13, "group 1, step " + std::to_string(s));
  }
}

TEST_CASE("probe optim: parameters without a gradient get no decay, no state and no step count") {
  Tensor live = f64_param({1.0, 2.0}, {2}), idle = f64_param({3.0, 4.0}, {2});
  Tensor frozen = f64({5.0, 6.0}, {2});  // requires_grad false: no gradient ever
  optim::AdamW opt({{.params = {live, idle}}, {.params = {frozen}}}, {.lr = 0.1, .weight_decay = 0.5, .amsgrad = true});
  AdamReference ref{.lr = 0.1, .wd = 0.5, .decoupled = true, .amsgrad = true};
  Values pl = values_of(live);
  for (int s = 0; s < 3; ++s) {
    const Values g = random_values(2, 300 + s);
    live.set_grad(f64(g, {2}));
    ref.step(pl, g);
    opt.step();
  }
  check_close(live, pl, 1e-13, 1e-13, "live");
  CHECK(values_of(idle) == Values{3.0, 4.0});
  CHECK(values_of(frozen) == Values{5.0, 6.0});
  CHECK(opt.state(idle) == nullptr);
  CHECK(opt.state(frozen) == nullptr);
  REQUIRE(opt.state(live) != nullptr);
  CHECK(opt.state(live)->step == 3);
  for (const auto& [key, t] : opt.state_dict()) CHECK_MESSAGE(!key.starts_with("state.1."), key);
  // idle's first gradient: its own step 1 (bias corrections at t = 1), with its decay.
  AdamReference ri{.lr = 0.1, .wd = 0.5, .decoupled = true, .amsgrad = true};
  Values pi = values_of(idle);
  const Values g = {0.5, -0.75};
  idle.set_grad(f64(g, {2}));
  live.set_grad(Tensor());
  ri.step(pi, g);
  opt.step();
  check_close(idle, pi, 1e-13, 1e-13, "idle's first step");
  CHECK(opt.state(idle)->step == 1);
  CHECK(opt.state(live)->step == 3);
  // torch steps a parameter with a gradient whatever its requires_grad says.
  frozen.set_grad(f64({1.0, 1.0}, {2}));
  idle.set_grad(Tensor());
  AdamReference rf{.lr = 0.1, .wd = 0.5, .decoupled = true, .amsgrad = true};
  Values pf = values_of(frozen);
  rf.step(pf, {1.0, 1.0});
  opt.step();
  check_close(frozen, pf, 1e-13, 1e-13, "frozen with a gradient");
}

TEST_CASE("probe optim: one tensor in two places is refused, as torch") {
  Tensor p = f64_param({1.0}, {1}), q = f64_param({2.0}, {1});
  check_error([&] { optim::SGD({{.params = {p}}, {.params = {q, p}}}, {.lr = 0.1}); }, {"more than one place"});
  check_error([&] { optim::Adam(std::vector<Tensor>{p, q, p}); }, {"more than one place"});
  optim::SGD opt(std::vector<optim::ParamGroup>{{.params = {p}}}, {.lr = 0.1});
  check_error([&] { opt.add_param_group({.params = {p}}); }, {"more than one place"});
  CHECK(opt.param_groups().size() == 1);
}

TEST_CASE("probe optim: zero_grad drops gradients (set_to_none) or zeroes the same tensor in place") {
  Tensor p = f64_param({1.0, 2.0}, {2}), q = f64_param({3.0}, {1});
  optim::SGD opt(std::vector<Tensor>{p, q}, {.lr = 0.1});
  const Tensor g = f64({4.0, 5.0}, {2});
  p.set_grad(g);
  opt.zero_grad(false);
  CHECK(p.grad().impl_ptr() == g.impl_ptr());
  CHECK(values_of(g) == Values{0.0, 0.0});
  CHECK_FALSE(q.grad().defined());
  opt.zero_grad();
  CHECK_FALSE(p.grad().defined());
  opt.step();  // nothing to do: unchanged
  CHECK(values_of(p) == Values{1.0, 2.0});
}

TEST_CASE("probe optim: SGD with Nesterov, dampening, weight decay and maximize follows torch's rule over 3 steps") {
  const optim::SGDOptions cases[] = {
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true},
      {.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.2},
      {.lr = 0.1, .momentum = 0.9, .nesterov = true, .maximize = true},
      {.lr = 0.1, .weight_decay = 0.3, .maximize = true},
  };
  for (const optim::SGDOptions& o : cases) {
    CAPTURE(o.momentum);
    CAPTURE(o.dampening);
    CAPTURE(o.nesterov);
    CAPTURE(o.maximize);
    Tensor p = f64_param({1.0, -0.5, 2.0}, {3});
    optim::SGD opt(std::vector<Tensor>{p}, o);
    SgdReference ref{.lr = o.lr,
                     .momentum = o.momentum,
                     .dampening = o.dampening,
                     .wd = o.weight_decay,
                     .nesterov = o.nesterov,
                     .maximize = o.maximize};
    Values want = values_of(p);
    const Values grads[] = {{1.0, -2.0, 0.5}, {-0.5, 0.25, 3.0}, {2.0, 2.0, -1.0}};
    for (const Values& g : grads) {
      p.set_grad(f64(g, {3}));
      ref.step(want, g);
      opt.step();
    }
    check_close(p, want, 1e-14, 1e-14, "after 3 steps");
  }
  // By hand, one element: p = 1, g = 1, 1, 1, lr 0.1, momentum 0.5, Nesterov, no decay.
  // buf 1, 1.5, 1.75; update g + 0.5 buf = 1.5, 1.75, 1.875: p = 1 - 0.1 * 5.125 = 0.4875.
  Tensor p = f64_param({1.0}, {1});
  optim::SGD opt(std::vector<Tensor>{p}, {.lr = 0.1, .momentum = 0.5, .nesterov = true});
  for (int s = 0; s < 3; ++s) {
    p.set_grad(f64({1.0}, {1}));
    opt.step();
  }
  CHECK(values_of(p)[0] == doctest::Approx(0.4875).epsilon(1e-15));
}

TEST_CASE("probe optim: a state dict saved mid-training resumes bit-identically (groups, amsgrad, skipped params)") {
  auto make = [](std::vector<Tensor>& ps) {
    ps = {f64_param(random_values(6, 1), {2, 3}), f64_param(random_values(3, 2), {3}), f64_param({1.0}, {1})};
    return std::make_unique<optim::AdamW>(
        std::vector<optim::ParamGroup>{{.params = {ps[0], ps[2]}}, {.params = {ps[1]}, .lr = 0.02, .amsgrad = true}},
        optim::AdamWOptions{.lr = 0.1, .weight_decay = 0.1});
  };
  auto grads_at = [](std::vector<Tensor>& ps, int s) {
    ps[0].set_grad(random_tensor({2, 3}, kFloat64, 500 + s));
    ps[1].set_grad(random_tensor({3}, kFloat64, 600 + s));
    ps[2].set_grad(Tensor());  // never stepped: no state to save
  };
  std::vector<Tensor> a, b;
  auto oa = make(a), ob = make(b);
  for (int s = 0; s < 2; ++s) {
    grads_at(a, s);
    oa->step();
  }
  optim::StateDict saved;
  for (const auto& [k, t] : oa->state_dict()) saved.emplace_back(k, t.clone());
  {
    autograd::NoGradGuard no_grad;
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  ob->param_groups()[0].lr = 123.0;  // overwritten by the load
  ob->load_state_dict(saved);
  CHECK(ob->param_groups()[0].lr == 0.1);
  for (int s = 2; s < 5; ++s) {
    grads_at(a, s);
    grads_at(b, s);
    oa->step();
    ob->step();
  }
  for (size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(bit_equal(a[i], b[i]), "param ", i);
  CHECK(ob->state(b[1])->step == 5);
  CHECK(ob->state(b[2]) == nullptr);
}

/// Two float32 steps of `opt` on the sum of fc over a fixed input.
void two_float32_steps(nn::Linear& fc, optim::Optimizer& opt) {
  const Tensor x = random_tensor({4, 3}, kFloat32, 8);
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad();
    sum(fc(x)).backward();
    opt.step();
  }
}

/// Converts fc to float64 and gives its weight a random gradient (the bias none); `weight`
/// gets the weight's values after the conversion. Returns the gradient.
Values to_float64_with_weight_grad(nn::Linear& fc, Values& weight, uint64_t seed) {
  fc.to(kFloat64);
  weight = values_of(fc.weight);
  const Values g = random_values(6, seed);
  fc.weight.set_grad(f64(g, {2, 3}));
  fc.bias.set_grad(Tensor());
  return g;
}

TEST_CASE("probe optim: a model converted to float64 after some steps continues from its converted state") {
  // torch.optim.Optimizer.load_state_dict casts state to its parameter's dtype; a step with
  // state of another dtype must not read it as the new one.
  SUBCASE("Adam") {
    nn::Linear fc(3, 2);
    optim::Adam opt(fc.parameters(), {.lr = 0.01, .amsgrad = true});
    two_float32_steps(fc, opt);
    const optim::ParamState* st = opt.state(fc.weight);
    REQUIRE(st != nullptr);
    AdamReference ref{.lr = 0.01, .amsgrad = true};
    ref.m = values_of(st->buffers[0]), ref.v = values_of(st->buffers[1]), ref.vmax = values_of(st->buffers[2]);
    ref.t = 2;
    Values want;
    const Values g = to_float64_with_weight_grad(fc, want, 31);
    ref.step(want, g);
    opt.step();
    check_close(fc.weight, want, 1e-12, 1e-12, "the float64 step");
    CHECK(opt.state(fc.weight)->buffers[0].dtype() == kFloat64);
  }
  SUBCASE("SGD with momentum") {
    nn::Linear fc(3, 2);
    optim::SGD opt(fc.parameters(), {.lr = 0.1, .momentum = 0.9});
    two_float32_steps(fc, opt);
    SgdReference ref{.lr = 0.1, .momentum = 0.9};
    ref.buf = values_of(opt.state(fc.weight)->buffers[0]);
    Values want;
    const Values g = to_float64_with_weight_grad(fc, want, 32);
    ref.step(want, g);
    opt.step();
    check_close(fc.weight, want, 1e-12, 1e-12, "the float64 step");
  }
}

TEST_CASE("probe nn: Dropout with p = 1 gives zeros and zero gradients; p = 0 passes input and gradient through") {
  nn::Dropout all(1.0), none(0.0);
  Tensor x = f64_param(random_values(6, 3), {2, 3});
  const Tensor g = f64(random_values(6, 4), {2, 3});
  sum(all(x) * g).backward();
  CHECK(values_of(x.grad()) == Values(6, 0.0));  // not NaN from 0 / (1 - p)
  x.set_grad(Tensor());
  CHECK(bit_equal(none(x), x));
  sum(none(x) * g).backward();
  CHECK(bit_equal(x.grad(), g));
}

TEST_CASE("probe optim: a float32 model converted to float16 after steps keeps its float32 state and goes on") {
  nn::Linear fc(3, 2);
  optim::AdamW opt(fc.parameters(), {.lr = 0.01, .weight_decay = 0.1});
  for (int s = 0; s < 2; ++s) {
    fc.weight.set_grad(random_tensor({2, 3}, kFloat32, 70 + s));
    fc.bias.set_grad(random_tensor({2}, kFloat32, 80 + s));
    opt.step();
  }
  AdamReference ref{.lr = 0.01, .wd = 0.1, .decoupled = true};
  ref.m = values_of(opt.state(fc.weight)->buffers[0]), ref.v = values_of(opt.state(fc.weight)->buffers[1]);
  ref.vmax = Values(6, 0.0);  // unused without amsgrad
  ref.t = 2;
  fc.to(kFloat16);
  Values want = values_of(fc.weight);
  const Tensor g = random_tensor({2, 3}, kFloat16, 90);
  fc.weight.set_grad(g);
  fc.bias.set_grad(Tensor());
  ref.step(want, values_of(g));
  opt.step();
  CHECK(opt.state(fc.weight)->buffers[0].dtype() == kFloat32);
  check_close(fc.weight, want, 1e-3, 1e-4, "the float16 step (float32 math, rounded once)");
  check_close(opt.state(fc.weight)->buffers[0], ref.m, 1e-6, 1e-7, "exp_avg");
}

TEST_CASE("probe optim: a group added after some steps is numbered after the others; the state dict round trips") {
  Tensor a = f64_param({1.0, 2.0}, {2}), b = f64_param({3.0}, {1});
  optim::SGD opt(std::vector<Tensor>{a}, {.lr = 0.1, .momentum = 0.9});
  a.set_grad(f64({1.0, -1.0}, {2}));
  opt.step();
  opt.add_param_group({.params = {b}, .lr = 0.5, .momentum = 0.5});
  b.set_grad(f64({2.0}, {1}));
  opt.step();
  const optim::StateDict sd = opt.state_dict();
  CHECK(values_of(entry(sd, "param_groups.1.params")) == Values{1.0});
  CHECK(values_of(entry(sd, "state.1.momentum_buffer")) == Values{2.0});
  CHECK(values_of(entry(sd, "state.0.momentum_buffer")) == Values{0.9 * 1.0 + 1.0, 0.9 * -1.0 - 1.0});
  CHECK(values_of(b) == Values{3.0 - 0.5 * 2.0});
}
