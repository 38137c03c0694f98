#pragma once
// GaLore (Zhao et al., 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
// Projection") with AdamW: the Adam moments of a weight matrix live in a rank-r subspace
// of its gradient, refreshed from an SVD every update_proj_gap steps (Note [GaLore] in
// optim/galore.cpp). Other parameters take the same AdamW rule unprojected: galore_torch's
// GaLoreAdamW, eps and decay included (Note [GaLore follows galore_torch]).
// State per parameter: step, exp_avg, exp_avg_sq and, for projected matrices, projection.
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace frugal::optim {

struct GaLoreOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled, after the update (galore_torch): p *= 1 - lr * weight_decay
  /// r: the subspace's dimension. A 2-D parameter (m, n) is projected when min(m, n) > rank.
  int64_t rank = 128;
  /// T: the projection is recomputed from the gradient at step 0 and every T steps.
  int64_t update_proj_gap = 200;
  /// alpha: the projected update is scaled by it (the paper's 0.25).
  double scale = 0.25;
  /// Matrices with min(m, n) < min_dim are not projected even when min(m, n) > rank.
  int64_t min_dim = 0;
};

/// AdamW whose moments of weight matrices live in a periodically refreshed low-rank
/// subspace of the gradient, so they take 2 r n + m r floats instead of 2 m n.
///
///   optim::GaLoreAdamW opt(model.parameters(), {.lr = 1e-4, .rank = 128, .update_proj_gap = 200});
class GaLoreAdamW : public Optimizer {
 public:
  GaLoreAdamW(std::vector<Tensor> params, GaLoreOptions options = {});
  GaLoreAdamW(std::vector<ParamGroup> groups, GaLoreOptions options = {});

  void step() override;
  const GaLoreOptions& options() const { return options_; }

  /// Whether a parameter of shape `sizes` is projected under these options.
  bool projects(const Shape& sizes) const;

 protected:
  std::vector<HyperParam> hyperparams() const override;
  double default_lr() const override { return options_.lr; }
  std::vector<const char*> state_names() const override { return {"exp_avg", "exp_avg_sq", "projection"}; }
  bool counts_steps() const override { return true; }
  void check_group(const ParamGroup& group, size_t g) const override;
  void check_state(const ParamState& state, const Tensor& param, const std::string& prefix) const override;
  bool state_shape_ok(size_t b, const Shape& sizes, const Tensor& param) const override;

 private:
  GaLoreOptions options_;
};

/// The pieces of a GaLore step, for tests and for readers; G is (m, n), float32 or float64.
namespace galore {

/// True when the projection acts on the left, P (m, r) and R = P^T G (r, n): m < n. A square
/// matrix projects on the right, as galore_torch's projector does (rows >= columns: right).
inline bool projects_left(const Shape& sizes) { return sizes[0] < sizes[1]; }

/// The projection of G (m, n) to rank r < min(m, n): the top-r left singular vectors
/// U[:, :r] (m, r) when m < n, else the top-r right ones V[:, :r] (n, r); contiguous.
Tensor projection(const Tensor& grad, int64_t rank);

/// R: P^T G (r, n) when m < n, else G P (m, r).
Tensor project(const Tensor& grad, const Tensor& proj);

/// Back to (m, n): P N for N (r, n), or N P^T for N (m, r).
Tensor project_back(const Tensor& low, const Tensor& proj);

/// Elements of GaLore state for an (m, n) matrix at rank r: moments and projection,
/// 2 r n + m r when m < n, else 2 m r + n r.
int64_t state_elements(int64_t m, int64_t n, int64_t rank);

}  // namespace galore

}  // namespace frugal::optim
