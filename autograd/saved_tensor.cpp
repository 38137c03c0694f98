#include "autograd/saved_tensor.h"

#include <thread>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/recompute_cheap.h"

namespace frugal::autograd {

namespace {
// A new handle onto the same storage, sizes and strides, without autograd meta.
Tensor detached_alias(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>(t.impl());
  impl->autograd_meta.reset();
  return Tensor(std::move(impl));
}

thread_local SavedTensorHooks* innermost_hooks = nullptr;
thread_local bool packing_a_parameter = false;  // set while a pack hook runs on a parameter

// Sets packing_a_parameter for the pack hook's call (restored after: a hook may save tensors itself).
class PackingParameter {
 public:
  explicit PackingParameter(bool value) : previous_(packing_a_parameter) { packing_a_parameter = value; }
  ~PackingParameter() { packing_a_parameter = previous_; }
  PackingParameter(const PackingParameter&) = delete;
  PackingParameter& operator=(const PackingParameter&) = delete;

 private:
  bool previous_;
};

const char* const kFreedMessage =
    ": its saved tensors were freed by an earlier backward; call backward(..., retain_graph=true) "
    "the first time to backward through the graph twice";
}  // namespace

// ---- hooks (Note [Saved tensor hooks]) ----------------------------------------

SavedTensorHooks::SavedTensorHooks(Pack pack, Unpack unpack)
    : hooks_(std::make_shared<const Pair>(Pair{std::move(pack), std::move(unpack)})), outer_(innermost_hooks) {
  FRUGAL_CHECK(hooks_->pack && hooks_->unpack, "SavedTensorHooks: both pack and unpack must be set");
  innermost_hooks = this;
}

SavedTensorHooks::~SavedTensorHooks() { innermost_hooks = outer_; }

const std::shared_ptr<const SavedTensorHooks::Pair>* SavedTensorHooks::current() {
  return innermost_hooks ? &innermost_hooks->hooks_ : nullptr;
}

bool SavedTensorHooks::packing_parameter() { return packing_a_parameter; }

// ---- one saved value ----------------------------------------------------------

// The hooked form: what pack returned, the hooks to restore it with, what the restored
// tensor must look like, and the original storage's version, read without owning it.
struct SavedValue::Packed {
  PackedTensor value;
  std::shared_ptr<const SavedTensorHooks::Pair> hooks;
  std::shared_ptr<const recompute::Recipe> recipe;  // instead of value and hooks (Note [Recomputable outputs])
  mutable bool read = false;                        // whether the recipe was unpacked once ("Sharing")
  Shape sizes;
  DType dtype;
  Device device;
  std::weak_ptr<Storage> storage;
  std::shared_ptr<const std::atomic<uint64_t>> final_version;

  std::string describe() const { return std::string(dtype_name(dtype)) + shape_str(sizes) + " " + device.str(); }

  Packed() = default;
  Packed(const Packed&) = delete;
  Packed& operator=(const Packed&) = delete;
  ~Packed() {
    if (recipe && !read) recompute::drop_saver(*recipe);
  }
};

SavedValue::SavedValue(const Tensor& t) : was_defined_(t.defined()) {
  if (!t.defined()) return;
  version_ = t.version();
  std::shared_ptr<const recompute::Recipe> recipe = recompute::recipe_for_saving(t);
  const std::shared_ptr<const SavedTensorHooks::Pair>* hooks = recipe ? nullptr : SavedTensorHooks::current();
  if (!recipe && !hooks) {
    data_ = detached_alias(t);
    return;
  }
  auto packed = std::make_unique<Packed>();
  packed->sizes = t.sizes();
  packed->dtype = t.dtype();
  packed->device = t.device();
  packed->storage = t.impl().storage;
  packed->final_version = t.impl().storage->final_version();
  if (recipe) {
    recompute::add_saver(*recipe);
    packed->recipe = std::move(recipe);
  } else {
    packed->hooks = *hooks;
    NoGradGuard no_grad;
    PackingParameter parameter(t.is_leaf() && t.requires_grad());
    packed->value = packed->hooks->pack(detached_alias(t));
  }
  packed_ = std::move(packed);
}

SavedValue::SavedValue() = default;
SavedValue::SavedValue(SavedValue&&) noexcept = default;
SavedValue& SavedValue::operator=(SavedValue&&) noexcept = default;
SavedValue::~SavedValue() = default;

// A storage that died may have been freed on another thread just now: weak_ptr::lock
// fails before its destructor publishes the last version, so wait for that store.
uint64_t SavedValue::current_version() const {
  if (!packed_) return data_.version();
  if (const std::shared_ptr<Storage> storage = packed_->storage.lock())
    return storage->version.load(std::memory_order_relaxed);
  uint64_t v;
  while ((v = packed_->final_version->load(std::memory_order_acquire)) == Storage::kLive) std::this_thread::yield();
  return v;
}

Tensor SavedValue::unpack(const std::string& node_name) const {
  if (!was_defined_) return Tensor();
  FRUGAL_CHECK(defined(), node_name, kFreedMessage);
  const uint64_t version = current_version();
  FRUGAL_CHECK(version == version_, node_name, ": a tensor it saved for backward (",
               packed_ ? packed_->describe() : data_.describe(), ") was modified by an in-place operation (version ",
               version, ", saved at version ", version_,
               "); clone it before the in-place op, or make that op out-of-place");
  if (!packed_) return data_;
  Tensor t;
  if (packed_->recipe) {
    t = recompute::read(*packed_->recipe, !packed_->read, node_name);
    packed_->read = true;
  } else {
    NoGradGuard no_grad;
    t = packed_->hooks->unpack(packed_->value);
  }
  FRUGAL_CHECK(
      t.defined() && t.sizes() == packed_->sizes && t.dtype() == packed_->dtype && t.device() == packed_->device,
      node_name, ": the ", packed_->recipe ? "recipe" : "unpack hook", " returned ", t.describe(),
      " for a saved tensor that was ", packed_->describe(),
      packed_->recipe ? " (Note [Recomputable outputs])" : " (Note [Saved tensor hooks])");
  return t;
}

std::shared_ptr<const recompute::Recipe> SavedValue::recipe() const { return packed_ ? packed_->recipe : nullptr; }

void SavedValue::reset() {
  data_ = Tensor();
  packed_.reset();
}

// ---- registration (Note [Saved tensor registry]) -------------------------------

SavedSlot::SavedSlot(Node* owner) : next_(owner->saved_) { owner->saved_ = this; }

}  // namespace frugal::autograd
