#pragma once
// Differentiable attention (torch.nn.functional.scaled_dot_product_attention): flash_attention
// where the fused kernels apply, otherwise matmul, masked_softmax and dropout
// (Note [Attention paths] in nn/attention.cpp).
#include <optional>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.scaled_dot_product_attention: q (..., L, E), k (..., S, E),
/// v (..., S, Ev) -> (..., L, Ev) = dropout(masked_softmax(q k^T, mask, is_causal, scale)) v,
/// scale defaulting to 1 / sqrt(E). attn_mask: bool (true = attend) or added float,
/// broadcastable to (..., L, S); not together with is_causal. Dropout on the attention
/// weights always applies when dropout_p > 0, as in PyTorch (pass 0 in eval); it draws from
/// `gen` (default: the process generator).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), bool is_causal = false, double dropout_p = 0.0,
                                    std::optional<double> scale = {}, Generator* gen = nullptr);

}  // namespace frugal
