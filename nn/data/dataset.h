#pragma once
// Datasets: indexable collections of (input, target) samples that a DataLoader
// batches, as torch.utils.data.Dataset. TensorDataset is the one every small experiment
// needs: two host tensors whose first dimension is the sample index, as
// torch.utils.data.TensorDataset. ImageDataset holds images as uint8 (a quarter of the
// memory of float32) and leaves their conversion to a transform (nn/data/transforms.h).
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "tensor/tensor.h"

namespace frugal::data {

/// One sample: its input (an image (C, H, W), a feature row, ...) and its target.
struct Example {
  Tensor input, target;
};

/// A map-style dataset: samples 0 .. size() - 1, each read with get(i).
///
/// get() is const and may be called from several loader threads at once: implementations
/// keep no mutable state (randomness comes from (seed, epoch, i): see TransformedDataset).
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples.
  virtual int64_t size() const = 0;
  /// Sample i, 0 <= i < size(); throws naming i and size() otherwise.
  virtual Example get(int64_t i) const = 0;
  /// Sample i as delivered in pass `epoch` of a loader. Datasets with random transforms
  /// draw from (seed, epoch, i), so each epoch sees other augmentations; the others ignore
  /// the epoch (this default).
  virtual Example get_at_epoch(int64_t i, int64_t epoch) const {
    (void)epoch;
    return get(i);
  }

 protected:
  /// Throws "<who>: index i is out of range for a dataset of n samples" unless 0 <= i < n.
  static void check_index(const char* who, int64_t i, int64_t n) {
    FRUGAL_CHECK(i >= 0 && i < n, who, ": index ", i, " is out of range for a dataset of ", n, " samples");
  }
};

/// Sample i is (inputs[i], targets[i]). Both tensors live on the host and share their
/// first dimension; they are made contiguous here, once, so a loader gathers each
/// sample's row with one memcpy (its fast path: Note [DataLoader pipeline]). Copies of a
/// TensorDataset share the tensors. Final: the loader's fast path reads the tensors without
/// calling get, so a subclass's get or get_at_epoch would be skipped silently (and the
/// loader's `const TensorDataset&` constructor would slice it); wrap one in a Dataset instead.
class TensorDataset final : public Dataset {
 public:
  TensorDataset(Tensor inputs, Tensor targets) {
    FRUGAL_CHECK(inputs.defined() && targets.defined(), "TensorDataset: inputs and targets must be defined tensors");
    FRUGAL_CHECK(inputs.dim() >= 1 && targets.dim() >= 1, "TensorDataset: inputs ", inputs.describe(), " and targets ",
                 targets.describe(), " need a first (sample) dimension");
    FRUGAL_CHECK(inputs.size(0) == targets.size(0), "TensorDataset: inputs ", inputs.describe(), " and targets ",
                 targets.describe(), " differ in their number of samples");
    FRUGAL_CHECK(inputs.device().is_cpu() && targets.device().is_cpu(), "TensorDataset: inputs ", inputs.describe(),
                 " and targets ", targets.describe(),
                 " must live on the host (the DataLoader moves each batch to its device)");
    inputs_ = inputs.detach().contiguous();
    targets_ = targets.detach().contiguous();
  }

  /// Number of samples.
  int64_t size() const override { return inputs_.size(0); }
  /// (inputs[i], targets[i]): views, no copy.
  Example get(int64_t i) const override {
    check_index("TensorDataset::get", i, size());
    return {inputs_.select(0, i), targets_.select(0, i)};
  }
  /// (N, ...): all inputs, contiguous.
  const Tensor& inputs() const { return inputs_; }
  /// (N, ...): all targets, contiguous.
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
};

/// Images stored as uint8, (N, C, H, W) or (N, H, W), with int64 labels (N). Sample i is
/// (images[i] as uint8 (C, H, W), with C = 1 for (N, H, W), labels[i] as an int64 scalar):
/// views, no copy. A transform converts them (ToFloat, Normalize: nn/data/transforms.h), so
/// the dataset stays in a quarter of the memory of float32, as torchvision's datasets keep
/// their bytes and convert in ToTensor.
class ImageDataset : public Dataset {
 public:
  ImageDataset(Tensor images, Tensor labels);

  int64_t size() const override { return images_.size(0); }
  Example get(int64_t i) const override;
  /// (N, C, H, W) uint8, contiguous.
  const Tensor& images() const { return images_; }
  /// (N) int64, contiguous.
  const Tensor& labels() const { return labels_; }

 private:
  Tensor images_, labels_;
};

}  // namespace frugal::data
