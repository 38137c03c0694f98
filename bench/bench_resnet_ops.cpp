// bench_resnet_ops: ResNet-50's conv + batch norm + ReLU layers, forward and backward
// under float16 autocast, NCHW against channels-last (NHWC), on CUDA.
//
// Note [ResNet op benchmark]
// Each row is one layer shape of ResNet-50 at the given batch (default 128, 224x224
// input): a bias-free convolution with float32 weights (cast to float16 by autocast,
// as in AMP training), batch norm with float32 parameters in training mode, and ReLU
// (batch_norm_relu) - or, for a bottleneck's last 1x1 convolution, batch_norm_add_relu
// with a residual of the output's shape. NCHW runs frugal's own batch norm kernels and a
// separate ReLU; NHWC runs cuDNN's fused persistent batch norm. One step is the forward and the backward of that layer
// (gradients of the input, the weight and the batch norm parameters), timed with CUDA
// events, median of repeated steps after warm-up, cudnn benchmark mode on (as
// torch.backends.cudnn.benchmark). tools/bench_resnet_ops.py times the same rows in
// PyTorch (channels_last, AMP) and prints the ratio.
// A second table times the stem's max pool (3x3, stride 2, padding 1, float16, 64
// channels at 112x112): its forward as training runs it (x requires grad), its backward
// op alone (frugal: max_pool2d_backward_from_input, as MaxPool2dBackward calls it;
// PyTorch: max_pool2d_with_indices_backward with the forward's indices), and one
// forward + backward step through autograd.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/batch_norm.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/pool.h"
#include "bench/bench_util.h"
#include "core/device.h"
#include "core/error.h"
#include "examples/flags.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/pool.h"

#ifdef FRUGAL_WITH_CUDA
#include "bench/gpu_timer.h"
#endif

namespace frugal::bench {
namespace {

/// One layer: input (N, C, H, W), K output channels, an RxR kernel, stride; `tail`: a
/// bottleneck's last conv, followed by batch_norm_add_relu with a residual of the output's shape.
struct Layer {
  const char* name;
  int64_t C, H, K, R, stride;
  bool tail;
};

constexpr Layer kLayers[] = {
    {"stem 7x7/2 3->64 @224", 3, 224, 64, 7, 2, false},    {"1x1 256->64 @56", 256, 56, 64, 1, 1, false},
    {"3x3 64->64 @56", 64, 56, 64, 3, 1, false},           {"1x1 64->256 @56 +add", 64, 56, 256, 1, 1, true},
    {"3x3/2 128->128 @56", 128, 56, 128, 3, 2, false},     {"3x3 128->128 @28", 128, 28, 128, 3, 1, false},
    {"1x1 512->1024/2 @28", 512, 28, 1024, 1, 2, false},   {"3x3 256->256 @14", 256, 14, 256, 3, 1, false},
    {"1x1 256->1024 @14 +add", 256, 14, 1024, 1, 1, true}, {"3x3 512->512 @7", 512, 7, 512, 3, 1, false},
    {"1x1 512->2048 @7 +add", 512, 7, 2048, 1, 1, true},
};

/// The stem max pool's rows (tools/bench_resnet_ops.py's POOL_ROWS): forward, backward, both.
constexpr const char* kPoolRows[] = {"max_pool2d 3x3/2 64 @112 forward", "max_pool2d 3x3/2 64 @112 backward",
                                     "max_pool2d 3x3/2 64 @112 fwd+bwd"};

#ifdef FRUGAL_WITH_CUDA
const Device kGpu = cuda(0);

/// Milliseconds of the stem max pool's forward, backward and forward + backward (kPoolRows).
std::vector<double> time_max_pool(int64_t batch, bool channels_last, int reps) {
  auto layout = [&](Tensor t) { return channels_last ? to_channels_last(t) : t; };
  Tensor x = layout(randn({batch, 64, 112, 112}, {kFloat16, kGpu}));
  x.requires_grad_();
  const Tensor grad = layout(randn({batch, 64, 56, 56}, {kFloat16, kGpu}));
  const MaxPool2dOptions o{.stride = 2, .padding = 1};
  const Tensor input = x.detach();
  return {gpu_median_ms([&] { (void)max_pool2d(x, 3, o); }, 5, reps),
          gpu_median_ms([&] { (void)ops::max_pool2d_backward_from_input(grad, input, 3, o); }, 5, reps),
          gpu_median_ms(
              [&] {
                max_pool2d(x, 3, o).backward(grad);
                x.set_grad(Tensor());
              },
              5, reps)};
}

/// Milliseconds of one forward + backward step of `layer` in `channels_last` or NCHW.
double time_layer(const Layer& l, int64_t batch, bool channels_last, int reps) {
  const int64_t pad = l.R / 2, OH = (l.H + 2 * pad - l.R) / l.stride + 1;
  auto layout = [&](Tensor t) { return channels_last ? to_channels_last(t) : t; };
  Tensor x = layout(randn({batch, l.C, l.H, l.H}, {kFloat16, kGpu}));
  x.requires_grad_(l.C != 3);  // the stem's input (the image) needs no gradient
  Tensor w = layout(randn({l.K, l.C, l.R, l.R}, {kFloat32, kGpu}));
  w.requires_grad_();
  Tensor gamma = ones({l.K}, {kFloat32, kGpu}), beta = zeros({l.K}, {kFloat32, kGpu});
  gamma.requires_grad_(), beta.requires_grad_();
  const Tensor rm = zeros({l.K}, {kFloat32, kGpu}), rv = ones({l.K}, {kFloat32, kGpu});
  const Tensor residual = layout(randn({batch, l.K, OH, OH}, {kFloat16, kGpu}));
  const Tensor grad = layout(randn({batch, l.K, OH, OH}, {kFloat16, kGpu}));
  auto step = [&] {
    Tensor y;
    {
      AutocastGuard amp(kGpu, kFloat16);
      const Tensor c = conv2d(x, w, Tensor(), {.stride = l.stride, .padding = pad});
      y = batch_norm_relu(c, rm, rv, gamma, beta, true, 0.1, 1e-5, l.tail ? residual : Tensor());
    }
    y.backward(grad);
    for (const Tensor* p : {&x, &w, &gamma, &beta}) p->set_grad(Tensor());
  };
  return gpu_median_ms(step, 5, reps);
}
#endif

int run(int argc, char** argv) {
  int64_t batch = 128;
  int reps = 20;
  cli::parse_or_exit("bench_resnet_ops", "usage: bench_resnet_ops [--batch N] [--quick]\n", [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--batch")) batch = flags.positive();
      else if (flags.is("--quick")) reps = 5;
      else flags.unknown();
    }
    return 0;
  });
#ifdef FRUGAL_WITH_CUDA
  FRUGAL_CHECK(cuda_device_count() > 0, "bench_resnet_ops: no GPU found");
  ops::set_cudnn_benchmark(true);
  Table table(fmt("ResNet-50 conv + batch norm + ReLU, forward + backward, float16 autocast, batch %lld (ms, median)",
                  (long long)batch),
              {"layer", "NCHW ms", "NHWC ms", "NHWC speedup"});
  KeyFigures keys;
  double total_nchw = 0, total_nhwc = 0;
  for (const Layer& l : kLayers) {
    const double nchw = time_layer(l, batch, false, reps), nhwc = time_layer(l, batch, true, reps);
    total_nchw += nchw, total_nhwc += nhwc;
    table.add({l.name, fmt("%.3f", nchw), fmt("%.3f", nhwc), fmt("%.2fx", nchw / nhwc)});
    keys.add(std::string("nhwc_ms ") + l.name, nhwc);
    keys.add(std::string("nchw_ms ") + l.name, nchw);
  }
  table.add({"sum of rows", fmt("%.3f", total_nchw), fmt("%.3f", total_nhwc), fmt("%.2fx", total_nchw / total_nhwc)});
  table.print();
  Table pool(fmt("ResNet-50 stem max pool 3x3/2 pad 1, float16, batch %lld (ms, median)", (long long)batch),
             {"row", "NCHW ms", "NHWC ms", "NHWC speedup"});
  const std::vector<double> pool_nchw = time_max_pool(batch, false, reps), pool_nhwc = time_max_pool(batch, true, reps);
  for (size_t i = 0; i < std::size(kPoolRows); ++i) {
    pool.add({kPoolRows[i], fmt("%.3f", pool_nchw[i]), fmt("%.3f", pool_nhwc[i]),
              fmt("%.2fx", pool_nchw[i] / pool_nhwc[i])});
    keys.add(std::string("nhwc_ms ") + kPoolRows[i], pool_nhwc[i]);
    keys.add(std::string("nchw_ms ") + kPoolRows[i], pool_nchw[i]);
  }
  pool.print();
  keys.add("nhwc_ms total", total_nhwc);
  keys.add("nchw_ms total", total_nchw);
  keys.print();
  return 0;
#else
  (void)batch, (void)reps;
  std::printf("bench_resnet_ops: frugal was built without CUDA\n");
  return 1;
#endif
}

}  // namespace
}  // namespace frugal::bench

int main(int argc, char** argv) {
  try {
    return frugal::bench::run(argc, argv);
  } catch (const frugal::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
