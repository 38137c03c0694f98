#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/binary_math.h"

namespace frugal::ops::cuda {

namespace {

// Grid-stride loop of a dynamic-cast op (Note [Dynamic casting]): K operands (out
// first), strides in bytes, f(out, a, b) on raw element pointers (b null when K == 2).
template <int K, typename Fn>
__global__ void dynamic_kernel(ElementwiseLayout L, Fn f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += stride) {
    int64_t off[K] = {};
    int64_t rem = i;
    for (int d = L.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % L.sizes[d];
      rem /= L.sizes[d];
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += idx * L.strides[k][d];
    }
    f(L.data[0] + off[0], L.data[1] + off[1], K > 2 ? L.data[K - 1] + off[K - 1] : nullptr);
  }
}

template <typename Fn>
void dynamic_map(ElementwiseLayout L, Device device, const Fn& f) {
  if (L.numel == 0) return;
  for (int k = 0; k < L.noperands; ++k)  // element strides to byte strides
    for (int d = 0; d < L.ndim; ++d) L.strides[k][d] *= int64_t(element_size(L.dtypes[k]));
  DeviceGuard guard(device);
  cudaStream_t stream = stream_for(device);
  if (L.noperands == 3) dynamic_kernel<3><<<grid_for(L.numel), kBlockSize, 0, stream>>>(L, f);
  else dynamic_kernel<2><<<grid_for(L.numel), kBlockSize, 0, stream>>>(L, f);
  FRUGAL_CUDA_CHECK_LAUNCH();
}

// op(a, b) for operands of two floating types, each widened to C's opmath type.
template <typename C, BinaryOp kOp>
struct MixedBinaryFn {
  using M = opmath_t<C>;
  M alpha;
  template <typename A, typename B>
  FRUGAL_HD C operator()(A a, B b) const {
    return C(binary_apply<kOp, M>(M(a), M(b), alpha));
  }
};

// Note [Mixed float32 and 16-bit operands]
// Under autocast a residual add meets a float16 branch and a float32 stream (a ViT block's
// x + attn(ln(x)): 49 adds of 74 MiB per step). The dynamic-cast kernel computes every
// operand's offset with a division per dim and switches on dtypes per element: 0.137 ms a
// ViT add, 2.3x its memory traffic's time. The float32-with-float16/bfloat16 arithmetic
// ops (add, mul, div) therefore get typed kernels, cuda_map's vectorized and strided paths.
// Returns false (nothing launched) for other dtype pairs.
template <BinaryOp kOp>
bool mixed_float32_map(const ElementwiseLayout& L, Device device, DType a, DType b, float alpha) {
  if constexpr (kOp == BinaryOp::Add || kOp == BinaryOp::Mul || kOp == BinaryOp::Div) {
    const MixedBinaryFn<float, kOp> f{alpha};
    if (a == kFloat32 && b == kFloat16) cuda_map<float, float, Half>(L, device, f);
    else if (a == kFloat16 && b == kFloat32) cuda_map<float, Half, float>(L, device, f);
    else if (a == kFloat32 && b == kBFloat16) cuda_map<float, float, BFloat16>(L, device, f);
    else if (a == kBFloat16 && b == kFloat32) cuda_map<float, BFloat16, float>(L, device, f);
    else return false;
    return true;
  }
  return false;
}

}  // namespace

// out: broadcast shape; a, b: broadcastable to out (any dtypes, any strides). When
// both inputs are in the compute dtype, cuda_map's typed path runs (16-byte vectors
// when dense: Note [Vectorized elementwise]), and float32 with a 16-bit float too (Note
// [Mixed float32 and 16-bit operands]); otherwise the dynamic-cast kernel.
void binary_kernel(BinaryOp op, DType compute, const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  const ElementwiseLayout L = make_elementwise_layout(binary_op_name(op), out, {a, b});
  visit_binary_op(op, [&]<BinaryOp kOp>() {
    dispatch_compute<kOp>(compute, out.device(), [&]<typename C>() {
      using M = opmath_t<C>;
      using Out = binary_out_t<kOp, C>;
      if (a.dtype() == compute && b.dtype() == compute && out.dtype() == dtype_of<Out>()) {
        cuda_map<Out, C, C>(L, out.device(), BinaryFn<C, kOp>{M(alpha)});
      } else if (std::is_same_v<C, float> && out.dtype() == kFloat32 &&
                 mixed_float32_map<kOp>(L, out.device(), a.dtype(), b.dtype(), float(alpha))) {
        // launched by mixed_float32_map
      } else {
        dynamic_map(L, out.device(), DynamicBinaryFn<C, kOp>{out.dtype(), a.dtype(), b.dtype(), M(alpha), M(0), false});
      }
    });
  });
}

// out, a: same shape (any strides); s: the right-hand scalar, passed by value.
void binary_scalar_kernel(BinaryOp op, DType compute, const Tensor& out, const Tensor& a, double s) {
  const ElementwiseLayout L = make_elementwise_layout(binary_op_name(op), out, {a});
  visit_binary_op(op, [&]<BinaryOp kOp>() {
    dispatch_compute<kOp>(compute, out.device(), [&]<typename C>() {
      using M = opmath_t<C>;
      using Out = binary_out_t<kOp, C>;
      const M rhs = binary_scalar_value<C, kOp>(s);
      if (a.dtype() == compute && out.dtype() == dtype_of<Out>()) {
        cuda_map<Out, C>(L, out.device(), BinaryScalarFn<C, kOp>{rhs});
      } else {
        dynamic_map(L, out.device(), DynamicBinaryFn<C, kOp>{out.dtype(), a.dtype(), a.dtype(), M(1), rhs, true});
      }
    });
  });
}

// out: broadcast shape; cond: bool; a, b: out's dtype.
void where_kernel(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const ElementwiseLayout L = make_elementwise_layout("where", out, {cond, a, b});
  dispatch_all(out.dtype(), "where", out.device(),
               [&]<typename T>() { cuda_map<T, bool, T, T>(L, out.device(), WhereFn<T>{}); });
}

// out: broadcast shape; x: out's dtype; mask: bool.
void masked_fill_kernel(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  const ElementwiseLayout L = make_elementwise_layout("masked_fill", out, {x, mask});
  dispatch_all(out.dtype(), "masked_fill", out.device(),
               [&]<typename T>() { cuda_map<T, T, bool>(L, out.device(), MaskedFillFn<T>{cast_to<T>(value)}); });
}

// out: broadcast shape; start, end, weight: out's dtype (Note [Lerp formula]).
void lerp_kernel(const Tensor& out, const Tensor& start, const Tensor& end, const Tensor& weight) {
  const ElementwiseLayout L = make_elementwise_layout("lerp", out, {start, end, weight});
  dispatch_floating(out.dtype(), "lerp", out.device(),
                    [&]<typename T>() { cuda_map<T, T, T, T>(L, out.device(), LerpFn<T>{}); });
}

// out: broadcast shape; start, end: out's dtype; weight: a scalar.
void lerp_scalar_kernel(const Tensor& out, const Tensor& start, const Tensor& end, double weight) {
  const ElementwiseLayout L = make_elementwise_layout("lerp", out, {start, end});
  dispatch_floating(out.dtype(), "lerp", out.device(), [&]<typename T>() {
    using M = opmath_t<T>;
    cuda_map<T, T, T>(L, out.device(), LerpScalarFn<T>{M(weight)});
  });
}

}  // namespace frugal::ops::cuda
