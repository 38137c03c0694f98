// conv2d (cuDNN), the pools and batch_norm (frugal's kernels) on CUDA against the CPU ops on
// the same inputs: forward and every gradient through autograd, in float32, float16,
// bfloat16 and float64, on small odd configurations and on ResNet-50's shapes (the 7x7
// stride-2 stem, 3x3 64->64 on 56x56, the 1x1 stride-2 downsample, the stem max pool,
// global average pooling, batch norm over 8 x 56 x 56); float32 accuracy without TF32,
// cudnn benchmark mode, the modules on the GPU, and mismatched devices.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/batch_norm.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/pool.h"
#include "nn/batch_norm.h"
#include "nn/conv.h"
#include "nn/pooling.h"
#include "tensor/factory.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/pool.h"
#include "tests/norm_close.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};
const Device kGpu = cuda(0);

/// Max-norm agreement: max |a - e| <= rtol * max |e|. Both backends accumulate in float32
/// (float64 for float64) in different orders and round once, so they differ by about one
/// rounding of the stored type relative to the largest value; cuDNN's float32 algorithms
/// (Winograd, FFT) add a little more.
double rtol_for(DType t) {
  switch (t) {
    case DType::Float16: return 4e-3;
    case DType::BFloat16: return 3e-2;
    case DType::Float32: return 5e-5;
    default: return 1e-10;
  }
}

/// check_norm_close, and the dtypes must match too.
void check_dtype_norm_close(const Tensor& actual, const Tensor& expected, double rtol, const std::string& what) {
  CHECK_MESSAGE(actual.dtype() == expected.dtype(), what);
  check_norm_close(actual, expected, rtol, what);
}

/// Forward and backward of f on leaves made from `inputs` (on `device`, in dtype t) with
/// output gradient `gy` (float64 values, converted likewise): the output and every input's grad.
template <typename F>
std::vector<Tensor> forward_backward(F&& f, const std::vector<Tensor>& inputs, const Tensor& gy, DType t,
                                     Device device) {
  std::vector<Tensor> leaves;
  for (const Tensor& in : inputs) {
    if (!in.defined()) {
      leaves.emplace_back();
      continue;
    }
    Tensor l = in.detach().to(device, t).clone();  // a fresh leaf, never `in` itself
    l.requires_grad_();
    leaves.push_back(l);
  }
  Tensor y = f(leaves);
  std::vector<Tensor> out = {y.detach()};
  y.backward(gy.to(device, t));
  for (const Tensor& l : leaves) out.push_back(l.defined() ? l.grad() : Tensor());
  return out;
}

/// Runs f on CPU and GPU from the same float64 values in dtype t; compares the output and all grads.
template <typename F>
void compare_devices(F&& f, const std::vector<Tensor>& inputs, const Shape& out_shape, DType t, uint64_t seed,
                     const std::string& what, double rtol_scale = 1.0) {
  const Tensor gy = random_tensor(out_shape, kFloat64, seed);
  const std::vector<Tensor> gpu = forward_backward(f, inputs, gy, t, kGpu);
  const std::vector<Tensor> cpu = forward_backward(f, inputs, gy, t, kCPU);
  const char* names[] = {"output", "grad 0", "grad 1", "grad 2", "grad 3"};
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (!cpu[i].defined()) continue;
    REQUIRE_MESSAGE(gpu[i].defined(), what, " ", names[i]);
    CHECK(gpu[i].device() == kGpu);
    check_dtype_norm_close(gpu[i], cpu[i], rtol_for(t) * rtol_scale,
                           detail::str_cat(what, " ", dtype_name(t), " ", names[i]));
  }
}

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
      {{1, 2, 4, 5}, {3, 2, 4, 5}, {}, true},  // kernel == input
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

TEST_CASE("cuda pooling: forward and backward match the CPU, ResNet's pools included") {
  struct MaxCase {
    Shape x;
    Int2 k;
    MaxPool2dOptions o;
  };
  const MaxCase max_cases[] = {
      {{2, 3, 9, 7}, 3, {.stride = 2, .padding = 1}},
      {{2, 2, 9, 9}, {3, 2}, {.stride = {2, 1}, .padding = 1, .dilation = {2, 1}, .ceil_mode = true}},
      {{8, 64, 112, 112}, 3, {.stride = 2, .padding = 1}},  // ResNet's stem pool
  };
  uint64_t seed = 1;
  for (const MaxCase& c : max_cases) {
    const Tensor x = random_tensor(c.x, kFloat64, ++seed);
    const Shape ys = ops::max_pool2d(x, c.k, c.o).out.sizes();
    for (DType t : kFloatTypes) {
      compare_devices([&](const std::vector<Tensor>& in) { return max_pool2d(in[0], c.k, c.o); }, {x}, ys, t, ++seed,
                      "max_pool2d " + shape_str(c.x));
      const Tensor xt = x.to(t);
      CHECK(ops::max_pool2d(xt.to(kGpu), c.k, c.o).indices.cpu().tolist<int64_t>() ==
            ops::max_pool2d(xt, c.k, c.o).indices.tolist<int64_t>());
    }
  }
  struct AvgCase {
    Shape x;
    Int2 k;
    AvgPool2dOptions o;
  };
  const AvgCase avg_cases[] = {
      {{2, 3, 9, 7}, 3, {.stride = 2, .padding = 1}},
      {{2, 2, 7, 8}, {3, 2}, {.stride = {2, 3}, .padding = 1, .ceil_mode = true, .count_include_pad = false}},
      {{8, 256, 28, 28}, 2, {}},
  };
  for (const AvgCase& c : avg_cases) {
    const Tensor x = random_tensor(c.x, kFloat64, ++seed);
    const Shape ys = ops::avg_pool2d(x, c.k, c.o).sizes();
    for (DType t : kFloatTypes)
      compare_devices([&](const std::vector<Tensor>& in) { return avg_pool2d(in[0], c.k, c.o); }, {x}, ys, t, ++seed,
                      "avg_pool2d " + shape_str(c.x));
  }
  const std::pair<Shape, Int2> adaptive_cases[] = {
      {{8, 2048, 7, 7}, 1},      // global average pooling: a warp per output
      {{2, 3, 13, 11}, {4, 5}},  // thread per output, overlapping windows
      {{2, 3, 3, 4}, {5, 7}},    // growing
      {{2, 4, 64, 48}, {2, 3}},  // large windows, several outputs per plane
  };
  for (const auto& [xs, out] : adaptive_cases) {
    const Tensor x = random_tensor(xs, kFloat64, ++seed);
    const Shape ys = ops::adaptive_avg_pool2d(x, out).sizes();
    for (DType t : kFloatTypes)
      compare_devices([&](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], out); }, {x}, ys, t,
                      ++seed, "adaptive_avg_pool2d " + shape_str(xs));
  }
  const Tensor xg = random_tensor({2, 3, 8, 8}, {kFloat32, kGpu}, 1, Layout::Transposed);
  check_dtype_norm_close(ops::max_pool2d(xg, 2).out, ops::max_pool2d(xg.cpu(), 2).out, 0, "non-contiguous max");
  const ops::MaxPool2dResult r = ops::max_pool2d(xg, 2);
  check_error([&] { ops::max_pool2d_backward(r.out, r.indices.cpu(), xg.sizes(), 2); },
              {"max_pool2d_backward", "cuda", "cpu"});
}

TEST_CASE("cuda batch_norm: training and eval match the CPU, with running statistics and every gradient") {
  const Shape shapes[] = {{4, 3, 5, 6}, {16, 5}, {8, 64, 56, 56}, {32, 4, 64, 64}, {2, 2048, 7, 7}};
  uint64_t seed = 1;
  for (const Shape& xs : shapes)
    for (DType t : kFloatTypes)
      for (bool training : {true, false}) {
        CAPTURE(shape_str(xs));
        CAPTURE(dtype_name(t));
        CAPTURE(training);
        const int64_t C = xs[1];
        const DType st = t == kFloat64 ? kFloat64 : kFloat32;  // float32 parameters and statistics for 16-bit x
        const Tensor x = random_tensor(xs, kFloat64, ++seed, {}, -1.0, 3.0);
        const Tensor w = random_tensor({C}, st, ++seed), b = random_tensor({C}, st, ++seed);
        const Tensor rm = random_tensor({C}, st, ++seed), rv = random_tensor({C}, st, ++seed, {}, 0.5, 2.0);
        // Running statistics per device, updated by the forward.
        Tensor rm_cpu = rm.clone(), rv_cpu = rv.clone(), rm_gpu = rm.to(kGpu), rv_gpu = rv.to(kGpu);
        auto run = [&](Device d) {
          return forward_backward(
              [&](const std::vector<Tensor>& in) {
                const bool gpu = in[0].is_cuda();
                return batch_norm(in[0], gpu ? rm_gpu : rm_cpu, gpu ? rv_gpu : rv_cpu, in[1].to(st), in[2].to(st),
                                  training, 0.1, 1e-5);
              },
              {x, w, b}, random_tensor(xs, kFloat64, 999), t, d);
        };
        const std::vector<Tensor> gpu = run(kGpu), cpu = run(kCPU);
        const char* names[] = {"y", "grad_x", "grad_weight", "grad_bias"};
        // The parameters' leaves are in dtype t and converted to st inside f: their grads arrive in t.
        for (size_t i = 0; i < gpu.size(); ++i)
          check_dtype_norm_close(gpu[i], cpu[i], rtol_for(t) * 2, detail::str_cat("batch_norm ", names[i]));
        check_dtype_norm_close(rm_gpu, rm_cpu, rtol_for(st) * 2, "running_mean");
        check_dtype_norm_close(rv_gpu, rv_cpu, rtol_for(st) * 2, "running_var");
      }
  // Mixed precision: float16 x with float32 parameters held as leaves; their grads stay float32.
  Tensor xh = random_tensor({8, 16, 10, 10}, {kFloat16, kGpu}, 5);
  Tensor w = random_tensor({16}, {kFloat32, kGpu}, 6), b = random_tensor({16}, {kFloat32, kGpu}, 7);
  w.requires_grad_();
  b.requires_grad_();
  Tensor y = batch_norm(xh, Tensor(), Tensor(), w, b, true);
  y.backward(ones_like(y));
  CHECK(w.grad().dtype() == kFloat32);
  CHECK(w.grad().device() == kGpu);
  check_error([&] { ops::batch_norm(xh, Tensor(), Tensor(), w.detach().cpu(), Tensor(), true); },
              {"batch_norm", "cuda", "cpu"});
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
