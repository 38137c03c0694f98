// grad(..., {.create_graph = true}) (Note [Double backward] in autograd/graph_backward.h): every
// node with an apply_graph against central differences of first-order gradients
// (autograd::gradgradcheck, float64), third derivatives against closed forms, a gradient
// penalty and a physics-informed loss against PyTorch 1.13 (tools/torch_golden_double_backward.py
// prints the values), and the refusals: a node without a double backward is named before
// anything runs.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/compress.h"
#include "autograd/engine.h"
#include "autograd/functional.h"
#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::GradOptions;

namespace {

using Fn = std::function<Tensor(const TensorList&)>;

void check_gradgradcheck(const Fn& f, const TensorList& inputs) {
  const autograd::GradcheckResult r = autograd::gradgradcheck(f, inputs);
  CHECK_MESSAGE(r.ok, r.report);
}

/// A float64 leaf away from the kinks (|x| in [lo, hi], either sign unless positive).
Tensor away_from_zero(const Shape& s, uint64_t seed, double lo = 0.3, double hi = 1.7, bool positive = false) {
  std::vector<double> v = random_values(numel_of(s), seed, lo, hi);
  if (!positive)
    for (size_t i = 0; i < v.size(); ++i)
      if (i % 3 == 1) v[i] = -v[i];
  Tensor t = make_tensor(v, s, TensorOptions(kFloat64));
  t.requires_grad_();
  return t;
}

/// 0.1 * sin(1.3 i + phase) in row-major order: tools/torch_golden_double_backward.py's wave().
Tensor wave(const Shape& s, double phase, bool requires_grad = true) {
  std::vector<double> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * std::sin(1.3 * double(i) + phase);
  Tensor t = make_tensor(v, s, TensorOptions(kFloat64));
  if (requires_grad) t.requires_grad_();
  return t;
}

}  // namespace

TEST_CASE("double backward: binary ops, broadcast and scalar, against differences of gradients") {
  const Tensor a = leaf({3, 4}, 1), b = leaf({4}, 2), c = away_from_zero({3, 1}, 3);
  check_gradgradcheck([](const TensorList& x) { return frugal::add(x[0], x[1], 0.5); }, {a, b});
  check_gradgradcheck([](const TensorList& x) { return frugal::sub(x[0], x[1]); }, {a, b});
  check_gradgradcheck([](const TensorList& x) { return frugal::mul(x[0], x[1]); }, {a, b});
  check_gradgradcheck([](const TensorList& x) { return frugal::div(x[0], x[1]); }, {a, c});
  check_gradgradcheck([](const TensorList& x) { return frugal::div(frugal::mul(x[0], 3.0), x[1]); }, {b, c});
  check_gradgradcheck([](const TensorList& x) { return frugal::rdiv(frugal::add(x[0], 2.5), 1.5); },
                      {away_from_zero({5}, 4)});
  check_gradgradcheck([](const TensorList& x) { return frugal::mul(x[0], x[0]); }, {a});  // one tensor twice
  const Tensor cond = frugal::gt(random_tensor({3, 4}, kFloat64, 5), 0.0);
  check_gradgradcheck([&](const TensorList& x) { return frugal::mul(frugal::where(cond, x[0], x[1]), x[0]); }, {a, b});
  check_gradgradcheck([&](const TensorList& x) { return frugal::mul(frugal::masked_fill(x[0], cond, 2.0), x[0]); },
                      {a});
}

TEST_CASE("double backward: unary ops and activations against differences of gradients") {
  const Tensor x = away_from_zero({2, 5}, 10), pos = away_from_zero({2, 5}, 11, 0.4, 2.0, /*positive=*/true);
  const std::vector<std::pair<std::string, Fn>> anywhere = {
      {"neg", [](const TensorList& t) { return frugal::mul(frugal::neg(t[0]), t[0]); }},
      {"affine", [](const TensorList& t) { return frugal::mul(frugal::affine(t[0], 1.5, -0.5), t[0]); }},
      {"exp", [](const TensorList& t) { return frugal::exp(t[0]); }},
      {"tanh", [](const TensorList& t) { return frugal::tanh(t[0]); }},
      {"sigmoid", [](const TensorList& t) { return frugal::sigmoid(t[0]); }},
      {"square", [](const TensorList& t) { return frugal::square(t[0]); }},
      {"sin", [](const TensorList& t) { return frugal::sin(t[0]); }},
      {"cos", [](const TensorList& t) { return frugal::cos(t[0]); }},
      {"pow 3", [](const TensorList& t) { return frugal::pow(t[0], 3.0); }},
      {"pow 0", [](const TensorList& t) { return frugal::mul(frugal::pow(t[0], 0.0), t[0]); }},
      {"reciprocal", [](const TensorList& t) { return frugal::reciprocal(t[0]); }},
      {"abs", [](const TensorList& t) { return frugal::mul(frugal::abs(t[0]), t[0]); }},
      {"relu", [](const TensorList& t) { return frugal::mul(frugal::relu(t[0]), t[0]); }},
      {"leaky_relu", [](const TensorList& t) { return frugal::mul(frugal::leaky_relu(t[0], 0.2), t[0]); }},
      {"elu", [](const TensorList& t) { return frugal::elu(t[0], 0.7); }},
      {"silu", [](const TensorList& t) { return frugal::silu(t[0]); }},
      {"softplus", [](const TensorList& t) { return frugal::softplus(t[0], 2.0, 2.0); }},
      {"gelu_tanh", [](const TensorList& t) { return frugal::gelu_tanh(t[0]); }},
      {"gelu", [](const TensorList& t) { return frugal::gelu(t[0]); }},
      {"mish", [](const TensorList& t) { return frugal::mish(t[0]); }},
      {"gelu's third derivative",
       [](const TensorList& t) {
         const Tensor g = autograd::grad({frugal::gelu(t[0])}, {t[0]}, {ones_like(t[0])}, {.create_graph = true})[0];
         return frugal::mul(g, g);
       }},
      {"hardswish", [](const TensorList& t) { return frugal::hardswish(frugal::mul(t[0], 2.0)); }},
      {"hardsigmoid", [](const TensorList& t) { return frugal::mul(frugal::hardsigmoid(t[0]), t[0]); }},
      {"clamp", [](const TensorList& t) { return frugal::mul(frugal::clamp(t[0], -1.0, 1.0), t[0]); }},
      {"hardtanh", [](const TensorList& t) { return frugal::mul(frugal::hardtanh(t[0], -1.0, 1.0), t[0]); }},
      {"tan", [](const TensorList& t) { return frugal::tan(frugal::mul(t[0], 0.5)); }},
      {"asin", [](const TensorList& t) { return frugal::asin(frugal::mul(t[0], 0.4)); }},
      {"acos", [](const TensorList& t) { return frugal::acos(frugal::mul(t[0], 0.4)); }},
      {"atanh", [](const TensorList& t) { return frugal::atanh(frugal::mul(t[0], 0.4)); }},
      {"atan", [](const TensorList& t) { return frugal::atan(t[0]); }},
      {"sinh", [](const TensorList& t) { return frugal::sinh(t[0]); }},
      {"cosh", [](const TensorList& t) { return frugal::cosh(t[0]); }},
      {"asinh", [](const TensorList& t) { return frugal::asinh(t[0]); }},
      {"erf", [](const TensorList& t) { return frugal::erf(t[0]); }},
      {"erfc", [](const TensorList& t) { return frugal::erfc(t[0]); }},
      {"expm1", [](const TensorList& t) { return frugal::expm1(t[0]); }},
      {"exp2", [](const TensorList& t) { return frugal::exp2(t[0]); }},
      {"logsigmoid", [](const TensorList& t) { return frugal::logsigmoid(t[0]); }},
      {"floor", [](const TensorList& t) { return frugal::mul(frugal::floor(frugal::mul(t[0], 1.7)), t[0]); }},
      {"round", [](const TensorList& t) { return frugal::mul(frugal::round(t[0]), t[0]); }},
      {"sign", [](const TensorList& t) { return frugal::mul(frugal::sign(t[0]), frugal::square(t[0])); }},
  };
  for (const auto& [name, f] : anywhere) {
    CAPTURE(name);
    check_gradgradcheck(f, {x});
  }
  const std::vector<std::pair<std::string, Fn>> positive = {
      {"log", [](const TensorList& t) { return frugal::log(t[0]); }},
      {"sqrt", [](const TensorList& t) { return frugal::sqrt(t[0]); }},
      {"rsqrt", [](const TensorList& t) { return frugal::rsqrt(t[0]); }},
      {"log1p", [](const TensorList& t) { return frugal::log1p(t[0]); }},
      {"pow 0.5", [](const TensorList& t) { return frugal::pow(t[0], 0.5); }},
      {"log2", [](const TensorList& t) { return frugal::log2(t[0]); }},
      {"log10", [](const TensorList& t) { return frugal::log10(t[0]); }},
      {"acosh", [](const TensorList& t) { return frugal::acosh(frugal::add(t[0], 1.0)); }},
  };
  for (const auto& [name, f] : positive) {
    CAPTURE(name);
    check_gradgradcheck(f, {pos});
  }
}

TEST_CASE("double backward: relu's packed mask under compression keeps its second derivative") {
  // A mask instead of y (Note [Compressed saved tensors]): d/dx (g relu'(x)) is 0, d/dg is the mask.
  // (float32: compression leaves float64 alone)
  const Tensor x = away_from_zero({4, 6}, 12).detach().to(kFloat32).requires_grad_();
  const Tensor g = random_tensor({4, 6}, kFloat32, 13).requires_grad_();
  Tensor gx_plain, gx_packed;
  for (bool compressed : {false, true}) {
    std::optional<autograd::CompressSavedTensors> compress;
    if (compressed)
      compress.emplace(
          autograd::CompressOptions{.min_bytes = 0, .select = [](std::string_view op) { return op == "relu"; }});
    const int64_t masks_before = autograd::compress_stats().tensors;
    const Tensor y = frugal::relu(frugal::mul(x, 1.0));
    const Tensor gx = autograd::grad({y}, {x}, {g}, {.create_graph = true})[0];
    const Tensor second = autograd::grad({frugal::sum(frugal::mul(gx, gx))}, {g})[0];
    CHECK(autograd::compress_stats().tensors == masks_before + (compressed ? 1 : 0));
    check_close(second, values_of(frugal::mul(gx, 2.0).detach()), 0, 0, compressed ? "packed" : "plain");
    (compressed ? gx_packed : gx_plain) = gx.detach();
  }
  check_close(gx_packed, values_of(gx_plain), 0, 0, "same first-order gradient");
}

TEST_CASE("double backward: reductions, views and copies") {
  const Tensor x = leaf({2, 3, 4}, 20);
  const std::vector<std::pair<std::string, Fn>> cases = {
      {"sum all",
       [](const TensorList& t) { return frugal::mul(frugal::sum(frugal::square(t[0])), frugal::sum(t[0])); }},
      {"sum dims",
       [](const TensorList& t) {
         return frugal::square(frugal::sum(t[0], {0, 2}));
       }},
      {"mean keepdim", [](const TensorList& t) { return frugal::mul(frugal::mean(t[0], {1}, true), t[0]); }},
      {"reshape",
       [](const TensorList& t) {
         return frugal::square(t[0].reshape({6, 4}));
       }},
      {"transpose", [](const TensorList& t) { return frugal::mul(t[0].transpose(0, 2), t[0].transpose(0, 2)); }},
      {"permute",
       [](const TensorList& t) {
         return frugal::tanh(t[0].permute({2, 0, 1}));
       }},
      {"expand",
       [](const TensorList& t) {
         return frugal::square(t[0].unsqueeze(1).expand({2, 5, 3, 4}));
       }},
      {"slice step 2", [](const TensorList& t) { return frugal::square(t[0].slice(2, 1, 4, 2)); }},
      {"select", [](const TensorList& t) { return frugal::sin(t[0].select(1, 2)); }},
      {"squeeze", [](const TensorList& t) { return frugal::square(t[0].slice(1, 1, 2).squeeze(1)); }},
      {"contiguous of a transpose",
       [](const TensorList& t) { return frugal::square(t[0].transpose(1, 2).contiguous()); }},
  };
  for (const auto& [name, f] : cases) {
    CAPTURE(name);
    check_gradgradcheck(f, {x});
  }
}

TEST_CASE("double backward: matmul, linear, softmax and mse_loss") {
  const Tensor a = leaf({3, 4}, 30), b = leaf({4, 2}, 31), batch = leaf({2, 3, 4}, 32), vec = leaf({4}, 33);
  check_gradgradcheck([](const TensorList& t) { return frugal::matmul(t[0], t[1]); }, {a, b});
  check_gradgradcheck([](const TensorList& t) { return frugal::matmul(t[0], t[1]); }, {batch, b});
  check_gradgradcheck([](const TensorList& t) { return frugal::matmul(t[0], t[1].transpose(-1, -2)); }, {batch, batch});
  check_gradgradcheck([](const TensorList& t) { return frugal::matmul(t[0], t[1]); }, {a, vec});
  check_gradgradcheck([](const TensorList& t) { return frugal::matmul(t[1], t[0].t()); }, {a, vec});
  const Tensor w = leaf({5, 4}, 34), bias = leaf({5}, 35);
  check_gradgradcheck([](const TensorList& t) { return frugal::tanh(frugal::linear(t[0], t[1], t[2])); },
                      {batch, w, bias});
  check_gradgradcheck([](const TensorList& t) { return frugal::square(frugal::linear(t[0], t[1])); }, {vec, w});
  check_gradgradcheck([](const TensorList& t) { return frugal::softmax(t[0], 1); }, {a});
  check_gradgradcheck([](const TensorList& t) { return frugal::log_softmax(t[0], 0); }, {a});
  check_gradgradcheck([](const TensorList& t) { return frugal::mse_loss(t[0], t[1]); }, {a, leaf({3, 4}, 36)});
  check_gradgradcheck([](const TensorList& t) { return frugal::mse_loss(t[0], t[1], Reduction::Sum); }, {batch, a});
}

TEST_CASE("double backward: conv2d (stride, padding, dilation, groups, bias) and its third derivative") {
  const Tensor x = leaf({2, 4, 5, 6}, 70), w = leaf({6, 2, 3, 2}, 71), b = leaf({6}, 72);
  for (const Conv2dOptions& o : {Conv2dOptions{}, Conv2dOptions{.stride = {2, 1}, .padding = {1, 2}, .groups = 2},
                                 Conv2dOptions{.padding = 1, .dilation = {1, 2}, .groups = 2}}) {
    CAPTURE(o.groups);
    const Tensor wo = o.groups == 1 ? leaf({3, 4, 3, 2}, 73) : w;
    const Tensor bo = o.groups == 1 ? leaf({3}, 74) : b;
    check_gradgradcheck([&](const TensorList& t) { return frugal::tanh(frugal::conv2d(t[0], t[1], t[2], o)); }, {x, wo, bo});
  }
  // The gradients' own backward, through conv_input_grad and conv_weight_grad's (Note
  // [Convolution double backward]): a penalty on both gradients of a conv, differentiated twice.
  const Tensor xs = leaf({1, 2, 4, 4}, 75), ws = leaf({2, 2, 3, 3}, 76);
  check_gradgradcheck(
      [](const TensorList& t) {
        const Tensor y = frugal::tanh(frugal::conv2d(t[0], t[1], Tensor(), {.padding = 1}));
        const TensorList g = autograd::grad({y}, {t[0], t[1]}, {ones_like(y)}, {.create_graph = true});
        return frugal::add(frugal::sum(frugal::square(g[0])), frugal::sum(frugal::square(g[1])));
      },
      {xs, ws});
}

TEST_CASE("double backward: the fused GELU MLP and flash attention (without dropout) against differences") {
  const Tensor x = leaf({3, 4}, 93), w1 = leaf({6, 4}, 94), b1 = leaf({6}, 95), w2 = leaf({2, 6}, 96);
  check_gradgradcheck([](const TensorList& t) { return frugal::gelu_mlp(t[0], t[1], t[2], t[3], Tensor()); }, {x, w1, b1, w2});
  const Tensor q = leaf({1, 2, 3, 4}, 97), k = leaf({1, 2, 5, 4}, 98), v = leaf({1, 2, 5, 4}, 99);
  for (const bool causal : {false, true}) {
    CAPTURE(causal);
    check_gradgradcheck(
        [&](const TensorList& t) { return frugal::flash_attention(t[0], t[1], t[2], Tensor(), causal, 0.0, 0.7); },
        {q, k, v});
  }
}

TEST_CASE("double backward: dropout's mask is kept by every order") {
  const Tensor x = leaf({4, 6}, 85);
  check_gradgradcheck(
      [](const TensorList& t) {
        Generator gen(5);  // the same mask at every call
        return frugal::square(frugal::dropout(frugal::tanh(t[0]), 0.3, /*training=*/true, &gen));
      },
      {x});
}

TEST_CASE("double backward: batch norm in training and eval, group norm, RMS norm") {
  const Tensor x = leaf({4, 3, 2, 2}, 86), w = leaf({3}, 87), b = leaf({3}, 88);
  const Tensor running_mean = random_tensor({3}, kFloat64, 89), running_var = random_tensor({3}, kFloat64, 90, Layout::Contiguous, 0.5, 2.0);
  for (const bool training : {true, false}) {
    CAPTURE(training);
    check_gradgradcheck(
        [&](const TensorList& t) {
          Tensor rm = running_mean.clone(), rv = running_var.clone();  // the update is the forward's business
          return frugal::tanh(frugal::batch_norm(t[0], rm, rv, t[1], t[2], training, 0.1, 1e-3));
        },
        {x, w, b});
  }
  check_gradgradcheck([](const TensorList& t) { return frugal::square(frugal::group_norm(t[0], 3, t[1], t[2], 1e-3)); },
                      {x, w, b});
  const Tensor x3 = leaf({3, 2, 5}, 91), w3 = leaf({5}, 92);
  check_gradgradcheck([](const TensorList& t) { return frugal::tanh(frugal::rms_norm(t[0], {5}, t[1], 1e-3)); }, {x3, w3});
}

TEST_CASE("double backward: layer_norm with and without weight and bias") {
  const Tensor x = leaf({3, 2, 5}, 80), w = leaf({2, 5}, 81), b = leaf({2, 5}, 82), w1 = leaf({5}, 83);
  check_gradgradcheck([](const TensorList& t) { return frugal::layer_norm(t[0], {2, 5}, t[1], t[2]); }, {x, w, b});
  check_gradgradcheck([](const TensorList& t) { return frugal::tanh(frugal::layer_norm(t[0], {5}, t[1])); }, {x, w1});
  check_gradgradcheck([](const TensorList& t) { return frugal::square(frugal::layer_norm(t[0], {5}, {}, {}, 0.1)); }, {x});
}

TEST_CASE("double backward: cross_entropy with class indices, smoothing, ignored rows and every reduction") {
  const Tensor logits = leaf({5, 4}, 37), logits3 = leaf({2, 3, 4}, 38);
  const Tensor target = from_vector(std::vector<int64_t>{1, 3, -100, 0, 2}, {5});
  const Tensor target3 = from_vector(std::vector<int64_t>{0, 2, 1, 1, 7, 2, 0, 0}, {2, 4});
  for (const Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (const double smoothing : {0.0, 0.2}) {
      CAPTURE(int(reduction));
      CAPTURE(smoothing);
      const CrossEntropyOptions options{.label_smoothing = smoothing, .reduction = reduction};
      check_gradgradcheck([&](const TensorList& t) { return frugal::cross_entropy(t[0], target, options); }, {logits});
      CrossEntropyOptions ignore_seven = options;
      ignore_seven.ignore_index = 7;  // (N, C, L) logits, one position ignored
      check_gradgradcheck([&](const TensorList& t) { return frugal::cross_entropy(t[0], target3, ignore_seven); },
                          {logits3});
    }
}

TEST_CASE("double backward: third derivatives and a Hessian-vector product against closed forms") {
  const Tensor x = leaf({7}, 40);
  const Tensor g1 = autograd::grad({frugal::sum(frugal::sin(x))}, {x}, {}, {.create_graph = true})[0];
  const Tensor g2 = autograd::grad({frugal::sum(g1)}, {x}, {}, {.create_graph = true})[0];
  const Tensor g3 = autograd::grad({frugal::sum(g2)}, {x})[0];
  const std::vector<double> xv = values_of(x);
  std::vector<double> cos_x, minus_sin, minus_cos;
  for (double v : xv)
    cos_x.push_back(std::cos(v)), minus_sin.push_back(-std::sin(v)), minus_cos.push_back(-std::cos(v));
  check_close(g1, cos_x, 1e-14, 1e-15, "sin'");
  check_close(g2, minus_sin, 1e-14, 1e-15, "sin''");
  check_close(g3, minus_cos, 1e-14, 1e-15, "sin'''");
  CHECK_FALSE(g3.requires_grad());  // the last grad() made no graph

  // f(w) = sum(tanh(A w)): H v = A^T diag(-2 t (1 - t^2)) A v, t = tanh(A w).
  const Tensor A = random_tensor({5, 3}, kFloat64, 41), w = leaf({3}, 42), v = random_tensor({3}, kFloat64, 43);
  const Tensor gw =
      autograd::grad({frugal::sum(frugal::tanh(frugal::matmul(A, w)))}, {w}, {}, {.create_graph = true})[0];
  const Tensor hv = autograd::grad({frugal::sum(frugal::mul(gw, v))}, {w})[0];
  const std::vector<double> av = values_of(A), wv = values_of(w), vv = values_of(v);
  std::vector<double> want(3, 0.0);
  for (int i = 0; i < 5; ++i) {
    double z = 0, zv = 0;
    for (int j = 0; j < 3; ++j) z += av[i * 3 + j] * wv[j], zv += av[i * 3 + j] * vv[j];
    const double t = std::tanh(z), d2 = -2 * t * (1 - t * t);
    for (int j = 0; j < 3; ++j) want[j] += av[i * 3 + j] * d2 * zv;
  }
  check_close(hv, want, 1e-13, 1e-14, "H v");
}

TEST_CASE("double backward: a gradient penalty and a physics-informed loss match PyTorch") {
  // tools/torch_golden_double_backward.py: a critic linear(4, 8) -> leaky_relu(0.2) -> linear(8, 1)
  // on wave() weights, the WGAN-GP penalty mean((|d critic / d x|_2 - 1)^2) at 3 samples,
  // and its gradients with respect to both weights (PyTorch 1.13, float64).
  const Tensor w1 = wave({8, 4}, 0.0), b1 = wave({8}, 1.0), w2 = wave({1, 8}, 2.0), b2 = wave({1}, 3.0);
  const Tensor x = frugal::mul(wave({3, 4}, 4.0, false), 10.0).requires_grad_();
  const Tensor critic = frugal::linear(frugal::leaky_relu(frugal::linear(x, w1, b1), 0.2), w2, b2);
  const Tensor gx = autograd::grad({critic}, {x}, {ones_like(critic)}, {.create_graph = true})[0];
  const Tensor norm = frugal::sqrt(frugal::sum(frugal::square(gx), {1}));
  const Tensor penalty = frugal::mean(frugal::square(frugal::sub(norm, 1.0)));
  const TensorList g = autograd::grad({penalty}, {w1, b1, w2});
  CHECK(penalty.item<double>() == doctest::Approx(0.9280525066553).epsilon(1e-12));
  check_close(g[0].slice(0, 0, 2),
              {-0.0449089281138, -0.0379661488401, 0.0245971274295, 0.05112555439, 0.00835184348022, 0.00552507503833,
               -0.00539594127858, -0.00841189098103},
              1e-10, 1e-15, "d penalty / d w1 (two rows)");
  CHECK(max_abs(g[1]) == 0.0);  // b1 moves gx only through leaky_relu's kink, as PyTorch's 0
  check_close(g[2],
              {-0.0649569271697, 0.0904127551598, 0.216560639022, 0.0641471364466, -0.146572325118, -0.214208716854,
               -0.0129647463182, 0.111388863922},
              1e-10, 1e-15, "d penalty / d w2");

  // u(t) = linear(1, 6) -> tanh -> linear(6, 1); the residual of u'' + u = 0 at 5 points.
  const Tensor v1 = wave({6, 1}, 5.0), c1 = wave({6}, 6.0), v2 = wave({1, 6}, 7.0);
  const Tensor t = frugal::mul(wave({5, 1}, 8.0, false), 10.0).requires_grad_();
  const Tensor u = frugal::linear(frugal::tanh(frugal::linear(t, v1, c1)), v2);
  const Tensor ut = autograd::grad({u}, {t}, {ones_like(u)}, {.create_graph = true})[0];
  const Tensor utt = autograd::grad({ut}, {t}, {ones_like(ut)}, {.create_graph = true})[0];
  const Tensor residual = frugal::mean(frugal::square(frugal::add(utt, u)));
  const TensorList gr = autograd::grad({residual}, {v1, c1, v2});
  CHECK(residual.item<double>() == doctest::Approx(0.0002822216203172).epsilon(1e-11));
  check_close(
      gr[0],
      {-0.00105554738948, -0.00150678774895, 0.000287228010113, 0.00161561487808, 0.000604698875999, -0.00128702899788},
      1e-10, 1e-15, "d residual / d v1");
  check_close(
      gr[2],
      {0.00094928325971, 0.00192375352024, 6.31756064307e-05, -0.00188092481966, -0.00106593295559, 0.00129640958215},
      1e-10, 1e-15, "d residual / d v2");
}

TEST_CASE("double backward: gradcheck of a loss that takes a gradient itself") {
  // A gradient penalty as a function of the critic's weights, checked against differences of
  // the penalty (gradcheck runs f with grad mode on for that).
  const Tensor x = leaf({3, 4}, 55), w1 = leaf({5, 4}, 56), w2 = leaf({1, 5}, 57);
  check_gradcheck(
      [&](const TensorList& t) {
        const Tensor xi = t[0].detach().requires_grad_();
        const Tensor critic = frugal::linear(frugal::softplus(frugal::linear(xi, t[1])), t[2]);
        const Tensor gx = autograd::grad({critic}, {xi}, {ones_like(critic)}, {.create_graph = true})[0];
        return frugal::mean(frugal::square(frugal::sub(frugal::sqrt(frugal::sum(frugal::square(gx), {1})), 1.0)));
      },
      {x.detach(), w1, w2});
}

TEST_CASE("double backward: create_graph leaves .grad alone and keeps the graph for the outer backward") {
  const Tensor w = leaf({4, 3}, 50), x = leaf({2, 4}, 51);
  const Tensor loss = frugal::sum(frugal::tanh(frugal::matmul(x, w)));
  const Tensor gx = autograd::grad({loss}, {x}, {}, {.create_graph = true})[0];
  CHECK(gx.requires_grad());
  CHECK_FALSE(w.grad().defined());
  CHECK_FALSE(x.grad().defined());
  // The outer loss runs through the first graph twice: loss's own and the penalty's.
  frugal::add(loss, frugal::sum(frugal::square(gx))).backward();
  CHECK(w.grad().defined());
  // Against the sum of the two gradients taken apart.
  const Tensor w2 = w.detach().requires_grad_(), x2 = x.detach().requires_grad_();
  const Tensor loss2 = frugal::sum(frugal::tanh(frugal::matmul(x2, w2)));
  const Tensor gx2 = autograd::grad({loss2}, {x2}, {}, {.create_graph = true})[0];
  const TensorList parts = autograd::grad({frugal::sum(frugal::square(gx2))}, {w2});
  const Tensor plain = autograd::grad({frugal::sum(frugal::tanh(frugal::matmul(x2, w2)))}, {w2})[0];
  check_close(w.grad(), values_of(frugal::add(parts[0], plain)), 1e-13, 1e-15, "w.grad");
}

TEST_CASE("double backward: backward with create_graph leaves .grad with its history, as PyTorch's") {
  // torch: y = (x ** 3).sum(); y.backward(create_graph=True); x.grad = 3 x^2 with a grad_fn,
  // and (x.grad ** 2).sum() differentiates to 36 x^3.
  const Tensor x = leaf({4}, 64);
  const Tensor w = leaf({4}, 65);
  autograd::backward({frugal::sum(frugal::mul(frugal::pow(x, 3.0), w))}, {}, {.create_graph = true});
  REQUIRE(x.grad().defined());
  CHECK(x.grad().requires_grad());
  const std::vector<double> xv = values_of(x), wv = values_of(w);
  std::vector<double> first, second_x, second_w;
  for (size_t i = 0; i < xv.size(); ++i) {
    first.push_back(3 * xv[i] * xv[i] * wv[i]);
    second_x.push_back(36 * std::pow(xv[i], 3) * wv[i] * wv[i]);  // d/dx (3 x^2 w)^2
    second_w.push_back(18 * std::pow(xv[i], 4) * wv[i]);          // d/dw (3 x^2 w)^2
  }
  check_close(x.grad(), first, 1e-14, 1e-15, "x.grad");
  const TensorList g = autograd::grad({frugal::sum(frugal::square(x.grad()))}, {x, w}, {}, /*retain_graph=*/true);
  check_close(g[0], second_x, 1e-13, 1e-15, "d/dx |x.grad|^2");
  check_close(g[1], second_w, 1e-13, 1e-15, "d/dw |x.grad|^2");
  // A second backward adds to .grad out of place, keeping the history of both.
  autograd::backward({frugal::sum(frugal::mul(x, w))}, {}, {.create_graph = true});
  check_close(autograd::grad({frugal::sum(x.grad())}, {w})[0], [&] {
    std::vector<double> want;
    for (size_t i = 0; i < xv.size(); ++i) want.push_back(3 * xv[i] * xv[i] + 1);
    return want;
  }(), 1e-14, 1e-15, "d/dw sum(x.grad) after two backwards");
}

TEST_CASE("double backward: Tensor::backward(gradient, retain_graph, create_graph) as torch.Tensor.backward") {
  // torch: y = x ** 3 * w; y.backward(v, create_graph=True); x.grad = 3 x^2 w v with a grad_fn.
  const Tensor x = leaf({3}, 66);
  const Tensor w = leaf({3}, 67);
  const Tensor v = leaf({3}, 68).detach();
  frugal::mul(frugal::pow(x, 3.0), w).backward(v, /*retain_graph=*/false, /*create_graph=*/true);
  REQUIRE(x.grad().defined());
  CHECK(x.grad().requires_grad());
  CHECK(w.grad().requires_grad());
  const std::vector<double> xv = values_of(x), wv = values_of(w), vv = values_of(v);
  std::vector<double> first, second_x;
  for (size_t i = 0; i < xv.size(); ++i) {
    first.push_back(3 * xv[i] * xv[i] * wv[i] * vv[i]);
    second_x.push_back(6 * xv[i] * wv[i] * vv[i]);  // d/dx sum(3 x^2 w v)
  }
  check_close(x.grad(), first, 1e-14, 1e-15, "x.grad");
  check_close(autograd::grad({frugal::sum(x.grad())}, {x})[0], second_x, 1e-14, 1e-15, "d/dx sum(x.grad)");
  // Without create_graph the .grad is a constant, as before.
  const Tensor x2 = leaf({3}, 69);
  frugal::sum(frugal::pow(x2, 3.0)).backward();
  CHECK_FALSE(x2.grad().requires_grad());
}

TEST_CASE("double backward: a node without one is named before anything runs") {
  // The fused linear + cross entropy keeps its gradients, not x and the weight: it has none.
  const Tensor x = leaf({2, 4}, 60), w = leaf({4, 4}, 61), w1 = leaf({6, 4}, 62);
  const Tensor target = from_vector(std::vector<int64_t>{1, 3}, {2});
  check_error(
      [&] {
        const Tensor loss = frugal::linear_cross_entropy(frugal::tanh(frugal::matmul(x, w)), w1, Tensor(), target);
        autograd::grad({loss}, {x}, {}, {.create_graph = true});
      },
      {"create_graph", "LinearCrossEntropyBackward", "Note [Double backward]"});
  // Nodes the requested inputs do not lead to are not checked: only w's path must have one.
  const Tensor h = frugal::matmul(x, w);
  const Tensor gw1 = autograd::grad({frugal::linear_cross_entropy(h.detach(), w1, Tensor(), target)}, {w1})[0];
  CHECK_FALSE(gw1.requires_grad());  // without create_graph: no check, no history
  const Tensor gw = autograd::grad({frugal::sum(frugal::tanh(h))}, {w}, {}, {.create_graph = true})[0];
  CHECK(gw.requires_grad());
  // A checkpoint's replay is a nested backward: refused too.
  check_error(
      [&] {
        const TensorList y =
            autograd::checkpoint([](const TensorList& in) { return TensorList{frugal::tanh(in[0])}; }, {x});
        autograd::grad({frugal::sum(y[0])}, {x}, {}, {.create_graph = true});
      },
      {"create_graph", "CheckpointBackward"});
}

TEST_CASE("autograd::functional: jacobian, hessian, vjp and hvp against closed forms") {
  namespace F = autograd::functional;
  const Tensor A = random_tensor({3, 4}, kFloat64, 100), x = random_tensor({4}, kFloat64, 101);
  const std::vector<double> av = values_of(A), xv = values_of(x);
  // J of tanh(A x) = diag(1 - t^2) A.
  const Tensor J = F::jacobian([&](const Tensor& t) { return frugal::tanh(frugal::matmul(A, t)); }, x);
  CHECK(J.sizes() == Shape{3, 4});
  std::vector<double> want_j;
  std::vector<double> t(3);
  for (int i = 0; i < 3; ++i) {
    double z = 0;
    for (int j = 0; j < 4; ++j) z += av[size_t(i * 4 + j)] * xv[size_t(j)];
    t[size_t(i)] = std::tanh(z);
    for (int j = 0; j < 4; ++j) want_j.push_back((1 - t[size_t(i)] * t[size_t(i)]) * av[size_t(i * 4 + j)]);
  }
  check_close(J, want_j, 1e-14, 1e-15, "jacobian");
  CHECK_FALSE(J.requires_grad());
  CHECK_FALSE(x.requires_grad());  // the caller's tensor is untouched
  // H of log(sum(exp(x))) = diag(p) - p p^T, p = softmax(x); shape x.sizes() twice.
  const Tensor x2 = random_tensor({2, 3}, kFloat64, 102);
  const Tensor H = F::hessian([](const Tensor& t) { return frugal::log(frugal::sum(frugal::exp(t))); }, x2);
  CHECK(H.sizes() == Shape{2, 3, 2, 3});
  const std::vector<double> x2v = values_of(x2);
  double total = 0;
  for (double v : x2v) total += std::exp(v);
  std::vector<double> want_h;
  for (size_t i = 0; i < 6; ++i)
    for (size_t j = 0; j < 6; ++j) {
      const double pi = std::exp(x2v[i]) / total, pj = std::exp(x2v[j]) / total;
      want_h.push_back((i == j ? pi : 0.0) - pi * pj);
    }
  check_close(H, want_h, 1e-13, 1e-15, "hessian");
  // hvp = H v; vjp of a linear map = A^T v; a linear f has H = 0.
  const Tensor v = random_tensor({2, 3}, kFloat64, 103);
  const F::HvpResult r = F::hvp([](const TensorList& t) { return frugal::log(frugal::sum(frugal::exp(t[0]))); }, {x2}, {v});
  check_close(r.hvp[0], values_of(frugal::matmul(H.reshape({6, 6}), v.reshape({6}))), 1e-13, 1e-15, "hvp");
  CHECK(r.output.item<double>() == doctest::Approx(std::log(total)).epsilon(1e-14));
  const Tensor u = random_tensor({3}, kFloat64, 104);
  const F::VjpResult q = F::vjp([&](const TensorList& t) { return frugal::matmul(A, t[0]); }, {x}, u);
  check_close(q.vjp[0], values_of(frugal::matmul(A.t(), u)), 1e-14, 1e-15, "vjp");
  const F::HvpResult lin = F::hvp([&](const TensorList& t) { return frugal::sum(frugal::matmul(A, t[0])); }, {x}, {x});
  CHECK(max_abs(lin.hvp[0]) == 0.0);
  check_error([&] { F::hvp([](const TensorList& t) { return t[0]; }, {x}, {x}); }, {"hvp", "one element"});
  check_error([&] { F::hvp([](const TensorList& t) { return frugal::sum(t[0]); }, {x}, {u}); }, {"hvp", "shape"});
}
