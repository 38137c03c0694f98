#include <algorithm>
#include <vector>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/ops/join.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kCatBatch = 64;  // inputs per launch; the descriptor stays well under the 4 KiB parameter limit

// Up to kCatBatch inputs of one cat, in units of the copy width U (see Note [cat: one batched copy]).
struct CatBatch {
  const void* src[kCatBatch];
  int64_t row[kCatBatch];         // units each input holds per outer index
  int64_t dst_offset[kCatBatch];  // where, in units from the start of an output row, input j's row goes
};

// blockIdx.y picks the input; a grid-stride loop over its (outer, row) units.
template <typename U, typename Index>
__global__ void cat_batched_kernel(CatBatch b, U* __restrict__ dst, Index outer, Index out_row) {
  // dst: (outer, out_row) units; input j: (outer, b.row[j]) units
  const int j = blockIdx.y;
  const Index row = Index(b.row[j]);
  const Index total = outer * row;
  const U* __restrict__ src = static_cast<const U*>(b.src[j]);
  U* __restrict__ d = dst + b.dst_offset[j];
  const Index stride = Index(gridDim.x) * blockDim.x;
  for (Index e = Index(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const Index o = e / row;
    d[o * out_row + (e - o * row)] = src[e];
  }
}

template <typename U>
void launch_cat(const Tensor& out, const std::vector<Tensor>& inputs, const std::vector<int64_t>& offsets,
                int64_t outer, int64_t inner_bytes, int64_t out_row_bytes, int64_t dim, cudaStream_t stream) {
  constexpr int64_t W = sizeof(U);
  const int64_t out_units = outer * (out_row_bytes / W);
  // 32-bit index math when every unit index (plus one grid stride) fits.
  const bool small = out_units < (int64_t(1) << 30);
  for (size_t first = 0; first < inputs.size(); first += kCatBatch) {
    const int nb = int(std::min<size_t>(kCatBatch, inputs.size() - first));
    CatBatch b{};
    int64_t max_total = 0;
    for (int j = 0; j < nb; ++j) {
      const Tensor& t = inputs[first + size_t(j)];
      b.src[j] = t.data();
      b.row[j] = t.size(dim) * inner_bytes / W;
      b.dst_offset[j] = offsets[first + size_t(j)] * inner_bytes / W;
      max_total = std::max(max_total, outer * b.row[j]);
    }
    // Enough blocks per input to fill the GPU once across the batch, at least one each.
    const unsigned gx = std::max(1u, std::min(grid_for(max_total), unsigned(2 * max_blocks(32) / nb)));
    const dim3 grid(gx, unsigned(nb));
    U* dst = static_cast<U*>(out.data());
    if (small) {
      cat_batched_kernel<U, int32_t>
          <<<grid, kBlockSize, 0, stream>>>(b, dst, int32_t(outer), int32_t(out_row_bytes / W));
    } else {
      cat_batched_kernel<U, int64_t><<<grid, kBlockSize, 0, stream>>>(b, dst, outer, out_row_bytes / W);
    }
    FRUGAL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void cat_kernel(const Tensor& out, const std::vector<Tensor>& inputs, const std::vector<int64_t>& offsets,
                int64_t dim) {
  // out: (outer, N, inner) contiguous; inputs[i]: (outer, n_i, inner) contiguous, out's dtype
  const int64_t es = int64_t(out.element_size());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= out.size(d);
  for (int64_t d = dim + 1; d < out.dim(); ++d) inner *= out.size(d);
  const int64_t inner_bytes = inner * es, out_row_bytes = out.size(dim) * inner_bytes;
  if (outer == 0 || inner == 0) return;
  // The copy width: the largest power of two <= 16 dividing every address, row and offset in bytes.
  uint64_t bits = 16 | uint64_t(out_row_bytes) | reinterpret_cast<uintptr_t>(out.data());
  for (size_t i = 0; i < inputs.size(); ++i) {
    bits |= reinterpret_cast<uintptr_t>(inputs[i].data()) | uint64_t(inputs[i].size(dim) * inner_bytes) |
            uint64_t(offsets[i] * inner_bytes);
  }
  const uint64_t width = bits & (~bits + 1);  // lowest set bit
  DeviceGuard guard(out.device());
  cudaStream_t stream = stream_for(out);
  switch (width) {
    case 16: launch_cat<uint4>(out, inputs, offsets, outer, inner_bytes, out_row_bytes, dim, stream); break;
    case 8: launch_cat<uint2>(out, inputs, offsets, outer, inner_bytes, out_row_bytes, dim, stream); break;
    case 4: launch_cat<uint32_t>(out, inputs, offsets, outer, inner_bytes, out_row_bytes, dim, stream); break;
    case 2: launch_cat<uint16_t>(out, inputs, offsets, outer, inner_bytes, out_row_bytes, dim, stream); break;
    default: launch_cat<uint8_t>(out, inputs, offsets, outer, inner_bytes, out_row_bytes, dim, stream); break;
  }
}

}  // namespace frugal::ops::cuda
