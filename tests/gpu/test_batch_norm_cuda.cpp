// batch_norm (frugal's kernels) on CUDA against the CPU op on the same inputs: training and
// eval, the running statistics and every gradient through autograd, in float32, float16,
// bfloat16 and float64, up to ResNet-50's shapes (8 x 64 x 56 x 56); float32 parameters for
// float16 inputs; mismatched devices.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "autograd/ops/batch_norm.h"
#include "tensor/factory.h"
#include "tensor/ops/batch_norm.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda batch_norm: training and eval match the CPU, with running statistics and every gradient") {
  const Shape shapes[] = {{4, 3, 5, 6}, {16, 5}, {8, 64, 56, 56}, {32, 4, 64, 64}, {2, 2048, 7, 7}};
  uint64_t seed = 1;
  for (const Shape& xs : shapes)
    for (DType t : kFloatTypes)
      for (bool training : {true, false}) {
        CAPTURE(shape_str(xs));
        CAPTURE(dtype_name(t));
        CAPTURE(training);
        const int64_t C = xs[1];
        const DType st = t == kFloat64 ? kFloat64 : kFloat32;  // float32 parameters and statistics for 16-bit x
        const Tensor x = random_tensor(xs, kFloat64, ++seed, {}, -1.0, 3.0);
        const Tensor w = random_tensor({C}, st, ++seed), b = random_tensor({C}, st, ++seed);
        const Tensor rm = random_tensor({C}, st, ++seed), rv = random_tensor({C}, st, ++seed, {}, 0.5, 2.0);
        // Running statistics per device, updated by the forward.
        Tensor rm_cpu = rm.clone(), rv_cpu = rv.clone(), rm_gpu = rm.to(kGpu), rv_gpu = rv.to(kGpu);
        auto run = [&](Device d) {
          return forward_backward(
              [&](const std::vector<Tensor>& in) {
                const bool gpu = in[0].is_cuda();
                return batch_norm(in[0], gpu ? rm_gpu : rm_cpu, gpu ? rv_gpu : rv_cpu, in[1].to(st), in[2].to(st),
                                  training, 0.1, 1e-5);
              },
              {x, w, b}, random_tensor(xs, kFloat64, 999), t, d);
        };
        const std::vector<Tensor> gpu = run(kGpu), cpu = run(kCPU);
        const char* names[] = {"y", "grad_x", "grad_weight", "grad_bias"};
        // The parameters' leaves are in dtype t and converted to st inside f: their grads arrive in t.
        for (size_t i = 0; i < gpu.size(); ++i)
          check_dtype_norm_close(gpu[i], cpu[i], rtol_for(t) * 2, detail::str_cat("batch_norm ", names[i]));
        check_dtype_norm_close(rm_gpu, rm_cpu, rtol_for(st) * 2, "running_mean");
        check_dtype_norm_close(rv_gpu, rv_cpu, rtol_for(st) * 2, "running_var");
      }
  // Mixed precision: float16 x with float32 parameters held as leaves; their grads stay float32.
  Tensor xh = random_tensor({8, 16, 10, 10}, {kFloat16, kGpu}, 5);
  Tensor w = random_tensor({16}, {kFloat32, kGpu}, 6), b = random_tensor({16}, {kFloat32, kGpu}, 7);
  w.requires_grad_();
  b.requires_grad_();
  Tensor y = batch_norm(xh, Tensor(), Tensor(), w, b, true);
  y.backward(ones_like(y));
  CHECK(w.grad().dtype() == kFloat32);
  CHECK(w.grad().device() == kGpu);
  check_error([&] { ops::batch_norm(xh, Tensor(), Tensor(), w.detach().cpu(), Tensor(), true); },
              {"batch_norm", "cuda", "cpu"});
}
