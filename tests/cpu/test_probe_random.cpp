// Probes for silent wrong answers in random numbers and parameter initialisation: the
// bounds of uniform_ after rounding to the tensor's dtype, moments, tails and chi-square
// uniformity of rand/randn/randint, randint at the int64 limits and for dtypes that cannot
// hold its range, fills of views and size-0 tensors, reproducibility of explicit and default
// generators, dropout masks, and nn::init (fans, kaiming, xavier, trunc_normal_, the layers'
// reset_parameters). Every statistical check uses a fixed seed, so it is deterministic;
// its bounds are several standard errors wide, and a wrong variance, a bias or an
// endpoint would still break them. Expectations are closed forms (moments of the uniform,
// normal and truncated normal distributions), float64 loops, or PyTorch's documented
// behaviour (cited per case).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nn/batch_norm.h"
#include "nn/conv.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

struct Moments {
  double mean = 0, var = 0, kurtosis = 0;  // var: population variance; kurtosis: m4 / m2^2
};

Moments moments_of(const std::vector<double>& v) {
  Moments m;
  const double n = double(v.size());
  for (double x : v) m.mean += x / n;
  double m2 = 0, m4 = 0;
  for (double x : v) {
    const double d = (x - m.mean) * (x - m.mean);
    m2 += d / n;
    m4 += d * d / n;
  }
  m.var = m2;
  m.kurtosis = m4 / (m2 * m2);
  return m;
}

/// Pearson's chi-square statistic of `v` over `bins` equal bins of [lo, hi) (values outside count as a failure).
double chi_square(const std::vector<double>& v, double lo, double hi, int bins) {
  std::vector<double> count(size_t(bins), 0.0);
  for (double x : v) {
    REQUIRE_MESSAGE(x >= lo, x, " < ", lo);
    REQUIRE_MESSAGE(x < hi, x, " >= ", hi);
    ++count[size_t(std::min<int64_t>(bins - 1, int64_t((x - lo) / (hi - lo) * bins)))];
  }
  const double expected = double(v.size()) / bins;
  double s = 0;
  for (double c : count) s += (c - expected) * (c - expected) / expected;
  return s;
}

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double normal_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

/// Correlation coefficient of two equally long samples.
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const Moments ma = moments_of(a), mb = moments_of(b);
  double c = 0;
  for (size_t i = 0; i < a.size(); ++i) c += (a[i] - ma.mean) * (b[i] - mb.mean) / double(a.size());
  return c / std::sqrt(ma.var * mb.var);
}

std::vector<int64_t> ints_of(const Tensor& t) { return t.contiguous().tolist<int64_t>(); }

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

}  // namespace

// torch.rand: "uniform distribution on the interval [0, 1)"; torch.Tensor.uniform_(from, to):
// "numbers sampled from the continuous uniform distribution [from, to)". A 24-bit uniform
// rounded to nearest in float16 (11 bits), bfloat16 (8 bits), or a float32 range whose
// spacing is coarse (1e6 + [0, 1): steps of 1/16), can round up onto `to`; a bound that
// is not representable (0.1 in float16) can make a rounded value fall below `from`.
TEST_CASE("probe random: rand and uniform_ never return the excluded high (or fall below low) after rounding") {
  struct Case {
    DType dt;
    double lo, hi;
    bool fine;  // many steps of the dtype in [lo, hi): the mean stays (lo + hi) / 2
  };
  const Case cases[] = {
      {kFloat16, 0.0, 1.0, true},        {kBFloat16, 0.0, 1.0, true},      {kFloat32, 1e6, 1e6 + 1, true},
      {kFloat16, 0.1, 0.2, true},        {kBFloat16, -0.1, 0.1, true},     {kFloat64, 1.0, 1.0 + 0x1p-52, false},
      {kFloat16, 1000.0, 1001.0, false}, {kBFloat16, 255.0, 256.0, false},
  };
  for (const Case& c : cases) {
    const std::string dt_name = dtype_name(c.dt);
    CAPTURE(dt_name);
    CAPTURE(c.lo);
    CAPTURE(c.hi);
    Generator g(2024);
    Tensor t = empty({200000}, c.dt);
    ops::uniform_(t, c.lo, c.hi, &g);
    int64_t at_or_above_high = 0, below_low = 0;
    double mean = 0;
    const std::vector<double> v = values_of(t);
    for (double x : v) {
      at_or_above_high += x >= c.hi;
      below_low += x < c.lo;
      mean += x / double(v.size());
    }
    CHECK(at_or_above_high == 0);
    CHECK(below_low == 0);
    // Still centred: the values moved off an endpoint moved by one step of the dtype only.
    if (c.fine) CHECK(std::fabs(mean - 0.5 * (c.lo + c.hi)) < 0.01 * (c.hi - c.lo));
  }
  // rand through the factory, float16: the same contract.
  manual_seed(77);
  CHECK(max_abs(rand({100000}, kFloat16)) < 1.0);
  // from == to is allowed (PyTorch: "from <= to") and gives from.
  Tensor same = empty({5}, kFloat32);
  ops::uniform_(same, 0.25, 0.25);
  CHECK(values_of(same) == std::vector<double>(5, 0.25));
}

// torch.Tensor.uniform_ (aten uniform_impl_): "from"/"to" must lie within the dtype's
// finite range and to - from must not exceed its max; otherwise it refuses ("to is out of
// bounds for Half", "uniform_ expects to-from <= std::numeric_limits<double>::max()").
TEST_CASE("probe random: uniform_ refuses bounds the dtype cannot hold instead of writing inf or NaN") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  check_error([] { ops::uniform_(empty({8}, kFloat16), 0.0, 1e5); }, {"uniform_", "float16"});
  check_error([] { ops::uniform_(empty({8}, kBFloat16), -1e39, 0.0); }, {"uniform_", "bfloat16"});
  check_error([] { ops::uniform_(empty({8}, kFloat32), 0.0, 1e39); }, {"uniform_", "float32"});
  check_error([] { ops::uniform_(empty({8}, kFloat64), -1e308, 1e308); }, {"uniform_", "float64"});
  check_error([inf] { ops::uniform_(empty({8}, kFloat32), -inf, inf); }, {"uniform_"});
  check_error([inf] { ops::uniform_(empty({8}, kFloat32), 0.0, inf); }, {"uniform_"});
  check_error([nan] { ops::uniform_(empty({8}, kFloat32), nan, 1.0); }, {"uniform_"});
  check_error([nan] { ops::uniform_(empty({8}, kFloat32), 0.0, nan); }, {"uniform_"});
  // The widest range float16 holds is accepted, and stays finite.
  Generator g(3);
  Tensor h = empty({20000}, kFloat16);
  ops::uniform_(h, -65504.0, 65504.0, &g);
  for (double x : values_of(h)) REQUIRE(std::isfinite(x));
}

// Closed forms: U(a, b) has mean (a + b) / 2 and variance (b - a)^2 / 12; 20 equal bins
// hold n / 20 each, and Pearson's statistic has 19 degrees of freedom (its 99.99th
// percentile is about 47).
TEST_CASE("probe random: uniform_ moments and a chi-square over 20 bins, float32 and float64") {
  for (DType dt : {kFloat32, kFloat64}) {
    const std::string dt_name = dtype_name(dt);
    CAPTURE(dt_name);
    for (auto [lo, hi] : {std::pair{0.0, 1.0}, std::pair{-3.0, 5.0}, std::pair{-1e-3, 2e-3}}) {
      Generator g(11);
      Tensor t = empty({200000}, dt);
      ops::uniform_(t, lo, hi, &g);
      const std::vector<double> v = values_of(t);
      const Moments m = moments_of(v);
      const double w = hi - lo;
      CHECK(std::fabs(m.mean - 0.5 * (lo + hi)) < 0.005 * w);
      CHECK(std::fabs(m.var / (w * w / 12.0) - 1.0) < 0.02);
      CHECK(chi_square(v, lo, hi, 20) < 50.0);
    }
  }
}

// Standard normal closed forms: mean 0, variance 1, kurtosis 3, P(|z| > 2) = 0.04550,
// P(|z| > 3) = 0.0026998, P(|z| > 4) = 6.334e-5. With n = 200000 the counts' standard
// deviations are 93, 23 and 3.6. normal_(mean, std) is mean + std * z (PyTorch's
// Tensor.normal_); std = 0 gives mean exactly; std < 0 and NaN are refused.
TEST_CASE("probe random: randn and normal_ moments, 2-, 3- and 4-sigma tails, kurtosis; std = 0 and bad std") {
  const int64_t n = 200000;
  for (DType dt : {kFloat32, kFloat64}) {
    const std::string dt_name = dtype_name(dt);
    CAPTURE(dt_name);
    Generator g(99);
    const std::vector<double> z = values_of(randn({n}, dt, &g));
    const Moments m = moments_of(z);
    CHECK(std::fabs(m.mean) < 0.01);
    CHECK(std::fabs(m.var - 1.0) < 0.02);
    CHECK(std::fabs(m.kurtosis - 3.0) < 0.08);
    int64_t over2 = 0, over3 = 0, over4 = 0, positive = 0;
    double max_z = 0;
    for (double x : z) {
      over2 += std::fabs(x) > 2, over3 += std::fabs(x) > 3, over4 += std::fabs(x) > 4, positive += x > 0;
      max_z = std::max(max_z, std::fabs(x));
    }
    CHECK(std::fabs(double(over2) - 0.0455003 * n) < 450);
    CHECK(std::fabs(double(over3) - 0.0026998 * n) < 115);
    CHECK(over4 >= 2);
    CHECK(over4 <= 30);
    CHECK(std::fabs(double(positive) - 0.5 * n) < 1200);
    CHECK(max_z > 4.0);
    // The bins between the quantiles of a standard normal (Phi^-1 of k/10) hold n/10 each.
    std::vector<double> u(z.size());
    for (size_t i = 0; i < z.size(); ++i) u[i] = std::min(normal_cdf(z[i]), std::nextafter(1.0, 0.0));
    CHECK(chi_square(u, 0.0, 1.0, 10) < 40.0);
  }
  Generator g(5);
  Tensor t = empty({100000}, kFloat64);
  ops::normal_(t, 3.0, 0.5, &g);
  const Moments m = moments_of(values_of(t));
  CHECK(std::fabs(m.mean - 3.0) < 0.005);
  CHECK(std::fabs(m.var / 0.25 - 1.0) < 0.02);
  ops::normal_(t, -1.5, 0.0, &g);
  CHECK(values_of(t) == std::vector<double>(size_t(t.numel()), -1.5));
  check_error([&] { ops::normal_(t, 0.0, -1.0); }, {"normal_", "std"});
  check_error([&] { ops::normal_(t, 0.0, std::numeric_limits<double>::quiet_NaN()); }, {"normal_", "std"});
}

// torch.randint(low, high): integers uniform on [low, high), any int64 bounds with
// low < high (aten random_from_to uses a 64-bit draw when high - low >= 2^32); it refuses
// low >= high ("random_ expects 'from' to be less than 'to'") and bounds the dtype cannot
// hold ("to - 1 is out of bounds for int"). Exact integers are compared, not doubles.
TEST_CASE("probe random: randint at the int64 limits, over the whole int64 range, and bounds past 2^53") {
  Generator g(17);
  const std::vector<int64_t> top = ints_of(randint(kI64Max - 10, kI64Max, {2000}, kInt64, &g));
  std::vector<int> seen(10, 0);
  for (int64_t x : top) {
    REQUIRE(x >= kI64Max - 10);
    REQUIRE(x < kI64Max);
    ++seen[size_t(x - (kI64Max - 10))];
  }
  for (int s : seen) CHECK(s > 100);

  const std::vector<int64_t> bottom = ints_of(randint(kI64Min, kI64Min + 3, {3000}, kInt64, &g));
  std::vector<int> low3(3, 0);
  for (int64_t x : bottom) {
    REQUIRE(x >= kI64Min);
    REQUIRE(x < kI64Min + 3);
    ++low3[size_t(x - kI64Min)];
  }
  for (int s : low3) CHECK(s > 800);

  const int64_t big = (int64_t(1) << 53) + 1;  // odd: not a double
  const std::vector<int64_t> odd = ints_of(randint(big, big + 3, {3000}, kInt64, &g));
  std::vector<int> mid3(3, 0);
  for (int64_t x : odd) {
    REQUIRE(x >= big);
    REQUIRE(x < big + 3);
    ++mid3[size_t(x - big)];
  }
  for (int s : mid3) CHECK(s > 800);

  // The whole range [INT64_MIN, INT64_MAX): about half negative, mean near 0 in units of 2^63.
  const std::vector<int64_t> all = ints_of(randint(kI64Min, kI64Max, {100000}, kInt64, &g));
  double mean = 0;
  int64_t negative = 0;
  for (int64_t x : all) mean += double(x) / 0x1p63 / double(all.size()), negative += x < 0;
  CHECK(std::fabs(mean) < 0.01);
  CHECK(std::fabs(double(negative) - 50000.0) < 800);

  check_error([] { randint(5, 5, {2}); }, {"randint", "5"});
  check_error([] { randint(5, 4, {2}); }, {"randint", "5", "4"});
  check_error([] { randint(kI64Max, kI64Min, {2}); }, {"randint"});
  check_error([] { randint(1, 1, {0}); }, {"randint"});  // checked before the size-0 shortcut, as torch
}

// A range just under 2^32 reduced modulo from a 32-bit word is biased: the values below
// 2^32 - range come twice as often (for [0, 3e9): mean 1.24e9 instead of 1.5e9). The mean
// and the share below 1e9 are closed forms of the uniform distribution on [0, 3e9).
TEST_CASE("probe random: randint over a range near 2^32 is uniform, and odd small ranges pass a chi-square") {
  Generator g(23);
  const int64_t hi = 3000000000;
  const std::vector<int64_t> v = ints_of(randint(0, hi, {200000}, kInt64, &g));
  double mean = 0;
  int64_t below_1e9 = 0;
  for (int64_t x : v) {
    REQUIRE(x >= 0);
    REQUIRE(x < hi);
    mean += double(x) / double(v.size());
    below_1e9 += x < 1000000000;
  }
  CHECK(std::fabs(mean / (0.5 * double(hi)) - 1.0) < 0.01);
  CHECK(std::fabs(double(below_1e9) / double(v.size()) - 1.0 / 3.0) < 0.005);

  for (DType dt : {kInt32, kInt64, kFloat32, kFloat16, kBFloat16}) {
    const std::string dt_name = dtype_name(dt);
    CAPTURE(dt_name);
    const std::vector<double> r = values_of(randint(-3, 4, {70000}, dt, &g));  // 7 values
    // 7 bins of width 1 over [-3, 4): 6 degrees of freedom, 99.99th percentile about 27.9.
    CHECK(chi_square(r, -3.0, 4.0, 7) < 32.0);
    for (double x : r) REQUIRE(x == std::floor(x));
  }
}

// aten check_from_to_in_range: the bounds must fit the dtype ("from is out of bounds for
// int", "to - 1 is out of bounds for int"); a value that wraps in int32 is a silent wrong
// answer. For floating dtypes frugal refuses integers past 2^digits (PyTorch only warns
// there): they round, so [low, high) is not what the tensor holds (Note [Random bounds
// in the dtype]).
TEST_CASE("probe random: randint refuses bounds the dtype cannot hold (int32, float16, float32)") {
  const int64_t two31 = int64_t(1) << 31;
  check_error([&] { randint(two31 - 5, two31 + 5, {4}, kInt32); }, {"randint", "int32"});
  check_error([&] { randint(-two31 - 1, 0, {4}, kInt32); }, {"randint", "int32"});
  check_error([] { randint(0, (int64_t(1) << 25), {4}, kFloat32); }, {"randint", "float32"});
  check_error([] { randint(0, 5000, {4}, kFloat16); }, {"randint", "float16"});
  check_error([] { randint(0, 2, {4}, kBool); }, {"randint", "bool"});
  // The extremes that fit are accepted and stay in range.
  Generator g(8);
  const std::vector<double> i32 = values_of(randint(-two31, -two31 + 2, {64}, kInt32, &g));
  for (double x : i32) CHECK((x == double(-two31) || x == double(-two31 + 1)));
  const std::vector<double> i32hi = values_of(randint(two31 - 2, two31, {64}, kInt32, &g));
  for (double x : i32hi) CHECK((x == double(two31 - 2) || x == double(two31 - 1)));
  const std::vector<double> f16 = values_of(randint(2040, 2049, {2000}, kFloat16, &g));
  for (double x : f16) CHECK((x >= 2040 && x < 2049 && x == std::floor(x)));
}

// Note [Counter-based RNG] (philox.h): element i, row-major in the target's own shape,
// draws from counter first + i / 4; a view is filled as a dense tensor of its shape would
// be, and nothing outside the view is written (PyTorch fills only the view's elements).
TEST_CASE("probe random: uniform_/normal_/random_int_ on transposed, strided and permuted views write only the view") {
  const double sentinel = -7.0;
  struct View {
    const char* name;
    Shape base;
    std::function<Tensor(const Tensor&)> make;
  };
  const std::vector<View> views = {
      {"transpose", {5, 7}, [](const Tensor& b) { return b.t(); }},
      {"every other column", {6, 9}, [](const Tensor& b) { return b.slice(1, 1, 9, 2); }},
      {"narrow of a permute",
       {3, 4, 5},
       [](const Tensor& b) {
         return b.permute({2, 0, 1}).narrow(0, 1, 3);
       }},
      {"select of a transpose", {4, 6}, [](const Tensor& b) { return b.t().select(0, 2); }},
  };
  for (const View& vw : views)
    for (int kind = 0; kind < 3; ++kind) {
      CAPTURE(vw.name);
      CAPTURE(kind);
      const DType dt = kind == 2 ? kInt32 : kFloat32;
      Tensor base = full(vw.base, sentinel, dt);
      Tensor view = vw.make(base);
      Tensor dense = empty(view.sizes(), dt);
      Generator g1(31), g2(31);
      auto fill = [kind](const Tensor& t, Generator* g) {
        if (kind == 0) ops::uniform_(t, -1.0, 1.0, g);
        if (kind == 1) ops::normal_(t, 0.0, 2.0, g);
        if (kind == 2) ops::random_int_(t, 0, 100, g);
      };
      fill(view, &g1);
      fill(dense, &g2);
      CHECK(values_of(view) == values_of(dense));
      CHECK(g1.offset() == g2.offset());
      // Mark the view's elements, then every element of base not in the view must be the sentinel.
      const std::vector<double> after = values_of(base);
      ops::fill_(view, 1234.0);
      const std::vector<double> marked = values_of(base);
      int64_t outside_changed = 0, inside = 0;
      for (size_t i = 0; i < after.size(); ++i) {
        if (marked[i] == 1234.0) ++inside;
        else outside_changed += after[i] != sentinel;
      }
      CHECK(inside == view.numel());
      CHECK(outside_changed == 0);
    }
}

// A size-0 fill draws nothing (Generator::reserve is skipped, so the stream is where it
// was); torch.nn.init.kaiming_uniform_/kaiming_normal_ on a zero-element tensor warn and
// return it untouched (their fan would be 0); xavier and trunc_normal_ just fill nothing.
TEST_CASE("probe random: size-0 tensors draw nothing; init on zero-element weights is a no-op") {
  Generator g(4);
  for (const Shape& s : {Shape{0}, Shape{3, 0}, Shape{0, 4, 2}}) {
    CAPTURE(shape_str(s));
    const uint64_t before = g.offset();
    CHECK(rand(s, kFloat32, &g).numel() == 0);
    CHECK(randn(s, kFloat64, &g).numel() == 0);
    CHECK(randint(0, 5, s, kInt64, &g).numel() == 0);
    CHECK(ops::dropout(empty(s), 0.5, &g).out.numel() == 0);
    CHECK(g.offset() == before);
  }
  for (const Shape& s : {Shape{4, 0}, Shape{0, 4}, Shape{8, 0, 3, 3}}) {
    CAPTURE(shape_str(s));
    Tensor w = empty(s);
    const uint64_t before = g.offset();
    nn::init::kaiming_uniform_(w, std::sqrt(5.0), nn::init::FanMode::FanIn, &g);
    nn::init::kaiming_uniform_(w, 0.0, nn::init::FanMode::FanOut, &g);
    nn::init::kaiming_normal_(w, 0.0, nn::init::FanMode::FanIn, &g);
    nn::init::kaiming_normal_(w, 0.0, nn::init::FanMode::FanOut, &g);
    nn::init::xavier_uniform_(w, 1.0, &g);
    nn::init::xavier_normal_(w, 1.0, &g);
    nn::init::trunc_normal_(w, 0.0, 1.0, -2.0, 2.0, &g);
    CHECK(g.offset() == before);
  }
}

// Reproducibility (torch.manual_seed, torch.Generator, get_state/set_state): a Generator
// with seed s draws what the default draws after manual_seed(s); drawing from an explicit
// Generator leaves the default untouched; a state saved mid-stream after a draw of an odd
// size replays every later draw; different seeds and successive draws are uncorrelated.
TEST_CASE("probe random: explicit vs default generator, mid-stream save and restore, independent streams") {
  manual_seed(1234);
  const std::vector<double> from_default = values_of(randn({1001}, kFloat64));
  Generator mine(1234);
  CHECK(values_of(randn({1001}, kFloat64, &mine)) == from_default);

  manual_seed(55);
  const uint64_t default_offset = default_generator().offset();
  Generator other(55);
  rand({999}, kFloat32, &other);
  randint(0, 3, {7}, kInt64, &other);
  CHECK(default_generator().offset() == default_offset);

  // Save after an odd-sized draw, draw a mix, restore, and draw it again.
  Generator g(606);
  rand({5}, kFloat32, &g);
  const GeneratorState saved = g.state();
  auto draw = [&g] {
    std::vector<double> out = values_of(randn({7}, kFloat64, &g));
    for (double x : values_of(randint(-4, 9, {3}, kInt64, &g))) out.push_back(x);
    for (double x : values_of(ops::dropout(ones({9}, kFloat64), 0.5, &g).out)) out.push_back(x);
    for (double x : values_of(rand({2, 3}, kFloat64, &g))) out.push_back(x);
    return out;
  };
  const std::vector<double> first = draw();
  rand({100}, kFloat32, &g);
  REQUIRE(saved.generator() == &g);
  g.set_state(saved.seed, saved.offset);
  CHECK(draw() == first);

  // Seeds 1 and 2, and two successive draws from one generator, are uncorrelated
  // (correlation's standard error at n = 200000 is 0.0022), as are neighbours within a draw.
  Generator s1(1), s2(2);
  const std::vector<double> a = values_of(rand({200000}, kFloat64, &s1));
  const std::vector<double> b = values_of(rand({200000}, kFloat64, &s2));
  const std::vector<double> c = values_of(rand({200000}, kFloat64, &s1));
  CHECK(std::fabs(correlation(a, b)) < 0.012);
  CHECK(std::fabs(correlation(a, c)) < 0.012);
  const std::vector<double> lag0(a.begin(), a.end() - 1), lag1(a.begin() + 1, a.end());
  CHECK(std::fabs(correlation(lag0, lag1)) < 0.012);
  // Box-Muller pairs (elements 2k, 2k+1 share their two uniforms) are uncorrelated, and so are their squares.
  const std::vector<double> z = values_of(randn({200000}, kFloat64, &s1));
  std::vector<double> even, odd, even2, odd2;
  for (size_t i = 0; i + 1 < z.size(); i += 2) {
    even.push_back(z[i]), odd.push_back(z[i + 1]);
    even2.push_back(z[i] * z[i]), odd2.push_back(z[i + 1] * z[i + 1]);
  }
  CHECK(std::fabs(correlation(even, odd)) < 0.015);
  CHECK(std::fabs(correlation(even2, odd2)) < 0.015);
}

// torch.nn.functional.dropout: each element zeroed with probability p, the rest scaled by
// 1 / (1 - p); p outside [0, 1] (NaN included) is refused ("dropout probability has to be
// between 0 and 1"). Note [Dropout mask from counters]: the mask is row-major in x's shape,
// so a transposed x gets the mask its contiguous copy would.
TEST_CASE("probe random: dropout keeps 1 - p, scales kept values by 1/(1-p), transposed input, bad p refused") {
  for (DType dt : {kFloat32, kFloat64, kFloat16}) {
    const std::string dt_name = dtype_name(dt);
    CAPTURE(dt_name);
    const double p = 0.3;
    Generator g(12);
    const std::vector<double> y = values_of(ops::dropout(full({200000}, 2.0, dt), p, &g).out);
    const double kept_value = values_of(full({1}, 2.0 / (1.0 - p), dt))[0];  // 2 / 0.7 rounded once to dt
    int64_t kept = 0, other = 0;
    for (double v : y) {
      if (v == 0.0) continue;
      if (std::fabs(v - kept_value) <= 1e-6 * kept_value) ++kept;
      else ++other;
    }
    CHECK(other == 0);
    CHECK(std::fabs(double(kept) / double(y.size()) - 0.7) < 0.005);
  }
  Tensor x = random_tensor({37, 21}, kFloat32, 3, Layout::Transposed);
  Generator g1(40), g2(40);
  CHECK(values_of(ops::dropout(x, 0.5, &g1).out) == values_of(ops::dropout(x.contiguous(), 0.5, &g2).out));
  // p = 0 is the identity and p = 1 zeros, neither drawing.
  Generator g3(41);
  CHECK(values_of(ops::dropout(x, 0.0, &g3).out) == values_of(x));
  CHECK(max_abs(ops::dropout(x, 1.0, &g3).out) == 0.0);
  CHECK(g3.offset() == 0);
  for (double bad : {-0.1, 1.1, std::numeric_limits<double>::quiet_NaN()})
    check_error([&] { ops::dropout(x, bad); }, {"dropout", "p"});
}

// torch.nn.init._calculate_fan_in_and_fan_out: fan_in = size(1) * receptive field,
// fan_out = size(0) * receptive field, receptive field = prod(size(2:)); "Fan in and fan out
// can not be computed for tensor with fewer than 2 dimensions". A grouped Conv2d's weight is
// (out, in / groups, kH, kW), so its fan_in is in / groups * kH * kW.
TEST_CASE("probe random: init fans of Linear, grouped Conv2d, 3-D and 5-D weights; fewer than 2 dims refused") {
  CHECK(nn::init::fans(empty({30, 20})) == std::pair<int64_t, int64_t>{20, 30});
  nn::Conv2d conv(64, 128, {3, 5}, {.groups = 4});
  CHECK(nn::init::fans(conv.weight) == std::pair<int64_t, int64_t>{16 * 15, 128 * 15});
  CHECK(nn::init::fans(empty({6, 4, 7})) == std::pair<int64_t, int64_t>{28, 42});
  CHECK(nn::init::fans(empty({2, 3, 4, 5, 6})) == std::pair<int64_t, int64_t>{360, 240});
  CHECK(nn::init::fans(empty({20, 30}).t()) == std::pair<int64_t, int64_t>{20, 30});  // the view's sizes
  check_error([] { nn::init::fans(empty({5})); }, {"init", "2 dims"});
  check_error([] { nn::init::fans(empty({})); }, {"init", "2 dims"});
  check_error([] { nn::init::kaiming_uniform_(empty({5})); }, {"init"});
  check_error([] { nn::init::xavier_normal_(empty({})); }, {"init"});
}

// torch.nn.init.kaiming_uniform_: bound = gain * sqrt(3 / fan), gain = calculate_gain(
// "leaky_relu", a) = sqrt(2 / (1 + a^2)); kaiming_normal_: std = gain / sqrt(fan);
// xavier_uniform_: bound = gain * sqrt(6 / (fan_in + fan_out)); xavier_normal_: std = gain *
// sqrt(2 / (fan_in + fan_out)). A uniform on (-B, B) has variance B^2 / 3.
TEST_CASE("probe random: init kaiming and xavier bounds and variances for fan_in/fan_out, leaky slopes and gains") {
  const Shape shape{256, 64, 3, 3};  // fan_in 576, fan_out 2304; 147456 elements
  const double fan_in = 576, fan_out = 2304;
  struct Case {
    const char* name;
    std::function<void(const Tensor&, Generator*)> init;
    bool uniform;
    double scale;  // bound (uniform) or std (normal)
  };
  using nn::init::FanMode;
  auto gain = [](double a) { return std::sqrt(2.0 / (1.0 + a * a)); };
  const std::vector<Case> cases = {
      {"kaiming_uniform a=0 fan_in",
       [](const Tensor& t, Generator* g) { nn::init::kaiming_uniform_(t, 0.0, FanMode::FanIn, g); }, true,
       gain(0.0) * std::sqrt(3.0 / fan_in)},
      {"kaiming_uniform a=0.2 fan_out",
       [](const Tensor& t, Generator* g) { nn::init::kaiming_uniform_(t, 0.2, FanMode::FanOut, g); }, true,
       gain(0.2) * std::sqrt(3.0 / fan_out)},
      {"kaiming_uniform a=sqrt(5)",
       [](const Tensor& t, Generator* g) { nn::init::kaiming_uniform_(t, std::sqrt(5.0), FanMode::FanIn, g); }, true,
       1.0 / std::sqrt(fan_in)},
      {"kaiming_normal a=0 fan_out",
       [](const Tensor& t, Generator* g) { nn::init::kaiming_normal_(t, 0.0, FanMode::FanOut, g); }, false,
       gain(0.0) / std::sqrt(fan_out)},
      {"kaiming_normal a=0.01 fan_in",
       [](const Tensor& t, Generator* g) { nn::init::kaiming_normal_(t, 0.01, FanMode::FanIn, g); }, false,
       gain(0.01) / std::sqrt(fan_in)},
      {"xavier_uniform gain 5/3 (tanh)",
       [](const Tensor& t, Generator* g) { nn::init::xavier_uniform_(t, 5.0 / 3.0, g); }, true,
       5.0 / 3.0 * std::sqrt(6.0 / (fan_in + fan_out))},
      {"xavier_normal gain 3/4 (selu)", [](const Tensor& t, Generator* g) { nn::init::xavier_normal_(t, 0.75, g); },
       false, 0.75 * std::sqrt(2.0 / (fan_in + fan_out))},
  };
  for (const Case& c : cases)
    for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
      const std::string dt_name = dtype_name(dt);
      CAPTURE(c.name);
      CAPTURE(dt_name);
      Generator g(321);
      Tensor w = empty(shape, dt);
      c.init(w, &g);
      const std::vector<double> v = values_of(w);
      const Moments m = moments_of(v);
      const double expected_var = c.uniform ? c.scale * c.scale / 3.0 : c.scale * c.scale;
      CHECK(std::fabs(m.mean) < 0.01 * c.scale);
      CHECK(std::fabs(m.var / expected_var - 1.0) < 0.02);
      if (c.uniform) {
        double mx = 0;
        for (double x : v) mx = std::max(mx, std::fabs(x));
        CHECK(mx <= c.scale);
        CHECK(mx > 0.99 * c.scale);
      } else {
        CHECK(std::fabs(m.kurtosis - 3.0) < 0.1);
      }
    }
}

// The truncated normal on [a, b] (a, b absolute, as torch.nn.init.trunc_normal_): with
// alpha = (a - mu) / sigma, beta = (b - mu) / sigma, Z = Phi(beta) - Phi(alpha),
// mean = mu + sigma (phi(alpha) - phi(beta)) / Z and
// var = sigma^2 [1 + (alpha phi(alpha) - beta phi(beta)) / Z - ((phi(alpha) - phi(beta)) / Z)^2].
// No value may leave [a, b], and none may pile up on a bound (clamping instead of sampling).
TEST_CASE("probe random: init trunc_normal_ stays in [a, b] with the truncated normal's mean and variance") {
  struct Case {
    double mu, sigma, a, b;
  };
  const Case cases[] = {{0.0, 1.0, -2.0, 2.0}, {0.5, 2.0, -1.0, 3.0}, {0.0, 0.02, -0.04, 0.04},
                        {0.0, 1.0, 3.0, 4.0},  {1.0, 1.0, -2.0, 2.0}, {0.0, 0.5, -3.0, -0.5},
                        {0.0, 1.0, 5.0, 6.0},  {0.0, 1.0, -6.0, -5.5}};  // far tails: the last that resolve
  for (const Case& c : cases)
    for (DType dt : {kFloat64, kFloat32, kFloat16}) {
      CAPTURE(c.mu);
      CAPTURE(c.sigma);
      CAPTURE(c.a);
      CAPTURE(c.b);
      const std::string dt_name = dtype_name(dt);
      CAPTURE(dt_name);
      Generator g(9);
      Tensor t = empty({400, 500}, dt);
      nn::init::trunc_normal_(t, c.mu, c.sigma, c.a, c.b, &g);
      const std::vector<double> v = values_of(t);
      const double al = (c.a - c.mu) / c.sigma, be = (c.b - c.mu) / c.sigma;
      const double Z = normal_cdf(be) - normal_cdf(al);
      const double d = (normal_pdf(al) - normal_pdf(be)) / Z;
      const double mean = c.mu + c.sigma * d;
      const double var = c.sigma * c.sigma * (1.0 + (al * normal_pdf(al) - be * normal_pdf(be)) / Z - d * d);
      const Moments m = moments_of(v);
      CHECK(std::fabs(m.mean - mean) < 0.01 * std::sqrt(var));
      CHECK(std::fabs(m.var / var - 1.0) < 0.02);
      // Bounds as the dtype holds them: torch clamps in the tensor's dtype (tensor.clamp_(min=a, max=b)),
      // so float16 keeps 0.04 as 0.0400085.
      const double a_dt = values_of(full({1}, c.a, dt))[0], b_dt = values_of(full({1}, c.b, dt))[0];
      int64_t outside = 0, on_bound = 0;
      for (double x : v) outside += x < a_dt || x > b_dt, on_bound += x == c.a || x == c.b;
      CHECK(outside == 0);
      if (dt != kFloat16) CHECK(on_bound < 5);  // float16's grid has the bounds as neighbours of drawn values
    }
  check_error([] { nn::init::trunc_normal_(empty({3, 3}), 0.0, 1.0, 2.0, 2.0); }, {"trunc_normal_"});
  check_error([] { nn::init::trunc_normal_(empty({3, 3}), 0.0, 1.0, 1.0, -1.0); }, {"trunc_normal_"});
  // Past 6 std the CDF is 0 or 1 to double precision: every value would land on one bound
  // (torch's on 11 for [10, 11], with a warning). Refused instead.
  for (const auto& [a, b] : {std::pair{10.0, 11.0}, std::pair{-11.0, -10.0}, std::pair{6.5, 100.0}})
    check_error([&] { nn::init::trunc_normal_(empty({3, 3}), 0.0, 1.0, a, b); }, {"trunc_normal_", "more than 6 std"});
}

// The layers' reset_parameters in PyTorch: nn.Linear and nn.Conv2d draw the weight with
// kaiming_uniform_(a = sqrt(5)) (bound 1 / sqrt(fan_in)) and the bias uniform(+-1 / sqrt(fan_in)),
// fan_in = in_features or in_channels / groups * kH * kW; nn.Embedding draws N(0, 1) and zeros
// the padding_idx row; nn.LayerNorm is ones/zeros; nn.BatchNorm2d is ones/zeros with
// running_mean 0, running_var 1 and num_batches_tracked 0.
TEST_CASE(
    "probe random: default init of Linear, grouped Conv2d, Embedding, LayerNorm and BatchNorm2d as reset_parameters") {
  auto check_uniform = [](const Tensor& t, double bound, const char* what) {
    CAPTURE(what);
    const std::vector<double> v = values_of(t);
    const Moments m = moments_of(v);
    double mx = 0;
    for (double x : v) mx = std::max(mx, std::fabs(x));
    CHECK(mx <= bound);
    CHECK(mx > (v.size() > 1000 ? 0.99 : 0.5) * bound);
    if (v.size() > 1000) CHECK(std::fabs(m.var / (bound * bound / 3.0) - 1.0) < 0.03);
  };
  manual_seed(2718);
  nn::Linear lin(400, 300);
  check_uniform(lin.weight, 1.0 / std::sqrt(400.0), "Linear.weight");
  check_uniform(lin.bias, 1.0 / std::sqrt(400.0), "Linear.bias");
  nn::Conv2d conv(64, 256, {3, 3}, {.groups = 8});
  const double conv_bound = 1.0 / std::sqrt(64.0 / 8 * 9);
  check_uniform(conv.weight, conv_bound, "Conv2d.weight");
  check_uniform(conv.bias, conv_bound, "Conv2d.bias");

  nn::Embedding emb(2000, 64, {.padding_idx = -1});
  const std::vector<double> e = values_of(emb.weight.narrow(0, 0, 1999));
  const Moments m = moments_of(e);
  CHECK(std::fabs(m.mean) < 0.01);
  CHECK(std::fabs(m.var - 1.0) < 0.02);
  CHECK(max_abs(emb.weight.select(0, 1999)) == 0.0);

  nn::LayerNorm ln({4, 6});
  CHECK(values_of(ln.weight) == std::vector<double>(24, 1.0));
  CHECK(values_of(ln.bias) == std::vector<double>(24, 0.0));
  nn::BatchNorm2d bn(5);
  CHECK(values_of(bn.weight) == std::vector<double>(5, 1.0));
  CHECK(values_of(bn.bias) == std::vector<double>(5, 0.0));
  CHECK(values_of(bn.running_mean) == std::vector<double>(5, 0.0));
  CHECK(values_of(bn.running_var) == std::vector<double>(5, 1.0));
  CHECK(bn.num_batches_tracked.dtype() == kInt64);
  CHECK(values_of(bn.num_batches_tracked) == std::vector<double>{0.0});
}
