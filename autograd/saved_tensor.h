#pragma once
// Tensors saved for backward: with the version they had when saved, registered with
// the node that saved them, and packed by saved-tensor hooks when a guard is alive.
//
// Note [Saved tensor versions]
// Views share their storage's version counter and every in-place op bumps it
// (Note [Tensor handle]). A SavedTensor remembers the version at save time;
// unpacking it in backward after an in-place write throws, naming the node,
// instead of silently computing a wrong gradient. Saved tensors are stored
// detached (no autograd meta): keeping an output's meta would make the output's
// grad_fn own itself through the node (a reference cycle), and backward needs
// only the values.
//
// Note [Saved tensor registry]
// A node's saved state is a member constructed with its node, `SavedTensor x{this};`,
// which links itself into the node's list of SavedSlots. Node::release_saved (called by
// the engine after a backward without retain_graph) walks the list and resets each, so a
// node writes no release code and cannot forget a member; any other operation over every
// saved tensor of a node is one walk too (Node::for_each_saved). The list runs through the
// members themselves (an intrusive list: no allocation per node), which needs members that
// never move: a Node cannot be copied or moved (it lives in a shared_ptr), and neither can
// a SavedSlot. There is no default constructor, so a member without its node does not
// compile. SavedTensorList holds a variable number of tensors (a checkpoint's inputs);
// SavedState<T> holds other state that may own tensors (a checkpoint's closure), so it is
// freed with them. A node whose backward needs only sizes and scalars has no slot.
//
// Note [Saved tensor hooks]
// As PyTorch's torch.autograd.graph.saved_tensors_hooks: while a SavedTensorHooks guard
// is alive on a thread (innermost wins; guards nest as a stack), saving a tensor calls
// `pack` with it (a detached alias, so a hook cannot hold the graph) and keeps only what
// pack returned, a PackedTensor (std::any: a host copy, a compressed buffer, a file
// name); the SavedTensor then holds no reference to the original, so its memory goes
// when the forward's other handles do (offloading activations to host memory frees the
// device). Unpack in backward calls the `unpack` of the same guard, kept alive with the
// saved tensor after the guard's scope ends, on the packed form (once per unpack: with
// retain_graph it may run again) and checks that it returned the packed tensor's sizes,
// dtype and device. Both hooks run with grad mode off. Undefined tensors are not packed.
// The version check is kept, unlike PyTorch (which skips it under hooks): the saved
// tensor holds its storage weakly and reads the live version, or, once the storage is
// freed, the last version it published (Storage::final_version), so an in-place write
// after the save is caught even when the written tensor has died since. What the alias no
// longer shows, whether the saved tensor is a parameter, a hook asks packing_parameter().
// A tensor registered as a recomputable output is saved as its recipe while a
// RecomputeCheapOutputs guard is alive, ahead of any hook (Note [Recomputable outputs] in
// autograd/recompute_cheap.cpp).
#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::autograd {

class Node;
namespace recompute {
struct Recipe;
}  // namespace recompute

/// What a pack hook made of a saved tensor (Note [Saved tensor hooks]).
using PackedTensor = std::any;

/// A scoped guard: tensors saved for backward on this thread while it lives are packed by
/// `pack` and restored by `unpack` (Note [Saved tensor hooks]). Guards nest; the innermost
/// applies. Destroy them in reverse order of construction (as scopes do).
class SavedTensorHooks {
 public:
  using Pack = std::function<PackedTensor(const Tensor&)>;
  using Unpack = std::function<Tensor(const PackedTensor&)>;
  struct Pair {
    Pack pack;
    Unpack unpack;
  };

  SavedTensorHooks(Pack pack, Unpack unpack);
  ~SavedTensorHooks();
  SavedTensorHooks(const SavedTensorHooks&) = delete;
  SavedTensorHooks& operator=(const SavedTensorHooks&) = delete;

  /// The innermost guard's hooks on this thread, or null when no guard is alive.
  static const std::shared_ptr<const Pair>* current();
  /// While a pack hook runs on this thread: whether the tensor it packs is a leaf that
  /// requires grad (a parameter), which its detached alias no longer shows. A hook that
  /// moves tensors elsewhere leaves parameters alone: their memory stays held by the
  /// module anyway. False outside a pack hook.
  static bool packing_parameter();

 private:
  std::shared_ptr<const Pair> hooks_;
  SavedTensorHooks* outer_;
};

/// One saved tensor's values and version, owned by a SavedTensor or a SavedTensorList.
class SavedValue {
 public:
  SavedValue();
  /// Saves t (through the innermost hooks, if any).
  explicit SavedValue(const Tensor& t);
  SavedValue(SavedValue&&) noexcept;
  SavedValue& operator=(SavedValue&&) noexcept;
  ~SavedValue();

  /// The saved values; throws if they were modified in place since saving, or freed
  /// by an earlier backward (run backward with retain_graph=true to call it twice).
  Tensor unpack(const std::string& node_name) const;
  /// Holds values: a defined tensor was saved and not yet freed.
  bool defined() const { return data_.defined() || packed_ != nullptr; }
  /// Was packed by a hook (Note [Saved tensor hooks]) or saved as a recipe.
  bool is_packed() const { return packed_ != nullptr; }
  /// The recipe it was saved as (Note [Recomputable outputs]), or null.
  std::shared_ptr<const recompute::Recipe> recipe() const;
  void reset();

 private:
  struct Packed;
  uint64_t current_version() const;

  Tensor data_;                     // a detached alias of the saved tensor, when no hook packed it
  std::unique_ptr<Packed> packed_;  // what a hook packed it into, with how to restore and check it
  uint64_t version_ = 0;
  bool was_defined_ = false;
};

/// Saved state that registers itself with its node (Note [Saved tensor registry]).
class SavedSlot {
 public:
  SavedSlot(const SavedSlot&) = delete;
  SavedSlot& operator=(const SavedSlot&) = delete;

  /// Frees what it holds (the engine calls it through Node::release_saved).
  virtual void reset() = 0;
  /// Calls f on each saved tensor it holds.
  virtual void for_each(const std::function<void(const SavedValue&)>& f) const = 0;
  /// Holds something reset() would free (a SavedState always counts: it cannot tell).
  virtual bool holds_values() const {
    bool any = false;
    for_each([&](const SavedValue& v) { any = any || v.defined(); });
    return any;
  }

 protected:
  explicit SavedSlot(Node* owner);
  ~SavedSlot() = default;  // members of a node, never deleted through a SavedSlot*

 private:
  friend class Node;
  SavedSlot* next_;
};

/// One tensor a node saves: `SavedTensor x{this};`, then `node->x = x;` in the forward.
class SavedTensor final : public SavedSlot {
 public:
  explicit SavedTensor(Node* owner) : SavedSlot(owner) {}
  SavedTensor& operator=(const Tensor& t) {
    value_ = SavedValue(t);
    return *this;
  }

  /// See SavedValue::unpack.
  Tensor unpack(const std::string& node_name) const { return value_.unpack(node_name); }
  bool defined() const { return value_.defined(); }
  /// See SavedValue::recipe.
  std::shared_ptr<const recompute::Recipe> recipe() const { return value_.recipe(); }
  void reset() override { value_.reset(); }
  void for_each(const std::function<void(const SavedValue&)>& f) const override { f(value_); }

 private:
  SavedValue value_;
};

/// A variable number of saved tensors (`SavedTensorList inputs{this};`).
class SavedTensorList final : public SavedSlot {
 public:
  explicit SavedTensorList(Node* owner) : SavedSlot(owner) {}
  void reserve(size_t n) { values_.reserve(n); }
  void push_back(const Tensor& t) { values_.emplace_back(t); }
  size_t size() const { return values_.size(); }
  const SavedValue& operator[](size_t i) const { return values_[i]; }

  /// Frees every value but keeps the count, so an unpack after it says why it failed.
  void reset() override {
    for (SavedValue& v : values_) v.reset();
  }
  void for_each(const std::function<void(const SavedValue&)>& f) const override {
    for (const SavedValue& v : values_) f(v);
  }

 private:
  std::vector<SavedValue> values_;
};

/// Other state a node keeps for backward and frees with its saved tensors: a closure
/// that may capture tensors (`SavedState<std::function<...>> fn{this};`). Hooks do not
/// see it; reset() puts back a value-initialized T.
template <typename T>
class SavedState final : public SavedSlot {
 public:
  explicit SavedState(Node* owner) : SavedSlot(owner) {}
  SavedState& operator=(T value) {
    value_ = std::move(value);
    return *this;
  }
  const T& operator*() const { return value_; }
  const T* operator->() const { return &value_; }

  void reset() override { value_ = T(); }
  void for_each(const std::function<void(const SavedValue&)>&) const override {}
  bool holds_values() const override { return true; }

 private:
  T value_{};
};

}  // namespace frugal::autograd
