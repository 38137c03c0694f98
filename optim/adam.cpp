#include "optim/adam.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/graph_capture.h"
#include "core/instrument.h"
#include "optim/step_util.h"
#include "tensor/factory.h"

namespace frugal::optim {

namespace {

using detail::one_group;

AdamOptions as_adam(const AdamWOptions& o) {
  return {.lr = o.lr,
          .beta1 = o.beta1,
          .beta2 = o.beta2,
          .eps = o.eps,
          .weight_decay = o.weight_decay,
          .amsgrad = o.amsgrad,
          .maximize = o.maximize};
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam(one_group(std::move(params)), options) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options) : Adam("Adam", std::move(groups), options, false) {}

Adam::Adam(const char* name, std::vector<ParamGroup> groups, AdamOptions options, bool decoupled)
    : Optimizer(name), options_(options), decoupled_(decoupled) {
  FRUGAL_CHECK(!groups.empty(), name, ": got an empty parameter list");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options) : AdamW(one_group(std::move(params)), options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Adam("AdamW", std::move(groups), as_adam(options), true) {}

std::vector<Optimizer::HyperParam> Adam::hyperparams() const {
  return {{.name = "beta1", .real = &ParamGroup::beta1, .option = options_.beta1},
          {.name = "beta2", .real = &ParamGroup::beta2, .option = options_.beta2},
          {.name = "eps", .real = &ParamGroup::eps, .option = options_.eps},
          {.name = "weight_decay", .real = &ParamGroup::weight_decay, .option = options_.weight_decay},
          {.name = "amsgrad", .flag = &ParamGroup::amsgrad, .option = double(options_.amsgrad)},
          {.name = "maximize", .flag = &ParamGroup::maximize, .option = double(options_.maximize)}};
}

void Adam::check_group(const ParamGroup& group, size_t g) const { detail::check_adam_group(name(), group, g); }

void Adam::check_state(const ParamState& st, const Tensor& /*param*/, const std::string& prefix) const {
  FRUGAL_CHECK(st.buffers[0].defined() == st.buffers[1].defined(), name(), ".load_state_dict: ", prefix, "exp_avg and ",
               prefix, "exp_avg_sq must be given together");
  FRUGAL_CHECK(st.step == 0 || st.buffers[0].defined(), name(), ".load_state_dict: ", prefix, "step is ", st.step,
               " but ", prefix, "exp_avg is missing");
}

void Adam::step() {
  core::refuse_in_graph_capture("Adam.step / AdamW.step",
                                "its bias corrections follow the step count, which a replay would not advance (capture "
                                "SGD, or step this optimizer after replay())");
  autograd::NoGradGuard no_grad;
  core::CategoryScope category(core::Category::OptimizerState);  // for the profiler: its state and buffers
  core::OpScope op(name());                                      // and its time
  std::vector<detail::StepTensors> stepped;
  detail::Batches<detail::AdamEntry> batches;
  // Check every gradient before any state changes, so a bad one leaves the optimizer as it was.
  const std::vector<Tensor> grads = checked_grads();
  size_t index = 0;
  for (const ParamGroup& group : param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor& grad = grads[index++];
      if (!grad.defined()) continue;
      const detail::StepTensors& t = stepped.emplace_back(p, grad);
      ParamState& st = state_for(p);
      const detail::AdamEntry e =
          detail::adam_entry(group, st, p.sizes(), TensorOptions(state_dtype(p.dtype()), p.device()), group.lr,
                             *group.weight_decay, decoupled_, t.work.data(), t.grad.data(), p.numel());
      if (p.numel() == 0) continue;
      batches.add(p.device(), p.dtype(), e);
    }
  }
  // (a generic lambda: a CPU-only build never instantiates the CUDA call)
  batches.run(name(), cpu::adam_step, [](auto&... args) { cuda::adam_step(args...); });
  for (const detail::StepTensors& t : stepped) t.finish();
}

}  // namespace frugal::optim
