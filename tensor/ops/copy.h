#pragma once
// copy_into: the one data-moving primitive under contiguous(), clone(), to() and copy_().
#include "tensor/tensor.h"

namespace frugal::ops {

/// dst[...] = src[...] converted to dst's dtype; src broadcasts to dst's shape; any
/// strides; across devices (through a contiguous staging copy). src may overlap dst: it is
/// read as it was before the copy (through a staging copy). Does not bump dst's version.
void copy_into(const Tensor& dst, const Tensor& src);

}  // namespace frugal::ops

namespace frugal::ops::cpu {
void copy_kernel(const Tensor& dst, const Tensor& src);  // same device, dtype cast, broadcast
}
namespace frugal::ops::cuda {
void copy_kernel(const Tensor& dst, const Tensor& src);
/// Copies `nbytes` between any two devices (host or GPU) on the current stream of the
/// GPU side; returns once a host destination holds the data.
void memcpy_across(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);
}  // namespace frugal::ops::cuda
