// Note [Profiling side effects]
// MemoryPlanner and BlockPlanner measure a model by running it: forwards, backwards, whole
// training steps. In training mode batch norm folds each batch's statistics into its running
// ones (and counts the batches), and dropout advances the generators it draws from: the
// default one, a TensorParallelRng's, one a layer was given. A model planned before training
// would then train and evaluate differently from one that was not, and a run that is handed
// the plan differently from the run that searched for it. So the planners put these back as
// they found them: ProfileStateGuard copies the buffers first (a few bytes per norm, held
// through the measurement and so counted in what it measures) and notes each generator's
// state before its first draw (Note [Draws under a record] in tensor/random.h; draws on
// other threads are not noted). Gradients are the planners' own business (MemoryPlanner
// leaves them undefined or zeroed; BlockPlanner's step clears them); parameters and
// optimizer state move only if the step a BlockPlanner is given updates them.
#include "nn/profile_state.h"

#include "autograd/grad_mode.h"

namespace frugal::nn {

ProfileStateGuard::ProfileStateGuard(const Module* model) : default_generator_(default_generator().state()) {
  if (model)
    for (const auto& [name, b] : model->named_buffers()) saved_.push_back({b, b.clone()});
}

ProfileStateGuard::~ProfileStateGuard() {
  autograd::NoGradGuard no_grad;
  for (const auto& [buffer, value] : saved_) buffer.copy_(value);  // bumps its version, as any write
  for (const GeneratorState& s : draws_.first_states())
    if (Generator* g = s.generator()) g->set_state(s.seed, s.offset);
  default_generator().set_state(default_generator_.seed, default_generator_.offset);
}

}  // namespace frugal::nn
