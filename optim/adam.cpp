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
          .maximize = o.maximize,
          .capturable = o.capturable};
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

// Note [Capturable Adam]
// Adam's bias corrections follow the step count t: 1 - beta1^t and 1 - beta2^t. Set on the
// host, a captured step would freeze them, and every replay would repeat step t. With
// capturable (PyTorch's capturable=True), each CUDA parameter's count is also a 0-d int64 on
// its device, made at its first step (which must be eager: it also makes the moments, like
// SGD's first momentum step); the kernel computes the corrections from *device_step + 1 in
// double, and a second launch raises the counts, both returning when GradScaler's inf flag
// is set, so a skipped replay counts nothing. Eager capturable steps take the same path, so
// they equal replays bit for bit (and differ from the host's corrections by at most the last
// ulp of a double pow before the float rounding). The host's ParamState::step is refreshed
// from the device when state() or state_dict() hands it out (one small read each), and a
// loaded state dict drops the device counts, so the next (eager) step remakes them.
void Adam::step() { step_impl(nullptr); }

void Adam::step_skipping_if(const Tensor& found_inf) {
  FRUGAL_CHECK(options_.capturable, name(),
               ".step_skipping_if: this optimizer cannot skip its step on a device flag; make it with "
               "{.capturable = true} (Note [Capturable Adam])");
  // A first step makes the moments (the kernel starts them at zero); skipped on the device
  // it would leave them unset yet made.
  step_on_device_flag(found_inf, needs_fresh_state(), [this](const float* skip_if) { step_impl(skip_if); });
}

bool Adam::needs_fresh_state() const {
  for (const ParamGroup& group : param_groups())
    for (const Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      const ParamState* st = stored_state(p);
      if (!st || !st->buffers[0].defined() || (group.amsgrad.value_or(false) && !st->buffers[2].defined()) ||
          (options_.capturable && p.is_cuda() && !device_steps_.count(p.impl_ptr().get())))
        return true;
    }
  return false;
}

void Adam::refresh_state(const Tensor& param, ParamState& state) const {
  auto it = device_steps_.find(param.impl_ptr().get());
  if (it != device_steps_.end()) state.step = it->second.item<int64_t>();
}

void Adam::step_impl(const float* skip_if) {
  if (!options_.capturable)
    core::refuse_in_graph_capture("Adam.step / AdamW.step",
                                  "its bias corrections follow the step count, which a replay would not advance (make "
                                  "it with {.capturable = true}, or step this optimizer after replay())");
  else if (core::current_graph_capture() && needs_fresh_state())  // (the loop only where it can refuse)
    core::refuse_in_graph_capture("Adam.step / AdamW.step's first step",
                                  "it makes the moments and the device step counts, and every replay would make them "
                                  "again (warm up at least one step before the capture)");
  freeze_hyperparams_for_replay();  // lr, betas... go into the kernels as values
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
      const int64_t* device_step = nullptr;
      // Every CUDA parameter counts on the device, an empty one too: it takes no chunk of the
      // kernel, but its count is raised (or, skipped, not) with the others'.
      if (options_.capturable && p.is_cuda()) {
        Tensor& count = device_steps_[p.impl_ptr().get()];
        if (!count.defined()) count = full({}, double(st.step), TensorOptions(kInt64, p.device()));
        device_step = count.data_ptr<int64_t>();
      }
      detail::AdamEntry e =
          detail::adam_entry(group, st, t.work, TensorOptions(state_dtype(p.dtype()), p.device()), group.lr,
                             *group.weight_decay, decoupled_, t.work.data(), t.grad.data(), p.numel());
      e.device_step = device_step;
      if (p.numel() == 0 && device_step == nullptr) continue;
      batches.add(p.device(), p.dtype(), e);
    }
  }
  // (a generic lambda: a CPU-only build never instantiates the CUDA call)
  batches.run(name(), cpu::adam_step, [skip_if](auto&... args) { cuda::adam_step(args..., skip_if); });
  for (const detail::StepTensors& t : stepped) t.finish();
}

}  // namespace frugal::optim
