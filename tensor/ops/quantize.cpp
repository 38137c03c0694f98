#include "tensor/ops/quantize.h"

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"

namespace frugal::ops {

namespace {

bool is_quantizable(DType t) { return t == kFloat32 || t == kFloat16 || t == kBFloat16; }

void check_format(const char* op, QuantFormat format) {
  FRUGAL_CHECK(format == QuantFormat::Fp8E4M3 || format == QuantFormat::Int8, op, ": unknown format ", int(format));
}

int64_t blocks_of(int64_t n, int64_t block) { return n == 0 ? 0 : (n - 1) / block + 1; }

}  // namespace

const char* to_string(QuantFormat format) { return format == QuantFormat::Fp8E4M3 ? "fp8_e4m3" : "int8"; }

Quantized quantize_blockwise(const Tensor& x, QuantFormat format, int64_t block) {
  constexpr const char* op = "quantize_blockwise";
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  check_format(op, format);
  FRUGAL_CHECK(is_quantizable(x.dtype()), op, ": expects a float32, float16 or bfloat16 input, got ", x.describe());
  FRUGAL_CHECK(block >= 1, op, ": block must be at least 1 element, got ", block, " (input ", x.describe(), ")");
  const int64_t n = x.numel();
  Quantized q{empty({n}, {kUInt8, x.device()}), empty({blocks_of(n, block)}, {kFloat32, x.device()})};
  if (n > 0) FRUGAL_DEVICE_DISPATCH(op, x.device(), quantize_blockwise_kernel, q.codes, q.scales, x, format, block);
  return q;
}

Tensor dequantize_blockwise(const Tensor& codes, const Tensor& scales, QuantFormat format, int64_t block, DType dtype,
                            const Shape& sizes) {
  constexpr const char* op = "dequantize_blockwise";
  FRUGAL_CHECK(codes.defined() && scales.defined(), op, ": undefined codes or scales");
  check_format(op, format);
  FRUGAL_CHECK(is_quantizable(dtype), op, ": the output dtype must be float32, float16 or bfloat16, got ",
               dtype_name(dtype));
  FRUGAL_CHECK(block >= 1, op, ": block must be at least 1 element, got ", block);
  const int64_t n = numel_of(sizes, op);
  FRUGAL_CHECK(codes.dtype() == kUInt8 && codes.dim() == 1 && codes.numel() == n && codes.is_contiguous(), op,
               ": expects contiguous uint8 codes of ", n, " elements (the numel of ", shape_str(sizes), "), got ",
               codes.describe());
  FRUGAL_CHECK(scales.dtype() == kFloat32 && scales.dim() == 1 && scales.numel() == blocks_of(n, block) &&
                   scales.is_contiguous(),
               op, ": expects contiguous float32 scales, one per block of ", block, " elements (", blocks_of(n, block),
               "), got ", scales.describe());
  check_same_device(op, codes, scales);
  Tensor out = empty(sizes, {dtype, codes.device()});
  if (n > 0) FRUGAL_DEVICE_DISPATCH(op, codes.device(), dequantize_blockwise_kernel, out, codes, scales, format, block);
  return out;
}

Tensor relu_mask(const Tensor& y) {
  constexpr const char* op = "relu_mask";
  FRUGAL_CHECK(y.defined(), op, ": undefined input");
  FRUGAL_CHECK(is_floating(y.dtype()), op, ": expects a floating-point input, got ", y.describe());
  Tensor mask = empty({blocks_of(y.numel(), 8)}, {kUInt8, y.device()});
  if (y.numel() > 0) FRUGAL_DEVICE_DISPATCH(op, y.device(), relu_mask_kernel, mask, y);
  return mask;
}

Tensor apply_relu_mask(const Tensor& g, const Tensor& mask) {
  constexpr const char* op = "apply_relu_mask";
  FRUGAL_CHECK(g.defined() && mask.defined(), op, ": undefined input");
  FRUGAL_CHECK(is_floating(g.dtype()), op, ": expects a floating-point gradient, got ", g.describe());
  FRUGAL_CHECK(
      mask.dtype() == kUInt8 && mask.dim() == 1 && mask.numel() == blocks_of(g.numel(), 8) && mask.is_contiguous(), op,
      ": expects a contiguous uint8 mask of ", blocks_of(g.numel(), 8), " bytes for ", g.describe(), ", got ",
      mask.describe());
  check_same_device(op, g, mask);
  Tensor out = empty(g.sizes(), g.options());
  if (g.numel() > 0) FRUGAL_DEVICE_DISPATCH(op, g.device(), apply_relu_mask_kernel, out, g, mask);
  return out;
}

}  // namespace frugal::ops
