// dropout: the mask against Philox's formula, scaled, Bernoulli(1 - p) and replayable; every
// dtype, non-contiguous inputs, p = 0 and 1, eval; the differentiable op
// (autograd/ops/dropout.h) through gradcheck with a fixed generator state.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops/dropout.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tensor/philox.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

}  // namespace

TEST_CASE("nn_functional: dropout mask is Philox's formula, scaled, Bernoulli(1 - p), replayable") {
  const double p = 0.3;
  const int64_t n = 20000;
  Generator gen(1234);
  gen.set_state(1234, 77);
  const ops::DropoutResult r = ops::dropout(ones({n}, kFloat64), p, &gen);
  CHECK(r.range.seed == 1234);
  CHECK(r.range.counter == 77);
  CHECK(gen.offset() == 77 + uint64_t(n + 3) / 4);
  const std::vector<double> y = values_of(r.out);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const PhiloxResult w = philox4x32(1234, 77 + uint64_t(i) / 4);
    const bool keep = philox_uniform(w.x[i % 4]) < float(1.0 - p);
    REQUIRE_MESSAGE(y[size_t(i)] == (keep ? 1.0 / (1.0 - p) : 0.0), "element ", i);
    kept += keep;
  }
  // Kept fraction within 5 standard deviations of 1 - p.
  const double frac = double(kept) / double(n), sd = std::sqrt(p * (1 - p) / double(n));
  CHECK(std::fabs(frac - (1 - p)) < 5 * sd);
  // Same generator state: the same mask; the next state: a different one.
  gen.set_state(1234, 77);
  CHECK(values_of(ops::dropout(ones({n}, kFloat64), p, &gen).out) == y);
  CHECK(values_of(ops::dropout(ones({n}, kFloat64), p, &gen).out) != y);
  // dropout_with_range re-creates it on other values.
  const Tensor x = random_tensor({n}, kFloat32, 400);
  const std::vector<double> xv = values_of(x), yr = values_of(ops::dropout_with_range(x, p, r.range));
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(yr[size_t(i)] == (y[size_t(i)] == 0 ? 0.0 : double(float(float(xv[size_t(i)]) * float(1.0 / (1.0 - p))))));
}

TEST_CASE("nn_functional: dropout in every dtype, non-contiguous, p = 0 and 1, eval, errors") {
  const double p = 0.5;
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const Tensor x = random_tensor({6, 9}, dt, 410, layout);
      Generator gen(9);
      const ops::DropoutResult r = ops::dropout(x, p, &gen);
      CHECK(r.out.is_contiguous());
      const std::vector<double> xv = values_of(x), y = values_of(r.out);
      for (int64_t i = 0; i < x.numel(); ++i) {  // element i is row-major in x's shape
        const PhiloxResult w = philox4x32(9, uint64_t(i) / 4);
        const bool keep = philox_uniform(w.x[i % 4]) < 0.5f;
        CHECK_MESSAGE(y[size_t(i)] == (keep ? 2.0 * xv[size_t(i)] : 0.0), name_of(dt, layout), " element ", i);
      }
    }
  }
  Generator gen(3);
  const Tensor x = random_tensor({4, 5}, kFloat32, 420);
  check_close(ops::dropout(x, 0.0, &gen).out, values_of(x), 0, 0, "p = 0");
  check_close(ops::dropout(x, 1.0, &gen).out, std::vector<double>(20, 0.0), 0, 0, "p = 1");
  CHECK(gen.offset() == 0);  // neither drew counters
  CHECK(dropout(x, 0.5, /*training=*/false).shares_storage(x));
  CHECK(dropout(x, 0.0).shares_storage(x));
  CHECK(ops::dropout(zeros({0, 3}), 0.5, &gen).out.sizes() == Shape{0, 3});
  check_error([&] { ops::dropout(x, 1.5); }, {"dropout", "[0, 1]", "1.5", "float32[4, 5] cpu"});
  check_error([&] { dropout(x, -0.1); }, {"dropout", "[0, 1]"});
  check_error([&] { ops::dropout(zeros({3}, kInt32), 0.5); }, {"dropout", "floating", "int32"});
}

TEST_CASE("nn_functional: dropout passes gradcheck with a fixed generator state; backward replays the mask") {
  Generator gen(55);
  for (double p : {0.2, 0.6, 1.0}) {
    CAPTURE(p);
    check_gradcheck(
        [&](const TensorList& in) {
          gen.set_state(55, 10);  // the same mask at every evaluation of f
          return dropout(in[0], p, true, &gen);
        },
        {leaf({5, 7}, 430)});
  }
  // The backward uses the forward's range even after the generator moved on.
  const Tensor x = leaf({300}, 431);
  gen.set_state(8, 0);
  const Tensor y = dropout(x, 0.4, true, &gen);
  CHECK(y.grad_fn_name() == "DropoutBackward");
  ops::dropout(ones({1000}), 0.4, &gen);  // advance
  y.backward(ones({300}, kFloat64));
  const std::vector<double> yv = values_of(y), xv = values_of(x), gx = values_of(x.grad());
  for (size_t i = 0; i < yv.size(); ++i) CHECK(gx[i] == (yv[i] == 0.0 && xv[i] != 0.0 ? 0.0 : 1.0 / (1.0 - 0.4)));
}

// A dropped element is x * 0 as PyTorch's x * mask (Note [Dropout mask from counters]): an
// inf or NaN there gives NaN, where a select gave 0 and hid a corrupted sample from GradScaler
// and LossWatch; p = 1 is x * 0 too. torch: F.dropout(tensor([inf, nan, -inf, 2.] * 4), .5)
// has NaN at each dropped inf and NaN, and a NaN upstream gradient makes x.grad all NaN.
TEST_CASE("nn_functional: dropout multiplies by the mask: a dropped inf or NaN gives NaN, in every dtype") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v;
  for (int k = 0; k < 64; ++k)
    v.insert(v.end(), {inf, nan, -inf, 2.0, -3.0});  // 320: the vector kernel's groups and tail
  for (DType dt : kFloatTypes) {
    CAPTURE(dtype_name(dt));
    const Tensor x = make_tensor(v, {int64_t(v.size())}, dt);
    Generator gen(5);
    const std::vector<double> y = values_of(ops::dropout(x, 0.5, &gen).out);
    int dropped_nonfinite = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const PhiloxResult w = philox4x32(5, uint64_t(i) / 4);
      const bool keep = philox_uniform(w.x[i % 4]) < 0.5f;
      if (keep) {
        CHECK((std::isnan(v[i]) ? std::isnan(y[i]) : y[i] == 2.0 * v[i]));
      } else if (std::isfinite(v[i])) {
        CHECK(y[i] == 0.0);
        CHECK(std::signbit(y[i]) == std::signbit(v[i]));  // -3 * 0 = -0, as PyTorch
      } else {
        CHECK(std::isnan(y[i]));
        ++dropped_nonfinite;
      }
    }
    CHECK(dropped_nonfinite > 10);
    const std::vector<double> all = values_of(ops::dropout(make_tensor({inf, nan, 1.0, -1.0}, {4}, dt), 1.0).out);
    CHECK(std::isnan(all[0]));
    CHECK(std::isnan(all[1]));
    CHECK(all[2] == 0.0);
    CHECK((all[3] == 0.0 && std::signbit(all[3])));
  }
  // The backward multiplies the same mask into the gradient: a NaN upstream stays NaN.
  const Tensor x = make_tensor(std::vector<double>(16, 1.0), {16}, kFloat64).requires_grad_();
  Generator gen(11);
  dropout(x, 0.5, true, &gen).backward(full({16}, nan, {kFloat64}));
  for (double g : values_of(x.grad())) CHECK(std::isnan(g));
}
