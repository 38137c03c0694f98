// Copies on CUDA: transfers, copies between layouts and dtypes, broadcast and strided
// copies, each checked against the CPU path; copy_ recorded by autograd across devices;
// mismatched and bad devices.
#include <doctest/doctest.h>

#include <string>

#include "autograd/ops/operators.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
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

TEST_CASE("cuda: uint8 reads as numbers and copies in any layout, as on the CPU") {
  // Note [Reading uint8 as numbers]: pixels loaded from a U8 file, moved to the device, converted there.
  std::vector<double> bytes(6 * 7);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = double((i * 37) % 256);
  for (Layout l : kAllLayouts) {
    CAPTURE(layout_name(l));
    const Tensor host = make_tensor(bytes, {6, 7}, kUInt8, l), device = make_tensor(bytes, {6, 7}, {kUInt8, cuda()}, l);
    CHECK(bytes_of(device.contiguous()) == bytes_of(host.contiguous()));  // uint8 -> uint8 on the device
    for (DType to : {kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kBool})
      check_close(device.to(to), values_of(host.to(to)), 0, 0, std::string("uint8 to ") + dtype_name(to));
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

TEST_CASE("cuda: device mismatch and bad devices are clear errors") {
  Tensor a = zeros({2}, cuda());
  Tensor b = zeros({2});
  check_error([&] { ops::cpu::copy_kernel(a, b); }, {"copy_", "cuda:0", "cpu"});
  check_error([] { zeros({2}, cuda(64)); }, {"cuda:64"});
}

TEST_CASE("cuda autograd: copy_ across devices and dtypes sends the gradient back to the source's device") {
  Tensor src = random_tensor({3}, kFloat32, 7);  // on the CPU
  src.requires_grad_();
  Tensor h = zeros({2, 3}, {kFloat16, cuda()});
  h.copy_(src);  // broadcast, converted to float16, moved to the GPU
  const Tensor g = random_tensor({2, 3}, {kFloat16, cuda()}, 8);
  (h * 1.0).backward(g);
  REQUIRE(src.grad().device() == kCPU);
  REQUIRE(src.grad().dtype() == kFloat32);
  const std::vector<double> gv = values_of(g);
  check_close(values_of(src.grad()), {gv[0] + gv[3], gv[1] + gv[4], gv[2] + gv[5]}, 1e-3, 1e-3);
  check_close(values_of(h.detach()), values_of(src.detach().to(kFloat16).unsqueeze(0).expand({2, 3})), 0, 0);
}
