// Indexing (tensor/ops/index.h): index tensors of both widths in random layouts (their
// skipped storage holds an invalid index), duplicates, empty dims, and now and then an
// out-of-range index that the op must reject.
#include <algorithm>
#include <cmath>

#include "tensor/ops/index.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

/// numel indices in [0, n), one of them made invalid with p = 0.04 (the reference then
/// expects an error); as a random-layout int32/int64 tensor of `shape`.
Tensor draw_index(Rng& rng, const Shape& shape, int64_t n, bool& invalid) {
  Shape base = shape;  // now and then an expanded index: stride 0 where base has size 1
  if (rng.chance(0.15))
    for (int64_t& d : base)
      if (rng.chance(0.5)) d = std::min<int64_t>(d, 1);
  std::vector<double> v(size_t(numel_of(base)));
  for (double& x : v) x = double(rng.range(0, n - 1));
  invalid = numel_of(shape) == 0 ? false : n == 0 || rng.chance(0.04);
  if (invalid) v[size_t(rng.range(0, int64_t(v.size()) - 1))] = rng.chance(0.5) ? -1.0 : double(n);
  return tensor_of(v, base, rng.chance(0.5) ? kInt64 : kInt32, &rng).expand(shape);
}

Shape small_shape(Rng& rng, int min_dims, int max_dims, int64_t max_numel = 240) {
  if (max_dims >= 2 && rng.chance(0.02)) return big_shape(rng);  // the threaded gather
  return random_shape(rng, {.min_dims = min_dims, .max_dims = max_dims, .max_size = 6, .max_numel = max_numel});
}

Values index_values(DType dt) { return dt == kBool ? Values{0, 1, 1} : values_for(dt); }

/// The sums a scatter-add makes, and the error its serial accumulation in opmath may have:
/// up to (terms - 1) ulps of the running magnitude per output (expanded sources repeat
/// one value, so the roundings do not cancel).
struct ScatterSums {
  Host out;
  std::vector<double> terms, magnitude;
  explicit ScatterSums(Host start) : out(std::move(start)), terms(out.v.size(), 1.0), magnitude(out.v.size(), 0.0) {
    for (size_t i = 0; i < out.v.size(); ++i) magnitude[i] = std::fabs(out.v[i]);
  }
  void add(const std::vector<int64_t>& at, double v) {
    const size_t i = size_t(out.pos(at));
    out.v[i] += v, terms[i] += 1, magnitude[i] += std::fabs(v);
  }
  Expected expected(DType dt) {
    double bound = 0;
    for (size_t i = 0; i < out.v.size(); ++i) bound = std::max(bound, terms[i] * magnitude[i]);
    for (double& v : out.v) v = round_to(dt, v);
    Tol tol = tol_for(dt);
    if (is_floating(dt)) tol.atol += (dt == kFloat64 ? 2.3e-16 : 1.2e-7) * bound;
    return {out, dt, tol};
  }
};

}  // namespace

void add_index_ops(std::vector<OpEntry>& t) {
  t.push_back({"index_select", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = small_shape(rng, 0, 5);
                 const int64_t nd = std::max<int64_t>(int64_t(shape.size()), 1), dim = rng.range(-nd, nd - 1);
                 const int64_t n = shape.empty() ? 1 : shape[size_t(dim < 0 ? dim + nd : dim)];
                 const bool zero_d = shape.empty() || rng.chance(0.1);
                 bool invalid;
                 Tensor index = draw_index(rng, zero_d ? Shape{} : Shape{random_size(rng, 6, 0.1)}, n, invalid);
                 s.inputs = {random_input(rng, shape, dt, index_values(dt)), index};
                 s.params = cat_str("dim=", dim);
                 s.run = [dim](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::index_select(in[0], dim, in[1])};
                 };
                 s.reference = [dim, dt, invalid](const std::vector<Host>& in) {
                   if (invalid) throw MustThrow{"index out of range"};
                   if (in[0].dim() == 0) return std::vector<Expected>{Expected{in[0], dt, {}}};
                   const int64_t d = dim < 0 ? dim + in[0].dim() : dim;
                   Shape out = in[0].sizes;
                   out[size_t(d)] = in[1].numel();
                   return std::vector<Expected>{make_expected(out, dt, {}, [&](std::vector<int64_t> idx) {
                     idx[size_t(d)] = int64_t(in[1].v[size_t(idx[size_t(d)])]);
                     return in[0].at(idx);
                   })};
                 };
                 return s;
               }});

  t.push_back({"gather", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = small_shape(rng, 0, 5);
                 const int64_t nd = std::max<int64_t>(int64_t(shape.size()), 1), dim = rng.range(-nd, nd - 1);
                 const int64_t d = dim < 0 ? dim + nd : dim;
                 Shape ishape = shape;
                 for (size_t k = 0; k < ishape.size(); ++k)
                   ishape[k] = int64_t(k) == d ? random_size(rng, 6, 0.1) : rng.range(0, ishape[k]);
                 bool invalid;
                 Tensor index = draw_index(rng, ishape, shape.empty() ? 1 : shape[size_t(d)], invalid);
                 s.inputs = {random_input(rng, shape, dt, index_values(dt)), index};
                 s.params = cat_str("dim=", dim);
                 s.run = [dim](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::gather(in[0], dim, in[1])};
                 };
                 s.reference = [d, dt, invalid](const std::vector<Host>& in) {
                   if (invalid) throw MustThrow{"index out of range"};
                   return std::vector<Expected>{make_expected(in[1].sizes, dt, {}, [&](std::vector<int64_t> idx) {
                     const double v = in[1].at(idx);
                     if (!idx.empty()) idx[size_t(d)] = int64_t(v);
                     return in[0].at(idx);
                   })};
                 };
                 return s;
               }});

  for (bool inplace : {false, true}) {
    t.push_back({inplace ? "scatter_add_" : "scatter_add", kNumeric, [inplace](Rng& rng, DType dt) {
                   Sample s;
                   const Shape shape = small_shape(rng, 0, 5);
                   const int64_t nd = std::max<int64_t>(int64_t(shape.size()), 1), dim = rng.range(-nd, nd - 1);
                   const int64_t d = dim < 0 ? dim + nd : dim;
                   Shape ishape = shape, sshape = shape;
                   for (size_t k = 0; k < ishape.size(); ++k) {
                     ishape[k] = int64_t(k) == d ? random_size(rng, 6, 0.1) : rng.range(0, ishape[k]);
                     sshape[k] = ishape[k] + (rng.chance(0.3) ? rng.range(1, 2) : 0);
                   }
                   bool invalid;
                   Tensor index = draw_index(rng, ishape, shape.empty() ? 1 : shape[size_t(d)], invalid);
                   s.inputs = {random_input(rng, shape, dt, index_values(dt), {.expand = !inplace}), index,
                               random_input(rng, sshape, dt, index_values(dt))};
                   if (inplace) s.mutates = {0};
                   const bool fits = shape.empty() || ishape[size_t(d)] <= shape[size_t(d)];
                   if (inplace && fits && rng.chance(0.15)) {  // src is self: it must be read as it was
                     s.inputs[2] = s.inputs[0];
                     s.params = "src is self; ";
                   }
                   s.params += cat_str("dim=", dim);
                   s.run = [dim, inplace](const std::vector<Tensor>& in) {
                     if (!inplace) return std::vector<Tensor>{ops::scatter_add(in[0], dim, in[1], in[2])};
                     ops::scatter_add_(in[0], dim, in[1], in[2]);
                     return std::vector<Tensor>{in[0]};
                   };
                   s.reference = [d, dt, invalid](const std::vector<Host>& in) {
                     if (invalid) throw MustThrow{"index out of range"};
                     ScatterSums sums(in[0]);
                     for_each_index(in[1].sizes, [&](const std::vector<int64_t>& idx) {
                       std::vector<int64_t> at = idx;
                       if (!at.empty()) at[size_t(d)] = int64_t(in[1].at(idx));
                       sums.add(at, in[2].at(idx));
                     });
                     return std::vector<Expected>{sums.expected(dt)};
                   };
                   return s;
                 }});
  }

  t.push_back({"index_add", kNumeric, [](Rng& rng, DType dt) {
                 Sample s;
                 const Shape shape = small_shape(rng, 0, 5);
                 const int64_t nd = std::max<int64_t>(int64_t(shape.size()), 1), dim = rng.range(-nd, nd - 1);
                 const int64_t d = dim < 0 ? dim + nd : dim;
                 const bool zero_d = shape.empty() || rng.chance(0.1);
                 const int64_t K = zero_d ? 1 : random_size(rng, 6, 0.1);
                 bool invalid;
                 Tensor index =
                     draw_index(rng, zero_d ? Shape{} : Shape{K}, shape.empty() ? 1 : shape[size_t(d)], invalid);
                 Shape sshape = shape.empty() ? Shape{1} : shape;
                 sshape[size_t(d)] = K;
                 if (shape.empty() && rng.chance(0.5)) sshape = {};
                 s.inputs = {random_input(rng, shape, dt, index_values(dt)), index,
                             random_input(rng, sshape, dt, index_values(dt))};
                 s.params = cat_str("dim=", dim);
                 s.run = [dim](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::index_add(in[0], dim, in[1], in[2])};
                 };
                 s.reference = [d, dt, invalid, K](const std::vector<Host>& in) {
                   if (invalid) throw MustThrow{"index out of range"};
                   ScatterSums sums(in[0]);
                   const Host& src = in[2];
                   for_each_index(src.sizes, [&](const std::vector<int64_t>& idx) {
                     std::vector<int64_t> at = idx;
                     if (in[0].dim() > 0) at[size_t(d)] = int64_t(in[1].v[size_t(idx[size_t(d)])]);
                     else at.clear();
                     sums.add(at, src.at(idx));
                   });
                   return std::vector<Expected>{sums.expected(dt)};
                 };
                 return s;
               }});

  t.push_back({"one_hot", {kInt64}, [](Rng& rng, DType) {
                 Sample s;
                 const int64_t C = rng.range(1, 6);
                 bool invalid;
                 s.inputs = {draw_index(rng, small_shape(rng, 0, 4), C, invalid)};
                 const bool infer = rng.chance(0.3);
                 s.params = cat_str("num_classes=", infer ? -1 : C);
                 s.run = [C, infer](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::one_hot(in[0], infer ? -1 : C)};
                 };
                 s.reference = [C, infer, invalid](const std::vector<Host>& in) {
                   int64_t classes = C;
                   if (infer) {
                     if (in[0].numel() == 0) throw MustThrow{"cannot infer num_classes"};
                     classes = int64_t(*std::max_element(in[0].v.begin(), in[0].v.end())) + 1;
                     if (*std::min_element(in[0].v.begin(), in[0].v.end()) < 0) throw MustThrow{"negative class"};
                   } else if (invalid) {
                     throw MustThrow{"index out of range"};
                   }
                   Shape out = in[0].sizes;
                   out.push_back(classes);
                   return std::vector<Expected>{make_expected(out, kInt64, {}, [&](std::vector<int64_t> idx) {
                     const int64_t c = idx.back();
                     idx.pop_back();
                     return double(in[0].at(idx) == double(c));
                   })};
                 };
                 return s;
               }});

  t.push_back({"embedding", kAll, [](Rng& rng, DType dt) {
                 Sample s;
                 const int64_t V = random_size(rng, 8, 0.03, 0.1), D = random_size(rng, 7, 0.05);
                 bool invalid;
                 Tensor indices = draw_index(rng, small_shape(rng, 0, 3, 60), V, invalid);
                 s.inputs = {random_input(rng, {V, D}, dt, index_values(dt)), indices};
                 s.run = [](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::embedding(in[0], in[1])};
                 };
                 s.reference = [dt, invalid, D](const std::vector<Host>& in) {
                   if (invalid) throw MustThrow{"index out of range"};
                   Shape out = in[1].sizes;
                   out.push_back(D);
                   return std::vector<Expected>{make_expected(out, dt, {}, [&](std::vector<int64_t> idx) {
                     const int64_t col = idx.back();
                     idx.pop_back();
                     return in[0].at({int64_t(in[1].at(idx)), col});
                   })};
                 };
                 return s;
               }});

  t.push_back({"embedding_backward", kNumeric, [](Rng& rng, DType dt) {
                 Sample s;
                 const int64_t V = random_size(rng, 8, 0.03, 0.1), D = random_size(rng, 7, 0.05);
                 bool invalid;
                 Tensor indices = draw_index(rng, small_shape(rng, 0, 3, 60), V, invalid);
                 Shape gshape = indices.sizes();
                 gshape.push_back(D);
                 const int64_t padding = V > 0 && rng.chance(0.4) ? rng.range(0, V - 1) : -1;
                 s.inputs = {random_input(rng, gshape, dt, index_values(dt)), indices};
                 s.params = cat_str("num_weights=", V, " padding_idx=", padding);
                 s.run = [V, padding](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::embedding_backward(in[0], in[1], V, padding)};
                 };
                 s.reference = [dt, invalid, V, D, padding](const std::vector<Host>& in) {
                   if (invalid) throw MustThrow{"index out of range"};
                   ScatterSums sums(host_zeros({V, D}));
                   for_each_index(in[0].sizes, [&](const std::vector<int64_t>& idx) {
                     std::vector<int64_t> row(idx.begin(), idx.end() - 1);
                     const int64_t v = int64_t(in[1].at(row));
                     if (v != padding) sums.add({v, idx.back()}, in[0].at(idx));
                   });
                   return std::vector<Expected>{sums.expected(dt)};
                 };
                 return s;
               }});
}

}  // namespace frugal::optest
