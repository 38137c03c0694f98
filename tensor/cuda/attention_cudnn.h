#pragma once
// Attention through cuDNN's fused scaled-dot-product-attention engines (Note [cuDNN attention]
// in attention_cudnn.cu). Declares no CUDA or cuDNN type, so tensor/ops/flash_attention.cpp may
// include it; it is compiled (attention_cudnn.cu) and called only in builds with CUDA.
#include <string>

#include "tensor/ops/flash_attention.h"

namespace frugal::ops::cuda {

/// A mask as cuDNN's graphs take it (Note [cuDNN attention]); undefined tensors: no mask.
struct CudnnAttentionMask {
  Tensor
      bias;  ///< added to the scaled scores: (Bm, Hm, L, S) in q's dtype, Bm in {1, B}, Hm in {1, H}, 16-byte aligned
  Tensor no_key;  ///< (Bm, Hm, Lm, 1) bool broadcasting to (B, H, L, 1): rows whose every key the bias masks (-inf)
};

/// Whether cuDNN has execution plans for the forward with p's shapes and strides (q, k, v and
/// out in p.q_stride, p.k_stride, p.v_stride, p.o_stride) and the mask `bias` (undefined:
/// none) AND for the backward of the layout that forward implies (p.o_stride, p.out_stride,
/// p.dq_stride, p.dk_stride, p.dv_stride): the test that sends one call, both directions, to
/// cuDNN. Builds the plans on first use and remembers the answer, failures included, per
/// shape and layout. On false, `why` (if given) says what failed. p's mask fields are not read.
bool cudnn_attention_supported(DType dtype, Device device, const FlashAttentionParams& p, const Tensor& bias,
                               std::string* why = nullptr);

/// Runs the forward on cuDNN: out (B, H, L, E) and lse (B, H, L) f32 from q, k, v, with the
/// strides in p, then gives the mask's rows without keys zeros and lse = -inf. Returns false,
/// having run nothing, when there is no plan or no workspace for it.
bool cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const FlashAttentionParams& p, const CudnnAttentionMask& mask);

/// Runs the backward on cuDNN: dq, dk, dv from dout, q, k, v, out and lse (rows without keys:
/// -inf), with the strides in p and the forward's bias. Returns false, having run nothing, when
/// there is no plan or no workspace for it.
bool cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const FlashAttentionParams& p, const Tensor& bias);

}  // namespace frugal::ops::cuda
