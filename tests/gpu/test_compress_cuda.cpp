// Compressed saved tensors on CUDA (Note [Compressed saved tensors] in autograd/compress.h):
// a ResNet-style basic block (conv, batch norm, relu, conv, batch norm, residual, relu)
// trained under float16 autocast, channels-last and not: the memory its forward leaves for
// backward, measured by the allocator, shrinks to about half (float16 -> 8-bit codes), and
// the gradients stay within the quantization error of the plain run's; and the compressed
// run on CUDA against the same run on the CPU in float32.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/compress.h"
#include "autograd/ops/all.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::CompressFormat;

namespace {

struct Block {
  std::vector<Tensor> params;  // conv1, bn1 weight, bn1 bias, conv2, bn2 weight, bn2 bias
  Tensor mean1, var1, mean2, var2;

  Block(int64_t c, Device device, bool channels_last) {
    auto p = [&](const Shape& s, uint64_t seed, double lo, double hi) {
      Tensor t = random_tensor(s, {kFloat32, device}, seed, Layout::Contiguous, lo, hi);
      if (channels_last && s.size() == 4) t = to_channels_last(t);
      t.requires_grad_();
      return t;
    };
    const double k = 1.0 / std::sqrt(double(9 * c));
    params = {p({c, c, 3, 3}, 1, -k, k), p({c}, 2, 0.5, 1.5), p({c}, 3, -0.1, 0.1),
              p({c, c, 3, 3}, 4, -k, k), p({c}, 5, 0.5, 1.5), p({c}, 6, -0.1, 0.1)};
    mean1 = zeros({c}, {kFloat32, device}), var1 = ones({c}, {kFloat32, device});
    mean2 = zeros({c}, {kFloat32, device}), var2 = ones({c}, {kFloat32, device});
  }

  Tensor forward(const Tensor& x) const {
    Tensor h = conv2d(x, params[0], Tensor(), {.padding = 1});
    h = relu(batch_norm(h, mean1, var1, params[1], params[2], true));
    h = conv2d(h, params[3], Tensor(), {.padding = 1});
    return relu(batch_norm(h, mean2, var2, params[4], params[5], true) + x);
  }
};

struct Run {
  int64_t held_bytes = 0;  // allocated after the forward, less before: what backward keeps
  std::vector<std::vector<double>> grads;
};

/// Four blocks in a row under float16 autocast (on CUDA), compressed when `format` is set.
Run run_blocks(const std::vector<Block>& blocks, const Tensor& x, Device device, const CompressFormat* format) {
  for (const Block& b : blocks)
    for (const Tensor& p : b.params) p.set_grad(Tensor());
  synchronize(device);
  const int64_t before = memory::stats(device).allocated_bytes.current;
  Tensor y;
  {
    AutocastGuard autocast(device, kFloat16, device.is_cuda());
    std::function<Tensor(const Tensor&)> all = [&](const Tensor& h) {
      Tensor t = h;
      for (const Block& b : blocks) t = b.forward(t);
      return t;
    };
    y = format ? autograd::compress(all, x, {.format = *format}) : all(x);
  }
  synchronize(device);
  Run r;
  r.held_bytes = memory::stats(device).allocated_bytes.current - before;
  const Tensor target = random_tensor(y.sizes(), {kFloat32, device}, 77);
  sum(y.to(kFloat32) * target).backward();
  for (const Block& b : blocks)
    for (const Tensor& p : b.params) r.grads.push_back(values_of(p.grad()));
  return r;
}

double relative_error(const Run& a, const Run& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.grads.size(); ++i)
    for (size_t j = 0; j < a.grads[i].size(); ++j) {
      const double d = a.grads[i][j] - b.grads[i][j];
      num += d * d;
      den += b.grads[i][j] * b.grads[i][j];
    }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("cuda compress: a ResNet block under float16 autocast keeps about half the bytes, near the plain gradients") {
  const int64_t C = 64;
  for (bool channels_last : {false, true}) {
    std::vector<Block> blocks;
    for (int i = 0; i < 4; ++i) blocks.emplace_back(C, kGpu, channels_last);
    Tensor x = random_tensor({32, C, 32, 32}, {kFloat32, kGpu}, 9);
    if (channels_last) x = to_channels_last(x);
    const Run plain = run_blocks(blocks, x, kGpu, nullptr);
    for (CompressFormat format : {CompressFormat::Fp8E4M3, CompressFormat::Int8}) {
      INFO(std::string(autograd::to_string(format)), channels_last ? " channels-last" : " contiguous");
      autograd::reset_compress_stats();
      const Run packed = run_blocks(blocks, x, kGpu, &format);
      const autograd::CompressStats s = autograd::compress_stats();
      MESSAGE(std::string(autograd::to_string(format)), channels_last ? " channels-last" : " contiguous", ": held ",
              packed.held_bytes, " bytes vs ", plain.held_bytes, " plain (",
              double(packed.held_bytes) / double(plain.held_bytes), "); compressed ", s.tensors, " tensors, ",
              s.bytes_in, " -> ", s.bytes_out, " bytes");
      CHECK(s.tensors > 0);
      CHECK(double(s.bytes_out) / double(s.bytes_in) < 0.55);  // float16 in, 8 bits and scales out, relu masks
      CHECK(double(packed.held_bytes) < 0.65 * double(plain.held_bytes));
      const double err = relative_error(packed, plain);
      MESSAGE("relative gradient error ", err);
      CHECK(err < (format == CompressFormat::Fp8E4M3 ? 0.0625 : 0.03));
    }
  }
}

TEST_CASE("cuda compress: the compressed float32 run on CUDA matches the same run on the CPU") {
  const int64_t C = 16;
  for (CompressFormat format : {CompressFormat::Fp8E4M3, CompressFormat::Int8}) {
    std::vector<Block> bc, bg;
    for (int i = 0; i < 2; ++i) bc.emplace_back(C, kCPU, false), bg.emplace_back(C, kGpu, false);
    const Tensor xc = random_tensor({4, C, 12, 12}, kFloat32, 3);
    // Without autocast on either side: the CPU run is float32 too (autocast is on only for CUDA).
    auto run = [&](const std::vector<Block>& blocks, const Tensor& x) {
      for (const Block& b : blocks)
        for (const Tensor& p : b.params) p.set_grad(Tensor());
      std::function<Tensor(const Tensor&)> all = [&](const Tensor& h) {
        Tensor t = h;
        for (const Block& b : blocks) t = b.forward(t);
        return t;
      };
      Tensor y = autograd::compress(all, x, {.format = format, .min_bytes = 0});
      sum(y * random_tensor(y.sizes(), {kFloat32, x.device()}, 5)).backward();
      std::vector<Tensor> g;
      for (const Block& b : blocks)
        for (const Tensor& p : b.params) g.push_back(p.grad());
      return g;
    };
    const std::vector<Tensor> gc = run(bc, xc), gg = run(bg, xc.to(kGpu));
    // The codes are the same on both devices only where the values quantized are: the conv
    // sums differ in the last bits, so a code may move by one step; compare in norm.
    for (size_t i = 0; i < gc.size(); ++i)
      check_dtype_norm_close(gg[i].cpu(), gc[i], 0.02,
                             std::string(autograd::to_string(format)) + " grad " + std::to_string(i));
  }
}
