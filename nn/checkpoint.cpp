// checkpoint_sequential: Sequential in checkpointed chunks (Note [Checkpoint recompute]).
#include "nn/checkpoint.h"

namespace frugal::nn {

Tensor checkpoint_sequential(Sequential& seq, int64_t segments, const Tensor& x, autograd::CheckpointPolicy policy) {
  const auto n = int64_t(seq.size());
  if (n == 0) return x;
  FRUGAL_CHECK(segments >= 1 && segments <= n, "checkpoint_sequential: segments must be in [1, ", n,
               "] for a Sequential of ", n, " modules, got ", segments);
  // Modules [begin, end) as one function; seq must outlive the backward (as with any model).
  auto run = [&seq](int64_t begin, int64_t end) {
    return [&seq, begin, end](const Tensor& h) {
      Tensor y = h;
      for (int64_t i = begin; i < end; ++i) y = (*seq[size_t(i)])(y);  // m(x): runs its hooks (Note [Forward hooks])
      return y;
    };
  };
  const int64_t chunk = n / segments;
  Tensor h = x;
  int64_t begin = 0;
  for (int64_t s = 0; s + 1 < segments; ++s, begin += chunk)
    h = autograd::checkpoint(run(begin, begin + chunk), h, policy);
  return run(begin, n)(h);  // the last chunk runs normally
}

}  // namespace frugal::nn
