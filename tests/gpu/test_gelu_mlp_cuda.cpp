// gelu_mlp on CUDA (Note [GELU epilogues] in tensor/cuda/matmul.cu): the GELU inside fc1's GEMM
// (CUBLASLT_EPILOGUE_GELU_AUX_BIAS) and its derivative with b1's gradient inside the backward's
// (DGELU_BGRAD), against the composed ops in float64 on the CPU from the same values, in
// float32, float16 and bfloat16, with 3-D, transposed and bias-free inputs, with each choice of
// ops::set_gelu_epilogues. The raw kernels are called directly to show that the epilogues
// really run on the shapes they take and decline the others (hidden % 8 != 0, M = 1, and the
// bfloat16 forward with a bias, which cuBLASLt takes only in bfloat16, added after the
// rounding: Note [Linear bias epilogue]), which gelu_mlp then composes; and under autocast
// the float32 master weights get float32 gradients.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/autocast.h"
#include "autograd/ops/matmul.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"
#include "tests/gelu_mlp_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// Tolerance of a low-precision result against float64, relative to the largest |value|.
double tol_for(DType t) { return t == kFloat32 ? 1e-5 : t == kFloat16 ? 1e-2 : 5e-2; }

void check_near(const std::vector<double>& a, const std::vector<double>& e, double tol, const std::string& what) {
  REQUIRE_MESSAGE(a.size() == e.size(), what, ": ", a.size(), " values vs ", e.size());
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(a[i] - e[i])), scale = std::max(scale, std::fabs(e[i]));
  CHECK_MESSAGE(worst <= tol * scale, what, ": max |error| ", worst, " against max |value| ", scale);
}

void check_near(const MlpValues& a, const MlpValues& e, double tol) {
  for_each_mlp_value(a, e, [&](const std::vector<double>& got, const std::vector<double>& want, const char* what) {
    check_near(got, want, tol, what);
  });
}

}  // namespace

TEST_CASE("gelu_mlp cuda: the epilogues' results equal the composed ops in float64") {
  struct Case {
    MlpCase mlp;
    bool fused;  // whether both epilogues take the shape
  };
  const Case cases[] = {{{{64, 48}, 128, 40, Layout::Contiguous, true, true}, true},
                        {{{2, 33, 64}, 96, 24, Layout::Contiguous, true, true}, true},
                        {{{64, 48}, 128, 40, Layout::Transposed, false, false}, true},
                        {{{37, 24}, 100, 16, Layout::Contiguous, true, true}, false},  // hidden % 8 != 0
                        {{{1, 24}, 64, 16, Layout::Contiguous, true, true}, false}};   // M = 1
  uint64_t seed = 100;
  for (DType dt : {kFloat32, kFloat16, kBFloat16})
    for (const Case& c : cases) {
      const std::string what = detail::str_cat(dtype_name(dt), " x ", shape_str(c.mlp.x), " ",
                                               layout_name(c.mlp.layout), " hidden ", c.mlp.hidden);
      CAPTURE(what);
      const MlpInputs in = mlp_inputs(c.mlp, {dt, cuda()}, seed += 8);
      const MlpValues ref = composed_mlp_reference(in);
      for (bool forward : {false, true})
        for (bool backward : {false, true}) {
          CAPTURE(forward);
          CAPTURE(backward);
          ops::set_gelu_epilogues({forward, backward});
          check_near(fused_mlp_values(in), ref, tol_for(dt));
        }
      ops::set_gelu_epilogues({true, true});

      // The raw kernels, called as gelu_mlp calls them: they run (and give the composed values) or decline.
      const int64_t M = in.x.numel() / in.x.size(-1), H = c.mlp.hidden;
      const Tensor x2 = in.x.reshape({M, in.x.size(-1)}), g2 = in.g.reshape({M, c.mlp.out});
      const Tensor out = empty({M, H}, {dt, cuda()}), pre = empty({M, H}, {dt, cuda()});
      const Tensor b1 = in.b1.defined() ? in.b1.contiguous() : Tensor();
      const bool forward_fused = c.fused && !(dt == kBFloat16 && b1.defined());
      REQUIRE(ops::cuda::linear_gelu_tanh_kernel(out, pre, x2, in.w1.t(), b1) == forward_fused);
      const Tensor pre_ref =
          ops::linear(x2.to(kCPU, kFloat64), in.w1.to(kCPU, kFloat64), b1.defined() ? b1.to(kCPU, kFloat64) : Tensor());
      if (forward_fused) {
        check_near(values_of(pre), values_of(pre_ref), tol_for(dt), "epilogue pre-activation");
        check_near(values_of(out), values_of(ops::gelu_tanh(pre_ref)), tol_for(dt), "epilogue GELU");
      }
      const ops::GeluGrads d = ops::matmul_gelu_tanh_backward(g2, in.w2, pre_ref.to(cuda(), dt), true);
      REQUIRE(d.pre.defined() == c.fused);
      {
        ops::set_gelu_epilogues({true, false});  // off (the default): the raw op declines
        CHECK_FALSE(ops::matmul_gelu_tanh_backward(g2, in.w2, pre_ref.to(cuda(), dt), true).pre.defined());
        ops::set_gelu_epilogues({true, true});
      }
      if (c.fused) {
        const Tensor pre64 = pre_ref.to(cuda(), dt).to(kCPU, kFloat64);  // the values the epilogue read
        const Tensor want = ops::unary_backward(ops::UnaryOp::GeluTanh,
                                                ops::mm(g2.to(kCPU, kFloat64), in.w2.to(kCPU, kFloat64)), pre64);
        CHECK(d.pre.dtype() == dt);
        CHECK(d.bias.dtype() == dt);
        check_near(values_of(d.pre), values_of(want), tol_for(dt), "epilogue dGELU");
        check_near(values_of(d.bias), values_of(ops::sum(want, {0})), tol_for(dt), "epilogue bias gradient");
      }
      ops::set_gelu_epilogues({});
    }
}

TEST_CASE("gelu_mlp cuda: under float16 autocast the float32 master weights get float32 gradients") {
  const MlpInputs in = mlp_inputs({{4, 16, 32}, 128, 32, Layout::Contiguous, true, true}, {kFloat32, cuda()}, 300);
  Tensor x = in.x.detach().requires_grad_(), w1 = in.w1.detach().requires_grad_(), b1 = in.b1.detach().requires_grad_();
  Tensor w2 = in.w2.detach().requires_grad_(), b2 = in.b2.detach().requires_grad_();
  Tensor y;
  {
    AutocastGuard amp(cuda(), kFloat16);
    y = gelu_mlp(x, w1, b1, w2, b2);
  }
  REQUIRE(y.dtype() == kFloat16);
  y.backward(in.g.to(kFloat16));
  for (const Tensor* t : {&x, &w1, &b1, &w2, &b2}) CHECK(t->grad().dtype() == kFloat32);
  // Against the composed ops on the float16-rounded operands, as autocast hands them over.
  MlpInputs lowered{in.x.to(kFloat16),  in.w1.to(kFloat16), in.b1.to(kFloat16),
                    in.w2.to(kFloat16), in.b2.to(kFloat16), in.g.to(kFloat16)};
  const MlpValues ref = composed_mlp_reference(lowered);
  check_near({values_of(y), values_of(x.grad()), values_of(w1.grad()), values_of(b1.grad()), values_of(w2.grad()),
              values_of(b2.grad())},
             ref, tol_for(kFloat16));
}
