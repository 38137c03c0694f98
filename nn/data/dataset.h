#pragma once
// Datasets: indexable collections of (input, target) samples that a DataLoader
// batches. TensorDataset is the one every small experiment needs: two host tensors
// whose first dimension is the sample index, as torch.utils.data.TensorDataset.
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "tensor/tensor.h"

namespace frugal::data {

/// Sample i is (inputs[i], targets[i]). Both tensors live on the host and share their
/// first dimension; they are made contiguous here, once, so a loader gathers each
/// sample's row with one memcpy. Copies of a TensorDataset share the tensors.
class TensorDataset {
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
  int64_t size() const { return inputs_.size(0); }
  /// (N, ...): all inputs, contiguous.
  const Tensor& inputs() const { return inputs_; }
  /// (N, ...): all targets, contiguous.
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
};

}  // namespace frugal::data
