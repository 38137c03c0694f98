// The checks of the differentiable op table (tests/op_table/grad_table.h): gradcheck,
// the autocast dtype, and low-precision forward/backward against float64.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tests/op_table/entry_util.h"
#include "tests/op_table/grad_table.h"

namespace frugal::optest {

const char* amp_policy_name(AmpPolicy p) {
  switch (p) {
    case AmpPolicy::Lower: return "lower";
    case AmpPolicy::Float32: return "float32";
    case AmpPolicy::Promote: return "promote";
    case AmpPolicy::Keep: return "keep";
    case AmpPolicy::LowerToFloat32: return "lower, float32 result";
  }
  return "?";
}

double dtype_tol(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 1e-4;
    case DType::Float16: return 1e-2;
    case DType::BFloat16: return 6e-2;
    default: return 1e-9;
  }
}

const std::vector<GradEntry>& grad_table() {
  static const std::vector<GradEntry> table = [] {
    std::vector<GradEntry> t;
    add_grad_elementwise(t);
    add_grad_shape(t);
    add_grad_statistics(t);
    add_grad_products(t);
    add_grad_nn(t);
    return t;
  }();
  return table;
}

const GradEntry* find_grad_op(const std::string& name) {
  for (const GradEntry& e : grad_table())
    if (e.name == name) return &e;
  return nullptr;
}

namespace {

uint64_t case_seed(uint64_t seed, const std::string& name, int64_t index) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a of the entry name
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return (seed + 0x5851F42D4C957F2Dull) * 0x9E3779B97F4A7C15ull ^ h ^ uint64_t(index) * 0xD1B54A32D192ED03ull;
}

/// How one floating input reaches the op: permuted dims (made contiguous in that order,
/// then permuted back), and/or every other element of a stack with a NaN twin (a step of
/// 2 along one dim, offset 0 or 1). Built from differentiable ops, so that gradcheck's
/// contiguous leaves reach the op in the layout and the gradient flows back through it.
struct Layout {
  std::vector<int64_t> perm;
  int64_t step_dim = -1, which = 0;
  std::string str() const {
    if (perm.empty() && step_dim < 0) return "contiguous";
    std::string s;
    if (!perm.empty()) s += "permuted " + optest::str(perm);
    if (step_dim >= 0) s += (s.empty() ? "" : ", ") + cat_str("step 2 at dim ", step_dim, " offset ", which);
    return s;
  }
};

Layout draw_layout(Rng& rng, int64_t ndim) {
  Layout l;
  const int64_t kind = rng.range(0, 3);  // contiguous, permuted, strided, both
  if ((kind & 1) && ndim >= 2) {
    l.perm.resize(size_t(ndim));
    std::iota(l.perm.begin(), l.perm.end(), 0);
    for (size_t i = size_t(ndim); i-- > 1;) std::swap(l.perm[i], l.perm[size_t(rng.range(0, int64_t(i)))]);
    if (std::is_sorted(l.perm.begin(), l.perm.end())) std::swap(l.perm[0], l.perm[1]);
  }
  if (kind & 2) {
    l.step_dim = rng.range(0, ndim);
    l.which = rng.range(0, 1);
  }
  return l;
}

Tensor relayout(const Tensor& x, const Layout& l) {
  if (l.perm.empty() && l.step_dim < 0) return x;
  Tensor p = l.perm.empty() ? x : x.permute(l.perm);
  if (l.step_dim >= 0) {
    const Tensor junk = full(p.sizes(), NAN, p.options());  // read by a kernel that strays outside the view
    p = stack(l.which ? TensorList{junk, p} : TensorList{p, junk}, l.step_dim).select(l.step_dim, l.which);
  } else {
    p = p.contiguous();
  }
  if (l.perm.empty()) return p;
  std::vector<int64_t> inverse(l.perm.size());
  for (size_t i = 0; i < l.perm.size(); ++i) inverse[size_t(l.perm[i])] = int64_t(i);
  return p.permute(inverse);
}

struct Failure {
  std::string text;
};

/// A sampled case: the sample, its layouts and the head of any failure message.
struct Case {
  GradSample s;
  std::vector<Layout> layouts;
  std::string head;
  std::function<Tensor(const TensorList&)> f;  // s.f after the relayout
};

Case make_case(const GradEntry& e, uint64_t seed, int64_t index, const std::string& what, const std::string& flags) {
  Case c;
  Rng rng(case_seed(seed, e.name, index));
  c.s = e.sample(rng);
  std::ostringstream head;
  head << "grad op " << e.name << " (" << what << "), seed " << seed << ", case " << index;
  for (size_t k = 0; k < c.s.inputs.size(); ++k) {
    const GradInput& in = c.s.inputs[k];
    Layout l;
    if (in.value.defined() && in.value.is_floating_point() && in.relayout) l = draw_layout(rng, in.value.dim());
    c.layouts.push_back(l);
    head << "\n  input " << k << ": " << describe(in.value) << (in.grad ? " (differentiable)" : "") << ", " << l.str();
  }
  if (!c.s.params.empty()) head << "\n  params: " << c.s.params;
  head << "\n  reproduce: op_fuzz --grad --op '" << e.name << "' --seed " << seed << " --first " << index
       << " --cases 1" << flags;
  c.head = head.str();
  c.f = [f = c.s.f, layouts = c.layouts](const TensorList& in) {
    TensorList x;
    for (size_t k = 0; k < in.size(); ++k) x.push_back(in[k].defined() ? relayout(in[k], layouts[k]) : in[k]);
    return f(x);
  };
  return c;
}

template <typename F>
GradResult guarded(const std::string& head, F&& body) {
  GradResult r;
  r.ran = true;
  try {
    body();
  } catch (const Failure& f) {
    r.ok = false;
    r.message = head + "\n  " + f.text;
  } catch (const std::exception& ex) {
    r.ok = false;
    r.message = head + "\n  threw: " + ex.what();
  }
  return r;
}

std::vector<double> host_values(const Tensor& t) {
  Tensor c = t.detach();
  if (!c.device().is_cpu()) c = c.to(kCPU);
  return read_host(c).v;
}

/// "" when got is within tol of want (both on any device): |g - w| <= tol (|w| + peak), peak
/// the largest |w| (at least 1, as in tests/gpu/autograd_check.h).
std::string compare(const Tensor& got, const Tensor& want, double tol) {
  if (!got.defined() || !want.defined())
    return got.defined() == want.defined() ? "" : std::string("one is undefined: got ") + describe(got);
  if (got.sizes() != want.sizes()) return "got " + describe(got) + ", expected the shape of " + describe(want);
  const std::vector<double> g = host_values(got), w = host_values(want);
  double peak = 1.0;  // results that cancel to tiny values are compared at the scale of their terms
  for (double v : w)
    if (std::isfinite(v)) peak = std::max(peak, std::fabs(v));
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    double ratio;
    if (std::isnan(w[i]) || std::isnan(g[i])) ratio = std::isnan(w[i]) && std::isnan(g[i]) ? 0.0 : INFINITY;
    else if (std::isinf(w[i]) || std::isinf(g[i])) ratio = g[i] == w[i] ? 0.0 : INFINITY;
    else ratio = std::fabs(g[i] - w[i]) / (tol * (std::fabs(w[i]) + peak));
    if (ratio > 1.0) ++bad;
    if (ratio > 1.0 && ratio > worst_ratio) worst_ratio = ratio, worst = int64_t(i);
  }
  if (bad == 0) return "";
  return cat_str(bad, " of ", g.size(), " elements off; worst at ", str(unravel(worst, got.sizes())), ": got ",
                 g[size_t(worst)], ", expected ", w[size_t(worst)], " (tol ", tol, " of |expected| + peak ", peak, ")");
}

/// A random upstream gradient for `y`, in y's dtype and on its device.
Tensor upstream(Rng& rng, const Tensor& y) {
  std::vector<double> v(size_t(y.numel()));
  for (double& x : v) x = rng.uniform(-1.0, 1.0);
  return tensor_of(v, y.sizes(), kFloat64).to(y.device(), y.dtype());
}

}  // namespace

namespace {
/// gradcheck, or with second_order gradgradcheck, of case `index`.
GradResult run_finite_differences(const GradEntry& e, uint64_t seed, int64_t index, bool second_order) {
  Case c;
  const char* what = second_order ? "gradgradcheck, float64" : "gradcheck, float64";
  try {
    c = make_case(e, seed, index, what, second_order ? " --gradgrad" : "");
  } catch (const std::exception& ex) { return {true, false, "grad op " + e.name + ": the sampler threw " + ex.what()}; }
  bool no_double_backward = false;  // the op's graph has a node without one (Note [Double backward]): not run
  const GradResult result = guarded(c.head, [&] {
    TensorList in;
    for (const GradInput& gi : c.s.inputs) {
      Tensor t = gi.value;
      if (gi.grad) {
        t = t.clone();
        t.requires_grad_();
      }
      in.push_back(t);
    }
    autograd::GradcheckOptions o;
    o.atol *= c.s.grad_tol;
    o.rtol *= c.s.grad_tol;
    o.eps = c.s.eps;
    o.seed = uint64_t(index);
    autograd::GradcheckResult r;
    try {
      r = second_order ? autograd::gradgradcheck(c.f, in, o) : autograd::gradcheck(c.f, in, o);
    } catch (const Error& ex) {
      no_double_backward =
          second_order && std::string(ex.what()).find("cannot be differentiated twice") != std::string::npos;
      if (no_double_backward) return;
      throw;
    }
    if (!r.ok)
      throw Failure{std::string(second_order ? "gradgradcheck: the double backward" : "gradcheck: backward") +
                    " differs from central differences:\n" + r.report};
  });
  return no_double_backward ? GradResult{} : result;
}
}  // namespace

GradResult run_gradcheck(const GradEntry& e, uint64_t seed, int64_t index) {
  return run_finite_differences(e, seed, index, /*second_order=*/false);
}

GradResult run_gradgradcheck(const GradEntry& e, uint64_t seed, int64_t index) {
  return run_finite_differences(e, seed, index, /*second_order=*/true);
}

GradResult run_autocast(const GradEntry& e, uint64_t seed, int64_t index, Device device, DType low) {
  if (device.is_cuda() && !e.on_cuda) return {};
  Case c;
  const std::string flags = cat_str(" --amp ", dtype_name(low), device.is_cuda() ? " --device cuda" : "");
  try {
    c = make_case(e, seed, index, cat_str("autocast ", dtype_name(low), " on ", device.str()), flags);
  } catch (const std::exception& ex) { return {true, false, "grad op " + e.name + ": the sampler threw " + ex.what()}; }
  return guarded(c.head, [&] {
    int64_t floating = 0;
    for (const GradInput& gi : c.s.inputs) floating += gi.value.defined() && gi.value.is_floating_point();
    // float32 inputs; low-precision inputs; the first e.amp_mixed low and the rest float32;
    // the same with the other low dtype for the rest (float16 + bfloat16 promote to float32),
    // except for the ops that keep their input dtype (they may want one dtype).
    const DType other_low = low == kFloat16 ? kBFloat16 : kFloat16;
    const int variants = e.amp_mixed > 0 && floating >= 2 ? (e.amp == AmpPolicy::Keep ? 3 : 4) : 2;
    for (int variant = 0; variant < variants; ++variant) {
      TensorList in;
      std::vector<DType> floating_dtypes;
      std::vector<bool> floating_zero_dim;  // 0-d inputs: Note [0-d operands in promotion]
      for (size_t k = 0; k < c.s.inputs.size(); ++k) {
        const GradInput& gi = c.s.inputs[k];
        Tensor t = gi.value;
        if (t.defined() && t.is_floating_point()) {
          const DType rest = variant == 3 ? other_low : kFloat32;
          const DType dt = variant == 0 ? kFloat32 : variant == 1 || int(k) < e.amp_mixed ? low : rest;
          floating_dtypes.push_back(dt);
          floating_zero_dim.push_back(t.dim() == 0);
          t = t.to(device, dt);
          if (gi.grad) t.requires_grad_();
        } else if (t.defined()) {
          t = t.to(device);
        }
        in.push_back(t);
      }
      const char* kinds[] = {"float32", dtype_name(low), "mixed with float32", "mixed float16 and bfloat16"};
      const std::string which = cat_str("variant ", variant, " (inputs ", kinds[variant], ")");
      Tensor y;
      {
        AutocastGuard amp(device, low);
        y = c.f(in);
      }
      DType want = floating_dtypes.empty() ? kFloat32 : floating_dtypes[0];
      if (e.amp == AmpPolicy::Lower) want = low;
      if (e.amp == AmpPolicy::Float32 || e.amp == AmpPolicy::LowerToFloat32) want = kFloat32;
      if (e.amp == AmpPolicy::Promote) {
        // torch.result_type of the floating inputs: a 0-d one counts only when all are 0-d.
        bool all_zero_dim = true;
        for (bool z : floating_zero_dim) all_zero_dim = all_zero_dim && z;
        bool first = true;
        for (size_t k = 0; k < floating_dtypes.size(); ++k) {
          if (!all_zero_dim && floating_zero_dim[k]) continue;
          want = first ? floating_dtypes[k] : ref_promote(want, floating_dtypes[k]);
          first = false;
        }
      }
      if (y.dtype() != want)
        throw Failure{cat_str(which, ": the output is ", describe(y), " under autocast, but policy ",
                              amp_policy_name(e.amp), " says ", dtype_name(want))};
      // The same values as the op on inputs cast by hand, outside autocast.
      TensorList cast;
      for (size_t k = 0; k < in.size(); ++k) {
        const Tensor& t = in[k];
        if (!t.defined() || !t.is_floating_point()) {
          cast.push_back(t);
          continue;
        }
        const bool lower = e.amp == AmpPolicy::Lower || e.amp == AmpPolicy::LowerToFloat32;
        const DType target = lower ? low : e.amp == AmpPolicy::Float32 ? kFloat32 : t.dtype();
        cast.push_back(t.detach().to(target));
      }
      Tensor by_hand;
      {
        autograd::NoGradGuard no_grad;
        by_hand = c.f(cast);
      }
      const std::vector<double> got = host_values(y), want_v = host_values(by_hand);
      // Within 2 ulps: the sample's relayout happens inside f, so under autocast the op casts a
      // strided view into a contiguous copy while by hand it gets a strided float32 view, and a
      // reduction (var over a permuted, stepped input) then sums in another order, on the CPU
      // as on CUDA (op_fuzz --grad --op var --seed 3 --first 1250 --amp f16: 1 ulp).
      const double ulp = y.dtype() == kFloat32 ? 0x1p-23 : y.dtype() == kFloat16 ? 0x1p-10
                         : y.dtype() == kBFloat16 ? 0x1p-7 : 0.0;
      const double slack = 2.0 * ulp;
      for (size_t i = 0; i < got.size() && i < want_v.size(); ++i)
        if (!(got[i] == want_v[i] || (std::isnan(got[i]) && std::isnan(want_v[i])) ||
              std::fabs(got[i] - want_v[i]) <= slack * std::max(std::fabs(got[i]), std::fabs(want_v[i]))))
          throw Failure{cat_str(which, ": element ", i, " is ", got[i], " under autocast but ", want_v[i],
                                " for the inputs cast by hand")};
      if (got.size() != want_v.size()) throw Failure{which + ": autocast changed the output's shape"};
      // Gradients come back in each input's own dtype (the cast's backward converts).
      if (!y.requires_grad()) throw Failure{which + ": the output does not require grad under autocast"};
      Rng rng(uint64_t(index) + 17);
      y.backward(upstream(rng, y));
      for (size_t k = 0; k < in.size(); ++k)
        if (c.s.inputs[k].grad && in[k].grad().defined() && in[k].grad().dtype() != in[k].dtype())
          throw Failure{
              cat_str(which, ": the gradient of input ", k, " is ", describe(in[k].grad()), " for ", describe(in[k]))};
    }
  });
}

GradResult run_dtype(const GradEntry& e, uint64_t seed, int64_t index, Device device, DType dtype) {
  if (device.is_cuda() && (!e.on_cuda || (e.cuda_16bit_only && dtype != kFloat16 && dtype != kBFloat16))) return {};
  Case c;
  const std::string flags = cat_str(" --dtype ", dtype_name(dtype), device.is_cuda() ? " --device cuda" : "");
  try {
    c = make_case(e, seed, index, cat_str(dtype_name(dtype), " on ", device.str(), " against float64"), flags);
  } catch (const std::exception& ex) { return {true, false, "grad op " + e.name + ": the sampler threw " + ex.what()}; }
  return guarded(c.head, [&] {
    TensorList ref, dev;
    for (const GradInput& gi : c.s.inputs) {
      Tensor r = gi.value, d = gi.value;
      if (r.defined() && r.is_floating_point()) {
        const Tensor rounded = r.to(dtype);
        r = rounded.to(kFloat64);  // the reference sees the values the device sees
        d = rounded.to(device);
        if (d.shares_storage(rounded)) d = d.clone();
        if (gi.grad) r.requires_grad_(), d.requires_grad_();
      } else if (d.defined()) {
        d = d.to(device);
      }
      ref.push_back(r);
      dev.push_back(d);
    }
    const Tensor y_ref = c.f(ref), y = c.f(dev);
    const double tol = dtype_tol(dtype) * e.low_tol * (device.is_cuda() ? 2.0 : 1.0);
    // An op with a float32 result for 16-bit products returns float32 outside autocast too.
    const DType want = e.amp == AmpPolicy::LowerToFloat32 && dtype != kFloat64 ? kFloat32 : dtype;
    if (y.dtype() != want) throw Failure{"the output is " + describe(y) + " for " + dtype_name(dtype) + " inputs"};
    if (!y.device().is_cuda() && device.is_cuda()) throw Failure{"the output is not on " + device.str()};
    std::string why = compare(y, y_ref, tol);
    if (!why.empty()) throw Failure{"forward: " + why};
    Rng rng(uint64_t(index) + 31);
    const Tensor u = upstream(rng, y);
    y_ref.backward(u.to(kCPU, kFloat64));
    y.backward(u);
    for (size_t k = 0; k < dev.size(); ++k) {
      if (!c.s.inputs[k].grad) continue;
      const Tensor g = dev[k].grad(), g_ref = ref[k].grad();
      if (g.defined() && g.dtype() != dtype)
        throw Failure{
            cat_str("the gradient of input ", k, " is ", describe(g), " for a ", dtype_name(dtype), " input")};
      why = compare(g.defined() ? g : zeros_like(dev[k]), g_ref.defined() ? g_ref : zeros_like(ref[k]), tol);
      if (!why.empty()) throw Failure{cat_str("gradient of input ", k, ": ", why)};
    }
  });
}

}  // namespace frugal::optest
