// Pooling front-ends: validation, output sizes (Note [Pooling windows]), dispatch.
#include "tensor/ops/pool.h"

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"

namespace frugal::ops {

namespace {

/// Checks a pooling input's rank (3 or 4) and its non-empty plane; returns P = product of leading dims.
int64_t check_pool_shape(const char* op, const Shape& s, const std::string& what) {
  FRUGAL_CHECK(s.size() == 3 || s.size() == 4, op, ": expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got ", what);
  FRUGAL_CHECK(s[s.size() - 2] > 0 && s[s.size() - 1] > 0, op, ": the input's height and width must be non-zero, got ",
               what);
  return s.size() == 4 ? s[0] * s[1] : s[0];
}

void check_floating(const char* op, const char* what, const Tensor& t) {
  FRUGAL_CHECK(t.defined(), op, ": ", what, " is undefined");
  FRUGAL_CHECK(is_floating(t.dtype()), op, ": expects a floating-point ", what, ", got ", t.describe());
}

/// Output size along one dim (Note [Pooling windows]).
Pool2dGeometry window_geometry(const char* op, const Shape& in, Int2 kernel, Int2 stride, Int2 padding, Int2 dilation,
                               bool ceil_mode) {
  Pool2dGeometry g;
  g.P = check_pool_shape(op, in, shape_str(in));
  g.H = in[in.size() - 2], g.W = in[in.size() - 1];
  FRUGAL_CHECK(kernel.h > 0 && kernel.w > 0, op, ": kernel size must be positive, got ", kernel.str());
  FRUGAL_CHECK(stride.h > 0 && stride.w > 0, op, ": stride must be positive, got ", stride.str());
  FRUGAL_CHECK(dilation.h > 0 && dilation.w > 0, op, ": dilation must be positive, got ", dilation.str());
  const Int2 eff{dilation.h * (kernel.h - 1) + 1, dilation.w * (kernel.w - 1) + 1};
  FRUGAL_CHECK(padding.h >= 0 && padding.w >= 0 && padding.h <= eff.h / 2 && padding.w <= eff.w / 2, op,
               ": padding must be between 0 and half the kernel size, got padding ", padding.str(), " for kernel ",
               kernel.str(), (dilation == Int2(1) ? "" : " dilated " + dilation.str()));
  g.kernel = kernel, g.stride = stride, g.padding = padding, g.dilation = dilation;
  g.OH = pooled_size(g.H, kernel.h, stride.h, padding.h, dilation.h, ceil_mode);
  g.OW = pooled_size(g.W, kernel.w, stride.w, padding.w, dilation.w, ceil_mode);
  FRUGAL_CHECK(g.OH > 0 && g.OW > 0, op, ": input ", shape_str(in), " is too small for kernel ", kernel.str(),
               " with padding ", padding.str(), ", dilation ", dilation.str(), ": output size ", g.OH, "x", g.OW);
  return g;
}

Pool2dGeometry max_geometry(const char* op, const Shape& in, Int2 kernel, const MaxPool2dOptions& o) {
  return window_geometry(op, in, kernel, pool_stride(o.stride, kernel), o.padding, o.dilation, o.ceil_mode);
}

Pool2dGeometry avg_geometry(const char* op, const Shape& in, Int2 kernel, const AvgPool2dOptions& o) {
  Pool2dGeometry g = window_geometry(op, in, kernel, pool_stride(o.stride, kernel), o.padding, Int2(1), o.ceil_mode);
  g.count_include_pad = o.count_include_pad;
  return g;
}

Shape with_plane(const Shape& in, int64_t oh, int64_t ow) {
  Shape s = in;
  s[s.size() - 2] = oh, s[s.size() - 1] = ow;
  return s;
}

/// Tells the pooling kernels the layout: native channels-last on CUDA (Note [NHWC
/// pooling] in tensor/cuda/pool.cu); `in` is the (N, C, H, W) input shape.
void describe_layout(Pool2dGeometry& g, const OpLayout& layout, const Shape& in) {
  g.channels_last = layout.native;
  if (layout.native) g.C = in[1];
}

/// grad_out is floating, has the expected output shape, and lives on `device`.
void check_grad_out(const char* op, const Tensor& grad_out, const Shape& expected) {
  check_floating(op, "grad_out", grad_out);
  FRUGAL_CHECK(grad_out.sizes() == expected, op, ": grad_out ", grad_out.describe(),
               " must have the pooling's output shape ", shape_str(expected));
}

}  // namespace

int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;  // floor division
  if (ceil_mode && (out - 1) * s >= in + p) --out;                 // the last window starts in the padding
  return out;
}

MaxPool2dResult max_pool2d(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options) {
  constexpr const char* op = "max_pool2d";
  check_floating(op, "input", x);
  Pool2dGeometry g = max_geometry(op, x.sizes(), kernel, options);
  const OpLayout layout(x);
  describe_layout(g, layout, x.sizes());
  const Shape os = with_plane(x.sizes(), g.OH, g.OW);
  MaxPool2dResult r{layout.result(os, x.options()), layout.result(os, {kInt64, x.device()})};
  if (g.P == 0) return r;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), max_pool2d_kernel, r.out, r.indices, layout.operand(x), g);
  return {layout.finish(r.out), layout.finish(r.indices)};
}

Tensor max_pool2d_values(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options) {
  constexpr const char* op = "max_pool2d";
  check_floating(op, "input", x);
  Pool2dGeometry g = max_geometry(op, x.sizes(), kernel, options);
  const OpLayout layout(x);
  describe_layout(g, layout, x.sizes());
  Tensor out = layout.result(with_plane(x.sizes(), g.OH, g.OW), x.options());
  if (g.P == 0) return out;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), max_pool2d_kernel, out, Tensor(), layout.operand(x), g);
  return layout.finish(out);
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape, Int2 kernel,
                           const MaxPool2dOptions& options) {
  constexpr const char* op = "max_pool2d_backward";
  Pool2dGeometry g = max_geometry(op, input_shape, kernel, options);
  const Shape os = with_plane(input_shape, g.OH, g.OW);
  check_grad_out(op, grad_out, os);
  FRUGAL_CHECK(indices.defined() && indices.dtype() == kInt64 && indices.sizes() == os, op, ": indices ",
               indices.defined() ? indices.describe() : "undefined", " must be int64 of the output shape ",
               shape_str(os));
  check_same_device(op, grad_out, indices);
  const OpLayout layout(grad_out);
  describe_layout(g, layout, input_shape);
  Tensor grad_x = layout.result(input_shape, grad_out.options());
  if (g.P == 0) return grad_x;
  FRUGAL_DEVICE_DISPATCH(op, grad_out.device(), max_pool2d_backward_kernel, grad_x, layout.operand(grad_out),
                         layout.operand(indices), g);
  return layout.finish(grad_x);
}

Tensor max_pool2d_backward_from_input(const Tensor& grad_out, const Tensor& x, Int2 kernel,
                                      const MaxPool2dOptions& options) {
  constexpr const char* op = "max_pool2d_backward";
  check_floating(op, "input", x);
  Pool2dGeometry g = max_geometry(op, x.sizes(), kernel, options);
  check_grad_out(op, grad_out, with_plane(x.sizes(), g.OH, g.OW));
  FRUGAL_CHECK(grad_out.dtype() == x.dtype(), op, ": grad_out ", grad_out.describe(), " and input ", x.describe(),
               " must have the same dtype");
  check_same_device(op, grad_out, x);
  const OpLayout layout(grad_out);  // grad_x follows grad_out's layout, as every backward's
  describe_layout(g, layout, x.sizes());
  Tensor grad_x = layout.result(x.sizes(), grad_out.options());
  if (g.P == 0) return grad_x;
  FRUGAL_DEVICE_DISPATCH(op, grad_out.device(), max_pool2d_backward_from_input_kernel, grad_x, layout.operand(grad_out),
                         layout.operand(x), g);
  return layout.finish(grad_x);
}

Tensor avg_pool2d(const Tensor& x, Int2 kernel, const AvgPool2dOptions& options) {
  constexpr const char* op = "avg_pool2d";
  check_floating(op, "input", x);
  Pool2dGeometry g = avg_geometry(op, x.sizes(), kernel, options);
  const OpLayout layout(x);
  describe_layout(g, layout, x.sizes());
  Tensor out = layout.result(with_plane(x.sizes(), g.OH, g.OW), x.options());
  if (g.P == 0) return out;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), avg_pool2d_kernel, out, layout.operand(x), g);
  return layout.finish(out);
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, Int2 kernel,
                           const AvgPool2dOptions& options) {
  constexpr const char* op = "avg_pool2d_backward";
  Pool2dGeometry g = avg_geometry(op, input_shape, kernel, options);
  check_grad_out(op, grad_out, with_plane(input_shape, g.OH, g.OW));
  const OpLayout layout(grad_out);
  describe_layout(g, layout, input_shape);
  Tensor grad_x = layout.result(input_shape, grad_out.options());
  if (g.P == 0) return grad_x;
  FRUGAL_DEVICE_DISPATCH(op, grad_out.device(), avg_pool2d_backward_kernel, grad_x, layout.operand(grad_out), g);
  return layout.finish(grad_x);
}

namespace {
Pool2dGeometry adaptive_geometry(const char* op, const Shape& in, Int2 output_size) {
  Pool2dGeometry g;
  g.P = check_pool_shape(op, in, shape_str(in));
  g.H = in[in.size() - 2], g.W = in[in.size() - 1];
  FRUGAL_CHECK(output_size.h > 0 && output_size.w > 0, op, ": output size must be positive, got ", output_size.str());
  g.OH = output_size.h, g.OW = output_size.w;
  return g;
}
}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size) {
  constexpr const char* op = "adaptive_avg_pool2d";
  check_floating(op, "input", x);
  Pool2dGeometry g = adaptive_geometry(op, x.sizes(), output_size);
  const OpLayout layout(x);
  describe_layout(g, layout, x.sizes());
  Tensor out = layout.result(with_plane(x.sizes(), g.OH, g.OW), x.options());
  if (g.P == 0) return out;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), adaptive_avg_pool2d_kernel, out, layout.operand(x), g);
  return layout.finish(out);
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape) {
  constexpr const char* op = "adaptive_avg_pool2d_backward";
  check_floating(op, "grad_out", grad_out);
  FRUGAL_CHECK(grad_out.dim() >= 2, op, ": grad_out ", grad_out.describe(), " must be at least 2-D");
  Pool2dGeometry g = adaptive_geometry(op, input_shape, {grad_out.size(-2), grad_out.size(-1)});
  check_grad_out(op, grad_out, with_plane(input_shape, g.OH, g.OW));
  const OpLayout layout(grad_out);
  describe_layout(g, layout, input_shape);
  Tensor grad_x = layout.result(input_shape, grad_out.options());
  if (g.P == 0) return grad_x;
  FRUGAL_DEVICE_DISPATCH(op, grad_out.device(), adaptive_avg_pool2d_backward_kernel, grad_x, layout.operand(grad_out),
                         g);
  return layout.finish(grad_x);
}

}  // namespace frugal::ops
