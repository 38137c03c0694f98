// run_case: sample, reference, run (on the CPU and optionally a CUDA device), compare.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/stream.h"
#include "tests/op_table/op_table.h"

namespace frugal::optest {

Tol tol_for(DType dtype) {
  switch (dtype) {
    case DType::Float64: return {1e-10, 1e-12};
    case DType::Float32: return {2e-5, 1e-6};
    case DType::Float16: return {2e-3, 2e-6};
    case DType::BFloat16: return {1.6e-2, 2e-6};
    default: return {0.0, 0.0};
  }
}

Tol tol_sum(DType dtype, int64_t n, double scale) {
  Tol t = tol_for(dtype);
  if (!is_floating(dtype)) return t;
  const double eps = dtype == kFloat64 ? 2.3e-16 : 1.2e-7;
  t.atol += 2.0 * eps * scale * double(std::max<int64_t>(n, 1));
  return t;
}

double round_to(DType dtype, double v) {
  alignas(8) char buf[8];
  store_element(buf, dtype, v);
  return load_element(buf, dtype);
}

std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t ndim) {
  std::vector<int64_t> out;
  for (int64_t d : dims) out.push_back(d < 0 ? d + std::max<int64_t>(ndim, 1) : d);
  return out;
}

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = [] {
    std::vector<OpEntry> t;
    add_unary_ops(t);
    add_binary_ops(t);
    add_reduce_ops(t);
    add_copy_ops(t);
    add_index_ops(t);
    add_linalg_ops(t);
    add_norm_loss_ops(t);
    add_nn_ops(t);
    add_attention_ops(t);
    add_random_ops(t);
    return t;
  }();
  return table;
}

const OpEntry* find_op(const std::string& name) {
  for (const OpEntry& e : op_table())
    if (e.name == name) return &e;
  return nullptr;
}

namespace {

uint64_t case_seed(uint64_t seed, const std::string& name, int64_t index) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the op name
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return seed * 0x9E3779B97F4A7C15ull ^ h ^ uint64_t(index) * 0xD1B54A32D192ED03ull;
}

int64_t capacity(const Tensor& t) { return int64_t(t.impl().storage->nbytes / t.element_size()); }

/// Every byte of t's storage, on the host.
std::vector<char> storage_bytes(const Tensor& t) {
  Tensor whole = t.as_strided({capacity(t)}, {1}, 0);
  if (!whole.device().is_cpu()) whole = whole.to(kCPU);
  const char* p = static_cast<const char*>(whole.data());
  return std::vector<char>(p, p + whole.numel() * int64_t(whole.element_size()));
}

/// Copies of `inputs` on `device` in the same layouts; inputs sharing a storage share one there too.
std::vector<Tensor> on_device(const std::vector<Tensor>& inputs, Device device) {
  std::map<const Storage*, Tensor> stores;
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    if (!t.defined() || device.is_cpu()) {
      out.push_back(t);
      continue;
    }
    Tensor& whole = stores[t.impl().storage.get()];
    if (!whole.defined()) whole = t.as_strided({capacity(t)}, {1}, 0).to(device);
    out.push_back(whole.as_strided(t.sizes(), t.strides(), t.storage_offset()));
  }
  return out;
}

std::string compare(const Tensor& got, const Expected& want, double tol_scale) {
  std::ostringstream os;
  if (!want.value.defined) {
    if (got.defined()) os << "expected an undefined tensor, got " << describe(got);
    return os.str();
  }
  if (!got.defined()) return "undefined, expected " + std::string(dtype_name(want.dtype)) + shape_str(want.value.sizes);
  if (got.sizes() != want.value.sizes || got.dtype() != want.dtype) {
    os << "got " << describe(got) << ", expected " << dtype_name(want.dtype) << shape_str(want.value.sizes);
    return os.str();
  }
  if (want.contiguous && !got.is_contiguous()) return "expected a contiguous result, got " + describe(got);
  const Host h = read_host(got.device().is_cpu() ? got : got.to(kCPU));
  const double rtol = want.tol.rtol * tol_scale, atol = want.tol.atol * tol_scale;
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0.0;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double g = h.v[size_t(i)], w = want.value.v[size_t(i)];
    double ratio;
    if (std::isnan(w) || std::isnan(g)) ratio = std::isnan(w) && std::isnan(g) ? 0.0 : INFINITY;
    else if (std::isinf(w) || std::isinf(g)) ratio = g == w ? 0.0 : INFINITY;
    else {
      const double bound = atol + rtol * std::fabs(w);
      ratio = bound > 0 ? std::fabs(g - w) / bound : (g == w ? 0.0 : INFINITY);
    }
    if (ratio > 1.0) ++bad;
    if (ratio > 1.0 && ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  if (bad == 0) return "";
  std::vector<int64_t> idx(h.sizes.size());
  for (int64_t i = worst, d = int64_t(idx.size()) - 1; d >= 0; --d)
    idx[size_t(d)] = i % h.sizes[size_t(d)], i /= h.sizes[size_t(d)];
  os.precision(9);
  os << bad << " of " << h.numel() << " elements off; worst at " << str(idx) << ": got " << h.v[size_t(worst)]
     << ", expected " << want.value.v[size_t(worst)] << " (rtol " << rtol << ", atol " << atol << ")";
  return os.str();
}

/// Storage elements of `t` that changed since `before` although no view in `written` (the
/// mutated inputs) covers them.
std::string untouched_check(const Tensor& t, const std::vector<char>& before, const std::vector<Tensor>& written) {
  const std::vector<char> after = storage_bytes(t);
  const int64_t es = int64_t(t.element_size()), n = int64_t(before.size()) / es;
  std::vector<bool> may_change(size_t(n), false);
  for (const Tensor& w : written) {
    if (!w.shares_storage(t)) continue;
    for_each_index(w.sizes(), [&](const std::vector<int64_t>& idx) {
      int64_t off = w.storage_offset();
      for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * w.strides()[d];
      may_change[size_t(off)] = true;
    });
  }
  int64_t changed = 0, first = -1;
  for (int64_t e = 0; e < n; ++e)
    if (!may_change[size_t(e)] && std::memcmp(&before[size_t(e * es)], &after[size_t(e * es)], size_t(es)) != 0) {
      if (first < 0) first = e;
      ++changed;
    }
  if (changed == 0) return "";
  return std::to_string(changed) + " storage elements " + (written.empty() ? "" : "outside the written views ") +
         "were written (first at storage element " + std::to_string(first) + ")";
}

/// " = [1, 2.5, nan]" for a small input (its values make a failure readable), else "".
std::string values_str(const Host& h) {
  if (!h.defined || h.numel() == 0 || h.numel() > 12) return "";
  std::ostringstream os;
  os.precision(6);
  os << " = [";
  for (int64_t i = 0; i < h.numel(); ++i) os << (i ? ", " : "") << h.v[size_t(i)];
  os << "]";
  return os.str();
}

struct Failure {
  std::string text;
};

void run_on(const Sample& s, const std::vector<Tensor>& inputs, const std::vector<Expected>* expected,
            const std::string& must_throw, double tol_scale) {
  std::vector<std::vector<char>> before;
  for (const Tensor& t : inputs) before.push_back(t.defined() ? storage_bytes(t) : std::vector<char>());
  std::vector<Tensor> outs;
  try {
    outs = s.run(inputs);
    // CUDA raises a bad index at the next synchronization, not at the op (Note [Deferred
    // index checks]): sync here so the error belongs to this case, as a user's .item() would.
    for (const Tensor& t : inputs)
      if (t.defined() && t.device().is_cuda()) {
        synchronize(t.device());
        break;
      }
  } catch (const Error& e) {
    if (!must_throw.empty()) return;
    throw Failure{std::string("threw frugal::Error: ") + e.what()};
  } catch (const std::exception& e) { throw Failure{std::string("threw ") + e.what()}; }
  if (!must_throw.empty()) throw Failure{"returned, but must throw: " + must_throw};
  if (outs.size() != expected->size())
    throw Failure{"returned " + std::to_string(outs.size()) + " outputs, the reference " +
                  std::to_string(expected->size())};
  for (size_t k = 0; k < outs.size(); ++k) {
    const std::string why = compare(outs[k], (*expected)[k], tol_scale);
    if (!why.empty()) throw Failure{"output " + std::to_string(k) + ": " + why};
  }
  std::vector<Tensor> written;
  for (int k : s.mutates) written.push_back(inputs[size_t(k)]);
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) continue;
    const std::string why = untouched_check(inputs[k], before[k], written);
    if (!why.empty()) throw Failure{"input " + std::to_string(k) + ": " + why};
  }
}

}  // namespace

CaseResult run_case(const OpEntry& op, uint64_t seed, int64_t index, const RunOptions& options) {
  std::vector<DType> allowed;
  const bool cuda = options.device.is_cuda();
  const auto listed = [](const std::vector<DType>& v, DType t) {
    return v.empty() || std::find(v.begin(), v.end(), t) != v.end();
  };
  const auto wanted = [&](DType t) { return listed(options.dtypes, t) && (!cuda || listed(op.cuda_dtypes, t)); };
  for (DType t : op.dtypes)
    if (wanted(t)) allowed.push_back(t);
  CaseResult r;
  if (allowed.empty() || (options.device.is_cuda() && !op.on_cuda)) return r;
  r.ran = true;
  Rng rng(case_seed(seed, op.name, index));
  const DType dtype = rng.pick(allowed);
  std::ostringstream head;
  head << "op " << op.name << ", dtype " << dtype_name(dtype) << ", seed " << seed << ", case " << index;
  Sample s;
  std::string device = "cpu";
  try {
    s = op.sample(rng, dtype);
    std::vector<Host> hosts;
    for (const Tensor& t : s.inputs) hosts.push_back(read_host(t));
    for (size_t k = 0; k < s.inputs.size(); ++k)
      head << "\n  input " << k << ": " << describe(s.inputs[k]) << values_str(hosts[k]);
    if (!s.params.empty()) head << "\n  params: " << s.params;
    head << "\n  reproduce: op_fuzz --op " << op.name << " --seed " << seed << " --first " << index << " --cases 1"
         << (cuda ? " --device cuda" : "");
    if (options.trace) std::fprintf(stderr, "%s\n", head.str().c_str());
    std::vector<Expected> expected;
    std::string must_throw;
    try {
      expected = s.reference(hosts);
    } catch (const MustThrow& m) { must_throw = m.why; }
    // Device copies first: an in-place op run on the CPU changes the originals.
    const std::vector<Tensor> dev_inputs =
        options.device.is_cuda() ? on_device(s.inputs, options.device) : std::vector<Tensor>();
    run_on(s, s.inputs, &expected, must_throw, 1.0);
    if (options.device.is_cuda()) {
      device = options.device.str();
      run_on(s, dev_inputs, &expected, must_throw, options.device_tol_scale);
    }
  } catch (const Failure& f) {
    r.ok = false;
    r.message = head.str() + "\n  on " + device + ": " + f.text;
  } catch (const std::exception& e) {
    r.ok = false;
    r.message = head.str() + "\n  the test harness threw: " + e.what();
  }
  return r;
}

}  // namespace frugal::optest
