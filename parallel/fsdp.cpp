// Fully sharded data parallel (ZeRO-3): parameters, gradients and optimizer state sharded.
//
// Note [ZeRO-3]
// The model's parameters are split into units: the modules the user names (each transformer
// block, each child of a Sequential) and a root unit of the parameters no unit holds. A
// unit's parameters are laid out end to end in one flat buffer (its FullyShardUnitLayout),
// padded with zeros to a multiple of the world size P; rank r keeps chunk r as a float32
// leaf, the unit's shard, and nothing else of the unit between its uses. The module's own
// parameter tensors stay (the module, its typed members and autograd know them), but each
// is re-pointed at a storage of its own whose bytes are swapped in and out:
//   gathered: the storage's bytes are the parameter's slot in the unit's all-gathered flat
//     buffer (in param_dtype) and the tensor has its shape;
//   freed: no bytes, shape [0], so an op on a parameter outside its unit's forward fails
//     with a shape error instead of reading freed memory.
// Tensors that backward saved are aliases of that same storage, so they see the bytes again
// whenever the unit is gathered again, as PyTorch's FSDP resizes the storage of its flat
// parameter to 0 and back. A unit's lifecycle in one training step:
//   1. forward: its forward pre-hook (Note [Forward hooks] in nn/module.cpp) waits for its
//      all-gather, issued earlier as a prefetch or now, and issues the next unit's all-gather
//      (asynchronous Work; over NCCL on the communicator's stream, ordered by events: Note
//      [Communication stream]), so communication hides behind this unit's compute. At most
//      two non-root units are gathered at once.
//   2. its forward hook frees it (reshard after forward) and, when the output will be
//      differentiated, puts a UnitPreBackward node on it: an identity whose backward runs
//      before any of the unit's own backward nodes (they all lie behind its output).
//   3. backward: UnitPreBackward gathers the unit again (or waits for its prefetch) and
//      prefetches the unit that runs before it in forward, whose backward comes next.
//   4. each parameter's post-accumulate-grad hook counts the unit's gradients; with the last
//      one the unit's backward is over: its gradients are flattened into a padded float32
//      buffer (the parameters' .grad dropped), reduce_scatter(avg) is launched
//      asynchronously, and the unit is freed. A completed reduce-scatter is added into the
//      shard's .grad (at most kMaxInFlight in flight; the rest wait at the end of backward).
//      Where a unit ran several forwards under checkpoints (a siamese pair, micro-batches
//      summed into one loss), each replay's nested backward accumulates its own gradients:
//      the count starts again, and the unit is reduced once per replay (the sum of the
//      reduce-scatters is the reduce-scatter of the sum).
//   5. at the end of the outermost backward (an engine callback queued by the first hook),
//      every unit not yet reduced, or holding gradients since, is reduced (zeros for
//      parameters that got no gradient, so every rank issues the same collectives in the
//      same order), everything in flight is retired and every unit, the root too, is freed.
//   6. the optimizer steps the shards (elementwise AdamW on a slice is AdamW on those
//      elements, as Note [ZeRO-1 step]); the next forward gathers the updated values. A
//      gather from a shard whose version moved since the unit's last gather (a step, a
//      load) bumps the parameters' versions, as an in-place write would: what keys on them
//      (autocast's cast cache, Note [Autocast]) sees new values. A gather of unchanged values
//      (step 3) does not, so backward's saved-tensor version checks still pass.
// The root unit is gathered when forward() starts and stays gathered until its own
// gradients are reduced (forward without grad frees it at once). Under a checkpoint
// (autograd::checkpoint, nn::checkpoint_sequential) the forward runs without a graph, so
// the unit is gathered and freed as in 1-2 with no UnitPreBackward; the recompute in
// backward runs the unit's hooks again: they gather it, and inside backward the forward
// hook leaves it gathered, since its backward (step 3) follows at once.
// no_sync: step 4 frees the unit but reduces nothing; .grad stays full size and
// accumulates, and the next synced backward reduce-scatters the sum (DDP's no_sync).
// Without no_sync, every backward reduce-scatters its own gradient and adds it to the
// shard's .grad, so k backward passes give the sum of k means.
// Mixed precision (FSDP's MixedPrecision.param_dtype): the gathered buffers, hence the
// parameters the units compute with, have param_dtype, the all-gather sends the shard cast
// to it; the shards, the reduce-scatter and the optimizer stay float32. Under autocast the
// parameters should be gathered in its compute dtype: float32 parameters would be cast by
// autocast and the casts kept for the whole region, a full low-precision model copy.
// Bytes per rank, for units u of n_u elements padded to m_u, S = sum_u m_u / P (shard
// elements, N/P plus less than one per unit), e the param_dtype's size:
//   parameters: 4 S (shards) + gathered units: the root's m_root e from forward to its
//     backward, plus at most two other units' m_u e;
//   gradients: 4 S (the shards' .grad), plus reduce-scatter buffers in flight,
//     at most kMaxInFlight + 1 of 4 (m_u + m_u / P);
//   optimizer state (AdamW): 8 S (exp_avg, exp_avg_sq).
// Against DDP's 4 N + 4 N + 8 N = 16 N bytes.
#include "parallel/fsdp.h"

#include <algorithm>
#include <deque>
#include <limits>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "core/instrument.h"
#include "optim/optimizer.h"
#include "parallel/sharded_grads.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"

namespace frugal::parallel {

namespace {
/// Reduce-scatters a rank keeps in flight before it waits for the oldest (as ZeRO-2's).
constexpr size_t kMaxInFlight = 2;
/// Non-root units gathered at once: the one computing and the one prefetched.
constexpr int kMaxPrefetched = 2;
constexpr size_t kNone = std::numeric_limits<size_t>::max();

int64_t bytes_of(const Tensor& t) { return t.defined() ? t.numel() * int64_t(t.element_size()) : 0; }
}  // namespace

struct FullyShardedDataParallel::State : std::enable_shared_from_this<State> {
  struct Param {
    std::string name;
    Tensor tensor;  // the module's parameter: its TensorImpl is the one the module holds
    Shape shape;
    size_t unit = 0;
    std::shared_ptr<Storage> storage;  // the parameter's own storage, swapped in and out
    uint64_t grad_hook = 0;
    bool grad_ready = false;  // this backward
  };
  struct Unit {
    FullyShardUnitLayout layout;
    nn::UnaryModule* module = nullptr;  // null for the root
    uint64_t forward_hooks = 0;
    std::vector<size_t> params;  // indices into State::params, in layout order
    Tensor shard;                // float32 leaf, padded / P elements
    uint64_t gathered_from = 0;  // the shard's version at the last gather (Note [ZeRO-3], step 6)
    Tensor gathered;             // padded elements of param_dtype, while gathered or gathering
    Tensor gather_input;         // the shard as sent, alive until the all-gather completed
    std::shared_ptr<Work> gathering;
    size_t grads_ready = 0;  // this backward
    bool reduced = false;    // this backward
  };
  struct InFlight {
    size_t unit;
    std::shared_ptr<Work> work;
    Tensor flat, out;
  };

  std::shared_ptr<Communicator> comm;
  FullyShardOptions options;
  std::vector<Param> params;
  std::vector<Unit> units;                    // the named units in forward order, then the root
  size_t named = 0;                           // how many named units
  size_t root = kNone;                        // the root unit's index, if it has parameters
  std::vector<FullyShardUnitLayout> layouts;  // units[u].layout, for layout()
  std::deque<InFlight> in_flight;
  bool sync = true;
  bool finish_queued = false;
  int64_t gathered_peak = 0, reduce_peak = 0;
  int units_peak = 0;

  int64_t P() const { return comm->size(); }
  TensorOptions param_options() const { return {options.param_dtype, comm->device()}; }
  TensorOptions master_options() const { return {kFloat32, comm->device()}; }

  int live_units() const {
    int n = 0;
    for (size_t u = 0; u < named; ++u) n += units[u].gathered.defined() ? 1 : 0;
    return n;
  }
  int64_t gathered_bytes() const {
    int64_t b = 0;
    for (const Unit& unit : units) b += bytes_of(unit.gathered);
    return b;
  }
  int64_t reduce_bytes() const {
    int64_t b = 0;
    for (const InFlight& f : in_flight) b += bytes_of(f.flat) + bytes_of(f.out);
    return b;
  }

  // ---- gather and free: Note [ZeRO-3] ---------------------------------------------------
  void issue_gather(size_t u) {
    Unit& unit = units[u];
    if (unit.gathered.defined() || unit.layout.padded == 0) return;
    autograd::NoGradGuard no_grad;
    core::CategoryScope category(core::Category::Parameters);
    unit.gather_input =
        options.param_dtype == kFloat32 ? unit.shard.detach() : unit.shard.detach().to(options.param_dtype);
    unit.gathered = empty({unit.layout.padded}, param_options());
    unit.gathering = comm->all_gather(unit.gather_input, unit.gathered);
    gathered_peak = std::max(gathered_peak, gathered_bytes());
    units_peak = std::max(units_peak, live_units());
  }

  void wait_gather(Unit& unit) {
    if (!unit.gathering) return;
    unit.gathering->wait();
    unit.gathering.reset();
    unit.gather_input = Tensor();
  }

  void ensure_gathered(size_t u) {
    Unit& unit = units[u];
    if (unit.layout.padded == 0) return;
    const bool fresh = !unit.gathered.defined() || unit.gathering != nullptr;
    issue_gather(u);
    wait_gather(unit);
    if (!fresh) return;
    const bool changed = unit.shard.version() != unit.gathered_from;  // Note [ZeRO-3], step 6
    unit.gathered_from = unit.shard.version();
    const size_t e = element_size(options.param_dtype);
    char* base = static_cast<char*>(unit.gathered.data());
    for (size_t j = 0; j < unit.params.size(); ++j) {
      Param& p = params[unit.params[j]];
      const size_t nbytes = size_t(numel_of(p.shape)) * e;
      p.storage->data = DataPtr(base + unit.layout.offsets[j] * int64_t(e), nbytes, comm->device(), nullptr, nullptr);
      p.storage->nbytes = nbytes;
      TensorImpl& impl = p.tensor.impl();
      impl.sizes = p.shape;
      impl.strides = contiguous_strides(p.shape);
      impl.offset = 0;
      if (changed) p.tensor.bump_version();
    }
  }

  void prefetch(size_t u) {
    if (!options.prefetch || u >= named || live_units() >= kMaxPrefetched) return;
    issue_gather(u);
  }

  void free_unit(size_t u) {
    Unit& unit = units[u];
    if (!unit.gathered.defined()) return;
    wait_gather(unit);  // the collective may still write the buffer
    empty_params(unit);
    unit.gathered = Tensor();
  }

  void empty_params(const Unit& unit) {
    for (size_t k : unit.params) {
      Param& p = params[k];
      p.storage->data = DataPtr(nullptr, 0, comm->device(), nullptr, nullptr);
      p.storage->nbytes = 0;
      TensorImpl& impl = p.tensor.impl();
      impl.sizes = {0};
      impl.strides = {1};
      impl.offset = 0;
    }
  }

  // ---- forward hooks and the backward pre-hook ------------------------------------------
  void before_forward(size_t u) {
    ensure_gathered(u);
    if (!autograd::in_backward()) prefetch(u + 1);  // a recompute runs this unit's backward next instead
  }

  Tensor after_forward(size_t u, Tensor out) {
    if (!autograd::in_backward()) free_unit(u);  // in a checkpoint's recompute, its backward follows at once
    return attach_pre_backward(u, std::move(out));
  }

  Tensor attach_pre_backward(size_t u, Tensor out);

  /// u: a unit, or the root's index (kNone when the root has no parameters): its backward
  /// comes first, then the last named unit's.
  void before_backward(size_t u) {
    queue_finish();
    if (u != kNone) ensure_gathered(u);
    if (u == kNone || u == root) {
      if (named > 0) prefetch(named - 1);
    } else if (u > 0) {
      prefetch(u - 1);
    }
  }

  // ---- gradients: reduce-scatter per unit -------------------------------------------------
  void on_grad(size_t k) {
    queue_finish();
    Param& p = params[k];
    Unit& unit = units[p.unit];
    if (!p.grad_ready) {
      p.grad_ready = true;
      ++unit.grads_ready;
    }
    if (unit.grads_ready == unit.params.size()) reduce_unit(p.unit);
  }

  void reduce_unit(size_t u) {
    Unit& unit = units[u];
    unit.reduced = true;
    // Another round may follow in this backward: each checkpoint replay of another forward
    // of the unit accumulates its own gradients (step 4).
    for (size_t k : unit.params) params[k].grad_ready = false;
    unit.grads_ready = 0;
    if (sync && unit.layout.padded == 0)  // nothing to reduce; its 0-element .grad must not outlive the round
      for (size_t k : unit.params) params[k].tensor.set_grad(Tensor());
    if (sync && unit.layout.padded > 0) {
      autograd::NoGradGuard no_grad;
      core::CategoryScope category(core::Category::Gradients);
      Tensor flat = zeros({unit.layout.padded}, master_options());
      for (size_t j = 0; j < unit.params.size(); ++j) {
        const Param& p = params[unit.params[j]];
        const Tensor g = p.tensor.grad();
        if (!g.defined()) continue;  // no contribution: zeros, as DDP's unused parameters
        flat.narrow(0, unit.layout.offsets[j], numel_of(p.shape)).view(p.shape).copy_(g);
        p.tensor.set_grad(Tensor());
      }
      Tensor out = empty({unit.layout.padded / P()}, master_options());
      auto work = comm->reduce_scatter(flat, out, ReduceOp::Avg);
      in_flight.push_back({u, std::move(work), std::move(flat), std::move(out)});
      reduce_peak = std::max(reduce_peak, reduce_bytes());
      while (!in_flight.empty() && (in_flight.size() > kMaxInFlight || in_flight.front().work->completed()))
        retire_oldest();
    }
    free_unit(u);
  }

  void retire_oldest() {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    f.work->wait();
    f.flat = Tensor();
    const Tensor& shard = units[f.unit].shard;
    const Tensor g = shard.grad();
    if (g.defined()) ops::add_(g, f.out);
    else shard.set_grad(f.out);
  }

  void queue_finish() {
    if (finish_queued) return;
    struct QueuedFlag {  // clears the flag when the engine destroys the callback, run or dropped
      std::weak_ptr<State> state;
      ~QueuedFlag() {
        if (auto s = state.lock()) s->finish_queued = false;
      }
    };
    auto token = std::make_shared<QueuedFlag>(QueuedFlag{weak_from_this()});
    finish_queued = true;
    autograd::queue_callback(
        [weak = weak_from_this(), token] {
          if (auto s = weak.lock()) s->finish_backward();
        },
        autograd::CallbackRun::Outermost);
  }

  void finish_backward() {
    for (size_t u = 0; u < units.size(); ++u)
      if (!units[u].reduced || units[u].grads_ready > 0) reduce_unit(u);
    while (!in_flight.empty()) retire_oldest();
    for (size_t u = 0; u < units.size(); ++u) free_unit(u);
    for (Param& p : params) p.grad_ready = false;
    for (Unit& unit : units) {
      unit.grads_ready = 0;
      unit.reduced = false;
    }
    if (!sync) return;
    for (const Param& p : params)
      FRUGAL_CHECK(!p.tensor.grad().defined(), "FullyShardedDataParallel: parameter '", p.name,
                   "' received a gradient after its unit's gradients were reduce-scattered; a unit's parameters "
                   "must be used only inside the unit's forward (or the root's)");
  }
};

namespace {
// Identity on a unit's output; its backward gathers the unit before any of the unit's own
// backward nodes run (Note [ZeRO-3], step 3).
struct UnitPreBackward final : autograd::Node {
  std::weak_ptr<FullyShardedDataParallel::State> state;
  size_t unit = kNone;
  std::string name() const override { return "FsdpUnitPreBackward"; }
  bool saves_tensors() const override { return false; }
  TensorList apply(TensorList&& grads) override {
    if (auto s = state.lock()) s->before_backward(unit);
    return std::move(grads);
  }
};
}  // namespace

Tensor FullyShardedDataParallel::State::attach_pre_backward(size_t u, Tensor out) {
  auto node = autograd::make_node<UnitPreBackward>({out});
  if (!node) return out;
  node->state = weak_from_this();
  node->unit = u;
  Tensor alias = out.detach();
  autograd::record(node, {alias});
  return alias;
}

// ---- construction -------------------------------------------------------------------------

std::vector<std::string> modules_of_type(const nn::Module& model, const std::string& type) {
  std::vector<std::string> names;
  for (const auto& [name, m] : model.named_modules())
    if (m->type_name() == type) names.push_back(name);
  return names;
}

namespace {
std::string known_units(const nn::Module& m) {
  std::string names;
  int shown = 0;
  for (const auto& [name, child] : m.named_modules()) {
    if (!std::dynamic_pointer_cast<nn::UnaryModule>(child)) continue;
    if (shown++ == 8) return names + ", ...";
    names += (names.empty() ? "'" : ", '") + name + "'";
  }
  return names.empty() ? "none" : names;
}
}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::UnaryModule> module,
                                                   std::shared_ptr<Communicator> comm, FullyShardOptions options)
    : module_(std::move(module)), state_(std::make_shared<State>()) {
  State& s = *state_;
  FRUGAL_CHECK(module_ != nullptr, "FullyShardedDataParallel: got no module");
  FRUGAL_CHECK(comm != nullptr, "FullyShardedDataParallel: needs a communicator");
  const DType pd = options.param_dtype;
  FRUGAL_CHECK(pd == kFloat32 || pd == kBFloat16 || pd == kFloat16,
               "FullyShardedDataParallel: param_dtype must be float32, bfloat16 or float16, got ", dtype_name(pd));
  s.comm = std::move(comm);
  s.options = std::move(options);
  const int64_t P = s.P();

  // Parameters, by name, in the module's order; a unit claims those under its name.
  std::map<const TensorImpl*, size_t> index_of;
  for (const auto& [name, t] : module_->named_parameters()) {  // a tied tensor once (see the check below)
    FRUGAL_CHECK(t.dtype() == kFloat32 && t.device() == s.comm->device() && t.requires_grad(),
                 "FullyShardedDataParallel: parameter '", name, "' is ", t.describe(),
                 "; every parameter must be float32 (the master copy), require grad and be on the communicator's "
                 "device ",
                 s.comm->device().str());
    index_of[t.impl_ptr().get()] = s.params.size();
    s.params.push_back({name, t, t.sizes(), kNone, nullptr, 0, false});
  }
  const auto modules = module_->named_modules();
  for (size_t u = 0; u < s.options.units.size(); ++u) {
    const std::string& name = s.options.units[u];
    auto it = std::find_if(modules.begin(), modules.end(), [&](const auto& m) { return m.first == name; });
    FRUGAL_CHECK(it != modules.end(), "FullyShardedDataParallel: no module named '", name,
                 "' to make a unit; the UnaryModules are ", known_units(*module_));
    auto unary = std::dynamic_pointer_cast<nn::UnaryModule>(it->second);
    FRUGAL_CHECK(unary != nullptr, "FullyShardedDataParallel: unit '", name, "' is a ", it->second->type_name(),
                 ", not an nn::UnaryModule (a unit runs through its m(x) hooks)");
    for (size_t v = 0; v < u; ++v) {
      const std::string& other = s.options.units[v];
      FRUGAL_CHECK(other != name && name.rfind(other + ".", 0) != 0 && other.rfind(name + ".", 0) != 0,
                   "FullyShardedDataParallel: units '", other, "' and '", name, "' overlap (units may not nest)");
    }
    State::Unit unit;
    unit.layout.name = name;
    unit.module = unary.get();
    for (const auto& [pname, t] : unary->named_parameters()) {
      const size_t k = index_of.at(t.impl_ptr().get());
      FRUGAL_CHECK(s.params[k].unit == kNone, "FullyShardedDataParallel: parameter '", s.params[k].name,
                   "' belongs to two units");
      s.params[k].unit = u;
      unit.params.push_back(k);
    }
    s.units.push_back(std::move(unit));
  }
  // A tied weight (one tensor registered in two modules) claimed by a unit must not be used
  // outside it: the unit frees its parameters after its forward, and the other user would
  // read an empty tensor ("weight must be 2-D ... float32[0]"). named_parameters() lists a
  // tie once, so every module's own registrations are walked here.
  std::map<const TensorImpl*, std::vector<std::string>> paths;
  for (const auto& [mname, m] : modules)
    for (const auto& [pname, t] : m->named_parameters(/*recurse=*/false))
      paths[t.impl_ptr().get()].push_back(mname.empty() ? pname : mname + "." + pname);
  for (size_t u = 0; u < s.units.size(); ++u) {
    const std::string& unit_name = s.options.units[u];
    for (size_t k : s.units[u].params)
      for (const std::string& path : paths[s.params[k].tensor.impl_ptr().get()])
        FRUGAL_CHECK(path.rfind(unit_name + ".", 0) == 0, "FullyShardedDataParallel: parameter '", s.params[k].name,
                     "' of unit '", unit_name, "' is also '", path,
                     "' outside it (a tied weight); a unit's parameters exist only during its forward and backward: "
                     "put every user of the tie in one unit, or leave it to the root unit");
  }
  s.named = s.units.size();
  State::Unit root;
  for (size_t k = 0; k < s.params.size(); ++k)
    if (s.params[k].unit == kNone) {
      s.params[k].unit = s.named;
      root.params.push_back(k);
    }
  if (!root.params.empty()) {
    s.root = s.named;
    s.units.push_back(std::move(root));
  }

  // Layouts, shards (rank 0's values when syncing), and each parameter's own storage.
  autograd::NoGradGuard no_grad;
  for (size_t u = 0; u < s.units.size(); ++u) {
    State::Unit& unit = s.units[u];
    FullyShardUnitLayout& l = unit.layout;
    for (size_t k : unit.params) {
      l.params.push_back(s.params[k].name);
      l.shapes.push_back(s.params[k].shape);
      l.offsets.push_back(l.numel);
      l.numel += numel_of(s.params[k].shape);
    }
    l.padded = (l.numel + P - 1) / P * P;
    Tensor flat = zeros({l.padded}, s.master_options());
    for (size_t j = 0; j < unit.params.size(); ++j) {
      const State::Param& p = s.params[unit.params[j]];
      flat.narrow(0, l.offsets[j], numel_of(p.shape)).view(p.shape).copy_(p.tensor);
    }
    if (s.options.sync_module_states && l.padded > 0) s.comm->broadcast(flat, 0)->wait();
    const int64_t n = l.padded / P;
    unit.shard = register_parameter("flat_param_" + std::to_string(u), flat.narrow(0, s.comm->rank() * n, n).clone());
    unit.gathered_from = unit.shard.version();
  }
  if (s.options.sync_module_states)
    for (const auto& [name, b] : module_->named_buffers()) s.comm->broadcast(b, 0)->wait();
  for (State::Param& p : s.params) {
    p.storage = std::make_shared<Storage>();
    TensorImpl& impl = p.tensor.impl();
    impl.storage = p.storage;  // the module's copy of the values is released here
    impl.dtype = s.options.param_dtype;
  }
  for (const State::Unit& unit : s.units) {
    // A unit of 0 elements (a rank-0 adapter) is never gathered: its parameters keep their
    // shapes for good (they have no bytes to swap), else its forward would see shape [0].
    if (unit.layout.padded > 0) s.empty_params(unit);
    s.layouts.push_back(unit.layout);
  }

  // Hooks: the forward pre/post hooks of each unit, the gradient hook of each parameter.
  std::weak_ptr<State> weak = state_;
  for (size_t u = 0; u < s.named; ++u)
    s.units[u].forward_hooks =
        s.units[u].module->add_forward_hooks({.before =
                                                  [weak, u](nn::UnaryModule&) {
                                                    if (auto st = weak.lock()) st->before_forward(u);
                                                  },
                                              .after =
                                                  [weak, u](nn::UnaryModule&, Tensor out) {
                                                    if (auto st = weak.lock())
                                                      return st->after_forward(u, std::move(out));
                                                    return out;
                                                  }});
  for (size_t k = 0; k < s.params.size(); ++k)
    s.params[k].grad_hook = autograd::register_post_accumulate_grad_hook(s.params[k].tensor, [weak, k](const Tensor&) {
      if (auto st = weak.lock()) st->on_grad(k);
    });
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (size_t u = 0; u < state_->named; ++u)
    state_->units[u].module->remove_forward_hooks(state_->units[u].forward_hooks);
  for (const State::Param& p : state_->params) autograd::remove_post_accumulate_grad_hook(p.tensor, p.grad_hook);
}

// ---- forward, modes, reports ----------------------------------------------------------------

Tensor FullyShardedDataParallel::forward(const Tensor& x) {
  State& s = *state_;
  if (s.root != kNone) s.ensure_gathered(s.root);
  s.prefetch(0);
  Tensor y = (*module_)(x);
  if (autograd::is_grad_enabled() && autograd::requires_grad(y)) return s.attach_pre_backward(s.root, std::move(y));
  if (s.root != kNone) s.free_unit(s.root);  // no backward will need it
  return y;
}

void FullyShardedDataParallel::train(bool on) {
  nn::UnaryModule::train(on);
  module_->train(on);
}

const std::shared_ptr<Communicator>& FullyShardedDataParallel::comm() const { return state_->comm; }

FullyShardedDataParallel::NoSyncGuard::NoSyncGuard(FullyShardedDataParallel& f) : fsdp_(f), was_(f.state_->sync) {
  f.state_->sync = false;
}
FullyShardedDataParallel::NoSyncGuard::~NoSyncGuard() { fsdp_.state_->sync = was_; }

const std::vector<FullyShardUnitLayout>& FullyShardedDataParallel::layout() const { return state_->layouts; }

FullyShardMemoryReport FullyShardedDataParallel::memory_report(const optim::Optimizer* opt) const {
  const State& s = *state_;
  FullyShardMemoryReport r;
  for (const State::Unit& u : s.units) {
    r.shard_bytes += bytes_of(u.shard);
    r.gradient_shard_bytes += bytes_of(u.shard.grad());
    if (opt)
      if (const optim::ParamState* st = opt->state(u.shard))
        for (const Tensor& t : st->buffers) r.optimizer_state_bytes += bytes_of(t);
  }
  for (const State::Param& p : s.params) r.param_grad_bytes += bytes_of(p.tensor.grad());
  r.gathered_bytes = s.gathered_bytes();
  r.gathered_bytes_peak = s.gathered_peak;
  r.gathered_units_peak = s.units_peak;
  r.reduce_bytes_peak = s.reduce_peak;
  return r;
}

void FullyShardedDataParallel::reset_peak() {
  state_->gathered_peak = state_->gathered_bytes();
  state_->units_peak = state_->live_units();
  state_->reduce_peak = state_->reduce_bytes();
}

// ---- full state dicts ------------------------------------------------------------------------

nn::NamedTensors FullyShardedDataParallel::full_state_dict() {
  State& s = *state_;
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> full(s.params.size());
  for (const State::Unit& unit : s.units) {
    if (unit.layout.padded == 0) continue;
    Tensor flat = empty({unit.layout.padded}, s.master_options());
    s.comm->all_gather(unit.shard.detach(), flat)->wait();
    for (size_t j = 0; j < unit.params.size(); ++j) {
      const Shape& shape = unit.layout.shapes[j];
      full[unit.params[j]] = flat.narrow(0, unit.layout.offsets[j], numel_of(shape)).view(shape).clone();
    }
  }
  nn::NamedTensors out;
  for (size_t k = 0; k < s.params.size(); ++k)
    out.emplace_back(s.params[k].name, full[k].defined() ? full[k] : zeros(s.params[k].shape, s.master_options()));
  for (const auto& [name, b] : module_->named_buffers()) out.emplace_back(name, b);
  return out;
}

void FullyShardedDataParallel::free_gathered() {
  for (size_t u = 0; u < state_->units.size(); ++u) state_->free_unit(u);
}

void FullyShardedDataParallel::load_full_state_dict(const std::map<std::string, Tensor>& state) {
  State& s = *state_;
  std::string missing, mismatched, unexpected;
  std::map<std::string, Shape> expected;
  for (const State::Param& p : s.params) expected[p.name] = p.shape;
  const auto buffers = module_->named_buffers();
  for (const auto& [name, b] : buffers) expected[name] = b.sizes();
  for (const auto& [name, shape] : expected) {
    auto it = state.find(name);
    if (it == state.end()) missing += " " + name;
    else if (!it->second.defined() || it->second.sizes() != shape)
      mismatched += " " + name + " (expected " + shape_str(shape) + ", got " +
                    (it->second.defined() ? shape_str(it->second.sizes()) : std::string("undefined")) + ")";
  }
  for (const auto& [name, t] : state)
    if (!expected.count(name)) unexpected += " " + name;
  FRUGAL_CHECK(missing.empty() && mismatched.empty() && unexpected.empty(),
               "FullyShardedDataParallel.load_full_state_dict: missing keys:", missing.empty() ? " none" : missing,
               "; shape mismatches:", mismatched.empty() ? " none" : mismatched,
               "; unexpected keys:", unexpected.empty() ? " none" : unexpected);
  free_gathered();
  autograd::NoGradGuard no_grad;
  const int64_t P = s.P();
  for (State::Unit& unit : s.units) {
    Tensor flat = zeros({unit.layout.padded}, s.master_options());
    for (size_t j = 0; j < unit.params.size(); ++j)
      flat.narrow(0, unit.layout.offsets[j], numel_of(unit.layout.shapes[j]))
          .view(unit.layout.shapes[j])
          .copy_(state.at(unit.layout.params[j]));
    const int64_t n = unit.layout.padded / P;
    unit.shard.detach().copy_(flat.narrow(0, s.comm->rank() * n, n));
  }
  for (const auto& [name, b] : buffers) b.detach().copy_(state.at(name));
}

double FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  return sharded_clip_grad_norm_(parameters(), comm(), max_norm, norm_type);
}

std::function<void(const Tensor&)> FullyShardedDataParallel::found_inf_sync() const {
  return sharded_found_inf_sync(comm());
}

}  // namespace frugal::parallel
