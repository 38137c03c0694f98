// Convolution, pooling and batch norm (tensor/ops/conv.h, pool.h, batch_norm.h) on
// batched and unbatched inputs in every layout (channels-last included), against
// direct loops over the windows.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/ops/batch_norm.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/pool.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Expected rounded(Host h, DType dt, Tol tol) {
  for (double& v : h.v) v = round_to(dt, v);
  return {std::move(h), dt, tol};
}

/// A pooling input (N, C, H, W) or (C, H, W).
Shape pool_input(Rng& rng) {
  Shape s{random_size(rng, 3, 0.1, 0.3), rng.range(1, 4), rng.range(1, 9), rng.range(1, 9)};
  if (rng.chance(0.25)) s.erase(s.begin());
  return s;
}

/// Pooled size along one dim, as Note [Pooling windows] defines it; <= 0 when invalid.
int64_t pooled(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const double span = double(in + 2 * p - d * (k - 1) - 1) / double(s);
  int64_t out = int64_t(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

struct Window {
  Int2 kernel, stride, padding, dilation{1};
  bool ceil_mode = false, count_include_pad = true;
  std::string str() const {
    return cat_str("kernel=", kernel.str(), " stride=", stride.str(), " padding=", padding.str(),
                   " dilation=", dilation.str(), " ceil_mode=", ceil_mode, " count_include_pad=", count_include_pad);
  }
};

Window draw_window(Rng& rng, bool dilated) {
  Window w;
  w.kernel = {rng.range(1, 3), rng.range(1, 3)};
  w.stride = rng.chance(0.3) ? Int2(0) : Int2(rng.range(1, 3), rng.range(1, 3));
  if (dilated && rng.chance(0.3)) w.dilation = {rng.range(1, 2), rng.range(1, 2)};
  const int64_t eh = w.dilation.h * (w.kernel.h - 1) + 1, ew = w.dilation.w * (w.kernel.w - 1) + 1;
  w.padding = {rng.range(0, eh / 2), rng.range(0, ew / 2)};
  w.ceil_mode = rng.chance(0.3);
  w.count_include_pad = rng.chance(0.5);
  return w;
}

/// The planes of a pooling input and its output plane size; throws MustThrow when the op must.
struct Planes {
  int64_t P, H, W, OH, OW;
  Int2 stride;
};
Planes planes(const Shape& in, const Window& w, bool dilated) {
  Planes p;
  p.H = in[in.size() - 2], p.W = in[in.size() - 1];
  p.P = numel_of(in) / (p.H * p.W);
  p.stride = w.stride == Int2(0) ? w.kernel : w.stride;
  const Int2 d = dilated ? w.dilation : Int2(1);
  p.OH = pooled(p.H, w.kernel.h, p.stride.h, w.padding.h, d.h, w.ceil_mode);
  p.OW = pooled(p.W, w.kernel.w, p.stride.w, w.padding.w, d.w, w.ceil_mode);
  if (p.OH <= 0 || p.OW <= 0) throw MustThrow{"input too small for the window"};
  return p;
}

Shape with_plane(Shape s, int64_t oh, int64_t ow) {
  s[s.size() - 2] = oh, s[s.size() - 1] = ow;
  return s;
}

/// max_pool2d's values and flat indices ih * W + iw (first largest; NaN wins, the last one as
/// in PyTorch's kernel); -inf and -1 for a window with no input pixel.
void max_pool_ref(const Host& x, const Window& w, Host& out, Host& indices) {
  const Planes g = planes(x.sizes, w, true);
  out = host_zeros(with_plane(x.sizes, g.OH, g.OW));
  indices = out;
  for (int64_t p = 0; p < g.P; ++p)
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        double best = -kInf;
        int64_t at = -1;
        for (int64_t i = 0; i < w.kernel.h; ++i)
          for (int64_t j = 0; j < w.kernel.w; ++j) {
            const int64_t ih = oh * g.stride.h - w.padding.h + i * w.dilation.h;
            const int64_t iw = ow * g.stride.w - w.padding.w + j * w.dilation.w;
            if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
            const double v = x.v[size_t((p * g.H + ih) * g.W + iw)];
            if (at < 0 || v > best || std::isnan(v)) best = v, at = ih * g.W + iw;  // the last NaN, as PyTorch
          }
        const size_t o = size_t((p * g.OH + oh) * g.OW + ow);
        out.v[o] = best, indices.v[o] = double(at);
      }
}

/// avg_pool2d's window [hs, he) x [ws, we) of output (oh, ow) and its divisor.
double avg_window(const Planes& g, const Window& w, int64_t oh, int64_t ow, int64_t& hs, int64_t& he, int64_t& ws,
                  int64_t& we) {
  hs = oh * g.stride.h - w.padding.h, ws = ow * g.stride.w - w.padding.w;
  he = std::min(hs + w.kernel.h, g.H + w.padding.h), we = std::min(ws + w.kernel.w, g.W + w.padding.w);
  const double padded = double((he - hs) * (we - ws));
  hs = std::max<int64_t>(hs, 0), ws = std::max<int64_t>(ws, 0), he = std::min(he, g.H), we = std::min(we, g.W);
  return w.count_include_pad ? padded : double((he - hs) * (we - ws));
}

struct ConvCase {
  Shape x, w;
  Conv2dOptions o;
  bool has_bias = false;
  std::string str() const {
    return cat_str("stride=", o.stride.str(), " padding=", o.padding.str(), " dilation=", o.dilation.str(),
                   " groups=", o.groups);
  }
};

ConvCase draw_conv(Rng& rng) {
  ConvCase c;
  const int64_t G = rng.pick(std::vector<int64_t>{1, 1, 2, 3}), cg = rng.range(1, 3),
                kg = random_size(rng, 3, 0.05, 0.2);
  c.o.groups = G;
  c.o.stride = {rng.range(1, 2), rng.range(1, 3)};
  c.o.padding = {rng.range(0, 2), rng.range(0, 1)};
  c.o.dilation = rng.chance(0.25) ? Int2(rng.range(1, 2), rng.range(1, 2)) : Int2(1);
  c.x = {random_size(rng, 2, 0.1, 0.3), G * cg, rng.range(1, 7), rng.range(1, 7)};
  c.w = {G * kg, cg, rng.range(1, 3), rng.range(1, 3)};
  if (rng.chance(0.2)) c.w[2] = c.w[3] = 1, c.o.stride = 1, c.o.padding = 0;  // the im2col-free path
  c.has_bias = rng.chance(0.5);
  return c;
}

struct TransposedConvCase {
  Shape x, w;
  ConvTranspose2dOptions o;
  bool has_bias = false;
  std::string str() const {
    return cat_str("stride=", o.stride.str(), " padding=", o.padding.str(), " output_padding=", o.output_padding.str(),
                   " dilation=", o.dilation.str(), " groups=", o.groups);
  }
};

TransposedConvCase draw_conv_transpose(Rng& rng) {
  TransposedConvCase c;
  const int64_t G = rng.pick(std::vector<int64_t>{1, 1, 2, 3}), cg = rng.range(1, 3),
                kg = random_size(rng, 3, 0.05, 0.2);
  c.o.groups = G;
  c.o.stride = {rng.range(1, 3), rng.range(1, 2)};
  c.o.padding = {rng.range(0, 2), rng.range(0, 1)};
  c.o.dilation = rng.chance(0.25) ? Int2(rng.range(1, 3), rng.range(1, 2)) : Int2(1);
  // Any output_padding below stride or dilation (also past the stride); 1 in 10 draws one too
  // large, which must throw.
  const auto draw_pad = [&](int64_t stride, int64_t dilation) {
    return rng.chance(0.1) ? std::max(stride, dilation) : rng.range(0, std::max(stride, dilation) - 1);
  };
  c.o.output_padding = {draw_pad(c.o.stride.h, c.o.dilation.h), draw_pad(c.o.stride.w, c.o.dilation.w)};
  c.x = {random_size(rng, 2, 0.1, 0.3), G * cg, rng.range(1, 5), rng.range(1, 5)};
  c.w = {G * cg, kg, rng.range(1, 3), rng.range(1, 3)};
  c.has_bias = rng.chance(0.5);
  return c;
}

/// Output size of a transposed convolution along one dim, or MustThrow.
int64_t transposed_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, int64_t out_pad) {
  if (out_pad >= s && out_pad >= d) throw MustThrow{"output_padding not below stride or dilation"};
  const int64_t out = (in - 1) * s - 2 * p + d * (k - 1) + out_pad + 1;
  if (out < 1) throw MustThrow{"output smaller than 1"};
  return out;
}

/// Output size of a convolution along one dim, or MustThrow.
int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  if (span < 0) throw MustThrow{"kernel larger than the padded input"};
  return span / s + 1;
}

/// Calls f(n, k, oh, ow, c, r, s, ih, iw) for every tap of a convolution that lands in the
/// input: c is the input channel, (r, s) the kernel position.
template <typename F>
void for_each_tap(const Shape& x, const Shape& w, const Conv2dOptions& o, F&& f) {
  const int64_t N = x[0], H = x[2], W = x[3], K = w[0], cg = w[1], R = w[2], S = w[3];
  const int64_t OH = conv_out(H, R, o.stride.h, o.padding.h, o.dilation.h);
  const int64_t OW = conv_out(W, S, o.stride.w, o.padding.w, o.dilation.w);
  const int64_t kg = K / o.groups;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t r = 0; r < R; ++r)
              for (int64_t s = 0; s < S; ++s) {
                const int64_t ih = oh * o.stride.h - o.padding.h + r * o.dilation.h;
                const int64_t iw = ow * o.stride.w - o.padding.w + s * o.dilation.w;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W) f(n, k, oh, ow, (k / kg) * cg + c, c, r, s, ih, iw);
              }
}

Shape conv_output_shape(const Shape& x, const Shape& w, const Conv2dOptions& o) {
  return {x[0], w[0], conv_out(x[2], w[2], o.stride.h, o.padding.h, o.dilation.h),
          conv_out(x[3], w[3], o.stride.w, o.padding.w, o.dilation.w)};
}

Host as_batched(const Host& h) {
  if (h.dim() == 4) return h;
  Host b = h;
  b.sizes.insert(b.sizes.begin(), 1);
  return b;
}

// ---- batch norm ------------------------------------------------------------------

DType compute_of(DType dt) { return dt == kFloat64 ? kFloat64 : kFloat32; }

Shape bn_input(Rng& rng) {
  Shape s{rng.range(1, 3), rng.range(1, 4)};
  const int64_t spatial = rng.range(0, 2);
  for (int64_t i = 0; i < spatial; ++i) s.push_back(rng.range(1, 5));
  return s;
}

/// A (C) tensor in x's dtype or the compute dtype, in a random layout.
Tensor channel_tensor(Rng& rng, int64_t C, DType dt, Values v = {}) {
  return random_input(rng, {C}, rng.chance(0.5) ? dt : compute_of(dt), v, {.expand = false});
}

/// Per-channel values of x (N, C, *): x.v positions of channel c.
std::vector<std::vector<size_t>> channel_positions(const Shape& x) {
  const int64_t N = x[0], C = x[1], HW = numel_of(x) / std::max<int64_t>(N * C, 1);
  std::vector<std::vector<size_t>> pos(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) pos[size_t(c)].push_back(size_t((n * C + c) * HW + i));
  return pos;
}

const Tol kStatsTol32{1e-4, 1e-5}, kStatsTol64{1e-10, 1e-12};
Tol stats_tol(DType t) { return t == kFloat64 ? kStatsTol64 : kStatsTol32; }
/// Running statistics stored in 16 bits round the float32 update once more: an update a hair
/// from a rounding midpoint lands one ulp either side of the float64 reference's.
Tol running_stats_tol(DType t) {
  return t == kFloat16 || t == kBFloat16 ? tol_for(t) : stats_tol(t == kFloat64 ? kFloat64 : kFloat32);
}

}  // namespace

void add_nn_ops(std::vector<OpEntry>& t) {
  t.push_back({"max_pool2d", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const Window w = draw_window(rng, true);
                 Values v{-2, 2, 0.5};
                 if (rng.chance(0.1)) v.p_nan = 0.05;
                 s.inputs = {random_input(rng, pool_input(rng), dt, v)};
                 s.params = w.str();
                 s.run = [w](const std::vector<Tensor>& in) {
                   const ops::MaxPool2dResult r =
                       ops::max_pool2d(in[0], w.kernel, {w.stride, w.padding, w.dilation, w.ceil_mode});
                   return std::vector<Tensor>{r.out, r.indices};
                 };
                 s.reference = [w, dt](const std::vector<Host>& in) {
                   Host out, idx;
                   max_pool_ref(in[0], w, out, idx);
                   return std::vector<Expected>{Expected{out, dt, {}}, Expected{idx, kInt64, {}}};
                 };
                 return s;
               }});
  t.push_back({"max_pool2d_backward", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const Window w = draw_window(rng, true);
                 const Shape in_shape = pool_input(rng);
                 Host out, idx;
                 try {
                   max_pool_ref(read_host(random_input(rng, in_shape, kFloat32)), w, out, idx);
                 } catch (const MustThrow&) {
                   out = idx = host_zeros(with_plane(in_shape, 1, 1));  // the op must throw: any indices
                 }
                 s.inputs = {random_input(rng, out.sizes, dt), tensor_of(idx.v, idx.sizes, kInt64, &rng)};
                 s.params = w.str() + " input_shape=" + str(in_shape);
                 s.run = [w, in_shape](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::max_pool2d_backward(in[0], in[1], in_shape, w.kernel,
                                                                       {w.stride, w.padding, w.dilation, w.ceil_mode})};
                 };
                 s.reference = [w, dt, in_shape](const std::vector<Host>& in) {
                   const Planes g = planes(in_shape, w, true);
                   Host gx = host_zeros(in_shape);
                   for (int64_t i = 0; i < in[0].numel(); ++i) {
                     const int64_t p = i / (g.OH * g.OW), at = int64_t(in[1].v[size_t(i)]);
                     if (at >= 0) gx.v[size_t(p * g.H * g.W + at)] += in[0].v[size_t(i)];  // -1: an empty window
                   }
                   return std::vector<Expected>{rounded(gx, dt, tol_sum(dt, w.kernel.h * w.kernel.w, 2))};
                 };
                 return s;
               }});
  t.push_back({"avg_pool2d", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const Window w = draw_window(rng, false);
                 s.inputs = {random_input(rng, pool_input(rng), dt)};
                 s.params = w.str();
                 s.run = [w](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{
                       ops::avg_pool2d(in[0], w.kernel, {w.stride, w.padding, w.ceil_mode, w.count_include_pad})};
                 };
                 s.reference = [w, dt](const std::vector<Host>& in) {
                   const Planes g = planes(in[0].sizes, w, false);
                   Host out = host_zeros(with_plane(in[0].sizes, g.OH, g.OW));
                   size_t o = 0;
                   for (int64_t p = 0; p < g.P; ++p)
                     for (int64_t oh = 0; oh < g.OH; ++oh)
                       for (int64_t ow = 0; ow < g.OW; ++ow) {
                         int64_t hs, he, ws, we;
                         const double div = avg_window(g, w, oh, ow, hs, he, ws, we);
                         double sum = 0;
                         for (int64_t ih = hs; ih < he; ++ih)
                           for (int64_t iw = ws; iw < we; ++iw) sum += in[0].v[size_t((p * g.H + ih) * g.W + iw)];
                         out.v[o++] = sum / div;
                       }
                   return std::vector<Expected>{rounded(out, dt, tol_sum(dt, 9, 2))};
                 };
                 return s;
               }});
  t.push_back({"avg_pool2d_backward", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const Window w = draw_window(rng, false);
                 const Shape in_shape = pool_input(rng);
                 Shape out_shape = with_plane(in_shape, 1, 1);
                 try {
                   const Planes g = planes(in_shape, w, false);
                   out_shape = with_plane(in_shape, g.OH, g.OW);
                 } catch (const MustThrow&) {}
                 s.inputs = {random_input(rng, out_shape, dt)};
                 s.params = w.str() + " input_shape=" + str(in_shape);
                 s.run = [w, in_shape](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::avg_pool2d_backward(
                       in[0], in_shape, w.kernel, {w.stride, w.padding, w.ceil_mode, w.count_include_pad})};
                 };
                 s.reference = [w, dt, in_shape](const std::vector<Host>& in) {
                   const Planes g = planes(in_shape, w, false);
                   Host gx = host_zeros(in_shape);
                   size_t o = 0;
                   for (int64_t p = 0; p < g.P; ++p)
                     for (int64_t oh = 0; oh < g.OH; ++oh)
                       for (int64_t ow = 0; ow < g.OW; ++ow) {
                         int64_t hs, he, ws, we;
                         const double div = avg_window(g, w, oh, ow, hs, he, ws, we);
                         const double gv = in[0].v[o++];
                         for (int64_t ih = hs; ih < he; ++ih)
                           for (int64_t iw = ws; iw < we; ++iw) gx.v[size_t((p * g.H + ih) * g.W + iw)] += gv / div;
                       }
                   return std::vector<Expected>{rounded(gx, dt, tol_sum(dt, 9, 2))};
                 };
                 return s;
               }});
  for (bool backward : {false, true}) {
    t.push_back(
        {backward ? "adaptive_avg_pool2d_backward" : "adaptive_avg_pool2d", kFloats, [backward](Rng& rng, DType dt) {
           Sample s;
           const Shape in_shape = pool_input(rng);
           const int64_t H = in_shape[in_shape.size() - 2], W = in_shape[in_shape.size() - 1];
           const Int2 out{rng.range(1, 2 * H), rng.range(1, 2 * W)};
           s.inputs = {random_input(rng, backward ? with_plane(in_shape, out.h, out.w) : in_shape, dt)};
           s.params = cat_str("output_size=", out.str(), " input_shape=", str(in_shape));
           s.run = [backward, out, in_shape](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{backward ? ops::adaptive_avg_pool2d_backward(in[0], in_shape)
                                                 : ops::adaptive_avg_pool2d(in[0], out)};
           };
           s.reference = [backward, out, in_shape, dt, H, W](const std::vector<Host>& in) {
             const int64_t P = numel_of(in_shape) / (H * W);
             Host res = host_zeros(backward ? in_shape : with_plane(in_shape, out.h, out.w));
             for (int64_t p = 0; p < P; ++p)
               for (int64_t oh = 0; oh < out.h; ++oh)
                 for (int64_t ow = 0; ow < out.w; ++ow) {
                   const int64_t hs = oh * H / out.h, he = ((oh + 1) * H + out.h - 1) / out.h;
                   const int64_t ws = ow * W / out.w, we = ((ow + 1) * W + out.w - 1) / out.w;
                   const double n = double((he - hs) * (we - ws));
                   const size_t o = size_t((p * out.h + oh) * out.w + ow);
                   double sum = 0;
                   for (int64_t ih = hs; ih < he; ++ih)
                     for (int64_t iw = ws; iw < we; ++iw) {
                       const size_t i = size_t((p * H + ih) * W + iw);
                       if (backward) res.v[i] += in[0].v[o] / n;
                       else sum += in[0].v[i];
                     }
                   if (!backward) res.v[o] = sum / n;
                 }
             return std::vector<Expected>{rounded(res, dt, tol_sum(dt, 2 * H * W / out.h / out.w + 4, 2))};
           };
           return s;
         }});
  }

  t.push_back({"conv2d", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 ConvCase c = draw_conv(rng);
                 const bool unbatched = rng.chance(0.15);
                 Shape xs = c.x;
                 if (unbatched) xs.erase(xs.begin());
                 s.inputs = {random_input(rng, xs, dt), random_input(rng, c.w, dt),
                             c.has_bias ? random_input(rng, {c.w[0]}, dt) : Tensor()};
                 s.params = c.str();
                 s.run = [c](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::conv2d(in[0], in[1], in[2], c.o)};
                 };
                 s.reference = [c, dt, unbatched](const std::vector<Host>& in) {
                   const Host x = as_batched(in[0]);
                   Shape out_shape = conv_output_shape(x.sizes, c.w, c.o);
                   Host y = host_zeros(out_shape);
                   if (in[2].defined)
                     for_each_index(out_shape, [&](const auto& idx) { y.at(idx) = in[2].v[size_t(idx[1])]; });
                   for_each_tap(x.sizes, c.w, c.o,
                                [&](int64_t n, int64_t k, int64_t oh, int64_t ow, int64_t ci, int64_t cw, int64_t r,
                                    int64_t sc, int64_t ih, int64_t iw) {
                                  y.at({n, k, oh, ow}) += x.at({n, ci, ih, iw}) * in[1].at({k, cw, r, sc});
                                });
                   if (unbatched) y.sizes.erase(y.sizes.begin());
                   Tol tol = tol_sum(dt, c.w[1] * c.w[2] * c.w[3] + 1, 4);
                   // CUDA stores the convolution in the 16-bit type and then adds the bias (as
                   // PyTorch eager does, tensor/cuda/conv.cu): one more rounding, of the value
                   // before the bias, which may be far larger than the result.
                   if (in[2].defined && (dt == kFloat16 || dt == kBFloat16)) {
                     double before_bias = 0;
                     for_each_index(y.sizes, [&](const auto& idx) {
                       const double b = in[2].v[size_t(idx[unbatched ? 0 : 1])];
                       before_bias = std::max(before_bias, std::fabs(y.at(idx) - b));
                     });
                     tol.atol += (dt == kBFloat16 ? 0x1p-8 : 0x1p-11) * before_bias;  // half an ulp, relative
                   }
                   return std::vector<Expected>{rounded(y, dt, tol)};
                 };
                 return s;
               }});
  t.push_back({"conv2d_backward_input", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 ConvCase c = draw_conv(rng);
                 Shape gs{1, 1, 1, 1};
                 try {
                   gs = conv_output_shape(c.x, c.w, c.o);
                 } catch (const MustThrow&) {}
                 s.inputs = {random_input(rng, gs, dt), random_input(rng, c.w, dt)};
                 s.params = c.str() + " input_shape=" + str(c.x);
                 s.run = [c](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::conv2d_backward_input(in[0], c.x, in[1], c.o)};
                 };
                 s.reference = [c, dt](const std::vector<Host>& in) {
                   conv_output_shape(c.x, c.w, c.o);
                   Host gx = host_zeros(c.x), magnitude = host_zeros(c.x);
                   for_each_tap(c.x, c.w, c.o,
                                [&](int64_t n, int64_t k, int64_t oh, int64_t ow, int64_t ci, int64_t cw, int64_t r,
                                    int64_t sc, int64_t ih, int64_t iw) {
                                  const double term = in[0].at({n, k, oh, ow}) * in[1].at({k, cw, r, sc});
                                  gx.at({n, ci, ih, iw}) += term;
                                  magnitude.at({n, ci, ih, iw}) += std::fabs(term);
                                });
                   Tol tol = tol_sum(dt, c.w[0] * c.w[2] * c.w[3] + 1, 4);
                   // cuDNN's 16-bit backward-data kernels for some strided problems store partial
                   // sums in the 16-bit type (PyTorch's too: tools/torch_conv_rounding.py finds
                   // x (2,4,7,5), w (6,2,3,1), stride 2 off by 200x a float32 accumulation's
                   // bound): allow one ulp of the terms' magnitude.
                   if (dt == kFloat16 || dt == kBFloat16) {
                     double largest = 0;
                     for (double m : magnitude.v) largest = std::max(largest, m);
                     tol.atol += (dt == kBFloat16 ? 0x1p-7 : 0x1p-10) * largest;
                   }
                   return std::vector<Expected>{rounded(gx, dt, tol)};
                 };
                 return s;
               }});
  t.push_back({"conv2d_backward_weight", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 ConvCase c = draw_conv(rng);
                 Shape gs{1, 1, 1, 1};
                 try {
                   gs = conv_output_shape(c.x, c.w, c.o);
                 } catch (const MustThrow&) {}
                 s.inputs = {random_input(rng, gs, dt), random_input(rng, c.x, dt)};
                 s.params = c.str() + " weight_shape=" + str(c.w);
                 s.run = [c](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::conv2d_backward_weight(in[0], in[1], c.w, c.o)};
                 };
                 s.reference = [c, dt, gs](const std::vector<Host>& in) {
                   conv_output_shape(c.x, c.w, c.o);
                   Host gw = host_zeros(c.w);
                   for_each_tap(c.x, c.w, c.o,
                                [&](int64_t n, int64_t k, int64_t oh, int64_t ow, int64_t ci, int64_t cw, int64_t r,
                                    int64_t sc, int64_t ih, int64_t iw) {
                                  gw.at({k, cw, r, sc}) += in[0].at({n, k, oh, ow}) * in[1].at({n, ci, ih, iw});
                                });
                   return std::vector<Expected>{rounded(gw, dt, tol_sum(dt, gs[0] * gs[2] * gs[3] + 1, 4))};
                 };
                 return s;
               }});

  t.push_back({"conv_transpose2d", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const TransposedConvCase c = draw_conv_transpose(rng);
                 s.inputs = {random_input(rng, c.x, dt), random_input(rng, c.w, dt),
                             c.has_bias ? random_input(rng, {c.w[1] * c.o.groups}, dt) : Tensor()};
                 s.params = c.str();
                 s.run = [c](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::conv_transpose2d(in[0], in[1], in[2], c.o)};
                 };
                 s.reference = [c, dt](const std::vector<Host>& in) {
                   // torch's definition: each input pixel adds w times itself into its window.
                   const ConvTranspose2dOptions& o = c.o;
                   const int64_t G = o.groups, cig = c.x[1] / G, cog = c.w[1], R = c.w[2], S = c.w[3];
                   const Shape ys = {
                       c.x[0], cog * G,
                       transposed_out(c.x[2], R, o.stride.h, o.padding.h, o.dilation.h, o.output_padding.h),
                       transposed_out(c.x[3], S, o.stride.w, o.padding.w, o.dilation.w, o.output_padding.w)};
                   Host y = host_zeros(ys), magnitude = host_zeros(ys);
                   if (in[2].defined) for_each_index(ys, [&](const auto& idx) { y.at(idx) = in[2].v[size_t(idx[1])]; });
                   for_each_index(c.x, [&](const auto& xi) {
                     const int64_t n = xi[0], ci = xi[1], g = ci / cig;
                     for (int64_t co = 0; co < cog; ++co)
                       for (int64_t r = 0; r < R; ++r)
                         for (int64_t sc = 0; sc < S; ++sc) {
                           const int64_t oh = xi[2] * o.stride.h - o.padding.h + r * o.dilation.h;
                           const int64_t ow = xi[3] * o.stride.w - o.padding.w + sc * o.dilation.w;
                           if (oh < 0 || oh >= ys[2] || ow < 0 || ow >= ys[3]) continue;
                           const double term = in[0].at(xi) * in[1].at({ci, co, r, sc});
                           y.at({n, g * cog + co, oh, ow}) += term;
                           magnitude.at({n, g * cog + co, oh, ow}) += std::fabs(term);
                         }
                   });
                   Tol tol = tol_sum(dt, cig * R * S + 1, 4);
                   // It runs as conv2d_backward_input (see that entry: cuDNN's 16-bit partial sums),
                   // and the bias is added to the rounded product (one more rounding).
                   if (dt == kFloat16 || dt == kBFloat16) {
                     double largest = 0;
                     for (double m : magnitude.v) largest = std::max(largest, m);
                     tol.atol += (dt == kBFloat16 ? 0x1p-7 : 0x1p-10) * largest;
                   }
                   return std::vector<Expected>{rounded(y, dt, tol)};
                 };
                 return s;
               }});

  for (bool add_relu : {false, true}) {
    t.push_back(
        {add_relu ? "batch_norm_add_relu" : "batch_norm", kFloats, [add_relu](Rng& rng, DType dt) {
           Sample s;
           const Shape xs = bn_input(rng);
           const int64_t C = xs[1];
           const bool training = rng.chance(0.6), running = !training || rng.chance(0.7);
           const double momentum = rng.pick(std::vector<double>{0.1, 0.5}),
                        eps = rng.pick(std::vector<double>{1e-5, 1e-3});
           s.inputs = {random_input(rng, xs, dt),
                       running ? channel_tensor(rng, C, dt) : Tensor(),
                       running ? channel_tensor(rng, C, dt, Values{0.2, 3}) : Tensor(),
                       rng.chance(0.7) ? channel_tensor(rng, C, dt) : Tensor(),
                       rng.chance(0.7) ? channel_tensor(rng, C, dt) : Tensor(),
                       add_relu && rng.chance(0.7) ? random_input(rng, xs, dt) : Tensor()};
           if (running) s.mutates = {1, 2};
           s.params = cat_str("training=", training, " momentum=", momentum, " eps=", eps);
           s.run = [add_relu, training, momentum, eps](const std::vector<Tensor>& in) {
             const ops::BatchNormResult r =
                 add_relu ? ops::batch_norm_add_relu(in[0], in[5], in[1], in[2], in[3], in[4], training, momentum, eps)
                          : ops::batch_norm(in[0], in[1], in[2], in[3], in[4], training, momentum, eps);
             return std::vector<Tensor>{r.out, r.mean, r.invstd, in[1], in[2]};
           };
           std::vector<DType> dts;
           for (const Tensor& x : s.inputs) dts.push_back(x.defined() ? x.dtype() : dt);
           s.reference = [add_relu, training, momentum, eps, dt, dts](const std::vector<Host>& in) {
             const Host& x = in[0];
             const int64_t N = x.sizes[0], C = x.sizes[1], HW = N * C == 0 ? 0 : x.numel() / (N * C);
             if (training && N * HW == 1) throw MustThrow{"one value per channel"};
             const DType st = compute_of(dt);
             Host mean = host_zeros({C}), invstd = host_zeros({C}), rm = in[1], rv = in[2];
             const auto pos = channel_positions(x.sizes);
             for (int64_t c = 0; c < C; ++c) {
               const auto& p = pos[size_t(c)];
               if (training) {
                 double m = 0, q = 0;
                 for (size_t i : p) m += x.v[i];
                 m /= double(p.size());
                 for (size_t i : p) q += (x.v[i] - m) * (x.v[i] - m);
                 const double var = q / double(p.size());
                 mean.v[size_t(c)] = m, invstd.v[size_t(c)] = 1 / std::sqrt(var + eps);
                 if (rm.defined && !p.empty()) {  // a size-0 batch leaves them (Note [Size-0 batch norm])
                   rm.v[size_t(c)] = (1 - momentum) * rm.v[size_t(c)] + momentum * m;
                   rv.v[size_t(c)] = (1 - momentum) * rv.v[size_t(c)] + momentum * q / double(p.size() - 1);
                 }
               } else {
                 mean.v[size_t(c)] = in[1].v[size_t(c)], invstd.v[size_t(c)] = 1 / std::sqrt(in[2].v[size_t(c)] + eps);
               }
             }
             Host y = x;
             for (int64_t c = 0; c < C; ++c)
               for (size_t i : pos[size_t(c)]) {
                 double v = (x.v[i] - mean.v[size_t(c)]) * invstd.v[size_t(c)];
                 if (in[3].defined) v *= in[3].v[size_t(c)];
                 if (in[4].defined) v += in[4].v[size_t(c)];
                 if (add_relu && in[5].defined) v += in[5].v[i];
                 if (add_relu) v = std::max(v, 0.0);
                 y.v[i] = v;
               }
             return std::vector<Expected>{
                 rounded(y, dt, tol_sum(dt, 16, 4)), rounded(mean, st, stats_tol(st)),
                 rounded(invstd, st, stats_tol(st)),
                 rm.defined ? rounded(rm, dts[1], running_stats_tol(dts[1])) : expect_undefined(),
                 rv.defined ? rounded(rv, dts[2], running_stats_tol(dts[2])) : expect_undefined()};
           };
           return s;
         }});
  }
  t.push_back(
      {"batch_norm_backward", kFloats, [](Rng& rng, DType dt) {
         Sample s;
         const Shape xs = bn_input(rng);
         const int64_t C = xs[1];
         const bool training = rng.chance(0.6);
         const DType st = compute_of(dt);
         Tensor x = random_input(rng, xs, dt);
         // The forward's statistics: the batch's (training) or random running ones (eval).
         const Host xh = read_host(x);
         std::vector<double> mean(static_cast<size_t>(C)), invstd(static_cast<size_t>(C));
         const auto pos = channel_positions(xs);
         for (int64_t c = 0; c < C; ++c) {
           const auto& p = pos[size_t(c)];
           double m = 0, q = 0;
           for (size_t i : p) m += xh.v[i];
           m /= double(std::max<size_t>(p.size(), 1));
           for (size_t i : p) q += (xh.v[i] - m) * (xh.v[i] - m);
           mean[size_t(c)] = training ? m : rng.uniform(-1, 1);
           invstd[size_t(c)] =
               training ? 1 / std::sqrt(q / double(std::max<size_t>(p.size(), 1)) + 1e-5) : rng.uniform(0.5, 2);
         }
         const ops::BatchNormGradMask mask{rng.chance(0.85), rng.chance(0.85), rng.chance(0.85)};
         s.inputs = {random_input(rng, xs, dt), x, rng.chance(0.7) ? channel_tensor(rng, C, dt) : Tensor(),
                     tensor_of(mean, {C}, st, &rng), tensor_of(invstd, {C}, st, &rng)};
         s.params = cat_str("training=", training, " mask=(", mask.x, ", ", mask.weight, ", ", mask.bias, ")");
         s.run = [training, mask](const std::vector<Tensor>& in) {
           const ops::BatchNormGrads g = ops::batch_norm_backward(in[0], in[1], in[2], in[3], in[4], training, mask);
           return std::vector<Tensor>{g.x, g.weight, g.bias};
         };
         s.reference = [training, mask, dt, st](const std::vector<Host>& in) {
           const Host &g = in[0], &x = in[1], &w = in[2], &mean = in[3], &invstd = in[4];
           const int64_t C = x.sizes[1];
           const auto pos = channel_positions(x.sizes);
           Host gx = x, gw = host_zeros({C}), gb = host_zeros({C});
           for (int64_t c = 0; c < C; ++c) {
             const auto& p = pos[size_t(c)];
             const double m = mean.v[size_t(c)], is = invstd.v[size_t(c)], wc = w.defined ? w.v[size_t(c)] : 1.0;
             for (size_t i : p) gw.v[size_t(c)] += g.v[i] * (x.v[i] - m) * is, gb.v[size_t(c)] += g.v[i];
             const double M = double(p.size());
             for (size_t i : p) {
               const double xhat = (x.v[i] - m) * is;
               gx.v[i] =
                   training ? wc * is * (g.v[i] - gb.v[size_t(c)] / M - xhat * gw.v[size_t(c)] / M) : wc * is * g.v[i];
             }
           }
           const int64_t M = x.numel() / std::max<int64_t>(C, 1);
           double amp = 1;  // invstd scales the error of the centred sums
           for (double v : invstd.v) amp = std::max(amp, v);
           return std::vector<Expected>{mask.x ? rounded(gx, dt, tol_sum(dt, M + 8, 16 * amp)) : expect_undefined(),
                                        mask.weight ? rounded(gw, st, tol_sum(st, M + 1, 8)) : expect_undefined(),
                                        mask.bias ? rounded(gb, st, tol_sum(st, M + 1, 4)) : expect_undefined()};
         };
         return s;
       }});
}

}  // namespace frugal::optest
