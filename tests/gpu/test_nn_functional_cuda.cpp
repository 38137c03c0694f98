// layer_norm, cross_entropy, dropout, masked_softmax, mse_loss and
// scaled_dot_product_attention on CUDA against the CPU ops on the same inputs: forward
// and backward in float32, float64, float16 and bfloat16 (the 16-bit types compute in
// float on both sides), the warp-per-row and block-per-row kernel paths, the dropout
// mask bit for bit, bad targets through the device flag, and mismatched devices.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/attention.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/norm.h"
#include "memory/stream.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/norm.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};
const Device kGpu = cuda(0);

struct Pair {
  Tensor cpu, gpu;
};
Pair random_pair(const Shape& s, DType t, uint64_t seed, Layout layout = Layout::Contiguous, double lo = -2,
                 double hi = 2) {
  return {random_tensor(s, {t, kCPU}, seed, layout, lo, hi), random_tensor(s, {t, kGpu}, seed, layout, lo, hi)};
}
Pair pair_of(const Tensor& cpu) { return {cpu, cpu.to(kGpu)}; }

/// Results computed in float on both sides (the CPU sums in double) agree within a few
/// roundings of the stored type; `scale` widens it for long sums.
double tol(DType t, double scale = 1.0) {
  return scale * (t == kFloat32 ? 2e-5 : t == kFloat64 ? 1e-12 : 2 * default_rtol(t));
}

void check_same(const Tensor& gpu, const Tensor& cpu, double rtol, double atol, const std::string& what) {
  REQUIRE_MESSAGE(gpu.defined() == cpu.defined(), what);
  if (!gpu.defined()) return;
  CHECK_MESSAGE(gpu.device() == kGpu, what);
  CHECK_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what, ": ", shape_str(gpu.sizes()), " vs ", shape_str(cpu.sizes()));
  check_close(gpu, values_of(cpu), rtol, atol, what);
}

std::string name_of(DType dt, const Shape& s) { return std::string(dtype_name(dt)) + " " + shape_str(s); }

}  // namespace

TEST_CASE("cuda nn_functional: layer_norm forward and backward match the CPU (warp and block rows)") {
  struct Case {
    Shape x, normalized;
  };
  uint64_t seed = 1;
  for (const Case& c : {Case{{5, 7}, {7}}, Case{{4, 33, 768}, {768}}, Case{{3, 1500}, {1500}},
                        Case{{2, 3, 4, 6}, {4, 6}}, Case{{700, 40}, {40}}}) {
    for (DType dt : kFloatTypes) {
      for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
        for (bool affine : {false, true}) {
          const std::string what = name_of(dt, c.x) + " " + layout_name(layout) + (affine ? " affine" : "");
          const Pair x = random_pair(c.x, dt, seed++, layout, -3, 5);
          const Pair w = affine ? random_pair(c.normalized, dt, seed++) : Pair{};
          const Pair b = affine ? random_pair(c.normalized, dt, seed++) : Pair{};
          const auto rc = ops::layer_norm(x.cpu, c.normalized, w.cpu, b.cpu);
          const auto rg = ops::layer_norm(x.gpu, c.normalized, w.gpu, b.gpu);
          check_same(rg.out, rc.out, tol(dt), tol(dt), "y " + what);
          check_same(rg.mean, rc.mean, tol(kFloat32), tol(kFloat32), "mean " + what);
          check_same(rg.rstd, rc.rstd, tol(kFloat32), 0, "rstd " + what);
          const Pair g = random_pair(c.x, dt, seed++);
          const auto gc = ops::layer_norm_backward(g.cpu, x.cpu, c.normalized, rc.mean, rc.rstd, w.cpu, affine);
          const auto gg = ops::layer_norm_backward(g.gpu, x.gpu, c.normalized, rg.mean, rg.rstd, w.gpu, affine);
          const int64_t M = x.cpu.numel() / numel_of(c.normalized);
          check_same(gg.x, gc.x, tol(dt, 4), tol(dt, 4), "dx " + what);
          // Column sums over M rows: allow for M roundings of the float accumulator.
          const double sum_atol = tol(dt, 4) * std::sqrt(double(M)) * 4;
          check_same(gg.weight, gc.weight, tol(dt, 4), sum_atol, "dweight " + what);
          check_same(gg.bias, gc.bias, tol(dt, 4), sum_atol, "dbias " + what);
        }
      }
    }
  }
}

TEST_CASE("cuda nn_functional: differentiable layer_norm, cross_entropy, mse_loss: CUDA gradients match the CPU") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const Pair x = random_pair({6, 64}, dt, 10), w = random_pair({64}, dt, 11), b = random_pair({64}, dt, 12);
    const Pair g = random_pair({6, 64}, dt, 13);
    TensorList grads[2];
    for (int side = 0; side < 2; ++side) {
      const Tensor xs = (side ? x.gpu : x.cpu).detach().requires_grad_();
      const Tensor ws = (side ? w.gpu : w.cpu).detach().requires_grad_();
      const Tensor bs = (side ? b.gpu : b.cpu).detach().requires_grad_();
      layer_norm(xs, {64}, ws, bs).backward(side ? g.gpu : g.cpu);
      grads[side] = {xs.grad(), ws.grad(), bs.grad()};
    }
    check_same(grads[1][0], grads[0][0], tol(dt, 4), tol(dt, 4), "layer_norm dx");
    check_same(grads[1][1], grads[0][1], tol(dt, 4), tol(dt, 8), "layer_norm dweight");
    check_same(grads[1][2], grads[0][2], tol(dt, 4), tol(dt, 8), "layer_norm dbias");

    const Pair logits = random_pair({8, 37}, dt, 14, Layout::Contiguous, -4, 4);
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

    const Pair a = random_pair({5, 9}, dt, 15), c = random_pair({9}, dt, 16);
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
    const Pair tp = pair_of(t);
    for (DType dt : kFloatTypes) {
      for (double e : {0.0, 0.2}) {
        for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
          const std::string what =
              name_of(dt, c.logits) + " smoothing " + std::to_string(e) + " reduction " + std::to_string(int(red));
          const Pair x = random_pair(c.logits, dt, seed++, Layout::Contiguous, -6, 6);
          const CrossEntropyOptions o{.label_smoothing = e, .reduction = red};
          const auto fc = ops::cross_entropy(x.cpu, tp.cpu, o);
          const auto fg = ops::cross_entropy(x.gpu, tp.gpu, o);
          const double long_row = std::sqrt(double(C) / 10.0);
          check_same(fg.loss, fc.loss, tol(dt, long_row), tol(dt, long_row), "loss " + what);
          check_same(fg.lse, fc.lse, tol(kFloat32, long_row), tol(kFloat32, long_row), "lse " + what);
          check_same(fg.count, fc.count, 0, 0, "count " + what);
          const Pair g = random_pair(fc.loss.sizes(), dt, seed++);
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

TEST_CASE("cuda nn_functional: dropout masks are identical on CPU and CUDA for the same generator state") {
  for (DType dt : kFloatTypes) {
    for (int64_t n : {1, 3, 4, 1001, 262147}) {
      for (double p : {0.1, 0.5, 0.9}) {
        const std::string what = name_of(dt, {n}) + " p " + std::to_string(p);
        const Pair x = random_pair({n}, dt, uint64_t(n));
        Generator gc(42), gg(42);
        gc.set_state(42, 1000);
        gg.set_state(42, 1000);
        const auto rc = ops::dropout(x.cpu, p, &gc);
        const auto rg = ops::dropout(x.gpu, p, &gg);
        CHECK(rg.range.seed == rc.range.seed);
        CHECK(rg.range.counter == rc.range.counter);
        check_same(rg.out, rc.out, 0, 0, "dropout " + what);  // bit for bit: the same keep decisions and scale
        check_same(ops::dropout_with_range(x.gpu, p, rc.range), rc.out, 0, 0, "dropout_with_range " + what);
      }
    }
  }
  // Non-contiguous input: element i is row-major in x's shape on both devices.
  const Pair x = random_pair({40, 30}, kFloat32, 7, Layout::Transposed);
  Generator gc(3), gg(3);
  check_same(ops::dropout(x.gpu, 0.3, &gg).out, ops::dropout(x.cpu, 0.3, &gc).out, 0, 0, "transposed");
  // Autograd: the backward on CUDA re-creates the forward's mask.
  Generator g(11);
  const Tensor xs = x.gpu.detach().requires_grad_();
  const Tensor y = dropout(xs, 0.4, true, &g);
  y.backward(ones({40, 30}, {kFloat32, kGpu}));
  const std::vector<double> yv = values_of(y), gv = values_of(xs.grad());
  for (size_t i = 0; i < yv.size(); ++i) CHECK(gv[i] == (yv[i] == 0.0 ? 0.0 : double(float(1.0 / (1.0 - 0.4)))));
}

TEST_CASE("cuda nn_functional: masked_softmax matches the CPU for every mask kind and row length") {
  uint64_t seed = 300;
  for (int64_t S : {5, 77, 1500}) {
    const int64_t B = 2, H = 3, L = 6;
    for (DType dt : kFloatTypes) {
      const std::string what = name_of(dt, {B, H, L, S});
      const Pair x = random_pair({B, H, L, S}, dt, seed++, Layout::Contiguous, -4, 4);
      std::vector<double> pad(size_t(B * S), 1.0);
      for (int64_t s = S / 2; s < S; ++s) pad[size_t(S + s)] = 0;  // batch 1 pads its second half
      const Pair bmask = pair_of(from_vector(pad, {B, 1, 1, S}).to(kBool));
      std::vector<double> add = random_values(L * S, seed++, -2, 2);
      for (int64_t s = 0; s < S; ++s) add[size_t(S + s)] = -INFINITY;  // row 1 fully masked: zeros
      const Pair fmask = pair_of(make_tensor(add, {L, S}, dt));
      const double t = tol(dt, std::sqrt(double(S) / 5.0));
      check_same(ops::masked_softmax(x.gpu, bmask.gpu, false, 0.125),
                 ops::masked_softmax(x.cpu, bmask.cpu, false, 0.125), t, t * 0.01, "bool " + what);
      check_same(ops::masked_softmax(x.gpu, fmask.gpu), ops::masked_softmax(x.cpu, fmask.cpu), t, t * 0.01,
                 "float " + what);
      check_same(ops::masked_softmax(x.gpu, Tensor(), true, 0.5), ops::masked_softmax(x.cpu, Tensor(), true, 0.5), t,
                 t * 0.01, "causal " + what);
    }
  }
}

TEST_CASE("cuda nn_functional: scaled_dot_product_attention forward and backward match the CPU") {
  const int64_t B = 2, H = 4, L = 16, S = 24, E = 32;
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    for (int mode = 0; mode < 3; ++mode) {  // plain, bool padding mask, causal
      const std::string what = std::string(dtype_name(dt)) + " mode " + std::to_string(mode);
      const Pair q = random_pair({B, H, L, E}, dt, 400), k = random_pair({B, H, S, E}, dt, 401),
                 v = random_pair({B, H, S, E}, dt, 402), g = random_pair({B, H, L, E}, dt, 403);
      std::vector<double> pad(size_t(B * S), 1.0);
      for (int64_t s = 20; s < S; ++s) pad[size_t(S + s)] = 0;
      const Pair mask = mode == 1 ? pair_of(from_vector(pad, {B, 1, 1, S}).to(kBool)) : Pair{};
      Tensor out[2];
      TensorList grads[2];
      for (int side = 0; side < 2; ++side) {
        const Tensor qs = (side ? q.gpu : q.cpu).detach().requires_grad_();
        const Tensor ks = (side ? k.gpu : k.cpu).detach().requires_grad_();
        const Tensor vs = (side ? v.gpu : v.cpu).detach().requires_grad_();
        out[side] = scaled_dot_product_attention(qs, ks, vs, side ? mask.gpu : mask.cpu, mode == 2);
        out[side].backward(side ? g.gpu : g.cpu);
        grads[side] = {qs.grad(), ks.grad(), vs.grad()};
      }
      const double t = tol(dt, 8);
      check_same(out[1], out[0], t, t, "out " + what);
      check_same(grads[1][0], grads[0][0], t, t, "dq " + what);
      check_same(grads[1][1], grads[0][1], t, t, "dk " + what);
      check_same(grads[1][2], grads[0][2], t, t, "dv " + what);
    }
  }
}

TEST_CASE("cuda nn_functional: mismatched devices are errors naming both tensors") {
  const Tensor xg = zeros({2, 3}, {kFloat32, kGpu}), wc = ones({3});
  check_error([&] { ops::layer_norm(xg, {3}, wc); }, {"layer_norm", "one device", "cuda:0", "float32[3] cpu"});
  check_error([&] { ops::cross_entropy(xg, zeros({2}, kInt64)); }, {"cross_entropy", "one device", "int64[2] cpu"});
  check_error([&] { ops::masked_softmax(xg, zeros({3}, kBool)); }, {"masked_softmax", "one device", "bool[3] cpu"});
  check_error([&] { ops::mse_loss(xg, zeros({2, 3})); }, {"mse_loss", "one device"});
  check_error(
      [&] {
        scaled_dot_product_attention(xg, zeros({2, 3}), xg);
      },
      {"scaled_dot_product_attention", "one device"});
}
