#include "train/evaluate.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops/loss.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"

namespace frugal::train {

EvalModeGuard::EvalModeGuard(nn::Module& model) : model_(model) {
  modes_.emplace_back(&model, model.is_training());
  for (const auto& [name, m] : model.named_modules()) modes_.emplace_back(m.get(), m->is_training());
  model.eval();
}

EvalModeGuard::~EvalModeGuard() {
  // train(on) recurses, so parents go first and each child then gets its own mode back.
  for (auto& [m, on] : modes_) m->train(on);
}

EvalResult evaluate(nn::UnaryModule& model, data::DataLoader& loader, const EvaluateOptions& options) {
  EvalModeGuard eval(model);
  autograd::NoGradGuard no_grad;
  Tensor loss_sum, correct;  // on the outputs' device: one read at the end
  EvalResult result;
  // A fresh pass (begin() abandons one under way): next() would continue a pass the caller
  // left early, and the result would cover only its remaining batches.
  for (data::Batch& b : loader) {
    const Tensor out = model(b.inputs);
    const int64_t n = b.targets.dim() > 0 ? b.targets.size(0) : 1;
    Tensor loss = options.loss_fn ? options.loss_fn(out, b.targets) : cross_entropy(out, b.targets);
    FRUGAL_CHECK(loss.numel() == 1, "evaluate: the loss function returned ", loss.numel(),
                 " values; it must return the batch's mean loss (one value)");
    loss = ops::mul(loss.detach().reshape({}).to(kFloat64), double(n));
    loss_sum = loss_sum.defined() ? ops::add(loss_sum, loss) : loss;
    if (options.accuracy) {
      FRUGAL_CHECK(out.dim() == 2 && b.targets.dim() == 1 && out.size(0) == b.targets.size(0),
                   "evaluate: accuracy needs outputs (B, C) and targets (B), got outputs ", shape_str(out.sizes()),
                   " and targets ", shape_str(b.targets.sizes()), " (set EvaluateOptions::accuracy = false)");
      Tensor hits = ops::sum(ops::eq(ops::argmax(out, 1), b.targets.to(kInt64)));
      correct = correct.defined() ? ops::add(correct, hits) : hits;
    }
    result.samples += n;
  }
  FRUGAL_CHECK(result.samples > 0, "evaluate: the loader yielded no batch (is the dataset empty?)");
  result.loss = loss_sum.item<double>() / double(result.samples);
  result.accuracy = options.accuracy ? double(correct.item<int64_t>()) / double(result.samples) : NAN;
  return result;
}

}  // namespace frugal::train
