#pragma once
// Eigen products for the CPU kernels, threaded by frugal rather than by Eigen.
//
// Note [Eigen runs single-threaded]
// Eigen's OpenMP GEMM splits one product across the team and synchronizes the threads by
// busy-waiting on shared counters between its packed blocks. On a machine whose cores
// other processes also use, a preempted thread leaves its partner spinning for a whole
// time slice at every block: the Fashion-MNIST CNN's convolution backward, one Eigen-
// threaded product per sample, took 0.5-1 s instead of 5 ms on the loaded 2-core
// development machine (issue 18), and two threads ran a step 7x slower than one. So
// Eigen never threads here: the kernels call serial_eigen() before their products
// (Eigen::setNbThreads(1), process-wide, once), and thread the work themselves over
// independent blocks of the output, handed out dynamically by an OpenMP loop whose idle
// threads wait in the runtime (which yields), not in a spin on Eigen's counters. The
// blocks depend only on the shapes, so a product's bits do not depend on the thread count.
#include <Eigen/Core>

#include <algorithm>
#include <cstdint>

#include "core/threads.h"
#include "tensor/cpu/loops.h"

namespace frugal::ops::cpu {

/// Keeps Eigen's products single-threaded (Note [Eigen runs single-threaded]).
inline void serial_eigen() {
  static const bool once = [] {
    Eigen::setNbThreads(1);
    return true;
  }();
  (void)once;
}

/// Multiply-adds below which a product block is not worth a thread of its own.
constexpr int64_t kGemmBlockMacs = int64_t(1) << 18;

/// out (M, N) = a (M, K) @ b (K, N), or += when `accumulate`: Eigen products over blocks of
/// whole rows (M >= N) or whole columns of out, in parallel when there are several
/// (Note [Eigen runs single-threaded]). Out, A and B are Eigen matrix expressions (maps).
template <typename Out, typename A, typename B>
void blocked_product(Out& out, const A& a, const B& b, bool accumulate) {
  serial_eigen();
  const int64_t M = out.rows(), N = out.cols(), K = a.cols();
  const bool by_rows = M >= N;
  const int64_t dim = by_rows ? M : N;
  const int64_t blocks = std::clamp<int64_t>(std::min(dim / 16, M * N * K / kGemmBlockMacs), 1, 8);
  auto block = [&](int64_t i) {
    const int64_t lo = i * dim / blocks, len = (i + 1) * dim / blocks - lo;
    if (by_rows) {
      if (accumulate) out.middleRows(lo, len).noalias() += a.middleRows(lo, len) * b;
      else out.middleRows(lo, len).noalias() = a.middleRows(lo, len) * b;
    } else {
      if (accumulate) out.middleCols(lo, len).noalias() += a * b.middleCols(lo, len);
      else out.middleCols(lo, len).noalias() = a * b.middleCols(lo, len);
    }
  };
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  if (blocks > 1 && threads > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(int(std::min(threads, blocks)))
    for (int64_t i = 0; i < blocks; ++i) block(i);
  } else {
    for (int64_t i = 0; i < blocks; ++i) block(i);
  }
}

}  // namespace frugal::ops::cpu
