// Channels-last (NHWC) on CUDA against NCHW float32 on the CPU, from the same inputs
// (rounded to the tested dtype first): conv2d forward and both gradients (cuDNN NHWC
// descriptors; 1x1 / 3x3 / 7x7, strides 1 and 2, weights stored either way), batch_norm
// training (cuDNN persistent batch norm for float16/bfloat16, the own kernels for
// float32) and eval, batch_norm_relu and batch_norm_add_relu forward and backward
// (cuDNN's fused kernels), running statistics, the pools, a ResNet bottleneck tail;
// every output and input gradient checked for its values and its layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/batch_norm.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/pool.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/pool.h"
#include "tensor/ops/unary.h"
#include "tests/norm_close.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const Device kGpu = cuda(0);
constexpr DType kTypes[] = {kFloat16, kBFloat16, kFloat32};

/// Max-norm tolerance per dtype: both sides compute in float32 from the same rounded
/// inputs, so they differ by about one rounding of the stored type (cuDNN's algorithms
/// sum in other orders; batch norm's statistics add one more rounding of y).
double rtol_for(DType t) {
  switch (t) {
    case DType::Float16: return 5e-3;
    case DType::BFloat16: return 4e-2;
    default: return 1e-4;
  }
}

void check_nhwc(const Tensor& t, const std::string& what) {
  CHECK_MESSAGE(suggests_channels_last(t), what, " is not channels-last: ", t.describe(), " strides ",
                shape_str(t.strides()));
}

/// A fresh leaf from float64 CPU values: on `device` in `dtype`, channels-last if asked.
Tensor leaf(const Tensor& values, Device device, DType dtype, bool channels_last = false) {
  Tensor t = values.to(device, dtype).clone();  // a fresh tensor, never `values` itself
  if (channels_last) t = to_channels_last(t);   // a copy, or t itself when its shape is ambiguous
  t.requires_grad_();
  return t;
}

/// The CPU float32 reference input: `values` rounded to `dtype` first, NCHW.
Tensor reference_leaf(const Tensor& values, DType dtype) {
  Tensor t = values.to(dtype).to(kFloat32).contiguous().clone();
  t.requires_grad_();
  return t;
}

}  // namespace

TEST_CASE("channels_last cuda: conv2d forward and backward, NHWC vs NCHW CPU") {
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  const Case cases[] = {
      {{2, 16, 14, 14}, {32, 16, 1, 1}, {}},                           // 1x1, stride 1
      {{2, 16, 14, 14}, {32, 16, 1, 1}, {.stride = 2}},                // 1x1 stride-2 downsample
      {{2, 16, 14, 14}, {16, 16, 3, 3}, {.stride = 1, .padding = 1}},  // 3x3
      {{2, 16, 15, 15}, {32, 16, 3, 3}, {.stride = 2, .padding = 1}},  // 3x3 stride 2, odd size
      {{2, 3, 32, 32}, {16, 3, 7, 7}, {.stride = 2, .padding = 3}},    // the 7x7 stem (C = 3)
  };
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.x));
    CAPTURE(shape_str(c.w));
    const Tensor xv = random_tensor(c.x, kFloat64, 1),
                 wv = random_tensor(c.w, kFloat64, 2, Layout::Contiguous, -0.3, 0.3);
    const Tensor bv = random_tensor({c.w[0]}, kFloat64, 3);
    for (DType t : kTypes) {
      CAPTURE(dtype_name(t));
      // CPU reference, NCHW float32.
      const Tensor xr = reference_leaf(xv, t), wr = reference_leaf(wv, t), br = reference_leaf(bv, t);
      const Tensor yr = conv2d(xr, wr, br, c.o);
      const Tensor gv = random_tensor(yr.sizes(), kFloat64, 4);
      yr.backward(gv.to(t).to(kFloat32));
      for (bool weight_nhwc : {false, true}) {
        CAPTURE(weight_nhwc);
        const Tensor x = leaf(xv, kGpu, t, true), w = leaf(wv, kGpu, t, weight_nhwc), b = leaf(bv, kGpu, t);
        const Tensor y = conv2d(x, w, b, c.o);
        check_nhwc(y, "conv2d output");
        CHECK(y.dtype() == t);
        y.backward(to_channels_last(gv.to(kGpu, t)));
        const double rtol = rtol_for(t);
        check_norm_close(y, yr, rtol, "conv2d output");
        check_norm_close(x.grad(), xr.grad(), rtol, "grad_x");
        check_nhwc(x.grad(), "grad_x");
        check_norm_close(w.grad(), wr.grad(), rtol, "grad_w");
        // The weight's gradient comes back in the weight's own layout.
        if (weight_nhwc) CHECK(is_channels_last(w.grad()));
        else CHECK(w.grad().is_contiguous());
        check_norm_close(b.grad(), br.grad(), rtol, "grad_bias");
      }
      // An NCHW gradient arriving at an NHWC convolution still gives NHWC gradients.
      const Tensor x = leaf(xv, kGpu, t, true), w = leaf(wv, kGpu, t);
      const Tensor y = conv2d(x, w, Tensor(), c.o);
      y.backward(gv.to(kGpu, t));
      check_nhwc(x.grad(), "grad_x from an NCHW grad_out");
      check_norm_close(w.grad(), wr.grad(), rtol_for(t), "grad_w from an NCHW grad_out");
    }
  }
}

namespace {

struct BnInputs {
  Tensor x, residual, weight, bias, grad, running_mean, running_var;  // float64 CPU values
};
BnInputs bn_inputs(const Shape& s, uint64_t seed) {
  const int64_t C = s[1];
  return {random_tensor(s, kFloat64, seed, Layout::Contiguous, -1.0, 3.0),
          random_tensor(s, kFloat64, seed + 1),
          random_tensor({C}, kFloat64, seed + 2, Layout::Contiguous, 0.5, 1.5),
          random_tensor({C}, kFloat64, seed + 3),
          random_tensor(s, kFloat64, seed + 4),
          random_tensor({C}, kFloat64, seed + 5, Layout::Contiguous, -0.5, 0.5),
          random_tensor({C}, kFloat64, seed + 6, Layout::Contiguous, 0.5, 1.5)};
}

enum class Tail { None, Relu, AddRelu };  // batch_norm, batch_norm_relu, batch_norm_add_relu
const char* tail_name(Tail m) { return m == Tail::None ? "batch_norm" : m == Tail::Relu ? "+relu" : "+add+relu"; }

/// The op's forward + backward: the output, grads of x, (residual,) weight, bias, and the
/// running statistics after the forward.
struct BnRun {
  Tensor out, gx, gr, gw, gb, rm, rv;
};
BnRun run_bn(const BnInputs& in, Tail tail, bool training, DType t, Device device, bool nhwc) {
  const bool add_relu = tail == Tail::AddRelu;
  const bool cpu = device.is_cpu();
  const Tensor x = cpu ? reference_leaf(in.x, t) : leaf(in.x, device, t, nhwc);
  const Tensor r = cpu ? reference_leaf(in.residual, t) : leaf(in.residual, device, t, nhwc);
  const Tensor w = leaf(in.weight, device, kFloat32), b = leaf(in.bias, device, kFloat32);
  BnRun o;
  o.rm = in.running_mean.to(device, kFloat32).clone();
  o.rv = in.running_var.to(device, kFloat32).clone();
  o.out = tail == Tail::None ? batch_norm(x, o.rm, o.rv, w, b, training, 0.1, 1e-5)
                             : batch_norm_relu(x, o.rm, o.rv, w, b, training, 0.1, 1e-5, add_relu ? r : Tensor());
  Tensor g = in.grad.to(t).to(device, cpu ? kFloat32 : t);
  if (nhwc && !cpu) g = to_channels_last(g);
  o.out.backward(g);
  o.gx = x.grad(), o.gw = w.grad(), o.gb = b.grad();
  if (add_relu) o.gr = r.grad();
  return o;
}

void compare_bn(const BnRun& a, const BnRun& e, DType t, bool add_relu, bool training) {
  const double rtol = rtol_for(t);
  check_norm_close(a.out, e.out, rtol, "output");
  check_nhwc(a.out, "output");
  check_norm_close(a.gx, e.gx, rtol, "grad_x");
  check_nhwc(a.gx, "grad_x");
  // Parameter gradients are sums over N*H*W values of the stored type: a looser bound.
  check_norm_close(a.gw, e.gw, 4 * rtol, "grad_weight");
  check_norm_close(a.gb, e.gb, 4 * rtol, "grad_bias");
  CHECK(a.gw.dtype() == kFloat32);
  if (add_relu) {
    check_norm_close(a.gr, e.gr, rtol, "grad_residual");
    check_nhwc(a.gr, "grad_residual");
  }
  if (training) {  // the batch statistics of x rounded to t, so close to float32's
    check_norm_close(a.rm, e.rm, 1e-4, "running_mean");
    check_norm_close(a.rv, e.rv, 1e-3, "running_var");
  } else {
    check_norm_close(a.rm, e.rm, 0, "running_mean untouched in eval");
  }
}

}  // namespace

TEST_CASE("channels_last cuda: batch_norm and batch_norm_add_relu, NHWC vs NCHW CPU") {
  for (const Shape& s : {Shape{4, 64, 14, 14}, Shape{8, 256, 7, 7}, Shape{2, 32, 28, 28}}) {
    CAPTURE(shape_str(s));
    const BnInputs in = bn_inputs(s, 10);
    for (DType t : kTypes) {
      CAPTURE(dtype_name(t));
      for (Tail tail : {Tail::None, Tail::Relu, Tail::AddRelu}) {
        for (bool training : {true, false}) {
          CAPTURE(tail_name(tail));
          CAPTURE(training);
          const BnRun ref = run_bn(in, tail, training, t, kCPU, false);
          const BnRun got = run_bn(in, tail, training, t, kGpu, true);
          compare_bn(got, ref, t, tail == Tail::AddRelu, training);
        }
      }
    }
  }
}

// Note [Batch norm add ReLU]: with residual = -round(bn(x)), bn(x) + residual is bn(x)'s
// rounding error, tiny and of either sign; the eval (own kernels) forward must round the
// sum once, so out and the ReLU-masked gradient keep its sign (the old bn + add + relu
// fallback rounded bn(x) first: every sum 0, every masked gradient 0).
TEST_CASE("channels_last cuda: eval batch_norm_add_relu rounds bn(x) + residual once (ReLU mask near 0)") {
  const Shape s{4, 64, 14, 14};
  const int64_t C = s[1], HW = s[2] * s[3];
  for (DType t : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    const BnInputs in = bn_inputs(s, 70);
    const Tensor xv = in.x.to(t).to(kFloat64);
    const std::vector<double> vx = values_of(xv), rm = values_of(in.running_mean), rv = values_of(in.running_var),
                              w = values_of(in.weight), b = values_of(in.bias);
    std::vector<double> y(vx.size()), z(vx.size());  // bn(x), bn(x) + residual in float64
    for (size_t i = 0; i < vx.size(); ++i) {
      const size_t c = (i / size_t(HW)) % size_t(C);
      y[i] = (vx[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c];
    }
    const Tensor rt = neg(from_vector(y, s, TensorOptions(kFloat64)).to(t));  // exact in t
    const std::vector<double> vr = values_of(rt);
    for (size_t i = 0; i < vx.size(); ++i) z[i] = y[i] + vr[i];
    const Tensor x = to_channels_last(xv.to(kGpu, t)), residual = to_channels_last(rt.to(kGpu));
    auto p32 = [&](const Tensor& v) { return v.to(kGpu, kFloat32); };
    const ops::BatchNormResult r = ops::batch_norm_add_relu(x, residual, p32(in.running_mean), p32(in.running_var),
                                                            p32(in.weight), p32(in.bias), false, 0.1, 1e-5);
    CHECK_FALSE(r.reserve.defined());  // eval: the own kernels
    check_nhwc(r.out, "eval output");
    const Tensor g = to_channels_last(in.grad.to(kGpu, t));
    const ops::BatchNormGrads gr =
        ops::batch_norm_add_relu_backward(g, x, r.out, p32(in.weight), p32(in.bias), r.mean, r.invstd, false, {},
                                          {.reserve = Tensor(), .eps = 1e-5, .residual = true});
    const std::vector<double> out = values_of(r.out), vg = values_of(g), gres = values_of(gr.residual);
    int decided = 0, positive = 0, wrong_out = 0, wrong_grad = 0;
    for (size_t i = 0; i < z.size(); ++i) {
      if (std::fabs(z[i]) <= 1e-5 * (std::fabs(y[i]) + 1.0)) continue;  // within float32's own error
      ++decided;
      const bool pass = z[i] > 0;
      positive += pass;
      // z is a small difference: allow bn(x)'s own float32 error (a few ulps of y) and
      // float16's subnormal spacing on top of one rounding of z.
      const double slack = 1e-6 * (std::fabs(y[i]) + 1.0);
      wrong_out += pass ? !(std::fabs(out[i] - z[i]) <= 2 * rtol_for(t) * std::fabs(z[i]) + slack) : out[i] != 0.0;
      wrong_grad += gres[i] != (pass ? vg[i] : 0.0);
    }
    CHECK(decided > int(z.size()) / 2);
    CHECK(positive > decided / 4);
    CHECK(wrong_out == 0);
    CHECK(wrong_grad == 0);
  }
}

// Elementwise ops whose operands disagree on layout (one NHWC, one NCHW, either way
// round) index each operand by its own strides: CUDA against the CPU.
TEST_CASE("channels_last cuda: add, mul and relu_backward on mixed NHWC / NCHW operands") {
  const Shape s{4, 64, 14, 14};
  const Tensor av = random_tensor(s, kFloat64, 80), bv = random_tensor(s, kFloat64, 81);
  for (DType t : kTypes) {
    CAPTURE(dtype_name(t));
    for (bool a_nhwc : {false, true}) {
      CAPTURE(a_nhwc);
      const Tensor a_cpu = av.to(t), b_cpu = bv.to(t);
      Tensor a = av.to(kGpu, t), b = bv.to(kGpu, t);
      if (a_nhwc) a = to_channels_last(a);
      else b = to_channels_last(b);
      check_norm_close(ops::add(a, b), ops::add(a_cpu, b_cpu), 0, "add");
      check_norm_close(ops::mul(a, b), ops::mul(a_cpu, b_cpu), 0, "mul");
      check_norm_close(ops::unary_backward(ops::UnaryOp::Relu, a, b),
                       ops::unary_backward(ops::UnaryOp::Relu, a_cpu, b_cpu), 0, "relu_backward");
    }
  }
}

TEST_CASE("channels_last cuda: cuDNN runs the float16 training batch norm and keeps a reserve") {
  const BnInputs in = bn_inputs({4, 64, 14, 14}, 30);
  for (DType t : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    const Tensor x = to_channels_last(in.x.to(kGpu, t)), r = to_channels_last(in.residual.to(kGpu, t));
    const Tensor w = in.weight.to(kGpu, kFloat32), b = in.bias.to(kGpu, kFloat32);
    const ops::BatchNormResult plain = ops::batch_norm(x, Tensor(), Tensor(), w, b, true);
    const ops::BatchNormResult fused = ops::batch_norm_add_relu(x, r, Tensor(), Tensor(), w, b, true);
    const ops::BatchNormResult with_relu = ops::batch_norm_add_relu(x, Tensor(), Tensor(), Tensor(), w, b, true);
    if (t == kFloat16) {
      CHECK(plain.reserve.defined());
      CHECK(fused.reserve.defined());
      CHECK(with_relu.reserve.defined());
    } else {
      WARN_MESSAGE(plain.reserve.defined(), "cuDNN declined bfloat16 persistent batch norm: own kernels ran");
      WARN_MESSAGE(fused.reserve.defined(), "cuDNN declined bfloat16 fused batch norm: own kernels ran");
      WARN_MESSAGE(with_relu.reserve.defined(), "cuDNN declined bfloat16 batch norm + relu: own kernels ran");
    }
    // Either way the statistics are the batch's: compare with the CPU.
    const Tensor xr = in.x.to(t).to(kFloat32);
    const ops::BatchNormResult ref = ops::batch_norm(xr, Tensor(), Tensor(), w.to(kCPU), b.to(kCPU), true);
    check_norm_close(plain.mean, ref.mean, 1e-4, "mean");
    check_norm_close(plain.invstd, ref.invstd, 1e-3, "invstd");
    check_norm_close(fused.mean, ref.mean, 1e-4, "fused mean");
    // An NCHW input is not cuDNN's: no reserve, NCHW output.
    const ops::BatchNormResult nchw = ops::batch_norm(x.contiguous(), Tensor(), Tensor(), w, b, true);
    CHECK_FALSE(nchw.reserve.defined());
    CHECK(nchw.out.is_contiguous());
  }
}

TEST_CASE("channels_last cuda: pools on NHWC inputs") {
  const Tensor xv = random_tensor({2, 32, 17, 16}, kFloat64, 40);
  for (DType t : kTypes) {
    CAPTURE(dtype_name(t));
    auto f = [](const Tensor& x) {
      const Tensor y = max_pool2d(x, 3, {.stride = 2, .padding = 1});
      return adaptive_avg_pool2d(avg_pool2d(y, 2, {.stride = 1}), {1, 1});
    };
    const Tensor xr = reference_leaf(xv, t), x = leaf(xv, kGpu, t, true);
    const Tensor yr = f(xr), y = f(x);
    check_norm_close(y, yr, rtol_for(t), "pools");
    yr.backward(ones_like(yr));
    y.backward(ones_like(y));
    check_norm_close(x.grad(), xr.grad(), rtol_for(t), "pools grad_x");
    check_nhwc(x.grad(), "pools grad_x");
    check_nhwc(max_pool2d(x, 3, {.stride = 2, .padding = 1}), "max_pool2d output");
  }
}

namespace {

constexpr DType kPoolTypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};

/// A CUDA channels-last copy of the CPU tensor t (t itself stays NCHW).
Tensor nhwc_gpu(const Tensor& t) { return to_channels_last(t.to(kGpu)); }

/// A backward's grad_x: channels-last when its grad_out is (an ambiguous grad_out, such as
/// global pooling's (N, C, 1, 1), decides nothing and leaves grad_x NCHW).
void check_grad_layout(const Tensor& grad_x, const Tensor& grad_out, const std::string& what) {
  if (suggests_channels_last(grad_out)) check_nhwc(grad_x, what);
}

}  // namespace

TEST_CASE("channels_last cuda: native NHWC max_pool2d matches NCHW CPU: values, indices, backward, layout") {
  struct Case {
    Shape x;
    Int2 k;
    MaxPool2dOptions o;
  };
  const Case cases[] = {
      {{2, 8, 17, 17}, 3, {.stride = 2, .padding = 1}},  // ResNet's stem pool
      {{2, 8, 9, 13}, 2, {.stride = 1}},                 // overlapping windows, non-square, no padding
      {{2, 5, 10, 7}, {3, 2}, {.stride = {2, 1}, .padding = 1, .dilation = {2, 1}, .ceil_mode = true}},
  };
  uint64_t seed = 60;
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.x));
    for (DType t : kPoolTypes) {
      CAPTURE(dtype_name(t));
      const Tensor x = random_tensor(c.x, kFloat64, ++seed).to(t);
      const ops::MaxPool2dResult ref = ops::max_pool2d(x, c.k, c.o);
      const ops::MaxPool2dResult got = ops::max_pool2d(nhwc_gpu(x), c.k, c.o);
      check_nhwc(got.out, "max_pool2d out");
      check_nhwc(got.indices, "max_pool2d indices");
      CHECK(values_of(got.out) == values_of(ref.out));  // a selection: exact
      CHECK(got.indices.cpu().contiguous().tolist<int64_t>() == ref.indices.tolist<int64_t>());

      const Tensor go = random_tensor(ref.out.sizes(), kFloat64, ++seed).to(t);
      const Tensor gx_ref = ops::max_pool2d_backward(go, ref.indices, c.x, c.k, c.o);
      const Tensor go_gpu = nhwc_gpu(go);
      const Tensor gx = ops::max_pool2d_backward(go_gpu, got.indices, c.x, c.k, c.o);
      check_grad_layout(gx, go_gpu, "max_pool2d_backward grad_x");
      check_close(gx, values_of(gx_ref), default_rtol(t), default_rtol(t), "max_pool2d_backward");
    }
  }
}

TEST_CASE("channels_last cuda: native NHWC avg_pool2d and adaptive_avg_pool2d match NCHW CPU, forward and backward") {
  struct AvgCase {
    Shape x;
    Int2 k;
    AvgPool2dOptions o;
  };
  const AvgCase avg_cases[] = {
      {{2, 8, 17, 17}, 3, {.stride = 2, .padding = 1}},
      {{2, 6, 9, 13}, {3, 2}, {.stride = {2, 1}, .padding = 1, .ceil_mode = true, .count_include_pad = false}},
  };
  const std::pair<Shape, Int2> adaptive_cases[] = {
      {{2, 64, 7, 7}, 1},        // ResNet's global pool
      {{2, 6, 13, 11}, {4, 5}},  // overlapping windows
      {{2, 6, 3, 4}, {5, 7}},    // growing
  };
  uint64_t seed = 80;
  for (DType t : kPoolTypes) {
    CAPTURE(dtype_name(t));
    const double tol = default_rtol(t);
    for (const AvgCase& c : avg_cases) {
      CAPTURE(shape_str(c.x));
      const Tensor x = random_tensor(c.x, kFloat64, ++seed).to(t);
      const Tensor ref = ops::avg_pool2d(x, c.k, c.o), y = ops::avg_pool2d(nhwc_gpu(x), c.k, c.o);
      check_nhwc(y, "avg_pool2d out");
      check_close(y, values_of(ref), tol, tol, "avg_pool2d");
      const Tensor go = random_tensor(ref.sizes(), kFloat64, ++seed).to(t), go_gpu = nhwc_gpu(go);
      const Tensor gx = ops::avg_pool2d_backward(go_gpu, c.x, c.k, c.o);
      check_grad_layout(gx, go_gpu, "avg_pool2d_backward grad_x");
      check_close(gx, values_of(ops::avg_pool2d_backward(go, c.x, c.k, c.o)), tol, tol, "avg_pool2d_backward");
    }
    for (const auto& [xs, os] : adaptive_cases) {
      CAPTURE(shape_str(xs));
      const Tensor x = random_tensor(xs, kFloat64, ++seed).to(t);
      const Tensor ref = ops::adaptive_avg_pool2d(x, os), y = ops::adaptive_avg_pool2d(nhwc_gpu(x), os);
      CHECK_MESSAGE(is_channels_last(y), "adaptive_avg_pool2d out: ", y.describe());  // (N, C, 1, 1) is both
      check_close(y, values_of(ref), tol, tol, "adaptive_avg_pool2d");
      const Tensor go = random_tensor(ref.sizes(), kFloat64, ++seed).to(t), go_gpu = nhwc_gpu(go);
      const Tensor gx = ops::adaptive_avg_pool2d_backward(go_gpu, xs);
      check_grad_layout(gx, go_gpu, "adaptive_avg_pool2d_backward grad_x");
      check_close(gx, values_of(ops::adaptive_avg_pool2d_backward(go, xs)), tol, tol, "adaptive_avg_pool2d_backward");
    }
  }
}

TEST_CASE("channels_last cuda: a bottleneck tail conv-bn-relu-conv-bn-add-relu in float16") {
  const Shape s{4, 64, 14, 14};
  const Tensor xv = random_tensor(s, kFloat64, 50);
  const Tensor w1v = random_tensor({64, 64, 3, 3}, kFloat64, 51, Layout::Contiguous, -0.1, 0.1);
  const Tensor w2v = random_tensor({64, 64, 1, 1}, kFloat64, 52, Layout::Contiguous, -0.2, 0.2);
  const Tensor gv = random_tensor(s, kFloat64, 53);
  const Tensor ones64 = ones({64}, kFloat64), zeros64 = zeros({64}, kFloat64);
  struct Leaves {
    Tensor x, w1, w2, g1, b1, g2, b2;
  };
  const DType t = kFloat16;
  // The float32 reference rounds every op's output to t, as the GPU stores it: a ReLU
  // mask is decided by the sign of values that may lie within one rounding of 0, and
  // one flipped mask bit moves a gradient by the whole incoming g.
  auto stored = [&](const Tensor& y) { return y.dtype() == kFloat32 ? y.to(t).to(kFloat32) : y; };
  auto block = [&](const Leaves& l) {
    const Tensor c1 = stored(conv2d(l.x, l.w1, Tensor(), {.padding = 1}));
    const Tensor h = stored(batch_norm_relu(c1, Tensor(), Tensor(), l.g1, l.b1, true));
    return batch_norm_add_relu(stored(conv2d(h, l.w2)), l.x, Tensor(), Tensor(), l.g2, l.b2, true);
  };
  const Leaves ref{reference_leaf(xv, t),        reference_leaf(w1v, t),        reference_leaf(w2v, t),
                   leaf(ones64, kCPU, kFloat32), leaf(zeros64, kCPU, kFloat32), leaf(ones64, kCPU, kFloat32),
                   leaf(zeros64, kCPU, kFloat32)};
  const Leaves gpu{leaf(xv, kGpu, t, true),      leaf(w1v, kGpu, t, true),      leaf(w2v, kGpu, t, true),
                   leaf(ones64, kGpu, kFloat32), leaf(zeros64, kGpu, kFloat32), leaf(ones64, kGpu, kFloat32),
                   leaf(zeros64, kGpu, kFloat32)};
  const Tensor yr = block(ref), y = block(gpu);
  check_nhwc(y, "block output");
  yr.backward(gv.to(t).to(kFloat32));
  y.backward(to_channels_last(gv.to(kGpu, t)));
  const double rtol = 2 * rtol_for(t);
  check_norm_close(y, yr, rtol, "block output");
  check_norm_close(gpu.x.grad(), ref.x.grad(), rtol, "grad_x");
  check_nhwc(gpu.x.grad(), "grad_x");
  check_norm_close(gpu.w1.grad(), ref.w1.grad(), 4 * rtol, "grad_w1");
  check_norm_close(gpu.w2.grad(), ref.w2.grad(), 4 * rtol, "grad_w2");
  check_norm_close(gpu.g2.grad(), ref.g2.grad(), 4 * rtol, "grad_gamma2");
  check_norm_close(gpu.b1.grad(), ref.b1.grad(), 4 * rtol, "grad_beta1");
}
