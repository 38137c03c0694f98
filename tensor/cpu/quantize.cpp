// CPU blockwise quantization (Note [Blockwise quantization]) with the software e4m3 encoder
// of tensor/ops/quantize_math.h, and the 1-bit masks of Note [ReLU masks].
#include <algorithm>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/quantize_math.h"

namespace frugal::ops::cpu {

using quant::LogicalIndexer;

namespace {

/// Element i of x (logical order) in float.
template <typename T>
struct Reader {
  const T* base;
  LogicalIndexer ix;
  bool dense;
  float operator()(int64_t i) const { return float(base[dense ? i : ix.offset(i)]); }
};

template <typename T>
Reader<T> reader(const Tensor& t, const char* op) {
  const LogicalIndexer ix = quant::make_logical_indexer(t, op);
  return {t.data_ptr<T>(), ix, ix.dense()};
}

/// Dispatch over the quantizable dtypes (float32, float16, bfloat16).
template <typename F>
void dispatch_quantizable(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32: return f.template operator()<float>();
    case DType::Float16: return f.template operator()<Half>();
    case DType::BFloat16: return f.template operator()<BFloat16>();
    default: throw_unsupported_dtype(op, t, kCPU);
  }
}

}  // namespace

void quantize_blockwise_kernel(const Tensor& codes, const Tensor& scales, const Tensor& x, QuantFormat format,
                               int64_t block) {
  dispatch_quantizable(x.dtype(), "quantize_blockwise", [&]<typename T>() {
    const Reader<T> read = reader<T>(x, "quantize_blockwise");
    uint8_t* cp = codes.data_ptr<uint8_t>();
    float* sp = scales.data_ptr<float>();
    const int64_t n = x.numel(), nblocks = scales.numel();
    const float qmax = quant::qmax(format);
    const uint8_t nan = quant::nan_code(format);
    const bool fp8 = format == QuantFormat::Fp8E4M3;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t lo = b * block, hi = std::min(n, lo + block);
      float absmax = 0.0f;
      for (int64_t i = lo; i < hi; ++i) {
        const float v = read(i);
        if (std::isfinite(v)) absmax = std::max(absmax, std::fabs(v));
      }
      const float scale = absmax / qmax;
      sp[b] = scale;
      const float inverse = quant::inverse_scale(scale);
      for (int64_t i = lo; i < hi; ++i) {
        const float v = read(i);
        if (!std::isfinite(v)) {
          cp[i] = nan;
          continue;
        }
        const float s = quant::scaled(v, scale, inverse);
        cp[i] = fp8 ? quant::e4m3_encode(s) : quant::int8_encode(s);
      }
    }
  });
}

void dequantize_blockwise_kernel(const Tensor& out, const Tensor& codes, const Tensor& scales, QuantFormat format,
                                 int64_t block) {
  dispatch_quantizable(out.dtype(), "dequantize_blockwise", [&]<typename T>() {
    T* op = out.data_ptr<T>();
    const uint8_t* cp = codes.data_ptr<uint8_t>();
    const float* sp = scales.data_ptr<float>();
    const int64_t n = out.numel();
    const bool fp8 = format == QuantFormat::Fp8E4M3;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      const float v = fp8 ? quant::e4m3_decode(cp[i]) : quant::int8_decode(cp[i]);
      op[i] = T(quant::keep_finite(v * sp[i / block]));
    }
  });
}

void relu_mask_kernel(const Tensor& mask, const Tensor& y) {
  dispatch_floating(y.dtype(), "relu_mask", y.device(), [&]<typename T>() {
    const LogicalIndexer ix = quant::make_logical_indexer(y, "relu_mask");
    const bool dense = ix.dense();
    const T* yp = y.data_ptr<T>();
    uint8_t* mp = mask.data_ptr<uint8_t>();
    const int64_t n = y.numel(), nbytes = mask.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t k = 0; k < nbytes; ++k) {
      uint8_t bits = 0;
      const int64_t end = std::min<int64_t>(8, n - 8 * k);
      for (int64_t j = 0; j < end; ++j) {
        const int64_t i = 8 * k + j;
        if (!(opmath_t<T>(yp[dense ? i : ix.offset(i)]) <= opmath_t<T>(0))) bits |= uint8_t(1u << j);
      }
      mp[k] = bits;
    }
  });
}

void apply_relu_mask_kernel(const Tensor& out, const Tensor& g, const Tensor& mask) {
  dispatch_floating(g.dtype(), "apply_relu_mask", g.device(), [&]<typename T>() {
    const LogicalIndexer ix = quant::make_logical_indexer(g, "apply_relu_mask");
    const bool dense = ix.dense();
    const T* gp = g.data_ptr<T>();
    const uint8_t* mp = mask.data_ptr<uint8_t>();
    T* op = out.data_ptr<T>();
    const int64_t n = g.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) op[i] = (mp[i >> 3] >> (i & 7)) & 1u ? gp[dense ? i : ix.offset(i)] : T(0);
  });
}

}  // namespace frugal::ops::cpu
