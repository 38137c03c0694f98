#pragma once
// ElementwiseLayout: how N operands of one elementwise op are laid out, shared by
// the CPU loops and the CUDA kernels (in the spirit of PyTorch's TensorIterator).
//
// Note [Elementwise layout]
// Every operand is described in the output's shape: broadcast dims get stride 0.
// Adjacent dims that are contiguous with each other in *every* operand are
// merged ("coalesced"), so a contiguous tensor becomes 1-D and a transposed one
// stays 2-D. Kernels then walk at most kMaxDims dims with plain integer math.
// When every operand is dense and in the same order (`contiguous`), kernels take
// a flat fast path (vectorized loads on CUDA).
//
// Note [Elementwise dim order]
// Before coalescing, the dims are put in the output's memory order (largest stride
// outermost), as TensorIterator does: element order does not matter to an elementwise
// op, and a channels-last (NHWC) output and inputs then coalesce to one contiguous dim
// and take the flat path. Walked in logical (N, C, H, W) order they would stay 3-D
// with the innermost step C elements apart, so neighbouring GPU threads would touch
// memory C elements apart: the residual-gradient sums of a ResNet-50 backward would
// run at a fraction of memory bandwidth. An output with a stride-0 dim (an accumulator, as in
// scatter_add) keeps the logical order, which its summation order depends on.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "tensor/tensor.h"

namespace frugal {

constexpr int kMaxDims = 12;
constexpr int kMaxOperands = 4;

struct ElementwiseLayout {
  int ndim = 0;
  int noperands = 0;
  int64_t numel = 0;
  bool contiguous = false;  // every operand dense, row-major, no broadcast
  // sizes[d], innermost dim last; strides[op][d] in elements (0 where broadcast)
  std::array<int64_t, kMaxDims> sizes{};
  std::array<std::array<int64_t, kMaxDims>, kMaxOperands> strides{};
  std::array<char*, kMaxOperands> data{};  // base pointers (offset applied)
  std::array<DType, kMaxOperands> dtypes{};
};

/// Builds the layout for `out` (operand 0, must have the broadcast shape) and `inputs`
/// (each broadcastable to out's shape). Throws naming `op` on shape mismatch.
ElementwiseLayout make_elementwise_layout(const char* op, const Tensor& out, std::initializer_list<Tensor> inputs);

// Note [Elementwise output layout]
// A new elementwise result takes the memory order its inputs suggest, as PyTorch's
// TensorIterator does, restricted to the two orders frugal's ops care about: the first
// input of the output's 4-D shape with a definite layout decides, channels-last
// (Note [Channels-last layout] in tensor/memory_format.h) or contiguous. Broadcast
// inputs, ambiguous ones (both layouts at once) and other strided ones decide nothing;
// with no decision the result is contiguous. So relu(x) and x + residual on NHWC
// activations stay NHWC, and a kernel's loads and stores both run along C.

/// Whether `a` and `b` may share an element: the same storage and intersecting spans of
/// element offsets (conservative: two interleaved views count as overlapping). An op that
/// writes `a` while it reads `b` copies `b` first when this holds, unless both are the
/// same view (each element is then read before it is written).
bool may_overlap(const Tensor& a, const Tensor& b);

/// Throws, naming `op`, if `out` has elements that share memory (a dimension of size > 1
/// and stride 0: an expanded view), which a write would make hold only the last of their
/// values. As PyTorch's assert_no_internal_overlap; fill_ and zero_, which write one value
/// everywhere, do not call it.
void check_no_internal_overlap(const char* op, const Tensor& out);

/// The uninitialized result of an elementwise op of `shape`: channels-last when `inputs`
/// suggest it (Note [Elementwise output layout]), else contiguous.
Tensor empty_elementwise_output(const Shape& shape, TensorOptions opts, std::initializer_list<const Tensor*> inputs);

}  // namespace frugal
