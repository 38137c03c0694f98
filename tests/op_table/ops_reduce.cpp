// Reductions (tensor/ops/reduce.h) over random dim sets of random layouts, against
// plain folds of the elements each output reads, bucketed by logical index.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/ops/reduce.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

/// Dims to reduce: a random subset, some negative, in random order; empty means all.
/// Now and then an invalid list (repeated or out-of-range dim) the op must reject.
std::vector<int64_t> draw_dims(Rng& rng, int64_t ndim) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  std::vector<int64_t> dims;
  if (rng.chance(0.15)) return dims;
  for (int64_t d = 0; d < n; ++d)
    if (rng.chance(0.45)) dims.push_back(rng.chance(0.3) ? d - n : d);
  if (dims.empty()) dims.push_back(rng.range(0, n - 1));
  for (size_t i = dims.size(); i-- > 1;) std::swap(dims[i], dims[size_t(rng.range(0, int64_t(i)))]);
  if (rng.chance(0.03)) dims.push_back(rng.chance(0.5) ? dims[0] : n + rng.range(0, 2));
  return dims;
}

/// Which dims of an ndim-dim input `dims` reduces; throws MustThrow for an invalid list.
std::vector<bool> reduced_mask(const std::vector<int64_t>& dims, int64_t ndim) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  std::vector<bool> mask(size_t(ndim), dims.empty()), seen(size_t(n), false);
  for (int64_t d : dims) {
    if (d < -n || d >= n) throw MustThrow{"dim out of range"};
    const int64_t w = d < 0 ? d + n : d;
    if (seen[size_t(w)]) throw MustThrow{"repeated dim"};
    seen[size_t(w)] = true;
    if (ndim > 0) mask[size_t(w)] = true;
  }
  return mask;
}

/// The elements each output reads, in row-major order of the reduced dims.
struct Buckets {
  Shape out;
  std::vector<std::vector<double>> values;
};
Buckets bucket(const Host& x, const std::vector<bool>& mask, bool keepdim) {
  Buckets b;
  Shape kept;  // the output's dims without keepdim's 1s
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!mask[size_t(d)]) kept.push_back(x.sizes[size_t(d)]);
    if (!mask[size_t(d)]) b.out.push_back(x.sizes[size_t(d)]);
    else if (keepdim) b.out.push_back(1);
  }
  b.values.resize(size_t(numel_of(kept)));
  size_t i = 0;
  for_each_index(x.sizes, [&](const std::vector<int64_t>& idx) {
    int64_t o = 0;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (!mask[size_t(d)]) o = o * x.sizes[size_t(d)] + idx[size_t(d)];
    b.values[size_t(o)].push_back(x.v[i++]);
  });
  return b;
}

template <typename F>
Expected fold(const Buckets& b, DType dtype, Tol tol, F&& f) {
  Host h = host_zeros(b.out);
  for (size_t o = 0; o < b.values.size(); ++o) h.v[o] = round_to(dtype, f(b.values[o]));
  return {std::move(h), dtype, tol};
}

double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
/// The product in float64, or for an integral result in int64, wrapping as the op's does.
double product_of(const std::vector<double>& v, bool integral) {
  if (!integral) {
    double p = 1;
    for (double x : v) p *= x;
    return p;
  }
  uint64_t p = 1;
  for (double x : v) p *= uint64_t(int64_t(x));
  return double(int64_t(p));
}
double mean_of(const std::vector<double>& v) { return v.empty() ? NAN : sum_of(v) / double(v.size()); }
/// The first extreme element's index (NaN beats everything).
int64_t arg_extreme(const std::vector<double>& v, bool is_max) {
  int64_t best = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) return int64_t(i);
    if (is_max ? v[i] > v[size_t(best)] : v[i] < v[size_t(best)]) best = int64_t(i);
  }
  return best;
}

/// Reduction inputs: up to 8 dims, now and then one long enough for the threaded paths.
Shape reduce_shape(Rng& rng) {
  if (rng.chance(0.02)) {
    const int64_t big = 2 * 32768 + rng.range(1, 999);  // past 2 * kParallelGrain in tensor/cpu/loops.h
    return rng.chance(0.5) ? Shape{big} : rng.chance(0.5) ? Shape{3, big / 3} : Shape{big / 5, 5};
  }
  if (rng.chance(0.02)) return big_shape(rng);
  if (rng.chance(0.03)) return {rng.range(1, 9), rng.range(1030, 2100)};  // more inner outputs than kColumnBlock
  return random_shape(rng, {.min_dims = 0, .max_dims = 8, .max_size = 13, .max_numel = 900});
}

Values reduce_values(Rng& rng, DType dt, bool ties) {
  Values v = values_for(dt);
  if (ties && is_floating(dt)) v.step = 0.5;
  return with_specials(rng, v);
}

enum class Red { Sum, Prod, Mean, Amax, Amin, Var };

/// A product's factors: away from 0 (which would make most products 0), and for floating
/// dtypes within 1 +- w of 1 in size, w = min(0.5, 40 / R) for R factors, so that no partial
/// product leaves float32's range (e^+-88) whatever the order of the multiplications (one
/// that does makes the result depend on that order: 0 or inf or NaN); integer products wrap
/// around. NaN but no infinities (inf times a product underflowed to 0 is NaN).
Values product_factors(Rng& rng, DType dt, const Shape& shape, const std::vector<int64_t>& dims) {
  if (!is_floating(dt)) return with_specials(rng, {-4, 4, 1.0, 0.5}, false);
  int64_t R = numel_of(shape);
  try {
    const std::vector<bool> mask = reduced_mask(dims, int64_t(shape.size()));
    R = 1;
    for (size_t d = 0; d < shape.size(); ++d)
      if (mask[d]) R *= shape[d];
  } catch (const MustThrow&) {  // the op must reject these dims: any factors do
  }
  const double w = std::min(0.5, 40.0 / double(std::max<int64_t>(R, 1)));
  return with_specials(rng, {-(1 + w), 1 + w, 0.0, 1 - w}, false);
}

void add_reduce(std::vector<OpEntry>& t, const char* name, Red red, const std::vector<DType>& dtypes) {
  t.push_back(
      {name, dtypes, [red](Rng& rng, DType dt) {
         Sample s;
         const Shape shape = reduce_shape(rng);
         const std::vector<int64_t> dims = draw_dims(rng, int64_t(shape.size()));
         const Values values = red == Red::Prod ? product_factors(rng, dt, shape, dims)
                                                : reduce_values(rng, dt, red == Red::Amax || red == Red::Amin);
         s.inputs = {random_input(rng, shape, dt, values)};
         const bool keepdim = rng.chance(0.4);
         const int64_t correction = red == Red::Var ? rng.range(0, 2) : 0;
         s.params = cat_str("dims=", str(dims), " keepdim=", keepdim, red == Red::Var ? " correction=" : "",
                            red == Red::Var ? std::to_string(correction) : "");
         s.run = [red, dims, keepdim, correction](const std::vector<Tensor>& in) {
           switch (red) {
             case Red::Sum: return std::vector<Tensor>{ops::sum(in[0], dims, keepdim)};
             case Red::Prod: return std::vector<Tensor>{ops::prod(in[0], dims, keepdim)};
             case Red::Mean: return std::vector<Tensor>{ops::mean(in[0], dims, keepdim)};
             case Red::Amax: return std::vector<Tensor>{ops::amax(in[0], dims, keepdim)};
             case Red::Amin: return std::vector<Tensor>{ops::amin(in[0], dims, keepdim)};
             default: return std::vector<Tensor>{ops::var(in[0], dims, correction, keepdim)};
           }
         };
         s.reference = [red, dims, keepdim, correction, dt](const std::vector<Host>& in) {
           const Buckets b = bucket(in[0], reduced_mask(dims, in[0].dim()), keepdim);
           const int64_t R = b.values.empty() ? in[0].numel() : int64_t(b.values[0].size());
           const int64_t reduced = numel_of(in[0].sizes) == 0 ? [&] {
                     int64_t r = 1;  // reduced count of an empty input, from the mask
                     const std::vector<bool> m = reduced_mask(dims, in[0].dim());
                     for (int64_t d = 0; d < in[0].dim(); ++d)
                       if (m[size_t(d)]) r *= in[0].sizes[size_t(d)];
                     return r;
                   }() : R;
           if ((red == Red::Amax || red == Red::Amin) && reduced == 0) throw MustThrow{"no identity"};
           switch (red) {
             case Red::Sum: {
               const DType out = is_floating(dt) ? dt : kInt64;
               return std::vector<Expected>{fold(b, out, tol_sum(out, R), sum_of)};
             }
             case Red::Prod: {  // each multiplication rounds in the opmath type: a relative error
               const DType out = is_floating(dt) ? dt : kInt64;
               Tol tol = tol_for(out);
               if (is_floating(out)) tol.rtol += 4 * (dt == kFloat64 ? 2.3e-16 : 1.2e-7) * double(R);
               return std::vector<Expected>{
                   fold(b, out, tol, [&](const std::vector<double>& v) { return product_of(v, !is_floating(dt)); })};
             }
             case Red::Mean: return std::vector<Expected>{fold(b, dt, tol_sum(dt, 1), mean_of)};
             case Red::Amax:
             case Red::Amin: {
               const bool is_max = red == Red::Amax;
               return std::vector<Expected>{
                   fold(b, dt, {}, [&](const std::vector<double>& v) { return v[size_t(arg_extreme(v, is_max))]; })};
             }
             default:
               return std::vector<Expected>{fold(b, dt, tol_sum(dt, 4), [&](const std::vector<double>& v) {
                 if (v.empty()) return double(NAN);
                 const double m = mean_of(v);
                 double m2 = 0;
                 for (double x : v) m2 += (x - m) * (x - m);
                 const double denom = std::max<double>(0.0, double(v.size()) - double(correction));
                 return m2 / denom;  // 0 / 0 = NaN, m2 / 0 = inf, as in PyTorch
               })};
           }
         };
         return s;
       }});
}

enum class Arg { Max, Min, Argmax, Argmin };

void add_arg_reduce(std::vector<OpEntry>& t, const char* name, Arg arg) {
  t.push_back({name, kAll, [arg](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = reduce_shape(rng);
                 s.inputs = {random_input(rng, shape, dt, reduce_values(rng, dt, true))};
                 const int64_t n = std::max<int64_t>(int64_t(shape.size()), 1);
                 const int64_t dim = rng.chance(0.03) ? n : rng.range(-n, n - 1);
                 const bool keepdim = rng.chance(0.4);
                 s.params = cat_str("dim=", dim, " keepdim=", keepdim);
                 s.run = [arg, dim, keepdim](const std::vector<Tensor>& in) {
                   switch (arg) {
                     case Arg::Max: {
                       const ops::ValuesIndices r = ops::max(in[0], dim, keepdim);
                       return std::vector<Tensor>{r.values, r.indices};
                     }
                     case Arg::Min: {
                       const ops::ValuesIndices r = ops::min(in[0], dim, keepdim);
                       return std::vector<Tensor>{r.values, r.indices};
                     }
                     case Arg::Argmax: return std::vector<Tensor>{ops::argmax(in[0], dim, keepdim)};
                     default: return std::vector<Tensor>{ops::argmin(in[0], dim, keepdim)};
                   }
                 };
                 s.reference = [arg, dim, keepdim, dt](const std::vector<Host>& in) {
                   const std::vector<bool> mask = reduced_mask({dim}, in[0].dim());
                   const int64_t d = wrap_dims({dim}, in[0].dim())[0];
                   if (in[0].dim() > 0 && in[0].sizes[size_t(d)] == 0) throw MustThrow{"empty dim"};
                   const Buckets b = bucket(in[0], mask, keepdim);
                   const bool is_max = arg == Arg::Max || arg == Arg::Argmax;
                   Expected idx = fold(b, kInt64, {}, [&](const auto& v) { return double(arg_extreme(v, is_max)); });
                   if (arg == Arg::Argmax || arg == Arg::Argmin) return std::vector<Expected>{idx};
                   Expected val = fold(b, dt, {}, [&](const auto& v) { return v[size_t(arg_extreme(v, is_max))]; });
                   return std::vector<Expected>{val, idx};
                 };
                 return s;
               }});
}

}  // namespace

void add_reduce_ops(std::vector<OpEntry>& t) {
  add_reduce(t, "sum", Red::Sum, kAll);
  add_reduce(t, "prod", Red::Prod, kAll);
  add_reduce(t, "mean", Red::Mean, kFloats);
  add_reduce(t, "amax", Red::Amax, kAll);
  add_reduce(t, "amin", Red::Amin, kAll);
  add_reduce(t, "var", Red::Var, kFloats);
  add_arg_reduce(t, "max", Arg::Max);
  add_arg_reduce(t, "min", Arg::Min);
  add_arg_reduce(t, "argmax", Arg::Argmax);
  add_arg_reduce(t, "argmin", Arg::Argmin);
}

}  // namespace frugal::optest
