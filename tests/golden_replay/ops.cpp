// The ops' replay of the PyTorch goldens (tests/golden_replay/replay.h): frugal's ops against
// PyTorch's own numbers, on the inputs users pass: transposed, permuted,
// strided and expanded views, broadcasts, 0-d and size-0 tensors, odd lengths, negative dims,
// values at the kinks, 16-bit dtypes; values and gradients. tools/torch_golden_ops.py writes
// the goldens (tests/golden/ops_torch.safetensors) with PyTorch 1.13 in float64 from the stored
// inputs; the other op tests compare with float64 loops written next to the ops, so a misreading
// of PyTorch's contract would be in both, and only these catch it.
//
// Note [Golden cases]
// Each case of the file's "cases" metadata names its op, the op's arguments, and per input a
// stored base and the views that make the op's argument from it (apply_view). The base is a
// leaf; the op runs on the view, backward runs from every differentiable output with the stored
// upstream gradient, and the base's gradient is compared, so the views' backward is checked with
// the op's. An output is compared by dtype (PyTorch's result dtype), shape and values: integers
// exactly, floating values within rtol |torch| + atol max(1, max |torch|) with the bounds of the
// output's dtype (tol_for; a gradient: the less precise of its input's dtype and the outputs'),
// NaN matching NaN and an infinity the same infinity. A gradient frugal leaves undefined matches
// a zero one (PyTorch's None). An in-place op (add_ ... masked_fill_, copy_) writes a clone of
// its first argument and returns it, as the generator's v = x.clone(); v.add_(other): frugal
// refuses a recorded write through a view (Note [In-place ops and autograd] in
// autograd/ops/inplace.h), so the view's base takes its gradient through the clone.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/all.h"
#include "autograd/ops/statistics.h"
#include "core/json.h"
#include "tensor/factory.h"
#include "tests/golden_replay/golden_file.h"
#include "tests/golden_replay/replay.h"
#include "tests/test_util.h"

namespace frugal::testing {
namespace {

const std::string kGoldenFile = "ops_torch.safetensors";
const std::string kRemake = " (regenerate it: /usr/bin/python3 tools/torch_golden_ops.py)";

GoldenFile read_golden_ops() { return read_golden_file(kGoldenFile, kRemake); }
const GoldenFile& golden_ops() { return golden_once<read_golden_ops>(); }

// ---- reading a case's JSON -----------------------------------------------------------------

/// An op's keyword arguments, with the defaults of its PyTorch signature.
struct Args {
  const json::Value& obj;
  const json::Value* get(const std::string& k) const {
    const json::Value* v = obj.find(k);
    return v && v->type != json::Value::Type::Null ? v : nullptr;
  }
  double num(const std::string& k, std::optional<double> dflt = std::nullopt) const {
    if (const json::Value* v = get(k)) return num_of(*v);
    FRUGAL_CHECK(dflt.has_value(), "torch goldens: missing argument \"", k, "\"");
    return *dflt;
  }
  int64_t integer(const std::string& k, std::optional<int64_t> dflt = std::nullopt) const {
    if (const json::Value* v = get(k)) return int_of(*v);
    FRUGAL_CHECK(dflt.has_value(), "torch goldens: missing argument \"", k, "\"");
    return *dflt;
  }
  bool flag(const std::string& k, bool dflt) const {
    const json::Value* v = get(k);
    if (!v) return dflt;
    FRUGAL_CHECK(v->type == json::Value::Type::Bool, "torch goldens: \"", k, "\" is not a bool");
    return v->boolean;
  }
  std::string text(const std::string& k, const std::string& dflt) const {
    const json::Value* v = get(k);
    return v ? str_of(*v) : dflt;
  }
  std::vector<int64_t> ints(const std::string& k) const { return ints_of(member(obj, k)); }
  /// A PyTorch int-or-pair argument (kernel, stride, padding, ...).
  Int2 pair(const std::string& k, Int2 dflt) const {
    const json::Value* v = get(k);
    if (!v) return dflt;
    if (!v->is_array()) return Int2(int_of(*v));
    const std::vector<int64_t> p = ints_of(*v);
    FRUGAL_CHECK(p.size() == 2, "torch goldens: \"", k, "\" is not a pair");
    return Int2(p[0], p[1]);
  }
  Reduction reduction() const {
    const std::string r = text("reduction", "mean");
    if (r == "none") return Reduction::None;
    if (r == "sum") return Reduction::Sum;
    FRUGAL_CHECK(r == "mean", "torch goldens: unknown reduction ", r);
    return Reduction::Mean;
  }
};

// ---- the ops -------------------------------------------------------------------------------

using Inputs = std::vector<Tensor>;  // undefined where the case passes None
using Outputs = std::vector<Tensor>;
using OpFn = std::function<Outputs(const Inputs&, const Args&)>;

OpFn unary(Tensor (*f)(const Tensor&)) {
  return [f](const Inputs& in, const Args&) { return Outputs{f(in.at(0))}; };
}
OpFn binary(Tensor (*f)(const Tensor&, const Tensor&)) {
  return [f](const Inputs& in, const Args&) { return Outputs{f(in.at(0), in.at(1))}; };
}
OpFn with_scalar(Tensor (*f)(const Tensor&, double)) {
  return [f](const Inputs& in, const Args& a) { return Outputs{f(in.at(0), a.num("s"))}; };
}
using DimsOp = Tensor (*)(const Tensor&, const std::vector<int64_t>&, bool);
/// cumsum or cumprod: dim, and dtype when given.
OpFn running(Tensor (*f)(const Tensor&, int64_t, std::optional<DType>)) {
  return [f](const Inputs& in, const Args& a) {
    const std::string dtype = a.text("dtype", "");
    return Outputs{
        f(in.at(0), a.integer("dim"), dtype.empty() ? std::nullopt : std::optional<DType>(parse_dtype(dtype)))};
  };
}

OpFn over_dims(DimsOp f) {
  return
      [f](const Inputs& in, const Args& a) { return Outputs{f(in.at(0), a.ints("dims"), a.flag("keepdim", false))}; };
}
OpFn along_dim(Tensor (*f)(const Tensor&, int64_t)) {
  return [f](const Inputs& in, const Args& a) { return Outputs{f(in.at(0), a.integer("dim"))}; };
}
using ValuesIndicesOp = ValuesIndices (*)(const Tensor&, int64_t, bool);
OpFn values_indices(ValuesIndicesOp f) {
  return [f](const Inputs& in, const Args& a) {
    ValuesIndices r = f(in.at(0), a.integer("dim"), a.flag("keepdim", false));
    return Outputs{r.values, r.indices};
  };
}
/// quantile or nanquantile: q a second input or the number "q"; dim when given.
OpFn quantiles(bool skip_nan) {
  return [skip_nan](const Inputs& in, const Args& a) {
    const std::optional<int64_t> dim = a.get("dim") ? std::optional<int64_t>(a.integer("dim")) : std::nullopt;
    const bool keep = a.flag("keepdim", false);
    const std::string mode = a.text("interpolation", "linear");
    if (in.size() > 1) {
      return Outputs{skip_nan ? nanquantile(in.at(0), in.at(1), dim, keep, mode)
                              : quantile(in.at(0), in.at(1), dim, keep, mode)};
    }
    const double q = a.num("q");
    return Outputs{skip_nan ? nanquantile(in.at(0), q, dim, keep, mode) : quantile(in.at(0), q, dim, keep, mode)};
  };
}
/// any or all: over one dim when given, else every dim.
OpFn logical_reduction(Tensor (*f)(const Tensor&, const std::vector<int64_t>&, bool)) {
  return [f](const Inputs& in, const Args& a) {
    const std::vector<int64_t> dims = a.get("dim") ? std::vector<int64_t>{a.integer("dim")} : std::vector<int64_t>{};
    return Outputs{f(in.at(0), dims, a.flag("keepdim", false))};
  };
}
/// cummax or cummin: values and indices along dim.
OpFn scan_indices(ValuesIndices (*f)(const Tensor&, int64_t)) {
  return [f](const Inputs& in, const Args& a) {
    const ValuesIndices r = f(in.at(0), a.integer("dim"));
    return Outputs{r.values, r.indices};
  };
}
using ArgOp = Tensor (*)(const Tensor&, int64_t, bool);
OpFn arg_reduce(ArgOp f) {
  return
      [f](const Inputs& in, const Args& a) { return Outputs{f(in.at(0), a.integer("dim"), a.flag("keepdim", false))}; };
}
using PointwiseLossOp = Tensor (*)(const Tensor&, const Tensor&, Reduction, double);
OpFn pointwise_loss(PointwiseLossOp f, const char* param) {
  return [f, param](const Inputs& in, const Args& a) {
    return Outputs{f(in.at(0), in.at(1), a.reduction(), a.num(param, 1.0))};
  };
}
/// An in-place op on a clone of input 0 (Note [Golden cases]); the written clone is the output.
OpFn on_clone(std::function<void(const Tensor&, const Inputs&, const Args&)> f) {
  return [f](const Inputs& in, const Args& a) {
    Tensor self = in.at(0).clone();
    f(self, in, a);
    return Outputs{self};
  };
}
OpFn on_clone_with_scalar(const Tensor& (*f)(const Tensor&, double)) {
  return on_clone([f](const Tensor& self, const Inputs&, const Args& a) { f(self, a.num("s")); });
}
/// batch_norm's outputs: y, then the running statistics after the call (updated in place).
Outputs with_running_stats(Tensor y, const Tensor& running_mean, const Tensor& running_var) {
  Outputs out{std::move(y)};
  for (const Tensor& s : {running_mean, running_var})
    if (s.defined()) out.push_back(s);
  return out;
}
/// Every op a case may name, keyed as tools/torch_golden_ops.py's OPS.
const std::map<std::string, OpFn>& op_table() {
  static const std::map<std::string, OpFn> table = {
      // unary and activations
      {"neg", unary(neg)}, {"exp", unary(exp)}, {"log", unary(log)}, {"sqrt", unary(sqrt)}, {"rsqrt", unary(rsqrt)},
      {"tanh", unary(tanh)}, {"sigmoid", unary(sigmoid)}, {"relu", unary(relu)}, {"silu", unary(silu)},
      {"log1p", unary(log1p)}, {"abs", unary(abs)}, {"square", unary(square)}, {"reciprocal", unary(reciprocal)},
      {"sin", unary(sin)}, {"cos", unary(cos)}, {"relu6", unary(relu6)}, {"hardsigmoid", unary(hardsigmoid)},
      {"hardswish", unary(hardswish)}, {"mish", unary(mish)}, {"tan", unary(tan)}, {"asin", unary(asin)},
      {"acos", unary(acos)}, {"atan", unary(atan)}, {"sinh", unary(sinh)}, {"cosh", unary(cosh)},
      {"asinh", unary(asinh)}, {"acosh", unary(acosh)}, {"atanh", unary(atanh)}, {"erf", unary(erf)},
      {"erfc", unary(erfc)}, {"expm1", unary(expm1)}, {"exp2", unary(exp2)}, {"log2", unary(log2)},
      {"log10", unary(log10)}, {"logsigmoid", unary(logsigmoid)}, {"selu", unary(selu)},
      {"celu", [](const Inputs& in, const Args& a) { return Outputs{celu(in.at(0), a.num("alpha", 1.0))}; }},
      {"softsign", unary(softsign)}, {"tanhshrink", unary(tanhshrink)},
      {"hardshrink", [](const Inputs& in, const Args& a) { return Outputs{hardshrink(in.at(0), a.num("lambd", 0.5))}; }},
      {"softshrink", [](const Inputs& in, const Args& a) { return Outputs{softshrink(in.at(0), a.num("lambd", 0.5))}; }},
      {"threshold",
       [](const Inputs& in, const Args& a) {
         return Outputs{threshold(in.at(0), a.num("threshold"), a.num("value"))};
       }},
      {"glu", [](const Inputs& in, const Args& a) { return Outputs{glu(in.at(0), a.integer("dim", -1))}; }},
      {"prelu", binary(prelu)}, {"floor", unary(floor)}, {"ceil", unary(ceil)},
      {"trunc", unary(trunc)}, {"round", unary(round)}, {"sign", unary(sign)},
      {"normalize",
       [](const Inputs& in, const Args& a) {
         return Outputs{normalize(in.at(0), a.num("p", 2.0), int64_t(a.num("dim", 1)), a.num("eps", 1e-12))};
       }},
      {"cosine_similarity",
       [](const Inputs& in, const Args& a) {
         return Outputs{cosine_similarity(in.at(0), in.at(1), int64_t(a.num("dim", 1)), a.num("eps", 1e-8))};
       }},
      {"pairwise_distance",
       [](const Inputs& in, const Args& a) {
         return Outputs{pairwise_distance(in.at(0), in.at(1), a.num("p", 2.0), a.num("eps", 1e-6),
                                          a.flag("keepdim", false))};
       }},
      {"triplet_margin_loss",
       [](const Inputs& in, const Args& a) {
         return Outputs{triplet_margin_loss(in.at(0), in.at(1), in.at(2), a.num("margin", 1.0), a.num("p", 2.0),
                                            a.num("eps", 1e-6), a.flag("swap", false), a.reduction())};
       }},
      {"cosine_embedding_loss",
       [](const Inputs& in, const Args& a) {
         return Outputs{cosine_embedding_loss(in.at(0), in.at(1), in.at(2), a.num("margin", 0.0), a.reduction())};
       }},
      {"gelu",
       [](const Inputs& in, const Args& a) {
         const std::string approx = a.text("approximate", "none");
         FRUGAL_CHECK(approx == "none" || approx == "tanh", "torch goldens: gelu approximate=", approx);
         return Outputs{approx == "tanh" ? gelu_tanh(in.at(0)) : gelu(in.at(0))};
       }},
      {"softplus",
       [](const Inputs& in, const Args& a) {
         return Outputs{softplus(in.at(0), a.num("beta", 1.0), a.num("threshold", 20.0))};
       }},
      {"pow_scalar", [](const Inputs& in, const Args& a) { return Outputs{pow(in.at(0), a.num("exponent"))}; }},
      {"clamp", [](const Inputs& in, const Args& a) { return Outputs{clamp(in.at(0), a.num("lo"), a.num("hi"))}; }},
      {"leaky_relu",
       [](const Inputs& in, const Args& a) { return Outputs{leaky_relu(in.at(0), a.num("negative_slope", 0.01))}; }},
      {"elu", [](const Inputs& in, const Args& a) { return Outputs{elu(in.at(0), a.num("alpha", 1.0))}; }},
      {"hardtanh",
       [](const Inputs& in, const Args& a) {
         return Outputs{hardtanh(in.at(0), a.num("min_val", -1.0), a.num("max_val", 1.0))};
       }},
      // binary
      {"add",
       [](const Inputs& in, const Args& a) { return Outputs{add(in.at(0), in.at(1), a.num("alpha", 1.0))}; }},
      {"sub",
       [](const Inputs& in, const Args& a) { return Outputs{sub(in.at(0), in.at(1), a.num("alpha", 1.0))}; }},
      {"mul", binary(mul)}, {"div", binary(div)}, {"maximum", binary(maximum)}, {"minimum", binary(minimum)},
      {"pow", binary(pow)},
      {"add_scalar", with_scalar(add)}, {"sub_scalar", with_scalar(sub)}, {"mul_scalar", with_scalar(mul)},
      {"div_scalar", with_scalar(div)}, {"rsub_scalar", with_scalar(rsub)}, {"rdiv_scalar", with_scalar(rdiv)},
      {"atan2", binary(atan2)}, {"hypot", binary(hypot)}, {"logaddexp", binary(logaddexp)},
      {"remainder", binary(remainder)}, {"fmod", binary(fmod)},
      {"div_floor", [](const Inputs& in, const Args&) { return Outputs{div(in.at(0), in.at(1), "floor")}; }},
      {"div_trunc", [](const Inputs& in, const Args&) { return Outputs{div(in.at(0), in.at(1), "trunc")}; }},
      {"remainder_scalar", with_scalar(remainder)}, {"fmod_scalar", with_scalar(fmod)},
      {"floor_divide_scalar", with_scalar(floor_divide)},
      {"where", [](const Inputs& in, const Args&) { return Outputs{where(in.at(0), in.at(1), in.at(2))}; }},
      {"masked_fill",
       [](const Inputs& in, const Args& a) { return Outputs{masked_fill(in.at(0), in.at(1), a.num("value"))}; }},
      // in place, on a clone (Note [Golden cases])
      {"add_", on_clone([](const Tensor& self, const Inputs& in, const Args& a) {
         add_(self, in.at(1), a.num("alpha", 1.0));
       })},
      {"sub_", on_clone([](const Tensor& self, const Inputs& in, const Args& a) {
         sub_(self, in.at(1), a.num("alpha", 1.0));
       })},
      {"mul_", on_clone([](const Tensor& self, const Inputs& in, const Args&) { mul_(self, in.at(1)); })},
      {"div_", on_clone([](const Tensor& self, const Inputs& in, const Args&) { div_(self, in.at(1)); })},
      {"add_scalar_", on_clone_with_scalar(add_)}, {"sub_scalar_", on_clone_with_scalar(sub_)},
      {"mul_scalar_", on_clone_with_scalar(mul_)}, {"div_scalar_", on_clone_with_scalar(div_)},
      {"masked_fill_", on_clone([](const Tensor& self, const Inputs& in, const Args& a) {
         masked_fill_(self, in.at(1), a.num("value"));
       })},
      {"copy_", on_clone([](const Tensor& self, const Inputs& in, const Args& a) {
         FRUGAL_CHECK(self.dtype() == parse_dtype(a.text("dtype", "")), "torch goldens: copy_ into ", self.describe(),
                      ", the case says ", a.text("dtype", ""));
         self.copy_(in.at(1));
       })},
      // conversions
      {"to", [](const Inputs& in, const Args& a) { return Outputs{in.at(0).to(parse_dtype(a.text("dtype", "")))}; }},
      // reductions
      {"sum", over_dims(sum)}, {"prod", over_dims(prod)}, {"mean", over_dims(mean)}, {"amax", over_dims(amax)}, {"amin", over_dims(amin)},
      {"logsumexp", over_dims(logsumexp)},
      {"var",
       [](const Inputs& in, const Args& a) {
         return Outputs{var(in.at(0), a.ints("dims"), a.integer("correction", 1), a.flag("keepdim", false))};
       }},
      {"std",
       [](const Inputs& in, const Args& a) {
         return Outputs{frugal::std(in.at(0), a.ints("dims"), a.integer("correction", 1), a.flag("keepdim", false))};
       }},
      {"vector_norm",
       [](const Inputs& in, const Args& a) {
         return Outputs{vector_norm(in.at(0), a.num("ord", 2.0), a.ints("dims"), a.flag("keepdim", false))};
       }},
      {"max_dim", values_indices(max)}, {"min_dim", values_indices(min)},
      {"argmax", arg_reduce(argmax)}, {"argmin", arg_reduce(argmin)},
      {"softmax", along_dim(softmax)}, {"log_softmax", along_dim(log_softmax)},
      {"cumsum", running(cumsum)}, {"cumprod", running(cumprod)},
      {"kthvalue",
       [](const Inputs& in, const Args& a) {
         const ValuesIndices r = kthvalue(in.at(0), a.integer("k"), a.integer("dim", -1), a.flag("keepdim", false));
         return Outputs{r.values, r.indices};
       }},
      {"diagonal",
       [](const Inputs& in, const Args& a) {
         return Outputs{diagonal(in.at(0), a.integer("offset", 0), a.integer("dim1", 0), a.integer("dim2", 1))};
       }},
      {"diag_embed",
       [](const Inputs& in, const Args& a) {
         return Outputs{diag_embed(in.at(0), a.integer("offset", 0), a.integer("dim1", -2), a.integer("dim2", -1))};
       }},
      {"diag", [](const Inputs& in, const Args& a) { return Outputs{diag(in.at(0), a.integer("offset", 0))}; }},
      {"trace", unary(trace)}, {"outer", binary(outer)}, {"kron", binary(kron)},
      {"tensordot",
       [](const Inputs& in, const Args& a) {
         return Outputs{tensordot(in.at(0), in.at(1), a.ints("dims_a"), a.ints("dims_b"))};
       }},
      {"cross", [](const Inputs& in, const Args& a) { return Outputs{cross(in.at(0), in.at(1), a.integer("dim", -1))}; }},
      {"cdist", [](const Inputs& in, const Args& a) { return Outputs{cdist(in.at(0), in.at(1), a.num("p", 2.0))}; }},
      {"cummax", scan_indices(cummax)}, {"cummin", scan_indices(cummin)},
      {"logcumsumexp", along_dim(logcumsumexp)},
      {"median_dim", values_indices(median)}, {"nanmedian_dim", values_indices(nanmedian)},
      {"median", unary(median)}, {"nanmedian", unary(nanmedian)},
      {"quantile", quantiles(false)}, {"nanquantile", quantiles(true)},
      {"nansum", over_dims(nansum)}, {"nanmean", over_dims(nanmean)},
      {"any", logical_reduction(any)}, {"all", logical_reduction(all)},
      {"count_nonzero", [](const Inputs& in, const Args& a) { return Outputs{count_nonzero(in.at(0), a.ints("dims"))}; }},
      {"masked_softmax",
       [](const Inputs& in, const Args& a) {
         return Outputs{masked_softmax(in.at(0), in.at(1), a.flag("is_causal", false), a.num("scale", 1.0))};
       }},
      {"sdpa",
       [](const Inputs& in, const Args& a) {
         std::optional<double> scale;
         if (a.get("scale")) scale = a.num("scale");
         return Outputs{scaled_dot_product_attention(in.at(0), in.at(1), in.at(2), in.at(3), a.flag("is_causal", false),
                                                     /*dropout_p=*/0.0, scale)};
       }},
      // shape and join
      {"roll",
       [](const Inputs& in, const Args& a) {
         return Outputs{roll(in.at(0), a.ints("shifts"), a.get("dims") ? a.ints("dims") : std::vector<int64_t>{})};
       }},
      {"einsum", [](const Inputs& in, const Args& a) { return Outputs{einsum(a.text("equation", ""), in)}; }},
      {"movedim",
       [](const Inputs& in, const Args& a) {
         return Outputs{movedim(in.at(0), a.ints("source"), a.ints("destination"))};
       }},
      {"pixel_shuffle",
       [](const Inputs& in, const Args& a) { return Outputs{pixel_shuffle(in.at(0), a.integer("factor"))}; }},
      {"pixel_unshuffle",
       [](const Inputs& in, const Args& a) { return Outputs{pixel_unshuffle(in.at(0), a.integer("factor"))}; }},
      {"flip", [](const Inputs& in, const Args& a) { return Outputs{flip(in.at(0), a.ints("dims"))}; }},
      {"repeat", [](const Inputs& in, const Args& a) { return Outputs{repeat(in.at(0), a.ints("repeats"))}; }},
      {"tril", [](const Inputs& in, const Args& a) { return Outputs{tril(in.at(0), a.integer("diagonal", 0))}; }},
      {"triu", [](const Inputs& in, const Args& a) { return Outputs{triu(in.at(0), a.integer("diagonal", 0))}; }},
      {"pad",
       [](const Inputs& in, const Args& a) {
         return Outputs{pad(in.at(0), a.ints("pad"), a.text("mode", "constant"), a.num("value", 0.0))};
       }},
      {"cat", [](const Inputs& in, const Args& a) { return Outputs{cat(in, a.integer("dim", 0))}; }},
      {"stack", [](const Inputs& in, const Args& a) { return Outputs{stack(in, a.integer("dim", 0))}; }},
      {"chunk",
       [](const Inputs& in, const Args& a) { return chunk(in.at(0), a.integer("chunks"), a.integer("dim", 0)); }},
      {"split_with_sizes",
       [](const Inputs& in, const Args& a) {
         return split_with_sizes(in.at(0), a.ints("sizes"), a.integer("dim", 0));
       }},
      // indexing
      {"gather",
       [](const Inputs& in, const Args& a) { return Outputs{gather(in.at(0), a.integer("dim"), in.at(1))}; }},
      {"scatter_add",
       [](const Inputs& in, const Args& a) {
         return Outputs{scatter_add(in.at(0), a.integer("dim"), in.at(1), in.at(2))};
       }},
      {"index_select",
       [](const Inputs& in, const Args& a) { return Outputs{index_select(in.at(0), a.integer("dim"), in.at(1))}; }},
      {"index_add",
       [](const Inputs& in, const Args& a) {
         return Outputs{index_add(in.at(0), a.integer("dim"), in.at(1), in.at(2))};
       }},
      {"embedding",
       [](const Inputs& in, const Args& a) {
         std::optional<int64_t> padding_idx;
         if (a.get("padding_idx")) padding_idx = a.integer("padding_idx");
         return Outputs{embedding(in.at(0), in.at(1), padding_idx)};
       }},
      {"one_hot",
       [](const Inputs& in, const Args& a) { return Outputs{one_hot(in.at(0), a.integer("num_classes", -1))}; }},
      // losses
      {"cross_entropy",
       [](const Inputs& in, const Args& a) {
         CrossEntropyOptions o;
         o.ignore_index = a.integer("ignore_index", -100);
         o.label_smoothing = a.num("label_smoothing", 0.0);
         o.reduction = a.reduction();
         o.weight = in.at(2);
         return Outputs{cross_entropy(in.at(0), in.at(1), o)};
       }},
      {"nll_loss",
       [](const Inputs& in, const Args& a) {
         ops::NllLossOptions o;
         o.weight = in.at(2);
         o.ignore_index = a.integer("ignore_index", -100);
         o.reduction = a.reduction();
         return Outputs{nll_loss(in.at(0), in.at(1), o)};
       }},
      {"mse_loss",
       [](const Inputs& in, const Args& a) { return Outputs{mse_loss(in.at(0), in.at(1), a.reduction())}; }},
      {"l1_loss", [](const Inputs& in, const Args& a) { return Outputs{l1_loss(in.at(0), in.at(1), a.reduction())}; }},
      {"smooth_l1_loss", pointwise_loss(smooth_l1_loss, "beta")},
      {"huber_loss", pointwise_loss(huber_loss, "delta")},
      {"binary_cross_entropy",
       [](const Inputs& in, const Args& a) {
         BceOptions o;
         o.weight = in.at(2);
         o.reduction = a.reduction();
         return Outputs{binary_cross_entropy(in.at(0), in.at(1), o)};
       }},
      {"bce_with_logits",
       [](const Inputs& in, const Args& a) {
         BceWithLogitsOptions o;
         o.weight = in.at(2);
         o.pos_weight = in.at(3);
         o.reduction = a.reduction();
         return Outputs{binary_cross_entropy_with_logits(in.at(0), in.at(1), o)};
       }},
      {"kl_div",
       [](const Inputs& in, const Args& a) {
         KlDivOptions o;
         const std::string r = a.text("reduction", "mean");
         o.reduction = r == "none" ? KlDivReduction::None
                       : r == "sum" ? KlDivReduction::Sum
                       : r == "batchmean" ? KlDivReduction::BatchMean
                                          : KlDivReduction::Mean;
         o.log_target = a.flag("log_target", false);
         return Outputs{kl_div(in.at(0), in.at(1), o)};
       }},
      // normalization
      {"layer_norm",
       [](const Inputs& in, const Args& a) {
         return Outputs{layer_norm(in.at(0), a.ints("normalized_shape"), in.at(1), in.at(2), a.num("eps", 1e-5))};
       }},
      {"group_norm",
       [](const Inputs& in, const Args& a) {
         return Outputs{group_norm(in.at(0), a.integer("num_groups"), in.at(1), in.at(2), a.num("eps", 1e-5))};
       }},
      {"rms_norm",
       [](const Inputs& in, const Args& a) {
         std::optional<double> eps;
         if (a.get("eps")) eps = a.num("eps");
         return Outputs{rms_norm(in.at(0), a.ints("normalized_shape"), in.at(1), eps)};
       }},
      {"batch_norm",
       [](const Inputs& in, const Args& a) {
         return with_running_stats(batch_norm(in.at(0), in.at(1), in.at(2), in.at(3), in.at(4),
                                              a.flag("training", false), a.num("momentum", 0.1), a.num("eps", 1e-5)),
                                   in.at(1), in.at(2));
       }},
      {"batch_norm_relu",
       [](const Inputs& in, const Args& a) {
         return with_running_stats(batch_norm_relu(in.at(0), in.at(1), in.at(2), in.at(3), in.at(4),
                                                   a.flag("training", false), a.num("momentum", 0.1),
                                                   a.num("eps", 1e-5)),
                                   in.at(1), in.at(2));
       }},
      {"batch_norm_add_relu",
       [](const Inputs& in, const Args& a) {
         return with_running_stats(batch_norm_add_relu(in.at(0), in.at(1), in.at(2), in.at(3), in.at(4), in.at(5),
                                                       a.flag("training", false), a.num("momentum", 0.1),
                                                       a.num("eps", 1e-5)),
                                   in.at(2), in.at(3));
       }},
      // convolution, pooling, products
      {"conv2d",
       [](const Inputs& in, const Args& a) {
         Conv2dOptions o;
         o.stride = a.pair("stride", 1);
         o.padding = a.pair("padding", 0);
         o.dilation = a.pair("dilation", 1);
         o.groups = a.integer("groups", 1);
         return Outputs{conv2d(in.at(0), in.at(1), in.at(2), o)};
       }},
      {"conv_transpose2d",
       [](const Inputs& in, const Args& a) {
         ConvTranspose2dOptions o;
         o.stride = a.pair("stride", 1);
         o.padding = a.pair("padding", 0);
         o.output_padding = a.pair("output_padding", 0);
         o.groups = a.integer("groups", 1);
         o.dilation = a.pair("dilation", 1);
         return Outputs{conv_transpose2d(in.at(0), in.at(1), in.at(2), o)};
       }},
      {"conv1d",
       [](const Inputs& in, const Args& a) {
         const Conv1dOptions o{.stride = a.integer("stride", 1),
                               .padding = a.integer("padding", 0),
                               .dilation = a.integer("dilation", 1),
                               .groups = a.integer("groups", 1)};
         return Outputs{conv1d(in.at(0), in.at(1), in.at(2), o)};
       }},
      {"conv_transpose1d",
       [](const Inputs& in, const Args& a) {
         const ConvTranspose1dOptions o{.stride = a.integer("stride", 1),
                                        .padding = a.integer("padding", 0),
                                        .output_padding = a.integer("output_padding", 0),
                                        .groups = a.integer("groups", 1),
                                        .dilation = a.integer("dilation", 1)};
         return Outputs{conv_transpose1d(in.at(0), in.at(1), in.at(2), o)};
       }},
      {"sort",
       [](const Inputs& in, const Args& a) {
         const ValuesIndices r = sort(in.at(0), a.integer("dim", -1), a.flag("descending", false));
         return Outputs{r.values, r.indices};
       }},
      {"argsort",
       [](const Inputs& in, const Args& a) {
         return Outputs{argsort(in.at(0), a.integer("dim", -1), a.flag("descending", false))};
       }},
      {"topk",
       [](const Inputs& in, const Args& a) {
         const ValuesIndices r = topk(in.at(0), a.integer("k"), a.integer("dim", -1), a.flag("largest", true));
         return Outputs{r.values, r.indices};
       }},
      {"max_pool1d",
       [](const Inputs& in, const Args& a) {
         const MaxPool1dOptions o{.stride = a.integer("stride", 0),
                                  .padding = a.integer("padding", 0),
                                  .dilation = a.integer("dilation", 1),
                                  .ceil_mode = a.flag("ceil_mode", false)};
         return Outputs{max_pool1d(in.at(0), a.integer("kernel"), o)};
       }},
      {"avg_pool1d",
       [](const Inputs& in, const Args& a) {
         const AvgPool1dOptions o{.stride = a.integer("stride", 0),
                                  .padding = a.integer("padding", 0),
                                  .ceil_mode = a.flag("ceil_mode", false),
                                  .count_include_pad = a.flag("count_include_pad", true)};
         return Outputs{avg_pool1d(in.at(0), a.integer("kernel"), o)};
       }},
      {"adaptive_avg_pool1d",
       [](const Inputs& in, const Args& a) { return Outputs{adaptive_avg_pool1d(in.at(0), a.integer("output_size"))}; }},
      {"max_pool2d",
       [](const Inputs& in, const Args& a) {
         MaxPool2dOptions o;
         o.stride = a.pair("stride", 0);
         o.padding = a.pair("padding", 0);
         o.dilation = a.pair("dilation", 1);
         o.ceil_mode = a.flag("ceil_mode", false);
         return Outputs{max_pool2d(in.at(0), a.pair("kernel", 0), o)};
       }},
      {"avg_pool2d",
       [](const Inputs& in, const Args& a) {
         AvgPool2dOptions o;
         o.stride = a.pair("stride", 0);
         o.padding = a.pair("padding", 0);
         o.ceil_mode = a.flag("ceil_mode", false);
         o.count_include_pad = a.flag("count_include_pad", true);
         return Outputs{avg_pool2d(in.at(0), a.pair("kernel", 0), o)};
       }},
      {"adaptive_avg_pool2d",
       [](const Inputs& in, const Args& a) {
         return Outputs{adaptive_avg_pool2d(in.at(0), a.pair("output_size", 0))};
       }},
      {"matmul", binary(matmul)},
      {"linear", [](const Inputs& in, const Args&) { return Outputs{linear(in.at(0), in.at(1), in.at(2))}; }},
      {"gelu_mlp",
       [](const Inputs& in, const Args&) {
         return Outputs{gelu_mlp(in.at(0), in.at(1), in.at(2), in.at(3), in.at(4))};
       }},
      {"linear_cross_entropy",
       [](const Inputs& in, const Args& a) {
         LinearCrossEntropyOptions o;
         o.loss.ignore_index = a.integer("ignore_index", -100);
         o.loss.label_smoothing = a.num("label_smoothing", 0.0);
         o.loss.reduction = a.reduction();
         o.chunk_rows = a.integer("chunk_rows", 0);
         return Outputs{linear_cross_entropy(in.at(0), in.at(1), in.at(2), in.at(3), o)};
       }},
  };
  return table;
}

// ---- comparing -----------------------------------------------------------------------------

/// The bound for results stored in `dt`: for 16-bit types a few roundings of the type; for
/// float32 ten times what the cases need today (all of them pass at 1e-6 |torch| + 1e-7 scale),
/// so an accumulation order or formula that loses accuracy shows up too.
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::Float16: return {4e-3, 1e-3};
    case DType::BFloat16: return {3e-2, 8e-3};
    case DType::Float32: return {1e-5, 1e-6};
    default: return {1e-10, 1e-12};
  }
}

/// The less precise of two dtypes (integers count as float64: they add no rounding).
DType coarser(DType a, DType b) {
  auto eps = [](DType t) { return t == DType::BFloat16 ? 3 : t == DType::Float16 ? 2 : t == DType::Float32 ? 1 : 0; };
  return eps(a) >= eps(b) ? a : b;
}

// ---- running a case ------------------------------------------------------------------------

/// Runs one case (Note [Golden cases]); every comparison is a CHECK naming the case.
void run_case(const GoldenFile& g, const json::Value& c, Device device) {
  const std::string id = str_of(member(c, "id")), op = str_of(member(c, "op"));
  const std::string title = case_title(c, device);
  const Args args{member(c, "args")};
  FRUGAL_CHECK(args.obj.is_object(), "torch goldens: \"args\" is not an object");
  Tol tol_override{0, 0};
  if (const json::Value* t = c.find("tol")) tol_override = {num_of(member(*t, "rtol")), num_of(member(*t, "atol"))};
  auto tol = [&](DType dt) { return tol_override.rtol > 0 ? tol_override : tol_for(dt); };

  auto it = op_table().find(op);
  FRUGAL_CHECK(it != op_table().end(), "torch goldens: no frugal op for \"", op, "\"");

  // Inputs: a leaf per stored base (requiring grad where the case says), then its views.
  const json::Value& in_meta = member(c, "inputs");
  FRUGAL_CHECK(in_meta.is_array(), "torch goldens: \"inputs\" is not an array");
  std::vector<Tensor> bases;
  Inputs inputs;
  bool any_grad = false;
  for (size_t i = 0; i < in_meta.items.size(); ++i) {
    const json::Value& m = in_meta.items[i];
    if (const json::Value* none = m.find("none"); none && none->boolean) {
      bases.emplace_back();
      inputs.emplace_back();
      continue;
    }
    Tensor base = fresh_copy(stored(g, id, "in" + std::to_string(i)), device);
    if (member(m, "grad").boolean) base.requires_grad_(true), any_grad = true;
    bases.push_back(base);
    inputs.push_back(apply_view(base, member(m, "view")));
  }

  const Outputs outs = it->second(inputs, args);

  // Outputs: dtype, shape, values.
  const json::Value& out_meta = member(c, "outputs");
  FRUGAL_CHECK(out_meta.is_array(), "torch goldens: \"outputs\" is not an array");
  CHECK_MESSAGE(outs.size() == out_meta.items.size(),
                title << ": " << outs.size() << " outputs, torch " << out_meta.items.size());
  TensorList roots, grads;
  DType compute = DType::Float64;  // the least precise output: what a gradient went through
  for (size_t k = 0; k < std::min(outs.size(), out_meta.items.size()); ++k) {
    const json::Value& m = out_meta.items[k];
    const DType dt = parse_dtype(str_of(member(m, "dtype")));
    const Tensor& want = stored(g, id, "out" + std::to_string(k));
    check_tensor(title, "out" + std::to_string(k), outs[k], want, dt, tol(dt));
    compute = coarser(compute, dt);
    if (member(m, "diff").boolean && any_grad) {
      CHECK_MESSAGE(outs[k].requires_grad(), title << ": out" << k << " is not differentiable in frugal");
      if (outs[k].requires_grad()) {
        roots.push_back(outs[k]);
        grads.push_back(stored(g, id, "gout" + std::to_string(k)).to(device));
      }
    }
  }

  // Gradients of the bases.
  if (roots.empty()) return;
  autograd::backward(roots, grads);
  for (size_t i = 0; i < bases.size(); ++i) {
    if (!bases[i].defined() || !bases[i].requires_grad()) continue;
    const Tensor& want = stored(g, id, "grad" + std::to_string(i));
    check_tensor(title, "grad of x" + std::to_string(i), bases[i].grad(), want, bases[i].dtype(),
                 tol(coarser(bases[i].dtype(), compute)));
  }
}

}  // namespace

void replay_golden_ops(const std::vector<std::string>& families, Device device) {
  const GoldenFile& g = golden_ops();
  replay_families(g, families, device, kGoldenFile, "op",
                  [&](const json::Value& c, const std::string&) { run_case(g, c, device); });
}

void check_golden_ops_file() {
  const GoldenFile& g = golden_ops();
  for (const json::Value& c : g.cases.items) {
    const json::Value* op = c.find("op");
    CHECK_MESSAGE((op && op->is_string() && op_table().count(op->text) == 1),
                  "torch goldens: a case names an op this test does not know: "
                      << (op && op->is_string() ? op->text : std::string("(none)")));
  }
}

}  // namespace frugal::testing
