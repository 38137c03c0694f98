// Saved tensors: every node frees what it saved after backward (Note [Saved tensor
// registry]), and saved-tensor hooks pack and unpack them (Note [Saved tensor hooks]).
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "autograd/ops/all.h"
#include "autograd/saved_tensor.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tests/error_text.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::Node;
using autograd::PackedTensor;
using autograd::SavedTensorHooks;
using autograd::SavedValue;

namespace {

Tensor leaf(const Shape& s, uint64_t seed, DType dtype = kFloat64) {
  Tensor t = random_tensor(s, dtype, seed);
  t.requires_grad_();
  return t;
}

Tensor index_tensor(const std::vector<int64_t>& values, const Shape& sizes) {
  return from_vector<int64_t>(values, sizes, TensorOptions(kInt64));
}

// Every node reachable from root's grad_fn (a graph walk; the nodes stay alive while held).
std::vector<std::shared_ptr<Node>> graph_of(const Tensor& root) {
  std::vector<std::shared_ptr<Node>> nodes, stack{autograd::meta_of(root)->grad_fn};
  std::unordered_set<Node*> seen;
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    if (!n || !seen.insert(n.get()).second) continue;
    for (const autograd::Edge& e : n->next_edges) stack.push_back(e.fn);
    nodes.push_back(std::move(n));
  }
  return nodes;
}

// The saved tensors of the graph's nodes that hold values (a defined tensor, not freed).
int64_t held_saved(const std::vector<std::shared_ptr<Node>>& nodes) {
  int64_t held = 0;
  for (const auto& n : nodes) n->for_each_saved([&](const SavedValue& v) { held += v.defined(); });
  return held;
}

// A hook that keeps a real copy (on the host: .to(kCPU), cloned when that is the tensor
// itself, as it is on the CPU) and restores it to the device it came from, counting calls.
struct OffloadHooks {
  struct Offloaded {
    Tensor host;
    Device device;
  };
  int packs = 0, unpacks = 0;
  std::vector<std::weak_ptr<Storage>> originals;  // the storages it was handed

  SavedTensorHooks::Pack pack() {
    return [this](const Tensor& t) -> PackedTensor {
      ++packs;
      originals.push_back(t.impl().storage);
      Tensor host = t.to(kCPU);
      if (host.shares_storage(t)) host = host.clone();
      return Offloaded{host, t.device()};
    };
  }
  SavedTensorHooks::Unpack unpack() {
    return [this](const PackedTensor& p) {
      ++unpacks;
      const auto& o = std::any_cast<const Offloaded&>(p);
      return o.host.to(o.device);
    };
  }
};

struct Program {
  std::string node;  // the node the program is about (it must be in the graph and save something)
  std::function<Tensor()> loss;
};

// One program per node that saves something, each ending in a scalar loss.
std::vector<Program> programs() {
  const Tensor c = random_tensor({3, 4}, kFloat64, 99);
  std::vector<Program> p;
  auto program = [&](std::string node, std::function<Tensor()> f) { p.push_back({std::move(node), std::move(f)}); };
  program("MulBackward", [] { return sum(mul(leaf({3, 4}, 1), leaf({3, 4}, 2))); });
  program("DivBackward", [] { return sum(div(leaf({3, 4}, 1), add(leaf({3, 4}, 2), 5.0))); });
  program("MaximumBackward", [] { return sum(maximum(leaf({3, 4}, 1), leaf({3, 4}, 2))); });
  program("PowBackward", [] { return sum(pow(add(abs(leaf({3, 4}, 1)), 1.0), leaf({3, 4}, 2))); });
  program("WhereBackward", [] {
    const Tensor a = leaf({3, 4}, 1);
    return sum(where(gt(a, 0.0), a, leaf({3, 4}, 2)));
  });
  program("MaskedFillBackward", [] {
    const Tensor a = leaf({3, 4}, 1);
    return sum(masked_fill(a, gt(a.detach(), 0.0), 0.0));
  });
  program("ExpBackward", [] { return sum(tanh(exp(leaf({3, 4}, 1)))); });
  program("SoftmaxBackward", [c] { return sum(mul(log_softmax(softmax(leaf({3, 4}, 1), 1), 0), c)); });
  program("MaskedSoftmaxBackward", [c] { return sum(mul(masked_softmax(leaf({3, 4}, 1), Tensor(), true), c)); });
  program("VarBackward", [] { return sum(var(leaf({3, 4}, 1), {1})); });
  program("AmaxBackward", [] { return sum(amax(leaf({3, 4}, 1), {1})); });
  program("MaxBackward", [] { return sum(max(leaf({3, 4}, 1), 1).values); });
  program("MatmulBackward", [] { return sum(matmul(leaf({3, 4}, 1), leaf({4, 2}, 2))); });
  program("LinearBackward", [] { return sum(linear(leaf({3, 4}, 1), leaf({2, 4}, 2), leaf({2}, 3))); });
  program("LayerNormBackward", [c] {
    return sum(mul(layer_norm(leaf({3, 4}, 1), {4}, leaf({4}, 2), leaf({4}, 3)), c));
  });
  program("CrossEntropyBackward", [] { return cross_entropy(leaf({3, 4}, 1), index_tensor({0, 3, 1}, {3})); });
  program("LinearCrossEntropyBackward", [] {
    return linear_cross_entropy(leaf({3, 4}, 1), leaf({5, 4}, 2), leaf({5}, 3), index_tensor({0, -100, 4}, {3}));
  });
  program("MseLossBackward", [] { return mse_loss(leaf({3, 4}, 1), leaf({3, 4}, 2)); });
  program("IndexSelectBackward", [] { return sum(index_select(leaf({3, 4}, 1), 1, index_tensor({0, 2, 2}, {3}))); });
  program("GatherBackward", [] { return sum(gather(leaf({3, 4}, 1), 1, index_tensor({0, 1, 2}, {3, 1}))); });
  program("ScatterAddBackward", [] {
    return sum(scatter_add(leaf({3, 4}, 1), 1, index_tensor({0, 1, 3}, {3, 1}), leaf({3, 1}, 2)));
  });
  program("IndexAddBackward", [] {
    return sum(index_add(leaf({3, 4}, 1), 0, index_tensor({2, 0}, {2}), leaf({2, 4}, 2)));
  });
  program("EmbeddingBackward", [] { return sum(embedding(leaf({5, 4}, 1), index_tensor({0, 4, 4}, {3}))); });
  program("Conv2dBackward", [] { return sum(conv2d(leaf({2, 3, 5, 5}, 1), leaf({4, 3, 3, 3}, 2), leaf({4}, 3))); });
  program("MaxPool2dBackward", [] { return sum(max_pool2d(leaf({1, 2, 4, 4}, 1), 2)); });
  program("BatchNormBackward", [] {
    const Tensor rm = zeros({3}, kFloat64), rv = ones({3}, kFloat64);
    return sum(square(batch_norm(leaf({2, 3, 2, 2}, 1), rm, rv, leaf({3}, 2), leaf({3}, 3), true, 0.1, 1e-5)));
  });
  program("BatchNormAddReluBackward", [] {
    const Tensor rm = zeros({3}, kFloat64), rv = ones({3}, kFloat64);
    return sum(batch_norm_add_relu(leaf({2, 3, 2, 2}, 1), leaf({2, 3, 2, 2}, 4), rm, rv, leaf({3}, 2), leaf({3}, 3),
                                   true, 0.1, 1e-5));
  });
  program("FlashAttentionBackward", [] {
    return sum(flash_attention(leaf({1, 2, 3, 4}, 1), leaf({1, 2, 5, 4}, 2), leaf({1, 2, 5, 4}, 3)));
  });
  program("CheckpointBackward", [c] {
    const Tensor w = leaf({4, 4}, 2);  // captured by the closure, which is freed with the node
    return sum(autograd::checkpoint([w, c](const Tensor& h) { return mul(tanh(matmul(h, w)), c); }, leaf({3, 4}, 1)));
  });
  return p;
}

bool has_node(const std::vector<std::shared_ptr<Node>>& nodes, const std::string& name) {
  for (const auto& n : nodes)
    if (n->name() == name) return true;
  return false;
}

}  // namespace

TEST_CASE("saved tensors: every node frees what it saved after backward, and holds no other tensor") {
  for (const Program& program : programs()) {
    CAPTURE(program.node);
    Tensor loss = program.loss();  // the leaves and intermediates live only in the graph now
    std::vector<std::shared_ptr<Node>> nodes = graph_of(loss);
    REQUIRE(has_node(nodes, program.node));
    CHECK(held_saved(nodes) > 0);
    loss.backward();
    CHECK(held_saved(nodes) == 0);  // every registered saved tensor was reset
    // Nothing else in the graph holds memory either (a Tensor member outside the registry,
    // a closure): dropping the graph frees no byte. The loss keeps its storage (detach).
    const int64_t with_graph = memory::stats(kCPU).allocated_bytes.current;
    nodes.clear();
    loss = loss.detach();
    CHECK(memory::stats(kCPU).allocated_bytes.current == with_graph);
  }
}

TEST_CASE("saved tensors: a freed node's unpack names it, as before") {
  Tensor x = leaf({3}, 1);
  Tensor y = mul(x, x);
  std::vector<std::shared_ptr<Node>> nodes = graph_of(y);
  sum(y).backward();
  const std::string msg = error_of([&] { sum(y).backward(); });
  CHECK_MESSAGE(msg.find("MulBackward: its saved tensors were freed by an earlier backward") != std::string::npos, msg);
}

TEST_CASE("saved tensor hooks: pack once per saved tensor, unpack on use, the packed form only is kept") {
  OffloadHooks hooks;
  Tensor a = leaf({3, 4}, 1), b = leaf({3, 4}, 2);
  Tensor loss;
  {
    SavedTensorHooks guard(hooks.pack(), hooks.unpack());
    loss = sum(mul(exp(a), b));  // ExpBackward saves its output, MulBackward both operands
  }
  CHECK(hooks.packs == 3);
  std::vector<std::shared_ptr<Node>> nodes = graph_of(loss);
  int64_t packed = 0;
  for (const auto& n : nodes) n->for_each_saved([&](const SavedValue& v) { packed += v.is_packed(); });
  CHECK(packed == 3);
  // exp(a) lives only in the graph: packed, its storage is gone (the copy stays).
  int64_t expired = 0;
  for (const auto& w : hooks.originals) expired += w.expired();
  CHECK(expired == 2);  // the output exp(a), saved twice (by ExpBackward and by MulBackward)
  loss.backward();
  CHECK(hooks.unpacks == 3);
  CHECK(held_saved(nodes) == 0);
  CHECK(values_of(a.grad()) == values_of(mul(exp(a.detach()), b.detach())));
}

TEST_CASE("saved tensor hooks: undefined tensors and saves without a guard are not packed") {
  OffloadHooks hooks;
  Tensor x = leaf({3, 4}, 1), w = leaf({2, 4}, 2);
  {
    SavedTensorHooks guard(hooks.pack(), hooks.unpack());
    Tensor y = layer_norm(x, {4});  // no weight: its SavedTensor stays undefined
    CHECK(hooks.packs == 3);        // x, mean, rstd
  }
  Tensor z = linear(x, w);
  CHECK(hooks.packs == 3);
  CHECK(autograd::SavedTensorHooks::current() == nullptr);
}

TEST_CASE("saved tensor hooks: guards nest, the innermost wins, and each is restored on scope exit") {
  OffloadHooks outer, inner;
  Tensor a = leaf({4}, 1), b = leaf({4}, 2), c = leaf({4}, 3);
  Tensor y;
  {
    SavedTensorHooks g1(outer.pack(), outer.unpack());
    y = exp(a);  // outer
    {
      SavedTensorHooks g2(inner.pack(), inner.unpack());
      y = mul(y, b);  // inner: y and b
    }
    y = mul(y, c);  // outer again: y and c
  }
  y = tanh(y);  // none
  CHECK(outer.packs == 3);
  CHECK(inner.packs == 2);
  CHECK(SavedTensorHooks::current() == nullptr);
  sum(y).backward();  // each saved tensor unpacks through the guard that packed it, long gone
  CHECK(outer.unpacks == 3);
  CHECK(inner.unpacks == 2);
}

TEST_CASE("saved tensor hooks: a guard applies only on its own thread") {
  OffloadHooks hooks;
  SavedTensorHooks guard(hooks.pack(), hooks.unpack());
  bool other_had_hooks = true;
  std::thread other([&] {
    other_had_hooks = SavedTensorHooks::current() != nullptr;
    Tensor x = leaf({4}, 1);
    sum(exp(x)).backward();
  });
  other.join();
  CHECK_FALSE(other_had_hooks);
  CHECK(hooks.packs == 0);
}

namespace {
// Runs f (a loss over params) and returns every parameter's gradient, bit for bit.
std::vector<std::vector<double>> gradients(const std::function<Tensor()>& f, const TensorList& params) {
  for (const Tensor& p : params) autograd::meta_of(p)->grad = Tensor();
  f().backward();
  std::vector<std::vector<double>> g;
  for (const Tensor& p : params) g.push_back(values_of(p.grad()));
  return g;
}

void check_offload_matches(const std::function<Tensor()>& f, const TensorList& params) {
  const auto plain = gradients(f, params);
  OffloadHooks hooks;
  std::vector<std::vector<double>> offloaded;
  {
    SavedTensorHooks guard(hooks.pack(), hooks.unpack());
    offloaded = gradients(f, params);
  }
  CHECK(hooks.packs > 0);
  CHECK(hooks.unpacks > 0);
  CHECK(offloaded == plain);  // bit-identical
}
}  // namespace

TEST_CASE("saved tensor hooks: offloading to a host copy gives bit-identical gradients (MLP, conv net)") {
  SUBCASE("MLP") {
    const Tensor x = random_tensor({8, 16}, kFloat32, 1);
    const Tensor target = index_tensor({0, 1, 2, 3, 4, 0, 1, 2}, {8});
    const TensorList p = {leaf({32, 16}, 2, kFloat32), leaf({32}, 3, kFloat32), leaf({5, 32}, 4, kFloat32),
                          leaf({5}, 5, kFloat32)};
    check_offload_matches([&] { return cross_entropy(linear(gelu(linear(x, p[0], p[1])), p[2], p[3]), target); }, p);
  }
  SUBCASE("conv net") {
    const Tensor x = random_tensor({2, 3, 8, 8}, kFloat32, 1);
    const Tensor target = index_tensor({1, 3}, {2});
    const Tensor rm = zeros({4}), rv = ones({4});
    const TensorList p = {leaf({4, 3, 3, 3}, 2, kFloat32), leaf({4}, 3, kFloat32), leaf({4}, 4, kFloat32),
                          leaf({5, 4}, 5, kFloat32), leaf({5}, 6, kFloat32)};
    check_offload_matches(
        [&] {
          Tensor h = conv2d(x, p[0], Tensor(), {.padding = 1});
          h = batch_norm_relu(h, rm, rv, p[1], p[2], true, 0.1, 1e-5);
          h = max_pool2d(h, 2);
          h = adaptive_avg_pool2d(h, 1).flatten(1);
          return cross_entropy(linear(h, p[3], p[4]), target);
        },
        p);
  }
  SUBCASE("checkpointed block") {  // a SavedTensorList (the checkpoint's inputs) is packed too
    const Tensor x = random_tensor({4, 8}, kFloat32, 1);
    const TensorList p = {leaf({8, 8}, 2, kFloat32), leaf({8}, 3, kFloat32)};
    check_offload_matches(
        [&] {
          const Tensor h = relu(linear(x, p[0], p[1]));
          return sum(square(autograd::checkpoint([&](const Tensor& t) { return tanh(linear(t, p[0])); }, h)));
        },
        p);
  }
}

TEST_CASE("saved tensor hooks: an in-place write after the save still throws, even once the tensor died") {
  OffloadHooks hooks;
  Tensor x = leaf({4}, 1);
  SUBCASE("the written tensor is alive") {
    Tensor y, loss;
    {
      SavedTensorHooks guard(hooks.pack(), hooks.unpack());
      y = exp(x);  // ExpBackward saves y
      loss = sum(y);
    }
    y.detach().copy_(zeros({4}, kFloat64));  // bumps the version y's storage shares
    const std::string msg = error_of([&] { loss.backward(); });
    CHECK_MESSAGE(msg.find("ExpBackward: a tensor it saved for backward (float64[4] cpu) was modified by an in-place "
                           "operation (version 1, saved at version 0)") != std::string::npos,
                  msg);
  }
  SUBCASE("the written tensor has been freed since") {
    Tensor loss;
    std::weak_ptr<Storage> storage;
    {
      SavedTensorHooks guard(hooks.pack(), hooks.unpack());
      Tensor y = exp(x);
      storage = y.impl().storage;
      loss = sum(y);
      y.detach().copy_(zeros({4}, kFloat64));
    }
    REQUIRE(storage.expired());  // only the packed copy is left: the version comes from the storage's last word
    const std::string msg = error_of([&] { loss.backward(); });
    CHECK_MESSAGE(msg.find("modified by an in-place operation (version 1, saved at version 0)") != std::string::npos,
                  msg);
  }
}

TEST_CASE("saved tensor hooks: retain_graph runs backward twice through the hooks, then the graph is freed") {
  OffloadHooks hooks;
  Tensor a = leaf({3}, 1), b = leaf({3}, 2);
  Tensor loss;
  {
    SavedTensorHooks guard(hooks.pack(), hooks.unpack());
    loss = sum(mul(a, b));
  }
  loss.backward(Tensor(), /*retain_graph=*/true);
  const std::vector<double> once = values_of(a.grad());
  loss.backward();
  CHECK(hooks.packs == 2);
  CHECK(hooks.unpacks == 4);  // each packed tensor, once per backward
  CHECK(values_of(a.grad()) == values_of(mul(b.detach(), 2.0)));
  CHECK(values_of(a.grad()) == values_of(mul(from_vector<double>(once, {3}), 2.0)));
  const std::string msg = error_of([&] { loss.backward(); });
  CHECK_MESSAGE(msg.find("its saved tensors were freed by an earlier backward") != std::string::npos, msg);
}

TEST_CASE("saved tensor hooks: an unpack that returns another shape is an error naming the node") {
  Tensor x = leaf({2, 3}, 1);
  Tensor loss;
  {
    SavedTensorHooks guard([](const Tensor& t) -> PackedTensor { return t; },
                           [](const PackedTensor& p) {
                             return std::any_cast<const Tensor&>(p).reshape({3, 2});
                           });
    loss = sum(exp(x));
  }
  const std::string msg = error_of([&] { loss.backward(); });
  CHECK_MESSAGE(
      msg.find("ExpBackward: the unpack hook returned float64[3, 2] cpu for a saved tensor that was float64[2, 3] "
               "cpu") != std::string::npos,
      msg);
}
