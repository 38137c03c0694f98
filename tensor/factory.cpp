#include "tensor/factory.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "memory/allocator.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/random.h"

namespace frugal {

namespace {
// `strides` by value: empty() hands over the strides it just computed (one Shape
// allocation fewer per new tensor). The caller has checked `sizes` and `strides`
// (Note [Size overflow]); `capacity_elems` is their span.
Tensor make_tensor(const Shape& sizes, Shape strides, int64_t capacity_elems, TensorOptions opts, const char* op) {
  auto storage = std::make_shared<Storage>();
  storage->nbytes = checked_nbytes(capacity_elems, opts.dtype, op, sizes);
  storage->data = memory::allocate(opts.device, storage->nbytes);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = sizes;
  impl->strides = std::move(strides);
  impl->dtype = opts.dtype;
  return Tensor(std::move(impl));
}
}  // namespace

Tensor empty(const Shape& sizes, TensorOptions opts) {
  ContiguousLayout layout = contiguous_layout(sizes, "empty");  // checks the sizes
  return make_tensor(sizes, std::move(layout.strides), layout.numel, opts, "empty");
}

Tensor empty_strided(const Shape& sizes, const Shape& strides, TensorOptions opts) {
  numel_of(sizes, "empty_strided");
  return make_tensor(sizes, strides, strided_span(sizes, strides, "empty_strided"), opts, "empty_strided");
}

Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.options()); }

Tensor full(const Shape& sizes, double value, TensorOptions opts) {
  Tensor t = empty(sizes, opts);
  ops::fill_(t, value);
  return t;
}
Tensor zeros(const Shape& sizes, TensorOptions opts) { return full(sizes, 0.0, opts); }
Tensor ones(const Shape& sizes, TensorOptions opts) { return full(sizes, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.options()); }
Tensor full_like(const Tensor& t, double value) { return full(t.sizes(), value, t.options()); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }

Tensor arange(double start, double end, double step, TensorOptions opts) {
  FRUGAL_CHECK(step != 0.0, "arange: step must be nonzero");
  FRUGAL_CHECK(std::isfinite(start) && std::isfinite(end), "arange: start and end must be finite");
  FRUGAL_CHECK(std::isfinite(step), "arange: step must be finite, got ", step);
  FRUGAL_CHECK(step > 0 ? end >= start : end <= start, "arange: the range [", start, ", ", end,
               ") is inconsistent with the sign of step ", step,
               " (as in PyTorch, this is an error, not an empty tensor)");
  const double count = std::ceil((end - start) / step);
  // 2^63 is exactly representable; converting a double at or above it to int64 is undefined.
  FRUGAL_CHECK(count < 9223372036854775808.0, "arange: [", start, ", ", end, ") in steps of ", step,
               " has too many elements (", count, ")");
  const int64_t n = std::max<int64_t>(0, int64_t(count));
  Tensor t = empty({n}, opts);  // from the arena: an absurd n fails with its OOM message
  ops::arange_fill_(t, start, step);
  return t;
}

Tensor arange(int64_t end, TensorOptions opts) { return arange(0.0, double(end), 1.0, opts); }

// eye is built on the host and copied over: it is made once, never inside a step.
Tensor eye(int64_t n, int64_t m, TensorOptions opts) {
  FRUGAL_CHECK(n >= 0, "eye: n must be >= 0, got ", n);
  FRUGAL_CHECK(m >= -1, "eye: m must be >= 0 (or -1 for m = n), got ", m);
  if (m == -1) m = n;
  numel_of({n, m}, "eye");  // n * m must fit
  Tensor host = zeros({n, m}, {kFloat64, kCPU});
  double* values = host.data_ptr<double>();
  for (int64_t i = 0; i < std::min(n, m); ++i) values[i * m + i] = 1.0;
  return host.to(opts.device, opts.dtype);
}

Tensor rand(const Shape& sizes, TensorOptions opts, Generator* gen) {
  Tensor t = empty(sizes, opts);
  ops::uniform_(t, 0.0, 1.0, gen);
  return t;
}

Tensor randn(const Shape& sizes, TensorOptions opts, Generator* gen) {
  Tensor t = empty(sizes, opts);
  ops::normal_(t, 0.0, 1.0, gen);
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& sizes, TensorOptions opts, Generator* gen) {
  Tensor t = empty(sizes, opts);
  ops::random_int_(t, low, high, gen);
  return t;
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes_in, TensorOptions opts) {
  const Shape sizes = sizes_in.empty() && values.size() != 1 ? Shape{int64_t(values.size())} : sizes_in;
  FRUGAL_CHECK(numel_of(sizes, "from_vector") == int64_t(values.size()), "from_vector: ", values.size(),
               " values do not fill shape ", shape_str(sizes));
  Tensor host = empty(sizes, {dtype_of<T>(), kCPU});
  if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> is packed
    bool* p = host.data_ptr<bool>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else if (!values.empty()) {
    std::memcpy(host.data(), values.data(), values.size() * sizeof(T));
  }
  return host.to(opts.device, opts.dtype);
}

template Tensor from_vector(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<Half>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<BFloat16>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<bool>&, const Shape&, TensorOptions);

}  // namespace frugal
