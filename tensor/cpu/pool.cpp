// CPU pooling (Note [Pooling windows] in tensor/ops/pool.h).
//
// Planes run in parallel. The backward kernels scatter each output gradient into a
// per-plane accumulator in opmath_t (float for float16/bfloat16), in output order, and
// store the plane once, so a pixel shared by several windows is rounded once (and a max-pool gradient
// is the GPU's bit for bit: Note [Pooling windows]).
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/pool.h"

namespace frugal::ops::cpu {

namespace {

/// Runs body(p) for every plane, in parallel when the work is large enough.
template <typename Body>
void for_each_plane(const Pool2dGeometry& g, int64_t work_per_plane, Body&& body) {
#pragma omp parallel for schedule(static) if (g.P * work_per_plane >= kParallelGrain && g.P > 1)
  for (int64_t p = 0; p < g.P; ++p) body(p);
}

/// The argmax of output (oh, ow)'s window in the plane xp: the flat index ih * W + iw of
/// the first largest value in window order (NaN wins; the padding never does), or -1 when
/// the window holds no input pixel; *best is its value.
template <typename T>
int64_t window_argmax(const T* xp, int64_t oh, int64_t ow, const Pool2dGeometry& g, opmath_t<T>* best) {
  const int64_t h0 = oh * g.stride.h - g.padding.h, w0 = ow * g.stride.w - g.padding.w;
  int64_t arg = -1;
  for (int64_t i = 0; i < g.kernel.h; ++i) {
    const int64_t ih = h0 + i * g.dilation.h;
    if (ih < 0 || ih >= g.H) continue;
    for (int64_t j = 0; j < g.kernel.w; ++j) {
      const int64_t iw = w0 + j * g.dilation.w;
      if (iw < 0 || iw >= g.W) continue;
      const opmath_t<T> v = opmath_t<T>(xp[ih * g.W + iw]);
      if (arg < 0 || v > *best || std::isnan(v)) *best = v, arg = ih * g.W + iw;
    }
  }
  return arg;
}

// out: (P, OH, OW); idx: (P, OH, OW) or null (only the maxima); x: (P, H, W)
template <typename T>
void max_pool_forward(T* out, int64_t* idx, const T* x, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  for_each_plane(g, g.OH * g.OW * g.kernel.h * g.kernel.w, [&](int64_t p) {
    const T* xp = x + p * g.H * g.W;
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        Acc best = 0;
        const int64_t arg = window_argmax(xp, oh, ow, g, &best);
        const int64_t o = (p * g.OH + oh) * g.OW + ow;
        out[o] = arg < 0 ? T(-std::numeric_limits<Acc>::infinity()) : T(best);  // all padding: -inf, index -1
        if (idx) idx[o] = arg;
      }
  });
}

// gx: (P, H, W); gy, idx: (P, OH, OW); index -1 (a window with no input pixel) routes nothing.
template <typename T>
void max_pool_backward(T* gx, const T* gy, const int64_t* idx, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  for_each_plane(g, g.H * g.W, [&](int64_t p) {
    std::vector<Acc> acc(size_t(g.H * g.W), Acc(0));
    for (int64_t o = p * g.OH * g.OW; o < (p + 1) * g.OH * g.OW; ++o)
      if (idx[o] >= 0) acc[size_t(idx[o])] += Acc(gy[o]);
    for (int64_t i = 0; i < g.H * g.W; ++i) gx[p * g.H * g.W + i] = T(acc[size_t(i)]);
  });
}

// gx, x: (P, H, W); gy: (P, OH, OW). The forward's argmax and the backward's routing in one
// pass per plane, so no index is stored (Note [Window-local max-pool indices]).
template <typename T>
void max_pool_backward_from_input(T* gx, const T* gy, const T* x, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  for_each_plane(g, g.OH * g.OW * g.kernel.h * g.kernel.w, [&](int64_t p) {
    const T* xp = x + p * g.H * g.W;
    std::vector<Acc> acc(size_t(g.H * g.W), Acc(0));
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        Acc best = 0;
        const int64_t arg = window_argmax(xp, oh, ow, g, &best);
        if (arg >= 0) acc[size_t(arg)] += Acc(gy[(p * g.OH + oh) * g.OW + ow]);
      }
    for (int64_t i = 0; i < g.H * g.W; ++i) gx[p * g.H * g.W + i] = T(acc[size_t(i)]);
  });
}

/// The window of output (oh, ow) and its divisor (Note [Pooling windows]).
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
};
AvgWindow avg_window_of(int64_t oh, int64_t ow, const Pool2dGeometry& g) {
  AvgWindow a{};
  const int64_t ph = avg_window(oh, g.stride.h, g.padding.h, g.kernel.h, g.H, &a.h0, &a.h1);
  const int64_t pw = avg_window(ow, g.stride.w, g.padding.w, g.kernel.w, g.W, &a.w0, &a.w1);
  a.divisor = g.count_include_pad ? ph * pw : (a.h1 - a.h0) * (a.w1 - a.w0);
  return a;
}

// out: (P, OH, OW); x: (P, H, W)
template <typename T>
void avg_pool_forward(T* out, const T* x, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  for_each_plane(g, g.OH * g.OW * g.kernel.h * g.kernel.w, [&](int64_t p) {
    const T* xp = x + p * g.H * g.W;
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const AvgWindow a = avg_window_of(oh, ow, g);
        Acc s = 0;
        for (int64_t ih = a.h0; ih < a.h1; ++ih)
          for (int64_t iw = a.w0; iw < a.w1; ++iw) s += Acc(xp[ih * g.W + iw]);
        out[(p * g.OH + oh) * g.OW + ow] = T(s / Acc(a.divisor));
      }
  });
}

// gx: (P, H, W); gy: (P, OH, OW)
template <typename T>
void avg_pool_backward(T* gx, const T* gy, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  for_each_plane(g, g.OH * g.OW * g.kernel.h * g.kernel.w, [&](int64_t p) {
    std::vector<Acc> acc(size_t(g.H * g.W), Acc(0));
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const AvgWindow a = avg_window_of(oh, ow, g);
        const Acc v = Acc(gy[(p * g.OH + oh) * g.OW + ow]) / Acc(a.divisor);
        for (int64_t ih = a.h0; ih < a.h1; ++ih)
          for (int64_t iw = a.w0; iw < a.w1; ++iw) acc[size_t(ih * g.W + iw)] += v;
      }
    for (int64_t i = 0; i < g.H * g.W; ++i) gx[p * g.H * g.W + i] = T(acc[size_t(i)]);
  });
}

// out: (P, OH, OW); x: (P, H, W)
template <typename T>
void adaptive_forward(T* out, const T* x, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  for_each_plane(g, g.H * g.W, [&](int64_t p) {
    const T* xp = x + p * g.H * g.W;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const int64_t h0 = adaptive_start(oh, g.H, g.OH), h1 = adaptive_end(oh, g.H, g.OH);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const int64_t w0 = adaptive_start(ow, g.W, g.OW), w1 = adaptive_end(ow, g.W, g.OW);
        Acc s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += Acc(xp[ih * g.W + iw]);
        out[(p * g.OH + oh) * g.OW + ow] = T(s / Acc((h1 - h0) * (w1 - w0)));
      }
    }
  });
}

// gx: (P, H, W); gy: (P, OH, OW)
template <typename T>
void adaptive_backward(T* gx, const T* gy, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  for_each_plane(g, g.H * g.W, [&](int64_t p) {
    std::vector<Acc> acc(size_t(g.H * g.W), Acc(0));
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const int64_t h0 = adaptive_start(oh, g.H, g.OH), h1 = adaptive_end(oh, g.H, g.OH);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const int64_t w0 = adaptive_start(ow, g.W, g.OW), w1 = adaptive_end(ow, g.W, g.OW);
        const Acc v = Acc(gy[(p * g.OH + oh) * g.OW + ow]) / Acc((h1 - h0) * (w1 - w0));
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) acc[size_t(ih * g.W + iw)] += v;
      }
    }
    for (int64_t i = 0; i < g.H * g.W; ++i) gx[p * g.H * g.W + i] = T(acc[size_t(i)]);
  });
}

}  // namespace

void max_pool2d_kernel(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  dispatch_floating(x.dtype(), "max_pool2d", x.device(), [&]<typename T>() {
    max_pool_forward<T>(out.data_ptr<T>(), indices.defined() ? indices.data_ptr<int64_t>() : nullptr, x.data_ptr<T>(),
                        g);
  });
}

void max_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                                const Pool2dGeometry& g) {
  dispatch_floating(grad_x.dtype(), "max_pool2d_backward", grad_x.device(), [&]<typename T>() {
    const int64_t* idx = indices.data_ptr<int64_t>();
    for (int64_t i = 0; i < indices.numel(); ++i)
      FRUGAL_CHECK(idx[i] >= -1 && idx[i] < g.H * g.W, "max_pool2d_backward: index ", idx[i], " at ", i,
                   " is outside the ", g.H, "x", g.W, " input plane (-1: a window with no input pixel)");
    max_pool_backward<T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), idx, g);
  });
}

void max_pool2d_backward_from_input_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& x,
                                           const Pool2dGeometry& g) {
  dispatch_floating(grad_x.dtype(), "max_pool2d_backward", grad_x.device(), [&]<typename T>() {
    max_pool_backward_from_input<T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), x.data_ptr<T>(), g);
  });
}

void avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  dispatch_floating(x.dtype(), "avg_pool2d", x.device(),
                    [&]<typename T>() { avg_pool_forward<T>(out.data_ptr<T>(), x.data_ptr<T>(), g); });
}

void avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g) {
  dispatch_floating(grad_x.dtype(), "avg_pool2d_backward", grad_x.device(),
                    [&]<typename T>() { avg_pool_backward<T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g); });
}

void adaptive_avg_pool2d_kernel(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  dispatch_floating(x.dtype(), "adaptive_avg_pool2d", x.device(),
                    [&]<typename T>() { adaptive_forward<T>(out.data_ptr<T>(), x.data_ptr<T>(), g); });
}

void adaptive_avg_pool2d_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& g) {
  dispatch_floating(grad_x.dtype(), "adaptive_avg_pool2d_backward", grad_x.device(),
                    [&]<typename T>() { adaptive_backward<T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g); });
}

}  // namespace frugal::ops::cpu
