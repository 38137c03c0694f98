// pad, as torch.nn.functional.pad: constant mode with its own node, forward and backward
// side by side; reflect and replicate as an index_select per padded dim.
//
// Note [Padding as regions]
// `pad` lists (left, right) pairs from the last dim backwards; a negative entry crops. Per
// dim of size n, the output has n + left + right entries, and the ones that come from x
// form one box: out[max(left, 0) + k] = x[max(-left, 0) + k] for k < n - max(-left, 0) -
// max(-right, 0). Constant mode fills the output with the value and copies x's box into
// it; its backward is g narrowed to the box (a view), placed in zeros of x's shape only
// when something was cropped. Reflect and replicate read every output entry from x: index
// o of the output reads x[i(o - left)] with i mirrored at the edges (reflect: -1 -> 1,
// n -> n - 2) or clamped into [0, n) (replicate), one index_select per dim, whose
// backward adds the gradients of the copies.
#include <algorithm>
#include <string>

#include "autograd/function.h"
#include "autograd/ops/index.h"
#include "autograd/ops/shape_ops.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"

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

/// Where output entry o of a dim of size n padded by `left` reads x (Note [Padding as regions]).
int64_t source_index(int64_t o, int64_t n, int64_t left, bool reflect) {
  const int64_t i = o - left;
  if (!reflect) return std::clamp<int64_t>(i, 0, n - 1);
  return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i;
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
  const bool constant = mode == "constant", reflect = mode == "reflect";
  FRUGAL_CHECK(constant || reflect || mode == "replicate", op, ": unknown mode \"", mode,
               "\" (expected \"constant\", \"reflect\" or \"replicate\")");
  // Per dim of x: pad[2k] and pad[2k + 1] belong to dim x.dim() - 1 - k.
  std::vector<int64_t> left(size_t(x.dim()), 0), right(size_t(x.dim()), 0);
  Shape out_sizes = x.sizes();
  for (int64_t k = 0; k < pairs; ++k) {
    const size_t d = size_t(x.dim() - 1 - k);
    left[d] = pad[size_t(2 * k)], right[d] = pad[size_t(2 * k + 1)];
    out_sizes[d] = x.size(int64_t(d)) + left[d] + right[d];
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
  Tensor out = x;
  for (int64_t d = x.dim() - pairs; d < x.dim(); ++d) {
    const int64_t n = x.size(d), l = left[size_t(d)], r = right[size_t(d)];
    FRUGAL_CHECK(!reflect || (l < n && r < n), op, ": reflect padding (", l, ", ", r, ") at dim ", d,
                 " must be less than the dim's size ", n, " for ", x.describe());
    FRUGAL_CHECK(out_sizes[size_t(d)] >= 1, op, ": padding (", l, ", ", r, ") leaves no entries at dim ", d, " of ",
                 x.describe());
    std::vector<int64_t> index(size_t(out_sizes[size_t(d)]));
    for (int64_t o = 0; o < int64_t(index.size()); ++o) {
      index[size_t(o)] = source_index(o, n, l, reflect);
      FRUGAL_CHECK(index[size_t(o)] >= 0 && index[size_t(o)] < n, op, ": reflect padding (", l, ", ", r,
                   ") crops past the mirrored entries at dim ", d, " of ", x.describe());
    }
    out = index_select(out, d, from_vector(index, {int64_t(index.size())}, {kInt64, x.device()}));
  }
  return out;
}

}  // namespace frugal
