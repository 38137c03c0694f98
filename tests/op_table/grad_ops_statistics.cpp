// Order statistics and the NaN-skipping reductions (autograd/ops/statistics.h) in the
// differentiable op table. Their inputs have distinct values (a tie would move a picked
// element's gradient under the finite differences' steps).
#include <string>

#include "autograd/ops/statistics.h"
#include "tests/op_table/grad_util.h"

namespace frugal::optest {

namespace {

using A = AmpPolicy;

/// A shape of 1 to 3 dims, no size 0 (an order statistic of an empty slice is an error), and a dim of it.
std::pair<Shape, int64_t> shape_and_dim(Rng& rng) {
  const Shape sh = small_shape(rng, 1, 3, 24, 0.0);
  return {sh, rng.range(-int64_t(sh.size()), int64_t(sh.size()) - 1)};
}

int64_t size_at(const Shape& sh, int64_t dim) { return sh[size_t(dim < 0 ? dim + int64_t(sh.size()) : dim)]; }

}  // namespace

void add_grad_statistics(std::vector<GradEntry>& t) {
  t.push_back({"kthvalue",
               [](Rng& rng) {
                 const auto [sh, dim] = shape_and_dim(rng);
                 const int64_t k = rng.range(1, size_at(sh, dim));
                 const bool keep = rng.chance(0.5);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("k=", k, " dim=", dim, " keepdim=", keep);
                 s.f = [=](const TensorList& in) { return kthvalue(in[0], k, dim, keep).values; };
                 return s;
               },
               A::Keep});
  for (bool skip_nan : {false, true})
    t.push_back({skip_nan ? "nanmedian" : "median",
                 [skip_nan](Rng& rng) {
                   const auto [sh, dim] = shape_and_dim(rng);
                   const bool keep = rng.chance(0.5), every = rng.chance(0.3);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = every ? std::string("every element") : cat_str("dim=", dim, " keepdim=", keep);
                   s.f = [=](const TensorList& in) {
                     if (every) return skip_nan ? nanmedian(in[0]) : median(in[0]);
                     return (skip_nan ? nanmedian(in[0], dim, keep) : median(in[0], dim, keep)).values;
                   };
                   return s;
                 },
                 A::Keep});
  for (bool skip_nan : {false, true})
    t.push_back({skip_nan ? "nanquantile" : "quantile",
                 [skip_nan](Rng& rng) {
                   const auto [sh, dim] = shape_and_dim(rng);
                   const char* modes[] = {"linear", "lower", "higher", "midpoint", "nearest"};
                   const std::string mode = modes[rng.range(0, 4)];
                   const double q = rng.uniform(0.0, 1.0);
                   const bool keep = rng.chance(0.5), every = rng.chance(0.3);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("q=", q, " ", every ? std::string("every element") : cat_str("dim=", dim),
                                      " keepdim=", keep, " interpolation=", mode);
                   s.f = [=](const TensorList& in) {
                     const std::optional<int64_t> d = every ? std::nullopt : std::optional<int64_t>(dim);
                     return skip_nan ? nanquantile(in[0], q, d, keep, mode) : quantile(in[0], q, d, keep, mode);
                   };
                   return s;
                 },
                 A::Keep});
  for (bool mean : {false, true})
    t.push_back({mean ? "nanmean" : "nansum",
                 [mean](Rng& rng) {
                   const Shape sh = small_shape(rng, 0, 3, 24, mean ? 0.0 : 0.03);
                   const std::vector<int64_t> dims = random_dims(rng, int64_t(sh.size()));
                   const bool keep = rng.chance(0.5);
                   GradSample s;
                   s.inputs = {grad_in(values(rng, sh))};
                   s.params = cat_str("dims=", str(dims), " keepdim=", keep);
                   s.f = [=](const TensorList& in) {
                     return mean ? nanmean(in[0], dims, keep) : nansum(in[0], dims, keep);
                   };
                   return s;
                 },
                 A::Float32});
}

}  // namespace frugal::optest
