#pragma once
// What the replays of the PyTorch goldens share (tests/golden_replay/{ops,modules,optim}.cpp):
// reading a golden file of tests/golden (its tensors and its "cases" JSON, validated before use),
// the JSON accessors for a case, and the comparison of frugal's values with PyTorch's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "golden_dir.h"  // FRUGAL_GOLDEN_DIR: the source tree's tests/golden (tests/meson.build)
#include "nn/safetensors.h"
#include "tests/test_util.h"

namespace frugal::testing {

/// A golden file: its tensors by name and its "cases" metadata, an array of objects.
struct GoldenFile {
  std::map<std::string, Tensor> tensors;
  json::Value cases;
};

/// Reads tests/golden/<name>: present, a valid safetensors file, "cases" a non-empty JSON array
/// whose length is the "count" metadata. Throws frugal::Error naming the file and what is wrong,
/// followed by `remake` (how to regenerate it).
inline GoldenFile read_golden_file(const std::string& name, const std::string& remake) {
  const std::string path = std::string(FRUGAL_GOLDEN_DIR) + "/" + name;
  FRUGAL_CHECK(std::filesystem::is_regular_file(path), "torch goldens: ", path, " is missing", remake);
  nn::SafetensorsFile file;
  try {
    file = nn::load_safetensors(path);
  } catch (const std::exception& e) { FRUGAL_FAIL("torch goldens: ", e.what(), remake); }
  auto it = file.metadata.find("cases");
  FRUGAL_CHECK(it != file.metadata.end(), "torch goldens: ", path, " has no \"cases\" metadata", remake);
  GoldenFile g;
  try {
    g.cases = json::parse(it->second);
  } catch (const std::exception& e) {
    FRUGAL_FAIL("torch goldens: ", path, ": the \"cases\" metadata: ", e.what(), remake);
  }
  FRUGAL_CHECK(g.cases.is_array() && !g.cases.items.empty(), "torch goldens: ", path,
               ": \"cases\" is not a non-empty array", remake);
  auto count = file.metadata.find("count");
  FRUGAL_CHECK(count != file.metadata.end() && count->second == std::to_string(g.cases.items.size()),
               "torch goldens: ", path, ": the case count does not match the \"count\" metadata", remake);
  g.tensors = std::move(file.tensors);
  return g;
}

/// read() run once, on first use; when it threw, every test case that asks fails with its message.
template <GoldenFile (*read)()>
const GoldenFile& golden_once() {
  static std::string error;
  static const std::optional<GoldenFile> g = []() -> std::optional<GoldenFile> {
    try {
      return read();
    } catch (const std::exception& e) {
      error = e.what();
      return std::nullopt;
    }
  }();
  REQUIRE_MESSAGE(g.has_value(), error);
  return *g;
}

// ---- a case's JSON: each accessor throws, naming what it expected ----------------------------

inline const json::Value& member(const json::Value& obj, const std::string& key) {
  const json::Value* v = obj.is_object() ? obj.find(key) : nullptr;
  FRUGAL_CHECK(v != nullptr, "torch goldens: missing \"", key, "\"");
  return *v;
}
inline std::string str_of(const json::Value& v) {
  FRUGAL_CHECK(v.is_string(), "torch goldens: expected a string, got ", json::type_name(v.type));
  return v.text;
}
inline bool bool_of(const json::Value& v) {
  FRUGAL_CHECK(v.type == json::Value::Type::Bool, "torch goldens: expected a bool, got ", json::type_name(v.type));
  return v.boolean;
}
/// A number, or "inf", "-inf" or "nan" (JSON has no literals for them).
inline double num_of(const json::Value& v) {
  if (v.is_string() && (v.text == "inf" || v.text == "-inf" || v.text == "nan"))
    return v.text == "nan" ? std::numeric_limits<double>::quiet_NaN()
                           : (v.text == "inf" ? 1.0 : -1.0) * std::numeric_limits<double>::infinity();
  FRUGAL_CHECK(v.type == json::Value::Type::Number, "torch goldens: expected a number, got ", json::type_name(v.type));
  return std::stod(v.text);
}
inline int64_t int_of(const json::Value& v) {
  const double d = num_of(v);
  FRUGAL_CHECK(d == std::floor(d), "torch goldens: expected an integer, got ", v.text);
  return int64_t(d);
}
inline std::vector<int64_t> ints_of(const json::Value& v) {
  FRUGAL_CHECK(v.is_array(), "torch goldens: expected an array, got ", json::type_name(v.type));
  std::vector<int64_t> r;
  for (const auto& e : v.items) r.push_back(int_of(e));
  return r;
}
inline std::vector<std::string> strs_of(const json::Value& v) {
  FRUGAL_CHECK(v.is_array(), "torch goldens: expected an array, got ", json::type_name(v.type));
  std::vector<std::string> r;
  for (const auto& e : v.items) r.push_back(str_of(e));
  return r;
}

/// "[a, b, c]": family names in a message.
inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : ", ") + e;
  return "[" + s + "]";
}

/// How a message names a case: "<id> <name>", and the device when it is not the CPU.
inline std::string case_title(const json::Value& c, Device device) {
  return str_of(member(c, "id")) + " " + str_of(member(c, "name")) + (device == kCPU ? "" : " on " + device.str());
}

/// Runs run(case, title) for every case of `families` in `g` (a case that throws fails with its
/// message), then fails when `file` holds none of them; `kind` names the goldens in messages.
template <typename Run>
void replay_families(const GoldenFile& g, const std::vector<std::string>& families, Device device,
                     const std::string& file, const std::string& kind, Run&& run) {
  int64_t n = 0;
  for (const json::Value& c : g.cases.items) {
    std::string title = "(a case without an id)";
    try {
      if (std::find(families.begin(), families.end(), str_of(member(c, "family"))) == families.end()) continue;
      title = case_title(c, device);
      ++n;
      run(c, title);
    } catch (const std::exception& e) { CHECK_MESSAGE(false, title << ": threw: " << std::string(e.what())); }
  }
  CHECK_MESSAGE(n > 0, "torch " << kind << " goldens: no case of " << join(families) << " in tests/golden/" << file);
  MESSAGE(n << " PyTorch " << kind << " golden cases of " << join(families) << " on " << device.str());
}

/// A copy of stored tensor `t` on `device`, sharing no storage with it: a leaf a case may change.
inline Tensor fresh_copy(const Tensor& t, Device device) { return t.device() == device ? t.clone() : t.to(device); }

// ---- an input's view (tools/golden_safetensors.py's apply_view) ------------------------------

/// The view steps of a case's input, as tools/golden_safetensors.py's apply_view takes them.
inline Tensor apply_view(Tensor t, const json::Value& steps) {
  FRUGAL_CHECK(steps.is_array(), "torch goldens: \"view\" is not an array");
  for (const json::Value& s : steps.items) {
    FRUGAL_CHECK(s.is_array() && !s.items.empty(), "torch goldens: a view step is not a non-empty array");
    const std::string kind = str_of(s.items[0]);
    std::vector<int64_t> a;
    for (size_t i = 1; i < s.items.size(); ++i) a.push_back(int_of(s.items[i]));
    const size_t arity = kind == "slice"                           ? 4
                         : kind == "transpose" || kind == "select" ? 2
                         : kind == "unsqueeze"                     ? 1
                                                                   : 0;
    FRUGAL_CHECK(arity == 0 || a.size() == arity, "torch goldens: view step ", kind, " takes ", arity, " numbers");
    if (kind == "transpose") {
      t = t.transpose(a[0], a[1]);
    } else if (kind == "permute") {
      t = t.permute(a);
    } else if (kind == "slice") {  // dim, start, end, step
      t = t.slice(a[0], a[1], a[2], a[3]);
    } else if (kind == "expand") {
      t = t.expand(a);
    } else if (kind == "unsqueeze") {
      t = t.unsqueeze(a[0]);
    } else if (kind == "select") {
      t = t.select(a[0], a[1]);
    } else {
      FRUGAL_FAIL("torch goldens: unknown view step ", kind);
    }
  }
  return t;
}

// ---- comparing ---------------------------------------------------------------------------------

/// A value passes within atol * max(1, max |torch|) + rtol * |torch|.
struct Tol {
  double rtol, atol;
};

/// How far `g` is from `w` (row-major values of `shape`), and where; "" when within the bound.
/// NaN matches NaN and an infinity the same infinity.
inline std::string mismatch(const std::vector<double>& g, const std::vector<double>& w, const Shape& shape, Tol tol) {
  if (g.size() != w.size()) return std::to_string(g.size()) + " values, torch " + std::to_string(w.size());
  double scale = 1.0;
  for (double v : w)
    if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
  double worst = 0.0, worst_err = 0.0;
  int64_t at = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    double err, ratio;
    if (!std::isfinite(w[i]) || !std::isfinite(g[i])) {
      const bool same = (std::isnan(w[i]) && std::isnan(g[i])) || g[i] == w[i];
      err = ratio = same ? 0.0 : std::numeric_limits<double>::infinity();
    } else {
      err = std::fabs(g[i] - w[i]);
      ratio = err / (tol.atol * scale + tol.rtol * std::fabs(w[i]));
    }
    if (ratio > worst || (at < 0 && ratio > 1.0)) worst = ratio, worst_err = err, at = int64_t(i);
  }
  if (worst <= 1.0) return "";
  std::ostringstream os;
  os.precision(9);
  os << "max |err| " << worst_err << " at " << shape_str(unravel(at, shape)) << " (frugal " << g[size_t(at)]
     << ", torch " << w[size_t(at)] << "), bound " << tol.atol << " x " << scale << " + " << tol.rtol << " |torch|";
  return os.str();
}
/// The same for two tensors of one shape (`want`: torch's, float64).
inline std::string mismatch(const Tensor& got, const Tensor& want, Tol tol) {
  return mismatch(values_of(got), values_of(want), want.sizes(), tol);
}

/// A stored tensor of case `id` ("<id>.<what>"), checked to exist.
inline const Tensor& stored(const GoldenFile& g, const std::string& id, const std::string& what) {
  auto it = g.tensors.find(id + "." + what);
  FRUGAL_CHECK(it != g.tensors.end(), "torch goldens: case ", id, " has no tensor \"", what, "\"");
  return it->second;
}

/// CHECKs an output, gradient or buffer against PyTorch's: the dtype (when given), the shape,
/// integers exactly and floating values within `tol`; an undefined `got` matches a zero `want`
/// (PyTorch's None gradient). `title` and `what` name it in the message.
inline void check_tensor(const std::string& title, const std::string& what, const Tensor& got, const Tensor& want,
                         std::optional<DType> want_dtype, Tol tol) {
  if (!got.defined()) {
    const bool zeros = want.numel() == 0 || max_abs(want) == 0.0;
    CHECK_MESSAGE(zeros, title << ": " << what << ": frugal gives none, torch max |value| " << max_abs(want));
    return;
  }
  if (want_dtype)
    CHECK_MESSAGE(got.dtype() == *want_dtype, title << ": " << what << ": dtype "
                                                    << std::string(dtype_name(got.dtype())) << ", torch "
                                                    << std::string(dtype_name(*want_dtype)));
  if (got.sizes() != want.sizes()) {
    CHECK_MESSAGE(
        false, title << ": " << what << ": shape " << shape_str(got.sizes()) << ", torch " << shape_str(want.sizes()));
    return;
  }
  if (!is_floating(want.dtype())) {
    const std::vector<int64_t> g = got.to(kCPU, kInt64).contiguous().tolist<int64_t>(), w = want.tolist<int64_t>();
    size_t bad = 0;
    while (bad < w.size() && g[bad] == w[bad]) ++bad;
    CHECK_MESSAGE(bad == w.size(), title << ": " << what << " " << shape_str(want.sizes()) << ": at "
                                         << (bad < w.size() ? shape_str(unravel(int64_t(bad), want.sizes())) : "")
                                         << " frugal " << (bad < w.size() ? g[bad] : 0) << ", torch "
                                         << (bad < w.size() ? w[bad] : 0));
    return;
  }
  const std::string err = mismatch(got, want, tol);
  CHECK_MESSAGE(err.empty(), title << ": " << what << " " << std::string(dtype_name(got.dtype()))
                                   << shape_str(want.sizes()) << ": " << err);
}

}  // namespace frugal::testing
