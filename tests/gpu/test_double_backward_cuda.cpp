// grad(..., {.create_graph = true}) on CUDA against the CPU (Note [Double backward]): a
// WGAN-GP penalty through an MLP and through a conv critic, a PINN residual, a
// Hessian-vector product through layer norm, GELU and cross entropy, and a penalty through
// causal attention (the fused kernels where they apply), each differentiated
// twice from the same float64 values on both devices; in float64 (the formulas alone) and
// float32 (with the devices' own kernels).
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// A program of leaves returning the tensors to compare (a loss's second-order gradients).
using Program = std::function<TensorList(const TensorList&)>;

/// Runs `program` on leaves made from the same values on the CPU and on CUDA in `dt`, and
/// compares every tensor it returns.
void compare(const std::string& what, const Program& program, const std::vector<Shape>& shapes, DType dt,
             double tolerance) {
  TensorList cpu, gpu;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const DevicePair p = random_pair(shapes[i], dt, 900 + i, Layout::Contiguous, -1.0, 1.0);
    cpu.push_back(p.cpu.requires_grad_());
    gpu.push_back(p.gpu.requires_grad_());
  }
  const TensorList want = program(cpu), got = program(gpu);
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {  // by max-norm: second derivatives sum long chains
    CAPTURE(what);
    CAPTURE(i);
    REQUIRE(got[i].device() == kGpu);
    REQUIRE(got[i].sizes() == want[i].sizes());
    const double scale = std::max(1.0, max_abs(want[i]));
    CHECK(max_abs(frugal::sub(got[i].detach().to(kCPU), want[i].detach())) <= tolerance * scale);
  }
}

TensorList gradient_penalty_mlp(const TensorList& t) {  // x, w1, b1, w2
  const Tensor x = t[0].detach().requires_grad_();
  const Tensor critic = frugal::linear(frugal::leaky_relu(frugal::linear(x, t[1], t[2]), 0.2), t[3]);
  const Tensor gx = autograd::grad({critic}, {x}, {ones_like(critic)}, {.create_graph = true})[0];
  const Tensor penalty = frugal::mean(frugal::square(frugal::sub(frugal::sqrt(frugal::sum(frugal::square(gx), {1})), 1.0)));
  TensorList out = autograd::grad({penalty}, {t[1], t[2], t[3]}, {}, {.allow_unused = true});
  out.push_back(penalty);
  return out;
}

TensorList gradient_penalty_conv(const TensorList& t) {  // x, w, b
  const Tensor x = t[0].detach().requires_grad_();
  const Tensor h = frugal::tanh(frugal::conv2d(x, t[1], t[2], {.stride = 2, .padding = 1}));
  const Tensor score = frugal::sum(h, {1, 2, 3});
  const Tensor gx = autograd::grad({score}, {x}, {ones_like(score)}, {.create_graph = true})[0];
  const Tensor penalty = frugal::mean(frugal::square(frugal::sum(frugal::square(gx), {1, 2, 3})));
  return autograd::grad({penalty}, {t[1], t[2]});
}

TensorList pinn_residual(const TensorList& t) {  // x points, w1, b1, w2
  const Tensor x = t[0].detach().requires_grad_();
  const Tensor u = frugal::linear(frugal::tanh(frugal::linear(x, t[1], t[2])), t[3]);
  const Tensor ux = autograd::grad({u}, {x}, {ones_like(u)}, {.create_graph = true})[0];
  const Tensor uxx = autograd::grad({ux}, {x}, {ones_like(ux)}, {.create_graph = true})[0];
  return autograd::grad({frugal::mean(frugal::square(frugal::add(uxx, u)))}, {t[1], t[2], t[3]});
}

TensorList hessian_vector(const TensorList& t) {  // x, w, v
  const Tensor target = from_vector(std::vector<int64_t>{0, 2, 1, 2}, {4}).to(t[0].device());
  const Tensor logits = frugal::matmul(frugal::gelu(frugal::layer_norm(t[0], {6})), t[1]);
  const Tensor loss = frugal::cross_entropy(logits, target, {.label_smoothing = 0.1});
  const Tensor gw = autograd::grad({loss}, {t[1]}, {}, {.create_graph = true})[0];
  return autograd::grad({frugal::sum(frugal::mul(gw, t[2].detach()))}, {t[0], t[1]});
}

TensorList attention_penalty(const TensorList& t) {  // q, k, v: the fused kernels where they apply
  const Tensor out = frugal::scaled_dot_product_attention(t[0], t[1], t[2], Tensor(), /*is_causal=*/true);
  const Tensor gq = autograd::grad({frugal::sum(frugal::square(out))}, {t[0]}, {}, {.create_graph = true})[0];
  return autograd::grad({frugal::sum(frugal::square(gq))}, {t[0], t[1], t[2]});
}

}  // namespace

TEST_CASE("double backward on CUDA: penalties, a PINN residual and a Hessian-vector product match the CPU") {
  const std::vector<std::pair<DType, double>> dtypes = {{kFloat64, 1e-10}, {kFloat32, 2e-4}};
  for (const auto& [dt, tolerance] : dtypes) {
    CAPTURE(dtype_name(dt));
    compare("MLP gradient penalty", gradient_penalty_mlp, {{5, 4}, {8, 4}, {8}, {1, 8}}, dt, tolerance);
    compare("conv gradient penalty", gradient_penalty_conv, {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}}, dt, tolerance);
    compare("PINN residual", pinn_residual, {{16, 1}, {12, 1}, {12}, {1, 12}}, dt, tolerance);
    compare("Hessian-vector product", hessian_vector, {{4, 6}, {6, 3}, {6, 3}}, dt, tolerance);
    compare("attention penalty", attention_penalty, {{1, 2, 8, 16}, {1, 2, 8, 16}, {1, 2, 8, 16}}, dt, tolerance);
  }
}
