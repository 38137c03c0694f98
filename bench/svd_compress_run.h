#pragma once
// The measurements behind bench/svd_compress, as functions the cpu suite can run at tiny
// sizes (tests/cpu/test_svd_compress.cpp): train a PatchViT, compress it by uniform
// energies and by parameter budgets (Note [Parameter budget]), fine-tune, and compare
// each variant with the dense model; and the factorized-against-dense Linear timing.
#include <cmath>
#include <iosfwd>
#include <string>
#include <vector>

#include "bench/svd_compress_vit.h"
#include "core/device.h"

namespace frugal::bench::svd {

struct Options {
  /// "small" (the README's 2-block model), "vit21m" (12 x 384, 4x4 patches of 28x28) or
  /// "vitb16" (ViT-B/16 at 224px, random weights: memory and speed only, no training).
  std::string model = "small";
  Device device = kCPU;
  bool quick = false;  ///< tiny sizes and few steps (the cpu suite's and --quick's)
  int64_t epochs = 1, finetune_steps = 60, train_limit = 12000, test_limit = 0, batch_size = 128;
  double lr = 2e-3;
  /// Fine-tuning's lr (lr / 4) decays to 0 by a cosine over its steps instead of staying
  /// constant (vit21m: its training ends at lr 0, and a constant lr / 4 lost the dense
  /// model 1.2 points of the accuracy that the rows are compared with).
  bool finetune_decay = false;
  /// Training batches get random crops (padding 2) and horizontal flips (vit21m: without
  /// them 20 epochs reached 0.8957, short of the small ViT's 0.897).
  bool augment = false;
  uint64_t seed = 0;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::vector<double> energies, budgets;  ///< the compressed rows (empty: none of that kind)
  int64_t throughput_reps = 10;           ///< timed batch-32 forwards per row
  /// How far below the dense accuracy the "best" row may be (Options for tests; 0.01 = 1 point).
  double accuracy_tolerance = 0.01;
};

/// The model's shape: Options::model at full size, or shrunk when quick.
PatchViTConfig model_config(const Options& o);
/// Defaults for a model on a device: rows, epochs, steps, batch, lr (flags override them).
Options defaults(const std::string& model, Device device, bool quick);

/// One variant of the model and what it measured (bytes are allocator peaks counted from
/// before the model was built, so weights are included and the dataset is not).
struct Row {
  std::string name;  ///< "dense", "e0.90" (energy) or "p0.70" (budget)
  int64_t params = 0, replaced = 0, matched = 0, min_rank = 0, max_rank = 0;
  double energy_kept = 1;  ///< mean over matched layers
  int64_t infer_peak_1 = 0, infer_peak_32 = 0, train_peak = 0;
  double step_ms = 0, images_per_s = 0;
  double acc_before = NAN, acc_after = NAN;  ///< NaN: not trained (vitb16)
};

/// Trains (unless vitb16), then measures the dense model and every energy and budget row.
/// Progress and each compression report go to `log`.
std::vector<Row> run_table(const Options& o, std::ostream& log);
void print_table(const Options& o, const std::vector<Row>& rows, std::ostream& os);

/// The row with the smallest batch-1 inference memory among the rows with fewer parameters
/// than the dense row (rows.front()) whose tuned accuracy is within `tolerance` of the
/// dense row's (accuracy not asked when not trained); -1 when none is.
int best_row(const std::vector<Row>& rows, double tolerance);
/// "best_row: NAME", "param_ratio: X", "inference_memory_ratio: Y" (batch 1) and
/// "inference_memory_ratio_b32: Z" of best_row; when no row is within `tolerance`, of the
/// most accurate compressed row, saying so on the best_row line; "best_row: none" only
/// when no row has fewer parameters than the dense one.
std::string summary(const std::vector<Row>& rows, double tolerance);

/// Forward + backward time of a dense Linear against LowRankLinear at several ranks, at
/// ViT-B/16's projection shapes (768->768, 768->3072, 3072->768) on `tokens` rows;
/// `dims_scale` divides the shapes (for the cpu suite). Prints a table to `os`.
void linear_microbench(Device device, int64_t tokens, int64_t dims_scale, int reps, std::ostream& os);

}  // namespace frugal::bench::svd
