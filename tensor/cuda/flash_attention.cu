// CUDA flash attention: launches of the kernels in flash_attention_forward.cuh and
// flash_attention_backward.cuh (Note [Flash attention], Note [Flash attention tiles]).
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/flash_attention_backward.cuh"
#include "tensor/cuda/flash_attention_forward.cuh"
#include "tensor/factory.h"

namespace frugal::ops::cuda {

namespace {

using namespace flash;

/// Calls f.template operator()<T, kD>() for q's dtype and the padded head dim.
template <typename F>
void dispatch_flash(const char* op, const Tensor& q, int64_t E, F&& f) {
  auto by_dim = [&]<typename T>() {
    if (E <= 32) f.template operator()<T, 32>();
    else if (E <= 64) f.template operator()<T, 64>();
    else if (E <= 96) f.template operator()<T, 96>();
    else f.template operator()<T, 128>();
  };
  if (q.dtype() == kFloat16) by_dim.template operator()<Half>();
  else if (q.dtype() == kBFloat16) by_dim.template operator()<BFloat16>();
  else FRUGAL_FAIL(op, ": not implemented for ", dtype_name(q.dtype()), " on ", q.device().str());
}

/// Lets `kernel` use `bytes` of dynamic shared memory (beyond the 48 KiB default).
template <typename K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    FRUGAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

/// The kernels store results in pairs (4-byte stores): rows must start 4-byte aligned. The
/// op allocates them so (E % 8 == 0, Note [Flash attention layouts]); this guards the claim.
void check_pair_stores(const char* op, const Tensor& t, const int64_t (&stride)[3]) {
  bool ok = reinterpret_cast<uintptr_t>(t.data()) % 4 == 0;
  for (int d = 0; d < 3; ++d) ok = ok && (stride[d] % 2 == 0 || t.size(d) == 1);  // a size-1 dim's is never used
  FRUGAL_CHECK(ok, op, ": result ", t.describe(),
               " has rows the kernels cannot store in pairs (odd stride or address)");
}

struct DropoutConsts {
  float keep_below, scale;
};
DropoutConsts dropout_consts(const FlashAttentionParams& p) {
  return {float(1.0 - p.dropout_p), float(1.0 / (1.0 - p.dropout_p))};
}

}  // namespace

void flash_attention_forward_kernel(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& mask, const FlashAttentionParams& p) {
  DeviceGuard guard(q.device());
  const cudaStream_t stream = stream_for(q);
  const DropoutConsts drop = dropout_consts(p);
  const float scale_log2 = float(p.scale * 1.4426950408889634);
  const void* mask_ptr = mask.defined() ? mask.data() : nullptr;
  const int64_t blocks = p.B * p.H * ((p.L + kBlockRows - 1) / kBlockRows);
  FRUGAL_CHECK(blocks <= int64_t(INT32_MAX), "flash_attention_forward: too many blocks for ", q.describe());
  check_pair_stores("flash_attention_forward", out, p.o_stride);
  dispatch_flash("flash_attention_forward", q, p.E, [&]<typename T, int kD>() {
    const size_t smem = forward_smem_bytes<T, kD>();
    allow_smem(flash_forward_kernel<T, kD>, smem);
    flash_forward_kernel<T, kD><<<unsigned(blocks), kThreads, smem, stream>>>(
        out.data_ptr<T>(), lse.data_ptr<float>(), q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), mask_ptr, p,
        scale_log2, drop.keep_below, drop.scale);
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

void flash_attention_backward_kernel(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& mask, const FlashAttentionParams& p) {
  DeviceGuard guard(q.device());
  const cudaStream_t stream = stream_for(q);
  const DropoutConsts drop = dropout_consts(p);
  const float scale_log2 = float(p.scale * 1.4426950408889634);
  const void* mask_ptr = mask.defined() ? mask.data() : nullptr;
  const int64_t rows = p.B * p.H * p.L;
  const int64_t blocks = p.B * p.H * ((p.S + kBlockCols - 1) / kBlockCols);
  FRUGAL_CHECK(blocks <= int64_t(INT32_MAX), "flash_attention_backward: too many blocks for ", q.describe());
  check_pair_stores("flash_attention_backward", dk, p.dk_stride);
  check_pair_stores("flash_attention_backward", dv, p.dv_stride);
  // O(B H L E) temporaries: the rows' dout . out and dq in f32 (atomics add into it).
  const Tensor dot = empty({rows}, {kFloat32, q.device()});
  const Tensor dq_acc = zeros({rows * p.E}, {kFloat32, q.device()});
  dispatch_flash("flash_attention_backward", q, p.E, [&]<typename T, int kD>() {
    constexpr int kRowsPerBlock = 8;
    flash_backward_dot_kernel<T>
        <<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
            dot.data_ptr<float>(), dout.data_ptr<T>(), out.data_ptr<T>(), p);
    FRUGAL_CUDA_CHECK_LAUNCH();
    const size_t smem = backward_smem_bytes<T, kD>();
    allow_smem(flash_backward_kernel<T, kD>, smem);
    flash_backward_kernel<T, kD><<<unsigned(blocks), kThreads, smem, stream>>>(
        dq_acc.data_ptr<float>(), dk.data_ptr<T>(), dv.data_ptr<T>(), dout.data_ptr<T>(), q.data_ptr<T>(),
        k.data_ptr<T>(), v.data_ptr<T>(), lse.data_ptr<float>(), dot.data_ptr<float>(), mask_ptr, p, scale_log2,
        drop.keep_below, drop.scale);
    FRUGAL_CUDA_CHECK_LAUNCH();
    flash_backward_dq_kernel<T><<<grid_for(rows * p.E), kBlockSize, 0, stream>>>(
        dq.data_ptr<T>(), dq_acc.data_ptr<float>(), p, float(p.scale));
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace frugal::ops::cuda
