#pragma once
// 1-D pooling (torch.nn.functional.max_pool1d, avg_pool1d, adaptive_avg_pool1d) on (N, C, L)
// or (C, L) tensors, as raw ops; the differentiable forms are in autograd/ops/pool1d.h. As the
// 1-D convolutions (Note [1-D convolution as 2-D] in tensor/ops/conv1d.h), they are the 2-D ops
// on a 1 x L image, with their own checks so that errors name the 1-D op and its settings.
#include <cstdint>

#include "tensor/ops/pool.h"  // MaxPool2dOptions, AvgPool2dOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.max_pool1d's settings (the kernel size is an argument).
struct MaxPool1dOptions {
  int64_t stride = 0;   // 0 (the default): the kernel size
  int64_t padding = 0;  // -inf, at most half the (dilated) kernel
  int64_t dilation = 1;
  bool ceil_mode = false;
};

/// torch.nn.functional.avg_pool1d's settings (the kernel size is an argument).
struct AvgPool1dOptions {
  int64_t stride = 0;   // 0 (the default): the kernel size
  int64_t padding = 0;  // zeros, at most half the kernel
  bool ceil_mode = false;
  bool count_include_pad = true;
};

}  // namespace frugal

namespace frugal::ops {

/// The 2-D settings of the 1 x L image (stride 0 resolved to the kernel size).
MaxPool2dOptions max_pool1d_as_2d(int64_t kernel, const MaxPool1dOptions& options);
AvgPool2dOptions avg_pool1d_as_2d(int64_t kernel, const AvgPool1dOptions& options);

/// Checks a 1-D pooling's input tensor: defined and floating; throws naming `op`.
void check_pool1d_tensor(const char* op, const Tensor& x);

/// Checks a 1-D window pooling of an input of `input_shape` ((N, C, L) or (C, L), L > 0) with
/// `kernel`, stride (0: the kernel), padding (at most half the dilated kernel) and dilation;
/// throws naming `op`, the shape and the settings. Returns the output length.
int64_t pool1d_output_length(const char* op, const Shape& input_shape, int64_t kernel, int64_t stride, int64_t padding,
                             int64_t dilation, bool ceil_mode);

/// Checks an adaptive 1-D pooling of an input of `input_shape` ((N, C, L) or (C, L), L > 0) to
/// output_size > 0; throws naming `op`.
void check_adaptive_pool1d(const char* op, const Shape& input_shape, int64_t output_size);

/// torch.nn.functional.max_pool1d (values; NaN wins, the first maximum of a window is its argmax).
Tensor max_pool1d(const Tensor& x, int64_t kernel, const MaxPool1dOptions& options = {});
/// torch.nn.functional.avg_pool1d.
Tensor avg_pool1d(const Tensor& x, int64_t kernel, const AvgPool1dOptions& options = {});
/// torch.nn.functional.adaptive_avg_pool1d: output_size bins of lengths floor/ceil(L / output_size).
Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size);

}  // namespace frugal::ops
