// Diagonals, the tensor products and cdist (autograd/ops/diagonal.h, tensor_products.h,
// distance.h) in the differentiable op table.
#include <string>

#include "autograd/ops/diagonal.h"
#include "autograd/ops/distance.h"
#include "autograd/ops/tensor_products.h"
#include "tests/op_table/grad_util.h"

namespace frugal::optest {

namespace {

using A = AmpPolicy;

/// Two distinct dims of an ndim-dim tensor, as drawn (negative now and then).
std::pair<int64_t, int64_t> two_dims(Rng& rng, int64_t ndim) {
  const int64_t d1 = rng.range(0, ndim - 1);
  int64_t d2 = rng.range(0, ndim - 2);
  if (d2 >= d1) ++d2;
  return {rng.chance(0.3) ? d1 - ndim : d1, rng.chance(0.3) ? d2 - ndim : d2};
}

}  // namespace

void add_grad_products(std::vector<GradEntry>& t) {
  t.push_back({"diagonal",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 2, 4, 36);
                 const auto [d1, d2] = two_dims(rng, int64_t(sh.size()));
                 const int64_t offset = rng.range(-3, 3);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("offset=", offset, " dim1=", d1, " dim2=", d2);
                 s.f = [=](const TensorList& in) { return diagonal(in[0], offset, d1, d2); };
                 return s;
               },
               A::Keep});
  t.push_back({"diag_embed",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 2, 8);
                 const auto [d1, d2] = two_dims(rng, int64_t(sh.size()) + 1);
                 const int64_t offset = rng.range(-2, 2);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("offset=", offset, " dim1=", d1, " dim2=", d2);
                 s.f = [=](const TensorList& in) { return diag_embed(in[0], offset, d1, d2); };
                 return s;
               },
               A::Keep});
  t.push_back({"diag",
               [](Rng& rng) {
                 const Shape sh = small_shape(rng, 1, 2, 20);
                 const int64_t offset = rng.range(-2, 2);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, sh))};
                 s.params = cat_str("offset=", offset);
                 s.f = [=](const TensorList& in) { return diag(in[0], offset); };
                 return s;
               },
               A::Keep});
  t.push_back({"trace",
               [](Rng& rng) {
                 GradSample s;
                 s.inputs = {grad_in(values(rng, {rng.range(1, 5), rng.range(1, 5)}))};
                 s.f = [](const TensorList& in) { return trace(in[0]); };
                 return s;
               },
               A::Float32});  // a sum, which autocast runs in float32
  t.push_back({"outer",
               [](Rng& rng) {
                 GradSample s;
                 s.inputs = {grad_in(values(rng, {rng.range(1, 5)})), grad_in(values(rng, {rng.range(1, 5)}))};
                 s.f = [](const TensorList& in) { return outer(in[0], in[1]); };
                 return s;
               },
               A::Promote});
  t.push_back(
      {"kron",
       [](Rng& rng) {
         GradSample s;
         s.inputs = {grad_in(values(rng, small_shape(rng, 0, 2, 6))), grad_in(values(rng, small_shape(rng, 0, 2, 6)))};
         s.f = [](const TensorList& in) { return kron(in[0], in[1]); };
         return s;
       },
       A::Promote});
  t.push_back({"tensordot",
               [](Rng& rng) {
                 const int64_t m = rng.range(1, 3), k = rng.range(1, 3), j = rng.range(1, 3), n = rng.range(1, 3);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, {m, k, j})), grad_in(values(rng, {j, n, k}))};
                 s.params = "dims=[1, 2] against [2, 0]";
                 s.f = [](const TensorList& in) { return tensordot(in[0], in[1], {1, 2}, {2, 0}); };
                 return s;
               },
               A::Lower});  // a matmul
  t.push_back({"cross",
               [](Rng& rng) {
                 const int64_t n = rng.range(1, 3);
                 const bool first = rng.chance(0.5);
                 GradSample s;
                 s.inputs = {grad_in(values(rng, first ? Shape{3, n} : Shape{n, 3})),
                             grad_in(values(rng, first ? Shape{3, 1} : Shape{3}))};
                 s.params = first ? "dim=0" : "dim=-1";
                 s.f = [first](const TensorList& in) { return cross(in[0], in[1], first ? 0 : -1); };
                 return s;
               },
               A::Promote});
  t.push_back({"cdist",
               [](Rng& rng) {
                 const double ps[] = {1.0, 2.0, 3.0};
                 const double p = ps[rng.range(0, 2)];
                 const bool matmul_form = p == 2.0 && rng.chance(0.5);
                 const int64_t P = matmul_form ? 26 : rng.range(1, 3), R = rng.range(1, 3), M = rng.range(1, 3);
                 GradSample s;
                 // The matmul form cancels: its points are kept apart (x1 below 0, x2 above), so that
                 // the finite differences of its second derivative stay above the rounding.
                 s.inputs = {grad_in(matmul_form ? values(rng, {P, M}, -2.0, -0.5) : values(rng, {P, M})),
                             grad_in(matmul_form ? values(rng, {R, M}, 0.5, 2.0) : values(rng, {R, M}))};
                 s.params = cat_str("p=", p, matmul_form ? " (matmul form)" : "");
                 s.f = [p](const TensorList& in) { return cdist(in[0], in[1], p); };
                 return s;
               },
               A::Float32});
}

}  // namespace frugal::optest
