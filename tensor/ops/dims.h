#pragma once
// The check of a list of dims an op takes (the reductions, logsumexp, flip), so that every
// such op refuses the same lists with the same message.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::ops {

/// Which dims of x `dims` names, one flag per dim of x; an empty `dims` names every dim when
/// empty_means_all (a reduction), none otherwise (flip). Throws, naming `op` and x, on an
/// out-of-range or repeated dim. A 0-d tensor accepts dim 0 and -1, as in PyTorch.
std::vector<bool> dims_mask(const char* op, const Tensor& x, const std::vector<int64_t>& dims, bool empty_means_all);

/// x's shape without the dims `mask` marks (keepdim: with 1 there): a reduction's result.
Shape reduced_shape(const Tensor& x, const std::vector<bool>& mask, bool keepdim);
/// How many elements of x fold into each result of a reduction over the dims `mask` marks.
int64_t reduced_count(const Tensor& x, const std::vector<bool>& mask);

}  // namespace frugal::ops
