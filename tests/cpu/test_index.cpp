// index_select, gather, scatter_add(_), index_add, one_hot, embedding and embedding_backward
// against naive loops in double, for every float dtype and both index dtypes; the
// differentiable ops (autograd/ops/index.h) through gradcheck in float64, duplicate indices
// and embedding's padding row.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/index.h"
#include "tensor/ops/unary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};
constexpr DType kIndexTypes[] = {kInt32, kInt64};

// n integers uniform in [0, hi), as doubles (duplicates are likely for small hi).
std::vector<double> random_ints(int64_t n, int64_t hi, uint64_t seed) {
  std::vector<double> v = random_values(n, seed, 0.0, double(hi));
  for (double& x : v) x = std::floor(x);
  return v;
}

// Tolerance for sums of a few values stored in dtype t (accumulated in float32 or wider, rounded once).
double sum_tol(DType t) { return t == kFloat32 ? 1e-5 : default_rtol(t); }

}  // namespace

TEST_CASE("index: index_select on every dim, dtype, index dtype and layout") {
  const Shape shape = {4, 5, 6};
  for (DType dt : kFloatTypes) {
    for (DType it : kIndexTypes) {
      for (Layout layout : kAllLayouts) {
        for (int64_t dim = -3; dim < 3; ++dim) {
          const int64_t d = dim < 0 ? dim + 3 : dim;
          const Tensor x = random_tensor(shape, dt, 11, layout);
          const std::vector<double> vx = values_of(x);
          const std::vector<double> vi = random_ints(7, shape[size_t(d)], uint64_t(d + 3));
          // A strided 1-D index (every other element of a longer tensor) for one of the layouts.
          const Layout index_layout = layout == Layout::Strided ? Layout::Strided : Layout::Contiguous;
          const Tensor index = make_tensor(vi, {7}, it, index_layout);
          const Tensor out = ops::index_select(x, dim, index);
          Shape expected = shape;
          expected[size_t(d)] = 7;
          REQUIRE(out.sizes() == expected);
          CHECK(out.dtype() == dt);
          std::vector<double> ref(size_t(out.numel()));
          for (int64_t i = 0; i < out.numel(); ++i) {
            std::vector<int64_t> idx = unravel(i, expected);
            idx[size_t(d)] = int64_t(vi[size_t(idx[size_t(d)])]);
            ref[size_t(i)] = vx[size_t(ravel(idx, shape))];
          }
          CAPTURE(dtype_name(dt));
          CAPTURE(dtype_name(it));
          CAPTURE(layout_name(layout));
          CAPTURE(dim);
          check_close(out, ref, 0.0, 0.0, "index_select");
        }
      }
    }
  }
  // 0-d index, 0-d input, empty index.
  const Tensor x = random_tensor({3, 4}, kFloat32, 2);
  const std::vector<double> vx = values_of(x);
  const Tensor r = ops::index_select(x, 0, scalar_tensor(2, kInt64));
  CHECK(r.sizes() == Shape{1, 4});
  check_close(r, std::vector<double>(vx.begin() + 8, vx.end()), 0.0, 0.0, "0-d index");
  const Tensor s = ops::index_select(scalar_tensor(3.5), 0, from_vector<int64_t>({0}));
  CHECK(s.dim() == 0);
  CHECK(s.item<float>() == 3.5f);
  CHECK(ops::index_select(x, 1, empty({0}, kInt64)).sizes() == Shape{3, 0});
}

TEST_CASE("index: gather on every dim, dtype, index dtype and layout") {
  const Shape shape = {4, 5, 6};
  for (DType dt : kFloatTypes) {
    for (DType it : kIndexTypes) {
      for (Layout layout : kAllLayouts) {
        for (int64_t dim = -3; dim < 3; ++dim) {
          const int64_t d = dim < 0 ? dim + 3 : dim;
          const Tensor x = random_tensor(shape, dt, 21, layout);
          const std::vector<double> vx = values_of(x);
          Shape ishape = {3, 4, 5};
          ishape[size_t(d)] = 7;  // larger than x along dim: allowed
          const std::vector<double> vi = random_ints(numel_of(ishape), shape[size_t(d)], uint64_t(d + 10));
          const Tensor index = make_tensor(vi, ishape, it, layout);
          const Tensor out = ops::gather(x, dim, index);
          REQUIRE(out.sizes() == ishape);
          std::vector<double> ref(size_t(out.numel()));
          for (int64_t i = 0; i < out.numel(); ++i) {
            std::vector<int64_t> idx = unravel(i, ishape);
            idx[size_t(d)] = int64_t(vi[size_t(i)]);
            ref[size_t(i)] = vx[size_t(ravel(idx, shape))];
          }
          CAPTURE(dtype_name(dt));
          CAPTURE(dtype_name(it));
          CAPTURE(layout_name(layout));
          CAPTURE(dim);
          check_close(out, ref, 0.0, 0.0, "gather");
        }
      }
    }
  }
  // 0-d input and index; empty index.
  CHECK(ops::gather(scalar_tensor(2.5), 0, scalar_tensor(0, kInt64)).item<float>() == 2.5f);
  CHECK(ops::gather(zeros({3, 4}), 1, empty({3, 0}, kInt32)).sizes() == Shape{3, 0});
}

TEST_CASE("index: scatter_add and scatter_add_ accumulate duplicates") {
  const Shape shape = {4, 5, 6};
  for (DType dt : kFloatTypes) {
    for (DType it : kIndexTypes) {
      for (Layout layout : kAllLayouts) {
        for (int64_t dim = -3; dim < 3; ++dim) {
          const int64_t d = dim < 0 ? dim + 3 : dim;
          const Tensor self = random_tensor(shape, dt, 31, layout);
          const std::vector<double> vs = values_of(self);
          Shape sshape = {4, 6, 6}, ishape = {3, 4, 6};
          sshape[size_t(d)] = 8;
          ishape[size_t(d)] = 7;  // more entries than self has along dim: duplicates certain
          const Tensor src = random_tensor(sshape, dt, 32, layout);
          const std::vector<double> vsrc = values_of(src);
          const std::vector<double> vi = random_ints(numel_of(ishape), shape[size_t(d)], uint64_t(d + 20));
          const Tensor index = make_tensor(vi, ishape, it, layout);
          std::vector<double> ref = vs;
          for (int64_t i = 0; i < numel_of(ishape); ++i) {
            const std::vector<int64_t> idx = unravel(i, ishape);
            std::vector<int64_t> to = idx;
            to[size_t(d)] = int64_t(vi[size_t(i)]);
            ref[size_t(ravel(to, shape))] += vsrc[size_t(ravel(idx, sshape))];
          }
          CAPTURE(dtype_name(dt));
          CAPTURE(dtype_name(it));
          CAPTURE(layout_name(layout));
          CAPTURE(dim);
          const double tol = sum_tol(dt);
          const Tensor out = ops::scatter_add(self, dim, index, src);
          CHECK(out.dtype() == dt);
          check_close(out, ref, tol, tol, "scatter_add");
          check_close(self, vs, 0.0, 0.0, "scatter_add leaves self");
          const uint64_t v0 = self.version();
          ops::scatter_add_(self, dim, index, src);  // in place, through the (maybe strided) view
          CHECK(self.version() > v0);
          check_close(self, ref, tol, tol, "scatter_add_");
        }
      }
    }
  }
  // Integer tensors accumulate exactly; an empty index changes nothing.
  const Tensor a = zeros({3}, kInt64);
  ops::scatter_add_(a, 0, from_vector<int32_t>({2, 2, 0, 2}), from_vector<int64_t>({1, 2, 3, 4}));
  CHECK(a.tolist<int64_t>() == std::vector<int64_t>{3, 0, 7});
  const Tensor b = ones({2, 2});
  check_close(ops::scatter_add(b, 1, empty({2, 0}, kInt64), ones({2, 2})), {1, 1, 1, 1}, 0.0, 0.0, "empty index");
}

TEST_CASE("index: index_add on every dim with duplicates") {
  const Shape shape = {5, 4, 3};
  for (DType dt : kFloatTypes) {
    for (DType it : kIndexTypes) {
      for (Layout layout : kAllLayouts) {
        for (int64_t dim = -3; dim < 3; ++dim) {
          const int64_t d = dim < 0 ? dim + 3 : dim;
          const Tensor self = random_tensor(shape, dt, 41, layout);
          const std::vector<double> vs = values_of(self);
          Shape sshape = shape;
          sshape[size_t(d)] = 9;
          const Tensor src = random_tensor(sshape, dt, 42, layout);
          const std::vector<double> vsrc = values_of(src);
          const std::vector<double> vi = random_ints(9, shape[size_t(d)], uint64_t(d + 30));
          const Tensor index = make_tensor(vi, {9}, it);
          std::vector<double> ref = vs;
          for (int64_t i = 0; i < numel_of(sshape); ++i) {
            std::vector<int64_t> idx = unravel(i, sshape);
            const double v = vsrc[size_t(i)];
            idx[size_t(d)] = int64_t(vi[size_t(idx[size_t(d)])]);
            ref[size_t(ravel(idx, shape))] += v;
          }
          CAPTURE(dtype_name(dt));
          CAPTURE(dtype_name(it));
          CAPTURE(layout_name(layout));
          CAPTURE(dim);
          const Tensor out = ops::index_add(self, dim, index, src);
          CHECK(out.dtype() == dt);
          check_close(out, ref, sum_tol(dt), sum_tol(dt), "index_add");
          check_close(self, vs, 0.0, 0.0, "index_add leaves self");
        }
      }
    }
  }
}

TEST_CASE("index: one_hot with given and inferred num_classes") {
  for (DType it : kIndexTypes) {
    const std::vector<double> vi = {3, 0, 1, 3, 2, 0};
    const Tensor index = make_tensor(vi, {2, 3}, it, Layout::Transposed);
    const std::vector<double> vt = values_of(index);
    for (int64_t c : {int64_t(-1), int64_t(4), int64_t(6)}) {
      const Tensor out = ops::one_hot(index, c);
      const int64_t n = c == -1 ? 4 : c;
      CHECK(out.dtype() == kInt64);
      REQUIRE(out.sizes() == Shape{2, 3, n});
      std::vector<double> ref(size_t(6 * n), 0.0);
      for (size_t i = 0; i < 6; ++i) ref[i * size_t(n) + size_t(vt[i])] = 1.0;
      check_close(out, ref, 0.0, 0.0, "one_hot");
    }
  }
  CHECK(ops::one_hot(scalar_tensor(2, kInt64), 3).tolist<int64_t>() == std::vector<int64_t>{0, 0, 1});
  CHECK(ops::one_hot(empty({0}, kInt64), 5).sizes() == Shape{0, 5});
}

TEST_CASE("index: embedding rows for any indices shape") {
  for (DType dt : kFloatTypes) {
    for (DType it : kIndexTypes) {
      for (Layout layout : kAllLayouts) {
        const Tensor weight = random_tensor({10, 6}, dt, 51, layout);
        const std::vector<double> vw = values_of(weight);
        const std::vector<double> vi = random_ints(12, 10, 52);
        const Tensor indices = make_tensor(vi, {3, 4}, it, layout);
        const std::vector<double> vt = values_of(indices);  // row-major order of the (maybe transposed) indices
        const Tensor out = ops::embedding(weight, indices);
        REQUIRE(out.sizes() == Shape{3, 4, 6});
        std::vector<double> ref;
        for (double v : vt)
          for (int64_t j = 0; j < 6; ++j) ref.push_back(vw[size_t(int64_t(v) * 6 + j)]);
        CAPTURE(dtype_name(dt));
        CAPTURE(dtype_name(it));
        CAPTURE(layout_name(layout));
        check_close(out, ref, 0.0, 0.0, "embedding");
      }
    }
  }
  const Tensor w = random_tensor({4, 3}, kFloat32, 1);
  const std::vector<double> vw = values_of(w);
  const Tensor r = ops::embedding(w, scalar_tensor(2, kInt32));
  CHECK(r.sizes() == Shape{3});
  check_close(r, {vw[6], vw[7], vw[8]}, 0.0, 0.0, "0-d indices");
  CHECK(ops::embedding(w, empty({2, 0}, kInt64)).sizes() == Shape{2, 0, 3});
}

TEST_CASE("index: embedding_backward sums duplicate rows and zeroes padding_idx") {
  for (DType dt : kFloatTypes) {
    for (DType it : kIndexTypes) {
      for (int64_t padding : {int64_t(-1), int64_t(3)}) {
        const std::vector<double> vi = random_ints(24, 7, 61);  // 24 lookups into 7 rows: many duplicates
        const Tensor indices = make_tensor(vi, {4, 6}, it);
        const Tensor grad = random_tensor({4, 6, 5}, dt, 62, Layout::Transposed);
        const std::vector<double> vg = values_of(grad);
        const Tensor out = ops::embedding_backward(grad, indices, 7, padding);
        CHECK(out.dtype() == dt);
        REQUIRE(out.sizes() == Shape{7, 5});
        std::vector<double> ref(35, 0.0);
        for (size_t k = 0; k < 24; ++k) {
          if (int64_t(vi[k]) == padding) continue;
          for (size_t j = 0; j < 5; ++j) ref[size_t(vi[k]) * 5 + j] += vg[k * 5 + j];
        }
        CAPTURE(dtype_name(dt));
        CAPTURE(dtype_name(it));
        CAPTURE(padding);
        check_close(out, ref, sum_tol(dt), sum_tol(dt), "embedding_backward");
        if (padding >= 0) check_close(out[padding], std::vector<double>(5, 0.0), 0.0, 0.0, "padding row");
      }
    }
  }
  // No lookups: all zeros.
  check_close(ops::embedding_backward(zeros({0, 3}), empty({0}, kInt64), 4), std::vector<double>(12, 0.0), 0.0, 0.0,
              "empty");
}

TEST_CASE("index: out-of-range and negative indices throw naming value, position and range") {
  const Tensor x = zeros({3, 5});
  for (DType it : kIndexTypes) {
    check_error(
        [&] {
          ops::index_select(x, 1, from_vector<int64_t>({0, 4, 5}, {3}, it));
        },
        {"index_select", "index 5", "dim 1 of input float32[3, 5] cpu", "[0, 5)", "position [2]"});
    check_error([&] { ops::index_select(x, 0, from_vector<int64_t>({-1}, {1}, it)); },
                {"index_select", "index -1", "[0, 3)", "position [0]"});
    check_error(
        [&] {
          ops::gather(x, 1, from_vector<int64_t>({0, 1, 2, 3, 9, 0}, {2, 3}, it));
        },
        {"gather", "index 9", "[0, 5)", "position [1, 1]"});
    check_error(
        [&] {
          ops::scatter_add(x, 0, from_vector<int64_t>({0, 3}, {1, 2}, it), ones({1, 2}));
        },
        {"scatter_add", "index 3", "dim 0 of self", "[0, 3)", "position [0, 1]"});
    check_error(
        [&] {
          ops::scatter_add_(x, 1, from_vector<int64_t>({-2}, {1, 1}, it), ones({1, 1}));
        },
        {"scatter_add_", "index -2", "[0, 5)", "position [0, 0]"});
    check_error(
        [&] {
          ops::index_add(x, 0, from_vector<int64_t>({1, 7}, {2}, it), ones({2, 5}));
        },
        {"index_add", "index 7", "[0, 3)", "position [1]"});
    check_error(
        [&] {
          ops::embedding(x, from_vector<int64_t>({0, 1, 2, 3}, {2, 2}, it));
        },
        {"embedding", "index 3", "weight float32[3, 5] cpu", "[0, 3)", "position [1, 1]"});
    check_error(
        [&] {
          ops::embedding_backward(ones({2, 2, 4}), from_vector<int64_t>({0, 1, 8, 2}, {2, 2}, it), 6);
        },
        {"embedding_backward", "index 8", "[0, 6)", "position [1, 0]"});
    check_error(
        [&] {
          ops::one_hot(from_vector<int64_t>({0, 1, 4}, {3}, it), 3);
        },
        {"one_hot", "index 4", "[0, 3)", "position [2]"});
    check_error(
        [&] {
          ops::one_hot(from_vector<int64_t>({0, -1}, {2}, it));
        },
        {"one_hot", "non-negative", "-1", "position [1]"});
  }
  // Empty dims and empty outputs still check every index.
  check_error([] { ops::index_select(zeros({0, 2}), 0, from_vector<int64_t>({0}, {1})); }, {"index_select", "[0, 0)"});
  check_error(
      [] {
        ops::index_select(zeros({4, 0}), 0, from_vector<int64_t>({1, 4}));
      },
      {"index_select", "index 4", "position [1]"});
  check_error([] { ops::gather(zeros({0}), 0, from_vector<int64_t>({2}, {1})); }, {"gather", "index 2", "[0, 0)"});
  check_error(
      [] {
        ops::embedding_backward(zeros({1, 0}), from_vector<int64_t>({5}, {1}), 4);
      },
      {"embedding_backward", "index 5", "[0, 4)"});
  check_error([] { ops::one_hot(from_vector<int64_t>({0}, {1}), 0); }, {"one_hot", "index 0", "[0, 0)"});
  // A failed scatter_add_ on a 16-bit tensor leaves it untouched (the sum runs in a float32 copy).
  const Tensor h = ones({3}, kFloat16);
  check_error([&] { ops::scatter_add_(h, 0, from_vector<int64_t>({0, 3}), ones({2}, kFloat16)); }, {"index 3"});
  check_close(h, {1, 1, 1}, 0.0, 0.0, "untouched");
}

TEST_CASE("index: check_index_range reports the first bad value at its row-major position in views") {
  auto message = [](int64_t value, int64_t position) {
    return "bad " + std::to_string(value) + " at " + std::to_string(position);
  };
  for (DType it : kIndexTypes) {
    CAPTURE(it);
    // (3, 2) stored transposed: logical row-major order 0 3 / 1 9 / 2 5, memory order 0 1 2 3 9 5.
    const Tensor index = from_vector<int64_t>({0, 1, 2, 3, 9, 5}, {2, 3}, it).t();
    ops::check_index_range(index, 10, message);  // every value in range: no error
    check_error([&] { ops::check_index_range(index, 9, message); }, {"bad 9 at 3"});
    check_error([&] { ops::check_index_range(index, 4, message); }, {"bad 9 at 3"});  // the first of 9 and 5
    check_error([&] { ops::check_index_range(ops::neg(index), 10, message); }, {"bad -3 at 1"});
    check_error([&] { ops::check_index_range(index, 0, message); }, {"bad 0 at 0"});
    ops::check_index_range(zeros({0, 4}, {it}), 0, message);  // nothing to check
    const Tensor expanded = from_vector<int64_t>({2}, {1}, it).expand({4});
    check_error([&] { ops::check_index_range(expanded, 2, message); }, {"bad 2 at 0"});
  }
  check_error([&] { ops::check_index_range(zeros({2}), 3, message); }, {"check_index_range", "int32 or int64"});
}

TEST_CASE("index: large gathers run on threads and report the first bad index") {
  const Tensor weight = random_tensor({50, 64}, kFloat32, 71, Layout::Transposed);
  const std::vector<double> vw = values_of(weight);
  std::vector<double> vi = random_ints(40 * 50, 50, 72);
  const Tensor out = ops::embedding(weight, make_tensor(vi, {40, 50}, kInt64));
  std::vector<double> ref;
  for (double v : vi)
    for (int64_t j = 0; j < 64; ++j) ref.push_back(vw[size_t(int64_t(v) * 64 + j)]);
  check_close(out, ref, 0.0, 0.0, "large embedding");
  // Two bad indices far apart (in different threads' ranges): the lower position is reported.
  vi[1999] = 77;
  vi[1234] = 50;
  check_error(
      [&] {
        ops::embedding(weight, make_tensor(vi, {40, 50}, kInt32));
      },
      {"embedding", "index 50", "position [24, 34]"});
}

TEST_CASE("index: argument errors name the op, shapes and dtypes") {
  const Tensor x = zeros({3, 5});
  const Tensor fi = zeros({2});  // float32 index
  check_error([&] { ops::index_select(x, 0, fi); }, {"index_select", "int32 or int64", "float32[2] cpu"});
  check_error([&] { ops::gather(x, 0, zeros({2, 2})); }, {"gather", "int32 or int64"});
  check_error([&] { ops::scatter_add(x, 0, zeros({1, 1}, kBool), x); }, {"scatter_add", "int32 or int64", "bool"});
  check_error([&] { ops::embedding(x, fi); }, {"embedding", "indices", "int32 or int64"});
  check_error([&] { ops::embedding_backward(x, fi, 3); }, {"embedding_backward", "int32 or int64"});
  check_error([&] { ops::one_hot(fi, 3); }, {"one_hot", "int32 or int64", "float32[2] cpu"});
  check_error([&] { ops::index_add(x, 0, fi, x); }, {"index_add", "int32 or int64"});
  // Wrong number of dims.
  check_error([&] { ops::index_select(x, 0, zeros({2, 2}, kInt64)); }, {"index_select", "1-D", "int64[2, 2] cpu"});
  check_error([&] { ops::gather(x, 0, zeros({2}, kInt64)); },
              {"gather", "int64[2] cpu", "as many dims", "float32[3, 5] cpu"});
  check_error([&] { ops::scatter_add(x, 0, zeros({2}, kInt64), x); }, {"scatter_add", "same number of dims"});
  check_error([&] { ops::embedding(zeros({5}), zeros({2}, kInt64)); }, {"embedding", "2-D", "float32[5] cpu"});
  check_error([&] { ops::index_add(x, 0, zeros({2, 1}, kInt64), x); }, {"index_add", "1-D"});
  // Shapes.
  check_error([&] { ops::gather(x, 0, zeros({2, 6}, kInt64)); }, {"gather", "larger than input", "dim 1"});
  check_error(
      [&] {
        ops::scatter_add(x, 0, zeros({2, 2}, kInt64), zeros({1, 2}));
      },
      {"scatter_add", "larger than src", "float32[1, 2] cpu"});
  check_error([&] { ops::scatter_add(x, 0, zeros({2, 6}, kInt64), zeros({2, 6})); }, {"scatter_add", "dim 1"});
  check_error(
      [&] {
        ops::index_add(x, 0, zeros({2}, kInt64), zeros({3, 5}));
      },
      {"index_add", "float32[3, 5] cpu", "index.numel() = 2"});
  check_error(
      [&] {
        ops::embedding_backward(zeros({2, 3}), zeros({3}, kInt64), 4);
      },
      {"embedding_backward", "indices.shape + [embedding_dim]", "float32[2, 3] cpu", "int64[3] cpu"});
  // Dtypes, dims, options.
  check_error(
      [&] {
        ops::scatter_add(x, 0, zeros({1, 1}, kInt64), zeros({1, 1}, kFloat64));
      },
      {"scatter_add", "one dtype", "float64[1, 1] cpu"});
  check_error([&] { ops::index_add(x, 0, zeros({3}, kInt64), zeros({3, 5}, kFloat16)); }, {"index_add", "one dtype"});
  check_error([&] { ops::scatter_add(zeros({2}, kBool), 0, zeros({1}, kInt64), zeros({1}, kBool)); },
              {"scatter_add", "bool"});
  check_error([&] { ops::index_select(x, 2, zeros({1}, kInt64)); }, {"index_select", "dim 2 out of range"});
  check_error([&] { ops::gather(x, -3, zeros({1, 1}, kInt64)); }, {"gather", "dim -3"});
  check_error([&] { ops::scatter_add_(zeros({1}).expand({4}), 0, zeros({1}, kInt64), zeros({1})); },
              {"scatter_add_", "overlapping"});
  check_error(
      [&] {
        ops::embedding_backward(zeros({2, 3}), zeros({2}, kInt64), 4, 4);
      },
      {"embedding_backward", "padding_idx 4", "[0, 4)"});
  check_error([&] { ops::embedding_backward(zeros({2, 3}), zeros({2}, kInt64), 4, -2); }, {"padding_idx -2"});
  check_error([] { ops::one_hot(empty({0}, kInt64)); }, {"one_hot", "infer", "empty"});
  check_error([] { ops::one_hot(zeros({2}, kInt64), -2); }, {"one_hot", "num_classes", "-2"});
  check_error([&] { ops::index_select(scalar_tensor(1.0), 0, zeros({2}, kInt64)); }, {"index_select", "0-d", "one"});
}

TEST_CASE("index: index -1 is an error for the accumulating ops, not the skipped padding row") {
  // The scatter-add kernel skips padding_idx's rows, with -1 meaning "no padding"; it
  // compared before it validated, so an index of -1 was skipped silently (a missing row
  // in index_add, scatter_add and embedding_backward, a zero row in one_hot).
  for (DType it : kIndexTypes) {
    const Tensor idx = from_vector<int64_t>({0, -1}, {2}, it);
    check_error([&] { ops::index_add(zeros({3, 2}), 0, idx, ones({2, 2})); }, {"index_add", "index -1", "[0, 3)"});
    check_error([&] { ops::scatter_add(zeros({3}), 0, idx, ones({2})); }, {"scatter_add", "index -1", "[0, 3)"});
    check_error([&] { ops::embedding_backward(ones({2, 4}), idx, 3); }, {"embedding_backward", "index -1"});
    check_error([&] { ops::one_hot(idx, 3); }, {"one_hot", "index -1"});
  }
  // padding_idx itself is still skipped, and only it.
  const Tensor g = ops::embedding_backward(ones({3, 2}), from_vector<int64_t>({1, 0, 1}, {3}), 3, 1);
  CHECK(values_of(g) == std::vector<double>{1, 1, 0, 0, 0, 0});
}

TEST_CASE("index: scatter_add_ reads a src or index that overlaps self as it was") {
  // self[index[i]] += src[i] with src = self: the serial kernel read entries it had
  // already added into (1 2 3 4 gave 11 3 6 10, not 5 3 5 7).
  const Tensor s = from_vector<float>({1, 2, 3, 4}, {4});
  ops::scatter_add_(s, 0, from_vector<int64_t>({1, 2, 3, 0}, {4}), s);
  CHECK(s.tolist<float>() == std::vector<float>{5, 3, 5, 7});
  const Tensor t = from_vector<int64_t>({0, 1, 0, 2}, {4});  // the index is self too
  ops::scatter_add_(t, 0, t, from_vector<int64_t>({1, 1, 1, 1}, {4}));
  CHECK(t.tolist<int64_t>() == std::vector<int64_t>{2, 2, 1, 2});
}

// ---- the differentiable ops: autograd/ops/index.h ---------------------------------------

namespace {

Tensor index_tensor(const std::vector<int64_t>& v, const Shape& shape) { return from_vector(v, shape); }

}  // namespace

TEST_CASE("autograd shape: index_select accumulates the gradients of duplicate indices") {
  // Gradchecks of index_select, gather, scatter_add and index_add (random indices, duplicates
  // included): the differentiable op table (tests/cpu/test_grad_table.cpp).
  const Tensor idx = index_tensor({2, 0, 2, 1}, {4});
  check_gradcheck([&](const TensorList& in) { return index_select(in[0], 0, index_tensor({0}, {})); },
                  {leaf({}, 72)});  // 0-d input and index
  Tensor x = leaf({3}, 81);
  sum(index_select(x, 0, idx)).backward();
  CHECK(values_of(x.grad()) == std::vector<double>{1, 1, 2});
}

TEST_CASE("autograd shape: embedding accumulates duplicates and leaves the padding row at zero") {
  const Tensor ids = index_tensor({3, 1, 3, 0, 1, 3}, {2, 3});
  check_gradcheck([&](const TensorList& in) { return embedding(in[0], ids); }, {leaf({5, 4}, 90)});
  Tensor w = leaf({5, 2}, 91);
  Tensor out = embedding(w, ids, /*padding_idx=*/1);
  CHECK(out.sizes() == Shape{2, 3, 2});
  // Forward still reads the padding row (PyTorch: padding_idx only affects the gradient).
  const std::vector<double> wv = values_of(w), ov = values_of(out);
  CHECK(ov[2] == wv[2]);
  CHECK(ov[3] == wv[3]);
  const Tensor g = random_tensor({2, 3, 2}, kFloat64, 92);
  out.backward(g);
  const std::vector<double> gv = values_of(g), gw = values_of(w.grad());
  // Row 3 appears at positions 0, 2, 5; row 0 at 3; row 1 (padding) at 1 and 4; rows 2, 4 never.
  for (int c = 0; c < 2; ++c) {
    CHECK(gw[size_t(3 * 2 + c)] ==
          doctest::Approx(gv[size_t(0 * 2 + c)] + gv[size_t(2 * 2 + c)] + gv[size_t(5 * 2 + c)]));
    CHECK(gw[size_t(0 * 2 + c)] == doctest::Approx(gv[size_t(3 * 2 + c)]));
    CHECK(gw[size_t(1 * 2 + c)] == 0.0);
    CHECK(gw[size_t(2 * 2 + c)] == 0.0);
    CHECK(gw[size_t(4 * 2 + c)] == 0.0);
  }
  check_error([&] { embedding(w, ids, 5); }, {"embedding", "padding_idx", "5"});
  check_error([&] { embedding(w, ids, -6); }, {"embedding", "padding_idx", "-6", "[-5, 5)"});
  // A negative padding_idx counts from the end, as torch.nn.functional.embedding: -2 is row 3.
  Tensor w2 = leaf({5, 2}, 93);
  sum(embedding(w2, ids, -2)).backward();
  for (int c = 0; c < 2; ++c) CHECK(values_of(w2.grad())[size_t(3 * 2 + c)] == 0.0);
  CHECK(values_of(w2.grad())[0] == 1.0);
  // one_hot is re-exported (not differentiable).
  CHECK(values_of(one_hot(index_tensor({1, 0}, {2}), 2)) == std::vector<double>{0, 1, 1, 0});
}
