#pragma once
// In-place random fills over the Philox stream (see Note [Counter-based RNG]).
// Element i of t (in row-major order) draws from counter first + i / 4, word i % 4,
// on the CPU and on CUDA alike.
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal::ops {

void uniform_(const Tensor& t, double low, double high, Generator* gen = nullptr);
void normal_(const Tensor& t, double mean, double std, Generator* gen = nullptr);
/// Integers uniform in [low, high).
void random_int_(const Tensor& t, int64_t low, int64_t high, Generator* gen = nullptr);

}  // namespace frugal::ops

namespace frugal::ops {
enum class RandomKind { Uniform, Normal, Integer };
/// Parameters of one random fill: a = low/mean, b = high/std.
struct RandomFill {
  RandomKind kind;
  double a, b;
  Generator::Range range;
};
}  // namespace frugal::ops
namespace frugal::ops::cpu {
void random_kernel(const Tensor& t, const RandomFill& fill);  // t contiguous
}
namespace frugal::ops::cuda {
void random_kernel(const Tensor& t, const RandomFill& fill);
}
