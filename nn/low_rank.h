#pragma once
// Low-rank (SVD) layers that compress a trained model.
//
//   auto report = nn::compress(model, {.patterns = {"blocks.*.mlp.*"}, .energy = nn::Energy{0.95}});
//   std::cout << report;  // path, in, out, rank, parameters before/after, reconstruction error
//
// A Linear W (out, in) = U S Vh is replaced by two thin maps, x -> Vh_r x (rank) ->
// (U_r S_r) (.) + b, keeping the r largest singular values: rank * (in + out)
// parameters instead of in * out, and the best rank-r approximation in the Frobenius
// norm (Eckart-Young): ||W - U_r S_r Vh_r||_F = sqrt(sum_{i>r} s_i^2). Conversion is a
// no-grad, one-off step on trained weights (ops::svd is not differentiable); the
// LowRankLinear it makes is an ordinary trainable module, to be fine-tuned.
// Conv2d layers are factorized along their channels by LowRankConv2d (nn/low_rank_conv.h).
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/linear.h"
#include "nn/low_rank_budget.h"

namespace frugal::nn {

/// y = up(down(x)): down (in -> rank, no bias) then up (rank -> out, with the bias).
/// Parameters "down.weight" (rank, in), "up.weight" (out, rank), "up.bias" (out). Both
/// maps are nn::Linear, so they run through frugal::linear (and autocast, when on).
class LowRankLinear : public UnaryModule {
 public:
  /// Fresh factors, each initialised as a Linear of its shape. 1 <= rank <= min(in, out).
  LowRankLinear(int64_t in_features, int64_t out_features, int64_t rank, LinearOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LowRankLinear"; }
  std::string extra_repr() const override;
  /// The product up.weight @ down.weight (out, in): the dense weight this layer applies.
  Tensor dense_weight() const;

  std::shared_ptr<Linear> down, up;
  const int64_t in_features, out_features, rank;
};

/// A rank rule: the smallest rank whose singular values keep at least `fraction` of the
/// sum of squared singular values (the "energy", ||W_r||_F^2 / ||W||_F^2), 0 < fraction <= 1.
struct Energy {
  double fraction = 0.95;
};

struct LowRankOptions {
  /// Refuse a rank with rank * (in + out) >= in * out: such a "compression" saves nothing.
  /// Turn off to build an exact (full-rank) factorization on purpose.
  bool require_saving = true;
};

/// The smallest r with sum_{i<r} s_i^2 >= fraction * sum_i s_i^2, for singular values
/// `s` (k) in decreasing order; at least 1 (and 0 only for an all-zero or empty `s`).
int64_t rank_for_energy(const Tensor& s, Energy energy);

/// The rank-`rank` truncated SVD of layer.weight as a LowRankLinear on the layer's device
/// and dtype (the SVD itself runs in float32, or float64 for float64 weights), in the layer's
/// train/eval mode; a frozen weight (requires_grad false) gives frozen factors, a frozen bias a
/// frozen up.bias, so compress() never makes a layer trainable that was not. Throws,
/// naming the layer's shape, when rank is outside [1, min(in, out)] or saves no parameters.
std::shared_ptr<LowRankLinear> to_low_rank(const Linear& layer, int64_t rank, LowRankOptions options = {});
/// As above with the rank chosen by rank_for_energy.
std::shared_ptr<LowRankLinear> to_low_rank(const Linear& layer, Energy energy, LowRankOptions options = {});

/// ||W - U_r S_r Vh_r||_F / ||W||_F, computed from the weights (in float64).
double relative_error(const Tensor& weight, const LowRankLinear& low_rank);

namespace detail {
/// ||weight - approx||_F / ||weight||_F in float64 (||approx||_F when weight is 0); `layer`
/// names the low-rank layer in the shape-mismatch message.
double relative_frobenius_error(const Tensor& weight, const Tensor& approx, const std::string& layer);
/// The factors (down.weight, up.weight, up.bias) require grad as the dense layer's weight and
/// bias do, and the factorized layer takes its train/eval mode.
void keep_trainability(const Module& dense, const Tensor& weight, const Tensor& bias, Module& factorized,
                       const Tensor& down_weight, const Tensor& up_weight, const Tensor& up_bias);
}  // namespace detail

// Note [Compress patterns]
// A pattern is a dotted module path in which each component is matched on its own and
// '*' matches any run of characters within ONE component: "*" matches "fc1" but not
// "mlp.fc1"; "blocks.*.mlp.*" matches "blocks.0.mlp.fc1"; "blocks.*.attn.*_proj" matches
// "blocks.3.attn.q_proj". A path must have as many components as the pattern.

/// Which layers compress() replaces, and how (patterns: Note [Compress patterns]).
struct CompressPolicy {
  std::vector<std::string> patterns;
  /// The rank rule, unless `rank` > 0.
  Energy energy{};
  /// A fixed rank for every matched layer (0: use `energy`).
  int64_t rank = 0;
  /// Also replace matching Conv2d layers by LowRankConv2d (nn/low_rank_conv.h). Off by
  /// default, so that patterns written for Linear layers ("*") never touch a CNN's convs
  /// unasked. A matched Conv2d with groups > 1 is kept and reported as such.
  bool convs = false;
  /// The budget rule instead (Note [Parameter budget] in nn/low_rank_budget.h): ranks per
  /// layer such that the matched layers' weights keep at most this fraction, in (0, 1], of
  /// their parameters, losing the least energy. Excludes `rank`.
  std::optional<double> param_budget = std::nullopt;
};

/// What compress() did to one layer.
struct LayerCompression {
  std::string path;
  int64_t in_features = 0, out_features = 0, rank = 0;  ///< a Conv2d's in/out channels
  int64_t params_before = 0, params_after = 0;
  double relative_error = 0;           ///< ||W - U_r S_r Vh_r||_F / ||W||_F (0 when kept)
  double energy_kept = 1;              ///< sum_{i<r} s_i^2 / sum_i s_i^2 (1 when kept)
  bool replaced = false;               ///< false: the chosen rank saved nothing (or groups > 1), the layer was kept
  std::string type = "Linear";         ///< "Linear" or "Conv2d"
  int64_t kernel_h = 1, kernel_w = 1;  ///< a Conv2d's kernel; its matrix is (out, in * kernel_h * kernel_w)
  int64_t groups = 1;                  ///< a Conv2d's groups (> 1: kept, not factorized)
};

struct CompressReport {
  std::vector<LayerCompression> layers;
  int64_t params_before() const;
  int64_t params_after() const;
  /// One row per layer and a total row.
  std::string table() const;
};
std::ostream& operator<<(std::ostream& os, const CompressReport& report);

/// Whether dotted `path` matches `pattern` (Note [Compress patterns]).
bool path_matches(const std::string& pattern, const std::string& path);

/// Replaces every Linear of `model` whose dotted path matches one of policy.patterns by
/// its LowRankLinear (Module::replace_module), under no grad, at the rank of policy.rank,
/// policy.param_budget or policy.energy; with policy.convs, every matching Conv2d by its
/// LowRankConv2d too. A layer whose chosen rank saves no
/// parameters is kept and reported as such. Throws when no layer matches, when two matched
/// paths are one shared layer, when a layer cannot be factorized (a NaN or inf weight: the
/// error names its path), and when a matched layer is also held outside its parent's registry
/// (a typed member the parent does not re-point in on_replace_module), since the replacement
/// would be unused; after an error the model is as it was (every layer is factorized before
/// any is swapped, so the factors of all of them exist at once, beside the dense layers until
/// the last swap). Parameters change: make the optimizer after compressing.
CompressReport compress(Module& model, const CompressPolicy& policy);

}  // namespace frugal::nn
