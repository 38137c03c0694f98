// CPU interpolation (Note [Interpolation source indices] in tensor/ops/interpolate.h).
//
// Each dim's source indices and weights depend only on the output index, so they are
// computed once per op into small tables (OH + OW entries), not once per pixel. The
// forward runs rows of output planes (P * OH of them) in chunks across threads (Note
// [Chunked parallel loops] in loops.h); every row writes its own outputs. The backward
// runs planes: each scatters its output gradients, in output order, into an accumulator
// plane of opmath_t (float for float16/bfloat16) owned by the thread, and stores the plane
// once, rounded once. Each pixel's sum therefore has one order whatever the thread count.
#include <algorithm>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/interpolate.h"

namespace frugal::ops::cpu {

namespace {

/// The source indices of 'nearest' along one dim: out entries.
std::vector<int64_t> nearest_table(int64_t in, int64_t out, double scale) {
  std::vector<int64_t> t(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) t[size_t(o)] = nearest_source(o, in, out, scale);
  return t;
}

/// The taps of 'bilinear' along one dim: out entries.
template <typename Acc>
std::vector<LinearTaps<Acc>> linear_table(int64_t in, int64_t out, bool align_corners, double scale) {
  const Acc s = linear_scale<Acc>(in, out, align_corners, scale);
  std::vector<LinearTaps<Acc>> t(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) t[size_t(o)] = linear_taps<Acc>(o, in, s, align_corners);
  return t;
}

// out: (P, OH, OW); x: (P, H, W)
template <typename T>
void nearest_forward(T* out, const T* x, const InterpolateGeometry& g) {
  const std::vector<int64_t> sh = nearest_table(g.H, g.OH, g.scale_h), sw = nearest_table(g.W, g.OW, g.scale_w);
  parallel_chunks(g.P * g.OH, g.OW, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r / g.OH, oh = r % g.OH;
      const T* row = x + (p * g.H + sh[size_t(oh)]) * g.W;
      T* o = out + r * g.OW;
      for (int64_t ow = 0; ow < g.OW; ++ow) o[ow] = row[sw[size_t(ow)]];
    }
  });
}

// gx: (P, H, W); gy: (P, OH, OW)
template <typename T>
void nearest_backward(T* gx, const T* gy, const InterpolateGeometry& g) {
  using Acc = opmath_t<T>;
  const std::vector<int64_t> sh = nearest_table(g.H, g.OH, g.scale_h), sw = nearest_table(g.W, g.OW, g.scale_w);
  const int64_t plane = g.H * g.W;
  parallel_chunks(g.P, g.OH * g.OW + plane, [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc(static_cast<size_t>(plane));
    for (int64_t p = begin; p < end; ++p) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      const T* gyp = gy + p * g.OH * g.OW;
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        Acc* row = acc.data() + sh[size_t(oh)] * g.W;
        for (int64_t ow = 0; ow < g.OW; ++ow) row[sw[size_t(ow)]] += Acc(gyp[oh * g.OW + ow]);
      }
      T* gxp = gx + p * plane;
      for (int64_t i = 0; i < plane; ++i) gxp[i] = T(acc[size_t(i)]);  // the one rounding
    }
  });
}

// out: (P, OH, OW); x: (P, H, W)
template <typename T>
void bilinear_forward(T* out, const T* x, const InterpolateGeometry& g) {
  using Acc = opmath_t<T>;
  const auto th = linear_table<Acc>(g.H, g.OH, g.align_corners, g.scale_h);
  const auto tw = linear_table<Acc>(g.W, g.OW, g.align_corners, g.scale_w);
  parallel_chunks(g.P * g.OH, 4 * g.OW, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r / g.OH, oh = r % g.OH;
      const LinearTaps<Acc>& h = th[size_t(oh)];
      const T* r0 = x + (p * g.H + h.i0) * g.W;
      const T* r1 = x + (p * g.H + h.i1) * g.W;
      T* o = out + r * g.OW;
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const LinearTaps<Acc>& w = tw[size_t(ow)];
        o[ow] = T(h.l0 * (w.l0 * Acc(r0[w.i0]) + w.l1 * Acc(r0[w.i1])) +
                  h.l1 * (w.l0 * Acc(r1[w.i0]) + w.l1 * Acc(r1[w.i1])));
      }
    }
  });
}

// gx: (P, H, W); gy: (P, OH, OW)
template <typename T>
void bilinear_backward(T* gx, const T* gy, const InterpolateGeometry& g) {
  using Acc = opmath_t<T>;
  const auto th = linear_table<Acc>(g.H, g.OH, g.align_corners, g.scale_h);
  const auto tw = linear_table<Acc>(g.W, g.OW, g.align_corners, g.scale_w);
  const int64_t plane = g.H * g.W;
  parallel_chunks(g.P, 4 * g.OH * g.OW + plane, [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc(static_cast<size_t>(plane));
    for (int64_t p = begin; p < end; ++p) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      const T* gyp = gy + p * g.OH * g.OW;
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const LinearTaps<Acc>& h = th[size_t(oh)];
        Acc* r0 = acc.data() + h.i0 * g.W;
        Acc* r1 = acc.data() + h.i1 * g.W;
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const LinearTaps<Acc>& w = tw[size_t(ow)];
          const Acc v = Acc(gyp[oh * g.OW + ow]);
          // The taps in Note [Interpolation source indices]'s order (the CUDA gather's).
          r0[w.i0] += h.l0 * w.l0 * v;
          r0[w.i1] += h.l0 * w.l1 * v;
          r1[w.i0] += h.l1 * w.l0 * v;
          r1[w.i1] += h.l1 * w.l1 * v;
        }
      }
      T* gxp = gx + p * plane;
      for (int64_t i = 0; i < plane; ++i) gxp[i] = T(acc[size_t(i)]);  // the one rounding
    }
  });
}

}  // namespace

void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g) {
  dispatch_floating(x.dtype(), "interpolate", x.device(), [&]<typename T>() {
    if (g.mode == InterpolateMode::Nearest) nearest_forward<T>(out.data_ptr<T>(), x.data_ptr<T>(), g);
    else bilinear_forward<T>(out.data_ptr<T>(), x.data_ptr<T>(), g);
  });
}

void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g) {
  dispatch_floating(grad_x.dtype(), "interpolate_backward", grad_x.device(), [&]<typename T>() {
    if (g.mode == InterpolateMode::Nearest) nearest_backward<T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g);
    else bilinear_backward<T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g);
  });
}

}  // namespace frugal::ops::cpu
