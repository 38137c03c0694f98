// normalize, cosine_similarity and pairwise_distance (autograd/ops/distance.h) against float64
// loops written from torch's definitions: every dim and norm order, broadcast operands, views,
// zero vectors (below eps), 0-d and 1-D inputs, every floating dtype; gradcheck and
// gradgradcheck; autocast; errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/distance.h"
#include "autograd/ops/reduce.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr DType kAllFloat[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

/// ||v||_p of a float64 vector (p = inf: max |v|).
double norm_of(const std::vector<double>& v, double p) {
  double acc = 0;
  for (double e : v) acc = p == kInf ? std::max(acc, std::fabs(e)) : acc + std::pow(std::fabs(e), p);
  return p == kInf ? acc : std::pow(acc, 1.0 / p);
}

/// Row-major strides of `shape`.
std::vector<int64_t> strides_of(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = int64_t(shape.size()) - 2; d >= 0; --d) s[size_t(d)] = s[size_t(d + 1)] * shape[size_t(d + 1)];
  return s;
}

/// Calls f(base offset, step) for each line of `shape` along dim d (row-major values).
template <typename F>
void for_each_line(const Shape& shape, int64_t d, F&& f) {
  const std::vector<int64_t> st = strides_of(shape);
  const int64_t n = numel_of(shape), len = shape[size_t(d)];
  for (int64_t i = 0; i < n; ++i)
    if ((i / st[size_t(d)]) % len == 0) f(i, st[size_t(d)]);
}

/// F.normalize's definition in float64.
std::vector<double> ref_normalize(const std::vector<double>& x, const Shape& shape, double p, int64_t d, double eps) {
  std::vector<double> y(x.size());
  for_each_line(shape, d, [&](int64_t base, int64_t step) {
    std::vector<double> line;
    for (int64_t k = 0; k < shape[size_t(d)]; ++k) line.push_back(x[size_t(base + k * step)]);
    const double n = std::max(norm_of(line, p), eps);
    for (int64_t k = 0; k < shape[size_t(d)]; ++k) y[size_t(base + k * step)] = line[size_t(k)] / n;
  });
  return y;
}

/// The values of x broadcast to `shape`, row-major.
std::vector<double> broadcast_values(const Tensor& x, const Shape& shape) {
  return values_of(x.expand(shape).contiguous());
}

}  // namespace

TEST_CASE("normalize: every dim and order, every dtype and layout, zero vectors; gradients") {
  uint64_t seed = 1;
  const Shape shape{3, 4, 5};
  for (DType dt : kAllFloat)
    for (Layout layout : kAllLayouts)
      for (int64_t dim : {0, 1, -1})
        for (double p : {2.0, 1.0, 3.0, kInf}) {
          CAPTURE(name_of(dt, layout));
          CAPTURE(dim);
          CAPTURE(p);
          const Tensor x = random_tensor(shape, dt, ++seed, layout);
          const Tensor y = normalize(x, p, dim);
          CHECK(y.dtype() == dt);
          REQUIRE(y.sizes() == shape);
          const int64_t d = dim < 0 ? dim + 3 : dim;
          check_close(y, ref_normalize(values_of(x), shape, p, d, 1e-12), 4 * default_rtol(dt), 1e-6, "normalize");
        }
  // A zero vector (norm below eps) divides by eps: zeros, and its gradient is 1 / eps.
  const Tensor z = make_tensor({0, 0, 0, 3, 4, 0}, {2, 3}, kFloat64);
  check_close(normalize(z), {0, 0, 0, 0.6, 0.8, 0}, 1e-15, 0, "zero row");
  check_close(normalize(z, 2.0, 1, 0.5), {0, 0, 0, 0.6, 0.8, 0}, 1e-15, 0, "eps below the norm");
  check_close(normalize(z, 2.0, 1, 10.0), {0, 0, 0, 0.3, 0.4, 0}, 1e-15, 0, "eps above the norm");
  Tensor zl = z.detach();
  zl.requires_grad_();
  sum(mul(normalize(zl), make_tensor({1, 2, 3, 0, 0, 0}, {2, 3}, kFloat64))).backward();
  check_close(zl.grad(), {1e12, 2e12, 3e12, 0, 0, 0}, 1e-12, 0, "zero row gradient: 1 / eps, the norm's none");
  for (double p : {2.0, 1.0, 3.0})
    check_gradcheck([p](const TensorList& in) { return normalize(in[0], p, 1); }, {leaf({3, 4}, 7)});
  CHECK(autograd::gradgradcheck([](const TensorList& in) { return normalize(in[0], 2.0, 0); }, {leaf({3, 4}, 8)}).ok);
}

TEST_CASE("cosine_similarity: broadcast operands, every dim, zero vectors, every dtype; gradients") {
  uint64_t seed = 20;
  struct Pair {
    Shape a, b;
    int64_t dim;
  };
  for (const Pair& pr : {Pair{{4, 6}, {4, 6}, 1}, Pair{{4, 6}, {6}, -1}, Pair{{2, 1, 5}, {3, 5}, 2},
                         Pair{{3, 4, 5}, {3, 4, 5}, 0}, Pair{{7}, {7}, 0}})
    for (DType dt : kAllFloat) {
      CAPTURE(shape_str(pr.a));
      CAPTURE(shape_str(pr.b));
      CAPTURE(dtype_name(dt));
      const Tensor a = random_tensor(pr.a, dt, ++seed, Layout::Transposed);
      const Tensor b = random_tensor(pr.b, dt, ++seed);
      const Tensor y = cosine_similarity(a, b, pr.dim);
      const Shape full = broadcast_shapes(pr.a, pr.b, "test");
      const int64_t d = pr.dim < 0 ? pr.dim + int64_t(full.size()) : pr.dim;
      const std::vector<double> av = broadcast_values(a, full), bv = broadcast_values(b, full);
      std::vector<double> expected;
      for_each_line(full, d, [&](int64_t base, int64_t step) {
        std::vector<double> u, v;
        for (int64_t k = 0; k < full[size_t(d)]; ++k) {
          u.push_back(av[size_t(base + k * step)]);
          v.push_back(bv[size_t(base + k * step)]);
        }
        const double nu = std::max(norm_of(u, 2), 1e-8), nv = std::max(norm_of(v, 2), 1e-8);
        double dot = 0;
        for (size_t k = 0; k < u.size(); ++k) dot += (u[k] / nu) * (v[k] / nv);
        expected.push_back(dot);
      });
      Shape out = full;
      out.erase(out.begin() + d);
      REQUIRE(y.sizes() == out);
      CHECK(y.dtype() == dt);
      check_close(y, expected, 4 * default_rtol(dt), 4 * default_rtol(dt), "cosine_similarity");
    }
  // A zero vector has similarity 0 with anything (torch: the same); two tiny equal vectors
  // (norm 1e-10 < eps) give 1e-4, as torch 1.13's normalize-first formula does.
  const Tensor a = make_tensor({1, 2, 3, 0, 0, 0, 1e-10, 0, 0}, {3, 3}, kFloat64);
  const Tensor b = make_tensor({2, 1, 0, 1, 1, 1, 1e-10, 0, 0}, {3, 3}, kFloat64);
  check_close(cosine_similarity(a, b), {4.0 / std::sqrt(14.0 * 5.0), 0.0, 1e-4}, 1e-12, 1e-18, "torch's values");
  check_gradcheck([](const TensorList& in) { return cosine_similarity(in[0], in[1], -1); },
                  {leaf({3, 4}, 30), leaf({4}, 31)});
  CHECK(autograd::gradgradcheck([](const TensorList& in) { return cosine_similarity(in[0], in[1], 0); },
                                {leaf({4, 3}, 32), leaf({4, 3}, 33)})
            .ok);
}

TEST_CASE("pairwise_distance: orders, broadcast, keepdim, 1-D and 0-d inputs; gradients") {
  uint64_t seed = 40;
  for (double p : {2.0, 1.0, 3.0, kInf})
    for (bool keepdim : {false, true}) {
      CAPTURE(p);
      CAPTURE(keepdim);
      const Tensor a = random_tensor({5, 4}, kFloat32, ++seed, Layout::Strided),
                   b = random_tensor({4}, kFloat32, ++seed);
      const Tensor y = pairwise_distance(a, b, p, 1e-6, keepdim);
      CHECK(y.sizes() == (keepdim ? Shape{5, 1} : Shape{5}));
      const std::vector<double> av = values_of(a), bv = values_of(b);
      std::vector<double> expected;
      for (int64_t r = 0; r < 5; ++r) {
        std::vector<double> diff;
        for (int64_t c = 0; c < 4; ++c) diff.push_back(av[size_t(r * 4 + c)] - bv[size_t(c)] + 1e-6);
        expected.push_back(norm_of(diff, p));
      }
      check_close(y, expected, 1e-5, 1e-6, "pairwise_distance");
    }
  // 1-D operands give a 0-d distance; identical rows give eps * n^(1/p), with a finite gradient.
  const Tensor v = make_tensor({1, 2, 3, 4}, {4}, kFloat64);
  const Tensor d = pairwise_distance(v, v);
  CHECK(d.dim() == 0);
  CHECK(d.item<double>() == doctest::Approx(2e-6).epsilon(1e-9));
  CHECK(pairwise_distance(scalar_tensor(3.0, kFloat64), scalar_tensor(1.0, kFloat64), 2.0, 0.0).item<double>() == 2.0);
  Tensor same = v.detach();
  same.requires_grad_();
  pairwise_distance(same, v).backward();
  for (double g : values_of(same.grad())) CHECK(std::isfinite(g));
  for (double p : {2.0, 1.5, kInf})
    check_gradcheck([p](const TensorList& in) { return pairwise_distance(in[0], in[1], p); },
                    {leaf({3, 5}, 50), leaf({3, 5}, 51)});
}

TEST_CASE("distances: autocast and errors") {
  {
    AutocastGuard amp(kCPU, kBFloat16);
    const Tensor a = random_tensor({3, 8}, kBFloat16, 60), b = random_tensor({3, 8}, kBFloat16, 61);
    CHECK(cosine_similarity(a, b).dtype() == kFloat32);  // PyTorch's float32 list
    CHECK(pairwise_distance(a, b).dtype() == kFloat32);  // the difference in float32 too
    CHECK(normalize(random_tensor({3, 8}, kFloat32, 62)).dtype() == kFloat32);
  }
  const Tensor x = random_tensor({3, 4}, kFloat32, 63);
  check_error([&] { normalize(make_tensor({1, 2}, {2}, kInt64)); }, {"normalize", "floating", "int64[2]"});
  check_error([&] { normalize(Tensor()); }, {"normalize", "undefined"});
  check_error([&] { normalize(scalar_tensor(1.0, kFloat32), 2.0, 0); }, {"normalize", "at least one dim"});
  check_error([&] { normalize(x, 2.0, 2); }, {"normalize", "dim"});
  check_error([&] { normalize(x, 2.0, 1, -1.0); }, {"normalize", "eps"});
  check_error([&] { cosine_similarity(x, random_tensor({5}, kFloat32, 64)); }, {"cosine_similarity", "[3, 4]", "[5]"});
  check_error([&] { cosine_similarity(x, Tensor()); }, {"cosine_similarity", "x2", "undefined"});
  check_error([&] { cosine_similarity(x, x, 3); }, {"cosine_similarity", "dim"});
  check_error(
      [&] {
        pairwise_distance(x, make_tensor({1, 2, 3, 4}, {4}, kInt32));
      },
      {"pairwise_distance", "x2", "int32[4]"});
  check_error([&] { pairwise_distance(x, x, 2.0, std::nan("")); }, {"pairwise_distance", "eps"});
}

TEST_CASE("triplet_margin_loss and cosine_embedding_loss: aten's formulas, reductions, swap, targets; gradients") {
  const Tensor a = random_tensor({4, 5}, kFloat64, 70), p = random_tensor({4, 5}, kFloat64, 71),
               n = random_tensor({4, 5}, kFloat64, 72, Layout::Transposed);
  const std::vector<double> av = values_of(a), pv = values_of(p), nv = values_of(n);
  auto dist = [](const std::vector<double>& u, const std::vector<double>& v, int64_t row) {
    std::vector<double> d;
    for (int64_t c = 0; c < 5; ++c) d.push_back(u[size_t(row * 5 + c)] - v[size_t(row * 5 + c)] + 1e-6);
    return norm_of(d, 2.0);
  };
  for (bool swap : {false, true}) {
    std::vector<double> per_row;
    for (int64_t r = 0; r < 4; ++r) {
      double d_neg = dist(av, nv, r);
      if (swap) d_neg = std::min(d_neg, dist(pv, nv, r));
      per_row.push_back(std::max(dist(av, pv, r) - d_neg + 0.7, 0.0));
    }
    double total = 0;
    for (double v : per_row) total += v;
    check_close(triplet_margin_loss(a, p, n, 0.7, 2.0, 1e-6, swap, Reduction::None), per_row, 1e-12, 1e-12, "none");
    CHECK(triplet_margin_loss(a, p, n, 0.7, 2.0, 1e-6, swap, Reduction::Sum).item<double>() ==
          doctest::Approx(total).epsilon(1e-12));
    CHECK(triplet_margin_loss(a, p, n, 0.7, 2.0, 1e-6, swap).item<double>() ==
          doctest::Approx(total / 4).epsilon(1e-12));
  }
  // cosine_embedding_loss: y = 1 pulls together, -1 pushes apart past the margin, 0 contributes 0.
  const Tensor x1 = random_tensor({4, 5}, kFloat64, 73), x2 = random_tensor({4, 5}, kFloat64, 74);
  const Tensor y = make_tensor({1, -1, 0, -1}, {4}, kInt64);
  const std::vector<double> u = values_of(x1), v = values_of(x2);
  std::vector<double> expected;
  const double targets[] = {1, -1, 0, -1};
  for (int64_t r = 0; r < 4; ++r) {
    double dot = 0, su = 0, sv = 0;
    for (int64_t c = 0; c < 5; ++c) {
      dot += u[size_t(r * 5 + c)] * v[size_t(r * 5 + c)];
      su += u[size_t(r * 5 + c)] * u[size_t(r * 5 + c)];
      sv += v[size_t(r * 5 + c)] * v[size_t(r * 5 + c)];
    }
    const double cos = dot / std::sqrt((su + 1e-12) * (sv + 1e-12));
    const double t = targets[r];
    expected.push_back(t == 1 ? 1 - cos : t == -1 ? std::max(cos - 0.1, 0.0) : 0.0);
  }
  check_close(cosine_embedding_loss(x1, x2, y, 0.1, Reduction::None), expected, 1e-12, 1e-12, "per row");
  check_close(cosine_embedding_loss(x1, x2, y.to(kFloat32), 0.1, Reduction::None), expected, 1e-12, 1e-12,
              "a float target");
  CHECK(cosine_embedding_loss(x1.select(0, 0), x2.select(0, 0), scalar_tensor(1.0, kInt64)).item<double>() ==
        doctest::Approx(expected[0]).epsilon(1e-12));
  CHECK(std::isnan(triplet_margin_loss(zeros({0, 3}, kFloat64), zeros({0, 3}, kFloat64), zeros({0, 3}, kFloat64))
                       .item<double>()));  // the mean of nothing, as torch
  // Gradients (the margins keep every row off its kink for these seeds).
  check_gradcheck([](const TensorList& in) { return triplet_margin_loss(in[0], in[1], in[2], 5.0, 2.0, 1e-6, true); },
                  {leaf({3, 4}, 80), leaf({3, 4}, 81), leaf({3, 4}, 82)});
  check_gradcheck(
      [y](const TensorList& in) { return cosine_embedding_loss(in[0], in[1], y, -1.0, Reduction::Sum); },
      {leaf({4, 5}, 83), leaf({4, 5}, 84)});
  check_error([&] { cosine_embedding_loss(x1, x2, make_tensor({1, -1}, {2}, kInt64)); },
              {"cosine_embedding_loss", "int64[2]", "(N)"});
  check_error([&] { cosine_embedding_loss(x1, random_tensor({4, 6}, kFloat64, 1), y); },
              {"cosine_embedding_loss", "[4, 5]", "[4, 6]"});
  check_error([&] { triplet_margin_loss(a, p, random_tensor({5}, kFloat64, 2)); },
              {"triplet_margin_loss", "same number of dims"});
}
