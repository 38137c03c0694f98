#pragma once
// Pooling layers: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d (no parameters).
#include "nn/module.h"
#include "tensor/ops/pool.h"  // Int2, MaxPool2dOptions, AvgPool2dOptions

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

}  // namespace frugal::nn
