#pragma once
// For ops whose result is a value picked out of their input (amax, amin, median(x)): the
// backward that shares the gradient evenly among the elements equal to it.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::autograd {

/// Records `out`, a value of x per slice over `dims` (empty: every dim; out with or without
/// keepdim), with the gradient g / count shared by the elements of x equal to it (NaN ones
/// when out is NaN), as PyTorch's evenly_distribute_backward (Note [Tie counts in float32]
/// in autograd/ops/reduce.cpp). Does nothing when x needs no gradient.
void record_even_share(const char* backward_name, const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims);

}  // namespace frugal::autograd
