#pragma once
// Checkpoints of a FullyShardedDataParallel model (see Note [Sharded checkpoint] in
// parallel/fsdp_checkpoint.cpp):
//   - sharded: every rank writes its own safetensors file (its shards, its optimizer state,
//     the module's buffers) and rank 0 an index.json naming them, in one directory; no rank
//     ever holds more than its shard. Loading needs the same world size and model.
//   - consolidated: the full model, gathered, written by rank 0 as the one-process model's
//     safetensors file (its state_dict() names), which the unsharded model loads.
//
//   parallel::save_sharded_checkpoint(*fsdp, "ckpt/step_1000", &opt);  // collective
//   parallel::load_sharded_checkpoint(*fsdp, "ckpt/step_1000", &opt);  // resume: same next steps
//   parallel::save_consolidated(*fsdp, "model.safetensors");            // collective; rank 0 writes
#include <string>

#include "parallel/fsdp.h"

namespace frugal::parallel {

/// Collective. Writes `dir`/shard-<rank>-of-<P>.g<generation>.safetensors on every rank, then
/// rank 0 replaces `dir`/index.json, then every rank deletes its file of the previous
/// generation. A save that fails at any point leaves the previous checkpoint loadable.
/// `opt` (optional): the optimizer stepping fsdp.parameters(); its state is saved too.
void save_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                             const optim::Optimizer* opt = nullptr);

/// Loads what save_sharded_checkpoint wrote into the shards, the module's buffers and, when
/// given, `opt` (which must then have been saved). Throws frugal::Error naming the file and
/// what is wrong (another world size, a missing shard file, another model: unit or
/// parameter names or shapes) before changing anything.
void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir, optim::Optimizer* opt = nullptr);

/// Collective: gathers full_state_dict() and rank 0 writes it to `path` (atomically) as the
/// unsharded model's safetensors; every rank returns once the file is in place.
void save_consolidated(FullyShardedDataParallel& fsdp, const std::string& path);

}  // namespace frugal::parallel
