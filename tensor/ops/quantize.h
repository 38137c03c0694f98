#pragma once
// Blockwise quantization to 8-bit codes with one float32 scale per block, and 1-bit
// masks: the storage formats of compressed saved tensors (autograd/compress.h).
//
// Note [Blockwise quantization]
// x is read in its logical row-major order (any strides) and cut into blocks of `block`
// consecutive elements (the last may be shorter). Each block b gets one float32 scale,
// computed in float32 as
//   scale_b = absmax_b / qmax,   absmax_b = max |x_i| over the block's finite elements,
// with qmax = 448 (the largest finite e4m3) or 127 (int8), and element i's code is
// encode(q_i), q_i = x_i * inv_b in float32 with inv_b = 1 / scale_b rounded to float32 (the
// quotient x_i / scale_b to within an ulp; a correctly rounded division per element cost the
// GPU encoder ~20 instructions and held it to ~550 G elements/s in every dtype, 0.40 of a
// copy's bandwidth in float16); where inv_b overflows (scale_b below 2^-128), q_i = x_i / scale_b:
//   Fp8E4M3: the e4m3fn bit pattern (1 sign, 4 exponent bits with bias 7, 3 mantissa bits;
//            no infinities, S.1111.111 is NaN) of q_i rounded to nearest even, saturated to
//            +-448: the result of CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3),
//            which the CPU's software encoder reproduces bit for bit.
//   Int8:    q_i rounded half to even, clamped to [-127, 127], as int8 bits; the code -128
//            (0x80) is free and marks NaN.
// A block whose finite elements are all zero has scale 0 and encodes x_i itself (+-0 keep
// their sign). A non-finite x_i (NaN, +-inf) gets the NaN code: e4m3fn has no infinity and
// int8 no NaN, and a saved activation that overflowed must not come back finite (a
// GradScaler then sees the NaN in the gradients and skips the step). Dequantization is
// decode(code_i) * scale_b in float32, converted to the output dtype (round to nearest); a
// product that rounds past the largest float32 (int8 codes of a block whose absmax is
// FLT_MAX) is kept at +-FLT_MAX, so that a finite x_i never comes back infinite.
//
// The error bound per element, from 3 mantissa bits (half an ulp of a normal e4m3 value v is
// at most 2^-4 |v|) and the subnormal step 2^-9 (half of it 2^-10), in units of the scale:
//   Fp8E4M3: |x_i - dq_i| <= max(2^-4 |x_i|, 2^-10 scale_b)
//   Int8:    |x_i - dq_i| <= 0.5 scale_b
// plus the float32 roundings of the inverse, q_i and the product (a few 2^-24 relative) and, for
// a float16/bfloat16 output, half an ulp of that dtype.
//
// Note [ReLU masks]
// relu_mask(y) packs, for each element of y (logical row-major order, element i in bit i % 8
// of byte i / 8), whether relu's backward passes its gradient: !(y_i <= 0), so y_i > 0 or
// NaN (unary_grad in tensor/ops/unary_math.h). That is all the backward needs of relu's
// output: 1 bit per element instead of 16 or 32. apply_relu_mask(g, mask) is g_i where the
// bit is set and +0 elsewhere, the same values, bit for bit, as relu's backward from y.
#include <cstdint>

#include "tensor/tensor.h"

namespace frugal::ops {

/// The code formats of Note [Blockwise quantization].
enum class QuantFormat : uint8_t { Fp8E4M3, Int8 };
/// "fp8_e4m3" or "int8".
const char* to_string(QuantFormat format);

/// A tensor's codes and scales (Note [Blockwise quantization]).
struct Quantized {
  Tensor codes;   ///< uint8 (n): one code per element of x, in x's logical row-major order
  Tensor scales;  ///< float32 (ceil(n / block)): one per block
};

/// Codes and per-block scales of x (float32, float16 or bfloat16, any strides, any size
/// including 0); block >= 1 elements per scale. Fresh contiguous outputs on x's device.
Quantized quantize_blockwise(const Tensor& x, QuantFormat format, int64_t block);

/// The values codes and scales stand for, as a fresh contiguous tensor of `sizes` and
/// `dtype` (float32, float16 or bfloat16); format and block as given to quantize_blockwise.
Tensor dequantize_blockwise(const Tensor& codes, const Tensor& scales, QuantFormat format, int64_t block, DType dtype,
                            const Shape& sizes);

/// The bits !(y_i <= 0) of a floating y (any strides), 8 per byte: uint8 (ceil(n / 8))
/// (Note [ReLU masks]).
Tensor relu_mask(const Tensor& y);

/// g_i where bit i of `mask` (from relu_mask) is set, else +0: a fresh contiguous tensor
/// of g's sizes and dtype (g floating, any strides).
Tensor apply_relu_mask(const Tensor& g, const Tensor& mask);

}  // namespace frugal::ops

// Backend kernels: n = x.numel() > 0; x and g any strides, every other tensor contiguous.
namespace frugal::ops::cpu {
/// codes: (n) uint8, scales: (ceil(n / block)) float32, x: any shape of n elements
void quantize_blockwise_kernel(const Tensor& codes, const Tensor& scales, const Tensor& x, QuantFormat format,
                               int64_t block);
/// out: (n) of its dtype, codes: (n) uint8, scales: (ceil(n / block)) float32
void dequantize_blockwise_kernel(const Tensor& out, const Tensor& codes, const Tensor& scales, QuantFormat format,
                                 int64_t block);
/// mask: (ceil(n / 8)) uint8, y: any shape of n elements
void relu_mask_kernel(const Tensor& mask, const Tensor& y);
/// out: (n) g's dtype, g: any shape of n elements, mask: (ceil(n / 8)) uint8
void apply_relu_mask_kernel(const Tensor& out, const Tensor& g, const Tensor& mask);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void quantize_blockwise_kernel(const Tensor& codes, const Tensor& scales, const Tensor& x, QuantFormat format,
                               int64_t block);
void dequantize_blockwise_kernel(const Tensor& out, const Tensor& codes, const Tensor& scales, QuantFormat format,
                                 int64_t block);
void relu_mask_kernel(const Tensor& mask, const Tensor& y);
void apply_relu_mask_kernel(const Tensor& out, const Tensor& g, const Tensor& mask);
}  // namespace frugal::ops::cuda
