// Channels-last (NHWC) layout: the layout helpers, Tensor::to keeping the layout,
// elementwise output layout (Note [Elementwise output layout]), conv2d / batch_norm /
// batch_norm_add_relu / pooling on NHWC inputs against their NCHW results and naive
// float64 loops, gradcheck through conv and batch norm on NHWC inputs, and
// nn::to_channels_last(Module&).
#include <doctest/doctest.h>

#include <cmath>

#include "autograd/gradcheck.h"
#include "autograd/ops/batch_norm.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/pool.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "nn/channels_last.h"
#include "nn/conv.h"
#include "tensor/elementwise.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/pool.h"
#include "tensor/ops/unary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::gradcheck;

namespace {

/// A random NCHW tensor and its channels-last copy (same values).
struct Pair {
  Tensor nchw, nhwc;
};
Pair random_pair(const Shape& s, DType dtype, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  const Tensor x = random_tensor(s, dtype, seed, Layout::Contiguous, lo, hi);
  return {x, to_channels_last(x)};
}

void check_nhwc(const Tensor& t, const char* what) {
  CHECK_MESSAGE(suggests_channels_last(t), what, " is not channels-last: ", t.describe(), " strides ",
                shape_str(t.strides()));
}
void check_nchw(const Tensor& t, const char* what) {
  CHECK_MESSAGE(t.is_contiguous(), what, " is not contiguous: strides ", shape_str(t.strides()));
}

}  // namespace

TEST_CASE("channels_last: layout helpers") {
  CHECK(channels_last_strides({2, 3, 4, 5}) == Shape{60, 1, 15, 3});
  const Tensor x = random_tensor({2, 3, 4, 5}, kFloat32, 1);
  CHECK(x.is_contiguous());
  CHECK_FALSE(is_channels_last(x));
  const Tensor y = to_channels_last(x);
  CHECK(y.sizes() == x.sizes());
  CHECK(y.strides() == Shape{60, 1, 15, 3});
  CHECK(is_channels_last(y));
  CHECK(suggests_channels_last(y));
  CHECK_FALSE(y.is_contiguous());
  check_close(y, values_of(x), 0, 0, "to_channels_last values");
  CHECK(to_channels_last(y).data() == y.data());  // already channels-last: itself
  const Tensor back = y.contiguous();
  CHECK(back.is_contiguous());
  check_close(back, values_of(x), 0, 0, "contiguous() of channels-last");
  // Ambiguous: both layouts at once, so no op treats it as channels-last.
  for (const Shape& s : {Shape{2, 1, 4, 5}, Shape{2, 3, 1, 1}, Shape{1, 1, 1, 1}}) {
    const Tensor a = random_tensor(s, kFloat32, 2);
    CHECK(is_channels_last(a));
    CHECK(a.is_contiguous());
    CHECK_FALSE(suggests_channels_last(a));
  }
  const Tensor e = empty_channels_last({2, 3, 4, 5}, kFloat64);
  CHECK(e.dtype() == kFloat64);
  CHECK(suggests_channels_last(e));
  CHECK_FALSE(is_channels_last(random_tensor({3, 4, 5}, kFloat32, 3)));
  CHECK_FALSE(is_channels_last(x.permute({0, 1, 3, 2})));
  check_error(
      [&] {
        to_channels_last(random_tensor({3, 4, 5}, kFloat32, 3));
      },
      {"to_channels_last", "4-D", "[3, 4, 5]"});
  check_error([] { channels_last_strides({3, 4}); }, {"channels_last", "[3, 4]"});
}

TEST_CASE("channels_last: Tensor::to keeps the layout") {
  const Pair p = random_pair({2, 3, 4, 5}, kFloat32, 4);
  for (DType t : {kFloat16, kBFloat16, kFloat64}) {
    const Tensor c = p.nhwc.to(t);
    check_nhwc(c, "to(dtype) of channels-last");
    check_close(c, values_of(p.nchw.to(t)), 0, 0, "to(dtype) values");
    check_nchw(p.nchw.to(t), "to(dtype) of contiguous");
  }
  // A non-channels-last strided tensor still converts to a contiguous one.
  check_nchw(p.nchw.transpose(2, 3).to(kFloat64), "to(dtype) of transposed");
}

TEST_CASE("channels_last: elementwise outputs follow their inputs") {
  const Pair a = random_pair({2, 3, 4, 5}, kFloat32, 5), b = random_pair({2, 3, 4, 5}, kFloat32, 6);
  const Tensor bias = random_tensor({1, 3, 1, 1}, kFloat32, 7);
  const std::vector<double> va = values_of(a.nchw), vb = values_of(b.nchw), vbias = values_of(bias);
  std::vector<double> sum(va.size()), relu_ref(va.size()), plus_bias(va.size());
  for (size_t i = 0; i < va.size(); ++i) {
    sum[i] = va[i] + vb[i];
    relu_ref[i] = va[i] > 0 ? va[i] : 0.0;
    plus_bias[i] = va[i] + vbias[(i / 20) % 3];
  }
  const double rtol = default_rtol(kFloat32);
  SUBCASE("unary") {
    const Tensor r = ops::relu(a.nhwc);
    check_nhwc(r, "relu(nhwc)");
    check_close(r, relu_ref, 0, 0, "relu values");
    check_nchw(ops::relu(a.nchw), "relu(nchw)");
    const Tensor g = ops::unary_backward(ops::UnaryOp::Relu, b.nhwc, r);
    check_nhwc(g, "relu_backward(nhwc)");
    std::vector<double> gref(va.size());
    for (size_t i = 0; i < va.size(); ++i) gref[i] = relu_ref[i] > 0 ? vb[i] : 0.0;
    check_close(g, gref, 0, 0, "relu_backward values");
  }
  SUBCASE("binary: the first input with a definite layout decides") {
    check_nhwc(ops::add(a.nhwc, b.nhwc), "nhwc + nhwc");
    check_close(ops::add(a.nhwc, b.nhwc), sum, rtol, 0, "nhwc + nhwc values");
    check_nhwc(ops::add(a.nhwc, b.nchw), "nhwc + nchw");
    check_close(ops::add(a.nhwc, b.nchw), sum, rtol, 0, "nhwc + nchw values");
    check_nchw(ops::add(a.nchw, b.nhwc), "nchw + nhwc");
    check_close(ops::add(a.nchw, b.nhwc), sum, rtol, 0, "nchw + nhwc values");
    // A broadcast operand has no say, whichever side it is on.
    check_nhwc(ops::add(bias, a.nhwc), "bias + nhwc");
    check_close(ops::add(bias, a.nhwc), plus_bias, rtol, 0, "bias + nhwc values");
    check_nhwc(ops::add(a.nhwc, bias), "nhwc + bias");
    check_nhwc(ops::mul(a.nhwc, 2.0), "nhwc * scalar");
    check_nhwc(ops::gt(a.nhwc, 0.0), "nhwc > scalar");
    // An expanded operand (stride 0) has no say either.
    const Tensor amb = random_tensor({2, 1, 4, 5}, kFloat32, 8);
    check_nhwc(ops::add(amb.expand({2, 3, 4, 5}), a.nhwc), "expanded + nhwc");
    // A layout other than the two is not propagated: contiguous result.
    check_nchw(ops::add(a.nchw.transpose(2, 3), b.nchw.transpose(2, 3)), "transposed + transposed");
    check_nchw(ops::add(random_tensor({3, 4, 5}, kFloat32, 9), random_tensor({3, 4, 5}, kFloat32, 10)), "3-D");
  }
  SUBCASE("differentiable add and relu keep the layout, gradients included") {
    const Tensor x = to_channels_last(a.nchw.to(kFloat64));
    x.requires_grad_();
    const Tensor out = relu(add(x, b.nhwc.to(kFloat64)));
    check_nhwc(out, "relu(x + y)");
    out.backward(ones_like(out));
    check_nhwc(x.grad(), "grad of x");
  }
}

TEST_CASE("channels_last: elementwise layouts walk NHWC operands as one contiguous run") {
  // Note [Elementwise dim order]: dims in the output's memory order, then coalesced.
  const Pair a = random_pair({2, 3, 4, 5}, kFloat32, 11), b = random_pair({2, 3, 4, 5}, kFloat32, 12);
  const Tensor out = empty_channels_last({2, 3, 4, 5}, {kFloat32});
  const ElementwiseLayout all_nhwc = make_elementwise_layout("add", out, {a.nhwc, b.nhwc});
  CHECK(all_nhwc.contiguous);
  CHECK(all_nhwc.ndim == 1);
  // Mixed layouts: the output's order is walked (its stride 1 innermost), the other follows.
  const ElementwiseLayout mixed = make_elementwise_layout("add", out, {a.nhwc, b.nchw});
  CHECK_FALSE(mixed.contiguous);
  CHECK(mixed.strides[0][mixed.ndim - 1] == 1);
  CHECK(mixed.strides[2][mixed.ndim - 1] == 20);  // NCHW's C stride (H * W), innermost for the NHWC output
  // An accumulator (stride 0 in the output) keeps the logical order.
  const Tensor acc = zeros({2, 1, 4, 5}).expand({2, 3, 4, 5});
  const ElementwiseLayout accumulating = make_elementwise_layout("scatter_add", acc, {a.nhwc});
  CHECK(accumulating.strides[0][accumulating.ndim - 1] == 1);
}

TEST_CASE("channels_last: conv2d on NHWC inputs equals NCHW on the CPU") {
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  for (const Case& c :
       {Case{{2, 4, 7, 6}, {6, 4, 3, 3}, {.stride = 1, .padding = 1}},
        Case{{2, 4, 9, 8}, {5, 4, 3, 3}, {.stride = 2, .padding = 1}}, Case{{2, 4, 6, 6}, {8, 4, 1, 1}, {}},
        Case{{1, 3, 11, 11}, {4, 3, 7, 7}, {.stride = 2, .padding = 3}},
        Case{{2, 4, 5, 5}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}}}) {
    CAPTURE(shape_str(c.x));
    CAPTURE(shape_str(c.w));
    const Pair x = random_pair(c.x, kFloat64, 11), w = random_pair(c.w, kFloat64, 12);
    const Tensor bias = random_tensor({c.w[0]}, kFloat64, 13);
    const Tensor ref = ops::conv2d(x.nchw, w.nchw, bias, c.o);
    check_nchw(ref, "NCHW conv");
    for (const Tensor& wt : {w.nchw, w.nhwc}) {
      const Tensor y = ops::conv2d(x.nhwc, wt, bias, c.o);
      if (ref.size(2) * ref.size(3) > 1) check_nhwc(y, "NHWC conv");
      check_close(y, values_of(ref), 1e-12, 1e-12, "conv2d NHWC");
    }
    const Pair g = random_pair(ref.sizes(), kFloat64, 14);
    const Tensor gx_ref = ops::conv2d_backward_input(g.nchw, c.x, w.nchw, c.o);
    const Tensor gx = ops::conv2d_backward_input(g.nhwc, c.x, w.nhwc, c.o);
    check_nhwc(gx, "conv2d_backward_input NHWC");
    check_close(gx, values_of(gx_ref), 1e-12, 1e-12, "conv2d_backward_input NHWC");
    const Tensor gw_ref = ops::conv2d_backward_weight(g.nchw, x.nchw, c.w, c.o);
    const Tensor gw = ops::conv2d_backward_weight(g.nhwc, x.nhwc, c.w, c.o);
    if (c.w[2] * c.w[3] > 1) check_nhwc(gw, "conv2d_backward_weight NHWC");
    check_close(gw, values_of(gw_ref), 1e-12, 1e-12, "conv2d_backward_weight NHWC");
  }
}

namespace {

/// bn(x), relu(bn(x)) or relu(bn(x) + r) (r non-empty) of an NCHW x by naive per-channel
/// loops in double, with the batch statistics; also the updated running statistics.
struct BnRef {
  std::vector<double> y, running_mean, running_var;
};
BnRef naive_bn(const std::vector<double>& x, const std::vector<double>& r, const Shape& s, const std::vector<double>& w,
               const std::vector<double>& b, std::vector<double> rm, std::vector<double> rv, double momentum,
               double eps, bool relu) {
  const int64_t N = s[0], C = s[1], HW = s[2] * s[3], M = N * HW;
  BnRef out;
  out.y.resize(x.size());
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < HW; ++j) sum += x[size_t((n * C + c) * HW + j)];
    const double mean = sum / double(M);
    double sq = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < HW; ++j) sq += std::pow(x[size_t((n * C + c) * HW + j)] - mean, 2);
    const double var = sq / double(M);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < HW; ++j) {
        const size_t i = size_t((n * C + c) * HW + j);
        double v = (x[i] - mean) / std::sqrt(var + eps) * w[size_t(c)] + b[size_t(c)];
        if (!r.empty()) v += r[i];
        if (relu) v = std::max(v, 0.0);
        out.y[i] = v;
      }
    rm[size_t(c)] = (1 - momentum) * rm[size_t(c)] + momentum * mean;
    rv[size_t(c)] = (1 - momentum) * rv[size_t(c)] + momentum * sq / double(M - 1);
  }
  out.running_mean = rm, out.running_var = rv;
  return out;
}

}  // namespace

TEST_CASE("channels_last: batch_norm and batch_norm_add_relu on NHWC inputs (CPU)") {
  const Shape s{3, 4, 5, 6};
  const int64_t C = s[1];
  for (DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    const Pair x = random_pair(s, dtype, 21), r = random_pair(s, dtype, 22);
    const Tensor w = random_tensor({C}, kFloat32, 23, Layout::Contiguous, 0.5, 1.5);
    const Tensor b = random_tensor({C}, kFloat32, 24);
    const Tensor wc = w.to(dtype == kFloat64 ? kFloat64 : kFloat32), bc = b.to(wc.dtype());
    const std::vector<double> rm0 = random_values(C, 25, -0.5, 0.5), rv0 = random_values(C, 26, 0.5, 1.5);
    const double rtol = dtype == kFloat64 ? 1e-10 : 1e-4, atol = rtol;
    enum Mode { Plain, Relu, AddRelu };
    for (Mode mode : {Plain, Relu, AddRelu}) {
      CAPTURE(int(mode));
      const bool add_relu = mode == AddRelu;
      // The op under test: batch_norm, or batch_norm_add_relu with or without a residual.
      auto forward = [&](const Tensor& xx, const Tensor& rr, const Tensor& m, const Tensor& v) {
        return mode == Plain ? ops::batch_norm(xx, m, v, wc, bc, true)
                             : ops::batch_norm_add_relu(xx, add_relu ? rr : Tensor(), m, v, wc, bc, true);
      };
      auto backward = [&](const Tensor& gg, const Tensor& xx, const ops::BatchNormResult& f) {
        return mode == Plain
                   ? ops::batch_norm_backward(gg, xx, wc, f.mean, f.invstd, true)
                   : ops::batch_norm_add_relu_backward(gg, xx, f.out, wc, bc, f.mean, f.invstd, true, {},
                                                       {.reserve = Tensor(), .eps = 1e-5, .residual = add_relu});
      };
      const BnRef ref = naive_bn(values_of(x.nchw), add_relu ? values_of(r.nchw) : std::vector<double>{}, s,
                                 values_of(w), values_of(b), rm0, rv0, 0.1, 1e-5, mode != Plain);
      const Tensor rm = from_vector(rm0, {C}, TensorOptions(wc.dtype())),
                   rv = from_vector(rv0, {C}, TensorOptions(wc.dtype()));
      const ops::BatchNormResult y = forward(x.nhwc, r.nhwc, rm, rv);
      check_nhwc(y.out, "batch norm output");
      CHECK_FALSE(y.reserve.defined());  // no cuDNN on the CPU
      check_close(y.out, ref.y, rtol, atol, "training output");
      check_close(rm, ref.running_mean, rtol, atol, "running_mean");
      check_close(rv, ref.running_var, rtol, atol, "running_var");
      // Backward equals the NCHW one.
      const Pair g = random_pair(s, dtype, 27);
      const ops::BatchNormResult yn = forward(x.nchw, r.nchw, Tensor(), Tensor());
      check_nchw(yn.out, "NCHW batch norm output");
      const ops::BatchNormGrads gn = backward(g.nchw, x.nchw, yn), gh = backward(g.nhwc, x.nhwc, y);
      check_nhwc(gh.x, "grad_x");
      check_close(gh.x, values_of(gn.x), rtol, atol, "grad_x");
      check_close(gh.weight, values_of(gn.weight), rtol, atol, "grad_weight");
      check_close(gh.bias, values_of(gn.bias), rtol, atol, "grad_bias");
      if (add_relu) {
        check_nhwc(gh.residual, "grad_residual");
        check_close(gh.residual, values_of(gn.residual), rtol, atol, "grad_residual");
      } else {
        CHECK_FALSE(gh.residual.defined());
      }
    }
    // Eval: the running statistics.
    const Tensor rm = from_vector(rm0, {C}, TensorOptions(wc.dtype())),
                 rv = from_vector(rv0, {C}, TensorOptions(wc.dtype()));
    const ops::BatchNormResult e = ops::batch_norm_add_relu(x.nhwc, r.nhwc, rm, rv, wc, bc, false);
    check_nhwc(e.out, "eval output");
    const std::vector<double> vx = values_of(x.nchw), vr = values_of(r.nchw), vw = values_of(w), vb = values_of(b);
    std::vector<double> ev(vx.size());
    for (size_t i = 0; i < vx.size(); ++i) {
      const size_t c = (i / 30) % 4;
      ev[i] = std::max((vx[i] - rm0[c]) / std::sqrt(rv0[c] + 1e-5) * vw[c] + vb[c] + vr[i], 0.0);
    }
    check_close(e.out, ev, rtol, atol, "eval output");
  }
}

// Note [Batch norm add ReLU]: residual = -round(bn(x)) makes bn(x) + residual the rounding
// error of bn(x), tiny and of either sign. Rounded once, out keeps that sign; rounding bn(x)
// first (the old bn + add + relu fallback) made every sum exactly 0, so out and the
// ReLU-masked gradients were all 0 where the sum is positive.
TEST_CASE("channels_last: batch_norm_add_relu rounds bn(x) + residual once (ReLU mask near 0)") {
  const Shape s{2, 8, 5, 6};
  const int64_t C = s[1], HW = s[2] * s[3];
  for (DType t : {kFloat16, kBFloat16}) {
    for (bool nhwc : {false, true}) {
      CAPTURE(dtype_name(t));
      CAPTURE(nhwc);
      const Tensor xv = random_tensor(s, kFloat64, 61).to(t).to(kFloat64);  // the values x holds
      const std::vector<double> vx = values_of(xv);
      const std::vector<double> rm = values_of(random_tensor({C}, kFloat64, 62, Layout::Contiguous, -0.5, 0.5));
      const std::vector<double> rv = values_of(random_tensor({C}, kFloat64, 63, Layout::Contiguous, 0.5, 1.5));
      const std::vector<double> w = values_of(random_tensor({C}, kFloat64, 64, Layout::Contiguous, 0.5, 1.5));
      const std::vector<double> b = values_of(random_tensor({C}, kFloat64, 65));
      std::vector<double> y(vx.size()), z(vx.size());  // bn(x) and bn(x) + residual, in float64
      for (size_t i = 0; i < vx.size(); ++i) {
        const size_t c = (i / size_t(HW)) % size_t(C);
        y[i] = (vx[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c];
      }
      Tensor residual = neg(from_vector(y, s, TensorOptions(kFloat64)).to(t));  // -round(bn(x)): exact in t
      const std::vector<double> vr = values_of(residual);
      for (size_t i = 0; i < vx.size(); ++i) z[i] = y[i] + vr[i];
      Tensor x = xv.to(t);
      if (nhwc) x = to_channels_last(x), residual = to_channels_last(residual);
      auto f32 = [&](const std::vector<double>& v) {
        return from_vector(v, {C}, TensorOptions(kFloat64)).to(kFloat32);
      };
      const ops::BatchNormResult r =
          ops::batch_norm_add_relu(x, residual, f32(rm), f32(rv), f32(w), f32(b), false, 0.1, 1e-5);
      const Tensor g = random_tensor(s, t, 66);
      const ops::BatchNormGrads gr =
          ops::batch_norm_add_relu_backward(g, x, r.out, f32(w), f32(b), r.mean, r.invstd, false, {},
                                            {.reserve = Tensor(), .eps = 1e-5, .residual = true});
      const std::vector<double> out = values_of(r.out), vg = values_of(g), gres = values_of(gr.residual);
      int decided = 0, positive = 0;
      for (size_t i = 0; i < z.size(); ++i) {
        if (std::fabs(z[i]) <= 1e-5 * (std::fabs(y[i]) + 1.0)) continue;  // within float32's own error: either sign
        ++decided;
        CAPTURE(i);
        CAPTURE(z[i]);
        if (z[i] > 0) {
          ++positive;
          CHECK(out[i] == doctest::Approx(z[i]).epsilon(default_rtol(t)));
          CHECK(gres[i] == vg[i]);
        } else {
          CHECK(out[i] == 0.0);
          CHECK(gres[i] == 0.0);
        }
      }
      CHECK(decided > int(z.size()) / 2);  // the test decides most elements...
      CHECK(positive > decided / 4);       // ...and many of them pass the mask
    }
  }
}

TEST_CASE("channels_last: batch_norm_add_relu errors") {
  const Tensor x = random_tensor({2, 3, 4, 4}, kFloat32, 31), w = ones({3}), b = zeros({3});
  check_error(
      [&] {
        ops::batch_norm_add_relu(x, random_tensor({2, 3, 4, 5}, kFloat32, 32), Tensor(), Tensor(), w, b, true);
      },
      {"batch_norm_add_relu", "residual", "[2, 3, 4, 5]", "[2, 3, 4, 4]"});
  check_error([&] { ops::batch_norm_add_relu(x, x.to(kFloat64), Tensor(), Tensor(), w, b, true); },
              {"batch_norm_add_relu", "float64", "float32"});
  check_error([&] { batch_norm_add_relu(x, Tensor(), Tensor(), Tensor(), w, b, true); },
              {"batch_norm_add_relu", "residual", "undefined"});
  check_error([&] { ops::batch_norm_add_relu(x, x, Tensor(), Tensor(), ones({4}), b, true); },
              {"batch_norm_add_relu", "weight", "[4]"});
  check_error([&] { ops::batch_norm_add_relu(x, x, Tensor(), Tensor(), w, b, false); },
              {"batch_norm_add_relu", "running_mean", "eval"});
  const ops::BatchNormResult r = ops::batch_norm_add_relu(x, x, Tensor(), Tensor(), w, b, true);
  check_error([&] { ops::batch_norm_add_relu_backward(r.out, x, r.out.narrow(3, 0, 2), w, b, r.mean, r.invstd, true); },
              {"batch_norm_add_relu_backward", "out", "[2, 3, 4, 2]"});
}

TEST_CASE("channels_last: pooling on NHWC inputs (CPU)") {
  const Pair x = random_pair({2, 3, 9, 8}, kFloat64, 41);
  SUBCASE("max_pool2d") {
    const MaxPool2dOptions o{.stride = 2, .padding = 1};
    const ops::MaxPool2dResult ref = ops::max_pool2d(x.nchw, 3, o), y = ops::max_pool2d(x.nhwc, 3, o);
    check_nhwc(y.out, "max_pool2d out");
    check_nhwc(y.indices, "max_pool2d indices");
    check_close(y.out, values_of(ref.out), 0, 0, "max_pool2d");
    check_close(y.indices, values_of(ref.indices), 0, 0, "max_pool2d indices");
    const Pair g = random_pair(ref.out.sizes(), kFloat64, 42);
    const Tensor gx = ops::max_pool2d_backward(g.nhwc, y.indices, x.nchw.sizes(), 3, o);
    check_nhwc(gx, "max_pool2d_backward");
    check_close(gx, values_of(ops::max_pool2d_backward(g.nchw, ref.indices, x.nchw.sizes(), 3, o)), 0, 0,
                "max_pool2d_backward");
  }
  SUBCASE("avg_pool2d") {
    const AvgPool2dOptions o{.stride = 2, .padding = 1, .count_include_pad = false};
    const Tensor ref = ops::avg_pool2d(x.nchw, 3, o), y = ops::avg_pool2d(x.nhwc, 3, o);
    check_nhwc(y, "avg_pool2d");
    check_close(y, values_of(ref), 1e-12, 1e-12, "avg_pool2d");
    const Pair g = random_pair(ref.sizes(), kFloat64, 43);
    const Tensor gx = ops::avg_pool2d_backward(g.nhwc, x.nchw.sizes(), 3, o);
    check_nhwc(gx, "avg_pool2d_backward");
    check_close(gx, values_of(ops::avg_pool2d_backward(g.nchw, x.nchw.sizes(), 3, o)), 1e-12, 1e-12,
                "avg_pool2d_backward");
  }
  SUBCASE("adaptive_avg_pool2d") {
    const Tensor ref = ops::adaptive_avg_pool2d(x.nchw, {3, 2}), y = ops::adaptive_avg_pool2d(x.nhwc, {3, 2});
    check_nhwc(y, "adaptive_avg_pool2d");
    check_close(y, values_of(ref), 1e-12, 1e-12, "adaptive_avg_pool2d");
    const Pair g = random_pair(ref.sizes(), kFloat64, 44);
    const Tensor gx = ops::adaptive_avg_pool2d_backward(g.nhwc, x.nchw.sizes());
    check_nhwc(gx, "adaptive_avg_pool2d_backward");
    check_close(gx, values_of(ops::adaptive_avg_pool2d_backward(g.nchw, x.nchw.sizes())), 1e-12, 1e-12,
                "adaptive_avg_pool2d_backward");
  }
}

TEST_CASE("channels_last: gradcheck through conv2d and batch norm on NHWC inputs") {
  auto leaf = [](const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
    Tensor t = random_tensor(s, kFloat64, seed, Layout::Contiguous, lo, hi);
    t.requires_grad_();
    return t;
  };
  const Tensor x = leaf({2, 3, 5, 4}, 51), w = leaf({4, 3, 3, 3}, 52), cb = leaf({4}, 53);
  const Tensor bw = leaf({4}, 54, 0.5, 1.5), bb = leaf({4}, 55), r = leaf({2, 4, 3, 2}, 56);
  for (bool training : {true, false}) {
    CAPTURE(training);
    const Tensor rm = random_tensor({4}, kFloat64, 57, Layout::Contiguous, -0.2, 0.2);
    const Tensor rv = random_tensor({4}, kFloat64, 58, Layout::Contiguous, 0.5, 1.5);
    // conv (channels-last input and weight, stride 2) -> batch_norm_add_relu with a channels-last residual.
    auto f = [&](const TensorList& in) {
      const Tensor y = conv2d(to_channels_last(in[0]), to_channels_last(in[1]), in[2], {.stride = 2, .padding = 1});
      CHECK(suggests_channels_last(y));
      const Tensor z = batch_norm_add_relu(y, to_channels_last(in[5]), rm.clone(), rv.clone(), in[3], in[4], training);
      CHECK(suggests_channels_last(z));
      return batch_norm_relu(z, rm.clone(), rv.clone(), in[3], in[4], training);
    };
    const auto res = gradcheck(f, {x, w, cb, bw, bb, r});
    CHECK_MESSAGE(res.ok, res.report);
    auto g = [&](const TensorList& in) {
      return batch_norm(to_channels_last(in[0]), rm.narrow(0, 0, 3).clone(), rv.narrow(0, 0, 3).clone(), in[1], in[2],
                        training);
    };
    const Tensor w3 = leaf({3}, 59, 0.5, 1.5), b3 = leaf({3}, 60);
    const auto res2 = gradcheck(g, {x, w3, b3});
    CHECK_MESSAGE(res2.ok, res2.report);
  }
  // Pools on channels-last inputs.
  auto p = [&](const TensorList& in) {
    const Tensor y = max_pool2d(to_channels_last(in[0]), 2, {.stride = 1});
    return adaptive_avg_pool2d(avg_pool2d(y, 2, {.stride = 1, .padding = 1}), {2, 2});
  };
  const auto res3 = gradcheck(p, {x});
  CHECK_MESSAGE(res3.ok, res3.report);
}

TEST_CASE("channels_last: nn::to_channels_last converts conv weights in place") {
  nn::Conv2d conv(3, 5, 3, {.padding = 1});
  nn::Conv2d pointwise(3, 5, 1);
  const Tensor handle = conv.weight;  // another handle to the same parameter
  const std::vector<double> before = values_of(conv.weight);
  const Tensor x = random_tensor({2, 3, 6, 6}, kFloat32, 61);
  const Tensor y_ref = conv.forward(x);
  nn::to_channels_last(conv);
  nn::to_channels_last(pointwise);
  CHECK(suggests_channels_last(conv.weight));
  CHECK(suggests_channels_last(handle));
  CHECK(conv.weight.requires_grad());
  CHECK(conv.bias.is_contiguous());
  CHECK(is_channels_last(pointwise.weight));  // 1x1: both layouts at once
  check_close(conv.weight, before, 0, 0, "weight values");
  const Tensor xl = to_channels_last(x);
  const Tensor y = conv.forward(xl);
  check_nhwc(y, "Conv2d output");
  check_close(y, values_of(y_ref), 1e-5, 1e-5, "Conv2d forward");
  sum(y).backward();
  check_nhwc(conv.weight.grad(), "weight gradient");
  // An NCHW input with a channels-last weight also runs channels-last (the weight suggests it).
  check_nhwc(conv.forward(x), "Conv2d output of an NCHW input");
}

TEST_CASE("channels_last: is_dense, same_dense_layout and empty_in_layout") {
  const Tensor nchw = zeros({2, 3, 4, 5});
  const Tensor nhwc = empty_channels_last({2, 3, 4, 5}, {});
  CHECK(is_dense(nchw));
  CHECK(is_dense(nhwc));
  CHECK(is_dense(nchw.transpose(1, 3)));             // any permutation
  CHECK_FALSE(is_dense(nchw.narrow(3, 0, 4)));       // a gap at the end of each row
  CHECK_FALSE(is_dense(zeros({5}).expand({3, 5})));  // elements seen twice
  CHECK(is_dense(zeros({1, 5}).expand({1, 5})));     // a size-1 dim's stride does not matter
  CHECK(is_dense(zeros({0, 3})));                    // nothing to walk
  CHECK(same_dense_layout(nhwc, empty_channels_last({2, 3, 4, 5}, {kFloat16})));
  CHECK_FALSE(same_dense_layout(nhwc, nchw));
  CHECK_FALSE(same_dense_layout(nchw, zeros({2, 3, 5, 4})));                   // sizes differ
  CHECK_FALSE(same_dense_layout(nchw.narrow(3, 0, 4), nchw.narrow(3, 0, 4)));  // not dense
  const Tensor c1 = empty_channels_last({2, 1, 4, 5}, {});                     // C == 1: ambiguous, still one order
  CHECK(same_dense_layout(c1, zeros({2, 1, 4, 5})));
  CHECK(empty_in_layout(nhwc, {kFloat64}).strides() == nhwc.strides());
  CHECK(empty_in_layout(nhwc, {kFloat64}).dtype() == kFloat64);
  CHECK(empty_in_layout(nchw.narrow(3, 0, 4), {}).is_contiguous());  // not dense: contiguous
}
