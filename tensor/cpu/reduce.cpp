// CPU reductions over the (outer, R, inner) view of Note [Reduction geometry].
//
// Note [CPU reduction accuracy]
// Floating sums, products, means and variances accumulate in double whatever the input type
// (the float-accumulation rule for half types is a floor, not a ceiling): summing
// 2^20 floats then errs by ~1e-16 relative instead of the ~1e-4 a naive float loop
// can reach, and a row still vectorizes because it folds 8 interleaved lanes
// (independent accumulators need no reassociation) that are merged at the end.
// Column reductions keep one accumulator per output and walk R in order, which
// vectorizes across the inner dim for the same reason. max/min compute in
// opmath_t (exact anyway).
//
// Note [Reduction chunks follow the sizes]
// A long row (or a long column of few outputs) is cut into chunks that threads fold apart
// and that are then combined in chunk order. The cut depends on the shape alone, never on
// the thread count: rows of 2 * kRowChunk elements or more are cut every kRowChunk, and
// columns of few work items (fewer than kColumnSlots) into as many chunks as fill
// kColumnSlots, at least 64 rows each. So a sum has the same bits at 1 thread or 64, which
// PyTorch's at::parallel_reduce (one chunk per thread) does not promise; threads only decide
// who folds which chunk (Note [CPU determinism] in core/threads.h). Chunking also makes long
// column sums more accurate: 1.3e-14 relative error at 90k rows in float64 with one
// accumulator, a few ulps with chunks.
#include "tensor/ops/reduce.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/reduction.h"

namespace frugal::ops::cpu {

using reduction::Geometry;

namespace {

constexpr int kLanes = 8;
constexpr int64_t kColumnBlock = 1024;  // outputs per work item of a column reduction (4 KiB of f32 per row)
constexpr int64_t kRowChunk = kParallelGrain;  // Note [Reduction chunks follow the sizes]
constexpr int64_t kColumnSlots = 64;
constexpr int64_t kColumnChunkMinRows = 64;

/// Folds elements [r0, r1) of one row; x points at the row's element 0, `stride` apart.
template <typename Red>
typename Red::acc_t fold_row(const Red& red, const typename Red::in_t* x, int64_t stride, int64_t r0, int64_t r1) {
  using A = typename Red::acc_t;
  A lane[kLanes];
  for (A& l : lane) l = red.identity();
  int64_t r = r0;
  if (stride == 1) {
    for (; r + kLanes <= r1; r += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] = red.step(lane[j], x[r + j], r + j);
  } else {
    for (; r + kLanes <= r1; r += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] = red.step(lane[j], x[(r + j) * stride], r + j);
  }
  for (int j = 0; r < r1; ++r, ++j) lane[j] = red.step(lane[j], x[r * stride], r);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] = red.combine(lane[j], lane[j + w]);
  return lane[0];
}

// x: (outer, R) with strides (so, sr); one output per row.
template <typename Red>
void reduce_rows(const Red& red, const Geometry& g, const typename Red::in_t* x) {
  using A = typename Red::acc_t;
  if (g.R < 2 * kRowChunk) {
    parallel_for_if(g.outer * g.R >= kParallelGrain, g.outer,
                    [&](int64_t o) { red.store(o, fold_row(red, x + o * g.so, g.sr, 0, g.R)); });
    return;
  }
  // Long rows: chunks of kRowChunk (the last one longer) folded apart, then merged in order.
  const int64_t chunks = g.R / kRowChunk;
  const std::unique_ptr<A[]> part(new A[size_t(g.outer * chunks)]);  // not vector: vector<bool> packs bits
  parallel_for_if(true, g.outer * chunks, [&](int64_t u) {
    const int64_t o = u / chunks, c = u % chunks;
    part[size_t(u)] = fold_row(red, x + o * g.so, g.sr, c * kRowChunk, c + 1 == chunks ? g.R : (c + 1) * kRowChunk);
  });
  for (int64_t o = 0; o < g.outer; ++o) {
    A a = red.identity();
    for (int64_t c = 0; c < chunks; ++c) a = red.combine(a, part[size_t(o * chunks + c)]);
    red.store(o, a);
  }
}

// x: (outer, R, inner) with strides (so, sr, si). Folds rows [r0, r1) into acc[0..n) for
// the n consecutive inner outputs from i0 of outer index o.
template <typename Red>
void fold_columns(const Red& red, const Geometry& g, const typename Red::in_t* x, int64_t o, int64_t i0, int64_t n,
                  int64_t r0, int64_t r1, typename Red::acc_t* acc) {
  for (int64_t j = 0; j < n; ++j) acc[j] = red.identity();
  const typename Red::in_t* base = x + o * g.so + i0 * g.si;
  if (g.si == 1) {
    for (int64_t r = r0; r < r1; ++r) {
      const typename Red::in_t* row = base + r * g.sr;
      for (int64_t j = 0; j < n; ++j) acc[j] = red.step(acc[j], row[j], r);
    }
  } else {
    for (int64_t r = r0; r < r1; ++r) {
      const typename Red::in_t* row = base + r * g.sr;
      for (int64_t j = 0; j < n; ++j) acc[j] = red.step(acc[j], row[j * g.si], r);
    }
  }
}

// Work items are blocks of kColumnBlock consecutive inner outputs of one outer index,
// each walking R with one accumulator per output. When there are few items (a bias
// gradient: outer = 1), R is cut into chunks too and the chunks' accumulators are merged
// in order (Note [Reduction chunks follow the sizes]).
template <typename Red>
void reduce_columns(const Red& red, const Geometry& g, const typename Red::in_t* x) {
  using A = typename Red::acc_t;
  const int64_t blocks = (g.inner + kColumnBlock - 1) / kColumnBlock, items = g.outer * blocks;
  const bool parallel = g.outer * g.R * g.inner >= kParallelGrain;
  const int64_t chunks =
      parallel && items < kColumnSlots
          ? std::max<int64_t>(1, std::min((kColumnSlots + items - 1) / items, g.R / kColumnChunkMinRows))
          : 1;
  auto item_span = [&](int64_t t, int64_t& o, int64_t& i0, int64_t& n) {
    o = t / blocks;
    i0 = (t % blocks) * kColumnBlock;
    n = std::min(kColumnBlock, g.inner - i0);
  };
  if (chunks == 1) {
    parallel_for_if(parallel, items, [&](int64_t t) {
      int64_t o, i0, n;
      item_span(t, o, i0, n);
      A acc[kColumnBlock];
      fold_columns(red, g, x, o, i0, n, 0, g.R, acc);
      for (int64_t j = 0; j < n; ++j) red.store(o * g.inner + i0 + j, acc[j]);
    });
    return;
  }
  const std::unique_ptr<A[]> part(new A[size_t(items * chunks * kColumnBlock)]);
  parallel_for_if(true, items * chunks, [&](int64_t u) {
    int64_t o, i0, n;
    item_span(u / chunks, o, i0, n);
    const int64_t c = u % chunks;
    fold_columns(red, g, x, o, i0, n, c * g.R / chunks, (c + 1) * g.R / chunks, &part[size_t(u * kColumnBlock)]);
  });
  for (int64_t t = 0; t < items; ++t) {
    int64_t o, i0, n;
    item_span(t, o, i0, n);
    for (int64_t j = 0; j < n; ++j) {
      A a = part[size_t(t * chunks * kColumnBlock + j)];
      for (int64_t c = 1; c < chunks; ++c) a = red.combine(a, part[size_t((t * chunks + c) * kColumnBlock + j)]);
      red.store(o * g.inner + i0 + j, a);
    }
  }
}

template <typename Red>
void run(const Red& red, const Tensor& in) {
  const Geometry g = Geometry::of(in);
  const auto* x = static_cast<const typename Red::in_t*>(in.data());
  if (g.inner == 1) reduce_rows(red, g, x);
  else reduce_columns(red, g, x);
}

}  // namespace

void reduce_kernel(ReduceOp op, const Tensor& out, const Tensor& in, int64_t correction) {
  const int64_t R = in.size(1);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      dispatch_all(in.dtype(), op == ReduceOp::Sum ? "sum" : "mean", in.device(), [&]<typename T>() {
        if constexpr (is_floating(dtype_of<T>())) {
          run(reduction::SumReducer<T, double, T>{out.data_ptr<T>(), op == ReduceOp::Mean ? double(R) : 1.0}, in);
        } else {
          run(reduction::SumReducer<T, int64_t, int64_t>{out.data_ptr<int64_t>(), 1}, in);
        }
      });
      return;
    case ReduceOp::Prod:
      dispatch_all(in.dtype(), "prod", in.device(), [&]<typename T>() {
        if constexpr (is_floating(dtype_of<T>())) {
          run(reduction::ProdReducer<T, double, T>{out.data_ptr<T>()}, in);
        } else {
          run(reduction::ProdReducer<T, int64_t, int64_t>{out.data_ptr<int64_t>()}, in);
        }
      });
      return;
    case ReduceOp::Max:
    case ReduceOp::Min:
      reduction::with_bool(op == ReduceOp::Max, [&]<bool IsMax>() {
        dispatch_all(in.dtype(), IsMax ? "amax" : "amin", in.device(), [&]<typename T>() {
          using Acc = opmath_t<T>;
          run(reduction::MinMaxReducer<T, Acc, IsMax>{out.data_ptr<T>(), reduction::extreme_identity<Acc, IsMax>()},
              in);
        });
      });
      return;
    case ReduceOp::Var:
      dispatch_floating(in.dtype(), "var", in.device(), [&]<typename T>() {
        run(reduction::VarReducer<T, double>{out.data_ptr<T>(), correction}, in);
      });
      return;
  }
}

void arg_reduce_kernel(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in) {
  reduction::with_bool(is_max, [&]<bool IsMax>() {
    dispatch_all(in.dtype(), IsMax ? "max" : "min", in.device(), [&]<typename T>() {
      T* v = values.defined() ? values.data_ptr<T>() : nullptr;
      run(reduction::ArgReducer<T, opmath_t<T>, IsMax>{v, indices.data_ptr<int64_t>()}, in);
    });
  });
}

}  // namespace frugal::ops::cpu
