#pragma once
// Fully sharded data parallel: ZeRO stage 3 (Rajbhandari et al., 2020), as PyTorch's FSDP
// with ShardingStrategy.FULL_SHARD and DeepSpeed's stage 3. Every rank keeps only its
// 1/P of each unit's parameters (a flat float32 shard), their gradients and their AdamW
// moments; a unit's full parameters exist only while it computes (Note [ZeRO-3] in
// parallel/fsdp.cpp).
//
//   auto fsdp = std::make_shared<parallel::FullyShardedDataParallel>(
//       model, dp_comm, parallel::FullyShardOptions{.units = {"encoder.0", "encoder.1", "head"}});
//   optim::AdamW opt(fsdp->parameters(), {.lr = 3e-4});  // the shards: any optimizer steps them
//   for (...) {
//     Tensor loss = loss_fn(fsdp->forward(x_shard), y_shard);
//     loss.backward();  // units gather, compute, free; gradients reduce-scatter unit by unit
//     opt.step();       // AdamW on this rank's shards only; no collective
//     opt.zero_grad();
//   }
//
// Checkpoints: parallel/fsdp_checkpoint.h (one file per rank plus an index; or consolidated).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "parallel/communicator.h"

namespace frugal::optim {
class Optimizer;
}

namespace frugal::parallel {

struct FullyShardOptions {
  /// Dotted names (as model->named_modules() spells them) of the nn::UnaryModules that are
  /// units, in the order their forwards run: the order of the forward prefetch, and its
  /// reverse the backward's. A unit must be called as m(x) (Note [Forward hooks] in
  /// nn/module.cpp), as Sequential and checkpoint_sequential do. Units may not nest or share
  /// parameters. The parameters of no unit form the root unit, gathered for the whole forward.
  std::vector<std::string> units;
  /// The dtype the gathered parameters have and the units compute in (FSDP's
  /// MixedPrecision.param_dtype): float32, or under autocast its compute dtype (bfloat16,
  /// float16), which halves the all-gather and leaves autocast nothing to cast. The shards,
  /// gradient shards and optimizer state stay float32; gradients are reduced in float32.
  DType param_dtype = kFloat32;
  /// Issue the next unit's all-gather while the current one computes (forward: the next unit;
  /// backward: the previous one), keeping at most two non-root units gathered.
  bool prefetch = true;
  /// Broadcast rank 0's parameters and buffers at construction, so every rank starts equal.
  bool sync_module_states = true;
};

/// The dotted names of the modules below `model` whose type_name() is `type`, in order: the
/// units of a model cut at its blocks (as FSDP's ModuleWrapPolicy({Block})), e.g.
/// {.units = modules_of_type(*vit, "EncoderBlock")}.
std::vector<std::string> modules_of_type(const nn::Module& model, const std::string& type);

/// Per-rank bytes (Note [ZeRO-3] has the formulas).
struct FullyShardMemoryReport {
  int64_t shard_bytes = 0;            ///< the float32 parameter shards (parameters())
  int64_t gathered_bytes = 0;         ///< gathered unit parameters alive now (incl. all-gathers in flight)
  int64_t gathered_bytes_peak = 0;    ///< their peak since construction or reset_peak()
  int gathered_units_peak = 0;        ///< non-root units gathered at once, at most
  int64_t param_grad_bytes = 0;       ///< full-size .grad alive now (only under no_sync)
  int64_t gradient_shard_bytes = 0;   ///< the shards' .grad (the averaged gradient shards)
  int64_t reduce_bytes_peak = 0;      ///< peak of reduce-scatter buffers in flight (flat + chunk)
  int64_t optimizer_state_bytes = 0;  ///< the given optimizer's state for the shards
};

/// How a unit's parameters are laid out in its flat buffer, rank r's shard being elements
/// [r * padded / P, (r + 1) * padded / P).
struct FullyShardUnitLayout {
  std::string name;                 ///< the unit's module name; "" for the root unit
  std::vector<std::string> params;  ///< dotted parameter names, as the unsharded model's
  std::vector<Shape> shapes;
  std::vector<int64_t> offsets;  ///< each parameter's first element in the flat buffer
  int64_t numel = 0;             ///< the parameters' elements
  int64_t padded = 0;            ///< numel rounded up to a multiple of P
};

/// Wraps `module`: its parameters move into per-unit flat shards (this module's
/// parameters(), float32 leaves of padded / P elements, named "flat_param_<u>") and the
/// module's own parameter tensors are left empty (shape [0]) except while their unit is
/// gathered. forward() runs the module; backward() leaves the averaged gradient of each
/// shard in its .grad and no full-size gradient anywhere. Every rank must run every forward
/// and backward (they meet in the collectives). The wrapped module keeps its buffers. The
/// module's parameters live in the shards for good: destroying the wrapper leaves them empty
/// (take them out first with full_state_dict()).
class FullyShardedDataParallel : public nn::UnaryModule {
 public:
  FullyShardedDataParallel(std::shared_ptr<nn::UnaryModule> module, std::shared_ptr<Communicator> comm,
                           FullyShardOptions options = {});
  ~FullyShardedDataParallel() override;

  /// Gathers the root unit (and prefetches the first), then runs the module.
  Tensor forward(const Tensor& x) override;
  void train(bool on = true) override;
  const std::shared_ptr<nn::UnaryModule>& module() const { return module_; }
  const std::shared_ptr<Communicator>& comm() const;
  std::string type_name() const override { return "FullyShardedDataParallel"; }

  /// While the returned guard lives, backward reduces nothing: each parameter keeps its
  /// full .grad and accumulates into it (FSDP's no_sync, DDP's); the next backward outside
  /// it reduce-scatters the sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedDataParallel& f);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    FullyShardedDataParallel& fsdp_;
    bool was_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  /// optim::clip_grad_norm_ for the whole model, after a synchronized backward: each rank's
  /// shards hold part of every gradient, so the shards' |g|^p sums (maxima for p = inf) are
  /// summed (maxed) across ranks before the coefficient is taken, as PyTorch's
  /// FullyShardedDataParallel.clip_grad_norm_. optim::clip_grad_norm_(parameters()) would clip
  /// each rank by its own shard's norm: the ranks' steps then differ. Returns the total norm
  /// (float64), the same on every rank; one all_reduce and one host read.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0);
  /// For optim::GradScalerOptions::sync_found_inf: all-reduces a found_inf flag with Max over
  /// this model's communicator, so every rank skips a step any rank's shard overflowed in.
  std::function<void(const Tensor&)> found_inf_sync() const;

  /// Units in shard order (the named units, then the root unit if it has parameters).
  const std::vector<FullyShardUnitLayout>& layout() const;
  /// Collective: every parameter of the unsharded model by its original name, full shape,
  /// float32, gathered from the shards (fresh tensors), then the module's buffers. What the
  /// one-process model's state_dict() holds; load it there with load_state_dict().
  nn::NamedTensors full_state_dict();
  /// Sets the shards from a full state dict (as full_state_dict() returns, or an unsharded
  /// model's state_dict()): every rank copies its chunks; buffers are copied into the module.
  /// Strict: a missing or unexpected key, or a shape mismatch, throws naming them.
  void load_full_state_dict(const std::map<std::string, Tensor>& state);
  /// Frees every unit's gathered parameters (after the gathers in flight): the next forward
  /// gathers from the shards again. The loads call it first, so that a unit still gathered
  /// (a forward whose backward never ran) cannot serve the values from before the load.
  void free_gathered();

  /// Per-rank bytes now; `opt` (optional) is the optimizer stepping parameters().
  FullyShardMemoryReport memory_report(const optim::Optimizer* opt = nullptr) const;
  void reset_peak();

  struct State;  // fsdp.cpp: what the hooks and backward nodes share (they hold it weakly)

 private:
  std::shared_ptr<nn::UnaryModule> module_;
  std::shared_ptr<State> state_;
};

}  // namespace frugal::parallel
