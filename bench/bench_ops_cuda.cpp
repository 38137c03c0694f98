// bench_ops, CUDA half: elementwise bandwidth vs cudaMemcpy, matmul vs raw
// cublasGemmEx, the caching allocator vs cudaMalloc. GPU time comes from
// cudaEvents on the current stream, the median of repeated runs after warm-up.
#include "bench/bench_ops.h"
#include "core/error.h"

#ifdef FRUGAL_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <string>
#include <tuple>

#include "bench/gpu_timer.h"
#include "core/cuda_check.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "tensor/cuda/cublas_handle.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/cumsum.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/norm.h"
#include "tensor/ops/quantize.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"

namespace frugal::bench {

namespace {

const Device kGpu = cuda(0);

cudaStream_t stream() { return cuda_stream(kGpu); }

/// GB/s (bytes read + written) of a device-to-device cudaMemcpy of `bytes`, median of `reps`:
/// the yardstick the memory-bound kernels are measured against (Note [Elementwise bandwidth]).
double memcpy_gbs(GpuTimer& timer, size_t bytes, int reps) {
  const Tensor src = empty({int64_t(bytes / 4)}, {kFloat32, kGpu}), dst = empty_like(src);
  const double ms = timer.median_ms(
      [&] { FRUGAL_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream())); }, 3,
      reps);
  return 2.0 * double(bytes) / (ms * 1e-3) * 1e-9;
}

// Note [Elementwise bandwidth]
// An elementwise op on a large tensor is bound by memory traffic, so its figure is
// bytes read + written per second, next to a device-to-device cudaMemcpy of the same
// size (read + write as well) in the same run: the fraction is how close the kernel
// comes to the best the memory system gives. 256 MiB per tensor is far beyond L2.
void elementwise(const Options& o, KeyFigures& keys, GpuTimer& timer) {
  constexpr size_t kBytes = size_t(256) << 20;
  const int reps = o.quick ? 10 : 30;
  const double copy_gbs = memcpy_gbs(timer, kBytes, reps);
  Table table("CUDA elementwise on 256 MiB tensors (GB/s of bytes read + written, median)",
              {"op", "dtype", "GB/s", "of memcpy"});
  table.add({"cudaMemcpy device-to-device", "-", fmt("%.0f", copy_gbs), "1.000"});
  double worst_f32 = 1e9;
  for (DType t : {kFloat32, kFloat16}) {
    const int64_t n = int64_t(kBytes / element_size(t));
    const Tensor a = randn({n}, {t, kGpu}), b = randn({n}, {t, kGpu});
    // The saved-tensor codecs of autograd::compress (Note [Vectorized quantization]): codes are
    // a byte per element, masks a bit.
    const double es = double(element_size(t));
    const ops::Quantized q = ops::quantize_blockwise(a, ops::QuantFormat::Fp8E4M3, 256);
    const Tensor mask = ops::relu_mask(a);
    const Tensor rows = a.view({n / 4096, 4096}), columns = a.view({4096, n / 4096});
    struct Case {
      const char* name;
      double tensors;    // tensors of kBytes read or written
      bool elementwise;  // counted in gpu_elementwise_frac_of_copy
      std::function<void()> run;
    };
    const Case cases[] = {
        {"ops::add", 3, true, [&] { Tensor c = ops::add(a, b); }},
        {"ops::mul", 3, true, [&] { Tensor c = ops::mul(a, b); }},
        {"ops::relu", 2, true, [&] { Tensor c = ops::relu(a); }},
        {"copy (clone)", 2, false, [&] { Tensor c = a.clone(); }},
        {"quantize_blockwise fp8", 1 + 1 / es, false,
         [&] { ops::Quantized c = ops::quantize_blockwise(a, ops::QuantFormat::Fp8E4M3, 256); }},
        {"dequantize_blockwise fp8", 1 + 1 / es, false,
         [&] {
           Tensor c = ops::dequantize_blockwise(q.codes, q.scales, ops::QuantFormat::Fp8E4M3, 256, t, a.sizes());
         }},
        {"relu_mask", 1 + 1 / (8 * es), false, [&] { Tensor c = ops::relu_mask(a); }},
        {"apply_relu_mask", 2 + 1 / (8 * es), false, [&] { Tensor c = ops::apply_relu_mask(b, mask); }},
        // Prefix sums (Note [Cumulative sum order]): rows of 4096 through the shared-memory tile,
        // columns down 4096 lines, and one line of n, chunk by chunk.
        {"cumsum, last dim of (n/4096, 4096)", 2, false, [&] { Tensor c = ops::cumsum(rows, 1); }},
        {"cumsum, dim 0 of (4096, n/4096)", 2, false, [&] { Tensor c = ops::cumsum(columns, 0); }},
        {"cumsum, one line of n", 2, false, [&] { Tensor c = ops::cumsum(a, 0); }},
    };
    for (const Case& c : cases) {
      const double ms = timer.median_ms(c.run, 3, reps);
      const double gbs = c.tensors * double(kBytes) / (ms * 1e-3) * 1e-9;
      table.add({c.name, dtype_name(t), fmt("%.0f", gbs), fmt("%.3f", gbs / copy_gbs)});
      if (t == kFloat32 && c.elementwise) worst_f32 = std::min(worst_f32, gbs / copy_gbs);
    }
  }
  table.print();
  keys.add("gpu_memcpy_gbs", copy_gbs, "%.0f");
  keys.add("gpu_elementwise_frac_of_copy", worst_f32);
}

// Note [Matmul against raw cuBLAS]
// The peer is one cublasGemmEx call with the same types, compute type and stream,
// on a handle of its own; frugal's figure includes its dispatch and the allocation
// of the output. float32 runs without TF32 on both sides (CUBLAS_COMPUTE_32F).
void matmul(const Options& o, KeyFigures& keys, GpuTimer& timer) {
  cublasHandle_t raw = nullptr;
  FRUGAL_CUBLAS_CHECK(cublasCreate(&raw));
  FRUGAL_CUBLAS_CHECK(cublasSetStream(raw, stream()));
  Table table("CUDA matmul, square n x n x n (TFLOP/s, median; float32 without TF32)",
              {"dtype", "n", "frugal TFLOP/s", "cuBLAS TFLOP/s", "frugal/cuBLAS"});
  const std::vector<int64_t> sizes = o.quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 8192};
  struct Type {
    DType dtype;
    cudaDataType_t blas;
    const char* key;
  };
  for (const Type& ty : {Type{kFloat16, CUDA_R_16F, "gpu_matmul_f16_vs_cublas"},
                         Type{kBFloat16, CUDA_R_16BF, "gpu_matmul_bf16_vs_cublas"},
                         Type{kFloat32, CUDA_R_32F, "gpu_matmul_f32_vs_cublas"}}) {
    double ratio = 0;
    for (int64_t n : sizes) {
      const int reps = o.quick ? 5 : (n <= 4096 ? 20 : 10);
      const Tensor a = randn({n, n}, {ty.dtype, kGpu}), b = randn({n, n}, {ty.dtype, kGpu});
      const Tensor c = empty({n, n}, {ty.dtype, kGpu});
      const float alpha = 1, beta = 0;
      const int ni = int(n);
      const double f_ms = timer.median_ms([&] { Tensor r = ops::matmul(a, b); }, 3, reps);
      const double c_ms = timer.median_ms(
          [&] {  // row-major c = a @ b is column-major c^T = b^T a^T
            FRUGAL_CUBLAS_CHECK(cublasGemmEx(raw, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, b.data(), ty.blas, ni,
                                             a.data(), ty.blas, ni, &beta, c.data(), ty.blas, ni, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT));
          },
          3, reps);
      const double tflop = 2.0 * double(n) * double(n) * double(n) * 1e-12;
      const double tf = tflop / (f_ms * 1e-3), tc = tflop / (c_ms * 1e-3);
      ratio = tf / tc;  // the key figure is the largest size run
      table.add({dtype_name(ty.dtype), std::to_string(n), fmt("%.1f", tf), fmt("%.1f", tc), fmt("%.3f", ratio)});
    }
    keys.add(ty.key, ratio);
  }
  table.print();
  cublasDestroy(raw);
}

void allocation(const Options& o, KeyFigures& keys) {
  constexpr size_t kMiB = size_t(1) << 20;
  const int blocks = o.quick ? 20 : 100;
  const double arena_ns = ns_per_call([&] { DataPtr p = memory::allocate(kGpu, kMiB); }, blocks, 1000);
  const double cuda_ns = 1e9 * time_median(
                                   [&] {
                                     void* p = nullptr;
                                     FRUGAL_CUDA_CHECK(cudaMalloc(&p, kMiB));
                                     FRUGAL_CUDA_CHECK(cudaFree(p));
                                   },
                                   5, o.quick ? 50 : 200);
  const Tensor x = ones({1}, {kFloat32, kGpu}), y = ones({1}, {kFloat32, kGpu});
  const double add_ns = ns_per_call([&] { Tensor z = ops::add(x, y); }, blocks, 1000);
  synchronize(kGpu);
  Table table("CUDA fixed costs (host ns per call, median)", {"call", "ns/call"});
  table.add({"memory::allocate + free, 1 MiB (cache hit)", fmt("%.0f", arena_ns)});
  table.add({"cudaMalloc + cudaFree, 1 MiB", fmt("%.0f", cuda_ns)});
  table.add({"ops::add of two 1-element float32 tensors (queued)", fmt("%.0f", add_ns)});
  table.print();
  keys.add("alloc_free_ns", arena_ns, "%.0f");
  keys.add("cudamalloc_free_ns", cuda_ns, "%.0f");
  keys.add("gpu_tiny_op_overhead_ns", add_ns, "%.0f");
}

// ViT-B/16's row ops at batch 128 (25216 rows of 768): layer norm forward and backward
// (Note [CUDA layer norm kernels]) as GB/s of their compulsory traffic next to cudaMemcpy,
// and the patch embedding (Note [Patchify convolution]) forward and both backward products.
void vit_row_ops(const Options& o, KeyFigures& keys, GpuTimer& timer) {
  const int reps = o.quick ? 10 : 30;
  constexpr int64_t M = 128 * 197, N = 768;
  const Tensor x = randn({M, N}, {kFloat32, kGpu}), g = randn({M, N}, {kFloat32, kGpu});
  const Tensor w = randn({N}, {kFloat32, kGpu}), b = randn({N}, {kFloat32, kGpu});
  const ops::LayerNormResult f = ops::layer_norm(x, {N}, w, b);
  const double bytes = double(M * N * 4);
  const double copy_gbs = memcpy_gbs(timer, size_t(bytes), reps);
  Table table("ViT-B/16 b128 row ops, float32 (ms and GB/s of compulsory traffic, median)",
              {"op", "ms", "GB/s", "of memcpy"});
  const double fwd_ms = timer.median_ms([&] { ops::LayerNormResult r = ops::layer_norm(x, {N}, w, b); }, 3, reps);
  const double bwd_ms = timer.median_ms(
      [&] { ops::LayerNormGrads r = ops::layer_norm_backward(g, x, {N}, f.mean, f.rstd, w, true); }, 3, reps);
  for (auto [name, ms, tensors] : {std::tuple{"layer_norm forward (x -> y)", fwd_ms, 2.0},
                                   std::tuple{"layer_norm backward (g, x -> dx, dw, db)", bwd_ms, 3.0}}) {
    const double gbs = tensors * bytes / (ms * 1e-3) * 1e-9;
    table.add({name, fmt("%.4f", ms), fmt("%.0f", gbs), fmt("%.3f", gbs / copy_gbs)});
  }
  // A linear's bias gradient: the column sums of its (rows, out) float16 output gradient.
  for (int64_t cols : {int64_t(768), int64_t(3072)}) {
    const Tensor go = randn({M, cols}, {kFloat16, kGpu});
    const double ms = timer.median_ms([&] { Tensor db = ops::sum(go, {0}); }, 3, reps);
    const double gbs = double(M * cols * 2) / (ms * 1e-3) * 1e-9;
    table.add({fmt("bias gradient: sum over rows of (%lld, %lld) float16", (long long)M, (long long)cols),
               fmt("%.4f", ms), fmt("%.0f", gbs), fmt("%.3f", gbs / copy_gbs)});
  }
  const Tensor img = randn({128, 3, 224, 224}, {kFloat16, kGpu}), pw = randn({768, 3, 16, 16}, {kFloat16, kGpu});
  const Conv2dOptions patch{.stride = 16};
  const Tensor py = ops::conv2d(img, pw, Tensor(), patch);
  const Tensor pg = randn(py.sizes(), {kFloat16, kGpu});
  const double conv_ms = timer.median_ms([&] { Tensor y = ops::conv2d(img, pw, Tensor(), patch); }, 3, reps);
  const double dx_ms =
      timer.median_ms([&] { Tensor d = ops::conv2d_backward_input(pg, img.sizes(), pw, patch); }, 3, reps);
  const double dw_ms =
      timer.median_ms([&] { Tensor d = ops::conv2d_backward_weight(pg, img, pw.sizes(), patch); }, 3, reps);
  table.add({"patch embedding conv 16x16/16, float16 forward", fmt("%.4f", conv_ms), "-", "-"});
  table.add({"  backward input", fmt("%.4f", dx_ms), "-", "-"});
  table.add({"  backward weight", fmt("%.4f", dw_ms), "-", "-"});
  table.print();
  keys.add("vit_layer_norm_backward_frac_of_copy", 3 * bytes / (bwd_ms * 1e-3) * 1e-9 / copy_gbs);
  keys.add("vit_patch_embedding_fwd_bwd_ms", conv_ms + dx_ms + dw_ms, "%.4f");
}

}  // namespace

void require_cuda() { FRUGAL_CHECK(cuda_device_count() > 0, "bench_ops: --device cuda, but no GPU was found"); }

void run_cuda_benchmarks(const Options& o, KeyFigures& keys) {
  cudaDeviceProp prop{};
  FRUGAL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("\nGPU: %s (%d SMs, %.0f GiB)\n", prop.name, prop.multiProcessorCount,
              double(prop.totalGlobalMem) / double(size_t(1) << 30));
  ops::set_allow_tf32(false);
  GpuTimer timer;
  elementwise(o, keys, timer);
  matmul(o, keys, timer);
  vit_row_ops(o, keys, timer);
  allocation(o, keys);
}

}  // namespace frugal::bench

#else  // a build without CUDA

namespace frugal::bench {
void require_cuda() {
  FRUGAL_FAIL("bench_ops: --device cuda, but frugal was built without CUDA (meson setup -Dcuda=enabled)");
}
void run_cuda_benchmarks(const Options&, KeyFigures&) { require_cuda(); }
}  // namespace frugal::bench

#endif
