// bench_conv_cpu: ResNet-50's convolutions on the CPU, float32 NCHW, one row per distinct
// shape: the forward (conv2d), the input gradient (conv2d_backward_input) and the weight
// gradient (conv2d_backward_weight) as raw ops, the fastest of repeated calls (the development machine is shared: a
// median is quantized by other processes' time slices), and the sum over the network (each row times the number of
// layers of that shape; the stem has no input gradient). tools/bench_conv_cpu_torch.py times the same rows in PyTorch
// (oneDNN).
//
//   bench_conv_cpu [--batch 8] [--reps 5] [--image-size 224] [--cpu-time]
//
// --cpu-time times by the process's CPU time instead of the wall clock: at OMP_NUM_THREADS=1
// that is the time the kernels ran, whatever else the machine runs (for A/B comparisons).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "bench/bench_util.h"
#include "core/error.h"
#include "examples/flags.h"
#include "tensor/factory.h"
#include "tensor/ops/conv.h"

namespace frugal::bench {
namespace {

/// The process's CPU time in seconds: at one thread, the time it ran, however long other
/// processes held the core (a robust A/B measure on a loaded machine).
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

/// The fastest time in seconds (wall, or CPU time when `cpu_time`) of `reps` calls of fn(),
/// after one untimed call.
template <typename F>
double time_min(F&& fn, int reps, bool cpu_time) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = cpu_time ? cpu_seconds() : now_seconds();
    fn();
    best = std::min(best, (cpu_time ? cpu_seconds() : now_seconds()) - t0);
  }
  return best;
}

/// One convolution shape: input (N, C, H, H), K output channels, an RxR kernel, stride
/// (padding R / 2), and how many layers of ResNet-50 have it.
struct Layer {
  int64_t C, H, K, R, stride, count;
};

// At 224x224; H scales with --image-size.
constexpr Layer kLayers[] = {
    {3, 224, 64, 7, 2, 1},   {64, 56, 64, 1, 1, 1},    {256, 56, 64, 1, 1, 2},   {64, 56, 64, 3, 1, 3},
    {64, 56, 256, 1, 1, 4},  {256, 56, 128, 1, 1, 1},  {128, 56, 128, 3, 2, 1},  {256, 56, 512, 1, 2, 1},
    {128, 28, 512, 1, 1, 4}, {512, 28, 128, 1, 1, 3},  {128, 28, 128, 3, 1, 3},  {512, 28, 256, 1, 1, 1},
    {256, 28, 256, 3, 2, 1}, {512, 28, 1024, 1, 2, 1}, {256, 14, 1024, 1, 1, 6}, {1024, 14, 256, 1, 1, 5},
    {256, 14, 256, 3, 1, 5}, {1024, 14, 512, 1, 1, 1}, {512, 14, 512, 3, 2, 1},  {1024, 14, 2048, 1, 2, 1},
    {512, 7, 2048, 1, 1, 3}, {2048, 7, 512, 1, 1, 2},  {512, 7, 512, 3, 1, 2},
};

}  // namespace
}  // namespace frugal::bench

int main(int argc, char** argv) {
  using namespace frugal;
  using namespace frugal::bench;
  struct Args {
    int64_t batch = 8, reps = 5, image = 224;
    bool cpu_time = false;
  };
  const Args a = cli::parse_or_exit(
      "bench_conv_cpu", "usage: bench_conv_cpu [--batch N] [--reps N] [--image-size P] [--cpu-time]\n", [&] {
        Args r;
        cli::Flags flags(argc, argv);
        while (flags.next()) {
          if (flags.is("--batch")) r.batch = flags.positive();
          else if (flags.is("--reps")) r.reps = flags.positive();
          else if (flags.is("--image-size")) r.image = flags.positive();
          else if (flags.is("--cpu-time")) r.cpu_time = true;
          else flags.unknown();
        }
        return r;
      });
  const int64_t batch = a.batch, reps = a.reps, image = a.image;
  Table table("ResNet-50 convolutions on cpu, float32 NCHW, batch " + std::to_string(batch) + " (fastest ms)",
              {"layer", "count", "forward", "grad_x", "grad_w", "GFLOP/s"});
  double total[3] = {0, 0, 0};
  for (const Layer& l : kLayers) {
    const int64_t H = l.H * image / 224;
    const Conv2dOptions o{.stride = l.stride, .padding = l.R / 2};
    const Tensor x = randn({batch, l.C, H, H}), w = randn({l.K, l.C, l.R, l.R});
    const Tensor y = ops::conv2d(x, w, Tensor(), o);
    const Tensor gy = randn(y.sizes());
    const double f = time_min([&] { (void)ops::conv2d(x, w, Tensor(), o); }, int(reps), a.cpu_time);
    const bool stem = l.C == 3;
    const double bi =
        stem ? 0 : time_min([&] { (void)ops::conv2d_backward_input(gy, x.sizes(), w, o); }, int(reps), a.cpu_time);
    const double bw = time_min([&] { (void)ops::conv2d_backward_weight(gy, x, w.sizes(), o); }, int(reps), a.cpu_time);
    const double macs = double(y.numel()) * double(l.C * l.R * l.R);
    const double gflops = (stem ? 4 : 6) * macs / (f + bi + bw) / 1e9;
    total[0] += l.count * f, total[1] += l.count * bi, total[2] += l.count * bw;
    table.add({fmt("%lldx%lld %lld->%lld/%lld @%lld", (long long)l.R, (long long)l.R, (long long)l.C, (long long)l.K,
                   (long long)l.stride, (long long)H),
               fmt("%lld", (long long)l.count), fmt("%.2f", f * 1e3), fmt("%.2f", bi * 1e3), fmt("%.2f", bw * 1e3),
               fmt("%.0f", gflops)});
  }
  table.add(
      {"network", "53", fmt("%.1f", total[0] * 1e3), fmt("%.1f", total[1] * 1e3), fmt("%.1f", total[2] * 1e3), ""});
  table.print();
  KeyFigures k;
  k.add("conv_forward_ms", total[0] * 1e3);
  k.add("conv_grad_x_ms", total[1] * 1e3);
  k.add("conv_grad_w_ms", total[2] * 1e3);
  k.add("conv_total_ms", (total[0] + total[1] + total[2]) * 1e3);
  k.print();
  return 0;
}
