// max_pool1d, avg_pool1d and adaptive_avg_pool1d (tensor/ops/pool1d.h) against float64 loops
// written from torch's definitions: windows at stride with padding, dilation and ceil_mode (a
// last window that starts in the right padding dropped), max's -inf padding and NaN winning,
// avg's divisor with and without the padding, adaptive bins [floor(i L / O), ceil((i + 1) L / O));
// in every dtype and layout, unbatched; gradcheck; errors in 1-D terms; the modules.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "autograd/ops/pool1d.h"
#include "nn/pooling.h"
#include "tensor/ops/pool1d.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

struct Window {
  int64_t kernel, stride, padding, dilation;
  bool ceil_mode, count_include_pad;
  std::string name() const {
    return detail::str_cat("kernel ", kernel, " stride ", stride, " padding ", padding, " dilation ", dilation,
                           ceil_mode ? " ceil_mode" : "", count_include_pad ? "" : " exclude pad");
  }
};

const Window kWindows[] = {
    {2, 0, 0, 1, false, true},  // stride = kernel
    {3, 2, 1, 1, false, true}, {3, 2, 1, 1, true, true},
    {3, 2, 1, 1, true, false}, {2, 1, 1, 2, false, true},  // dilated (max only)
    {4, 3, 2, 1, true, false}, {5, 1, 2, 1, false, true},
};

int64_t out_length(int64_t L, const Window& w, int64_t dilation) {
  const int64_t s = w.stride == 0 ? w.kernel : w.stride, span = dilation * (w.kernel - 1) + 1;
  const double q = double(L + 2 * w.padding - span) / double(s);
  int64_t out = int64_t(w.ceil_mode ? std::ceil(q) : std::floor(q)) + 1;
  if (w.ceil_mode && (out - 1) * s >= L + w.padding) --out;  // a window must start inside the input or left padding
  return out;
}

/// rows of length L -> pooled rows, max (dilation) or average.
std::vector<double> pool_reference(const std::vector<double>& x, int64_t rows, int64_t L, const Window& w, bool max) {
  const int64_t d = max ? w.dilation : 1, s = w.stride == 0 ? w.kernel : w.stride, O = out_length(L, w, d);
  std::vector<double> y;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < O; ++o) {
      const int64_t start = o * s - w.padding;
      double best = -std::numeric_limits<double>::infinity(), sum = 0;
      int64_t inside = 0;
      for (int64_t j = 0; j < w.kernel; ++j) {
        const int64_t at = start + j * d;
        if (at < 0 || at >= L) continue;
        const double v = x[size_t(r * L + at)];
        if (std::isnan(v) || v > best) best = std::isnan(best) ? best : v;
        sum += v, ++inside;
      }
      // avg: the window clipped to the padded input, counted with or without the padding.
      const int64_t end = std::min(start + w.kernel, L + w.padding);
      const int64_t divisor = w.count_include_pad ? end - start : inside;
      y.push_back(max ? best : sum / double(divisor));
    }
  return y;
}

}  // namespace

TEST_CASE("max_pool1d and avg_pool1d: match float64 loops in every dtype and layout, unbatched too") {
  uint64_t seed = 1;
  for (const Window& w : kWindows)
    for (bool max : {true, false}) {
      if (!max && w.dilation != 1) continue;
      for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16})
        for (Layout layout : kAllLayouts)
          for (const Shape& xs : {Shape{2, 3, 11}, Shape{3, 8}}) {
            CAPTURE(w.name());
            CAPTURE(max);
            CAPTURE(name_of(t, layout));
            CAPTURE(shape_str(xs));
            const Tensor x = random_tensor(xs, t, ++seed, layout);
            const Tensor y =
                max ? ops::max_pool1d(x, w.kernel, {w.stride, w.padding, w.dilation, w.ceil_mode})
                    : ops::avg_pool1d(x, w.kernel, {w.stride, w.padding, w.ceil_mode, w.count_include_pad});
            const int64_t L = xs.back(), rows = numel_of(xs) / L;
            const std::vector<double> expected = pool_reference(values_of(x), rows, L, w, max);
            REQUIRE(y.dim() == int64_t(xs.size()));
            CHECK(y.size(-1) == out_length(L, w, max ? w.dilation : 1));
            check_close(y, expected, max ? 0 : default_rtol(t), max ? 0 : default_rtol(t), w.name());
          }
    }
}

TEST_CASE("max_pool1d: NaN wins its windows; all -inf windows and the -inf padding") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const Tensor x = make_tensor({1, nan, -inf, -inf, 3, 2}, {1, 1, 6}, kFloat32);
  const std::vector<double> y = values_of(ops::max_pool1d(x, 2, {.stride = 2}));
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == -inf);
  CHECK(y[2] == 3);
  CHECK(values_of(ops::max_pool1d(make_tensor({-5, -4}, {1, 2}, kFloat32), 3, {.stride = 1, .padding = 1})) ==
        std::vector<double>{-4, -4});
}

TEST_CASE("adaptive_avg_pool1d: torch's bins, unbatched, and gradients") {
  const Tensor x = random_tensor({2, 3, 10}, kFloat64, 7);
  for (int64_t O : {1, 3, 4, 10, 13}) {
    CAPTURE(O);
    const std::vector<double> xv = values_of(x);
    std::vector<double> expected;
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t i = 0; i < O; ++i) {
        const int64_t a = (i * 10) / O, b = ((i + 1) * 10 + O - 1) / O;
        double s = 0;
        for (int64_t j = a; j < b; ++j) s += xv[size_t(r * 10 + j)];
        expected.push_back(s / double(b - a));
      }
    check_close(ops::adaptive_avg_pool1d(x, O), expected, 1e-14, 1e-14, "adaptive");
    CHECK(ops::adaptive_avg_pool1d(x[0], O).sizes() == Shape{3, O});
  }
  check_gradcheck([](const TensorList& v) { return adaptive_avg_pool1d(v[0], 4); }, {leaf({2, 3, 10}, 8)});
}

TEST_CASE("max_pool1d and avg_pool1d: gradcheck in float64") {
  uint64_t seed = 100;
  for (const Window& w : kWindows) {
    CAPTURE(w.name());
    // Distinct values a step apart: the finite differences never cross a tie.
    Tensor x = make_tensor(random_values(2 * 3 * 11, ++seed), {2, 3, 11}, kFloat64);
    x.requires_grad_();
    check_gradcheck(
        [&](const TensorList& v) {
          return max_pool1d(v[0], w.kernel, {w.stride, w.padding, w.dilation, w.ceil_mode});
        },
        {x});
    if (w.dilation == 1)
      check_gradcheck(
          [&](const TensorList& v) {
            return avg_pool1d(v[0], w.kernel, {w.stride, w.padding, w.ceil_mode, w.count_include_pad});
          },
          {x});
  }
}

TEST_CASE("max_pool1d, avg_pool1d, adaptive_avg_pool1d: errors in 1-D terms") {
  const Tensor x = zeros({2, 3, 8});
  check_error([&] { ops::max_pool1d(zeros({2, 3, 4, 4}), 2); }, {"max_pool1d", "3-D (N, C, L)", "[2, 3, 4, 4]"});
  check_error([&] { max_pool1d(x, 0); }, {"max_pool1d", "kernel size", "0"});
  check_error([&] { ops::max_pool1d(x, 2, {.padding = 2}); }, {"max_pool1d", "padding", "half the kernel", "2"});
  check_error([&] { ops::avg_pool1d(x, 9); }, {"avg_pool1d", "too short", "kernel 9", "[2, 3, 8]"});
  check_error([&] { avg_pool1d(x, 2, {.stride = -1}); }, {"avg_pool1d", "stride", "-1"});
  check_error([&] { ops::max_pool1d(zeros({2, 3, 0}), 2); }, {"max_pool1d", "length must be non-zero"});
  check_error([&] { adaptive_avg_pool1d(x, 0); }, {"adaptive_avg_pool1d", "output size", "0"});
}

TEST_CASE("nn: MaxPool1d, AvgPool1d and AdaptiveAvgPool1d print and run as torch's") {
  nn::MaxPool1d max(3, {.stride = 2, .padding = 1});
  CHECK(max.extra_repr() == "kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=false");
  nn::AvgPool1d avg(2);
  CHECK(avg.extra_repr() == "kernel_size=(2,), stride=(2,), padding=(0,)");
  nn::AdaptiveAvgPool1d gap(1);
  CHECK(gap.extra_repr() == "output_size=1");
  const Tensor x = random_tensor({2, 4, 9}, kFloat32, 3);
  check_close(max(x), values_of(ops::max_pool1d(x, 3, {.stride = 2, .padding = 1})), 0, 0, "MaxPool1d");
  CHECK(avg(x).sizes() == Shape{2, 4, 4});
  CHECK(gap(x).sizes() == Shape{2, 4, 1});
  check_error([] { nn::MaxPool1d(0); }, {"MaxPool1d", "kernel_size"});
}
