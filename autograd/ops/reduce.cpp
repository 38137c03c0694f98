// Reductions, forward and backward side by side.
//
// Note [Reduction gradients]
// The gradient of a reduction has the reduced shape; backward first puts 1s back at the
// reduced dims (a free reshape: `kept`), so that it broadcasts against the input. sum's
// gradient is then just that broadcast (an expand view: no memory), and the others scale
// or mask it. The raw op has already checked the dims, so the helpers here trust them.
#include "autograd/ops/reduce.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/even_share.h"
#include "autograd/ops/index.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/index.h"
#include "tensor/ops/unary.h"  // sqrt: std

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

/// x's shape with 1 at each reduced dim (empty `dims`: every dim), as keepdim gives.
Shape kept_shape(const Shape& in, const std::vector<int64_t>& dims) {
  Shape s = in;
  const int64_t nd = int64_t(in.size());
  if (dims.empty()) std::fill(s.begin(), s.end(), 1);
  if (nd > 0)
    for (int64_t d : dims) s[size_t(d < 0 ? d + nd : d)] = 1;
  return s;
}

/// How many elements fold into each output.
int64_t reduced_count(const Shape& in, const Shape& kept) {
  int64_t n = 1;
  for (size_t d = 0; d < in.size(); ++d)
    if (kept[d] != in[d]) n *= in[d];
  return n;  // dims of size 1 fold one element either way
}

/// What every reduction node needs: the input's shape and dtype, the kept shape.
struct ReduceGeometry {
  Shape in, kept;
  DType dtype = kFloat32;
  ReduceGeometry() = default;
  ReduceGeometry(const Tensor& x, const std::vector<int64_t>& dims)
      : in(x.sizes()), kept(kept_shape(x.sizes(), dims)), dtype(x.dtype()) {}
  /// g with its reduced dims restored as 1s (Note [Reduction gradients]).
  Tensor restore(const Tensor& g) const { return in_dtype(g, dtype).reshape(kept); }
};

// out = sum(x, dims)
// grad_x = g broadcast to x's shape
struct SumBackward final : Node {
  ReduceGeometry geo;
  std::string name() const override { return "SumBackward"; }
  TensorList apply(TensorList&& grads) override { return {geo.restore(grads[0]).expand(geo.in)}; }
  bool has_graph_backward() const override { return true; }  // in_dtype, reshape and expand record
  TensorList apply_graph(TensorList&& grads) override { return apply(std::move(grads)); }
};

// out = mean(x, dims) over N elements each
// grad_x = g / N broadcast (the division on the small reduced tensor)
struct MeanBackward final : Node {
  ReduceGeometry geo;
  std::string name() const override { return "MeanBackward"; }
  TensorList apply(TensorList&& grads) override {
    const double n = double(reduced_count(geo.in, geo.kept));
    return {ops::div(geo.restore(grads[0]), n).expand(geo.in)};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const double n = double(reduced_count(geo.in, geo.kept));
    return {frugal::div(geo.restore(grads[0]), n).expand(geo.in)};
  }
};

// out = var(x, dims, correction) over N elements each
// grad_x = g * 2 (x - mean(x)) / (N - correction)
// x - mean in float32 for 16-bit x: a 16-bit mean of two adjacent values rounds onto one of
// them, which zeroes one gradient and doubles the other (std's, 1 / std times it, most).
Tensor var_grad(const Tensor& x, const ReduceGeometry& geo, const std::vector<int64_t>& dims, int64_t correction,
                const Tensor& g) {
  const double n = double(reduced_count(geo.in, geo.kept));
  const bool half = x.dtype() == kFloat16 || x.dtype() == kBFloat16;
  const Tensor xc = half ? x.to(kFloat32) : x;
  const Tensor scale = ops::mul(geo.restore(g), 2.0 / (n - double(correction)));  // reduced shape
  return in_dtype(ops::mul(ops::sub(xc, ops::mean(xc, dims, /*keepdim=*/true)), scale), x.dtype());
}

/// var_grad in differentiable ops (Note [Double backward]), x joined to its history.
Tensor var_grad_graph(const Tensor& x, const ReduceGeometry& geo, const std::vector<int64_t>& dims, int64_t correction,
                      const Tensor& g) {
  const double n = double(reduced_count(geo.in, geo.kept));
  const bool half = x.dtype() == kFloat16 || x.dtype() == kBFloat16;
  const Tensor xc = half ? x.to(kFloat32) : x;
  const Tensor scale = frugal::mul(geo.restore(g), 2.0 / (n - double(correction)));
  return in_dtype(frugal::mul(frugal::sub(xc, frugal::mean(xc, dims, /*keepdim=*/true)), scale), x.dtype());
}

struct VarBackward final : Node {
  SavedTensor x{this};
  ReduceGeometry geo;
  std::vector<int64_t> dims;
  int64_t correction = 1;
  std::string name() const override { return "VarBackward"; }
  TensorList apply(TensorList&& grads) override { return {var_grad(x.unpack(name()), geo, dims, correction, grads[0])}; }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    return {var_grad_graph(autograd::graph::saved_input(*this, 0, x), geo, dims, correction, grads[0])};
  }
};

// out = sqrt(var(x, dims, correction))
// grad_x = var's gradient for g / (2 out), 0 where out == 0 (PyTorch's std_backward: a
// slice of equal values gets 0, not the NaN of sqrt's 1 / 0 times var's 0)
struct StdBackward final : Node {
  SavedTensor x{this}, out{this};
  ReduceGeometry geo;
  std::vector<int64_t> dims;
  int64_t correction = 1;
  std::string name() const override { return "StdBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor o = out.unpack(name());
    const Tensor g = in_dtype(grads[0], o.dtype());
    const Tensor g_var = ops::masked_fill(ops::div(g, ops::mul(o, 2.0)), ops::eq(o, 0.0), 0.0);
    return {var_grad(x.unpack(name()), geo, dims, correction, g_var)};
  }
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor o = autograd::graph::saved_output(*this, 0, out);
    const Tensor g = in_dtype(grads[0], o.dtype());
    const Tensor zero = autograd::raw([&] { return ops::eq(o.detach(), 0.0); });
    // Where out is 0 the quotient is replaced, and its NaN derivative with it (where's backward).
    const Tensor safe_o = frugal::masked_fill(o, zero, 1.0);
    const Tensor g_var = frugal::masked_fill(frugal::div(g, frugal::mul(safe_o, 2.0)), zero, 0.0);
    return {var_grad_graph(autograd::graph::saved_input(*this, 0, x), geo, dims, correction, g_var)};
  }
};

// out = amax(x, dims) (amin alike; median(x) and nanmedian(x) over every dim)
// grad_x = hit ? g / count(hit) : 0 with hit = (x == out || x and out are NaN): ties share
// the gradient evenly, and a NaN result (NaN wins) sends it to the NaNs, as max(x, dim) sends
// it to the first NaN; x == out alone is false for every element there (NaN != NaN) and
// would drop the gradient (PyTorch gives NaN to the whole slice; either keeps the NaN seen).
//
// Note [Tie counts in float32]
// The division g / count(hit) runs in float32 (float64 for float64 inputs), never in a
// float16 input's own dtype: a float16 count saturates at 65504, so 70000 equal maxima
// (an amax over a large constant or ReLU-clipped tensor) would divide by inf and send a
// gradient of 0 everywhere, and counts past 2048 would already round. PyTorch's formula,
// grad / mask.sum(), promotes to the input dtype and so divides by a float16 count; the
// share itself, 1/70000 of g, is a float16 subnormal and survives the cast back.
struct EvenShareBackward final : Node {
  SavedTensor x{this}, out{this};
  ReduceGeometry geo;
  std::vector<int64_t> dims;
  std::string backward_name;
  std::string name() const override { return backward_name; }
  /// The elements that won (hit) and, per reduced slice, how many (count, in float32 or wider:
  /// Note [Tie counts in float32]).
  struct Hits {
    Tensor hit, count;
  };
  Hits hits(DType wide) const {
    return autograd::raw([&] {
      const Tensor xv = x.unpack(name());
      const Tensor ov = out.unpack(name()).reshape(geo.kept);
      Tensor hit = ops::eq(xv, ov);
      if (is_floating(xv.dtype())) hit = ops::logical_or(hit, ops::logical_and(ops::ne(xv, xv), ops::ne(ov, ov)));
      return Hits{hit, ops::sum(hit, dims, /*keepdim=*/true).to(wide)};  // reduced shape
    });
  }
  static DType wide_dtype(DType dtype) { return dtype == kFloat64 ? kFloat64 : kFloat32; }
  TensorList apply(TensorList&& grads) override {
    const DType wide = wide_dtype(geo.dtype);
    const Hits h = hits(wide);
    const Tensor share = ops::div(in_dtype(grads[0], wide).reshape(geo.kept), h.count);
    return {in_dtype(ops::where(h.hit, share, zeros({}, share.options())), geo.dtype)};
  }
  // g / count on the hits: linear in g, the hits and counts constants.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const DType wide = wide_dtype(geo.dtype);
    const Hits h = hits(wide);
    const Tensor share = frugal::div(in_dtype(grads[0], wide).reshape(geo.kept), h.count);
    const Tensor missed = autograd::raw([&] { return ops::logical_not(h.hit); });
    const Tensor spread = frugal::masked_fill(share.expand(geo.in), missed, 0.0);
    return {autograd::graph::with_zero_derivative(in_dtype(spread, geo.dtype), *this, 0)};
  }
};

Tensor reduction(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool is_sum) {
  Tensor out = autograd::raw([&] { return is_sum ? ops::sum(x, dims, keepdim) : ops::mean(x, dims, keepdim); });
  if (is_sum) {
    if (auto node = make_node<SumBackward>({x})) {
      node->geo = ReduceGeometry(x, dims);
      autograd::record(node, {out});
    }
  } else if (auto node = make_node<MeanBackward>({x})) {
    node->geo = ReduceGeometry(x, dims);
    autograd::record(node, {out});
  }
  return out;
}

Tensor amax_amin(bool is_max, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  core::OpScope scope(is_max ? "amax" : "amin");
  Tensor out = autograd::raw([&] { return is_max ? ops::amax(x, dims, keepdim) : ops::amin(x, dims, keepdim); });
  autograd::record_even_share(is_max ? "AmaxBackward" : "AminBackward", out, x, dims);
  return out;
}

// values, indices = max(x, dim) (min alike)
// grad_x = zeros with g scattered to the indices along dim
struct MaxMinBackward final : Node {
  SavedTensor indices{this};
  ReduceGeometry geo;
  int64_t dim = 0;
  bool is_max = true;
  std::string name() const override { return is_max ? "MaxBackward" : "MinBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = geo.restore(grads[0]);
    if (geo.in.empty()) return {g};  // a 0-d input is its own max
    Tensor grad = zeros(geo.in, g.options());
    ops::scatter_add_(grad, dim, indices.unpack(name()).reshape(geo.kept), g);
    return {grad};
  }
  bool has_graph_backward() const override { return true; }  // linear in g: scatter_add's own backward
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = geo.restore(grads[0]);
    if (geo.in.empty()) return {g};
    const Tensor grad = frugal::scatter_add(zeros(geo.in, g.options()), dim, indices.unpack(name()).reshape(geo.kept), g);
    return {autograd::graph::with_zero_derivative(grad, *this, 0)};
  }
};

ValuesIndices max_min(bool is_max, const Tensor& x, int64_t dim, bool keepdim) {
  core::OpScope scope(is_max ? "max" : "min");
  ValuesIndices r = autograd::raw([&] { return is_max ? ops::max(x, dim, keepdim) : ops::min(x, dim, keepdim); });
  if (auto node = make_node<MaxMinBackward>({x})) {
    node->indices = r.indices;
    node->geo = ReduceGeometry(x, {dim});
    node->dim = x.dim() == 0 ? 0 : wrap_dim(dim, x.dim(), is_max ? "max" : "min");
    node->is_max = is_max;
    autograd::record(node, {r.values});
  }
  return r;
}

}  // namespace

void autograd::record_even_share(const char* backward_name, const Tensor& out, const Tensor& x,
                                 const std::vector<int64_t>& dims) {
  if (auto node = make_node<EvenShareBackward>({x})) {
    node->x = x;
    node->out = out;
    node->geo = ReduceGeometry(x, dims);
    node->dims = dims;
    node->backward_name = backward_name;
    autograd::record(node, {out});
  }
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  core::OpScope scope("sum");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return sum((*c)[0], dims, keepdim);
  return reduction(x, dims, keepdim, true);
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  core::OpScope scope("mean");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return mean((*c)[0], dims, keepdim);
  return reduction(x, dims, keepdim, false);
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  core::OpScope scope("var");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return var((*c)[0], dims, correction, keepdim);
  Tensor out = autograd::raw([&] { return ops::var(x, dims, correction, keepdim); });
  if (auto node = make_node<VarBackward>({x})) {
    node->x = x;
    node->geo = ReduceGeometry(x, dims);
    node->dims = dims;
    node->correction = correction;
    autograd::record(node, {out});
  }
  return out;
}

Tensor std(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  core::OpScope scope("std");
  FRUGAL_CHECK(x.defined() && is_floating(x.dtype()), "std: expects a floating tensor, got ",
               x.defined() ? x.describe() : "undefined");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return frugal::std((*c)[0], dims, correction, keepdim);
  Tensor out = autograd::raw([&] { return ops::sqrt(ops::var(x, dims, correction, keepdim)); });
  if (auto node = make_node<StdBackward>({x})) {
    node->x = x;
    node->out = out;
    node->geo = ReduceGeometry(x, dims);
    node->dims = dims;
    node->correction = correction;
    autograd::record(node, {out});
  }
  return out;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return amax_amin(true, x, dims, keepdim);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return amax_amin(false, x, dims, keepdim);
}

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) { return max_min(true, x, dim, keepdim); }
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) { return max_min(false, x, dim, keepdim); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  core::OpScope scope("argmax");
  return autograd::raw([&] { return ops::argmax(x, dim, keepdim); });
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  core::OpScope scope("argmin");
  return autograd::raw([&] { return ops::argmin(x, dim, keepdim); });
}

}  // namespace frugal
