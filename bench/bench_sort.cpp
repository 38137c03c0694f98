// bench_sort: sort, argsort and topk (tensor/ops/sort.h) on the row lengths models sort
// (attention-sized rows, a vocabulary's logits for top-k sampling, one long row), next to
// tools/bench_sort_torch.py (the same cases through torch.sort(stable=True) and torch.topk).
//
//   build/bench/bench_sort [--device cpu|cuda] [--reps N] [--threads N]
//
// Milliseconds, the median of --reps timed calls after 3 warm-up calls (host clock; on CUDA
// each call is followed by a synchronize). The CPU takes an eighth of the rows.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/device_args.h"
#include "core/stream.h"
#include "core/threads.h"
#include "tensor/factory.h"
#include "tensor/ops/sort.h"

using namespace frugal;

namespace {

struct Case {
  const char* name;
  int64_t rows, length;
  DType dtype;
  int64_t k;  // 0: sort; > 0: topk; < 0: argsort
};

}  // namespace

int main(int argc, char** argv) {
  const bench::DeviceArgs args = bench::parse_device_args("bench_sort", argc, argv);
  try {
    set_num_threads(args.threads);
    const bool gpu = args.device == "cuda";
    const Device dev = gpu ? cuda(0) : kCPU;
    const int64_t div = gpu ? 1 : 8;
    const std::vector<Case> cases = {
        {"sort rows of 128", 8192 / div, 128, kFloat32, 0},
        {"sort rows of 2048", 2048 / div, 2048, kFloat32, 0},
        {"sort rows of 32768", 64 / div, 32768, kFloat32, 0},
        {"sort one row of 4M", 1, (int64_t(1) << 22) / div, kFloat32, 0},
        {"argsort rows of 512", 4096 / div, 512, kFloat16, -1},
        {"topk 50 of 32000", 256 / div, 32000, kFloat32, 50},
        {"topk 10 of 2048", 4096 / div, 2048, kFloat32, 10},
        {"sort int64 rows of 1024", 2048 / div, 1024, kInt64, 0},
    };
    bench::Table table("sort on " + dev.str() + " (ms, median of " + std::to_string(args.reps) + ")",
                       {"case", "shape", "dtype", "ms"});
    for (const Case& c : cases) {
      const Tensor x = c.dtype == kInt64 ? randint(0, 1000, {c.rows, c.length}, {kInt64, dev})
                                         : randn({c.rows, c.length}, {c.dtype, dev});
      const double ms = 1e3 * bench::time_median(
                                  [&] {
                                    if (c.k > 0) ops::topk(x, c.k);
                                    else if (c.k < 0) ops::argsort(x);
                                    else ops::sort(x);
                                    if (gpu) synchronize(dev);
                                  },
                                  3, args.reps);
      table.add({c.name, shape_str({c.rows, c.length}), dtype_name(c.dtype), bench::fmt("%.3f", ms)});
    }
    table.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sort: %s\n", e.what());
    return 1;
  }
  return 0;
}
