#pragma once
// Differentiable functional ops for nn layers (torch.nn.functional): layer_norm,
// dropout, cross_entropy, mse_loss, masked_softmax, scaled_dot_product_attention.
// Same semantics as the raw ops in tensor/ops/{norm,dropout,loss,masked_softmax}.h.
// Definitions: autograd/ops/norm.cpp, dropout.cpp, loss.cpp, attention.cpp.
#include <optional>

#include "tensor/ops/loss.h"  // Reduction, CrossEntropyOptions
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.layer_norm over the trailing `normalized_shape` dims; weight and bias
/// (of normalized_shape) may be undefined. Saves x, weight and the per-row mean and rstd.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

/// torch.nn.functional.dropout: zeroes each element with probability p and scales the rest
/// by 1 / (1 - p). Identity (x itself) when !training or p == 0. The backward re-creates
/// the mask from the saved Philox range, so no mask is stored (Note [Dropout mask from counters]).
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

/// torch.nn.functional.cross_entropy with class-index targets (int64/int32): logits (N, C),
/// (C) or (N, C, d1, ...); see Note [Fused cross entropy]. Differentiable in the logits.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

/// torch.nn.functional.mse_loss: mean (or sum, or none) of (input - target)^2; input and
/// target broadcast; differentiable in both.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

/// softmax(scale * scores + mask) along the last dim (Note [Masked softmax]); mask: undefined,
/// bool (true = attend) or of scores' dtype (added, differentiable); is_causal keeps keys s <= l.
Tensor masked_softmax(const Tensor& scores, const Tensor& mask = Tensor(), bool is_causal = false, double scale = 1.0);

/// torch.nn.functional.scaled_dot_product_attention: q (..., L, E), k (..., S, E),
/// v (..., S, Ev) -> (..., L, Ev) = dropout(masked_softmax(q k^T, mask, is_causal, scale)) v,
/// scale defaulting to 1 / sqrt(E). attn_mask: bool (true = attend) or added float,
/// broadcastable to (..., L, S); not together with is_causal. Dropout on the attention
/// weights always applies when dropout_p > 0, as in PyTorch (pass 0 in eval); it draws from
/// `gen` (default: the process generator).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), bool is_causal = false, double dropout_p = 0.0,
                                    std::optional<double> scale = {}, Generator* gen = nullptr);

/// Fused attention (Note [Flash attention]): q (B, H, L, E), k, v (B, H, S, E) -> (B, H, L, E),
/// the value of scaled_dot_product_attention without the (B, H, L, S) weights in memory; saves
/// q, k, v, out and the (B, H, L) logsumexp for backward. attn_mask (bool or q's dtype,
/// broadcastable to (B, H, L, S)) gets no gradient, and may come with is_causal. Any device;
/// CUDA takes f16/bf16 with E % 8 == 0, E <= 128 (ops::flash_attention_fused). dropout_p < 1.
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = Tensor(),
                       bool is_causal = false, double dropout_p = 0.0, std::optional<double> scale = {},
                       Generator* gen = nullptr);

}  // namespace frugal
