// l1_loss, smooth_l1_loss, huber_loss and nll_loss against float64 loops of PyTorch's
// formulas (torch/nn/functional.py and aten's SmoothL1/Huber/NLL kernels): values for every
// reduction on transposed views and broadcasts, gradients against torch's backward formulas and
// through gradcheck, the infinite and NaN differences of Note [Pointwise regression losses],
// size-0 inputs, and the error paths.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tensor/ops/loss.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
using ops::PointwiseLoss;

/// torch's elementwise loss and its derivative in d (aten/src/ATen/native/cpu/*Kernel.cpp).
double ref_loss(PointwiseLoss kind, double d, double p) {
  const double z = std::fabs(d);
  switch (kind) {
    case PointwiseLoss::L1: return z;
    case PointwiseLoss::SmoothL1: return p == 0 ? z : z < p ? 0.5 * d * d / p : z - 0.5 * p;
    case PointwiseLoss::Huber: break;
  }
  return z < p ? 0.5 * d * d : p * (z - 0.5 * p);
}
double ref_grad(PointwiseLoss kind, double d, double p) {
  const double sign = d > 0 ? 1.0 : d < 0 ? -1.0 : d == 0 ? 0.0 : d;
  switch (kind) {
    case PointwiseLoss::L1: return sign;
    case PointwiseLoss::SmoothL1: return p == 0 ? sign : d < -p ? -1.0 : d > p ? 1.0 : d / p;
    case PointwiseLoss::Huber: break;
  }
  return d < -p ? -p : d > p ? p : d;
}

Tensor call(PointwiseLoss kind, const Tensor& a, const Tensor& b, Reduction r, double p) {
  switch (kind) {
    case PointwiseLoss::L1: return l1_loss(a, b, r);
    case PointwiseLoss::SmoothL1: return smooth_l1_loss(a, b, r, p);
    case PointwiseLoss::Huber: break;
  }
  return huber_loss(a, b, r, p);
}

const PointwiseLoss kKinds[] = {PointwiseLoss::L1, PointwiseLoss::SmoothL1, PointwiseLoss::Huber};

}  // namespace

TEST_CASE("losses: l1, smooth_l1 and huber equal float64 loops on a transposed input and a broadcast target") {
  for (const DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
    for (const PointwiseLoss kind : kKinds)
      for (const double p : {0.0, 0.7, 1.0, 2.5}) {
        if (kind == PointwiseLoss::Huber && p == 0) continue;  // delta must be > 0
        const std::string what = std::string(ops::pointwise_loss_name(kind)) + " " + name_of(dt) + " p=" +
                                 std::to_string(p);
        const Tensor a = random_tensor({5, 7}, dt, 40, Layout::Transposed, -3, 3);  // (7, 5) stored transposed
        const Tensor b = random_tensor({5}, dt, 41, Layout::Contiguous, -3, 3);
        const Tensor at = a.t();  // (5, 7)^T = (7, 5); b broadcasts along the rows
        const std::vector<double> av = values_of(at), bv = values_of(b);
        std::vector<double> loss(35), grad(35);
        double total = 0;
        for (size_t i = 0; i < 35; ++i) {
          const double d = av[i] - bv[i % 5];
          loss[i] = ref_loss(kind, d, p);
          grad[i] = ref_grad(kind, d, p);
          total += loss[i];
        }
        const double rtol = default_rtol(dt) * 4, atol = dt == kFloat64 ? 1e-12 : default_rtol(dt) * 4;
        check_close(call(kind, at, b, Reduction::None, p), loss, rtol, atol, what + " none");
        check_close(call(kind, at, b, Reduction::Sum, p), {total}, rtol, atol * 35, what + " sum");
        Tensor x = at.detach().requires_grad_(), y = b.detach().requires_grad_();
        const Tensor m = call(kind, x, y, Reduction::Mean, p);
        check_close(m, {total / 35}, rtol, atol, what + " mean");
        m.backward();
        std::vector<double> gx(35), gy(5, 0.0);
        for (size_t i = 0; i < 35; ++i) {
          gx[i] = grad[i] / 35;
          gy[i % 5] -= grad[i] / 35;
        }
        check_close(x.grad(), gx, rtol, atol, what + " input grad");
        check_close(y.grad(), gy, rtol, atol * 8, what + " target grad");
      }
}

TEST_CASE("losses: gradcheck of l1, smooth_l1 and huber in float64 through views and broadcasts") {
  for (const PointwiseLoss kind : kKinds)
    for (const Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum})
      check_gradcheck([&](const TensorList& in) { return call(kind, in[0].t(), in[1], r, 1.3); },
                      {leaf({4, 3}, 610, -3, 3), leaf({4}, 611, -3, 3)});
}

TEST_CASE("losses: infinite and NaN differences give torch's values and gradients, not NaN from the other branch") {
  // d = +inf, -inf, NaN, 0 and one on each side of beta/delta = 1.
  const std::vector<double> dv{kInf, -kInf, std::nan(""), 0.0, 0.5, -3.0};
  for (const PointwiseLoss kind : kKinds) {
    const std::string name = ops::pointwise_loss_name(kind);
    Tensor x = from_vector(dv, {6}).requires_grad_();
    const Tensor loss = call(kind, x, zeros({6}, kFloat64), Reduction::None, 1.0);
    sum(loss).backward();
    const std::vector<double> lv = values_of(loss), gv = values_of(x.grad());
    for (size_t i = 0; i < dv.size(); ++i) {
      const double want = ref_loss(kind, dv[i], 1.0), want_grad = ref_grad(kind, dv[i], 1.0);
      if (std::isnan(want)) CHECK_MESSAGE(std::isnan(lv[i]), name, " value at ", dv[i]);
      else CHECK_MESSAGE(lv[i] == want, name, " value at ", dv[i]);
      if (std::isnan(want_grad)) CHECK_MESSAGE(std::isnan(gv[i]), name, " grad at ", dv[i]);
      else CHECK_MESSAGE(gv[i] == want_grad, name, " grad at ", dv[i], ": got ", gv[i]);
    }
  }
}

TEST_CASE("losses: size-0 inputs: none is empty, sum is 0, mean is NaN (as torch)") {
  for (const PointwiseLoss kind : kKinds) {
    const Tensor a = zeros({0, 3}), b = zeros({3});
    CHECK(call(kind, a, b, Reduction::None, 1.0).sizes() == Shape{0, 3});
    CHECK(call(kind, a, b, Reduction::Sum, 1.0).item<double>() == 0.0);
    CHECK(std::isnan(call(kind, a, b, Reduction::Mean, 1.0).item<double>()));
  }
  Tensor lp = zeros({0, 4}).requires_grad_();
  const Tensor m = nll_loss(lp, zeros({0}, kInt64));
  CHECK(std::isnan(m.item<double>()));
  CHECK(nll_loss(lp, zeros({0}, kInt64), {.reduction = Reduction::Sum}).item<double>() == 0.0);
}

TEST_CASE("losses: nll_loss equals torch's formula: weights, ignore_index, every reduction, spatial dims, int32") {
  // torch: loss_i = -w[t_i] x[i, t_i] (0 where t_i == ignore_index); mean = sum / sum of w[t_i]
  // over the kept entries. Input (N, C, d) stored transposed, targets int32.
  const int64_t N = 3, C = 4, D = 5;
  const Tensor x = random_tensor({N, D, C}, kFloat64, 70, Layout::Transposed, -4, 0).permute({0, 2, 1});  // (N, C, D)
  std::vector<int64_t> tv(N * D);
  for (int64_t i = 0; i < N * D; ++i) tv[size_t(i)] = (i * 3 + 1) % C;
  tv[4] = -100;
  tv[9] = -100;
  const Tensor target = from_vector(tv, {N, D}).to(kInt32);
  const std::vector<double> w{0.5, 2.0, 1.0, 3.0};
  const Tensor weight = from_vector(w, {C});
  const std::vector<double> xv = values_of(x);
  for (const bool weighted : {false, true}) {
    std::vector<double> rows(size_t(N * D)), grad(size_t(N * C * D), 0.0);
    double total = 0, wsum = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t t = tv[size_t(n * D + d)];
        if (t == -100) continue;
        const double wt = weighted ? w[size_t(t)] : 1.0;
        rows[size_t(n * D + d)] = -wt * xv[size_t((n * C + t) * D + d)];
        grad[size_t((n * C + t) * D + d)] = -wt;
        total += rows[size_t(n * D + d)];
        wsum += wt;
      }
    const ops::NllLossOptions base{.weight = weighted ? weight : Tensor()};
    ops::NllLossOptions none = base, summed = base;
    none.reduction = Reduction::None;
    summed.reduction = Reduction::Sum;
    const std::string what = weighted ? "weighted" : "unweighted";
    check_close(nll_loss(x, target, none), rows, 1e-14, 1e-14, what + " none");
    check_close(nll_loss(x, target, summed), {total}, 1e-14, 1e-14, what + " sum");
    Tensor leaf_x = x.detach().requires_grad_();
    const Tensor m = nll_loss(leaf_x, target, base);
    check_close(m, {total / wsum}, 1e-14, 1e-14, what + " mean");
    m.backward();
    for (double& g : grad) g /= wsum;
    check_close(leaf_x.grad(), grad, 1e-14, 1e-14, what + " grad");
  }
  // nll_loss(log_softmax(z)) is cross_entropy(z), value and gradient.
  Tensor z = random_tensor({6, 5}, kFloat64, 71).requires_grad_();
  const Tensor t = from_vector<int64_t>({0, 4, 2, -100, 1, 3}, {6});
  const Tensor a = nll_loss(log_softmax(z, 1), t);
  const Tensor ga = autograd::grad({a}, {z})[0];
  const Tensor ce = cross_entropy(z, t);
  check_close(a, values_of(ce), 1e-14, 1e-14, "as cross_entropy");
  check_close(ga, values_of(autograd::grad({ce}, {z})[0]), 1e-14, 1e-14, "as cross_entropy grad");
  // 1-D input with a 0-d target; every target ignored gives NaN for mean, 0 for sum.
  check_close(nll_loss(from_vector<double>({-1, -2, -3}, {3}), scalar_tensor(int64_t(2), kInt64)), {3.0}, 0, 0, "1-d");
  const Tensor all_ignored = full({3}, -100, kInt64);
  CHECK(std::isnan(nll_loss(zeros({3, 2}), all_ignored).item<double>()));
  CHECK(nll_loss(zeros({3, 2}), all_ignored, {.reduction = Reduction::Sum}).item<double>() == 0.0);
  Tensor lp = zeros({3, 2}).requires_grad_();
  for (const double g : values_of(autograd::grad({nll_loss(lp, all_ignored, {.reduction = Reduction::Sum})}, {lp})[0]))
    CHECK(g == 0.0);
}

TEST_CASE("losses: gradcheck of nll_loss with weights and an ignored target") {
  const Tensor t = from_vector<int64_t>({2, -100, 0, 1}, {4});
  const Tensor w = from_vector<double>({0.5, 2.0, 1.5}, {3});
  for (const Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum})
    check_gradcheck([&](const TensorList& in) { return nll_loss(in[0].t(), t, {.weight = w, .reduction = r}); },
                    {leaf({3, 4}, 620, -3, 0)});
}

TEST_CASE("losses: cross_entropy with class weights equals torch's formula: smoothing, ignore_index, reductions") {
  // aten's cross_entropy_loss_label_smoothing, written out in float64: p = log_softmax(x);
  // nll_i = -w[t_i] p[i, t_i], smooth_i = -sum_c w_c p[i, c] (both 0 where t_i is ignored);
  // Mean divides each sum by the sum of w[t_i] kept; loss = (1 - e) nll + e / C smooth.
  // Logits (N, C, D) stored transposed, int32 targets.
  const int64_t N = 2, C = 3, D = 4;
  const Tensor x = random_tensor({N, D, C}, kFloat64, 80, Layout::Transposed, -3, 3).permute({0, 2, 1});
  const std::vector<int64_t> tv{0, 2, -100, 1, 2, 2, 0, -100};
  const Tensor target = from_vector(tv, {N, D}).to(kInt32);
  const std::vector<double> w{0.5, 2.0, 1.25}, xv = values_of(x);
  int64_t cases = 0;
  for (const double e : {0.0, 0.2, 1.0})
    for (const Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
      CAPTURE(e);
      CAPTURE(int(r));
      std::vector<double> rows(size_t(N * D), 0.0);
      double total = 0, wsum = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t t = tv[size_t(n * D + d)];
          if (t == -100) continue;
          double mx = -kInf, z = 0;
          for (int64_t c = 0; c < C; ++c) mx = std::max(mx, xv[size_t((n * C + c) * D + d)]);
          for (int64_t c = 0; c < C; ++c) z += std::exp(xv[size_t((n * C + c) * D + d)] - mx);
          const auto logp = [&](int64_t c) { return xv[size_t((n * C + c) * D + d)] - mx - std::log(z); };
          double smooth = 0;
          for (int64_t c = 0; c < C; ++c) smooth -= w[size_t(c)] * logp(c);
          rows[size_t(n * D + d)] = (1 - e) * -w[size_t(t)] * logp(t) + e / double(C) * smooth;
          total += rows[size_t(n * D + d)];
          wsum += w[size_t(t)];
        }
      const CrossEntropyOptions o{.label_smoothing = e, .reduction = r, .weight = from_vector(w, {C})};
      const Tensor loss = cross_entropy(x, target, o);
      if (r == Reduction::None) check_close(loss, rows, 1e-14, 1e-14, "none");
      if (r == Reduction::Sum) check_close(loss, {total}, 1e-14, 1e-14, "sum");
      if (r == Reduction::Mean) check_close(loss, {total / wsum}, 1e-14, 1e-14, "mean");
      check_gradcheck([&](const TensorList& in) { return cross_entropy(in[0].permute({0, 2, 1}), target, o); },
                      {leaf({N, D, C}, 81)});
      ++cases;
    }
  // Weights of 1 are the unweighted (fused) loss, value and gradient; 1-D logits work too.
  Tensor z = random_tensor({5, 4}, kFloat64, 82).requires_grad_();
  const Tensor t = from_vector<int64_t>({0, 3, -100, 1, 2}, {5});
  const CrossEntropyOptions plain{.label_smoothing = 0.1};
  CrossEntropyOptions ones = plain;
  ones.weight = full({4}, 1.0, kFloat64);
  const Tensor a = cross_entropy(z, t, plain), b = cross_entropy(z, t, ones);
  check_close(b, values_of(a), 1e-14, 1e-14, "weights of 1");
  check_close(autograd::grad({b}, {z})[0], values_of(autograd::grad({a}, {z})[0]), 1e-14, 1e-14, "weights of 1 grad");
  const Tensor z1 = from_vector<double>({1, 2, 3}, {3});
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  check_close(cross_entropy(z1, scalar_tensor(int64_t(0), kInt64), {.weight = from_vector<double>({2, 1, 1}, {3})}),
              {lse - 1.0}, 1e-15, 1e-15, "1-d mean divides by w[t]");
  // The fused ops refuse weights by name rather than ignoring them; a bad weight names cross_entropy.
  check_error([&] { ops::cross_entropy(z.detach(), t, ones); }, {"cross_entropy", "class weights", "float64[4]"});
  check_error([&] { cross_entropy(z, t, {.weight = full({3}, 1.0, kFloat64)}); },
              {"cross_entropy", "weight", "float64[3]"});
  MESSAGE(cases, " weighted cross_entropy settings");
}

TEST_CASE("losses: cross_entropy with class probabilities equals aten's formula, gradients in both") {
  // aten's cross_entropy_loss_prob_target in float64: p = log_softmax(x); y' = (1 - e) y + e / C;
  // row_i = -sum_c w_c y'_ic p_ic; Mean divides by the rows (numel / C). Logits (N, C, D)
  // stored transposed; targets soft (mixup-like rows), not normalised on purpose.
  const int64_t N = 2, C = 3, D = 2;
  const Tensor x = random_tensor({N, D, C}, kFloat64, 90, Layout::Transposed, -3, 3).permute({0, 2, 1});
  const Tensor y = random_tensor({N, C, D}, kFloat64, 91, Layout::Contiguous, 0, 1);
  const std::vector<double> xv = values_of(x), yv = values_of(y), w{0.5, 2.0, 1.25};
  int64_t cases = 0;
  for (const bool weighted : {false, true})
    for (const double e : {0.0, 0.3})
      for (const Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
        CAPTURE(weighted);
        CAPTURE(e);
        CAPTURE(int(r));
        std::vector<double> rows;
        double total = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t d = 0; d < D; ++d) {
            const auto at = [&](int64_t c) { return size_t((n * C + c) * D + d); };
            double mx = -kInf, z = 0, row = 0;
            for (int64_t c = 0; c < C; ++c) mx = std::max(mx, xv[at(c)]);
            for (int64_t c = 0; c < C; ++c) z += std::exp(xv[at(c)] - mx);
            for (int64_t c = 0; c < C; ++c)
              row -= (weighted ? w[size_t(c)] : 1.0) * ((1 - e) * yv[at(c)] + e / double(C)) *
                     (xv[at(c)] - mx - std::log(z));
            rows.push_back(row);
            total += row;
          }
        CrossEntropyOptions o{.label_smoothing = e, .reduction = r};
        if (weighted) o.weight = from_vector(w, {C});
        const Tensor loss = cross_entropy(x, y, o);
        if (r == Reduction::None) check_close(loss, rows, 1e-14, 1e-14, "none");
        if (r == Reduction::Sum) check_close(loss, {total}, 1e-14, 1e-14, "sum");
        if (r == Reduction::Mean) check_close(loss, {total / double(N * D)}, 1e-14, 1e-14, "mean");
        check_gradcheck([&](const TensorList& in) { return cross_entropy(in[0].permute({0, 2, 1}), in[1], o); },
                        {leaf({N, D, C}, 92), leaf({N, C, D}, 93, 0, 1)});
        ++cases;
      }
  // One-hot probabilities are the class-index loss; float16 targets follow float32 logits.
  const Tensor z = random_tensor({4, 5}, kFloat64, 94);
  const Tensor t = from_vector<int64_t>({0, 4, 2, 1}, {4});
  check_close(cross_entropy(z, one_hot(t, 5).to(kFloat64), {.label_smoothing = 0.1}),
              values_of(cross_entropy(z, t, {.label_smoothing = 0.1})), 1e-14, 1e-14, "one-hot");
  check_close(cross_entropy(z.to(kFloat32), one_hot(t, 5).to(kFloat16)), values_of(cross_entropy(z, t)), 1e-6, 1e-6,
              "float16 probabilities");
  CHECK(std::isnan(cross_entropy(zeros({0, 3}), zeros({0, 3})).item<double>()));
  // float16 logits with float32 probabilities promote to a float32 loss, as PyTorch's
  // log_softmax(x) * y; the probabilities are not rounded to float16 first.
  const Tensor zh = z.to(kFloat16), p32 = softmax(random_tensor({4, 5}, kFloat32, 95), 1);
  const Tensor mixed = cross_entropy(zh, p32);
  CHECK(mixed.dtype() == kFloat32);
  const Tensor expected = div(neg(sum(mul(log_softmax(zh, 1).to(kFloat32), p32))), 4.0);
  check_close(mixed, values_of(expected), 1e-6, 1e-6, "promoted");
  // ignore_index means nothing for probabilities: PyTorch refuses it, and so does frugal.
  check_error([&] { cross_entropy(z, one_hot(t, 5).to(kFloat64), {.ignore_index = 0}); },
              {"cross_entropy", "ignore_index", "not supported", "float64[4, 5]"});
  check_error([&] { cross_entropy(z, zeros({4, 4}, kFloat64)); },
              {"cross_entropy", "class probabilities", "float64[4, 4]", "float64[4, 5]"});
  MESSAGE(cases, " probability-target cross_entropy settings");
}

TEST_CASE("losses: binary_cross_entropy_with_logits equals aten's formula and its gradients, at 0 and far out") {
  // aten: lw = 1 + (pw - 1) y; loss = w ((1 - y) x + lw (log1p(exp(-|x|)) + max(-x, 0)));
  // d/dx = w (lw sigmoid(x) - pw y); d/dy = w (-x + (pw - 1) softplus(-x)). Written in float64.
  const int64_t N = 3, C = 5;
  const std::vector<double> xs{-100, -30, -1e-3, 0, 0.5, 40, 100, 0, -2, 3, 0, 7, -0.25, 1e-8, -19};
  std::vector<double> ys(size_t(N * C));
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = double(i % 4) / 3.0;  // 0, 1/3, 2/3, 1: soft labels too
  const std::vector<double> wv{0.5, 2.0, 1.0}, pwv{1.0, 3.0, 0.5, 2.0, 1.0};
  const auto softplus_neg = [](double x) { return std::log1p(std::exp(-std::fabs(x))) + std::max(-x, 0.0); };
  const auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  int64_t cases = 0;
  for (const bool weighted : {false, true})
    for (const bool positive_weighted : {false, true})
      for (const Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
        CAPTURE(weighted);
        CAPTURE(positive_weighted);
        CAPTURE(int(r));
        std::vector<double> loss(xs.size()), gx(xs.size()), gy(xs.size());
        double total = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t c = 0; c < C; ++c) {
            const size_t i = size_t(n * C + c);
            const double x = xs[i], y = ys[i], w = weighted ? wv[size_t(n)] : 1.0;
            const double pw = positive_weighted ? pwv[size_t(c)] : 1.0, lw = 1 + (pw - 1) * y;
            loss[i] = w * ((1 - y) * x + lw * softplus_neg(x));
            gx[i] = w * (lw * sigmoid(x) - pw * y);
            gy[i] = w * (-x + (pw - 1) * softplus_neg(x));
            total += loss[i];
          }
        const double scale = r == Reduction::Mean ? 1.0 / double(xs.size()) : 1.0;
        BceWithLogitsOptions o{.reduction = r};
        if (weighted) o.weight = from_vector(wv, {N, 1});
        if (positive_weighted) o.pos_weight = from_vector(pwv, {C});
        // The input is a transpose of a (C, N) buffer, the target contiguous.
        Tensor x = from_vector(xs, {N, C}).t().contiguous().t().detach().requires_grad_();
        Tensor y = from_vector(ys, {N, C}).requires_grad_();
        const Tensor out = binary_cross_entropy_with_logits(x, y, o);
        if (r == Reduction::None) check_close(out, loss, 1e-15, 1e-15, "none");
        if (r != Reduction::None) check_close(out, {total * scale}, 1e-14, 1e-14, "reduced");
        const TensorList g = autograd::grad({r == Reduction::None ? sum(out) : out}, {x, y});
        for (double& v : gx) v *= scale;
        for (double& v : gy) v *= scale;
        check_close(g[0], gx, 1e-15, 1e-15, "d/dx");
        check_close(g[1], gy, 1e-14, 1e-14, "d/dy");
        ++cases;
      }
  // At x = 0 with y = 0 the gradient is sigmoid(0) = 0.5, not a kink convention's 0; float32
  // logits far out give finite losses, and float16 ones run in float32 under autocast rules.
  Tensor z = zeros({4}).requires_grad_();
  binary_cross_entropy_with_logits(z, zeros({4}), {.reduction = Reduction::Sum}).backward();
  check_close(z.grad(), {0.5, 0.5, 0.5, 0.5}, 0, 0, "gradient at 0");
  const Tensor far = binary_cross_entropy_with_logits(from_vector<float>({-200.0f, 200.0f}, {2}),
                                                      from_vector<float>({1.0f, 0.0f}, {2}), {.reduction = Reduction::None});
  check_close(far, {200.0, 200.0}, 0, 0, "far out");
  // Size-0: none is empty, sum 0, mean NaN (as torch).
  CHECK(std::isnan(binary_cross_entropy_with_logits(zeros({0, 3}), zeros({0, 3})).item<double>()));
  check_error([&] { binary_cross_entropy_with_logits(zeros({3, 2}), zeros({3, 1})); },
              {"binary_cross_entropy_with_logits", "float32[3, 1]", "float32[3, 2]"});
  check_error([&] { binary_cross_entropy_with_logits(zeros({3, 2}), zeros({3, 2}), {.pos_weight = zeros({3})}); },
              {"binary_cross_entropy_with_logits pos_weight", "[3]", "[3, 2]"});
  check_error([&] { binary_cross_entropy_with_logits(zeros({3, 2}), zeros({3, 2}, kInt64)); },
              {"binary_cross_entropy_with_logits", "int64[3, 2]"});
  MESSAGE(cases, " binary_cross_entropy_with_logits settings");
}

TEST_CASE("losses: log1p and softplus equal float64 math where the naive forms lose it") {
  // log1p keeps x where 1 + x rounds; softplus is exact far out (threshold = inf) and x past
  // the threshold, as torch; its gradient is sigmoid(beta x).
  check_close(log1p(from_vector<float>({1e-10f, -1e-10f, 0.0f, 3.0f}, {4})),
              {double(1e-10f), double(-1e-10f), 0.0, std::log1p(3.0)}, 1e-7, 0, "log1p float32");
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> x{-800, -40, -1, 0, 1, 19.5, 20.5, 800};
  std::vector<double> exact, torch_threshold;
  for (const double v : x) {
    exact.push_back(std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v))));
    torch_threshold.push_back(v > 20 ? v : std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v))));
  }
  check_close(softplus(from_vector(x, {8}), 1.0, inf), exact, 1e-15, 0, "softplus, no threshold");
  check_close(softplus(from_vector(x, {8})), torch_threshold, 1e-15, 0, "softplus, threshold 20");
  check_close(softplus(from_vector<double>({1.0, -2.0}, {2}), 2.0, 20.0),
              {std::log1p(std::exp(2.0)) / 2.0, std::log1p(std::exp(-4.0)) / 2.0}, 1e-15, 0, "beta 2");
  check_gradcheck([](const TensorList& in) { return softplus(in[0].t(), 1.5, 2.0); }, {leaf({3, 4}, 630)});
  check_gradcheck([](const TensorList& in) { return log1p(in[0].t()); }, {leaf({3, 4}, 631, -0.5, 2.0)});
  check_error([] { softplus(zeros({2}), 0.0, 20.0); }, {"softplus", "beta", "0"});
  check_error([] { log1p(zeros({2}, kInt64)); }, {"log1p", "int64[2]"});
}

TEST_CASE("losses: bad input names the op, shapes and values") {
  check_error([&] { smooth_l1_loss(zeros({3}), zeros({3}), Reduction::Mean, -1.0); },
              {"smooth_l1_loss", "beta", "-1"});
  check_error([&] { huber_loss(zeros({3}), zeros({3}), Reduction::Mean, 0.0); }, {"huber_loss", "delta", "0"});
  check_error([&] { huber_loss(zeros({3}), zeros({3}), Reduction::Mean, std::nan("")); }, {"huber_loss", "delta"});
  check_error([&] { l1_loss(zeros({3}), zeros({4})); }, {"l1_loss", "[3]", "[4]"});
  check_error([&] { l1_loss(zeros({3}), zeros({3}, kFloat64)); }, {"l1_loss", "float32[3] cpu", "float64[3] cpu"});
  const Tensor x = zeros({3, 4});
  check_error([&] { nll_loss(x, from_vector<int64_t>({0, 4, 1}, {3})); },
              {"nll_loss", "target 4", "4 classes", "[1]"});
  check_error([&] { nll_loss(x, from_vector<int64_t>({0, -1, 1}, {3})); }, {"nll_loss", "target -1", "[1]"});
  check_error([&] { nll_loss(x, zeros({2}, kInt64)); }, {"nll_loss", "int64[2] cpu", "float32[3, 4] cpu"});
  check_error([&] { nll_loss(x, zeros({3})); }, {"nll_loss", "class indices"});
  check_error([&] { nll_loss(x, zeros({3}, kInt64), {.weight = ones({3})}); }, {"nll_loss", "weight", "C = 4"});
}
