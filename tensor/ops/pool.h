#pragma once
// 2-D pooling on (N, C, H, W) or unbatched (C, H, W) tensors, as torch.nn.functional's
// max_pool2d, avg_pool2d and adaptive_avg_pool2d, forward and backward (raw ops; the
// differentiable forms are in autograd/ops/pool.h).
//
// Note [Pooling windows]
// Every plane (one sample, one channel) pools on its own. Output (oh, ow) of a window
// pool reads rows oh * stride_h - pad_h + i * dilation_h, i < kernel_h (likewise
// columns); the output size is
//   OH = floor_or_ceil((H + 2 pad_h - dilation_h (kernel_h - 1) - 1) / stride_h) + 1,
// where ceil_mode rounds up but drops a last window that would start in the right
// padding. Max pooling ignores the padding (as if -inf), takes the first largest
// value, lets NaN win, and records the argmax as the flat index ih * W + iw in its
// plane (PyTorch's convention); its backward routes each gradient to that index. A
// window that holds no input pixel at all (only dilation can leave one entirely in the
// padding) gives -inf and index -1, whose gradient goes nowhere.
// Average pooling divides by the window's size counted with the padding
// (count_include_pad, clipped to the padded input) or without it. Adaptive average
// pooling splits H into OH windows [floor(o H / OH), ceil((o + 1) H / OH)).
// The CUDA backward kernels gather (one thread per input element sums the outputs
// whose window holds it) instead of scattering with atomics: deterministic, and
// rounded once for float16/bfloat16. Both backends add a pixel's gradients in output
// order (oh, then ow), so their max-pool gradients agree exactly.
//
// Note [Window-local max-pool indices]
// max_pool2d's public indices are PyTorch's: int64 flat positions ih * W + iw, 8 bytes
// per output. Its backward needs far less: which of the window's kernel_h * kernel_w
// positions won, the offset i * kernel_w + j (kh, kw order, so the first maximum in
// window order is the smallest offset). Up to 255 positions (every practical pool; 9
// for ResNet's 3x3) that is one byte, with 255 (kNoWindowArgmax) for a window that holds
// no input pixel. The autograd node keeps the pool's input, not indices (Note [Max-pool
// backward from the input] in autograd/ops/pool.cpp), and max_pool2d_backward_from_input
// recomputes the argmax: on CUDA into a transient byte per output (N C OH OW bytes,
// 25.7 MB at ResNet-50's stem at batch 128, where int64 would take 205 MB), which the
// gather kernel reads back, 16 bytes of channels at a time when channels-last (Note
// [NHWC pooling] in tensor/cuda/pool.cu); larger windows fall back to int64 flat
// indices. The CPU fuses the two passes per plane and needs no index buffer.
// Channels-last inputs (Note [Channels-last layout] in tensor/memory_format.h) give
// channels-last results (and max pooling's indices); a backward returns grad_x
// channels-last when grad_out is. The CUDA kernels read and write NHWC natively (Note
// [NHWC pooling] in tensor/cuda/pool.cu); the CPU kernels compute NCHW planes, so the
// front-end hands them contiguous copies and converts the results.
#include "tensor/half.h"
#include "tensor/ops/conv.h"  // Int2
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.max_pool2d's settings (the kernel size is an argument).
struct MaxPool2dOptions {
  Int2 stride = 0;   // 0 (the default): the kernel size
  Int2 padding = 0;  // -inf, at most half the (dilated) kernel
  Int2 dilation = 1;
  bool ceil_mode = false;
};

/// torch.nn.functional.avg_pool2d's settings (the kernel size is an argument).
struct AvgPool2dOptions {
  Int2 stride = 0;   // 0 (the default): the kernel size
  Int2 padding = 0;  // zeros, at most half the kernel
  bool ceil_mode = false;
  bool count_include_pad = true;
};

/// A pooling's stride: `stride`, or the kernel size when it is 0 (PyTorch's stride=None).
constexpr Int2 pool_stride(Int2 stride, Int2 kernel) { return stride == Int2(0) ? kernel : stride; }

}  // namespace frugal

namespace frugal::ops {

/// The number of windows of kernel k (dilation d) at stride s over `in` elements padded by p on
/// each side, as PyTorch's pooling_output_shape: with ceil_mode a last partial window counts
/// unless it starts in the right padding. May be <= 0 (the callers' error).
int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode);

/// The sizes of one pooling: P = N * C planes of (H, W) pooled to (OH, OW). channels_last
/// (CUDA only): every operand is an (N, C, H, W) tensor in channels-last memory, and C is
/// set (it stays 1 otherwise).
struct Pool2dGeometry {
  int64_t P = 0, C = 1, H = 0, W = 0, OH = 0, OW = 0;
  Int2 kernel, stride, padding, dilation = 1;
  bool count_include_pad = true;
  bool channels_last = false;
};

/// The outputs of max_pool2d: the maxima and their int64 flat indices ih * W + iw in the
/// plane, both of the output shape.
struct MaxPool2dResult {
  Tensor out, indices;
};

/// torch.nn.functional.max_pool2d(x, kernel, ...) with return_indices: x (N, C, H, W) or
/// (C, H, W), floating. See Note [Pooling windows].
MaxPool2dResult max_pool2d(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options = {});
/// max_pool2d's maxima alone: no indices are computed or stored (the autograd forward).
Tensor max_pool2d_values(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options = {});
/// The gradient of max_pool2d: grad_out and indices of the output shape -> grad_x of `input_shape`.
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape, Int2 kernel,
                           const MaxPool2dOptions& options = {});
/// The gradient of max_pool2d from its input x instead of its indices: grad_out of the
/// output shape -> grad_x of x's shape, the argmax recomputed from x (Note [Window-local
/// max-pool indices]). Equals max_pool2d_backward(grad_out, max_pool2d(x).indices, ...).
Tensor max_pool2d_backward_from_input(const Tensor& grad_out, const Tensor& x, Int2 kernel,
                                      const MaxPool2dOptions& options = {});

/// The most window positions a one-byte argmax offset holds, and the offset of "no input
/// pixel in the window" (Note [Window-local max-pool indices]).
inline constexpr int64_t kMaxByteWindow = 255;
inline constexpr uint8_t kNoWindowArgmax = 255;

/// torch.nn.functional.avg_pool2d: x (N, C, H, W) or (C, H, W), floating.
Tensor avg_pool2d(const Tensor& x, Int2 kernel, const AvgPool2dOptions& options = {});
/// The gradient of avg_pool2d: grad_out of the output shape -> grad_x of `input_shape`.
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, Int2 kernel,
                           const AvgPool2dOptions& options = {});

/// torch.nn.functional.adaptive_avg_pool2d: x (N, C, H, W) or (C, H, W) -> (..., OH, OW).
Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size);
/// The gradient of adaptive_avg_pool2d: grad_out (..., OH, OW) -> grad_x of `input_shape`.
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape);

// ---- window arithmetic shared by the CPU and CUDA kernels (Note [Pooling windows]) ----

/// Average pooling along one dim: the window of output o clipped to the input, [*start, *end),
/// returning its length clipped to the padded input (the count_include_pad divisor factor).
FRUGAL_HD int64_t avg_window(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t size, int64_t* start,
                             int64_t* end) {
  int64_t s = o * stride - pad, e = s + kernel;
  if (e > size + pad) e = size + pad;
  const int64_t padded = e - s;
  *start = s < 0 ? 0 : s;
  *end = e > size ? size : e;
  return padded;
}

/// Adaptive pooling along one dim: output o of out_size reads [start, end) of in_size.
FRUGAL_HD int64_t adaptive_start(int64_t o, int64_t in_size, int64_t out_size) { return (o * in_size) / out_size; }
FRUGAL_HD int64_t adaptive_end(int64_t o, int64_t in_size, int64_t out_size) {
  return ((o + 1) * in_size + out_size - 1) / out_size;
}

}  // namespace frugal::ops

// Backend kernels. Every tensor is contiguous and viewed as (P, H, W) / (P, OH, OW), or
// channels-last when g.channels_last (CUDA only); the front-end has handled empty
// tensors. indices: int64, or undefined when only the maxima are wanted.
namespace frugal::ops::cpu {
void max_pool2d_kernel(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g);
void max_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                                const Pool2dGeometry& g);
void max_pool2d_backward_from_input_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& x,
                                           const Pool2dGeometry& g);
void avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g);
void avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g);
void adaptive_avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g);
void adaptive_avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void max_pool2d_kernel(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g);
void max_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                                const Pool2dGeometry& g);
void max_pool2d_backward_from_input_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& x,
                                           const Pool2dGeometry& g);
void avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g);
void avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g);
void adaptive_avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g);
void adaptive_avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g);
}  // namespace frugal::ops::cuda
