// Offloaded saved tensors on CUDA (Note [Offloaded saved tensors] in autograd/offload.cpp):
// chains of blocks with large activations give the plain run's outputs and gradients (bit
// for bit whenever the plain run repeats itself bit for bit, which it does unless a kernel
// accumulates with atomics), in float32 and under float16 autocast, on the default stream
// and on a stream of the test's own; the device holds after forward what the plain run
// holds less the bytes that went to the host; every restore is a prefetch.
//
// Races: the copies run on a side stream while the compute stream goes on, and the freed
// activations are reused at once by the next block's (and by the garbage allocated between
// forward and backward). A copy that started before its producer finished, a source block
// reused before its copy was done, or a restore read before it landed gives wrong values,
// so the exact comparison fails; under compute-sanitizer (memcheck, synccheck) the same
// cases also check that no access is out of bounds or unsynchronised.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/offload.h"
#include "autograd/ops/all.h"
#include "core/cuda_check.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "memory/pinned.h"
#include "nn/linear.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::offload;
using autograd::OffloadOptions;
using autograd::OffloadStats;

namespace {

const Device kGpu{DeviceType::CUDA, 0};

// Block: tanh(Linear2(gelu(Linear1(h)))). Saved per block: h (Linear1's input), Linear1's
// output (GELU's input), GELU's output (Linear2's input) and the block's output (tanh's):
// that output is the next block's h, shared with its copy (dedupe across blocks).
struct Chain {
  std::vector<std::shared_ptr<nn::Linear>> layers;  // 2 per block
  int64_t blocks;

  Chain(int64_t n, int64_t width) : blocks(n) {
    manual_seed(21);
    for (int64_t i = 0; i < 2 * n; ++i) {
      layers.push_back(std::make_shared<nn::Linear>(width, width));
      layers.back()->to(kGpu);
    }
  }
  std::function<Tensor(const Tensor&)> block(int64_t i) const {
    auto a = layers[2 * i], b = layers[2 * i + 1];
    return [a, b](const Tensor& h) { return tanh(b->forward(gelu(a->forward(h)))); };
  }
  void zero_grad() const {
    for (const auto& l : layers) l->zero_grad();
  }
  std::vector<std::vector<double>> grads() const {
    std::vector<std::vector<double>> g;
    for (const auto& l : layers)
      for (const Tensor& p : l->parameters()) g.push_back(values_of(p.grad()));
    return g;
  }
};

struct Run {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
  int64_t allocated_after_forward = 0;  // the device's bytes once forward returned
  int64_t backward_peak = 0;            // the device's peak during backward
};

// loss = sum(y * c) through the chain; offloaded when `options` is given. `garbage` bytes
// are allocated and written between forward and backward, to reuse freed blocks at once.
Run run(const Chain& chain, const Tensor& x0, const OffloadOptions* options, int64_t garbage = 0) {
  chain.zero_grad();
  Run r;
  const Tensor x = x0 * 1.0;  // not a leaf: offloaded like any activation
  Tensor h = x;
  for (int64_t i = 0; i < chain.blocks; ++i) h = options ? offload(chain.block(i), h, *options) : chain.block(i)(h);
  r.allocated_after_forward = memory::stats(kGpu).allocated_bytes.current;
  if (garbage > 0) {
    Tensor g = full({garbage / 4}, 1e30, {kFloat32, kGpu});
    add_(g, 1.0);
  }
  const Tensor c = random_tensor(h.sizes(), {h.dtype(), kGpu}, 5);
  memory::reset_peak(kGpu);
  sum(h * c).backward();
  r.backward_peak = memory::stats(kGpu).allocated_bytes.peak;
  r.out = values_of(h);
  r.grads = chain.grads();
  return r;
}

// max |a - b| / max |b| over the output and every gradient.
double worst_error(const Run& got, const Run& want) {
  double worst = 0;
  auto cmp = [&](const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < a.size(); ++i)
      diff = std::max(diff, std::abs(a[i] - b[i])), scale = std::max(scale, std::abs(b[i]));
    worst = std::max(worst, diff / scale);
  };
  cmp(got.out, want.out);
  for (size_t i = 0; i < got.grads.size(); ++i) cmp(got.grads[i], want.grads[i]);
  return worst;
}

// The offloaded run equals the plain one: bit for bit when two plain runs are, otherwise
// within twice the plain runs' own spread (a race gives errors of order 1).
void check_same(const Run& off, const Run& plain, const Run& plain_again) {
  const double spread = worst_error(plain_again, plain);
  const double err = worst_error(off, plain);
  MESSAGE("plain runs differ by ", spread, "; the offloaded one by ", err);
  if (spread == 0) CHECK(err == 0);
  else CHECK(err <= 2 * spread);
}

}  // namespace

TEST_CASE("offload cuda: 4 blocks of large activations give the plain gradients; the device holds less") {
  const int64_t width = 1024, batch = 8192, act = batch * width * 4;  // 32 MiB a tensor
  const Chain chain(4, width);
  const Tensor x0 = random_tensor({batch, width}, {kFloat32, kGpu}, 1);
  const OffloadOptions options{};
  const Run plain = run(chain, x0, nullptr), plain_again = run(chain, x0, nullptr);
  autograd::reset_offload_stats();
  const int64_t pinned_before = memory::pinned_stats().requested_bytes.current;
  const Run off = run(chain, x0, &options);
  synchronize(kGpu);
  check_same(off, plain, plain_again);

  const OffloadStats s = autograd::offload_stats();
  // x, then per block Linear1's and GELU's outputs and the block's output: 13 tensors, the
  // inner blocks' inputs shared with the outputs before them (3 dedupes).
  CHECK(s.tensors_offloaded == 13);
  CHECK(s.bytes_offloaded == 13 * act);
  CHECK(s.deduplicated == 3);
  CHECK(s.bytes_restored == s.bytes_offloaded);
  CHECK(s.prefetched == s.tensors_offloaded);  // every restore issued ahead of its unpack
  CHECK(s.on_demand == 0);
  MESSAGE("compute stream stalled ", s.wait_ms, " ms on restores");
  // After forward the device lacks exactly the offloaded tensors, less x and the output,
  // which the caller holds in both runs.
  CHECK(plain.allocated_after_forward - off.allocated_after_forward == s.bytes_offloaded - 2 * act);
  // Backward holds about two blocks of activations at a time, not all of them.
  CHECK(off.backward_peak < plain.backward_peak - 2 * act);
  CHECK(memory::pinned_stats().requested_bytes.current == pinned_before);  // host copies freed
}

TEST_CASE("offload cuda: float16 under autocast; cached weight casts stay on the device") {
  const int64_t width = 1024, batch = 4096;
  const Chain chain(4, width);
  const Tensor x0 = random_tensor({batch, width}, {kFloat32, kGpu}, 2);
  const OffloadOptions options{};
  auto amp_run = [&](const OffloadOptions* o) {
    AutocastGuard amp(kGpu, kFloat16);
    return run(chain, x0, o);
  };
  const Run plain = amp_run(nullptr), plain_again = amp_run(nullptr);
  autograd::reset_offload_stats();
  const Run off = amp_run(&options);
  check_same(off, plain, plain_again);
  const OffloadStats s = autograd::offload_stats();
  CHECK(s.tensors_offloaded > 0);
  // The 8 weights' float16 casts (2 MiB each, over min_bytes) are cached by autocast and
  // saved by the linears: kept, not copied.
  CHECK(s.bytes_kept_on_device >= 8 * width * width * 2);
  CHECK(s.prefetched == s.tensors_offloaded);
  CHECK(s.on_demand == 0);
}

TEST_CASE("offload cuda: many blocks, freed memory reused at once, on a stream of the test's own: exact") {
  const int64_t width = 512, batch = 8192, act = batch * width * 4;  // 16 MiB a tensor
  const Chain chain(16, width);
  const Tensor x0 = random_tensor({batch, width}, {kFloat32, kGpu}, 3);
  const OffloadOptions options{};
  synchronize(kGpu);  // the weights and x0, made on the legacy stream, which ours does not wait for
  cudaStream_t stream = nullptr;
  FRUGAL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    StreamGuard guard(Stream{stream, kGpu});
    const Run plain = run(chain, x0, nullptr, 8 * act), plain_again = run(chain, x0, nullptr, 8 * act);
    for (int repeat = 0; repeat < 3; ++repeat) {
      CAPTURE(repeat);
      autograd::reset_offload_stats();
      const Run off = run(chain, x0, &options, 8 * act);
      check_same(off, plain, plain_again);
      const OffloadStats s = autograd::offload_stats();
      CHECK(s.prefetched > 0);  // the restores overlapped: issued a block ahead
      CHECK(s.prefetched == s.tensors_offloaded);
      CHECK(s.bytes_restored == s.bytes_offloaded);
    }
    synchronize(kGpu);
  }
  FRUGAL_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("offload cuda: an in-place write to an offloaded saved tensor still throws") {
  const Chain chain(1, 256);
  Tensor y = offload(chain.block(0), random_tensor({1024, 256}, {kFloat32, kGpu}, 4) * 1.0, {.min_bytes = 0});
  {
    autograd::NoGradGuard no_grad;
    mul_(y, 2.0);  // y is the output TanhBackward saved
  }
  check_error([&] { sum(y).backward(); }, {"TanhBackward", "modified by an in-place operation"});
}
