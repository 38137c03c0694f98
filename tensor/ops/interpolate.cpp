// interpolate's front-end: validation, output size (Note [Interpolation source indices]), dispatch
// ('area' to adaptive_avg_pool2d).
#include "tensor/ops/interpolate.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/pool.h"  // adaptive_avg_pool2d: 'area'

namespace frugal {

const char* interpolate_mode_name(InterpolateMode mode) {
  switch (mode) {
    case InterpolateMode::Nearest: return "nearest";
    case InterpolateMode::Bilinear: return "bilinear";
    case InterpolateMode::Bicubic: return "bicubic";
    case InterpolateMode::NearestExact: return "nearest-exact";
    case InterpolateMode::Area: return "area";
    case InterpolateMode::Linear: return "linear";
  }
  return "unknown";
}

namespace {
constexpr InterpolateMode kModes[] = {InterpolateMode::Nearest, InterpolateMode::Bilinear,
                                      InterpolateMode::Bicubic, InterpolateMode::NearestExact,
                                      InterpolateMode::Area,    InterpolateMode::Linear};
constexpr const char* kModeList = "'nearest', 'linear', 'bilinear', 'bicubic', 'nearest-exact' or 'area'";
}  // namespace

InterpolateMode interpolate_mode(std::string_view name, const char* op) {
  for (InterpolateMode m : kModes)
    if (name == interpolate_mode_name(m)) return m;
  FRUGAL_FAIL(op, ": unknown mode '", name, "' (expected ", kModeList,
              "; 'trilinear' is for 5-D inputs, which are not implemented)");
}

namespace {
/// A double as Python's repr writes it: the shortest text that reads back, "2.0" not "2".
std::string python_float(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, r.ptr);
  if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}
}  // namespace

std::string Scale2::str() const {
  if (h == w) return python_float(h);
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "(" + string&&.
  std::string s = "(";
  s += python_float(h);
  s += ", ";
  s += python_float(w);
  return s + ")";
}

void check_interpolate_options(const InterpolateOptions& o, const char* op) {
  FRUGAL_CHECK(std::find(std::begin(kModes), std::end(kModes), o.mode) != std::end(kModes), op, ": unknown mode ",
               int(o.mode), " (expected ", kModeList, ")");
  FRUGAL_CHECK(o.size.has_value() != o.scale_factor.has_value(), op, ": exactly one of size and scale_factor must be ",
               "given, got ", o.size ? "size=" + o.size->str() : "neither",
               o.scale_factor ? " and scale_factor=" + o.scale_factor->str() : "");
  FRUGAL_CHECK(interpolates(o.mode) || !o.align_corners.has_value(), op,
               ": align_corners can only be set with the interpolating modes (linear, bilinear, bicubic), not with ",
               interpolate_mode_name(o.mode));
  FRUGAL_CHECK(!o.size || (o.size->h > 0 && o.size->w > 0), op, ": size must be positive, got ", o.size->str());
  FRUGAL_CHECK(!o.scale_factor || (std::isfinite(o.scale_factor->h) && std::isfinite(o.scale_factor->w) &&
                                   o.scale_factor->h > 0 && o.scale_factor->w > 0),
               op, ": scale_factor must be positive and finite, got ", o.scale_factor->str());
}

}  // namespace frugal

namespace frugal::ops {

namespace {

/// Whether `in` is a 1-D signal (N, C, L) (Note [1-D interpolation as 2-D]).
bool is_signal(const Shape& in) { return in.size() == 3; }

/// The checked geometry of resizing an input of shape `in`: (N, C, H, W), or (N, C, L) as
/// (N, C, 1, L) with 'linear' as 'bilinear'.
InterpolateGeometry interpolate_geometry(const char* op, const Shape& in, const InterpolateOptions& o) {
  FRUGAL_CHECK(in.size() == 3 || in.size() == 4, op, ": expected a 3-D (N, C, L) or 4-D (N, C, H, W) input, got ",
               shape_str(in), " (5-D resizing is not implemented)");
  check_interpolate_options(o, op);
  const bool signal = is_signal(in);
  const bool mode_fits = signal ? o.mode != InterpolateMode::Bilinear && o.mode != InterpolateMode::Bicubic
                                : o.mode != InterpolateMode::Linear;
  FRUGAL_CHECK(mode_fits, op, ": mode '", interpolate_mode_name(o.mode), "' needs a ", signal ? "4-D" : "3-D",
               " input, got ", shape_str(in),
               signal ? " ('linear' resizes 3-D inputs)" : " ('bilinear' resizes 4-D inputs)");
  if (signal) {
    FRUGAL_CHECK(!o.size || o.size->h == o.size->w, op, ": a 3-D input takes one size, got ", o.size->str());
    FRUGAL_CHECK(!o.scale_factor || o.scale_factor->h == o.scale_factor->w, op,
                 ": a 3-D input takes one scale_factor, got ", o.scale_factor->str());
  }
  const int64_t H = signal ? 1 : in[2], W = in.back();
  FRUGAL_CHECK(H > 0 && W > 0, op, ": the input's ", signal ? "length" : "height and width", " must be non-zero, got ",
               shape_str(in));
  InterpolateGeometry g;
  g.P = in[0] * in[1], g.H = H, g.W = W;
  g.mode = o.mode == InterpolateMode::Linear ? InterpolateMode::Bilinear : o.mode;
  g.align_corners = o.align_corners.value_or(false);
  if (o.size) {
    g.OH = signal ? 1 : o.size->h, g.OW = o.size->w;
  } else {
    const Scale2 s = *o.scale_factor;
    // PyTorch's compute_output_size: floor(in * scale), in double.
    const double oh = signal ? 1.0 : std::floor(double(g.H) * s.h), ow = std::floor(double(g.W) * s.w);
    FRUGAL_CHECK(oh >= 1 && ow >= 1 && oh < 9.0e15 && ow < 9.0e15, op, ": scale_factor ", s.str(),
                 " gives an output size of ", oh, "x", ow, " for input ", shape_str(in), "; it must be at least 1x1");
    g.OH = int64_t(oh), g.OW = int64_t(ow);
    if (!o.recompute_scale_factor) g.scale_h = signal ? 0.0 : s.h, g.scale_w = s.w;
  }
  // 'nearest' and 'bilinear' copy a dim whose size does not change, whatever the scale; the
  // other modes keep it (Note [Interpolation source indices]).
  if (g.mode == InterpolateMode::Nearest || g.mode == InterpolateMode::Bilinear) {  // (linear too)
    if (g.OH == g.H) g.scale_h = 0;
    if (g.OW == g.W) g.scale_w = 0;
  }
  return g;
}

/// The (N, C, oh, ow) of an image's resize; a signal's (N, C, ow).
Shape with_plane(const Shape& in, int64_t oh, int64_t ow) {
  return is_signal(in) ? Shape{in[0], in[1], ow} : Shape{in[0], in[1], oh, ow};
}

void check_floating(const char* op, const char* what, const Tensor& t) {
  FRUGAL_CHECK(t.defined(), op, ": ", what, " is undefined");
  FRUGAL_CHECK(is_floating(t.dtype()), op, ": expects a floating-point ", what, ", got ", t.describe());
}

/// t's layout, computed natively channels-last by both backends' kernels (not only CUDA's).
OpLayout native_layout(const Tensor& t) {
  OpLayout layout(t);
  layout.native = layout.channels_last;
  return layout;
}

/// Native channels-last; `in` is the (N, C, H, W) input shape.
void describe_layout(InterpolateGeometry& g, const OpLayout& layout, const Shape& in) {
  g.channels_last = layout.native;
  if (layout.native) g.C = in[1];
}

}  // namespace

Shape interpolate_output_shape(const Shape& input_shape, const InterpolateOptions& options, const char* op) {
  const InterpolateGeometry g = interpolate_geometry(op, input_shape, options);
  return with_plane(input_shape, g.OH, g.OW);
}

namespace {

/// The image x (N, C, H, W) resized as g says.
Tensor resize_image(const Tensor& x, InterpolateGeometry g) {
  if (g.mode == InterpolateMode::Area) return adaptive_avg_pool2d(x, {g.OH, g.OW});
  const OpLayout layout = native_layout(x);
  describe_layout(g, layout, x.sizes());
  Tensor out = layout.result({x.size(0), x.size(1), g.OH, g.OW}, x.options());
  if (g.P == 0) return out;
  FRUGAL_DEVICE_DISPATCH("interpolate", x.device(), interpolate_kernel, out, layout.operand(x), g);
  return layout.finish(out);
}

/// resize_image's gradient: grad_out (N, C, OH, OW) to the image's shape.
Tensor resize_image_backward(const Tensor& grad_out, const Shape& image_shape, InterpolateGeometry g) {
  if (g.mode == InterpolateMode::Area) return adaptive_avg_pool2d_backward(grad_out, image_shape);
  const OpLayout layout = native_layout(grad_out);  // grad_x follows grad_out's layout, as every backward's
  describe_layout(g, layout, image_shape);
  Tensor grad_x = layout.result(image_shape, grad_out.options());
  if (g.P == 0) return grad_x;
  FRUGAL_DEVICE_DISPATCH("interpolate_backward", grad_out.device(), interpolate_backward_kernel, grad_x,
                         layout.operand(grad_out), g);
  return layout.finish(grad_x);
}

}  // namespace

Tensor interpolate(const Tensor& x, const InterpolateOptions& options) {
  constexpr const char* op = "interpolate";
  check_floating(op, "input", x);
  const InterpolateGeometry g = interpolate_geometry(op, x.sizes(), options);
  // A signal is the one-row image (N, C, 1, L) (Note [1-D interpolation as 2-D]).
  if (is_signal(x.sizes())) return resize_image(x.unsqueeze(2), g).squeeze(2).contiguous();
  return resize_image(x, g);
}

Tensor interpolate_backward(const Tensor& grad_out, const Shape& input_shape, const InterpolateOptions& options) {
  constexpr const char* op = "interpolate_backward";
  check_floating(op, "grad_out", grad_out);
  const InterpolateGeometry g = interpolate_geometry(op, input_shape, options);
  const Shape os = with_plane(input_shape, g.OH, g.OW);
  FRUGAL_CHECK(grad_out.sizes() == os, op, ": grad_out ", grad_out.describe(), " must have the output shape ",
               shape_str(os), " of input ", shape_str(input_shape));
  if (is_signal(input_shape)) {
    const Shape image{input_shape[0], input_shape[1], 1, input_shape[2]};
    return resize_image_backward(grad_out.unsqueeze(2), image, g).squeeze(2).contiguous();
  }
  return resize_image_backward(grad_out, input_shape, g);
}

}  // namespace frugal::ops
