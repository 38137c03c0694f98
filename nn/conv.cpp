#include "nn/conv.h"

#include <cmath>
#include <string>

#include "autograd/ops/conv.h"
#include "autograd/ops/conv1d.h"
#include "nn/init.h"
#include "tensor/factory.h"

namespace frugal::nn {

namespace {

/// Checks a layer's channel counts, kernel size (every entry positive: kernel_ok; printed as
/// `kernel`) and groups, naming `layer`.
void check_layer(const char* layer, int64_t in, int64_t out, bool kernel_ok, const std::string& kernel,
                 int64_t groups) {
  FRUGAL_CHECK(in > 0 && out > 0, layer, ": channels must be positive, got in_channels=", in, " out_channels=", out);
  FRUGAL_CHECK(kernel_ok, layer, ": kernel_size must be positive, got ", kernel);
  FRUGAL_CHECK(groups > 0 && in % groups == 0 && out % groups == 0, layer, ": groups=", groups,
               " must divide in_channels=", in, " and out_channels=", out);
}

/// A convolution layer's weight, initialised as torch's _ConvNd.reset_parameters:
/// kaiming_uniform (a = sqrt(5)), whose fan_in is the product of the weight's dims after the first.
Tensor conv_weight(const Shape& shape) {
  Tensor weight = empty(shape);
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  return weight;
}

/// Its bias, uniform(+-1 / sqrt(fan_in)) with the weight's fan_in.
Tensor conv_bias(int64_t out_channels, const Shape& weight_shape) {
  int64_t fan_in = 1;
  for (size_t d = 1; d < weight_shape.size(); ++d) fan_in *= weight_shape[d];
  Tensor bias = empty({out_channels});
  const double bound = 1.0 / std::sqrt(double(fan_in));
  init::uniform_(bias, -bound, bound);
  return bias;
}

/// A size as PyTorch prints it: "(3,)" in 1-D, "(3, 1)" in 2-D.
std::string size_text(int64_t v) { return "(" + std::to_string(v) + ",)"; }
std::string size_text(Int2 v) { return v.str(); }

/// torch's _ConvNd.extra_repr: the channels, kernel_size and stride, then padding, dilation,
/// output_padding, groups and bias where they are not the defaults.
template <typename Size>
std::string conv_repr(int64_t in, int64_t out, Size kernel, Size stride, Size padding, Size dilation,
                      Size output_padding, int64_t groups, bool has_bias) {
  std::string s = std::to_string(in) + ", " + std::to_string(out) + ", kernel_size=" + size_text(kernel) +
                  ", stride=" + size_text(stride);
  if (padding != Size(0)) s += ", padding=" + size_text(padding);
  if (dilation != Size(1)) s += ", dilation=" + size_text(dilation);
  if (output_padding != Size(0)) s += ", output_padding=" + size_text(output_padding);
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!has_bias) s += ", bias=false";
  return s;
}

/// A layer's input: (N, C, <dims>) or unbatched (C, <dims>), `dims` "L" or "H, W".
void check_input(const char* layer, const Tensor& x, int64_t in_channels, int64_t spatial_dims, const char* dims) {
  FRUGAL_CHECK(x.dim() == spatial_dims + 1 || x.dim() == spatial_dims + 2, layer, ": expected input (N, ", in_channels,
               ", ", dims, ") or (", in_channels, ", ", dims, "), got ", x.describe());
}

}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, Int2 kernel, Conv2dModuleOptions o)
    : in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      options{.stride = o.stride, .padding = o.padding, .dilation = o.dilation, .groups = o.groups} {
  check_layer("Conv2d", in, out, kernel.h > 0 && kernel.w > 0, kernel.str(), o.groups);
  weight = register_parameter("weight", conv_weight({out, in / o.groups, kernel.h, kernel.w}));
  if (o.bias) bias = register_parameter("bias", conv_bias(out, weight.sizes()));
}

Tensor Conv2d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  check_input("Conv2d", x, in_channels, 2, "H, W");
  return conv2d(x, weight, bias, options);
}

std::string Conv2d::extra_repr() const {
  return conv_repr(in_channels, out_channels, kernel_size, options.stride, options.padding, options.dilation, Int2(0),
                   options.groups, bias.defined());
}

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, Int2 kernel, ConvTranspose2dModuleOptions o)
    : in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      options{.stride = o.stride,
              .padding = o.padding,
              .output_padding = o.output_padding,
              .groups = o.groups,
              .dilation = o.dilation} {
  check_layer("ConvTranspose2d", in, out, kernel.h > 0 && kernel.w > 0, kernel.str(), o.groups);
  weight = register_parameter("weight", conv_weight({in, out / o.groups, kernel.h, kernel.w}));
  if (o.bias) bias = register_parameter("bias", conv_bias(out, weight.sizes()));
}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  check_input("ConvTranspose2d", x, in_channels, 2, "H, W");
  return conv_transpose2d(x, weight, bias, options);
}

Tensor ConvTranspose2d::forward(const Tensor& x, Int2 output_size) {
  check_input("ConvTranspose2d", x, in_channels, 2, "H, W");
  // torch's _output_padding: the output_padding that reaches output_size from the smallest size.
  ConvTranspose2dOptions o = options;
  o.output_padding = 0;
  const Shape batched = x.dim() == 4 ? x.sizes() : Shape{1, x.size(0), x.size(1), x.size(2)};
  const Shape smallest = ops::conv_transpose2d_output_shape("ConvTranspose2d", batched, weight.sizes(), o);
  const Int2 largest{smallest[2] + o.stride.h - 1, smallest[3] + o.stride.w - 1};
  FRUGAL_CHECK(output_size.h >= smallest[2] && output_size.h <= largest.h && output_size.w >= smallest[3] &&
                   output_size.w <= largest.w,
               "ConvTranspose2d: requested an output size of ", output_size.str(), " for input ", x.describe(),
               ", but valid sizes range from (", smallest[2], ", ", smallest[3], ") to ", largest.str());
  o.output_padding = {output_size.h - smallest[2], output_size.w - smallest[3]};
  core::ModuleScope scope(this);
  return conv_transpose2d(x, weight, bias, o);
}

std::string ConvTranspose2d::extra_repr() const {
  return conv_repr(in_channels, out_channels, kernel_size, options.stride, options.padding, options.dilation,
                   options.output_padding, options.groups, bias.defined());
}

Conv1d::Conv1d(int64_t in, int64_t out, int64_t kernel, Conv1dModuleOptions o)
    : in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      options{.stride = o.stride, .padding = o.padding, .dilation = o.dilation, .groups = o.groups} {
  check_layer("Conv1d", in, out, kernel > 0, std::to_string(kernel), o.groups);
  weight = register_parameter("weight", conv_weight({out, in / o.groups, kernel}));
  if (o.bias) bias = register_parameter("bias", conv_bias(out, weight.sizes()));
}

Tensor Conv1d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  check_input("Conv1d", x, in_channels, 1, "L");
  return conv1d(x, weight, bias, options);
}

std::string Conv1d::extra_repr() const {
  return conv_repr<int64_t>(in_channels, out_channels, kernel_size, options.stride, options.padding, options.dilation,
                            0, options.groups, bias.defined());
}

ConvTranspose1d::ConvTranspose1d(int64_t in, int64_t out, int64_t kernel, ConvTranspose1dModuleOptions o)
    : in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      options{.stride = o.stride,
              .padding = o.padding,
              .output_padding = o.output_padding,
              .groups = o.groups,
              .dilation = o.dilation} {
  check_layer("ConvTranspose1d", in, out, kernel > 0, std::to_string(kernel), o.groups);
  weight = register_parameter("weight", conv_weight({in, out / o.groups, kernel}));
  if (o.bias) bias = register_parameter("bias", conv_bias(out, weight.sizes()));
}

Tensor ConvTranspose1d::forward(const Tensor& x) {
  core::ModuleScope scope(this);
  check_input("ConvTranspose1d", x, in_channels, 1, "L");
  return conv_transpose1d(x, weight, bias, options);
}

std::string ConvTranspose1d::extra_repr() const {
  return conv_repr<int64_t>(in_channels, out_channels, kernel_size, options.stride, options.padding, options.dilation,
                            options.output_padding, options.groups, bias.defined());
}

}  // namespace frugal::nn
