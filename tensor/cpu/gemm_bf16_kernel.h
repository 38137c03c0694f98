#pragma once
// The bfloat16 GEMM on AVX512-BF16's dot-product instruction, built once with x86-64-v4 and
// -mavx512bf16 (Note [bfloat16 GEMM] in tensor/cpu/gemm_bf16_kernel.cpp). Called through
// gemm() in tensor/cpu/gemm.h, which threads it and gives it its workspace.
#include <cstdint>

namespace frugal::ops::cpu::v4 {

/// A (rows, cols) bfloat16 matrix as raw bits: element (i, j) at data[i * row_stride + j * col_stride].
struct Bf16Matrix {
  const uint16_t* data;
  int64_t rows, cols, row_stride, col_stride;
};

/// Bytes of 64-byte-aligned workspace gemm_bf16 needs, whatever the shapes.
int64_t gemm_bf16_workspace_bytes();

/// out (a.rows, b.cols), float32 row-major with leading dimension ldc, = a @ b, or += a @ b
/// when `accumulate`; serial.
void gemm_bf16(const Bf16Matrix& a, const Bf16Matrix& b, float* out, int64_t ldc, bool accumulate, void* workspace);

}  // namespace frugal::ops::cpu::v4
