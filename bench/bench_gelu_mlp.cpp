// bench_gelu_mlp: a transformer MLP block with the tanh GELU, fc2(gelu_tanh(fc1(x))), forward
// and forward+backward on the GPU: gelu_mlp with each choice of its GEMM epilogues (the GELU in
// the forward GEMM, its derivative in the backward's; Note [GELU epilogues] in
// tensor/cuda/matmul.cu) and the same block composed of linear, gelu_tanh and linear, at GPT-2
// small's and medium's shapes (8 x 1024 tokens), in float16 and bfloat16; median ms of
// CUDA-event-timed calls and the MiB allocated beyond the inputs at peak. tools/bench_gelu_mlp.py times PyTorch eager's
// composed block at the same shapes and prints the ratios (run it with --frugal <this binary>).
//   bench_gelu_mlp [--quick]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/ops/matmul.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/unary.h"
#include "bench/bench_util.h"
#include "bench/gpu_timer.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/unary.h"

using namespace frugal;
using namespace frugal::bench;

namespace {

const Device kGpu = cuda(0);

struct Block {
  const char* name;
  const char* key;
  int64_t tokens, width, hidden;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 2 || (argc == 2 && !quick)) {
    std::fprintf(stderr, "usage: bench_gelu_mlp [--quick]\n");
    return 2;
  }
  try {
    FRUGAL_CHECK(cuda_device_count() > 0, "bench_gelu_mlp: no GPU found");
    const int warmup = 3, reps = quick ? 5 : 20;
    const std::vector<Block> blocks = {{"GPT-2 small MLP", "gpt2", 8192, 768, 3072},
                                       {"GPT-2 medium MLP", "gpt2_medium", 8192, 1024, 4096}};
    // gelu_mlp with each choice of epilogues (ops::set_gelu_epilogues), and the block composed
    // of separate autograd ops.
    struct Variant {
      const char* name;
      const char* key;
      ops::GeluEpilogues epilogues;
      bool separate_ops;
    };
    const Variant variants[] = {{"gelu_mlp, both epilogues", "both", {true, true}, false},
                                {"gelu_mlp, forward epilogue", "forward", {true, false}, false},
                                {"gelu_mlp, backward epilogue", "backward", {false, true}, false},
                                {"gelu_mlp, no epilogue", "none", {false, false}, false},
                                {"linear, gelu_tanh, linear", "composed", {false, false}, true}};
    KeyFigures keys;
    for (DType dt : {kFloat16, kBFloat16}) {
      Table table(std::string("MLP block with the tanh GELU, ") + dtype_name(dt) +
                      " (median ms; MiB allocated beyond the inputs at peak, forward+backward)",
                  {"block", "variant", "fwd ms", "fwd+bwd ms", "MiB"});
      for (const Block& b : blocks) {
        const TensorOptions o(dt, kGpu);
        const Tensor x = randn({b.tokens, b.width}, o).requires_grad_();
        const Tensor w1 = (randn({b.hidden, b.width}, o) * 0.02).requires_grad_();
        const Tensor b1 = zeros({b.hidden}, o).requires_grad_(), b2 = zeros({b.width}, o).requires_grad_();
        const Tensor w2 = (randn({b.width, b.hidden}, o) * 0.02).requires_grad_();
        const Tensor g = randn({b.tokens, b.width}, o);
        for (const Variant& v : variants) {
          ops::set_gelu_epilogues(v.epilogues);
          auto forward = [&] {
            return v.separate_ops ? linear(gelu_tanh(linear(x, w1, b1)), w2, b2) : gelu_mlp(x, w1, b1, w2, b2);
          };
          auto forward_backward = [&] {
            for (const Tensor* t : {&x, &w1, &b1, &w2, &b2}) t->set_grad(Tensor());
            forward().backward(g);
          };
          const double f_ms = gpu_median_ms([&] { forward(); }, warmup, reps);
          const double fb_ms = gpu_median_ms(forward_backward, warmup, reps);
          const int64_t mem = peak_extra_bytes(kGpu, forward_backward);
          table.add({b.name, v.name, fmt("%.3f", f_ms), fmt("%.3f", fb_ms), fmt("%.0f", double(mem) / (1 << 20))});
          const std::string prefix = std::string("gelu_mlp_") + b.key + "_" + dtype_name(dt) + "_" + v.key;
          keys.add(prefix + "_fwd_ms", f_ms, "%.4f");
          keys.add(prefix + "_fwd_bwd_ms", fb_ms, "%.4f");
        }
      }
      table.print();
    }
    ops::set_gelu_epilogues({});
    // The block's raw pieces in each dtype: in bfloat16 its forward took twice float16's time
    // for the same GEMM FLOPs (H200, 2026-12-03); these say which piece. (A bfloat16 bias goes
    // into cuBLASLt's epilogue as float32: Note [Linear bias epilogue].)
    const Block& b = blocks[0];
    Table pieces("The pieces of " + std::string(b.name) + "'s forward (median ms)",
                 {"dtype", "linear + bias", "linear, no bias", "bias copy", "gelu_tanh", "linear_gelu_tanh"});
    for (DType dt : {kFloat16, kBFloat16}) {
      const TensorOptions o(dt, kGpu);
      const Tensor x = randn({b.tokens, b.width}, o), w1 = randn({b.hidden, b.width}, o) * 0.02;
      const Tensor b1 = randn({b.hidden}, o), pre = randn({b.tokens, b.hidden}, o);
      const double with_bias = gpu_median_ms([&] { ops::linear(x, w1, b1); }, warmup, reps);
      const double no_bias = gpu_median_ms([&] { ops::linear(x, w1); }, warmup, reps);
      // What linear's other bias path (copy, then the GEMM with beta = 1) adds to "no bias".
      const double copy = gpu_median_ms([&] { pre.copy_(b1.expand({b.tokens, b.hidden})); }, warmup, reps);
      const double gelu = gpu_median_ms([&] { ops::gelu_tanh(pre); }, warmup, reps);
      const double fused = gpu_median_ms([&] { ops::linear_gelu_tanh(x, w1, b1); }, warmup, reps);
      pieces.add({dtype_name(dt), fmt("%.3f", with_bias), fmt("%.3f", no_bias), fmt("%.3f", copy), fmt("%.3f", gelu),
                  fmt("%.3f", fused)});
      const std::string prefix = std::string("gelu_mlp_pieces_") + dtype_name(dt);
      keys.add(prefix + "_linear_bias_ms", with_bias, "%.4f");
      keys.add(prefix + "_linear_ms", no_bias, "%.4f");
      keys.add(prefix + "_bias_copy_ms", copy, "%.4f");
      keys.add(prefix + "_gelu_tanh_ms", gelu, "%.4f");
      keys.add(prefix + "_linear_gelu_tanh_ms", fused, "%.4f");
    }
    pieces.print();
    keys.print();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
