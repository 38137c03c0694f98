// Cumulative sums, running extremes and log-sum-exps, forward and backward side by side
// (cumprod: autograd/ops/products.cpp).
#include "autograd/ops/cumsum.h"

#include <limits>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/formula_node.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/index.h"
#include "autograd/ops/shape_ops.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/cumsum.h"
#include "tensor/ops/unary.h"  // isfinite

namespace frugal {

using autocast::Policy;
using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::TensorList;
namespace graph = autograd::graph;

namespace {

// out[j] = sum of x[k] for k <= j along dim
// grad_x[k] = sum of g[j] for j >= k: the cumulative sum of g run backwards, in x's dtype
struct CumsumBackward final : Node {
  DType dtype = kFloat32;  // x's
  int64_t dim = 0;         // wrapped; -1 for a 0-d input (its own sum)
  std::string name() const override { return "CumsumBackward"; }
  TensorList apply(TensorList&& grads) override {
    if (dim < 0) return {in_dtype(grads[0], dtype)};
    // Summed in the wider of x's dtype and the gradient's: a cumsum into a 16-bit dtype must
    // not round x's gradient prefixes to 16 bits (PyTorch sums in x's dtype).
    const Tensor& g = grads[0];
    return {in_dtype(ops::reverse_cumsum(in_dtype(g, promote_types(g.dtype(), dtype)), dim), dtype)};
  }
  bool has_graph_backward() const override { return true; }  // reverse_cumsum as flip, cumsum, flip
  TensorList apply_graph(TensorList&& grads) override {
    if (dim < 0) return {in_dtype(grads[0], dtype)};
    const Tensor g = in_dtype(grads[0], promote_types(grads[0].dtype(), dtype));
    return {in_dtype(frugal::flip(frugal::cumsum(frugal::flip(g, {dim}), dim), {dim}), dtype)};
  }
};

// out = logcumsumexp(x, dim)
// grad_x = exp(rlcse(log g+ - out) + x) - exp(rlcse(log g- - out) + x), rlcse the log-sum-exps
// run from the end of dim, g+ and g- the positive and negative parts of g in log space (the
// lowest finite value where there is none): PyTorch's formula, which keeps every exponential
// at most 1 (each term is exp(x_k - out_j) g_j for j >= k, and out_j >= x_k).
//
// Note [logcumsumexp's gradient precision]
// The formula differences x_k and out_j, which can be large and close (x near 1000: float32
// rounds out_j to 3e-5, which exp(x_k - out_j) carries into PyTorch's gradient). So out is
// recomputed from x in float64 for float32 and float64 x (float32 for 16-bit), not read from
// the saved output (which is then not saved at all: the node keeps x alone), and x and out are
// first shifted by each line's last out (its largest, when finite), which cancels in x_k -
// out_j and keeps log g - out at the size of the differences.
struct LogcumsumexpBackward final : autograd::FormulaNode {
  int64_t dim = 0;  // wrapped; -1 for a 0-d input (its own log-sum-exp)
  DType dtype = kFloat32;
  std::string name() const override { return "LogcumsumexpBackward"; }
  Tensor grad_from(const Tensor& g_in, const Tensor& xv, bool graph_mode) const override {
    if (dim < 0 || xv.numel() == 0) return in_dtype(g_in, dtype);
    const DType compute = dtype == kFloat32 ? kFloat64 : opmath_dtype(dtype);
    const Tensor g = in_dtype(g_in, compute), xw = in_dtype(xv, compute);
    const Tensor ow = graph_mode ? logcumsumexp(xw, dim) : ops::logcumsumexp(xw, dim);
    const Tensor shift = autograd::raw([&] {
      const Tensor last = ow.detach().narrow(dim, ow.size(dim) - 1, 1);
      return ops::where(ops::isfinite(last), last, zeros({}, last.options()));
    });
    const Tensor xc = sub(xw, shift), oc = sub(ow, shift);
    const double lowest =
        compute == kFloat64 ? std::numeric_limits<double>::lowest() : double(std::numeric_limits<float>::lowest());
    const Tensor none = full({}, lowest, {compute, g.device()});
    const auto [positive, negative] = autograd::raw([&] {
      return std::pair{ops::gt(g.detach(), 0.0), ops::lt(g.detach(), 0.0)};
    });
    const Tensor log_abs = log(abs(g));
    const auto from_end = [&](const Tensor& t) {
      return graph_mode ? flip(logcumsumexp(flip(t, {dim}), dim), {dim}) : ops::reverse_logcumsumexp(t, dim);
    };
    const auto part = [&](const Tensor& mask) { return exp(add(from_end(sub(where(mask, log_abs, none), oc)), xc)); };
    return in_dtype(sub(part(positive), part(negative)), dtype);
  }
};

/// cummax or cummin: the raw op's values re-read through gather when x needs a gradient.
ValuesIndices running_extreme(bool is_max, const Tensor& x, int64_t dim) {
  core::OpScope scope(is_max ? "cummax" : "cummin");
  ValuesIndices r = autograd::raw([&] { return is_max ? ops::cummax(x, dim) : ops::cummin(x, dim); });
  if (!autograd::needs_grad({&x})) return r;
  if (x.dim() == 0) {
    r.values = gather(x.reshape({1}), 0, r.indices.reshape({1})).reshape({});
  } else {
    r.values = gather(x, wrap_dim(dim, x.dim(), is_max ? "cummax" : "cummin"), r.indices);
  }
  return r;
}

}  // namespace

ValuesIndices cummax(const Tensor& x, int64_t dim) { return running_extreme(true, x, dim); }
ValuesIndices cummin(const Tensor& x, int64_t dim) { return running_extreme(false, x, dim); }

Tensor logcumsumexp(const Tensor& x, int64_t dim) {
  core::OpScope scope("logcumsumexp");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return logcumsumexp((*c)[0], dim);
  Tensor out = autograd::raw([&] { return ops::logcumsumexp(x, dim); });
  if (auto node = make_node<LogcumsumexpBackward>({x})) {
    node->x = x;
    node->dtype = x.dtype();
    node->dim = x.dim() == 0 ? -1 : wrap_dim(dim, x.dim(), "logcumsumexp");
    autograd::record(node, {out});
  }
  return out;
}

Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  core::OpScope scope("cumsum");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x})) return cumsum((*c)[0], dim, dtype);
  Tensor out = autograd::raw([&] { return ops::cumsum(x, dim, dtype); });
  if (auto node = make_node<CumsumBackward>({x})) {
    FRUGAL_CHECK(is_floating(out.dtype()), "cumsum: cannot sum ", x.describe(), ", which requires grad, into ",
                 dtype_name(out.dtype()), " (only floating tensors can require grad)");
    node->dtype = x.dtype();
    node->dim = x.dim() == 0 ? -1 : wrap_dim(dim, x.dim(), "cumsum");
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
