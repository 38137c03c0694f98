#pragma once
// Differentiable fused attention (Note [Flash attention]). Same semantics as the raw ops in
// tensor/ops/flash_attention.h.
#include <optional>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal {

/// Fused attention (Note [Flash attention]): q (B, H, L, E), k, v (B, H, S, E) -> (B, H, L, E),
/// the value of scaled_dot_product_attention without the (B, H, L, S) weights in memory; saves
/// q, k, v, out and the (B, H, L) logsumexp for backward. attn_mask (bool or q's dtype,
/// broadcastable to (B, H, L, S)) gets no gradient, and may come with is_causal. Any device;
/// CUDA takes f16/bf16 with E % 8 == 0, E <= 128 (ops::flash_attention_fused). dropout_p < 1.
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = Tensor(),
                       bool is_causal = false, double dropout_p = 0.0, std::optional<double> scale = {},
                       Generator* gen = nullptr);

}  // namespace frugal
