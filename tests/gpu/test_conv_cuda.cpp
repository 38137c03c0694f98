// conv2d (cuDNN) on CUDA against the CPU op on the same inputs: forward and every gradient
// through autograd, in float32, float16, bfloat16 and float64, on small odd configurations
// and on ResNet-50's shapes (the 7x7 stride-2 stem, 3x3 64->64 on 56x56, the 1x1 stride-2
// downsample); float32 accuracy without TF32, cudnn benchmark mode, the legacy API and
// misaligned operands, mismatched devices; conv_transpose2d (cuDNN's backward-data) likewise,
// channels-last too; and the Conv2d, BatchNorm2d and pool modules on the GPU. The pools and
// batch_norm are in test_pool_cuda.cpp and test_batch_norm_cuda.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/conv.h"
#include "nn/batch_norm.h"
#include "nn/conv.h"
#include "nn/pooling.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/matmul.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

struct ConvCase {
  Shape x, w;
  Conv2dOptions o;
  bool bias;
};

std::string name_of(const ConvCase& c) {
  return detail::str_cat("x", shape_str(c.x), " w", shape_str(c.w), " stride", c.o.stride.str(), " pad",
                         c.o.padding.str(), " dil", c.o.dilation.str(), " groups ", c.o.groups);
}

void compare_conv(const ConvCase& c, uint64_t seed) {
  const Tensor x = random_tensor(c.x, kFloat64, seed), w = random_tensor(c.w, kFloat64, seed + 1, {}, -0.5, 0.5);
  const Tensor b = c.bias ? random_tensor({c.w[0]}, kFloat64, seed + 2) : Tensor();
  const Shape ys = ops::conv2d(x, w, b, c.o).sizes();
  const Conv2dOptions o = c.o;
  for (DType t : kFloatTypes)
    compare_devices([&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], o); }, {x, w, b}, ys, t,
                    seed + 3, "conv2d " + name_of(c));
}

}  // namespace

TEST_CASE("cuda conv2d: forward and gradients match the CPU on small configurations") {
  const ConvCase cases[] = {
      {{2, 3, 9, 7}, {4, 3, 3, 2}, {}, true},
      {{2, 3, 11, 10}, {5, 3, 3, 3}, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}}, true},
      {{3, 4, 8, 8}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}, true},
      {{2, 8, 9, 9}, {8, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 8}, false},  // depthwise
      {{2, 6, 7, 7}, {4, 6, 1, 1}, {.stride = 2}, false},
      {{1, 2, 4, 5}, {3, 2, 4, 5}, {}, true},                    // kernel == input
      {{2, 3, 32, 32}, {24, 3, 16, 16}, {.stride = 16}, true},   // patchify (Note [Patchify convolution])
      {{2, 3, 10, 9}, {5, 3, 3, 2}, {.stride = {3, 2}}, false},  // patchify, leftover rows and columns
  };
  uint64_t seed = 1;
  for (const ConvCase& c : cases) compare_conv(c, seed += 10);
}

TEST_CASE("cuda conv2d: ResNet-50 shapes match the CPU in every dtype") {
  const ConvCase cases[] = {
      {{4, 3, 64, 64}, {64, 3, 7, 7}, {.stride = 2, .padding = 3}, false},  // the stem (smaller image)
      {{8, 64, 56, 56}, {64, 64, 3, 3}, {.padding = 1}, false},             // layer1's 3x3
      {{8, 256, 28, 28}, {512, 256, 1, 1}, {.stride = 2}, false},           // a 1x1 stride-2 downsample
      {{8, 64, 28, 28}, {256, 64, 1, 1}, {}, true},                         // a 1x1 expansion
  };
  uint64_t seed = 100;
  for (const ConvCase& c : cases) compare_conv(c, seed += 10);
}

TEST_CASE("cuda conv2d: float32 is accurate to float32 unless TF32 is allowed; benchmark mode agrees") {
  const Tensor x = random_tensor({4, 64, 28, 28}, kFloat32, 1), w = random_tensor({64, 64, 3, 3}, kFloat32, 2);
  const Tensor ref = ops::conv2d(x.to(kFloat64), w.to(kFloat64), Tensor(), {.padding = 1});
  const Tensor xg = x.to(kGpu), wg = w.to(kGpu);
  check_dtype_norm_close(ops::conv2d(xg, wg, Tensor(), {.padding = 1}).to(kFloat64), ref, 2e-5, "float32 without TF32");
  ops::set_allow_tf32(true);
  check_dtype_norm_close(ops::conv2d(xg, wg, Tensor(), {.padding = 1}).to(kFloat64), ref, 5e-3, "float32 with TF32");
  ops::set_allow_tf32(false);
  ops::set_cudnn_benchmark(true);
  for (DType t : {kFloat32, kFloat16}) {
    const Tensor y = ops::conv2d(xg.to(t), wg.to(t), Tensor(), {.padding = 1});
    check_dtype_norm_close(y, ops::conv2d(x.to(t), w.to(t), Tensor(), {.padding = 1}), rtol_for(t),
                           "benchmark forward");
    const Tensor gy = random_tensor(y.sizes(), {t, kGpu}, 3);
    check_dtype_norm_close(ops::conv2d_backward_input(gy, x.sizes(), wg.to(t), {.padding = 1}),
                           ops::conv2d_backward_input(gy.cpu(), x.sizes(), w.to(t), {.padding = 1}), rtol_for(t),
                           "benchmark backward input");
    check_dtype_norm_close(ops::conv2d_backward_weight(gy, xg.to(t), w.sizes(), {.padding = 1}),
                           ops::conv2d_backward_weight(gy.cpu(), x.to(t), w.sizes(), {.padding = 1}), rtol_for(t),
                           "benchmark backward weight");
  }
  ops::set_cudnn_benchmark(false);
}

TEST_CASE("cuda conv2d: the legacy cuDNN API path and operands off 16-byte alignment match the CPU") {
  // The default path is cuDNN's graph API (Note [cuDNN graph API convolutions]); the legacy
  // API serves what it declines and everything under set_cudnn_legacy_conv(true).
  ops::set_cudnn_legacy_conv(true);
  compare_conv({{2, 3, 11, 10}, {5, 3, 3, 3}, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}}, true}, 500);
  compare_conv({{3, 4, 8, 8}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}, true}, 510);
  ops::set_cudnn_legacy_conv(false);
  // Views one element into their storage: 2-byte (float16) and 4-byte (float32) aligned
  // pointers, a different plan from the aligned ones of the same shape.
  for (DType t : {kFloat16, kFloat32}) {
    const Shape xs = {2, 8, 9, 9}, ws = {8, 8, 3, 3};
    const Tensor xb = random_tensor({1 + numel_of(xs)}, {t, kGpu}, 520),
                 wb = random_tensor({1 + numel_of(ws)}, {t, kGpu}, 521);
    const Tensor x = xb.narrow(0, 1, numel_of(xs)).view(xs), w = wb.narrow(0, 1, numel_of(ws)).view(ws);
    const Conv2dOptions o{.padding = 1};
    const Tensor y = ops::conv2d(x, w, Tensor(), o);
    check_dtype_norm_close(y, ops::conv2d(x.cpu(), w.cpu(), Tensor(), o), rtol_for(t), "misaligned forward");
    const Tensor gy = random_tensor(y.sizes(), {t, kGpu}, 522);
    check_dtype_norm_close(ops::conv2d_backward_input(gy, xs, w, o),
                           ops::conv2d_backward_input(gy.cpu(), xs, w.cpu(), o), rtol_for(t),
                           "misaligned backward input");
    check_dtype_norm_close(ops::conv2d_backward_weight(gy, x, ws, o),
                           ops::conv2d_backward_weight(gy.cpu(), x.cpu(), ws, o), rtol_for(t),
                           "misaligned backward weight");
  }
}

TEST_CASE("cuda conv2d: non-contiguous inputs, empty batches, unbatched input, device errors") {
  const Tensor x = random_tensor({2, 3, 8, 9}, {kFloat32, kGpu}, 1, Layout::Transposed);
  const Tensor w = random_tensor({4, 3, 3, 3}, {kFloat32, kGpu}, 2, Layout::Strided);
  check_dtype_norm_close(ops::conv2d(x, w), ops::conv2d(x.cpu(), w.cpu()), rtol_for(kFloat32), "non-contiguous");
  CHECK(ops::conv2d(zeros({0, 3, 8, 8}, {kFloat32, kGpu}), w).sizes() == Shape{0, 4, 6, 6});
  check_dtype_norm_close(ops::conv2d(x[0], w), ops::conv2d(x[0].cpu(), w.cpu()), rtol_for(kFloat32), "unbatched");
  check_error([&] { ops::conv2d(x, w.cpu()); }, {"conv2d", "cuda", "cpu"});
  check_error([&] { ops::conv2d(x, w, zeros({4})); }, {"conv2d", "cuda", "cpu"});
  check_error([&] { ops::conv2d_backward_weight(zeros({2, 4, 6, 7}), x, w.sizes()); }, {"cuda", "cpu"});
}

TEST_CASE("cuda conv_transpose2d: forward and gradients match the CPU, channels-last and a DCGAN generator's shapes") {
  struct Case {
    Shape x, w;
    ConvTranspose2dOptions o;
    bool bias;
  };
  const Case cases[] = {
      {{2, 4, 5, 4}, {4, 3, 4, 4}, {.stride = 2, .padding = 1}, true},  // a decoder's 2x upsampling
      {{1, 3, 3, 4}, {3, 2, 3, 2}, {.stride = {2, 3}, .padding = {1, 0}, .output_padding = {1, 2}}, false},
      {{2, 4, 4, 3}, {4, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 2}, true},
      {{2, 6, 5, 5}, {6, 1, 3, 3}, {.padding = 1, .groups = 6}, true},                     // depthwise
      {{2, 2, 3, 3}, {2, 2, 3, 2}, {.output_padding = {1, 0}, .dilation = {2, 1}}, true},  // output_padding >= stride
      {{4, 64, 1, 1}, {64, 32, 4, 4}, {}, false},                           // DCGAN's first layer: 1x1 -> 4x4
      {{4, 32, 8, 8}, {32, 16, 4, 4}, {.stride = 2, .padding = 1}, false},  // and a later one: 8x8 -> 16x16
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const Tensor x = random_tensor(c.x, kFloat64, ++seed), w = random_tensor(c.w, kFloat64, ++seed, {}, -0.5, 0.5);
    const Tensor b = c.bias ? random_tensor({c.w[1] * c.o.groups}, kFloat64, ++seed) : Tensor();
    const Shape ys = ops::conv_transpose2d(x, w, b, c.o).sizes();
    const ConvTranspose2dOptions o = c.o;
    for (DType t : kFloatTypes)
      compare_devices([&](const std::vector<Tensor>& in) { return conv_transpose2d(in[0], in[1], in[2], o); },
                      {x, w, b}, ys, t, ++seed, "conv_transpose2d x" + shape_str(c.x) + " w" + shape_str(c.w));
    // Channels-last in, channels-last out (cuDNN's NHWC backward-data), the CPU's values.
    const Tensor xg = to_channels_last(x.to(kGpu, kFloat32));
    const Tensor yg = ops::conv_transpose2d(xg, w.to(kGpu, kFloat32), b.defined() ? b.to(kGpu, kFloat32) : b, o);
    if (c.x[2] * c.x[3] > 1) CHECK(is_channels_last(yg));  // a 1x1 image is both layouts
    check_dtype_norm_close(yg.cpu(),
                           ops::conv_transpose2d(x.to(kFloat32), w.to(kFloat32), b.defined() ? b.to(kFloat32) : b, o),
                           rtol_for(kFloat32), "channels-last");
  }
  check_error(
      [] {
        ops::conv_transpose2d(zeros({1, 2, 3, 3}, {kFloat32, kGpu}), zeros({2, 2, 3, 3}));
      },
      {"conv_transpose2d", "cuda", "cpu"});
}

TEST_CASE("cuda nn: Conv2d, BatchNorm2d and the pools run on the GPU like on the CPU") {
  manual_seed(3);
  nn::Conv2d conv(3, 8, 3, {.padding = 1, .bias = false});
  nn::BatchNorm2d bn(8);
  nn::MaxPool2d pool(3, {.stride = 2, .padding = 1});
  nn::AdaptiveAvgPool2d gap(1);
  const Tensor x = random_tensor({4, 3, 16, 16}, kFloat32, 1);
  const Tensor y_cpu = gap(pool(bn(conv(x))));
  const Tensor rm_cpu = bn.running_mean.clone();
  bn.reset_running_stats();
  conv.to(kGpu);
  bn.to(kGpu);
  const Tensor y_gpu = gap(pool(bn(conv(x.to(kGpu)))));
  check_dtype_norm_close(y_gpu.cpu(), y_cpu, 1e-4, "module stack");
  check_dtype_norm_close(bn.running_mean.cpu(), rm_cpu, 1e-4, "running_mean");
  CHECK(bn.num_batches_tracked.device() == kGpu);
  CHECK(bn.num_batches_tracked.cpu().item<int64_t>() == 1);
}
