// What a CUDA graph capture needs of the layers below it, on the CPU: a capture is simulated
// by setting this thread's core::GraphCapture, as CudaGraph does around its
// cudaStreamBeginCapture. Note [Graph pools] (memory/caching_allocator.h) on the CPU
// allocator, whose policy is the device's: what the capture allocates comes from its own
// pool, and what it frees is not handed to anyone else until the pool is released. Code a
// replay would get wrong refuses with an error naming it (random numbers, Adam's step count,
// SGD's first momentum step, a GradScaler step on CPU gradients or with an optimizer that
// cannot skip its step on the device), and SGD's frozen hyperparameters are checked before
// each replay.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/graph_capture.h"
#include "memory/allocator.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tests/fake_capture.h"
#include "tests/test_util.h"

using namespace frugal;
using frugal::testing::FakeCapture;

namespace {

/// The state of the CPU allocator's block that holds `ptr`.
memory::BlockState state_at(const void* ptr) {
  for (const memory::SegmentInfo& segment : memory::snapshot(kCPU))
    for (const memory::BlockInfo& b : segment.blocks)
      if (b.ptr <= ptr && ptr < static_cast<const char*>(b.ptr) + b.size) return b.state;
  FAIL("no block holds the pointer");
  return memory::BlockState::Free;
}

constexpr size_t kBytes = 3000;  // the small pool, one 512-byte multiple past 2560

}  // namespace

TEST_CASE("graph pool: the capture allocates from its own pool and reuses only its own frees") {
  int key = 0;
  memory::begin_graph_pool(kCPU, &key);
  DataPtr outside = memory::allocate(kCPU, kBytes);
  void* const outside_ptr = outside.get();
  outside = DataPtr();  // cached, free, on the CPU's stream
  void *first = nullptr, *second = nullptr;
  {
    FakeCapture capture(&key);
    DataPtr a = memory::allocate(kCPU, kBytes);
    first = a.get();
    CHECK(first != outside_ptr);  // not the cached block of the stream: a segment of the pool
    a = DataPtr();                // a pool block freed during the capture...
    DataPtr b = memory::allocate(kCPU, kBytes);
    second = b.get();
    CHECK(second == first);  // ...serves the capture's next allocation (the captured stream orders them)
  }
  // After the capture, the pool's free blocks are not handed out.
  DataPtr after = memory::allocate(kCPU, kBytes);
  CHECK(after.get() != first);
  after = DataPtr();
  memory::release_graph_pool(kCPU, &key, Stream{nullptr, kCPU});
}

TEST_CASE("graph pool: a block from before the capture, freed during it, is held until the release") {
  int key = 0;
  memory::begin_graph_pool(kCPU, &key);
  DataPtr before = memory::allocate(kCPU, kBytes);  // read by the graph: an input, a cached cast
  void* const ptr = before.get();
  const int64_t allocated = memory::stats(kCPU).allocated_bytes.current;
  {
    FakeCapture capture(&key);
    before = DataPtr();
    CHECK(memory::stats(kCPU).allocated_bytes.current < allocated);  // freed, as far as the counts go
    DataPtr again = memory::allocate(kCPU, kBytes);
    CHECK(again.get() != ptr);
  }
  std::vector<DataPtr> probes;  // the held block is not reused outside the capture either
  for (int i = 0; i < 64; ++i) {
    probes.push_back(memory::allocate(kCPU, kBytes));
    CHECK(probes.back().get() != ptr);
  }
  probes.clear();
  CHECK(state_at(ptr) == memory::BlockState::AwaitingEvents);  // held for the graph
  memory::release_graph_pool(kCPU, &key, Stream{nullptr, kCPU});
  CHECK(state_at(ptr) == memory::BlockState::Free);  // the stream's again (merged with free neighbours)
}

TEST_CASE("graph pool: pinned staging freed during a capture is never reused within it") {
  int key = 0;
  memory::begin_graph_pool(kCPU, &key);
  {
    FakeCapture capture(&key);
    // Two uploads' staging buffers: a replay reads each as the capture left it, so the
    // second must not overwrite the first.
    DataPtr a = memory::allocate_pinned(kBytes);
    void* const first = a.get();
    a = DataPtr();
    DataPtr b = memory::allocate_pinned(kBytes);
    CHECK(b.get() != first);
  }
  memory::release_graph_pool(kCPU, &key, Stream{nullptr, kCPU});
}

TEST_CASE("graph capture: what cannot be captured refuses with an error naming it; empty_cache too") {
  core::refuse_in_graph_capture("this", "no capture runs");  // outside a capture: nothing happens
  int key = 0;
  memory::begin_graph_pool(kCPU, &key);
  {
    FakeCapture capture(&key);
    CHECK_THROWS_WITH_AS(core::refuse_in_graph_capture("GradScaler.step", "it reads the inf flag on the host"),
                         doctest::Contains("GradScaler.step cannot run inside a CUDA graph capture"), Error);
    CHECK_THROWS_WITH_AS(memory::empty_cache(kCPU), doctest::Contains("empty_cache"), Error);
  }
  memory::release_graph_pool(kCPU, &key, Stream{nullptr, kCPU});
}

TEST_CASE("graph capture: other generators, Adam, SGD's first momentum step, GradScaler.step refuse; lr checked") {
  using namespace frugal::testing;
  Tensor w = param_tensor(random_values(6, 3), {6});
  w.set_grad(make_tensor(random_values(6, 4), {6}, kFloat32));
  optim::AdamW adamw({w}, {.lr = 1e-3});
  optim::SGD sgd({w}, {.lr = 0.1, .momentum = 0.9});
  optim::GradScaler scaler;
  int key = 0;
  memory::begin_graph_pool(kCPU, &key);
  {
    FakeCapture capture(&key);
    CHECK_THROWS_WITH_AS(ops::dropout(w.detach(), 0.5), doctest::Contains("Philox offset"), Error);
    CHECK_THROWS_WITH_AS(adamw.step(), doctest::Contains("bias corrections"), Error);
    CHECK_THROWS_WITH_AS(sgd.step(), doctest::Contains("first step with momentum"), Error);
    // Note [GradScaler in a CUDA graph]: a captured step takes CUDA gradients and an optimizer
    // that skips its step on the device; each refusal names the rule.
    CHECK_THROWS_WITH_AS(scaler.unscale_(sgd), doctest::Contains("has its gradient on cpu"), Error);
    CHECK_THROWS_WITH_AS(scaler.step(sgd), doctest::Contains("has its gradient on cpu"), Error);
    CHECK_THROWS_WITH_AS(scaler.step(adamw), doctest::Contains("AdamW cannot skip its step on the device"), Error);
    CHECK_THROWS_WITH_AS(scaler.update(), doctest::Contains("0 inf flags were recorded"), Error);
    CHECK_THROWS_WITH_AS(scaler.update(1024.0), doctest::Contains("GradScaler.update(new_scale)"), Error);
    CHECK_THROWS_WITH_AS(adamw.step_skipping_if(Tensor()), doctest::Contains("cannot skip its step"), Error);
    // Note [Capturable Adam]: capturable, its first step (which makes the moments) refuses.
    optim::AdamW capturable({w}, {.lr = 1e-3, .capturable = true});
    CHECK_THROWS_WITH_AS(capturable.step(), doctest::Contains("first step"), Error);
    CHECK(capturable.state(w) == nullptr);
  }
  CHECK_THROWS_WITH_AS(sgd.step_skipping_if(zeros({})), doctest::Contains("one-element float32 CUDA tensor"), Error);
  CHECK(scaler.get_scale() == 65536.0);  // nothing above changed it
  sgd.step();                            // the warm-up step outside the capture makes the momentum buffer
  {
    FakeCapture capture(&key);
    sgd.step();                       // captured: lr 0.1 and momentum 0.9 go into the kernel as values
    capture.check_replay();           // unchanged: a replay may go ahead
    sgd.param_groups()[0].lr = 0.05;  // what an LR scheduler would do between replays
    CHECK_THROWS_WITH_AS(capture.check_replay(), doctest::Contains("SGD's learning rate"), Error);
  }
  {
    FakeCapture capture(&key);
    sgd.step();
    capture.check_replay();
    sgd.load_state_dict(sgd.state_dict());  // new buffers: the graph's kernels hold the old ones
    CHECK_THROWS_WITH_AS(capture.check_replay(), doctest::Contains("replaced by load_state_dict"), Error);
  }
  memory::release_graph_pool(kCPU, &key, Stream{nullptr, kCPU});
}
