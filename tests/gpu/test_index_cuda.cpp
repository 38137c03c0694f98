// The index ops (index_select, gather, scatter_add, index_add, one_hot, embedding,
// embedding_backward) on CUDA against the CPU ops on the same inputs; out-of-range indices
// through the device flag; mismatched devices; the differentiable ops, forward values and
// gradients (tests/gpu/autograd_check.h).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/index.h"
#include "core/stream.h"
#include "tensor/factory.h"
#include "tensor/ops/index.h"
#include "tests/gpu/autograd_check.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using frugal::detail::str_cat;

namespace {

constexpr DType kIndexTypes[] = {kInt32, kInt64};

DevicePair index_pair(const Shape& s, int64_t hi, DType t, uint64_t seed, Layout layout = Layout::Contiguous) {
  std::vector<double> v = random_values(numel_of(s), seed, 0.0, double(hi));
  for (double& x : v) x = std::floor(x);
  return {make_tensor(v, s, {t, kCPU}, layout), make_tensor(v, s, {t, kGpu}, layout)};
}

double sum_tol(DType t) { return t == kFloat32 ? 1e-5 : t == kFloat64 ? 1e-12 : default_rtol(t); }

}  // namespace

TEST_CASE("cuda index: index_select, gather and embedding match the CPU") {
  const Shape shape = {4, 5, 6};
  for (DType dt : kFloatTypes) {
    for (DType it : kIndexTypes) {
      for (Layout layout : kAllLayouts) {
        const DevicePair x = random_pair(shape, dt, 11, layout);
        for (int64_t dim = 0; dim < 3; ++dim) {
          const std::string what = str_cat(dtype_name(dt), " ", dtype_name(it), " ", layout_name(layout), " dim ", dim);
          const DevicePair i1 = index_pair({9}, shape[size_t(dim)], it, uint64_t(dim) + 1, layout);
          check_same(ops::index_select(x.gpu, dim, i1.gpu), ops::index_select(x.cpu, dim, i1.cpu), 0.0,
                     "index_select " + what);
          Shape ishape = {3, 4, 5};
          ishape[size_t(dim)] = 8;
          const DevicePair ig = index_pair(ishape, shape[size_t(dim)], it, uint64_t(dim) + 7, layout);
          check_same(ops::gather(x.gpu, dim, ig.gpu), ops::gather(x.cpu, dim, ig.cpu), 0.0, "gather " + what);
        }
        const DevicePair w = random_pair({50, 96}, dt, 12, layout);
        const DevicePair ids = index_pair({16, 33}, 50, it, 13, layout);
        check_same(ops::embedding(w.gpu, ids.gpu), ops::embedding(w.cpu, ids.cpu), 0.0,
                   str_cat("embedding ", dtype_name(dt), " ", dtype_name(it), " ", layout_name(layout)));
      }
    }
  }
}

TEST_CASE("cuda index: scatter_add, index_add, embedding_backward and one_hot match the CPU") {
  const Shape shape = {4, 5, 6};
  for (DType dt : kFloatTypes) {
    const double tol = sum_tol(dt);
    for (DType it : kIndexTypes) {
      for (Layout layout : kAllLayouts) {
        for (int64_t dim = 0; dim < 3; ++dim) {
          const std::string what = str_cat(dtype_name(dt), " ", dtype_name(it), " ", layout_name(layout), " dim ", dim);
          const DevicePair self = random_pair(shape, dt, 21, layout);
          Shape sshape = {4, 6, 6}, ishape = {3, 4, 6};
          sshape[size_t(dim)] = 12;
          ishape[size_t(dim)] = 11;  // twice self's size along dim: duplicates certain
          const DevicePair src = random_pair(sshape, dt, 22, layout);
          const DevicePair idx = index_pair(ishape, shape[size_t(dim)], it, uint64_t(dim) + 23, layout);
          check_same(ops::scatter_add(self.gpu, dim, idx.gpu, src.gpu),
                     ops::scatter_add(self.cpu, dim, idx.cpu, src.cpu), tol, "scatter_add " + what);
          ops::scatter_add_(self.gpu, dim, idx.gpu, src.gpu);
          ops::scatter_add_(self.cpu, dim, idx.cpu, src.cpu);
          check_same(self.gpu, self.cpu, tol, "scatter_add_ " + what);

          Shape ashape = shape;
          ashape[size_t(dim)] = 10;
          const DevicePair asrc = random_pair(ashape, dt, 24, layout);
          const DevicePair aidx = index_pair({10}, shape[size_t(dim)], it, uint64_t(dim) + 25);
          check_same(ops::index_add(self.gpu, dim, aidx.gpu, asrc.gpu),
                     ops::index_add(self.cpu, dim, aidx.cpu, asrc.cpu), tol, "index_add " + what);
        }
        // Many lookups of few rows: heavy atomic contention on CUDA.
        const DevicePair ids = index_pair({64, 40}, 9, it, 26, layout);
        const DevicePair grad = random_pair({64, 40, 32}, dt, 27, layout);
        for (int64_t padding : {int64_t(-1), int64_t(4)}) {
          check_same(ops::embedding_backward(grad.gpu, ids.gpu, 9, padding),
                     ops::embedding_backward(grad.cpu, ids.cpu, 9, padding), tol * 8,
                     str_cat("embedding_backward ", dtype_name(dt), " ", dtype_name(it), " ", layout_name(layout),
                             " padding ", padding));
        }
      }
    }
  }
  for (DType it : kIndexTypes) {
    const DevicePair idx = index_pair({7, 5}, 6, it, 31, Layout::Transposed);
    check_same(ops::one_hot(idx.gpu), ops::one_hot(idx.cpu), 0.0, "one_hot inferred");
    check_same(ops::one_hot(idx.gpu, 9), ops::one_hot(idx.cpu, 9), 0.0, "one_hot 9");
  }
}

TEST_CASE("cuda index: an out-of-range index is a frugal::Error, and the device stays usable") {
  const Tensor x = zeros({3, 5}, {kFloat32, kGpu});
  for (DType it : kIndexTypes) {
    const TensorOptions io(it, kGpu);
    check_error(
        [&] {
          ops::index_select(x, 1, from_vector<int64_t>({0, 9, 1}, {3}, io));
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"index_select", "index 9", "[0, 5)", "position [1]"});
    check_error(
        [&] {
          ops::index_select(x, 0, from_vector<int64_t>({-1}, {1}, io));
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"index_select", "index -1"});
    check_error(
        [&] {
          ops::gather(x, 0, from_vector<int64_t>({0, 1, 2, 3, 0}, {1, 5}, io));
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"gather", "index 3", "[0, 3)", "position [0, 3]"});
    check_error(
        [&] {
          ops::scatter_add_(x, 0, from_vector<int64_t>({4}, {1, 1}, io), ones({1, 1}, {kFloat32, kGpu}));
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"scatter_add_", "index 4", "[0, 3)"});
    check_error(
        [&] {
          ops::index_add(x, 1, from_vector<int64_t>({5}, {1}, io), ones({3, 1}, {kFloat32, kGpu}));
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"index_add", "index 5", "[0, 5)"});
    check_error(
        [&] {
          ops::embedding(x, from_vector<int64_t>({0, 2, 3}, {3}, io));
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"embedding", "index 3", "position [2]"});
    const Tensor grad = ones({2, 4}, {kFloat32, kGpu});
    check_error(
        [&] {
          ops::embedding_backward(grad, from_vector<int64_t>({1, 6}, {2}, io), 6);
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"embedding_backward", "index 6", "[0, 6)", "position [1]"});
    check_error(
        [&] {
          ops::one_hot(from_vector<int64_t>({0, 3}, {2}, io), 3);
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"one_hot", "index 3"});
  }
  // Nothing was written out of bounds and the context is healthy: a later op works.
  synchronize(kGpu);
  const Tensor ok = ops::index_select(x, 1, from_vector<int64_t>({4, 0}, {2}, {kInt64, kGpu}));
  check_close(ok, std::vector<double>(6, 0.0), 0.0, 0.0, "after errors");
}

TEST_CASE("cuda index: mismatched devices are errors naming both tensors") {
  const Tensor g = zeros({2, 3}, {kFloat32, kGpu}), c = zeros({2, 3});
  const Tensor gi = zeros({2}, {kInt64, kGpu}), ci = zeros({2}, kInt64);
  check_error([&] { ops::index_select(g, 0, ci); }, {"index_select", "one device", "int64[2] cpu"});
  check_error([&] { ops::gather(c, 0, zeros({1, 1}, {kInt64, kGpu})); }, {"gather", "one device"});
  check_error([&] { ops::scatter_add(g, 0, zeros({1, 1}, {kInt64, kGpu}), c); }, {"scatter_add", "cpu", "cuda:0"});
  check_error([&] { ops::index_add(g, 0, gi, c); }, {"index_add", "cpu", "cuda:0"});
  check_error([&] { ops::embedding(g, ci); }, {"embedding", "one device"});
  check_error(
      [&] {
        ops::embedding_backward(zeros({2, 3}, {kFloat32, kGpu}), ci, 4);
      },
      {"embedding_backward", "one device"});
}

// ---- the differentiable ops on CUDA: autograd/ops/index.h -------------------------------

namespace {

std::vector<AutogradCase> autograd_index_cases() {
  using L = const TensorList&;
  std::vector<AutogradCase> cases;
  cases.push_back({"index_select", {grad_input({40, 7}), index_input({64}, 40)}, [](L in) {
                     return index_select(in[0], 0, in[1]);
                   }});
  cases.push_back(
      {"gather", {grad_input({30, 20}), index_input({30, 12}, 20)}, [](L in) { return gather(in[0], 1, in[1]); }});
  cases.push_back({"scatter_add", {grad_input({10, 20}), index_input({25, 20}, 10), grad_input({25, 20})}, [](L in) {
                     return scatter_add(in[0], 0, in[1], in[2]);
                   }});
  cases.push_back({"index_add", {grad_input({10, 6}), index_input({30}, 10), grad_input({30, 6})}, [](L in) {
                     return index_add(in[0], 0, in[1], in[2]);
                   }});
  cases.push_back({"embedding with padding", {grad_input({50, 16}), index_input({4, 33}, 50)}, [](L in) {
                     return embedding(in[0], in[1], /*padding_idx=*/3);
                   }});
  return cases;
}

}  // namespace

TEST_CASE("cuda autograd ops: the index ops and embedding forward and gradients match the CPU") {
  run_autograd_cases(autograd_index_cases());
}
