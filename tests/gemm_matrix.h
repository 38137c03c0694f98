#pragma once
// A GEMM operand for the kernel tests (test_gemm.cpp, test_gemm_bf16.cpp): a matrix in a
// buffer of its own, laid out as a caller of ops::cpu::gemm may lay it out.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "tensor/cpu/gemm.h"

namespace frugal::testing {

/// A (rows, cols) matrix of uniform(-1, 1) values: row- or column-major, `pad` unused elements
/// after each row (column), filled with NaN so a kernel reading them shows.
template <typename T>
struct GemmMatrix {
  std::vector<T> buffer;
  ops::cpu::GemmOperand<T> op;
  GemmMatrix(int64_t rows, int64_t cols, bool row_major, int64_t pad, std::mt19937& rng) {
    const int64_t ld = (row_major ? cols : rows) + pad, outer = row_major ? rows : cols;
    buffer.assign(size_t(std::max<int64_t>(ld * outer, 1)), T(NAN));
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const double v = u(rng);
        buffer[size_t(row_major ? i * ld + j : i + j * ld)] = std::is_arithmetic_v<T> ? T(v) : T(float(v));
      }
    op = {buffer.data(), rows, cols, ld, row_major};
  }
  /// Element (i, j) in float64 (a 16-bit type through float, which holds it exactly).
  double at(int64_t i, int64_t j) const {
    const T& v = op.data[op.row_major ? i * op.ld + j : i + j * op.ld];
    if constexpr (std::is_arithmetic_v<T>) return double(v);
    else return double(float(v));
  }
};

}  // namespace frugal::testing
