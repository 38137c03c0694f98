// gelu_mlp (autograd/ops/matmul.h): fc2(gelu_tanh(fc1(x))) as one op, against the composed ops
// in float64 and by finite differences, with the inputs users pass (3-D, transposed and strided
// views, no biases, an empty batch, odd sizes); the fused backward op declines on the CPU;
// bad operands are errors naming the op; a selective checkpoint keeps its outputs. The CUDA
// epilogues: tests/gpu/test_gelu_mlp_cuda.cpp.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/unary.h"
#include "memory/trace.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/unary.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/gelu_mlp_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("gelu_mlp cpu: equals linear, gelu_tanh, linear in float64 and float32") {
  const MlpCase cases[] = {{{5, 7}, 9, 3, Layout::Contiguous, true, true},
                           {{2, 3, 8}, 16, 8, Layout::Contiguous, true, true},
                           {{6, 8}, 16, 5, Layout::Transposed, false, true},
                           {{4, 5}, 6, 7, Layout::Strided, true, false},
                           {{1, 3}, 4, 2, Layout::Contiguous, false, false},
                           {{0, 4}, 8, 3, Layout::Contiguous, true, true},
                           // size-0 feature dims: in, hidden, out
                           {{3, 0}, 4, 2, Layout::Contiguous, true, true},
                           {{3, 4}, 0, 2, Layout::Contiguous, true, true},
                           {{2, 2, 4}, 5, 0, Layout::Contiguous, true, true}};
  uint64_t seed = 10;
  for (DType dt : {kFloat64, kFloat32})
    for (const MlpCase& c : cases) {
      CAPTURE(dtype_name(dt));
      CAPTURE(shape_str(c.x));
      CAPTURE(layout_name(c.layout));
      const MlpInputs in = mlp_inputs(c, {dt}, seed += 8);
      check_mlp_values(fused_mlp_values(in), composed_mlp_reference(in), dt == kFloat64 ? 1e-12 : 1e-5,
                       dt == kFloat64 ? 1e-12 : 1e-5);
    }
}

TEST_CASE("gelu_mlp cpu: gradcheck against finite differences") {
  const MlpInputs in = mlp_inputs({{3, 4}, 6, 5, Layout::Contiguous, true, true}, {kFloat64}, 90);
  TensorList leaves{in.x, in.w1, in.b1, in.w2, in.b2};
  for (Tensor& t : leaves) t = t.detach().requires_grad_();
  check_gradcheck([](const TensorList& t) { return gelu_mlp(t[0], t[1], t[2], t[3], t[4]); }, leaves);
}

TEST_CASE("gelu_mlp cpu: the fused ops fall back to the composed ones; bad operands are errors") {
  const Tensor g = random_tensor({5, 3}, kFloat32, 1), w = random_tensor({3, 8}, kFloat32, 2);
  const Tensor pre = random_tensor({5, 8}, kFloat32, 3);
  CHECK_FALSE(ops::matmul_gelu_tanh_backward(g, w, pre, true).pre.defined());  // no fused kernel on the CPU
  const Tensor b = random_tensor({3}, kFloat32, 4);
  const ops::LinearGelu r = ops::linear_gelu_tanh(pre, w, b);
  CHECK(values_of(r.pre) == values_of(ops::linear(pre, w, b)));
  CHECK(values_of(r.out) == values_of(ops::gelu_tanh(r.pre)));
  check_error([&] { ops::matmul_gelu_tanh_backward(g, w, pre.narrow(1, 0, 7), true); },
              {"matmul_gelu_tanh_backward", "[5, 7]"});
  const Tensor x = random_tensor({5, 7}, kFloat32, 5), w1 = random_tensor({9, 7}, kFloat32, 6);
  const Tensor w2 = random_tensor({3, 9}, kFloat32, 7);
  check_error([&] { gelu_mlp(x, w1.narrow(1, 0, 6), Tensor(), w2, Tensor()); }, {"gelu_mlp", "[5, 7]", "[9, 6]"});
  check_error([&] { gelu_mlp(x, w1, Tensor(), w2.narrow(1, 0, 8), Tensor()); }, {"gelu_mlp", "[9, 7]", "[3, 8]"});
  check_error([&] { gelu_mlp(x, w1, random_tensor({8}, kFloat32, 8), w2, Tensor()); }, {"gelu_mlp", "bias", "[8]"});
  check_error([&] { gelu_mlp(x, w1, Tensor(), w2, random_tensor({8}, kFloat32, 9)); },
              {"gelu_mlp", "fc2's bias", "[8]"});
  check_error([&] { ops::linear_gelu_tanh(x, w1.narrow(1, 0, 6)); }, {"linear_gelu_tanh", "[5, 7]", "[9, 6]"});
}

TEST_CASE("gelu_mlp cpu: a selective checkpoint keeps its outputs; its recompute runs no GEMM") {
  const MlpInputs in = mlp_inputs({{6, 8}, 16, 8, Layout::Contiguous, true, true}, {kFloat64}, 200);
  TensorList params{in.w1, in.b1, in.w2, in.b2};
  for (Tensor& p : params) p = p.detach().requires_grad_();
  auto block = [&](const Tensor& h) { return tanh(gelu_mlp(h, params[0], params[1], params[2], params[3])); };
  // The gradients of x and the parameters, and the allocations gelu_mlp made in the backward
  // (the trace names each allocation's op: a kept call allocates nothing).
  auto run = [&](std::optional<CheckpointPolicy> policy) {
    for (Tensor& p : params) p.set_grad(Tensor());
    Tensor x = in.x.detach().requires_grad_();
    const Tensor y = policy ? checkpoint(block, x, *policy) : block(x);
    memory::enable_trace(kCPU);
    y.backward(in.g);
    int64_t gelu_mlp_allocations = 0;
    for (const memory::TraceEvent& e : memory::trace_events(kCPU))
      gelu_mlp_allocations += e.action == memory::TraceAction::Alloc && std::string(e.op) == "gelu_mlp";
    memory::disable_trace(kCPU);
    std::vector<std::vector<double>> grads{values_of(x.grad())};
    for (const Tensor& p : params) grads.push_back(values_of(p.grad()));
    return std::pair{grads, gelu_mlp_allocations};
  };
  const auto plain = run(std::nullopt), full = run(CheckpointPolicy::Full),
             selective = run(CheckpointPolicy::Selective);
  for (size_t i = 0; i < plain.first.size(); ++i) {
    check_close(full.first[i], plain.first[i], 1e-12, 1e-12, "full checkpoint");
    check_close(selective.first[i], plain.first[i], 1e-12, 1e-12, "selective checkpoint");
  }
  CHECK(full.second > 0);        // the full recompute runs gelu_mlp's forward again
  CHECK(selective.second == 0);  // the selective one takes its kept outputs
}
