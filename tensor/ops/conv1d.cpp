// conv1d and conv_transpose1d: checks in 1-D terms, then the 2-D ops (Note [1-D convolution as 2-D]).
#include "tensor/ops/conv1d.h"

#include <string>
#include <utility>

namespace frugal::ops {

namespace {

/// The checks both 1-D ops share: ranks, signs of the settings, a non-empty kernel.
void check_ranks_and_settings(const char* op, const Shape& xs, const Shape& ws, int64_t stride, int64_t padding,
                              int64_t dilation, int64_t groups, const char* weight_dims) {
  FRUGAL_CHECK(xs.size() == 3, op, ": expected a 3-D input (N, C, L), got shape ", shape_str(xs));
  FRUGAL_CHECK(ws.size() == 3, op, ": expected a 3-D weight ", weight_dims, ", got shape ", shape_str(ws));
  FRUGAL_CHECK(stride > 0, op, ": stride must be positive, got ", stride);
  FRUGAL_CHECK(dilation > 0, op, ": dilation must be positive, got ", dilation);
  FRUGAL_CHECK(padding >= 0, op, ": padding must be non-negative, got ", padding);
  FRUGAL_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  FRUGAL_CHECK(ws[2] > 0, op, ": the kernel must not be empty, weight ", shape_str(ws));
}

/// x with a 1-long height: (N, C, L) -> (N, C, 1, L); weights likewise.
Tensor as_image(const Tensor& t) { return t.defined() ? t.unsqueeze(-2) : t; }

}  // namespace

void check_conv1d_operands(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  FRUGAL_CHECK(x.defined(), op, ": the input is undefined");
  FRUGAL_CHECK(weight.defined(), op, ": the weight is undefined (input ", x.describe(), ")");
  const std::pair<const Tensor*, const char*> operands[] = {{&x, "input"}, {&weight, "weight"}, {&bias, "bias"}};
  for (const auto& [t, what] : operands) {
    if (!t->defined()) continue;
    FRUGAL_CHECK(is_floating(t->dtype()), op, ": expects floating-point tensors, got ", what, " ", t->describe());
    FRUGAL_CHECK(t->dtype() == x.dtype(), op, ": ", what, " ", t->describe(), " and input ", x.describe(),
                 " must have the same dtype");
    check_same_device(op, x, *t);
  }
}

int64_t conv1d_output_length(const char* op, const Shape& xs, const Shape& ws, const Conv1dOptions& o) {
  check_ranks_and_settings(op, xs, ws, o.stride, o.padding, o.dilation, o.groups,
                           "(out_channels, in_channels / groups, kW)");
  const int64_t C = xs[1], K = ws[0];
  FRUGAL_CHECK(C % o.groups == 0 && K % o.groups == 0, op, ": groups=", o.groups,
               " must divide both the input channels (", C, ", input ", shape_str(xs), ") and the output channels (", K,
               ", weight ", shape_str(ws), ")");
  FRUGAL_CHECK(ws[1] * o.groups == C, op, ": input ", shape_str(xs), " has ", C, " channels but weight ", shape_str(ws),
               " expects ", ws[1], " * groups (", o.groups, ") = ", ws[1] * o.groups);
  const int64_t span = o.dilation * (ws[2] - 1) + 1, padded = xs[2] + 2 * o.padding;
  FRUGAL_CHECK(span <= padded, op, ": kernel ", ws[2], " (", span, " with dilation ", o.dilation,
               ") is longer than the padded input ", padded, " (input ", shape_str(xs), ", padding ", o.padding, ")");
  return (padded - span) / o.stride + 1;
}

int64_t conv_transpose1d_output_length(const char* op, const Shape& xs, const Shape& ws,
                                       const ConvTranspose1dOptions& o) {
  check_ranks_and_settings(op, xs, ws, o.stride, o.padding, o.dilation, o.groups,
                           "(in_channels, out_channels / groups, kW)");
  FRUGAL_CHECK(o.output_padding >= 0 && (o.output_padding < o.stride || o.output_padding < o.dilation), op,
               ": output_padding ", o.output_padding, " must be non-negative and smaller than either stride ", o.stride,
               " or dilation ", o.dilation);
  FRUGAL_CHECK(xs[1] == ws[0], op, ": input ", shape_str(xs), " has ", xs[1], " channels but weight ", shape_str(ws),
               " expects ", ws[0], " (a transposed convolution's weight is (in_channels, out_channels / groups, kW))");
  FRUGAL_CHECK(ws[0] % o.groups == 0, op, ": groups=", o.groups, " must divide the input channels (", ws[0],
               ", weight ", shape_str(ws), ")");
  FRUGAL_CHECK(xs[2] > 0, op, ": the input signal must not be empty (only N or C may be 0), got input ", shape_str(xs));
  const int64_t OL = (xs[2] - 1) * o.stride - 2 * o.padding + o.dilation * (ws[2] - 1) + o.output_padding + 1;
  FRUGAL_CHECK(OL > 0, op, ": input ", shape_str(xs), " and weight ", shape_str(ws), " with stride ", o.stride,
               ", padding ", o.padding, ", dilation ", o.dilation, " and output_padding ", o.output_padding,
               " give an output of length ", OL, ": it must be at least 1");
  return OL;
}

// The raw ops may be handed tensors that require grad: their views go through detached
// handles, so they record no autograd nodes.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv1dOptions& options) {
  check_conv1d_operands("conv1d", x, weight, bias);
  const Tensor xd = x.detach(), b = bias.defined() ? bias.detach() : bias;
  if (x.dim() == 2) return conv1d(xd.unsqueeze(0), weight, b, options).squeeze(0);  // unbatched (C, L)
  conv1d_output_length("conv1d", x.sizes(), weight.sizes(), options);
  return conv2d(as_image(xd), as_image(weight.detach()), b, options.as_2d()).squeeze(-2);
}

Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose1dOptions& options) {
  check_conv1d_operands("conv_transpose1d", x, weight, bias);
  const Tensor xd = x.detach(), b = bias.defined() ? bias.detach() : bias;
  if (x.dim() == 2) return conv_transpose1d(xd.unsqueeze(0), weight, b, options).squeeze(0);  // (C_in, L)
  conv_transpose1d_output_length("conv_transpose1d", x.sizes(), weight.sizes(), options);
  return conv_transpose2d(as_image(xd), as_image(weight.detach()), b, options.as_2d()).squeeze(-2);
}

}  // namespace frugal::ops
