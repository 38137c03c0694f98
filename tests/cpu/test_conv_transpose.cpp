// conv_transpose2d (Note [Transposed convolution]): the raw op and its gradients against a
// naive float64 scatter written from torch's definition (each input pixel adds w times itself
// into the output window at stride, dilation and padding), over strides, padding,
// output_padding (also >= stride, below dilation), groups, depthwise, bias, non-square,
// unbatched, every dtype and layout, channels-last; gradcheck and gradgradcheck; empty batches
// and no input channels; errors; the ConvTranspose2d module with forward(x, output_size).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "autograd/autocast.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/reduce.h"
#include "nn/channels_last.h"
#include "nn/conv.h"
#include "tensor/memory_format.h"
#include "tensor/ops/conv.h"
#include "tests/cpu/conv_reference.h"  // check_scaled
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

struct Case {
  Shape x, w;  // (N, C_in, H, W), (C_in, C_out / groups, R, S)
  ConvTranspose2dOptions o;
  bool bias = true;
  std::string name() const {
    return detail::str_cat("x", shape_str(x), " w", shape_str(w), " stride", o.stride.str(), " pad", o.padding.str(),
                           " out_pad", o.output_padding.str(), " dil", o.dilation.str(), " groups ", o.groups,
                           bias ? " bias" : "");
  }
};

const Case kCases[] = {
    {{2, 3, 4, 5}, {3, 2, 3, 3}, {}},                           // stride 1: a full conv
    {{2, 4, 5, 4}, {4, 3, 4, 4}, {.stride = 2, .padding = 1}},  // a decoder's 2x upsampling
    {{1, 3, 3, 4}, {3, 2, 3, 2}, {.stride = {2, 3}, .padding = {1, 0}, .output_padding = {1, 2}}},  // output_padding
    {{2, 4, 4, 3}, {4, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 2}, false},                  // groups
    {{2, 3, 5, 5}, {3, 1, 3, 3}, {.padding = 1, .groups = 3}},                                      // depthwise
    {{2, 2, 3, 3},
     {2, 2, 3, 2},
     {.stride = 1, .output_padding = {1, 0}, .dilation = {2, 1}}},  // output_padding >= stride
    {{1, 2, 3, 4}, {2, 3, 2, 3}, {.stride = 2, .padding = {0, 1}, .output_padding = 1, .dilation = {3, 2}}},
    {{3, 5, 4, 4}, {5, 2, 1, 1}, {}},                                     // 1x1
    {{2, 3, 2, 3}, {3, 4, 2, 2}, {.stride = 2}, false},                   // stride == kernel
    {{1, 2, 6, 5}, {2, 2, 5, 3}, {.stride = {1, 2}, .padding = {2, 1}}},  // padding eats the rim
};

/// The reference, from torch's definition: y[n, g Cog + co, ih sh - ph + r dh, iw sw - pw + s dw]
/// += x[n, g Cig + ci, ih, iw] w[g Cig + ci, co, r, s], plus the bias; with gy, the gradients by
/// the chain rule on every product, and each element's sum of |terms| (its rounding scale).
struct Reference {
  Shape ys;
  std::vector<double> y, y_scale, gx, gx_scale, gw, gw_scale, gb;
};

Reference reference(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w, const Shape& ws,
                    const std::vector<double>* b, const ConvTranspose2dOptions& o,
                    const std::vector<double>* gy = nullptr) {
  const int64_t N = xs[0], Ci = xs[1], H = xs[2], W = xs[3], Cog = ws[1], R = ws[2], S = ws[3];
  const int64_t G = o.groups, Cig = Ci / G, Co = Cog * G;
  const int64_t OH = (H - 1) * o.stride.h - 2 * o.padding.h + o.dilation.h * (R - 1) + o.output_padding.h + 1;
  const int64_t OW = (W - 1) * o.stride.w - 2 * o.padding.w + o.dilation.w * (S - 1) + o.output_padding.w + 1;
  Reference r;
  r.ys = {N, Co, OH, OW};
  const size_t ny = size_t(N * Co * OH * OW);
  r.y.assign(ny, 0.0), r.y_scale.assign(ny, 0.0);
  r.gx.assign(x.size(), 0.0), r.gx_scale.assign(x.size(), 0.0);
  r.gw.assign(w.size(), 0.0), r.gw_scale.assign(w.size(), 0.0);
  r.gb.assign(size_t(Co), 0.0);
  auto yi = [&](int64_t n, int64_t c, int64_t h, int64_t v) { return size_t(((n * Co + c) * OH + h) * OW + v); };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < Co; ++c)
      for (int64_t h = 0; h < OH; ++h)
        for (int64_t v = 0; v < OW; ++v) {
          const double bias = b ? (*b)[size_t(c)] : 0.0;
          r.y[yi(n, c, h, v)] = bias, r.y_scale[yi(n, c, h, v)] = std::fabs(bias);
          if (gy) r.gb[size_t(c)] += (*gy)[yi(n, c, h, v)];
        }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t ci = 0; ci < Cig; ++ci)
        for (int64_t ih = 0; ih < H; ++ih)
          for (int64_t iw = 0; iw < W; ++iw)
            for (int64_t co = 0; co < Cog; ++co)
              for (int64_t i = 0; i < R; ++i)
                for (int64_t j = 0; j < S; ++j) {
                  const int64_t oh = ih * o.stride.h - o.padding.h + i * o.dilation.h;
                  const int64_t ow = iw * o.stride.w - o.padding.w + j * o.dilation.w;
                  if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                  const size_t xi = size_t(((n * Ci + g * Cig + ci) * H + ih) * W + iw);
                  const size_t wi = size_t((((g * Cig + ci) * Cog + co) * R + i) * S + j);
                  const size_t o_ = yi(n, g * Cog + co, oh, ow);
                  r.y[o_] += x[xi] * w[wi];
                  r.y_scale[o_] += std::fabs(x[xi] * w[wi]);
                  if (!gy) continue;
                  r.gx[xi] += (*gy)[o_] * w[wi];
                  r.gx_scale[xi] += std::fabs((*gy)[o_] * w[wi]);
                  r.gw[wi] += (*gy)[o_] * x[xi];
                  r.gw_scale[wi] += std::fabs((*gy)[o_] * x[xi]);
                }
  return r;
}

constexpr DType kAllFloat[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

}  // namespace

TEST_CASE("conv_transpose2d: forward matches the naive float64 scatter in every dtype and layout") {
  uint64_t seed = 1;
  for (const Case& c : kCases)
    for (DType t : kAllFloat)
      for (Layout layout : kAllLayouts)
        for (bool channels_last : {false, true}) {
          CAPTURE(c.name());
          CAPTURE(name_of(t, layout));
          CAPTURE(channels_last);
          Tensor x = random_tensor(c.x, t, ++seed, layout);
          if (channels_last) x = to_channels_last(x);
          const Tensor w = random_tensor(c.w, t, ++seed, layout == Layout::Contiguous ? layout : Layout::Strided);
          const Tensor b = c.bias ? random_tensor({c.w[1] * c.o.groups}, t, ++seed) : Tensor();
          const Tensor y = ops::conv_transpose2d(x, w, b, c.o);
          const std::vector<double> bv = c.bias ? values_of(b) : std::vector<double>();
          const Reference ref = reference(values_of(x), c.x, values_of(w), c.w, c.bias ? &bv : nullptr, c.o);
          REQUIRE(y.sizes() == ref.ys);
          CHECK(y.dtype() == t);
          CHECK(y.sizes() == ops::conv_transpose2d_output_shape("test", c.x, c.w, c.o));
          // 16-bit: the product is rounded before the bias is added (one more rounding).
          check_scaled(values_of(y), ref.y, ref.y_scale, 2 * default_rtol(t), "conv_transpose2d " + c.name());
        }
}

TEST_CASE("conv_transpose2d: input, weight and bias gradients match the naive scatter's chain rule") {
  uint64_t seed = 200;
  for (const Case& c : kCases)
    for (DType t : {kFloat32, kFloat64, kBFloat16}) {
      CAPTURE(c.name());
      CAPTURE(dtype_name(t));
      Tensor x = random_tensor(c.x, t, ++seed), w = random_tensor(c.w, t, ++seed);
      Tensor b = c.bias ? random_tensor({c.w[1] * c.o.groups}, t, ++seed) : Tensor();
      x.requires_grad_(), w.requires_grad_();
      if (b.defined()) b.requires_grad_();
      const Tensor y = conv_transpose2d(x, w, b, c.o);
      CHECK(y.grad_fn_name() == "ConvTranspose2dBackward");
      const Tensor gy = random_tensor(y.sizes(), t, ++seed, Layout::Transposed);
      y.backward(gy);
      const std::vector<double> gyv = values_of(gy);
      const Reference ref = reference(values_of(x), c.x, values_of(w), c.w, nullptr, c.o, &gyv);
      REQUIRE(x.grad().sizes() == c.x);
      REQUIRE(w.grad().sizes() == c.w);
      check_scaled(values_of(x.grad()), ref.gx, ref.gx_scale, default_rtol(t), "grad_x " + c.name());
      check_scaled(values_of(w.grad()), ref.gw, ref.gw_scale, default_rtol(t), "grad_w " + c.name());
      if (c.bias) {
        std::vector<double> gb_scale(ref.gb.size(), 0.0);
        for (size_t i = 0; i < gyv.size(); ++i)
          gb_scale[(i / size_t(ref.ys[2] * ref.ys[3])) % gb_scale.size()] += std::fabs(gyv[i]);
        check_scaled(values_of(b.grad()), ref.gb, gb_scale, default_rtol(t), "grad_bias " + c.name());
      }
    }
}

TEST_CASE("conv_transpose2d: gradcheck and gradgradcheck in float64, output_padding past the stride included") {
  const Case picks[] = {kCases[1], kCases[2], kCases[3], kCases[5], kCases[6]};
  uint64_t seed = 500;
  for (const Case& c : picks) {
    CAPTURE(c.name());
    const Shape bs{c.w[1] * c.o.groups};
    const TensorList in = {leaf(c.x, ++seed), leaf(c.w, ++seed), leaf(bs, ++seed)};
    const auto f = [o = c.o](const TensorList& v) { return conv_transpose2d(v[0], v[1], v[2], o); };
    check_gradcheck(f, in);
    const autograd::GradcheckResult r = autograd::gradgradcheck(f, in);
    CHECK_MESSAGE(r.ok, r.report);
  }
}

TEST_CASE("conv_transpose2d: saves only what backward needs; unbatched input; empty batch; no input channels") {
  Tensor x = random_tensor({2, 3, 4, 4}, kFloat64, 1);
  Tensor w = leaf({3, 2, 3, 3}, 2);
  Tensor y = conv_transpose2d(x, w, Tensor(), {.stride = 2});
  y.backward(ones_like(y));
  CHECK(w.grad().defined());
  CHECK_FALSE(x.grad().defined());

  const Tensor wf = random_tensor({3, 2, 3, 3}, kFloat32, 3), bf = random_tensor({2}, kFloat32, 4);
  const Tensor x3 = random_tensor({3, 4, 5}, kFloat32, 5);
  const Tensor y3 = conv_transpose2d(x3, wf, bf, {.stride = 2, .padding = 1});
  CHECK(y3.sizes() == Shape{2, 7, 9});
  check_close(y3, values_of(ops::conv_transpose2d(x3.unsqueeze(0), wf, bf, {.stride = 2, .padding = 1})), 0, 0,
              "unbatched");
  CHECK(ops::conv_transpose2d(zeros({0, 3, 4, 5}), wf, bf).sizes() == Shape{0, 2, 6, 7});
  // No input channels: every output is the bias.
  const Tensor y0 = ops::conv_transpose2d(zeros({2, 0, 3, 3}), zeros({0, 2, 2, 2}), bf);
  REQUIRE(y0.sizes() == Shape{2, 2, 4, 4});
  const std::vector<double> bv = values_of(bf), v0 = values_of(y0);
  for (size_t i = 0; i < v0.size(); ++i) CHECK(v0[i] == bv[(i / 16) % 2]);
  // A channels-last input gives a channels-last output (the convolution's layout rule).
  CHECK(is_channels_last(ops::conv_transpose2d(to_channels_last(random_tensor({2, 3, 4, 4}, kFloat32, 6)), wf)));
}

TEST_CASE("conv_transpose2d: under CPU autocast and with a channels-last weight, as the plain op") {
  // Autocast runs it in bfloat16 (conv2d's policy) and the float32 weight's gradient comes back
  // in float32, the bfloat16 op's.
  const Tensor x = random_tensor({2, 4, 5, 5}, kFloat32, 20);
  Tensor w = random_tensor({4, 3, 3, 3}, kFloat32, 21, Layout::Contiguous, -0.5, 0.5);
  w.requires_grad_();
  Tensor y;
  {
    AutocastGuard guard(kCPU, kBFloat16);
    y = conv_transpose2d(x, w, Tensor(), {.stride = 2});
  }
  CHECK(y.dtype() == kBFloat16);
  check_close(y, values_of(ops::conv_transpose2d(x.to(kBFloat16), w.detach().to(kBFloat16), Tensor(), {.stride = 2})),
              0, 0, "autocast forward");
  y.backward(ones_like(y));
  CHECK(w.grad().dtype() == kFloat32);

  // nn::to_channels_last(module) stores the weight NHWC; its gradient keeps that layout and the values.
  manual_seed(5);
  nn::ConvTranspose2d up(4, 3, 3, {.stride = 2, .padding = 1, .output_padding = 1});
  const Tensor reference_y = up(x);
  reference_y.backward(ones_like(reference_y));
  const std::vector<double> reference_gw = values_of(up.weight.grad());
  up.zero_grad();
  nn::to_channels_last(up);
  REQUIRE(is_channels_last(up.weight));
  const Tensor y_cl = up(to_channels_last(x));
  check_close(y_cl, values_of(reference_y), 1e-6, 1e-6, "channels-last forward");
  y_cl.backward(ones_like(y_cl));
  CHECK(is_channels_last(up.weight.grad()));
  check_close(up.weight.grad(), reference_gw, 1e-5, 1e-5, "channels-last weight gradient");
}

TEST_CASE("conv_transpose2d: errors name the op, the shapes and the settings") {
  const Tensor x = zeros({2, 3, 4, 4});
  check_error(
      [&] {
        ops::conv_transpose2d(x, zeros({4, 2, 3, 3}));
      },
      {"conv_transpose2d", "[2, 3, 4, 4]", "[4, 2, 3, 3]", "3 channels", "in_channels, out_channels"});
  check_error([&] { conv_transpose2d(x, zeros({4, 2, 3, 3})); }, {"conv_transpose2d", "3 channels"});
  check_error(
      [&] {
        ops::conv_transpose2d(x, zeros({3, 2, 3, 3}), Tensor(), {.groups = 2});
      },
      {"conv_transpose2d", "groups=2", "must divide", "(3"});
  check_error(
      [&] {
        ops::conv_transpose2d(x, zeros({3, 2, 3, 3}), Tensor(), {.stride = 2, .output_padding = 2});
      },
      {"conv_transpose2d", "output_padding (2, 2)", "stride (2, 2)", "dilation (1, 1)"});
  check_error(
      [&] {
        ops::conv_transpose2d(x, zeros({3, 2, 3, 3}), Tensor(), {.output_padding = {0, -1}});
      },
      {"output_padding (0, -1)"});
  check_error(
      [&] {
        ops::conv_transpose2d(zeros({1, 3, 1, 1}), zeros({3, 2, 1, 1}), Tensor(), {.padding = 1});
      },
      {"conv_transpose2d", "-1x-1", "at least 1x1", "padding (1, 1)"});
  check_error(
      [&] {
        ops::conv_transpose2d(x, zeros({3, 2, 3, 3}), zeros({3}));
      },
      {"conv_transpose2d", "bias", "[3]", "[2]"});
  check_error([&] { ops::conv_transpose2d(x, zeros({3, 2, 3, 3}, kFloat64)); }, {"float64", "same dtype"});
  check_error(
      [&] {
        ops::conv_transpose2d(zeros({2, 3, 0, 4}), zeros({3, 2, 3, 3}));
      },
      {"conv_transpose2d", "image must not be empty", "[2, 3, 0, 4]"});
  check_error([&] { ops::conv_transpose2d(zeros({4, 4}), zeros({3, 2, 3, 3})); }, {"4-D input", "[4, 4]"});
  check_error([&] { ops::conv_transpose2d(x, zeros({3, 2, 3})); }, {"4-D weight", "[3, 2, 3]"});
  check_error([&] { ops::conv_transpose2d(x, zeros({3, 2, 3, 3}), Tensor(), {.stride = 0}); }, {"stride", "(0, 0)"});
}

TEST_CASE("nn: ConvTranspose2d has torch's parameters, init, printout and forward(x, output_size)") {
  manual_seed(0);
  nn::ConvTranspose2d up(6, 8, 3, {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2});
  const auto named = up.named_parameters();
  REQUIRE(named.size() == 2);
  CHECK(named[0].first == "weight");
  CHECK(up.weight.sizes() == Shape{6, 4, 3, 3});
  CHECK(up.bias.sizes() == Shape{8});
  // torch's fan_in of a transposed weight is its second dim times the kernel: 4 * 3 * 3.
  const double bound = 1.0 / std::sqrt(36.0);
  CHECK(max_abs(up.weight) <= bound);
  CHECK(max_abs(up.weight) > 0.8 * bound);
  CHECK(max_abs(up.bias) <= bound);
  CHECK(up.extra_repr() == "6, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1), groups=2");

  const Tensor x = random_tensor({2, 6, 5, 4}, kFloat32, 5);
  const Tensor y = up(x);
  CHECK(y.sizes() == Shape{2, 8, 10, 8});
  check_close(y, values_of(ops::conv_transpose2d(x, up.weight, up.bias, up.options)), 0, 0, "module forward");
  y.backward(ones_like(y));
  CHECK(up.weight.grad().sizes() == up.weight.sizes());
  CHECK(up.bias.grad().defined());

  // forward(x, output_size) picks output_padding: 9 or 10 rows from 5 at stride 2.
  nn::ConvTranspose2d plain(6, 2, 3, {.stride = 2, .padding = 1, .bias = false});
  CHECK(plain.extra_repr() == "6, 2, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=false");
  CHECK(plain.forward(x).sizes() == Shape{2, 2, 9, 7});
  const Tensor y10 = plain.forward(x, {10, 7});
  CHECK(y10.sizes() == Shape{2, 2, 10, 7});
  check_close(y10,
              values_of(ops::conv_transpose2d(x, plain.weight, Tensor(),
                                              {.stride = 2, .padding = 1, .output_padding = {1, 0}})),
              0, 0, "output_size");
  check_error([&] { plain.forward(x, {11, 7}); }, {"ConvTranspose2d", "(11, 7)", "(9, 7)", "(10, 8)"});
  check_error([] { nn::ConvTranspose2d(6, 8, 3, {.groups = 4}); }, {"ConvTranspose2d", "groups=4"});
}
