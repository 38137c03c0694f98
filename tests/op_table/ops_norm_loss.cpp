// Row-wise ops: softmax and log_softmax with their backward, masked_softmax, layer norm
// with its backward, and the losses (tensor/ops/softmax.h, masked_softmax.h, norm.h, loss.h).
#include <cmath>
#include <limits>

#include "tensor/ops/loss.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/norm.h"
#include "tensor/ops/softmax.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Calls f(idx, n) for each slice of `shape` along dim d: the slice is idx with idx[d] = 0..n-1.
template <typename F>
void for_each_slice(const Shape& shape, int64_t d, F&& f) {
  Shape outer = shape;
  const int64_t n = shape[size_t(d)];
  outer[size_t(d)] = 1;
  if (n == 0) return;
  for_each_index(outer, [&](const std::vector<int64_t>& idx) { f(idx, n); });
}

/// Softmax (or log-softmax) of each slice along d, NaN slices NaN, as Note [Stable softmax].
Host softmax_ref(const Host& x, int64_t d, bool log) {
  Host y = x;
  for_each_slice(x.sizes, d, [&](std::vector<int64_t> idx, int64_t n) {
    double m = -kInf;
    bool nan = false;
    for (idx[size_t(d)] = 0; idx[size_t(d)] < n; ++idx[size_t(d)]) {
      const double v = x.at(idx);
      nan = nan || std::isnan(v);
      m = std::max(m, v);
    }
    double se = 0;
    for (idx[size_t(d)] = 0; idx[size_t(d)] < n; ++idx[size_t(d)]) se += std::exp(x.at(idx) - m);
    for (idx[size_t(d)] = 0; idx[size_t(d)] < n; ++idx[size_t(d)]) {
      const double v = x.at(idx);
      double r = log ? v - m - std::log(se) : std::exp(v - m) / se;
      if (nan || m == -kInf) r = NAN;
      y.at(idx) = r;
    }
  });
  return y;
}

Expected rounded(Host h, DType dt, Tol tol) {
  for (double& v : h.v) v = round_to(dt, v);
  return {std::move(h), dt, tol};
}

Shape row_shape(Rng& rng, int min_dims = 0) {
  if (rng.chance(0.02)) return big_shape(rng);
  if (rng.chance(0.03)) return {rng.range(1, 5), rng.range(1000, 4100)};  // long rows
  return random_shape(rng, {.min_dims = min_dims, .max_dims = 8, .max_size = 13, .max_numel = 700});
}

DType stats_dtype(DType dt) { return dt == kFloat64 ? kFloat64 : kFloat32; }

/// Per-row (mean, rstd) of x seen as (M, N) rows, in double.
void row_stats(const Host& x, int64_t N, double eps, std::vector<double>& mean, std::vector<double>& rstd) {
  const int64_t M = N == 0 ? 0 : x.numel() / N;
  mean.assign(size_t(M), 0);
  rstd.assign(size_t(M), 0);
  for (int64_t r = 0; r < M; ++r) {
    double s = 0, q = 0;
    for (int64_t j = 0; j < N; ++j) s += x.v[size_t(r * N + j)];
    const double m = s / double(N);
    for (int64_t j = 0; j < N; ++j) q += (x.v[size_t(r * N + j)] - m) * (x.v[size_t(r * N + j)] - m);
    mean[size_t(r)] = m;
    rstd[size_t(r)] = 1.0 / std::sqrt(q / double(N) + eps);
  }
}

/// The cross-entropy of one row: (lse, loss) for target t (Note [Fused cross entropy]).
struct CeRow {
  double lse, loss;
  bool ignored;
};

/// The rows of logits (N, C, d...) / (C): row r's class c at logits index.
struct CeView {
  int64_t R = 0, C = 0;
  std::vector<std::vector<double>> rows;
  std::vector<int64_t> targets;
};
CeView ce_rows(const Host& logits, const Host& target) {
  CeView v;
  v.C = logits.dim() == 1 ? logits.sizes[0] : logits.sizes[1];
  v.R = target.numel();
  for_each_index(target.sizes, [&](const std::vector<int64_t>& t) {
    std::vector<double> row;
    for (int64_t c = 0; c < v.C; ++c) {
      std::vector<int64_t> idx = t;
      if (logits.dim() == 1) idx = {c};
      else idx.insert(idx.begin() + 1, c);
      row.push_back(logits.at(idx));
    }
    v.rows.push_back(row);
    v.targets.push_back(int64_t(target.at(t)));
  });
  return v;
}

CeRow ce_row(const std::vector<double>& x, int64_t t, int64_t ignore, double e) {
  double m = -kInf, sx = 0;
  for (double v : x) m = std::max(m, v), sx += v;
  double se = 0;
  for (double v : x) se += std::exp(v - m);
  const double lse = x.empty() ? -kInf : m + std::log(se);
  if (t == ignore) return {lse, 0.0, true};
  if (t < 0 || t >= int64_t(x.size())) throw MustThrow{"target out of range"};
  return {lse, (1 - e) * (lse - x[size_t(t)]) + e * (lse - sx / double(x.size())), false};
}

struct CeCase {
  Shape logits_shape, target_shape;
  CrossEntropyOptions opts;
};
CeCase draw_ce(Rng& rng) {
  CeCase c;
  const int64_t C = random_size(rng, 9, 0.03, 0.1);
  const int kind = int(rng.range(0, 2));
  if (kind == 0) c.logits_shape = {C};
  if (kind == 1) c.logits_shape = {random_size(rng, 9, 0.05), C};
  if (kind == 2) {
    c.logits_shape = random_shape(rng, {.min_dims = 3, .max_dims = 5, .max_size = 5, .max_numel = 300});
    c.logits_shape[1] = C;
  }
  c.target_shape = c.logits_shape;
  c.target_shape.erase(c.target_shape.begin() + (kind == 0 ? 0 : 1));
  c.opts.ignore_index = rng.chance(0.5) ? -100 : rng.range(0, std::max<int64_t>(C - 1, 0));
  c.opts.label_smoothing = rng.pick(std::vector<double>{0.0, 0.0, 0.1, 0.5});
  c.opts.reduction = rng.pick(std::vector<Reduction>{Reduction::None, Reduction::Mean, Reduction::Sum});
  return c;
}

/// Targets in [0, C) or ignore_index, one invalid with p = 0.03.
Tensor draw_targets(Rng& rng, const CeCase& c) {
  const int64_t C = c.logits_shape.size() == 1 ? c.logits_shape[0] : c.logits_shape[1];
  std::vector<double> v(size_t(numel_of(c.target_shape)));
  for (double& t : v) t = rng.chance(0.15) || C == 0 ? double(c.opts.ignore_index) : double(rng.range(0, C - 1));
  if (!v.empty() && rng.chance(0.03)) v[0] = rng.chance(0.5) ? double(C) : -1.0;
  return tensor_of(v, c.target_shape, rng.chance(0.5) ? kInt64 : kInt32, &rng);
}

const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Mean ? "mean" : "sum";
}

}  // namespace

void add_norm_loss_ops(std::vector<OpEntry>& t) {
  for (bool log : {false, true}) {
    t.push_back({log ? "log_softmax" : "softmax", kFloats, [log](Rng& rng, DType dt) {
                   Sample s;
                   const Shape shape = row_shape(rng);
                   Values v{-4, 4};
                   if (rng.chance(0.1)) v.p_nan = 0.02;
                   if (rng.chance(0.15)) v.p_neg_inf = 0.3;  // masked entries, whole rows now and then
                   s.inputs = {random_input(rng, shape, dt, v)};
                   const int64_t n = std::max<int64_t>(int64_t(shape.size()), 1), dim = rng.range(-n, n - 1);
                   s.params = cat_str("dim=", dim);
                   s.run = [log, dim](const std::vector<Tensor>& in) {
                     return std::vector<Tensor>{log ? ops::log_softmax(in[0], dim) : ops::softmax(in[0], dim)};
                   };
                   s.reference = [log, dim, dt](const std::vector<Host>& in) {
                     const Host x = in[0].dim() == 0 ? Host{true, {1}, in[0].v} : in[0];
                     Host y = softmax_ref(x, wrap_dims({dim}, x.dim())[0], log);
                     y.sizes = in[0].sizes;
                     return std::vector<Expected>{rounded(y, dt, tol_sum(dt, 8, 4))};
                   };
                   return s;
                 }});
    t.push_back(
        {log ? "log_softmax_backward" : "softmax_backward", kFloats, [log](Rng& rng, DType dt) {
           Sample s;
           const Shape shape = row_shape(rng);
           s.inputs = {random_input(rng, shape, dt), random_input(rng, shape, dt, log ? Values{-3, 0} : Values{0, 1})};
           const int64_t n = std::max<int64_t>(int64_t(shape.size()), 1), dim = rng.range(-n, n - 1);
           s.params = cat_str("dim=", dim);
           s.run = [log, dim](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{log ? ops::log_softmax_backward(in[0], in[1], dim)
                                            : ops::softmax_backward(in[0], in[1], dim)};
           };
           s.reference = [log, dim, dt](const std::vector<Host>& in) {
             const bool zero_d = in[0].dim() == 0;
             const Host g = zero_d ? Host{true, {1}, in[0].v} : in[0];
             const Host y = zero_d ? Host{true, {1}, in[1].v} : in[1];
             const int64_t d = wrap_dims({dim}, g.dim())[0];
             Host out = g;
             for_each_slice(g.sizes, d, [&](std::vector<int64_t> idx, int64_t len) {
               double acc = 0;
               for (idx[size_t(d)] = 0; idx[size_t(d)] < len; ++idx[size_t(d)])
                 acc += log ? g.at(idx) : g.at(idx) * y.at(idx);
               for (idx[size_t(d)] = 0; idx[size_t(d)] < len; ++idx[size_t(d)])
                 out.at(idx) = log ? g.at(idx) - std::exp(y.at(idx)) * acc : y.at(idx) * (g.at(idx) - acc);
             });
             out.sizes = in[0].sizes;
             const int64_t len = g.sizes[size_t(d)];
             return std::vector<Expected>{rounded(out, dt, tol_sum(dt, len + 1, 4))};
           };
           return s;
         }});
  }

  t.push_back({"masked_softmax", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const bool causal = rng.chance(0.3);
                 const Shape shape =
                     random_shape(rng, {.min_dims = causal ? 2 : 1, .max_dims = 5, .max_size = 11, .max_numel = 600});
                 const int kind = int(rng.range(0, 2));  // none, bool, added
                 const double scale = rng.pick(std::vector<double>{1.0, 0.125, 2.5});
                 s.inputs = {random_input(rng, shape, dt, Values{-3, 3}),
                             kind == 0   ? Tensor()
                             : kind == 1 ? random_input(rng, broadcast_operand(rng, shape), kBool)
                                         : random_input(rng, broadcast_operand(rng, shape), dt,
                                                        Values{.lo = -2, .hi = 2, .p_neg_inf = 0.3})};
                 s.params = cat_str("is_causal=", causal, " scale=", scale);
                 s.run = [causal, scale](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::masked_softmax(in[0], in[1], causal, scale)};
                 };
                 s.reference = [causal, scale, kind, dt](const std::vector<Host>& in) {
                   const Host& x = in[0];
                   Host z = x;  // the masked, scaled scores
                   size_t i = 0;
                   for_each_index(x.sizes, [&](const std::vector<int64_t>& idx) {
                     double v = scale * x.v[i];
                     if (kind == 1 && in[1].at_broadcast(idx) == 0) v = -kInf;
                     if (kind == 2) v += in[1].at_broadcast(idx);
                     if (causal && idx.back() > idx[idx.size() - 2]) v = -kInf;
                     z.v[i++] = v;
                   });
                   Host y = softmax_ref(z, z.dim() - 1, false);
                   for (size_t k = 0; k < y.v.size(); ++k)
                     if (std::isnan(y.v[k])) y.v[k] = 0;  // a row with no finite entry: zeros
                   return std::vector<Expected>{rounded(y, dt, tol_sum(dt, 8, 4))};
                 };
                 return s;
               }});

  t.push_back({"layer_norm", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = row_shape(rng, 1);
                 const int64_t k = rng.range(1, std::min<int64_t>(3, int64_t(shape.size())));
                 const Shape norm(shape.end() - k, shape.end());
                 const double eps = rng.pick(std::vector<double>{1e-5, 1e-3, 0.1});
                 s.inputs = {random_input(rng, shape, dt), rng.chance(0.7) ? random_input(rng, norm, dt) : Tensor(),
                             rng.chance(0.7) ? random_input(rng, norm, dt) : Tensor()};
                 s.params = cat_str("normalized_shape=", str(norm), " eps=", eps);
                 s.run = [norm, eps](const std::vector<Tensor>& in) {
                   const ops::LayerNormResult r = ops::layer_norm(in[0], norm, in[1], in[2], eps);
                   return std::vector<Tensor>{r.out, r.mean, r.rstd};
                 };
                 s.reference = [norm, eps, dt](const std::vector<Host>& in) {
                   const int64_t N = numel_of(norm);
                   const Shape rows(in[0].sizes.begin(), in[0].sizes.end() - int64_t(norm.size()));
                   std::vector<double> mean, rstd;
                   row_stats(in[0], N, eps, mean, rstd);
                   Host y = in[0];
                   for (int64_t i = 0; i < y.numel(); ++i) {
                     const int64_t r = i / N, j = i % N;
                     double v = (y.v[size_t(i)] - mean[size_t(r)]) * rstd[size_t(r)];
                     if (in[1].defined) v *= in[1].v[size_t(j)];
                     if (in[2].defined) v += in[2].v[size_t(j)];
                     y.v[size_t(i)] = v;
                   }
                   const DType st = stats_dtype(dt);
                   Host m{true, rows, mean}, rs{true, rows, rstd};
                   if (N == 0) m.v = rs.v = std::vector<double>(size_t(numel_of(rows)), NAN);
                   const Tol stats_tol{st == kFloat64 ? 1e-10 : 1e-4, st == kFloat64 ? 1e-12 : 1e-5};
                   return std::vector<Expected>{rounded(y, dt, tol_sum(dt, 16, 4)), rounded(m, st, stats_tol),
                                                rounded(rs, st, stats_tol)};
                 };
                 return s;
               }});

  t.push_back({"layer_norm_backward", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = row_shape(rng, 1);
                 const int64_t k = rng.range(1, std::min<int64_t>(3, int64_t(shape.size())));
                 const Shape norm(shape.end() - k, shape.end());
                 const Shape rows(shape.begin(), shape.end() - k);
                 Tensor x = random_input(rng, shape, dt);
                 // The forward's statistics, computed here from x's stored values.
                 std::vector<double> mean, rstd;
                 row_stats(read_host(x), numel_of(norm), 1e-5, mean, rstd);
                 if (numel_of(norm) == 0) mean = rstd = std::vector<double>(size_t(numel_of(rows)), NAN);
                 const bool has_bias = rng.chance(0.6);
                 const ops::LayerNormGradMask mask{rng.chance(0.85), rng.chance(0.85), rng.chance(0.85)};
                 s.inputs = {random_input(rng, shape, dt), x, tensor_of(mean, rows, stats_dtype(dt), &rng),
                             tensor_of(rstd, rows, stats_dtype(dt), &rng),
                             rng.chance(0.7) ? random_input(rng, norm, dt) : Tensor()};
                 s.params = cat_str("normalized_shape=", str(norm), " has_bias=", has_bias, " mask=(", mask.x, ", ",
                                    mask.weight, ", ", mask.bias, ")");
                 s.run = [norm, has_bias, mask](const std::vector<Tensor>& in) {
                   const ops::LayerNormGrads g =
                       ops::layer_norm_backward(in[0], in[1], norm, in[2], in[3], in[4], has_bias, mask);
                   return std::vector<Tensor>{g.x, g.weight, g.bias};
                 };
                 s.reference = [norm, has_bias, mask, dt](const std::vector<Host>& in) {
                   const Host &g = in[0], &x = in[1], &mu = in[2], &rs = in[3], &w = in[4];
                   const int64_t N = numel_of(norm), M = N == 0 ? mu.numel() : x.numel() / N;
                   Host dx = x, dw = host_zeros(norm), db = host_zeros(norm);
                   for (int64_t r = 0; r < M && N > 0; ++r) {
                     double a = 0, b = 0;  // mean_N(dxhat), mean_N(dxhat * xhat)
                     for (int64_t j = 0; j < N; ++j) {
                       const size_t i = size_t(r * N + j);
                       const double xhat = (x.v[i] - mu.v[size_t(r)]) * rs.v[size_t(r)];
                       const double dxhat = g.v[i] * (w.defined ? w.v[size_t(j)] : 1.0);
                       a += dxhat, b += dxhat * xhat;
                       dw.v[size_t(j)] += g.v[i] * xhat;
                       db.v[size_t(j)] += g.v[i];
                     }
                     a /= double(N), b /= double(N);
                     for (int64_t j = 0; j < N; ++j) {
                       const size_t i = size_t(r * N + j);
                       const double xhat = (x.v[i] - mu.v[size_t(r)]) * rs.v[size_t(r)];
                       const double dxhat = g.v[i] * (w.defined ? w.v[size_t(j)] : 1.0);
                       dx.v[i] = rs.v[size_t(r)] * (dxhat - a - xhat * b);
                     }
                   }
                   return std::vector<Expected>{
                       mask.x ? rounded(dx, dt, tol_sum(dt, N + 4, 16)) : expect_undefined(),
                       mask.weight && w.defined ? rounded(dw, dt, tol_sum(dt, M + 1, 8)) : expect_undefined(),
                       mask.bias && has_bias ? rounded(db, dt, tol_sum(dt, M + 1, 4)) : expect_undefined()};
                 };
                 return s;
               }});

  t.push_back({"cross_entropy", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const CeCase c = draw_ce(rng);
                 s.inputs = {random_input(rng, c.logits_shape, dt, Values{-4, 4}), draw_targets(rng, c)};
                 s.params = cat_str("ignore_index=", c.opts.ignore_index, " label_smoothing=", c.opts.label_smoothing,
                                    " reduction=", reduction_name(c.opts.reduction));
                 s.run = [c](const std::vector<Tensor>& in) {
                   const ops::CrossEntropyResult r = ops::cross_entropy(in[0], in[1], c.opts);
                   return std::vector<Tensor>{r.loss, r.lse, r.count};
                 };
                 s.reference = [c, dt](const std::vector<Host>& in) {
                   const CeView v = ce_rows(in[0], in[1]);
                   Host loss = host_zeros(in[1].sizes), lse = host_zeros(in[1].sizes);
                   double total = 0, count = 0;
                   for (int64_t r = 0; r < v.R; ++r) {
                     const CeRow row =
                         ce_row(v.rows[size_t(r)], v.targets[size_t(r)], c.opts.ignore_index, c.opts.label_smoothing);
                     loss.v[size_t(r)] = row.loss, lse.v[size_t(r)] = row.lse;
                     total += row.loss, count += row.ignored ? 0 : 1;
                   }
                   const DType st = stats_dtype(dt);
                   std::vector<Expected> out;
                   const Tol tol = tol_sum(dt, v.C + 8, 8);
                   if (c.opts.reduction == Reduction::None) out.push_back(rounded(loss, dt, tol));
                   if (c.opts.reduction == Reduction::Sum)
                     out.push_back(rounded(Host{true, {}, {total}}, dt, tol_sum(dt, v.R * (v.C + 8), 8)));
                   if (c.opts.reduction == Reduction::Mean)
                     out.push_back(rounded(Host{true, {}, {total / count}}, dt, tol_sum(dt, v.C + 8, 8)));
                   // lse is float64 for every dtype (Note [Cross entropy keeps lse in float64]), accurate
                   // to the compute type's sums (CUDA sums exps in float32).
                   out.push_back(rounded(lse, kFloat64, tol_sum(st, v.C + 8, 4)));
                   out.push_back(c.opts.reduction == Reduction::Mean ? Expected{Host{true, {}, {count}}, st, {}}
                                                                     : expect_undefined());
                   return out;
                 };
                 return s;
               }});

  t.push_back({"cross_entropy_backward", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const CeCase c = draw_ce(rng);
                 Tensor logits = random_input(rng, c.logits_shape, dt, Values{-4, 4});
                 Tensor target = draw_targets(rng, c);
                 // The forward's lse and count, computed here from the stored logits.
                 const CeView v = ce_rows(read_host(logits), read_host(target));
                 std::vector<double> lse;
                 double count = 0;
                 bool bad_target = false;
                 for (int64_t r = 0; r < v.R; ++r) {
                   double m = -kInf, se = 0;
                   for (double x : v.rows[size_t(r)]) m = std::max(m, x);
                   for (double x : v.rows[size_t(r)]) se += std::exp(x - m);
                   lse.push_back(v.C == 0 ? -kInf : m + std::log(se));
                   const int64_t tr = v.targets[size_t(r)];
                   count += tr != c.opts.ignore_index;
                   bad_target = bad_target || (tr != c.opts.ignore_index && (tr < 0 || tr >= v.C));
                 }
                 const DType st = stats_dtype(dt);
                 const Shape loss_shape = c.opts.reduction == Reduction::None ? c.target_shape : Shape{};
                 s.inputs = {random_input(rng, loss_shape, dt), logits, target,
                             tensor_of(lse, c.target_shape, kFloat64, &rng),  // Note [Cross entropy keeps lse in float64]
                             c.opts.reduction == Reduction::Mean ? tensor_of({count}, {}, st) : Tensor()};
                 s.params = cat_str("ignore_index=", c.opts.ignore_index, " label_smoothing=", c.opts.label_smoothing,
                                    " reduction=", reduction_name(c.opts.reduction));
                 s.run = [c](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::cross_entropy_backward(in[0], in[1], in[2], in[3], in[4], c.opts)};
                 };
                 s.reference = [c, dt, v, bad_target](const std::vector<Host>& in) {
                   (void)bad_target;  // the backward does not validate targets: a bad one gets no one-hot term
                   const double e = c.opts.label_smoothing;
                   Host grad = host_zeros(in[1].sizes);
                   int64_t r = 0;
                   for_each_index(in[2].sizes, [&](const std::vector<int64_t>& tidx) {
                     const int64_t tr = v.targets[size_t(r)];
                     double scale = c.opts.reduction == Reduction::None ? in[0].at(tidx) : in[0].v[0];
                     if (c.opts.reduction == Reduction::Mean) scale /= in[4].v[0];
                     if (tr == c.opts.ignore_index) scale = 0;
                     for (int64_t k = 0; k < v.C; ++k) {
                       std::vector<int64_t> idx = tidx;
                       if (in[1].dim() == 1) idx = {k};
                       else idx.insert(idx.begin() + 1, k);
                       const double p = std::exp(in[1].at(idx) - in[3].at(tidx));
                       grad.at(idx) = scale * (p - (1 - e) * double(k == tr) - e / double(v.C));
                     }
                     ++r;
                   });
                   return std::vector<Expected>{rounded(grad, dt, tol_sum(dt, 8, 8))};
                 };
                 return s;
               }});

  t.push_back(
      {"mse_loss", kFloats, [](Rng& rng, DType dt) {
         Sample s;
         const Shape shape = random_shape(rng, {.min_dims = 0, .max_dims = 6, .max_size = 7, .max_numel = 500});
         s.inputs = {random_input(rng, broadcast_operand(rng, shape), dt),
                     random_input(rng, broadcast_operand(rng, shape), dt)};
         const Reduction red = rng.pick(std::vector<Reduction>{Reduction::None, Reduction::Mean, Reduction::Sum});
         s.params = cat_str("reduction=", reduction_name(red));
         s.run = [red](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::mse_loss(in[0], in[1], red)}; };
         s.reference = [red, dt](const std::vector<Host>& in) {
           const Shape shape = broadcast(in[0].sizes, in[1].sizes);
           Host sq = host_zeros(shape);
           size_t i = 0;
           double total = 0;
           for_each_index(shape, [&](const std::vector<int64_t>& idx) {
             const double d = in[0].at_broadcast(idx) - in[1].at_broadcast(idx);
             sq.v[i++] = d * d;
             total += round_to(dt, d * d);  // the kernels sum the rounded squares
           });
           const int64_t n = numel_of(shape);
           if (red == Reduction::None) return std::vector<Expected>{rounded(sq, dt, tol_sum(dt, 4, 16))};
           const double v = red == Reduction::Sum ? total : n == 0 ? NAN : total / double(n);
           return std::vector<Expected>{rounded(Host{true, {}, {v}}, dt, tol_sum(dt, n + 4, 16))};
         };
         return s;
       }});
}

}  // namespace frugal::optest
