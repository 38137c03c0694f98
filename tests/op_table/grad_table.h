#pragma once
// The differentiable side of the op table (docs/design.md, "Tests"): one entry per
// differentiable op of autograd/ops/*.h (and Tensor's recorded views and copies), each with
// a sampler of small float64 inputs, which of them are differentiable, the op's autocast
// policy and whether CUDA runs it. Three checks run every entry:
//   run_gradcheck  float64 backward against central differences (autograd::gradcheck), every
//                  differentiable input, each reaching the op in a random layout (and
//                  run_gradgradcheck the double backward, for the ops that have one);
//   run_autocast   under an AutocastGuard for float16/bfloat16: the output's dtype is the
//                  policy's, every input gradient comes back in its input's dtype, and the
//                  value equals the op on inputs cast by hand outside autocast;
//   run_dtype      forward and backward in float32/float16/bfloat16 on a device against the
//                  CPU float64 run on the same (rounded) values, within a per-dtype tolerance.
// The cpu suite (tests/cpu/test_grad_table.cpp) runs all three on the CPU, the gpu suite
// (tests/gpu/test_grad_table_cuda.cpp) the last two on CUDA, `op_fuzz --grad` more cases;
// tools/check_grad_table.py fails when a function of autograd/ops/*.h has no entry.
// A case is reproducible from (seed, entry name, case index), as in op_table.h.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/op_table/sample.h"

namespace frugal::optest {

/// What an op's output dtype is under autocast (Note [Autocast] in autograd/autocast.cpp).
enum class AmpPolicy {
  Lower,    ///< the autocast dtype (Policy::Lower)
  Float32,  ///< float32 (Policy::Float32)
  Promote,  ///< the widest floating input (no cast: the kernels promote)
  Keep,     ///< the first floating input's dtype (no cast)
  LowerToFloat32,  ///< products in the autocast dtype, a float32 result (linear_cross_entropy)
};
const char* amp_policy_name(AmpPolicy p);

/// One input of a case.
struct GradInput {
  Tensor value;          // a contiguous CPU tensor: float64 when floating, else indices or a mask
  bool grad = true;      // differentiable: gradchecked and compared (floating inputs only)
  bool relayout = true;  // a floating input reaches the op in a random layout (permuted, strided)
};

/// One sampled case of an entry.
struct GradSample {
  std::vector<GradInput> inputs;
  std::string params;  // the op's other arguments, for the failure message
  /// The frugal call on `inputs` (any device and dtype, after the runner's relayout).
  std::function<Tensor(const TensorList& in)> f;
  double eps = 1e-6;      // gradcheck's central-difference step
  double grad_tol = 1.0;  // scales gradcheck's atol and rtol
};

struct GradEntry {
  /// The function it covers, optionally with a variant: "add", "add(x, s)", "Tensor::view".
  std::string name;
  std::function<GradSample(Rng& rng)> sample;
  AmpPolicy amp = AmpPolicy::Keep;
  bool on_cuda = true;  // the CUDA backend implements it (the gpu suite skips the others)
  /// The autocast check's mixed variant: inputs before this position low-precision, the rest
  /// float32 (0: no mixed variant, for ops that want one dtype).
  int amp_mixed = 1;
  double low_tol = 1.0;  // scales run_dtype's tolerance (ill-conditioned ops)
  bool cuda_16bit_only = false;  // CUDA takes only float16/bfloat16 (flash attention's kernels)
};

/// Every entry, in a fixed order.
const std::vector<GradEntry>& grad_table();
/// The entry named `name`, or nullptr.
const GradEntry* find_grad_op(const std::string& name);

struct GradResult {
  bool ran = false;  // false: not run (the entry is not on this device)
  bool ok = true;
  std::string message;  // why it failed, with what reproduces it
};
/// Never throw.
GradResult run_gradcheck(const GradEntry& e, uint64_t seed, int64_t index);
/// The double backward against central differences of gradients (autograd::gradgradcheck);
/// not run (ran = false) for an op whose graph has a node without one (Note [Double backward]).
GradResult run_gradgradcheck(const GradEntry& e, uint64_t seed, int64_t index);
GradResult run_autocast(const GradEntry& e, uint64_t seed, int64_t index, Device device, DType low);
GradResult run_dtype(const GradEntry& e, uint64_t seed, int64_t index, Device device, DType dtype);

/// The tolerance of run_dtype in `dtype`, relative to the largest magnitude of the result
/// (and, for each element, its own): the rounding of inputs and outputs plus float32 sums.
double dtype_tol(DType dtype);

// ---- the groups of entries, one file each ----------------------------------------
void add_grad_elementwise(std::vector<GradEntry>& t);  // unary, binary, in-place, reduce, softmax
void add_grad_shape(std::vector<GradEntry>& t);        // join, index, views, copies
void add_grad_nn(std::vector<GradEntry>& t);           // matmul, conv, pool, norms, losses, attention, dropout
void add_grad_statistics(std::vector<GradEntry>& t);   // order statistics, nansum, nanmean
void add_grad_products(std::vector<GradEntry>& t);     // diagonals, tensor products, cdist

}  // namespace frugal::optest
