#pragma once
// BatchNorm2d: batch normalization over the channels of (N, C, H, W) inputs.
#include <optional>

#include "autograd/ops/conv_bn.h"
#include "nn/module.h"

namespace frugal::nn {

/// torch.nn.BatchNorm2d's settings.
struct BatchNormOptions {
  double eps = 1e-5;
  /// Weight of the batch statistics in the running ones; nullopt: a cumulative average
  /// (1 / num_batches_tracked), as PyTorch's momentum=None (reads the counter: a host sync).
  std::optional<double> momentum = 0.1;
  bool affine = true;               // learnable weight (ones) and bias (zeros)
  bool track_running_stats = true;  // running_mean (zeros), running_var (ones), num_batches_tracked (int64 0)
};

/// torch.nn.BatchNorm2d: in training, normalizes each channel with the batch's mean and
/// biased variance and updates the running statistics (Note [Batch norm statistics]);
/// in eval, normalizes with the running ones. Parameters "weight", "bias" and buffers
/// "running_mean", "running_var", "num_batches_tracked" carry torchvision's names, so
/// ResNet checkpoints load. Without track_running_stats it always uses batch statistics.
class BatchNorm2d : public UnaryModule {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {});
  Tensor forward(const Tensor& x) override;
  /// relu(forward(x) + residual), or relu(forward(x)) without a residual, as one op
  /// (batch_norm_relu: cuDNN's fused kernel for channels-last 16-bit training on CUDA).
  /// Updates the running statistics exactly as forward does.
  Tensor forward_relu(const Tensor& x, const Tensor& residual = Tensor());
  /// The batch norm forward would apply to x, for an op that fuses it (bn_relu_conv2d in
  /// autograd/ops/conv_bn.h); counts the batch exactly as forward does.
  BatchNormArgs args_for(const Tensor& x);
  std::string type_name() const override { return "BatchNorm2d"; }
  /// "64, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true"
  std::string extra_repr() const override;

  /// running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_running_stats();

  Tensor weight, bias;                                    // undefined unless affine
  Tensor running_mean, running_var, num_batches_tracked;  // undefined unless track_running_stats
  const int64_t num_features;
  const BatchNormOptions options;

 private:
  /// Checks x, counts the batch in training, and gives the momentum to use.
  double start_batch(const Tensor& x);
  /// Whether this call normalizes with batch statistics (training, or no running ones).
  bool uses_batch_stats() const { return is_training() || !options.track_running_stats; }
};

}  // namespace frugal::nn
