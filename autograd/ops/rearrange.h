#pragma once
// Differentiable rearrangements composed of views and cat (autograd/ops/rearrange.cpp): roll,
// movedim, pixel_shuffle and pixel_unshuffle, as PyTorch's. Their gradients are the composing
// ops' (narrow, cat, permute, reshape), so double backward and every device come with them.
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace frugal {

/// x's entries shifted `shifts[i]` places along `dims[i]` (negative: backwards), those pushed
/// past the end coming back at the start, as torch.roll; with no dims, x flattened is rolled
/// by shifts[0] and given x's shape back. A fresh tensor (two narrows and a cat a dim).
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims = {});

/// x with its dims `source` moved to the positions `destination` and the others in their order
/// between, as torch.movedim: a view (a permute).
Tensor movedim(const Tensor& x, const std::vector<int64_t>& source, const std::vector<int64_t>& destination);

/// (*, C r^2, H, W) to (*, C, H r, W r): each group of r^2 channels becomes an r x r block of
/// pixels (torch.nn.functional.pixel_shuffle, the sub-pixel convolution's upsampling).
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor);
/// The inverse: (*, C, H r, W r) to (*, C r^2, H, W), as torch.nn.functional.pixel_unshuffle.
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor);

}  // namespace frugal
