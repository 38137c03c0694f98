#include "tests/op_table/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "tensor/factory.h"

namespace frugal::optest {

uint64_t Rng::next() {
  uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t Rng::range(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return lo + int64_t(next() % uint64_t(hi - lo + 1));
}

double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) * 0x1.0p-53; }

int64_t Host::pos(const std::vector<int64_t>& idx) const {
  int64_t p = 0;
  for (size_t d = 0; d < sizes.size(); ++d) p = p * sizes[d] + idx[d];
  return p;
}

double Host::at_broadcast(const std::vector<int64_t>& idx) const {
  const size_t lead = idx.size() - sizes.size();
  int64_t p = 0;
  for (size_t d = 0; d < sizes.size(); ++d) p = p * sizes[d] + (sizes[d] == 1 ? 0 : idx[lead + d]);
  return v[size_t(p)];
}

Host host_zeros(const Shape& sizes) { return Host{true, sizes, std::vector<double>(size_t(numel_of(sizes)), 0.0)}; }

void for_each_index(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& f) {
  const int64_t n = numel_of(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

Shape broadcast(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) throw std::invalid_argument("shapes do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

double load_element(const void* p, DType t) {
  switch (t) {
    case DType::Float32: return *static_cast<const float*>(p);
    case DType::Float16: return float(*static_cast<const Half*>(p));
    case DType::BFloat16: return float(*static_cast<const BFloat16*>(p));
    case DType::Float64: return *static_cast<const double*>(p);
    case DType::Int32: return *static_cast<const int32_t*>(p);
    case DType::Int64: return double(*static_cast<const int64_t*>(p));
    case DType::Bool: return *static_cast<const bool*>(p) ? 1.0 : 0.0;
    case DType::UInt8: return *static_cast<const uint8_t*>(p);
  }
  return 0.0;
}

void store_element(void* p, DType t, double v) {
  switch (t) {
    case DType::Float32: *static_cast<float*>(p) = float(v); return;
    case DType::Float16: *static_cast<Half*>(p) = Half(float(v)); return;
    case DType::BFloat16: *static_cast<BFloat16*>(p) = BFloat16(float(v)); return;
    case DType::Float64: *static_cast<double*>(p) = v; return;
    case DType::Int32: *static_cast<int32_t*>(p) = int32_t(std::llround(v)); return;
    case DType::Int64: *static_cast<int64_t*>(p) = int64_t(std::llround(v)); return;
    case DType::Bool: *static_cast<bool*>(p) = v != 0.0; return;
    case DType::UInt8: *static_cast<uint8_t*>(p) = uint8_t(std::llround(v)); return;
  }
}

Host read_host(const Tensor& t) {
  if (!t.defined()) return host_undefined();
  FRUGAL_CHECK(t.device().is_cpu(), "read_host: expects a CPU tensor, got ", t.describe());
  Host h{true, t.sizes(), std::vector<double>(size_t(t.numel()))};
  const char* base = static_cast<const char*>(t.data());
  const int64_t es = int64_t(t.element_size());
  size_t i = 0;
  for_each_index(t.sizes(), [&](const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
    h.v[i++] = load_element(base + off * es, t.dtype());
  });
  return h;
}

namespace {

/// Where a random layout puts a logical shape in its storage.
struct Placement {
  Shape strides;
  int64_t offset = 0, capacity = 0;
};

Placement random_placement(Rng& rng, const Shape& shape, const LayoutOptions& layout) {
  const size_t n = shape.size();
  std::vector<bool> expanded(n, false);
  if (layout.expand && rng.chance(0.2))
    for (size_t d = 0; d < n; ++d) expanded[d] = shape[d] > 1 && rng.chance(0.4);
  // Memory dim i holds logical dim perm[i] (outermost first).
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  if (layout.strided && n >= 2 && rng.chance(0.45)) {
    if (n == 4 && rng.chance(0.4)) perm = {0, 2, 3, 1};  // channels-last
    else if (rng.chance(0.4)) std::swap(perm[n - 1], perm[n - 2]);
    else
      for (size_t i = n; i-- > 1;) std::swap(perm[i], perm[size_t(rng.range(0, int64_t(i)))]);
  }
  const bool stepped = layout.strided && rng.chance(0.35);
  std::vector<int64_t> mem(n), step(n, 1), start(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t d = perm[i];
    const int64_t b = expanded[size_t(d)] ? 1 : shape[size_t(d)];
    int64_t pad = 0;
    if (stepped) {
      if (rng.chance(0.35)) step[i] = rng.range(2, 3);
      if (rng.chance(0.35)) pad = rng.range(1, 2);
      start[i] = rng.range(0, pad);
    }
    mem[i] = b == 0 ? pad : (b - 1) * step[i] + 1 + pad;
  }
  Placement p;
  p.strides.assign(n, 0);
  p.offset = layout.strided && rng.chance(0.3) ? rng.range(1, 5) : 0;
  int64_t stride = 1, start_offset = 0;
  for (size_t i = n; i-- > 0;) {
    const int64_t d = perm[i];
    if (!expanded[size_t(d)]) p.strides[size_t(d)] = stride * step[i];
    start_offset += start[i] * stride;
    stride *= std::max<int64_t>(mem[i], 1);
  }
  int64_t span = 1;
  for (int64_t m : mem) span *= m;
  p.capacity = p.offset + span + rng.range(0, 3);  // slack past the view: reads there are wrong, not UB
  p.offset += start_offset;
  return p;
}

double draw(Rng& rng, const Values& v, DType dtype) {
  if (dtype == kBool) return rng.chance(0.5) ? 1.0 : 0.0;
  if (v.p_nan > 0 && is_floating(dtype) && rng.chance(v.p_nan)) return std::nan("");
  if (v.p_neg_inf > 0 && is_floating(dtype) && rng.chance(v.p_neg_inf)) return -INFINITY;
  if (v.p_pos_inf > 0 && is_floating(dtype) && rng.chance(v.p_pos_inf)) return INFINITY;
  const double step = v.step > 0 ? v.step : (is_floating(dtype) ? 0.0 : 1.0);
  for (int attempt = 0;; ++attempt) {
    double x = step > 0 ? step * double(rng.range(int64_t(std::ceil(v.lo / step)), int64_t(std::floor(v.hi / step))))
                        : rng.uniform(v.lo, v.hi);
    if (std::fabs(x) >= v.min_abs) return x;
    if (attempt > 50) return v.min_abs;
  }
}

Tensor storage_of(const Placement& p, DType dtype) { return empty({std::max<int64_t>(p.capacity, 1)}, dtype); }

}  // namespace

Tensor random_input(Rng& rng, const Shape& shape, DType dtype, const Values& values, const LayoutOptions& layout) {
  const Placement p = random_placement(rng, shape, layout);
  Tensor storage = storage_of(p, dtype);
  char* base = static_cast<char*>(storage.data());
  for (int64_t i = 0; i < storage.numel(); ++i)
    store_element(base + i * int64_t(storage.element_size()), dtype, draw(rng, values, dtype));
  return storage.as_strided(shape, p.strides, p.offset);
}

Tensor tensor_of(const std::vector<double>& values, const Shape& shape, DType dtype, Rng* rng) {
  const Placement p =
      rng ? random_placement(*rng, shape, {.expand = false}) : Placement{contiguous_strides(shape), 0, numel_of(shape)};
  Tensor storage = storage_of(p, dtype);
  char* base = static_cast<char*>(storage.data());
  const int64_t es = int64_t(storage.element_size());
  // Elements outside the view hold a poison value: an invalid index, a large number.
  for (int64_t i = 0; i < storage.numel(); ++i) store_element(base + i * es, dtype, is_floating(dtype) ? 1e4 : -7);
  Tensor view = storage.as_strided(shape, p.strides, p.offset);
  char* vbase = static_cast<char*>(view.data());
  size_t i = 0;
  for_each_index(shape, [&](const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * p.strides[d];
    store_element(vbase + off * es, dtype, values[i++]);
  });
  return view;
}

int64_t random_size(Rng& rng, int64_t max_size, double p_zero, double p_one) {
  const double u = rng.uniform(0.0, 1.0);
  if (u < p_zero) return 0;
  if (u < p_zero + p_one || max_size < 2) return std::min<int64_t>(1, max_size);
  return rng.range(2, max_size);
}

Shape random_shape(Rng& rng, const ShapeOptions& o) {
  Shape s(size_t(rng.range(o.min_dims, o.max_dims)));
  for (int64_t& n : s) n = random_size(rng, o.max_size, o.p_zero, o.p_one);
  while (numel_of(s) > o.max_numel) {
    int64_t& big = *std::max_element(s.begin(), s.end());
    big = (big + 1) / 2;
  }
  return s;
}

Values with_specials(Rng& rng, Values v, bool infinities) {
  if (!rng.chance(0.15)) return v;
  v.p_nan = 0.04;
  if (infinities) v.p_neg_inf = v.p_pos_inf = 0.03;
  return v;
}

Shape big_shape(Rng& rng, int64_t min_numel) {
  Shape s(size_t(rng.range(2, 4)));
  for (int64_t& n : s) n = 2 * rng.range(1, 8) + 1;
  while (numel_of(s) < min_numel) s[size_t(rng.range(0, int64_t(s.size()) - 1))] += rng.range(1, 9);
  return s;
}

std::string str(const std::vector<int64_t>& v) { return shape_str(v); }

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(dtype_name(t.dtype())) + shape_str(t.sizes()) + " strides " + shape_str(t.strides()) + " offset " +
         std::to_string(t.storage_offset());
}

}  // namespace frugal::optest
