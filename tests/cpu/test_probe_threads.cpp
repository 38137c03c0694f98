// Probes of multithreaded autograd (2026-12-05 findings): backward on separate graphs that
// share a leaf, from several threads at once, lost one thread's gradient now and then and
// could free an accumulator another thread was storing (PyTorch supports this use and sums
// into .grad: "Multithreaded autograd" in its notes). The names carry "thread", so
// tools/sanitize.sh tsan runs them.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
// Runs body(k) on `threads` threads that start together.
template <typename F>
void run_together(int threads, F body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int k = 0; k < threads; ++k)
    pool.emplace_back([&, k] {
      ++ready;
      while (ready.load() < threads) std::this_thread::yield();
      body(k);
    });
  for (std::thread& t : pool) t.join();
}
}  // namespace

TEST_CASE("autograd threads: separate graphs over one shared leaf sum every thread's gradient") {
  // Each thread adds (k + 1) to every element of w.grad: 1 + 2 + 3 + 4 = 10 per round.
  constexpr int kThreads = 4, kRounds = 300;
  int wrong = 0;
  for (int round = 0; round < kRounds; ++round) {
    const Tensor w = ones({64}, TensorOptions(kFloat64)).requires_grad_();
    run_together(kThreads, [&](int k) { sum(mul(w, double(k + 1))).backward(); });
    const std::vector<double> g = w.grad().tolist<double>();
    for (double v : g) wrong += v != 10.0;
  }
  CHECK(wrong == 0);
}

TEST_CASE("autograd threads: a shared MLP's parameters get the serial sum of the threads' gradients") {
  const Tensor w1 = random_tensor({16, 8}, TensorOptions(kFloat64), 1).requires_grad_();
  const Tensor w2 = random_tensor({1, 16}, TensorOptions(kFloat64), 2).requires_grad_();
  constexpr int kThreads = 4, kSteps = 20;
  const auto loss = [&](int k, int step) {
    const Tensor x = random_tensor({5, 8}, TensorOptions(kFloat64), uint64_t(100 * k + step));
    return sum(matmul(tanh(matmul(x, w1.t())), w2.t()));
  };
  for (int k = 0; k < kThreads; ++k)
    for (int s = 0; s < kSteps; ++s) loss(k, s).backward();
  const std::vector<double> g1 = w1.grad().tolist<double>(), g2 = w2.grad().tolist<double>();
  w1.set_grad({});
  w2.set_grad({});
  run_together(kThreads, [&](int k) {
    for (int s = 0; s < kSteps; ++s) loss(k, s).backward();
  });
  check_close(w1.grad(), g1, 1e-12, 1e-12, "w1");
  check_close(w2.grad(), g2, 1e-12, 1e-12, "w2");
}
