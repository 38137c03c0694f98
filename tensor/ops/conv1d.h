#pragma once
// 1-D convolution and transposed convolution (torch.nn.functional.conv1d / conv_transpose1d)
// on (N, C, L) tensors, as raw ops; the differentiable forms are in autograd/ops/conv1d.h.
//
// Note [1-D convolution as 2-D]
// A length-L signal is a 1 x L image: conv1d(x, w) = conv2d(x (N, C, 1, L), w (K, C/G, 1, k))
// squeezed, with (1, stride), (0, padding) and (1, dilation); conv_transpose1d likewise through
// conv_transpose2d. The 2-D ops' kernels (cuDNN on CUDA) and gradients serve both; only the
// checks are the 1-D ops' own, so that an error names conv1d and the shapes the user passed.
#include <cstdint>

#include "tensor/ops/conv.h"  // Int2, Conv2dOptions, ConvTranspose2dOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.conv1d's settings.
struct Conv1dOptions {
  int64_t stride = 1;
  int64_t padding = 0;  // zeros on both ends
  int64_t dilation = 1;
  int64_t groups = 1;
  /// The 2-D convolution of the signal as a 1 x L image (Note [1-D convolution as 2-D]).
  Conv2dOptions as_2d() const {
    return {.stride = {1, stride}, .padding = {0, padding}, .dilation = {1, dilation}, .groups = groups};
  }
};

/// torch.nn.functional.conv_transpose1d's settings, in its argument order (dilation last).
struct ConvTranspose1dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output_padding = 0;  // smaller than stride or dilation
  int64_t groups = 1;
  int64_t dilation = 1;
  ConvTranspose2dOptions as_2d() const {
    return {.stride = {1, stride},
            .padding = {0, padding},
            .output_padding = {0, output_padding},
            .groups = groups,
            .dilation = {1, dilation}};
  }
};

}  // namespace frugal

namespace frugal::ops {

/// Checks conv1d's operands' shapes (input (N, C, L), weight (K, C / groups, k)) and settings;
/// throws naming `op`, the shapes and the settings. Returns the output length
/// floor((L + 2 padding - dilation (k - 1) - 1) / stride) + 1.
int64_t conv1d_output_length(const char* op, const Shape& input_shape, const Shape& weight_shape,
                             const Conv1dOptions& options);
/// Checks conv_transpose1d's operands' shapes (input (N, C_in, L), weight (C_in, C_out / groups,
/// k)) and settings; throws naming `op`. Returns the output length
/// (L - 1) stride - 2 padding + dilation (k - 1) + output_padding + 1.
int64_t conv_transpose1d_output_length(const char* op, const Shape& input_shape, const Shape& weight_shape,
                                       const ConvTranspose1dOptions& options);

/// Checks a 1-D convolution's tensors: input and weight defined, every one floating, of the
/// input's dtype and on its device; throws naming `op` and the offending tensor.
void check_conv1d_operands(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias);

/// torch.nn.functional.conv1d: x (N, C, L) or unbatched (C, L), weight (K, C / groups, k), bias
/// (K) or undefined; result (N, K, OL) (or (K, OL)). Same dtypes and devices as conv2d.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv1dOptions& options = {});

/// torch.nn.functional.conv_transpose1d: x (N, C_in, L) or (C_in, L), weight (C_in, C_out / groups,
/// k), bias (C_out) or undefined; result (N, C_out, OL) (or (C_out, OL)).
Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose1dOptions& options = {});

}  // namespace frugal::ops
