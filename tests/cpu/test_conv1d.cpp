// conv1d and conv_transpose1d (Note [1-D convolution as 2-D]): the raw ops against naive float64
// loops written from torch's definitions (cross-correlation; each input sample adding w times
// itself into its window), over stride, padding, dilation, groups, output_padding, bias, in every
// dtype and layout (a (N, L, C) tensor transposed included); gradcheck and gradgradcheck through
// autograd; unbatched input; errors in 1-D terms; the Conv1d and ConvTranspose1d modules.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "autograd/gradcheck.h"
#include "autograd/ops/conv1d.h"
#include "nn/conv.h"
#include "tensor/ops/conv1d.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

struct Case {
  Shape x, w;  // conv1d: (N, C, L), (K, C / groups, k); transposed: (N, C_in, L), (C_in, C_out / groups, k)
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1, output_padding = 0;
  bool bias = true;
  std::string name() const {
    return detail::str_cat("x", shape_str(x), " w", shape_str(w), " stride ", stride, " pad ", padding, " dil ",
                           dilation, " groups ", groups, " out_pad ", output_padding, bias ? " bias" : "");
  }
  Conv1dOptions conv() const { return {stride, padding, dilation, groups}; }
  ConvTranspose1dOptions transposed() const { return {stride, padding, output_padding, groups, dilation}; }
};

const Case kConvCases[] = {
    {{2, 3, 9}, {4, 3, 3}},
    {{2, 4, 11}, {6, 2, 3}, 2, 1, 1, 2},            // stride, padding, groups
    {{1, 3, 10}, {5, 3, 4}, 3, 2, 2, 1, 0, false},  // dilation
    {{3, 6, 7}, {6, 1, 3}, 1, 1, 1, 6},             // depthwise (Mamba's, Conformer's)
    {{2, 80, 12}, {16, 80, 3}, 1, 1},               // Whisper's first layer, narrowed
    {{2, 5, 4}, {3, 5, 1}},                         // 1-long kernel
};

const Case kTransposedCases[] = {
    {{2, 3, 5}, {3, 2, 3}},
    {{2, 4, 6}, {4, 3, 4}, 2, 1},                  // 2x upsampling
    {{1, 4, 4}, {4, 1, 3}, 3, 1, 1, 2, 2},         // output_padding, groups
    {{2, 2, 4}, {2, 2, 3}, 1, 0, 2, 1, 1, false},  // output_padding >= stride, below dilation
};

std::vector<double> conv1d_reference(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                                     const Shape& ws, const std::vector<double>* b, const Case& c) {
  const int64_t N = xs[0], C = xs[1], L = xs[2], K = ws[0], Cg = ws[1], k = ws[2], Kg = K / c.groups;
  const int64_t OL = (L + 2 * c.padding - c.dilation * (k - 1) - 1) / c.stride + 1;
  std::vector<double> y(size_t(N * K * OL));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < K; ++o)
      for (int64_t t = 0; t < OL; ++t) {
        double s = b ? (*b)[size_t(o)] : 0.0;
        for (int64_t ci = 0; ci < Cg; ++ci)
          for (int64_t j = 0; j < k; ++j) {
            const int64_t at = t * c.stride - c.padding + j * c.dilation;
            if (at >= 0 && at < L)
              s += x[size_t((n * C + (o / Kg) * Cg + ci) * L + at)] * w[size_t((o * Cg + ci) * k + j)];
          }
        y[size_t((n * K + o) * OL + t)] = s;
      }
  return y;
}

std::vector<double> conv_transpose1d_reference(const std::vector<double>& x, const Shape& xs,
                                               const std::vector<double>& w, const Shape& ws,
                                               const std::vector<double>* b, const Case& c) {
  const int64_t N = xs[0], Ci = xs[1], L = xs[2], Cog = ws[1], k = ws[2], Cig = Ci / c.groups, Co = Cog * c.groups;
  const int64_t OL = (L - 1) * c.stride - 2 * c.padding + c.dilation * (k - 1) + c.output_padding + 1;
  std::vector<double> y(size_t(N * Co * OL));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o)
      for (int64_t t = 0; t < OL; ++t) y[size_t((n * Co + o) * OL + t)] = b ? (*b)[size_t(o)] : 0.0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ci = 0; ci < Ci; ++ci)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t co = 0; co < Cog; ++co)
          for (int64_t j = 0; j < k; ++j) {
            const int64_t t = i * c.stride - c.padding + j * c.dilation;
            if (t < 0 || t >= OL) continue;
            y[size_t((n * Co + (ci / Cig) * Cog + co) * OL + t)] +=
                x[size_t((n * Ci + ci) * L + i)] * w[size_t((ci * Cog + co) * k + j)];
          }
  return y;
}

}  // namespace

TEST_CASE("conv1d and conv_transpose1d: match naive float64 loops in every dtype and layout") {
  uint64_t seed = 1;
  for (bool transposed : {false, true})
    for (const Case& c : transposed ? std::vector<Case>(std::begin(kTransposedCases), std::end(kTransposedCases))
                                    : std::vector<Case>(std::begin(kConvCases), std::end(kConvCases)))
      for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16})
        for (Layout layout : kAllLayouts) {
          CAPTURE(c.name());
          CAPTURE(transposed);
          CAPTURE(name_of(t, layout));
          const Tensor x = random_tensor(c.x, t, ++seed, layout);
          const Tensor w = random_tensor(c.w, t, ++seed, layout, -0.5, 0.5);
          const int64_t out_channels = transposed ? c.w[1] * c.groups : c.w[0];
          const Tensor b = c.bias ? random_tensor({out_channels}, t, ++seed) : Tensor();
          const std::vector<double> bv = c.bias ? values_of(b) : std::vector<double>();
          const Tensor y = transposed ? ops::conv_transpose1d(x, w, b, c.transposed()) : ops::conv1d(x, w, b, c.conv());
          const std::vector<double> expected =
              transposed ? conv_transpose1d_reference(values_of(x), c.x, values_of(w), c.w, c.bias ? &bv : nullptr, c)
                         : conv1d_reference(values_of(x), c.x, values_of(w), c.w, c.bias ? &bv : nullptr, c);
          REQUIRE(y.dim() == 3);
          CHECK(y.size(1) == out_channels);
          CHECK(y.dtype() == t);
          const double scale = t == kFloat64 ? 1e-12 : t == kFloat32 ? 1e-5 : t == kFloat16 ? 4e-3 : 3e-2;
          check_close(y, expected, scale, scale, c.name());
        }
}

TEST_CASE("conv1d and conv_transpose1d: gradcheck and gradgradcheck in float64, unbatched input") {
  uint64_t seed = 300;
  for (const Case& c : {kConvCases[1], kConvCases[2], kConvCases[3]}) {
    CAPTURE(c.name());
    const TensorList in = {leaf(c.x, ++seed), leaf(c.w, ++seed), leaf({c.w[0]}, ++seed)};
    const auto f = [o = c.conv()](const TensorList& v) { return conv1d(v[0], v[1], v[2], o); };
    check_gradcheck(f, in);
    const autograd::GradcheckResult r = autograd::gradgradcheck(f, in);
    CHECK_MESSAGE(r.ok, r.report);
  }
  for (const Case& c : kTransposedCases) {
    CAPTURE(c.name());
    const TensorList in = {leaf(c.x, ++seed), leaf(c.w, ++seed), leaf({c.w[1] * c.groups}, ++seed)};
    const auto f = [o = c.transposed()](const TensorList& v) { return conv_transpose1d(v[0], v[1], v[2], o); };
    check_gradcheck(f, in);
    const autograd::GradcheckResult r = autograd::gradgradcheck(f, in);
    CHECK_MESSAGE(r.ok, r.report);
  }
  const Tensor x = random_tensor({3, 9}, kFloat32, 1), w = random_tensor({4, 3, 3}, kFloat32, 2);
  const Tensor y = conv1d(x, w, Tensor(), {.padding = 1});
  CHECK(y.sizes() == Shape{4, 9});
  check_close(y, values_of(ops::conv1d(x.unsqueeze(0), w, Tensor(), {.padding = 1})), 0, 0, "unbatched conv1d");
  const Tensor yt = conv_transpose1d(x, random_tensor({3, 2, 4}, kFloat32, 3), Tensor(), {.stride = 2});
  CHECK(yt.sizes() == Shape{2, 20});
  CHECK(ops::conv1d(zeros({0, 3, 9}), w).sizes() == Shape{0, 4, 7});
}

TEST_CASE("conv1d and conv_transpose1d: errors name the op and the shapes the user passed") {
  const Tensor x = zeros({2, 3, 8});
  check_error([&] { ops::conv1d(x, zeros({4, 2, 3})); }, {"conv1d", "[2, 3, 8]", "[4, 2, 3]", "3 channels"});
  check_error([&] { conv1d(x, zeros({4, 2, 3})); }, {"conv1d", "[2, 3, 8]", "[4, 2, 3]"});
  check_error([&] { ops::conv1d(x, zeros({4, 3, 3, 3})); }, {"conv1d", "3-D weight", "[4, 3, 3, 3]"});
  check_error([&] { ops::conv1d(zeros({2, 3, 8, 8}), zeros({4, 3, 3})); }, {"conv1d", "3-D input"});
  check_error([&] { ops::conv1d(x, zeros({4, 3, 9})); }, {"conv1d", "kernel 9", "longer than the padded input 8"});
  check_error([&] { ops::conv1d(x, zeros({4, 1, 3}), Tensor(), {.groups = 2}); }, {"conv1d", "groups=2"});
  check_error([&] { conv_transpose1d(x, zeros({4, 2, 3})); }, {"conv_transpose1d", "[2, 3, 8]", "3 channels"});
  check_error(
      [&] {
        ops::conv_transpose1d(x, zeros({3, 2, 3}), Tensor(), {.stride = 2, .output_padding = 2});
      },
      {"conv_transpose1d", "output_padding 2", "stride 2", "dilation 1"});
  check_error(
      [&] {
        ops::conv_transpose1d(zeros({1, 3, 1}), zeros({3, 2, 1}), Tensor(), {.padding = 1});
      },
      {"conv_transpose1d", "length -1", "at least 1"});
}

TEST_CASE("nn: Conv1d and ConvTranspose1d have torch's parameters, init and printout") {
  manual_seed(0);
  nn::Conv1d conv(80, 16, 3, {.padding = 1});
  CHECK(conv.weight.sizes() == Shape{16, 80, 3});
  CHECK(conv.bias.sizes() == Shape{16});
  const double bound = 1.0 / std::sqrt(240.0);  // kaiming_uniform(a = sqrt(5)): 1 / sqrt(fan_in), fan_in = 80 * 3
  CHECK(max_abs(conv.weight) <= bound);
  CHECK(max_abs(conv.weight) > 0.9 * bound);
  CHECK(max_abs(conv.bias) <= bound);
  CHECK(conv.extra_repr() == "80, 16, kernel_size=(3,), stride=(1,), padding=(1,)");
  const Tensor x = random_tensor({2, 80, 12}, kFloat32, 5);
  const Tensor y = conv(x);
  CHECK(y.sizes() == Shape{2, 16, 12});
  check_close(y, values_of(ops::conv1d(x, conv.weight, conv.bias, conv.options)), 0, 0, "Conv1d forward");
  y.backward(ones_like(y));
  CHECK(conv.weight.grad().sizes() == conv.weight.sizes());

  nn::ConvTranspose1d up(16, 8, 4, {.stride = 2, .padding = 1, .groups = 2, .bias = false});
  CHECK(up.weight.sizes() == Shape{16, 4, 4});
  CHECK_FALSE(up.bias.defined());
  CHECK(max_abs(up.weight) <= 1.0 / std::sqrt(16.0));  // fan_in = weight.size(1) * k = 4 * 4
  CHECK(up.extra_repr() == "16, 8, kernel_size=(4,), stride=(2,), padding=(1,), groups=2, bias=false");
  CHECK(up(y).sizes() == Shape{2, 8, 24});
  check_error([] { nn::Conv1d(6, 8, 3, {.groups = 4}); }, {"Conv1d", "groups=4", "in_channels=6"});
  check_error([] { nn::ConvTranspose1d(6, 8, 0); }, {"ConvTranspose1d", "kernel_size", "0"});
  check_error([&] { conv(zeros({80})); }, {"Conv1d", "(N, 80, L)"});
}
