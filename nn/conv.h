#pragma once
// Convolution layers: Conv1d, Conv2d, ConvTranspose1d and ConvTranspose2d, as torch.nn's.
#include "nn/module.h"
#include "tensor/ops/conv.h"    // Int2, Conv2dOptions
#include "tensor/ops/conv1d.h"  // Conv1dOptions, ConvTranspose1dOptions

namespace frugal::nn {

/// torch.nn.Conv2d's settings besides the channel counts and the kernel size.
struct Conv2dModuleOptions {
  Int2 stride = 1;
  Int2 padding = 0;
  Int2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

/// y = conv2d(x, weight, bias) with weight (out_channels, in_channels / groups, kH, kW) and
/// bias (out_channels), initialised as torch.nn.Conv2d: kaiming_uniform (a = sqrt(5)) and
/// bias uniform(+-1 / sqrt(fan_in)), fan_in = in_channels / groups * kH * kW.
class Conv2d : public UnaryModule {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size, Conv2dModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  /// "3, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=false"
  std::string extra_repr() const override;

  Tensor weight, bias;  // bias undefined without one
  const int64_t in_channels, out_channels;
  const Int2 kernel_size;
  const Conv2dOptions options;
};

/// torch.nn.ConvTranspose2d's settings besides the channel counts and the kernel size.
struct ConvTranspose2dModuleOptions {
  Int2 stride = 1;
  Int2 padding = 0;
  Int2 output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Int2 dilation = 1;
};

/// y = conv_transpose2d(x, weight, bias) with weight (in_channels, out_channels / groups, kH, kW)
/// and bias (out_channels), initialised as torch.nn.ConvTranspose2d: kaiming_uniform (a =
/// sqrt(5)) on the weight, whose fan_in is out_channels / groups * kH * kW (its second dim), and
/// bias uniform(+-1 / sqrt(that fan_in)).
class ConvTranspose2d : public UnaryModule {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size,
                  ConvTranspose2dModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  /// The forward to an output of `output_size` (H, W), which picks the output_padding of each
  /// dim (torch's forward(input, output_size)): each size must lie from the size without
  /// output_padding to stride - 1 above it.
  Tensor forward(const Tensor& x, Int2 output_size);
  std::string type_name() const override { return "ConvTranspose2d"; }
  /// "16, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1)"
  std::string extra_repr() const override;

  Tensor weight, bias;  // bias undefined without one
  const int64_t in_channels, out_channels;
  const Int2 kernel_size;
  const ConvTranspose2dOptions options;
};

/// torch.nn.Conv1d's settings besides the channel counts and the kernel size.
struct Conv1dModuleOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

/// y = conv1d(x, weight, bias) with weight (out_channels, in_channels / groups, k), initialised as
/// torch.nn.Conv1d (Conv2d's rule with fan_in = in_channels / groups * k).
class Conv1d : public UnaryModule {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv1dModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv1d"; }
  /// "80, 384, kernel_size=(3,), stride=(1,), padding=(1,)", as PyTorch prints 1-tuples.
  std::string extra_repr() const override;

  Tensor weight, bias;  // bias undefined without one
  const int64_t in_channels, out_channels, kernel_size;
  const Conv1dOptions options;
};

/// torch.nn.ConvTranspose1d's settings besides the channel counts and the kernel size.
struct ConvTranspose1dModuleOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  int64_t dilation = 1;
};

/// y = conv_transpose1d(x, weight, bias) with weight (in_channels, out_channels / groups, k),
/// initialised as torch.nn.ConvTranspose1d (fan_in = out_channels / groups * k).
class ConvTranspose1d : public UnaryModule {
 public:
  ConvTranspose1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                  ConvTranspose1dModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ConvTranspose1d"; }
  std::string extra_repr() const override;

  Tensor weight, bias;  // bias undefined without one
  const int64_t in_channels, out_channels, kernel_size;
  const ConvTranspose1dOptions options;
};

}  // namespace frugal::nn
