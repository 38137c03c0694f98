// autograd::queue_callback (autograd/engine.h, Note [Backward callbacks]): callbacks queued
// from hooks run once, in FIFO order, after the run's last node and before backward()
// returns; outside a backward it is an error; a throwing callback propagates and the rest
// are dropped; a checkpoint's nested run owns the callbacks queued in it (Current) unless
// the outermost run is asked for.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/meta.h"
#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using Log = std::vector<std::string>;

namespace {
Tensor leaf(uint64_t seed) {
  Tensor t = random_tensor({3}, kFloat32, seed);
  t.requires_grad_();
  return t;
}

/// Identity whose backward (a node's apply) queues a callback counting its runs.
struct CountingIdentityBackward : autograd::Node {
  int* count = nullptr;
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    autograd::queue_callback([c = count] { ++*c; });
    return std::move(grads);
  }
  std::string name() const override { return "CountingIdentityBackward"; }
  bool saves_tensors() const override { return false; }
};

Tensor counting_identity(const Tensor& x, int* count) {
  Tensor out = autograd::raw([&] { return x.clone(); });
  if (auto node = autograd::make_node<CountingIdentityBackward>({x})) {
    node->count = count;
    autograd::record(node, {out});
  }
  return out;
}
}  // namespace

TEST_CASE("queue_callback: callbacks run after every node, in FIFO order, before backward returns") {
  Tensor w = leaf(1), x = leaf(2);
  Log log;
  auto both_grads = [&] { return std::string(w.grad().defined() && x.grad().defined() ? " (all grads)" : ""); };
  autograd::register_post_accumulate_grad_hook(w, [&](const Tensor&) {
    log.push_back("hook w");
    CHECK(autograd::in_backward());
    autograd::queue_callback([&] {
      log.push_back("cb1" + both_grads());
      autograd::queue_callback([&] { log.push_back("cb4" + both_grads()); });  // queued by a callback
    });
    autograd::queue_callback([&] { log.push_back("cb2" + both_grads()); });
  });
  autograd::register_post_accumulate_grad_hook(x, [&](const Tensor&) {
    log.push_back("hook x");
    autograd::queue_callback([&] { log.push_back("cb3" + both_grads()); });
  });
  sum(mul(w, x)).backward();
  log.push_back("returned");
  // AccumulateGrad(x) is newer than AccumulateGrad(w) (x was made later), so it runs first
  CHECK(log == Log{"hook x", "hook w", "cb3 (all grads)", "cb1 (all grads)", "cb2 (all grads)", "cb4 (all grads)",
                   "returned"});
  CHECK(!autograd::in_backward());
}

TEST_CASE("queue_callback: each callback runs once, in the backward that queued it; grad() runs them too") {
  Tensor w = leaf(3);
  int hooks = 0, callbacks = 0;
  autograd::register_post_accumulate_grad_hook(w, [&](const Tensor&) {
    ++hooks;
    autograd::queue_callback([&] { ++callbacks; });
  });
  for (int i = 1; i <= 3; ++i) {
    sum(mul(w, 2.0)).backward();
    CHECK(hooks == i);
    CHECK(callbacks == i);
  }
  // a node's apply can queue too, and autograd::grad runs the callbacks before it returns
  Tensor v = leaf(4);
  int in_grad = 0;
  const Tensor y = mul(counting_identity(v, &in_grad), 3.0);
  const auto g = autograd::grad({sum(y)}, {v}, {}, /*retain_graph=*/true);
  CHECK(in_grad == 1);
  CHECK(values_of(g[0]) == std::vector<double>{3, 3, 3});
  sum(y).backward();
  CHECK(in_grad == 2);
}

TEST_CASE("queue_callback: outside a backward is an error") {
  CHECK(!autograd::in_backward());
  check_error([] { autograd::queue_callback([] {}); }, {"queue_callback", "outside a backward"});
  check_error([] { autograd::queue_callback([] {}, autograd::CallbackRun::Outermost); },
              {"queue_callback", "outside a backward"});
}

TEST_CASE("queue_callback: a throwing callback propagates out of backward; the rest are dropped, state is reset") {
  Tensor w = leaf(5);
  Log log;
  bool throwing = true;
  autograd::register_post_accumulate_grad_hook(w, [&](const Tensor&) {
    autograd::queue_callback([&] { log.push_back("first"); });
    autograd::queue_callback([&] {
      if (throwing) throw std::runtime_error("callback failed");
      log.push_back("second");
    });
    autograd::queue_callback([&] { log.push_back("third"); });
  });
  CHECK_THROWS_WITH_AS(sum(w).backward(), "callback failed", std::runtime_error);
  CHECK(log == Log{"first"});
  CHECK(!autograd::in_backward());
  check_error([] { autograd::queue_callback([] {}); }, {"queue_callback", "outside a backward"});
  // the next backward starts with an empty queue: nothing from the failed run reappears
  throwing = false;
  sum(w).backward();
  CHECK(log == Log{"first", "first", "second", "third"});
  // a node throwing mid-run drops the callbacks queued before it
  int count = 0;
  Tensor a = leaf(6);
  const Tensor z = counting_identity(mul(a, a), &count);  // backward: identity (queues), then mul
  sum(z).backward();
  CHECK(count == 1);
  check_error([&] { sum(z).backward(); }, {"saved tensors were freed"});  // mul's, after the identity queued
  CHECK(count == 1);
  CHECK(!autograd::in_backward());
}

TEST_CASE("queue_callback: callbacks queued in a checkpoint's nested backward belong to that run") {
  Tensor v = leaf(7), w = leaf(8);
  Log log;
  auto v_done = [&] { return std::string(v.grad().defined() ? " v done" : " v pending"); };
  autograd::register_post_accumulate_grad_hook(w, [&](const Tensor&) {  // fires in the recompute's run
    log.push_back("hook w");
    autograd::queue_callback([&] { log.push_back("outer" + v_done()); }, autograd::CallbackRun::Outermost);
    autograd::queue_callback([&] {
      log.push_back("inner" + v_done());
      CHECK(autograd::in_backward());  // the outer run is still going
    });
  });
  autograd::register_post_accumulate_grad_hook(v, [&](const Tensor&) { log.push_back("hook v"); });
  const Tensor h = mul(v, 2.0);
  const Tensor y = autograd::checkpoint([&](const Tensor& t) { return mul(t, w); }, h);
  sum(y).backward();
  CHECK(log == Log{"hook w", "inner v pending", "hook v", "outer v done"});
  // the gradients are those of the plain computation
  check_close(values_of(w.grad()), values_of(mul(v, 2.0)), 1e-6, 0, "w.grad");
  check_close(values_of(v.grad()), values_of(mul(w, 2.0)), 1e-6, 0, "v.grad");
}
