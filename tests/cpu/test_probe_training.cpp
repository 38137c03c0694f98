// Probes of what a training loop relies on (2026-12-04 findings), each against PyTorch 1.13's
// behaviour written out beside it: a frozen weight tied into another module stays one frozen
// tensor; trunc_normal_ is an in-place write that a node which saved the tensor notices;
// copy_ of a float that requires grad into an integer buffer is a plain conversion; gather and
// scatter_add take 0-d operands as 1-d; clip_grad_value_ and clip_grad_norm_'s argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "autograd/ops/all.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tensor/ops/index.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// A head whose weight is registered from outside: the tie PyTorch writes head.weight = emb.weight.
struct Head : nn::Module {
  Tensor weight;
  explicit Head(const Tensor& w) { weight = register_parameter("weight", w); }
  std::string type_name() const override { return "Head"; }
};

struct TiedLM : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<Head> head;
  explicit TiedLM(bool freeze_first) {
    emb = register_module("emb", std::make_shared<nn::Embedding>(3, 2));
    if (freeze_first) emb->requires_grad_(false);
    head = register_module("head", std::make_shared<Head>(emb->weight));
  }
  std::string type_name() const override { return "TiedLM"; }
};

}  // namespace

TEST_CASE("probe training: a frozen weight tied into another module stays one frozen tensor") {
  TiedLM m(/*freeze_first=*/true);
  // torch: parameters() lists it once, head.weight.requires_grad False, the step leaves it.
  CHECK(m.parameters().size() == 1);
  CHECK(m.head->weight.impl_ptr() == m.emb->weight.impl_ptr());
  CHECK_FALSE(m.head->weight.requires_grad());
  const std::vector<float> before = m.emb->weight.tolist<float>();
  const Tensor ids = from_vector<int64_t>({0, 2}, {2});
  const Tensor out = sum(linear((*m.emb)(ids), m.head->weight));
  CHECK_FALSE(out.requires_grad());  // nothing to train: torch's output needs no grad either
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  opt.step();
  CHECK(m.emb->weight.tolist<float>() == before);
  // Unfrozen, the one tensor gets one gradient: both uses summed.
  m.requires_grad_(true);
  CHECK(m.head->weight.requires_grad());
  sum(linear((*m.emb)(ids), m.head->weight)).backward();
  CHECK(m.parameters().size() == 1);
  CHECK(m.emb->weight.grad().defined());
  // Asking for a frozen copy of a weight that requires grad is refused, not a silent second parameter.
  TiedLM trainable(/*freeze_first=*/false);
  struct FrozenHead : nn::Module {
    explicit FrozenHead(const Tensor& w) { register_parameter("weight", w, /*requires_grad=*/false); }
    std::string type_name() const override { return "FrozenHead"; }
  };
  check_error([&] { FrozenHead h(trainable.emb->weight); }, {"register_parameter", "weight", "requires_grad_(false)"});
}

TEST_CASE("probe training: a fresh tensor registered as a parameter is made to require grad") {
  struct Fresh : nn::Module {
    Tensor w;
    Fresh() { w = register_parameter("w", zeros({2})); }
    std::string type_name() const override { return "Fresh"; }
  } f;
  CHECK(f.w.requires_grad());
  CHECK(f.w.is_leaf());
}

TEST_CASE("probe training: trunc_normal_ is an in-place write: a node that saved the tensor refuses to run") {
  Tensor x = ones({2, 3}, TensorOptions(kFloat64)).requires_grad_();
  Tensor w = ones({3, 3}, TensorOptions(kFloat64)).requires_grad_();
  const Tensor y = matmul(x, w);  // saves w
  const uint64_t v = w.version();
  nn::init::trunc_normal_(w, 0.0, 1.0);
  CHECK(w.version() > v);
  // torch: "one of the variables needed for gradient computation has been modified by an inplace operation"
  check_error([&] { sum(y).backward(); }, {"MatmulBackward", "modified by an in-place operation"});
  // An expanded target is refused before the draw, naming trunc_normal_: the generator does not move.
  Generator gen(5);
  const uint64_t offset = gen.offset();
  check_error(
      [&] {
        nn::init::trunc_normal_(zeros({3}).expand({2, 3}), 0.0, 1.0, -2.0, 2.0, &gen);
      },
      {"trunc_normal_"});
  CHECK(gen.offset() == offset);
}

TEST_CASE("probe training: copy_ of a float that requires grad into an integer buffer is a plain conversion") {
  Tensor s = from_vector<double>({1.0, 2.0, 3.7}, {3}).requires_grad_();
  Tensor buf = zeros({3}, TensorOptions(kInt64));
  buf.copy_(s);  // torch: tensor([1, 2, 3]), requires_grad False
  CHECK(buf.tolist<int64_t>() == std::vector<int64_t>{1, 2, 3});
  CHECK_FALSE(buf.requires_grad());
}

TEST_CASE("probe training: gather and scatter_add take a 0-d operand as 1-d, as PyTorch") {
  // torch.gather(torch.tensor([2., 3]), 0, torch.tensor(1)) == tensor(3.)
  const Tensor g = ops::gather(from_vector<float>({2, 3}, {2}), 0, scalar_tensor(1, TensorOptions(kInt64)));
  CHECK(g.dim() == 0);
  CHECK(g.item<float>() == 3.0f);
  // torch.tensor(1.).scatter_add(0, torch.tensor([0, 0]), torch.tensor([2., 3])) == tensor(6.)
  const Tensor s =
      ops::scatter_add(scalar_tensor(1.0), 0, from_vector<int64_t>({0, 0}, {2}), from_vector<float>({2, 3}, {2}));
  CHECK(s.dim() == 0);
  CHECK(s.item<float>() == 6.0f);
  // Differentiable, with the gradient of the 0-d index's one element.
  Tensor x = from_vector<double>({2, 3}, {2}).requires_grad_();
  gather(x, 0, scalar_tensor(1, TensorOptions(kInt64))).backward();
  CHECK(x.grad().tolist<double>() == std::vector<double>{0, 1});
}

TEST_CASE("probe training: clip_grad_value_ clamps every gradient; clip_grad_norm_ refuses a negative max_norm") {
  Tensor a = zeros({3}).requires_grad_(), b = zeros({2}).requires_grad_(), c = zeros({1}).requires_grad_();
  a.set_grad(from_vector<float>({-3, 0.5, 7}, {3}));
  b.set_grad(from_vector<float>({NAN, -0.25}, {2}));
  optim::clip_grad_value_({a, b, c}, 1.0);  // c has no gradient: skipped
  CHECK(a.grad().tolist<float>() == std::vector<float>{-1, 0.5, 1});
  CHECK(std::isnan(b.grad().tolist<float>()[0]));  // torch's clamp_ keeps NaN
  CHECK(b.grad().tolist<float>()[1] == -0.25f);
  CHECK_FALSE(c.grad().defined());
  check_error([&] { optim::clip_grad_value_({a}, -1.0); }, {"clip_grad_value_", "clip_value", "-1"});
  // torch takes max_norm -1 and flips every gradient's sign ([3, 4] -> [-0.6, -0.8]).
  Tensor p = zeros({2}).requires_grad_();
  p.set_grad(from_vector<float>({3, 4}, {2}));
  check_error([&] { optim::clip_grad_norm_({p}, -1.0); }, {"clip_grad_norm_", "max_norm", "-1"});
  check_error([&] { optim::clip_grad_norm_({p}, NAN); }, {"clip_grad_norm_", "max_norm"});
  CHECK(p.grad().tolist<float>() == std::vector<float>{3, 4});
  CHECK(optim::clip_grad_norm_({p}, INFINITY) == doctest::Approx(5.0));  // inf: measure, never clip
  CHECK(p.grad().tolist<float>() == std::vector<float>{3, 4});
}

TEST_CASE("probe training: clip_grad_norm_ with error_if_nonfinite refuses a non-finite norm before scaling") {
  Tensor p = zeros({3}).requires_grad_();
  p.set_grad(from_vector<float>({1, INFINITY, 2}, {3}));
  for (double norm_type : {2.0, 1.0, double(INFINITY)})
    check_error([&] { optim::clip_grad_norm_({p}, 1.0, norm_type, /*error_if_nonfinite=*/true); },
                {"clip_grad_norm_", "non-finite", "error_if_nonfinite"});
  CHECK(p.grad().tolist<float>()[0] == 1.0f);  // untouched
  p.set_grad(from_vector<float>({3, 4, 0}, {3}));
  CHECK(optim::clip_grad_norm_({p}, 1.0, 2.0, true) == doctest::Approx(5.0));
  CHECK(p.grad().tolist<float>()[0] == doctest::Approx(0.6f).epsilon(1e-5));
}
