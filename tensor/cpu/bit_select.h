#pragma once
// A select by bits for the CPU's elementwise loops: c ? a : b as a blend of the operands' bytes,
// with no branch. Compiled as written, such a select becomes a branch wherever one side costs
// work or a load the source does not do for the other (the compiler may not add it), which
// random conditions mispredict half the time and which keeps the loop scalar; the blend reads
// both sides and vectorizes, giving the same bytes. Used by where and leaky_relu.
#include <bit>
#include <cstdint>
#include <type_traits>

namespace frugal::ops::cpu {

/// The unsigned integer of T's size (void when there is none).
template <typename T>
using SameSizeUint = std::conditional_t<
    sizeof(T) == 1, uint8_t,
    std::conditional_t<sizeof(T) == 2, uint16_t,
                       std::conditional_t<sizeof(T) == 4, uint32_t, std::conditional_t<sizeof(T) == 8, uint64_t, void>>>>;

/// c ? a : b, the chosen operand's bytes, without a branch.
template <typename T>
inline T bit_select(bool c, T a, T b) {
  using U = SameSizeUint<T>;
  static_assert(std::is_trivially_copyable_v<T> && !std::is_void_v<U>, "bit_select: a type of 1, 2, 4 or 8 bytes");
  const U keep_a = U(U(0) - U(c));
  return std::bit_cast<T>(U((std::bit_cast<U>(a) & keep_a) | (std::bit_cast<U>(b) & U(~keep_a))));
}

}  // namespace frugal::ops::cpu
