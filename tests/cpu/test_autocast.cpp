// Automatic mixed precision (autograd/autocast.h, Note [Autocast]): the guard's state,
// the tensors autocast never casts (each op's dtype under its policy is checked by the
// differentiable op table, tests/op_table/grad_table.h), gradients of float32 parameters against a
// float32 reference, the cast cache, checkpoint replay, pure-half inference, mixed-dtype
// errors outside autocast, and the activation memory AMP saves (the CPU arena's stats).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "memory/allocator.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autocast::Policy;

namespace {

constexpr DType kLowDtypes[] = {kFloat16, kBFloat16};

Tensor leaf(const Shape& s, uint64_t seed, double scale = 1.0) {
  Tensor t = random_tensor(s, kFloat32, seed, Layout::Contiguous, -scale, scale);
  t.requires_grad_();
  return t;
}

/// Largest |v|, for tolerances relative to a whole tensor.
double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

/// `got` close to `want` within rtol of want's largest magnitude (low-precision sums).
void check_close_scaled(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  const std::vector<double> w = values_of(want);
  check_close(values_of(got), w, 0.0, rtol * std::max(max_abs(w), 1e-30), what);
}

/// A tolerance for results computed through one or two `low` roundings plus f32 sums.
double low_tol(DType low) { return low == kFloat16 ? 1e-2 : 6e-2; }

}  // namespace

TEST_CASE("autocast: the guard sets the state per device type, nests, and restores it") {
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
  CHECK_FALSE(autocast::is_enabled(DeviceType::CUDA));
  {
    AutocastGuard outer(kCPU, kFloat16);
    CHECK(autocast::is_enabled(DeviceType::CPU));
    CHECK(autocast::dtype(DeviceType::CPU) == kFloat16);
    CHECK_FALSE(autocast::is_enabled(DeviceType::CUDA));  // the other type is untouched
    {
      AutocastGuard inner(kCPU, kBFloat16);
      CHECK(autocast::dtype(DeviceType::CPU) == kBFloat16);
      {
        AutocastGuard off(kCPU, kBFloat16, /*enabled=*/false);
        CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
        const Tensor x = random_tensor({2, 3}, kFloat32, 1), w = random_tensor({4, 3}, kFloat32, 2);
        CHECK(linear(x, w).dtype() == kFloat32);  // off inside on: ops as without autocast
      }
      CHECK(autocast::is_enabled(DeviceType::CPU));
      CHECK(autocast::dtype(DeviceType::CPU) == kBFloat16);
    }
    CHECK(autocast::dtype(DeviceType::CPU) == kFloat16);
    {
      AutocastGuard gpu(cuda(), kBFloat16);
      CHECK(autocast::is_enabled(DeviceType::CUDA));
      CHECK(autocast::dtype(DeviceType::CUDA) == kBFloat16);
      CHECK(autocast::dtype(DeviceType::CPU) == kFloat16);
    }
    CHECK_FALSE(autocast::is_enabled(DeviceType::CUDA));
    const autocast::State s = autocast::state(DeviceType::CPU);
    CHECK((s.enabled && s.dtype == kFloat16));
  }
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
}

TEST_CASE("autocast: a dtype other than float16/bfloat16 is a clear error") {
  check_error([] { AutocastGuard g(kCPU, kFloat32); }, {"AutocastGuard", "float16 or bfloat16", "float32", "cpu"});
  check_error([] { AutocastGuard g(cuda(), kFloat64); }, {"AutocastGuard", "float64", "cuda"});
  check_error([] { autocast::set_state(DeviceType::CPU, {true, kInt32}); }, {"set_state", "int32"});
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));         // nothing changed
  AutocastGuard disabled(kCPU, kFloat32, /*enabled=*/false);  // the dtype of a disabled guard is not used
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
}

TEST_CASE("autocast: float64 and integer tensors are never cast; a CUDA guard leaves CPU tensors alone") {
  // Each differentiable op's dtype under autocast, and its values against the op on inputs
  // cast by hand: the differentiable op table (tests/cpu/test_grad_table.cpp).
  const Tensor a = random_tensor({3, 4}, kFloat32, 1), b = random_tensor({4, 5}, kFloat32, 2);
  const Tensor w = random_tensor({6, 4}, kFloat32, 4), bias = random_tensor({6}, kFloat32, 5);
  const Tensor target = from_vector<int64_t>({0, 3, 1, 2}, {4}, kInt64);
  for (DType low : kLowDtypes) {
    CAPTURE(dtype_name(low));
    AutocastGuard amp(kCPU, low);
    CHECK(matmul(a.to(kFloat64), b.to(kFloat64)).dtype() == kFloat64);
    CHECK(softmax(a.to(kFloat64), -1).dtype() == kFloat64);
    CHECK(sum(target).dtype() == kInt64);
    const DType other = low == kFloat16 ? kBFloat16 : kFloat16;
    CHECK((a.to(low) + a.to(other)).dtype() == kFloat32);  // float16 + bfloat16 -> float32, as PyTorch
  }
  AutocastGuard gpu_only(cuda(), kFloat16);
  CHECK(linear(a, w, bias).dtype() == kFloat32);
  CHECK(softmax(a.to(kFloat16), -1).dtype() == kFloat16);
}

TEST_CASE("autocast: gradients of float32 parameters arrive in float32 and match a float32 reference") {
  // x -> linear -> layer_norm -> gelu -> linear -> cross_entropy, plus a softmax-weighted sum.
  const Tensor x = random_tensor({16, 12}, kFloat32, 1);
  const Tensor target = from_vector<int64_t>({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3}, {16}, kInt64);
  Tensor w1 = leaf({24, 12}, 2, 0.3), b1 = leaf({24}, 3, 0.1), g = leaf({24}, 4), beta = leaf({24}, 5, 0.1);
  Tensor w2 = leaf({6, 24}, 6, 0.3), b2 = leaf({6}, 7, 0.1);
  const std::vector<Tensor> params = {w1, b1, g, beta, w2, b2};
  auto loss_fn = [&] {
    const Tensor h = gelu(layer_norm(linear(x, w1, b1), {24}, g, beta));
    const Tensor logits = linear(h, w2, b2);
    return cross_entropy(logits, target) + sum(softmax(logits, -1) * logits) * 0.1;
  };
  auto grads_of = [&](const Tensor& loss) {
    for (const Tensor& p : params) p.set_grad(Tensor());
    loss.backward();
    std::vector<Tensor> gs;
    for (const Tensor& p : params) gs.push_back(p.grad());
    return gs;
  };
  const std::vector<Tensor> ref = grads_of(loss_fn());
  for (DType low : kLowDtypes) {
    CAPTURE(dtype_name(low));
    Tensor loss;
    {
      AutocastGuard amp(kCPU, low);
      loss = loss_fn();
    }
    CHECK(loss.dtype() == kFloat32);
    const std::vector<Tensor> got = grads_of(loss);
    for (size_t i = 0; i < params.size(); ++i) {
      CAPTURE(i);
      REQUIRE(got[i].defined());
      CHECK(got[i].dtype() == kFloat32);
      check_close_scaled(got[i], ref[i], low_tol(low), "grad of param " + std::to_string(i));
    }
  }
}

TEST_CASE("autocast: a parameter used twice is cast once, and its gradient sums both uses") {
  Tensor w = leaf({8, 6}, 1);
  const Tensor x1 = random_tensor({4, 6}, kFloat32, 2), x2 = random_tensor({5, 6}, kFloat32, 3);
  Tensor loss;
  {
    AutocastGuard amp(kCPU, kFloat16);
    CHECK(autocast::cache_size() == 0);
    const Tensor y1 = linear(x1, w), y2 = linear(x2, w);
    CHECK(autocast::cache_size() == 1);  // w only: x1 and x2 are not leaves that require grad
    const auto c1 = autocast::cast_inputs(Policy::Lower, {&w});
    const auto c2 = autocast::cast_inputs(Policy::Lower, {&w});
    REQUIRE((c1 && c2));
    CHECK((*c1)[0].impl_ptr() == (*c2)[0].impl_ptr());  // the same cast tensor
    CHECK((*c1)[0].dtype() == kFloat16);
    loss = sum(y1) + sum(y2 * 2.0);
    {
      AutocastGuard nested(kCPU, kFloat16);  // a nested guard shares the cache
      (void)linear(x1, w);
      CHECK(autocast::cache_size() == 1);
    }
    CHECK(autocast::cache_size() == 1);
    // Another dtype is another entry.
    AutocastGuard bf(kCPU, kBFloat16);
    (void)linear(x1, w);
    CHECK(autocast::cache_size() == 2);
  }
  CHECK(autocast::cache_size() == 0);  // dropped with the outermost guard
  loss.backward();
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == kFloat32);
  // Reference: w cast by hand to a float16 leaf; its .grad sums both uses' float16 grads.
  Tensor w16 = w.detach().to(kFloat16);
  w16.requires_grad_();
  (sum(linear(x1.to(kFloat16), w16)) + sum(linear(x2.to(kFloat16), w16) * 2.0)).backward();
  check_close_scaled(w.grad(), w16.grad(), 2e-3, "w.grad vs the hand-cast float16 leaf");

  // An in-place change of w (an optimizer step) makes the cached cast stale.
  AutocastGuard amp(kCPU, kFloat16);
  const auto before = autocast::cast_inputs(Policy::Lower, {&w});
  {
    autograd::NoGradGuard no_grad;
    mul_(w, 2.0);
  }
  const auto after = autocast::cast_inputs(Policy::Lower, {&w});
  REQUIRE((before && after));
  CHECK((*before)[0].impl_ptr() != (*after)[0].impl_ptr());
  CHECK(values_of((*after)[0]) == values_of(w.to(kFloat16)));
  CHECK(autocast::cache_size() == 1);
  // A cast made under NoGradGuard has no graph: with grad on, w is cast again and gets its gradient.
  Tensor v = leaf({3, 6}, 9);
  {
    autograd::NoGradGuard no_grad;
    (void)linear(x1, v);
  }
  w.set_grad(Tensor());
  sum(linear(x1, v)).backward();
  CHECK(v.grad().defined());
}

TEST_CASE("autocast: a linear's weight and input gradients are computed in float32, not rounded to the low dtype") {
  // Note [Weight gradients in the master dtype]: g^T x with g and x in the low dtype, summed
  // in float32 and never rounded to 16 bits. The reference is the float64 product of the
  // same low-dtype operands; a 16-bit result would be ~2^-9 (float16) or ~2^-6 (bfloat16)
  // of the largest entry away, a float32 one ~1e-6.
  // The input's gradient likewise (x is a float32 activation cast for the product).
  for (DType low : kLowDtypes) {
    CAPTURE(dtype_name(low));
    Tensor x = leaf({2, 32, 32}, 11), w = leaf({16, 32}, 12, 0.5);
    Tensor y;
    {
      AutocastGuard amp(kCPU, low);
      y = linear(x, w);
    }
    REQUIRE(y.dtype() == low);
    const Tensor g = random_tensor({2, 32, 16}, kFloat32, 13).to(low);
    y.backward(g);
    REQUIRE(w.grad().dtype() == kFloat32);
    REQUIRE(x.grad().dtype() == kFloat32);
    const Tensor g64 = g.to(kFloat64).reshape({64, 16}), x64 = x.to(low).to(kFloat64).reshape({64, 32});
    const Tensor want = ops::mm(g64.t(), x64);
    check_close_scaled(w.grad(), want, 1e-5, "w.grad vs float64 g^T x");
    check_close_scaled(x.grad(), ops::mm(g64, w.to(low).to(kFloat64)).reshape({2, 32, 32}), 1e-5,
                       "x.grad vs float64 g w");
    // Used twice through the one cached cast, the float32 gradients of both uses add.
    w.set_grad(Tensor());
    {
      AutocastGuard amp(kCPU, low);
      y = linear(x, w) + linear(x, w) * 2.0;
    }
    y.backward(g);
    check_close_scaled(w.grad(), mul(want, 3.0), 1e-5, "w.grad of two uses");
  }
}

TEST_CASE("autocast: a cast's float32 gradient reaches the user in the cast's dtype; mixed uses add up") {
  // Note [Weight gradients in the master dtype]: the gradient flowing into a cast may be
  // float32, but a retained or requested gradient of the float16 tensor is float16.
  const Tensor x = random_tensor({6, 8}, kFloat32, 41);
  Tensor w = leaf({4, 8}, 42);
  const Tensor h = w.to(kFloat16);
  h.retain_grad();
  Tensor y = linear(x.to(kFloat16), h);
  const Tensor g = random_tensor({6, 4}, kFloat32, 43).to(kFloat16);
  const TensorList requested = autograd::grad({y}, {h}, {g}, /*retain_graph=*/true);
  REQUIRE(requested[0].dtype() == kFloat16);
  y.backward(g);
  REQUIRE(h.grad().dtype() == kFloat16);
  CHECK(values_of(h.grad()) == values_of(requested[0]));
  CHECK(w.grad().dtype() == kFloat32);
  // One cached cast used by a linear (float32 gradient) and a matmul (float16 gradient).
  w.set_grad(Tensor());
  {
    AutocastGuard amp(kCPU, kFloat16);
    y = linear(x, w) + matmul(x, w.t());
  }
  y.backward(g);
  REQUIRE(w.grad().dtype() == kFloat32);
  const Tensor g64 = g.to(kFloat64), x64 = x.to(kFloat16).to(kFloat64);
  check_close_scaled(w.grad(), mul(ops::mm(g64.t(), x64), 2.0), 2e-3, "w.grad of a linear and a matmul");
}

TEST_CASE("mm with a float32 result: float16/bfloat16 operands only, clear errors otherwise") {
  const Tensor a = random_tensor({5, 7}, kFloat32, 21), b = random_tensor({7, 3}, kFloat32, 22);
  for (DType low : kLowDtypes) {
    const Tensor out = ops::mm(a.to(low), b.to(low), kFloat32);
    CHECK(out.dtype() == kFloat32);
    check_close_scaled(out, ops::mm(a.to(low).to(kFloat64), b.to(low).to(kFloat64)), 1e-6, "mm vs float64");
  }
  CHECK(ops::mm(a, b, kFloat32).dtype() == kFloat32);  // the plain product
  check_error([&] { (void)ops::mm(a, b, kFloat16); }, {"mm", "float16", "float32"});
  check_error([&] { (void)ops::mm(a.to(kFloat16), b.to(kBFloat16), kFloat32); }, {"mm", "same dtype"});
}

TEST_CASE("autocast: checkpoint replays the forward's autocast state in the recompute") {
  auto block = [](const Tensor& h, const Tensor& w, const Tensor& b) {
    return relu(layer_norm(linear(h, w, b), {16}));
  };
  for (DType low : kLowDtypes) {
    CAPTURE(dtype_name(low));
    Tensor w1 = leaf({16, 16}, 1, 0.4), b1 = leaf({16}, 2, 0.1), w2 = leaf({16, 16}, 3, 0.4), b2 = leaf({16}, 4, 0.1);
    const Tensor x0 = random_tensor({8, 16}, kFloat32, 5);
    auto run = [&](bool use_checkpoint) {
      for (const Tensor* p : {&w1, &b1, &w2, &b2}) p->set_grad(Tensor());
      Tensor x = x0.detach();
      x.requires_grad_();
      Tensor loss;
      {
        AutocastGuard amp(kCPU, low);
        auto body = [&](const Tensor& h) { return block(block(h, w1, b1), w2, b2); };
        const Tensor y = use_checkpoint ? checkpoint(body, x) : body(x);
        loss = sum(y * y);  // each weight used once: its gradient is summed in one order either way
      }
      loss.backward();  // outside the guard: the recompute must restore autocast itself
      std::vector<std::vector<double>> grads = {values_of(x.grad())};
      for (const Tensor* p : {&w1, &b1, &w2, &b2}) grads.push_back(values_of(p->grad()));
      return grads;
    };
    const auto plain = run(false), ckpt = run(true);
    REQUIRE(plain.size() == ckpt.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(i);
      CHECK(ckpt[i] == plain[i]);  // the same ops in the same dtypes: bitwise equal
    }
  }
}

TEST_CASE("autocast: Module::to(float16) runs a Linear/Conv/LayerNorm/Softmax model in half without autocast") {
  manual_seed(3);
  nn::Sequential mlp{std::make_shared<nn::Linear>(32, 64), std::make_shared<nn::LayerNorm>(Shape{64}),
                     std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(64, 10)};
  nn::Sequential cnn{std::make_shared<nn::Conv2d>(3, 8, Int2{3, 3}, nn::Conv2dModuleOptions{.padding = 1}),
                     std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(),
                     std::make_shared<nn::Linear>(8 * 6 * 6, 10)};
  const Tensor x = random_tensor({16, 32}, kFloat32, 1), img = random_tensor({4, 3, 6, 6}, kFloat32, 2);
  autograd::NoGradGuard inference;
  const Tensor ref_mlp = softmax(mlp.forward(x), -1), ref_cnn = softmax(cnn.forward(img), -1);
  mlp.to(kFloat16);
  cnn.to(kFloat16);
  for (const Tensor& p : mlp.parameters()) CHECK(p.dtype() == kFloat16);
  for (const Tensor& p : cnn.parameters()) CHECK(p.dtype() == kFloat16);
  const Tensor half_mlp = softmax(mlp.forward(x.to(kFloat16)), -1),
               half_cnn = softmax(cnn.forward(img.to(kFloat16)), -1);
  CHECK(half_mlp.dtype() == kFloat16);
  CHECK(half_cnn.dtype() == kFloat16);
  check_close(half_mlp, values_of(ref_mlp), 1e-2, 2e-3, "half MLP vs float32");
  check_close(half_cnn, values_of(ref_cnn), 1e-2, 2e-3, "half CNN vs float32");
}

TEST_CASE("autocast: mixed dtypes outside autocast are clear errors naming the op and the dtypes") {
  const Tensor x16 = random_tensor({4, 6}, kFloat16, 1), x32 = random_tensor({4, 6}, kFloat32, 2);
  const Tensor w32 = random_tensor({3, 6}, kFloat32, 3), w16 = w32.to(kFloat16);
  check_error([&] { linear(x16, w32); }, {"linear", "float16", "float32"});
  check_error([&] { linear(x16, w16, zeros({3}, kFloat32)); }, {"linear", "bias", "float32", "float16"});
  check_error([&] { matmul(x16, w32.t()); }, {"matmul", "float16", "float32"});
  const Tensor img16 = random_tensor({1, 2, 5, 5}, kFloat16, 4), k32 = random_tensor({3, 2, 3, 3}, kFloat32, 5);
  check_error([&] { conv2d(img16, k32); }, {"conv2d", "float16", "float32"});
  check_error([&] { layer_norm(x16, {6}, ones({6}, kFloat32)); }, {"layer_norm", "float32", "float16"});
  check_error([&] { mse_loss(x16, x32); }, {"mse_loss", "float16", "float32"});
  check_error([&] { masked_softmax(x32, x16); }, {"masked_softmax", "float16", "float32"});
  const Tensor q16 = random_tensor({2, 3, 4}, kFloat16, 6), key32 = random_tensor({2, 3, 4}, kFloat32, 7);
  check_error([&] { scaled_dot_product_attention(q16, key32, key32); },
              {"scaled_dot_product_attention", "float16", "float32"});
  const Tensor bn32 = random_tensor({2, 3, 4, 4}, kFloat32, 8), c16 = ones({3}, kFloat16);
  check_error([&] { batch_norm(bn32, Tensor(), Tensor(), c16, c16, true); }, {"batch_norm", "float16", "float32"});
}

TEST_CASE("autocast: one AMP training step of an 8-layer MLP keeps >= 40% fewer activation bytes") {
  constexpr int64_t kDepth = 8, kWidth = 512, kBatch = 256;
  manual_seed(5);
  auto mlp = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < kDepth; ++i) {
    mlp->push_back(std::make_shared<nn::Linear>(kWidth, kWidth));
    mlp->push_back(std::make_shared<nn::ReLU>());
  }
  const Tensor x = random_tensor({kBatch, kWidth}, kFloat32, 1, Layout::Contiguous, 0.0, 2.0);
  const Tensor target = random_tensor({kBatch, kWidth}, kFloat32, 2, Layout::Contiguous, 0.0, 0.5);
  const auto params = mlp->parameters();
  // A summed loss keeps the float16 gradients of the first layers above float16's
  // underflow without a GradScaler (a mean over 131072 elements would not).
  auto loss_of = [&](const Tensor& y) { return mse_loss(y, target, Reduction::Sum); };

  // The bytes the model's forward leaves allocated: the activations kept for backward
  // (and the output). A first forward fills the cast cache, so the second measures
  // activations only.
  auto forward = [&](bool amp, int64_t& kept) {
    std::optional<AutocastGuard> guard;
    if (amp) guard.emplace(kCPU, kFloat16);
    (void)mlp->forward(x);
    const int64_t before = memory::stats(kCPU).allocated_bytes.current;
    const Tensor y = mlp->forward(x);
    kept = memory::stats(kCPU).allocated_bytes.current - before;
    return loss_of(y);
  };
  int64_t f32_bytes = 0, amp_bytes = 0;
  const Tensor loss32 = forward(false, f32_bytes), loss16 = forward(true, amp_bytes);
  MESSAGE("activation bytes kept for backward: float32 ", f32_bytes, ", AMP float16 ", amp_bytes, " (",
          100.0 * double(f32_bytes - amp_bytes) / double(f32_bytes), "% less)");
  CHECK(f32_bytes >= kDepth * kBatch * kWidth * 4);  // sanity: one float32 activation per layer
  CHECK(double(amp_bytes) <= 0.6 * double(f32_bytes));

  // The step: float32 gradients close to the float32 run's, then an SGD update lowers the loss.
  for (const Tensor& p : params) p.set_grad(Tensor());
  loss32.backward();
  std::vector<Tensor> ref;
  for (const Tensor& p : params) ref.push_back(p.grad().clone());
  for (const Tensor& p : params) p.set_grad(Tensor());
  loss16.backward();
  CHECK(loss16.dtype() == kFloat32);
  check_close(values_of(loss16), values_of(loss32), 1e-2, 0.0, "AMP loss vs float32 loss");
  // Through 8 float16 layers a few ReLUs flip near zero, so single elements may differ by
  // more than a rounding; the whole gradient must agree to 1% (relative Frobenius norm).
  // (x is non-negative, like image or post-ReLU features: with zero-mean x the first
  // weight's gradient, a sum of terms of both signs, magnifies float16's error to ~4%.)
  double worst = 0.0;
  for (size_t i = 0; i < params.size(); ++i) {
    CAPTURE(i);
    CHECK(params[i].grad().dtype() == kFloat32);
    const std::vector<double> got = values_of(params[i].grad()), want = values_of(ref[i]);
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t j = 0; j < got.size(); ++j) diff2 += (got[j] - want[j]) * (got[j] - want[j]), ref2 += want[j] * want[j];
    const double rel = std::sqrt(diff2 / ref2);
    worst = std::max(worst, rel);
    CHECK(rel < 1e-2);
  }
  MESSAGE("largest relative gradient error (Frobenius) of AMP vs float32: ", worst);
  {
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : params) sub_(p, p.grad(), 1e-5);
  }
  AutocastGuard amp(kCPU, kFloat16);
  const Tensor after = loss_of(mlp->forward(x));
  MESSAGE("AMP loss before the step ", loss16.item<float>(), ", after ", after.item<float>());
  CHECK(after.item<float>() < loss16.item<float>());
}

TEST_CASE("autocast: one guard around two forward/backward passes reuses the cached cast") {
  // The cached cast's ToCopyBackward saves no tensors, so the first backward (without
  // retain_graph) must not make the second one fail.
  Tensor w = leaf({8, 6}, 1);
  const Tensor x = random_tensor({4, 6}, kFloat32, 2);
  AutocastGuard amp(kCPU, kFloat16);
  sum(linear(x, w)).backward();
  const Tensor first = w.grad().clone();
  sum(linear(x, w)).backward();
  CHECK(autocast::cache_size() == 1);
  check_close_scaled(w.grad(), first * 2.0, 1e-6, "w.grad after two identical passes");
}
