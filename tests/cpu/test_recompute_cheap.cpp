// Selective recompute of cheap outputs (Note [Recomputable outputs]): gradients and running
// statistics against the plain run (float64 exactly, float32 to 1e-6) for the fused batch norm
// + ReLU ops, layer norm and GELU, a small ResNet, BERT and ViT; the memory the forward keeps,
// from the CPU arena's statistics against the bytes of the outputs that became recipes (from
// their shapes); the allocator's trace (the output's block is freed in the forward, recipes run
// in the backward); in-place writes, retain_graph, nesting with checkpoint, the length limit.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "autograd/recompute_cheap.h"
#include "memory/allocator.h"
#include "memory/trace.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/init.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::RecomputeCheapOutputs;
using autograd::recompute::is_recomputable;

namespace {

Tensor leaf(const Shape& s, DType dtype, uint64_t seed, double scale = 1.0) {
  Tensor t = mul(random_tensor(s, dtype, seed), scale);
  t.requires_grad_();
  return t;
}

int64_t bytes_of(const Shape& s, DType dtype) { return numel_of(s) * int64_t(element_size(dtype)); }

int64_t requested_now() { return memory::stats(kCPU).requested_bytes.current; }

// Allocations the trace attributes to op `op`.
int64_t allocations_by(const std::vector<memory::TraceEvent>& events, const char* op) {
  int64_t n = 0;
  for (const memory::TraceEvent& e : events) n += e.action == memory::TraceAction::Alloc && std::strcmp(e.op, op) == 0;
  return n;
}

// Blocks that `op` allocated with `requested` bytes and that were freed later in the same trace.
int64_t freed_allocations_by(const std::vector<memory::TraceEvent>& events, const char* op, size_t requested) {
  std::set<void*> live;
  int64_t freed = 0;
  for (const memory::TraceEvent& e : events) {
    if (e.action == memory::TraceAction::Alloc && std::strcmp(e.op, op) == 0 && e.requested == requested)
      live.insert(e.ptr);
    if (e.action == memory::TraceAction::Free && live.erase(e.ptr)) ++freed;
  }
  return freed;
}

void check_same(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(got.defined() == want.defined(), what);
  if (!want.defined()) return;
  if (rtol == 0.0) CHECK_MESSAGE(values_of(got) == values_of(want), what, " differs from the plain run");
  else check_close(values_of(got), values_of(want), rtol, 1e-12, what);
}

void check_same_grads(const nn::Module& got, const nn::Module& want, double rtol) {
  const auto g = got.named_parameters(), w = want.named_parameters();
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < g.size(); ++i) check_same(g[i].second.grad(), w[i].second.grad(), rtol, g[i].first);
  const auto gb = got.named_buffers(), wb = want.named_buffers();
  REQUIRE(gb.size() == wb.size());
  for (size_t i = 0; i < gb.size(); ++i) check_same(gb[i].second, wb[i].second, 0.0, gb[i].first);  // exactly once
}

// ---- conv -> batch_norm_relu (+ residual) -> conv ----------------------------------------

struct BnReluNet {
  DType dt;
  Tensor w1, w2, gamma, beta, r, c2;
  static constexpr int64_t N = 2, Cin = 3, C = 4, H = 6, W = 6;
  BnReluNet(DType d)
      : dt(d),
        w1(leaf({C, Cin, 3, 3}, d, 11, 0.3)),
        w2(leaf({C, C, 3, 3}, d, 12, 0.3)),
        gamma(leaf({C}, d, 13)),
        beta(leaf({C}, d, 14)),
        r(leaf({N, C, H, W}, d, 15)),  // a residual alive anyway (a leaf)
        c2(random_tensor({N, C, H, W}, d, 16)) {}
  Shape y_shape() const { return {N, C, H, W}; }
  std::vector<Tensor> params() const { return {w1, w2, gamma, beta, r}; }

  // x -> conv -> relu(bn(.) (+ r)) -> conv; `seen` gets whether y was registered as a recipe.
  Tensor forward(const Tensor& x, const Tensor& rm, const Tensor& rv, bool training, bool residual, bool* seen) const {
    const Tensor c = conv2d(x, w1, Tensor(), {.padding = 1});
    const Tensor y = batch_norm_relu(c, rm, rv, gamma, beta, training, 0.1, 1e-5, residual ? r : Tensor());
    if (seen) *seen = is_recomputable(y);
    return conv2d(y, w2, Tensor(), {.padding = 1});
  }
};

struct NetRun {
  int64_t kept = 0;  // requested bytes held after the forward
  std::vector<Tensor> grads;
  Tensor out, running_mean, running_var;
  bool registered = false;
  std::vector<memory::TraceEvent> forward_trace, backward_trace;
};

NetRun run_bn_relu_net(const BnReluNet& net, const Tensor& x0, bool training, bool residual, bool cheap) {
  for (Tensor p : net.params()) p.set_grad(Tensor());
  NetRun run;
  run.running_mean = random_tensor({BnReluNet::C}, net.dt, 21);
  run.running_var = add(random_tensor({BnReluNet::C}, net.dt, 22, Layout::Contiguous, 0.0, 1.0), 0.5);
  Tensor x = x0.detach();
  x.requires_grad_();
  memory::empty_cache(kCPU);
  memory::enable_trace(kCPU);
  const int64_t before = requested_now();
  auto fn = [&](const Tensor& in) {
    return net.forward(in, run.running_mean, run.running_var, training, residual, &run.registered);
  };
  const Tensor z = cheap ? autograd::recompute_cheap(fn, x) : fn(x);
  run.kept = requested_now() - before;
  run.forward_trace = memory::trace_events(kCPU);
  memory::enable_trace(kCPU);
  sum(z * net.c2).backward();
  run.backward_trace = memory::trace_events(kCPU);
  memory::disable_trace(kCPU);
  run.out = z.detach();
  run.grads.push_back(x.grad());
  for (const Tensor& p : net.params()) run.grads.push_back(p.grad());
  return run;
}

}  // namespace

TEST_CASE("recompute_cheap: batch_norm_relu's output is freed after the forward and regenerated in backward") {
  for (DType dt : {kFloat64, kFloat32}) {
    const BnReluNet net(dt);
    const Tensor x0 = random_tensor({BnReluNet::N, BnReluNet::Cin, BnReluNet::H, BnReluNet::W}, dt, 1);
    const int64_t y_bytes = bytes_of(net.y_shape(), dt);
    for (bool training : {true, false})
      for (bool residual : {false, true}) {
        CAPTURE(dtype_name(dt));
        CAPTURE(training);
        CAPTURE(residual);
        const NetRun plain = run_bn_relu_net(net, x0, training, residual, false);
        const NetRun cheap = run_bn_relu_net(net, x0, training, residual, true);
        CHECK(!plain.registered);
        CHECK(cheap.registered);
        // The forward keeps exactly y less: the conv after it and batch_norm_relu's own backward
        // (ReLU's mask) save it as a recipe over x, mean, invstd, weight, bias (and r, alive anyway).
        CHECK(plain.kept - cheap.kept == y_bytes);
        const char* op = residual ? "batch_norm_add_relu" : "batch_norm_relu";
        CHECK(freed_allocations_by(cheap.forward_trace, op, size_t(y_bytes)) == 1);  // y's block went in the forward
        CHECK(freed_allocations_by(plain.forward_trace, op, size_t(y_bytes)) == 0);
        // Backward regenerates it once: the conv's weight gradient and ReLU's mask share it.
        CHECK(allocations_by(cheap.backward_trace, "recompute_cheap") == 1);
        CHECK(allocations_by(plain.backward_trace, "recompute_cheap") == 0);
        const double rtol = dt == kFloat64 ? 0.0 : 1e-6;
        check_same(cheap.out, plain.out, rtol, "output");
        for (size_t i = 0; i < plain.grads.size(); ++i)
          check_same(cheap.grads[i], plain.grads[i], rtol, "grad " + std::to_string(i));
        // The running statistics moved once, as in the plain run (no replay).
        check_same(cheap.running_mean, plain.running_mean, 0.0, "running_mean");
        check_same(cheap.running_var, plain.running_var, 0.0, "running_var");
      }
  }
}

TEST_CASE("recompute_cheap: plain batch_norm's output is a recipe in training and eval") {
  const DType dt = kFloat64;
  const Tensor x = leaf({3, 4, 5}, dt, 1), w = leaf({4}, dt, 2), b = leaf({4}, dt, 3),
               c = random_tensor({3, 4, 5}, dt, 4);
  for (bool training : {true, false}) {
    CAPTURE(training);
    const Tensor rm = zeros({4}, dt), rv = ones({4}, dt);
    auto fn = [&](const Tensor& in) {
      const Tensor y = batch_norm(in, rm, rv, w, b, training);
      CHECK(is_recomputable(y) == RecomputeCheapOutputs::active());
      return sum(tanh(y * y) * c);  // mul saves y twice
    };
    std::vector<std::vector<double>> want;
    for (bool cheap : {false, true}) {
      for (Tensor t : {x, w, b}) t.set_grad(Tensor());
      (cheap ? autograd::recompute_cheap(fn, x) : fn(x)).backward();
      std::vector<std::vector<double>> got{values_of(x.grad()), values_of(w.grad()), values_of(b.grad())};
      if (!cheap) want = got;
      else CHECK(got == want);
    }
  }
}

TEST_CASE("recompute_cheap: layer norm and GELU outputs, saved by the next linear, cost no memory") {
  // Pre-norm MLP blocks h + linear(gelu(linear(layer_norm(h)))): the forward keeps layer norm's
  // output (rows x width) and GELU's (rows x 4 width) less per block, and nothing else changes.
  const int depth = 3;
  const int64_t width = 16, rows = 24;
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    std::vector<Tensor> params;
    for (int i = 0; i < depth; ++i)
      for (const Shape& s : std::vector<Shape>{{width}, {width}, {4 * width, width}, {4 * width}, {width, 4 * width}})
        params.push_back(leaf(s, dt, 100 + params.size(), 0.3));
    auto block = [&](int i) {
      return [&, i](const Tensor& h) {
        const Tensor* p = &params[size_t(5 * i)];
        const Tensor n = layer_norm(h, {width}, p[0], p[1]);
        return h + linear(gelu(linear(n, p[2], p[3])), p[4]);
      };
    };
    const Tensor x0 = random_tensor({rows, width}, dt, 1), c = random_tensor({rows, width}, dt, 2);
    struct Got {
      int64_t kept;
      std::vector<std::vector<double>> grads;
      int64_t recomputed;
    };
    auto run = [&](bool cheap) {
      for (Tensor p : params) p.set_grad(Tensor());
      Tensor x = x0.detach();
      x.requires_grad_();
      memory::empty_cache(kCPU);
      const int64_t before = requested_now();
      Tensor h = x;
      for (int i = 0; i < depth; ++i) h = cheap ? autograd::recompute_cheap(block(i), h) : block(i)(h);
      const int64_t kept = requested_now() - before;
      memory::enable_trace(kCPU);
      sum(h * c).backward();
      const int64_t recomputed = allocations_by(memory::trace_events(kCPU), "recompute_cheap");
      memory::disable_trace(kCPU);
      Got g{kept, {values_of(h), values_of(x.grad())}, recomputed};
      for (const Tensor& p : params) g.grads.push_back(values_of(p.grad()));
      return g;
    };
    const Got plain = run(false), cheap = run(true);
    CHECK(plain.kept - cheap.kept == depth * (bytes_of({rows, width}, dt) + bytes_of({rows, 4 * width}, dt)));
    CHECK(cheap.recomputed == 2 * depth);  // each once, for the linear after it
    CHECK(plain.recomputed == 0);
    REQUIRE(cheap.grads.size() == plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      if (dt == kFloat64) CHECK(cheap.grads[i] == plain.grads[i]);
      else check_close(cheap.grads[i], plain.grads[i], 1e-6, 1e-12, "grad " + std::to_string(i));
    }
  }
}

TEST_CASE("recompute_cheap: a cast of a recipe's output (autocast's, before a linear) is a recipe too") {
  // float64 layer norm, its output cast to float32 for a float32 linear, as autocast casts a
  // float32 layer norm output to float16: the linear saves the cast, which costs no memory.
  const int64_t rows = 12, width = 8;
  const Tensor h0 = random_tensor({rows, width}, kFloat64, 1);
  const Tensor lw = leaf({width}, kFloat64, 2), lb = leaf({width}, kFloat64, 3), w = leaf({5, width}, kFloat32, 4);
  std::vector<std::vector<double>> want;
  int64_t plain_kept = 0;
  for (bool cheap : {false, true}) {
    for (Tensor t : {lw, lb, w}) t.set_grad(Tensor());
    Tensor h = h0.detach();
    h.requires_grad_();
    memory::empty_cache(kCPU);
    const int64_t before = requested_now();
    auto fn = [&](const Tensor& in) {
      const Tensor n = layer_norm(in, {width}, lw, lb).to(kFloat32);
      CHECK(is_recomputable(n) == cheap);
      return linear(n, w);
    };
    const Tensor z = cheap ? autograd::recompute_cheap(fn, h) : fn(h);
    const int64_t kept = requested_now() - before;
    if (!cheap) plain_kept = kept;
    else CHECK(plain_kept - kept == bytes_of({rows, width}, kFloat32));
    sum(z * z).backward();
    std::vector<std::vector<double>> got{values_of(h.grad()), values_of(lw.grad()), values_of(lb.grad()),
                                         values_of(w.grad())};
    if (!cheap) want = got;
    else CHECK(got == want);
  }
}

namespace {

// ResNet's forward with every residual block under recompute_cheap (what a per-block memory
// planner does): the stem and the head run plainly.
Tensor resnet_forward_cheap(models::ResNet& net, const Tensor& x) {
  Tensor h = net.bn1->forward_relu((*net.conv1)(x));
  if (!net.options.small_input_stem) h = max_pool2d(h, 3, {.stride = 2, .padding = 1});
  for (const auto& layer : {net.layer1, net.layer2, net.layer3, net.layer4})
    for (size_t i = 0; i < layer->size(); ++i) {
      std::shared_ptr<nn::UnaryModule> blk = (*layer)[i];
      h = autograd::recompute_cheap([blk](const Tensor& in) { return (*blk)(in); }, h);
    }
  return (*net.fc)(adaptive_avg_pool2d(h, 1).flatten(1));
}

}  // namespace

TEST_CASE("recompute_cheap: ResNet blocks give the plain run's gradients and running statistics, keeping less") {
  // BasicBlocks {4, 1, 1, 1}, fused BN+ReLU, 8x8 inputs with the small stem. Per block, bn1's
  // output and the block's output become recipes, except layer1's fourth output: its recipe
  // would chain through three residual recipes (length 4 > 3), so it is kept and layer2
  // starts from it (Note [Recomputable outputs], residuals).
  const models::ResNetOptions o{.num_classes = 4, .in_channels = 1, .small_input_stem = true, .fused_bn_relu = true};
  const std::array<int64_t, 4> blocks{4, 1, 1, 1};
  const int64_t N = 2;
  for (DType dt : {kFloat64, kFloat32})
    for (bool training : {true, false}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(training);
      manual_seed(4);
      auto plain = std::make_shared<models::ResNet>(models::BlockType::Basic, blocks, o);
      manual_seed(4);
      auto cheap = std::make_shared<models::ResNet>(models::BlockType::Basic, blocks, o);
      for (auto* m : {plain.get(), cheap.get()}) {
        m->to(dt);
        m->train(training);
      }
      const Tensor x = random_tensor({N, 1, 8, 8}, dt, 3), y = from_vector<int64_t>({1, 3}, {2});
      // The bytes a forward leaves allocated (its output and everything saved for backward).
      auto step = [&](const std::function<Tensor()>& forward) {
        memory::empty_cache(kCPU);
        const int64_t before = requested_now();
        const Tensor logits = forward();
        const int64_t kept = requested_now() - before;
        cross_entropy(logits, y).backward();
        return kept;
      };
      const int64_t plain_kept = step([&] { return plain->forward(x); });
      const int64_t cheap_kept = step([&] { return resnet_forward_cheap(*cheap, x); });
      check_same_grads(*cheap, *plain, dt == kFloat64 ? 0.0 : 1e-6);
      // Elements of one (N, C, H, W) activation per layer: 64x8x8, 128x4x4, 256x2x2, 512x1x1.
      const int64_t e1 = N * 64 * 64, e2 = N * 128 * 16, e3 = N * 256 * 4, e4 = N * 512;
      const int64_t recipes = (4 + 3) * e1 + 2 * e2 + 2 * e3 + 2 * e4;
      CHECK(plain_kept - cheap_kept == recipes * int64_t(element_size(dt)));
    }
}

TEST_CASE("recompute_cheap: BERT and ViT give the plain run's gradients, and recompute in backward") {
  SUBCASE("BERT, the whole forward under one guard") {
    models::BertConfig c;
    c.vocab_size = 50, c.hidden_size = 16, c.num_hidden_layers = 2, c.num_attention_heads = 2;
    c.intermediate_size = 32, c.max_position_embeddings = 12, c.hidden_dropout_prob = 0.0;
    c.attention_probs_dropout_prob = 0.0, c.num_labels = 3;
    manual_seed(5);
    models::BertForSequenceClassification plain(c);
    manual_seed(5);
    models::BertForSequenceClassification cheap(c);
    const Tensor ids = randint(0, 50, {2, 6}),
                 mask = from_vector<int64_t>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
    const Tensor y = from_vector<int64_t>({2, 0}, {2});
    plain.forward(ids, mask, Tensor(), y).loss.backward();
    Tensor loss;
    {
      RecomputeCheapOutputs guard;
      loss = cheap.forward(ids, mask, Tensor(), y).loss;
    }
    memory::enable_trace(kCPU);
    loss.backward();
    // Per layer: 2 layer norm outputs (saved by the next layer's projections; the last by the
    // pooler) and GELU's.
    CHECK(allocations_by(memory::trace_events(kCPU), "recompute_cheap") >= 3 * c.num_hidden_layers);
    memory::disable_trace(kCPU);
    check_same_grads(cheap, plain, 1e-6);
  }
  SUBCASE("ViT, each encoder block under recompute_cheap") {
    models::ViTConfig c;
    c.image_size = 8, c.patch_size = 4, c.num_layers = 2, c.num_heads = 2, c.hidden_dim = 8, c.mlp_dim = 16;
    c.num_classes = 5;
    manual_seed(7);
    models::VisionTransformer plain(c);
    nn::init::normal_(plain.head->weight, 0.0, 0.5);  // torchvision's zero head would stop every gradient
    models::VisionTransformer cheap(c);
    const auto sd = plain.state_dict();
    cheap.load_state_dict(std::map<std::string, Tensor>(sd.begin(), sd.end()));
    const Tensor x = randn({2, 3, 8, 8}), y = from_vector<int64_t>({4, 1}, {2});
    cross_entropy(plain.forward(x), y).backward();
    // VisionTransformer::forward with its blocks under recompute_cheap.
    const int64_t n = x.size(0);
    Tensor h = (*cheap.conv_proj)(x).flatten(2).transpose(1, 2);
    h = cat({cheap.class_token.expand({n, -1, -1}), h}, 1);
    h = (*cheap.encoder_dropout)(h + cheap.pos_embedding);
    for (const auto& block : cheap.blocks)
      h = autograd::recompute_cheap([block](const Tensor& in) { return (*block)(in); }, h);
    const Tensor logits = (*cheap.head)((*cheap.encoder_ln)(h).select(1, 0));
    memory::enable_trace(kCPU);
    cross_entropy(logits, y).backward();
    CHECK(allocations_by(memory::trace_events(kCPU), "recompute_cheap") == 3 * c.num_layers);  // ln_1, ln_2, GELU
    memory::disable_trace(kCPU);
    check_same_grads(cheap, plain, 1e-6);
  }
}

TEST_CASE("recompute_cheap: in-place writes after the forward still throw at backward") {
  const DType dt = kFloat64;
  const BnReluNet net(dt);
  const Tensor x0 = random_tensor({BnReluNet::N, BnReluNet::Cin, BnReluNet::H, BnReluNet::W}, dt, 1);
  const Tensor rm = zeros({BnReluNet::C}, dt), rv = ones({BnReluNet::C}, dt);
  SUBCASE("to a source of the recipe (batch norm's input)") {
    Tensor c, z;
    {
      RecomputeCheapOutputs guard;
      c = conv2d(x0, net.w1, Tensor(), {.padding = 1});
      z = conv2d(batch_norm_relu(c, rm, rv, net.gamma, net.beta, true), net.w2, Tensor(), {.padding = 1});
    }
    mul_(c, 2.0);
    check_error([&] { sum(z).backward(); }, {"Conv2dBackward: regenerating the batch_norm_relu output it saved",
                                             "BatchNormAddReluBackward", "modified by an in-place operation"});
  }
  SUBCASE("to the output itself, after the conv saved it") {
    Tensor y, z;
    {
      RecomputeCheapOutputs guard;
      y = batch_norm_relu(conv2d(x0, net.w1, Tensor(), {.padding = 1}), rm, rv, net.gamma, net.beta, true);
      z = conv2d(y, net.w2, Tensor(), {.padding = 1});
    }
    mul_(y, 2.0);
    check_error([&] { sum(z).backward(); }, {"Conv2dBackward", "modified by an in-place operation"});
  }
  SUBCASE("an output written in place is no longer a recipe, and a later save keeps its values") {
    // batch_norm's node does not save its output, so writing it in place is legal; the write
    // voids the recipe (its version moved), so the conv after it saves the written values.
    std::vector<std::vector<double>> want;
    for (bool cheap : {false, true}) {
      for (Tensor p : net.params()) p.set_grad(Tensor());
      std::optional<RecomputeCheapOutputs> guard;
      if (cheap) guard.emplace();
      const Tensor y = batch_norm(conv2d(x0, net.w1, Tensor(), {.padding = 1}), rm, rv, net.gamma, net.beta, true);
      CHECK(is_recomputable(y) == cheap);
      add_(y, 0.5);
      CHECK(!is_recomputable(y));
      const Tensor z = conv2d(y, net.w2, Tensor(), {.padding = 1});
      guard.reset();
      sum(z * net.c2).backward();
      std::vector<std::vector<double>> got{values_of(net.w1.grad()), values_of(net.w2.grad()),
                                           values_of(net.gamma.grad())};
      if (!cheap) want = got;
      else CHECK(got == want);
    }
  }
}

TEST_CASE("recompute_cheap: retain_graph runs the recipes again on a second backward") {
  const DType dt = kFloat64;
  const BnReluNet net(dt);
  const Tensor x0 = random_tensor({BnReluNet::N, BnReluNet::Cin, BnReluNet::H, BnReluNet::W}, dt, 1);
  std::vector<std::vector<double>> once;
  for (bool cheap : {false, true}) {
    for (Tensor p : net.params()) p.set_grad(Tensor());
    const Tensor rm = zeros({BnReluNet::C}, dt), rv = ones({BnReluNet::C}, dt);
    auto fn = [&](const Tensor& in) { return net.forward(in, rm, rv, true, true, nullptr); };
    const Tensor z = cheap ? autograd::recompute_cheap(fn, x0) : fn(x0);
    const Tensor loss = sum(z * net.c2);
    loss.backward(Tensor(), /*retain_graph=*/true);
    if (!cheap) {
      for (const Tensor& p : net.params()) once.push_back(values_of(p.grad()));
      continue;
    }
    loss.backward();
    for (size_t i = 0; i < once.size(); ++i) {
      std::vector<double> twice = once[i];
      for (double& v : twice) v *= 2;
      check_close(values_of(net.params()[i].grad()), twice, 1e-14, 0.0, "param " + std::to_string(i));
    }
    check_error([&] { loss.backward(); }, {"freed by an earlier backward"});
  }
}

TEST_CASE("recompute_cheap: nests with checkpoint, full and selective, either way round") {
  const DType dt = kFloat64;
  const BnReluNet net(dt);
  const Tensor x0 = random_tensor({BnReluNet::N, BnReluNet::Cin, BnReluNet::H, BnReluNet::W}, dt, 1);
  auto block = [&](const Tensor& in) {
    const Tensor rm = zeros({BnReluNet::C}, dt), rv = ones({BnReluNet::C}, dt);  // fresh: replays see the same
    const Tensor h = net.forward(in, rm, rv, true, true, nullptr);
    return gelu(layer_norm(h, {BnReluNet::W}));
  };
  auto grads = [&](const std::function<Tensor(const Tensor&)>& fn) {
    for (Tensor p : net.params()) p.set_grad(Tensor());
    Tensor x = x0.detach();
    x.requires_grad_();
    sum(fn(x) * net.c2).backward();
    std::vector<std::vector<double>> g{values_of(x.grad())};
    for (const Tensor& p : net.params()) g.push_back(values_of(p.grad()));
    return g;
  };
  const auto want = grads(block);
  for (CheckpointPolicy policy : {CheckpointPolicy::Full, CheckpointPolicy::Selective}) {
    CAPTURE(autograd::to_string(policy));
    // The guard inside a checkpointed function: recipes only in the replay's graph.
    CHECK(grads([&](const Tensor& x) {
            return checkpoint([&](const Tensor& in) { return autograd::recompute_cheap(block, in); }, x, policy);
          }) == want);
    // A checkpoint inside the guard: its saved input may be a recipe, its replay runs plainly.
    CHECK(grads([&](const Tensor& x) {
            return autograd::recompute_cheap([&](const Tensor& in) { return checkpoint(block, gelu(in), policy); }, x);
          }) == grads([&](const Tensor& x) { return block(gelu(x)); }));
  }
}

TEST_CASE("recompute_cheap: a residual chain stops at max_recipe_length") {
  // y_k = relu(bn(x_k) + y_{k-1}): each recipe runs the one before it, so the k-th is k passes
  // long; with a limit of 2 every third output is kept and starts the next chain.
  const DType dt = kFloat64;
  const Tensor w = leaf({3}, dt, 1), b = leaf({3}, dt, 2);
  std::vector<Tensor> xs;
  for (int k = 0; k < 6; ++k) xs.push_back(leaf({2, 3, 4}, dt, 10 + uint64_t(k)));
  std::vector<bool> registered;
  std::vector<std::vector<double>> want;
  for (bool cheap : {false, true}) {
    for (Tensor t : xs) t.set_grad(Tensor());
    std::optional<RecomputeCheapOutputs> guard;
    if (cheap) guard.emplace(2);
    Tensor y = mul(xs[0], 1.0);  // a plain start
    for (int k = 1; k < 6; ++k) {
      y = batch_norm_relu(xs[size_t(k)], Tensor(), Tensor(), w, b, true, 0.1, 1e-5, y);
      if (cheap) registered.push_back(is_recomputable(y));
    }
    guard.reset();
    memory::enable_trace(kCPU);
    sum(y * y).backward();
    // Each recipe runs once, though y_5 has three savers (y * y twice, its own node) and every
    // recipe reads the one before it: a regeneration is shared until each saver has read it.
    if (cheap) CHECK(allocations_by(memory::trace_events(kCPU), "recompute_cheap") == 4);
    memory::disable_trace(kCPU);
    std::vector<std::vector<double>> got;
    for (const Tensor& t : xs) got.push_back(values_of(t.grad()));
    if (!cheap) want = got;
    else CHECK(got == want);
  }
  CHECK(registered == std::vector<bool>{true, true, false, true, true});
}

TEST_CASE("recompute_cheap: errors") {
  check_error([] { autograd::recompute_cheap(nullptr, Tensor()); }, {"recompute_cheap: the function is empty"});
  check_error([] { RecomputeCheapOutputs guard(0); }, {"max_recipe_length must be at least 1, got 0"});
  CHECK(!RecomputeCheapOutputs::active());
  {
    RecomputeCheapOutputs outer(3);
    {
      RecomputeCheapOutputs inner(1);
      CHECK(RecomputeCheapOutputs::max_recipe_length() == 1);
    }
    CHECK(RecomputeCheapOutputs::max_recipe_length() == 3);
  }
  CHECK(RecomputeCheapOutputs::max_recipe_length() == 0);
}
