// cat, stack, split and chunk on CUDA against the CPU ops on the same inputs: every dim,
// layout and copy width, many inputs, mixed dtypes and empties; mismatched devices; the
// differentiable ops, forward values and gradients (tests/gpu/autograd_check.h).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/join.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/ops/join.h"
#include "tests/gpu/autograd_check.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using frugal::detail::str_cat;

TEST_CASE("cuda join: cat on every dim and layout, each copy width") {
  for (DType dt : kFloatTypes) {
    for (int64_t dim : {0, 1, 2, -1}) {
      // Odd and even inner sizes give rows of 2 to 64 bytes: copy widths of 2, 4, 8 and 16 bytes.
      for (int64_t inner : {1, 3, 4, 7, 8}) {
        std::vector<Tensor> cpu, gpu;
        uint64_t seed = 0;
        for (Layout layout : kAllLayouts) {
          for (int64_t len : {2, 1, 3}) {
            Shape s = {3, 4, inner};
            s[size_t(dim < 0 ? dim + 3 : dim)] = len;
            const DevicePair p = random_pair(s, dt, ++seed, layout);
            cpu.push_back(p.cpu);
            gpu.push_back(p.gpu);
          }
        }
        check_same(ops::cat(gpu, dim), ops::cat(cpu, dim), 0.0,
                   str_cat("cat ", dtype_name(dt), " dim ", dim, " inner ", inner));
      }
    }
  }
}

TEST_CASE("cuda join: cat of many inputs, mixed dtypes, empties; stack; split and chunk") {
  std::vector<Tensor> cpu, gpu;
  for (int i = 0; i < 150; ++i) {  // three launches of the batched kernel
    const DevicePair p = random_pair({5, i % 5, 3}, i % 7 == 0 ? kFloat16 : kFloat32, uint64_t(i),
                                     i % 3 == 0 ? Layout::Strided : Layout::Contiguous);
    cpu.push_back(p.cpu);
    gpu.push_back(p.gpu);
  }
  cpu.push_back(empty({0}, {kBFloat16, kCPU}));  // skipped, promotes f16 + f32 + bf16 -> f32
  gpu.push_back(empty({0}, {kBFloat16, kGpu}));
  check_same(ops::cat(gpu, 1), ops::cat(cpu, 1), 0.0, "cat 150");
  const DevicePair a = random_pair({1000, 333}, kFloat16, 1), b = random_pair({1000, 1}, kFloat16, 2);
  check_same(ops::cat({a.gpu, b.gpu}, 1), ops::cat({a.cpu, b.cpu}, 1), 0.0, "cat large odd");
  check_same(ops::cat({a.gpu, a.gpu}, 0), ops::cat({a.cpu, a.cpu}, 0), 0.0, "cat large dim 0");

  for (DType dt : kFloatTypes) {
    for (int64_t dim : {0, 1, 2, -1}) {
      const DevicePair x = random_pair({3, 4}, dt, 3, Layout::Transposed), y = random_pair({3, 4}, dt, 4);
      check_same(ops::stack({x.gpu, y.gpu, x.gpu}, dim), ops::stack({x.cpu, y.cpu, x.cpu}, dim), 0.0,
                 str_cat("stack ", dtype_name(dt), " dim ", dim));
    }
  }
  const DevicePair x = random_pair({4, 10}, kFloat32, 5, Layout::Strided);
  const auto pg = ops::split(x.gpu, 4, 1), pc = ops::split(x.cpu, 4, 1);
  REQUIRE(pg.size() == 3);
  for (size_t i = 0; i < pg.size(); ++i) {
    CHECK(pg[i].shares_storage(x.gpu));
    check_same(pg[i], pc[i], 0.0, "split");
  }
  const auto cg = ops::chunk(x.gpu, 4, 1), cc = ops::chunk(x.cpu, 4, 1);
  REQUIRE(cg.size() == cc.size());
  for (size_t i = 0; i < cg.size(); ++i) check_same(cg[i], cc[i], 0.0, "chunk");
}

TEST_CASE("cuda join: mismatched devices are errors naming both tensors") {
  const Tensor g = zeros({2, 3}, {kFloat32, kGpu}), c = zeros({2, 3});
  check_error([&] { ops::cat({g, c}); }, {"cat", "one device", "cuda:0", "cpu"});
  check_error([&] { ops::stack({g, c}); }, {"stack", "one device"});
}

// ---- the differentiable ops on CUDA: autograd/ops/join.h --------------------------------

namespace {

std::vector<AutogradCase> autograd_join_cases() {
  using L = const TensorList&;
  std::vector<AutogradCase> cases;
  cases.push_back({"cat", {grad_input({3, 5}), const_input({2, 5}), grad_input({5, 4})}, [](L in) {
                     return cat({in[0], in[1], in[2].t()}, 0);
                   }});
  cases.push_back({"stack", {grad_input({3, 5}), grad_input({3, 5})}, [](L in) { return stack({in[0], in[1]}, 1); }});
  cases.push_back({"split partially used", {grad_input({7, 9})}, [](L in) { return mul(split(in[0], 4, 1)[1], 3.0); }});
  cases.push_back({"chunk", {grad_input({7, 9})}, [](L in) {
                     std::vector<Tensor> c = chunk(in[0], 3, 0);
                     return cat({square(c[2]), c[0]}, 0);
                   }});
  cases.push_back({"split_with_sizes", {grad_input({8, 3})}, [](L in) {
                     std::vector<Tensor> p = split_with_sizes(in[0], {2, 5, 1}, 0);
                     return add(p[0], p[0]) + p[2];
                   }});
  return cases;
}

}  // namespace

TEST_CASE("cuda autograd ops: cat, stack, split and chunk forward and gradients match the CPU") {
  run_autograd_cases(autograd_join_cases());
}
