// linear_cross_entropy (Note [Fused linear cross entropy]) against the unfused
// cross_entropy(linear(...)): loss and every gradient, with ignored rows, label smoothing,
// several chunks, views, tied weights and autocast; plus finite differences and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "autograd/autocast.h"
#include "autograd/ops/all.h"
#include "autograd/ops/linear_cross_entropy.h"
#include "core/graph_capture.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

// Targets in [0, C) with every third one ignore_index (-100).
Tensor targets(const Shape& s, int64_t C, uint64_t seed, bool ignore_some = true) {
  std::vector<double> v = random_values(numel_of(s), seed, 0.0, double(C));
  for (size_t i = 0; i < v.size(); ++i) v[i] = ignore_some && i % 3 == 1 ? -100.0 : std::floor(v[i]);
  return make_tensor(v, s, kInt64);
}

struct Grads {
  Tensor loss, x, weight, bias;
};

Grads run(bool fused, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& t,
          const LinearCrossEntropyOptions& o) {
  const Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  const Tensor b = b0.defined() ? b0.detach().requires_grad_() : Tensor();
  const Tensor loss = fused ? linear_cross_entropy(x, w, b, t, o)
                            : cross_entropy(linear(x, w, b).reshape({-1, w.size(0)}), t.reshape({-1}), o.loss);
  loss.backward();
  return {loss, x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

void check_same(const Grads& got, const Grads& want, double rtol, const std::string& what) {
  check_close(got.loss, values_of(want.loss), rtol, rtol, what + " loss");
  CHECK(got.loss.dtype() == want.loss.dtype());
  for (auto [g, e, name] :
       {std::tuple{got.x, want.x, "x"}, {got.weight, want.weight, "weight"}, {got.bias, want.bias, "bias"}}) {
    REQUIRE_MESSAGE(g.defined() == e.defined(), what, " grad ", name);
    if (!g.defined()) continue;
    CHECK_MESSAGE(g.dtype() == e.dtype(), what, " grad ", name);
    CHECK_MESSAGE(g.sizes() == e.sizes(), what, " grad ", name);
    check_close(g, values_of(e), rtol, rtol * std::max(1.0, max_abs(e)), what + " grad " + name);
  }
}

}  // namespace

TEST_CASE("linear_cross_entropy: loss and gradients equal the unfused pair (float64 and float32)") {
  const int64_t H = 6, C = 11;
  for (DType dt : {kFloat64, kFloat32})
    for (Reduction red : {Reduction::Mean, Reduction::Sum})
      for (double smoothing : {0.0, 0.1})
        for (int64_t chunk : {int64_t(0), int64_t(1), int64_t(3)})
          for (bool with_bias : {true, false}) {
            // x (2, 5, H) as a transposed view: the kernels see a non-contiguous input.
            const Tensor x = random_tensor({2, H, 5}, dt, 1).transpose(1, 2);
            const Tensor w = random_tensor({C, H}, dt, 2), b = with_bias ? random_tensor({C}, dt, 3) : Tensor();
            const Tensor t = targets({2, 5}, C, 4);
            const LinearCrossEntropyOptions o{.loss = {.label_smoothing = smoothing, .reduction = red},
                                              .chunk_rows = chunk};
            const std::string what = name_of(dt) + (red == Reduction::Mean ? " mean" : " sum") + " smoothing " +
                                     std::to_string(smoothing) + " chunk " + std::to_string(chunk) +
                                     (with_bias ? " bias" : "");
            check_same(run(true, x, w, b, t, o), run(false, x, w, b, t, o), dt == kFloat64 ? 1e-12 : 1e-6, what);
          }
}

TEST_CASE("linear_cross_entropy: finite differences in float64, int32 targets, no rows ignored") {
  const Tensor t = targets({7}, 5, 9, /*ignore_some=*/false).to(kInt32);
  check_gradcheck(
      [&](const TensorList& in) {
        return linear_cross_entropy(in[0], in[1], in[2], t, {.loss = {.label_smoothing = 0.2}, .chunk_rows = 2});
      },
      {leaf({7, 4}, 10), leaf({5, 4}, 11), leaf({5}, 12)});
}

TEST_CASE("linear_cross_entropy: size-0 features or rows give the unfused pair's loss and gradients") {
  // H = 0: the logits are the bias alone (zero without one); N = 0: no rows, a NaN mean and a
  // zero sum, as PyTorch's cross_entropy of an empty batch.
  for (auto [N, H] : {std::pair<int64_t, int64_t>{4, 0}, {0, 3}, {0, 0}})
    for (Reduction red : {Reduction::Mean, Reduction::Sum})
      for (bool with_bias : {true, false}) {
        const int64_t C = 5;
        const Tensor x = random_tensor({N, H}, kFloat64, 40), w = random_tensor({C, H}, kFloat64, 41);
        const Tensor b = with_bias ? random_tensor({C}, kFloat64, 42) : Tensor();
        const Tensor t = targets({N}, C, 43, /*ignore_some=*/false);
        const LinearCrossEntropyOptions o{.loss = {.reduction = red}};
        const std::string what = "N " + std::to_string(N) + " H " + std::to_string(H) +
                                 (red == Reduction::Mean ? " mean" : " sum") + (with_bias ? " bias" : "");
        const Grads want = run(false, x, w, b, t, o);
        const Grads got = run(true, x, w, b, t, o);
        if (N == 0 && red == Reduction::Mean) {
          CHECK_MESSAGE(std::isnan(got.loss.item<double>()), what);
          CHECK_MESSAGE(std::isnan(want.loss.item<double>()), what);
          continue;
        }
        check_same(got, want, 1e-12, what);
      }
}

TEST_CASE("linear_cross_entropy: a tied weight sums both gradients, as with the unfused head") {
  // The weight is also an embedding table (BERT's decoder tied to the word embeddings).
  const Tensor w0 = random_tensor({9, 4}, kFloat64, 20), ids = targets({6}, 9, 21, false), t = targets({6}, 9, 22);
  Tensor grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    const Tensor w = w0.detach().requires_grad_();
    const Tensor h = mul(embedding(w, ids), 0.5);
    const Tensor loss = fused ? linear_cross_entropy(h, w, Tensor(), t) : cross_entropy(linear(h, w), t);
    loss.backward();
    grads[fused] = w.grad();
  }
  check_close(grads[1], values_of(grads[0]), 1e-12, 1e-12, "tied weight");
}

TEST_CASE("linear_cross_entropy: every row ignored gives NaN (mean) or 0 (sum), as PyTorch") {
  const Tensor x = random_tensor({3, 4}, kFloat32, 30), w = random_tensor({5, 4}, kFloat32, 31);
  const Tensor t = full({3}, -100.0, kInt64);
  CHECK(std::isnan(linear_cross_entropy(x, w, Tensor(), t).item<float>()));
  CHECK(linear_cross_entropy(x, w, Tensor(), t, {.loss = {.reduction = Reduction::Sum}}).item<float>() == 0.0f);
  const Tensor xg = x.detach().requires_grad_();
  linear_cross_entropy(xg, w, Tensor(), t, {.loss = {.reduction = Reduction::Sum}}).backward();
  CHECK(max_abs(xg.grad()) == 0.0);
  CHECK(xg.grad().sizes() == x.sizes());
}

TEST_CASE("linear_cross_entropy: inside a graph capture every row goes through, with the same results") {
  // Note [Fused linear cross entropy]: a capture may not read the targets on the host, so the
  // ignored rows are not left out and a Mean divides by a device count. The capture is
  // simulated on the CPU as tests/cpu/test_graph_capture.cpp does (CudaGraph's state).
  const int64_t H = 6, C = 11;
  int key = 0;
  memory::begin_graph_pool(kCPU, &key);
  for (Reduction red : {Reduction::Mean, Reduction::Sum})
    for (bool all_ignored : {false, true}) {
      const Tensor x = random_tensor({2, H, 5}, kFloat64, 40).transpose(1, 2);
      const Tensor w = random_tensor({C, H}, kFloat64, 41), b = random_tensor({C}, kFloat64, 42);
      const Tensor t = all_ignored ? full({2, 5}, -100.0, kInt64) : targets({2, 5}, C, 43);
      const LinearCrossEntropyOptions o{.loss = {.label_smoothing = 0.1, .reduction = red}, .chunk_rows = 3};
      const std::string what =
          std::string(red == Reduction::Mean ? "mean" : "sum") + (all_ignored ? " all ignored" : "");
      const Grads want = run(false, x, w, b, t, o);
      core::GraphCapture capture{.pool_key = &key, .device = kCPU};
      core::set_current_graph_capture(&capture);
      Grads got;
      try {
        got = run(true, x, w, b, t, o);
      } catch (...) {
        core::set_current_graph_capture(nullptr);
        throw;
      }
      core::set_current_graph_capture(nullptr);
      if (all_ignored && red == Reduction::Mean) {  // NaN loss and gradients, as the unfused pair's
        CHECK(std::isnan(got.loss.item<double>()));
        CHECK(std::isnan(want.loss.item<double>()));
        continue;
      }
      check_same(got, want, 1e-12, what);
    }
  memory::release_graph_pool(kCPU, &key, Stream{nullptr, kCPU});
}

TEST_CASE("linear_cross_entropy: under autocast it matches the unfused pair, in float32 master dtypes") {
  const int64_t H = 16, C = 40;
  for (DType low : {kBFloat16, kFloat16}) {
    const Tensor x = random_tensor({4, 6, H}, kFloat32, 40),
                 w = random_tensor({C, H}, kFloat32, 41, Layout::Contiguous, -0.5, 0.5);
    const Tensor b = random_tensor({C}, kFloat32, 42), t = targets({4, 6}, C, 43);
    Grads g[2];
    for (int fused = 0; fused < 2; ++fused) {
      AutocastGuard amp(kCPU, low);
      g[fused] = run(fused == 1, x, w, b, t, {.loss = {}, .chunk_rows = 5});
    }
    CHECK(g[1].loss.dtype() == kFloat32);
    // Both round the logits to `low` and the logits' gradient to `low` for its GEMMs; the
    // unfused one also rounds the GEMMs' results, the fused one keeps them in float32.
    check_same(g[1], g[0], low == kBFloat16 ? 2e-2 : 4e-3, std::string("autocast ") + dtype_name(low));
  }
}

TEST_CASE("linear_cross_entropy: bad inputs are errors that name the op and the shapes") {
  const Tensor x = zeros({3, 4}), w = zeros({5, 4}), t = zeros({3}, kInt64);
  check_error([&] { linear_cross_entropy(x, zeros({5, 3}), Tensor(), t); }, {"linear_cross_entropy", "[5, 3]"});
  check_error([&] { linear_cross_entropy(x, w, zeros({4}), t); }, {"linear_cross_entropy", "bias"});
  check_error([&] { linear_cross_entropy(x, w, Tensor(), zeros({4}, kInt64)); }, {"linear_cross_entropy", "target"});
  check_error([&] { linear_cross_entropy(x, w, Tensor(), zeros({3})); }, {"linear_cross_entropy", "int64"});
  check_error([&] { linear_cross_entropy(x, w.to(kFloat64), Tensor(), t); }, {"linear_cross_entropy", "dtype"});
  check_error([&] { linear_cross_entropy(x, w, Tensor(), t, {.loss = {.reduction = Reduction::None}}); },
              {"linear_cross_entropy", "None"});
  check_error([&] { linear_cross_entropy(x, w, Tensor(), full({3}, 7.0, kInt64)); }, {"7"});
}

TEST_CASE("linear_cross_entropy: the (N, C) logits never exist at once") {
  // 512 x 2000 float32 logits are 4 MiB, their gradient as much again; a chunk of 32 rows
  // is 1/16 of that, the weight gradient (C, H) 125 KiB.
  const int64_t N = 512, H = 16, C = 2000;
  const Tensor x = random_tensor({N, H}, kFloat32, 50), w = random_tensor({C, H}, kFloat32, 51);
  const Tensor t = targets({N}, C, 52);
  int64_t added[2];
  for (int fused = 0; fused < 2; ++fused) {
    memory::reset_peak(kCPU);
    const int64_t base = memory::stats(kCPU).allocated_bytes.current;
    run(fused == 1, x, w, Tensor(), t, {.loss = {}, .chunk_rows = 32});
    added[fused] = memory::stats(kCPU).allocated_bytes.peak - base;
  }
  MESSAGE("peak added: unfused ", added[0], " bytes, fused ", added[1], " bytes");
  CHECK(added[0] >= 2 * N * 2 / 3 * C * 4);  // the kept rows' logits and their gradient, at least
  CHECK(added[1] * 8 < added[0]);
}
