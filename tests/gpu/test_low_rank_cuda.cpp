// LowRankLinear on CUDA against the CPU: forward and backward from the same parameters,
// and to_low_rank's conversion (the same rank and truncation error).
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "nn/linear.h"
#include "nn/low_rank.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("low_rank cuda: LowRankLinear forward, backward and to_low_rank match the CPU") {
  nn::LowRankLinear a(24, 16, 5);
  nn::LowRankLinear b(24, 16, 5);
  b.to(cuda());
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : a.state_dict()) state[name] = t;
  b.load_state_dict(state);
  const Tensor x_cpu = random_tensor({3, 4, 24}, kFloat32, 2).requires_grad_();
  const Tensor x_gpu = x_cpu.detach().to(cuda()).requires_grad_();
  const Tensor w = random_tensor({3, 4, 16}, kFloat32, 3);
  const Tensor y_cpu = a.forward(x_cpu), y_gpu = b.forward(x_gpu);
  check_close(y_gpu, values_of(y_cpu), 1e-5, 1e-5, "forward");
  sum(mul(y_cpu, w)).backward();
  sum(mul(y_gpu, w.to(cuda()))).backward();
  check_close(x_gpu.grad(), values_of(x_cpu.grad()), 1e-5, 1e-5, "grad x");
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    check_close(pb[i].second.grad(), values_of(pa[i].second.grad()), 1e-5, 1e-5, "grad " + pa[i].first);

  // Conversion on CUDA: the same spectrum, so the same rank and truncation error.
  nn::Linear layer(48, 32);
  auto lr_cpu = nn::to_low_rank(layer, nn::Energy{0.6});
  layer.to(cuda());
  auto lr_gpu = nn::to_low_rank(layer, nn::Energy{0.6});
  CHECK(lr_gpu->up->weight.device() == cuda());
  CHECK(lr_gpu->rank == lr_cpu->rank);
  CHECK(nn::relative_error(layer.weight, *lr_gpu) ==
        doctest::Approx(nn::relative_error(layer.weight, *lr_cpu)).epsilon(1e-4));
  const Tensor xl = random_tensor({6, 48}, kFloat32, 4);
  // The two SVDs agree to float32 accuracy relative to |W|, not to each output: an output
  // that cancels to near 0 carries the error of the outputs' scale.
  const Tensor expected = lr_cpu->forward(xl);
  check_close(lr_gpu->forward(xl.to(cuda())), values_of(expected), 1e-4, 1e-4 * max_abs(expected), "converted forward");
}
