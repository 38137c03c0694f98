// bench_gelu_cpu: exact GELU forward and backward on the CPU in float32, the generic path
// (unary_apply per element, glibc's erfcf) next to the vectorized kernel of each x86-64 level
// this CPU runs (Note [Vectorized GELU] in tensor/cpu/gelu_kernel.cpp).
//
//   build/bench/bench_gelu_cpu [--rows N] [--cols N] [--threads N] [--reps N]
//
// Defaults: a (512, 3072) tensor (the intermediate activation of one BERT-base layer at batch 4, sequence
// 128) at 2 threads, the median of 20 runs after 3 warm-up runs, into a
// preallocated output, so only the kernels (and cpu_map's threading) are timed.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/threads.h"
#include "examples/flags.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/loops.h"
#include "tensor/factory.h"
#include "tensor/ops/unary.h"
#include "tensor/ops/unary_math.h"

using namespace frugal;
using ops::UnaryOp;

int main(int argc, char** argv) {
  int64_t rows = 512, cols = 3072;
  int threads = 2, reps = 20;
  cli::parse_or_exit("bench_gelu_cpu", "usage: bench_gelu_cpu [--rows N] [--cols N] [--threads N] [--reps N]\n", [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--rows")) rows = flags.integer(1, 1 << 20);
      else if (flags.is("--cols")) cols = flags.integer(1, 1 << 20);
      else if (flags.is("--threads")) threads = int(flags.integer(1, 1024));
      else if (flags.is("--reps")) reps = int(flags.integer(1, 1 << 20));
      else flags.unknown();
    }
  });
  set_num_threads(threads);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);  // pre-activations, tails included
  std::vector<float> xs(size_t(rows * cols)), gs(size_t(rows * cols));
  for (float& v : xs) v = normal(rng);
  for (float& v : gs) v = normal(rng);
  const Tensor x = from_vector<float>(xs, {rows, cols}), g = from_vector<float>(gs, {rows, cols});
  const Tensor y = empty_like(x), gi = empty_like(x);

  // The generic path as unary.cpp ran it before the vectorized kernels: cpu_map of UnaryFn.
  const ElementwiseLayout Lf = make_elementwise_layout("gelu", y, {x});
  const ElementwiseLayout Lb = make_elementwise_layout("gelu", gi, {g, x});
  auto generic_fwd = [&] { ops::cpu::cpu_map<float, float>(Lf, ops::UnaryFn<float, UnaryOp::Gelu>{0.0f, 0.0f}); };
  auto generic_bwd = [&] {
    ops::cpu::cpu_map<float, float, float>(Lb, ops::UnaryBackwardFn<float, UnaryOp::Gelu>{0.0f, 0.0f});
  };
  auto kernel_fwd = [&] { ops::cpu::unary_kernel(UnaryOp::Gelu, y, x, 0.0, 0.0); };
  auto kernel_bwd = [&] { ops::cpu::unary_backward_kernel(UnaryOp::Gelu, gi, g, x, 0.0, 0.0); };

  std::printf("gelu float32 (%lld, %lld), %d threads, median of %d runs (ms)\n", (long long)rows, (long long)cols,
              threads, reps);
  std::printf("%-22s %10s %10s\n", "path", "forward", "backward");
  const double gf = bench::time_median(generic_fwd, 3, reps) * 1e3, gb = bench::time_median(generic_bwd, 3, reps) * 1e3;
  std::printf("%-22s %10.3f %10.3f\n", "generic (erfcf)", gf, gb);
  const ops::cpu::GemmIsa in_use = ops::cpu::gemm_isa();
  double best_f = gf, best_b = gb;
  for (ops::cpu::GemmIsa isa :
       {ops::cpu::GemmIsa::X86_64_V2, ops::cpu::GemmIsa::X86_64_V3, ops::cpu::GemmIsa::X86_64_V4}) {
    if (!ops::cpu::cpu_supports(isa)) continue;
    ops::cpu::set_gemm_isa(isa);
    const double f = bench::time_median(kernel_fwd, 3, reps) * 1e3, b = bench::time_median(kernel_bwd, 3, reps) * 1e3;
    std::printf("%-22s %10.3f %10.3f\n", (std::string("kernel ") + ops::cpu::gemm_isa_name(isa)).c_str(), f, b);
    if (isa == in_use) best_f = f, best_b = b;
  }
  ops::cpu::set_gemm_isa(in_use);
  std::printf("gelu_fwd_generic_ms: %.3f\ngelu_bwd_generic_ms: %.3f\n", gf, gb);
  std::printf("gelu_fwd_ms: %.3f\ngelu_bwd_ms: %.3f\n", best_f, best_b);
  std::printf("gelu_fwd_speedup: %.2f\ngelu_bwd_speedup: %.2f\n", gf / best_f, gb / best_b);
  return 0;
}
