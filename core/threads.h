#pragma once
// How many threads the CPU kernels use for one op, as torch.get_num_threads /
// torch.set_num_threads: OpenMP's team size (its nthreads-var), 1 in a build without OpenMP.

namespace frugal {

/// The threads an op started from this thread may use (OMP_NUM_THREADS or the core count
/// unless set_num_threads changed it).
int get_num_threads();
/// Sets that number (n >= 1) for the ops this thread starts afterwards, as
/// omp_set_num_threads does; threads started later (data-loader workers) keep the default.
void set_num_threads(int n);

}  // namespace frugal
