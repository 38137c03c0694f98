// Backward of the Tensor methods that derive one tensor from another: views,
// clone/contiguous and to() (see Note [Derived tensors]). One node type, one
// formula per kind of derivation.
#include "autograd/ops/view.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/index.h"
#include "autograd/ops/view_history.h"
#include "autograd/recompute_cheap.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"

namespace frugal::autograd {

namespace {

class DerivedBackward final : public ViewNode {
 public:
  DerivedInfo info;
  Shape in_sizes;
  DType in_dtype = kFloat32;
  Device in_device = kCPU;

  std::string name() const override {
    switch (info.kind) {
      case DerivedInfo::Kind::Reshape: return "ViewBackward";
      case DerivedInfo::Kind::Permute: return "PermuteBackward";
      case DerivedInfo::Kind::Slice: return "SliceBackward";
      case DerivedInfo::Kind::Select: return "SelectBackward";
      case DerivedInfo::Kind::Expand: return "ExpandBackward";
      case DerivedInfo::Kind::Convert: return "ToCopyBackward";
      case DerivedInfo::Kind::AsStrided: return "AsStridedBackward";
    }
    return "DerivedBackward";
  }
  // sizes, dtype and device only: saves_tensors() is false (ViewNode)
  std::optional<DType> converts_gradient_to() const override {
    return info.kind == DerivedInfo::Kind::Convert ? std::optional<DType>(in_dtype) : std::nullopt;
  }

  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    switch (info.kind) {
      case DerivedInfo::Kind::Reshape: return {g.reshape(in_sizes)};
      case DerivedInfo::Kind::Permute: {
        std::vector<int64_t> inverse(info.dims.size());
        for (size_t i = 0; i < info.dims.size(); ++i) inverse[size_t(info.dims[i])] = int64_t(i);
        return {g.permute(inverse)};
      }
      case DerivedInfo::Kind::Slice: {
        Tensor gin = zeros(in_sizes, g.options());
        ops::copy_into(gin.slice(info.dim, info.start, info.end, info.step), g);
        return {gin};
      }
      case DerivedInfo::Kind::Select: {
        Tensor gin = zeros(in_sizes, g.options());
        ops::copy_into(gin.select(info.dim, info.start), g);
        return {gin};
      }
      case DerivedInfo::Kind::Expand: return {sum_to(g, in_sizes)};
      case DerivedInfo::Kind::Convert: return {g.to(in_device, in_dtype)};
      case DerivedInfo::Kind::AsStrided: break;
    }
    FRUGAL_FAIL(name(), ": not differentiable");
  }
  bool has_graph_backward() const override { return info.kind != DerivedInfo::Kind::AsStrided; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor& g = grads[0];
    switch (info.kind) {
      case DerivedInfo::Kind::Expand: return {graph::sum_to(g, in_sizes)};
      case DerivedInfo::Kind::Slice:  // g's rows added into zeros at the sliced positions
      case DerivedInfo::Kind::Select: {
        const bool select = info.kind == DerivedInfo::Kind::Select;
        const int64_t end = select ? info.start + 1 : info.end, step = select ? 1 : info.step;
        const Tensor index = arange(double(info.start), double(end), double(step), {kInt64, g.device()});
        const Tensor rows = select ? g.unsqueeze(info.dim) : g;
        return {frugal::index_add(zeros(in_sizes, g.options()), info.dim, index, rows)};
      }
      default: return apply(std::move(grads));  // reshape, permute and to() record themselves
    }
  }
};

const char* derived_name(DerivedInfo::Kind kind) {
  switch (kind) {
    case DerivedInfo::Kind::Reshape: return "view";
    case DerivedInfo::Kind::Permute: return "permute";
    case DerivedInfo::Kind::Slice: return "slice";
    case DerivedInfo::Kind::Select: return "select";
    case DerivedInfo::Kind::Expand: return "expand";
    case DerivedInfo::Kind::Convert: return "to/clone";
    case DerivedInfo::Kind::AsStrided: return "as_strided";
  }
  return "view";
}

void record_derived(const Tensor& in, const Tensor& out, const DerivedInfo& info) {
  check_untracked_view(derived_name(info.kind), in);  // Note [Views without history]
  if (!is_grad_enabled() && requires_grad(in) && info.kind != DerivedInfo::Kind::Convert)
    out.impl().no_grad_view_of_grad = true;
  if (!needs_grad({&in})) return;
  // A raw op (frugal::ops) views its inputs with as_strided, so a user calling one on a
  // tensor that requires grad lands here: the message names that case too.
  FRUGAL_CHECK(info.kind != DerivedInfo::Kind::AsStrided, "as_strided: not differentiable in frugal (input ",
               in.describe(),
               " requires grad, grad mode on). If a raw op from frugal::ops (tensor/ops/*.h, below autograd) "
               "raised this, call the differentiable op of the same name in frugal (autograd/ops/all.h), or run "
               "the raw op on x.detach() or under NoGradGuard; for a view of your own use view, permute, slice, "
               "select or expand");
  // A conversion to an integer or bool dtype is not differentiable: its result requires no grad,
  // as PyTorch's (x.to(torch.int64) of an x that requires grad).
  if (!is_floating(out.dtype())) return;
  auto node = make_node<DerivedBackward>({in});
  node->info = info;
  node->in_sizes = in.sizes();
  node->in_dtype = in.dtype();
  node->in_device = in.device();
  if (info.kind != DerivedInfo::Kind::Convert) node->set_base(in);  // a copy's values are its own
  record(node, {out});
  // A cast of a recomputable output is one too (Note [Recomputable outputs], casts).
  if (info.kind == DerivedInfo::Kind::Convert) recompute::register_conversion(in, out);
}

}  // namespace

// ---- Note [Views of a tensor written in place] ------------------------------------------

void ViewNode::set_base(const Tensor& base) {
  const AutogradMeta* m = meta_of(base);
  const Node* fn = m ? m->grad_fn.get() : nullptr;
  const auto* parent = dynamic_cast<const ViewNode*>(fn);
  if (parent && parent->tracks_base) {  // a view of a view: the same root base
    root_base = parent->root_base;
    root_fn = parent->root_fn;
  } else {
    root_base = base.impl_ptr();
    root_fn = fn;
  }
  tracks_base = true;
}

void check_view_history(const Tensor& t, const Node& fn) {
  const auto* view = dynamic_cast<const ViewNode*>(&fn);
  if (!view || !view->tracks_base) return;
  const std::shared_ptr<TensorImpl> base = view->root_base.lock();
  if (!base) return;
  const auto* m = static_cast<const AutogradMeta*>(base->autograd_meta.get());
  const Node* now = m ? m->grad_fn.get() : nullptr;
  FRUGAL_CHECK(now == view->root_fn, view->name(), ": ", t.describe(),
               " is a view of a tensor that was modified in place after the view was taken (its history now ends in ",
               now ? now->name() : std::string("a leaf"),
               "); frugal does not track views, so this view's gradient would miss the in-place write: take the "
               "view after the in-place op, or clone() the tensor before writing it (",
               "Note [Views of a tensor written in place])");
}

void check_stale_view(const char* op, const Tensor& t) {
  const TensorImpl& impl = t.impl();
  if (!impl.is_view || !is_grad_enabled()) return;
  const uint64_t now = impl.storage->history_rewrites.load(std::memory_order_relaxed);
  if (now == impl.rewrites_at_view) return;
  const AutogradMeta* m = meta_of(t);
  if (m && m->grad_fn) return;  // a view node: check_view_history's case
  FRUGAL_FAIL(op, ": ", t.describe(),
              " is a view taken while its base needed no grad (or under NoGradGuard), and its storage was "
              "modified in place by an operation autograd recorded after the view was taken; the view has no "
              "history of that write, so a gradient through it would be silently missing: take the view after "
              "the in-place op, or use it under NoGradGuard (Note [Views without history])");
}

void install_derived_hook() { set_derived_hook(&record_derived); }

}  // namespace frugal::autograd
