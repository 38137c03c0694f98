#pragma once
// Activation modules: thin wrappers over the differentiable functions.
#include "nn/module.h"

namespace frugal::nn {

class ReLU : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ReLU"; }
};

/// approximate = true uses the tanh form (torch's approximate='tanh').
class GELU : public UnaryModule {
 public:
  explicit GELU(bool approximate = false) : approximate_(approximate) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "GELU"; }
  std::string extra_repr() const override { return approximate_ ? "approximate='tanh'" : ""; }

 private:
  bool approximate_;
};

class Tanh : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Tanh"; }
};

class SiLU : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "SiLU"; }
};

class Sigmoid : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sigmoid"; }
};

}  // namespace frugal::nn
