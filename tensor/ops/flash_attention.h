#pragma once
// Fused attention that never materializes the (B, H, L, S) scores (the differentiable
// form is frugal::flash_attention in autograd/ops/flash_attention.h; scaled_dot_product_attention
// routes to it on CUDA, see Note [Attention paths] in nn/attention.cpp).
//
// Note [Flash attention]
// out = dropout(softmax(scale * q k^T + mask)) v, computed as FlashAttention-2 does (Dao 2023):
// a block of queries walks the keys tile by tile, keeping per row the running max m and sum
// l of exp(score - m) (the online softmax) and the output scaled to that max; a new tile
// with a larger max rescales both by exp(m_old - m_new). Only (B, H, L) f32 statistics
// leave the kernel: lse = m + log(l), the logsumexp of each row. The backward recomputes
// P = exp(scale * q k^T + mask - lse) tile by tile from q, k, v, out and lse, with
// D = rowsum(dout * out) (= rowsum(P * dP)) standing in for the softmax's row sums:
//   dv = P^T dout,  dP = dout v^T,  dS = P * (dP - D),  dq = scale dS k,  dk = scale dS^T q.
// So neither direction holds more than O(B H (L + S) E) memory. Masking is as in Note
// [Masked softmax]: a bool mask keeps where true, a floating one is added, is_causal keeps
// key s <= query l (top-left aligned), and a row with no key left gives zeros (lse = -inf).
// Our kernels' dropout keeps element (b, h, l, s) with the Philox word of its row-major index in the
// (B, H, L, S) weights (Note [Dropout mask from counters]): the very mask dropout() would
// draw on the materialized weights from the same Generator::Range, so the fused and the
// plain path agree bit for bit on which weights survive. Dropout applies to the weights
// after normalization (lse is that of the undropped softmax), as in torch.
// On CUDA, calls go to cuDNN's fused engines where it has plans for them, masks as an added
// bias (Note [cuDNN attention] in tensor/cuda/attention_cudnn.cu): the same out and lse. With
// dropout cuDNN draws its own mask from the same range (never stored; not dropout()'s), the
// range records that (Generator::Range::drawn_by), and the backward then runs on cuDNN too.
#include <optional>

#include "tensor/philox.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal::ops {

/// What the attention applies besides the product; the same for forward and backward.
struct FlashAttentionOptions {
  Tensor mask;                  ///< undefined, bool (true = attend) or q's dtype (added); broadcasts to (B, H, L, S)
  bool is_causal = false;       ///< keep key s <= query l
  std::optional<double> scale;  ///< default 1 / sqrt(E)
  double dropout_p = 0.0;       ///< in [0, 1)
};

/// Forward result: the output, the row statistics the backward needs, and the dropout range.
struct FlashAttentionForward {
  Tensor out;              ///< (B, H, L, E), q's dtype, in q's memory order (Note [Flash attention layouts])
  Tensor lse;              ///< (B, H, L) float32 (float64 for float64 q): logsumexp of each row
  Generator::Range range;  ///< Philox counters of the dropout mask and who drew it ({0, 0} without dropout)
};

/// Input gradients of flash_attention_forward.
struct FlashAttentionGrads {
  Tensor dq, dk, dv;  ///< q's, k's and v's shapes and memory order, q's dtype (Note [Flash attention layouts])
};

// Note [Flash attention layouts]
// Attention's inputs are usually views of a projection laid out (B, T, H, E) in memory
// (sequence-major: heads inside a token), e.g. chunk(linear(x), 3, -1) + split_heads in
// nn/attention.cpp. Results follow that order so that undoing the head split costs no copy:
// - out is allocated (B, L, H, E).transpose(1, 2) when q is sequence-major (q.stride(2) >
//   q.stride(1)), so heads.transpose(1, 2).reshape({B, L, H * E}) before out_proj is a view;
// - dq, dk, dv take their input's order; when q, k, v are exactly chunk(x, 3, -1) of one
//   (B, T, 3 H E) buffer split into heads, they are views of ONE (B, T, 3, H, E) buffer with
//   q, k, v's strides, so the split's backward finds them adjacent and joins them without a
//   cat (SplitBackward in autograd/ops/join.cpp). This is what PyTorch does too.
// The kernels read and write every operand through its strides (the last dim contiguous).

/// Attention of q (B, H, L, E) over k (B, H, S, E), v (B, H, S, E) (see Note [Flash attention]).
/// float32/float64/float16/bfloat16 on the CPU; float16/bfloat16 with E <= 128, E % 8 == 0 on
/// CUDA, where calls run cuDNN's fused engines when they can
/// (attention_backend_for, Note [cuDNN attention]). With dropout it draws (B H L S + 3) / 4
/// counters from `gen` (default generator).
FlashAttentionForward flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const FlashAttentionOptions& options, Generator* gen = nullptr);

/// Gradients of flash_attention_forward given dout (B, H, L, E), from its inputs, out and
/// lse; `range` is the forward's dropout range. A mask cuDNN drew (range.drawn_by) is drawn
/// again on cuDNN whatever the backend setting; where cuDNN cannot run, that is an error.
FlashAttentionGrads flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse, const FlashAttentionOptions& options,
                                             Generator::Range range);

/// Whether the fused kernels take these inputs on their device (a CUDA device, f16/bf16,
/// 4-D q/k/v of one batch and head count, E == Ev, E % 8 == 0, E <= 128, a bool or
/// q-dtype mask that broadcasts to (B, H, L, S)). The CPU kernels take every valid input.
bool flash_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);

/// Which kernels run fused attention on CUDA (Note [cuDNN attention] in tensor/cuda/attention_cudnn.cu).
/// CPU tensors, masks that broadcast over the keys and shapes cuDNN has no plan for always run
/// frugal's own kernels.
enum class AttentionBackend {
  Auto,   ///< cuDNN's fused engines where they take the call, frugal's own kernels otherwise
  Cudnn,  ///< as Auto, but a CUDA call that cuDNN cannot take is an error
  Flash,  ///< frugal's own kernels (Note [Flash attention]) for every call
};

/// Sets the attention backend of every thread. Until set, it is what the environment
/// variable FRUGAL_ATTENTION says (auto, cudnn or flash; auto when unset).
void set_attention_backend(AttentionBackend backend);
/// The current setting of set_attention_backend (or FRUGAL_ATTENTION).
AttentionBackend attention_backend();
/// "auto", "cudnn" or "flash".
const char* attention_backend_name(AttentionBackend backend);
/// Which kernels flash_attention_forward (and the backward that follows it) would run for
/// these inputs under the current setting: Cudnn or Flash, never Auto. Builds (and caches)
/// cuDNN's plans for the shape if need be; throws where flash_attention_forward would.
AttentionBackend attention_backend_for(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const FlashAttentionOptions& options);

/// Sets the attention backend for a scope and restores the previous one at its end.
class AttentionBackendGuard {
 public:
  explicit AttentionBackendGuard(AttentionBackend backend) : previous_(attention_backend()) {
    set_attention_backend(backend);
  }
  ~AttentionBackendGuard() { set_attention_backend(previous_); }
  AttentionBackendGuard(const AttentionBackendGuard&) = delete;
  AttentionBackendGuard& operator=(const AttentionBackendGuard&) = delete;

 private:
  AttentionBackend previous_;
};

/// How the kernels see their operands: sizes, element strides of the (batch, head, seq)
/// dims (the last dim is contiguous), and the mask's broadcast strides over (B, H, L, S).
struct FlashAttentionParams {
  int64_t B = 0, H = 0, L = 0, S = 0, E = 0;
  int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {};
  int64_t o_stride[3] = {};                                         // out (forward) or dout (backward)
  int64_t out_stride[3] = {};                                       // out (backward)
  int64_t dq_stride[3] = {}, dk_stride[3] = {}, dv_stride[3] = {};  // backward's results
  int mask_kind = 0;                                                // 0: none, 1: bool, 2: added (q's dtype)
  int64_t mask_stride[4] = {};                                      // 0 where the mask broadcasts
  bool causal = false;
  double scale = 1.0;
  double dropout_p = 0.0;
  Generator::Range range{0, 0};
};

/// Whether dropout keeps weight `index` (row-major in (B, H, L, S)) of the range: the word
/// dropout() would use for element `index` (Note [Dropout mask from counters]).
FRUGAL_HD bool flash_dropout_keep(Generator::Range range, uint64_t index, float keep_below) {
  const PhiloxResult r = philox4x32(range.seed, philox_first_counter(range.counter, range.base) + index / 4);
  return philox_uniform(r.x[index % 4]) < keep_below;
}

}  // namespace frugal::ops

// Backend kernels. lse is fresh contiguous; out, dq, dk, dv fresh with the strides in params
// (Note [Flash attention layouts]); q, k, v, dout views with the strides in params; every
// operand has a contiguous last dim; mask a (B, H, L, S) broadcast view or undefined; B H L S E > 0.
namespace frugal::ops::cpu {
/// q: (B, H, L, E); k, v: (B, H, S, E); out: (B, H, L, E); lse: (B, H, L) f32 (f64 for f64)
void flash_attention_forward_kernel(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& mask, const FlashAttentionParams& params);
/// dq, dout, out: (B, H, L, E); dk, dv, k, v: (B, H, S, E); lse: (B, H, L) f32 (f64 for f64)
void flash_attention_backward_kernel(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& mask, const FlashAttentionParams& params);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void flash_attention_forward_kernel(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& mask, const FlashAttentionParams& params);
void flash_attention_backward_kernel(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& mask, const FlashAttentionParams& params);
}  // namespace frugal::ops::cuda
