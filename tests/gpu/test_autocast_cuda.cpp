// Autocast on CUDA (Note [Autocast]): the independence of the CPU and CUDA states, and a
// small model's forward and backward under CUDA autocast against the same model under CPU
// autocast (same inputs and weights).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kLowDtypes[] = {kFloat16, kBFloat16};

Tensor gpu_leaf(const Tensor& cpu) {
  Tensor t = cpu.to(cuda());
  t.requires_grad_();
  return t;
}

Tensor cpu_leaf(const Tensor& cpu) {
  Tensor t = cpu.clone();
  t.requires_grad_();
  return t;
}

/// `got` (CUDA) close to `want` (CPU), within rtol of want's largest magnitude.
void check_same(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(got.defined(), what);
  REQUIRE_MESSAGE(want.defined(), what);
  CHECK_MESSAGE(got.device().is_cuda(), what);
  CHECK_MESSAGE(got.dtype() == want.dtype(), what);
  const std::vector<double> w = values_of(want);
  double peak = 1e-30;
  for (double v : w) peak = std::max(peak, std::fabs(v));
  check_close(values_of(got), w, 0.0, rtol * peak, what);
}

}  // namespace

TEST_CASE("autocast cuda: a CUDA guard leaves CPU tensors alone, a CPU guard CUDA tensors") {
  // Each op's dtype under CUDA autocast: the differentiable op table (tests/gpu/test_grad_table_cuda.cpp).
  const TensorOptions g{kFloat32, cuda()};
  const Tensor a = random_tensor({8, 16}, g, 1), w = random_tensor({12, 16}, g, 2);
  for (DType low : kLowDtypes) {
    CAPTURE(dtype_name(low));
    AutocastGuard amp(cuda(), low);
    CHECK(linear(a, w).dtype() == low);
    CHECK(linear(a.to(kCPU), w.to(kCPU)).dtype() == kFloat32);
    AutocastGuard cpu_amp(kCPU, low);
    AutocastGuard cuda_off(cuda(), low, /*enabled=*/false);
    CHECK(linear(a, w).dtype() == kFloat32);
  }
}

TEST_CASE("autocast cuda: a small model's forward and backward match CPU autocast") {
  const Tensor x = random_tensor({32, 24}, kFloat32, 1);
  const Tensor target = from_vector<int64_t>(std::vector<int64_t>(32, 3), {32}, kInt64);
  const std::vector<Tensor> init = {
      random_tensor({48, 24}, kFloat32, 2, Layout::Contiguous, -0.3, 0.3),  // w1
      random_tensor({48}, kFloat32, 3, Layout::Contiguous, -0.1, 0.1),      // b1
      random_tensor({48}, kFloat32, 4, Layout::Contiguous, 0.5, 1.5),       // ln gamma
      random_tensor({48}, kFloat32, 5, Layout::Contiguous, -0.1, 0.1),      // ln beta
      random_tensor({10, 48}, kFloat32, 6, Layout::Contiguous, -0.3, 0.3),  // w2
      random_tensor({10}, kFloat32, 7, Layout::Contiguous, -0.1, 0.1),      // b2
  };
  auto model = [](const Tensor& in, const std::vector<Tensor>& p) {
    const Tensor h = gelu(layer_norm(linear(in, p[0], p[1]), {48}, p[2], p[3]));
    const Tensor att = scaled_dot_product_attention(h.unsqueeze(0), h.unsqueeze(0), h.unsqueeze(0)).squeeze(0);
    return linear(att + h, p[4], p[5]);
  };
  for (DType low : kLowDtypes) {
    CAPTURE(dtype_name(low));
    std::vector<Tensor> pc, pg;
    for (const Tensor& t : init) pc.push_back(cpu_leaf(t)), pg.push_back(gpu_leaf(t));
    Tensor logits_c, logits_g, loss_c, loss_g;
    {
      AutocastGuard amp(kCPU, low);
      logits_c = model(x, pc);
      loss_c = cross_entropy(logits_c, target);
    }
    {
      AutocastGuard amp(cuda(), low);
      logits_g = model(x.to(cuda()), pg);
      loss_g = cross_entropy(logits_g, target.to(cuda()));
    }
    CHECK(logits_g.dtype() == low);
    const double tol = low == kFloat16 ? 2e-2 : 8e-2;
    check_same(logits_g, logits_c, tol, "logits");
    check_same(loss_g, loss_c, tol, "loss");
    loss_c.backward();
    loss_g.backward();
    for (size_t i = 0; i < init.size(); ++i) {
      CAPTURE(i);
      CHECK(pg[i].grad().dtype() == kFloat32);
      check_same(pg[i].grad(), pc[i].grad(), tol, "grad of param " + std::to_string(i));
    }
  }
}

TEST_CASE("autocast cuda: a linear's weight and input gradients come out of the GEMM in float32") {
  // Note [Weight gradients in the master dtype]: cuBLAS's 16-bit-in, float32-out GEMM. The
  // reference is the float64 product of the same low-dtype operands; a result rounded to
  // 16 bits would be ~2^-9 (float16) or ~2^-6 (bfloat16) of the largest entry away.
  const Tensor x = random_tensor({512, 256}, kFloat32, 31);
  const Tensor g_cpu = random_tensor({512, 128}, kFloat32, 32);
  for (DType low : kLowDtypes) {
    CAPTURE(dtype_name(low));
    Tensor w = gpu_leaf(random_tensor({128, 256}, kFloat32, 33, Layout::Contiguous, -0.5, 0.5));
    Tensor y;
    {
      AutocastGuard amp(cuda(), low);
      y = linear(x.to(cuda()), w) + linear(x.to(cuda()), w) * 2.0;  // two uses, one cached cast
    }
    REQUIRE(y.dtype() == low);
    const Tensor g = g_cpu.to(low);
    y.backward(g.to(cuda()));
    REQUIRE(w.grad().dtype() == kFloat32);
    const Tensor want = mul(ops::mm(g.to(kFloat64).t(), x.to(low).to(kFloat64)), 3.0).to(kFloat32);
    check_same(w.grad(), want, 1e-5, "w.grad vs float64 3 g^T x");
    // The input's gradient, when the input is a float32 activation cast for the product.
    Tensor xg = gpu_leaf(x);
    {
      AutocastGuard amp(cuda(), low);
      y = linear(xg, w);
    }
    y.backward(g.to(cuda()));
    REQUIRE(xg.grad().dtype() == kFloat32);
    check_same(xg.grad(), ops::mm(g.to(kFloat64), w.detach().cpu().to(low).to(kFloat64)).to(kFloat32), 1e-5,
               "x.grad vs float64 g w");
    // ops::mm itself, against the CPU's widened product.
    const Tensor a = x.to(low), b = g.t().contiguous();
    check_same(ops::mm(b.to(cuda()), a.to(cuda()), kFloat32), ops::mm(b, a, kFloat32), 1e-5, "mm float32 result");
  }
}
