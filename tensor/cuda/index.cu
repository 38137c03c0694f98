#include <cstdint>

#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/index.h"

namespace frugal::ops::cuda {

namespace {

// A gather only moves elements, so it is instantiated per element size, not per dtype.
template <typename F>
void dispatch_bytes(size_t element_size, F&& f) {
  switch (element_size) {
    case 1: return f.template operator()<uint8_t>();
    case 2: return f.template operator()<uint16_t>();
    case 4: return f.template operator()<uint32_t>();
    case 8: return f.template operator()<uint64_t>();
    default: FRUGAL_FAIL("index_gather: unsupported element size ", element_size);
  }
}

// rec = {flag, value, position}: the first thread to find a bad index claims the flag and
// writes the rest (see Note [Index validation]).
__device__ __forceinline__ void record_bad_index(unsigned long long* rec, int64_t v, int64_t pos) {
  if (atomicCAS(rec, 0ull, 1ull) == 0ull) {
    rec[1] = static_cast<unsigned long long>(v);
    rec[2] = static_cast<unsigned long long>(pos);
  }
}

// Element offsets of operands 0, 1, 2 at row-major position i of the layout.
template <typename Index>
__device__ __forceinline__ void offsets3(const ElementwiseLayout& L, Index i, Index (&off)[3]) {
  off[0] = off[1] = off[2] = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    const Index size = Index(L.sizes[d]);
    const Index idx = i % size;
    i /= size;
#pragma unroll
    for (int k = 0; k < 3; ++k) off[k] += idx * Index(L.strides[k][d]);
  }
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int32_t* p, int32_t v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int64_t* p, int64_t v) {
  // Two's complement: an unsigned add is the signed add.
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

// Operands: 0 = out, 1 = index, 2 = table (stride 0 at the indexed dim).
template <typename Index, typename T, typename I>
__global__ void gather_kernel(ElementwiseLayout L, int64_t dim_size, int64_t dim_stride, unsigned long long* rec) {
  T* __restrict__ out = reinterpret_cast<T*>(L.data[0]);
  const I* __restrict__ index = reinterpret_cast<const I*>(L.data[1]);
  const T* __restrict__ table = reinterpret_cast<const T*>(L.data[2]);
  const Index n = Index(L.numel), stride = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index off[3];
    offsets3(L, i, off);
    const int64_t v = int64_t(index[off[1]]);
    if (v < 0 || v >= dim_size) {
      record_bad_index(rec, v, int64_t(i));
      continue;
    }
    out[off[0]] = table[int64_t(off[2]) + v * dim_stride];
  }
}

// Operands: 0 = acc (stride 0 at the indexed dim), 1 = index, 2 = src. See Note [Scatter accumulation].
template <typename Index, typename Acc, typename S, typename I>
__global__ void scatter_add_kernel(ElementwiseLayout L, int64_t dim_size, int64_t dim_stride, int64_t skip,
                                   unsigned long long* rec) {
  Acc* acc = reinterpret_cast<Acc*>(L.data[0]);
  const I* __restrict__ index = reinterpret_cast<const I*>(L.data[1]);
  const S* __restrict__ src = reinterpret_cast<const S*>(L.data[2]);
  const Index n = Index(L.numel), stride = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index off[3];
    offsets3(L, i, off);
    const int64_t v = int64_t(index[off[1]]);
    if (v < 0 || v >= dim_size) {  // before the skip test: skip = -1 means "none", not "index -1"
      record_bad_index(rec, v, int64_t(i));
      continue;
    }
    if (v == skip) continue;
    atomic_add(acc + int64_t(off[0]) + v * dim_stride, Acc(static_cast<opmath_t<S>>(src[off[2]])));
  }
}

// The device record one kernel writes a bad index into, zeroed in stream order. The kernels
// hand it to the front-end, which reads it now or later (Note [Deferred index checks]).
class BadIndexRecord {
 public:
  BadIndexRecord(Device device, cudaStream_t stream) : buf_(empty({3}, {kInt64, device})) {
    FRUGAL_CUDA_CHECK(cudaMemsetAsync(buf_.data(), 0, 3 * sizeof(int64_t), stream));
  }
  unsigned long long* ptr() const { return static_cast<unsigned long long*>(buf_.data()); }
  const Tensor& tensor() const { return buf_; }

 private:
  Tensor buf_;
};

// 32-bit index math when every offset, and every position plus one grid stride, fits.
bool use_int32(const ElementwiseLayout& L) { return L.numel < (int64_t(1) << 30) && detail::fits_int32(L); }

__global__ void pad_indices_kernel(int64_t* out, int64_t size, int64_t n, int64_t left, PadIndexMode mode) {
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < size; o += int64_t(gridDim.x) * blockDim.x)
    out[o] = pad_source_index(o, n, left, mode);
}

}  // namespace

void index_gather_kernel(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim_size,
                         int64_t dim_stride, IndexError& err) {
  // out, index, src: the iteration shape; src: stride 0 at the indexed dim
  const ElementwiseLayout L = make_elementwise_layout("index_gather", out, {index, src});
  if (L.numel == 0) return;
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_for(out);
  const BadIndexRecord rec(out.device(), stream);
  const bool small = use_int32(L);
  dispatch_bytes(out.element_size(), [&]<typename T>() {
    dispatch_index(index.dtype(), "index_gather", index.device(), [&]<typename I>() {
      if (small) {
        gather_kernel<int32_t, T, I><<<grid_for(L.numel), kBlockSize, 0, stream>>>(L, dim_size, dim_stride, rec.ptr());
      } else {
        gather_kernel<int64_t, T, I><<<grid_for(L.numel), kBlockSize, 0, stream>>>(L, dim_size, dim_stride, rec.ptr());
      }
      FRUGAL_CUDA_CHECK_LAUNCH();
    });
  });
  err.record = rec.tensor();
}

void index_scatter_add_kernel(const Tensor& acc, const Tensor& index, const Tensor& src, int64_t dim_size,
                              int64_t dim_stride, int64_t skip, IndexError& err) {
  // acc, index, src: the iteration shape; acc: stride 0 at the indexed dim, dtype opmath(src)
  const ElementwiseLayout L = make_elementwise_layout("index_scatter_add", acc, {index, src});
  if (L.numel == 0) return;
  DeviceGuard guard(acc.device());
  cudaStream_t stream = stream_for(acc);
  const BadIndexRecord rec(acc.device(), stream);
  const bool small = use_int32(L);
  dispatch_numeric(src.dtype(), "index_scatter_add", src.device(), [&]<typename S>() {
    using Acc = opmath_t<S>;
    FRUGAL_CHECK(acc.dtype() == dtype_of<Acc>(), "index_scatter_add: accumulator ", acc.describe(),
                 " does not match src ", src.describe());
    dispatch_index(index.dtype(), "index_scatter_add", index.device(), [&]<typename I>() {
      const unsigned grid = grid_for(L.numel);
      if (small) {
        scatter_add_kernel<int32_t, Acc, S, I>
            <<<grid, kBlockSize, 0, stream>>>(L, dim_size, dim_stride, skip, rec.ptr());
      } else {
        scatter_add_kernel<int64_t, Acc, S, I>
            <<<grid, kBlockSize, 0, stream>>>(L, dim_size, dim_stride, skip, rec.ptr());
      }
      FRUGAL_CUDA_CHECK_LAUNCH();
    });
  });
  err.record = rec.tensor();
}

void pad_source_indices_kernel(const Tensor& out, int64_t n, int64_t left, PadIndexMode mode) {
  DeviceGuard guard(out.device());
  pad_indices_kernel<<<grid_for(out.numel()), kBlockSize, 0, stream_for(out)>>>(out.data_ptr<int64_t>(), out.numel(),
                                                                               n, left, mode);
  FRUGAL_CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::ops::cuda
