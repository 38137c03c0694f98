#include "nn/low_rank.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <sstream>

#include "autograd/grad_mode.h"
#include "nn/low_rank_conv.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/svd.h"

namespace frugal::nn {

LowRankLinear::LowRankLinear(int64_t in, int64_t out, int64_t r, LinearOptions options)
    : in_features(in), out_features(out), rank(r) {
  FRUGAL_CHECK(in > 0 && out > 0, "LowRankLinear: features must be positive, got in=", in, " out=", out);
  FRUGAL_CHECK(r >= 1 && r <= std::min(in, out), "LowRankLinear: rank ", r, " is outside [1, min(in=", in,
               ", out=", out, ")]");
  down = register_module("down", std::make_shared<Linear>(in, r, LinearOptions{.bias = false}));
  up = register_module("up", std::make_shared<Linear>(r, out, options));
}

Tensor LowRankLinear::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  FRUGAL_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "LowRankLinear: expected input (..., ", in_features,
               "), got ", x.describe());
  return up->forward(down->forward(x));
}

std::string LowRankLinear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) + ", out_features=" + std::to_string(out_features) +
         ", rank=" + std::to_string(rank) + ", bias=" + (up->bias.defined() ? "true" : "false");
}

Tensor LowRankLinear::dense_weight() const {
  autograd::NoGradGuard no_grad;
  return ops::matmul(up->weight.detach(), down->weight.detach());
}

// Note [Energy in units of the largest singular value]
// Energies are sums of s_i^2, and s_i^2 leaves double's range long before s_i does: a
// float64 weight of magnitude 1e-170 has every s_i^2 = 0 (so "all energy" at rank 1), one
// of 1e160 has s_0^2 = inf (so rank 1 again, and NaN shares). The rank rules and the
// reports use only ratios of energies, so they divide every s_i by the largest first,
// which changes no ratio and keeps every square in [0, 1]; likewise relative_error
// divides both matrices by the largest |w_ij|, and ranks_for_budget each spectrum by its s_0.
namespace {
void scale_to_largest(std::vector<double>& values) {
  double largest = 0;
  for (double v : values) largest = std::max(largest, std::fabs(v));
  if (largest > 0)
    for (double& v : values) v /= largest;
}
}  // namespace

int64_t rank_for_energy(const Tensor& s, Energy energy) {
  FRUGAL_CHECK(energy.fraction > 0 && energy.fraction <= 1, "rank_for_energy: fraction must be in (0, 1], got ",
               energy.fraction);
  FRUGAL_CHECK(s.dim() == 1, "rank_for_energy: expected singular values (k), got ", s.describe());
  std::vector<double> values = s.tolist<double>();
  for (size_t i = 0; i < values.size(); ++i)  // as ranks_for_budget: a spectrum, or nonsense
    FRUGAL_CHECK(std::isfinite(values[i]) && values[i] >= 0 && (i == 0 || values[i] <= values[i - 1]),
                 "rank_for_energy: singular value ", i, " is ", values[i], " after ", i ? values[i - 1] : 0.0,
                 "; expected finite, non-negative values in non-increasing order (ops::svd's S)");
  scale_to_largest(values);  // Note [Energy in units of the largest singular value]
  double total = 0;
  for (double v : values) total += v * v;
  if (total == 0) return values.empty() ? 0 : 1;
  // Compare against the target with a relative slack of a few ulps, so that a fraction
  // met exactly (e.g. 0.9 of a spectrum built to give it) is not missed by rounding.
  const double target = energy.fraction * total * (1 - 1e-12);
  double kept = 0;
  for (size_t r = 0; r < values.size(); ++r) {
    kept += values[r] * values[r];
    if (kept >= target) return int64_t(r) + 1;
  }
  return int64_t(values.size());
}

namespace {

std::string layer_str(const Linear& layer) {
  return "Linear(in=" + std::to_string(layer.in_features) + ", out=" + std::to_string(layer.out_features) + ")";
}

/// The thin SVD of layer.weight in float32 (float64 for float64 weights), on its device.
ops::SVDResult weight_svd(const Linear& layer) {
  const Tensor w = layer.weight.detach();
  return ops::svd(w.dtype() == kFloat64 ? w : w.to(kFloat32));
}

void check_rank(const Linear& layer, int64_t rank, LowRankOptions options, const char* how) {
  const int64_t in = layer.in_features, out = layer.out_features;
  FRUGAL_CHECK(rank >= 1 && rank <= std::min(in, out), "to_low_rank: rank ", rank, how, " is outside [1, ",
               std::min(in, out), "] for ", layer_str(layer));
  if (options.require_saving) {
    const int64_t largest = (in * out - 1) / (in + out);  // the largest rank with rank * (in + out) < in * out
    FRUGAL_CHECK(rank * (in + out) < in * out, "to_low_rank: rank ", rank, how, " saves no parameters for ",
                 layer_str(layer), ": rank * (in + out) = ", rank * (in + out), " >= in * out = ", in * out,
                 largest >= 1 ? " (ranks up to " + std::to_string(largest) + " save)" : " (no rank saves)",
                 "; pass LowRankOptions{.require_saving = false} to factorize anyway");
  }
}

std::shared_ptr<LowRankLinear> build(const Linear& layer, const ops::SVDResult& f, int64_t rank) {
  autograd::NoGradGuard no_grad;
  auto m = std::make_shared<LowRankLinear>(layer.in_features, layer.out_features, rank,
                                           LinearOptions{.bias = layer.bias.defined()});
  m->to(layer.weight.device(), layer.weight.dtype());
  // W ~ (U_r diag(S_r)) Vh_r: up.weight (out, r) = U_r S_r, down.weight (r, in) = Vh_r.
  ops::copy_into(m->down->weight, f.Vh.narrow(0, 0, rank));
  ops::copy_into(m->up->weight, ops::mul(f.U.narrow(1, 0, rank), f.S.narrow(0, 0, rank)));
  if (layer.bias.defined()) ops::copy_into(m->up->bias, layer.bias.detach());
  detail::keep_trainability(layer, layer.weight, layer.bias, *m, m->down->weight, m->up->weight, m->up->bias);
  return m;
}

}  // namespace

void detail::keep_trainability(const Module& dense, const Tensor& weight, const Tensor& bias, Module& factorized,
                               const Tensor& down_weight, const Tensor& up_weight, const Tensor& up_bias) {
  down_weight.requires_grad_(weight.requires_grad());
  up_weight.requires_grad_(weight.requires_grad());
  if (bias.defined()) up_bias.requires_grad_(bias.requires_grad());
  factorized.train(dense.is_training());
}

std::shared_ptr<LowRankLinear> to_low_rank(const Linear& layer, int64_t rank, LowRankOptions options) {
  check_rank(layer, rank, options, "");
  return build(layer, weight_svd(layer), rank);
}

std::shared_ptr<LowRankLinear> to_low_rank(const Linear& layer, Energy energy, LowRankOptions options) {
  const ops::SVDResult f = weight_svd(layer);
  const int64_t rank = std::max<int64_t>(1, rank_for_energy(f.S, energy));
  check_rank(layer, rank, options, (" (energy " + std::to_string(energy.fraction) + ")").c_str());
  return build(layer, f, rank);
}

double detail::relative_frobenius_error(const Tensor& weight, const Tensor& approx, const std::string& layer) {
  autograd::NoGradGuard no_grad;
  const Tensor w = weight.detach().to(kCPU, kFloat64);
  FRUGAL_CHECK(w.sizes() == approx.sizes(), "relative_error: weight ", w.describe(), " does not match ", layer);
  // In units of the largest |w_ij| (or |approx_ij| for a zero weight), so that no square
  // under- or overflows (Note [Energy in units of the largest singular value]).
  const std::vector<double> wv = w.contiguous().tolist<double>(),
                            av = approx.to(kCPU, kFloat64).contiguous().tolist<double>();
  double unit = 0;
  for (double v : wv) unit = std::max(unit, std::fabs(v));
  if (unit == 0)
    for (double v : av) unit = std::max(unit, std::fabs(v));
  if (unit == 0) return 0;
  double num = 0, den = 0;
  for (size_t i = 0; i < wv.size(); ++i) {
    const double d = wv[i] / unit - av[i] / unit;
    num += d * d;
    den += (wv[i] / unit) * (wv[i] / unit);
  }
  return den == 0 ? unit * std::sqrt(num) : std::sqrt(num / den);
}

double relative_error(const Tensor& weight, const LowRankLinear& low_rank) {
  autograd::NoGradGuard no_grad;
  const Tensor approx =
      ops::matmul(low_rank.up->weight.detach().to(kCPU, kFloat64), low_rank.down->weight.detach().to(kCPU, kFloat64));
  return detail::relative_frobenius_error(weight, approx, low_rank.repr());
}

// ---- compress ---------------------------------------------------------------------

namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

/// '*' matches any run of characters within one component (no dots there).
bool component_matches(const std::string& pat, const std::string& s) {
  size_t p = 0, i = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (p < pat.size() && pat[p] == '*') star = p++, mark = i;
    else if (p < pat.size() && pat[p] == s[i]) ++p, ++i;
    else if (star != std::string::npos) p = star + 1, i = ++mark;
    else return false;
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

std::shared_ptr<Module> child_of(const Module& parent, const std::string& name) {
  for (auto& [n, m] : parent.named_children())
    if (n == name) return m;
  FRUGAL_FAIL("compress: ", parent.type_name(), " has no submodule '", name, "'");
}

}  // namespace

bool path_matches(const std::string& pattern, const std::string& path) {
  const auto pat = split_path(pattern), parts = split_path(path);
  if (pat.size() != parts.size()) return false;
  for (size_t i = 0; i < pat.size(); ++i)
    if (!component_matches(pat[i], parts[i])) return false;
  return true;
}

int64_t CompressReport::params_before() const {
  int64_t n = 0;
  for (const auto& l : layers) n += l.params_before;
  return n;
}
int64_t CompressReport::params_after() const {
  int64_t n = 0;
  for (const auto& l : layers) n += l.params_after;
  return n;
}

std::string CompressReport::table() const {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-32s %-6s %6s %6s %6s %6s %12s %12s %10s %7s\n", "layer", "type", "in", "out",
                "kernel", "rank", "params", "params_lr", "rel_error", "energy");
  os << line;
  for (const auto& l : layers) {
    const std::string kernel =
        l.type == "Conv2d" ? std::to_string(l.kernel_h) + "x" + std::to_string(l.kernel_w) : std::string("-");
    const std::string kept = l.replaced     ? ""
                             : l.groups > 1 ? "  (kept: groups=" + std::to_string(l.groups) + ")"
                                            : "  (kept: no saving)";
    std::snprintf(line, sizeof line, "%-32s %-6s %6lld %6lld %6s %6lld %12lld %12lld %10.4f %7.4f%s\n", l.path.c_str(),
                  l.type.c_str(), (long long)l.in_features, (long long)l.out_features, kernel.c_str(),
                  (long long)l.rank, (long long)l.params_before, (long long)l.params_after, l.relative_error,
                  l.energy_kept, kept.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "%-32s %-6s %6s %6s %6s %6s %12lld %12lld %9.1f%%\n", "total", "", "", "", "", "",
                (long long)params_before(), (long long)params_after(),
                params_before() ? 100.0 * double(params_after()) / double(params_before()) : 0.0);
  os << line;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const CompressReport& report) { return os << report.table(); }

namespace {

/// The row of one matched layer, and its replacement (null when the layer is kept).
struct LayerPlan {
  LayerCompression row;
  std::shared_ptr<Module> replacement;
};

/// The rank of one layer: the budget's (`budget_rank` > 0), the policy's fixed rank, or the energy rule's.
int64_t chosen_rank(const CompressPolicy& policy, const ops::SVDResult& f, int64_t budget_rank) {
  if (budget_rank > 0) return budget_rank;
  return policy.rank > 0 ? policy.rank : std::max<int64_t>(1, rank_for_energy(f.S, policy.energy));
}

/// sum_{i<rank} s_i^2 / sum_i s_i^2 (1 for an all-zero spectrum).
double energy_fraction(const Tensor& s, int64_t rank) {
  std::vector<double> v = s.to(kCPU, kFloat64).tolist<double>();
  scale_to_largest(v);  // Note [Energy in units of the largest singular value]
  double kept = 0, total = 0;
  for (size_t i = 0; i < v.size(); ++i) (int64_t(i) < rank ? kept : total) += v[i] * v[i];
  total += kept;
  return total == 0 ? 1.0 : kept / total;
}

LayerPlan plan_linear(const std::string& path, const Linear& layer, const CompressPolicy& policy, int64_t budget_rank) {
  LayerPlan plan{.row = {.path = path,
                         .in_features = layer.in_features,
                         .out_features = layer.out_features,
                         .params_before = layer.num_parameters()},
                 .replacement = nullptr};
  LayerCompression& row = plan.row;
  const ops::SVDResult f = weight_svd(layer);
  const int64_t in = layer.in_features, out = layer.out_features;
  row.rank = chosen_rank(policy, f, budget_rank);
  if (row.rank > std::min(in, out) || row.rank * (in + out) >= in * out) {
    row.rank = std::min(row.rank, std::min(in, out));
    row.params_after = row.params_before;
    return plan;
  }
  auto low_rank = build(layer, f, row.rank);
  row.params_after = low_rank->num_parameters();
  row.relative_error = relative_error(layer.weight, *low_rank);
  row.energy_kept = energy_fraction(f.S, row.rank);
  row.replaced = true;
  plan.replacement = low_rank;
  return plan;
}

LayerPlan plan_conv(const std::string& path, const Conv2d& layer, const CompressPolicy& policy, int64_t budget_rank) {
  LayerPlan plan{.row = {.path = path,
                         .in_features = layer.in_channels,
                         .out_features = layer.out_channels,
                         .params_before = layer.num_parameters(),
                         .type = "Conv2d",
                         .kernel_h = layer.kernel_size.h,
                         .kernel_w = layer.kernel_size.w,
                         .groups = layer.options.groups},
                 .replacement = nullptr};
  LayerCompression& row = plan.row;
  row.params_after = row.params_before;
  if (layer.options.groups != 1) return plan;  // not one matrix: kept (reported as such)
  const ops::SVDResult f = detail::conv_weight_svd(layer);
  const int64_t patch = layer.in_channels * layer.kernel_size.h * layer.kernel_size.w, out = layer.out_channels;
  row.rank = chosen_rank(policy, f, budget_rank);
  if (row.rank > std::min(patch, out) || row.rank * (patch + out) >= patch * out) {
    row.rank = std::min(row.rank, std::min(patch, out));
    return plan;
  }
  auto low_rank = detail::build_low_rank_conv(layer, f, row.rank);
  row.params_after = low_rank->num_parameters();
  row.relative_error = relative_error(layer.weight, *low_rank);
  row.energy_kept = energy_fraction(f.S, row.rank);
  row.replaced = true;
  plan.replacement = low_rank;
  return plan;
}

/// The budget rule's rank for each of `paths` (Note [Parameter budget]); a grouped Conv2d,
/// which compress keeps, enters as dense and unshrinkable (rank 0: no override).
template <class ParentOf>
std::vector<int64_t> ranks_under_budget(const std::vector<std::string>& paths, double fraction,
                                        const ParentOf& parent_of) {
  std::vector<LayerSpectrum> spectra;
  std::vector<size_t> index;  // paths[index[k]] has spectra[k]
  int64_t fixed = 0;          // weight parameters of layers the budget cannot shrink
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto [parent, name] = parent_of(paths[i]);
    const std::shared_ptr<Module> child = child_of(*parent, name);
    if (auto linear = std::dynamic_pointer_cast<Linear>(child)) {
      spectra.push_back({.in = linear->in_features,
                         .out = linear->out_features,
                         .s = weight_svd(*linear).S.to(kCPU, kFloat64).tolist<double>()});
    } else {
      const auto& conv = dynamic_cast<const Conv2d&>(*child);
      const int64_t patch = conv.in_channels / conv.options.groups * conv.kernel_size.h * conv.kernel_size.w;
      if (conv.options.groups != 1) {
        fixed += conv.out_channels * patch;
        continue;
      }
      spectra.push_back({.in = patch,
                         .out = conv.out_channels,
                         .s = detail::conv_weight_svd(conv).S.to(kCPU, kFloat64).tolist<double>()});
    }
    index.push_back(i);
  }
  std::vector<int64_t> ranks(paths.size(), 0);
  if (spectra.empty()) return ranks;
  // The budget is over all matched weights; kept layers spend their share first.
  const int64_t total = dense_weight_params(spectra) + fixed;
  const double shrinkable = fraction * double(total) - double(fixed);
  FRUGAL_CHECK(shrinkable > 0, "compress: param_budget ", fraction, " leaves nothing for the factorizable layers (",
               fixed, " of ", total, " weight parameters are in grouped convs that stay as they are)");
  const std::vector<RankChoice> choice = ranks_for_budget(
      spectra, {fixed == 0 ? fraction : std::min(1.0, shrinkable / double(dense_weight_params(spectra)))});
  for (size_t k = 0; k < choice.size(); ++k) ranks[index[k]] = choice[k].rank;
  return ranks;
}

}  // namespace

// Note [Replacing a layer in place]
// compress() swaps a child in its parent's registry (Module::replace_module), which is
// what named_parameters(), state_dict() and Sequential's forward read. A parent whose
// forward calls the child through a typed member (MultiheadAttention::out_proj, a
// Linear) would keep calling the old layer: the swap would silently do nothing. Such a
// layer is caught by its reference count: once swapped out, compress() holds the only
// reference unless somebody else (the typed member) still does, and then the swap is
// undone and reported. Parents that want their layers compressible keep them as
// UnaryModule and re-point them in on_replace_module.
CompressReport compress(Module& model, const CompressPolicy& policy) {
  FRUGAL_CHECK(!policy.patterns.empty(), "compress: the policy has no patterns");
  FRUGAL_CHECK(policy.rank >= 0, "compress: rank must be positive (or 0 for the energy rule), got ", policy.rank);
  FRUGAL_CHECK(!policy.param_budget || policy.rank == 0, "compress: a policy takes a fixed rank (", policy.rank,
               ") or a param_budget (", policy.param_budget.value_or(0), "), not both");
  FRUGAL_CHECK(!policy.param_budget || (*policy.param_budget > 0 && *policy.param_budget <= 1),
               "compress: param_budget must be in (0, 1], got ", policy.param_budget.value_or(0));
  autograd::NoGradGuard no_grad;
  const std::string kinds = policy.convs ? "Linear or Conv2d" : "Linear";
  // Paths first, then one swap at a time: holding no handles while swapping keeps the
  // reference count meaningful (Note [Replacing a layer in place]).
  std::vector<std::string> paths, all_layers;
  for (const auto& [path, m] : model.named_modules()) {
    if (!std::dynamic_pointer_cast<Linear>(m) && !(policy.convs && std::dynamic_pointer_cast<Conv2d>(m))) continue;
    const size_t dot = path.rfind('.');
    if (dot != std::string::npos) {  // the factors of an earlier low-rank layer are not layers to compress
      const std::string parent = path.substr(0, dot);
      bool inside_low_rank = false;
      for (const auto& [p, pm] : model.named_modules())
        if (p == parent)
          inside_low_rank =
              std::dynamic_pointer_cast<LowRankLinear>(pm) || std::dynamic_pointer_cast<LowRankConv2d>(pm);
      if (inside_low_rank) continue;
    }
    all_layers.push_back(path);
    for (const auto& pat : policy.patterns)
      if (path_matches(pat, path)) {
        paths.push_back(path);
        break;
      }
  }
  if (paths.empty()) {
    std::string known;
    for (const auto& p : all_layers) known += "\n  " + p;
    FRUGAL_FAIL("compress: no ", kinds, " layer of ", model.type_name(), " matches the patterns (",
                policy.patterns.size(), ", first '", policy.patterns.front(), "'); its ", kinds,
                " layers are:", known.empty() ? " none" : known);
  }

  auto parent_of = [&](const std::string& path) {
    const size_t dot = path.rfind('.');
    Module* parent = &model;
    if (dot != std::string::npos)
      for (const auto& part : split_path(path.substr(0, dot))) parent = child_of(*parent, part).get();
    return std::pair<Module*, std::string>(parent, dot == std::string::npos ? path : path.substr(dot + 1));
  };
  const std::vector<int64_t> budget_ranks =
      policy.param_budget ? ranks_under_budget(paths, *policy.param_budget, parent_of) : std::vector<int64_t>();

  // Every layer is planned (its SVD, its checks) before any is swapped, and a failed swap
  // puts the earlier ones back: an error leaves the model as it was.
  std::vector<LayerPlan> plans;
  std::map<const Module*, std::string> planned;  // a layer shared by two paths is refused
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    const auto [parent, name] = parent_of(path);
    const int64_t budget_rank = budget_ranks.empty() ? 0 : budget_ranks[i];
    const std::shared_ptr<Module> child = child_of(*parent, name);
    const auto [at, fresh] = planned.emplace(child.get(), path);
    FRUGAL_CHECK(fresh, "compress: '", path, "' and '", at->second, "' are one shared ", child->type_name(),
                 "; a shared layer is not compressed (give each path a layer of its own, or match only one)");
    try {
      if (auto linear = std::dynamic_pointer_cast<Linear>(child))
        plans.push_back(plan_linear(path, *linear, policy, budget_rank));
      else plans.push_back(plan_conv(path, dynamic_cast<const Conv2d&>(*child), policy, budget_rank));
    } catch (const std::exception& e) {
      FRUGAL_FAIL("compress: layer '", path, "' (", child->type_name(), "): ", e.what());
    }
  }                                                                 // no handle on an old layer survives the loop
  std::vector<std::pair<size_t, std::shared_ptr<Module>>> swapped;  // (path index, the old layer)
  CompressReport report;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    const auto [parent, name] = parent_of(path);
    if (plans[i].replacement) {
      std::shared_ptr<Module> old = parent->replace_module(name, plans[i].replacement);
      if (old.use_count() > 1) {
        parent->replace_module(name, old);
        for (auto it = swapped.rbegin(); it != swapped.rend(); ++it) {
          const auto [earlier_parent, earlier_name] = parent_of(paths[it->first]);
          earlier_parent->replace_module(earlier_name, it->second);
        }
        FRUGAL_FAIL("compress: '", path, "' is also held outside ", parent->type_name(),
                    "'s registry (a typed member?), so a replacement would never run; keep it as a UnaryModule and "
                    "re-point it in ",
                    parent->type_name(),
                    "::on_replace_module (see Note [Replacing a layer in place] in nn/low_rank.cpp); nothing was "
                    "compressed");
      }
      swapped.emplace_back(i, std::move(old));
    }
    report.layers.push_back(plans[i].row);
  }
  return report;
}

}  // namespace frugal::nn
