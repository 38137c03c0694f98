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

}  // namespace frugal::nn
