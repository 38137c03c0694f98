// nn::Module: registration and dotted names, state_dict round trips and their
// errors, in-place dtype conversion, zero_grad, modes, printing; Linear's init and forward.
#include <doctest/doctest.h>

#include <cmath>

#include "autograd/ops/all.h"
#include "nn/checkpoint.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
// A small model with nesting, the shape of a real one.
struct Block : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Tensor scale;
  Block() {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 3));
    scale = register_buffer("scale", ones({3}));
  }
  std::string type_name() const override { return "Block"; }
};

struct Net : nn::Module {
  std::shared_ptr<nn::Sequential> layers;
  std::shared_ptr<Block> head;
  Net() {
    layers = register_module("layers",
                             std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                                 std::make_shared<nn::Linear>(5, 4), std::make_shared<nn::Flatten>()}));
    head = register_module("head", std::make_shared<Block>());
  }
  std::string type_name() const override { return "Net"; }
};
}  // namespace

TEST_CASE("nn: parameters and buffers have dotted names in registration order") {
  Net net;
  std::vector<std::string> names;
  for (auto& [name, p] : net.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"layers.0.weight", "layers.0.bias", "head.fc.weight", "head.fc.bias"});
  CHECK(net.named_buffers().at(0).first == "head.scale");
  CHECK(net.num_parameters() == 5 * 4 + 4 + 4 * 3 + 3);
  CHECK(net.named_modules().size() == 5);  // layers, layers.0, layers.1, head, head.fc
  for (const Tensor& p : net.parameters()) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  const std::string r = net.repr();
  CHECK(r.find("(layers): Sequential(") != std::string::npos);
  CHECK(r.find("(fc): Linear(in_features=4, out_features=3, bias=true)") != std::string::npos);
}

TEST_CASE("nn: Linear initialises like torch and computes x W^T + b") {
  manual_seed(0);
  nn::Linear fc(400, 50);
  const double bound = 1.0 / std::sqrt(400.0);
  double mx = 0;
  for (double w : values_of(fc.weight)) mx = std::max(mx, std::fabs(w));
  CHECK(mx <= bound);
  CHECK(mx > 0.95 * bound);  // 20000 uniform draws reach close to the bound
  for (double b : values_of(fc.bias)) CHECK(std::fabs(b) <= bound);

  nn::Linear small(3, 2);
  Tensor x = random_tensor({4, 3}, kFloat32, 1);
  const std::vector<double> xv = values_of(x), wv = values_of(small.weight), bv = values_of(small.bias);
  std::vector<double> expect;
  for (int i = 0; i < 4; ++i)
    for (int o = 0; o < 2; ++o) {
      double s = bv[o];
      for (int k = 0; k < 3; ++k) s += xv[i * 3 + k] * wv[o * 3 + k];
      expect.push_back(s);
    }
  check_close(small(x), expect, 1e-5, 1e-6, "Linear forward");
  check_error([&] { small(zeros({4, 5})); }, {"Linear", "(..., 3)", "[4, 5]"});
}

TEST_CASE("nn: state_dict round trip and strict loading errors") {
  Net a, b;
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : a.state_dict()) state[name] = t.clone();
  b.load_state_dict(state);
  for (auto& [name, t] : b.state_dict()) CHECK(values_of(t) == values_of(state.at(name)));

  auto missing = state;
  missing.erase("head.fc.bias");
  missing["extra.weight"] = zeros({1});
  missing["layers.0.weight"] = zeros({4, 6});
  check_error([&] { b.load_state_dict(missing); },
              {"missing keys (1)", "head.fc.bias", "unexpected keys (1)", "extra.weight", "shape mismatches (1)",
               "layers.0.weight (checkpoint [4, 6], model [4, 5])"});
  auto partial = state;
  partial.erase("head.scale");
  b.load_state_dict(partial, /*strict=*/false);  // missing keys allowed when not strict
}

TEST_CASE("nn: load_state_dict takes another module's state_dict(); a key given twice is an error") {
  Net a, b;
  for (auto& [name, t] : a.state_dict()) t.detach().copy_(full(t.sizes(), 0.25));
  b.load_state_dict(a.state_dict());
  for (auto& [name, t] : b.state_dict())
    for (double v : values_of(t)) CHECK_MESSAGE(v == 0.25, name);
  nn::NamedTensors twice = a.state_dict();
  twice.push_back(twice.front());
  check_error([&] { b.load_state_dict(twice); }, {"load_state_dict", twice.front().first, "twice"});
}

namespace unnamed_modules {
struct PlainBlock : nn::Module {};  // no type_name override
}  // namespace unnamed_modules

TEST_CASE("nn: type_name defaults to the class's own name") {
  CHECK(unnamed_modules::PlainBlock().type_name() == "PlainBlock");
  CHECK(Net().type_name() == "Net");  // an override still wins
}

TEST_CASE("nn: to(dtype) converts in place, zero_grad, train/eval") {
  Net net;
  Tensor held = net.head->fc->weight;  // e.g. an optimizer's handle
  const std::vector<double> before = values_of(held);
  net.to(kFloat64);
  CHECK(held.dtype() == kFloat64);
  CHECK(values_of(held) == before);  // float32 -> float64 is exact
  CHECK(held.requires_grad());
  net.to(kBFloat16);
  CHECK(net.head->scale.dtype() == kBFloat16);

  Net n2;
  Tensor w = n2.head->fc->weight;
  w.set_grad(ones_like(w));
  n2.zero_grad(false);
  CHECK(values_of(w.grad()) == std::vector<double>(12, 0.0));
  n2.zero_grad();
  CHECK_FALSE(w.grad().defined());

  CHECK(n2.is_training());
  n2.eval();
  CHECK_FALSE(n2.head->fc->is_training());
  n2.train();
  CHECK(n2.layers->is_training());
}

TEST_CASE("nn: registration errors") {
  struct Bad : nn::Module {
    std::string type_name() const override { return "Bad"; }
    void go() {
      register_parameter("w", zeros({2}));
      register_buffer("w", zeros({2}));
    }
    void dotted() { register_parameter("a.b", zeros({2})); }
  };
  Bad bad;
  check_error([&] { bad.go(); }, {"Bad", "'w'", "already registered"});
  check_error([&] { bad.dotted(); }, {"Bad", "'a.b'"});
  check_error([] { nn::Linear(0, 3); }, {"Linear", "in=0"});
}

TEST_CASE("nn: forward hooks run around m(x) (Sequential's and checkpoint_sequential's calls), not m.forward(x)") {
  manual_seed(3);
  auto lin = std::make_shared<nn::Linear>(3, 2);
  nn::Sequential seq{lin, std::make_shared<nn::Linear>(2, 2)};
  std::vector<std::string> calls;
  const uint64_t first = lin->add_forward_hooks(
      {.before = [&](nn::UnaryModule&) { calls.push_back("before 1"); },
       .after = [&](nn::UnaryModule& m, Tensor out) {
         CHECK(&m == lin.get());
         calls.push_back("after 1");
         return mul(out, 2.0);  // the caller sees what `after` returns
       }});
  lin->add_forward_hooks({.before = [&](nn::UnaryModule&) { calls.push_back("before 2"); }, .after = {}});
  const Tensor x = random_tensor({4, 3}, kFloat32, 5);
  const Tensor plain = lin->forward(x);  // no hooks
  CHECK(calls.empty());
  const Tensor y = seq.forward(x);
  CHECK(calls == std::vector<std::string>{"before 1", "before 2", "after 1"});
  check_close(values_of(y), values_of(seq[1]->forward(mul(plain, 2.0))), 1e-6, 1e-7, "hooked output");
  calls.clear();
  (void)nn::checkpoint_sequential(seq, 2, x);
  CHECK(calls == std::vector<std::string>{"before 1", "before 2", "after 1"});
  lin->remove_forward_hooks(first);
  calls.clear();
  (void)(*lin)(x);
  CHECK(calls == std::vector<std::string>{"before 2"});
}
