#pragma once
// Shared test helpers: random inputs in every layout, float64 reference values,
// and closeness checks with per-dtype tolerances. Tests compare frugal's ops with
// independent naive loops in double precision (docs/design.md, "Tests").
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "tensor/factory.h"
#include "tensor/tensor.h"

namespace frugal::testing {

/// A file path in the temp directory unique to this process ("<stem>_<pid><ext>"), so that
/// test runs in parallel (CI and a developer's run) never share a file.
inline std::string temp_path(const std::string& stem, const std::string& ext = ".safetensors") {
  return (std::filesystem::temp_directory_path() / (stem + "_" + std::to_string(::getpid()) + ext)).string();
}

/// A fresh directory at temp_path(stem, ""), removed with the object (made writable first:
/// a test may have taken its write permission away).
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& stem) : path(temp_path(stem, "")) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

/// How a test input is laid out in memory.
enum class Layout {
  Contiguous,
  Transposed,  // last two dims swapped in memory (a transposed view of a dense tensor)
  Strided,     // every other element of a twice-as-long last dim
};
inline const char* layout_name(Layout l) {
  return l == Layout::Contiguous ? "contiguous" : l == Layout::Transposed ? "transposed" : "strided";
}
inline constexpr Layout kAllLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Strided};

/// "float32 transposed", "bfloat16 [2, 3]": a dtype and a layout or a shape, for test messages.
inline std::string name_of(DType dt, Layout l = Layout::Contiguous) {
  return std::string(dtype_name(dt)) + " " + layout_name(l);
}
inline std::string name_of(DType dt, const Shape& s) { return std::string(dtype_name(dt)) + " " + shape_str(s); }

/// Deterministic values in [lo, hi) on the host, independent of frugal's RNG.
inline std::vector<double> random_values(int64_t n, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  std::vector<double> v(size_t(std::max<int64_t>(n, 0)));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;  // xorshift64*
    const uint64_t r = s * 0x2545F4914F6CDD1Dull;
    x = lo + (hi - lo) * double(r >> 11) / 9007199254740992.0;
  }
  return v;
}

/// make_tensor for uint8, which nothing converts to (Note [Storage-only uint8] in tensor/dtype.h):
/// each value's byte written on the host through the layout's view of zeroed memory, which then
/// moves to `device` whole.
inline Tensor uint8_tensor(const std::vector<double>& values, const Shape& sizes, Device device, Layout layout) {
  const int64_t d = int64_t(sizes.size());
  const bool transposed = layout == Layout::Transposed && d >= 2, strided = layout == Layout::Strided && d >= 1;
  Shape mem = sizes;
  if (transposed) std::swap(mem[size_t(d - 1)], mem[size_t(d - 2)]);
  if (strided) mem.back() *= 2;
  auto view_of = [&](const Tensor& m) {
    return transposed ? m.transpose(d - 1, d - 2) : strided ? m.slice(-1, 0, mem.back(), 2) : m;
  };
  Tensor memory = empty(mem, kUInt8);
  auto* bytes = memory.data_ptr<uint8_t>();
  std::fill(bytes, bytes + memory.numel(), uint8_t(0));
  const Tensor view = view_of(memory);
  for (int64_t i = 0; i < view.numel(); ++i) {
    int64_t at = view.storage_offset(), rest = i;
    for (int64_t k = d; k-- > 0;) {
      at += (rest % sizes[size_t(k)]) * view.stride(k);
      rest /= sizes[size_t(k)];
    }
    bytes[at] = uint8_t(values[size_t(i)]);
  }
  return view_of(memory.to(device));
}

/// A tensor of `sizes` holding `values` (row-major) in `layout`, dtype and device of `opts`.
inline Tensor make_tensor(const std::vector<double>& values, const Shape& sizes, TensorOptions opts,
                          Layout layout = Layout::Contiguous) {
  if (opts.dtype == kUInt8) return uint8_tensor(values, sizes, opts.device, layout);
  Tensor dense = from_vector(values, sizes, TensorOptions(kFloat64));
  if (layout == Layout::Transposed && sizes.size() >= 2) {
    const int64_t d = int64_t(sizes.size());
    Tensor mem = dense.transpose(d - 1, d - 2).contiguous().to(opts.device, opts.dtype);
    return mem.transpose(d - 1, d - 2);  // same values, column-major storage
  }
  if (layout == Layout::Strided && !sizes.empty()) {
    Shape wide = sizes;
    wide.back() *= 2;
    Tensor mem = zeros(wide, opts);
    Tensor view = mem.slice(-1, 0, wide.back(), 2);
    view.copy_(dense.to(opts.device));
    return view;
  }
  return dense.to(opts.device, opts.dtype);
}

/// Random tensor with values in [lo, hi).
inline Tensor random_tensor(const Shape& sizes, TensorOptions opts, uint64_t seed, Layout layout = Layout::Contiguous,
                            double lo = -2.0, double hi = 2.0) {
  return make_tensor(random_values(numel_of(sizes), seed, lo, hi), sizes, opts, layout);
}

/// Every element as double, row-major.
inline std::vector<double> values_of(const Tensor& t) { return t.to(kCPU, kFloat64).contiguous().tolist<double>(); }

/// The largest |element| of t (0 for an empty tensor), in float64.
inline double max_abs(const Tensor& t) {
  double m = 0.0;
  for (double v : values_of(t)) m = std::max(m, std::fabs(v));
  return m;
}

/// Relative tolerance for results stored in `t` (one or two roundings of the type).
inline double default_rtol(DType t) {
  switch (t) {
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
    case DType::Float32: return 1e-5;
    default: return 1e-12;
  }
}

/// Unravels linear index i of `sizes` (row-major) into a multi-index.
inline std::vector<int64_t> unravel(int64_t i, const Shape& sizes) {
  std::vector<int64_t> idx(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    idx[d] = i % sizes[d];
    i /= sizes[d];
  }
  return idx;
}

/// The row-major linear position of `idx` in `sizes` (unravel's inverse).
inline int64_t ravel(const std::vector<int64_t>& idx, const Shape& sizes) {
  int64_t at = 0;
  for (size_t d = 0; d < sizes.size(); ++d) at = at * sizes[d] + idx[d];
  return at;
}

/// Linear index into a tensor of `sizes` that broadcasts to the output index `idx`.
inline int64_t broadcast_index(const std::vector<int64_t>& idx, const Shape& sizes) {
  int64_t lin = 0;
  const size_t lead = idx.size() - sizes.size();
  for (size_t d = 0; d < sizes.size(); ++d) lin = lin * sizes[d] + (sizes[d] == 1 ? 0 : idx[lead + d]);
  return lin;
}

/// A leaf parameter (requires_grad) holding `v` in `shape` and `dt`: the optimizer tests' weights.
inline Tensor param_tensor(const std::vector<double>& v, const Shape& shape, DType dt = kFloat32) {
  Tensor t = make_tensor(v, shape, dt);
  t.requires_grad_();
  return t;
}

/// Checks |actual - expected| <= atol + rtol * |expected| elementwise (NaNs must match);
/// reports the first mismatch with its index and the count of mismatches.
/// ([[maybe_unused]]: programs built with DOCTEST_CONFIG_DISABLE, such as dist_check, compile
/// the checks away.)
inline void check_close(const std::vector<double>& actual, const std::vector<double>& expected, double rtol,
                        double atol, [[maybe_unused]] const std::string& what = "") {
  REQUIRE_MESSAGE(actual.size() == expected.size(), what, ": ", actual.size(), " values vs ", expected.size());
  int64_t bad = 0;
  [[maybe_unused]] int64_t first = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const bool ok =
        (std::isnan(a) && std::isnan(e)) || (std::isinf(e) && a == e) || std::fabs(a - e) <= atol + rtol * std::fabs(e);
    if (!ok && bad++ == 0) first = int64_t(i);
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", actual.size(), " values differ; first at ", first, ": got ",
                first >= 0 ? actual[first] : 0.0, " expected ", first >= 0 ? expected[first] : 0.0);
}

inline void check_close(const Tensor& actual, const std::vector<double>& expected, double rtol, double atol,
                        const std::string& what = "") {
  check_close(values_of(actual), expected, rtol, atol, what);
}

/// The names of a (name, value) list (state_dict, named_parameters, named_modules), in order.
template <typename T>
std::vector<std::string> names_of(const std::vector<std::pair<std::string, T>>& list) {
  std::vector<std::string> out;
  for (const auto& kv : list) out.push_back(kv.first);
  return out;
}

/// The tensor named `name` in a (name, tensor) list; fails the test when it is missing. A
/// handle, not a reference: the list is often a temporary (m.state_dict()), and a reference
/// into it dangled (ASan, test_probe_module_api.cpp).
inline Tensor entry(const std::vector<std::pair<std::string, Tensor>>& list, const std::string& name) {
  for (const auto& kv : list)
    if (kv.first == name) return kv.second;
  FAIL("missing key " << name);
  return Tensor();
}

/// Runs `body` and checks it throws frugal::Error whose message contains every `parts` string.
template <typename F>
void check_error(F&& body, const std::vector<std::string>& parts) {
  std::string msg;
  try {
    body();
  } catch (const Error& e) { msg = e.what(); }
  REQUIRE_MESSAGE(!msg.empty(), "expected a frugal::Error mentioning ", parts.empty() ? "" : parts[0]);
  for (const auto& p : parts) CHECK_MESSAGE(msg.find(p) != std::string::npos, "message '", msg, "' lacks '", p, "'");
}

/// A tensor's bytes in row-major order (a contiguous host copy's): bit-exact comparisons.
inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to(kCPU).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data());
  return std::vector<uint8_t>(p, p + size_t(c.numel()) * c.element_size());
}

/// A file's bytes; write_file replaces a file with `bytes` (to corrupt or truncate one).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace frugal::testing
