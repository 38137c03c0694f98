#include "autograd/meta.h"

#include <atomic>
#include <mutex>

#include "autograd/ops/view.h"
#include "autograd/ops/view_history.h"

namespace frugal::autograd {

AutogradMeta* meta_of(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return static_cast<AutogradMeta*>(t.impl().autograd_meta.get());
}

AutogradMeta& ensure_meta(const Tensor& t) {
  auto& slot = t.impl().autograd_meta;
  if (!slot) {
    // Once per process, before the first tensor with metadata can be viewed: a magic
    // static, so rank threads creating metadata at once do not race on the hook.
    static const bool hook_installed = (install_derived_hook(), true);
    (void)hook_installed;
    slot = std::make_shared<AutogradMeta>();
  }
  return *static_cast<AutogradMeta*>(slot.get());
}

bool requires_grad(const Tensor& t) {
  const AutogradMeta* m = meta_of(t);
  return m && (m->requires_grad || m->grad_fn);
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta_of(t);
  if (!m) return {};
  if (m->grad_fn) {
    // A view whose base was rewritten in place since is refused here, at its next use
    // (Note [Views of a tensor written in place]). View nodes save no tensors: most nodes
    // do, so the virtual call spares them the cast.
    if (!m->grad_fn->saves_tensors()) check_view_history(t, *m->grad_fn);
    return {m->grad_fn, m->output_nr};
  }
  if (!m->requires_grad) return {};
  // Threads building graphs over one leaf (a shared parameter) must find one accumulator, its
  // mutex serializing their sums into .grad, and not write the weak_ptr at once (PyTorch
  // locks the leaf's meta here).
  static std::mutex accumulator_mutex;
  std::lock_guard<std::mutex> lock(accumulator_mutex);
  std::shared_ptr<Node> acc = m->accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->accumulator = acc;
  }
  return {acc, 0};
}

uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook) {
  FRUGAL_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(),
               "register_post_accumulate_grad_hook: needs a leaf tensor that requires grad, got ",
               leaf.defined() ? leaf.describe() : std::string("an undefined tensor"));
  static std::atomic<uint64_t> next_id{1};
  const uint64_t id = next_id.fetch_add(1, std::memory_order_relaxed);
  ensure_meta(leaf).post_accumulate_grad_hooks.emplace_back(id, std::move(hook));
  return id;
}

void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t id) {
  AutogradMeta* m = meta_of(leaf);
  if (!m) return;
  auto& hooks = m->post_accumulate_grad_hooks;
  std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
}

uint64_t register_hook(const Tensor& t, TensorHook hook) {
  FRUGAL_CHECK(t.defined() && requires_grad(t),
               "register_hook: cannot register a hook on a tensor that does not "
               "require grad, got ",
               t.defined() ? t.describe() : std::string("an undefined tensor"));
  FRUGAL_CHECK(bool(hook), "register_hook: empty hook for ", t.describe());
  static std::atomic<uint64_t> next_id{1};
  const uint64_t id = next_id.fetch_add(1, std::memory_order_relaxed);
  AutogradMeta& m = ensure_meta(t);
  if (m.grad_fn) m.grad_fn->tensor_hooks.emplace_back(m.output_nr, id, std::move(hook));
  else m.tensor_hooks.emplace_back(id, std::move(hook));
  return id;
}

void remove_hook(const Tensor& t, uint64_t id) {
  AutogradMeta* m = meta_of(t);
  if (!m) return;
  std::erase_if(m->tensor_hooks, [id](const auto& h) { return h.first == id; });
  if (m->grad_fn) std::erase_if(m->grad_fn->tensor_hooks, [id](const auto& h) { return std::get<1>(h) == id; });
}

void set_history(const Tensor& t, const std::shared_ptr<Node>& fn, uint32_t nr) {
  AutogradMeta& m = ensure_meta(t);
  m.grad_fn = fn;
  m.output_nr = nr;
  m.requires_grad = true;
}

}  // namespace frugal::autograd
