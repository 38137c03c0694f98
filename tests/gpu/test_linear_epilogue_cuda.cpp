// cuBLASLt epilogues for linear (tensor/cuda/matmul.cu): the bias gradient from the
// weight-gradient GEMM (Note [Bias gradient epilogue]) against the separate GEMM + reduction,
// the CPU and float64; linear + tanh GELU in one GEMM (Note [GELU epilogue], Note [Fused
// linear and GELU]) against the two ops and float64, and where it falls back; the transformer
// MLP (linear, GELU, linear) forward and backward against float64, plain and under autocast.
#include <doctest/doctest.h>

#include <algorithm>
#include <any>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/unary.h"
#include "autograd/recompute_cheap.h"
#include "autograd/saved_tensor.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

struct Dims {
  int64_t M, N, K;  // rows, out_features, in_features
};

// A sum of M products of values in [-2, 2], rounded once to `t`: the rounding of the largest
// partial sums (about sqrt(M) times a product) plus the order of the float32 sum.
double sum_atol(DType t, int64_t M) { return 4 * default_rtol(t) * std::sqrt(double(std::max<int64_t>(M, 1))); }

/// g (M, N) and x (M, K) in `layout` on the GPU.
std::pair<Tensor, Tensor> operands(const Dims& d, DType t, Layout layout, uint64_t seed) {
  return {random_tensor({d.M, d.N}, {t, kGpu}, seed, layout), random_tensor({d.M, d.K}, {t, kGpu}, seed + 1, layout)};
}

}  // namespace

TEST_CASE("cuda linear_weight_grads: the bias-gradient epilogue matches a GEMM and a reduction") {
  // (77, 129, 33): odd sizes; (1, ...) and (..., 1): dims the epilogue leaves to the fallback.
  const Dims dims[] = {{77, 129, 33}, {256, 96, 64}, {1, 8, 16}, {5, 3, 1}, {0, 4, 3}};
  for (DType t : kFloatTypes)
    for (bool widen : {false, true}) {
      if (widen && t != kFloat16 && t != kBFloat16) continue;
      const DType wdt = widen ? kFloat32 : t;
      for (const Dims& d : dims)
        for (Layout layout : {Layout::Contiguous, Layout::Transposed, Layout::Strided})
          for (bool with_bias : {true, false}) {
            const std::string what = detail::str_cat(dtype_name(t), " -> ", dtype_name(wdt), " M=", d.M, " N=", d.N,
                                                     " K=", d.K, " ", layout_name(layout), with_bias ? " bias" : "");
            CAPTURE(what);
            const auto [g, x] = operands(d, t, layout, 60);
            const ops::LinearWeightGrads r = ops::linear_weight_grads(g, x, wdt, with_bias);
            REQUIRE(r.weight.defined());
            CHECK(r.weight.dtype() == wdt);
            CHECK(r.weight.device() == kGpu);
            REQUIRE(r.weight.sizes() == Shape{d.N, d.K});
            REQUIRE(r.bias.defined() == with_bias);
            // float64 of the same stored values on the CPU: the independent reference.
            const Tensor g64 = g.cpu().to(kFloat64), x64 = x.cpu().to(kFloat64);
            check_close(r.weight, values_of(ops::mm(g64.t(), x64)), default_rtol(wdt), sum_atol(wdt, d.M),
                        "weight vs float64");
            // The unfused path on the GPU (a GEMM, then ops::sum over the rows).
            check_close(r.weight, values_of(ops::mm(g.t(), x, wdt)), default_rtol(wdt), sum_atol(wdt, d.M),
                        "weight vs mm");
            if (!with_bias) continue;
            CHECK(r.bias.dtype() == wdt);
            REQUIRE(r.bias.sizes() == Shape{d.N});
            check_close(r.bias, values_of(ops::sum(g64, {0})), default_rtol(wdt), sum_atol(wdt, d.M),
                        "bias vs float64");
            check_close(r.bias, values_of(ops::sum(g, {0})), default_rtol(t), sum_atol(t, d.M), "bias vs ops::sum");
          }
    }
}

TEST_CASE("cuda linear_weight_grads: the epilogue is taken for the 16- and 32-bit types") {
  // Without this the test above would pass on the fallback alone. (M, N, K) as ViT-B/16's MLP,
  // scaled down: 8 images of 197 tokens, 768 -> 3072 and 3072 -> 768.
  for (DType t : {kFloat16, kBFloat16, kFloat32})
    for (const Dims& d : {Dims{8 * 197, 3072, 768}, Dims{8 * 197, 768, 3072}}) {
      CAPTURE(dtype_name(t));
      CAPTURE(d.N);
      const auto [g, x] = operands(d, t, Layout::Contiguous, 61);
      const Tensor dw = empty({d.N, d.K}, {t, kGpu}), db = empty({d.N}, {t, kGpu});
      CHECK(ops::cuda::linear_weight_grads_kernel(dw, db, g.t(), x));
      check_close(db, values_of(ops::sum(g.cpu().to(kFloat64), {0})), default_rtol(t), sum_atol(t, d.M), "bias");
      if (t != kFloat32) {  // the float32 weight gradient of 16-bit operands, with its float32 bias gradient
        const Tensor dw32 = empty({d.N, d.K}, {kFloat32, kGpu}), db32 = empty({d.N}, {kFloat32, kGpu});
        CHECK(ops::cuda::linear_weight_grads_kernel(dw32, db32, g.t(), x));
        check_close(db32, values_of(ops::sum(g.cpu().to(kFloat64), {0})), 1e-5, sum_atol(kFloat32, d.M),
                    "float32 bias");
      }
    }
}

TEST_CASE("cuda linear: dx, dW and db through autograd match the CPU and float64") {
  // x is given as (K, M) and used as its transposed view (M, K): a non-contiguous input.
  const Dims d{77, 129, 33};
  const Tensor xt = random_tensor({d.K, d.M}, kFloat64, 70), w = random_tensor({d.N, d.K}, kFloat64, 71);
  const Tensor b = random_tensor({d.N}, kFloat64, 72);
  for (DType t : kFloatTypes)
    for (bool with_bias : {true, false})
      for (bool transposed_x : {false, true}) {
        const std::string what = detail::str_cat("linear", with_bias ? " bias" : "", transposed_x ? " x^T" : "");
        auto f = [transposed_x](const std::vector<Tensor>& in) {
          return linear(transposed_x ? in[0].t() : in[0], in[1], in[2]);
        };
        const Tensor x = transposed_x ? xt : xt.t().contiguous();
        const std::vector<Tensor> inputs = {x, w, with_bias ? b : Tensor()};
        compare_devices(f, inputs, {d.M, d.N}, t, 73, what);
        // Against float64 on the CPU: one rounding of each result to t, relative to its largest value.
        const Tensor gy = random_tensor({d.M, d.N}, kFloat64, 73);
        const std::vector<Tensor> got = forward_backward(f, inputs, gy, t, kGpu);
        const std::vector<Tensor> want = forward_backward(f, inputs, gy, kFloat64, kCPU);
        for (size_t i = 0; i < got.size(); ++i) {
          if (!want[i].defined()) continue;
          REQUIRE(got[i].defined());
          check_norm_close(got[i].to(kCPU, kFloat64), want[i], 2 * rtol_for(t),
                           detail::str_cat(what, " ", dtype_name(t), " result ", i, " vs float64"));
        }
      }
}

TEST_CASE("cuda linear + GELU + linear (the transformer MLP): forward and backward vs float64") {
  const Dims d{77, 129, 33};
  const std::vector<Tensor> inputs = {
      random_tensor({d.M, d.K}, kFloat64, 80), random_tensor({d.N, d.K}, kFloat64, 81, Layout::Contiguous, -0.5, 0.5),
      random_tensor({d.N}, kFloat64, 82),      random_tensor({d.K, d.N}, kFloat64, 83, Layout::Contiguous, -0.5, 0.5),
      random_tensor({d.K}, kFloat64, 84),
  };
  for (bool tanh : {false, true})
    for (DType t : kFloatTypes) {
      auto mlp = [tanh](const std::vector<Tensor>& in) {
        const Tensor h = linear(in[0], in[1], in[2]);
        return linear(tanh ? gelu_tanh(h) : gelu(h), in[3], in[4]);
      };
      const std::string what = tanh ? "mlp gelu_tanh" : "mlp gelu";
      compare_devices(mlp, inputs, {d.M, d.K}, t, 85, what);
      const Tensor gy = random_tensor({d.M, d.K}, kFloat64, 85);
      const std::vector<Tensor> got = forward_backward(mlp, inputs, gy, t, kGpu);
      const std::vector<Tensor> want = forward_backward(mlp, inputs, gy, kFloat64, kCPU);
      for (size_t i = 0; i < got.size(); ++i)
        check_norm_close(got[i].to(kCPU, kFloat64), want[i], 4 * rtol_for(t),
                         detail::str_cat(what, " ", dtype_name(t), " result ", i, " vs float64"));
    }
}

TEST_CASE("cuda linear: the bias gradient under autocast is float32, as the weight's") {
  // float32 master weights and bias, float16/bfloat16 products: both parameter gradients come
  // out of one GEMM in float32 (Note [Weight gradients in the master dtype]), against CPU autocast.
  const Dims d{77, 129, 33};
  const Tensor x = random_tensor({d.M, d.K}, kFloat32, 90), gy = random_tensor({d.M, d.N}, kFloat32, 91);
  const Tensor w0 = random_tensor({d.N, d.K}, kFloat32, 92), b0 = random_tensor({d.N}, kFloat32, 93);
  for (DType low : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(low));
    Tensor wg = w0.to(kGpu), bg = b0.to(kGpu), wc = w0.clone(), bc = b0.clone();
    for (Tensor* p : {&wg, &bg, &wc, &bc}) p->requires_grad_();
    Tensor yg, yc;
    {
      AutocastGuard amp(kGpu, low);
      yg = gelu(linear(x.to(kGpu), wg, bg));
    }
    {
      AutocastGuard amp(kCPU, low);
      yc = gelu(linear(x, wc, bc));
    }
    REQUIRE(yg.dtype() == low);
    yg.backward(gy.to(kGpu, low));
    yc.backward(gy.to(low));
    REQUIRE(wg.grad().dtype() == kFloat32);
    REQUIRE(bg.grad().dtype() == kFloat32);
    const double rtol = low == kFloat16 ? 2e-2 : 8e-2;
    check_norm_close(wg.grad().cpu(), wc.grad(), rtol, "weight grad vs CPU autocast");
    check_norm_close(bg.grad().cpu(), bc.grad(), rtol, "bias grad vs CPU autocast");
  }
}

TEST_CASE("cuda linear_gelu_tanh: the GELU epilogue matches linear then gelu_tanh, and float64") {
  // N = 3072 / 16 (the epilogue: a multiple of 8), and N = 129 (no epilogue: aux's ld).
  for (DType t : {kFloat16, kBFloat16, kFloat32})
    for (const Dims& d : {Dims{77, 192, 33}, Dims{77, 129, 33}})
      for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
        const std::string what = detail::str_cat(dtype_name(t), " N=", d.N, " ", layout_name(layout));
        CAPTURE(what);
        const Tensor x = random_tensor({d.M, d.K}, {t, kGpu}, 100, layout);
        const Tensor w = random_tensor({d.N, d.K}, {t, kGpu}, 101, Layout::Contiguous, -0.5, 0.5);
        const Tensor b = random_tensor({d.N}, {t, kGpu}, 102);
        const ops::LinearGeluResult r = ops::linear_gelu_tanh(x, w, b);
        REQUIRE(r.out.dtype() == t);
        REQUIRE(r.pre.sizes() == Shape{d.M, d.N});
        const Tensor pre = ops::linear(x, w, b), out = ops::gelu_tanh(pre);
        const double atol = 4 * default_rtol(t) * std::sqrt(double(d.K));
        check_close(r.pre, values_of(pre), default_rtol(t), atol, "pre vs linear");
        check_close(r.out, values_of(out), 2 * default_rtol(t), 2 * atol, "out vs gelu_tanh(linear)");
        const Tensor pre64 = ops::linear(x.cpu().to(kFloat64), w.cpu().to(kFloat64), b.cpu().to(kFloat64));
        check_close(r.out, values_of(ops::gelu_tanh(pre64)), 2 * default_rtol(t), 2 * atol, "out vs float64");
        // The exact GELU differs from the tanh form by up to 4.7e-4: the epilogue must not stand in for it.
        if (t == kFloat32) CHECK(max_abs(ops::sub(ops::gelu(pre64), ops::gelu_tanh(pre64))) > 1e-4);
      }
  // The ViT-B/16 MLP's first linear, scaled down, takes the epilogue.
  const Tensor x = random_tensor({8 * 197, 768}, {kFloat16, kGpu}, 103);
  const Tensor w = random_tensor({3072, 768}, {kFloat16, kGpu}, 104, Layout::Contiguous, -0.05, 0.05);
  const Tensor b = random_tensor({3072}, {kFloat16, kGpu}, 105);
  const Tensor out = empty({8 * 197, 3072}, {kFloat16, kGpu}), pre = empty({8 * 197, 3072}, {kFloat16, kGpu});
  CHECK(ops::cuda::linear_gelu_tanh_kernel(out, pre, x, w.t(), b));
  check_close(out, values_of(ops::gelu_tanh(ops::linear(x, w, b))), 4e-3, 4e-3, "ViT MLP shape");
}

TEST_CASE("cuda linear_gelu: one node when fused, the two ops under the memory techniques") {
  const Dims d{77, 192, 33};
  const std::vector<Tensor> inputs = {
      random_tensor({d.M, d.K}, kFloat64, 110),
      random_tensor({d.N, d.K}, kFloat64, 111, Layout::Contiguous, -0.5, 0.5),
      random_tensor({d.N}, kFloat64, 112),
      random_tensor({d.K, d.N}, kFloat64, 113, Layout::Contiguous, -0.5, 0.5),
  };
  auto mlp = [](bool approximate) {
    return [approximate](const std::vector<Tensor>& in) {
      return linear(linear_gelu(in[0], in[1], in[2], approximate), in[3]);
    };
  };
  const Tensor gy = random_tensor({d.M, d.K}, kFloat64, 114);
  for (DType t : {kFloat32, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    // Fused (approximate) vs written out, and vs float64 on the CPU (which composes the ops).
    auto written_out = [](const std::vector<Tensor>& in) {
      return linear(gelu_tanh(linear(in[0], in[1], in[2])), in[3]);
    };
    const std::vector<Tensor> fused = forward_backward(mlp(true), inputs, gy, t, kGpu);
    const std::vector<Tensor> plain = forward_backward(written_out, inputs, gy, t, kGpu);
    const std::vector<Tensor> want = forward_backward(written_out, inputs, gy, kFloat64, kCPU);
    for (size_t i = 0; i < fused.size(); ++i) {
      check_norm_close(fused[i].to(kCPU, kFloat64), plain[i].to(kCPU, kFloat64), 2 * rtol_for(t),
                       detail::str_cat("fused vs unfused, result ", i));
      check_norm_close(fused[i].to(kCPU, kFloat64), want[i], 4 * rtol_for(t),
                       detail::str_cat("fused vs float64, result ", i));
    }
    // The exact GELU is the two ops, always.
    const std::vector<Tensor> exact = forward_backward(mlp(false), inputs, gy, t, kGpu);
    const std::vector<Tensor> exact64 =
        forward_backward([](const std::vector<Tensor>& in) { return linear(gelu(linear(in[0], in[1], in[2])), in[3]); },
                         inputs, gy, kFloat64, kCPU);
    for (size_t i = 0; i < exact.size(); ++i)
      check_norm_close(exact[i].to(kCPU, kFloat64), exact64[i], 4 * rtol_for(t),
                       detail::str_cat("exact vs float64, result ", i));
  }
  // Which node: fused with grad on, the unfused GELU under RecomputeCheapOutputs and hooks.
  Tensor x = inputs[0].to(kGpu, kFloat16), w = inputs[1].to(kGpu, kFloat16), b = inputs[2].to(kGpu, kFloat16);
  w.requires_grad_();
  CHECK(linear_gelu(x, w, b, true).grad_fn_name() == "LinearGeluBackward");
  CHECK(linear_gelu(x, w, b, false).grad_fn_name() != "LinearGeluBackward");
  CHECK(linear_gelu(x, w, Tensor(), true).grad_fn_name() != "LinearGeluBackward");
  {
    autograd::RecomputeCheapOutputs guard;
    CHECK(linear_gelu(x, w, b, true).grad_fn_name() != "LinearGeluBackward");
  }
  {
    autograd::SavedTensorHooks hooks([](const Tensor& t) { return autograd::PackedTensor(t); },
                                     [](const autograd::PackedTensor& p) { return std::any_cast<Tensor>(p); });
    CHECK(linear_gelu(x, w, b, true).grad_fn_name() != "LinearGeluBackward");
  }
  {
    AutocastGuard amp(kGpu, kBFloat16);
    const Tensor y = linear_gelu(x.to(kFloat32), w, b.to(kFloat32), true);
    CHECK(y.dtype() == kBFloat16);
    CHECK(y.grad_fn_name() == "LinearGeluBackward");
  }
}
