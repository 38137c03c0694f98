#pragma once
// Resizing (N, C, H, W) images, as torch.nn.functional.interpolate's 'nearest' and
// 'bilinear' modes, forward and backward (raw ops; the differentiable form is in
// autograd/ops/interpolate.h).
//
// Note [Interpolation source indices]
// Every plane (one sample, one channel) resizes on its own, each dim on its own: output
// row oh reads input rows chosen by the same rule as output column ow reads columns.
// The output size is `size`, or floor(in * scale_factor) when scale_factor is given.
// The rules are PyTorch's CPU kernels' (aten/src/ATen/native/UpSample.h), float math and
// all, so frugal picks torch's source pixels at the boundaries. A dim whose size does not
// change copies (src = o) in both modes whatever scale_factor says (the front-end drops its
// scale, so s = in / out = 1), as torch's CPU does.
//  - 'nearest' (legacy, not 'nearest-exact'): src = min(floor(o * s), in - 1), s = 1 /
//    scale_factor if given (recompute_scale_factor unset), else in / out, each rounded to
//    float, product in float; out == 2 in halves (src = o >> 1). torch's CUDA kernels lack
//    these shortcuts, so torch's two backends can differ; frugal's agree with its CPU.
//  - 'bilinear' (area_pixel_compute_source_index): with align_corners, s = (in - 1) /
//    (out - 1) (0 when out == 1) and src = s * o; without, s as for 'nearest' and
//    src = max(s * (o + 0.5) - 0.5, 0). Then i0 = floor(src), i1 = i0 + 1 clamped to
//    in - 1, l1 = src - i0, l0 = 1 - l1, and the output is
//      l0h (l0w x[i0h, i0w] + l1w x[i0h, i1w]) + l1h (l0w x[i1h, i0w] + l1w x[i1h, i1w]),
//    all in opmath_t (float for float32/16-bit, double for float64), as PyTorch's accscalar_t.
// The backward adds each output's gradient into the pixels it read, with the same weights.
// Both backends accumulate one pixel's contributions in output order (oh, then ow, then
// the taps in the order above) in opmath_t and round once, so the result does not depend
// on the thread count or schedule: the CPU scatters into a per-plane accumulator (a plane
// per thread), the CUDA kernel gathers (a thread per input pixel finds by binary search the
// outputs whose source it is: the source index is monotone in o), with no atomics.
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include "tensor/half.h"
#include "tensor/ops/conv.h"  // Int2
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.interpolate's modes (for 4-D input).
enum class InterpolateMode { Nearest, Bilinear };

/// "nearest" or "bilinear", as PyTorch spells the mode.
const char* interpolate_mode_name(InterpolateMode mode);
/// The mode PyTorch spells `name`; throws naming `op` and the modes for any other name
/// ("bicubic", "area", "nearest-exact" are not implemented).
InterpolateMode interpolate_mode(std::string_view name, const char* op = "interpolate");

/// A scale factor per spatial dim; one value means (v, v).
struct Scale2 {
  double h = 0, w = 0;
  constexpr Scale2() = default;
  constexpr Scale2(double v) : h(v), w(v) {}  // NOLINT: implicit, so a scalar means (v, v)
  constexpr Scale2(double h_, double w_) : h(h_), w(w_) {}
  friend constexpr bool operator==(const Scale2&, const Scale2&) = default;
  /// "2.0" for (2, 2), "(1.5, 2.0)" otherwise, as PyTorch prints them.
  std::string str() const;
};

/// torch.nn.functional.interpolate's settings: exactly one of size and scale_factor.
struct InterpolateOptions {
  std::optional<Int2> size = std::nullopt;            // the output's (H, W)
  std::optional<Scale2> scale_factor = std::nullopt;  // output size floor(in * scale_factor)
  InterpolateMode mode = InterpolateMode::Nearest;
  std::optional<bool> align_corners = std::nullopt;  // bilinear only (default false); torch refuses it with nearest
  /// true: the kernels use in / out as the scale, as if `size` had been given (PyTorch's
  /// recompute_scale_factor=True); false: 1 / scale_factor.
  bool recompute_scale_factor = false;
};

}  // namespace frugal

namespace frugal::ops {

/// The sizes of one resize: P = N * C planes of (H, W) resized to (OH, OW). scale_h and
/// scale_w are the scale factors the kernels divide by (PyTorch's scales_h/w), 0 when
/// the scale is in / out. channels_last (CUDA only): every operand is an (N, C, H, W)
/// tensor in channels-last memory, and C is set (it stays 1 otherwise).
struct InterpolateGeometry {
  int64_t P = 0, C = 1, H = 0, W = 0, OH = 0, OW = 0;
  double scale_h = 0, scale_w = 0;
  InterpolateMode mode = InterpolateMode::Nearest;
  bool align_corners = false;
  bool channels_last = false;
};

/// torch.nn.functional.interpolate(x, size | scale_factor, mode, align_corners): x (N, C, H, W),
/// floating, any layout (channels-last in, channels-last out). See Note [Interpolation source indices].
Tensor interpolate(const Tensor& x, const InterpolateOptions& options);
/// The gradient of interpolate: grad_out (N, C, OH, OW) -> grad_x of `input_shape`.
Tensor interpolate_backward(const Tensor& grad_out, const Shape& input_shape, const InterpolateOptions& options);
/// The output shape interpolate gives an input of `input_shape`, after checking the options.
Shape interpolate_output_shape(const Shape& input_shape, const InterpolateOptions& options,
                               const char* op = "interpolate");

// ---- source indices shared by the CPU and CUDA kernels (Note [Interpolation source indices]) ----

/// 'nearest': the input index output o reads (UpSample.h's nearest_idx).
FRUGAL_HD int64_t nearest_source(int64_t o, int64_t in, int64_t out, double scale) {
  if (out == in) return o;
  if (out == 2 * in) return o >> 1;
  const float s = scale > 0 ? float(1.0 / scale) : float(in) / float(out);
  const int64_t src = int64_t(floorf(float(o) * s));
  return src < in - 1 ? src : in - 1;
}

/// 'bilinear': the scale of one dim in Acc (area_pixel_compute_scale).
template <typename Acc>
FRUGAL_HD Acc linear_scale(int64_t in, int64_t out, bool align_corners, double scale) {
  if (align_corners) return out > 1 ? Acc(in - 1) / Acc(out - 1) : Acc(0);
  return scale > 0 ? Acc(1.0 / scale) : Acc(in) / Acc(out);
}

/// The two input indices output o of one dim reads and their weights.
template <typename Acc>
struct LinearTaps {
  int64_t i0, i1;
  Acc l0, l1;
};

/// 'bilinear': output o's taps along one dim of `in` (area_pixel_compute_source_index), s
/// from linear_scale.
template <typename Acc>
FRUGAL_HD LinearTaps<Acc> linear_taps(int64_t o, int64_t in, Acc s, bool align_corners) {
  Acc src = align_corners ? s * Acc(o) : s * (Acc(o) + Acc(0.5)) - Acc(0.5);
  if (src < Acc(0)) src = Acc(0);
  LinearTaps<Acc> t;
  t.i0 = int64_t(src);  // floor: src >= 0
  if (t.i0 > in - 1) t.i0 = in - 1;
  t.i1 = t.i0 < in - 1 ? t.i0 + 1 : t.i0;
  t.l1 = src - Acc(t.i0);
  t.l0 = Acc(1) - t.l1;
  return t;
}

}  // namespace frugal::ops

// Backend kernels. Every tensor is contiguous and viewed as (P, H, W) / (P, OH, OW), or
// channels-last when g.channels_last (CUDA only); the front-end has handled empty tensors.
namespace frugal::ops::cpu {
/// out: (P, OH, OW); x: (P, H, W)
void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g);
/// grad_x: (P, H, W); grad_out: (P, OH, OW)
void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
/// out: (P, OH, OW) or (N, OH, OW, C); x: (P, H, W) or (N, H, W, C)
void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g);
/// grad_x: (P, H, W) or (N, H, W, C); grad_out: (P, OH, OW) or (N, OH, OW, C)
void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g);
}  // namespace frugal::ops::cuda
