// Probes for silent wrong answers, crashes and misleading numbers on the CPU in three areas:
// SVD low-rank layers and compress() (against weights built from a known SVD, so that the
// truncated SVD is known without computing one, and naive float64 loops), blockwise 8-bit
// quantization of saved tensors (against a float64 reference of Note [Blockwise quantization]
// at the float formats' edges), and the arena allocator's statistics (against a reference
// model of Note [Sizes and pools] and Note [Best fit, split and merge], the trace and the
// profiler). A failing case here is a finding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/compress.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "core/error.h"
#include "memory/allocator.h"
#include "memory/caching_allocator.h"
#include "memory/trace.h"
#include "nn/container.h"
#include "nn/low_rank.h"
#include "nn/low_rank_budget.h"
#include "nn/low_rank_conv.h"
#include "profiler/session.h"
#include "tensor/factory.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/quantize.h"
#include "tests/quantize_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// ============================================================================================
// Low rank: weights with a known SVD
// ============================================================================================

/// k orthonormal vectors of length n (k <= n), as columns of a row-major (n, k) matrix:
/// Gram-Schmidt, twice, on random vectors.
Values orthonormal_columns(int64_t n, int64_t k, uint64_t seed) {
  Values q = random_values(n * k, seed);
  for (int64_t j = 0; j < k; ++j)
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t p = 0; p < j; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += q[size_t(i * k + j)] * q[size_t(i * k + p)];
        for (int64_t i = 0; i < n; ++i) q[size_t(i * k + j)] -= dot * q[size_t(i * k + p)];
      }
      double norm = 0;
      for (int64_t i = 0; i < n; ++i) norm += q[size_t(i * k + j)] * q[size_t(i * k + j)];
      for (int64_t i = 0; i < n; ++i) q[size_t(i * k + j)] /= std::sqrt(norm);
    }
  return q;
}

/// W = U diag(s) V^T (out, in) with U, V orthonormal: its rank-r truncation is known exactly.
struct KnownSvd {
  int64_t out, in;
  Values U, V, s;  // U (out, k), V (in, k), s (k) decreasing
  /// sum_{l<r} s_l u_l v_l^T, (out, in) row-major.
  Values truncated(int64_t r) const {
    const int64_t k = int64_t(s.size());
    Values w(size_t(out * in), 0.0);
    for (int64_t i = 0; i < out; ++i)
      for (int64_t j = 0; j < in; ++j)
        for (int64_t l = 0; l < r; ++l)
          w[size_t(i * in + j)] += U[size_t(i * k + l)] * s[size_t(l)] * V[size_t(j * k + l)];
    return w;
  }
  /// ||W - W_r||_F / ||W||_F = sqrt(sum_{l>=r} s_l^2 / sum s_l^2) (Eckart-Young).
  double tail(int64_t r) const {
    double t = 0, all = 0;
    for (size_t l = 0; l < s.size(); ++l) (int64_t(l) >= r ? t : all) += s[l] * s[l];
    return std::sqrt(t / (t + all));
  }
};

KnownSvd known_svd(int64_t out, int64_t in, uint64_t seed, double scale = 1.0) {
  const int64_t k = std::min(out, in);
  KnownSvd w{out, in, orthonormal_columns(out, k, seed), orthonormal_columns(in, k, seed + 7), {}};
  for (int64_t l = 0; l < k; ++l)
    w.s.push_back(scale * (3.0 + 5.0 * std::pow(0.6, double(l))));  // distinct, decreasing
  return w;
}

void set_values(const Tensor& t, const Values& v) {
  autograd::NoGradGuard no_grad;
  t.copy_(from_vector(v, t.sizes(), TensorOptions(kFloat64)));
}

/// y = x W^T + b in float64: x (B, in), W (out, in), b (out) or empty.
Values naive_linear(const Values& x, const Values& w, const Values& b, int64_t B, int64_t in, int64_t out) {
  Values y(size_t(B * out), 0.0);
  for (int64_t n = 0; n < B; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[size_t(o)];
      for (int64_t i = 0; i < in; ++i) acc += x[size_t(n * in + i)] * w[size_t(o * in + i)];
      y[size_t(n * out + o)] = acc;
    }
  return y;
}

/// A (rows, cols) @ B (cols, inner) in float64, row-major; `ta` reads A transposed (A is (cols, rows)).
Values naive_mm(const Values& a, const Values& b, int64_t rows, int64_t cols, int64_t inner, bool ta = false) {
  Values c(size_t(rows * inner), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t l = 0; l < cols; ++l) {
      const double av = ta ? a[size_t(l * rows + i)] : a[size_t(i * cols + l)];
      for (int64_t j = 0; j < inner; ++j) c[size_t(i * inner + j)] += av * b[size_t(l * inner + j)];
    }
  return c;
}

Tensor run_no_grad(nn::UnaryModule& m, const Tensor& x) {
  autograd::NoGradGuard no_grad;
  return m.forward(x);
}

Tensor f64(const Values& v, const Shape& s, bool grad = false) {
  Tensor t = from_vector(v, s, TensorOptions(kFloat64));
  if (grad) t.requires_grad_();
  return t;
}

}  // namespace

// ============================================================================================
// probe lowrank
// ============================================================================================

TEST_CASE("probe lowrank: known-SVD Linear layers, tall, wide and square, ranks 1 to min, with and without bias") {
  struct Case {
    int64_t out, in;
    bool bias;
  };
  // 18 x 24 has k = 18 > 16: the BDCSVD path of Note [Eigen SVD choice].
  for (const Case c : {Case{3, 7, true}, Case{7, 3, false}, Case{5, 5, true}, Case{1, 6, true}, Case{18, 24, false}}) {
    const int64_t k = std::min(c.out, c.in), B = 4;
    const KnownSvd w = known_svd(c.out, c.in, uint64_t(c.out * 100 + c.in));
    nn::Linear layer(c.in, c.out, nn::LinearOptions{.bias = c.bias});
    layer.to(kFloat64);
    set_values(layer.weight, w.truncated(k));
    const Values bias = c.bias ? random_values(c.out, 5) : Values{};
    if (c.bias) set_values(layer.bias, bias);
    const Values xv = random_values(B * c.in, 6), gv = random_values(B * c.out, 8);
    for (int64_t r : {int64_t(1), (k + 1) / 2, k}) {
      INFO("Linear(in=", c.in, ", out=", c.out, ", bias=", c.bias, ") rank ", r);
      auto lr = nn::to_low_rank(layer, r, {.require_saving = false});
      CHECK(lr->num_parameters() == r * (c.in + c.out) + (c.bias ? c.out : 0));
      const Values wr = w.truncated(r);
      check_close(lr->dense_weight(), wr, 0, 1e-12, "dense_weight = W_r");
      CHECK(nn::relative_error(layer.weight, *lr) == doctest::Approx(w.tail(r)).epsilon(1e-9));
      // Forward and every gradient against float64 loops with W_r = (U_r S_r) Vh_r.
      Tensor x = f64(xv, {B, c.in}, true);
      Tensor y = lr->forward(x);
      check_close(y, naive_linear(xv, wr, bias, B, c.in, c.out), 0, 1e-12, "y");
      sum(mul(y, f64(gv, {B, c.out}))).backward();
      check_close(x.grad(), naive_mm(gv, wr, B, c.out, c.in), 0, 1e-12, "dx = g W_r");
      const Values down = values_of(lr->down->weight), up = values_of(lr->up->weight);
      Values hx(size_t(B * r), 0.0);
      for (int64_t n = 0; n < B; ++n)
        for (int64_t l = 0; l < r; ++l)
          for (int64_t i = 0; i < c.in; ++i)
            hx[size_t(n * r + l)] += xv[size_t(n * c.in + i)] * down[size_t(l * c.in + i)];
      check_close(lr->up->weight.grad(), naive_mm(gv, hx, c.out, B, r, true), 0, 1e-12, "d up = g^T h");
      const Values gu = naive_mm(gv, up, B, c.out, r);  // (B, r)
      check_close(lr->down->weight.grad(), naive_mm(gu, xv, r, B, c.in, true), 0, 1e-12, "d down = (g up)^T x");
      if (c.bias) {
        Values db(size_t(c.out), 0.0);
        for (int64_t n = 0; n < B; ++n)
          for (int64_t o = 0; o < c.out; ++o) db[size_t(o)] += gv[size_t(n * c.out + o)];
        check_close(lr->up->bias.grad(), db, 0, 1e-13, "d bias");
      }
      // Full rank is the layer itself.
      if (r == k) check_close(y, values_of(run_no_grad(layer, x)), 0, 1e-12, "full rank = the layer");
    }
    check_error([&] { nn::to_low_rank(layer, k + 1, {.require_saving = false}); },
                {"rank " + std::to_string(k + 1), "outside"});
    check_error([&] { nn::to_low_rank(layer, 0, {.require_saving = false}); }, {"rank 0", "outside"});
  }
}

TEST_CASE(
    "probe lowrank: an exactly rank-5 weight is reproduced to 1e-12 in float64, and the energy rule finds rank 5") {
  // (40, 24) of rank 5: k = 24 runs BDCSVD. W = X Y with X (40, 5), Y (5, 24).
  const int64_t out = 40, in = 24, rank = 5, B = 3;
  const Values X = random_values(out * rank, 21), Y = random_values(rank * in, 22);
  const Values wv = naive_mm(X, Y, out, rank, in);
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(std::string(dtype_name(dt)));
    nn::Linear layer(in, out);
    layer.to(dt);
    set_values(layer.weight, wv);
    const Tensor x = random_tensor({B, in}, dt, 23);
    const Values want = values_of(run_no_grad(layer, x));
    const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
    auto lr = nn::to_low_rank(layer, rank);
    check_close(run_no_grad(*lr, x), want, tol, tol, "rank 5 of a rank-5 weight");
    CHECK(nn::relative_error(layer.weight, *lr) < (dt == kFloat64 ? 1e-13 : 1e-6));
    for (double fraction : {1.0, 0.999999}) CHECK(nn::to_low_rank(layer, nn::Energy{fraction})->rank == rank);
    // Rank 4 drops exactly the smallest of the 5 nonzero singular values.
    const Values s = values_of(ops::svd(layer.weight.detach().to(kFloat64)).S);
    const double tail = std::sqrt(s[4] * s[4] / (s[0] * s[0] + s[1] * s[1] + s[2] * s[2] + s[3] * s[3] + s[4] * s[4]));
    CHECK(nn::relative_error(layer.weight, *nn::to_low_rank(layer, 4)) == doctest::Approx(tail).epsilon(1e-5));
  }
}

TEST_CASE("probe lowrank: a zero weight factorizes to zero factors; the output is the bias, the error 0") {
  nn::Linear layer(6, 9);
  layer.to(kFloat64);
  set_values(layer.weight, Values(54, 0.0));
  const Values bias = random_values(9, 31);
  set_values(layer.bias, bias);
  for (auto lr : {nn::to_low_rank(layer, 1), nn::to_low_rank(layer, nn::Energy{0.5})}) {
    CHECK(lr->rank == 1);
    check_close(lr->dense_weight(), Values(54, 0.0), 0, 0, "dense weight");
    Values want;
    for (int n = 0; n < 2; ++n) want.insert(want.end(), bias.begin(), bias.end());
    check_close(run_no_grad(*lr, random_tensor({2, 6}, kFloat64, 32)), want, 0, 0, "y = bias");
    CHECK(nn::relative_error(layer.weight, *lr) == 0.0);
  }
  CHECK(nn::rank_for_energy(f64(Values(4, 0.0), {4}), nn::Energy{1.0}) == 1);
  CHECK(nn::rank_for_energy(f64(Values{}, {0}), nn::Energy{1.0}) == 0);
}

TEST_CASE("probe lowrank: energy thresholds at 0, 1 and in between; the rank rules do not depend on the scale") {
  // s^2 = 16, 9, 4, 1, 0.25: cumulative shares 16/30.25, 25/30.25, 29/30.25, 30/30.25, 1.
  const Values s = {4, 3, 2, 1, 0.5};
  const double total = 30.25;
  for (double scale : {1.0, 1e-170, 1e170, 1e-300, 1e300}) {
    INFO("scale ", scale);
    Values scaled;
    for (double v : s) scaled.push_back(v * scale);
    const Tensor st = f64(scaled, {5});
    CHECK(nn::rank_for_energy(st, nn::Energy{1.0}) == 5);
    CHECK(nn::rank_for_energy(st, nn::Energy{16 / total}) == 1);
    CHECK(nn::rank_for_energy(st, nn::Energy{16 / total + 1e-6}) == 2);
    CHECK(nn::rank_for_energy(st, nn::Energy{25 / total + 1e-6}) == 3);
    CHECK(nn::rank_for_energy(st, nn::Energy{1e-300}) == 1);
    // The budget rule: the same spectra give the same ranks at any scale.
    const std::vector<nn::LayerSpectrum> layers = {{.in = 12, .out = 5, .s = scaled},
                                                   {.in = 8, .out = 5, .s = {scale, 0.9 * scale, 0.1 * scale, 0, 0}}};
    const std::vector<nn::RankChoice> got = nn::ranks_for_budget(layers, nn::ParamBudget{0.6});
    const std::vector<nn::RankChoice> ref =
        nn::ranks_for_budget({{.in = 12, .out = 5, .s = s}, {.in = 8, .out = 5, .s = {1, 0.9, 0.1, 0, 0}}}, {0.6});
    for (size_t i = 0; i < ref.size(); ++i) {
      CHECK(got[i].rank == ref[i].rank);
      CHECK(got[i].energy_kept == doctest::Approx(ref[i].energy_kept).epsilon(1e-12));
    }
  }
  for (double bad : {0.0, -0.1, 1.0 + 1e-9, kNaN})
    check_error([&] { nn::rank_for_energy(f64(s, {5}), nn::Energy{bad}); }, {"rank_for_energy", "(0, 1]"});
}

TEST_CASE("probe lowrank: compress reports the same ranks, energy and error for W and for 1e-160 W or 1e160 W") {
  const KnownSvd w = known_svd(6, 40, 41);
  std::vector<nn::CompressReport> reports;
  for (double scale : {1.0, 1e-160, 1e160}) {
    auto model = std::make_shared<nn::Sequential>(
        std::initializer_list<std::shared_ptr<nn::UnaryModule>>{std::make_shared<nn::Linear>(40, 6)});
    model->to(kFloat64);
    Values wv = w.truncated(6);
    for (double& v : wv) v *= scale;
    set_values(std::dynamic_pointer_cast<nn::Linear>(model->named_children()[0].second)->weight, wv);
    reports.push_back(nn::compress(*model, {.patterns = {"*"}, .energy = nn::Energy{0.8}}));
  }
  // The reference: the smallest r whose share of sum s^2 reaches 0.8, from the known spectrum.
  int64_t r = 1;
  while (w.tail(r) * w.tail(r) > 0.2 * (1 + 1e-12)) ++r;
  REQUIRE(r * 46 < 240);  // it saves
  for (const nn::CompressReport& rep : reports) {
    REQUIRE(rep.layers.size() == 1);
    const nn::LayerCompression& l = rep.layers[0];
    CHECK(l.rank == r);
    CHECK(l.replaced);
    CHECK(l.energy_kept == doctest::Approx(1 - w.tail(r) * w.tail(r)).epsilon(1e-10));
    CHECK(l.relative_error == doctest::Approx(w.tail(r)).epsilon(1e-8));
    CHECK(l.params_before == 6 * 40 + 6);
    CHECK(l.params_after == r * 46 + 6);
  }
}

namespace {

struct ConvGeom {
  int64_t N, C, H, W, O, kh, kw;
  Int2 stride, padding, dilation;
  int64_t OH() const { return (H + 2 * padding.h - dilation.h * (kh - 1) - 1) / stride.h + 1; }
  int64_t OW() const { return (W + 2 * padding.w - dilation.w * (kw - 1) - 1) / stride.w + 1; }
};

/// conv2d in float64 loops; with `g` given, instead the input gradient for output gradient g.
Values naive_conv(const ConvGeom& c, const Values& x, const Values& w, const Values& b, const Values* g = nullptr) {
  Values y(size_t(c.N * c.O * c.OH() * c.OW()), 0.0), dx(x.size(), 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.O; ++o)
      for (int64_t oh = 0; oh < c.OH(); ++oh)
        for (int64_t ow = 0; ow < c.OW(); ++ow) {
          const size_t yi = size_t(((n * c.O + o) * c.OH() + oh) * c.OW() + ow);
          double acc = b.empty() ? 0.0 : b[size_t(o)];
          for (int64_t ci = 0; ci < c.C; ++ci)
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t ih = oh * c.stride.h - c.padding.h + i * c.dilation.h;
                const int64_t iw = ow * c.stride.w - c.padding.w + j * c.dilation.w;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                const size_t xi = size_t(((n * c.C + ci) * c.H + ih) * c.W + iw);
                const double wv = w[size_t(((o * c.C + ci) * c.kh + i) * c.kw + j)];
                acc += x[xi] * wv;
                if (g) dx[xi] += (*g)[yi] * wv;
              }
          y[yi] = acc;
        }
  return g ? dx : y;
}

}  // namespace

TEST_CASE(
    "probe lowrank: LowRankConv2d with stride, padding, dilation and a 2x3 kernel is the conv of the truncated "
    "weight") {
  const ConvGeom c{2, 3, 9, 10, 7, 2, 3, Int2(2, 1), Int2(1, 2), Int2(2, 1)};
  const int64_t patch = c.C * c.kh * c.kw;  // 18: W2 is (7, 18), k = 7
  const KnownSvd w = known_svd(c.O, patch, 51);
  for (bool bias : {true, false}) {
    nn::Conv2d conv(c.C, c.O, Int2(c.kh, c.kw),
                    {.stride = c.stride, .padding = c.padding, .dilation = c.dilation, .bias = bias});
    conv.to(kFloat64);
    set_values(conv.weight, w.truncated(c.O));
    const Values b = bias ? random_values(c.O, 52) : Values{};
    if (bias) set_values(conv.bias, b);
    const Values xv = random_values(c.N * c.C * c.H * c.W, 53), gv = random_values(c.N * c.O * c.OH() * c.OW(), 54);
    for (int64_t r : {1, 3, 7}) {
      INFO("bias ", bias, " rank ", r);
      auto lr = nn::to_low_rank(conv, r, {.require_saving = false});
      CHECK(lr->num_parameters() == r * (patch + c.O) + (bias ? c.O : 0));
      const Values wr = w.truncated(r);
      CHECK(nn::relative_error(conv.weight, *lr) == doctest::Approx(w.tail(r)).epsilon(1e-9));
      Tensor x = f64(xv, {c.N, c.C, c.H, c.W}, true);
      Tensor y = lr->forward(x);
      REQUIRE(y.sizes() == Shape{c.N, c.O, c.OH(), c.OW()});
      check_close(y, naive_conv(c, xv, wr, b), 0, 1e-12, "y = conv(x, W_r)");
      sum(mul(y, f64(gv, y.sizes()))).backward();
      check_close(x.grad(), naive_conv(c, xv, wr, b, &gv), 0, 1e-12, "dx = conv^T(g, W_r)");
      if (r == c.O) check_close(y, values_of(run_no_grad(conv, x)), 0, 1e-12, "full rank = the conv");
    }
  }
  // Grouped convolutions are refused by name, and compress keeps them, saying so.
  nn::Conv2d grouped(4, 6, Int2(3), {.groups = 2});
  check_error([&] { nn::to_low_rank(grouped, 1); }, {"groups=2", "Conv2d(in=4, out=6"});
  nn::Sequential model({std::make_shared<nn::Conv2d>(4, 6, Int2(3), nn::Conv2dModuleOptions{.groups = 2}),
                        std::make_shared<nn::Conv2d>(6, 8, Int2(3))});
  const nn::CompressReport rep = nn::compress(model, {.patterns = {"*"}, .rank = 2, .convs = true});
  REQUIRE(rep.layers.size() == 2);
  CHECK_FALSE(rep.layers[0].replaced);
  CHECK(rep.layers[0].params_after == rep.layers[0].params_before);
  CHECK(rep.layers[0].params_before == 6 * 2 * 9 + 6);
  CHECK(rep.layers[1].replaced);
  CHECK(rep.layers[1].params_before == 8 * 54 + 8);
  CHECK(rep.layers[1].params_after == 2 * (54 + 8) + 8);
  CHECK(rep.params_after() == model.num_parameters());
  CHECK(rep.table().find("groups=2") != std::string::npos);
}

TEST_CASE("probe lowrank: compress's parameter counts are the modules' counts; kept layers say why") {
  // At rank 3: 5 -> 40 (bias) and 40 -> 5 (no bias) save (3 * 45 < 200); 5 -> 4 and 4 -> 4
  // save nothing (3 * 9 >= 20, 3 * 8 >= 16): kept; 4 -> 2 has rank 3 > min: kept.
  nn::Sequential model(
      {std::make_shared<nn::Linear>(5, 40), std::make_shared<nn::Linear>(40, 5, nn::LinearOptions{.bias = false}),
       std::make_shared<nn::Linear>(5, 4), std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::Linear>(4, 2)});
  model.to(kFloat64);
  const int64_t before = model.num_parameters();
  CHECK(before == (5 * 40 + 40) + 40 * 5 + (5 * 4 + 4) + (4 * 4 + 4) + (4 * 2 + 2));
  const Tensor x = random_tensor({3, 5}, kFloat64, 61);
  const nn::CompressReport rep = nn::compress(model, {.patterns = {"*"}, .rank = 3});
  REQUIRE(rep.layers.size() == 5);
  const int64_t want_after[] = {3 * 45 + 40, 3 * 45, 5 * 4 + 4, 4 * 4 + 4, 4 * 2 + 2};
  const bool want_replaced[] = {true, true, false, false, false};
  for (size_t i = 0; i < 5; ++i) {
    INFO("layer ", i);
    CHECK(rep.layers[i].params_after == want_after[i]);
    CHECK(rep.layers[i].replaced == want_replaced[i]);
  }
  CHECK(rep.params_before() == before);
  CHECK(rep.params_after() == model.num_parameters());
  CHECK(rep.table().find("(kept: no saving)") != std::string::npos);
}

// ============================================================================================
// probe quantize: a float64 reference of Note [Blockwise quantization]
// ============================================================================================

namespace {

using ops::QuantFormat;

/// The magnitude of e4m3fn code c & 0x7F from the format's definition: exponent bias 7, 3
/// mantissa bits, subnormals m * 2^-9, S.1111.111 NaN (no infinities).
double e4m3_magnitude(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  return e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
}

struct Ref {
  std::vector<uint8_t> codes;
  std::vector<double> scales;
  Values exact;  // decode(code) * scale in float64, not rounded
};

/// Blocks in logical order; scale = float32(absmax / qmax) over finite elements; the code of
/// q = x * float32(1 / scale) (ref_scaled): nearest e4m3 value (ties to the even code, saturating at 448) or
/// round-half-even clamped to +-127; non-finite -> the NaN code.
Ref ref_quantize(const Values& x, QuantFormat format, int64_t block) {
  const bool fp8 = format == QuantFormat::Fp8E4M3;
  const double qmax = fp8 ? 448.0 : 127.0;
  Ref r;
  for (size_t lo = 0; lo < x.size(); lo += size_t(block)) {
    const size_t hi = std::min(x.size(), lo + size_t(block));
    double absmax = 0;
    for (size_t i = lo; i < hi; ++i)
      if (std::isfinite(x[i])) absmax = std::max(absmax, std::fabs(x[i]));
    const float scale = float(float(absmax) / float(qmax));
    r.scales.push_back(scale);
    for (size_t i = lo; i < hi; ++i) {
      uint8_t code;
      double value;
      if (!std::isfinite(x[i])) {
        code = fp8 ? 0x7F : 0x80, value = kNaN;
      } else {
        const double q = ref_scaled(x[i], scale);
        if (fp8) {
          int best = 0;
          for (int c = 1; c <= 0x7E; ++c) {
            const double d = std::fabs(std::fabs(q) - e4m3_magnitude(c)),
                         db = std::fabs(std::fabs(q) - e4m3_magnitude(best));
            if (d < db || (d == db && c % 2 == 0)) best = c;
          }
          if (std::fabs(q) >= 448) best = 0x7E;
          code = uint8_t((std::signbit(q) ? 0x80 : 0) | best);
          value = (std::signbit(q) ? -1 : 1) * e4m3_magnitude(best) * scale;
        } else {
          const double k = std::clamp(std::nearbyint(q), -127.0, 127.0);
          code = uint8_t(int8_t(k)), value = k * scale;
        }
      }
      r.codes.push_back(code);
      r.exact.push_back(value);
    }
  }
  return r;
}

/// Quantizes and dequantizes x, checking codes and scales bit for bit against the reference,
/// and the values: non-finite -> NaN, finite -> finite, within a float32 rounding of the
/// reference's exact product and within the documented bound of x (plus qmax * 2^-149 for
/// the subnormal float32 scales of blocks below 2^-126 * qmax).
void check_round_trip(const Tensor& x, QuantFormat format, int64_t block, const std::string& what) {
  INFO(what, " ", std::string(ops::to_string(format)), " block ", block, " ", x.describe());
  const Values xv = values_of(x);
  const Ref ref = ref_quantize(xv, format, block);
  const ops::Quantized q = ops::quantize_blockwise(x, format, block);
  const Values scales = values_of(q.scales);
  REQUIRE(scales.size() == ref.scales.size());
  for (size_t b = 0; b < scales.size(); ++b) CHECK_MESSAGE(scales[b] == ref.scales[b], "scale ", b);
  const uint8_t* codes = q.codes.data_ptr<uint8_t>();
  for (size_t i = 0; i < xv.size(); ++i)
    CHECK_MESSAGE(codes[i] == ref.codes[i], "code ", i, " of ", xv[i], ": ", int(codes[i]), " vs ", int(ref.codes[i]));
  const Values dq = values_of(ops::dequantize_blockwise(q.codes, q.scales, format, block, x.dtype(), x.sizes()));
  const double ulp = x.dtype() == kFloat16    ? std::ldexp(1.0, -11)
                     : x.dtype() == kBFloat16 ? std::ldexp(1.0, -8)
                                              : std::ldexp(1.0, -24);
  // Half the output dtype's smallest subnormal: the absolute rounding of tiny outputs.
  const double sub = std::ldexp(1.0, x.dtype() == kFloat16 ? -25 : x.dtype() == kBFloat16 ? -134 : -150);
  const double qmax = format == QuantFormat::Fp8E4M3 ? 448.0 : 127.0;
  for (size_t i = 0; i < xv.size(); ++i) {
    if (!std::isfinite(xv[i])) {
      CHECK_MESSAGE(std::isnan(dq[i]), "element ", i, " = ", xv[i], " came back as ", dq[i]);
      continue;
    }
    CHECK_MESSAGE(std::isfinite(dq[i]), "element ", i, " = ", xv[i], " came back as ", dq[i]);
    CHECK_MESSAGE(std::fabs(dq[i] - ref.exact[i]) <= 2 * ulp * std::fabs(ref.exact[i]) + sub, "element ", i, ": ",
                  dq[i], " vs ", ref.exact[i]);
    if (xv[i] == 0)
      CHECK_MESSAGE(std::signbit(dq[i]) == (std::signbit(xv[i]) && format == QuantFormat::Fp8E4M3), "zero ", i);
    const double scale = ref.scales[i / size_t(block)], ax = std::fabs(xv[i]);
    const double bound =
        (format == QuantFormat::Fp8E4M3 ? std::max(std::ldexp(ax, -4), std::ldexp(scale, -10)) : 0.5 * scale) +
        std::ldexp(ax + scale, -20) + 2 * ulp * ax + sub + qmax * std::ldexp(1.0, -149);
    CHECK_MESSAGE(std::fabs(xv[i] - dq[i]) <= bound, "element ", i, ": |", xv[i], " - ", dq[i], "| > ", bound);
  }
}

}  // namespace

TEST_CASE("probe quantize: the largest and smallest finite values of float32, float16 and bfloat16 round trip finite") {
  const double fmax = FLT_MAX, fmin = FLT_MIN, sub = std::ldexp(1.0, -149);
  // Blocks of 5, 13 elements: the last block is short. Block 1 spans float32's range, block 2
  // holds only subnormals (a subnormal or zero scale), block 3 the largest values.
  const Values f32 = {fmax, -fmax, 1.0,     fmin, -0.0, sub, -sub, 3 * sub, std::ldexp(1.0, -140),
                      0.0,  3e38,  -2.9e38, fmax};
  const double hmax = 65504, hmin = std::ldexp(1.0, -14), hsub = std::ldexp(1.0, -24);
  const Values f16 = {hmax, -hmax, hmin, hsub, -0.0, -hsub, 3 * hsub, hmin, 0.0, 0.0, 65472, -hmax, 1.0};
  const double bmax = 0x1.fep127, bsub = std::ldexp(1.0, -133);
  const Values bf16 = {bmax, -bmax, fmin, bsub, -0.0, -bsub, 3 * bsub, fmin, 0.0, -0.0, 0x1.fcp127, bmax, 1.0};
  for (QuantFormat format : {QuantFormat::Fp8E4M3, QuantFormat::Int8}) {
    check_round_trip(make_tensor(f32, {13}, kFloat32), format, 5, "float32 extremes");
    check_round_trip(make_tensor(f16, {13}, kFloat16), format, 5, "float16 extremes");
    check_round_trip(make_tensor(bf16, {13}, kBFloat16), format, 5, "bfloat16 extremes");
    for (int64_t block : {1, 2, 13, 64})
      check_round_trip(make_tensor(f32, {13}, kFloat32), format, block, "float32 extremes");
  }
}

TEST_CASE(
    "probe quantize: NaN, +-inf and -0 at every position of odd blocks, in expanded, permuted and narrowed layouts") {
  Values v = random_values(21, 71, -5, 5);
  for (DType dt : {kFloat32, kFloat16, kBFloat16})
    for (QuantFormat format : {QuantFormat::Fp8E4M3, QuantFormat::Int8})
      for (size_t pos = 0; pos < 7; ++pos) {
        Values w = v;
        w[pos] = kNaN, w[pos + 7] = pos % 2 ? kInf : -kInf, w[pos + 14] = -0.0;
        w[(pos + 3) % 7 + 14] = kInf * (pos % 2 ? -1 : 1);
        const Tensor x = make_tensor(w, {3, 7}, dt);
        for (int64_t block : {3, 5, 7, 21}) {
          check_round_trip(x, format, block, "contiguous");
          check_round_trip(x.t(), format, block, "transposed");
        }
        check_round_trip(x.narrow(1, 1, 5), format, 4, "narrowed");
        check_round_trip(x.narrow(0, 1, 1).expand({4, 7}), format, 3, "expanded rows");
        check_round_trip(x.view({3, 7, 1}).permute({2, 1, 0}).expand({2, 7, 3}), format, 5, "permuted and expanded");
      }
}

TEST_CASE("probe quantize: a compressed saved input keeps NaN and inf non-finite in the weight gradient") {
  // linear saves x; dW = g^T x_dq, where x_dq is the reference's round trip of x.
  const int64_t B = 5, in = 9, out = 4, block = 4;
  Values xv = random_values(B * in, 81, -3, 3);
  xv[2] = kNaN, xv[in + 5] = kInf, xv[3 * in + 5] = -kInf, xv[4 * in] = -0.0;
  const Values gv = random_values(B * out, 82);
  for (CompressFormat format : {CompressFormat::Fp8E4M3, CompressFormat::Int8}) {
    INFO(std::string(autograd::to_string(format)));
    Tensor w = random_tensor({out, in}, kFloat32, 83);
    w.requires_grad_();
    Tensor x = make_tensor(xv, {B, in}, kFloat32);
    {
      CompressSavedTensors scope({.format = format, .block = block, .min_bytes = 0});
      linear(x, w).backward(make_tensor(gv, {B, out}, kFloat32));
    }
    const Ref ref =
        ref_quantize(values_of(x), format == CompressFormat::Fp8E4M3 ? QuantFormat::Fp8E4M3 : QuantFormat::Int8, block);
    Values xdq(ref.exact.size());
    for (size_t i = 0; i < xdq.size(); ++i) xdq[i] = double(float(ref.exact[i]));
    const Values want = naive_mm(gv, xdq, out, B, in, true);  // (out, in)
    // Columns 2 and 5 meet NaN/inf: every entry there is non-finite; the rest are finite.
    const Values got = values_of(w.grad());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        const double v = got[size_t(o * in + i)];
        CHECK_MESSAGE(std::isfinite(v) == (i != 2 && i != 5), "dW[", o, ", ", i, "] = ", v);
      }
    check_close(got, want, 1e-5, 1e-6, "dW = g^T x_dq");
  }
}

TEST_CASE("probe quantize: a saved transposed view is quantized in its memory order, and comes back in its layout") {
  // matmul(a, b) with a = x.t(): a is dense in another memory order (x's), so its blocks are
  // cut along x's rows. db = a_dq^T g = x_dq g.
  const int64_t K = 6, M = 7, P = 3, block = 5;  // 5 divides neither 6 nor 7
  const Values xv = random_values(K * M, 91, -4, 4), gv = random_values(M * P, 92);
  Tensor x = make_tensor(xv, {K, M}, kFloat32);
  Tensor b = random_tensor({K, P}, kFloat32, 93);
  b.requires_grad_();
  {
    CompressSavedTensors scope({.format = CompressFormat::Fp8E4M3, .block = block, .min_bytes = 0});
    matmul(x.t(), b).backward(make_tensor(gv, {M, P}, kFloat32));
  }
  const Ref mem = ref_quantize(values_of(x), QuantFormat::Fp8E4M3, block);  // x's memory order
  Values xdq(mem.exact.size());
  for (size_t i = 0; i < xdq.size(); ++i) xdq[i] = double(float(mem.exact[i]));
  check_close(b.grad(), naive_mm(xdq, gv, K, M, P), 1e-5, 1e-6, "db = x_dq g");
  // Blocks cut in a's logical order would give other values: the check above tells them apart.
  const Ref logical = ref_quantize(values_of(x.t()), QuantFormat::Fp8E4M3, block);
  int64_t differ = 0;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = 0; m < M; ++m) differ += mem.exact[size_t(k * M + m)] != logical.exact[size_t(m * K + k)];
  CHECK(differ > 0);
}

TEST_CASE("probe quantize: an expanded saved tensor is not 'compressed' into more bytes than it holds") {
  // mul saves its inputs as given: here a (1, 64) row expanded to (256, 64), 256 bytes of
  // storage. Codes for all 16384 elements would take 16 KiB (64x the storage) while the
  // stats claimed a 4x saving. It must stay an alias: exact gradients, nothing counted.
  const Values rv = random_values(64, 101);
  const Tensor row = make_tensor(rv, {1, 64}, kFloat32);
  Tensor w = random_tensor({256, 64}, kFloat32, 103);
  w.requires_grad_();
  autograd::reset_compress_stats();
  {
    CompressSavedTensors scope({.format = CompressFormat::Int8, .block = 256, .min_bytes = 0});
    sum(mul(row.expand({256, 64}), w)).backward();
  }
  const autograd::CompressStats stats = autograd::compress_stats();
  CHECK(stats.bytes_out <= stats.bytes_in);
  CHECK(stats.tensors == 0);
  Values want(256 * 64);
  for (size_t i = 0; i < want.size(); ++i) want[i] = double(float(rv[i % 64]));
  check_close(w.grad(), want, 0, 0, "dW = row, exact");
}

// ============================================================================================
// probe memory: a reference model of the arena (Note [Sizes and pools], Note [Best fit,
// split and merge], Note [Out of memory]) on private host allocators
// ============================================================================================

namespace {

using memory::MemoryStats;
using memory::PoolStats;
using memory::StatCounter;
using memory::detail::CachingAllocator;
constexpr size_t KiB = 1024, MiB = 1024 * KiB;
constexpr Stream kHost{nullptr, kCPU};

/// The allocator's rules re-derived from the Notes, with its own bookkeeping.
struct ArenaModel {
  struct Block {
    size_t size;
    bool allocated = false;
    size_t requested = 0;
  };
  struct Segment {
    size_t size;
    bool small;
    std::map<uintptr_t, Block> blocks;  // by address
  };
  std::map<uintptr_t, Segment> segments;  // by base
  size_t limit = 0;
  int64_t allocs = 0, frees = 0, hits = 0, seg_allocs = 0, seg_frees = 0, retries = 0, ooms = 0;
  // Peaks per pool (0 small, 1 large, 2 both) of: allocated, reserved, requested, inactive split, active, segments.
  int64_t peak[3][6] = {};

  static size_t round(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }
  static size_t segment_for(size_t size) {
    if (size <= MiB) return 2 * MiB;
    if (size < 10 * MiB) return 20 * MiB;
    return (size + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
  }
  /// Current values [pool][stat] as defined in memory/stats.h.
  void current(int64_t out[3][6]) const {
    for (int p = 0; p < 3; ++p)
      for (int s = 0; s < 6; ++s) out[p][s] = 0;
    for (const auto& [base, seg] : segments) {
      const int p = seg.small ? 0 : 1;
      out[p][1] += int64_t(seg.size), out[p][5] += 1;
      for (const auto& [addr, b] : seg.blocks) {
        if (b.allocated) out[p][0] += int64_t(b.size), out[p][2] += int64_t(b.requested), out[p][4] += 1;
        else if (seg.blocks.size() > 1) out[p][3] += int64_t(b.size);
      }
    }
    for (int s = 0; s < 6; ++s) out[2][s] = out[0][s] + out[1][s];
  }
  void update_peaks() {
    int64_t c[3][6];
    current(c);
    for (int p = 0; p < 3; ++p)
      for (int s = 0; s < 6; ++s) peak[p][s] = std::max(peak[p][s], c[p][s]);
  }
  void reset_peak() { current(peak); }
  int64_t reserved() const {
    int64_t c[3][6];
    current(c);
    return c[2][1];
  }
  /// The smallest free block (then lowest address) of the pool that fits.
  std::pair<Segment*, uintptr_t> best_fit(bool small, size_t size) {
    std::pair<Segment*, uintptr_t> best{nullptr, 0};
    size_t best_size = 0;
    for (auto& [base, seg] : segments)
      if (seg.small == small)
        for (const auto& [addr, b] : seg.blocks)
          if (!b.allocated && b.size >= size &&
              (!best.first || b.size < best_size || (b.size == best_size && addr < best.second)))
            best = {&seg, addr}, best_size = b.size;
    return best;
  }
  void release_whole_free_segments() {
    for (auto it = segments.begin(); it != segments.end();)
      if (it->second.blocks.size() == 1 && !it->second.blocks.begin()->second.allocated)
        it = segments.erase(it), ++seg_frees;
      else ++it;
  }
  /// What allocate(n) must do, given the pointer the allocator returned (null: it threw OOM).
  /// Returns a description of the mismatch, or "".
  std::string allocate(size_t n, void* got) {
    if (n == 0) return got ? "a 0-byte allocation returned memory" : "";
    const size_t size = round(n);
    const bool small = size <= MiB;
    auto [seg, addr] = best_fit(small, size);
    if (seg) {
      ++hits;
    } else {
      const size_t seg_size = segment_for(size);
      if (limit && size_t(reserved()) + seg_size > limit) {
        ++retries;
        release_whole_free_segments();
        if (size_t(reserved()) + seg_size > limit) {
          ++ooms;
          return got ? "expected out of memory" : "";
        }
      }
      if (!got) return "unexpected out of memory";
      const uintptr_t base = uintptr_t(got);
      for (const auto& [b, s] : segments)
        if (base < b + s.size && b < base + seg_size) return "a new segment overlaps a known one";
      seg = &segments[base];
      *seg = Segment{seg_size, small, {{base, Block{seg_size}}}};
      addr = base, ++seg_allocs;
    }
    if (uintptr_t(got) != addr) return "best fit picked another block";
    Block& b = seg->blocks[addr];
    const size_t rest = b.size - size;
    if (small ? rest >= 512 : rest > MiB) {
      seg->blocks[addr + size] = Block{rest};
      b.size = size;
    }
    b.allocated = true, b.requested = n, ++allocs;
    update_peaks();
    return "";
  }
  void free(void* p) {
    const uintptr_t addr = uintptr_t(p);
    auto sit = std::prev(segments.upper_bound(addr));
    auto& blocks = sit->second.blocks;
    auto it = blocks.find(addr);
    it->second.allocated = false, it->second.requested = 0, ++frees;
    if (auto next = std::next(it); next != blocks.end() && !next->second.allocated)
      it->second.size += next->second.size, blocks.erase(next);
    if (it != blocks.begin())
      if (auto prev = std::prev(it); !prev->second.allocated) prev->second.size += it->second.size, blocks.erase(it);
    update_peaks();
  }

  /// Checks every statistic of `s` against the model.
  void check(const MemoryStats& s, const std::string& when) const {
    INFO(when);
    int64_t c[3][6];
    current(c);
    const PoolStats* pools[3] = {&s.small_pool, &s.large_pool, &s};
    const char* names[6] = {"allocated", "reserved", "requested", "inactive_split", "active_blocks", "segments"};
    for (int p = 0; p < 3; ++p) {
      const StatCounter* stats[6] = {&pools[p]->allocated_bytes, &pools[p]->reserved_bytes,
                                     &pools[p]->requested_bytes, &pools[p]->inactive_split_bytes,
                                     &pools[p]->active_blocks,   &pools[p]->segments};
      for (int k = 0; k < 6; ++k) {
        CHECK_MESSAGE(stats[k]->current == c[p][k], "pool ", p, " ", names[k], " current");
        CHECK_MESSAGE(stats[k]->peak == peak[p][k], "pool ", p, " ", names[k], " peak");
        CHECK_MESSAGE(stats[k]->current - (stats[k]->allocated - stats[k]->freed) == 0, "pool ", p, " ", names[k],
                      " flows");
        CHECK_MESSAGE(stats[k]->current >= 0, "pool ", p, " ", names[k], " negative");
      }
      CHECK(pools[p]->allocated_bytes.current + pools[p]->inactive_split_bytes.current <=
            pools[p]->reserved_bytes.current);
      CHECK(pools[p]->requested_bytes.current <= pools[p]->allocated_bytes.current);
      const double frag = c[p][1] ? double(c[p][3]) / double(c[p][1]) : 0.0;
      CHECK(pools[p]->fragmentation() == frag);
    }
    CHECK(s.num_allocs == allocs);
    CHECK(s.num_frees == frees);
    CHECK(s.cache_hits == hits);
    CHECK(s.num_segment_allocs == seg_allocs);
    CHECK(s.num_segment_frees == seg_frees);
    CHECK(s.num_alloc_retries == retries);
    CHECK(s.num_ooms == ooms);
  }
};

/// allocate(n) on both the allocator and the model; the DataPtr (empty on OOM) is returned.
DataPtr model_allocate(CachingAllocator& a, ArenaModel& m, size_t n) {
  DataPtr p;
  try {
    p = a.allocate(n, kHost);
  } catch (const OutOfMemoryError&) {}
  const std::string err = m.allocate(n, p.get());
  CHECK_MESSAGE(err.empty(), "allocate(", n, "): ", err);
  return p;
}

void model_free(ArenaModel& m, DataPtr& p) {
  void* ptr = p.get();
  p = DataPtr();
  if (ptr) m.free(ptr);
}

}  // namespace

TEST_CASE(
    "probe memory: a scripted sequence against the model: 0 and 1 bytes, rounding edges, one large split and merged") {
  CachingAllocator a("probe", kCPU, memory::detail::make_cpu_backend());
  ArenaModel m;
  std::vector<DataPtr> live;
  auto alloc = [&](size_t n) {
    live.push_back(model_allocate(a, m, n));
    m.check(a.stats(), "after allocate(" + std::to_string(n) + ")");
  };
  auto free_at = [&](size_t i) {
    model_free(m, live[i]);
    m.check(a.stats(), "after free #" + std::to_string(i));
  };
  for (size_t n : {size_t(0), size_t(1), size_t(511), size_t(512), size_t(513), MiB - 1, MiB, MiB + 1}) alloc(n);
  // 0: null, nothing counted; 1 and 511 round to 512; 513 to 1024; 1 MiB is the small pool's last.
  CHECK(live[0].get() == nullptr);
  CHECK(a.stats().small_pool.requested_bytes.current == int64_t(1 + 511 + 512 + 513 + MiB - 1 + MiB));
  CHECK(a.stats().small_pool.allocated_bytes.current == int64_t(512 * 3 + 1024 + 2 * MiB));
  CHECK(a.stats().large_pool.allocated_bytes.current == int64_t(MiB + 512));  // 1 MiB + 1 -> large pool
  CHECK(a.stats().small_pool.reserved_bytes.current == int64_t(4 * MiB));  // MiB did not fit the first segment's rest
  // 10 MiB + 1 B fits the rest of the 20 MiB segment (19 MiB - 512): no new segment.
  alloc(10 * MiB + 1);
  CHECK(a.stats().large_pool.reserved_bytes.current == int64_t(20 * MiB));
  // 25 MiB gets a 26 MiB segment; the 1 MiB rest is not worth splitting, so the whole block
  // is handed out and counted as allocated.
  alloc(25 * MiB);
  CHECK(a.stats().large_pool.allocated_bytes.current == int64_t(MiB + 512 + 10 * MiB + 512 + 26 * MiB));
  free_at(8);
  alloc(3 * MiB);
  alloc(5 * MiB);
  alloc(MiB + 512);  // its remainder, 10 MiB - 1 KiB, is split off again
  a.reset_peak();
  m.reset_peak();
  m.check(a.stats(), "after reset_peak");
  for (size_t i : {size_t(11), size_t(10), size_t(12)}) free_at(i);  // merged back into one free block
  CHECK(a.stats().large_pool.inactive_split_bytes.current == int64_t(20 * MiB - (MiB + 512)));
  for (size_t i = 1; i < live.size(); ++i) model_free(m, live[i]);
  m.check(a.stats(), "all freed");
  CHECK(a.stats().allocated_bytes.current == 0);
  CHECK(a.stats().inactive_split_bytes.current == 0);
  a.empty_cache();
  m.release_whole_free_segments();
  m.check(a.stats(), "after empty_cache");
  CHECK(a.stats().reserved_bytes.current == 0);
  CHECK(a.stats().reserved_bytes.peak == int64_t(4 * MiB + 20 * MiB + 26 * MiB));
}

TEST_CASE("probe memory: a random sequence with a memory limit against the model, stats after every step") {
  CachingAllocator a("probe", kCPU, memory::detail::make_cpu_backend());
  ArenaModel m;
  const size_t edges[] = {
      0,       1, 511, 512, 513, 4096, 100000, MiB - 1, MiB, MiB + 1, 3 * MiB, 10 * MiB - 512, 10 * MiB, 10 * MiB + 1,
      25 * MiB};
  std::vector<DataPtr> live;
  uint64_t s = 12345;
  auto next = [&] {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull >> 11;
  };
  for (int step = 0; step < 600; ++step) {
    if (step == 300) a.set_limit(64 * MiB), m.limit = 64 * MiB;
    const uint64_t r = next() % 100;
    if (r < 55 || live.empty()) {
      const size_t n = r % 3 ? edges[next() % std::size(edges)] : size_t(next() % (3 * MiB));
      live.push_back(model_allocate(a, m, n));
      if (live.size() > 20) {
        model_free(m, live.front());
        live.erase(live.begin());
      }
    } else if (r < 95) {
      const size_t i = next() % live.size();
      model_free(m, live[i]);
      live.erase(live.begin() + std::ptrdiff_t(i));
    } else if (r < 98) {
      a.empty_cache();
      m.release_whole_free_segments();
    } else {
      a.reset_peak();
      m.reset_peak();
    }
    m.check(a.stats(), "step " + std::to_string(step));
  }
  CHECK(m.ooms > 0);  // the limit was met, and recovered from
  CHECK(m.hits > 0);
  live.clear();
}

TEST_CASE("probe memory: the trace's running totals replay to the allocator's numbers, OOM and a lost event included") {
  CachingAllocator a("probe", kCPU, memory::detail::make_cpu_backend());
  a.enable_trace(1000);
  ArenaModel m;
  std::vector<DataPtr> live;
  for (size_t n : {size_t(1), size_t(700), MiB, MiB + 1, 12 * MiB, size_t(0), size_t(513)})
    live.push_back(model_allocate(a, m, n));
  model_free(m, live[2]);
  model_free(m, live[4]);
  a.empty_cache();  // nothing goes: 12 MiB went into the 20 MiB segment, each segment has a live block
  m.release_whole_free_segments();
  a.set_limit(30 * MiB);
  m.limit = 30 * MiB;
  live.push_back(model_allocate(a, m, 25 * MiB));  // 22 + 26 > 30: retry, then out of memory
  CHECK(live.back().get() == nullptr);
  m.check(a.stats(), "after the OOM");
  const std::vector<memory::TraceEvent> events = a.trace_events();
  int64_t allocated = 0, reserved = 0, allocs = 0, frees = 0, ooms = 0;
  std::map<void*, size_t> sizes;
  for (size_t i = 0; i < events.size(); ++i) {
    const memory::TraceEvent& e = events[i];
    INFO("event ", i, " ", std::string(memory::to_string(e.action)));
    CHECK(e.seq == i);
    switch (e.action) {
      case memory::TraceAction::Alloc: allocated += int64_t(e.size), ++allocs, sizes[e.ptr] = e.size; break;
      case memory::TraceAction::Free:
        CHECK(sizes[e.ptr] == e.size);  // a free names the size its alloc did
        allocated -= int64_t(e.size), ++frees;
        break;
      case memory::TraceAction::SegmentAlloc: reserved += int64_t(e.size); break;
      case memory::TraceAction::SegmentFree: reserved -= int64_t(e.size); break;
      case memory::TraceAction::Oom:
        ++ooms;
        CHECK(e.requested == 25 * MiB);
        break;
      default: break;
    }
    CHECK(e.allocated_bytes == allocated);
    CHECK(e.reserved_bytes == reserved);
  }
  const MemoryStats s = a.stats();
  CHECK(allocated == s.allocated_bytes.current);
  CHECK(reserved == s.reserved_bytes.current);
  CHECK(allocs == s.num_allocs);
  CHECK(frees == s.num_frees);
  CHECK(ooms == 1);
  // A ring of 4 keeps the last 4 events; the first kept seq says how many were lost.
  a.enable_trace(4);
  for (int i = 0; i < 6; ++i) live.push_back(model_allocate(a, m, 2048));  // 6 allocs in the small segment
  const std::vector<memory::TraceEvent> ring = a.trace_events();
  REQUIRE(ring.size() == 4);
  CHECK(ring.front().seq == 2);
  CHECK(ring.back().allocated_bytes == a.stats().allocated_bytes.current);
  live.clear();
}

TEST_CASE("probe memory: the profiler's peak, its groups and its timeline equal the allocator's numbers") {
  memory::reset_peak(kCPU);
  const int64_t base = memory::stats(kCPU).allocated_bytes.current;
  profiler::Session session({.device = kCPU});
  session.start();
  // Small requests: each block is its rounded size (the small pool always splits off the rest).
  const size_t script[] = {1, 513, 4096, 100000, 700, 0, 65536};
  std::vector<DataPtr> live;
  int64_t now = 0, peak = 0;
  for (size_t n : script) {
    live.push_back(memory::allocate(kCPU, n));
    now += n ? int64_t(ArenaModel::round(n)) : 0;
    peak = std::max(peak, now);
  }
  for (size_t i : {size_t(3), size_t(1)}) {
    now -= int64_t(ArenaModel::round(script[i]));
    live[i] = DataPtr();
  }
  live.push_back(memory::allocate(kCPU, 50000));
  now += int64_t(ArenaModel::round(50000));
  peak = std::max(peak, now);
  session.stop();
  const MemoryStats s = memory::stats(kCPU);
  CHECK(session.start_allocated() == base);
  CHECK(session.peak_allocated() == base + peak);
  CHECK(s.allocated_bytes.peak == base + peak);
  CHECK(s.allocated_bytes.current == base + now);
  int64_t sum = 0, ours = 0;
  for (const profiler::AllocationGroup& g : session.live_at_peak()) {
    sum += g.bytes;
    if (g.op == "(outside ops)") ours += g.bytes;
  }
  CHECK(sum == session.peak_allocated());
  CHECK(ours == peak);
  int64_t by_category = 0;
  for (int64_t b : session.category_bytes_at_peak()) by_category += b;
  CHECK(by_category == session.peak_allocated());
  REQUIRE(!session.timeline().empty());
  CHECK(session.timeline().back().allocated == s.allocated_bytes.current);
  CHECK(session.timeline().back().reserved == s.reserved_bytes.current);
  CHECK(session.lost_events() == 0);
}

TEST_CASE(
    "probe memory: reset_peak lowers every peak to now; reset_stats zeroes the flows and counters, keeps current") {
  CachingAllocator a("probe", kCPU, memory::detail::make_cpu_backend());
  DataPtr big = a.allocate(3 * MiB, kHost), small = a.allocate(700, kHost);
  big = DataPtr();  // peak allocated 3 MiB + 1 KiB, now 1 KiB
  a.reset_peak();
  MemoryStats s = a.stats();
  CHECK(s.allocated_bytes.peak == int64_t(KiB));
  CHECK(s.large_pool.allocated_bytes.peak == 0);
  CHECK(s.reserved_bytes.peak == int64_t(22 * MiB));  // still reserved: peak is the current value
  CHECK(s.inactive_split_bytes.peak == int64_t(2 * MiB - KiB));
  a.reset_stats();
  s = a.stats();
  CHECK(s.allocated_bytes.current == int64_t(KiB));
  CHECK(s.allocated_bytes.allocated == 0);
  CHECK(s.allocated_bytes.freed == 0);
  CHECK(s.requested_bytes.current == 700);
  CHECK(s.num_allocs == 0);
  CHECK(s.num_segment_allocs == 0);
  small = DataPtr();
  s = a.stats();
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.allocated_bytes.freed == int64_t(KiB));
  CHECK(s.num_frees == 1);
  CHECK(s.allocated_bytes.peak == int64_t(KiB));
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.current == 0);
  CHECK(a.stats().num_segment_frees == 2);
}

TEST_CASE("probe lowrank: compress() that fails leaves the model as it was, naming the layer") {
  // A NaN weight in the second layer threw 'svd: input (32, 32) contains NaN or Inf' with the
  // first layer already swapped; a Linear registered at two paths was blamed on a typed member.
  const auto types = [](nn::Sequential& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size(); ++i) out.push_back(s[i]->type_name());
    return out;
  };
  auto s = std::make_shared<nn::Sequential>();
  s->push_back(std::make_shared<nn::Linear>(32, 32));
  auto bad = std::make_shared<nn::Linear>(32, 32);
  s->push_back(bad);
  {
    autograd::NoGradGuard no_grad;
    ops::fill_(bad->weight.narrow(0, 0, 1), std::numeric_limits<double>::quiet_NaN());
  }
  bad.reset();
  check_error([&] { (void)nn::compress(*s, {.patterns = {"*"}, .rank = 4}); },
              {"compress: layer '1' (Linear)", "NaN or Inf"});
  CHECK(types(*s) == std::vector<std::string>{"Linear", "Linear"});
  auto t = std::make_shared<nn::Sequential>();
  auto shared = std::make_shared<nn::Linear>(32, 32);
  t->push_back(std::make_shared<nn::Linear>(32, 32));
  t->push_back(shared);
  t->push_back(shared);
  shared.reset();
  check_error([&] { (void)nn::compress(*t, {.patterns = {"*"}, .rank = 4}); },
              {"compress: '2' and '1' are one shared Linear"});
  CHECK(types(*t) == std::vector<std::string>{"Linear", "Linear", "Linear"});
  CHECK(nn::compress(*t, {.patterns = {"0"}, .rank = 4}).layers.size() == 1);  // one path of it is fine
  // rank_for_energy refuses what is no spectrum (it returned 4, 2 and 1 for these)
  for (const std::vector<float>& bad_s : {std::vector<float>{1, NAN, 1, 1}, {1, 3}, {-3, 1}})
    check_error([&] { (void)nn::rank_for_energy(from_vector<float>(bad_s, {int64_t(bad_s.size())}), nn::Energy{0.1}); },
                {"rank_for_energy: singular value", "non-increasing"});
}
