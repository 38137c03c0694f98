// The channels-last batch norm backward on CUDA (tensor/cuda/batch_norm_channels_last.cu,
// Note [Channels-last batch norm backward]) against the CPU in float64 from the same inputs:
// batch_norm_backward, batch_norm_add_relu_backward with and without a residual, and
// batch_norm_relu_backward_affine, in float16, bfloat16, float32 and float64, training and
// eval, weight defined and undefined, subsets of the gradients; shapes with one channel vector
// per row, odd channel counts (scalar path), 2048 and 4100 channels, one row, many rows;
// grad_out in NCHW for a channels-last x; layouts of the results; bitwise determinism.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/binary.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

enum class Kind { BatchNorm, AddRelu, AddReluResidual, Affine };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::BatchNorm: return "batch_norm_backward";
    case Kind::AddRelu: return "batch_norm_add_relu_backward (no residual)";
    case Kind::AddReluResidual: return "batch_norm_add_relu_backward";
    default: return "batch_norm_relu_backward_affine";
  }
}

DType compute_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

/// One problem's inputs on the CPU in dtype t (the (C) ones in the compute dtype): x, grad_out,
/// the forward's statistics, out = relu(bn(x) (+ residual)) as the forward computes it, and
/// bn folded into scale, shift.
struct Problem {
  Tensor x, g, w, b, mean, invstd, out, scale, shift;
};

Problem make_problem(const Shape& xs, DType t, bool training, bool affine, bool residual, uint64_t seed) {
  const int64_t C = xs[1], M = numel_of(xs) / C;
  const DType compute = compute_of(t);
  Problem p;
  p.x = random_tensor(xs, t, seed, Layout::Contiguous, -1.0, 3.0);
  p.g = random_tensor(xs, t, seed + 1);
  if (affine) p.w = random_tensor({C}, compute, seed + 2), p.b = random_tensor({C}, compute, seed + 3);
  const Tensor rm = random_tensor({C}, compute, seed + 4), rv = random_tensor({C}, compute, seed + 5, {}, 0.5, 2.0);
  const bool batch_stats = training && M > 1;  // one value per channel has no batch statistics
  const Tensor r = residual ? random_tensor(xs, t, seed + 6) : Tensor();
  const ops::BatchNormResult f = ops::batch_norm_add_relu(p.x, r, rm, rv, p.w, p.b, batch_stats);
  p.mean = f.mean, p.invstd = f.invstd, p.out = f.out;
  p.scale = p.w.defined() ? ops::mul(p.w, p.invstd) : p.invstd.clone();
  p.shift = ops::sub(p.b.defined() ? p.b : zeros({C}, compute), ops::mul(p.mean, p.scale));
  return p;
}

Tensor on_gpu(const Tensor& t, bool channels_last = true) {
  if (!t.defined()) return t;
  const Tensor g = t.to(kGpu);
  return channels_last && g.dim() == 4 ? to_channels_last(g) : g;
}

Tensor f64(const Tensor& t) { return t.defined() ? t.to(kFloat64) : t; }

/// The op on the GPU. A (1, C, 1, 1) tensor is contiguous as well as channels-last, so the ops
/// take the NCHW path for it: then the channels-last kernel is called directly (one row).
ops::BatchNormGrads run_gpu(Kind kind, const Problem& p, bool training, ops::BatchNormGradMask mask, bool g_nchw) {
  const Tensor x = on_gpu(p.x), g = on_gpu(p.g, !g_nchw), out = on_gpu(p.out, !g_nchw), w = on_gpu(p.w),
               b = on_gpu(p.b), mean = on_gpu(p.mean), invstd = on_gpu(p.invstd), scale = on_gpu(p.scale),
               shift = on_gpu(p.shift);
  ops::BatchNormSaved saved;
  saved.residual = kind == Kind::AddReluResidual;
  if (suggests_channels_last(x)) {
    switch (kind) {
      case Kind::BatchNorm: return ops::batch_norm_backward(g, x, w, mean, invstd, training, mask);
      case Kind::AddRelu:
      case Kind::AddReluResidual:
        return ops::batch_norm_add_relu_backward(g, x, out, w, b, mean, invstd, training, mask, saved);
      default: return ops::batch_norm_relu_backward_affine(g, x, scale, shift, w, mean, invstd, training, mask);
    }
  }
  REQUIRE(is_channels_last(x));
  const int64_t C = x.size(1);
  ops::BatchNormGrads r;
  if (mask.x) r.x = empty_channels_last(x.sizes(), x.options());
  if (mask.residual && saved.residual) r.residual = empty_channels_last(x.sizes(), x.options());
  if (mask.weight) r.weight = empty({C}, mean.options());
  if (mask.bias) r.bias = empty({C}, mean.options());
  const bool relu_out = kind == Kind::AddRelu || kind == Kind::AddReluResidual, fold = kind == Kind::Affine;
  ops::cuda::batch_norm_backward_channels_last_kernel(
      r.x, r.residual, r.weight, r.bias, to_channels_last(g), x, relu_out ? to_channels_last(out) : Tensor(),
      fold ? scale : Tensor(), fold ? shift : Tensor(), mean, invstd, w, training, x.numel() / C, C);
  return r;
}

/// The reference on the CPU in float64 from the same (rounded) inputs. ReLU's mask comes from
/// out, or from x scale + shift formed in the compute dtype as the op forms it, so both sides
/// mask the same elements.
ops::BatchNormGrads run_cpu(Kind kind, const Problem& p, bool training, ops::BatchNormGradMask mask) {
  ops::BatchNormSaved saved;
  saved.residual = kind == Kind::AddReluResidual;
  Tensor g = p.g;
  if (kind == Kind::Affine) {
    const Shape channel{1, p.x.size(1), 1, 1};
    const Tensor a = ops::add(ops::mul(p.x.to(p.scale.dtype()), p.scale.reshape(channel)), p.shift.reshape(channel));
    g = ops::masked_fill(p.g, ops::le(a, 0.0), 0.0);
  }
  if (kind == Kind::AddRelu || kind == Kind::AddReluResidual)
    return ops::batch_norm_add_relu_backward(f64(g), f64(p.x), f64(p.out), f64(p.w), f64(p.b), f64(p.mean),
                                             f64(p.invstd), training, mask, saved);
  return ops::batch_norm_backward(f64(g), f64(p.x), f64(p.w), f64(p.mean), f64(p.invstd), training, mask);
}

/// A GPU result against the float64 CPU one: both defined or neither, the dtype asked,
/// channels-last for (N, C, H, W) results, within rtol of the largest |expected|.
void check_grad(const Tensor& gpu, const Tensor& cpu, DType dtype, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(gpu.defined() == cpu.defined(), what);
  if (!gpu.defined()) return;
  CHECK_MESSAGE(gpu.device() == kGpu, what);
  CHECK_MESSAGE(gpu.dtype() == dtype, what);
  if (gpu.dim() == 4) CHECK_MESSAGE(is_channels_last(gpu), what, ": not channels-last");
  check_norm_close(gpu, cpu, rtol, what);
}

void compare(Kind kind, const Shape& xs, DType t, bool training, bool affine, ops::BatchNormGradMask mask, bool g_nchw,
             uint64_t seed) {
  const Problem p = make_problem(xs, t, training, affine, kind == Kind::AddReluResidual, seed);
  const ops::BatchNormGrads gpu = run_gpu(kind, p, training, mask, g_nchw), cpu = run_cpu(kind, p, training, mask);
  const std::string what = detail::str_cat(kind_name(kind), " ", shape_str(xs), " ", dtype_name(t),
                                           training ? " training" : " eval", affine ? "" : " no weight");
  // grad_x rounds once to t; the parameter grads are sums in the compute dtype.
  const double rtol_x = 2 * rtol_for(t), rtol_p = 4 * rtol_for(compute_of(t));
  check_grad(gpu.x, cpu.x, t, rtol_x, what + " grad_x");
  check_grad(gpu.residual, cpu.residual, t, 0, what + " grad_residual");  // gz: g or 0, exactly
  check_grad(gpu.weight, cpu.weight, compute_of(t), rtol_p, what + " grad_weight");
  check_grad(gpu.bias, cpu.bias, compute_of(t), rtol_p, what + " grad_bias");
}

constexpr Kind kKinds[] = {Kind::BatchNorm, Kind::AddRelu, Kind::AddReluResidual, Kind::Affine};

}  // namespace

TEST_CASE("cuda channels-last batch norm backward: every op, dtype and mode against the CPU in float64") {
  // One vector per row and odd C (scalar path), 64 channels, 2048 (many vectors per row, few
  // rows), 4100 (scalar for 16-bit types, vectors for float32), one row, many rows of 8.
  const Shape shapes[] = {{2, 3, 5, 7}, {1, 7, 1, 1}, {4, 64, 9, 9}, {3, 2048, 2, 3}, {2, 4100, 3, 1}, {64, 8, 33, 33}};
  uint64_t seed = 100;
  for (const Shape& xs : shapes)
    for (DType t : kFloatTypes)
      for (bool training : {true, false})
        for (bool affine : {true, false})
          for (Kind kind : kKinds) compare(kind, xs, t, training, affine, {}, false, seed += 10);
}

TEST_CASE("cuda channels-last batch norm backward: subsets of the gradients, grad_out in NCHW") {
  const ops::BatchNormGradMask only_params{.x = false, .weight = true, .bias = true, .residual = false};
  const ops::BatchNormGradMask only_x{.x = true, .weight = false, .bias = false, .residual = false};
  const ops::BatchNormGradMask only_residual{.x = false, .weight = false, .bias = false, .residual = true};
  uint64_t seed = 5000;
  for (DType t : kFloatTypes)
    for (bool training : {true, false})
      for (Kind kind : kKinds) {
        for (const auto& m : {only_params, only_x, only_residual})
          compare(kind, {4, 64, 9, 9}, t, training, true, m, false, seed += 10);
        compare(kind, {2, 3, 5, 7}, t, training, true, only_x, false, seed += 10);
        // grad_out (and out) contiguous NCHW while x is channels-last: converted, grads channels-last.
        compare(kind, {4, 64, 9, 9}, t, training, true, {}, true, seed += 10);
        compare(kind, {2, 3, 5, 7}, t, training, false, {}, true, seed += 10);
      }
  // A million rows of 8 channels: as many splits as fill the GPU, long float32 sums.
  compare(Kind::Affine, {16, 8, 256, 256}, kFloat16, true, true, {}, false, 7000);
  compare(Kind::AddReluResidual, {16, 8, 256, 256}, kBFloat16, true, true, {}, false, 7010);
}

TEST_CASE("cuda channels-last batch norm backward: the same bits run to run") {
  for (const Shape& xs : {Shape{64, 8, 33, 33}, Shape{3, 2048, 2, 3}}) {
    const Problem p = make_problem(xs, kFloat16, true, true, false, 9000);
    for (Kind kind : {Kind::Affine, Kind::AddRelu}) {
      CAPTURE(kind_name(kind));
      const ops::BatchNormGrads a = run_gpu(kind, p, true, {}, false), b = run_gpu(kind, p, true, {}, false);
      CHECK(values_of(a.x) == values_of(b.x));
      CHECK(values_of(a.weight) == values_of(b.weight));
      CHECK(values_of(a.bias) == values_of(b.bias));
    }
  }
}
