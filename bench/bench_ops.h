#pragma once
// bench_ops: the CPU and CUDA halves of the op benchmark (bench_ops.cpp, bench_ops_cuda.cpp).
#include "bench/bench_util.h"

namespace frugal::bench {

struct Options {
  bool cuda = false;   // --device cuda
  bool quick = false;  // --quick: fewer sizes and repetitions
};

/// matmul vs raw Eigen, tiny-op and allocation overhead on the host.
void run_cpu_benchmarks(const Options& o, KeyFigures& keys);

/// Throws frugal::Error, saying why, in a build without CUDA or on a machine without a GPU.
void require_cuda();

/// Elementwise bandwidth vs cudaMemcpy, matmul vs raw cuBLAS, allocator vs cudaMalloc.
void run_cuda_benchmarks(const Options& o, KeyFigures& keys);

}  // namespace frugal::bench
