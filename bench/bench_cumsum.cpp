// bench_cumsum: CUDA cumsum on 256 MiB, shape by shape, next to tools/bench_cumsum_torch.py.
//
//   build/bench/bench_cumsum [--only SUBSTRING] [--reps N]
//
// GB/s of bytes read + written (the input once, the output once) from the median of --reps
// timed runs (CUDA events) after 3 warm-up runs. The shapes cover the kernels of
// tensor/cuda/cumsum.cu: rows through the 32 x 32 tiles (one pass, or by chunk when few),
// lines along dim 0, a few long rows and one line of n (split by chunk and span). --only
// picks rows by name, e.g. to profile one of them under ncu.
#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include "bench/gpu_timer.h"
#include "examples/flags.h"
#include "tensor/factory.h"
#include "tensor/ops/cumsum.h"

namespace {

constexpr const char* kUsage = "usage: bench_cumsum [--only SUBSTRING] [--reps N]\n";

struct Args {
  std::string only;
  int reps = 30;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace frugal;
  using namespace frugal::bench;
  const Args args = cli::parse_or_exit("bench_cumsum", kUsage, [&] {
    Args a;
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--only")) a.only = flags.text();
      else if (flags.is("--reps")) a.reps = int(flags.positive());
      else flags.unknown();
    }
    return a;
  });
  try {
    constexpr int64_t kBytes = int64_t(256) << 20;
    const Device gpu = cuda(0);
    GpuTimer timer(gpu);
    Table table("CUDA cumsum on 256 MiB (GB/s of bytes read + written, median of " + std::to_string(args.reps) + ")",
                {"shape, dim", "dtype", "GB/s"});
    for (DType t : {kFloat32, kFloat16}) {
      const int64_t n = kBytes / int64_t(element_size(t));
      const Tensor a = randn({n}, {t, gpu});
      struct Case {
        std::string name;
        Tensor x;
        int64_t dim;
      };
      const Case cases[] = {
          {"(n/4096, 4096), last dim", a.view({n / 4096, 4096}), 1},
          {"(n/65536, 65536), last dim", a.view({n / 65536, 65536}), 1},
          {"(4096, n/4096), dim 0", a.view({4096, n / 4096}), 0},
          {"(8, n/8), last dim", a.view({8, n / 8}), 1},
          {"one line of n", a, 0},
      };
      for (const Case& c : cases) {
        if (!args.only.empty() && c.name.find(args.only) == std::string::npos) continue;
        const double ms = timer.median_ms([&] { Tensor out = ops::cumsum(c.x, c.dim); }, 3, args.reps);
        table.add({c.name, dtype_name(t), fmt("%.0f", 2.0 * double(kBytes) / (ms * 1e-3) * 1e-9)});
      }
    }
    table.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cumsum: %s\n", e.what());
    return 1;
  }
  return 0;
}
