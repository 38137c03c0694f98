// conv2d and its backward products: validation, output shapes, dispatch (Note [Convolution as GEMM]).
#include "tensor/ops/conv.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/matmul.h"

namespace frugal {

// Appended piece by piece: GCC 12's -Wrestrict misreads `"(" + std::string&&` (an insert at 0).
std::string Int2::str() const {
  std::string text = "(";
  text += std::to_string(h);
  text += ", ";
  text += std::to_string(w);
  text += ")";
  return text;
}

}  // namespace frugal

namespace frugal::ops {

namespace {

/// Note [Channels-last convolution]'s format for a convolution of `data` and `other`. cuDNN has no
/// float64 NHWC convolution ("no algorithm"): a float64 channels-last problem is computed NCHW
/// and its result converted, as PyTorch's cudnn_conv_suggest_memory_format keeps double NCHW.
OpLayout conv_layout(const Tensor& data, const Tensor& other) {
  OpLayout layout(data, other);
  if (data.dtype() == kFloat64) layout.native = false;
  return layout;
}

/// The settings every 2-D convolution checks: positive stride, dilation and groups, padding >= 0.
void check_settings(const char* op, Int2 stride, Int2 padding, Int2 dilation, int64_t groups) {
  FRUGAL_CHECK(stride.h > 0 && stride.w > 0, op, ": stride must be positive, got ", stride.str());
  FRUGAL_CHECK(dilation.h > 0 && dilation.w > 0, op, ": dilation must be positive, got ", dilation.str());
  FRUGAL_CHECK(padding.h >= 0 && padding.w >= 0, op, ": padding must be non-negative, got ", padding.str());
  FRUGAL_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
}

std::atomic<bool> g_cudnn_benchmark{false};

bool legacy_conv_from_environment() {
  const char* v = std::getenv("FRUGAL_CUDNN_LEGACY_CONV");
  return v != nullptr && std::string(v) == "1";
}
std::atomic<bool> g_cudnn_legacy_conv{legacy_conv_from_environment()};

std::string describe_or_undefined(const Tensor& t) { return t.defined() ? t.describe() : "undefined"; }

/// `t` is a floating tensor with `ref`'s dtype and device.
void check_like(const char* op, const char* what, const Tensor& t, const Tensor& ref, const char* ref_name) {
  FRUGAL_CHECK(t.defined(), op, ": ", what, " is undefined");
  FRUGAL_CHECK(is_floating(t.dtype()), op, ": expects floating-point tensors, got ", what, " ", t.describe());
  FRUGAL_CHECK(t.dtype() == ref.dtype(), op, ": ", what, " ", t.describe(), " and ", ref_name, " ", ref.describe(),
               " must have the same dtype");
  check_same_device(op, ref, t);
}

/// The output of a convolution whose every element is the bias (or zero): no input channels.
void fill_with_bias(const Tensor& out, const Tensor& bias) {
  if (bias.defined()) {
    copy_into(out, bias.reshape({1, bias.numel(), 1, 1}));
  } else {
    zero_(out);
  }
}

// Note [Patchify convolution]
// A convolution whose stride equals its kernel, without padding, dilation or groups (ViT's
// 16x16 / 16 patch embedding, ConvNeXt's 4x4 / 4 stem) reads every input pixel at most
// once: it is one GEMM of the non-overlapping patches laid out as rows,
//   (N OH OW, C R S) @ (C R S, K),
// in the weight's (C, R, S) order. cuDNN has no fast kernel for it on Hopper (ViT-B/16 at
// batch 128: 1.2 ms forward in its implicit-GEMM kernels, for a GEMM of 0.05 ms), so it runs
// as a copy that lays the patches out (the input's bytes once) and a cuBLAS GEMM; the
// backward products are the transposed GEMMs, and grad_x the inverse copy. Rows and columns
// past the last whole patch (H % R, W % S) are read by no output: their gradient is zero.
bool is_patchify(const Conv2dGeometry& g) {
  return g.groups == 1 && g.R * g.S > 1 && g.stride.h == g.R && g.stride.w == g.S && g.padding.h == 0 &&
         g.padding.w == 0 && g.dilation.h == 1 && g.dilation.w == 1;
}

/// x's whole patches, (N, C, OH R, OW S) viewed as (N, C, OH, R, OW, S).
Tensor patch_view(const Tensor& x, const Conv2dGeometry& g) {
  return x.narrow(2, 0, g.OH * g.R).narrow(3, 0, g.OW * g.S).view({g.N, g.C, g.OH, g.R, g.OW, g.S});
}

/// (N OH OW, C R S): one patch per row.
Tensor patch_rows(const Tensor& x, const Conv2dGeometry& g) {
  return patch_view(x, g).permute({0, 2, 4, 1, 3, 5}).reshape({g.N * g.OH * g.OW, g.C * g.R * g.S});
}

/// grad_out (N, K, OH, OW) as (N OH OW, K).
Tensor output_rows(const Tensor& grad_out, const Conv2dGeometry& g) {
  return grad_out.permute({0, 2, 3, 1}).reshape({g.N * g.OH * g.OW, g.K});
}

// The raw op may be handed tensors that require grad (autograd's conv2d calls it so): its
// views and copies go through detached handles, so they record no autograd nodes.
Tensor patchify_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dGeometry& g,
                        const OpLayout& layout) {
  const Tensor rows = linear(patch_rows(x.detach(), g), weight.detach().reshape({g.K, g.C * g.R * g.S}),
                             bias.defined() ? bias.detach() : bias);
  const Tensor nhwc = rows.view({g.N, g.OH, g.OW, g.K}).permute({0, 3, 1, 2});  // channels-last memory
  if (layout.native) return nhwc;
  Tensor out = layout.result(g.output_shape(), x.options());
  copy_into(out, nhwc);
  return layout.finish(out);
}

Tensor patchify_backward_input(const Tensor& grad_out, const Tensor& weight, const Conv2dGeometry& g,
                               const OpLayout& layout) {
  const Tensor rows = mm(output_rows(grad_out.detach(), g), weight.detach().reshape({g.K, g.C * g.R * g.S}));
  Tensor grad_x = layout.result(g.input_shape(), grad_out.options());
  if (g.H % g.R || g.W % g.S) zero_(grad_x);
  copy_into(patch_view(grad_x, g).permute({0, 2, 4, 1, 3, 5}), rows.view({g.N, g.OH, g.OW, g.C, g.R, g.S}));
  return layout.finish(grad_x);
}

Tensor patchify_backward_weight(const Tensor& grad_out, const Tensor& x, const Conv2dGeometry& g,
                                const OpLayout& layout) {
  const Tensor w = mm(output_rows(grad_out.detach(), g).t(), patch_rows(x.detach(), g));  // (K, C R S)
  Tensor grad_w = layout.result(g.weight_shape(), x.options());
  copy_into(grad_w, w.view(g.weight_shape()));
  return layout.finish(grad_w);
}

}  // namespace

Conv2dGeometry conv2d_geometry(const char* op, const Shape& xs, const Shape& ws, const Conv2dOptions& o) {
  FRUGAL_CHECK(xs.size() == 4, op, ": expected a 4-D input (N, C, H, W), got shape ", shape_str(xs));
  FRUGAL_CHECK(ws.size() == 4, op, ": expected a 4-D weight (out_channels, in_channels / groups, kH, kW), got shape ",
               shape_str(ws));
  check_settings(op, o.stride, o.padding, o.dilation, o.groups);
  Conv2dGeometry g;
  g.N = xs[0], g.C = xs[1], g.H = xs[2], g.W = xs[3];
  g.K = ws[0], g.R = ws[2], g.S = ws[3];
  g.stride = o.stride, g.padding = o.padding, g.dilation = o.dilation, g.groups = o.groups;
  FRUGAL_CHECK(g.C % g.groups == 0 && g.K % g.groups == 0, op, ": groups=", g.groups,
               " must divide both the input channels (", g.C, ", input ", shape_str(xs), ") and the output channels (",
               g.K, ", weight ", shape_str(ws), ")");
  FRUGAL_CHECK(ws[1] * g.groups == g.C, op, ": input ", shape_str(xs), " has ", g.C, " channels but weight ",
               shape_str(ws), " expects ", ws[1], " * groups (", g.groups, ") = ", ws[1] * g.groups);
  FRUGAL_CHECK(g.R > 0 && g.S > 0, op, ": the kernel must not be empty, weight ", shape_str(ws));
  const int64_t eff_r = o.dilation.h * (g.R - 1) + 1, eff_s = o.dilation.w * (g.S - 1) + 1;
  const int64_t ph = g.H + 2 * o.padding.h, pw = g.W + 2 * o.padding.w;
  FRUGAL_CHECK(eff_r <= ph && eff_s <= pw, op, ": kernel ", g.R, "x", g.S, " (", eff_r, "x", eff_s, " with dilation ",
               o.dilation.str(), ") is larger than the padded input ", ph, "x", pw, " (input ", shape_str(xs),
               ", padding ", o.padding.str(), ")");
  g.OH = (ph - eff_r) / o.stride.h + 1;
  g.OW = (pw - eff_s) / o.stride.w + 1;
  return g;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& options) {
  constexpr const char* op = "conv2d";
  FRUGAL_CHECK(x.defined() && weight.defined(), op, ": input ", describe_or_undefined(x), " and weight ",
               describe_or_undefined(weight), " must be defined");
  if (x.dim() == 3) return conv2d(x.unsqueeze(0), weight, bias, options).squeeze(0);  // unbatched (C, H, W)
  check_like(op, "input", x, x, "input");
  check_like(op, "weight", weight, x, "input");
  if (bias.defined()) {
    check_like(op, "bias", bias, x, "input");
    FRUGAL_CHECK(bias.dim() == 1 && weight.dim() >= 1 && bias.size(0) == weight.size(0), op, ": bias ", bias.describe(),
                 " must have shape [out_channels] for weight ", weight.describe());
  }
  Conv2dGeometry g = conv2d_geometry(op, x.sizes(), weight.sizes(), options);
  const OpLayout layout = conv_layout(x, weight);
  g.channels_last = layout.native;
  if (is_patchify(g) && g.C > 0 && g.N * g.K * g.OH * g.OW > 0) return patchify_forward(x, weight, bias, g, layout);
  Tensor out = layout.result(g.output_shape(), x.options());
  if (out.numel() == 0) return layout.finish(out);
  if (g.C == 0) {
    fill_with_bias(out, bias);
    return layout.finish(out);
  }
  FRUGAL_DEVICE_DISPATCH(op, x.device(), conv2d_kernel, out, layout.operand(x), layout.operand(weight),
                         bias.defined() ? bias.contiguous() : bias, g);
  return layout.finish(out);
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Shape& input_shape, const Tensor& weight,
                             const Conv2dOptions& options) {
  constexpr const char* op = "conv2d_backward_input";
  FRUGAL_CHECK(grad_out.defined() && weight.defined(), op, ": grad_out ", describe_or_undefined(grad_out),
               " and weight ", describe_or_undefined(weight), " must be defined");
  check_like(op, "grad_out", grad_out, grad_out, "grad_out");
  check_like(op, "weight", weight, grad_out, "grad_out");
  Conv2dGeometry g = conv2d_geometry(op, input_shape, weight.sizes(), options);
  FRUGAL_CHECK(grad_out.sizes() == g.output_shape(), op, ": grad_out ", grad_out.describe(),
               " must have the convolution's output shape ", shape_str(g.output_shape()));
  const OpLayout layout = conv_layout(grad_out, weight);
  g.channels_last = layout.native;
  if (is_patchify(g) && g.K > 0 && g.N * g.C * g.H * g.W > 0)
    return patchify_backward_input(grad_out, weight, g, layout);
  Tensor grad_x = layout.result(input_shape, grad_out.options());
  if (grad_x.numel() == 0) return layout.finish(grad_x);
  if (g.K == 0) {  // no output channel depends on the input
    zero_(grad_x);
    return layout.finish(grad_x);
  }
  FRUGAL_DEVICE_DISPATCH(op, grad_out.device(), conv2d_backward_input_kernel, grad_x, layout.operand(grad_out),
                         layout.operand(weight), g);
  return layout.finish(grad_x);
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dOptions& options) {
  constexpr const char* op = "conv2d_backward_weight";
  FRUGAL_CHECK(grad_out.defined() && x.defined(), op, ": grad_out ", describe_or_undefined(grad_out), " and input ",
               describe_or_undefined(x), " must be defined");
  check_like(op, "grad_out", grad_out, grad_out, "grad_out");
  check_like(op, "input", x, grad_out, "grad_out");
  Conv2dGeometry g = conv2d_geometry(op, x.sizes(), weight_shape, options);
  FRUGAL_CHECK(grad_out.sizes() == g.output_shape(), op, ": grad_out ", grad_out.describe(),
               " must have the convolution's output shape ", shape_str(g.output_shape()));
  const OpLayout layout = conv_layout(grad_out, x);
  g.channels_last = layout.native;
  if (is_patchify(g) && g.N > 0 && g.K * g.C > 0) return patchify_backward_weight(grad_out, x, g, layout);
  Tensor grad_w = layout.result(weight_shape, x.options());
  if (grad_w.numel() == 0) return layout.finish(grad_w);
  if (g.N == 0) {  // a sum over no samples
    zero_(grad_w);
    return layout.finish(grad_w);
  }
  FRUGAL_DEVICE_DISPATCH(op, x.device(), conv2d_backward_weight_kernel, grad_w, layout.operand(grad_out),
                         layout.operand(x), g);
  return layout.finish(grad_w);
}

Shape conv_transpose2d_output_shape(const char* op, const Shape& xs, const Shape& ws, const ConvTranspose2dOptions& o) {
  FRUGAL_CHECK(xs.size() == 4, op, ": expected a 4-D input (N, C_in, H, W), got shape ", shape_str(xs));
  FRUGAL_CHECK(ws.size() == 4, op, ": expected a 4-D weight (in_channels, out_channels / groups, kH, kW), got shape ",
               shape_str(ws));
  check_settings(op, o.stride, o.padding, o.dilation, o.groups);
  const Int2 op_pad = o.output_padding;
  FRUGAL_CHECK(op_pad.h >= 0 && op_pad.w >= 0 && (op_pad.h < o.stride.h || op_pad.h < o.dilation.h) &&
                   (op_pad.w < o.stride.w || op_pad.w < o.dilation.w),
               op, ": output_padding ", op_pad.str(), " must be non-negative and smaller than either stride ",
               o.stride.str(), " or dilation ", o.dilation.str(), " in each dim");
  FRUGAL_CHECK(xs[1] == ws[0], op, ": input ", shape_str(xs), " has ", xs[1], " channels but weight ", shape_str(ws),
               " expects ", ws[0],
               " (a transposed convolution's weight is (in_channels, out_channels / groups, kH, kW))");
  FRUGAL_CHECK(ws[0] % o.groups == 0, op, ": groups=", o.groups, " must divide the input channels (", ws[0],
               ", weight ", shape_str(ws), ")");
  FRUGAL_CHECK(ws[2] > 0 && ws[3] > 0, op, ": the kernel must not be empty, weight ", shape_str(ws));
  FRUGAL_CHECK(xs[2] > 0 && xs[3] > 0, op, ": the input image must not be empty (only N or C may be 0), got input ",
               shape_str(xs));
  const int64_t OH = (xs[2] - 1) * o.stride.h - 2 * o.padding.h + o.dilation.h * (ws[2] - 1) + op_pad.h + 1;
  const int64_t OW = (xs[3] - 1) * o.stride.w - 2 * o.padding.w + o.dilation.w * (ws[3] - 1) + op_pad.w + 1;
  FRUGAL_CHECK(OH > 0 && OW > 0, op, ": input ", shape_str(xs), " and weight ", shape_str(ws), " with stride ",
               o.stride.str(), ", padding ", o.padding.str(), ", dilation ", o.dilation.str(), " and output_padding ",
               op_pad.str(), " give an output of ", OH, "x", OW, ": it must be at least 1x1");
  return {xs[0], ws[1] * o.groups, OH, OW};
}

Int2 conv_transpose2d_input_padding(const ConvTranspose2dOptions& o) {
  return {o.output_padding.h / o.stride.h, o.output_padding.w / o.stride.w};
}

Tensor conv_transpose2d_padded_input(const Tensor& x, const ConvTranspose2dOptions& options) {
  const Int2 extra = conv_transpose2d_input_padding(options);
  if (extra == Int2(0)) return x;
  Tensor padded = zeros({x.size(0), x.size(1), x.size(2) + extra.h, x.size(3) + extra.w}, x.options());
  if (suggests_channels_last(x)) padded = to_channels_last(padded);
  copy_into(padded.narrow(2, 0, x.size(2)).narrow(3, 0, x.size(3)), x);
  return padded;
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose2dOptions& options) {
  constexpr const char* op = "conv_transpose2d";
  FRUGAL_CHECK(x.defined() && weight.defined(), op, ": input ", describe_or_undefined(x), " and weight ",
               describe_or_undefined(weight), " must be defined");
  if (x.dim() == 3) return conv_transpose2d(x.unsqueeze(0), weight, bias, options).squeeze(0);  // (C_in, H, W)
  check_like(op, "input", x, x, "input");
  check_like(op, "weight", weight, x, "input");
  const Shape ys = conv_transpose2d_output_shape(op, x.sizes(), weight.sizes(), options);
  if (bias.defined()) {
    check_like(op, "bias", bias, x, "input");
    FRUGAL_CHECK(bias.dim() == 1 && bias.size(0) == ys[1], op, ": bias ", bias.describe(),
                 " must have shape [out_channels] = [", ys[1], "] for weight ", weight.describe());
  }
  // Note [Transposed convolution]: the input gradient of the convolution of the output.
  Tensor out =
      conv2d_backward_input(conv_transpose2d_padded_input(x.detach(), options), ys, weight.detach(), options.conv());
  if (bias.defined() && out.numel() > 0) add_(out, bias.detach().view({1, ys[1], 1, 1}));
  return out;
}

void set_cudnn_benchmark(bool on) { g_cudnn_benchmark.store(on, std::memory_order_relaxed); }
bool cudnn_benchmark() { return g_cudnn_benchmark.load(std::memory_order_relaxed); }
void set_cudnn_legacy_conv(bool on) { g_cudnn_legacy_conv.store(on, std::memory_order_relaxed); }
bool cudnn_legacy_conv() { return g_cudnn_legacy_conv.load(std::memory_order_relaxed); }

}  // namespace frugal::ops
