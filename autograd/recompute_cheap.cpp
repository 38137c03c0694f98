// Selective recompute of cheap outputs: a saved activation becomes a recipe over tensors that
// backward keeps anyway.
//
// Note [Recomputable outputs]
// Most of a network's activation memory is outputs of cheap ops that the *next* op saves as
// its input: relu(bn(conv_out)) (the next conv saves it), layer_norm(x) (the QKV or fc1
// linear saves it), gelu(fc1_out) (fc2 saves it). Each of them is an elementwise function of
// tensors its own backward keeps anyway: batch norm's input x and (C) mean and invstd, layer
// norm's input and per-row mean and rstd, GELU's input. Korthikanti et al. (2022) recompute
// such outputs instead of keeping them; InPlace-ABN regenerates them from what backward keeps.
// Here, while a RecomputeCheapOutputs guard is alive (recompute_cheap(fn, x) is fn(x) under
// one), with no replay of the block:
//  - Registration. Such an op, after recording its node, registers a Recipe for its output
//    on the output's AutogradMeta: a closure that recomputes the output from the node's
//    saved tensors (unpacked through SavedTensor::unpack, so their version checks and any
//    saved-tensor hooks apply), holding the node weakly. batch_norm (training and eval:
//    either way the node keeps the statistics it normalized with) and batch_norm_relu /
//    batch_norm_add_relu regenerate with ops::batch_norm_apply, one pass in the forward's own
//    arithmetic; layer_norm with ops::layer_norm_apply; a unary op whose backward saves its
//    input (gelu, gelu_tanh, silu, ...) by running again on it. The node then saves the few
//    small tensors the recipe needs beyond its backward's (the bias: a parameter, alive
//    anyway).
//  - Packing. SavedValue asks recipe_for_saving(t) first: when a guard is alive and t's
//    meta holds a recipe matching t, the saved tensor holds the recipe, not t, so t's memory
//    goes when the forward's handles do. This includes the producer's own saved output:
//    batch_norm_relu's backward needs its output for ReLU's mask (and cuDNN's fused backward
//    reads it), so the op saves it after registering, as a recipe of itself. A recipe beats a
//    saved-tensor hook (an offload or compression of a tensor that costs nothing to keep is
//    waste); the recipe's own sources went through the hooks when the node saved them.
//  - Unpacking runs the recipe (one elementwise kernel, named "recompute_cheap" in the
//    allocator's trace) with grad mode off. The saved tensor still checks the version of the
//    output's storage (read weakly, Note [Saved tensor hooks]), and the recipe's sources are
//    checked by their own SavedTensors: an in-place write to either after the forward throws
//    at backward, naming the consumer and the producer.
//  - The key. A recipe lives on the TensorImpl that the op returned, so a later tensor in the
//    same memory (another impl) can never see it. It also records that output's storage
//    (weakly), offset, sizes, strides, dtype and version, and matches only while all are
//    unchanged: an in-place op on the output (which rebases its history on the same impl),
//    or anything that repoints the impl, voids it. Views of the output are separate impls
//    without a recipe: a consumer that saves a view keeps it as usual.
//  - Residuals. relu(bn(x) + r) needs r, which its backward does not keep. The node saves r
//    for the recipe only: when r is itself a recipe (a downsample branch's batch norm, or the
//    previous block's output) it is saved as that recipe, and the new one runs it first; when
//    r is a plain tensor (a block input that the block's first conv saves anyway) it is held
//    as it is, no worse than keeping y, which has r's shape and dtype. A chain of residual
//    recipes (y_k needs y_{k-1}, which needs y_{k-2}, ...) would make every unpack in a
//    ResNet stage rerun the stage: a recipe longer than the guard's max_recipe_length (3 by
//    default) is not registered, so that output is kept and the next chain starts from it.
//    In ResNet-50's stages of 3, 4, 6 and 3 blocks that keeps 1, 1, 1 and 1 block outputs.
//  - Sharing. An output usually has several savers: relu(bn(x)) is saved by the next conv
//    (its input) and by its own node (ReLU's mask), a block output also by the next block's
//    residual recipe. Regenerating it for each would run the pass two or three times, and a
//    residual recipe again for every recipe built on it. So the first saver to unpack runs
//    the recipe and the recipe holds the result until every saver has unpacked once (or gone
//    without unpacking); the others get the same tensor, as they would under Keep. It lives
//    from its first use in backward to its last, never longer than Keep would hold it.
//  - Lifetime. The recipe holds its producer weakly (no cycle through the producer's own
//    saved output); every consumer of the output holds the producer through its edge, and in
//    one backward every consumer runs before the producer releases its saved tensors, so the
//    recipe always finds them. A second backward after they were freed throws the usual
//    "freed by an earlier backward" error; retain_graph keeps everything, and recipes run
//    again on each unpack.
// Nesting. checkpoint(fn) inside the guard records nothing in its forward (no recipes); its
// saved inputs may be recipes, and its replay in backward runs outside the guard. The guard
// inside a checkpointed fn registers recipes only in the replay, whose graph lives for one
// nested backward: correct, and pointless. A selective checkpoint's kept outputs are not
// saved tensors and never recipes.
// Casts. Under autocast a float32 layer norm output reaches the next linear as a float16 copy
// (the linear's Policy::Lower cast), and the copy is what that linear saves: a conversion of a
// recipe's output registers a recipe of its own (the source's, then the same .to(); one pass
// longer), so the copy is not kept either.
// Limits: a chain through a non-fused relu(bn(x)) (batch_norm then relu, whose node keeps
// relu's output) is not recomputed; ResNet needs fused_bn_relu for the savings. On CUDA, a forward that
// cuDNN computed is regenerated by frugal's own kernel: values may differ from cuDNN's in the
// last bit, so gradients match the plain run to rounding, not bitwise.
#include "autograd/recompute_cheap.h"

#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "core/instrument.h"

namespace frugal::autograd {

namespace {
thread_local int t_guards = 0;
thread_local int t_max_length = 0;
}  // namespace

RecomputeCheapOutputs::RecomputeCheapOutputs(int max_recipe_length) : outer_max_(t_max_length) {
  FRUGAL_CHECK(max_recipe_length >= 1, "RecomputeCheapOutputs: max_recipe_length must be at least 1, got ",
               max_recipe_length);
  ++t_guards;
  t_max_length = max_recipe_length;
}

RecomputeCheapOutputs::~RecomputeCheapOutputs() {
  --t_guards;
  t_max_length = outer_max_;
}

bool RecomputeCheapOutputs::active() noexcept { return t_guards > 0; }
int RecomputeCheapOutputs::max_recipe_length() noexcept { return t_guards > 0 ? t_max_length : 0; }

Tensor recompute_cheap(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  FRUGAL_CHECK(fn != nullptr, "recompute_cheap: the function is empty");
  RecomputeCheapOutputs guard;
  return fn(x);
}

namespace recompute {

bool Recipe::matches(const Tensor& t) const {
  const TensorImpl& impl = t.impl();
  return impl.storage == storage.lock() && impl.offset == offset && impl.sizes == sizes && impl.strides == strides &&
         impl.dtype == dtype && t.version() == version;
}

namespace detail {

void register_recipe(const Tensor& y, std::shared_ptr<Recipe> recipe) {
  AutogradMeta* m = meta_of(y);
  FRUGAL_CHECK(m != nullptr, "recompute_cheap: ", recipe->what, "'s output ", y.describe(),
               " has no autograd metadata; register its recipe after autograd::record");
  const TensorImpl& impl = y.impl();
  recipe->storage = impl.storage;
  recipe->offset = impl.offset;
  recipe->sizes = impl.sizes;
  recipe->strides = impl.strides;
  recipe->dtype = impl.dtype;
  recipe->version = y.version();
  m->recipe = std::move(recipe);
}

}  // namespace detail

void register_conversion(const Tensor& in, const Tensor& out) {
  if (!RecomputeCheapOutputs::active()) return;
  const AutogradMeta* m = meta_of(in);
  if (!m || !m->recipe || !m->recipe->matches(in)) return;
  std::shared_ptr<const Recipe> source = m->recipe;
  if (source->length + 1 > RecomputeCheapOutputs::max_recipe_length()) return;
  auto recipe = std::make_shared<Recipe>();
  recipe->what = source->what;
  recipe->producer = source->producer;
  recipe->length = source->length + 1;
  recipe->run = [source, dtype = out.dtype(), device = out.device()]() -> Tensor {
    const Tensor t = source->run();
    return t.defined() ? t.to(device, dtype) : t;
  };
  detail::register_recipe(out, std::move(recipe));
}

std::shared_ptr<const Recipe> recipe_for_saving(const Tensor& t) {
  if (!RecomputeCheapOutputs::active()) return nullptr;
  const AutogradMeta* m = meta_of(t);
  if (!m || !m->recipe || !m->recipe->matches(t)) return nullptr;
  return m->recipe;
}

bool is_recomputable(const Tensor& t) {
  const AutogradMeta* m = meta_of(t);
  return m && m->recipe && m->recipe->matches(t);
}

Tensor run(const Recipe& recipe, const std::string& consumer) {
  core::OpScope scope("recompute_cheap");
  NoGradGuard no_grad;
  Tensor y;
  try {
    y = recipe.run();
  } catch (const Error& e) {
    FRUGAL_FAIL(consumer, ": regenerating the ", recipe.what, " output it saved (a recipe over ", recipe.producer,
                "'s saved tensors, Note [Recomputable outputs]) failed: ", e.what());
  }
  FRUGAL_CHECK(y.defined(), consumer, ": the ", recipe.what, " output it saved is a recipe over ", recipe.producer,
               "'s saved tensors, and that node is gone (Note [Recomputable outputs])");
  return y;
}

void add_saver(const Recipe& recipe) {
  const std::lock_guard lock(recipe.mutex);
  ++recipe.unread;
}

Tensor read(const Recipe& recipe, bool first_read, const std::string& consumer) {
  Tensor y;
  {
    const std::lock_guard lock(recipe.mutex);
    y = recipe.shared;
  }
  if (!y.defined()) y = run(recipe, consumer);  // outside the lock: it may read other recipes
  const std::lock_guard lock(recipe.mutex);
  if (first_read) --recipe.unread;
  recipe.shared = recipe.unread > 0 ? y : Tensor();
  return y;
}

void drop_saver(const Recipe& recipe) {
  const std::lock_guard lock(recipe.mutex);
  if (--recipe.unread <= 0) recipe.shared = Tensor();
}

}  // namespace recompute

}  // namespace frugal::autograd
