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

}  // namespace frugal::ops
