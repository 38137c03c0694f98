#pragma once
// CheckpointManager: numbered checkpoints of a training run in one directory, each a
// safetensors file holding everything a bit-exact resume needs; the newest k are kept.
//
//   train::CheckpointManager ckpt("runs/a", {.keep_last = 3});
//   train::TrainState state{.model = &net, .optimizer = &opt, .scaler = &scaler,
//                           .scheduler = &schedule, .loader = &loader};
//   int64_t step = ckpt.resume(state).value_or(0);    // 0: a fresh run
//   ... every N steps: ckpt.save(step, state);        // runs/a/ckpt-00001200.safetensors
//
// Note [Resumable checkpoint]
// A run resumed from a checkpoint repeats the uninterrupted run bit for bit when the
// checkpoint holds every input of the steps that follow: the parameters and buffers, the
// optimizer's state and its groups' lrs, the GradScaler's scale and growth tracker, the
// LR schedule's epoch, the default generator's (seed, offset) (dropout and other random
// ops draw from it: Note [Counter-based RNG]), and where the data stands (the loader's
// epoch and batch: the order of an epoch is a function of (seed, epoch), so the batch index
// is all that is needed; DataLoader::set_position). Saved between the micro-steps of
// gradient accumulation, the gradients accumulated so far are such an input too:
// TrainState::grads saves and restores them. Keys: "model.*", "optim.*", "scaler.*",
// "scheduler.*", "grad.<parameter>", "rng.seed", "rng.offset" (and "rng.<name>.seed/offset"
// of TrainState::generators), "data.epoch", "data.batch" and
// what the loader's order depends on ("data.samples", "data.batch_size", "data.shuffle",
// "data.seed"); the metadata holds "step", "optimizer" (its name()) and "checksum".
//
// A save is atomic (nn::save_safetensors writes a temporary and renames it), refuses
// parameters holding inf or NaN, and deletes older checkpoints only once the new one is
// in place: a failed save leaves every earlier checkpoint as it was.
//
// Note [Checkpoint load is all or nothing]
// A checkpoint that does not fit the run must be refused whole: a caller that catches the
// error (and starts afresh, or tries an older file) must not go on with new weights and an
// old optimizer. So load() first checks everything it can without changing anything - the
// file's checksum (a flipped bit in the data would otherwise load as another number), the
// parts asked for, the optimizer's type (Adam's and AdamW's state dicts have the same keys
// but not the same meaning), the loader's order and position, the gradients - and then loads
// the parts whose own checks come last: optimizer, GradScaler and schedule, whose previous
// state it keeps (the optimizer's buffers are replaced, not written, by a load, so keeping
// them costs nothing) and restores if a later part refuses, and the model last (its own load
// checks every key and shape before it writes). Every error names the file.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/data/dataloader.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "tensor/random.h"

namespace frugal::train {

/// The parts of a run a checkpoint saves and restores; null parts are left out.
struct TrainState {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::GradScaler* scaler = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  data::DataLoader* loader = nullptr;  ///< its position (epoch, batch)
  bool rng = true;                     ///< the default generator's seed and offset
  /// Other generators the run draws from, by name: a TensorParallelRng's streams
  /// ({{"tp.replicated", &rng->replicated}, {"tp.split", &rng->split}}), a Generator given to
  /// dropout or init. Each is saved as "rng.<name>.seed" / "rng.<name>.offset"; a load
  /// refuses a file without them. Unnamed here, such a generator would restart its stream on
  /// resume and draw the masks of the run's first steps again.
  std::vector<std::pair<std::string, Generator*>> generators = {};
  /// The model's gradients (those defined; a load sets the others to None): set it to save
  /// between the micro-steps of gradient accumulation, whose gradients the next step reads.
  /// A checkpoint that holds gradients is refused by a load without it.
  bool grads = false;
};

struct CheckpointOptions {
  int64_t keep_last = 3;        ///< checkpoints kept after a save, newest first (0: all)
  std::string prefix = "ckpt";  ///< files are <dir>/<prefix>-<step, 8 digits>.safetensors
};

/// One checkpoint file of a directory.
struct CheckpointFile {
  std::string path;
  int64_t step = 0;
};

/// Saves, lists, prunes and restores the checkpoints of one run (Note [Resumable checkpoint]).
class CheckpointManager {
 public:
  /// `dir` must exist when save() runs (it is not created: a typo should not make a tree).
  explicit CheckpointManager(std::string dir, CheckpointOptions options = {});

  /// Writes the checkpoint of `step` (in [0, 10^18)) and returns its path, then deletes all but the
  /// newest keep_last (by step; the file just written always among them). `metadata` is stored beside "step",
  /// "optimizer" and "checksum" (keys the manager keeps for itself). Throws naming the path, leaving every existing
  /// checkpoint as it was, when the directory cannot be written or a tensor (not a gradient) holds inf or NaN.
  std::string save(int64_t step, const TrainState& state, const std::map<std::string, std::string>& metadata = {});

  /// The checkpoints in the directory, oldest (lowest step) first; none if it does not exist.
  /// Only files named as path_for names them count ("ckpt-1.safetensors" is not one).
  std::vector<CheckpointFile> list() const;
  std::optional<CheckpointFile> latest() const;

  /// Restores every non-null part of `state` from `path`; returns its step. All or nothing
  /// (Note [Checkpoint load is all or nothing]): throws naming the file, with every part as
  /// it was, when the file is damaged, lacks a part `state` asks for, or holds a part that
  /// does not fit (another model, optimizer type, parameter count or loader order).
  int64_t load(const std::string& path, const TrainState& state) const;
  /// load() of the newest checkpoint; nullopt (and nothing changed) when there is none.
  std::optional<int64_t> resume(const TrainState& state) const;
  /// The metadata of a checkpoint (the user's, "step", "optimizer" and "checksum").
  std::map<std::string, std::string> metadata(const std::string& path) const;

  const std::string& dir() const { return dir_; }
  /// The path save(step) writes.
  std::string path_for(int64_t step) const;

 private:
  std::string dir_;
  CheckpointOptions options_;
};

}  // namespace frugal::train
