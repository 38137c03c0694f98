// group_norm, forward and backward side by side.
//
// Note [Group norm as layer norm over groups]
// x (N, C, *) seen as (N * G, C / G * HxW) rows (a view when x is contiguous, a copy
// otherwise) has one row per (sample, group), holding exactly that group's values; so group
// norm's statistics and its normalized xhat are layer norm's over those rows, without an
// affine, and the same kernels compute them (tensor/ops/norm.h). The per-channel weight and
// bias are then applied in place on the (N, C, *) view of the output. The backward keeps what
// layer norm's keeps, x and the per-row mean and rstd (plus weight), not xhat nor the output:
// it regenerates xhat with layer_norm_apply, forms
//   dweight = sum_{N, *}(g * xhat),  dbias = sum_{N, *}(g),
// and hands dxhat = g * weight to layer_norm_backward for dx.
#include "autograd/ops/group_norm.h"

#include <cmath>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/norm.h"
#include "tensor/ops/reduce.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

/// x (N, C, *) as group norm sees it (Note [Group norm as layer norm over groups]).
struct GroupNormGeometry {
  Shape rows;                        // (N * G, C / G * HxW): one row per (sample, group)
  Shape channel;                     // (1, C, 1, ..., 1): a (C) parameter as it broadcasts against x
  std::vector<int64_t> reduce_dims;  // every dim of x but C: a parameter's gradient sums over them

  Shape row_len() const { return {rows[1]}; }
};

GroupNormGeometry check_group_norm(const Tensor& x, int64_t G, const Tensor& weight, const Tensor& bias, double eps) {
  constexpr const char* op = "group_norm";
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point input, got ", x.describe());
  FRUGAL_CHECK(x.dim() >= 2, op, ": expects an input (N, C, *) of at least 2 dims, got ", x.describe());
  const int64_t N = x.size(0), C = x.size(1);
  FRUGAL_CHECK(G > 0, op, ": num_groups must be positive, got ", G);
  FRUGAL_CHECK(C % G == 0, op, ": the input's channels C = ", C, " must be divisible by num_groups = ", G, " (input ",
               x.describe(), ")");
  ops::check_norm_param(op, "weight", weight, x, {C}, "shape (C) =");
  ops::check_norm_param(op, "bias", bias, x, {C}, "shape (C) =");
  FRUGAL_CHECK(eps >= 0.0 && std::isfinite(eps), op, ": eps must be finite and >= 0, got ", eps);
  int64_t hxw = 1;
  for (int64_t d = 2; d < x.dim(); ++d) hxw *= x.size(d);
  GroupNormGeometry g{{N * G, C / G * hxw}, Shape(size_t(x.dim()), 1), {0}};
  g.channel[1] = C;
  for (int64_t d = 2; d < x.dim(); ++d) g.reduce_dims.push_back(d);
  return g;
}

struct GroupNormBackward final : Node {
  SavedTensor x{this}, weight{this}, mean{this}, rstd{this};  // mean, rstd: (N * G) in the compute dtype
  GroupNormGeometry geometry;
  double eps = 0;  // for the double backward's recomputed statistics
  bool has_bias = false;
  std::string name() const override { return "GroupNormBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor xv = x.unpack(name()), wv = weight.defined() ? weight.unpack(name()) : Tensor();
    const Tensor rows = xv.reshape(geometry.rows), mv = mean.unpack(name()), rv = rstd.unpack(name());
    Tensor gx, gw, gb;
    if (wants_grad(*this, 1) && wv.defined()) {
      // g * xhat formed in xhat's own (fresh) buffer: one full-size temporary, not two.
      const Tensor g_xhat = ops::layer_norm_apply(rows, geometry.row_len(), mv, rv).view(xv.sizes());
      gw = ops::sum(ops::mul_(g_xhat, g), geometry.reduce_dims);
    }
    if (wants_grad(*this, 2) && has_bias) gb = ops::sum(g, geometry.reduce_dims);
    if (wants_grad(*this, 0)) {
      const Tensor dxhat = wv.defined() ? ops::mul(g, wv.view(geometry.channel)) : g;
      gx = ops::layer_norm_backward(dxhat.reshape(geometry.rows), rows, geometry.row_len(), mv, rv, Tensor(), false,
                                    {.x = true, .weight = false, .bias = false})
               .x.view(xv.sizes());
    }
    return {gx, gw, gb};
  }
  // Layer norm's formula on the (sample, group) rows, the affine per channel, in differentiable
  // ops with the statistics recomputed from x (Note [Double backward]).
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    namespace graph = autograd::graph;
    const Tensor xv = graph::saved_input(*this, 0, x);
    const Tensor g = autograd::in_dtype(grads[0], xv.dtype());
    const Tensor rows = xv.reshape(geometry.rows);
    auto row_mean = [](const Tensor& t) { return frugal::mean(t, {1}, /*keepdim=*/true); };
    const Tensor centred = frugal::sub(rows, row_mean(rows));
    const Tensor rstd_v = frugal::rsqrt(frugal::add(row_mean(frugal::square(centred)), eps));
    const Tensor xhat_rows = frugal::mul(centred, rstd_v);
    const Tensor xhat = xhat_rows.reshape(xv.sizes());
    TensorList out(3);
    if (wants_grad(*this, 0)) {
      const Tensor dxhat = weight.defined() ? frugal::mul(g, graph::saved_input(*this, 1, weight).view(geometry.channel)) : g;
      out[0] = graph::normalized_input_grad(dxhat.reshape(geometry.rows), xhat_rows, rstd_v, {1}, true).reshape(xv.sizes());
    }
    if (wants_grad(*this, 1) && weight.defined()) out[1] = frugal::sum(frugal::mul(g, xhat), geometry.reduce_dims);
    if (wants_grad(*this, 2) && has_bias) out[2] = frugal::sum(g, geometry.reduce_dims);
    return out;
  }
};

}  // namespace

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  core::OpScope scope("group_norm");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x, &weight, &bias}))
    return group_norm((*c)[0], num_groups, (*c)[1], (*c)[2], eps);
  const GroupNormGeometry geometry = check_group_norm(x, num_groups, weight, bias, eps);
  ops::LayerNormResult r = autograd::raw([&] {
    ops::LayerNormResult n = ops::layer_norm(x.reshape(geometry.rows), geometry.row_len(), Tensor(), Tensor(), eps);
    n.out = n.out.view(x.sizes());  // fresh and contiguous: the affine runs in place
    if (weight.defined()) ops::mul_(n.out, weight.view(geometry.channel));
    if (bias.defined()) ops::add_(n.out, bias.view(geometry.channel));
    return n;
  });
  if (auto node = make_node<GroupNormBackward>({x, weight, bias})) {
    node->x = x;
    if (weight.defined()) node->weight = weight;
    node->mean = r.mean;
    node->rstd = r.rstd;
    node->geometry = geometry;
    node->eps = eps;
    node->has_bias = bias.defined();
    autograd::record(node, {r.out});
  }
  return r.out;
}

}  // namespace frugal
