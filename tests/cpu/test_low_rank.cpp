// nn/low_rank.h, nn/low_rank_conv.h: LowRankLinear, LowRankConv2d, to_low_rank, the energy
// rule and compress(), checked
// against gradcheck, Eigen's JacobiSVD in float64 and exactly low-rank weights.
#include <doctest/doctest.h>

#include <Eigen/SVD>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/pool.h"
#include "autograd/ops/reduce.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/low_rank.h"
#include "nn/low_rank_conv.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using MatrixXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Sets `t` to the given values (under no grad; parameters are leaves).
void set_values(const Tensor& t, const std::vector<double>& values) {
  autograd::NoGradGuard no_grad;
  t.copy_(from_vector(values, t.sizes(), TensorOptions(kFloat64)));
}

/// Singular values of a (out, in) weight by Eigen's JacobiSVD in float64.
std::vector<double> singular_values(const Tensor& w) {
  const std::vector<double> v = values_of(w);
  const MatrixXd A = Eigen::Map<const MatrixXd>(v.data(), w.size(0), w.size(1));
  const Eigen::VectorXd s = Eigen::JacobiSVD<MatrixXd>(A).singularValues();
  return std::vector<double>(s.data(), s.data() + s.size());
}

/// A (rows, cols) matrix of exact rank `rank`: X (rows, rank) @ Y (rank, cols).
std::vector<double> rank_r_values(int64_t rows, int64_t cols, int64_t rank, uint64_t seed) {
  const std::vector<double> X = random_values(rows * rank, seed), Y = random_values(rank * cols, seed + 1);
  std::vector<double> A(size_t(rows * cols), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t l = 0; l < rank; ++l) A[size_t(i * cols + j)] += X[size_t(i * rank + l)] * Y[size_t(l * cols + j)];
  return A;
}

Tensor run(nn::UnaryModule& m, const Tensor& x) {
  autograd::NoGradGuard no_grad;
  return m.forward(x);
}

// A (6, 8) matrix with singular values 4, 3, 2, 1, 0.5, 0.1: a scaled permutation with signs.
const std::vector<double> kKnownSpectrum = {4, 3, 2, 1, 0.5, 0.1};
std::vector<double> known_spectrum_matrix() {
  const int64_t rows[] = {3, 0, 5, 1, 4, 2}, cols[] = {5, 0, 7, 2, 3, 6};
  std::vector<double> w(6 * 8, 0.0);
  for (int64_t i = 0; i < 6; ++i) w[size_t(rows[i] * 8 + cols[i])] = (i % 2 ? -1 : 1) * kKnownSpectrum[size_t(i)];
  return w;
}

// Eckart-Young: truncating to rank r leaves sqrt(sum of the tail's s^2 / sum of all s^2).
double truncation_error(const std::vector<double>& s, int64_t r) {
  double tail = 0, total = 0;
  for (size_t i = 0; i < s.size(); ++i) (i >= size_t(r) ? tail : total) += s[i] * s[i];
  return std::sqrt(tail / (total + tail));
}

}  // namespace

TEST_CASE("low_rank: LowRankLinear passes gradcheck and names its parameters") {
  nn::LowRankLinear m(5, 4, 2);
  m.to(kFloat64);
  std::vector<std::string> names;
  for (auto& [name, p] : m.named_parameters()) names.push_back(name + shape_str(p.sizes()));
  CHECK(names == std::vector<std::string>{"down.weight[2, 5]", "up.weight[4, 2]", "up.bias[4]"});
  Tensor x = random_tensor({2, 3, 5}, kFloat64, 7).requires_grad_();
  auto r = autograd::gradcheck([&](const TensorList& in) { return m.forward(in[0]); },
                               {x, m.down->weight, m.up->weight, m.up->bias});
  CHECK_MESSAGE(r.ok, r.report);
  // Forward against a naive loop: y = U' (V' x) + b.
  const std::vector<double> xv = values_of(x), dv = values_of(m.down->weight), uv = values_of(m.up->weight),
                            bv = values_of(m.up->bias);
  std::vector<double> expected;
  for (int64_t row = 0; row < 6; ++row)
    for (int64_t o = 0; o < 4; ++o) {
      double acc = bv[size_t(o)];
      for (int64_t l = 0; l < 2; ++l) {
        double h = 0;
        for (int64_t i = 0; i < 5; ++i) h += dv[size_t(l * 5 + i)] * xv[size_t(row * 5 + i)];
        acc += uv[size_t(o * 2 + l)] * h;
      }
      expected.push_back(acc);
    }
  check_close(run(m, x), expected, 1e-12, 1e-12, "LowRankLinear forward");
}

TEST_CASE("low_rank: full rank reproduces the layer, truncation errs by the tail singular values") {
  nn::Linear layer(24, 16);
  set_values(layer.weight, random_values(16 * 24, 3, -0.3, 0.3));
  const Tensor x = random_tensor({5, 24}, kFloat32, 4);
  const std::vector<double> y = values_of(run(layer, x));

  auto full = nn::to_low_rank(layer, 16, {.require_saving = false});
  CHECK(full->rank == 16);
  check_close(run(*full, x), y, 1e-5, 1e-5, "rank = min(in, out)");
  CHECK(nn::relative_error(layer.weight, *full) < 1e-5);  // float32 factors

  const std::vector<double> s = singular_values(layer.weight);
  for (int64_t r : {1, 3, 6, 9}) {
    CAPTURE(r);
    auto m = nn::to_low_rank(layer, r);
    CHECK(m->num_parameters() == r * (24 + 16) + 16);
    CHECK(nn::relative_error(layer.weight, *m) == doctest::Approx(truncation_error(s, r)).epsilon(1e-4));
    // And the factors reproduce the bias.
    check_close(m->up->bias, values_of(layer.bias), 0, 0, "bias");
  }
}

TEST_CASE("low_rank: the energy rule picks the rank of a known spectrum") {
  const std::vector<double>& s = kKnownSpectrum;
  const std::vector<double> w = known_spectrum_matrix();
  nn::Linear layer(8, 6);
  set_values(layer.weight, w);
  // Squared: 16, 25, 29, 30, 30.25, 30.26 (total 30.26).
  const Tensor sv = from_vector(s, {6}, TensorOptions(kFloat64));
  CHECK(nn::rank_for_energy(sv, {0.5}) == 1);
  CHECK(nn::rank_for_energy(sv, {25.0 / 30.26}) == 2);  // met exactly
  CHECK(nn::rank_for_energy(sv, {0.9}) == 3);
  CHECK(nn::rank_for_energy(sv, {0.99}) == 4);
  CHECK(nn::rank_for_energy(sv, {0.9999}) == 6);
  CHECK(nn::rank_for_energy(sv, {1.0}) == 6);
  CHECK(nn::rank_for_energy(zeros({3}), {0.9}) == 1);
  auto m = nn::to_low_rank(layer, nn::Energy{0.9});
  CHECK(m->rank == 3);
  CHECK(nn::relative_error(layer.weight, *m) == doctest::Approx(std::sqrt(1.26 / 30.26)).epsilon(1e-5));
  // 0.99 needs rank 4, and 4 * (8 + 6) >= 48 saves nothing.
  check_error([&] { nn::to_low_rank(layer, nn::Energy{0.99}); },
              {"to_low_rank", "rank 4", "energy 0.99", "saves no parameters", "in=8, out=6", "ranks up to 3"});
}

TEST_CASE("low_rank: refusals name the layer and the reason") {
  nn::Linear layer(10, 6);
  check_error([&] { nn::to_low_rank(layer, 0); }, {"to_low_rank", "rank 0", "outside [1, 6]", "in=10, out=6"});
  check_error([&] { nn::to_low_rank(layer, 7, {.require_saving = false}); }, {"rank 7", "outside [1, 6]"});
  check_error([&] { nn::to_low_rank(layer, 4); }, {"rank 4", "saves no parameters", "64 >= in * out = 60"});
  check_error([&] { nn::to_low_rank(layer, nn::Energy{1.5}); }, {"fraction must be in (0, 1]", "1.5"});
  check_error([&] { nn::to_low_rank(layer, nn::Energy{0}); }, {"fraction must be in (0, 1]"});
  check_error([] { nn::LowRankLinear(4, 3, 4); }, {"LowRankLinear", "rank 4", "min(in=4, out=3)"});
  CHECK(nn::to_low_rank(layer, 3)->rank == 3);
}

TEST_CASE("low_rank: path patterns match one component per '*'") {
  CHECK(nn::path_matches("blocks.*.mlp.*", "blocks.0.mlp.fc1"));
  CHECK(nn::path_matches("blocks.*.mlp.*", "blocks.12.mlp.0"));
  CHECK_FALSE(nn::path_matches("blocks.*.mlp.*", "blocks.0.mlp.fc1.down"));
  CHECK_FALSE(nn::path_matches("blocks.*", "blocks.0.mlp"));
  CHECK(nn::path_matches("*.attn.*_proj", "3.attn.q_proj"));
  CHECK_FALSE(nn::path_matches("*.attn.*_proj", "3.attn.proj_out"));
  CHECK(nn::path_matches("head", "head"));
  CHECK_FALSE(nn::path_matches("head", "heads"));
}

namespace {

/// x -> proj(x + mlp(x)), with proj kept in a typed member that it re-points on replacement.
struct Block : nn::UnaryModule {
  std::shared_ptr<nn::Sequential> mlp;
  std::shared_ptr<nn::UnaryModule> proj;
  explicit Block(int64_t d) {
    mlp = register_module("mlp", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<UnaryModule>>{
                                     std::make_shared<nn::Linear>(d, 3 * d), std::make_shared<nn::ReLU>(),
                                     std::make_shared<nn::Linear>(3 * d, d)}));
    proj = register_module("proj", std::shared_ptr<UnaryModule>(std::make_shared<nn::Linear>(d, d)));
  }
  Tensor forward(const Tensor& x) override { return proj->forward(add(x, mlp->forward(x))); }
  std::string type_name() const override { return "Block"; }

 protected:
  void on_replace_module(const std::string& name, const std::shared_ptr<Module>& m) override {
    if (name == "proj") proj = std::dynamic_pointer_cast<UnaryModule>(m);
  }
};

struct Net : nn::UnaryModule {
  std::shared_ptr<nn::ModuleList<Block>> blocks;
  std::shared_ptr<nn::MultiheadAttention> attn;
  explicit Net(int64_t d) {
    blocks = register_module("blocks", std::make_shared<nn::ModuleList<Block>>());
    for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<Block>(d));
    attn = register_module("attn", std::make_shared<nn::MultiheadAttention>(d, 2));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (const auto& b : *blocks) h = b->forward(h);
    return h;
  }
  std::string type_name() const override { return "Net"; }
};

}  // namespace

TEST_CASE("low_rank: compress replaces matching layers of a nested model and reports them") {
  const int64_t d = 8;
  Net net(d);
  // Exactly rank-2 weights: compressing at rank 2 changes no output.
  uint64_t seed = 20;
  for (auto& [path, m] : net.named_modules())
    if (auto lin = std::dynamic_pointer_cast<nn::Linear>(m); lin && path.rfind("blocks.", 0) == 0)
      set_values(lin->weight, rank_r_values(lin->out_features, lin->in_features, 2, seed += 2));
  const Tensor x = random_tensor({3, d}, kFloat32, 9);
  const std::vector<double> before = values_of(run(net, x));
  const int64_t params_before = net.num_parameters();

  const nn::CompressReport report =
      nn::compress(net, {.patterns = {"blocks.*.mlp.*", "blocks.1.proj"}, .energy = {0.999}});
  REQUIRE(report.layers.size() == 5);
  const char* expected_paths[] = {"blocks.0.mlp.0", "blocks.0.mlp.2", "blocks.1.mlp.0", "blocks.1.mlp.2",
                                  "blocks.1.proj"};
  for (size_t i = 0; i < 5; ++i) {
    const auto& l = report.layers[i];
    CAPTURE(l.path);
    CHECK(l.path == expected_paths[i]);
    CHECK(l.rank == 2);
    CHECK(l.replaced);
    CHECK(l.params_after == 2 * (l.in_features + l.out_features) + l.out_features);
    CHECK(l.params_before == l.in_features * l.out_features + l.out_features);
    CHECK(l.relative_error < 1e-5);
  }
  CHECK(net.num_parameters() == params_before - report.params_before() + report.params_after());
  CHECK(report.table().find("blocks.1.proj") != std::string::npos);
  // The replacements are what forward runs: typed members (Sequential's list, Block::proj) were re-pointed.
  CHECK(std::dynamic_pointer_cast<nn::LowRankLinear>((*net.blocks)[1]->proj) != nullptr);
  CHECK(std::dynamic_pointer_cast<nn::LowRankLinear>((*(*net.blocks)[0]->mlp)[2]) != nullptr);
  // The outputs reach a few thousand while some are tens (cancellation), and the factors'
  // float32 rounding (relative 1e-7 of the weights) moves each by about 1e-6 of the largest:
  // the tolerance is relative to the largest output, not to each one.
  double largest = 0;
  for (double v : before) largest = std::max(largest, std::fabs(v));
  check_close(run(net, x), before, 1e-4, 1e-5 * largest, "compressed output");
  bool found = false;
  for (auto& [name, p] : net.named_parameters()) found |= name == "blocks.0.mlp.0.down.weight";
  CHECK(found);
  // Compressing again leaves the factors alone: nothing matches any more.
  check_error([&] { nn::compress(net, {.patterns = {"blocks.*.mlp.*"}}); },
              {"compress", "no Linear layer of Net matches", "blocks.0.proj"});
}

TEST_CASE("low_rank: compress keeps layers that would not shrink and refuses typed members it cannot re-point") {
  Net net(8);
  // Random weights at energy 0.99 need nearly full rank: nothing saves, everything is kept.
  const nn::CompressReport kept = nn::compress(net, {.patterns = {"blocks.*.proj"}, .energy = {0.99}});
  REQUIRE(kept.layers.size() == 2);
  for (const auto& l : kept.layers) {
    CHECK_FALSE(l.replaced);
    CHECK(l.params_after == l.params_before);
  }
  CHECK(kept.table().find("kept") != std::string::npos);
  CHECK(std::dynamic_pointer_cast<nn::Linear>((*net.blocks)[0]->proj) != nullptr);
  // MultiheadAttention calls out_proj through a typed Linear member: the swap is undone.
  check_error([&] { nn::compress(net, {.patterns = {"attn.out_proj"}, .rank = 2}); },
              {"compress", "attn.out_proj", "MultiheadAttention", "on_replace_module"});
  bool restored = false;
  for (auto& [name, m] : net.named_modules()) restored |= name == "attn.out_proj" && m == net.attn->out_proj;
  CHECK(restored);
  check_error([&] { nn::compress(net, {.patterns = {}}); }, {"compress", "no patterns"});
}

TEST_CASE("low_rank: state_dict round trip through safetensors") {
  nn::LowRankLinear a(12, 10, 3), b(12, 10, 3);
  const std::string path = temp_path("frugal_test_low_rank");
  nn::save_safetensors(path, a.state_dict());
  const nn::SafetensorsFile file = nn::load_safetensors(path);
  std::remove(path.c_str());
  CHECK(file.tensors.size() == 3);
  CHECK(file.tensors.count("down.weight") == 1);
  CHECK(file.tensors.count("up.weight") == 1);
  CHECK(file.tensors.count("up.bias") == 1);
  b.load_state_dict(file.tensors);
  const Tensor x = random_tensor({4, 12}, kFloat32, 1);
  check_close(run(b, x), values_of(run(a, x)), 0, 0, "loaded LowRankLinear");
  // A mismatched rank is refused by load_state_dict.
  nn::LowRankLinear c(12, 10, 4);
  check_error([&] { c.load_state_dict(file.tensors); }, {"load_state_dict", "down.weight"});
}

TEST_CASE("low_rank: Module::replace_module swaps a child in place, re-points typed lists, refuses misfits") {
  nn::Sequential seq{std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::ReLU>()};
  auto low = std::make_shared<nn::LowRankLinear>(4, 6, 2);
  auto old = seq.replace_module("0", low);
  CHECK(std::dynamic_pointer_cast<nn::Linear>(old) != nullptr);
  CHECK(seq[0] == low);  // Sequential's forward list follows the registry
  CHECK(seq.named_parameters().front().first == "0.down.weight");
  const Tensor x = random_tensor({3, 4}, kFloat32, 5);
  check_close(run(seq, x), values_of(ops::relu(run(*low, x))), 0, 0, "Sequential runs the replacement");
  // A ModuleList refuses a replacement of another type; the registry is restored.
  nn::ModuleList<nn::Linear> list;
  list.push_back(std::make_shared<nn::Linear>(2, 2));
  check_error([&] { list.replace_module("0", std::make_shared<nn::ReLU>()); }, {"ModuleList", "'0'", "ReLU"});
  CHECK(list.named_children().front().second == list[0]);
  check_error([&] { seq.replace_module("7", low); }, {"Sequential", "no submodule named '7'"});
  check_error([&] { seq.replace_module("1", nullptr); }, {"Sequential", "null module"});
}

// ---- Conv2d: channel factorization (nn/low_rank_conv.h) ----------------------------

namespace {

/// A conv weight (out, in, kh, kw) as the matrix (out, in*kh*kw) its SVD factorizes.
Tensor as_matrix(const Tensor& w) { return w.reshape({w.size(0), -1}); }

/// A Conv2d whose weight matrix (out, in*kh*kw) has exact rank `rank`.
void set_rank_r_conv(nn::Conv2d& conv, int64_t rank, uint64_t seed) {
  const int64_t out = conv.weight.size(0), patch = conv.weight.numel() / out;
  set_values(conv.weight, rank_r_values(out, patch, rank, seed));
}

}  // namespace

TEST_CASE("low_rank: LowRankConv2d passes gradcheck, names its parameters, applies up @ down") {
  const Conv2dOptions o{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}};
  nn::LowRankConv2d m(3, 4, {3, 2}, 2, {.stride = o.stride, .padding = o.padding, .dilation = o.dilation});
  m.to(kFloat64);
  std::vector<std::string> names;
  for (auto& [name, p] : m.named_parameters()) names.push_back(name + shape_str(p.sizes()));
  CHECK(names == std::vector<std::string>{"down.weight[2, 3, 3, 2]", "up.weight[4, 2, 1, 1]", "up.bias[4]"});
  Tensor x = random_tensor({2, 3, 6, 5}, kFloat64, 11).requires_grad_();
  auto r = autograd::gradcheck([&](const TensorList& in) { return m.forward(in[0]); },
                               {x, m.down->weight, m.up->weight, m.up->bias});
  CHECK_MESSAGE(r.ok, r.report);
  // dense_weight against a naive loop: W[o, c, i, j] = sum_l up[o, l] down[l, c, i, j].
  const std::vector<double> dv = values_of(m.down->weight), uv = values_of(m.up->weight);
  std::vector<double> dense(4 * 18, 0.0);
  for (int64_t out = 0; out < 4; ++out)
    for (int64_t k = 0; k < 18; ++k)
      for (int64_t l = 0; l < 2; ++l) dense[size_t(out * 18 + k)] += uv[size_t(out * 2 + l)] * dv[size_t(l * 18 + k)];
  check_close(m.dense_weight(), dense, 1e-14, 1e-14, "dense_weight");
  // The two convs apply the dense conv, with the original geometry.
  autograd::NoGradGuard no_grad;
  check_close(run(m, x), values_of(conv2d(x, m.dense_weight(), m.up->bias, o)), 1e-12, 1e-12, "forward");
  check_error([&] { run(m, random_tensor({2, 4, 6, 5}, kFloat64, 1)); }, {"LowRankConv2d", "expected input (N, 3"});
}

TEST_CASE("low_rank: a full-rank Conv2d factorization reproduces strided, padded, dilated convs") {
  struct Case {
    int64_t in, out;
    Int2 kernel;
    nn::Conv2dModuleOptions options;
  };
  const Case cases[] = {
      {3, 8, 3, {.padding = 1}},
      {4, 6, {3, 2}, {.stride = {2, 1}, .padding = {1, 2}}},
      {2, 5, 3, {.stride = 2, .padding = 2, .dilation = 2}},
      {5, 4, 1, {.bias = false}},
      {6, 7, {2, 3}, {.stride = {1, 3}, .dilation = {3, 1}, .bias = false}},
  };
  uint64_t seed = 40;
  for (const Case& c : cases) {
    nn::Conv2d conv(c.in, c.out, c.kernel, c.options);
    CAPTURE(conv.repr());
    const Tensor x = random_tensor({2, c.in, 9, 10}, kFloat32, ++seed);
    const std::vector<double> y = values_of(run(conv, x));
    const int64_t full = std::min(c.out, c.in * c.kernel.h * c.kernel.w);
    auto m = nn::to_low_rank(conv, full, {.require_saving = false});
    CHECK(m->rank == full);
    CHECK(m->down->options.stride == conv.options.stride);
    CHECK(m->up->bias.defined() == conv.bias.defined());
    check_close(run(*m, x), y, 1e-5, 1e-5, "rank = min(out, in*kh*kw)");
    CHECK(nn::relative_error(conv.weight, *m) < 1e-5);
  }
}

TEST_CASE("low_rank: a truncated Conv2d errs by the tail singular values of its (out, in*kh*kw) matrix") {
  nn::Conv2d conv(4, 12, 3, {.stride = 2, .padding = 1});
  const std::vector<double> s = singular_values(as_matrix(conv.weight));  // (12, 36): 12 values
  REQUIRE(s.size() == 12);
  for (int64_t r : {1, 3, 6, 8}) {  // r * (36 + 12) < 432 up to r = 8
    CAPTURE(r);
    auto m = nn::to_low_rank(conv, r);
    CHECK(m->num_parameters() == r * (36 + 12) + 12);
    CHECK(nn::relative_error(conv.weight, *m) == doctest::Approx(truncation_error(s, r)).epsilon(1e-4));
    check_close(m->up->bias, values_of(conv.bias), 0, 0, "bias");
  }
}

TEST_CASE("low_rank: the energy rule picks the rank of a known Conv2d spectrum") {
  // W (6, 2, 2, 2) whose (6, 8) matrix has the known spectrum.
  const std::vector<double> w = known_spectrum_matrix();
  nn::Conv2d conv(2, 6, 2);
  set_values(conv.weight, w);
  auto m = nn::to_low_rank(conv, nn::Energy{0.9});
  CHECK(m->rank == 3);
  CHECK(nn::relative_error(conv.weight, *m) == doctest::Approx(std::sqrt(1.26 / 30.26)).epsilon(1e-5));
  CHECK(nn::to_low_rank(conv, nn::Energy{0.5})->rank == 1);
  // 0.99 needs rank 4, and 4 * (8 + 6) >= 48 saves nothing.
  check_error([&] { nn::to_low_rank(conv, nn::Energy{0.99}); },
              {"to_low_rank", "rank 4", "energy 0.99", "saves no parameters", "in=2, out=6, kernel_size=(2, 2)",
               "ranks up to 3"});
  CHECK(nn::to_low_rank(conv, nn::Energy{0.99}, {.require_saving = false})->rank == 4);
}

TEST_CASE("low_rank: Conv2d refusals name the layer and the reason") {
  nn::Conv2d conv(3, 8, 3);  // (8, 27): r * 35 < 216 up to r = 6
  check_error([&] { nn::to_low_rank(conv, 7); },
              {"to_low_rank", "rank 7", "saves no parameters", "245 >= out * in*kh*kw = 216", "ranks up to 6",
               "require_saving = false"});
  check_error([&] { nn::to_low_rank(conv, 9, {.require_saving = false}); }, {"rank 9", "outside [1, 8]"});
  check_error([&] { nn::to_low_rank(conv, 0); }, {"rank 0", "outside [1, 8]", "kernel_size=(3, 3)"});
  CHECK(nn::to_low_rank(conv, 6)->rank == 6);
  CHECK(nn::to_low_rank(conv, 8, {.require_saving = false})->rank == 8);
  nn::Conv2d grouped(4, 8, 3, {.groups = 2});
  check_error([&] { nn::to_low_rank(grouped, 2); },
              {"to_low_rank", "Conv2d(in=4, out=8, kernel_size=(3, 3), groups=2)", "only groups=1"});
  check_error([&] { nn::to_low_rank(grouped, nn::Energy{0.9}); }, {"to_low_rank", "groups=2", "only groups=1"});
  check_error([] { nn::LowRankConv2d(4, 8, 3, 2, {.groups = 2}); }, {"LowRankConv2d", "groups must be 1", "groups=2"});
  check_error([] { nn::LowRankConv2d(1, 8, 2, 5); }, {"LowRankConv2d", "rank 5", "in*kh*kw=4"});
}

namespace {

/// conv (a typed member it re-points on replacement), then body = [ReLU, Conv2d].
struct ConvBlock : nn::UnaryModule {
  std::shared_ptr<nn::UnaryModule> conv;
  std::shared_ptr<nn::Sequential> body;
  ConvBlock(int64_t in, int64_t out) {
    conv = register_module("conv", std::shared_ptr<UnaryModule>(std::make_shared<nn::Conv2d>(
                                       in, out, 3, nn::Conv2dModuleOptions{.padding = 1})));
    body =
        register_module("body", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<UnaryModule>>{
                                    std::make_shared<nn::ReLU>(),
                                    std::make_shared<nn::Conv2d>(out, out, 3, nn::Conv2dModuleOptions{.padding = 1})}));
  }
  Tensor forward(const Tensor& x) override { return body->forward(conv->forward(x)); }
  std::string type_name() const override { return "ConvBlock"; }

 protected:
  void on_replace_module(const std::string& name, const std::shared_ptr<Module>& m) override {
    if (name == "conv") conv = std::dynamic_pointer_cast<UnaryModule>(m);
  }
};

/// stem = [strided conv, depthwise conv], two ConvBlocks, spatial mean, Linear head.
struct SmallCNN : nn::UnaryModule {
  std::shared_ptr<nn::Sequential> stem;
  std::shared_ptr<nn::ModuleList<ConvBlock>> stages;
  std::shared_ptr<nn::UnaryModule> head;
  SmallCNN() {
    stem = register_module(
        "stem", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<UnaryModule>>{
                    std::make_shared<nn::Conv2d>(3, 8, 3, nn::Conv2dModuleOptions{.stride = 2, .padding = 1}),
                    std::make_shared<nn::Conv2d>(8, 8, 3, nn::Conv2dModuleOptions{.padding = 1, .groups = 8})}));
    stages = register_module("stages", std::make_shared<nn::ModuleList<ConvBlock>>());
    stages->push_back(std::make_shared<ConvBlock>(8, 16));
    stages->push_back(std::make_shared<ConvBlock>(16, 16));
    head = register_module("head", std::shared_ptr<UnaryModule>(std::make_shared<nn::Linear>(16, 10)));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = stem->forward(x);
    for (const auto& s : *stages) h = s->forward(h);
    return head->forward(mean(h, {2, 3}));
  }
  std::string type_name() const override { return "SmallCNN"; }

 protected:
  void on_replace_module(const std::string& name, const std::shared_ptr<Module>& m) override {
    if (name == "head") head = std::dynamic_pointer_cast<UnaryModule>(m);
  }
};

}  // namespace

TEST_CASE("low_rank: compress factorizes the Conv2d layers of a nested CNN only when asked") {
  SmallCNN net;
  uint64_t seed = 60;
  for (auto& [path, m] : net.named_modules()) {
    auto conv = std::dynamic_pointer_cast<nn::Conv2d>(m);
    if (conv && conv->options.groups == 1) set_rank_r_conv(*conv, 2, seed += 2);
    if (auto lin = std::dynamic_pointer_cast<nn::Linear>(m))
      set_values(lin->weight, rank_r_values(lin->out_features, lin->in_features, 2, seed += 2));
  }
  const Tensor x = random_tensor({2, 3, 10, 9}, kFloat32, 13);
  const std::vector<double> before = values_of(run(net, x));
  const int64_t params_before = net.num_parameters();
  const std::vector<std::string> patterns = {"stem.*", "stages.*.conv", "stages.*.body.*", "head"};

  // Without .convs the policy sees Linear layers only (the behaviour before Conv2d support).
  check_error(
      [&] {
        nn::compress(net, {.patterns = {"stem.*", "stages.*.conv"}});
      },
      {"compress", "no Linear layer of SmallCNN matches", "head"});

  const nn::CompressReport report = nn::compress(net, {.patterns = patterns, .energy = {0.999}, .convs = true});
  REQUIRE(report.layers.size() == 7);
  struct Row {
    const char* path;
    const char* type;
    int64_t in, out, k;
    bool replaced;
  };
  const Row expected[] = {{"stem.0", "Conv2d", 3, 8, 3, true},          {"stem.1", "Conv2d", 8, 8, 3, false},
                          {"stages.0.conv", "Conv2d", 8, 16, 3, true},  {"stages.0.body.1", "Conv2d", 16, 16, 3, true},
                          {"stages.1.conv", "Conv2d", 16, 16, 3, true}, {"stages.1.body.1", "Conv2d", 16, 16, 3, true},
                          {"head", "Linear", 16, 10, 1, true}};
  for (size_t i = 0; i < 7; ++i) {
    const auto& l = report.layers[i];
    const Row& e = expected[i];
    CAPTURE(l.path);
    CHECK(l.path == e.path);
    CHECK(l.type == e.type);
    CHECK(l.in_features == e.in);
    CHECK(l.out_features == e.out);
    CHECK(l.kernel_h == e.k);
    CHECK(l.replaced == e.replaced);
    if (!e.replaced) {  // the depthwise conv is kept, whatever the energy
      CHECK(l.groups == 8);
      CHECK(l.params_after == l.params_before);
      continue;
    }
    CHECK(l.rank == 2);
    const int64_t patch = l.in_features * l.kernel_h * l.kernel_w;
    CHECK(l.params_before == l.out_features * patch + l.out_features);
    CHECK(l.params_after == 2 * (patch + l.out_features) + l.out_features);
    CHECK(l.relative_error < 1e-5);
  }
  CHECK(net.num_parameters() == params_before - report.params_before() + report.params_after());
  const std::string table = report.table();
  CHECK(table.find("stages.1.body.1") != std::string::npos);
  CHECK(table.find("3x3") != std::string::npos);
  CHECK(table.find("kept: groups=8") != std::string::npos);
  // The replacements are what forward runs (Sequential's list, ConvBlock::conv, SmallCNN::head).
  CHECK(std::dynamic_pointer_cast<nn::LowRankConv2d>((*net.stages)[1]->conv) != nullptr);
  CHECK(std::dynamic_pointer_cast<nn::LowRankConv2d>((*(*net.stages)[0]->body)[1]) != nullptr);
  CHECK(std::dynamic_pointer_cast<nn::LowRankConv2d>((*net.stem)[0]) != nullptr);
  CHECK(std::dynamic_pointer_cast<nn::Conv2d>((*net.stem)[1]) != nullptr);
  CHECK(std::dynamic_pointer_cast<nn::LowRankLinear>(net.head) != nullptr);
  check_close(run(net, x), before, 1e-4, 1e-5, "compressed output");
  bool found = false;
  for (auto& [name, p] : net.named_parameters()) found |= name == "stages.0.conv.down.weight";
  CHECK(found);
  // The factors are not compressed again: only the depthwise conv is left to match.
  const nn::CompressReport again = nn::compress(net, {.patterns = patterns, .rank = 1, .convs = true});
  REQUIRE(again.layers.size() == 1);
  CHECK(again.layers[0].path == "stem.1");
  check_error([&] { nn::compress(net, {.patterns = {"stages.*.*.*"}, .convs = true}); },
              {"no Linear or Conv2d layer of SmallCNN matches", "stem.1"});
}

TEST_CASE("low_rank: LowRankConv2d state_dict round trip through safetensors") {
  nn::LowRankConv2d a(3, 6, 3, 2, {.padding = 1}), b(3, 6, 3, 2, {.padding = 1});
  const std::string path = temp_path("frugal_test_low_rank_conv");
  nn::save_safetensors(path, a.state_dict());
  const nn::SafetensorsFile file = nn::load_safetensors(path);
  std::remove(path.c_str());
  CHECK(file.tensors.size() == 3);
  CHECK(file.tensors.count("down.weight") == 1);
  CHECK(file.tensors.count("up.weight") == 1);
  CHECK(file.tensors.count("up.bias") == 1);
  b.load_state_dict(file.tensors);
  const Tensor x = random_tensor({2, 3, 7, 6}, kFloat32, 2);
  check_close(run(b, x), values_of(run(a, x)), 0, 0, "loaded LowRankConv2d");
  nn::LowRankConv2d c(3, 6, 3, 4, {.padding = 1});
  check_error([&] { c.load_state_dict(file.tensors); }, {"load_state_dict", "down.weight"});
}

// A frozen layer stays frozen through compress(): its factors do not require grad, so an
// optimizer built afterwards (as the header says) does not train them (a probe found them
// all trainable: a frozen layer moved during fine-tuning).
TEST_CASE("low_rank: compress keeps frozen weights and biases frozen, Linear and Conv2d alike") {
  nn::Sequential net{std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::Conv2d>(8, 8, 3),
                     std::make_shared<nn::Linear>(16, 16)};
  const auto params = net.named_parameters();
  entry(params, "0.weight").requires_grad_(false);  // layer 0 frozen whole
  entry(params, "0.bias").requires_grad_(false);
  entry(params, "1.weight").requires_grad_(false);  // layer 1: the weight only
  net.eval();
  nn::compress(net, {.patterns = {"*"}, .rank = 2, .convs = true});
  std::map<std::string, bool> trainable;
  for (const auto& [name, p] : net.named_parameters()) trainable[name] = p.requires_grad();
  const std::map<std::string, bool> expected = {{"0.down.weight", false}, {"0.up.weight", false}, {"0.up.bias", false},
                                                {"1.down.weight", false}, {"1.up.weight", false}, {"1.up.bias", true},
                                                {"2.down.weight", true},  {"2.up.weight", true},  {"2.up.bias", true}};
  CHECK(trainable == expected);
  for (const auto& [path, m] : net.named_modules()) CHECK_MESSAGE(!m->is_training(), path);
}
