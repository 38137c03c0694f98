#pragma once
// How many threads the CPU kernels use for one op, as torch.get_num_threads /
// torch.set_num_threads: OpenMP's team size (its nthreads-var), 1 in a build without OpenMP.

// Note [CPU determinism]
// What a seeded CPU run may rely on (tests/cpu/test_probe_determinism.cpp checks each point).
// 1. Run to run: at a fixed thread count, every op gives the same bits every time. No CPU
//    kernel lets the OS's scheduling decide an order of floating-point operations: work is
//    split by the sizes and the thread count only (Note [Chunked parallel loops]), partial
//    results are combined in a fixed order, and duplicate indices (scatter_add, index_add,
//    embedding's and gather's backward) are accumulated serially (Note [Scatter
//    accumulation]). So an OpenMP reduction clause on floats is not used: it adds the
//    threads' partials in the order they finish (clip_grad_norm_'s norm once changed in its
//    last bits from run to run that way).
// 2. Across thread counts: elementwise ops, random fills and dropout (Note [Counter-based
//    RNG]), matmul/linear/bmm and their input and weight gradients (Note [Eigen runs
//    single-threaded]), conv2d and its gradients (Note [CPU convolution threading]),
//    layer_norm and batch_norm with their gradients, softmax, log_softmax, cross_entropy,
//    flash_attention, the index ops and clip_grad_norm_ give the same bits for any thread
//    count. So does the sum family (sum, mean, var, and what is built on them: a bias
//    gradient, the gradient of a broadcast operand, a mean loss): a long row or column is cut
//    into chunks by its sizes alone and the chunks are added in order (Note [Reduction chunks
//    follow the sizes] in tensor/cpu/reduce.cpp), where PyTorch's CPU reductions
//    (at::parallel_reduce) cut one chunk per thread. amax and amin are exact in any order.
//    So a seeded CPU run gives the same bits at any thread count.
// 2b. Across machines: the matrix products run the widest x86-64 level's GEMM the CPU has
//    (Note [GEMM kernels per instruction set] in tensor/cpu/gemm.cpp), and FMA rounds a
//    multiply-add once where x86-64-v2 rounds twice, so bits may differ between an AVX2 and
//    an older machine; FRUGAL_CPU_ISA=x86-64-v2 reproduces the baseline's on any of them.
// 3. Random numbers: the default generator is one process-wide (seed, offset) pair; a draw
//    reserves counters under its lock, so its numbers depend only on the draws made from it
//    before, never on threads drawing from generators of their own (a DataLoader's
//    augmentations draw from one generator per sample: Note [Per-sample randomness]). Two
//    threads drawing from the default generator at once get disjoint numbers in an order
//    that depends on the scheduling; give each thread its own Generator instead.
// The DataLoader's batches do not depend on its worker count, so a seeded training run
// repeats bit for bit at a fixed thread count whatever the loader's workers.

namespace frugal {

/// The threads an op started from this thread may use (OMP_NUM_THREADS or the core count
/// unless set_num_threads changed it).
int get_num_threads();
/// Sets that number (n >= 1) for the ops this thread starts afterwards, as
/// omp_set_num_threads does; threads started later (data-loader workers) keep the default.
void set_num_threads(int n);

}  // namespace frugal
