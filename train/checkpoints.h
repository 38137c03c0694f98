#pragma once
// CheckpointManager: numbered checkpoints of a training run in one directory, each a
// safetensors file holding everything a bit-exact resume needs; the newest k are kept.
//
//   train::CheckpointManager ckpt("runs/a", {.keep_last = 3});
//   train::TrainState state{.model = &net, .optimizer = &opt, .scaler = &scaler,
//                           .scheduler = &schedule, .loader = &loader};
//   int64_t step = ckpt.resume(state).value_or(0);    // 0: a fresh run (past damaged newest files)
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
//
// Note [Resume falls back past damaged checkpoints]
// A run killed while the disk filled, or a bit flipped on the disk, leaves a newest file
// that cannot be read whole while an older intact one sits beside it. resume() tells two
// failures apart:
//   - damaged: the file cannot be read (I/O error, gone), is not safetensors or is cut short,
//     is not a checkpoint (no "step" metadata), fails its checksum (Note [Checkpoint
//     checksum]), or its "step" is not the one in its name (by which list() ranks it). Nothing of the run is touched
//     before these checks, so resume() warns on stderr (one line: the file and why) and tries the next older
//     checkpoint. When one loads, the damaged newer files are renamed to "<path>.damaged" (kept for a look, no longer a
//     checkpoint to list(), resume() or keep_last): else the run's next saves, at lower steps, would rank below them,
//     and keep_last would prune the intact files and keep the damaged ones. When every checkpoint is damaged, resume()
//     throws listing each file and its reason, renaming nothing: a run never silently starts again from step 0.
//   - does not fit: an intact file of another model, optimizer, schedule, loader order or set
//     of generators (or other expected metadata, ResumeOptions). resume() throws at once, as
//     load() does: an older file of the same run would not fit either, and falling back would
//     hide a changed configuration.
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

/// A checkpoint resume() passed over because it could not be read whole (Note [Resume falls
/// back past damaged checkpoints]).
struct DamagedCheckpoint {
  std::string path;      ///< where it was found
  std::string reason;    ///< the error that reading it gave
  std::string moved_to;  ///< where resume() renamed it ("<path>.damaged"); empty when that failed
};

/// What a resume expects of the checkpoint besides the parts of TrainState.
struct ResumeOptions {
  /// Metadata (as given to save()) the checkpoint must hold with these values, e.g.
  /// {{"model", "cnn"}}: a checkpoint without the key or with another value does not fit the
  /// run, an error naming both values (not a reason to fall back to an older one).
  std::map<std::string, std::string> expect_metadata = {};
};

/// What resume(state, options) did.
struct ResumeResult {
  std::optional<int64_t> step;             ///< the step restored; nullopt: no checkpoint, nothing changed
  std::string path;                        ///< the file restored ("" when none)
  std::vector<DamagedCheckpoint> skipped;  ///< newer checkpoints that were damaged, newest first
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
  /// load() of the newest intact checkpoint; nullopt (and nothing changed) when there is none.
  /// Damaged newer files are skipped with a warning and renamed aside once an older one has
  /// loaded; throws when every checkpoint is damaged (listing each), or at once when the newest
  /// intact one does not fit the run (Note [Resume falls back past damaged checkpoints]).
  std::optional<int64_t> resume(const TrainState& state) const;
  /// resume(state), checking `options` too, and saying which file it restored and which it
  /// skipped:
  ///
  ///   const train::ResumeResult r = ckpt.resume(state, {.expect_metadata = {{"model", "cnn"}}});
  ///   for (const train::DamagedCheckpoint& d : r.skipped) log(d.path + ": " + d.reason);
  ResumeResult resume(const TrainState& state, const ResumeOptions& options) const;
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
