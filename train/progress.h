#pragma once
// A training run's progress line: rate, ETA and running loss, redrawn in place with '\r'
// on a terminal, and one line per epoch (plus, if asked, one every log_every steps) when
// the output is a file or a pipe, so logs hold no half-drawn lines.
//
//   train::Progress progress({.epochs = epochs, .unit = "img"});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     progress.start_epoch(epoch, loader.size());
//     ... progress.update(step, samples, loss);   // after each step (or every few)
//     progress.end_epoch(mean_loss);              // "epoch 1/10  mean loss 0.4123  5120 img/s  0:12"
//   }
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace frugal::train {

/// "m:ss" (or "h:mm:ss" from an hour on) of `seconds`, rounded; "?" when it is not finite.
std::string format_clock(double seconds);

/// What one progress line shows.
struct ProgressState {
  int64_t epoch = 0, epochs = 0;  // 1-based as printed; epochs 0: "epoch 3"; epoch 0: no epoch shown
  int64_t step = 0, steps = 0;    // within the epoch
  double loss = 0;                // the running loss
  double rate = 0;                // units per second
  double eta_seconds = 0;         // to the epoch's end
  std::string unit = "samples";
  std::string extra = {};  // appended after two spaces when not empty ("lr 1.00e-03")
};

/// "epoch 2/10  step 300/938  loss 0.4123  5120 samples/s  ETA 0:12[  extra]" (without
/// "epoch 2/10  " when s.epoch is 0, without "/938" and the ETA when s.steps is 0).
std::string format_progress(const ProgressState& s);

/// "epoch 2/10  mean loss 0.4123  5120 samples/s  0:36[  extra]".
std::string format_epoch_summary(int64_t epoch, int64_t epochs, double mean_loss, double rate, const std::string& unit,
                                 double seconds, const std::string& extra = "");

struct ProgressOptions {
  int64_t epochs = 0;                 ///< shown as "epoch e/epochs" (0: "epoch e"; -1: a run of steps, no epoch)
  std::string unit = "samples";       ///< what update()'s counts are ("img", "tokens")
  std::FILE* out = stdout;            ///< where lines go
  std::optional<bool> terminal = {};  ///< redraw with '\r'; default: isatty(out)
  int64_t log_every = 0;              ///< not on a terminal: a full line every N steps too (0: none)
  double redraw_seconds = 0.1;        ///< on a terminal: redraw at most this often (the last step always)
};

/// The progress line of a run (see the file comment). Not thread-safe: one training loop.
class Progress {
 public:
  explicit Progress(ProgressOptions options = {});
  ~Progress();  // ends a line left half drawn
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Starts epoch `epoch` (0-based) of `steps` steps (0: not known) and its clock.
  void start_epoch(int64_t epoch, int64_t steps);
  /// After step `step` (1-based, within the epoch): `samples` units done this epoch and
  /// the running loss; `extra` goes at the end of the line. Redraws on a terminal, prints
  /// every log_every steps otherwise.
  void update(int64_t step, int64_t samples, double loss, const std::string& extra = "");
  /// Prints the epoch's summary line (format_epoch_summary), replacing a redrawn line.
  /// Returns the epoch's seconds.
  double end_epoch(double mean_loss, const std::string& extra = "");
  /// Ends a half-drawn line with '\n' (call before printing something else, e.g. an error).
  void break_line();

  bool terminal() const { return terminal_; }
  /// Seconds since start_epoch.
  double elapsed() const;
  /// Units per second this epoch, from the last update().
  double rate() const;

 private:
  void emit(const std::string& line, bool final_line);

  ProgressOptions options_;
  bool terminal_ = false;
  bool mid_line_ = false;
  size_t drawn_ = 0;  // length of the line on screen, to blank a longer old one
  int64_t epoch_ = 0, steps_ = 0, samples_ = 0;
  double start_ = 0, last_draw_ = -1;
};

}  // namespace frugal::train
