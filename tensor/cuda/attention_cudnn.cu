// Attention through cuDNN's fused scaled-dot-product-attention engines, built with the graph
// (backend) API as tensor/cuda/conv_graph.cu builds convolutions.
//
// Note [cuDNN attention]
// cuDNN's fused flash-attention engines recognise an operation graph of ordinary matmul,
// pointwise and reduction nodes: the "composite" SDPA of cudnn-frontend's
// scaled_dot_product_flash_attention.h. (The dedicated CUDNN_BACKEND_OPERATION_SDPA_FWD
// descriptor, from 9.13.1, takes in 9.14 neither a causal mask (9.21) nor has the frontend a
// backward built on it; the frontend picks it only for an unmasked forward. The composite graph
// serves every case here, both directions, with or without the causal mask.) The graphs below
// are node for node the frontend's (v1.15, the release of cuDNN 9.14), with float32
// intermediates (virtual tensors) and fp16/bf16 operands:
//   forward   S = q k^T (k passed as k^T: its (B, H, E, S) dims with the last two strides swapped)
//             S = S * scale                      (a by-value float scalar)
//             causal: S = select(row >= col, S, -inf)   (GEN_INDEX on axes 2 and 3, CMP_GE,
//                                                         BINARY_SELECT; top-left aligned)
//             m = max_s S, e = exp(S - m), z = sum_s e, Stats = m + log z, P = e / z  (P in q's dtype)
//             out = P v
//   backward Dsum = (sum_e dout * out) * 1       (a float (B, H, L, 1) tensor we allocate)
//             P = exp(scale q k^T - Stats)      (causal: -inf above the diagonal before exp)
//             dv = P^T dout,  dS = (dout v^T - Dsum) * P * scale,  dk = dS^T q,
//             dq = dS k, accumulated in a float (B, H, L, E) tensor we allocate, then cast
// Stats is the logsumexp of each scaled row, exactly the lse of Note [Flash attention], so the
// forward result (out, lse) is the same whichever backend made it, and FlashAttentionForward
// does not change. The operands keep their strides (Note [Flash attention layouts]): cuDNN
// reads the sequence-major views and writes the packed-qkv gradients in place.
//
// Dropout: cuDNN draws the keep mask itself, with its RNG node (Bernoulli, keep probability
// 1 - p, part of the graph) from the call's Generator::Range: seed = the range's seed, offset =
// its first counter, int64 device words a one-thread kernel writes so that a CUDA graph replay
// reads its own base (Note [Graph-safe random numbers]). The mask is never in memory; the
// backward draws it again from the same words. As in cudnn-frontend's graphs, with c = 1 / (1 - p):
//   forward   P' = P * mask * c in place of P before P' v
//   backward  dv = P'^T dout, dS = ((dout v^T) * mask - Dsum * (1 - p)) * P * c * scale
// cuDNN's Philox stream is not Note [Dropout mask from counters]'s, so this mask is not the one
// dropout() or our kernels draw from the same range: the range says who drew it (drawn_by =
// Generator::kCudnnRng) and flash_attention_backward then runs cuDNN's backward whatever the
// backend setting, or fails; never our kernels with another mask. An earlier version handed
// cuDNN dropout()'s own mask as a (B, H, L, S) tensor in q's dtype ("custom dropout mask"),
// drawn before each direction: the same numbers on every backend, but 100 MB written and read
// twice per layer at BERT's b16 x 512 (about 1.2 of 26.7 ms a step on the H200), and it needed
// the mask to hold 1 / (1 - p) (0/1 with Dsum scaled by 1 - p gave wrong dq and dk there).
// Masks: cuDNN adds a bias to the scaled scores (before the causal mask, as cudnn-frontend's
// `bias`), in q's dtype, (Bm, Hm, L, S) with Bm in {1, B}, Hm in {1, H} (broadcast by the
// graph) and stride 0 over the queries where the mask has one row for all (a key padding mask
// (B, 1, 1, S) reads B S values), its rows 16 bytes apart. A bool mask becomes 0 where it
// keeps and -inf where it masks; an additive one in q's dtype is used as it is when so laid
// out (CudnnBias in tensor/ops/flash_attention.cpp, laid out before any allocation, so a call
// that ends on our kernels builds no bias). A mask that broadcasts over the keys stays on our
// kernels. A row whose every key is masked (by the bias, or by the bias and the causal mask
// together: left padding) has max = -inf, so cuDNN computes -inf - -inf = NaN there, where ours
// give zeros and lse = -inf. Which rows those are follows from the bias and is_causal alone,
// without a sync: after the forward, one thread per (b, h, l) row scans its bias row (keys
// s <= l when causal) up to the first that is not -inf, and only a row without one writes zeros
// and -inf (clear_keyless_rows_kernel; for a padding mask it reads one value per row). The
// backward gets lse with -inf turned into +inf: exp(score - lse) is then 0 for every key of
// such a row (-inf - +inf = -inf, finite - +inf = -inf), so the row adds nothing to dk, dv and gets
// dq = 0, as on our kernels. Masks need cuDNN 9.10 (-inf scores; see masked_score()).
// What stays on frugal's own kernels (tensor/cuda/flash_attention.cu), decided before either
// direction runs, from the inputs and options alone (ops::attention_backend_for):
// - masks that broadcast over the keys (a (.., L, 1) mask);
// - anything without a plan: each (device, dtype, direction, shape, causal, strides) problem
//   builds its graph once; the plans, or the failure and its reason, are remembered, so a
//   shape cuDNN refuses costs one attempt, not one per step. A call uses cuDNN only when the
//   forward AND the backward of the layout it implies (dout in out's order, the gradients in
//   the inputs' order) have plans, so one call does not mix backends. Without dropout, a
//   backward whose dout arrives in another layout looks up its own plan and, lacking one, runs
//   our backward: it reads the same out and lse, so the gradients are the same either way.
//   With dropout nothing may switch backends once cuDNN drew the mask: the backward copies dout
//   into out's layout instead, and a forward or backward that cuDNN then cannot run (no
//   workspace, an execution it refused) is an error, not our kernels with another mask (a
//   checkpoint's recompute could otherwise draw another mask than the forward it replays).
// The scale is a by-value operand, so it is not part of the key; the dropout probability is
// part of the graph (the RNG node's), so each distinct p builds graphs of its own (a schedule
// of many values would build many: keep p to a few values). Plans come from cuDNN's
// heuristics (mode A, then the fallback list): the first kMaxPlans that finalize, in that order
// (one, as cudnn-frontend's default policy and PyTorch: finalizing a fused engine's plan may
// compile it at run time, which costs far more than the spares would ever save); a call runs
// the first whose workspace the arena can provide, and our kernels when none (without
// dropout; with it, an error, as above). Two workarounds
// come from cudnn-frontend too: its backward refuses L = S = 1, and for cuDNN <= 9.15 it masks
// the backward's scores with a padding mask of the full lengths (per-batch int32 L and S, also
// given to every product as its size overrides) whenever a length is not a multiple of 128
// (197, 77, ...).
#include "tensor/cuda/attention_cudnn.h"

#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda/conv_graph.h"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/cudnn_backend.h"
#include "tensor/cuda/cudnn_graph.h"
#include "tensor/cuda/cudnn_handle.h"
#include "tensor/factory.h"
#include "tensor/philox.h"

namespace frugal::ops::cuda {

namespace {

constexpr size_t kMaxPlans = 1;  // plans finalized per problem (see the Note)

/// The non-virtual operands' ids in a variant pack; virtual tensors count from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kDO,
  kDQ,
  kDK,
  kDV,
  kOne,
  kSoftmaxSum,
  kDQAccum,
  kSeqLenQ,
  kSeqLenKV,
  kDropoutSeed,
  kDropoutOffset,
  kDropoutScale,
  kBias,
  kFirstVirtual = 100,
};

enum class Direction { Forward, Backward };

using Dims = GraphDims;
constexpr cudnnDataType_t kF32 = kGraphF32;

/// Strides of a (B, H, N, E) operand as cuDNN gets them: a size-1 dim never addresses anything,
/// so its stride is made the packed one of the dims inside it (a regular layout, one key).
Dims operand_strides(const int64_t (&s)[3], int64_t B, int64_t H, int64_t N, int64_t E) {
  Dims st{s[0], s[1], s[2], 1};
  const Dims dims{B, H, N, E};
  for (int d = 2; d >= 0; --d)
    if (dims[size_t(d)] == 1) st[size_t(d)] = st[size_t(d) + 1] * dims[size_t(d) + 1];
  return st;
}

/// (B, H, N, E) strides as those of the transpose (B, H, E, N).
Dims transposed(Dims st) {
  std::swap(st[2], st[3]);
  return st;
}

using BiasShape = CudnnBiasShape;

/// The shape of a bias tensor (undefined: none) as the graphs declare it.
BiasShape shape_of(const Tensor& bias) {
  BiasShape b;
  if (!bias.defined()) return b;
  b.dims.assign(bias.sizes().begin(), bias.sizes().end());
  b.strides.assign(bias.strides().begin(), bias.strides().end());
  return b;
}

/// Scores plus the additive mask (Note [cuDNN attention]), where there is one.
cudnnBackendDescriptor_t with_bias(GraphBuilder& g, cudnnBackendDescriptor_t x, const Dims& dims, const Dims& strides,
                                   const BiasShape& bias) {
  if (!bias.present()) return x;
  cudnnBackendDescriptor_t y = g.virtual_tensor(dims, strides);
  g.pointwise(CUDNN_POINTWISE_ADD, x, g.tensor(kBias, bias.dims, bias.strides, g.io()), y);
  return y;
}

/// Scores with the causal mask applied: select(row >= col, x, -inf), top-left aligned.
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, cudnnBackendDescriptor_t x, const Dims& dims,
                                     const Dims& strides) {
  cudnnBackendDescriptor_t row = g.virtual_tensor(dims, strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, row, kF32, nullptr, 2);
  cudnnBackendDescriptor_t col = g.virtual_tensor(dims, strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, col, kF32, nullptr, 3);
  cudnnBackendDescriptor_t keep = g.virtual_tensor(dims, strides, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);
  cudnnBackendDescriptor_t y = g.virtual_tensor(dims, strides);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, g.scalar(kNegInf), y, kF32, keep);
  return y;
}

/// Scores with cudnn-frontend's padding mask: select(row < seq_len_q && col < seq_len_kv, x, -inf).
cudnnBackendDescriptor_t padding_mask(GraphBuilder& g, cudnnBackendDescriptor_t x, const Dims& dims,
                                      const Dims& strides, cudnnBackendDescriptor_t seq_len_q,
                                      cudnnBackendDescriptor_t seq_len_kv) {
  cudnnBackendDescriptor_t row = g.virtual_tensor(dims, strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, row, CUDNN_DATA_INT32, nullptr, 2);
  cudnnBackendDescriptor_t col = g.virtual_tensor(dims, strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, col, CUDNN_DATA_INT32, nullptr, 3);
  cudnnBackendDescriptor_t row_in = g.virtual_tensor(dims, strides, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, row, seq_len_q, row_in, CUDNN_DATA_BOOLEAN);
  cudnnBackendDescriptor_t col_in = g.virtual_tensor(dims, strides, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, col, seq_len_kv, col_in, CUDNN_DATA_BOOLEAN);
  cudnnBackendDescriptor_t keep = g.virtual_tensor(dims, strides, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, row_in, col_in, keep, CUDNN_DATA_BOOLEAN);
  cudnnBackendDescriptor_t y = g.virtual_tensor(dims, strides);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, g.scalar(kNegInf), y, kF32, keep);
  return y;
}

/// The keep mask of p's dropout, drawn by cuDNN's RNG node from the call's seed and offset:
/// 1 where a weight is kept (probability 1 - p), 0 where it is dropped (see the Note).
cudnnBackendDescriptor_t keep_mask(GraphBuilder& g, const FlashAttentionParams& p, const Dims& dims,
                                   const Dims& strides) {
  const Dims one{1, 1, 1, 1};
  cudnnBackendDescriptor_t mask = g.virtual_tensor(dims, strides);
  g.bernoulli(mask, g.tensor(kDropoutSeed, one, one, CUDNN_DATA_INT64),
              g.tensor(kDropoutOffset, one, one, CUDNN_DATA_INT64), 1.0 - p.dropout_p);
  return mask;
}

/// Dropout with the given keep mask: x * mask * (1 / (1 - p)), the scale a by-value scalar, in `type`.
cudnnBackendDescriptor_t dropped(GraphBuilder& g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t mask,
                                 const Dims& dims, const Dims& strides, cudnnDataType_t type) {
  cudnnBackendDescriptor_t kept = g.virtual_tensor(dims, strides);
  g.pointwise(CUDNN_POINTWISE_MUL, x, mask, kept);
  cudnnBackendDescriptor_t y = g.virtual_tensor(dims, strides, type);
  g.pointwise(CUDNN_POINTWISE_MUL, kept, g.scalar(kDropoutScale), y);
  return y;
}

/// Whether the backward needs cudnn-frontend's workaround for cuDNN <= 9.15: a padding mask of
/// the full lengths (a no-op) when a length is not a multiple of 128, without which those
/// versions' backward engines are wrong (cudnn-frontend 1.15 and later set it up the same way).
bool needs_padding_workaround(const FlashAttentionParams& p) {
  return cudnnGetVersion() <= 91500 && (p.L % 128 != 0 || p.S % 128 != 0);
}

/// The forward graph of the Note: q, k, v -> out, Stats.
void build_forward(GraphBuilder& g, const FlashAttentionParams& p, const BiasShape& bias) {
  const int64_t B = p.B, H = p.H, L = p.L, S = p.S, E = p.E;
  const cudnnDataType_t io = g.io();
  const Dims scores{B, H, L, S}, scores_st{H * L * S, L * S, S, 1}, rows{B, H, L, 1}, rows_st{H * L, L, 1, 1};
  cudnnBackendDescriptor_t q = g.tensor(kQ, {B, H, L, E}, operand_strides(p.q_stride, B, H, L, E), io);
  cudnnBackendDescriptor_t kt = g.tensor(kK, {B, H, E, S}, transposed(operand_strides(p.k_stride, B, H, S, E)), io);
  cudnnBackendDescriptor_t v = g.tensor(kV, {B, H, S, E}, operand_strides(p.v_stride, B, H, S, E), io);
  cudnnBackendDescriptor_t o = g.tensor(kO, {B, H, L, E}, operand_strides(p.o_stride, B, H, L, E), io);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, rows, rows_st, kF32);

  cudnnBackendDescriptor_t s = g.virtual_tensor(scores, scores_st);
  g.matmul(q, kt, s);
  cudnnBackendDescriptor_t scaled = g.virtual_tensor(scores, scores_st);
  g.pointwise(CUDNN_POINTWISE_MUL, s, g.scalar(kScale), scaled);
  scaled = with_bias(g, scaled, scores, scores_st, bias);
  if (p.causal) scaled = causal_mask(g, scaled, scores, scores_st);
  cudnnBackendDescriptor_t max = g.virtual_tensor(rows, rows_st);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max);
  cudnnBackendDescriptor_t shifted = g.virtual_tensor(scores, scores_st);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, max, shifted);
  cudnnBackendDescriptor_t e = g.virtual_tensor(scores, scores_st);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  cudnnBackendDescriptor_t sum = g.virtual_tensor(rows, rows_st);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  cudnnBackendDescriptor_t log_sum = g.virtual_tensor(rows, rows_st);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, stats);
  const bool dropout = p.dropout_p > 0.0;
  cudnnBackendDescriptor_t probs = g.virtual_tensor(scores, scores_st, dropout ? kF32 : io);  // P v in q's dtype
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, probs);
  if (dropout) probs = dropped(g, probs, keep_mask(g, p, scores, scores_st), scores, scores_st, io);
  g.matmul(probs, v, o);
}

/// The backward graph of the Note: q, k, v, out, dout, Stats -> dq, dk, dv.
void build_backward(GraphBuilder& g, const FlashAttentionParams& p, const BiasShape& bias) {
  const int64_t B = p.B, H = p.H, L = p.L, S = p.S, E = p.E;
  const cudnnDataType_t io = g.io();
  const Dims scores{B, H, L, S}, scores_st{H * L * S, L * S, S, 1}, rows{B, H, L, 1}, rows_st{H * L, L, 1, 1};
  const Dims scores_t{B, H, S, L}, scores_t_st{H * L * S, L * S, 1, S};  // the same memory, transposed
  const Dims k_st = operand_strides(p.k_stride, B, H, S, E);
  cudnnBackendDescriptor_t q = g.tensor(kQ, {B, H, L, E}, operand_strides(p.q_stride, B, H, L, E), io);
  cudnnBackendDescriptor_t kt = g.tensor(kK, {B, H, E, S}, transposed(k_st), io);
  cudnnBackendDescriptor_t vt = g.tensor(kV, {B, H, E, S}, transposed(operand_strides(p.v_stride, B, H, S, E)), io);
  cudnnBackendDescriptor_t o = g.tensor(kO, {B, H, L, E}, operand_strides(p.out_stride, B, H, L, E), io);
  cudnnBackendDescriptor_t dout = g.tensor(kDO, {B, H, L, E}, operand_strides(p.o_stride, B, H, L, E), io);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, rows, rows_st, kF32);
  cudnnBackendDescriptor_t dq = g.tensor(kDQ, {B, H, L, E}, operand_strides(p.dq_stride, B, H, L, E), io);
  cudnnBackendDescriptor_t dk = g.tensor(kDK, {B, H, S, E}, operand_strides(p.dk_stride, B, H, S, E), io);
  cudnnBackendDescriptor_t dv = g.tensor(kDV, {B, H, S, E}, operand_strides(p.dv_stride, B, H, S, E), io);

  // Dsum = rowsum(dout * out) times kOne (1 without dropout): dS below is computed as
  // ((dP * mask) - Dsum kOne) * P * c, cudnn-frontend's order (see the Note).
  cudnnBackendDescriptor_t dout_out = g.virtual_tensor({B, H, L, E}, {H * L * E, L * E, H * E, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, dout_out);
  cudnnBackendDescriptor_t row_dot = g.virtual_tensor(rows, rows_st);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dout_out, row_dot);
  cudnnBackendDescriptor_t softmax_sum = g.tensor(kSoftmaxSum, rows, rows_st, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, row_dot, g.scalar(kOne), softmax_sum);

  // The padding workaround's per-batch lengths (all L and S), which every product then also gets
  // as its size overrides, as cudnn-frontend does once it has them.
  cudnnBackendDescriptor_t len_q = nullptr, len_kv = nullptr;
  if (needs_padding_workaround(p)) {
    len_q = g.tensor(kSeqLenQ, {B, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32);
    len_kv = g.tensor(kSeqLenKV, {B, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32);
  }

  // P = exp(scale q k^T - Stats), then dv = P^T dout.
  cudnnBackendDescriptor_t s = g.virtual_tensor(scores, scores_st);
  g.matmul(q, kt, s, len_q, len_kv);
  cudnnBackendDescriptor_t scaled = g.virtual_tensor(scores, scores_st);
  cudnnBackendDescriptor_t scale = g.scalar(kScale);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, scaled);
  scaled = with_bias(g, scaled, scores, scores_st, bias);
  if (len_q != nullptr) scaled = padding_mask(g, scaled, scores, scores_st, len_q, len_kv);
  cudnnBackendDescriptor_t shifted = g.virtual_tensor(scores, scores_st);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, shifted);
  if (len_q != nullptr && cudnnGetVersion() < 91000)  // cudnn-frontend's workaround for 9.0 - 9.9
    shifted = padding_mask(g, shifted, scores, scores_st, len_q, len_kv);
  if (p.causal) shifted = causal_mask(g, shifted, scores, scores_st);
  cudnnBackendDescriptor_t probs = g.virtual_tensor(scores, scores_st);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, probs);
  const bool dropout = p.dropout_p > 0.0;
  cudnnBackendDescriptor_t mask = dropout ? keep_mask(g, p, scores, scores_st) : nullptr;
  cudnnBackendDescriptor_t probs_dropped = dropout ? dropped(g, probs, mask, scores, scores_st, kF32) : probs;
  cudnnBackendDescriptor_t probs_t = g.virtual_tensor(scores_t, scores_t_st, io);
  g.reshape(probs_dropped, probs_t);
  g.matmul(probs_t, dout, dv, len_kv, nullptr, len_q);

  // dS = (dout v^T - Dsum) * P * scale, then dk = dS^T q.
  cudnnBackendDescriptor_t dp = g.virtual_tensor(scores, scores_st);
  g.matmul(dout, vt, dp, len_q, len_kv);
  if (dropout) {
    cudnnBackendDescriptor_t dp_kept = g.virtual_tensor(scores, scores_st);
    g.pointwise(CUDNN_POINTWISE_MUL, dp, mask, dp_kept);
    dp = dp_kept;
  }
  cudnnBackendDescriptor_t dp_centered = g.virtual_tensor(scores, scores_st);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centered);
  cudnnBackendDescriptor_t ds_unscaled = g.virtual_tensor(scores, scores_st);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, probs, ds_unscaled);
  if (dropout) {
    cudnnBackendDescriptor_t ds_kept = g.virtual_tensor(scores, scores_st);
    g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, g.scalar(kDropoutScale), ds_kept);
    ds_unscaled = ds_kept;
  }
  cudnnBackendDescriptor_t ds = g.virtual_tensor(scores, scores_st);
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);
  cudnnBackendDescriptor_t ds_t = g.virtual_tensor(scores_t, scores_t_st, io);
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, dk, len_kv, nullptr, len_q);

  // dq = dS k, accumulated in float32, then cast into dq.
  cudnnBackendDescriptor_t k = g.virtual_tensor({B, H, S, E}, k_st);
  g.reshape(kt, k);
  cudnnBackendDescriptor_t dq_accum = g.tensor(kDQAccum, {B, H, L, E}, {H * L * E, L * E, E, 1}, kF32);
  g.matmul(ds, k, dq_accum, len_q, nullptr, len_kv);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
}

/// One problem's graph and plans (best first), or, with no plan, why not.
struct PlanSet {
  std::unique_ptr<GraphBuilder> graph;  // the tensors and operations the plans refer to
  Descriptor op_graph;
  std::vector<Plan> plans;
  std::string what, why;  // the problem; without plans, why not
  // The padding workaround's (B) int32 lengths, filled once; like the plans, never freed.
  void* seq_len_q = nullptr;
  void* seq_len_kv = nullptr;
  // The status of an execution cuDNN refused (a plan that built but does not run): from then on
  // the problem counts as unplanned, so later calls go to our kernels without trying again.
  mutable std::atomic<int> refused{int(CUDNN_STATUS_SUCCESS)};

  bool usable() const { return !plans.empty() && refused.load(std::memory_order_relaxed) == CUDNN_STATUS_SUCCESS; }
  std::string reason() const {
    const int status = refused.load(std::memory_order_relaxed);
    if (status == CUDNN_STATUS_SUCCESS) return ::frugal::detail::str_cat(what, ": ", why);
    return ::frugal::detail::str_cat(what, ": cudnnBackendExecute refused its plan (",
                                     cudnnGetErrorString(cudnnStatus_t(status)), ")");
  }
};

cudnnDataType_t io_type(DType t) { return t == kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

std::string describe(Direction d, DType dtype, const FlashAttentionParams& p, const BiasShape& bias) {
  return ::frugal::detail::str_cat("cuDNN attention ", d == Direction::Forward ? "forward" : "backward", " (",
                                   dtype_name(dtype), ", B=", p.B, " H=", p.H, " L=", p.L, " S=", p.S, " E=", p.E,
                                   p.causal ? ", causal" : "",
                                   bias.present() ? ::frugal::detail::str_cat(", mask ", shape_str(bias.dims)) : "",
                                   p.dropout_p > 0.0 ? ::frugal::detail::str_cat(", dropout ", p.dropout_p) : "", ")");
}

/// Builds one problem's graph and plans (see the Note); a set without plans, and the reason,
/// when cuDNN refuses.
std::shared_ptr<const PlanSet> build_plans(cudnnHandle_t h, Direction d, DType dtype, const FlashAttentionParams& p,
                                           const BiasShape& bias) {
  auto set = std::make_shared<PlanSet>();
  set->what = describe(d, dtype, p, bias);
  if (cudnnGetVersion() < 90000) {
    set->why = ::frugal::detail::str_cat("needs cuDNN 9, found ", cudnnGetVersion());
    return set;
  }
  if (bias.present() && cudnnGetVersion() < 91000) {  // masked_score(): -inf scores only from 9.10
    set->why = ::frugal::detail::str_cat("a mask needs cuDNN 9.10, found ", cudnnGetVersion());
    return set;
  }
  if (d == Direction::Backward && p.L == 1 && p.S == 1) {  // as cudnn-frontend refuses it
    set->why = "cuDNN's backward does not take L = S = 1";
    return set;
  }
  try {
    auto graph = std::make_unique<GraphBuilder>(io_type(dtype), kFirstVirtual);
    if (d == Direction::Forward) build_forward(*graph, p, bias);
    else build_backward(*graph, p, bias);
    Descriptor op_graph = graph->finalize(h);
    std::vector<Plan> plans = make_plans(h, op_graph, kMaxPlans);
    if (plans.empty()) {
      set->why = ::frugal::detail::str_cat("no engine of cuDNN ", cudnnGetVersion(), " takes the graph");
      return set;
    }
    if (d == Direction::Backward && needs_padding_workaround(p)) {
      for (auto [ptr, n] : {std::pair{&set->seq_len_q, p.L}, std::pair{&set->seq_len_kv, p.S}}) {
        const std::vector<int32_t> lengths(size_t(p.B), int32_t(n));
        FRUGAL_CUDA_CHECK(cudaMalloc(ptr, lengths.size() * sizeof(int32_t)));
        FRUGAL_CUDA_CHECK(cudaMemcpy(*ptr, lengths.data(), lengths.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      }
    }
    set->graph = std::move(graph), set->op_graph = std::move(op_graph), set->plans = std::move(plans);
  } catch (const Error& e) {
    set->plans.clear();
    set->why = e.what();
  }
  return set;
}

using PlanKey = std::vector<int64_t>;

PlanKey make_key(Direction d, DType dtype, Device device, const FlashAttentionParams& p, const BiasShape& bias) {
  PlanKey key{device.index,
              int64_t(dtype),
              int64_t(d),
              p.B,
              p.H,
              p.L,
              p.S,
              p.E,
              int64_t(p.causal),
              std::bit_cast<int64_t>(p.dropout_p)};  // the RNG node's keep probability is part of the graph
  auto add = [&](const int64_t(&s)[3], int64_t N) {
    for (int64_t v : operand_strides(s, p.B, p.H, N, p.E)) key.push_back(v);
  };
  add(p.q_stride, p.L), add(p.k_stride, p.S), add(p.v_stride, p.S), add(p.o_stride, p.L);
  if (d == Direction::Backward) {
    add(p.out_stride, p.L), add(p.dq_stride, p.L), add(p.dk_stride, p.S), add(p.dv_stride, p.S);
  }
  key.push_back(int64_t(bias.dims.size()));
  key.insert(key.end(), bias.dims.begin(), bias.dims.end());
  key.insert(key.end(), bias.strides.begin(), bias.strides.end());
  return key;
}

/// The plans of one problem, built on first use (under a DeviceGuard for `device`).
std::shared_ptr<const PlanSet> plans_for(Direction d, DType dtype, Device device, const FlashAttentionParams& p,
                                         const BiasShape& bias) {
  const PlanKey key = make_key(d, dtype, device, p, bias);
  std::shared_ptr<const PlanSet> set = plan_cache<PlanKey, PlanSet>().lookup(key);
  if (set == nullptr) {
    set = build_plans(cudnn_handle(device), d, dtype, p, bias);
    plan_cache<PlanKey, PlanSet>().insert(key, set);
  }
  return set;
}

struct Operand {
  int64_t uid;
  void* ptr;
};

/// Runs the first plan of `set` whose workspace the arena provides, with the graph's operands
/// taken from `operands` by id; false, having run nothing, when none can run.
bool execute(const PlanSet& set, Device device, const std::vector<Operand>& operands) {
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  for (int64_t uid : set.graph->uids()) {
    auto it = std::find_if(operands.begin(), operands.end(), [&](const Operand& o) { return o.uid == uid; });
    FRUGAL_CHECK(it != operands.end(), "cuDNN attention: no operand for tensor id ", uid);
    uids.push_back(uid), pointers.push_back(it->ptr);
  }
  for (const Plan& plan : set.plans) {
    Tensor ws = try_workspace(plan.workspace, device);
    if (plan.workspace > 0 && !ws.defined()) continue;
    void* ws_ptr = ws.defined() ? ws.data() : nullptr;
    Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data())
        .set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws_ptr);
    pack.finalize();
    const cudnnStatus_t status = cudnnBackendExecute(cudnn_handle(device), plan.plan.get(), pack.get());
    if (status == CUDNN_STATUS_SUCCESS) return true;
    set.refused.store(int(status), std::memory_order_relaxed);
    return false;
  }
  return false;
}

/// The RNG node's seed and offset (see the Note) as int64 device words at [0] and [2] (each
/// 16-byte aligned), written on the device so that a CUDA graph replay reads its own base.
__global__ void dropout_seed_offset_kernel(int64_t* words, Generator::Range range) {
  words[0] = int64_t(range.seed);
  words[2] = int64_t(philox_first_counter(range.counter, range.base));
}

/// The graphs' dropout operands (see the Note): seed and offset, c (kDropoutScale) and kOne.
struct DropoutOperands {
  Tensor seed_offset;  // undefined without dropout
  float scale = 1.0f, dsum_scale = 1.0f;
  void* seed() const { return seed_offset.defined() ? seed_offset.data() : nullptr; }
  void* offset() const { return seed_offset.defined() ? static_cast<int64_t*>(seed_offset.data()) + 2 : nullptr; }
};

/// The dropout operands of p's range.
DropoutOperands dropout_operands(const FlashAttentionParams& p, Device device) {
  DropoutOperands d;
  if (p.dropout_p <= 0.0) return d;
  d.seed_offset = empty({4}, {kInt64, device});
  dropout_seed_offset_kernel<<<1, 1, 0, stream_for(device)>>>(static_cast<int64_t*>(d.seed_offset.data()), p.range);
  FRUGAL_CUDA_CHECK(cudaGetLastError());
  d.scale = float(1.0 / (1.0 - p.dropout_p));
  d.dsum_scale = float(1.0 - p.dropout_p);
  return d;
}

/// Whether every operand (undefined: none) starts 16-byte aligned, as the tensor descriptors declare.
bool aligned(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && reinterpret_cast<uintptr_t>(t->data()) % 16 != 0) return false;
  return true;
}

/// Rows the bias (16-bit, -inf where masked: all bits neg_inf; element strides bb, bh, bl, 0
/// where it broadcasts) and the causal mask leave without a key: cuDNN leaves NaN there; they get
/// what our kernels give, zeros and lse = -inf (see the Note). One thread per (b, h, l) row scans
/// the row's keys (s <= l when causal) up to the first kept one. out is float16/bfloat16, whose
/// zero is all bits clear either way.
__global__ void clear_keyless_rows_kernel(uint16_t* out, float* lse, const uint16_t* bias, uint16_t neg_inf, int64_t H,
                                          int64_t L, int64_t S, int64_t E, int64_t ob, int64_t oh, int64_t ol,
                                          int64_t bb, int64_t bh, int64_t bl, bool causal, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int64_t l = row % L, h = row / L % H, b = row / (L * H);
  const uint16_t* keys = bias + b * bb + h * bh + l * bl;
  const int64_t end = causal ? (l + 1 < S ? l + 1 : S) : S;
  for (int64_t s = 0; s < end; ++s)
    if (keys[s] != neg_inf) return;
  lse[row] = -INFINITY;
  uint16_t* o = out + b * ob + h * oh + l * ol;
  for (int64_t e = 0; e < E; ++e) o[e] = 0;
}

/// The backward's statistics: lse with -inf (a row without keys) made +inf, so that cuDNN's
/// exp(score - lse) is 0 for every key of that row instead of NaN (see the Note).
__global__ void keyless_lse_kernel(float* y, const float* lse, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = lse[i] == -INFINITY ? INFINITY : lse[i];
}

int blocks_for(int64_t n, int threads) { return int((n + threads - 1) / threads); }

/// -inf for masked scores; cuDNN before 9.10 wanted the lowest float instead (as cudnn-frontend).
float masked_score() {
  return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
}

}  // namespace

bool cudnn_attention_supported(DType dtype, Device device, const FlashAttentionParams& p, const BiasShape& bias,
                               std::string* why) {
  DeviceGuard guard(device);
  for (Direction d : {Direction::Forward, Direction::Backward}) {
    std::shared_ptr<const PlanSet> set = plans_for(d, dtype, device, p, bias);
    if (!set->usable()) {
      if (why != nullptr) *why = set->reason();
      return false;
    }
  }
  return true;
}

bool cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const FlashAttentionParams& p, const Tensor& bias) {
  if (!aligned({&out, &lse, &q, &k, &v, &bias})) return false;
  const Device device = q.device();
  DeviceGuard guard(device);
  std::shared_ptr<const PlanSet> set = plans_for(Direction::Forward, q.dtype(), device, p, shape_of(bias));
  if (!set->usable()) return false;
  const DropoutOperands drop = dropout_operands(p, device);
  float scale = float(p.scale), neg_inf = masked_score(), drop_scale = drop.scale;
  if (!execute(*set, device,
               {{kQ, q.data()},
                {kK, k.data()},
                {kV, v.data()},
                {kO, out.data()},
                {kStats, lse.data()},
                {kScale, &scale},
                {kNegInf, &neg_inf},
                {kBias, bias.defined() ? bias.data() : nullptr},
                {kDropoutSeed, drop.seed()},
                {kDropoutOffset, drop.offset()},
                {kDropoutScale, &drop_scale}}))
    return false;
  if (bias.defined()) {
    auto stride = [&](int d) { return bias.size(d) == 1 ? 0 : bias.stride(d); };  // Bm, Hm broadcast
    const uint16_t neg_inf = q.dtype() == kBFloat16 ? 0xFF80 : 0xFC00;
    const int64_t rows = p.B * p.H * p.L;
    clear_keyless_rows_kernel<<<blocks_for(rows, 256), 256, 0, stream_for(device)>>>(
        static_cast<uint16_t*>(out.data()), static_cast<float*>(lse.data()), static_cast<const uint16_t*>(bias.data()),
        neg_inf, p.H, p.L, p.S, p.E, p.o_stride[0], p.o_stride[1], p.o_stride[2], stride(0), stride(1), stride(2),
        p.causal, rows);
    FRUGAL_CUDA_CHECK(cudaGetLastError());
  }
  return true;
}

bool cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const FlashAttentionParams& p, const Tensor& bias) {
  if (!aligned({&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse, &bias})) return false;
  const Device device = q.device();
  DeviceGuard guard(device);
  std::shared_ptr<const PlanSet> set = plans_for(Direction::Backward, q.dtype(), device, p, shape_of(bias));
  if (!set->usable()) return false;
  Tensor stats = lse;
  if (bias.defined()) {  // rows without keys: -inf -> +inf (see keyless_lse_kernel)
    stats = empty(lse.sizes(), lse.options());
    keyless_lse_kernel<<<blocks_for(lse.numel(), 256), 256, 0, stream_for(device)>>>(
        static_cast<float*>(stats.data()), static_cast<const float*>(lse.data()), lse.numel());
    FRUGAL_CUDA_CHECK(cudaGetLastError());
  }
  // O(B H L E) float temporaries the graph names (as cudnn-frontend carves them from its
  // workspace): the rows' dout . out, and dq's accumulator, which cuDNN >= 9.6 zeroes itself.
  const Tensor softmax_sum = empty({p.B * p.H * p.L}, {kFloat32, device});
  const Tensor dq_accum = empty({p.B * p.H * p.L * p.E}, {kFloat32, device});
  if (cudnnGetVersion() < 90600)
    FRUGAL_CUDA_CHECK(
        cudaMemsetAsync(dq_accum.data(), 0, size_t(dq_accum.numel()) * sizeof(float), stream_for(device)));
  const DropoutOperands drop = dropout_operands(p, device);
  // `one` scales Dsum: 1 - p with dropout (see the Note), 1 without.
  float scale = float(p.scale), neg_inf = masked_score(), one = drop.dsum_scale, drop_scale = drop.scale;
  return execute(*set, device,
                 {{kQ, q.data()},
                  {kK, k.data()},
                  {kV, v.data()},
                  {kO, out.data()},
                  {kDO, dout.data()},
                  {kStats, stats.data()},
                  {kBias, bias.defined() ? bias.data() : nullptr},
                  {kDQ, dq.data()},
                  {kDK, dk.data()},
                  {kDV, dv.data()},
                  {kScale, &scale},
                  {kNegInf, &neg_inf},
                  {kOne, &one},
                  {kSoftmaxSum, softmax_sum.data()},
                  {kDQAccum, dq_accum.data()},
                  {kSeqLenQ, set->seq_len_q},
                  {kSeqLenKV, set->seq_len_kv},
                  {kDropoutSeed, drop.seed()},
                  {kDropoutOffset, drop.offset()},
                  {kDropoutScale, &drop_scale}});
}

}  // namespace frugal::ops::cuda
