#pragma once
// Linear and Flatten.
#include "nn/module.h"

namespace frugal::nn {

struct LinearOptions {
  bool bias = true;
};

/// y = x W^T + b, W: (out, in), initialised as torch.nn.Linear (kaiming_uniform a=sqrt(5),
/// bias uniform(+-1/sqrt(in))).
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  std::string extra_repr() const override;

  Tensor weight, bias;  // bias undefined without one
  const int64_t in_features, out_features;
};

/// Flattens dims [start_dim, end_dim] (default: all but the batch dim).
class Flatten : public UnaryModule {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim_, end_dim_); }
  std::string type_name() const override { return "Flatten"; }
  std::string extra_repr() const override;

 private:
  int64_t start_dim_, end_dim_;
};

}  // namespace frugal::nn
