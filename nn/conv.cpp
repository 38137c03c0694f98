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

/// "(3,)": PyTorch's 1-tuple.
std::string tuple1(int64_t v) { return "(" + std::to_string(v) + ",)"; }

void check_1d_input(const char* layer, const Tensor& x, int64_t in_channels) {
  FRUGAL_CHECK(x.dim() == 2 || x.dim() == 3, layer, ": expected input (N, ", in_channels, ", L) or (", in_channels,
               ", L), got ", x.describe());
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
  FRUGAL_CHECK(x.dim() == 3 || x.dim() == 4, "Conv2d: expected input (N, ", in_channels, ", H, W) or (", in_channels,
               ", H, W), got ", x.describe());
  return conv2d(x, weight, bias, options);
}

std::string Conv2d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + kernel_size.str() + ", stride=" + options.stride.str();
  if (options.padding != Int2(0)) s += ", padding=" + options.padding.str();
  if (options.dilation != Int2(1)) s += ", dilation=" + options.dilation.str();
  if (options.groups != 1) s += ", groups=" + std::to_string(options.groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
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
  FRUGAL_CHECK(x.dim() == 3 || x.dim() == 4, "ConvTranspose2d: expected input (N, ", in_channels, ", H, W) or (",
               in_channels, ", H, W), got ", x.describe());
  return conv_transpose2d(x, weight, bias, options);
}

Tensor ConvTranspose2d::forward(const Tensor& x, Int2 output_size) {
  FRUGAL_CHECK(x.dim() == 3 || x.dim() == 4, "ConvTranspose2d: expected input (N, ", in_channels, ", H, W) or (",
               in_channels, ", H, W), got ", x.describe());
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
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + kernel_size.str() + ", stride=" + options.stride.str();
  if (options.padding != Int2(0)) s += ", padding=" + options.padding.str();
  if (options.dilation != Int2(1)) s += ", dilation=" + options.dilation.str();
  if (options.output_padding != Int2(0)) s += ", output_padding=" + options.output_padding.str();
  if (options.groups != 1) s += ", groups=" + std::to_string(options.groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
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
  check_1d_input("Conv1d", x, in_channels);
  return conv1d(x, weight, bias, options);
}

std::string Conv1d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + tuple1(kernel_size) + ", stride=" + tuple1(options.stride);
  if (options.padding != 0) s += ", padding=" + tuple1(options.padding);
  if (options.dilation != 1) s += ", dilation=" + tuple1(options.dilation);
  if (options.groups != 1) s += ", groups=" + std::to_string(options.groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
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
  check_1d_input("ConvTranspose1d", x, in_channels);
  return conv_transpose1d(x, weight, bias, options);
}

std::string ConvTranspose1d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + tuple1(kernel_size) + ", stride=" + tuple1(options.stride);
  if (options.padding != 0) s += ", padding=" + tuple1(options.padding);
  if (options.dilation != 1) s += ", dilation=" + tuple1(options.dilation);
  if (options.output_padding != 0) s += ", output_padding=" + tuple1(options.output_padding);
  if (options.groups != 1) s += ", groups=" + std::to_string(options.groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
}

}  // namespace frugal::nn
