// A tour of frugal's tensor layer: fits a linear regression by gradient descent
// with raw ops (no autograd), on the GPU when there is one, and shows where the
// memory went. Run: build/examples/tensor_tour [--device cpu|cuda[:N]]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "examples/flags.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"

using namespace frugal;

int main(int argc, char** argv) try {
  const std::string device_name =
      cli::parse_or_exit("tensor_tour", "usage: tensor_tour [--device cpu|cuda[:N]]\n", [&] {
        std::string name;
        cli::Flags flags(argc, argv);
        while (flags.next()) {
          if (flags.is("--device")) name = flags.device();
          else flags.unknown();
        }
        return name;
      });
  const Device device = !device_name.empty() ? Device(device_name) : cuda_device_count() > 0 ? cuda() : kCPU;

  const int64_t n = 8192, d = 256, steps = 300;
  const double lr = 0.1;
  manual_seed(0);

  // Synthetic data: y = X w* + 0.01 noise.
  Tensor x = randn({n, d}, {kFloat32, device});
  Tensor w_true = randn({d, 1}, {kFloat32, device});
  Tensor y = ops::add(ops::matmul(x, w_true), randn({n, 1}, {kFloat32, device}), 0.01);
  Tensor w = zeros({d, 1}, {kFloat32, device});
  std::printf("frugal tensor tour on %s: fitting %lld x %lld least squares by gradient descent\n", device.str().c_str(),
              (long long)n, (long long)d);

  memory::reset_peak(device);
  const auto before = memory::stats(device);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step <= steps; ++step) {
    Tensor err = ops::sub(ops::matmul(x, w), y);                       // (n, 1)
    Tensor grad = ops::mul(ops::matmul(x.t(), err), 2.0 / double(n));  // (d, 1): X^T err * 2/n
    ops::sub_(w, grad, lr);                                            // w -= lr * grad
    if (step % 50 == 0) {
      const double loss = ops::mean(ops::mul(err, err)).item<float>();
      std::printf("  step %3lld  mse %.6f\n", (long long)step, loss);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto after = memory::stats(device);

  const double w_err = std::sqrt(ops::sum(ops::mul(ops::sub(w, w_true), ops::sub(w, w_true))).item<float>());
  std::printf("||w - w*|| = %.5f after %lld steps (%.1f steps/s)\n", w_err, (long long)steps, double(steps) / secs);
  std::printf("allocator: %lld allocations, %lld served from cache (%.1f%%), %lld new segments during the loop\n",
              (long long)(after.num_allocs - before.num_allocs), (long long)(after.cache_hits - before.cache_hits),
              100.0 * double(after.cache_hits - before.cache_hits) /
                  double(std::max<int64_t>(1, after.num_allocs - before.num_allocs)),
              (long long)(after.num_segment_allocs - before.num_segment_allocs));
  std::printf("%s", memory::memory_summary(device).c_str());
  memory::print_memory_usage(device);
  if (w_err < 0.05) return 0;
  std::fprintf(stderr, "tensor_tour: the fit did not converge: ||w - w*|| = %g, expected < 0.05\n", w_err);
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tensor_tour: %s\n", e.what());
  return 1;
}
