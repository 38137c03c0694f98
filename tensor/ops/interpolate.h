#pragma once
// Resizing (N, C, H, W) images, as torch.nn.functional.interpolate's 'nearest', 'bilinear',
// 'bicubic', 'nearest-exact' and 'area' modes, and (N, C, L) signals with 'nearest', 'linear',
// 'nearest-exact' and 'area', forward and backward (raw ops; the differentiable form is in
// autograd/ops/interpolate.h).
//
// Note [1-D interpolation as 2-D]
// A 3-D input (N, C, L) resizes as the image (N, C, 1, L) to (1, OL): the row dim keeps its one
// row (src = 0, weight 1) and 'linear' runs as 'bilinear', 'area' as adaptive_avg_pool2d. The
// column dim follows the same rules as torch's 1-D kernels, so the values are torch's bit for
// bit; only an infinite input differs: the row's zero-weight second tap (the same pixel) makes
// 0 * inf = NaN where torch's 1-D kernel gives inf in some outputs (torch's 2-D kernel on the
// same image gives NaN there too). size and scale_factor are one value for a 3-D input (Int2
// and Scale2 from a scalar); the output is contiguous, as torch's.
//
// Note [Interpolation source indices]
// Every plane (one sample, one channel) resizes on its own, each dim on its own: output
// row oh reads input rows chosen by the same rule as output column ow reads columns.
// The output size is `size`, or floor(in * scale_factor) when scale_factor is given.
// The rules are PyTorch's CPU kernels' (aten/src/ATen/native/UpSample.h and
// UpSampleKernel.cpp), float math and all, so frugal picks torch's source pixels at the
// boundaries. s is the scale of a dim: 1 / scale_factor if given (recompute_scale_factor
// unset), else in / out; 'nearest' and 'bilinear' copy a dim whose size does not change
// (src = o) whatever scale_factor says (the front-end drops its scale, so s = 1), as torch's
// CPU does; 'bicubic' and 'nearest-exact' keep it, as torch's CPU does.
//  - 'nearest' (legacy): src = min(floor(o * s), in - 1), s rounded to float, product in
//    float; out == 2 in halves (src = o >> 1). torch's CUDA kernels lack these shortcuts, so
//    torch's two backends can differ; frugal's agree with its CPU.
//  - 'nearest-exact' (Pillow's and scipy's rule): src = min(floor((o + 0.5) * s), in - 1), s
//    in float, the product in double rounded to float before the floor, as torch's.
//  - 'bilinear' (area_pixel_compute_source_index): with align_corners, s = (in - 1) /
//    (out - 1) (0 when out == 1) and src = s * o; without, src = max(s * (o + 0.5) - 0.5, 0).
//    Then i0 = floor(src), i1 = i0 + 1 clamped to in - 1, with weights 1 - l and l,
//    l = src - i0.
//  - 'bicubic' (Keys' cubic convolution, a = -0.75, as torch's): src as for 'bilinear'
//    without the clamp at 0, i = floor(src) (in float), t = src - i; the taps are i - 1 .. i + 2
//    clamped to [0, in - 1] (the edge pixel repeats) with weights
//    c2(t + 1), c1(t), c1(1 - t), c2((1 - t) + 1), where c1(x) = ((a + 2) x - (a + 3)) x^2 + 1 and
//    c2(x) = ((a x - 5a) x + 8a) x - 4a.
//  - 'area': adaptive_avg_pool2d to the output size (torch's definition of it).
// An output is the sum over its row taps a of wh[a] (sum over its column taps b of
// ww[b] x[ih[a], iw[b]]), each sum left to right, in opmath_t (float for float32/16-bit,
// double for float64), as PyTorch's accscalar_t: for 'bilinear'
//   l0h (l0w x[i0h, i0w] + l1w x[i0h, i1w]) + l1h (l0w x[i1h, i0w] + l1w x[i1h, i1w]).
// The nearest modes copy the pixel.
// The backward adds each output's gradient into the pixels it read, weight (wh[a] ww[b]) g.
// Both backends accumulate a pixel's contributions in opmath_t in a fixed order and round
// once, so the result does not depend on the thread count or schedule, with no atomics:
//  - the CPU scatters into a per-plane accumulator (a plane per thread) in output order
//    (oh, then ow, then the taps a, then b);
//  - the CUDA kernel gathers: a thread per input pixel finds by binary search the outputs
//    whose taps reach it (each dim's first tap never decreases with o). The nearest modes
//    add those outputs' gradients in the CPU's order (the same bits); the interpolating
//    modes sum, as the forward does, row by row: sum over oh of wh (sum over ow of ww g),
//    where wh and ww are the weights of the taps that read the pixel (added first where
//    clamped taps repeat an edge pixel), so the two backends differ there by rounding.
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include "tensor/half.h"
#include "tensor/ops/conv.h"  // Int2
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.interpolate's modes (Note [Interpolation source indices]): 'bilinear' and
/// 'bicubic' for 4-D input, 'linear' for 3-D, the others for both.
enum class InterpolateMode { Nearest, Bilinear, Bicubic, NearestExact, Area, Linear };

/// "nearest", "bilinear", "bicubic", "nearest-exact" or "area", as PyTorch spells the mode.
const char* interpolate_mode_name(InterpolateMode mode);
/// The mode PyTorch spells `name`; throws naming `op` and the modes for any other name.
InterpolateMode interpolate_mode(std::string_view name, const char* op = "interpolate");
/// Whether `mode` interpolates (linear, bilinear, bicubic): the modes that take align_corners.
constexpr bool interpolates(InterpolateMode mode) {
  return mode == InterpolateMode::Bilinear || mode == InterpolateMode::Bicubic || mode == InterpolateMode::Linear;
}

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
  std::optional<bool> align_corners = std::nullopt;  // bilinear and bicubic only (default false), as torch
  /// true: the kernels use in / out as the scale, as if `size` had been given (PyTorch's
  /// recompute_scale_factor=True); false: 1 / scale_factor.
  bool recompute_scale_factor = false;
};

/// Checks the settings alone (the mode, one of size and scale_factor, positive sizes and
/// scales, align_corners only where the mode interpolates); throws naming `op`.
void check_interpolate_options(const InterpolateOptions& options, const char* op);

}  // namespace frugal

namespace frugal::ops {

/// The sizes of one resize: P = N * C planes of (H, W) resized to (OH, OW) (a 3-D input: H = OH
/// = 1, and 'linear' is 'bilinear': Note [1-D interpolation as 2-D]). scale_h and
/// scale_w are the scale factors the kernels divide by (PyTorch's scales_h/w), 0 when
/// the scale is in / out. channels_last: every operand is an (N, C, H, W) tensor in
/// channels-last memory, and C is set (it stays 1 otherwise).
struct InterpolateGeometry {
  int64_t P = 0, C = 1, H = 0, W = 0, OH = 0, OW = 0;
  double scale_h = 0, scale_w = 0;
  InterpolateMode mode = InterpolateMode::Nearest;
  bool align_corners = false;
  bool channels_last = false;
};

/// torch.nn.functional.interpolate(x, size | scale_factor, mode, align_corners): x (N, C, H, W),
/// floating, any layout (channels-last in, channels-last out), or (N, C, L) (Note [1-D
/// interpolation as 2-D]). See Note [Interpolation source indices].
Tensor interpolate(const Tensor& x, const InterpolateOptions& options);
/// The gradient of interpolate: grad_out (N, C, OH, OW) or (N, C, OL) -> grad_x of `input_shape`.
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

/// 'nearest-exact': the input index output o reads (UpSample.h's nearest_exact_idx).
FRUGAL_HD int64_t nearest_exact_source(int64_t o, int64_t in, int64_t out, double scale) {
  const float s = scale > 0 ? float(1.0 / scale) : float(in) / float(out);
  const int64_t src = int64_t(floorf(float((double(o) + 0.5) * double(s))));
  return src < in - 1 ? src : in - 1;
}

/// The interpolating modes' scale of one dim in Acc (area_pixel_compute_scale).
template <typename Acc>
FRUGAL_HD Acc linear_scale(int64_t in, int64_t out, bool align_corners, double scale) {
  if (align_corners) return out > 1 ? Acc(in - 1) / Acc(out - 1) : Acc(0);
  return scale > 0 ? Acc(1.0 / scale) : Acc(in) / Acc(out);
}

/// How one dim resizes: what its taps depend on besides the output index.
template <typename Acc>
struct ResizeDim {
  int64_t in = 0, out = 0;
  double scale = 0;  // the user's scale factor, 0 when the scale is in / out
  Acc s = 0;         // linear_scale's, for the interpolating modes
  bool align_corners = false;
};

template <typename Acc>
FRUGAL_HD ResizeDim<Acc> resize_dim(int64_t in, int64_t out, double scale, bool align_corners) {
  return {in, out, scale, linear_scale<Acc>(in, out, align_corners, scale), align_corners};
}

/// The number of taps of a mode along one dim ('area' has none: it pools).
constexpr int tap_count(InterpolateMode mode) {
  return mode == InterpolateMode::Bicubic ? 4 : mode == InterpolateMode::Bilinear ? 2 : 1;
}
/// How far the first tap lies before `base` (bicubic reads base - 1 .. base + 2).
constexpr int tap_offset(InterpolateMode mode) { return mode == InterpolateMode::Bicubic ? 1 : 0; }

/// The input indices output o of one dim reads and their weights (tap_count of them), and
/// `base`, an index that never decreases with o: tap k is base - tap_offset + k clamped to
/// [0, in - 1].
template <typename Acc>
struct Taps {
  int64_t base;
  int64_t i[4];
  Acc w[4];
};

/// Keys' cubic convolution weights of the four taps at fraction t (get_cubic_upsample_coefficients).
template <typename Acc>
FRUGAL_HD void cubic_weights(Acc t, Acc* w) {
  const Acc a = Acc(-0.75);
  const auto near = [a](Acc x) { return ((a + Acc(2)) * x - (a + Acc(3))) * x * x + Acc(1); };  // |x| <= 1
  const auto far = [a](Acc x) { return ((a * x - Acc(5) * a) * x + Acc(8) * a) * x - Acc(4) * a; };  // 1 < |x| < 2
  w[0] = far(t + Acc(1));
  w[1] = near(t);
  w[2] = near(Acc(1) - t);
  w[3] = far((Acc(1) - t) + Acc(1));  // torch's two roundings
}

/// Calls f.template operator()<mode>() with `mode` as a constant, for the modes with taps
/// ('area' has none: the front-end pools); throws naming `backend` for 'area'.
template <typename F>
void visit_tap_mode(InterpolateMode mode, const char* backend, F&& f) {
  switch (mode) {
    case InterpolateMode::Nearest: return f.template operator()<InterpolateMode::Nearest>();
    case InterpolateMode::NearestExact: return f.template operator()<InterpolateMode::NearestExact>();
    case InterpolateMode::Bilinear: return f.template operator()<InterpolateMode::Bilinear>();
    case InterpolateMode::Bicubic: return f.template operator()<InterpolateMode::Bicubic>();
    case InterpolateMode::Area:
    case InterpolateMode::Linear: break;  // the front-end runs 'linear' as 'bilinear'
  }
  FRUGAL_FAIL("interpolate: the ", backend, " kernel has no mode ", interpolate_mode_name(mode));
}

/// Output o's taps along dim d in `mode`.
template <InterpolateMode mode, typename Acc>
FRUGAL_HD Taps<Acc> taps_of(int64_t o, const ResizeDim<Acc>& d) {
  Taps<Acc> t;
  if constexpr (mode == InterpolateMode::Nearest || mode == InterpolateMode::NearestExact) {
    t.base = mode == InterpolateMode::Nearest ? nearest_source(o, d.in, d.out, d.scale)
                                              : nearest_exact_source(o, d.in, d.out, d.scale);
    t.i[0] = t.base;
    t.w[0] = Acc(1);
  } else if constexpr (mode == InterpolateMode::Bilinear) {
    Acc src = d.align_corners ? d.s * Acc(o) : d.s * (Acc(o) + Acc(0.5)) - Acc(0.5);
    if (src < Acc(0)) src = Acc(0);
    int64_t i0 = int64_t(src);  // floor: src >= 0
    if (i0 > d.in - 1) i0 = d.in - 1;
    t.base = t.i[0] = i0;
    t.i[1] = i0 < d.in - 1 ? i0 + 1 : i0;
    t.w[1] = src - Acc(i0);
    t.w[0] = Acc(1) - t.w[1];
  } else {
    static_assert(mode == InterpolateMode::Bicubic, "'area' has no taps");
    const Acc src = d.align_corners ? d.s * Acc(o) : d.s * (Acc(o) + Acc(0.5)) - Acc(0.5);
    t.base = int64_t(floorf(float(src)));  // torch's floorf, in float for double too
    cubic_weights<Acc>(src - Acc(t.base), t.w);
    for (int k = 0; k < 4; ++k) {
      const int64_t i = t.base - 1 + k;
      t.i[k] = i < 0 ? 0 : i > d.in - 1 ? d.in - 1 : i;
    }
  }
  return t;
}

}  // namespace frugal::ops

// Backend kernels. Every tensor is contiguous and viewed as (P, H, W) / (P, OH, OW), or
// channels-last, (N, H, W, C), when g.channels_last; the front-end has handled empty tensors.
namespace frugal::ops::cpu {
/// out: (P, OH, OW) or (N, OH, OW, C); x: (P, H, W) or (N, H, W, C)
void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g);
/// grad_x: (P, H, W) or (N, H, W, C); grad_out: (P, OH, OW) or (N, OH, OW, C)
void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
/// out: (P, OH, OW) or (N, OH, OW, C); x: (P, H, W) or (N, H, W, C)
void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g);
/// grad_x: (P, H, W) or (N, H, W, C); grad_out: (P, OH, OW) or (N, OH, OW, C)
void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g);
}  // namespace frugal::ops::cuda
