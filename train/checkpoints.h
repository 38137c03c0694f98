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
// is all that is needed; DataLoader::set_position). Keys: "model.*", "optim.*",
// "scaler.*", "scheduler.*", "rng.seed", "rng.offset", "data.epoch", "data.batch"; the
// step is the metadata "step".
//
// A save is atomic (nn::save_safetensors writes a temporary and renames it), refuses
// parameters holding inf or NaN, and deletes older checkpoints only once the new one is
// in place: a failed save leaves every earlier checkpoint as it was.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nn/data/dataloader.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace frugal::train {

/// The parts of a run a checkpoint saves and restores; null parts are left out.
struct TrainState {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::GradScaler* scaler = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  data::DataLoader* loader = nullptr;  ///< its position (epoch, batch)
  bool rng = true;                     ///< the default generator's seed and offset
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

  /// Writes the checkpoint of `step` (>= 0) and returns its path, then deletes all but the
  /// newest keep_last (by step; the file just written always among them). `metadata` is stored beside "step" (keys
  /// other than "step"). Throws naming the path, leaving every existing checkpoint as it was, when the directory cannot
  /// be written or a tensor holds inf or NaN.
  std::string save(int64_t step, const TrainState& state, const std::map<std::string, std::string>& metadata = {});

  /// The checkpoints in the directory, oldest (lowest step) first; none if it does not exist.
  std::vector<CheckpointFile> list() const;
  std::optional<CheckpointFile> latest() const;

  /// Restores every non-null part of `state` from `path`; returns its step. Checks first
  /// that the file holds each part `state` asks for (naming what is missing); each part's
  /// own load then checks its keys and shapes.
  int64_t load(const std::string& path, const TrainState& state) const;
  /// load() of the newest checkpoint; nullopt (and nothing changed) when there is none.
  std::optional<int64_t> resume(const TrainState& state) const;
  /// The metadata of a checkpoint (the user's and "step").
  std::map<std::string, std::string> metadata(const std::string& path) const;

  const std::string& dir() const { return dir_; }
  /// The path save(step) writes.
  std::string path_for(int64_t step) const;

 private:
  std::string dir_;
  CheckpointOptions options_;
};

}  // namespace frugal::train
