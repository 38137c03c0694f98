#include "nn/conv.h"

#include <cmath>

#include "autograd/ops/conv.h"
#include "nn/init.h"
#include "tensor/factory.h"

namespace frugal::nn {

Conv2d::Conv2d(int64_t in, int64_t out, Int2 kernel, Conv2dModuleOptions o)
    : in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      options{.stride = o.stride, .padding = o.padding, .dilation = o.dilation, .groups = o.groups} {
  FRUGAL_CHECK(in > 0 && out > 0, "Conv2d: channels must be positive, got in_channels=", in, " out_channels=", out);
  FRUGAL_CHECK(kernel.h > 0 && kernel.w > 0, "Conv2d: kernel_size must be positive, got ", kernel.str());
  FRUGAL_CHECK(o.groups > 0 && in % o.groups == 0 && out % o.groups == 0, "Conv2d: groups=", o.groups,
               " must divide in_channels=", in, " and out_channels=", out);
  weight = register_parameter("weight", empty({out, in / o.groups, kernel.h, kernel.w}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (o.bias) {
    bias = register_parameter("bias", empty({out}));
    const double bound = 1.0 / std::sqrt(double(in / o.groups * kernel.h * kernel.w));
    init::uniform_(bias, -bound, bound);
  }
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
  constexpr const char* op = "ConvTranspose2d";
  FRUGAL_CHECK(in > 0 && out > 0, op, ": channels must be positive, got in_channels=", in, " out_channels=", out);
  FRUGAL_CHECK(kernel.h > 0 && kernel.w > 0, op, ": kernel_size must be positive, got ", kernel.str());
  FRUGAL_CHECK(o.groups > 0 && in % o.groups == 0 && out % o.groups == 0, op, ": groups=", o.groups,
               " must divide in_channels=", in, " and out_channels=", out);
  weight = register_parameter("weight", empty({in, out / o.groups, kernel.h, kernel.w}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));  // fan_in = weight.size(1) * kH * kW, as torch's
  if (o.bias) {
    bias = register_parameter("bias", empty({out}));
    const double bound = 1.0 / std::sqrt(double(out / o.groups * kernel.h * kernel.w));
    init::uniform_(bias, -bound, bound);
  }
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

}  // namespace frugal::nn
