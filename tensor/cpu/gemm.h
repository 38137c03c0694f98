#pragma once
// The CPU matrix product every CPU kernel calls (matmul, linear, bmm, conv2d and their
// gradients): Eigen's GEMM, compiled once per x86-64 instruction-set level and picked at run
// time (Note [GEMM kernels per instruction set] in tensor/cpu/gemm.cpp), threaded by frugal.
// No Eigen here: the kernels' translation units include Eigen under a name of their own.
//
// Note [Eigen runs single-threaded]
// Eigen's OpenMP GEMM splits one product across the team and synchronizes the threads by
// busy-waiting on shared counters between its packed blocks. On a machine whose cores
// other processes also use, a preempted thread leaves its partner spinning for a whole
// time slice at every block: the Fashion-MNIST CNN's convolution backward, one Eigen-
// threaded product per sample, took 0.5-1 s instead of 5 ms on the loaded 2-core
// development machine (issue 18), and two threads ran a step 7x slower than one. So
// Eigen never threads here: the GEMM kernels are built without OpenMP (and svd.cpp, the other
// Eigen product, defines EIGEN_DONT_PARALLELIZE), and gemm() threads the work itself over independent blocks of
// the output, handed out dynamically by an OpenMP loop whose idle threads wait in the
// runtime (which yields), not in a spin on Eigen's counters. The blocks depend only on the
// shapes, so a product's bits do not depend on the thread count.
#include <cstdint>

namespace frugal {
struct BFloat16;
}

namespace frugal::ops::cpu {

/// A (rows, cols) matrix where it lies: element (i, j) at data[i * ld + j] when row_major,
/// else at data[i + j * ld] (a transposed or column-major view costs no copy).
template <typename T>
struct GemmOperand {
  const T* data;
  int64_t rows, cols, ld;
  bool row_major;

  GemmOperand transposed() const { return {data, cols, rows, ld, !row_major}; }
  /// Rows [lo, lo + n) / columns [lo, lo + n), still in place.
  GemmOperand row_block(int64_t lo, int64_t n) const {
    return {data + lo * (row_major ? ld : 1), n, cols, ld, row_major};
  }
  GemmOperand col_block(int64_t lo, int64_t n) const {
    return {data + lo * (row_major ? 1 : ld), rows, n, ld, row_major};
  }
};

/// A contiguous row-major (rows, cols) matrix.
template <typename T>
GemmOperand<T> row_major_matrix(const T* data, int64_t rows, int64_t cols) {
  return {data, rows, cols, cols, true};
}

/// Multiply-adds below which a product (a block of one, or a batch of them) is not worth a
/// thread of its own.
inline constexpr int64_t kGemmBlockMacs = int64_t(1) << 18;

/// out (a.rows, b.cols), row-major with leading dimension ldc, = a @ b, or += a @ b when
/// `accumulate`; split into blocks of rows or columns of out run on the op's threads. Bits do
/// not depend on the thread count (Note [CPU determinism]).
void gemm(const GemmOperand<float>& a, const GemmOperand<float>& b, float* out, int64_t ldc, bool accumulate);
void gemm(const GemmOperand<double>& a, const GemmOperand<double>& b, double* out, int64_t ldc, bool accumulate);

/// The same on the calling thread alone (a caller that threads over a batch of products).
void gemm_serial(const GemmOperand<float>& a, const GemmOperand<float>& b, float* out, int64_t ldc, bool accumulate);
void gemm_serial(const GemmOperand<double>& a, const GemmOperand<double>& b, double* out, int64_t ldc, bool accumulate);

/// True when bfloat16 products run on AVX512-BF16's dot-product instruction: the CPU has it
/// and the level in use is x86-64-v4 (Note [bfloat16 GEMM] in tensor/cpu/gemm_bf16_kernel.cpp).
/// Otherwise callers multiply float32 copies.
bool gemm_bf16_native();
/// out (a.rows, b.cols), float32, = a @ b, or += a @ b when `accumulate`, for bfloat16
/// operands; requires gemm_bf16_native(). Threaded as gemm(), or on the calling thread alone.
void gemm(const GemmOperand<BFloat16>& a, const GemmOperand<BFloat16>& b, float* out, int64_t ldc, bool accumulate);
void gemm_serial(const GemmOperand<BFloat16>& a, const GemmOperand<BFloat16>& b, float* out, int64_t ldc,
                 bool accumulate);

/// The x86-64 instruction-set levels the GEMM (and the float32 GELU, tensor/cpu/gelu_kernel.h) is
/// compiled for; gemm_isa() picks the level of both.
enum class GemmIsa { X86_64_V2, X86_64_V3, X86_64_V4 };

/// "x86-64-v2" (SSE4.2), "x86-64-v3" (AVX2, FMA), "x86-64-v4" (AVX-512).
const char* gemm_isa_name(GemmIsa isa);
/// The level in use: the widest this CPU runs, unless FRUGAL_CPU_ISA (one of the names above)
/// or set_gemm_isa chose a narrower one.
GemmIsa gemm_isa();
/// True when this CPU (and its OS) runs code built for `isa`.
bool cpu_supports(GemmIsa isa);
/// Uses `isa`'s kernels from now on, process-wide (tests compare the levels); throws when the
/// CPU cannot run them.
void set_gemm_isa(GemmIsa isa);

}  // namespace frugal::ops::cpu
