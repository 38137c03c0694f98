#include <type_traits>

#include "core/graph_capture.h"
#include "memory/deferred_checks.h"
#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/copy_math.h"

namespace frugal::ops::cuda {

namespace {
// Note: device code uses functors, not lambdas: nvcc forbids __device__ lambdas
// inside the generic (templated) lambdas that dtype dispatch uses.
template <typename D, typename S>
struct CastTo {
  __device__ D operator()(S v) const { return convert_element<D, S>(v); }  // Note [Float to integer conversion]
};
struct SameByte {
  __device__ uint8_t operator()(uint8_t v) const { return v; }
};
/// A uint8 byte read as the number 0..255 (Note [Reading uint8 as numbers] in tensor/cpu/copy.cpp).
template <typename D>
struct FromByte {
  __device__ D operator()(uint8_t v) const {
    if constexpr (std::is_same_v<D, bool>) return v != 0;
    else return convert_element<D, float>(static_cast<float>(v));  // 0..255: exact in every floating dtype
  }
};
}  // namespace

void copy_kernel(const Tensor& dst, const Tensor& src) {
  const ElementwiseLayout L = make_elementwise_layout("copy_", dst, {src});
  if (L.contiguous && dst.dtype() == src.dtype()) {
    DeviceGuard guard(dst.device());
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(L.data[0], L.data[1], size_t(L.numel) * dst.element_size(),
                                      cudaMemcpyDeviceToDevice, stream_for(dst)));
    return;
  }
  if (src.dtype() == DType::UInt8) {  // Note [Reading uint8 as numbers] in tensor/cpu/copy.cpp, as the CPU
    if (dst.dtype() == DType::UInt8) return cuda_map<uint8_t, uint8_t>(L, dst.device(), SameByte{});
    dispatch_all(dst.dtype(), "copy_", dst.device(),
                 [&]<typename D>() { cuda_map<D, uint8_t>(L, dst.device(), FromByte<D>{}); });
    return;
  }
  dispatch_all(dst.dtype(), "copy_", dst.device(), [&]<typename D>() {
    dispatch_all(src.dtype(), "copy_", src.device(),
                 [&]<typename S>() { cuda_map<D, S>(L, dst.device(), CastTo<D, S>{}); });
  });
}

void memcpy_across(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  if (dst_dev.is_cpu())
    core::refuse_in_graph_capture("Copying a device tensor to the host (cpu(), to(kCPU), item(), tolist())",
                                  "the host would read it before the captured work has run");
  else if (src_dev.is_cpu())
    core::refuse_in_graph_capture("Copying a host tensor to the device",
                                  "each replay would copy the host memory as it is then; copy into a static device "
                                  "tensor before replay() instead");
  const Device gpu = dst_dev.is_cuda() ? dst_dev : src_dev;
  DeviceGuard guard(gpu);
  cudaStream_t stream = stream_for(gpu);
  if (dst_dev.is_cuda() && src_dev.is_cuda() && dst_dev.index != src_dev.index) {
    FRUGAL_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, stream));
  } else {
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream));
  }
  // A host destination must hold the data when we return; a device one is ordered by the stream.
  if (dst_dev.is_cpu()) {
    FRUGAL_CUDA_CHECK(cudaStreamSynchronize(stream));
    memory::resolve_checks(gpu);  // the host waited anyway (Note [Deferred index checks])
  }
}

}  // namespace frugal::ops::cuda
