#include "optim/sgd.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/graph_capture.h"
#include "core/instrument.h"
#include "optim/step_util.h"
#include "tensor/factory.h"

namespace frugal::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD(detail::one_group(std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options) : Optimizer("SGD"), options_(options) {
  FRUGAL_CHECK(!groups.empty(), "SGD: got an empty parameter list");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

std::vector<Optimizer::HyperParam> SGD::hyperparams() const {
  return {{.name = "momentum", .real = &ParamGroup::momentum, .option = options_.momentum},
          {.name = "dampening", .real = &ParamGroup::dampening, .option = options_.dampening},
          {.name = "weight_decay", .real = &ParamGroup::weight_decay, .option = options_.weight_decay},
          {.name = "nesterov", .flag = &ParamGroup::nesterov, .option = double(options_.nesterov)},
          {.name = "maximize", .flag = &ParamGroup::maximize, .option = double(options_.maximize)}};
}

void SGD::check_group(const ParamGroup& group, size_t g) const {
  // Finite and non-negative (Note [Finite hyperparameters] in optim/step_util.h).
  FRUGAL_CHECK(group.lr >= 0 && std::isfinite(group.lr), "SGD: param group ", g, ": invalid learning rate ", group.lr);
  FRUGAL_CHECK(*group.momentum >= 0 && std::isfinite(*group.momentum), "SGD: param group ", g, ": invalid momentum ",
               *group.momentum);
  FRUGAL_CHECK(*group.weight_decay >= 0 && std::isfinite(*group.weight_decay), "SGD: param group ", g,
               ": invalid weight_decay ", *group.weight_decay);
  FRUGAL_CHECK(!*group.nesterov || (*group.momentum > 0 && *group.dampening == 0), "SGD: param group ", g,
               ": Nesterov momentum requires a momentum and zero dampening (momentum ", *group.momentum, ", dampening ",
               *group.dampening, ")");
}

void SGD::step() { step_impl(nullptr); }

void SGD::step_skipping_if(const Tensor& found_inf) {
  // A first step with momentum sets each buffer instead of updating it; skipped on the
  // device it would leave the buffer unset yet marked as set.
  step_on_device_flag(found_inf, needs_fresh_buffer(), [this](const float* skip_if) { step_impl(skip_if); });
}

bool SGD::needs_fresh_buffer() const {
  for (const ParamGroup& group : param_groups()) {
    if (*group.momentum == 0) continue;
    for (const Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      const ParamState* st = state(p);
      if (!st || !st->buffers[0].defined()) return true;
    }
  }
  return false;
}

void SGD::step_impl(const float* skip_if) {
  autograd::NoGradGuard no_grad;
  core::CategoryScope category(core::Category::OptimizerState);  // for the profiler: its state and buffers
  core::OpScope op(name());                                      // and its time
  freeze_hyperparams_for_replay();                               // lr, momentum... go into the kernels as values
  std::vector<detail::StepTensors> stepped;
  detail::Batches<detail::SgdEntry> batches;
  // Check every gradient before any state changes, so a bad one leaves the optimizer as it was.
  const std::vector<Tensor> grads = checked_grads();
  size_t index = 0;
  for (const ParamGroup& group : param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor& grad = grads[index++];
      if (!grad.defined()) continue;
      const detail::StepTensors& t = stepped.emplace_back(p, grad);
      uint32_t flags = 0;
      void* buf = nullptr;
      if (*group.momentum != 0) {
        ParamState& st = state_for(p);
        if (!st.buffers[0].defined())  // first step: the kernel sets the buffer to d_p
          core::refuse_in_graph_capture("SGD.step's first step with momentum",
                                        "it sets the momentum buffer instead of updating it, and every replay would "
                                        "do the same (warm up at least one step before the capture)");
        if (detail::state_in_layout(st.buffers[0], t.work, TensorOptions(state_dtype(p.dtype()), p.device())))
          flags |= detail::kSgdFreshBuffer;
        buf = st.buffers[0].data();
      }
      if (*group.nesterov) flags |= detail::kSgdNesterov;
      if (*group.maximize) flags |= detail::kSgdMaximize;
      if (p.numel() == 0) continue;
      batches.add(p.device(), p.dtype(),
                  {.param = t.work.data(),
                   .grad = t.grad.data(),
                   .momentum_buffer = buf,
                   .numel = p.numel(),
                   .chunk_begin = 0,
                   .lr = group.lr,
                   .momentum = *group.momentum,
                   .dampening = *group.dampening,
                   .weight_decay = *group.weight_decay,
                   .flags = flags});
    }
  }
  // (a generic lambda: a CPU-only build never instantiates the CUDA call)
  batches.run(name(), cpu::sgd_step, [&](auto&... args) { cuda::sgd_step(args..., skip_if); });
  for (const detail::StepTensors& t : stepped) t.finish();
}

}  // namespace frugal::optim
