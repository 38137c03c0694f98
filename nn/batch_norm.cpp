#include "nn/batch_norm.h"

#include <algorithm>
#include <sstream>

#include "autograd/checkpoint.h"
#include "autograd/ops/batch_norm.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/fill.h"

namespace frugal::nn {

BatchNorm::BatchNorm(const char* type, std::vector<Accepted> accepted, int64_t features, BatchNormOptions o)
    : num_features(features), options(o), type_(type), accepted_(std::move(accepted)) {
  FRUGAL_CHECK(features > 0, type_, ": num_features must be positive, got ", features);
  if (o.affine) {
    weight = register_parameter("weight", ones({features}));
    bias = register_parameter("bias", zeros({features}));
  }
  if (o.track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({features}));
    running_var = register_buffer("running_var", ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
}

void BatchNorm::reset_running_stats() {
  if (!options.track_running_stats) return;
  ops::zero_(running_mean);
  ops::fill_(running_var, 1.0);
  ops::zero_(num_batches_tracked);
}

double BatchNorm::start_batch(const Tensor& x) {
  FRUGAL_CHECK(x.defined(), type_, ": undefined input");
  const auto fits = [&](const Accepted& a) { return x.dim() == a.rank; };
  if (std::none_of(accepted_.begin(), accepted_.end(), fits) || x.size(1) != num_features) {
    std::string want;
    for (const Accepted& a : accepted_) want += (want.empty() ? "" : " or ") + std::string(a.shape);
    FRUGAL_FAIL(type_, ": expected input ", want, " with C = ", num_features, ", got ", x.describe());
  }
  double momentum = options.momentum.value_or(0.0);
  // A checkpoint's recompute counted this batch in the forward (Note [Checkpoint recompute]).
  if (is_training() && options.track_running_stats && !autograd::in_checkpoint_recompute()) {
    ops::add_(num_batches_tracked, 1.0);
    if (!options.momentum) {  // a cumulative average: 1 / batches so far
      const int64_t batches = num_batches_tracked.item<int64_t>();
      FRUGAL_CHECK(batches >= 1, type_, ": num_batches_tracked is ", batches,
                   " after this batch (a loaded state held a negative or overflowing count); the cumulative",
                   " average (momentum None) takes 1 / count");
      momentum = 1.0 / double(batches);
    }
  }
  return momentum;
}

Tensor BatchNorm::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  const double momentum = start_batch(x);
  // Running statistics are used in eval and updated in training; without them, batch statistics always.
  return batch_norm(x, running_mean, running_var, weight, bias, uses_batch_stats(), momentum, options.eps);
}

Tensor BatchNorm::forward_relu(const Tensor& x, const Tensor& residual) {
  const double momentum = start_batch(x);
  return batch_norm_relu(x, running_mean, running_var, weight, bias, uses_batch_stats(), momentum, options.eps,
                         residual);
}

BatchNormArgs BatchNorm::args_for(const Tensor& x) {
  const double momentum = start_batch(x);
  return {running_mean, running_var, weight, bias, uses_batch_stats(), momentum, options.eps};
}

std::string BatchNorm::extra_repr() const {
  std::ostringstream os;
  os << num_features << ", eps=" << options.eps << ", momentum=";
  if (options.momentum) os << *options.momentum;
  else os << "None";
  os << ", affine=" << (options.affine ? "true" : "false")
     << ", track_running_stats=" << (options.track_running_stats ? "true" : "false");
  return os.str();
}

}  // namespace frugal::nn
