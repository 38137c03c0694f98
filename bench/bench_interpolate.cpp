// bench_interpolate: interpolate's forward and backward (ops::interpolate and
// ops::interpolate_backward) on a decoder's 2x upsampling and a 0.6x downsampling, per mode,
// next to tools/bench_interpolate_torch.py (the same cases through torch's autograd).
//
//   build/bench/bench_interpolate [--device cpu|cuda] [--reps N] [--threads N]
//
// Milliseconds, the median of --reps timed calls after 3 warm-up calls (host clock; on CUDA
// each call is followed by a synchronize, which costs microseconds against milliseconds).
// The CUDA backward gathers (Note [Interpolation source indices]); PyTorch's scatters with
// atomicAdd, so the rows say what determinism costs.
#include <cstdio>
#include <exception>
#include <string>

#include "bench/bench_util.h"
#include "bench/device_args.h"
#include "core/stream.h"
#include "core/threads.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/interpolate.h"

using namespace frugal;

int main(int argc, char** argv) {
  const bench::DeviceArgs args = bench::parse_device_args("bench_interpolate", argc, argv);
  try {
    set_num_threads(args.threads);
    const bool gpu = args.device == "cuda";
    const Device dev = gpu ? cuda(0) : kCPU;
    // The CPU gets a smaller batch: the same shapes per plane, an eighth of the planes.
    const Shape xs = gpu ? Shape{32, 64, 128, 128} : Shape{4, 64, 128, 128};
    bench::Table table(
        "interpolate on " + dev.str() + " of " + shape_str(xs) + " (ms, median of " + std::to_string(args.reps) + ")",
        {"case", "dtype", "layout", "forward", "backward"});
    using M = InterpolateMode;
    struct Case {
      std::string name;
      InterpolateOptions o;
    };
    const Case cases[] = {
        {"nearest x2", {.scale_factor = 2.0, .mode = M::Nearest}},
        {"bilinear x2", {.scale_factor = 2.0, .mode = M::Bilinear}},
        {"bicubic x2", {.scale_factor = 2.0, .mode = M::Bicubic}},
        {"bilinear x0.6", {.scale_factor = 0.6, .mode = M::Bilinear}},
        {"bicubic x0.6", {.scale_factor = 0.6, .mode = M::Bicubic}},
    };
    auto sync = [&] {
      if (gpu) synchronize(dev);
    };
    for (DType t : gpu ? std::vector<DType>{kFloat32, kFloat16} : std::vector<DType>{kFloat32})
      for (bool nhwc : {false, true}) {
        Tensor x = randn(xs, {t, dev});
        if (nhwc) x = to_channels_last(x);
        for (const Case& c : cases) {
          Tensor gy = randn(ops::interpolate_output_shape(xs, c.o), {t, dev});
          if (nhwc) gy = to_channels_last(gy);
          const double fwd = 1e3 * bench::time_median(
                                       [&] {
                                         Tensor y = ops::interpolate(x, c.o);
                                         sync();
                                       },
                                       3, args.reps);
          const double bwd = 1e3 * bench::time_median(
                                       [&] {
                                         Tensor gx = ops::interpolate_backward(gy, xs, c.o);
                                         sync();
                                       },
                                       3, args.reps);
          table.add({c.name, dtype_name(t), nhwc ? "channels-last" : "contiguous", bench::fmt("%.3f", fwd),
                     bench::fmt("%.3f", bwd)});
        }
      }
    table.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_interpolate: %s\n", e.what());
    return 1;
  }
  return 0;
}
