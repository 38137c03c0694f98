#pragma once
// MultiheadAttention: torch.nn.MultiheadAttention's semantics and parameter names, so a
// torch state_dict ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")
// loads as it is. Built from the differentiable ops: linear, chunk, views, and
// scaled_dot_product_attention (see Note [Attention paths] in nn/attention.cpp).
#include <memory>
#include <optional>

#include "nn/linear.h"
#include "nn/module.h"

namespace frugal::nn {

/// x: (B, T, H * D) -> (B, H, T, D), a view: the layout the attention ops take.
Tensor split_heads(const Tensor& x, int64_t heads);
/// ctx: (B, H, T, D) -> (B, T, H * D), split_heads undone (a copy: the heads interleave).
Tensor merge_heads(const Tensor& ctx);

struct MultiheadAttentionOptions {
  /// Dropout on the attention weights, in training mode only.
  double dropout = 0.0;
  /// in_proj_bias and out_proj.bias (both start at zero, as torch).
  bool bias = true;
  /// Inputs and output are (B, L, E) when true, (L, B, E) when false. torch defaults to
  /// false; frugal defaults to true because every layer and model here is batch-first
  /// (B, T, C) and so is torch's own fast path. It changes no parameter, so checkpoints
  /// load either way.
  bool batch_first = true;
  /// Feature sizes of key and value (default embed_dim). When either differs from
  /// embed_dim the projections are separate: q_proj_weight (E, E), k_proj_weight
  /// (E, kdim), v_proj_weight (E, vdim) replace in_proj_weight, as in torch.
  std::optional<int64_t> kdim{}, vdim{};
};

/// What MultiheadAttention::forward returns. weights is undefined unless need_weights:
/// (B, L, S) averaged over heads, or (B, H, L, S) per head ((L, S) / (H, L, S) for
/// unbatched inputs), whatever batch_first says (as torch).
struct AttentionOutput {
  Tensor output;
  Tensor weights;
};

// Members without a default spelled out get `{}`, so designated initializers such as
// {.need_weights = true} compile without -Wmissing-field-initializers (GCC 12).
struct AttentionForwardOptions {
  /// (B, S), or (S) for unbatched inputs: bool, true = ignore that key (torch's
  /// convention), or floating, added to the scores.
  Tensor key_padding_mask{};
  /// (L, S) or (B*H, L, S) ((H, L, S) unbatched): bool, true = NOT allowed to attend
  /// (torch's convention for nn.MultiheadAttention, the opposite of
  /// scaled_dot_product_attention's bool mask), or floating, added to the scores (float
  /// masks are converted to the scores' dtype and are differentiable).
  Tensor attn_mask{};
  /// Also return the attention weights (off by default, unlike torch: they cost a
  /// (B, H, L, S) tensor that the fused path never makes).
  bool need_weights = false;
  /// Average the returned weights over the heads.
  bool average_attn_weights = true;
  /// Query l attends only to keys s <= l. Unlike torch, where it is a hint that attn_mask
  /// is causal and attn_mask is required, here it applies the causal mask itself, alone or
  /// on top of attn_mask and key_padding_mask (the same result when torch's hint is right).
  bool is_causal = false;
};

/// Multi-head attention (Vaswani et al.): output = out_proj(concat_h softmax(q_h k_h^T /
/// sqrt(D) + mask) v_h), with q, k, v the input projections split into H heads of
/// D = embed_dim / H. Masked-out keys get weight 0; a query whose every key is masked
/// gets all-zero weights (torch's math attention path returns the same through its
/// _safe_softmax; its need_weights path returns NaN there). Initialised as torch:
/// xavier_uniform_ on the input projection weights, zeros on the biases, out_proj.weight
/// as nn.Linear.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options = {});

  /// query (B, L, E), key (B, S, kdim), value (B, S, vdim) -> output (B, L, E) (batch_first;
  /// (L, B, .) otherwise; or unbatched (L, E), (S, kdim), (S, vdim) -> (L, E)). Passing the
  /// same tensor as query, key and value takes the fused self-attention path.
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                          const AttentionForwardOptions& options = {});
  AttentionOutput operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                             const AttentionForwardOptions& options = {}) {
    core::ModuleScope scope(this);  // for the memory profiler, as UnaryModule::operator()
    return forward(query, key, value, options);
  }

  std::string type_name() const override { return "MultiheadAttention"; }
  std::string extra_repr() const override;

  Tensor in_proj_weight;                               // (3E, E); undefined with kdim/vdim != E
  Tensor q_proj_weight, k_proj_weight, v_proj_weight;  // (E, E), (E, kdim), (E, vdim); only then
  Tensor in_proj_bias;                                 // (3E): q, k, v biases; undefined without bias
  std::shared_ptr<Linear> out_proj;                    // E -> E

  const int64_t embed_dim, num_heads, head_dim, kdim, vdim;
  const double dropout_p;
  const bool batch_first;
};

}  // namespace frugal::nn
