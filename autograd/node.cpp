#include "autograd/node.h"

#include <atomic>

#include "autograd/meta.h"
#include "autograd/ops/binary.h"
#include "autograd/saved_tensor.h"
#include "core/instrument.h"
#include "memory/trace.h"
#include "tensor/memory_format.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"

namespace frugal::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node() : sequence_nr(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {
  // Backward ops are attributed to the module whose forward created them.
  if (core::profiling()) core::note_node_module(sequence_nr);
}

TensorList Node::apply_graph(TensorList&&) {
  FRUGAL_FAIL(name(), " has no double backward (Note [Double backward])");  // the engine checks first
}

void Node::release_saved() {
  for (SavedSlot* s = saved_; s != nullptr; s = s->next_) s->reset();
}

bool Node::holds_saved() const {
  for (const SavedSlot* s = saved_; s != nullptr; s = s->next_)
    if (s->holds_values()) return true;
  return false;
}

void Node::for_each_saved(const std::function<void(const SavedValue&)>& f) const {
  for (const SavedSlot* s = saved_; s != nullptr; s = s->next_) s->for_each(f);
}

// Iterative teardown (Note [Backward graph]): before this node dies, take every
// child that only we keep alive; each such child gives up its own children the
// same way before it is destroyed, so no destructor ever recurses more than once.
Node::~Node() {
  std::vector<std::shared_ptr<Node>> orphans;
  auto adopt_children = [&orphans](Node& n) {
    for (Edge& e : n.next_edges)
      if (e.fn && e.fn.use_count() == 1) orphans.push_back(std::move(e.fn));
    n.next_edges.clear();
  };
  adopt_children(*this);
  while (!orphans.empty()) {
    std::shared_ptr<Node> n = std::move(orphans.back());
    orphans.pop_back();
    adopt_children(*n);
  }  // n is destroyed here with no children left
}

AccumulateGrad::AccumulateGrad(const Tensor& leaf) : leaf_(leaf.impl_ptr()) {
  outputs.push_back({leaf.sizes(), leaf.dtype(), leaf.device()});
}

namespace {
// One hook on one gradient (register_hook): the gradient in its tensor's dtype in, a defined
// result of the same shape replaces it.
void run_hook(const TensorHook& hook, Tensor& g, const OutputMeta& out, const std::string& node) {
  if (g.dtype() != out.dtype) g = g.to(out.dtype);
  Tensor r = hook(g);
  if (!r.defined()) return;
  FRUGAL_CHECK(r.sizes() == g.sizes(), "register_hook: a hook on an output of ", node, " returned ", r.describe(),
               " for a gradient of shape ", shape_str(g.sizes()), "; it must keep the shape");
  g = r.dtype() == out.dtype && r.device() == g.device() ? r : r.to(g.device(), out.dtype);
}
}  // namespace

void Node::run_tensor_hooks(TensorList& grads) {
  if (tensor_hooks.empty()) return;
  const auto hooks = tensor_hooks;  // a hook may remove itself
  for (const auto& [nr, id, hook] : hooks)
    if (nr < grads.size() && grads[nr].defined()) run_hook(hook, grads[nr], outputs[nr], name());
}

void AccumulateGrad::run_tensor_hooks(TensorList& grads) {
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  if (!impl || grads.empty() || !grads[0].defined()) return;
  AutogradMeta* m = meta_of(Tensor(impl));
  if (!m || m->tensor_hooks.empty()) return;
  const auto hooks = m->tensor_hooks;  // a hook may remove itself
  for (const auto& [id, hook] : hooks) run_hook(hook, grads[0], outputs[0], name());
}

namespace {
/// register_post_accumulate_grad_hook's hooks, after `leaf`'s .grad took this backward's part.
void run_post_accumulate_hooks(const AutogradMeta& m, const Tensor& leaf) {
  if (m.post_accumulate_grad_hooks.empty()) return;
  const auto hooks = m.post_accumulate_grad_hooks;  // a hook may remove itself
  for (const auto& [id, hook] : hooks) hook(leaf);
}
}  // namespace

namespace {
/// AccumulateGrad's work: g into the .grad of the leaf `leaf_ref` names, if it still lives and
/// requires grad. record (backward() with create_graph): the sum is a recorded op, out of place,
/// so .grad keeps its history, as PyTorch's; else .grad takes g's buffer or a copy the first
/// time and sums in place after.
void accumulate_grad(const std::weak_ptr<TensorImpl>& leaf_ref, std::mutex& mutex, Tensor g, bool record) {
  std::shared_ptr<TensorImpl> impl = leaf_ref.lock();
  if (!impl || !g.defined()) return;
  Tensor leaf(impl);
  AutogradMeta& m = ensure_meta(leaf);
  // A leaf frozen (requires_grad_(false)) after the graph was built gets nothing, as in
  // PyTorch's AccumulateGrad: freezing a parameter between forward and backward freezes it.
  if (!m.requires_grad) return;
  core::CategoryScope category(core::Category::Gradients);  // the copies below are .grad
  if (g.dtype() != leaf.dtype()) g = g.to(leaf.dtype());
  {
    // Held for the sum only: a post-accumulate hook may start another backward.
    std::lock_guard<std::mutex> lock(mutex);
    if (!m.grad.defined() && record) {
      m.grad = g;
    } else if (!m.grad.defined()) {
      // Steal the incoming buffer when nothing else holds it; otherwise copy, since a
      // later accumulation writes into .grad in place. .grad is contiguous, or channels-last
      // for a channels-last leaf (the parameter's layout, as PyTorch; Note [Channels-last layout]).
      const bool channels_last = suggests_channels_last(leaf);
      const bool in_layout = channels_last ? is_channels_last(g) : g.is_contiguous();
      // Stolen only when the gradient is its whole storage: a view of part of a buffer (a
      // split's adjacent grads joined, Note [Split backward without a copy]) would keep the
      // rest alive as long as .grad, labelled a gradient.
      const bool whole =
          g.storage_offset() == 0 && size_t(g.numel()) * element_size(g.dtype()) == g.impl().storage->nbytes;
      const bool sole_owner = g.impl_ptr().use_count() == 1 && g.impl().storage.use_count() == 1 && in_layout && whole;
      if (sole_owner) {
        m.grad = g;
        // A stolen buffer was allocated as a backward temporary; it is a gradient now.
        memory::relabel(g.device(), g.impl().storage->data.get(), core::Category::Gradients);
      } else if (channels_last) {
        m.grad = empty_channels_last(g.sizes(), g.options());
        ops::copy_into(m.grad, g);
      } else {
        m.grad = g.clone();
      }
    } else {
      // A .grad the user set in another dtype (set_grad allows it, for optimizers' checks to
      // be tested) would take every later gradient rounded to its dtype: refused, as PyTorch
      // refuses to assign it ("assigned grad has data of a different type").
      FRUGAL_CHECK(m.grad.dtype() == leaf.dtype(), "AccumulateGrad: the .grad of leaf ", leaf.describe(), " is ",
                   m.grad.describe(), "; a gradient accumulates in its leaf's dtype: set_grad a ",
                   dtype_name(leaf.dtype()), " tensor, or set_grad(Tensor()) before backward");
      if (record) m.grad = frugal::add(m.grad, g);
      else ops::add_(m.grad, g);
    }
  }
  run_post_accumulate_hooks(m, leaf);
}
}  // namespace

TensorList AccumulateGrad::apply(TensorList&& grads) {
  accumulate_grad(leaf_, mutex_, std::move(grads[0]), /*record=*/false);
  return {};
}

TensorList AccumulateGrad::apply_graph(TensorList&& grads) {
  accumulate_grad(leaf_, mutex_, std::move(grads[0]), /*record=*/true);
  return {};
}

}  // namespace frugal::autograd
