// Data movement (tensor/ops/copy.h, fill.h, join.h and the copying Tensor methods):
// every dtype pair of a copy, broadcasting sources, strided destinations, joins.
#include <cmath>

#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/join.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

/// v converted as a copy into `to` converts it: != 0 for bool, truncation for integers.
double convert(double v, DType to) {
  if (to == kBool) return v != 0 ? 1.0 : 0.0;
  if (!is_floating(to)) return std::trunc(v);
  return round_to(to, v);
}

Values copy_values(DType dt) {
  return dt == kBool ? Values{0, 1, 1} : is_floating(dt) ? Values{-9, 9} : Values{-9, 9, 1};
}

Shape any_shape(Rng& rng, int max_dims = 8) {
  if (rng.chance(0.015)) return big_shape(rng);
  return random_shape(rng, {.min_dims = 0, .max_dims = max_dims, .max_size = 9, .max_numel = 600});
}

/// A random shape with `numel` elements (a 0 somewhere when numel is 0), one dim -1 at times.
Shape regroup(Rng& rng, const Shape& from) {
  const int64_t n = numel_of(from);
  Shape to;
  if (n == 0) {
    to = from;
    for (size_t i = to.size(); i-- > 1;) std::swap(to[i], to[size_t(rng.range(0, int64_t(i)))]);
    return to;
  }
  std::vector<int64_t> primes;
  for (int64_t m = n, p = 2; m > 1; p = p * p > m ? m : p + 1)
    while (m % p == 0) primes.push_back(p), m /= p;
  const int64_t dims = rng.range(primes.empty() ? 0 : 1, std::min<int64_t>(6, int64_t(primes.size()) + 1));
  to.assign(size_t(dims), 1);
  for (int64_t p : primes) to[size_t(rng.range(0, dims - 1))] *= p;
  if (!to.empty() && rng.chance(0.3)) to[size_t(rng.range(0, dims - 1))] = -1;
  return to;
}

/// The pieces split/chunk return: the lengths along dim.
std::vector<int64_t> split_lengths(int64_t n, int64_t size) {
  std::vector<int64_t> out;
  if (size == 0) return {n};
  for (int64_t start = 0; start < n || out.empty(); start += size) out.push_back(std::min(size, n - start));
  return out;
}

/// The pieces of x along dim with `lengths`, as Expected outputs in x's dtype.
std::vector<Expected> pieces(const Host& x, int64_t dim, const std::vector<int64_t>& lengths, DType dt) {
  std::vector<Expected> out;
  int64_t start = 0;
  for (int64_t len : lengths) {
    Shape s = x.sizes;
    s[size_t(dim)] = len;
    out.push_back(make_expected(s, dt, {}, [&](std::vector<int64_t> idx) {
      idx[size_t(dim)] += start;
      return x.at(idx);
    }));
    start += len;
  }
  return out;
}

}  // namespace

void add_copy_ops(std::vector<OpEntry>& t) {
  t.push_back({"copy_", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = any_shape(rng);
                 const DType src = rng.chance(0.5) ? dt : rng.pick(kAll);
                 s.inputs = {random_input(rng, shape, dt, copy_values(dt), {.expand = false}),
                             random_input(rng, broadcast_operand(rng, shape), src, copy_values(src))};
                 s.mutates = {0};
                 s.run = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].copy_(in[1])}; };
                 s.reference = [dt](const std::vector<Host>& in) {
                   return std::vector<Expected>{make_expected(
                       in[0].sizes, dt, {}, [&](const auto& idx) { return convert(in[1].at_broadcast(idx), dt); })};
                 };
                 return s;
               }});
  // copy_ between two views of one storage: the source must be read as it was.
  t.push_back(
      {"copy_overlapping", kAll, [](Rng& rng, DType dt) {
         Sample s;
         const int kind = int(rng.range(0, 3));
         const int64_t n = rng.range(1, 9), k = rng.range(1, 3);
         Tensor dst, src;
         if (kind == 0) {  // a square matrix and its transpose
           dst = random_input(rng, {n, n}, dt, copy_values(dt), {.expand = false});
           src = dst.t();
         } else if (kind == 1) {  // rows shifted by k, either way
           const Tensor base = random_input(rng, {n + k, rng.range(1, 5)}, dt, copy_values(dt), {.expand = false});
           dst = base.narrow(0, rng.chance(0.5) ? k : 0, n);
           src = base.narrow(0, dst.storage_offset() == base.storage_offset() ? k : 0, n);
         } else if (kind == 2) {  // the same view
           dst = src = random_input(rng, any_shape(rng), dt, copy_values(dt), {.expand = false});
         } else {  // interleaved, disjoint: even and odd elements
           const Tensor base = random_input(rng, {2 * n}, dt, copy_values(dt), {.expand = false});
           dst = base.slice(0, 0, 2 * n, 2), src = base.slice(0, 1, 2 * n, 2);
         }
         s.inputs = {dst, src};
         s.mutates = {0};
         s.params = cat_str("overlap=", kind == 0   ? "transpose"
                                        : kind == 1 ? "shift"
                                        : kind == 2 ? "same"
                                                    : "interleaved");
         s.run = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].copy_(in[1])}; };
         s.reference = [dt](const std::vector<Host>& in) { return std::vector<Expected>{{in[1], dt, {}}}; };
         return s;
       }});
  for (const char* name : {"contiguous", "clone"}) {
    const bool clone = std::string(name) == "clone";
    t.push_back({name, kAll, [clone](Rng& rng, DType dt) {
                   Sample s;
                   s.inputs = {random_input(rng, any_shape(rng), dt, copy_values(dt))};
                   s.run = [clone](const std::vector<Tensor>& in) {
                     const Tensor out = clone ? in[0].clone() : in[0].contiguous();
                     FRUGAL_CHECK(!clone || !out.shares_storage(in[0]), "clone shares its input's storage");
                     return std::vector<Tensor>{out};
                   };
                   s.reference = [dt](const std::vector<Host>& in) {
                     Expected e{in[0], dt, {}};
                     e.contiguous = true;
                     return std::vector<Expected>{e};
                   };
                   return s;
                 }});
  }
  t.push_back({"to_dtype", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const DType to = rng.pick(kAll);
                 s.inputs = {random_input(rng, any_shape(rng), dt, copy_values(dt))};
                 s.params = cat_str("to=", dtype_name(to));
                 s.run = [to](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].to(to)}; };
                 s.reference = [to](const std::vector<Host>& in) {
                   return std::vector<Expected>{
                       make_expected(in[0].sizes, to, {}, [&](const auto& idx) { return convert(in[0].at(idx), to); })};
                 };
                 return s;
               }});
  t.push_back({"reshape", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = any_shape(rng);
                 const Shape to = regroup(rng, shape);
                 s.inputs = {random_input(rng, shape, dt, copy_values(dt))};
                 s.params = cat_str("shape=", str(to));
                 s.run = [to](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].reshape(to)}; };
                 s.reference = [to, dt](const std::vector<Host>& in) {
                   Shape out = to;
                   int64_t known = 1;  // the product of the sizes other than -1
                   for (int64_t n : to)
                     if (n != -1) known *= n;
                   for (int64_t& n : out)
                     if (n == -1) n = known == 0 ? 0 : in[0].numel() / known;
                   return std::vector<Expected>{Expected{Host{true, out, in[0].v}, dt, {}}};
                 };
                 return s;
               }});
  for (bool zero : {false, true}) {
    t.push_back({zero ? "zero_" : "fill_", kAll, [zero](Rng& rng, DType dt) {
                   Sample s;
                   s.inputs = {random_input(rng, any_shape(rng), dt, copy_values(dt), {.expand = false})};
                   s.mutates = {0};
                   const double value = zero ? 0.0 : is_floating(dt) ? rng.uniform(-5, 5) : double(rng.range(-9, 9));
                   s.params = cat_str("value=", value);
                   s.run = [zero, value](const std::vector<Tensor>& in) {
                     zero ? ops::zero_(in[0]) : ops::fill_(in[0], value);
                     return std::vector<Tensor>{in[0]};
                   };
                   s.reference = [dt, value](const std::vector<Host>& in) {
                     return std::vector<Expected>{
                         make_expected(in[0].sizes, dt, {}, [&](const auto&) { return convert(value, dt); })};
                   };
                   return s;
                 }});
  }

  // ---- join --------------------------------------------------------------------
  t.push_back({"cat", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape base = random_shape(rng, {.min_dims = 1, .max_dims = 5, .max_size = 6, .max_numel = 200});
                 const int64_t nd = int64_t(base.size()), dim = rng.range(-nd, nd - 1), k = rng.range(1, 4);
                 for (int64_t i = 0; i < k; ++i) {
                   if (rng.chance(0.08)) {  // PyTorch's legacy rule: a (0,) input is skipped
                     s.inputs.push_back(random_input(rng, {0}, rng.chance(0.7) ? dt : rng.pick(kAll)));
                     continue;
                   }
                   Shape shape = base;
                   shape[size_t(dim < 0 ? dim + nd : dim)] = random_size(rng, 5, 0.15);
                   const DType ti = rng.chance(0.8) ? dt : rng.pick(kAll);
                   s.inputs.push_back(random_input(rng, shape, ti, copy_values(ti)));
                 }
                 s.params = cat_str("dim=", dim);
                 s.run = [dim](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::cat(in, dim)}; };
                 std::vector<DType> dtypes;
                 for (const Tensor& x : s.inputs) dtypes.push_back(x.dtype());
                 s.reference = [dim, dtypes](const std::vector<Host>& in) {
                   DType out = dtypes[0];
                   for (DType d : dtypes) out = ref_promote(out, d);
                   std::vector<const Host*> used;
                   for (const Host& h : in)
                     if (!(h.dim() == 1 && h.sizes[0] == 0)) used.push_back(&h);
                   if (used.empty()) {  // every input skipped: dim must still be valid for a 1-D tensor
                     if (dim < -1 || dim > 0) throw MustThrow{"dim out of range"};
                     return std::vector<Expected>{Expected{host_zeros({0}), out, {}}};
                   }
                   const int64_t d = dim < 0 ? dim + used[0]->dim() : dim;
                   Shape shape = used[0]->sizes;
                   shape[size_t(d)] = 0;
                   for (const Host* h : used) shape[size_t(d)] += h->sizes[size_t(d)];
                   return std::vector<Expected>{make_expected(shape, out, {}, [&](std::vector<int64_t> idx) {
                     for (const Host* h : used) {
                       if (idx[size_t(d)] < h->sizes[size_t(d)]) return convert(h->at(idx), out);
                       idx[size_t(d)] -= h->sizes[size_t(d)];
                     }
                     return 0.0;
                   })};
                 };
                 return s;
               }});
  t.push_back({"stack", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = random_shape(rng, {.min_dims = 0, .max_dims = 5, .max_size = 6, .max_numel = 200});
                 const int64_t nd = int64_t(shape.size()), dim = rng.range(-nd - 1, nd), k = rng.range(1, 4);
                 for (int64_t i = 0; i < k; ++i) s.inputs.push_back(random_input(rng, shape, dt, copy_values(dt)));
                 s.params = cat_str("dim=", dim);
                 s.run = [dim](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::stack(in, dim)}; };
                 s.reference = [dim, dt, k](const std::vector<Host>& in) {
                   const int64_t d = dim < 0 ? dim + in[0].dim() + 1 : dim;
                   Shape out = in[0].sizes;
                   out.insert(out.begin() + d, k);
                   return std::vector<Expected>{make_expected(out, dt, {}, [&](std::vector<int64_t> idx) {
                     const int64_t which = idx[size_t(d)];
                     idx.erase(idx.begin() + d);
                     return in[size_t(which)].at(idx);
                   })};
                 };
                 return s;
               }});
  // The views split, split_with_sizes and chunk return, read through their strides.
  for (const char* name : {"split", "split_with_sizes", "chunk"}) {
    const std::string op = name;
    t.push_back(
        {name, kAll, [op](Rng& rng, DType dt) {
           Sample s;
           const Shape shape = random_shape(rng, {.min_dims = 1, .max_dims = 5, .max_size = 9, .max_numel = 300});
           const int64_t nd = int64_t(shape.size()), dim = rng.range(-nd, nd - 1);
           const int64_t n = shape[size_t(dim < 0 ? dim + nd : dim)];
           s.inputs = {random_input(rng, shape, dt, copy_values(dt))};
           std::vector<int64_t> lengths;
           int64_t arg = 0;
           if (op == "split") {
             arg = n == 0 ? rng.range(0, 2) : rng.range(1, n + 1);
             lengths = split_lengths(n, arg);
           } else if (op == "chunk") {
             arg = rng.range(1, 5);
             lengths = n == 0 ? std::vector<int64_t>(size_t(arg), 0) : split_lengths(n, (n + arg - 1) / arg);
           } else {
             for (int64_t left = n; left > 0 || lengths.empty() || rng.chance(0.2);) {
               const int64_t len = rng.range(0, left);
               lengths.push_back(len);
               left -= len;
               if (left == 0 && rng.chance(0.6)) break;
             }
             int64_t total = 0;
             for (int64_t len : lengths) total += len;
             lengths.back() += n - total;
           }
           s.params = cat_str("dim=", dim, op == "split_with_sizes" ? " sizes=" + str(lengths) : cat_str(" arg=", arg));
           s.run = [op, dim, arg, lengths](const std::vector<Tensor>& in) {
             if (op == "split") return ops::split(in[0], arg, dim);
             if (op == "chunk") return ops::chunk(in[0], arg, dim);
             return ops::split_with_sizes(in[0], lengths, dim);
           };
           s.reference = [dim, dt, lengths](const std::vector<Host>& in) {
             return pieces(in[0], dim < 0 ? dim + in[0].dim() : dim, lengths, dt);
           };
           return s;
         }});
  }
}

}  // namespace frugal::optest
