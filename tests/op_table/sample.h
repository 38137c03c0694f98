#pragma once
// Inputs for the differential op tests (tests/op_table/op_table.h): a seeded generator,
// random shapes, random memory layouts of a logical shape, and float64 host copies read
// element by element through the strides, so that neither the inputs nor the reference
// values pass through the kernels under test.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::optest {

/// splitmix64: seedable and independent of frugal's Philox stream.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next();
  /// Uniform in [lo, hi] (inclusive).
  int64_t range(int64_t lo, int64_t hi);
  double uniform(double lo, double hi);
  bool chance(double p) { return uniform(0.0, 1.0) < p; }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[size_t(range(0, int64_t(v.size()) - 1))];
  }

 private:
  uint64_t s_;
};

/// A float64 copy of a tensor's elements, row-major in its logical shape.
struct Host {
  bool defined = true;
  Shape sizes;
  std::vector<double> v;

  int64_t dim() const { return int64_t(sizes.size()); }
  int64_t numel() const { return int64_t(v.size()); }
  int64_t size(int64_t d) const { return sizes[size_t(d < 0 ? d + dim() : d)]; }
  /// Row-major position of a multi-index.
  int64_t pos(const std::vector<int64_t>& idx) const;
  double at(const std::vector<int64_t>& idx) const { return v[size_t(pos(idx))]; }
  double& at(const std::vector<int64_t>& idx) { return v[size_t(pos(idx))]; }
  /// The element read at index `idx` of a shape this one broadcasts to (NumPy rules).
  double at_broadcast(const std::vector<int64_t>& idx) const;
};
/// A zero-filled Host of `sizes`.
Host host_zeros(const Shape& sizes);
/// The undefined Host (an optional tensor that is absent).
inline Host host_undefined() { return Host{false, {}, {}}; }
/// Reads a CPU tensor element by element through its sizes, strides and offset.
Host read_host(const Tensor& t);

/// Calls f(idx) for every multi-index of `shape`, in row-major order.
void for_each_index(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& f);
/// NumPy broadcasting of two shapes, or throws std::invalid_argument.
Shape broadcast(const Shape& a, const Shape& b);

/// How the values of an input are drawn.
struct Values {
  double lo = -2.0, hi = 2.0;
  double step = 0.0;       // > 0: multiples of `step` only (ties, exact comparisons)
  double min_abs = 0.0;    // redraw values closer to 0 than this (divisors, reciprocals)
  double p_nan = 0.0;      // floating dtypes: a NaN with this probability
  double p_neg_inf = 0.0;  // floating dtypes: -inf with this probability (masks)
  double p_pos_inf = 0.0;  // floating dtypes: +inf with this probability
};
/// `v` with NaN and infinities mixed in, in about one case of seven: for the ops whose
/// handling of them is defined (comparisons, max/min, sums, softmax, relu, clamp).
Values with_specials(Rng& rng, Values v, bool infinities = true);

/// Which layouts an input may take.
struct LayoutOptions {
  bool expand = true;   // stride-0 (broadcast) dims: read-only inputs only
  bool strided = true;  // permuted dims, steps, a storage offset
};

/// A CPU tensor of logical `shape` and `dtype` in a random layout: dims permuted
/// (transposes, channels-last), sliced with steps, at a storage offset, size-1 dims
/// expanded (stride 0). Every storage element holds a random value, the ones the view
/// skips included, so a kernel that reads outside the view gives a wrong answer.
Tensor random_input(Rng& rng, const Shape& shape, DType dtype, const Values& values = {},
                    const LayoutOptions& layout = {});
/// A tensor of `shape` holding `values` (row-major), in a random non-expanded layout
/// when `rng` is given, else contiguous.
Tensor tensor_of(const std::vector<double>& values, const Shape& shape, DType dtype, Rng* rng = nullptr);

/// Random shapes: size-0, size-1 and odd sizes included.
struct ShapeOptions {
  int min_dims = 0, max_dims = 4;
  int64_t max_size = 9;     // of one dim, before the numel cap
  int64_t max_numel = 600;  // larger shapes are shrunk
  double p_zero = 0.04;     // per dim
  double p_one = 0.2;       // per dim
};
Shape random_shape(Rng& rng, const ShapeOptions& options = {});
/// A shape of 2 to 4 dims with at least `min_numel` elements: large enough for the
/// kernels' threaded paths (kParallelGrain in tensor/cpu/loops.h), odd sizes.
Shape big_shape(Rng& rng, int64_t min_numel = 70000);
/// One dim's size in [0, max_size]: 0 with p_zero, 1 with p_one.
int64_t random_size(Rng& rng, int64_t max_size, double p_zero = 0.04, double p_one = 0.2);

/// "float16[3, 4] strides [1, 3] offset 2" (or "undefined").
std::string describe(const Tensor& t);
/// "[1, 2, 3]"
std::string str(const std::vector<int64_t>& v);

/// One element of runtime dtype t at p, as a double; and the reverse (rounded to t).
double load_element(const void* p, DType t);
void store_element(void* p, DType t, double v);

}  // namespace frugal::optest
