#include "optim/galore.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "core/graph_capture.h"
#include "core/instrument.h"
#include "optim/step_util.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/index.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/svd.h"
#include "tensor/ops/unary.h"

namespace frugal::optim {

// Note [GaLore]
// Adam keeps two moments per weight, 2 m n floats for an (m, n) matrix. GaLore observes
// that the gradient of a weight matrix is close to low rank and changes its dominant
// subspace slowly, so it keeps the moments of a rank-r projection of the gradient instead:
//   every T steps (T = update_proj_gap; at the first step too), from the current gradient G:
//     m < n: P = U[:, :r]  (m, r),  of G = U S V^T        m >= n: P = V[:, :r]  (n, r)
//   every step:
//     R = P^T G  (r, n)                                    R = G P  (m, r)
//     M, V: Adam's moments of R, and N = M / (sqrt(V) + eps)  (r, n)  or  (m, r)
//     p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * alpha * (P N  or  N P^T);  p *= 1 - lr * wd
// (see Note [GaLore follows galore_torch] for where eps and the decay go).
// The side is the smaller dimension (a square matrix: the right, as galore_torch), so the moments take r * max(m, n)
// per moment and the projection r * min(m, n): the state of a projected matrix is
//   2 r n + m r   (m < n)         2 m r + n r   (m >= n)
// floats instead of AdamW's 2 m n (BERT-base's (768, 3072) FFN at r = 128: 0.92 M vs 4.7 M).
// A matrix with min(m, n) <= r (or < min_dim), and every 1-D or scalar parameter, takes
// the same rule unprojected (and no alpha), through the same fused kernel.
//
// Note [GaLore follows galore_torch]
// The published GaLore numbers come from galore_torch's GaLoreAdamW, whose update is
// Hugging Face's AdamW, not torch.optim.AdamW's (Note [Adam update]), for every parameter
// in it, projected or not: eps is added to the uncorrected sqrt(V), the bias corrections go
// into the step size, and the decoupled decay comes after the update:
//   step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//   p -= step_size * (M / (sqrt(V) + eps));   p -= lr * wd * p
// torch's rule, M_hat / (sqrt(V_hat) + eps), is this one with eps / sqrt(1 - beta2^t) in
// place of eps: 30x eps at t = 1 with beta2 = 0.999, which changes the early steps of
// small gradients by tens of percent; the decay order differs by lr * wd * update. Both
// are evaluated by Adam's own kernel, which computes p * decay - step_size * m / (sqrt(v)
// / c2 + eps): with c2 = 1 and step_size scaled by decay = 1 - lr * wd it is exactly
//   (p - step_size * M / (sqrt(V) + eps)) * (1 - lr * wd)
// in real arithmetic, galore_torch's two statements in one pass (galore_torch_rule below).
// The back-projected update of a projected matrix is applied the same way: w * decay +
// (lr * alpha * decay) * (-P N). The paper's Algorithm 1 writes torch's placement of eps
// and no decay; its reference code, and so its results, use the rule above.
//
// At a refresh the moments are not rotated into the new subspace, as in the paper and its
// reference implementation: M and V keep their coordinates and now describe the new
// basis's directions. A rotation P_new^T P_old exists for M, but V is elementwise (a
// diagonal preconditioner) and has no exact rotation, and with T in the hundreds the
// moments forget the old basis within ~1 / (1 - beta1) steps; the paper finds the jump
// harmless. Bias corrections use the parameter's step count, which does not restart.
//
// The SVD is the existing ops::svd (Eigen on the CPU, cuSOLVER on CUDA; on CUDA it waits
// for the device once per refresh); the projections are GEMMs and the Adam math is the
// fused multi-tensor kernel of Adam itself (one launch for every parameter, projected or
// not: each projected entry writes -N into a zeroed scratch "parameter", since with lr 1,
// a zero start and no decay the Adam rule leaves exactly -step_size * m / denom there).
// Signs: singular vectors are unique only up to sign. Within one subspace the update P N
// does not depend on it (flipping a column of P flips the same row of R, M and N), but the
// moments carried over a refresh do: M's row i, kept from the old basis, now multiplies the
// new column i, and cuSOLVER and Eigen pick different signs. So each column is flipped to
// a canonical sign (its largest-magnitude entry positive): the CPU and CUDA optimizers take
// the same steps across refreshes, and a gradient and its negation give the same P.
// The projection is saved in the state dict
// (state.<i>.projection), so a resumed run continues bit-identically.

namespace {

using detail::one_group;

/// Turns `e`, an entry adam_entry made for step t with decoupled decay, into galore_torch's
/// rule (Note [GaLore follows galore_torch]): the kernel's step_size becomes
/// lr_factor * sqrt(1 - beta2^t) / (1 - beta1^t), and its second correction 1, so eps is
/// added to the uncorrected sqrt(v). `lr_factor` is lr * (1 - lr * wd) for a parameter
/// stepped in place, 1 for a projected one (its lr and decay come at the back-projection).
void galore_torch_rule(detail::AdamEntry& e, int64_t t, double lr_factor) {
  e.step_size = lr_factor * std::sqrt(1.0 - std::pow(e.beta2, double(t))) / (1.0 - std::pow(e.beta1, double(t)));
  e.bias_correction2_sqrt = 1.0;
}

}  // namespace

namespace galore {

Tensor projection(const Tensor& grad, int64_t rank) {
  FRUGAL_CHECK(grad.dim() == 2 && (grad.dtype() == kFloat32 || grad.dtype() == kFloat64),
               "galore::projection: expected a float32 or float64 matrix, got ", grad.describe());
  const int64_t m = grad.size(0), n = grad.size(1);
  FRUGAL_CHECK(rank > 0 && rank < std::min(m, n), "galore::projection: rank ", rank,
               " must be in [1, min(m, n) = ", std::min(m, n), ") for ", grad.describe());
  const ops::SVDResult f = ops::svd(grad);
  const Tensor p = projects_left(grad.sizes()) ? f.U.narrow(1, 0, rank) : f.Vh.narrow(0, 0, rank).t();
  // Canonical signs, as sklearn's svd_flip: each column's largest-magnitude entry positive
  // (see "Signs" in Note [GaLore]).
  const Tensor largest = ops::gather(p, 0, ops::argmax(ops::abs(p), 0, /*keepdim=*/true));  // (1, r)
  return ops::mul(p, ops::sub(ops::mul(ops::ge(largest, 0.0), 2.0), 1.0).to(p.dtype())).contiguous();
}

Tensor project(const Tensor& grad, const Tensor& proj) {
  // grad: (m, n); proj: (m, r) or (n, r)
  return projects_left(grad.sizes()) ? ops::mm(proj.t(), grad) : ops::mm(grad, proj);
}

Tensor project_back(const Tensor& low, const Tensor& proj) {
  // low: (r, n) with proj (m, r), or (m, r) with proj (n, r); m >= n > r on the right
  return low.size(0) == proj.size(1) ? ops::mm(proj, low) : ops::mm(low, proj.t());
}

int64_t state_elements(int64_t m, int64_t n, int64_t rank) {
  return m < n ? 2 * rank * n + m * rank : 2 * m * rank + n * rank;
}

}  // namespace galore

GaLoreAdamW::GaLoreAdamW(std::vector<Tensor> params, GaLoreOptions options)
    : GaLoreAdamW(one_group(std::move(params)), options) {}

GaLoreAdamW::GaLoreAdamW(std::vector<ParamGroup> groups, GaLoreOptions options)
    : Optimizer("GaLoreAdamW"), options_(options) {
  FRUGAL_CHECK(options.rank > 0, name(), ": invalid rank ", options.rank, " (must be positive)");
  FRUGAL_CHECK(options.update_proj_gap > 0, name(), ": invalid update_proj_gap ", options.update_proj_gap,
               " (must be positive)");
  FRUGAL_CHECK(std::isfinite(options.scale) && options.scale > 0, name(), ": invalid scale ", options.scale,
               " (must be positive)");
  FRUGAL_CHECK(options.min_dim >= 0, name(), ": invalid min_dim ", options.min_dim, " (must be non-negative)");
  FRUGAL_CHECK(!groups.empty(), name(), ": got an empty parameter list");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

bool GaLoreAdamW::projects(const Shape& sizes) const {
  if (sizes.size() != 2) return false;
  const int64_t k = std::min(sizes[0], sizes[1]);
  return k > options_.rank && k >= options_.min_dim;
}

std::vector<Optimizer::HyperParam> GaLoreAdamW::hyperparams() const {
  return {{.name = "beta1", .real = &ParamGroup::beta1, .option = options_.beta1},
          {.name = "beta2", .real = &ParamGroup::beta2, .option = options_.beta2},
          {.name = "eps", .real = &ParamGroup::eps, .option = options_.eps},
          {.name = "weight_decay", .real = &ParamGroup::weight_decay, .option = options_.weight_decay}};
}

void GaLoreAdamW::check_group(const ParamGroup& group, size_t g) const { detail::check_adam_group(name(), group, g); }

bool GaLoreAdamW::state_shape_ok(size_t /*b*/, const Shape& sizes, const Tensor& param) const {
  return projects(param.sizes()) || sizes == param.sizes();  // projected: check_state checks the shapes
}

void GaLoreAdamW::check_state(const ParamState& st, const Tensor& param, const std::string& prefix) const {
  const Tensor &m = st.buffers[0], &v = st.buffers[1], &proj = st.buffers[2];
  FRUGAL_CHECK(m.defined() == v.defined(), name(), ".load_state_dict: ", prefix, "exp_avg and ", prefix,
               "exp_avg_sq must be given together");
  FRUGAL_CHECK(st.step == 0 || m.defined(), name(), ".load_state_dict: ", prefix, "step is ", st.step, " but ", prefix,
               "exp_avg is missing");
  if (!projects(param.sizes())) {
    FRUGAL_CHECK(!proj.defined(), name(), ".load_state_dict: ", prefix, "projection is given, but ", param.describe(),
                 " is not projected at rank ", options_.rank);
    return;
  }
  FRUGAL_CHECK(proj.defined() == m.defined(), name(), ".load_state_dict: ", prefix, "exp_avg and ", prefix,
               "projection must be given together");
  if (!m.defined()) return;
  const int64_t rows = param.size(0), cols = param.size(1), r = options_.rank;
  const bool left = galore::projects_left(param.sizes());
  const Shape want_proj = left ? Shape{rows, r} : Shape{cols, r};
  const Shape want_low = left ? Shape{r, cols} : Shape{rows, r};
  FRUGAL_CHECK(proj.sizes() == want_proj && m.sizes() == want_low && v.sizes() == want_low, name(),
               ".load_state_dict: ", prefix, "projection ", shape_str(proj.sizes()), ", exp_avg ", shape_str(m.sizes()),
               " and exp_avg_sq ", shape_str(v.sizes()), " do not fit ", param.describe(), " at rank ", r,
               " (expected ", shape_str(want_proj), ", ", shape_str(want_low), ", ", shape_str(want_low), ")");
}

void GaLoreAdamW::step() {
  core::refuse_in_graph_capture("GaLoreAdamW.step",
                                "its bias corrections follow the step count, which a replay would not advance (capture "
                                "SGD, or step this optimizer after replay())");
  autograd::NoGradGuard no_grad;
  core::CategoryScope category(core::Category::OptimizerState);  // for the profiler: its state and buffers
  core::OpScope op(name());                                      // and its time
  // A projected matrix between the fused Adam launch and its back-projection.
  struct Projected {
    size_t index;    // into `stepped`
    Tensor proj;     // P: (m, r) or (n, r)
    Tensor low;      // R: (r, n) or (m, r), the Adam kernel's "gradient"
    Tensor neg_dir;  // -N, same shape: the kernel's "parameter", zero before the launch
    double lr, weight_decay;
  };
  std::vector<detail::StepTensors> stepped;
  std::vector<Projected> projected;
  detail::Batches<detail::AdamEntry> batches;
  // Check every gradient, and compute the projections due for a refresh (an SVD may throw),
  // before any state changes, so a bad one leaves the optimizer as it was.
  const std::vector<Tensor> grads = checked_grads();
  std::vector<Tensor> refreshed(grads.size());  // P, where step % T == 0
  size_t index = 0;
  for (const ParamGroup& group : param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor& grad = grads[index++];
      const ParamState* st = state(p);
      if (grad.defined() && projects(p.sizes()) && (st ? st->step : 0) % options_.update_proj_gap == 0)
        refreshed[index - 1] = galore::projection(grad.to(state_dtype(p.dtype())), options_.rank);
    }
  }
  index = 0;
  for (const ParamGroup& group : param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor& grad = grads[index++];
      if (!grad.defined()) continue;
      const detail::StepTensors& t = stepped.emplace_back(p, grad);
      ParamState& st = state_for(p);
      const TensorOptions state_opts(state_dtype(p.dtype()), p.device());
      if (!projects(p.sizes())) {  // the same rule, unprojected
        detail::AdamEntry e = detail::adam_entry(group, st, t.work, state_opts, group.lr, *group.weight_decay,
                                                 /*decoupled=*/true, t.work.data(), t.grad.data(), p.numel());
        galore_torch_rule(e, st.step, group.lr * (1.0 - group.lr * *group.weight_decay));
        if (p.numel() > 0) batches.add(p.device(), p.dtype(), e);
        continue;
      }
      const Tensor g = t.grad.to(state_opts.dtype);  // G: (m, n), float32 for 16-bit parameters
      if (refreshed[index - 1].defined()) st.buffers[2] = refreshed[index - 1];
      Projected& pr = projected.emplace_back(Projected{.index = stepped.size() - 1,
                                                       .proj = st.buffers[2],
                                                       .low = galore::project(g, st.buffers[2]).contiguous(),
                                                       .neg_dir = Tensor(),
                                                       .lr = group.lr,
                                                       .weight_decay = *group.weight_decay});
      pr.neg_dir = zeros(pr.low.sizes(), state_opts);
      detail::AdamEntry e = detail::adam_entry(group, st, pr.low, state_opts, /*lr=*/1.0, /*weight_decay=*/0.0,
                                               /*decoupled=*/true, pr.neg_dir.data(), pr.low.data(), pr.low.numel());
      galore_torch_rule(e, st.step, /*lr_factor=*/1.0);
      batches.add(p.device(), state_opts.dtype, e);
    }
  }
  // (a generic lambda: a CPU-only build never instantiates the CUDA call)
  batches.run(name(), cpu::adam_step, [](auto&... args) { cuda::adam_step(args...); });
  for (const Projected& pr : projected) {
    const Tensor& work = stepped[pr.index].work;                    // the parameter (m, n)
    const Tensor back = galore::project_back(pr.neg_dir, pr.proj);  // -P N or -N P^T: (m, n)
    // The update, then the decoupled decay, as galore_torch: (w - lr alpha P N) * decay, as
    // w * decay + (lr alpha decay) (-P N) (Note [GaLore follows galore_torch]); 16-bit
    // parameters are updated in float32 and rounded once.
    const Tensor w = work.dtype() == back.dtype() ? work : work.to(back.dtype());
    const double decay = 1.0 - pr.lr * pr.weight_decay;
    if (pr.weight_decay != 0) ops::mul_(w, decay);
    ops::add_(w, back, pr.lr * options_.scale * decay);
    if (!w.shares_storage(work)) ops::copy_into(work, w);
  }
  for (const detail::StepTensors& t : stepped) t.finish();
}

}  // namespace frugal::optim
