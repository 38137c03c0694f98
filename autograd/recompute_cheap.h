#pragma once
// Selective recompute of cheap outputs without replaying the block (Note [Recomputable
// outputs] in autograd/recompute_cheap.cpp):
//
//   // Inside fn, the outputs of batch norm (+ ReLU, + residual), layer norm and GELU that a
//   // later op saves for backward are not kept: backward regenerates each in one elementwise
//   // pass from what the producing op's own backward keeps anyway.
//   Tensor y = autograd::recompute_cheap([&](const Tensor& h) { return (*block)(h); }, x);
//
// Unlike checkpoint(fn, x, CheckpointPolicy::Selective), nothing of fn runs again: no batch
// statistics are recomputed, no node rebuilt (a checkpoint's replay skips the running
// statistics' update too, Note [Checkpoint recompute]).
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "autograd/node.h"

namespace frugal::autograd {

/// A scoped guard: while alive on this thread, the ops that support it (batch_norm,
/// batch_norm_relu, batch_norm_add_relu, layer_norm, GELU and the other unary ops whose
/// backward saves their input) register a recipe for their output, and a tensor saved for
/// backward that is such an output is saved as its recipe instead of its values (Note
/// [Recomputable outputs]). Guards nest (the count of live guards is what matters).
class RecomputeCheapOutputs {
 public:
  /// `max_recipe_length`: the most elementwise passes one unpack may take. A residual that is
  /// itself a recipe adds its length; an output whose recipe would be longer is kept.
  explicit RecomputeCheapOutputs(int max_recipe_length = kDefaultMaxRecipeLength);
  ~RecomputeCheapOutputs();
  RecomputeCheapOutputs(const RecomputeCheapOutputs&) = delete;
  RecomputeCheapOutputs& operator=(const RecomputeCheapOutputs&) = delete;

  /// True while a guard is alive on this thread.
  static bool active() noexcept;
  /// The innermost guard's max_recipe_length (0 when none is alive).
  static int max_recipe_length() noexcept;

  static constexpr int kDefaultMaxRecipeLength = 3;

 private:
  int outer_max_;
};

/// Runs fn(x) under a RecomputeCheapOutputs guard: the per-block entry point of a memory
/// planner. The result is fn's, unchanged; gradients are those of fn(x) run plainly.
Tensor recompute_cheap(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

namespace recompute {

/// How to regenerate one op's output from its producing node's saved tensors, and what that
/// output was when registered (the key a saved tensor must match: Note [Recomputable outputs]).
struct Recipe {
  const char* what = "";  ///< the op: "batch_norm_add_relu", "layer_norm", "gelu"
  std::string producer;   ///< the producing node's name, for errors
  int length = 1;         ///< elementwise passes one run takes (nested recipes included)
  std::function<Tensor()> run;
  // The output it regenerates.
  std::weak_ptr<Storage> storage;
  int64_t offset = 0;
  Shape sizes, strides;
  DType dtype = kFloat32;
  uint64_t version = 0;
  // One regeneration shared by the saved tensors that hold this recipe ("Sharing" in the Note).
  mutable std::mutex mutex;
  mutable int unread = 0;  ///< savers that have not unpacked it yet
  mutable Tensor shared;   ///< the last regeneration, held while unread > 0

  /// Whether t is the output this recipe regenerates, unmodified since.
  bool matches(const Tensor& t) const;
};

namespace detail {
void register_recipe(const Tensor& y, std::shared_ptr<Recipe> recipe);
}  // namespace detail

/// Registers, for output y of `node`, the recipe f(const N&) -> Tensor, which must compute y
/// from node's saved tensors only (unpacked with their version checks). Call it after
/// autograd::record and before saving y in the node, only while a guard is active. The
/// recipe holds the node weakly: a consumer of y holds it through its edge.
template <typename N, typename F>
void register_output(const Tensor& y, const std::shared_ptr<N>& node, const char* what, int length, F f) {
  auto recipe = std::make_shared<Recipe>();
  recipe->what = what;
  recipe->producer = node->name();
  recipe->length = length;
  recipe->run = [weak = std::weak_ptr<N>(node), f = std::move(f)]() -> Tensor {
    const std::shared_ptr<N> n = weak.lock();
    return n ? f(static_cast<const N&>(*n)) : Tensor();
  };
  detail::register_recipe(y, std::move(recipe));
}

/// Registers out = in.to(...) (autocast's casts) as in's recipe followed by the same
/// conversion, when a guard is active and in is a recipe's output, unmodified, and the result
/// stays within the guard's max_recipe_length. Called by the conversion's recording.
void register_conversion(const Tensor& in, const Tensor& out);

/// The recipe t is saved as: its registered one when a guard is active and t is that output,
/// unmodified; else null.
std::shared_ptr<const Recipe> recipe_for_saving(const Tensor& t);

/// Whether t carries a recipe that matches it (for tests and reports).
bool is_recomputable(const Tensor& t);

/// Runs the recipe for the node `consumer`'s backward; errors name both nodes.
Tensor run(const Recipe& recipe, const std::string& consumer);

/// A saved tensor now holds the recipe (one saver more).
void add_saver(const Recipe& recipe);
/// The recipe's output for a saver's unpack: regenerated by the first saver that reads it and
/// shared with the others until each has read it once (first_read: this saver had not).
Tensor read(const Recipe& recipe, bool first_read, const std::string& consumer);
/// A saver that never read the output goes away.
void drop_saver(const Recipe& recipe);

}  // namespace recompute

}  // namespace frugal::autograd

namespace frugal {
using autograd::recompute_cheap;
}  // namespace frugal
