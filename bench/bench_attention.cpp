// bench_attention: the fused flash attention kernels (tensor/ops/flash_attention.h) at the
// shapes of BERT-base (B=64, H=12, T=128, E=64), ViT-B/16 (B=128, H=12, T=197, E=64) and long
// sequences (T=2048), forward and forward+backward, in TFLOP/s, next to the composed path
// (q k^T, masked softmax, times v: the (B, H, T, T) weights in memory) and the memory each
// takes. --backend picks the kernels (ops::set_attention_backend: auto, cudnn or flash; Note
// [cuDNN attention]); the "backend" column says which ran each row. tools/bench_attention.py
// times torch's scaled_dot_product_attention at the same shapes, runs this with both backends
// and prints the ratios (run it with --frugal <this binary>).
//   bench_attention [--quick] [--backend auto|cudnn|flash]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gpu_timer.h"
#include "core/device.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/ops/flash_attention.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/matmul.h"

using namespace frugal;
using namespace frugal::bench;

namespace {

const Device kGpu = cuda(0);

struct Shape4 {
  const char* name;
  const char* key;
  int64_t B, H, T, E;
  bool causal;
  double dropout;
  bool padding = false;  // a bool (B, 1, 1, S) key padding mask, the last quarter of odd batches masked
};

std::string mib(int64_t bytes) { return fmt("%.0f", double(bytes) / (1 << 20)); }

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  ops::AttentionBackend backend = ops::AttentionBackend::Auto;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i], next = i + 1 < argc ? argv[i + 1] : "";
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--backend" && (next == "auto" || next == "cudnn" || next == "flash")) {
      backend = next == "auto"    ? ops::AttentionBackend::Auto
                : next == "cudnn" ? ops::AttentionBackend::Cudnn
                                  : ops::AttentionBackend::Flash;
      ++i;
    } else {
      std::fprintf(stderr, "usage: bench_attention [--quick] [--backend auto|cudnn|flash]\n");
      return 2;
    }
  }
  ops::set_attention_backend(backend);
  try {
    FRUGAL_CHECK(cuda_device_count() > 0, "bench_attention: no GPU found");
    const int warmup = 3, reps = quick ? 5 : 20;
    // FLOPs as FlashAttention's benchmarks count them: 4 B H L S E forward (two products),
    // 2.5 times that backward (five, the score recompute included); half of it when causal.
    const std::vector<Shape4> shapes = {
        {"BERT-base", "bert", 64, 12, 128, 64, false, 0.0},
        {"BERT-base, dropout 0.1", "bert_dropout", 64, 12, 128, 64, false, 0.1},
        {"BERT-base, padding mask", "bert_padding", 64, 12, 128, 64, false, 0.0, true},
        {"ViT-B/16", "vit", 128, 12, 197, 64, false, 0.0},
        {"T=2048", "t2048", 4, 16, 2048, 64, false, 0.0},
        {"T=2048 causal", "t2048_causal", 4, 16, 2048, 64, true, 0.0},
        {"T=2048 E=128", "t2048_e128", 2, 16, 2048, 128, false, 0.0},
        {"T=4096 E=128", "t4096_e128", 2, 16, 4096, 128, false, 0.0},
    };
    KeyFigures keys;
    for (DType dt : {kFloat16, kBFloat16}) {
      Table table(
          std::string("Flash attention, ") + dtype_name(dt) + ", backend " + ops::attention_backend_name(backend) +
              " (median ms, TFLOP/s; MiB allocated beyond the inputs at peak)",
          {"shape", "backend", "fwd ms", "fwd TF/s", "fwd+bwd ms", "fwd+bwd TF/s", "MiB", "composed fwd ms", "MiB "});
      for (const Shape4& s : shapes) {
        const Tensor q = randn({s.B, s.H, s.T, s.E}, {dt, kGpu}), k = randn({s.B, s.H, s.T, s.E}, {dt, kGpu});
        const Tensor v = randn({s.B, s.H, s.T, s.E}, {dt, kGpu}), g = randn({s.B, s.H, s.T, s.E}, {dt, kGpu});
        Tensor mask;
        if (s.padding) {
          std::vector<float> keep(size_t(s.B * s.T), 1.0f);
          for (int64_t b = 1; b < s.B; b += 2)
            for (int64_t t = s.T * 3 / 4; t < s.T; ++t) keep[size_t(b * s.T + t)] = 0.0f;
          mask = from_vector<float>(keep, {s.B, 1, 1, s.T}).to(kBool);
          mask = mask.to(kGpu);
        }
        const ops::FlashAttentionOptions o{mask, s.causal, {}, s.dropout};
        const double flops = 4.0 * double(s.B * s.H) * double(s.T) * double(s.T) * double(s.E) * (s.causal ? 0.5 : 1.0);
        auto fwd = [&] { return ops::flash_attention_forward(q, k, v, o); };
        auto fwd_bwd = [&] {
          const ops::FlashAttentionForward f = fwd();
          ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
        };
        auto composed = [&] {  // the (B, H, T, T) weights, as the unfused path (dropout left out)
          const Tensor w =
              ops::masked_softmax(ops::matmul(q, k.transpose(-2, -1)), mask, s.causal, 1.0 / std::sqrt(double(s.E)));
          return ops::matmul(w, v);
        };
        const double fwd_ms = gpu_median_ms([&] { fwd(); }, warmup, reps);
        const double fb_ms = gpu_median_ms(fwd_bwd, warmup, reps);
        const double comp_ms = gpu_median_ms([&] { composed(); }, warmup, reps);
        const int64_t fb_mem = peak_extra_bytes(kGpu, fwd_bwd), comp_mem = peak_extra_bytes(kGpu, [&] { composed(); });
        const double fwd_tf = flops / (fwd_ms * 1e-3) * 1e-12, fb_tf = 3.5 * flops / (fb_ms * 1e-3) * 1e-12;
        const char* used = ops::attention_backend_name(ops::attention_backend_for(q, k, v, o));
        table.add({s.name, used, fmt("%.3f", fwd_ms), fmt("%.0f", fwd_tf), fmt("%.3f", fb_ms), fmt("%.0f", fb_tf),
                   mib(fb_mem), fmt("%.3f", comp_ms), mib(comp_mem)});
        const std::string prefix = std::string("flash_") + s.key + "_" + dtype_name(dt);
        keys.add(prefix + "_fwd_ms", fwd_ms, "%.4f");
        keys.add(prefix + "_fwd_bwd_ms", fb_ms, "%.4f");
        keys.add(prefix + "_fwd_tflops", fwd_tf, "%.1f");
        keys.add(prefix + "_fwd_bwd_tflops", fb_tf, "%.1f");
      }
      table.print();
    }
    keys.print();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
