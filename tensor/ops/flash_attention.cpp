#include "tensor/ops/flash_attention.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#ifdef FRUGAL_WITH_CUDA
#include "tensor/cuda/attention_cudnn.h"
#endif

namespace frugal::ops {

namespace {

constexpr int64_t kMaxFusedE = 128;

/// Whether a mask broadcasts to (B, H, L, S).
bool mask_broadcasts(const Tensor& mask, const Shape& to) {
  if (mask.dim() > int64_t(to.size())) return false;
  for (int64_t d = 1; d <= mask.dim(); ++d)
    if (mask.size(-d) != 1 && mask.size(-d) != to[to.size() - size_t(d)]) return false;
  return true;
}

/// t with a contiguous last dim, and on CUDA rows the 16-byte copies can read (cp.async).
/// Otherwise a fresh copy: not contiguous(), which returns a contiguous view as it is,
/// however its storage offset aligns it (a view at offset 3 once faulted the kernels).
Tensor kernel_view(const Tensor& t) {
  bool ok = t.stride(-1) == 1 || t.size(-1) == 1;
  if (ok && t.device().is_cuda()) {
    const int64_t per16 = int64_t(16 / element_size(t.dtype()));
    ok = reinterpret_cast<uintptr_t>(t.data()) % 16 == 0 && t.stride(-1) == 1;
    for (int d = 0; d < 3; ++d) ok = ok && (t.stride(d) % per16 == 0 || t.size(d) == 1);
  }
  return ok ? t : t.clone();
}

/// float32 statistics, float64 for float64 inputs (gradcheck needs them exact).
DType lse_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

void strides_of(const Tensor& t, int64_t (&s)[3]) {
  for (int d = 0; d < 3; ++d) s[d] = t.stride(d);
}

/// Whether a (B, H, N, E) operand lays out heads inside a token: (B, N, H, E) in memory.
bool sequence_major(const Tensor& t) { return t.stride(2) > t.stride(1); }

/// A fresh tensor of t's sizes in t's memory order (Note [Flash attention layouts]).
Tensor empty_in_order_of(const Tensor& t) {
  if (!sequence_major(t)) return empty(t.sizes(), t.options());
  return empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options()).transpose(1, 2);
}

/// Whether q, k, v are exactly chunk(x, 3, -1) of one (B, T, 3 H E) tensor x split into
/// heads: one storage, equal sizes and strides, k and v H E elements after q and k, and
/// the strides of that split (those of dims of size 1 do not matter).
bool packed_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!q.shares_storage(k) || !q.shares_storage(v) || k.sizes() != q.sizes() || v.sizes() != q.sizes() ||
      k.strides() != q.strides() || v.strides() != q.strides())
    return false;
  const int64_t T = q.size(2), D = q.size(1) * q.size(3);
  const int64_t packed[4] = {T * 3 * D, q.size(3), 3 * D, 1};
  for (int d = 0; d < 4; ++d)
    if (q.size(d) != 1 && q.stride(d) != packed[d]) return false;
  return k.storage_offset() - q.storage_offset() == D && v.storage_offset() - k.storage_offset() == D;
}

/// Fresh gradients for q, k, v in their memory order: for packed q, k, v, views of one
/// (B, T, 3, H, E) buffer with exactly their strides (Note [Flash attention layouts]).
FlashAttentionGrads empty_grads(const Tensor& q, const Tensor& k, const Tensor& v) {
  FlashAttentionGrads g;
  if (packed_qkv(q, k, v)) {
    const Tensor buffer = empty({q.size(0), q.size(2), 3, q.size(1), q.size(3)}, q.options());
    const int64_t D = q.size(1) * q.size(3), at = buffer.storage_offset();
    g.dq = buffer.as_strided(q.sizes(), q.strides(), at);
    g.dk = buffer.as_strided(k.sizes(), k.strides(), at + D);
    g.dv = buffer.as_strided(v.sizes(), v.strides(), at + 2 * D);
    return g;
  }
  g.dq = empty_in_order_of(q), g.dk = empty_in_order_of(k), g.dv = empty_in_order_of(v);
  return g;
}

/// The strides empty_in_order_of(t) gives, without allocating.
void strides_in_order_of(const Tensor& t, int64_t (&s)[3]) {
  const int64_t H = t.size(1), N = t.size(2), E = t.size(3);
  if (sequence_major(t)) s[0] = N * H * E, s[1] = E, s[2] = H * E;
  else s[0] = H * N * E, s[1] = N * E, s[2] = E;
}

/// -1 until the first attention_backend() reads FRUGAL_ATTENTION.
std::atomic<int> g_attention_backend{-1};

AttentionBackend backend_from_environment() {
  const char* s = std::getenv("FRUGAL_ATTENTION");
  if (s == nullptr || *s == '\0' || std::strcmp(s, "auto") == 0) return AttentionBackend::Auto;
  if (std::strcmp(s, "cudnn") == 0) return AttentionBackend::Cudnn;
  if (std::strcmp(s, "flash") == 0) return AttentionBackend::Flash;
  FRUGAL_FAIL("FRUGAL_ATTENTION must be auto, cudnn or flash, got '", s, "'");
}

/// How a mask reaches cuDNN as the bias its graphs add to the scores (Note [cuDNN attention]):
/// (Bm, Hm, L, S) dims and element strides, stride 0 over queries where the mask has one row for
/// all. The mask is used as it is when it is in q's dtype, 16-byte aligned, its keys contiguous
/// and its other dims whole 16-byte rows apart in (b, h, l) order (size-1 dims get packed
/// strides: one layout, one plan); otherwise it is copied into a buffer whose rows start 16 bytes
/// apart, a bool mask as 0 where it keeps and -inf where it masks. Laid out without allocating,
/// so a call that does not go to cuDNN pays nothing; make() builds the tensor.
struct CudnnBias {
  std::vector<int64_t> dims, strides;
  Tensor mask4;  // the mask as 4-D
  Shape buffer;  // the copy's (Bm, Hm, Lm, padded S); empty: the mask is used as it is
  bool present() const { return !dims.empty(); }

  Tensor make(const Tensor& q) const {
    if (!present()) return Tensor();
    if (buffer.empty()) return mask4.as_strided(dims, strides, mask4.storage_offset());
    const Tensor buf = empty(buffer, q.options());
    const Tensor rows = buf.narrow(3, 0, mask4.size(3));
    if (mask4.dtype() == kBool) {
      fill_(rows, -INFINITY);
      masked_fill_(rows, mask4, 0.0);
    } else {
      copy_into(rows, mask4);
    }
    return buf.as_strided(dims, strides, buf.storage_offset());
  }
};

/// The bias layout of `mask` for q (see CudnnBias); none without a mask, off the GPU, under the
/// Flash setting (unless `any_backend`: the backward of cuDNN's dropout), or for a mask that
/// broadcasts over keys, which cuDNN does not take.
CudnnBias cudnn_bias(const Tensor& mask, const Tensor& q, const FlashAttentionParams& p, bool any_backend = false) {
  CudnnBias b;
  if (!mask.defined() || !q.device().is_cuda()) return b;
  if (!any_backend && attention_backend() == AttentionBackend::Flash) return b;
  Tensor m4 = mask;
  while (m4.dim() < 4) m4 = m4.unsqueeze(0);
  if (m4.size(3) != p.S) return b;
  const int64_t per16 = int64_t(16 / element_size(q.dtype()));
  bool as_is = m4.dtype() == q.dtype() && m4.stride(3) == 1 && reinterpret_cast<uintptr_t>(m4.data()) % 16 == 0;
  for (int64_t d = 2, inner = p.S; d >= 0; --d) {
    if (m4.size(d) == 1) continue;
    as_is = as_is && m4.stride(d) % per16 == 0 && m4.stride(d) >= inner;
    inner = m4.stride(d) * m4.size(d);
  }
  std::array<int64_t, 4> st{};
  if (as_is) {
    for (int d = 0; d < 4; ++d) st[size_t(d)] = m4.stride(d);
    for (int d = 2; d >= 0; --d)
      if (m4.size(d) == 1) st[size_t(d)] = st[size_t(d) + 1] * m4.size(d + 1);
  } else {
    const int64_t padded = (p.S + per16 - 1) / per16 * per16;
    b.buffer = {m4.size(0), m4.size(1), m4.size(2), padded};
    st = {m4.size(1) * m4.size(2) * padded, m4.size(2) * padded, padded, 1};
  }
  b.mask4 = m4;
  b.dims = {m4.size(0), m4.size(1), p.L, p.S};
  b.strides = {st[0], st[1], m4.size(2) == 1 && p.L > 1 ? 0 : st[2], 1};
  return b;
}

/// Whether this call runs on cuDNN (Note [cuDNN attention]): a CUDA build, a backend other than Flash, a mask only
/// as cuDNN's bias (cudnn_bias), and plans for the forward with p's strides (q, k, v and out) and for the backward
/// that follows it (dout in out's order, the gradients in the order empty_grads gives them). q, k, v are the
/// caller's tensors, p has their kernel views'.
bool use_cudnn(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const FlashAttentionParams& p,
               const CudnnBias& bias) {
  if (!q.device().is_cuda()) return false;
  const AttentionBackend mode = attention_backend();
  if (mode == AttentionBackend::Flash) return false;
#ifdef FRUGAL_WITH_CUDA
  FlashAttentionParams both = p;
  for (int d = 0; d < 3; ++d) both.out_stride[d] = p.o_stride[d];
  if (packed_qkv(q, k, v)) {
    strides_of(q, both.dq_stride), strides_of(k, both.dk_stride), strides_of(v, both.dv_stride);
  } else {
    strides_in_order_of(q, both.dq_stride), strides_in_order_of(k, both.dk_stride);
    strides_in_order_of(v, both.dv_stride);
  }
  std::string why = "a mask that broadcasts over the keys";
  if ((p.mask_kind == 0 || bias.present()) &&
      cuda::cudnn_attention_supported(q.dtype(), q.device(), both, {bias.dims, bias.strides}, &why))
    return true;
  FRUGAL_CHECK(mode != AttentionBackend::Cudnn, op, ": the attention backend is cudnn (set_attention_backend or ",
               "FRUGAL_ATTENTION) but cuDNN cannot run query ", q.describe(), ", key ", k.describe(), ", value ",
               v.describe(), ": ", why);
  return false;
#else
  (void)op, (void)k, (void)v, (void)p, (void)bias;
  return false;
#endif
}

/// cuda::cudnn_attention_forward in a CUDA build; false (run nothing) otherwise.
bool cudnn_forward(const FlashAttentionForward& r, const Tensor& q, const Tensor& k, const Tensor& v,
                   const FlashAttentionParams& p, const Tensor& bias) {
#ifdef FRUGAL_WITH_CUDA
  return cuda::cudnn_attention_forward(r.out, r.lse, q, k, v, p, bias);
#else
  (void)r, (void)q, (void)k, (void)v, (void)p, (void)bias;
  return false;
#endif
}

/// cuda::cudnn_attention_backward in a CUDA build; false (run nothing) otherwise.
bool cudnn_backward(const FlashAttentionGrads& g, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& out, const Tensor& lse, const FlashAttentionParams& p, const Tensor& bias) {
#ifdef FRUGAL_WITH_CUDA
  return cuda::cudnn_attention_backward(g.dq, g.dk, g.dv, dout, q, k, v, out, lse, p, bias);
#else
  (void)g, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)p, (void)bias;
  return false;
#endif
}

/// The backward of a forward whose dropout mask cuDNN's RNG node drew (Note [cuDNN attention]):
/// nothing else can draw that mask again, so it runs on cuDNN whatever the backend setting is
/// now, with dout in out's memory order (the layout whose backward plan the forward made sure
/// of), and anything that still keeps cuDNN from running is an error, not other kernels.
void cudnn_rng_backward(const char* op, const FlashAttentionGrads& g, Tensor dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, FlashAttentionParams p,
                        const CudnnBias& bias) {
  FRUGAL_CHECK(
      p.mask_kind == 0 || bias.present(), op, ": the forward's dropout mask was drawn by cuDNN, which cannot ",
      "take this backward's mask (one that broadcasts over the keys); give the backward the forward's options");
  if (dout.strides() != out.strides()) {
    const Tensor d = empty_in_order_of(out);
    copy_into(d, dout);
    dout = kernel_view(d);
    strides_of(dout, p.o_stride);
  }
  std::string why = q.device().is_cuda() ? "no workspace, or an execution it refused" : "they are not on a GPU";
#ifdef FRUGAL_WITH_CUDA
  if (q.device().is_cuda() &&
      cuda::cudnn_attention_supported(q.dtype(), q.device(), p, {bias.dims, bias.strides}, &why) &&
      cudnn_backward(g, dout, q, k, v, out, lse, p, bias.make(q)))
    return;
#else
  (void)g, (void)lse, (void)bias;
#endif
  FRUGAL_FAIL(op, ": the forward's dropout mask was drawn by cuDNN, but cuDNN's backward cannot run for query ",
              q.describe(), ", key ", k.describe(), ", value ", v.describe(), ", out ", out.describe(), ": ", why);
}

/// Checks q, k, v (and the mask) and fills the parameters both directions share.
FlashAttentionParams make_params(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const FlashAttentionOptions& o, Tensor& mask_view) {
  FRUGAL_CHECK(q.defined() && k.defined() && v.defined(), op, ": undefined query, key or value");
  FRUGAL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
               ": expects 4-D query (B, H, L, E), key (B, H, S, E) and value (B, H, S, E), got ", q.describe(), ", ",
               k.describe(), ", ", v.describe());
  FRUGAL_CHECK(is_floating(q.dtype()) && q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
               ": query, key and value must share a floating dtype, got ", q.describe(), ", ", k.describe(), ", ",
               v.describe());
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  FRUGAL_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) && v.size(1) == q.size(1) &&
                   k.size(3) == q.size(3) && v.size(3) == q.size(3) && v.size(2) == k.size(2),
               op, ": query ", q.describe(), ", key ", k.describe(), " and value ", v.describe(),
               " must agree on B, H and E, and key and value on S");
  FRUGAL_CHECK(o.dropout_p >= 0.0 && o.dropout_p < 1.0, op, ": dropout_p must be in [0, 1), got ", o.dropout_p);
  FlashAttentionParams p;
  p.B = q.size(0), p.H = q.size(1), p.L = q.size(2), p.S = k.size(2), p.E = q.size(3);
  p.causal = o.is_causal;
  p.scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(p.E));
  p.dropout_p = o.dropout_p;
  if (q.device().is_cuda()) {
    FRUGAL_CHECK(q.dtype() == kFloat16 || q.dtype() == kBFloat16, op,
                 ": the CUDA kernels take float16 or bfloat16, got ", q.describe());
    FRUGAL_CHECK(p.E > 0 && p.E % 8 == 0 && p.E <= kMaxFusedE, op,
                 ": the CUDA kernels take head dims E > 0, E % 8 == 0, E <= ", kMaxFusedE, ", got ", q.describe());
  }
  if (o.mask.defined()) {
    const Tensor& m = o.mask;
    const Shape full{p.B, p.H, p.L, p.S};
    FRUGAL_CHECK(m.dtype() == kBool || m.dtype() == q.dtype(), op, ": mask ", m.describe(),
                 " must be bool or of the query's dtype (query ", q.describe(), ")");
    check_same_device(op, q, m);
    FRUGAL_CHECK(mask_broadcasts(m, full), op, ": mask ", m.describe(),
                 " does not broadcast to (B, H, L, S) = ", shape_str(full));
    p.mask_kind = m.dtype() == kBool ? 1 : 2;
    mask_view = m.expand(full);  // stride 0 where it broadcasts: nothing is copied
    for (int d = 0; d < 4; ++d) p.mask_stride[d] = p.S == 0 || p.L == 0 ? 0 : mask_view.stride(d);
  }
  return p;
}

}  // namespace

void set_attention_backend(AttentionBackend backend) {
  g_attention_backend.store(int(backend), std::memory_order_relaxed);
}

AttentionBackend attention_backend() {
  int b = g_attention_backend.load(std::memory_order_relaxed);
  if (b < 0) {
    int unset = -1;
    g_attention_backend.compare_exchange_strong(unset, int(backend_from_environment()), std::memory_order_relaxed);
    b = g_attention_backend.load(std::memory_order_relaxed);
  }
  return AttentionBackend(b);
}

const char* attention_backend_name(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::Auto: return "auto";
    case AttentionBackend::Cudnn: return "cudnn";
    case AttentionBackend::Flash: return "flash";
  }
  return "unknown";
}

AttentionBackend attention_backend_for(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const FlashAttentionOptions& options) {
  Tensor mask_view;
  FlashAttentionParams p = make_params("attention_backend_for", q, k, v, options, mask_view);
  if (p.B * p.H * p.L == 0 || p.S == 0) return AttentionBackend::Flash;  // no kernel runs at all
  strides_of(kernel_view(q), p.q_stride), strides_of(kernel_view(k), p.k_stride);
  strides_of(kernel_view(v), p.v_stride), strides_in_order_of(q, p.o_stride);
  const CudnnBias bias = cudnn_bias(options.mask, q, p);
  return use_cudnn("attention_backend_for", q, k, v, p, bias) ? AttentionBackend::Cudnn : AttentionBackend::Flash;
}

bool flash_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  if (!q.defined() || !k.defined() || !v.defined() || !q.device().is_cuda()) return false;
  if (q.dtype() != kFloat16 && q.dtype() != kBFloat16) return false;
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype() || k.device() != q.device() || v.device() != q.device())
    return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  for (int d : {0, 1, 3})
    if (k.size(d) != q.size(d) || v.size(d) != q.size(d)) return false;
  if (v.size(2) != k.size(2) || q.size(3) % 8 != 0 || q.size(3) > kMaxFusedE || q.size(3) == 0) return false;
  if (!mask.defined()) return true;
  return (mask.dtype() == kBool || mask.dtype() == q.dtype()) && mask.device() == q.device() &&
         mask_broadcasts(mask, {q.size(0), q.size(1), q.size(2), k.size(2)});
}

FlashAttentionForward flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const FlashAttentionOptions& options, Generator* gen) {
  constexpr const char* op = "flash_attention_forward";
  Tensor mask_view;
  FlashAttentionParams p = make_params(op, q, k, v, options, mask_view);
  FlashAttentionForward r;
  r.out = empty_in_order_of(q);
  r.lse = empty({p.B, p.H, p.L}, {lse_dtype(q.dtype()), q.device()});
  r.range = {0, 0};
  // Not out.numel(): with E == 0 the output is empty but every row still has an lse
  // (of its masked zero scores), which the kernel computes.
  if (p.B * p.H * p.L == 0) return r;
  if (p.S == 0) {  // no key at all: every row is empty, so zeros and lse = -inf
    fill_(r.out, 0.0);
    fill_(r.lse, -INFINITY);
    return r;
  }
  if (p.dropout_p > 0.0) {
    Generator& g = gen ? *gen : default_generator();
    r.range = g.reserve(uint64_t(p.B * p.H * p.L * p.S + 3) / 4);
  }
  p.range = r.range;
  const Tensor qv = kernel_view(q), kv = kernel_view(k), vv = kernel_view(v);
  strides_of(qv, p.q_stride), strides_of(kv, p.k_stride), strides_of(vv, p.v_stride), strides_of(r.out, p.o_stride);
  const CudnnBias bias = cudnn_bias(options.mask, q, p);
  if (use_cudnn(op, q, k, v, p, bias)) {
    if (cudnn_forward(r, qv, kv, vv, p, bias.make(q))) {
      if (p.dropout_p > 0.0) r.range.drawn_by = Generator::kCudnnRng;  // its backward must run there too
      return r;
    }
    // With dropout, falling back would draw another mask than a run that got cuDNN: a
    // checkpoint's recompute could then replay a different forward (Note [cuDNN attention]).
    FRUGAL_CHECK(p.dropout_p == 0.0, op, ": cuDNN has plans for query ", q.describe(), ", key ", k.describe(),
                 ", value ", v.describe(), " with dropout ", p.dropout_p,
                 " but could not run them (no workspace, or an execution it refused), and its dropout mask is not "
                 "frugal's kernels'; free memory or set_attention_backend(AttentionBackend::Flash)");
  }
  FRUGAL_DEVICE_DISPATCH(op, q.device(), flash_attention_forward_kernel, r.out, r.lse, qv, kv, vv, mask_view, p);
  return r;
}

FlashAttentionGrads flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse, const FlashAttentionOptions& options,
                                             Generator::Range range) {
  constexpr const char* op = "flash_attention_backward";
  Tensor mask_view;
  FlashAttentionParams p = make_params(op, q, k, v, options, mask_view);
  FRUGAL_CHECK(dout.defined() && out.defined() && lse.defined(), op, ": undefined dout, out or lse");
  FRUGAL_CHECK(
      dout.sizes() == q.sizes() && out.sizes() == q.sizes() && dout.dtype() == q.dtype() && out.dtype() == q.dtype(),
      op, ": dout ", dout.describe(), " and out ", out.describe(), " must match query ", q.describe());
  FRUGAL_CHECK(lse.sizes() == Shape({p.B, p.H, p.L}) && lse.dtype() == lse_dtype(q.dtype()), op, ": lse ",
               lse.describe(), " must be ", dtype_name(lse_dtype(q.dtype())),
               " (B, H, L) = ", shape_str({p.B, p.H, p.L}));
  check_same_device(op, q, dout);
  check_same_device(op, q, out);
  check_same_device(op, q, lse);
  FlashAttentionGrads g = empty_grads(q, k, v);
  if (p.B * p.H * p.E == 0 || (p.L == 0 && p.S == 0)) return g;
  if (p.L == 0 || p.S == 0) {  // nothing attends: every gradient is zero
    fill_(g.dq, 0.0), fill_(g.dk, 0.0), fill_(g.dv, 0.0);
    return g;
  }
  p.range = range;
  const Tensor qv = kernel_view(q), kv = kernel_view(k), vv = kernel_view(v), dov = kernel_view(dout),
               ov = kernel_view(out);
  strides_of(qv, p.q_stride), strides_of(kv, p.k_stride), strides_of(vv, p.v_stride), strides_of(dov, p.o_stride);
  strides_of(ov, p.out_stride);
  strides_of(g.dq, p.dq_stride), strides_of(g.dk, p.dk_stride), strides_of(g.dv, p.dv_stride);
  const Tensor lse_c = lse.contiguous();
  const bool cudnn_rng = p.dropout_p > 0.0 && range.drawn_by == Generator::kCudnnRng;
  const CudnnBias bias = cudnn_bias(options.mask, q, p, cudnn_rng);
  if (cudnn_rng) {  // only cuDNN can draw its mask again
    cudnn_rng_backward(op, g, dov, qv, kv, vv, ov, lse_c, p, bias);
    return g;
  }
  // Without dropout: the forward's choice, made again from the same inputs (its p had out's
  // strides where this one has dout's); a dout in another layout without a plan of its own
  // runs our backward, which reads the same out and lse (Note [cuDNN attention]). With
  // dropout our kernels drew the mask, so they run the backward.
  if (p.dropout_p == 0.0) {
    FlashAttentionParams forward_p = p;
    for (int d = 0; d < 3; ++d) forward_p.o_stride[d] = p.out_stride[d];
    if (use_cudnn(op, q, k, v, forward_p, bias) && cudnn_backward(g, dov, qv, kv, vv, ov, lse_c, p, bias.make(q)))
      return g;
  }
  FRUGAL_DEVICE_DISPATCH(op, q.device(), flash_attention_backward_kernel, g.dq, g.dk, g.dv, dov, qv, kv, vv, ov, lse_c,
                         mask_view, p);
  return g;
}

}  // namespace frugal::ops
