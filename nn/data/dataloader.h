#pragma once
// DataLoader: batches of a Dataset, shuffled reproducibly, prepared by background
// worker threads so the training loop (and the GPU) never waits for them.
//
//   data::DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .seed = 1, .device = cuda()});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);
//     for (data::Batch& b : loader) step(b.inputs, b.targets);
//   }
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "core/data_ptr.h"
#include "core/device.h"
#include "nn/data/dataset.h"
#include "tensor/from_data_ptr.h"
#include "tensor/tensor.h"

namespace frugal::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;       // with shuffle: the order of epoch e is a function of (seed, e) only
  bool drop_last = false;  // drop the last batch when it has fewer than batch_size samples
  Device device = kCPU;    // where batches are delivered
  int64_t prefetch = 2;    // batches prepared ahead by the worker threads; 0: no thread
  int64_t workers = 1;     // threads preparing batches (with prefetch > 0); the batches do not depend on it
};

/// One batch: rows of the dataset's inputs and targets, (B, ...) each, on the loader's device.
struct Batch {
  Tensor inputs, targets;
};

/// Stacks examples into a batch: inputs (B, ...) and targets (B, ...) in pinned host
/// memory. Every example's input must have the shape and dtype of the first's, and so must
/// every target; throws naming the example that differs.
Batch collate(const std::vector<Example>& examples);

/// A tensor over `data` (tensor/from_data_ptr.h), here for the loader's users.
using frugal::from_data_ptr;

/// Iterates a Dataset in batches; see Note [DataLoader pipeline] in dataloader.cpp.
///
/// A pass over the data (an epoch) starts at begin(), or at next() when none is under
/// way, and uses epoch number epoch(); each pass started advances that number by one,
/// and set_epoch() sets it. With shuffle the sample order is a permutation that depends
/// only on (seed, epoch): runs are reproducible, and epochs differ. Batch b of an epoch holds
/// samples order(epoch)[b B .. (b + 1) B), each read with get_at_epoch(i, epoch), whatever
/// the number of workers.
/// Not copyable or movable (a worker thread refers to it). Use from one thread.
class DataLoader {
 public:
  /// The fast path: each batch gathers rows of the dataset's tensors, one memcpy per sample.
  DataLoader(const TensorDataset& dataset, DataLoaderOptions options = {});
  /// Any dataset: each batch is collate() of get_at_epoch(i, epoch) for its samples. The
  /// dataset's get must be safe to call from several threads (Dataset's contract).
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Batches in one epoch.
  int64_t size() const;
  /// Samples in the dataset (in one epoch, before drop_last).
  int64_t samples() const { return dataset_->size(); }
  /// The epoch number of the next pass.
  int64_t epoch() const { return next_epoch_; }
  /// The next pass (begin() or next()) uses `epoch`; abandons a pass under way, so that
  /// position() reports {epoch, 0} until it starts - unless no pass is under way and
  /// set_position() named this epoch: then the pass still starts at that position's batch
  /// (Note [set_epoch after set_position]).
  void set_epoch(int64_t epoch);
  /// Where the data stands, for a checkpoint: the epoch of the pass under way and the
  /// batches it has delivered, or, between passes, the next pass's epoch and first batch.
  struct Position {
    int64_t epoch = 0, batch = 0;
  };
  Position position() const;
  /// The next pass uses `epoch` and starts at its batch `batch` (what position() returned
  /// when a checkpoint was saved); later passes start at batch 0. Abandons a pass under
  /// way. Throws unless 0 <= batch <= size().
  void set_position(Position position);

  /// The sample indices of `epoch`, in the order they are delivered (before drop_last).
  std::vector<int64_t> order(int64_t epoch) const;
  const DataLoaderOptions& options() const { return options_; }
  /// Batches so far whose copy to a CUDA device ran on the side stream, overlapped with the
  /// step before them (Note [DataLoader pipeline]); the others were copied on the step's stream.
  int64_t side_stream_copies() const { return side_stream_copies_; }

  /// Moves the next batch of the current pass into `batch` and returns true; at the end
  /// of the pass returns false (and the next call starts a new pass). An error raised
  /// while preparing a batch is rethrown here, in order, and ends the pass.
  bool next(Batch& batch);

  /// Input iterator over one pass; `for (Batch& b : loader)`. Leaving the loop early is
  /// fine: the next begin() (or the destructor) stops the worker.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    Batch& operator*() { return batch_; }
    Batch* operator->() { return &batch_; }
    Iterator& operator++() {
      done_ = !loader_->next(batch_);
      return *this;
    }
    bool operator==(std::default_sentinel_t) const { return done_; }

   private:
    friend class DataLoader;
    explicit Iterator(DataLoader* loader) : loader_(loader) { ++*this; }
    DataLoader* loader_;
    Batch batch_;
    bool done_ = false;
  };
  /// Starts a new pass (abandoning any pass under way) and returns its first position.
  Iterator begin();
  std::default_sentinel_t end() { return {}; }

 private:
  struct Pass;
  void start_pass();
  void end_pass();
  void check_options() const;
  Batch make_batch(const std::vector<int64_t>& order, int64_t index, int64_t epoch) const;
  /// The next prepared host batch of the pass under way, waiting for it, or, without
  /// `wait`, only if it is ready and did not fail (nullopt otherwise).
  std::optional<Batch> take_prepared(bool wait);

  std::shared_ptr<const Dataset> dataset_;
  const TensorDataset* tensors_ = nullptr;  // dataset_ when it is a TensorDataset (the fast path)
  DataLoaderOptions options_;
  int64_t next_epoch_ = 0;
  int64_t next_first_batch_ = 0;  // where the next pass starts (set_position), then 0
  std::unique_ptr<Pass> pass_;
  int64_t side_stream_copies_ = 0;
};

}  // namespace frugal::data
