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

class SELU : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "SELU"; }
};

/// torch.nn.CELU(alpha).
class CELU : public UnaryModule {
 public:
  explicit CELU(double alpha = 1.0);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "CELU"; }
  std::string extra_repr() const override;

 private:
  double alpha_;
};

class Softsign : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Softsign"; }
};

class Tanhshrink : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Tanhshrink"; }
};

/// torch.nn.Hardshrink(lambd).
class Hardshrink : public UnaryModule {
 public:
  explicit Hardshrink(double lambd = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Hardshrink"; }
  std::string extra_repr() const override;

 private:
  double lambd_;
};

/// torch.nn.Softshrink(lambd).
class Softshrink : public UnaryModule {
 public:
  explicit Softshrink(double lambd = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Softshrink"; }
  std::string extra_repr() const override;

 private:
  double lambd_;
};

/// torch.nn.Threshold(threshold, value).
class Threshold : public UnaryModule {
 public:
  Threshold(double threshold, double value);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Threshold"; }
  std::string extra_repr() const override;

 private:
  double threshold_, value_;
};

/// torch.nn.GLU(dim).
class GLU : public UnaryModule {
 public:
  explicit GLU(int64_t dim = -1) : dim_(dim) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "GLU"; }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim_); }

 private:
  int64_t dim_;
};

/// torch.nn.PReLU(num_parameters, init): a learned slope for x <= 0, one in all or one per
/// channel (x's dim 1), each starting at `init`. Its parameter is "weight", as torch's.
class PReLU : public UnaryModule {
 public:
  explicit PReLU(int64_t num_parameters = 1, double init = 0.25);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "PReLU"; }
  std::string extra_repr() const override { return "num_parameters=" + std::to_string(weight.numel()); }

  Tensor weight;
};

}  // namespace frugal::nn
