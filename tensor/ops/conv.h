#pragma once
// 2-D convolution (cross-correlation, as torch.nn.functional.conv2d) on NCHW tensors:
// the forward and its two backward products, as raw ops. The differentiable form is
// frugal::conv2d in autograd/ops/conv.h.
//
// Note [Convolution as GEMM]
// With the input x: (N, C, H, W), the weight w: (K, C / groups, R, S) and the output
// y: (N, K, OH, OW), group g of sample n is one matrix product
//   y[n, g] (K/G, OH*OW) = w[g] (K/G, C/G*R*S) @ col (C/G*R*S, OH*OW)
// where col = im2col(x[n, g]) holds, in row (c, r, s) and column (oh, ow), the input
// pixel x[n, c, oh*stride_h - pad_h + r*dilation_h, ow*stride_w - pad_w + s*dilation_w]
// (zero in the padding). The two backward products are the same GEMM transposed:
//   grad_x[n, g] = col2im(w[g]^T @ grad_y[n, g])        (col2im adds overlapping taps)
//   grad_w[g]    = sum_n grad_y[n, g] @ im2col(x[n, g])^T
// The CPU backend (tensor/cpu/conv.cpp) runs exactly this on Eigen's GEMM; a 1x1 kernel
// with stride 1 and no padding needs no im2col at all (col is x itself). The CUDA
// backend (tensor/cuda/conv.cu) hands the three products to cuDNN, see Note [cuDNN
// convolution algorithms] there.
//
// Note [Channels-last convolution]
// Each op picks one memory format for all its 4-D operands, as PyTorch's
// cudnn_conv_suggest_memory_format does: channels-last when its data input (x, or
// grad_out for the backward products) or its weight (x for backward_weight) suggests it
// (Note [Channels-last layout] in tensor/memory_format.h), else contiguous. Operands
// in the other format are converted (a weight stored channels-last by
// nn::to_channels_last(Module&) converts no more), and the result is returned in the
// chosen format. The CUDA backend runs channels-last natively (cuDNN's NHWC tensor and
// filter descriptors, geometry.channels_last); the CPU computes NCHW and converts the
// result, so the layout of a result never depends on the device. float64 takes the CPU's way
// on CUDA too: cuDNN has no float64 NHWC convolution.
#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace frugal {

/// A (height, width) pair of a 2-D setting; one number sets both:
/// `{.stride = 2, .padding = {3, 1}}`.
struct Int2 {
  int64_t h = 0, w = 0;
  constexpr Int2() = default;
  constexpr Int2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit, so a scalar means (v, v)
  constexpr Int2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  friend constexpr bool operator==(const Int2&, const Int2&) = default;
  /// "(3, 1)", as PyTorch prints tuples.
  std::string str() const;
};

/// torch.nn.functional.conv2d's settings.
struct Conv2dOptions {
  Int2 stride = 1;
  Int2 padding = 0;  // zeros on both sides
  Int2 dilation = 1;
  int64_t groups = 1;
};

/// torch.nn.functional.conv_transpose2d's settings, in its argument order (dilation last).
struct ConvTranspose2dOptions {
  Int2 stride = 1;
  Int2 padding = 0;         // dilation (k - 1) - padding zeros added to both sides of the input
  Int2 output_padding = 0;  // rows (columns) added at the bottom (right); smaller than stride or dilation
  int64_t groups = 1;
  Int2 dilation = 1;
  /// The convolution whose input gradient this op is (Note [Transposed convolution]).
  Conv2dOptions conv() const { return {.stride = stride, .padding = padding, .dilation = dilation, .groups = groups}; }
};

}  // namespace frugal

namespace frugal::ops {

/// Every size of one convolution, checked (see conv2d_geometry).
struct Conv2dGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input (N, C, H, W)
  int64_t K = 0, R = 0, S = 0;         // weight (K, C / groups, R, S)
  int64_t OH = 0, OW = 0;              // output (N, K, OH, OW)
  Int2 stride, padding, dilation;
  int64_t groups = 1;
  bool channels_last = false;  // every operand of the kernel call is NHWC (Note [Channels-last convolution])
  Shape input_shape() const { return {N, C, H, W}; }
  Shape weight_shape() const { return {K, C / groups, R, S}; }
  Shape output_shape() const { return {N, K, OH, OW}; }
};

/// Validates a convolution of an input of `input_shape` (N, C, H, W) with a weight of
/// `weight_shape` (K, C / groups, R, S) and computes the output size
/// OH = (H + 2 pad_h - dilation_h (R - 1) - 1) / stride_h + 1 (likewise OW). Throws a
/// frugal::Error naming `op` and the shapes on a channel mismatch, groups that do not
/// divide both channel counts, a kernel larger than the padded input, or a non-positive
/// stride/dilation, negative padding or groups.
Conv2dGeometry conv2d_geometry(const char* op, const Shape& input_shape, const Shape& weight_shape,
                               const Conv2dOptions& options);

/// torch.nn.functional.conv2d: x (N, C, H, W) or unbatched (C, H, W), weight (K, C / groups,
/// R, S), bias (K) or undefined; result (N, K, OH, OW) (or (K, OH, OW)). x, weight and bias
/// share a floating dtype and a device. float16/bfloat16 accumulate in float32.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& options = {});

/// The gradient of conv2d with respect to its input: grad_out (N, K, OH, OW), weight
/// (K, C / groups, R, S) -> grad_x of `input_shape` (N, C, H, W).
Tensor conv2d_backward_input(const Tensor& grad_out, const Shape& input_shape, const Tensor& weight,
                             const Conv2dOptions& options = {});

/// The gradient of conv2d with respect to its weight: grad_out (N, K, OH, OW), x (N, C, H, W)
/// -> grad_w of `weight_shape` (K, C / groups, R, S), channels-last when the operands suggest
/// it (Note [Channels-last convolution]; the autograd node returns it in the weight's layout). (The bias gradient is
/// the sum of grad_out over N, OH and OW.)
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dOptions& options = {});

// Note [Transposed convolution]
// conv_transpose2d(x, w) with x (N, C_in, H, W) and w (C_in, C_out / groups, R, S) is the
// input gradient of the convolution that maps an (N, C_out, OH, OW) image to x with the same
// w (K = C_in output channels), as torch defines it:
//   conv_transpose2d(x, w) = conv2d_backward_input(grad_out = x, (N, C_out, OH, OW), w),
//   OH = (H - 1) stride - 2 padding + dilation (R - 1) + output_padding + 1  (likewise OW):
// each input pixel adds w[c_in] times itself into the window the convolution reads for it,
// and output_padding adds the rows at the bottom that the convolution's floor division
// leaves unread. So it runs on the convolution's kernels (cuDNN's backward-data on CUDA, as
// PyTorch's), and its gradients are the convolution's other products:
//   grad_x = conv2d(g, w),   grad_w = conv2d_backward_weight(grad_out = x, input = g).
// torch allows output_padding >= stride while it is below dilation; the convolution of the
// output then has H' = H + output_padding / stride rows, and x takes part as x padded with
// H' - H zero rows at the bottom (likewise columns), which add nothing.

/// conv_transpose2d's output shape for an input of `input_shape` (N, C_in, H, W) and a weight of
/// `weight_shape` (C_in, C_out / groups, R, S): (N, C_out, OH, OW) (Note [Transposed convolution]).
/// Throws naming `op`, the shapes and the settings on a channel mismatch, groups that do not
/// divide C_in, output_padding not below stride or dilation, or an output size below 1.
Shape conv_transpose2d_output_shape(const char* op, const Shape& input_shape, const Shape& weight_shape,
                                    const ConvTranspose2dOptions& options);

/// The zero rows and columns x takes at the bottom and right so that the convolution of the
/// output maps back to its size: (output_padding.h / stride.h, output_padding.w / stride.w),
/// nonzero only where output_padding >= stride (Note [Transposed convolution]).
Int2 conv_transpose2d_input_padding(const ConvTranspose2dOptions& options);

/// x with conv_transpose2d_input_padding's zero rows and columns (x itself when there are none),
/// in x's layout.
Tensor conv_transpose2d_padded_input(const Tensor& x, const ConvTranspose2dOptions& options);

/// torch.nn.functional.conv_transpose2d: x (N, C_in, H, W) or unbatched (C_in, H, W), weight
/// (C_in, C_out / groups, R, S), bias (C_out) or undefined; result (N, C_out, OH, OW) (or
/// (C_out, OH, OW)), in the layout conv2d_backward_input picks (Note [Channels-last
/// convolution]). float16/bfloat16 accumulate in float32; the bias is added after, rounded again.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose2dOptions& options = {});

/// Lets the CUDA backend time every cuDNN algorithm on the first call of each convolution
/// shape and keep the fastest (cudnnFind*), like torch.backends.cudnn.benchmark; otherwise
/// cuDNN's heuristics choose (cudnnGet*). Process-wide; default false.
void set_cudnn_benchmark(bool on);
/// The current setting of set_cudnn_benchmark.
bool cudnn_benchmark();

/// Which cuDNN API the CUDA backend runs convolutions with: the graph (backend) API with
/// execution plans cached per shape (the default: its per-call host cost is a fraction of
/// the legacy API's), or the legacy cudnnConvolution* calls (Note [cuDNN graph API
/// convolutions] in tensor/cuda/conv_graph.cu). The legacy API also serves whatever the
/// graph API has no plan for, and float64. Process-wide; the environment variable
/// FRUGAL_CUDNN_LEGACY_CONV=1 sets the initial value to legacy.
void set_cudnn_legacy_conv(bool on);
/// The current setting of set_cudnn_legacy_conv.
bool cudnn_legacy_conv();

}  // namespace frugal::ops

// Backend kernels. The front-end has validated the operands, made every tensor contiguous
// (or, when g.channels_last, channels-last: CUDA only),
// allocated the result and handled empty sizes (N, K, C / groups, OH or OW of 0): the
// kernels see a non-empty problem and write every element of their result.
namespace frugal::ops::cpu {
/// out: (N, K, OH, OW); x: (N, C, H, W); w: (K, C/G, R, S); bias: (K) or undefined
void conv2d_kernel(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g);
/// grad_x: (N, C, H, W); grad_out: (N, K, OH, OW); w: (K, C/G, R, S)
void conv2d_backward_input_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& w,
                                  const Conv2dGeometry& g);
/// grad_w: (K, C/G, R, S); grad_out: (N, K, OH, OW); x: (N, C, H, W)
void conv2d_backward_weight_kernel(const Tensor& grad_w, const Tensor& grad_out, const Tensor& x,
                                   const Conv2dGeometry& g);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void conv2d_kernel(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g);
void conv2d_backward_input_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& w,
                                  const Conv2dGeometry& g);
void conv2d_backward_weight_kernel(const Tensor& grad_w, const Tensor& grad_out, const Tensor& x,
                                   const Conv2dGeometry& g);
}  // namespace frugal::ops::cuda
