#pragma once
// Dropout as a raw op over the Philox stream (the differentiable form is
// frugal::dropout in autograd/ops/dropout.h).
//
// Note [Dropout mask from counters]
// Element i (row-major in x's shape) of a dropout over the counter range
// (seed, first) is kept iff philox_uniform(word i % 4 of philox4x32(seed, first + i / 4))
// < 1 - p (computed in float), and a kept element is scaled by 1 / (1 - p): the mask
// is Bernoulli(1 - p), as torch.nn.functional.dropout, and it is the same stream on the
// CPU and on CUDA (Note [Counter-based RNG]). The mask is a pure function of the
// Generator::Range, so the backward re-creates it from those 16 bytes instead of
// keeping an n-byte mask alive between forward and backward, and a checkpoint
// recompute that replays the range reproduces the forward bit for bit. One Philox call
// yields the four words of four neighbouring elements, so each thread (CUDA) or loop
// step (CPU) handles four elements per call. A dropped element is x * 0, not a 0 put in
// its place, as PyTorch's x * mask: an inf or NaN there still gives NaN (a select hid a
// corrupted sample whose inf was dropped, and GradScaler or LossWatch never saw it), and a
// dropped negative value gives -0. p == 1 is x * 0 likewise.
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal::ops {

/// The output of dropout and the counter range its mask came from.
struct DropoutResult {
  Tensor out;
  Generator::Range range;
};

/// x * mask / (1 - p) with mask ~ Bernoulli(1 - p), drawing (numel + 3) / 4 counters from
/// `gen` (default: the process generator). p in [0, 1]; p == 0 gives a copy of x and p == 1
/// x * 0 (zeros, NaN where x is inf or NaN), neither drawing counters. Floating dtypes; fresh contiguous output.
DropoutResult dropout(const Tensor& x, double p, Generator* gen = nullptr);

/// x * mask / (1 - p) with the mask of an earlier dropout over `range` (its backward, or a
/// recompute): the same elements are kept. p as in that call.
Tensor dropout_with_range(const Tensor& x, double p, Generator::Range range);

}  // namespace frugal::ops

// Backend kernels: out, x contiguous with n = numel > 0 elements, 0 < p < 1.
namespace frugal::ops::cpu {
/// out, x: (n)
void dropout_kernel(const Tensor& out, const Tensor& x, double p, Generator::Range range);
/// The scalar loop, for every dtype: what dropout_kernel runs but for float32, and the reference
/// its vectorized float32 kernels are tested and timed against (Note [Vectorized dropout]).
void dropout_kernel_generic(const Tensor& out, const Tensor& x, double p, Generator::Range range);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void dropout_kernel(const Tensor& out, const Tensor& x, double p, Generator::Range range);
}  // namespace frugal::ops::cuda
