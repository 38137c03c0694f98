#pragma once
#include "tensor/tensor.h"

namespace frugal::ops {

/// Sets every element of t (any strides) to value, converted to t's dtype. Bumps the version.
void fill_(const Tensor& t, double value);
/// fill_(t, 0)
void zero_(const Tensor& t);
/// Sets element i of the contiguous 1-D t to start + i * step, computed in double and
/// converted to t's dtype as fill_ converts. Bumps the version.
void arange_fill_(const Tensor& t, double start, double step);

}  // namespace frugal::ops

namespace frugal::ops::cpu {
void fill_kernel(const Tensor& t, double value);
void arange_fill_kernel(const Tensor& t, double start, double step);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void fill_kernel(const Tensor& t, double value);
void arange_fill_kernel(const Tensor& t, double start, double step);
}  // namespace frugal::ops::cuda
