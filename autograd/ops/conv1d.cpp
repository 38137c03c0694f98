// conv1d and conv_transpose1d through the 2-D differentiable ops (Note [1-D convolution as 2-D]).
#include "autograd/ops/conv1d.h"

#include "autograd/autocast.h"
#include "autograd/ops/conv.h"

namespace frugal {

namespace {

Tensor as_image(const Tensor& t) { return t.defined() ? t.unsqueeze(-2) : t; }

}  // namespace

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& options) {
  if (auto c = autocast::cast_inputs(autocast::Policy::Lower, {&x, &weight, &bias}))  // conv2d's policy
    return conv1d((*c)[0], (*c)[1], (*c)[2], options);
  ops::check_conv1d_operands("conv1d", x, weight, bias);
  if (x.dim() == 2) return conv1d(x.unsqueeze(0), weight, bias, options).squeeze(0);  // unbatched (C, L)
  ops::conv1d_output_length("conv1d", x.sizes(), weight.sizes(), options);            // the errors in 1-D terms
  return conv2d(as_image(x), as_image(weight), bias, options.as_2d()).squeeze(-2);
}

Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose1dOptions& options) {
  if (auto c = autocast::cast_inputs(autocast::Policy::Lower, {&x, &weight, &bias}))
    return conv_transpose1d((*c)[0], (*c)[1], (*c)[2], options);
  ops::check_conv1d_operands("conv_transpose1d", x, weight, bias);
  if (x.dim() == 2) return conv_transpose1d(x.unsqueeze(0), weight, bias, options).squeeze(0);  // (C_in, L)
  ops::conv_transpose1d_output_length("conv_transpose1d", x.sizes(), weight.sizes(), options);
  return conv_transpose2d(as_image(x), as_image(weight), bias, options.as_2d()).squeeze(-2);
}

}  // namespace frugal
