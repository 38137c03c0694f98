// einsum (autograd/ops/einsum.h) against a brute-force float64 evaluator written here (every
// assignment of the labels, the product of the operands' entries summed into the output): matrix,
// batched and attention products, outer and dot products, sums and transposes, implicit outputs,
// the ellipsis with broadcasting, three operands, size-1 broadcasting, size-0 dims, transposed
// inputs, diagonals and traces; the errors; gradcheck and gradgradcheck.
#include <doctest/doctest.h>

#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "autograd/ops/einsum.h"
#include "tensor/factory.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// The reference: `equation` with explicit output and letters only ("..." spelled out by the
/// caller as letters), each operand's size-1 dims broadcast.
std::vector<double> brute_force(const std::string& equation, const std::vector<Tensor>& xs, Shape& out_shape) {
  const size_t arrow = equation.find("->");
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = equation.find(',', start);
    terms.push_back(equation.substr(start, std::min(comma, arrow) - start));
    if (comma == std::string::npos || comma > arrow) break;
    start = comma + 1;
  }
  const std::string out = equation.substr(arrow + 2);
  std::map<char, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t d = 0; d < terms[i].size(); ++d)
      size[terms[i][d]] = std::max(size[terms[i][d]], xs[i].size(int64_t(d)));
  std::vector<char> labels;
  for (const auto& [c, n] : size) labels.push_back(c);
  out_shape.clear();
  for (char c : out) out_shape.push_back(size[c]);
  std::vector<double> result(size_t(numel_of(out_shape)), 0.0);
  std::vector<std::vector<double>> values;
  for (const Tensor& x : xs) values.push_back(values_of(x));
  std::map<char, int64_t> at;
  for (char c : labels) at[c] = 0;
  for (char c : labels)
    if (size[c] == 0) return result;  // no assignment: nothing summed
  for (;;) {
    double product = 1.0;
    for (size_t i = 0; i < terms.size(); ++i) {
      int64_t p = 0;
      for (size_t d = 0; d < terms[i].size(); ++d) {
        const int64_t n = xs[i].size(int64_t(d));
        p = p * n + (n == 1 ? 0 : at[terms[i][d]]);
      }
      product *= values[i][size_t(p)];
    }
    int64_t q = 0;
    for (char c : out) q = q * size[c] + at[c];
    if (!result.empty()) result[size_t(q)] += product;
    size_t k = 0;  // the next assignment, odometer style
    for (; k < labels.size(); ++k) {
      if (++at[labels[k]] < size[labels[k]]) break;
      at[labels[k]] = 0;
    }
    if (k == labels.size()) break;
  }
  return result;
}

struct Case {
  std::string equation;  // as einsum takes it
  std::string spelled;   // the reference's: explicit output, letters for "..."
  std::vector<Shape> shapes;
};

}  // namespace

TEST_CASE("einsum: matches a brute-force evaluator on every kind of equation") {
  const std::vector<Case> cases = {
      {"ij,jk->ik", "ij,jk->ik", {{3, 4}, {4, 5}}},
      {"bij,bjk->bik", "bij,bjk->bik", {{2, 3, 4}, {2, 4, 2}}},
      {"bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", {{2, 2, 3, 4}, {2, 2, 5, 4}}},
      {"i,j->ij", "i,j->ij", {{3}, {4}}},
      {"i,i->", "i,i->", {{5}, {5}}},
      {"ij->", "ij->", {{3, 4}}},
      {"ij->ji", "ij->ji", {{3, 4}}},
      {"ij->j", "ij->j", {{3, 4}}},
      {"ij,jk", "ij,jk->ik", {{3, 4}, {4, 2}}},
      {"Ab,bC", "Ab,bC->AC", {{2, 3}, {3, 4}}},
      {"ba,ca", "ba,ca->bc", {{2, 3}, {4, 3}}},  // implicit: the once-used labels, sorted
      {"...ij,...jk->...ik", "xyij,yjk->xyik", {{2, 3, 3, 4}, {3, 4, 2}}},
      {"...ij,...jk->...ik", "xyij,xyjk->xyik", {{2, 3, 3, 4}, {2, 1, 4, 2}}},  // a size-1 batch dim broadcasts
      {"b...,b...->b", "bxy,bxy->b", {{2, 3, 4}, {2, 3, 4}}},
      {"...", "xy->xy", {{3, 2}}},
      {"ij,jk,kl->il", "ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}},
      {"ij,k->i", "ij,k->i", {{3, 4}, {5}}},         // k only in the second operand, summed out
      {"ij,ij->ij", "ij,ij->ij", {{3, 1}, {1, 4}}},  // size-1 dims broadcast
      {"ij,jk->ik", "ij,jk->ik", {{3, 0}, {0, 2}}},  // an empty contraction: zeros
      {"ij,jk->ik", "ij,jk->ik", {{0, 3}, {3, 2}}},
      {" i j , j k -> i k ", "ij,jk->ik", {{2, 3}, {3, 2}}},  // spaces ignored
      {"ii->i", "ii->i", {{4, 4}}},                           // diagonals
      {"ii", "ii->", {{3, 3}}},                               // a trace: i used twice, so summed
      {"bii,bi->bi", "bii,bi->bi", {{2, 3, 3}, {2, 3}}},
      {"iji->j", "iji->j", {{3, 2, 3}}},
      {"iii->i", "iii->i", {{3, 3, 3}}},
  };
  uint64_t seed = 50;
  for (const Case& c : cases) {
    std::vector<Tensor> xs;
    for (const Shape& s : c.shapes) xs.push_back(make_tensor(random_values(numel_of(s), seed++), s, kFloat64));
    Shape want_shape;
    const std::vector<double> want = brute_force(c.spelled, xs, want_shape);
    const Tensor got = einsum(c.equation, xs);
    REQUIRE_MESSAGE(got.sizes() == want_shape, c.equation);
    check_close(got, want, 1e-12, 1e-12, c.equation);
  }
  // Transposed and float32 operands.
  const Tensor a = make_tensor(random_values(12, 7), {4, 3}, kFloat32).t(),
               b = make_tensor(random_values(20, 8), {4, 5}, kFloat32);
  Shape s;
  check_close(einsum("ij,jk->ik", {a, b}), brute_force("ij,jk->ik", {a.contiguous(), b}, s), 1e-5, 1e-5, "transposed");
}

TEST_CASE("einsum: bad equations and operands are errors that say what is wrong") {
  const Tensor m = zeros({2, 3}, kFloat32), v = zeros({3}, kFloat32);
  check_error([&] { einsum("ij,jk->ik", {m}); }, {"einsum", "2 operand terms", "1 operands"});
  check_error([&] { einsum("ijk->i", {m}); }, {"einsum", "operand 0", "2 dims", "name 3"});
  check_error([&] { einsum("i1->i", {m}); }, {"einsum", "invalid subscript '1'"});
  check_error([&] { einsum("ii->i", {zeros({3, 4}, kFloat32)}); }, {"einsum", "'i'", "3 and 4", "diagonal"});
  check_error([&] { einsum("ij->k", {m}); }, {"einsum", "output label 'k'", "no operand"});
  check_error([&] { einsum("ij->ii", {m}); }, {"einsum", "repeated output label"});
  check_error([&] { einsum("ij,j->i", {m, zeros({4}, kFloat32)}); }, {"einsum", "'j'", "3 and 4"});
  check_error([&] { einsum("i..j->i", {m}); }, {"einsum", "ellipsis"});
  check_error([&] { einsum("ij,j->i", {m, Tensor()}); }, {"einsum", "operand 1", "undefined"});
  check_error([&] { einsum("ij,j->i", {m, zeros({3}, kFloat64)}); }, {"einsum", "operand 1", "float64", "dtype"});
  check_error([&] { einsum("ij,j->i", {m, zeros({3}, kInt64)}); }, {"einsum", "floating", "int64"});
  CHECK(einsum("ij,j->i", {m, v}).sizes() == Shape{2});
}

TEST_CASE("einsum: gradients, first and second order") {
  const Tensor a = leaf({2, 3, 4}, 60), b = leaf({2, 4, 3}, 61), c = leaf({3, 2}, 62);
  check_gradcheck([](const TensorList& in) { return einsum("bij,bjk->bik", {in[0], in[1]}); }, {a, b});
  check_gradcheck([](const TensorList& in) { return einsum("bij,bjk,kl->il", {in[0], in[1], in[2]}); }, {a, b, c});
  check_gradcheck([](const TensorList& in) { return einsum("...j,...j->...", {in[0], in[1]}); }, {a, leaf({3, 4}, 63)});
  check_gradcheck([](const TensorList& in) { return einsum("bii->bi", {in[0]}); }, {leaf({2, 3, 3}, 64)});
  const autograd::GradcheckResult gg = autograd::gradgradcheck(
      [](const TensorList& in) {
        return einsum("bij,bjk->ik", {in[0], in[1]});
      },
      {a, b});
  CHECK_MESSAGE(gg.ok, gg.report);
}
