// Differentiable joins, splits and indexing (autograd/ops/join.h, index.h) and Tensor's
// recorded views and copies (Note [Derived tensors]; autograd/ops/view.cpp, copy.cpp) in the
// differentiable op table.
#include <optional>
#include <string>

#include "autograd/ops/all.h"
#include "autograd/ops/cumsum.h"
#include "autograd/ops/logsumexp.h"
#include "autograd/ops/shape_ops.h"
#include "tests/op_table/grad_util.h"

namespace frugal::optest {

namespace {

using A = AmpPolicy;

/// Pieces of a split, some left unused (their gradient must be zeros), joined again.
Tensor join_some(const std::vector<Tensor>& pieces, int64_t dim) {
  std::vector<Tensor> used;
  for (size_t k = 0; k < pieces.size(); ++k)
    if (k % 3 != 1) used.push_back(pieces[k]);
  return cat(used, dim);
}

void add_join(std::vector<GradEntry>& t) {
  t.push_back({"cat",
               [](Rng& rng) {
                 Shape sh = small_shape(rng, 1, 3, 12);
                 const int64_t dim = rng.range(-int64_t(sh.size()), int64_t(sh.size()) - 1);
                 const int64_t n = rng.range(1, 3);
                 GradSample s;
                 for (int64_t k = 0; k < n; ++k) {
                   sh[size_t(wrap_dims({dim}, int64_t(sh.size()))[0])] = rng.range(0, 3);
                   s.inputs.push_back(grad_in(values(rng, sh)));
                 }
                 if (n > 1 && rng.chance(0.3)) s.inputs[0].grad = false;
                 s.params = cat_str("dim=", dim);
                 s.f = [dim](const TensorList& in) { return cat(in, dim); };
                 return s;
               },
               A::Promote});
  t.push_back({"stack",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 0, 3, 12);
                 const int64_t dim = rng.range(-int64_t(sh.size()) - 1, int64_t(sh.size()));
                 const int64_t n = rng.range(1, 3);
                 GradSample s;
                 for (int64_t k = 0; k < n; ++k) s.inputs.push_back(grad_in(values(rng, sh)));
                 s.params = cat_str("dim=", dim);
                 s.f = [dim](const TensorList& in) { return stack(in, dim); };
                 return s;
               },
               A::Promote});
  t.push_back({"split",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 3);
                 const int64_t dim = rng.range(0, int64_t(sh.size()) - 1), size = rng.range(1, 3);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("split_size=", size, " dim=", dim);
                 s.f = [=](const TensorList& in) { return join_some(split(in[0], size, dim), dim); };
                 return s;
               },
               A::Keep});
  t.push_back({"split_with_sizes",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 3);
                 const int64_t dim = rng.range(0, int64_t(sh.size()) - 1);
                 std::vector<int64_t> sizes;
                 for (int64_t left = sh[size_t(dim)]; left > 0 || sizes.empty();) {
                   const int64_t n = rng.range(0, left);
                   sizes.push_back(n), left -= n;
                   if (sizes.size() > 4) sizes.back() += left, left = 0;
                 }
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("sizes=", str(sizes), " dim=", dim);
                 s.f = [=](const TensorList& in) { return join_some(split_with_sizes(in[0], sizes, dim), dim); };
                 return s;
               },
               A::Keep});
  t.push_back({"chunk",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 3, 24, 0.0);
                 const int64_t dim = rng.range(0, int64_t(sh.size()) - 1), chunks = rng.range(1, 4);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("chunks=", chunks, " dim=", dim);
                 s.f = [=](const TensorList& in) { return join_some(chunk(in[0], chunks, dim), dim); };
                 return s;
               },
               A::Keep});
}

void add_index(std::vector<GradEntry>& t) {
  t.push_back({"index_select",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 3, 24, 0.0);
                 const int64_t dim = rng.range(0, int64_t(sh.size()) - 1);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh)), const_in(indices(rng, {rng.range(0, 5)}, sh[size_t(dim)]))};
                 s.params = cat_str("dim=", dim);
                 s.f = [dim](const TensorList& in) { return index_select(in[0], dim, in[1]); };
                 return s;
               },
               A::Keep});
  t.push_back({"gather",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 3, 24, 0.0);
                 const int64_t dim = rng.range(0, int64_t(sh.size()) - 1);
                 Shape is = sh;
                 for (size_t d = 0; d < is.size(); ++d)
                   is[d] = int64_t(d) == dim ? rng.range(0, 4) : rng.range(1, sh[d]);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh)), const_in(indices(rng, is, sh[size_t(dim)]))};
                 s.params = cat_str("dim=", dim);
                 s.f = [dim](const TensorList& in) { return gather(in[0], dim, in[1]); };
                 return s;
               },
               A::Keep});
  t.push_back(
      {"scatter_add",
       [](Rng& rng) {
         const Shape sh = small_shape(rng, 1, 3, 24, 0.0);
         const int64_t dim = rng.range(0, int64_t(sh.size()) - 1);
         Shape is = sh;
         for (size_t d = 0; d < is.size(); ++d) is[d] = int64_t(d) == dim ? rng.range(0, 4) : rng.range(1, sh[d]);
         GradSample s;
         s.inputs = {grad_in(values(rng, sh)), const_in(indices(rng, is, sh[size_t(dim)])), grad_in(values(rng, is))};
         s.params = cat_str("dim=", dim);
         s.f = [dim](const TensorList& in) { return scatter_add(in[0], dim, in[1], in[2]); };
         return s;
       },
       A::Keep, true, /*amp_mixed=*/0});
  t.push_back({"index_add",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 3, 24, 0.0);
                 const int64_t dim = rng.range(0, int64_t(sh.size()) - 1);
                 Shape ss = sh;
                 ss[size_t(dim)] = rng.range(0, 4);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh)), const_in(indices(rng, {ss[size_t(dim)]}, sh[size_t(dim)])),
                             grad_in(values(rng, ss))};
                 s.params = cat_str("dim=", dim);
                 s.f = [dim](const TensorList& in) { return index_add(in[0], dim, in[1], in[2]); };
                 return s;
               },
               A::Keep, true, /*amp_mixed=*/0});
  t.push_back({"embedding",
               [](Rng& rng) {
                 const int64_t V = rng.range(1, 5), D = rng.range(1, 4);
                 const int64_t padding_idx = V > 1 && rng.chance(0.4) ? rng.range(0, V - 1) : -1;
                 // The padding row gets no gradient although it is read: a gradcheck can only
                 // check that the other rows get theirs, so no index picks it here.
                 Tensor idx = indices(rng, small_shape(rng, 0, 2, 6), padding_idx < 0 ? V : V - 1);
                 std::vector<double> v = idx.tolist<double>();
                 for (double& i : v) i += padding_idx >= 0 && i >= double(padding_idx);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, {V, D})), const_in(tensor_of(v, idx.sizes(), kInt64))};
                 // None, the row, or the row counted from the end (torch's negative padding_idx).
                 std::optional<int64_t> padding;
                 if (padding_idx >= 0) padding = rng.chance(0.5) ? padding_idx : padding_idx - V;
                 s.params = cat_str("padding_idx=", padding ? std::to_string(*padding) : "none");
                 s.f = [=](const TensorList& in) { return embedding(in[0], in[1], padding); };
                 return s;
               },
               A::Keep});
}

/// A Tensor method of one input; make_f draws its parameters from `r` (the same seed on
/// every call, so every call makes the same view) and names them in `p`.
GradEntry method(const char* name, std::function<Tensor(const Tensor&, Rng& r, std::string& p)> make_f, int min_dims,
                 bool relayout = true) {
  return {name,
          [=](Rng& rng) {
            GradSample s;
            const Tensor x = values(rng, small_shape(rng, min_dims, 4));
            s.inputs = {{x, true, relayout}};
            const uint64_t seed = rng.next();
            Rng r(seed);
            make_f(x, r, s.params);
            s.f = [make_f, seed](const TensorList& in) {
              Rng r2(seed);
              std::string ignored;
              return make_f(in[0], r2, ignored);
            };
            return s;
          },
          A::Keep};
}

int64_t pick_dim(Rng& r, const Tensor& x) { return r.range(-x.dim(), x.dim() - 1); }

void add_views(std::vector<GradEntry>& t) {
  t.push_back(method(
      "Tensor::view",
      [](const Tensor& x, Rng& r, std::string& p) {
        const Shape to = r.chance(0.5) ? Shape{x.numel()} : Shape{-1, x.dim() > 0 ? x.size(-1) : 1};
        p = "view " + shape_str(to);
        return x.dim() > 0 && x.size(-1) == 0 ? x.view({x.numel()}) : x.view(to);
      },
      0, /*relayout=*/false));
  t.push_back(method(
      "Tensor::reshape",
      [](const Tensor& x, Rng& r, std::string& p) {
        const Shape to = r.chance(0.5) ? Shape{x.numel()} : Shape{x.numel(), 1};
        p = "reshape " + shape_str(to);
        return x.reshape(to);
      },
      0));
  t.push_back(method(
      "Tensor::permute",
      [](const Tensor& x, Rng& r, std::string& p) {
        std::vector<int64_t> perm(size_t(x.dim()));
        for (size_t i = 0; i < perm.size(); ++i) perm[i] = int64_t(i);
        for (size_t i = perm.size(); i-- > 1;) std::swap(perm[i], perm[size_t(r.range(0, int64_t(i)))]);
        p = "permute " + str(perm);
        return x.permute(perm);
      },
      1));
  t.push_back(method(
      "Tensor::transpose",
      [](const Tensor& x, Rng& r, std::string& p) {
        const int64_t a = pick_dim(r, x), b = pick_dim(r, x);
        p = cat_str("transpose ", a, ", ", b);
        return x.transpose(a, b);
      },
      1));
  t.push_back(method(
      "Tensor::t",
      [](const Tensor& x, Rng&, std::string& p) {
        p = "t()";
        return x.flatten(1).t();
      },
      2));
  t.push_back(method(
      "Tensor::narrow",
      [](const Tensor& x, Rng& r, std::string& p) {
        const int64_t d = pick_dim(r, x), n = x.size(d), start = r.range(0, n), len = r.range(0, n - start);
        p = cat_str("narrow dim=", d, " start=", start, " length=", len);
        return x.narrow(d, start, len);
      },
      1));
  t.push_back(method(
      "Tensor::slice",
      [](const Tensor& x, Rng& r, std::string& p) {
        const int64_t d = pick_dim(r, x), n = x.size(d);
        const int64_t start = r.range(-n, n), end = r.range(-n, n + 1), step = r.range(1, 3);
        p = cat_str("slice dim=", d, " start=", start, " end=", end, " step=", step);
        return x.slice(d, start, end, step);
      },
      1));
  t.push_back(method(
      "Tensor::select",
      [](const Tensor& x, Rng& r, std::string& p) {
        const int64_t d = pick_dim(r, x), n = x.size(d);
        if (n == 0) return x.narrow(d, 0, 0);  // nothing to select
        const int64_t i = r.range(-n, n - 1);
        p = cat_str("select dim=", d, " index=", i);
        return x.select(d, i);
      },
      1));
  t.push_back(method(
      "Tensor::expand",
      [](const Tensor& x, Rng& r, std::string& p) {
        Shape to = x.sizes();
        for (int64_t& n : to)
          if (n == 1 && r.chance(0.6)) n = r.range(2, 3);
        if (r.chance(0.5)) to.insert(to.begin(), r.range(1, 2));
        p = "expand " + shape_str(to);
        return x.expand(to);
      },
      0));
  t.push_back(method(
      "Tensor::squeeze",
      [](const Tensor& x, Rng& r, std::string& p) {
        if (x.dim() == 0 || r.chance(0.5)) {
          p = "squeeze()";
          return x.squeeze();
        }
        const int64_t d = pick_dim(r, x);
        p = cat_str("squeeze ", d);
        return x.squeeze(d);
      },
      0));
  t.push_back(method(
      "Tensor::unsqueeze",
      [](const Tensor& x, Rng& r, std::string& p) {
        const int64_t d = r.range(-x.dim() - 1, x.dim());
        p = cat_str("unsqueeze ", d);
        return x.unsqueeze(d);
      },
      0));
  t.push_back(method(
      "Tensor::flatten",
      [](const Tensor& x, Rng& r, std::string& p) {
        const int64_t a = r.range(0, x.dim() - 1), b = r.range(a, x.dim() - 1);
        p = cat_str("flatten ", a, ", ", b);
        return x.flatten(a, b);
      },
      1));
  t.push_back(method(
      "Tensor::unflatten",
      [](const Tensor& x, Rng& r, std::string& p) {
        const int64_t d = r.range(0, x.dim() - 1);
        const Shape to = {1, x.size(d), 1};
        p = cat_str("unflatten ", d, " ", shape_str(to));
        return x.unflatten(d, to);
      },
      1));
  t.push_back(method(
      "Tensor::contiguous",
      [](const Tensor& x, Rng&, std::string& p) {
        p = "contiguous()";
        return x.contiguous();
      },
      0));
  t.push_back(method(
      "Tensor::clone",
      [](const Tensor& x, Rng&, std::string& p) {
        p = "clone()";
        return x.clone();
      },
      0));
  t.push_back(method(
      "Tensor::to",
      [](const Tensor& x, Rng&, std::string& p) {
        p = "to(float32).to(the input's dtype)";
        return x.to(kFloat32).to(x.dtype());
      },
      0));
  t.push_back({"Tensor::copy_",
               [](Rng& rng) {
                 const Shape out = small_shape(rng, 0, 4);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, out)), grad_in(values(rng, broadcast_operand(rng, out)))};
                 s.f = [](const TensorList& in) {
                   Tensor self = in[0].clone();  // its old history gets zeros
                   self.copy_(in[1]);
                   return self;
                 };
                 return s;
               },
               A::Keep});
}

/// An entry of one input of a random shape; make draws the op's other arguments from the
/// shape alone (so an undefined input reaches the op) and names them in the params.
GradEntry one_input(const char* name, int min_dims,
                    std::function<std::function<Tensor(const Tensor&)>(const Shape&, Rng&, std::string&)> make,
                    AmpPolicy amp = A::Keep) {
  return {name,
          [=](Rng& rng) {
            GradSample s;
            const Shape sh = small_shape(rng, min_dims, 4);
            s.inputs = {grad_in(values(rng, sh))};
            s.f = [f = make(sh, rng, s.params)](const TensorList& in) { return f(in[0]); };
            return s;
          },
          amp};
}

/// flip, repeat, tril/triu, pad (autograd/ops/shape_ops.h), the scans (cumsum, cumprod, cummax,
/// cummin, logcumsumexp) and logsumexp.
void add_rearrange(std::vector<GradEntry>& t) {
  using Op = std::function<Tensor(const Tensor&)>;
  t.push_back(one_input("flip", 0, [](const Shape& sh, Rng& r, std::string& p) -> Op {
    const int64_t nd = int64_t(sh.size());
    const std::vector<int64_t> dims = nd == 0 && r.chance(0.5) ? std::vector<int64_t>{0} : random_dims(r, nd);
    p = "dims=" + str(dims);
    return [dims](const Tensor& x) { return flip(x, dims); };
  }));
  t.push_back(one_input("roll", 0, [](const Shape& sh, Rng& r, std::string& p) -> Op {
    std::vector<int64_t> dims = sh.empty() || r.chance(0.25) ? std::vector<int64_t>{} : random_dims(r, int64_t(sh.size()));
    std::vector<int64_t> shifts(std::max<size_t>(dims.size(), 1));
    for (int64_t& k : shifts) k = r.range(-6, 6);
    p = "shifts=" + str(shifts) + " dims=" + str(dims);
    return [shifts, dims](const Tensor& x) { return roll(x, shifts, dims); };
  }));
  t.push_back(one_input("movedim", 1, [](const Shape& sh, Rng& r, std::string& p) -> Op {
    const int64_t nd = int64_t(sh.size());
    const std::vector<int64_t> source{r.range(0, nd - 1)}, destination{r.range(-nd, nd - 1)};
    p = "source=" + str(source) + " destination=" + str(destination);
    return [source, destination](const Tensor& x) { return movedim(x, source, destination); };
  }));
  for (bool shuffle : {true, false})
    t.push_back({shuffle ? "pixel_shuffle" : "pixel_unshuffle",
                 [shuffle](Rng& rng) {
                   const int64_t f = rng.range(1, 3), c = rng.range(1, 2), h = rng.range(1, 2), w = rng.range(1, 3);
                   Shape sh = shuffle ? Shape{c * f * f, h, w} : Shape{c, h * f, w * f};
                   if (rng.chance(0.6)) sh.insert(sh.begin(), rng.range(1, 2));  // a batch dim
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("factor=", f);
                   s.f = [shuffle, f](const TensorList& in) {
                     return shuffle ? pixel_shuffle(in[0], f) : pixel_unshuffle(in[0], f);
                   };
                   return s;
                 },
                 A::Keep});
  t.push_back(one_input("repeat", 0, [](const Shape& sh, Rng& r, std::string& p) -> Op {
    std::vector<int64_t> reps(sh.size() + size_t(r.range(0, 1)));
    for (int64_t& n : reps) n = r.chance(0.05) ? 0 : r.range(1, 2);
    p = "repeats=" + str(reps);
    return [reps](const Tensor& x) { return repeat(x, reps); };
  }));
  for (const char* name : {"tril", "triu"})
    t.push_back(one_input(name, 2, [upper = name[3] == 'u'](const Shape&, Rng& r, std::string& p) -> Op {
      const int64_t diagonal = r.range(-3, 3);
      p = cat_str("diagonal=", diagonal);
      return [=](const Tensor& x) { return upper ? triu(x, diagonal) : tril(x, diagonal); };
    }));
  t.push_back(one_input("pad", 0, [](const Shape& sh, Rng& r, std::string& p) -> Op {
    std::vector<int64_t> pads;
    // An integral value: int and bool inputs (the error probes) hold it exactly.
    const double value = r.chance(0.5) ? 0.0 : 1.0;
    for (int64_t k = 0, pairs = r.range(0, std::min<int64_t>(int64_t(sh.size()), 3)); k < pairs; ++k) {
      const int64_t n = sh[sh.size() - 1 - size_t(k)];
      const int64_t left = r.range(-std::min<int64_t>(n, 1), 2);  // a negative pad crops
      // The two crops together stay within the dim (more is an error, as in PyTorch).
      pads.insert(pads.end(), {left, r.range(-std::min<int64_t>(n - std::max<int64_t>(-left, 0), 1), 2)});
    }
    p = cat_str("pad=", str(pads), " value=", value);
    return [=](const Tensor& x) { return pad(x, pads, "constant", value); };
  }));
  for (const char* mode : {"reflect", "replicate", "circular"})
    t.push_back({cat_str("pad(", mode, ")"),
                 [mode = std::string(mode)](Rng& rng) {
                   const int64_t pairs = rng.range(1, 3), nd = pairs + rng.range(1, 2);
                   Shape sh = Shape(size_t(nd), 1);
                   for (int64_t& n : sh) n = rng.range(1, pairs == 3 ? 2 : 3);
                   std::vector<int64_t> pads;
                   for (int64_t k = 0; k < pairs; ++k) {
                     const int64_t n = sh[size_t(nd - 1 - k)];
                     const int64_t hi = mode == "reflect" ? n - 1 : mode == "circular" ? n : 2;
                     const int64_t left = rng.range(n > 1 ? -1 : 0, hi);
                     // circular wraps what is left after a crop: the right pad is at most that
                     pads.insert(pads.end(), {left, rng.range(0, mode == "circular" && left < 0 ? n - 1 : hi)});
                   }
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("pad=", str(pads), " mode=", mode);
                   s.f = [=](const TensorList& in) { return pad(in[0], pads, mode); };
                   return s;
                 },
                 A::Keep});
  for (bool product : {false, true})
    t.push_back({product ? "cumprod" : "cumsum",
                 [product](Rng& rng) {
                   const Shape sh = small_shape(rng, 0, 3);
                   const int64_t n = std::max<int64_t>(int64_t(sh.size()), 1), dim = rng.range(-n, n - 1);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("dim=", dim);
                   s.f = [dim, product](const TensorList& in) {
                     return product ? cumprod(in[0], dim) : cumsum(in[0], dim);
                   };
                   return s;
                 },
                 A::Float32});
  for (bool is_max : {true, false})
    t.push_back({is_max ? "cummax" : "cummin",
                 [is_max](Rng& rng) {
                   const Shape sh = small_shape(rng, 0, 3);
                   const int64_t n = std::max<int64_t>(int64_t(sh.size()), 1), dim = rng.range(-n, n - 1);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("dim=", dim);
                   s.f = [dim, is_max](const TensorList& in) {
                     return (is_max ? cummax(in[0], dim) : cummin(in[0], dim)).values;
                   };
                   return s;
                 },
                 A::Keep});
  t.push_back({"logcumsumexp",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 0, 3);
                 const int64_t n = std::max<int64_t>(int64_t(sh.size()), 1), dim = rng.range(-n, n - 1);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("dim=", dim);
                 s.f = [dim](const TensorList& in) { return logcumsumexp(in[0], dim); };
                 return s;
               },
               A::Float32});
  t.push_back({"logsumexp",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 0, 3);
                 const std::vector<int64_t> dims = random_dims(rng, int64_t(sh.size()));
                 const bool keepdim = rng.chance(0.5);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("dims=", str(dims), " keepdim=", keepdim);
                 s.f = [=](const TensorList& in) { return logsumexp(in[0], dims, keepdim); };
                 return s;
               },
               A::Float32});
}

}  // namespace

void add_grad_shape(std::vector<GradEntry>& t) {
  add_join(t);
  add_index(t);
  add_views(t);
  add_rearrange(t);
  // Tensor::to rounds through float32: finite differences need a larger step there.
  for (GradEntry& e : t)
    if (e.name == "Tensor::to")
      e.sample = [sample = e.sample](Rng& rng) {
        GradSample s = sample(rng);
        s.eps = 1e-3;
        s.grad_tol = 100.0;
        return s;
      };
}

}  // namespace frugal::optest
