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

/// torch.nn.LeakyReLU(negative_slope).
class LeakyReLU : public UnaryModule {
 public:
  explicit LeakyReLU(double negative_slope = 0.01);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LeakyReLU"; }
  std::string extra_repr() const override;

 private:
  double negative_slope_;
};

/// torch.nn.ELU(alpha).
class ELU : public UnaryModule {
 public:
  explicit ELU(double alpha = 1.0);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ELU"; }
  std::string extra_repr() const override;

 private:
  double alpha_;
};

/// torch.nn.Hardtanh(min_val, max_val); ReLU6 is Hardtanh(0, 6), as in PyTorch.
class Hardtanh : public UnaryModule {
 public:
  explicit Hardtanh(double min_val = -1.0, double max_val = 1.0);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Hardtanh"; }
  std::string extra_repr() const override;

 private:
  double min_val_, max_val_;
};

class ReLU6 : public Hardtanh {
 public:
  ReLU6() : Hardtanh(0.0, 6.0) {}
  std::string type_name() const override { return "ReLU6"; }
  std::string extra_repr() const override { return ""; }
};

class Hardsigmoid : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Hardsigmoid"; }
};

class Hardswish : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Hardswish"; }
};

class Mish : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Mish"; }
};

class LogSigmoid : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LogSigmoid"; }
};

}  // namespace frugal::nn
