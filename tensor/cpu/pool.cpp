// CPU pooling (Note [Pooling windows] in tensor/ops/pool.h).
//
// Planes run in chunks across threads (Note [Chunked parallel loops] in loops.h). The
// backward kernels scatter each output gradient into a per-plane accumulator in opmath_t
// (float for float16/bfloat16), in output order, and store the plane once, so a pixel
// shared by several windows is rounded once (and a max-pool gradient is the GPU's bit for
// bit: Note [Pooling windows]).
//
// Note [CPU max-pool fast paths]
// Max pooling finds each window's argmax twice per step (forward, and backward from the
// input: Note [Window-local max-pool indices]), so the search is the kernel. When every
// window lies inside the plane (no padding, none hanging over the edge in ceil_mode) it
// runs without bounds checks, with the kernel size a compile-time constant for the 2x2
// and 3x3 undilated pools every CNN uses (the compiler unrolls the window). Every path
// takes the same first-largest-NaN-wins argmax in the same window order. When no input
// pixel lies in two windows (stride >= the dilated kernel, as in 2x2 stride 2), the
// backward writes each routed gradient straight into grad_x, 0 + g as the accumulator
// would have rounded it, and needs no accumulator plane. The 2x2 stride-2 pool, the
// commonest, has loops of its own: the forward's maxima without an index, the backward
// writing each window's four gradient pixels (the routed one or zero) with no pre-zeroing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/pool.h"

namespace frugal::ops::cpu {

namespace {

/// Runs body(p, acc) for every plane, in chunks across threads when the work is large
/// enough; acc is the chunk's scratch plane of H * W opmath_t<T> values (uninitialized).
template <typename T, typename Body>
void for_each_plane(const Pool2dGeometry& g, int64_t work_per_plane, Body&& body) {
  parallel_chunks(g.P, work_per_plane, [&](int64_t begin, int64_t end) {
    std::vector<opmath_t<T>> acc(size_t(g.H * g.W));
    for (int64_t p = begin; p < end; ++p) body(p, acc.data());
  });
}

/// Stores the accumulated plane acc into gx, rounding once.
template <typename T>
void store_plane(T* gx, const opmath_t<T>* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gx[i] = T(acc[i]);
}

/// True when every window lies inside the plane (Note [CPU max-pool fast paths]).
bool windows_inside(const Pool2dGeometry& g) {
  return g.padding == Int2(0) && (g.OH - 1) * g.stride.h + (g.kernel.h - 1) * g.dilation.h < g.H &&
         (g.OW - 1) * g.stride.w + (g.kernel.w - 1) * g.dilation.w < g.W;
}

/// True when no input pixel lies in two windows (Note [CPU max-pool fast paths]).
bool windows_disjoint(const Pool2dGeometry& g) {
  return (g.OH == 1 || g.stride.h > (g.kernel.h - 1) * g.dilation.h) &&
         (g.OW == 1 || g.stride.w > (g.kernel.w - 1) * g.dilation.w);
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

/// window_argmax for planes whose windows all lie inside (windows_inside): no bounds
/// checks; KH, KW > 0 fix an undilated kernel's size at compile time (0: g's kernel and dilation).
template <typename T, int KH, int KW, typename F>
void inside_window_maxima(const T* xp, const Pool2dGeometry& g, F&& f) {
  using Acc = opmath_t<T>;
  const int64_t kh = KH ? KH : g.kernel.h, kw = KW ? KW : g.kernel.w;
  const int64_t dh = (KH ? 1 : g.dilation.h) * g.W, dw = KW ? 1 : g.dilation.w;
  for (int64_t oh = 0; oh < g.OH; ++oh)
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      const int64_t origin = oh * g.stride.h * g.W + ow * g.stride.w;
      const T* win = xp + origin;
      Acc best = Acc(win[0]);
      int64_t arg = 0;
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j) {
          const Acc v = Acc(win[i * dh + j * dw]);
          if (v > best || std::isnan(v)) best = v, arg = i * dh + j * dw;
        }
      f(oh * g.OW + ow, origin + arg, best);
    }
}

/// Calls f(o, arg, best) for every output o = oh * OW + ow of the plane xp, in output
/// order, with its window's argmax (window_argmax's; -1: no input pixel) and maximum.
/// `inside`: windows_inside(g), computed once per op.
template <typename T, typename F>
void for_each_window_max(const T* xp, const Pool2dGeometry& g, bool inside, F&& f) {
  if (!inside) {
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        opmath_t<T> best = 0;
        const int64_t arg = window_argmax(xp, oh, ow, g, &best);
        f(oh * g.OW + ow, arg, best);
      }
  } else if (g.kernel == Int2(2) && g.dilation == Int2(1)) {
    inside_window_maxima<T, 2, 2>(xp, g, f);
  } else if (g.kernel == Int2(3) && g.dilation == Int2(1)) {
    inside_window_maxima<T, 3, 3>(xp, g, f);
  } else {
    inside_window_maxima<T, 0, 0>(xp, g, f);
  }
}

/// True for the 2x2 stride-2 pool with every window inside the plane, which the loops below
/// write without an argmax index or a call per output (Note [CPU max-pool fast paths]).
bool tiled_2x2(const Pool2dGeometry& g, bool inside) {
  return inside && g.kernel == Int2(2) && g.stride == Int2(2) && g.dilation == Int2(1);
}

/// Which of the window's a, b, c, d (window order) window_argmax picks: 0-3.
template <typename Acc>
int argmax_of_4(Acc a, Acc b, Acc c, Acc d, Acc* best) {
  Acc m = a;
  int k = 0;
  if (b > m || std::isnan(b)) m = b, k = 1;
  if (c > m || std::isnan(c)) m = c, k = 2;
  if (d > m || std::isnan(d)) m = d, k = 3;
  *best = m;
  return k;
}

// out: (OH, OW); xp: (H, W), one plane of a tiled_2x2 pool
template <typename T>
void max_2x2_plane(T* out, const T* xp, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    const T* r0 = xp + 2 * oh * g.W;
    const T* r1 = r0 + g.W;
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      Acc m;
      argmax_of_4(Acc(r0[2 * ow]), Acc(r0[2 * ow + 1]), Acc(r1[2 * ow]), Acc(r1[2 * ow + 1]), &m);
      out[oh * g.OW + ow] = T(m);
    }
  }
}

// gx, xp: (H, W); gy: (OH, OW), one plane of a tiled_2x2 pool: each window's four pixels
// get the routed gradient or zero; pixels no window covers (odd H or W) zero.
template <typename T>
void max_2x2_backward_plane(T* gx, const T* gy, const T* xp, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  if (2 * g.OH != g.H || 2 * g.OW != g.W) std::fill(gx, gx + g.H * g.W, T(0));
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    const T* r0 = xp + 2 * oh * g.W;
    const T* r1 = r0 + g.W;
    T* g0 = gx + 2 * oh * g.W;
    T* g1 = g0 + g.W;
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      Acc m;
      const int k = argmax_of_4(Acc(r0[2 * ow]), Acc(r0[2 * ow + 1]), Acc(r1[2 * ow]), Acc(r1[2 * ow + 1]), &m);
      const T v = T(Acc(0) + Acc(gy[oh * g.OW + ow])), zero = T(0);
      g0[2 * ow] = k == 0 ? v : zero;
      g0[2 * ow + 1] = k == 1 ? v : zero;
      g1[2 * ow] = k == 2 ? v : zero;
      g1[2 * ow + 1] = k == 3 ? v : zero;
    }
  }
}

// out: (P, OH, OW); idx: (P, OH, OW) or null (only the maxima); x: (P, H, W)
template <typename T>
void max_pool_forward(T* out, int64_t* idx, const T* x, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  const int64_t outs = g.OH * g.OW;
  const bool inside = windows_inside(g);
  parallel_chunks(g.P, outs * g.kernel.h * g.kernel.w, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      T* op = out + p * outs;
      if (!idx && tiled_2x2(g, inside)) {  // the maxima alone: no index per output
        max_2x2_plane(op, x + p * g.H * g.W, g);
        continue;
      }
      int64_t* ip = idx ? idx + p * outs : nullptr;
      for_each_window_max(x + p * g.H * g.W, g, inside, [&](int64_t o, int64_t arg, Acc best) {
        op[o] = arg < 0 ? T(-std::numeric_limits<Acc>::infinity()) : T(best);  // all padding: -inf, index -1
        if (ip) ip[o] = arg;
      });
    }
  });
}

// gx: (P, H, W); gy, idx: (P, OH, OW); index -1 (a window with no input pixel) routes nothing.
template <typename T>
void max_pool_backward(T* gx, const T* gy, const int64_t* idx, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  const int64_t plane = g.H * g.W, outs = g.OH * g.OW;
  for_each_plane<T>(g, plane + outs, [&](int64_t p, Acc* acc) {
    std::fill(acc, acc + plane, Acc(0));
    for (int64_t o = p * outs; o < (p + 1) * outs; ++o)
      if (idx[o] >= 0) acc[idx[o]] += Acc(gy[o]);
    store_plane(gx + p * plane, acc, plane);
  });
}

// gx, x: (P, H, W); gy: (P, OH, OW). The forward's argmax and the backward's routing in one
// pass per plane, so no index is stored (Note [Window-local max-pool indices]).
template <typename T>
void max_pool_backward_from_input(T* gx, const T* gy, const T* x, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  const int64_t plane = g.H * g.W, outs = g.OH * g.OW;
  const bool inside = windows_inside(g);
  const int64_t work = plane + outs * g.kernel.h * g.kernel.w;
  if (windows_disjoint(g)) {  // each pixel gets at most one gradient (Note [CPU max-pool fast paths])
    parallel_chunks(g.P, work, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        T* gxp = gx + p * plane;
        const T* gyp = gy + p * outs;
        if (tiled_2x2(g, inside)) {
          max_2x2_backward_plane(gxp, gyp, x + p * plane, g);
          continue;
        }
        std::fill(gxp, gxp + plane, T(0));
        for_each_window_max(x + p * plane, g, inside, [&](int64_t o, int64_t arg, Acc) {
          if (arg >= 0) gxp[arg] = T(Acc(0) + Acc(gyp[o]));
        });
      }
    });
    return;
  }
  for_each_plane<T>(g, work, [&](int64_t p, Acc* acc) {
    const T* gyp = gy + p * outs;
    std::fill(acc, acc + plane, Acc(0));
    for_each_window_max(x + p * plane, g, inside, [&](int64_t o, int64_t arg, Acc) {
      if (arg >= 0) acc[arg] += Acc(gyp[o]);
    });
    store_plane(gx + p * plane, acc, plane);
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
  parallel_chunks(g.P, g.OH * g.OW * g.kernel.h * g.kernel.w, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* xp = x + p * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const AvgWindow a = avg_window_of(oh, ow, g);
          Acc s = 0;
          for (int64_t ih = a.h0; ih < a.h1; ++ih)
            for (int64_t iw = a.w0; iw < a.w1; ++iw) s += Acc(xp[ih * g.W + iw]);
          out[(p * g.OH + oh) * g.OW + ow] = T(s / Acc(a.divisor));
        }
    }
  });
}

// gx: (P, H, W); gy: (P, OH, OW)
template <typename T>
void avg_pool_backward(T* gx, const T* gy, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  const int64_t plane = g.H * g.W;
  for_each_plane<T>(g, plane + g.OH * g.OW * g.kernel.h * g.kernel.w, [&](int64_t p, Acc* acc) {
    std::fill(acc, acc + plane, Acc(0));
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const AvgWindow a = avg_window_of(oh, ow, g);
        const Acc v = Acc(gy[(p * g.OH + oh) * g.OW + ow]) / Acc(a.divisor);
        for (int64_t ih = a.h0; ih < a.h1; ++ih)
          for (int64_t iw = a.w0; iw < a.w1; ++iw) acc[ih * g.W + iw] += v;
      }
    store_plane(gx + p * plane, acc, plane);
  });
}

// out: (P, OH, OW); x: (P, H, W)
template <typename T>
void adaptive_forward(T* out, const T* x, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  parallel_chunks(g.P, g.H * g.W, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
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
    }
  });
}

// gx: (P, H, W); gy: (P, OH, OW)
template <typename T>
void adaptive_backward(T* gx, const T* gy, const Pool2dGeometry& g) {
  using Acc = opmath_t<T>;
  const int64_t plane = g.H * g.W;
  for_each_plane<T>(g, plane, [&](int64_t p, Acc* acc) {
    std::fill(acc, acc + plane, Acc(0));
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const int64_t h0 = adaptive_start(oh, g.H, g.OH), h1 = adaptive_end(oh, g.H, g.OH);
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const int64_t w0 = adaptive_start(ow, g.W, g.OW), w1 = adaptive_end(ow, g.W, g.OW);
        const Acc v = Acc(gy[(p * g.OH + oh) * g.OW + ow]) / Acc((h1 - h0) * (w1 - w0));
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) acc[ih * g.W + iw] += v;
      }
    }
    store_plane(gx + p * plane, acc, plane);
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
