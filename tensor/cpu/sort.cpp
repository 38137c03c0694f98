// The CPU sort (Note [Sort order] in tensor/ops/sort.h), rows in parallel chunks.
//
// Note [CPU sort keys]
// Each element becomes an unsigned key whose integer order is the sort's: a float's bits with the
// sign bit flipped (negative values: every bit flipped), NaN the largest key, -0 the key of +0;
// an integer with its sign bit flipped; 16-bit types through float. Descending complements the
// keys. For 4-byte and smaller types the key and the element's index share one uint64 (key high,
// index low), so one integer comparison orders by value and breaks ties by index: any sorting
// algorithm gives Note [Sort order]'s one order, and std::sort compares integers instead of
// floats with NaN tests (2-3x faster than an index sort with that comparison). 8-byte types
// compare (key, index) pairs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/sort.h"

namespace frugal::ops::cpu {

namespace {

/// The unsigned key type of T: 64 bits for 8-byte types, 32 for the others.
template <typename T>
using KeyOf = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;

/// x's key in ascending order (Note [CPU sort keys]).
template <typename T>
KeyOf<T> ascending_key(T x) {
  if constexpr (std::is_same_v<T, int32_t>) {
    return uint32_t(x) ^ 0x80000000u;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return uint64_t(x) ^ 0x8000000000000000ull;
  } else {
    using F = std::conditional_t<std::is_same_v<T, double>, double, float>;
    using U = KeyOf<T>;
    const F f = F(x);
    if (std::isnan(f)) return ~U(0);
    U bits;
    const F nonzero = f == F(0) ? F(0) : f;  // -0 sorts as +0
    std::memcpy(&bits, &nonzero, sizeof(bits));
    constexpr U kSign = U(1) << (8 * sizeof(U) - 1);
    return (bits & kSign) ? U(~bits) : U(bits | kSign);
  }
}

/// The first k of row's n elements in order: `order` receives their indices.
template <typename T>
void sort_row(const T* row, int64_t n, int64_t k, bool descending, std::vector<int64_t>& order) {
  const auto key = [descending](T v) {
    const KeyOf<T> a = ascending_key(v);
    return descending ? KeyOf<T>(~a) : a;
  };
  const auto first_k = [&](auto& items) {
    if (k == n) std::sort(items.begin(), items.end());
    else std::partial_sort(items.begin(), items.begin() + k, items.end());
  };
  if constexpr (sizeof(KeyOf<T>) == 4) {
    if (n <= (int64_t(1) << 32)) {
      std::vector<uint64_t> items(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) items[size_t(i)] = (uint64_t(key(row[i])) << 32) | uint64_t(i);
      first_k(items);
      for (int64_t j = 0; j < k; ++j) order[size_t(j)] = int64_t(items[size_t(j)] & 0xffffffffu);
      return;
    }
  }
  std::vector<std::pair<KeyOf<T>, int64_t>> items(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) items[size_t(i)] = {key(row[i]), i};
  first_k(items);
  for (int64_t j = 0; j < k; ++j) order[size_t(j)] = items[size_t(j)].second;
}

}  // namespace

void sort_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending) {
  const int64_t rows = x.size(0), L = x.size(1), k = indices.size(1);
  dispatch_numeric(x.dtype(), "sort", x.device(), [&]<typename T>() {
    const T* in = x.data_ptr<T>();
    T* out = values.defined() ? values.data_ptr<T>() : nullptr;  // undefined: argsort
    int64_t* idx_out = indices.data_ptr<int64_t>();
    const double log_l = std::log2(double(std::max<int64_t>(L, 2)));
    parallel_chunks(rows, int64_t(double(L) * log_l) + 1, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> order(static_cast<size_t>(k));
      for (int64_t r = begin; r < end; ++r) {
        const T* row = in + r * L;
        sort_row(row, L, k, descending, order);
        for (int64_t j = 0; j < k; ++j) idx_out[r * k + j] = order[size_t(j)];
        if (out)
          for (int64_t j = 0; j < k; ++j) out[r * k + j] = row[order[size_t(j)]];
      }
    });
  });
}

}  // namespace frugal::ops::cpu
