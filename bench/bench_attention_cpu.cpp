// bench_attention_cpu: attention's float32 element kernels on the CPU - dropout, the masked
// softmax (no mask, and BERT's additive padding mask) and the softmax gradient - the generic path
// (dropout_kernel_generic, masked_softmax_kernel_generic, softmax_backward_kernel_generic) next to
// the vectorized kernel of each x86-64 level this CPU runs (Note [Vectorized dropout] in
// tensor/cpu/dropout_kernel.cpp, Note [Vectorized masked softmax] in
// tensor/cpu/masked_softmax_kernel.cpp).
//
//   build/bench/bench_attention_cpu [--batch N] [--heads N] [--seq-len N] [--threads N] [--reps N]
//
// Defaults: BERT-base's attention weights at batch 4, sequence 128, (4, 12, 128, 128), at 2
// threads, the median of 20 runs after 3 warm-up runs, into preallocated outputs, so only the
// kernels (and their threading) are timed.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/threads.h"
#include "examples/flags.h"
#include "tensor/cpu/gemm.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/softmax.h"

using namespace frugal;
namespace cpu = frugal::ops::cpu;

int main(int argc, char** argv) {
  int64_t batch = 4, heads = 12, seq = 128;
  int threads = 2, reps = 20;
  cli::parse_or_exit("bench_attention_cpu",
                     "usage: bench_attention_cpu [--batch N] [--heads N] [--seq-len N] [--threads N] [--reps N]\n",
                     [&] {
                       cli::Flags flags(argc, argv);
                       while (flags.next()) {
                         if (flags.is("--batch")) batch = flags.integer(1, 1 << 16);
                         else if (flags.is("--heads")) heads = flags.integer(1, 1 << 10);
                         else if (flags.is("--seq-len")) seq = flags.integer(1, 1 << 14);
                         else if (flags.is("--threads")) threads = int(flags.integer(1, 1024));
                         else if (flags.is("--reps")) reps = int(flags.integer(1, 1 << 20));
                         else flags.unknown();
                       }
                     });
  set_num_threads(threads);
  const Shape shape{batch, heads, seq, seq};
  manual_seed(1);
  const Tensor scores = randn(shape), g = randn(shape);
  // BERT's additive mask (B, 1, 1, T): odd sequences lose their last quarter (-10000).
  std::vector<float> m(size_t(batch * seq), 0.0f);
  for (int64_t b = 1; b < batch; b += 2)
    for (int64_t t = seq * 3 / 4; t < seq; ++t) m[size_t(b * seq + t)] = -10000.0f;
  const Tensor mask = from_vector<float>(m, {batch, 1, 1, seq});
  const Tensor y = ops::masked_softmax(scores, mask, false, 0.125), out = empty(shape);
  const Generator::Range range{1234, 0};
  const double p = 0.1;

  // The masked softmax's parameters as ops::masked_softmax builds them.
  auto params = [&](const Tensor& mk) {
    ops::MaskedSoftmaxParams ps;
    ps.ndim = 4;
    ps.scale = 0.125;
    for (int d = 0; d < 4; ++d) ps.sizes[d] = shape[size_t(d)];
    if (mk.defined()) {
      ps.kind = 2;
      const Tensor v = mk.expand(shape);
      for (int d = 0; d < 4; ++d) ps.mask_strides[d] = v.stride(d);
    }
    return ps;
  };
  const ops::MaskedSoftmaxParams plain = params(Tensor()), masked = params(mask);
  const Tensor mask_view = mask.expand(shape);
  const ops::SoftmaxShape rows{batch * heads * seq, seq, 1};

  struct Row {
    const char* name;
    std::function<void()> generic, kernel;
  };
  const std::vector<Row> table = {
      {"dropout", [&] { cpu::dropout_kernel_generic(out, scores, p, range); },
       [&] { cpu::dropout_kernel(out, scores, p, range); }},
      {"masked_softmax", [&] { cpu::masked_softmax_kernel_generic(out, scores, Tensor(), plain); },
       [&] { cpu::masked_softmax_kernel(out, scores, Tensor(), plain); }},
      {"masked_softmax +mask", [&] { cpu::masked_softmax_kernel_generic(out, scores, mask_view, masked); },
       [&] { cpu::masked_softmax_kernel(out, scores, mask_view, masked); }},
      {"softmax_backward", [&] { cpu::softmax_backward_kernel_generic(out, g, y, rows, false); },
       [&] { cpu::softmax_backward_kernel(out, g, y, rows, false); }},
  };

  const std::vector<cpu::GemmIsa> levels = {cpu::GemmIsa::X86_64_V2, cpu::GemmIsa::X86_64_V3, cpu::GemmIsa::X86_64_V4};
  std::printf("attention float32 (%lld, %lld, %lld, %lld), %d threads, median of %d runs (ms)\n", (long long)batch,
              (long long)heads, (long long)seq, (long long)seq, threads, reps);
  std::printf("%-22s %10s", "kernel", "generic");
  for (cpu::GemmIsa isa : levels)
    if (cpu::cpu_supports(isa)) std::printf(" %10s", cpu::gemm_isa_name(isa));
  std::printf("\n");
  const cpu::GemmIsa in_use = cpu::gemm_isa();
  std::vector<std::pair<std::string, double>> keys;
  for (const Row& r : table) {
    const double generic = bench::time_median(r.generic, 3, reps) * 1e3;
    std::printf("%-22s %10.3f", r.name, generic);
    double best = generic;
    for (cpu::GemmIsa isa : levels) {
      if (!cpu::cpu_supports(isa)) continue;
      cpu::set_gemm_isa(isa);
      const double ms = bench::time_median(r.kernel, 3, reps) * 1e3;
      std::printf(" %10.3f", ms);
      if (isa == in_use) best = ms;
    }
    cpu::set_gemm_isa(in_use);
    std::printf("\n");
    std::string key = r.name;
    for (char& c : key)
      if (c == ' ' || c == '+') c = '_';
    keys.push_back({key, generic / best});
  }
  for (const auto& [key, speedup] : keys) std::printf("%s_speedup: %.2f\n", key.c_str(), speedup);
  return 0;
}
