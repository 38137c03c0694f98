// The CPU sort (Note [Sort order] in tensor/ops/sort.h): each row's indices ordered by a
// comparison that breaks ties by index, rows in parallel chunks.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/sort.h"

namespace frugal::ops::cpu {

namespace {

/// a before b in ascending order: NaN above every number; -0 == +0 (neither before the other).
template <typename K>
bool ascends(K a, K b) {
  if constexpr (std::is_floating_point_v<K>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

/// The key a value is compared by: 16-bit types as float, the others as they are.
template <typename T>
using Key = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

}  // namespace

void sort_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, bool descending) {
  const int64_t rows = x.size(0), L = x.size(1), k = indices.size(1);
  dispatch_numeric(x.dtype(), "sort", x.device(), [&]<typename T>() {
    using K = Key<T>;
    const T* in = x.data_ptr<T>();
    T* out = values.defined() ? values.data_ptr<T>() : nullptr;
    int64_t* idx_out = indices.data_ptr<int64_t>();
    const double log_l = std::log2(double(std::max<int64_t>(L, 2)));
    parallel_chunks(rows, int64_t(double(L) * log_l) + 1, [&](int64_t begin, int64_t end) {
      std::vector<K> keys(static_cast<size_t>(L));
      std::vector<int64_t> order(static_cast<size_t>(L));
      for (int64_t r = begin; r < end; ++r) {
        const T* row = in + r * L;
        for (int64_t i = 0; i < L; ++i) keys[size_t(i)] = K(row[i]);
        std::iota(order.begin(), order.end(), int64_t(0));
        // Ties (neither value before the other) in index order: one order for every algorithm.
        const auto before = [&](int64_t a, int64_t b) {
          const K va = keys[size_t(a)], vb = keys[size_t(b)];
          const bool first = descending ? ascends(vb, va) : ascends(va, vb);
          const bool second = descending ? ascends(va, vb) : ascends(vb, va);
          return first || (!second && a < b);
        };
        if (k == L) std::sort(order.begin(), order.end(), before);
        else std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        for (int64_t j = 0; j < k; ++j) idx_out[r * k + j] = order[size_t(j)];
        if (out)
          for (int64_t j = 0; j < k; ++j) out[r * k + j] = row[order[size_t(j)]];
      }
    });
  });
}

}  // namespace frugal::ops::cpu
