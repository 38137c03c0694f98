// linear_cross_entropy: the language-model head and its loss in row chunks.
#include "autograd/ops/linear_cross_entropy.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "core/graph_capture.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/index.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"

namespace frugal {

using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// Note [Fused linear cross entropy]
// After Liger Kernel's fused linear cross-entropy and Cut Cross-Entropy (Wijmans et al.,
// 2024). The loss of a Mean or Sum reduction is a scalar, so its gradient is a scalar g:
// every gradient is g times the gradient for g = 1. The forward therefore computes, chunk
// by chunk of rows, the logits (one GEMM), the loss and the logits' gradient for g = 1
// (the fused cross-entropy kernels), and from it the gradients of x (its rows of the
// chunk), of weight and of bias (two GEMMs, summed over the chunks); the chunk's logits
// and their gradient are dropped before the next chunk. Backward only scales the kept
// gradients by g. Same FLOPs as linear + cross_entropy, but instead of N x C logits, their
// float32 copy and their gradient (BERT's MLM head at batch 64 x 128: 3 GiB), the step
// keeps a float32 weight gradient (C x H) and the rows' input gradient. Rows whose target
// is ignore_index contribute nothing and are left out before the GEMMs (BERT predicts
// 15% of its tokens): that reads the targets on the host, one small copy per call. Inside a
// CUDA graph capture nothing may be read on the host (Note [CUDA graphs]), so there every
// row goes through the GEMMs (ignored ones give zero loss and gradient in the cross-entropy
// kernels) and a Mean divides by the count of kept rows as a device scalar: the step costs
// the head's FLOPs on every row instead of 15% of them, but BERT's step can be captured.
// Precision as the unfused pair under autocast: logits rounded to the autocast dtype,
// the loss and the logits' gradient in float32 (the gradient then rounded to the autocast
// dtype for its GEMMs, as the unfused backward does, but first scaled by 2^10 so that a
// large vocabulary's small probabilities stay normal float16 numbers; the GEMMs write
// float32 and the scale is divided back out), weight gradients accumulated in float32
// (Note [Weight gradients in the master dtype]).
constexpr double kLowPrecisionGradScale = 1024.0;

/// Rows per chunk: a quarter of the rows, so that a chunk's logits (and their float32
/// copy and gradient) are a quarter of the unfused ones, but at least 256 rows (smaller
/// GEMMs waste the GPU) and at most 64 MiB of float32 logits.
int64_t default_chunk_rows(int64_t rows, int64_t classes) {
  const int64_t most = std::max<int64_t>(1, (int64_t(64) << 20) / (4 * std::max<int64_t>(classes, 1)));
  return std::min(most, std::max<int64_t>(256, (rows + 3) / 4));
}

struct LinearCrossEntropyBackward final : Node {
  SavedTensor grad_x{this}, grad_weight{this}, grad_bias{this};  // for a loss gradient of `unit`
  SavedTensor rows{this};                                        // int64 indices of the kept rows; undefined: every row
  Shape x_shape;
  DType x_dtype = kFloat32, weight_dtype = kFloat32, bias_dtype = kFloat32;
  DType accumulation_dtype = kFloat32;  // of the kept gradients
  double unit = 1.0;  // what the kept gradients are for: 1 / (scale * count) (Mean) or 1 / scale (Sum)
  Tensor count;       // inside a capture, a Mean's count of kept rows (0-d, on the device): unit is then 1 / scale
  std::string name() const override { return "LinearCrossEntropyBackward"; }
  TensorList apply(TensorList&& grads) override {
    // One 0-d factor, so each kept gradient is scaled in one pass. The kept gradients
    // share a dtype: the forward's accumulation dtype.
    Tensor factor = ops::mul(grads[0].to(accumulation_dtype), unit);
    // No kept row: every gradient is 0, as PyTorch's (the loss is 0 / 0 = NaN), not 0 * inf.
    if (count.defined()) factor = ops::div(factor, ops::clamp(count, 1.0, std::numeric_limits<double>::infinity()));
    const auto scaled = [&](const SavedTensor& kept, DType dtype) {
      return autograd::in_dtype(ops::mul(kept.unpack(name()), factor), dtype);
    };
    TensorList out(3);
    if (wants_grad(*this, 0)) {
      Tensor gx = scaled(grad_x, x_dtype);
      if (rows.defined()) {
        const int64_t n = numel_of(Shape(x_shape.begin(), x_shape.end() - 1));
        gx = ops::index_add(zeros({n, gx.size(1)}, gx.options()), 0, rows.unpack(name()), gx);
      }
      out[0] = gx.reshape(x_shape);
    }
    if (wants_grad(*this, 1)) out[1] = scaled(grad_weight, weight_dtype);
    if (wants_grad(*this, 2)) out[2] = scaled(grad_bias, bias_dtype);
    return out;
  }
};

void check_inputs(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& target,
                  const LinearCrossEntropyOptions& o) {
  constexpr const char* op = "linear_cross_entropy";
  FRUGAL_CHECK(x.defined() && weight.defined() && target.defined(), op, ": x, weight and target are required, got ",
               x.describe(), ", ", weight.describe(), " and ", target.describe());
  FRUGAL_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1), op, ": x (..., H) and weight (C, H) ",
               "do not match: ", x.describe(), " and ", weight.describe());
  FRUGAL_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), op, ": bias must be (",
               weight.size(0), "), got ", bias.describe());
  FRUGAL_CHECK(x.is_floating_point() && weight.is_floating_point() && (!bias.defined() || bias.is_floating_point()), op,
               ": x, weight and bias must be floating point, got ", x.describe(), ", ", weight.describe(), " and ",
               bias.describe());
  const Shape rows(x.sizes().begin(), x.sizes().end() - 1);
  FRUGAL_CHECK(target.sizes() == rows && (target.dtype() == kInt64 || target.dtype() == kInt32), op,
               ": target must be int64 or int32 of x's leading shape ", shape_str(rows), ", got ", target.describe());
  FRUGAL_CHECK(weight.device() == x.device() && target.device() == x.device() &&
                   (!bias.defined() || bias.device() == x.device()),
               op, ": every input must be on ", x.device().str(), ", got weight on ", weight.device().str(),
               " and target on ", target.device().str());
  FRUGAL_CHECK(o.loss.reduction != Reduction::None, op,
               ": reduction None needs every row's logits; use cross_entropy(linear(x, weight, bias), target)");
  FRUGAL_CHECK(o.chunk_rows >= 0, op, ": chunk_rows must be >= 0, got ", o.chunk_rows);
  FRUGAL_CHECK(!o.loss.weight.defined(), op, ": class weights (", o.loss.weight.describe(),
               ") are not taken by the fused op; use cross_entropy(linear(x, weight, bias), target, options) for them");
  // The range once over the whole target, so that a bad one is named by its own position, not
  // by its place in a chunk of the kept rows.
  const Tensor valid = ops::ne(target, double(o.loss.ignore_index));
  ops::checked_class_index(op, target, valid, weight.size(0), o.loss.ignore_index, x);
}

/// The dtype of the products: the autocast dtype when autocast is on for x's device,
/// else x's (then weight and bias must share it, as linear requires).
DType product_dtype(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DeviceType type = x.device().type;
  if (autocast::is_enabled(type) && x.dtype() != kFloat64) return autocast::dtype(type);
  FRUGAL_CHECK(weight.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
               "linear_cross_entropy: x, weight and bias must share a dtype outside autocast, got ", x.describe(), ", ",
               weight.describe(), (bias.defined() ? ", " + bias.describe() : std::string()));
  return x.dtype();
}

/// The rows whose target is not ignore_index (host indices).
std::vector<int64_t> kept_rows(const Tensor& target, int64_t ignore_index) {
  const std::vector<int64_t> t = target.to(kCPU, kInt64).contiguous().tolist<int64_t>();
  std::vector<int64_t> kept;
  kept.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] != ignore_index) kept.push_back(int64_t(i));
  return kept;
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& target,
                            const LinearCrossEntropyOptions& options) {
  core::OpScope scope("linear_cross_entropy");
  check_inputs(x, weight, bias, target, options);
  const DType dtype = product_dtype(x, weight, bias);
  const bool low = dtype == kFloat16 || dtype == kBFloat16;
  const DType loss_dtype = low ? kFloat32 : dtype;  // of the loss and of every accumulation
  const double grad_scale = low ? kLowPrecisionGradScale : 1.0;
  const int64_t H = x.size(-1), C = weight.size(0);
  auto node = make_node<LinearCrossEntropyBackward>({x, weight, bias});
  const bool want_x = node && wants_grad(*node, 0), want_w = node && wants_grad(*node, 1),
             want_b = node && wants_grad(*node, 2);

  CrossEntropyOptions sum_options = options.loss;
  sum_options.reduction = Reduction::Sum;
  Tensor loss, grad_x, grad_w, grad_b, rows, count;
  int64_t kept = 0;
  const bool captured = core::current_graph_capture() != nullptr;  // no host read (see the Note)
  autograd::raw([&] {
    Tensor xs = x.reshape({target.numel(), H}), ts = target.reshape({-1});  // rows named: H may be 0
    const std::vector<int64_t> keep = captured ? std::vector<int64_t>() : kept_rows(ts, options.loss.ignore_index);
    kept = captured ? xs.size(0) : int64_t(keep.size());
    if (!captured && kept < xs.size(0)) {
      rows = from_vector(keep, {kept}).to(x.device());
      xs = ops::index_select(xs, 0, rows);
      ts = ops::index_select(ts, 0, rows);
    }
    xs = xs.to(dtype);
    const Tensor w = weight.to(dtype), b = bias.defined() ? bias.to(dtype) : Tensor();
    const TensorOptions acc(loss_dtype, x.device());
    loss = zeros({}, acc);
    if (want_x) grad_x = empty({kept, H}, acc);
    const Tensor one = scalar_tensor(1.0, acc);
    const int64_t chunk = options.chunk_rows > 0 ? options.chunk_rows : default_chunk_rows(kept, C);
    for (int64_t first = 0; first < kept; first += chunk) {
      const int64_t n = std::min(chunk, kept - first);
      const Tensor xc = xs.narrow(0, first, n), tc = ts.narrow(0, first, n);
      Tensor g;
      {
        const Tensor logits = ops::linear(xc, w, b).to(acc.dtype);  // (n, C): rounded to `dtype`, as linear's
        const ops::CrossEntropyResult r = ops::cross_entropy(logits, tc, sum_options);
        ops::add_(loss, r.loss);
        if (!node) continue;
        g = ops::cross_entropy_backward(one, logits, tc, r.lse, Tensor(), sum_options);
      }
      if (want_b) {
        const Tensor part = ops::mul(ops::sum(g, {0}), grad_scale);
        grad_b = grad_b.defined() ? ops::add_(grad_b, part) : part;
      }
      const Tensor g_low = low ? ops::mul(g, grad_scale).to(dtype) : g;
      g = Tensor();
      if (want_x) grad_x.narrow(0, first, n).copy_(ops::mm(g_low, w, acc.dtype));
      if (want_w) {
        const Tensor part = ops::mm(g_low.t(), xc, acc.dtype);  // (C, H)
        grad_w = grad_w.defined() ? ops::add_(grad_w, part) : part;
      }
    }
    if (options.loss.reduction == Reduction::Mean) {  // 0 kept: NaN, as PyTorch
      if (captured) count = ops::sum(ops::ne(ts, double(options.loss.ignore_index)).to(loss_dtype));  // exact < 2^24
      loss = captured ? ops::div(loss, count) : ops::div(loss, double(kept));
    }
    if (want_w && !grad_w.defined()) grad_w = zeros({C, H}, acc);
    if (want_b && !grad_b.defined()) grad_b = zeros({C}, acc);
  });
  if (node) {
    const double host_count = options.loss.reduction == Reduction::Mean && !captured ? double(kept) : 1.0;
    node->unit = host_count > 0 ? 1.0 / (grad_scale * host_count) : 0.0;  // no kept row: zero gradients
    node->count = count;
    node->accumulation_dtype = loss_dtype;
    if (want_x) node->grad_x = grad_x;
    if (want_w) node->grad_weight = grad_w;
    if (want_b) node->grad_bias = grad_b;
    if (rows.defined()) node->rows = rows;
    node->x_shape = x.sizes();
    node->x_dtype = x.dtype();
    node->weight_dtype = weight.dtype();
    node->bias_dtype = bias.defined() ? bias.dtype() : kFloat32;
    autograd::record(node, {loss});
  }
  return loss;
}

}  // namespace frugal
