// nn/low_rank.h: LowRankLinear, to_low_rank, the energy rule and compress(), checked
// against gradcheck, Eigen's JacobiSVD in float64 and exactly low-rank weights.
#include <doctest/doctest.h>

#include <Eigen/SVD>
#include <cmath>
#include <cstdio>
#include <map>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/elementwise.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/low_rank.h"
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
  double total = 0;
  for (double v : s) total += v * v;
  for (int64_t r : {1, 3, 6, 9}) {
    CAPTURE(r);
    auto m = nn::to_low_rank(layer, r);
    CHECK(m->num_parameters() == r * (24 + 16) + 16);
    double tail = 0;
    for (size_t i = size_t(r); i < s.size(); ++i) tail += s[i] * s[i];
    // Eckart-Young: the truncation error is exactly the tail of the spectrum.
    CHECK(nn::relative_error(layer.weight, *m) == doctest::Approx(std::sqrt(tail / total)).epsilon(1e-4));
    // And the factors reproduce the bias.
    check_close(m->up->bias, values_of(layer.bias), 0, 0, "bias");
  }
}

TEST_CASE("low_rank: the energy rule picks the rank of a known spectrum") {
  // W (6, 8) with singular values 4, 3, 2, 1, 0.5, 0.1: a scaled permutation with signs.
  const std::vector<double> s = {4, 3, 2, 1, 0.5, 0.1};
  const int64_t rows[] = {3, 0, 5, 1, 4, 2}, cols[] = {5, 0, 7, 2, 3, 6};
  std::vector<double> w(6 * 8, 0.0);
  for (int64_t i = 0; i < 6; ++i) w[size_t(rows[i] * 8 + cols[i])] = (i % 2 ? -1 : 1) * s[size_t(i)];
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
  check_close(run(net, x), before, 1e-4, 1e-5, "compressed output");
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
  const std::string path = "/tmp/frugal_test_low_rank.safetensors";
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
