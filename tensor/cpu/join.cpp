#include "tensor/ops/join.h"

#include <cstring>
#include <vector>

namespace frugal::ops::cpu {

// See Note [cat: one batched copy]. Viewed as (outer, size(dim) * inner) rows, input i
// fills bytes [offsets[i] * inner, (offsets[i] + n_i) * inner) of every output row.
void cat_kernel(const Tensor& out, const std::vector<Tensor>& inputs, const std::vector<int64_t>& offsets,
                int64_t dim) {
  // out: (outer, N, inner) contiguous; inputs[i]: (outer, n_i, inner) contiguous
  const int64_t es = int64_t(out.element_size());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= out.size(d);
  for (int64_t d = dim + 1; d < out.dim(); ++d) inner *= out.size(d);
  const int64_t out_row = out.size(dim) * inner * es;
  char* dst = static_cast<char*>(out.data());
  const size_t count = inputs.size();
  const int64_t n = int64_t(count);
  std::vector<const char*> src(count);
  std::vector<int64_t> row(count), dst_offset(count);
  for (size_t i = 0; i < count; ++i) {
    src[i] = static_cast<const char*>(inputs[i].data());
    row[i] = inputs[i].size(dim) * inner * es;
    dst_offset[i] = offsets[i] * inner * es;
  }
  const bool parallel = out.numel() * es >= (int64_t(1) << 20);  // below ~1 MiB one thread is faster
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = size_t(i);
      std::memcpy(dst + o * out_row + dst_offset[k], src[k] + o * row[k], size_t(row[k]));
    }
  }
}

}  // namespace frugal::ops::cpu
