#pragma once
// Pooling layers: MaxPool1d/2d, AvgPool1d/2d, AdaptiveAvgPool1d/2d (no parameters).
#include "nn/module.h"
#include "tensor/ops/pool.h"    // Int2, MaxPool2dOptions, AvgPool2dOptions
#include "tensor/ops/pool1d.h"  // MaxPool1dOptions, AvgPool1dOptions

namespace frugal::nn {

/// torch.nn.MaxPool2d: max over kernel_size windows (stride defaults to kernel_size).
class MaxPool2d : public UnaryModule {
 public:
  explicit MaxPool2d(Int2 kernel_size, MaxPool2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MaxPool2d"; }
  std::string extra_repr() const override;

  const Int2 kernel_size;
  const MaxPool2dOptions options;
};

/// torch.nn.AvgPool2d: mean over kernel_size windows (stride defaults to kernel_size).
class AvgPool2d : public UnaryModule {
 public:
  explicit AvgPool2d(Int2 kernel_size, AvgPool2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AvgPool2d"; }
  std::string extra_repr() const override;

  const Int2 kernel_size;
  const AvgPool2dOptions options;
};

/// torch.nn.AdaptiveAvgPool2d: mean pooling to a fixed output size ({1, 1}: global average pooling).
class AdaptiveAvgPool2d : public UnaryModule {
 public:
  explicit AdaptiveAvgPool2d(Int2 output_size);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  std::string extra_repr() const override { return "output_size=" + output_size.str(); }

  const Int2 output_size;
};

/// torch.nn.MaxPool1d: max over kernel_size windows of (N, C, L) or (C, L) input.
class MaxPool1d : public UnaryModule {
 public:
  explicit MaxPool1d(int64_t kernel_size, MaxPool1dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MaxPool1d"; }
  std::string extra_repr() const override;

  const int64_t kernel_size;
  const MaxPool1dOptions options;
};

/// torch.nn.AvgPool1d: mean over kernel_size windows of (N, C, L) or (C, L) input.
class AvgPool1d : public UnaryModule {
 public:
  explicit AvgPool1d(int64_t kernel_size, AvgPool1dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AvgPool1d"; }
  std::string extra_repr() const override;

  const int64_t kernel_size;
  const AvgPool1dOptions options;
};

/// torch.nn.AdaptiveAvgPool1d: mean pooling to output_size bins (1: the mean over time).
class AdaptiveAvgPool1d : public UnaryModule {
 public:
  explicit AdaptiveAvgPool1d(int64_t output_size);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AdaptiveAvgPool1d"; }
  std::string extra_repr() const override { return "output_size=" + std::to_string(output_size); }

  const int64_t output_size;
};

}  // namespace frugal::nn
