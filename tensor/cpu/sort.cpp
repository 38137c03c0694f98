// The CPU sort (Note [Sort order] in tensor/ops/sort.h), rows in parallel chunks.
//
// Rows sort as (key, index) pairs (Note [Sort keys] in tensor/ops/sort_key.h). For 4-byte and
// smaller types the key and the index share one uint64 (key high, index low), so one integer
// comparison orders by value and breaks ties by index, and std::sort compares integers instead
// of floats with NaN tests (2-3x faster than an index sort with that comparison); 8-byte types
// compare (key, index) pairs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/sort.h"
#include "tensor/ops/sort_key.h"

namespace frugal::ops::cpu {

namespace {

/// The first k of row's n elements in order: `order` receives their indices.
template <typename T>
void sort_row(const T* row, int64_t n, int64_t k, bool descending, std::vector<int64_t>& order) {
  const auto key = [descending](T v) { return sort_key(v, descending); };
  const auto first_k = [&](auto& items) {
    if (k == n) std::sort(items.begin(), items.end());
    else std::partial_sort(items.begin(), items.begin() + k, items.end());
  };
  if constexpr (sizeof(SortKey<T>) == 4) {
    if (n <= (int64_t(1) << 32)) {
      std::vector<uint64_t> items(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) items[size_t(i)] = (uint64_t(key(row[i])) << 32) | uint64_t(i);
      first_k(items);
      for (int64_t j = 0; j < k; ++j) order[size_t(j)] = int64_t(items[size_t(j)] & 0xffffffffu);
      return;
    }
  }
  std::vector<std::pair<SortKey<T>, int64_t>> items(static_cast<size_t>(n));
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
