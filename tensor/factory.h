#pragma once
// Tensor factories, as in PyTorch: zeros({2, 3}), randn({4}, {kFloat16, cuda()}).
#include <initializer_list>
#include <vector>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal {

/// Uninitialized memory from the device's arena.
Tensor empty(const Shape& sizes, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
Tensor empty_strided(const Shape& sizes, const Shape& strides, TensorOptions opts = {});
Tensor zeros(const Shape& sizes, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones(const Shape& sizes, TensorOptions opts = {});
Tensor ones_like(const Tensor& t);
Tensor full(const Shape& sizes, double value, TensorOptions opts = {});
Tensor full_like(const Tensor& t, double value);
/// 0-d tensor holding `value`.
Tensor scalar_tensor(double value, TensorOptions opts = {});
/// [start, end) in steps of `step`, in opts.dtype (float32 unless given).
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = {});
/// 0, 1, ..., end-1 as int64 (PyTorch's default for integer arange).
Tensor arange(int64_t end, TensorOptions opts = {kInt64});
Tensor eye(int64_t n, int64_t m = -1, TensorOptions opts = {});

/// Uniform in [0, 1).
Tensor rand(const Shape& sizes, TensorOptions opts = {}, Generator* gen = nullptr);
/// Standard normal.
Tensor randn(const Shape& sizes, TensorOptions opts = {}, Generator* gen = nullptr);
/// Integers uniform in [low, high); default dtype int64.
Tensor randint(int64_t low, int64_t high, const Shape& sizes, TensorOptions opts = {kInt64}, Generator* gen = nullptr);

/// A tensor holding `values` (converted to opts.dtype) with `sizes`; by default 1-D of
/// values.size(), except that a single value makes a 0-d tensor (as torch.tensor(5.0)).
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes, TensorOptions opts);
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes = {}) {
  return from_vector<T>(values, sizes, TensorOptions(dtype_of<T>()));
}

}  // namespace frugal
