#pragma once
// Singular value decomposition, with torch.linalg.svd(full_matrices=False)'s conventions.
//
// A raw op only: nothing here is differentiable. SVD serves weight compression
// (nn/low_rank.h), which runs once, under no grad, on trained weights; the
// backward of SVD (ill-conditioned where singular values meet) is not needed there.
#include "tensor/tensor.h"

namespace frugal::ops {

/// The thin SVD A = U diag(S) Vh of a (..., m, n) tensor, k = min(m, n).
struct SVDResult {
  Tensor U;   ///< (..., m, k), orthonormal columns
  Tensor S;   ///< (..., k), non-negative, descending
  Tensor Vh;  ///< (..., k, n), orthonormal rows
};

/// Thin SVD of every matrix of `a` (..., m, n); leading dims are a batch. float32 and
/// float64, on the CPU (Eigen: JacobiSVD for k <= 16, BDCSVD above) and on CUDA
/// (cuSOLVER gesvdj; gesvdjBatched for batches of matrices up to 32 x 32). Singular
/// vectors are unique only up to sign (and rotation within repeated singular values),
/// so the backends may differ there; U diag(S) Vh is what they agree on. The input must
/// be finite. Not differentiable (see the note at the top of this header). On CUDA it
/// waits for the device to read the solver's convergence flags.
SVDResult svd(const Tensor& a);

}  // namespace frugal::ops

// Backend kernels. The front-end has validated `a`, made it contiguous (B, m, n) and
// allocated the outputs (contiguous); B, m and n are all positive here.
namespace frugal::ops::cpu {
// a: (B, m, n); U: (B, m, k); S: (B, k); Vh: (B, k, n)
void svd_kernel(const Tensor& a, const Tensor& U, const Tensor& S, const Tensor& Vh);
}  // namespace frugal::ops::cpu

namespace frugal::ops::cuda {
// a: (B, m, n); U: (B, m, k); S: (B, k); Vh: (B, k, n)
void svd_kernel(const Tensor& a, const Tensor& U, const Tensor& S, const Tensor& Vh);
}  // namespace frugal::ops::cuda
