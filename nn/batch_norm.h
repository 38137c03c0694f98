#pragma once
// BatchNorm1d, BatchNorm2d, BatchNorm3d: batch normalization over the channels of (N, C, *)
// inputs, as torch.nn's.
#include <optional>
#include <vector>

#include "autograd/ops/conv_bn.h"
#include "nn/module.h"

namespace frugal::nn {

/// torch.nn.BatchNorm1d/2d/3d's settings.
struct BatchNormOptions {
  double eps = 1e-5;
  /// Weight of the batch statistics in the running ones; nullopt: a cumulative average
  /// (1 / num_batches_tracked), as PyTorch's momentum=None (reads the counter: a host sync).
  std::optional<double> momentum = 0.1;
  bool affine = true;               // learnable weight (ones) and bias (zeros)
  bool track_running_stats = true;  // running_mean (zeros), running_var (ones), num_batches_tracked (int64 0)
};

/// torch.nn.BatchNorm{1,2,3}d: in training, normalizes each channel with the batch's mean
/// and biased variance over every dim but C and updates the running statistics (Note [Batch
/// norm statistics]); in eval, normalizes with the running ones. Parameters "weight", "bias"
/// and buffers "running_mean", "running_var", "num_batches_tracked" carry PyTorch's names, so
/// its checkpoints load. Without track_running_stats it always uses batch statistics. The
/// three differ only in the input ranks they accept (as PyTorch's, so a flattened feature map
/// handed to a BatchNorm2d is refused, not normalized over the wrong dims).
class BatchNorm : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  /// relu(forward(x) + residual), or relu(forward(x)) without a residual, as one op
  /// (batch_norm_relu: cuDNN's fused kernel for channels-last 16-bit training on CUDA).
  /// Updates the running statistics exactly as forward does.
  Tensor forward_relu(const Tensor& x, const Tensor& residual = Tensor());
  /// The batch norm forward would apply to x, for an op that fuses it (bn_relu_conv2d in
  /// autograd/ops/conv_bn.h); counts the batch exactly as forward does.
  BatchNormArgs args_for(const Tensor& x);
  std::string type_name() const override { return type_; }
  /// "64, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true"
  std::string extra_repr() const override;

  /// running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_running_stats();

  Tensor weight, bias;                                    // undefined unless affine
  Tensor running_mean, running_var, num_batches_tracked;  // undefined unless track_running_stats
  const int64_t num_features;
  const BatchNormOptions options;

 protected:
  /// An input rank accepted and its shape as errors name it, e.g. {4, "(N, C, H, W)"}.
  struct Accepted {
    int64_t rank;
    const char* shape;
  };
  /// `type`: "BatchNorm2d" etc.
  BatchNorm(const char* type, std::vector<Accepted> accepted, int64_t num_features, BatchNormOptions options);

 private:
  /// Checks x, counts the batch in training, and gives the momentum to use.
  double start_batch(const Tensor& x);
  /// Whether this call normalizes with batch statistics (training, or no running ones).
  bool uses_batch_stats() const { return is_training() || !options.track_running_stats; }

  const char* type_;
  std::vector<Accepted> accepted_;
};

/// torch.nn.BatchNorm1d: (N, C) or (N, C, L) inputs (features of an MLP, channels of a sequence).
class BatchNorm1d final : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {})
      : BatchNorm("BatchNorm1d", {{2, "(N, C)"}, {3, "(N, C, L)"}}, num_features, options) {}
};

/// torch.nn.BatchNorm2d: (N, C, H, W) inputs, NCHW or channels-last.
class BatchNorm2d final : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {})
      : BatchNorm("BatchNorm2d", {{4, "(N, C, H, W)"}}, num_features, options) {}
};

/// torch.nn.BatchNorm3d: (N, C, D, H, W) inputs.
class BatchNorm3d final : public BatchNorm {
 public:
  explicit BatchNorm3d(int64_t num_features, BatchNormOptions options = {})
      : BatchNorm("BatchNorm3d", {{5, "(N, C, D, H, W)"}}, num_features, options) {}
};

}  // namespace frugal::nn
