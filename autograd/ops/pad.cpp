// pad, as torch.nn.functional.pad: constant mode with its own node, forward and backward
// side by side; reflect, replicate and circular as an index_select per padded dim.
//
// Note [Padding as regions]
// `pad` lists (left, right) pairs from the last dim backwards; a negative entry crops. Per
// dim of size n, the output has n + left + right entries, and the ones that come from x
// form one box: out[max(left, 0) + k] = x[max(-left, 0) + k] for k < n - max(-left, 0) -
// max(-right, 0). Constant mode fills the output with the value and copies x's box into
// it; its backward is g narrowed to the box (a view), placed in zeros of x's shape only
// when something was cropped. Reflect and replicate read every output entry from x: index
// o of the output reads x[i(o - left)] with i mirrored at the edges (reflect: -1 -> 1,
// n -> n - 2), clamped into [0, n) (replicate) or wrapped (circular: -1 -> n - 1), one
// index_select per dim (circular wraps the entries left after cropping, as PyTorch) (ops::pad_source_indices), whose
// backward adds the gradients of the copies.
#include <algorithm>
#include <cstdint>
#include <string>

#include "autograd/function.h"
#include "autograd/ops/index.h"
#include "autograd/ops/shape_ops.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/index.h"

namespace frugal {

using autograd::in_dtype;
using autograd::make_node;
using autograd::Node;
using autograd::TensorList;

namespace {

/// The part of x and of the output that hold the same entries (Note [Padding as regions]).
struct PadBox {
  std::vector<int64_t> in_start, out_start, length;  // one per dim of x
  bool crops = false;                                // some pad is negative
  bool empty = false;                                // some length is 0: nothing of x is kept
};

PadBox pad_box(const Shape& in, const std::vector<int64_t>& left, const std::vector<int64_t>& right) {
  PadBox b;
  for (size_t d = 0; d < in.size(); ++d) {
    const int64_t cut_l = std::max<int64_t>(-left[d], 0), cut_r = std::max<int64_t>(-right[d], 0);
    b.in_start.push_back(cut_l);
    b.out_start.push_back(std::max<int64_t>(left[d], 0));
    b.length.push_back(std::max<int64_t>(in[d] - cut_l - cut_r, 0));
    b.crops = b.crops || cut_l > 0 || cut_r > 0;
    b.empty = b.empty || b.length.back() == 0;
  }
  return b;
}

Tensor narrow_box(Tensor t, const std::vector<int64_t>& start, const std::vector<int64_t>& length) {
  for (size_t d = 0; d < start.size(); ++d) t = t.narrow(int64_t(d), start[d], length[d]);
  return t;
}

Tensor constant_pad(const Tensor& x, const std::vector<int64_t>& left, const std::vector<int64_t>& right,
                    const Shape& out_sizes, double value);

// out = x placed in a tensor of `value` (cropped where a pad is negative)
// grad_x = g's box, in zeros of x's shape where x was cropped
struct ConstantPadBackward final : Node {
  Shape in_sizes;
  DType dtype = kFloat32;
  PadBox box;
  std::string name() const override { return "ConstantPadBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    if (!box.crops) return {narrow_box(g, box.out_start, box.length)};
    Tensor grad = zeros(in_sizes, g.options());
    if (!box.empty)
      ops::copy_into(narrow_box(grad, box.in_start, box.length), narrow_box(g, box.out_start, box.length));
    return {grad};
  }
  bool has_graph_backward() const override { return true; }  // g's box, padded back with zeros where cropped
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor g = in_dtype(grads[0], dtype);
    if (!box.crops) return {narrow_box(g, box.out_start, box.length)};
    if (box.empty) return {zeros(in_sizes, g.options())};
    std::vector<int64_t> right;
    for (size_t d = 0; d < in_sizes.size(); ++d) right.push_back(in_sizes[d] - box.in_start[d] - box.length[d]);
    return {constant_pad(narrow_box(g, box.out_start, box.length), box.in_start, right, in_sizes, 0.0)};
  }
};

Tensor constant_pad(const Tensor& x, const std::vector<int64_t>& left, const std::vector<int64_t>& right,
                    const Shape& out_sizes, double value) {
  FRUGAL_CHECK(x.dtype() != kUInt8, "pad: not implemented for ", x.describe(), " (uint8 is storage only)");
  ops::check_fill_value("pad", value, x);
  const PadBox box = pad_box(x.sizes(), left, right);
  Tensor out = autograd::raw([&] {
    Tensor t = full(out_sizes, value, x.options());
    if (!box.empty) ops::copy_into(narrow_box(t, box.out_start, box.length), narrow_box(x, box.in_start, box.length));
    return t;
  });
  if (auto node = make_node<ConstantPadBackward>({x})) {
    node->in_sizes = x.sizes();
    node->dtype = x.dtype();
    node->box = box;
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace

Tensor pad(const Tensor& x, const std::vector<int64_t>& pad, const std::string& mode, double value) {
  constexpr const char* op = "pad";
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined(), op, ": undefined tensor");
  const int64_t pairs = int64_t(pad.size()) / 2;
  FRUGAL_CHECK(pad.size() % 2 == 0, op, ": padding length must be divisible by 2 ((left, right) pairs), got ",
               pad.size(), " values for ", x.describe());
  FRUGAL_CHECK(pairs <= x.dim(), op, ": padding length should be at most twice the number of dims, got ", pad.size(),
               " values for ", x.describe());
  const bool constant = mode == "constant", reflect = mode == "reflect", circular = mode == "circular";
  FRUGAL_CHECK(constant || reflect || circular || mode == "replicate", op, ": unknown mode \"", mode,
               "\" (expected \"constant\", \"reflect\", \"replicate\" or \"circular\")");
  // Per dim of x: pad[2k] and pad[2k + 1] belong to dim x.dim() - 1 - k.
  std::vector<int64_t> left(size_t(x.dim()), 0), right(size_t(x.dim()), 0);
  Shape out_sizes = x.sizes();
  for (int64_t k = 0; k < pairs; ++k) {
    const size_t d = size_t(x.dim() - 1 - k);
    left[d] = pad[size_t(2 * k)], right[d] = pad[size_t(2 * k + 1)];
    // Sizes and crops are computed in int64: a pad near its limits must not wrap into a small
    // valid size (INT64_MIN + INT64_MAX + 5 is 4).
    FRUGAL_CHECK(left[d] != INT64_MIN && right[d] != INT64_MIN &&
                     !__builtin_add_overflow(x.size(int64_t(d)), left[d], &out_sizes[d]) &&
                     !__builtin_add_overflow(out_sizes[d], right[d], &out_sizes[d]),
                 op, ": padding (", left[d], ", ", right[d], ") of dim ", d, " of ", x.describe(), " overflows int64");
    FRUGAL_CHECK(out_sizes[d] >= 0, op, ": the input size ", x.size(int64_t(d)), " plus padding (", left[d], ", ",
                 right[d], ") gives a negative output size at dim ", d, " of ", x.describe());
    // PyTorch crops with narrow, one side at a time: the crops together cannot exceed the input
    // (pad(zeros({3}), {-4, 2}) is an error there, not one element of the fill value).
    const int64_t cut = std::max<int64_t>(-left[d], 0) + std::max<int64_t>(-right[d], 0);
    FRUGAL_CHECK(cut <= x.size(int64_t(d)), op, ": padding (", left[d], ", ", right[d], ") crops ", cut,
                 " entries from dim ", d, ", which has ", x.size(int64_t(d)), ", of ", x.describe());
  }
  if (constant) return constant_pad(x, left, right, out_sizes, value);

  FRUGAL_CHECK(value == 0, op, ": mode \"", mode, "\" takes no fill value, got ", value);
  FRUGAL_CHECK(pairs >= 1 && pairs <= 3 && (x.dim() == pairs + 1 || x.dim() == pairs + 2), op, ": mode \"", mode,
               "\" pads the last 1, 2 or 3 dims of a 2-D or 3-D, 3-D or 4-D, 4-D or 5-D input, got ", pad.size(),
               " values for ", x.describe());
  // Only the leading batch dim (of a (pairs + 2)-D x) may be empty, as PyTorch.
  for (int64_t d = x.dim() - pairs - 1; d < x.dim(); ++d)
    FRUGAL_CHECK(x.size(d) > 0, op, ": mode \"", mode,
                 "\" needs non-empty dims apart from the batch dim, got size 0 at dim ", d, " of ", x.describe());
  const ops::PadIndexMode index_mode = reflect    ? ops::PadIndexMode::Reflect
                                       : circular ? ops::PadIndexMode::Circular
                                                  : ops::PadIndexMode::Replicate;
  Tensor out = x;
  for (int64_t d = x.dim() - pairs; d < x.dim(); ++d) {
    const int64_t n = x.size(d), l = left[size_t(d)], r = right[size_t(d)];
    FRUGAL_CHECK(!reflect || (l < n && r < n), op, ": reflect padding (", l, ", ", r, ") at dim ", d,
                 " must be less than the dim's size ", n, " for ", x.describe());
    FRUGAL_CHECK(out_sizes[size_t(d)] >= 1, op, ": padding (", l, ", ", r, ") leaves no entries at dim ", d, " of ",
                 x.describe());
    if (circular) {
      // Crop first, then wrap what is left (PyTorch's order: pad({1, 2, 3, 4, 5}, {-2, 3}) is
      // {3, 4, 5, 3, 4, 5}, the copies taken from the cropped {3, 4, 5}).
      const int64_t crop_l = std::max<int64_t>(-l, 0), kept = n - crop_l - std::max<int64_t>(-r, 0);
      FRUGAL_CHECK(l <= kept && r <= kept, op, ": circular padding (", l, ", ", r, ") at dim ", d,
                   " wraps around more than once: at most the ", kept, " entries left after cropping, for ",
                   x.describe());
      if (kept < n) out = out.narrow(d, crop_l, kept);
      out = index_select(
          out, d, ops::pad_source_indices(out_sizes[size_t(d)], kept, std::max<int64_t>(l, 0), index_mode, x.device()));
      continue;
    }
    // Every source index lies in [0, n) (ops::pad_source_index), so index_select's check never fires.
    out = index_select(out, d, ops::pad_source_indices(out_sizes[size_t(d)], n, l, index_mode, x.device()));
  }
  return out;
}

}  // namespace frugal
