// CUDA isnan / isinf / isfinite, nonzero, masked_select (and its gradient) and lerp / lerp_
// against the CPU ops on the same inputs: every dtype, non-contiguous and broadcast operands,
// all-false and all-true masks, a mask of 2^20 + 3 elements about 30% true (the count's scan
// crosses blocks and chunks: Note [Cumulative sum order]), the refusal inside a CUDA graph
// capture and the device-mismatch errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/masked.h"
#include "tensor/cuda_graph.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/masked.h"
#include "tensor/ops/unary.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr DType kAll[] = {kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kBool, kUInt8};

/// Values with NaN, infinities, zeros of both signs and integers, in [-3, 3] otherwise.
std::vector<double> special_values(int64_t n, uint64_t seed) {
  std::vector<double> v = random_values(n, seed, -3, 3);
  const double specials[] = {kNaN, kInf, -kInf, 0.0, -0.0, 1.0};
  for (size_t i = 0; i < v.size(); i += 4) v[i] = specials[(i / 4) % 6];
  return v;
}

/// Bit-identical results (selections copy, predicates compare exactly).
void check_exact(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  REQUIRE_MESSAGE(gpu.device() == kGpu, what);
  CHECK_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what, ": ", shape_str(gpu.sizes()), " vs ", shape_str(cpu.sizes()));
  CHECK_MESSAGE(bytes_of(gpu.cpu()) == bytes_of(cpu), what);
}

/// A bool mask of `shape`, each element true with probability p.
Tensor random_mask(const Shape& shape, double p, uint64_t seed, Device device = kCPU) {
  std::vector<double> v = random_values(numel_of(shape), seed, 0.0, 1.0);
  for (double& e : v) e = e < p;
  return from_vector(v, shape, TensorOptions(kFloat64)).to(device, kBool);
}

}  // namespace

TEST_CASE("cuda isnan / isinf / isfinite: match the CPU in every dtype and layout") {
  for (DType dt : kAll) {
    for (Layout l : kAllLayouts) {
      std::vector<double> v = special_values(6 * 9, 1);
      if (!is_floating(dt))
        for (double& e : v) e = std::isfinite(e) ? std::fabs(std::trunc(e)) : 2.0;
      const DevicePair x = on_both(v, {6, 9}, dt, l);
      const std::string what = name_of(dt, l);
      check_exact(ops::isnan(x.gpu), ops::isnan(x.cpu), "isnan " + what);
      check_exact(ops::isinf(x.gpu), ops::isinf(x.cpu), "isinf " + what);
      check_exact(ops::isfinite(x.gpu), ops::isfinite(x.cpu), "isfinite " + what);
    }
  }
  CHECK(ops::isnan(empty({0, 4}, {kFloat32, kGpu})).sizes() == Shape{0, 4});
}

TEST_CASE("cuda nonzero: matches the CPU (row-major order) in every dtype and layout, 0-d, size-0, large") {
  for (DType dt : kAll) {
    for (Layout l : kAllLayouts) {
      std::vector<double> v = special_values(5 * 7, 2);
      if (!is_floating(dt))
        for (double& e : v) e = std::isfinite(e) ? std::fabs(std::trunc(e)) : 0.0;
      const DevicePair x = on_both(v, {5, 7}, dt, l);
      check_exact(ops::nonzero(x.gpu), ops::nonzero(x.cpu), "nonzero " + name_of(dt, l));
    }
  }
  check_exact(ops::nonzero(scalar_tensor(3.0, {kFloat32, kGpu})), ops::nonzero(scalar_tensor(3.0, kFloat32)), "0-d");
  check_exact(ops::nonzero(zeros({3, 0}, {kFloat32, kGpu})), ops::nonzero(zeros({3, 0}, kFloat32)), "size-0");
  check_exact(ops::nonzero(zeros({4, 5}, {kInt32, kGpu})), ops::nonzero(zeros({4, 5}, kInt32)), "all zero");
  // 2^20 + 3 elements, ~30% true, in 3 dims: the scan spans many chunks and spans.
  const Tensor m = random_mask({1027, 1021}, 0.3, 3).view({13, 79, 1021});
  check_exact(ops::nonzero(m.to(kGpu)), ops::nonzero(m), "nonzero of 2^20+ elements");
}

TEST_CASE("cuda masked_select: matches the CPU in every dtype, layout and broadcast; all-false, all-true, 10^6+") {
  for (DType dt : kAll) {
    for (Layout l : kAllLayouts) {
      std::vector<double> v = special_values(4 * 6, 4);
      if (!is_floating(dt))
        for (double& e : v) e = std::isfinite(e) ? std::fabs(std::trunc(e)) : 1.0;
      const DevicePair x = on_both(v, {4, 6}, dt, l);
      // The reference selects from the device tensor's own bytes: a NaN converted on the device
      // (a strided layout is filled there) may carry another payload than the host's conversion.
      const Tensor x_bytes = x.gpu.cpu();
      const std::string what = name_of(dt, l);
      for (Layout ml : kAllLayouts) {
        const Tensor mc = make_tensor(random_values(24, 5, 0, 1), {4, 6}, kFloat64, ml);
        const DevicePair m = {ops::lt(mc, 0.4), ops::lt(mc.to(kGpu), 0.4)};
        check_exact(ops::masked_select(x.gpu, m.gpu), ops::masked_select(x_bytes, m.cpu),
                    what + " mask " + layout_name(ml));
      }
      const Tensor mb = random_mask({3, 4, 6}, 0.3, 6);  // x broadcast by the mask
      check_exact(ops::masked_select(x.gpu, mb.to(kGpu)), ops::masked_select(x_bytes, mb), what + " mask (3, 4, 6)");
      const Tensor mr = random_mask({6}, 0.5, 7);  // the mask broadcast by x
      check_exact(ops::masked_select(x.gpu, mr.to(kGpu)), ops::masked_select(x_bytes, mr), what + " mask (6)");
      check_exact(ops::masked_select(x.gpu, zeros({4, 6}, {kBool, kGpu})),
                  ops::masked_select(x_bytes, zeros({4, 6}, kBool)), what + " all false");
      check_exact(ops::masked_select(x.gpu, full({4, 6}, 1.0, {kBool, kGpu})),
                  ops::masked_select(x_bytes, full({4, 6}, 1.0, kBool)), what + " all true");
    }
  }
  for (int64_t n : {int64_t(1) << 20, (int64_t(1) << 20) + 3, int64_t(3000017)}) {
    const Tensor m = random_mask({n}, 0.3, uint64_t(n));
    const DevicePair x = random_pair({n}, kFloat32, 8);
    check_exact(ops::masked_select(x.gpu, m.to(kGpu)), ops::masked_select(x.cpu, m), "large " + std::to_string(n));
  }
  check_exact(ops::masked_select(zeros({0, 3}, {kFloat32, kGpu}), full({3}, 1.0, {kBool, kGpu})),
              ops::masked_select(zeros({0, 3}, kFloat32), full({3}, 1.0, kBool)), "size-0");
}

TEST_CASE("cuda masked_select: gradients match the CPU (broadcast input, 10^6+ mask); no sync in backward") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
    const Tensor mask = random_mask({3, 4, 6}, 0.3, 9);
    const std::vector<double> xv = random_values(4, 10);
    Tensor xc = from_vector(xv, {4, 1}, TensorOptions(kFloat64)).to(dt), xg = xc.to(kGpu);
    xc.requires_grad_(), xg.requires_grad_();
    const Tensor yc = masked_select(xc, mask), yg = masked_select(xg, mask.to(kGpu));
    const Tensor g = from_vector(random_values(yc.numel(), 11), {yc.numel()}, TensorOptions(kFloat64)).to(dt);
    yc.backward(g), yg.backward(g.to(kGpu));
    check_same(xg.grad(), xc.grad(), tol(dt, 8.0), "masked_select gradient " + std::string(dtype_name(dt)));
  }
  const int64_t n = (int64_t(1) << 20) + 5;
  const Tensor m = random_mask({n}, 0.3, 12);
  const Tensor mg = m.to(kGpu);
  const Tensor count = ops::masked_select(zeros({n}, kFloat32), m);
  const Tensor g = from_vector(random_values(count.numel(), 13), {count.numel()}, TensorOptions(kFloat32));
  check_exact(ops::masked_select_backward(g.to(kGpu), mg, {n}), ops::masked_select_backward(g, m, {n}),
              "scatter of 2^20+ elements");
}

TEST_CASE("cuda lerp / lerp_: match the CPU in every floating dtype, layout and broadcast") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
    for (Layout l : kAllLayouts) {
      const std::string what = name_of(dt, l);
      const DevicePair s = on_both(special_values(5 * 6, 14), {5, 6}, dt, l);
      const DevicePair e = random_pair({5, 6}, dt, 15, Layout::Transposed);
      const DevicePair w = random_pair({6}, dt, 16, Layout::Contiguous, -1, 2);
      // The same formula in the same opmath type on both (Note [Lerp formula]), but nvcc contracts
      // a + w (b - a) into one fused multiply-add: a rounding apart, NaNs where the CPU's are.
      check_same(ops::lerp(s.gpu, e.gpu, w.gpu), ops::lerp(s.cpu, e.cpu, w.cpu), tol(dt), "lerp " + what);
      for (double wt : {-0.7, 0.3, 0.5, 1.3})
        check_same(ops::lerp(s.gpu, e.gpu, wt), ops::lerp(s.cpu, e.cpu, wt), tol(dt), "lerp scalar " + what);
      const Tensor ig = s.gpu.clone(), ic = s.cpu.clone();
      ops::lerp_(ig, e.gpu, w.gpu), ops::lerp_(ic, e.cpu, w.cpu);
      check_same(ig, ic, tol(dt), "lerp_ " + what);
      ops::lerp_(ig, e.gpu.select(0, 1), 0.999), ops::lerp_(ic, e.cpu.select(0, 1), 0.999);
      check_same(ig, ic, tol(dt), "lerp_ scalar " + what);
    }
    // Gradients of start, end and a tensor weight.
    TensorList c, gv;
    for (const auto& [shape, seed] :
         {std::pair{Shape{3, 4}, 17}, std::pair{Shape{4}, 18}, std::pair{Shape{3, 1}, 19}}) {
      Tensor t = random_tensor(shape, dt, uint64_t(seed)), u = t.to(kGpu);
      t.requires_grad_(), u.requires_grad_();
      c.push_back(t), gv.push_back(u);
    }
    const Tensor g = random_tensor({3, 4}, dt, 20);
    lerp(c[0], c[1], c[2]).backward(g);
    lerp(gv[0], gv[1], gv[2]).backward(g.to(kGpu));
    for (size_t k = 0; k < 3; ++k)
      check_same(gv[k].grad(), c[k].grad(), tol(dt, 8.0), "lerp gradient " + std::to_string(k) + " " + dtype_name(dt));
  }
  // An EMA of CUDA weights under NoGradGuard.
  Tensor ema = random_tensor({1000}, {kFloat32, kGpu}, 21);
  ema.requires_grad_();
  const Tensor p = random_tensor({1000}, {kFloat32, kGpu}, 22);
  Tensor ema_cpu = ema.detach().cpu();
  {
    autograd::NoGradGuard no_grad;
    lerp_(ema, p, 0.01);
  }
  ops::lerp_(ema_cpu, p.cpu(), 0.01);
  check_same(ema.detach(), ema_cpu, tol(kFloat32), "EMA step");
}

TEST_CASE("cuda masked_select / nonzero: refused inside a CUDA graph capture; device mismatches named") {
  const Tensor x = random_tensor({4, 5}, {kFloat32, kGpu}, 23);
  const Tensor m = random_mask({4, 5}, 0.5, 24, kGpu);
  ops::masked_select(x, m);  // warm: the allocations exist outside the capture
  CudaGraph graph;
  CHECK_THROWS_WITH_AS(graph.capture([&] { ops::masked_select(x, m); }, {.warmup = 0}),
                       doctest::Contains("masked_select cannot run inside a CUDA graph capture"), Error);
  CudaGraph graph2;
  CHECK_THROWS_WITH_AS(graph2.capture([&] { ops::nonzero(x); }, {.warmup = 0}),
                       doctest::Contains("nonzero cannot run inside a CUDA graph capture"), Error);
  // lerp has a fixed output size: it captures and replays.
  const Tensor out = empty({4, 5}, {kFloat32, kGpu});
  CudaGraph graph3;
  graph3.capture([&] { ops::lerp_(out.copy_(x), x.t().contiguous().t(), 0.25); }, {.warmup = 0});
  graph3.replay();
  check_exact(out, ops::lerp(x.cpu(), x.cpu(), 0.25), "captured lerp_");
  check_error([&] { ops::masked_select(x, m.cpu()); }, {"masked_select", "one device", "cuda:0", "cpu"});
  check_error([&] { ops::masked_select(x.cpu(), m.to(kFloat32)); }, {"masked_select", "mask must be bool"});
  check_error([&] { ops::lerp(x, x.cpu(), 0.5); }, {"lerp", "one device"});
  check_error([&] { ops::lerp(x, x, x.cpu()); }, {"lerp", "one device"});
  check_error([&] { ops::lerp_(x.clone(), x.cpu(), 0.5); }, {"lerp_", "one device"});
}
