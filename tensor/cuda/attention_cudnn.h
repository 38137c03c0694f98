#pragma once
// Attention through cuDNN's fused scaled-dot-product-attention engines (Note [cuDNN attention]
// in attention_cudnn.cu). Declares no CUDA or cuDNN type, so tensor/ops/flash_attention.cpp may
// include it; it is compiled (attention_cudnn.cu) and called only in builds with CUDA.
#include <string>
#include <vector>

#include "tensor/ops/flash_attention.h"

namespace frugal::ops::cuda {

/// The additive mask ("bias") cuDNN's graphs add to the scaled scores (Note [cuDNN attention]):
/// the (Bm, Hm, L, S) dims (Bm in {1, B}, Hm in {1, H}) and element strides of a q-dtype tensor,
/// stride 0 over queries where the mask has one row for all; no dims without a mask.
struct CudnnBiasShape {
  std::vector<int64_t> dims, strides;
  bool present() const { return !dims.empty(); }
};

/// Whether cuDNN has execution plans for the forward with p's shapes and strides (q, k, v and
/// out in p.q_stride, p.k_stride, p.v_stride, p.o_stride) and the mask `bias` (none: no mask)
/// AND for the backward of the layout that forward implies (p.o_stride, p.out_stride,
/// p.dq_stride, p.dk_stride, p.dv_stride): the test that sends one call, both directions, to
/// cuDNN. Builds the plans on first use and remembers the answer, failures included, per
/// shape and layout. On false, `why` (if given) says what failed. p's mask fields are not read.
bool cudnn_attention_supported(DType dtype, Device device, const FlashAttentionParams& p, const CudnnBiasShape& bias,
                               std::string* why = nullptr);

/// Runs the forward on cuDNN: out (B, H, L, E) and lse (B, H, L) f32 from q, k, v, with the
/// strides in p, and `bias` (undefined: no mask; else 16-byte aligned, of the dims and strides
/// cudnn_attention_supported was given); then the rows the bias (and the causal mask) leave
/// without a key get zeros and lse = -inf. Returns false, having run nothing, when there is no
/// plan or no workspace for it.
bool cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const FlashAttentionParams& p, const Tensor& bias);

/// Runs the backward on cuDNN: dq, dk, dv from dout, q, k, v, out and lse (rows without keys:
/// -inf), with the strides in p and the forward's bias. Returns false, having run nothing, when
/// there is no plan or no workspace for it.
bool cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const FlashAttentionParams& p, const Tensor& bias);

}  // namespace frugal::ops::cuda
