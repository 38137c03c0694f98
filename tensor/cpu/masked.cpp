// nonzero, masked_select and masked_select's backward on the CPU (Note [Data-dependent output
// sizes]): every element of the flat mask knows its output slot from pos, so the elements
// are independent and run on parallel_chunks.
#include <cstdint>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/masked.h"

namespace frugal::ops::cpu {

// out: (count); x: (n); mask, pos: (n)
void masked_select_kernel(const Tensor& out, const Tensor& x, const Tensor& mask, const Tensor& pos) {
  dispatch_bytes(element_size(x.dtype()), "masked_select", [&]<typename U>() {
    U* o = static_cast<U*>(out.data());
    const U* xp = static_cast<const U*>(x.data());
    const bool* m = mask.data_ptr<bool>();
    const int64_t* p = pos.data_ptr<int64_t>();
    parallel_chunks(x.numel(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        if (m[i]) o[p[i] - 1] = xp[i];
    });
  });
}

// out: (count, ndim) int64; mask, pos: (n)
void nonzero_kernel(const Tensor& out, const Tensor& mask, const Tensor& pos, const Shape& sizes) {
  int64_t* o = out.data_ptr<int64_t>();
  const bool* m = mask.data_ptr<bool>();
  const int64_t* p = pos.data_ptr<int64_t>();
  const int64_t ndim = int64_t(sizes.size());
  parallel_chunks(mask.numel(), ndim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (!m[i]) continue;
      int64_t* row = o + (p[i] - 1) * ndim;
      for (int64_t d = ndim - 1, rem = i; d >= 0; --d) {  // row-major coordinates of i
        row[d] = rem % sizes[d];
        rem /= sizes[d];
      }
    }
  });
}

// out: (n); src: (count); mask, pos: (n)
void masked_scatter_kernel(const Tensor& out, const Tensor& mask, const Tensor& pos, const Tensor& src) {
  dispatch_bytes(element_size(out.dtype()), "masked_select_backward", [&]<typename U>() {
    U* o = static_cast<U*>(out.data());
    const U* s = static_cast<const U*>(src.data());
    const bool* m = mask.data_ptr<bool>();
    const int64_t* p = pos.data_ptr<int64_t>();
    parallel_chunks(out.numel(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) o[i] = m[i] ? s[p[i] - 1] : U(0);  // all-zero bits: +0 in every dtype
    });
  });
}

}  // namespace frugal::ops::cpu
