#pragma once
// Random autograd programs (tests/cpu/test_random_autograd.cpp, and on the GPU
// tests/gpu/test_random_autograd_cuda.cpp): sequences of differentiable ops drawn at
// random from a menu of views, in-place ops, copy_, broadcasting and reductions, over a
// pool of same-shaped values, so any value may be used in two branches.
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/all.h"
#include "tests/test_util.h"

namespace frugal::testing {

constexpr int64_t kRows = 2, kCols = 3;  // every value of a program is (kRows, kCols)

/// A small deterministic generator (xorshift64*), independent of frugal's RNG.
struct Dice {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  size_t below(size_t n) { return size_t(next() % n); }
};

/// One step: reads values a and b of the pool (maybe the same one) and adds a new value.
struct Step {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> apply;
};

/// The steps a program is drawn from. Each keeps the (kRows, kCols) shape and is smooth
/// where it is evaluated (no kinks: the differences must agree with backward).
inline const std::vector<Step>& steps() {
  static const std::vector<Step> kSteps = {
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"add_scaled", [](const Tensor& a, const Tensor& b) { return a + b * 0.5; }},
      {"div_smooth", [](const Tensor& a, const Tensor& b) { return a / (square(b) + 1.0); }},
      {"tanh", [](const Tensor& a, const Tensor&) { return tanh(a); }},
      {"sin", [](const Tensor& a, const Tensor&) { return sin(a); }},
      {"sigmoid_mul", [](const Tensor& a, const Tensor& b) { return sigmoid(a) * b; }},
      {"transpose_roundtrip",  // an op on a transposed view, transposed back
       [](const Tensor& a, const Tensor& b) { return (a.t() * b.t().contiguous()).t(); }},
      {"reshape_roundtrip",
       [](const Tensor& a, const Tensor&) {
         return exp(a.reshape({kRows * kCols}) * 0.3).view({kRows, kCols});
       }},
      {"narrow_cat",  // pieces of a, recombined
       [](const Tensor& a, const Tensor& b) {
         return cat({a.narrow(1, 1, 2) * 2.0, b.narrow(1, 0, 1)}, 1);
       }},
      {"row_broadcast",  // a row of b, broadcast over the rows
       [](const Tensor& a, const Tensor& b) { return a * b.select(0, 1).unsqueeze(0); }},
      {"mean_expand",
       [](const Tensor& a, const Tensor&) {
         return a - mean(a, {1}, true).expand({kRows, kCols});
       }},
      {"softmax", [](const Tensor& a, const Tensor& b) { return softmax(a, 1) * b; }},
      {"matmul_chain", [](const Tensor& a, const Tensor& b) { return matmul(matmul(a, b.t()), b) * 0.3; }},
      {"add_inplace",  // a recorded in-place op on a fresh value
       [](const Tensor& a, const Tensor& b) {
         Tensor t = a * 1.5;
         t += b;
         return t;
       }},
      {"mul_inplace",
       [](const Tensor& a, const Tensor& b) {
         Tensor t = a + 0.25;
         t *= b;
         return t;
       }},
      {"copy_overwrite",  // the old history must get nothing, b everything
       [](const Tensor& a, const Tensor& b) {
         Tensor t = a * 3.0;
         t.copy_(b * a);
         return t;
       }},
      {"copy_broadcast",  // a row of b copied into every row
       [](const Tensor& a, const Tensor& b) {
         Tensor t = a * 2.0;
         t.copy_(b.narrow(0, 0, 1));
         return t + a;
       }},
  };
  return kSteps;
}

/// A program: for each step, which op and which two pool values (leaves first) it reads.
struct Program {
  struct Use {
    size_t step, a, b;
  };
  std::vector<Use> uses;
  std::vector<double> weights;  // the output: sum over the pool of weight * sum(value)

  std::string str() const {
    std::string s;
    for (const Use& u : uses) s += steps()[u.step].name + "(" + std::to_string(u.a) + "," + std::to_string(u.b) + ") ";
    return s;
  }

  Tensor run(const TensorList& leaves) const {
    TensorList pool(leaves.begin(), leaves.end());
    for (const Use& u : uses) pool.push_back(steps()[u.step].apply(pool[u.a], pool[u.b]));
    Tensor out = sum(pool.back());
    for (size_t i = leaves.size(); i + 1 < pool.size(); ++i) out = out + sum(pool[i]) * weights[i];
    return out;
  }
};

inline Program random_program(uint64_t seed, size_t leaves, size_t length) {
  Dice dice{seed * 0x9E3779B97F4A7C15ull + 7};
  Program p;
  for (size_t k = 0; k < length; ++k) {
    const size_t pool = leaves + k;
    p.uses.push_back({dice.below(steps().size()), dice.below(pool), dice.below(pool)});
  }
  for (size_t i = 0; i < leaves + length; ++i) p.weights.push_back(double(dice.below(5)) * 0.25 - 0.5);
  return p;
}

/// n leaves of the program's shape; the same values for a seed whatever the dtype and device.
inline TensorList random_leaves(uint64_t seed, size_t n, TensorOptions opts = TensorOptions(kFloat64)) {
  TensorList leaves;
  for (size_t i = 0; i < n; ++i) {
    // * 0.7 keeps exp and the products in a tame range
    Tensor t = make_tensor(random_values(kRows * kCols, seed * 31 + i, -1.4, 1.4), {kRows, kCols}, opts);
    t.requires_grad_();
    leaves.push_back(t);
  }
  return leaves;
}

}  // namespace frugal::testing
