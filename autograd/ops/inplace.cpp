// The in-place rules of Note [In-place ops and autograd] (autograd/ops/inplace.h).
#include "autograd/ops/inplace.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "autograd/checkpoint.h"
#include "autograd/function.h"

namespace frugal::autograd {

namespace {

bool is_view_node(const std::string& name) {
  static constexpr std::array<std::string_view, 8> kViews = {
      "ViewBackward",   "PermuteBackward",   "SliceBackward", "SelectBackward",
      "ExpandBackward", "AsStridedBackward", "SplitBackward", "SplitWithSizesBackward"};
  return std::find(kViews.begin(), kViews.end(), name) != kViews.end();
}

}  // namespace

/// Checks that `self` may be written in place (Note [In-place ops and autograd]);
/// true when the op must be recorded.
bool must_record_inplace(const char* op, const Tensor& self, const Tensor* other) {
  FRUGAL_CHECK(self.defined(), op, ": undefined input tensor");
  FRUGAL_CHECK(other == nullptr || other->defined(), op, ": undefined operand (self ", self.describe(), ")");
  check_recompute_write(op, self);  // before the early return: the buffer needs no grad
  // (A view that got a node of its own afterwards, as an op's raw body makes them, is the
  // view rule's below.)
  FRUGAL_CHECK(!(self.impl().no_grad_view_of_grad && is_grad_enabled() && self.grad_fn_name().empty()), op, ": ",
               self.describe(),
               " is a view of a tensor that requires grad, taken under NoGradGuard, and is written by an in-place "
               "operation with grad mode on: its base's history would miss the write (PyTorch refuses it too); "
               "write it under NoGradGuard, or take the view with grad mode on (Note [Views without history])");
  if (!needs_grad({&self, other})) return false;
  FRUGAL_CHECK(!(self.is_leaf() && self.requires_grad()), op,
               ": a leaf tensor that requires grad is used in an in-place operation (", self.describe(),
               "); run it under NoGradGuard (as an optimizer step does) or use the out-of-place op");
  const std::string fn = self.grad_fn_name();
  const bool spans_storage =
      self.storage_offset() == 0 && size_t(self.numel()) * self.element_size() == self.impl().storage->nbytes;
  // A view op's result over a storage another tensor holds (its base, or a view of it
  // taken under NoGradGuard) even without a view node: the base would miss the change.
  const bool shared_view = self.impl().is_view && self.impl().storage.use_count() > 1;
  FRUGAL_CHECK(spans_storage && !is_view_node(fn) && !shared_view, op, ": in-place operation on a view (",
               fn.empty() ? (spans_storage ? "sharing a storage another tensor holds" : "part of a larger tensor") : fn,
               ") of ", self.describe(),
               " while autograd records it; frugal does not track views, so the base tensor would miss the "
               "change: clone() it first or use the out-of-place op");
  return true;
}

/// Makes the node the new grad_fn of self (Note [In-place ops and autograd]).
void rebase_history(const Tensor& self, const std::shared_ptr<Node>& node) {
  AutogradMeta* m = meta_of(self);
  const bool retained = m && m->retains_grad && m->grad_fn;
  if (retained)
    std::erase_if(m->grad_fn->retained_outputs, [&](const auto& r) { return r.second.lock() == self.impl_ptr(); });
  record(node, {self});
  // Views of this storage without a view node no longer describe it (Note [Views without history]).
  self.impl().storage->history_rewrites.fetch_add(1, std::memory_order_relaxed);
  if (retained) node->retained_outputs.emplace_back(0, self.impl_ptr());
}

Tensor alias_for_history(const Tensor& t, bool aliased) {
  Tensor out = t.detach();
  if (aliased) out.impl().is_view = true;  // refused by must_record_inplace while shared
  return out;
}

}  // namespace frugal::autograd
