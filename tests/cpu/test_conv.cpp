// conv2d: the raw forward and both backward products against a naive 7-loop float64
// convolution (strides, padding, dilation, groups incl. depthwise, non-square, batches,
// bias) in every dtype and layout; gradcheck of the differentiable conv2d; errors; the
// Conv2d module.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "autograd/gradcheck.h"
#include "autograd/ops/conv.h"
#include "core/threads.h"
#include "nn/conv.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/reduce.h"
#include "tests/cpu/conv_reference.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::gradcheck;

namespace {

struct ConvCase {
  Shape x, w;  // (N, C, H, W), (K, C / groups, R, S)
  Conv2dOptions o;
  bool bias = true;
  std::string name() const {
    return detail::str_cat("x", shape_str(x), " w", shape_str(w), " stride", o.stride.str(), " pad", o.padding.str(),
                           " dil", o.dilation.str(), " groups ", o.groups, bias ? " bias" : "");
  }
};

const ConvCase kCases[] = {
    {{2, 3, 5, 7}, {4, 3, 3, 2}, {}},                                                         // non-square everything
    {{2, 3, 7, 6}, {4, 3, 3, 3}, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}}},  // all options
    {{3, 4, 6, 6}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}},                                // groups
    {{2, 4, 7, 7}, {4, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 4}},                   // depthwise
    {{2, 3, 5, 5}, {6, 1, 3, 3}, {.padding = 1, .groups = 3}, false},                         // depthwise x2, no bias
    {{3, 5, 4, 6}, {7, 5, 1, 1}, {}},                                                         // 1x1: no im2col
    {{2, 6, 7, 7}, {4, 6, 1, 1}, {.stride = 2}, false},                                       // 1x1 downsample
    {{2, 3, 16, 16}, {5, 3, 7, 7}, {.stride = 2, .padding = 3}},                              // the ResNet stem
    {{1, 2, 9, 8}, {3, 2, 3, 3}, {.padding = 2, .dilation = 2}},                              // one sample, dilated
    {{2, 2, 4, 5}, {3, 2, 4, 5}, {}},                                                         // kernel == input
    {{2, 2, 3, 3}, {3, 2, 5, 5}, {.padding = 1}},                                             // kernel > input, padded
    // Note [Patchify convolution]: stride == kernel runs as one GEMM of the patches.
    {{2, 3, 8, 8}, {4, 3, 4, 4}, {.stride = 4}},               // ViT's patch embedding
    {{2, 3, 10, 9}, {5, 3, 3, 2}, {.stride = {3, 2}}, false},  // leftover rows, columns
    // Note [CPU convolution threading]: every product in two chunks (5 and 4 samples of 400
    // columns), strided and dilated im2col runs; the 1x1 cases above are one chunk of all
    // samples (columns gathered and products scattered, no im2col of their own).
    {{9, 3, 20, 20}, {5, 3, 3, 3}, {.padding = 1}},
    {{9, 4, 30, 20}, {6, 2, 3, 3}, {.stride = {1, 2}, .padding = {2, 1}, .dilation = {2, 1}, .groups = 2}},
    // One sample a chunk (more than 1024 columns): operands read in place, the 1x1's x too.
    {{3, 4, 33, 34}, {6, 4, 1, 1}, {}},
    {{2, 4, 36, 30}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}, false},
};

/// Sum of |terms| of each gradient element, for the backward tolerances: scatter |gy| |w| and |gy| |x|.
std::pair<std::vector<double>, std::vector<double>> grad_scales(const std::vector<double>& x, const Shape& xs,
                                                                const std::vector<double>& w, const Shape& ws,
                                                                const Conv2dOptions& o, const std::vector<double>& gy) {
  auto absv = [](std::vector<double> v) {
    for (double& e : v) e = std::fabs(e);
    return v;
  };
  const std::vector<double> ax = absv(x), aw = absv(w), ag = absv(gy);
  const ConvRef n = conv_ref(ax, xs, aw, ws, nullptr, o, &ag);
  return {n.gx, n.gw};
}

constexpr DType kAllFloat[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

}  // namespace

TEST_CASE("conv2d: forward matches a naive float64 convolution in every dtype and layout") {
  uint64_t seed = 1;
  for (const ConvCase& c : kCases)
    for (DType t : kAllFloat)
      for (Layout layout : kAllLayouts) {
        CAPTURE(c.name());
        CAPTURE(dtype_name(t));
        CAPTURE(layout_name(layout));
        const Tensor x = random_tensor(c.x, t, ++seed, layout);
        const Tensor w =
            random_tensor(c.w, t, ++seed, layout == Layout::Contiguous ? Layout::Contiguous : Layout::Strided);
        const Tensor b = c.bias ? random_tensor({c.w[0]}, t, ++seed) : Tensor();
        const Tensor y = ops::conv2d(x, w, b, c.o);
        // The reference sees the values as stored in dtype t.
        const std::vector<double> bv = c.bias ? values_of(b) : std::vector<double>();
        const ConvRef ref = conv_ref(values_of(x), c.x, values_of(w), c.w, c.bias ? &bv : nullptr, c.o);
        REQUIRE(y.sizes() == ref.ys);
        CHECK(y.dtype() == t);
        CHECK(y.is_contiguous());
        check_scaled(values_of(y), ref.y, ref.scale, default_rtol(t), "conv2d " + c.name());
      }
}

TEST_CASE("conv2d: backward input and weight match the naive scatter of every product") {
  uint64_t seed = 100;
  for (const ConvCase& c : kCases)
    for (DType t : kAllFloat) {
      CAPTURE(c.name());
      CAPTURE(dtype_name(t));
      const Tensor x = random_tensor(c.x, t, ++seed);
      const Tensor w = random_tensor(c.w, t, ++seed);
      const Shape ys = conv_ref(values_of(x), c.x, values_of(w), c.w, nullptr, c.o).ys;
      const Tensor gy = random_tensor(ys, t, ++seed, Layout::Transposed);
      const std::vector<double> gyv = values_of(gy);
      const ConvRef ref = conv_ref(values_of(x), c.x, values_of(w), c.w, nullptr, c.o, &gyv);
      const auto [sx, sw] = grad_scales(values_of(x), c.x, values_of(w), c.w, c.o, gyv);
      const Tensor gx = ops::conv2d_backward_input(gy, c.x, w, c.o);
      const Tensor gw = ops::conv2d_backward_weight(gy, x, c.w, c.o);
      REQUIRE(gx.sizes() == c.x);
      REQUIRE(gw.sizes() == c.w);
      CHECK(gx.dtype() == t);
      CHECK(gw.dtype() == t);
      check_scaled(values_of(gx), ref.gx, sx, default_rtol(t), "grad_x " + c.name());
      check_scaled(values_of(gw), ref.gw, sw, default_rtol(t), "grad_w " + c.name());
    }
}

TEST_CASE("conv2d: the CPU results do not depend on the thread count") {
  // Note [CPU convolution threading]: chunks of samples run in parallel, the weight gradient's
  // chunk partials are added in chunk order, so one thread and two agree bit for bit.
  const Shape xs{9, 3, 20, 20}, ws{5, 3, 3, 3};
  const Conv2dOptions o{.padding = 1};
  const Tensor x = random_tensor(xs, kFloat32, 7), w = random_tensor(ws, kFloat32, 8);
  const Tensor gy = random_tensor({9, 5, 20, 20}, kFloat32, 9);
  auto run = [&](int threads) {
    const int before = get_num_threads();
    set_num_threads(threads);
    std::vector<std::vector<double>> r = {values_of(ops::conv2d(x, w, Tensor(), o)),
                                          values_of(ops::conv2d_backward_input(gy, xs, w, o)),
                                          values_of(ops::conv2d_backward_weight(gy, x, ws, o))};
    set_num_threads(before);
    return r;
  };
  const auto one = run(1), two = run(2);
  CHECK(one[0] == two[0]);
  CHECK(one[1] == two[1]);
  CHECK(one[2] == two[2]);
}

TEST_CASE("conv2d: saves only what backward needs and skips unneeded gradients") {
  Tensor x = random_tensor({2, 3, 5, 5}, kFloat64, 1);
  Tensor w = leaf({4, 3, 3, 3}, 2);
  Tensor y = conv2d(x, w);  // only the weight needs a gradient
  CHECK(y.grad_fn_name() == "Conv2dBackward");
  y.backward(ones_like(y));
  CHECK(w.grad().defined());
  CHECK_FALSE(x.grad().defined());
  // d sum(y) / dw[k, c, r, s] = sum over n, oh, ow of the tap x[n, c, oh + r, ow + s].
  const std::vector<double> xv = values_of(x), gw = values_of(w.grad());
  double expect = 0;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t oh = 0; oh < 3; ++oh)
      for (int64_t ow = 0; ow < 3; ++ow) expect += xv[size_t(((n * 3 + 1) * 5 + oh + 2) * 5 + ow + 1)];
  CHECK(gw[size_t(((0 * 3 + 1) * 3 + 2) * 3 + 1)] == doctest::Approx(expect).epsilon(1e-12));
}

TEST_CASE("conv2d: unbatched input, empty batch, no input channels") {
  const Tensor w = random_tensor({4, 3, 3, 3}, kFloat32, 1), b = random_tensor({4}, kFloat32, 2);
  const Tensor x = random_tensor({3, 6, 5}, kFloat32, 3);
  const Tensor y3 = ops::conv2d(x, w, b, {.padding = 1});
  const Tensor y4 = ops::conv2d(x.unsqueeze(0), w, b, {.padding = 1});
  CHECK(y3.sizes() == Shape{4, 6, 5});
  check_close(y3, values_of(y4), 0, 0, "unbatched");
  CHECK(ops::conv2d(zeros({0, 3, 6, 5}), w, b).sizes() == Shape{0, 4, 4, 3});
  CHECK(ops::conv2d_backward_weight(zeros({0, 4, 4, 3}), zeros({0, 3, 6, 5}), w.sizes()).sizes() == w.sizes());
  check_close(ops::conv2d_backward_weight(zeros({0, 4, 4, 3}), zeros({0, 3, 6, 5}), w.sizes()),
              std::vector<double>(size_t(w.numel()), 0.0), 0, 0, "sum over no samples");
  // No input channels: every output is the bias.
  const Tensor y0 = ops::conv2d(zeros({2, 0, 4, 4}), zeros({4, 0, 3, 3}), b);
  REQUIRE(y0.sizes() == Shape{2, 4, 2, 2});
  const std::vector<double> bv = values_of(b), v0 = values_of(y0);
  for (size_t i = 0; i < v0.size(); ++i) CHECK(v0[i] == bv[(i / 4) % 4]);
}

TEST_CASE("conv2d: errors name the op, the shapes and the settings") {
  const Tensor x = zeros({2, 3, 8, 8});
  check_error([&] { ops::conv2d(x, zeros({4, 2, 3, 3})); }, {"conv2d", "[2, 3, 8, 8]", "[4, 2, 3, 3]", "3 channels"});
  check_error([&] { conv2d(x, zeros({4, 2, 3, 3})); }, {"conv2d", "[2, 3, 8, 8]", "[4, 2, 3, 3]"});
  check_error(
      [&] {
        ops::conv2d(zeros({2, 4, 8, 8}), zeros({6, 2, 3, 3}), Tensor(), {.groups = 3});
      },
      {"conv2d", "groups=3", "must divide", "(4"});
  check_error(
      [&] {
        ops::conv2d(zeros({2, 4, 8, 8}), zeros({5, 2, 3, 3}), Tensor(), {.groups = 2});
      },
      {"groups=2", "(5"});
  check_error(
      [&] {
        ops::conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 5, 5}));
      },
      {"conv2d", "kernel 5x5", "larger than the padded input 4x4", "[1, 1, 4, 4]"});
  check_error(
      [&] {
        ops::conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {.dilation = 2});
      },
      {"kernel 3x3 (5x5", "dilation (2, 2)"});
  check_error([&] { ops::conv2d(x, zeros({4, 3, 3, 3}, kFloat64)); }, {"conv2d", "float64", "same dtype"});
  check_error([&] { ops::conv2d(x, zeros({4, 3, 3, 3}), zeros({5})); }, {"conv2d", "bias", "[5]"});
  check_error([&] { ops::conv2d(zeros({8, 8}), zeros({4, 3, 3, 3})); }, {"conv2d", "4-D input", "[8, 8]"});
  check_error([&] { ops::conv2d(x, zeros({4, 3, 3})); }, {"conv2d", "4-D weight", "[4, 3, 3]"});
  check_error([&] { ops::conv2d(x, zeros({4, 3, 3, 3}), Tensor(), {.stride = {1, 0}}); }, {"stride", "(1, 0)"});
  check_error([&] { ops::conv2d(x, zeros({4, 3, 3, 3}), Tensor(), {.padding = -1}); }, {"padding", "(-1, -1)"});
  check_error([&] { ops::conv2d(x, zeros({4, 3, 3, 3}), Tensor(), {.groups = 0}); }, {"groups", "0"});
  check_error(
      [&] {
        ops::conv2d(zeros({2, 3, 8, 8}, kInt64), zeros({4, 3, 3, 3}, kInt64));
      },
      {"conv2d", "floating-point", "int64"});
  check_error(
      [&] {
        ops::conv2d_backward_input(zeros({2, 4, 5, 5}), x.sizes(), zeros({4, 3, 3, 3}));
      },
      {"conv2d_backward_input", "grad_out", "[2, 4, 6, 6]"});
  check_error(
      [&] {
        ops::conv2d_backward_weight(zeros({2, 4, 6, 6}), x, {4, 2, 3, 3});
      },
      {"conv2d_backward_weight", "3 channels"});
}

TEST_CASE("conv2d: the cuDNN benchmark switch is a process-wide setting") {
  CHECK_FALSE(ops::cudnn_benchmark());
  ops::set_cudnn_benchmark(true);
  CHECK(ops::cudnn_benchmark());
  ops::set_cudnn_benchmark(false);
  CHECK_FALSE(ops::cudnn_benchmark());
}

TEST_CASE("nn: Conv2d has torch's parameters, names, init and printout") {
  manual_seed(0);
  nn::Conv2d conv(6, 8, 3, {.stride = 2, .padding = 1, .groups = 2});
  const auto named = conv.named_parameters();
  REQUIRE(named.size() == 2);
  CHECK(named[0].first == "weight");
  CHECK(named[1].first == "bias");
  CHECK(conv.weight.sizes() == Shape{8, 3, 3, 3});
  CHECK(conv.bias.sizes() == Shape{8});
  // kaiming_uniform(a = sqrt(5)): bound = sqrt(6 / ((1 + 5) fan_in)) = 1 / sqrt(fan_in); fan_in = 3 * 3 * 3.
  const double bound = 1.0 / std::sqrt(27.0);
  double wmax = 0, bmax = 0;
  for (double v : values_of(conv.weight)) wmax = std::max(wmax, std::fabs(v));
  for (double v : values_of(conv.bias)) bmax = std::max(bmax, std::fabs(v));
  CHECK(wmax <= bound);
  CHECK(wmax > 0.8 * bound);  // 216 draws fill the range
  CHECK(bmax <= bound);
  CHECK(bmax > 0);
  CHECK(conv.extra_repr() == "6, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), groups=2");

  const Tensor x = random_tensor({2, 6, 7, 7}, kFloat32, 5);
  const Tensor y = conv(x);
  CHECK(y.sizes() == Shape{2, 8, 4, 4});
  check_close(y, values_of(ops::conv2d(x, conv.weight, conv.bias, {.stride = 2, .padding = 1, .groups = 2})), 0, 0,
              "module forward");
  y.backward(ones_like(y));
  CHECK(conv.weight.grad().sizes() == conv.weight.sizes());
  CHECK(conv.bias.grad().defined());

  nn::Conv2d stem(3, 64, 7, {.stride = 2, .padding = 3, .bias = false});
  CHECK(stem.named_parameters().size() == 1);
  CHECK_FALSE(stem.bias.defined());
  CHECK(stem.weight.sizes() == Shape{64, 3, 7, 7});
  CHECK(stem.extra_repr() == "3, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=false");
  nn::Conv2d rect(2, 2, {1, 3}, {.dilation = {1, 2}});
  CHECK(rect.weight.sizes() == Shape{2, 2, 1, 3});
  CHECK(rect.extra_repr() == "2, 2, kernel_size=(1, 3), stride=(1, 1), dilation=(1, 2)");

  check_error([] { nn::Conv2d(6, 8, 3, {.groups = 4}); }, {"Conv2d", "groups=4", "in_channels=6"});
  check_error([] { nn::Conv2d(0, 8, 3); }, {"Conv2d", "in_channels=0"});
  check_error([&] { conv(zeros({2, 5, 7, 7})); }, {"conv2d", "[2, 5, 7, 7]"});
  check_error([&] { conv(zeros({6, 7})); }, {"Conv2d", "float32[6, 7]"});
}
