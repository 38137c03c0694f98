// cross_entropy and mse_loss on CUDA against the CPU ops on the same inputs: forward and
// backward in float32, float64, float16 and bfloat16 (small C, vocabulary C, spatial), the
// differentiable ops' gradients, bad targets through the device flag, and mismatched devices.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/loss.h"
#include "core/stream.h"
#include "tensor/factory.h"
#include "tensor/ops/loss.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda nn_functional: differentiable cross_entropy and mse_loss: CUDA gradients match the CPU") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const DevicePair logits = random_pair({8, 37}, dt, 14, Layout::Contiguous, -4, 4);
    const Tensor t = from_vector<int64_t>({0, 36, -100, 5, 5, 12, 3, -100}, {8});
    Tensor ce_grad[2], ce_loss[2];
    for (int side = 0; side < 2; ++side) {
      const Tensor ls = (side ? logits.gpu : logits.cpu).detach().requires_grad_();
      ce_loss[side] = cross_entropy(ls, side ? t.to(kGpu) : t, {.label_smoothing = 0.1});
      ce_loss[side].backward();
      ce_grad[side] = ls.grad();
    }
    check_same(ce_loss[1], ce_loss[0], tol(dt), tol(dt), "cross_entropy loss");
    check_same(ce_grad[1], ce_grad[0], tol(dt, 2), tol(dt, 2) * 0.1, "cross_entropy grad");

    const DevicePair a = random_pair({5, 9}, dt, 15), c = random_pair({9}, dt, 16);
    Tensor mse_grad[2][2], mse[2];
    for (int side = 0; side < 2; ++side) {
      const Tensor as = (side ? a.gpu : a.cpu).detach().requires_grad_();
      const Tensor cs = (side ? c.gpu : c.cpu).detach().requires_grad_();
      mse[side] = mse_loss(as, cs);
      mse[side].backward();
      mse_grad[side][0] = as.grad();
      mse_grad[side][1] = cs.grad();
    }
    check_same(mse[1], mse[0], tol(dt, 2), tol(dt, 2), "mse_loss");
    check_same(mse_grad[1][0], mse_grad[0][0], tol(dt, 2), tol(dt, 2) * 0.1, "mse_loss grad input");
    check_same(mse_grad[1][1], mse_grad[0][1], tol(dt, 2), tol(dt, 2), "mse_loss grad target");
  }
}

TEST_CASE("cuda nn_functional: cross_entropy forward and backward match the CPU (small C, vocabulary C, spatial)") {
  uint64_t seed = 100;
  struct Case {
    Shape logits;
  };
  for (const Case& c : {Case{{9, 10}}, Case{{5, 30522}}, Case{{2, 4, 3, 5}}, Case{{7}}}) {
    const int64_t C = c.logits.size() == 1 ? c.logits[0] : c.logits[1];
    Shape tshape = c.logits;
    if (tshape.size() == 1) tshape.clear();
    else tshape.erase(tshape.begin() + 1);
    std::vector<double> tv = random_values(numel_of(tshape), seed++, 0, double(C));
    for (double& v : tv) v = std::floor(v);
    if (tv.size() > 2) tv[1] = -100;  // one ignored target
    const Tensor t = make_tensor(tv, tshape, kInt64);
    const DevicePair tp = pair_of(t);
    for (DType dt : kFloatTypes) {
      for (double e : {0.0, 0.2}) {
        for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
          const std::string what =
              name_of(dt, c.logits) + " smoothing " + std::to_string(e) + " reduction " + std::to_string(int(red));
          const DevicePair x = random_pair(c.logits, dt, seed++, Layout::Contiguous, -6, 6);
          const CrossEntropyOptions o{.label_smoothing = e, .reduction = red};
          const auto fc = ops::cross_entropy(x.cpu, tp.cpu, o);
          const auto fg = ops::cross_entropy(x.gpu, tp.gpu, o);
          const double long_row = std::sqrt(double(C) / 10.0);
          check_same(fg.loss, fc.loss, tol(dt, long_row), tol(dt, long_row), "loss " + what);
          check_same(fg.lse, fc.lse, tol(kFloat32, long_row), tol(kFloat32, long_row), "lse " + what);
          check_same(fg.count, fc.count, 0, 0, "count " + what);
          const DevicePair g = random_pair(fc.loss.sizes(), dt, seed++);
          check_same(ops::cross_entropy_backward(g.gpu, x.gpu, tp.gpu, fg.lse, fg.count, o),
                     ops::cross_entropy_backward(g.cpu, x.cpu, tp.cpu, fc.lse, fc.count, o), tol(dt, 2),
                     tol(dt, 2) * 1e-2, "grad " + what);
        }
      }
    }
  }
}

TEST_CASE("cuda nn_functional: a bad cross_entropy target is a frugal::Error, and the device stays usable") {
  const Tensor x = zeros({3, 5}, {kFloat32, kGpu});
  for (DType it : {kInt64, kInt32}) {
    check_error(
        [&] {
          ops::cross_entropy(x, from_vector<int64_t>({0, 5, 1}, {3}, {it, kGpu}));
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"cross_entropy", "target 5", "5 classes", "position [1]"});
    check_error(
        [&] {
          ops::cross_entropy(x, from_vector<int64_t>({-3, 0, 1}, {3}, {it, kGpu}));
          synchronize(kGpu);  // deferred: raised at the next sync
        },
        {"cross_entropy", "target -3", "position [0]"});
  }
  const Tensor big = zeros({2, 2000}, {kFloat32, kGpu});
  check_error(
      [&] {
        ops::cross_entropy(big, from_vector<int64_t>({0, 2000}, {2}, {kInt64, kGpu}));
        synchronize(kGpu);  // deferred: raised at the next sync
      },
      {"cross_entropy", "target 2000", "position [1]"});
  synchronize(kGpu);
  const auto ok = ops::cross_entropy(x, from_vector<int64_t>({4, -100, 0}, {3}, {kInt64, kGpu}));
  check_close(ok.loss, {std::log(5.0)}, 1e-6, 1e-6, "after errors");
}

TEST_CASE("cuda nn_functional: cross_entropy and mse_loss on mismatched devices are errors naming both tensors") {
  const Tensor xg = zeros({2, 3}, {kFloat32, kGpu});
  check_error([&] { ops::cross_entropy(xg, zeros({2}, kInt64)); }, {"cross_entropy", "one device", "int64[2] cpu"});
  check_error([&] { ops::mse_loss(xg, zeros({2, 3})); }, {"mse_loss", "one device"});
}
