// CUDA tensor core: transfers, copies between layouts and dtypes, fill, and the
// Philox stream (same numbers as the CPU), each checked against the CPU path.
#include <doctest/doctest.h>

#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda: host <-> device round trip in every dtype and layout") {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
    for (Layout layout : kAllLayouts) {
      CAPTURE(dtype_name(t));
      CAPTURE(layout_name(layout));
      std::vector<double> vals = random_values(6 * 7, 11, -50, 50);
      for (auto& v : vals) v = t == kBool ? double(v > 0) : std::round(v);  // exact in every dtype
      Tensor host = make_tensor(vals, {6, 7}, t, layout);
      Tensor dev = host.to(cuda());
      CHECK(dev.device() == cuda());
      check_close(dev, vals, 0, 0, "to(cuda)");
      Tensor dev_layout = make_tensor(vals, {6, 7}, {t, cuda()}, layout);
      check_close(dev_layout.cpu(), vals, 0, 0, "to(cpu)");
    }
  }
}

TEST_CASE("cuda: dtype conversion matches the CPU bit for bit") {
  const std::vector<double> vals = random_values(4097, 3, -1000, 1000);
  for (DType from : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    for (DType to : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
      CAPTURE(dtype_name(from));
      CAPTURE(dtype_name(to));
      Tensor src = make_tensor(vals, {4097}, from);
      Tensor on_cpu = src.to(to);
      Tensor on_gpu = src.to(cuda()).to(to);
      check_close(on_gpu, values_of(on_cpu), 0, 0, "conversion");
    }
  }
}

TEST_CASE("cuda: strided and broadcast copies, large tensors use the vectorized path") {
  for (DType t : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
    CAPTURE(dtype_name(t));
    Tensor src = random_tensor({33, 65}, {t, cuda()}, 5, Layout::Transposed);
    Tensor dst = zeros({65, 66}, {t, cuda()}).slice(1, 0, 66, 2).t().slice(1, 0, 65);  // (33, 65) strided
    CHECK_FALSE(dst.is_contiguous());
    dst.copy_(src);
    check_close(dst, values_of(src), 0, 0, "strided copy");
    Tensor row = random_tensor({65}, {t, cuda()}, 6);
    Tensor b = empty({7, 65}, {t, cuda()});
    b.copy_(row);
    const std::vector<double> rv = values_of(row), bv = values_of(b);
    for (size_t i = 0; i < bv.size(); ++i) REQUIRE(bv[i] == rv[i % 65]);
  }
  Tensor big = random_tensor({1 << 20}, {kFloat32, cuda()}, 9);
  Tensor half_big = big.to(kFloat16);
  check_close(half_big, values_of(big.cpu().to(kFloat16)), 0, 0, "1M-element f32 -> f16");
  Tensor odd = big.slice(0, 1, (1 << 20) - 1);  // misaligned start: scalar fallback
  check_close(odd.clone(), values_of(odd), 0, 0, "misaligned clone");
}

TEST_CASE("cuda: fill and factories") {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool}) {
    Tensor x = full({3, 5}, 1.0, {t, cuda()});
    check_close(x, std::vector<double>(15, 1.0), 0, 0, dtype_name(t));
    ops::fill_(x.slice(1, 0, 5, 2), 0.0);
    const std::vector<double> v = values_of(x);
    for (int i = 0; i < 15; ++i) REQUIRE(v[i] == ((i % 5) % 2 == 0 ? 0.0 : 1.0));
  }
  check_close(eye(3, 3, {kFloat16, cuda()}), values_of(eye(3)), 0, 0, "eye");
  check_close(arange(0.0, 10.0, 0.5, {kBFloat16, cuda()}), values_of(arange(0.0, 10.0, 0.5)), 0, 0, "arange");
}

TEST_CASE("cuda: Philox stream is the same on CPU and GPU") {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    Generator gc(99), gg(99);
    check_close(rand({1000, 3}, {t, cuda()}, &gg), values_of(rand({1000, 3}, t, &gc)), 0, 0, "rand");
    // randn uses logf/sinf/cosf whose last bits may differ between libm and CUDA.
    check_close(randn({5001}, {t, cuda()}, &gg), values_of(randn({5001}, t, &gc)), default_rtol(t), 1e-5, "randn");
  }
  Generator gc(3), gg(3);
  check_close(randint(0, 1000, {4096}, {kInt64, cuda()}, &gg), values_of(randint(0, 1000, {4096}, kInt64, &gc)), 0, 0,
              "randint");
}

TEST_CASE("cuda: device mismatch and bad devices are clear errors") {
  Tensor a = zeros({2}, cuda());
  Tensor b = zeros({2});
  check_error([&] { ops::cpu::copy_kernel(a, b); }, {"copy_", "cuda:0", "cpu"});
  check_error([] { zeros({2}, cuda(64)); }, {"cuda:64"});
}
