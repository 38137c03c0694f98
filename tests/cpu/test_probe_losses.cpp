// Probes of losses at the inputs that break naive formulas (2026-12-05 findings): float16
// smooth_l1/huber squared d before dividing by beta (inf where the loss fits), logsumexp's
// gradient was NaN at large finite entries of a slice holding +inf, and linear_cross_entropy
// named a bad target by its place in a chunk, under cross_entropy's name. Expected values are
// PyTorch 1.13's, written beside them.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/ops/all.h"
#include "autograd/ops/linear_cross_entropy.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

TEST_CASE("probe losses: 16-bit smooth_l1 and huber are computed in float32 and rounded once") {
  // torch: F.smooth_l1_loss(a, 0, beta=1000.) for a = [300, 2, 250] float16: none [45, 0.0020008, 31.25],
  // mean 25.421875; F.huber_loss(a, 0, delta=1000.): [44992, 2, 31248]; bfloat16 none [45, 0.0019989, 31.25].
  const Tensor a = from_vector<float>({300, 2, 250}, {3}).to(kFloat16), z = zeros({3}, TensorOptions(kFloat16));
  CHECK(smooth_l1_loss(a, z, Reduction::None, 1000.0).tolist<float>() ==
        std::vector<float>{45, 0.0020008087158203125f, 31.25});
  CHECK(smooth_l1_loss(a, z, Reduction::Mean, 1000.0).item<float>() == 25.421875f);
  CHECK(huber_loss(a, z, Reduction::None, 1000.0).tolist<float>() == std::vector<float>{44992, 2, 31248});
  CHECK(smooth_l1_loss(a.to(kBFloat16), z.to(kBFloat16), Reduction::None, 1000.0).tolist<float>() ==
        std::vector<float>{45, 0.0019989013671875f, 31.25});
  CHECK(smooth_l1_loss(a, z, Reduction::None, 1000.0).dtype() == kFloat16);
  // The gradient d / beta = 0.3 at d = 300 (float16 0.2998...), not inf * 0.
  const Tensor x = a.detach().requires_grad_();
  smooth_l1_loss(x, z, Reduction::Sum, 1000.0).backward();
  const std::vector<float> g = x.grad().tolist<float>();
  CHECK(g[0] == doctest::Approx(0.3).epsilon(1e-3));
  CHECK(g[2] == doctest::Approx(0.25).epsilon(1e-3));
  // float32's outside branch at a huge delta: delta (|d| - delta / 2), no delta^2 overflow.
  // torch: F.huber_loss(tensor([2.1e19]), tensor([0.]), reduction='none', delta=2e19) is 2.2e38.
  const float big = huber_loss(from_vector<float>({2.1e19f}, {1}), zeros({1}), Reduction::None, 2e19).item<float>();
  CHECK(big == doctest::Approx(2.2e38).epsilon(1e-6));
  CHECK(huber_loss(from_vector<float>({INFINITY}, {1}), zeros({1}), Reduction::None, 1e30).item<float>() == INFINITY);
}

TEST_CASE("probe losses: logsumexp's gradient over a slice holding +inf is 0 at its finite entries") {
  // torch: logsumexp([[inf, 100, 1], [3, 1, 2]], 1) = [inf, 3.4076]; the gradient of the sum is
  // [[nan, 0, 0], [0.6652, 0.0900, 0.2447]]; [inf, inf, 1] gives [nan, nan, 0].
  for (DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    const double big = dtype == kFloat32 ? 100.0 : 1000.0;  // exp(big) overflows in the dtype
    const Tensor x = from_vector<double>({kInf, big, 1, 3, 1, 2}, {2, 3}).to(dtype).requires_grad_();
    const Tensor y = logsumexp(x, {1});
    const std::vector<double> v = y.tolist<double>();
    CHECK(v[0] == kInf);
    CHECK(v[1] == doctest::Approx(3.40760596444438).epsilon(1e-6));
    sum(y).backward();
    const std::vector<double> g = x.grad().tolist<double>();
    CHECK(std::isnan(g[0]));
    CHECK(g[1] == 0.0);
    CHECK(g[2] == 0.0);
    CHECK(g[3] == doctest::Approx(0.66524095589).epsilon(1e-6));
    const Tensor w = from_vector<double>({kInf, kInf, 1}, {3}).to(dtype).requires_grad_();
    logsumexp(w, {0}).backward();
    const std::vector<double> gw = w.grad().tolist<double>();
    CHECK((std::isnan(gw[0]) && std::isnan(gw[1]) && gw[2] == 0.0));
  }
}

TEST_CASE("probe losses: linear_cross_entropy names a bad target by its own position, and refuses class weights") {
  const Tensor x = full({7, 5}, 0.1), w = full({11, 5}, 0.2);
  const Tensor t = from_vector<int64_t>({1, -100, 10, 0, 3, 12, 7}, {7});
  check_error([&] { linear_cross_entropy(x, w, Tensor(), t, {.loss = {}, .chunk_rows = 2}); },
              {"linear_cross_entropy", "target 12 is out of range for 11 classes", "position [5]", "int64[7]"});
  check_error(
      [&] {
        linear_cross_entropy(x, w, Tensor(), from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7}, {7}),
                             {.loss = {.weight = ones({11})}});
      },
      {"linear_cross_entropy", "class weights", "float32[11]", "cross_entropy(linear("});
}

// A NaN target masked out of an L1 loss (missing labels) left NaN in pred.grad: abs's
// backward passed NaN through even where its incoming gradient was 0. PyTorch gives 0 there
// (g * sgn(NaN)); a NaN that reaches the loss still shows in frugal.
TEST_CASE("probe losses: a NaN kept out of an L1 loss by a mask gives a zero gradient, not NaN") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor mask = make_tensor({1, 0, 1}, {3}, kFloat64).to(kBool);
  for (int form = 0; form < 3; ++form) {
    CAPTURE(form);
    const Tensor pred = make_tensor({0.5, 2.0, -1.0}, {3}, kFloat64).requires_grad_();
    const Tensor target = make_tensor({1.0, nan, 0.0}, {3}, kFloat64);
    const Tensor per_element = form == 0   ? abs(sub(pred, target))
                               : form == 1 ? l1_loss(pred, target, Reduction::None)
                                           : smooth_l1_loss(pred, target, Reduction::None, 0.5);
    sum(where(mask, per_element, zeros({3}, kFloat64))).backward();
    // torch: [-1, 0, -1] (smooth_l1 with beta 0.5: the same, |d| >= beta outside)
    CHECK(values_of(pred.grad()) == std::vector<double>{-1.0, 0.0, -1.0});
  }
  const Tensor x = make_tensor({nan, 1.0}, {2}, kFloat64).requires_grad_();
  sum(abs(x)).backward();  // the NaN reached the loss: its gradient shows it
  CHECK(std::isnan(values_of(x.grad())[0]));
  CHECK(values_of(x.grad())[1] == 1.0);
}
