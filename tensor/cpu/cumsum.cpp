// CPU scans: cumulative sums, products, extremes and log-sum-exps (Note [Cumulative sum dtypes], Note [Cumulative sum
// order]).
//
// A work item is a block of up to kBlock neighbouring lines of one outer index: walking D,
// each step reads and writes kBlock contiguous elements (one per line) and keeps the
// running sums in a small array, so lines along a non-last dim are read with unit stride.
// Along the last dim (inner == 1) a work item is one row.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/cumsum.h"

namespace frugal::ops::cpu {

namespace {

constexpr int64_t kBlock = 256;  // lines per work item when the sum is not along the last dim

// x: (outer, D, inner) of T; out: the same of Out; lines [i0, i0 + n) of outer index o.
// Op: CumulativeCombine (+ or *).
template <typename Op, typename T, typename Out, typename Acc>
void cumsum_item(const T* x, Out* out, const CumsumShape& s, int64_t o, int64_t i0, int64_t n) {
  // carry = span_carry + chunk_carry, formed at each chunk's start (Note [Cumulative sum order])
  Acc span_carry[kBlock], chunk_carry[kBlock], carry[kBlock], local[kBlock];
  for (Acc* a : {span_carry, chunk_carry, carry, local}) std::fill(a, a + n, Op::identity());
  for (int64_t step = 0; step < s.D; ++step) {
    if (step > 0 && step % kCumsumChunk == 0) {
      const bool span_ends = step % (kCumsumChunk * kCumsumSpan) == 0;
      for (int64_t k = 0; k < n; ++k) {
        chunk_carry[k] = Op::apply(chunk_carry[k], local[k]), local[k] = Op::identity();
        if (span_ends) span_carry[k] = Op::apply(span_carry[k], chunk_carry[k]), chunk_carry[k] = Op::identity();
        carry[k] = Op::apply(span_carry[k], chunk_carry[k]);
      }
    }
    const int64_t j = s.reverse ? s.D - 1 - step : step;
    const int64_t at = (o * s.D + j) * s.inner + i0;
    for (int64_t k = 0; k < n; ++k) {
      local[k] = Op::apply(local[k], Acc(x[at + k]));
      out[at + k] = Out(Op::apply(carry[k], local[k]));
    }
  }
}

}  // namespace

void cumsum_kernel(const Tensor& out, const Tensor& x, CumsumShape s) {
  with_cumulative(s.op, [&]<Cumulative kOp>() {
    const auto scan = [&]<typename T>() {
      using Out = CumsumOut<T>;
      using Acc = CumsumAcc<T>;
      using Op = CumulativeCombine<kOp, Acc>;
      const T* xp = x.data_ptr<T>();
      Out* op = out.data_ptr<Out>();
      const int64_t blocks = (s.inner + kBlock - 1) / kBlock;
      parallel_chunks(s.outer * blocks, s.D * std::min(kBlock, s.inner), [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const int64_t o = t / blocks, i0 = (t % blocks) * kBlock;
          cumsum_item<Op, T, Out, Acc>(xp, op, s, o, i0, std::min(kBlock, s.inner - i0));
        }
      });
    };
    if constexpr (kOp == Cumulative::LogAddExp) dispatch_floating(x.dtype(), cumulative_name(kOp), x.device(), scan);
    else dispatch_all(x.dtype(), cumulative_name(kOp), x.device(), scan);
  });
}

}  // namespace frugal::ops::cpu
