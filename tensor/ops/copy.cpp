#include "tensor/ops/copy.h"

#include "tensor/device_dispatch.h"
#include "tensor/elementwise.h"
#include "tensor/factory.h"

namespace frugal::ops {

void copy_into(const Tensor& dst, const Tensor& src) {
  FRUGAL_CHECK(dst.defined() && src.defined(), "copy_: undefined tensor");
  // Validate the broadcast up front so the message names both tensors.
  const Shape b = broadcast_shapes(dst.sizes(), src.sizes(), "copy_");
  FRUGAL_CHECK(b == dst.sizes(), "copy_: source ", src.describe(), " does not broadcast to destination ",
               dst.describe());
  if (dst.numel() == 0) return;
  check_no_internal_overlap("copy_", dst);
  if (dst.device() == src.device()) {
    // A source overlapping dst in another layout (dst.copy_(dst.t()), a shifted view) would
    // be read where it was already written: copy it first, as the in-place binary ops do.
    const bool same_view = src.sizes() == dst.sizes() && src.strides() == dst.strides() &&
                           src.storage_offset() == dst.storage_offset() && src.dtype() == dst.dtype();
    if (same_view && src.shares_storage(dst)) return;  // x.copy_(x)
    if (may_overlap(dst, src)) {
      Tensor staged = empty(src.sizes(), src.options());
      FRUGAL_DEVICE_DISPATCH("copy_", src.device(), copy_kernel, staged, src);
      FRUGAL_DEVICE_DISPATCH("copy_", dst.device(), copy_kernel, dst, staged);
      return;
    }
    FRUGAL_DEVICE_DISPATCH("copy_", dst.device(), copy_kernel, dst, src);
    return;
  }
#ifdef FRUGAL_WITH_CUDA
  // Across devices: make a dense copy in dst's dtype on src's device, move the bytes,
  // then scatter into dst's layout if it is not dense itself.
  Tensor staged = src;
  if (src.dtype() != dst.dtype() || src.sizes() != dst.sizes() || !src.is_contiguous()) {
    staged = empty(dst.sizes(), {dst.dtype(), src.device()});
    copy_into(staged, src);
  }
  Tensor landing = dst.is_contiguous() ? dst : empty(dst.sizes(), dst.options());
  cuda::memcpy_across(landing.data(), dst.device(), staged.data(), src.device(),
                      size_t(dst.numel()) * dst.element_size());
  if (!landing.shares_storage(dst)) copy_into(dst, landing);
#else
  throw_no_cuda("copy_", dst.device().is_cuda() ? dst.device() : src.device());
#endif
}

}  // namespace frugal::ops
