#include "tensor/ops/masked_softmax.h"

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"

namespace frugal::ops {

Tensor masked_softmax(const Tensor& scores, const Tensor& mask, bool is_causal, double scale) {
  constexpr const char* op = "masked_softmax";
  FRUGAL_CHECK(scores.defined(), op, ": undefined scores");
  FRUGAL_CHECK(is_floating(scores.dtype()), op, ": expects floating-point scores, got ", scores.describe());
  FRUGAL_CHECK(scores.dim() >= 1, op, ": scores must have at least one dim, got ", scores.describe());
  FRUGAL_CHECK(!is_causal || scores.dim() >= 2, op, ": is_causal needs scores of shape (..., L, S), got ",
               scores.describe());
  FRUGAL_CHECK(scores.dim() <= MaskedSoftmaxParams::kMaxDims, op, ": at most ", MaskedSoftmaxParams::kMaxDims,
               " dims, got ", scores.describe());
  MaskedSoftmaxParams p;
  p.ndim = int(scores.dim());
  p.causal = is_causal;
  p.scale = scale;
  for (int d = 0; d < p.ndim; ++d) p.sizes[d] = scores.size(d);
  Tensor mask_view;
  if (mask.defined()) {
    FRUGAL_CHECK(mask.dtype() == kBool || mask.dtype() == scores.dtype(), op, ": mask ", mask.describe(),
                 " must be bool or of the scores' dtype (scores ", scores.describe(), ")");
    check_same_device(op, scores, mask);
    bool broadcasts = mask.dim() <= scores.dim();
    for (int64_t d = 1; broadcasts && d <= mask.dim(); ++d)
      broadcasts = mask.size(-d) == 1 || mask.size(-d) == scores.size(-d);
    FRUGAL_CHECK(broadcasts, op, ": mask ", mask.describe(), " does not broadcast to scores ", scores.describe());
    p.kind = mask.dtype() == kBool ? 1 : 2;
    mask_view = mask.expand(scores.sizes());  // stride 0 where it broadcasts: nothing is copied
    for (int d = 0; d < p.ndim; ++d) p.mask_strides[d] = mask_view.stride(d);
  }
  Tensor out = empty(scores.sizes(), scores.options());
  if (out.numel() == 0) return out;
  FRUGAL_DEVICE_DISPATCH(op, scores.device(), masked_softmax_kernel, out, scores.contiguous(), mask_view, p);
  return out;
}

}  // namespace frugal::ops
