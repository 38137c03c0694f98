// CPU interpolation (Note [Interpolation source indices] in tensor/ops/interpolate.h).
//
// Each dim's taps depend only on the output index, so they are computed once per op into
// small tables (OH + OW entries), not once per pixel. The forward runs rows of output
// planes (P * OH of them) in chunks across threads (Note [Chunked parallel loops] in
// loops.h); every row writes its own outputs. The backward runs planes: each scatters its
// output gradients, in output order, into an accumulator plane of opmath_t (float for
// float16/bfloat16) owned by the thread, and stores the plane once, rounded once. Each
// pixel's sum therefore has one order whatever the thread count.
//
// Channels-last tensors are resized as they lie, (N, H, W, C): a pixel's C channels share
// its taps, so the innermost loop runs over channels, contiguous in memory (vectorized),
// with each channel's arithmetic exactly the planar kernels' (the same bits). The backward
// runs (sample, block of channels) pairs, each with its own accumulator of H W channels.
#include <algorithm>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/interpolate.h"

namespace frugal::ops::cpu {

namespace {

using Mode = InterpolateMode;

/// The taps of every output index along one dim.
template <Mode mode, typename Acc>
std::vector<Taps<Acc>> tap_table(int64_t in, int64_t out, double scale, bool align_corners) {
  const ResizeDim<Acc> d = resize_dim<Acc>(in, out, scale, align_corners);
  std::vector<Taps<Acc>> t(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) t[size_t(o)] = taps_of<mode, Acc>(o, d);
  return t;
}

/// The taps of g's rows (th) and columns (tw).
template <Mode mode, typename Acc>
struct TapTables {
  std::vector<Taps<Acc>> th, tw;
  explicit TapTables(const InterpolateGeometry& g)
      : th(tap_table<mode, Acc>(g.H, g.OH, g.scale_h, g.align_corners)),
        tw(tap_table<mode, Acc>(g.W, g.OW, g.scale_w, g.align_corners)) {}
};

// out: (P, OH, OW); x: (P, H, W)
template <Mode mode, typename T>
void resize_forward(T* out, const T* x, const InterpolateGeometry& g) {
  using Acc = opmath_t<T>;
  constexpr int K = tap_count(mode);
  const auto [th, tw] = TapTables<mode, Acc>(g);
  parallel_chunks(g.P * g.OH, K * K * g.OW, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r / g.OH, oh = r % g.OH;
      const Taps<Acc>& h = th[size_t(oh)];
      const T* rows[K];
      for (int a = 0; a < K; ++a) rows[a] = x + (p * g.H + h.i[a]) * g.W;
      T* o = out + r * g.OW;
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const Taps<Acc>& w = tw[size_t(ow)];
        if constexpr (K == 1) {
          o[ow] = rows[0][w.i[0]];  // the nearest modes copy
        } else {
          Acc sum = 0;
          for (int a = 0; a < K; ++a) {
            Acc row = w.w[0] * Acc(rows[a][w.i[0]]);
            for (int b = 1; b < K; ++b) row += w.w[b] * Acc(rows[a][w.i[b]]);
            sum = a == 0 ? h.w[0] * row : sum + h.w[a] * row;
          }
          o[ow] = T(sum);
        }
      }
    }
  });
}

// gx: (P, H, W); gy: (P, OH, OW)
template <Mode mode, typename T>
void resize_backward(T* gx, const T* gy, const InterpolateGeometry& g) {
  using Acc = opmath_t<T>;
  constexpr int K = tap_count(mode);
  const auto [th, tw] = TapTables<mode, Acc>(g);
  const int64_t plane = g.H * g.W;
  parallel_chunks(g.P, K * K * g.OH * g.OW + plane, [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc(static_cast<size_t>(plane));
    for (int64_t p = begin; p < end; ++p) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      const T* gyp = gy + p * g.OH * g.OW;
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const Taps<Acc>& h = th[size_t(oh)];
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const Taps<Acc>& w = tw[size_t(ow)];
          const Acc v = Acc(gyp[oh * g.OW + ow]);
          // The taps in Note [Interpolation source indices]'s order.
          for (int a = 0; a < K; ++a) {
            Acc* row = acc.data() + h.i[a] * g.W;
            for (int b = 0; b < K; ++b) row[w.i[b]] += K == 1 ? v : h.w[a] * w.w[b] * v;
          }
        }
      }
      T* gxp = gx + p * plane;
      for (int64_t i = 0; i < plane; ++i) gxp[i] = T(acc[size_t(i)]);  // the one rounding
    }
  });
}

// out: (N, OH, OW, C); x: (N, H, W, C)
template <Mode mode, typename T>
void resize_forward_nhwc(T* out, const T* x, const InterpolateGeometry& g) {
  using Acc = opmath_t<T>;
  constexpr int K = tap_count(mode);
  const int64_t N = g.P / g.C, C = g.C;
  const auto [th, tw] = TapTables<mode, Acc>(g);
  parallel_chunks(N * g.OH, K * K * g.OW * C, [&](int64_t begin, int64_t end) {
    std::vector<Acc> sum(K == 1 ? 0 : static_cast<size_t>(C));  // one pixel's channel sums
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.OH, oh = r % g.OH;
      const Taps<Acc>& h = th[size_t(oh)];
      T* o = out + r * g.OW * C;
      for (int64_t ow = 0; ow < g.OW; ++ow, o += C) {
        const Taps<Acc>& w = tw[size_t(ow)];
        if constexpr (K == 1) {
          const T* px = x + ((n * g.H + h.i[0]) * g.W + w.i[0]) * C;
          std::copy(px, px + C, o);  // the nearest modes copy
        } else {
          // Each channel as resize_forward's element, a row tap at a time, so each loop over
          // the channels reads K pixels and vectorizes.
          Acc* __restrict s = sum.data();
          for (int a = 0; a < K; ++a) {
            const T* px[K];  // row tap a's pixels, C channels each
            for (int b = 0; b < K; ++b) px[b] = x + ((n * g.H + h.i[a]) * g.W + w.i[b]) * C;
            for (int64_t c = 0; c < C; ++c) {
              Acc row = w.w[0] * Acc(px[0][c]);
              for (int b = 1; b < K; ++b) row += w.w[b] * Acc(px[b][c]);
              s[c] = a == 0 ? h.w[0] * row : s[c] + h.w[a] * row;
            }
          }
          for (int64_t c = 0; c < C; ++c) o[c] = T(s[c]);
        }
      }
    }
  });
}

// gx: (N, H, W, C); gy: (N, OH, OW, C)
template <Mode mode, typename T>
void resize_backward_nhwc(T* gx, const T* gy, const InterpolateGeometry& g) {
  using Acc = opmath_t<T>;
  constexpr int K = tap_count(mode);
  constexpr int64_t kBlock = 64;  // channels per accumulator
  const int64_t N = g.P / g.C, C = g.C, blocks = (C + kBlock - 1) / kBlock;
  const auto [th, tw] = TapTables<mode, Acc>(g);
  const int64_t pixels = g.H * g.W;
  parallel_chunks(N * blocks, (K * K * g.OH * g.OW + pixels) * std::min(C, kBlock), [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t n = job / blocks, c0 = (job % blocks) * kBlock, cb = std::min(kBlock, C - c0);
      acc.assign(static_cast<size_t>(pixels * cb), Acc(0));
      const T* gyn = gy + n * g.OH * g.OW * C + c0;
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const Taps<Acc>& h = th[size_t(oh)];
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const Taps<Acc>& w = tw[size_t(ow)];
          const T* v = gyn + (oh * g.OW + ow) * C;
          // The taps in resize_backward's order, each channel as its element.
          for (int a = 0; a < K; ++a)
            for (int b = 0; b < K; ++b) {
              Acc* dst = acc.data() + (h.i[a] * g.W + w.i[b]) * cb;
              if constexpr (K == 1) {
                for (int64_t c = 0; c < cb; ++c) dst[c] += Acc(v[c]);
              } else {
                const Acc hw = h.w[a] * w.w[b];
                for (int64_t c = 0; c < cb; ++c) dst[c] += hw * Acc(v[c]);
              }
            }
        }
      }
      T* gxn = gx + n * pixels * C + c0;
      for (int64_t i = 0; i < pixels; ++i)
        for (int64_t c = 0; c < cb; ++c) gxn[i * C + c] = T(acc[size_t(i * cb + c)]);  // the one rounding
    }
  });
}

}  // namespace

void interpolate_kernel(const Tensor& out, const Tensor& x, const InterpolateGeometry& g) {
  dispatch_floating(x.dtype(), "interpolate", x.device(), [&]<typename T>() {
    visit_tap_mode(g.mode, "CPU", [&]<Mode mode>() {
      if (g.channels_last) resize_forward_nhwc<mode, T>(out.data_ptr<T>(), x.data_ptr<T>(), g);
      else resize_forward<mode, T>(out.data_ptr<T>(), x.data_ptr<T>(), g);
    });
  });
}

void interpolate_backward_kernel(const Tensor& grad_x, const Tensor& grad_out, const InterpolateGeometry& g) {
  dispatch_floating(grad_x.dtype(), "interpolate_backward", grad_x.device(), [&]<typename T>() {
    visit_tap_mode(g.mode, "CPU", [&]<Mode mode>() {
      if (g.channels_last) resize_backward_nhwc<mode, T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g);
      else resize_backward<mode, T>(grad_x.data_ptr<T>(), grad_out.data_ptr<T>(), g);
    });
  });
}

}  // namespace frugal::ops::cpu
