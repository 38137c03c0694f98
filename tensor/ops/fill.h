#pragma once
#include "tensor/tensor.h"

namespace frugal::ops {

/// Sets every element of t (any strides) to value, converted to t's dtype. Bumps the version.
void fill_(const Tensor& t, double value);
/// fill_(t, 0)
void zero_(const Tensor& t);

}  // namespace frugal::ops

namespace frugal::ops::cpu {
void fill_kernel(const Tensor& t, double value);
}
namespace frugal::ops::cuda {
void fill_kernel(const Tensor& t, double value);
}
