// Deferred index checks on CUDA (Note [Deferred index checks]): a bad index raises
// nothing at the op and the op's own message at the next synchronization; with the sync
// switch on it raises at the op, as the CPU does.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/stream.h"
#include "memory/allocator.h"
#include "memory/deferred_checks.h"
#include "tensor/factory.h"
#include "tensor/ops/index.h"
#include "tensor/ops/loss.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const Device kGpu = cuda(0);

// Sets the switch for a scope.
class SyncIndexChecks {
 public:
  explicit SyncIndexChecks(bool on) : before_(ops::sync_index_checks()) { ops::set_sync_index_checks(on); }
  ~SyncIndexChecks() { ops::set_sync_index_checks(before_); }
  SyncIndexChecks(const SyncIndexChecks&) = delete;
  SyncIndexChecks& operator=(const SyncIndexChecks&) = delete;

 private:
  bool before_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) { return e.what(); }
  return "";
}

// The message without the trailing "  [...]" (the source location, or the deferred note).
std::string body_of(const std::string& msg) { return msg.substr(0, msg.rfind("  [")); }

struct BadCall {
  std::string name;
  std::function<void()> call;
  std::vector<std::string> parts;  // op name, bad value, valid range
};

std::vector<BadCall> bad_calls() {
  const Tensor w = zeros({6, 4}, {kFloat32, kGpu});
  const Tensor logits = zeros({3, 5}, {kFloat32, kGpu});
  const Tensor grad = ones({2, 4}, {kFloat32, kGpu});
  return {
      {"embedding",
       [w] {
         ops::embedding(w, from_vector<int64_t>({0, 2, 9}, {3}, {kInt64, kGpu}));
       },
       {"embedding: index 9", "[0, 6)", "position [2]"}},
      {"embedding_backward",
       [grad] {
         ops::embedding_backward(grad, from_vector<int64_t>({1, 6}, {2}, {kInt32, kGpu}), 6);
       },
       {"embedding_backward: index 6", "[0, 6)", "position [1]"}},
      {"index_select",
       [w] {
         ops::index_select(w, 1, from_vector<int64_t>({0, -2}, {2}, {kInt64, kGpu}));
       },
       {"index_select: index -2", "[0, 4)", "position [1]"}},
      {"cross_entropy",
       [logits] {
         ops::cross_entropy(logits, from_vector<int64_t>({0, 5, 1}, {3}, {kInt64, kGpu}));
       },
       {"cross_entropy: target 5", "[0, 5)", "position [1]"}},
  };
}

void check_parts(const std::string& msg, const std::vector<std::string>& parts, const std::string& what) {
  REQUIRE_MESSAGE(!msg.empty(), what, ": expected an error");
  for (const std::string& p : parts)
    CHECK_MESSAGE(msg.find(p) != std::string::npos, what, ": '", msg, "' lacks '", p, "'");
}

}  // namespace

TEST_CASE("cuda deferred index checks: raised at the next item() or synchronize(), with the op's own message") {
  REQUIRE_NOTHROW(synchronize(kGpu));
  for (const BadCall& c : bad_calls()) {
    std::string sync_msg;
    {
      SyncIndexChecks on(true);
      sync_msg = error_of(c.call);  // at the op, as before
    }
    check_parts(sync_msg, c.parts, c.name);
    CHECK(memory::pending_check_count(kGpu) == 0);

    SyncIndexChecks off(false);
    CHECK_MESSAGE(error_of(c.call).empty(), c.name, ": the deferred check raised at the op");
    CHECK(memory::pending_check_count(kGpu) >= 1);
    const Tensor scalar = ones({}, {kFloat32, kGpu});
    const std::string at_item = error_of([&] { (void)scalar.item<float>(); });
    check_parts(at_item, c.parts, c.name);
    CHECK_MESSAGE(at_item.find(body_of(sync_msg)) != std::string::npos, c.name, ": deferred '", at_item,
                  "' differs from '", sync_msg, "'");
    CHECK(at_item.find("detected at a later synchronization with cuda:0") != std::string::npos);
    CHECK(memory::pending_check_count(kGpu) == 0);

    // Raised once: the next sync is clean, and the same bad call is caught by synchronize() too.
    CHECK_NOTHROW(synchronize(kGpu));
    CHECK(error_of(c.call).empty());
    check_parts(error_of([] { synchronize(kGpu); }), c.parts, c.name);
    // And by a device-to-host copy of an unrelated tensor.
    CHECK(error_of(c.call).empty());
    check_parts(error_of([&] { (void)scalar.cpu(); }), c.parts, c.name);
    CHECK_NOTHROW(synchronize(kGpu));
  }
}

TEST_CASE("cuda deferred index checks: after the error, ops work normally; good indices never raise") {
  SyncIndexChecks off(false);
  REQUIRE_NOTHROW(synchronize(kGpu));
  const Tensor wc = random_tensor({7, 3}, {kFloat32, kCPU}, 5);
  const Tensor wg = wc.to(kGpu);
  const std::vector<int64_t> good = {6, 0, 3, 3, 1};
  ops::embedding(wg, from_vector<int64_t>({7}, {1}, {kInt64, kGpu}));  // bad: 7 embeddings
  CHECK(!error_of([] { synchronize(kGpu); }).empty());
  for (int rep = 0; rep < 3; ++rep) {
    const Tensor ig = from_vector<int64_t>(good, {5}, {kInt64, kGpu});
    const Tensor ic = from_vector<int64_t>(good, {5}, {kInt64, kCPU});
    const Tensor yg = ops::embedding(wg, ig);
    check_close(yg, values_of(ops::embedding(wc, ic)), 0.0, 0.0, "embedding after the error");
    const Tensor gg = ops::embedding_backward(ones({5, 3}, {kFloat32, kGpu}), ig, 7);
    check_close(gg, values_of(ops::embedding_backward(ones({5, 3}, {kFloat32, kCPU}), ic, 7)), 1e-6, 1e-6,
                "embedding_backward after the error");
    const Tensor t = from_vector<int64_t>({2, 0, 1, -100, 2, 0, 1}, {7}, {kInt64, kGpu});
    const double loss = ops::cross_entropy(wg, t).loss.item<double>();
    const double loss_cpu = ops::cross_entropy(wc, t.cpu()).loss.item<double>();
    CHECK(loss == doctest::Approx(loss_cpu).epsilon(1e-5));
    CHECK_NOTHROW(synchronize(kGpu));
    CHECK(memory::pending_check_count(kGpu) == 0);
  }
}

TEST_CASE("cuda deferred index checks: with the sync switch on, the error is raised at the op") {
  SyncIndexChecks on(true);
  REQUIRE_NOTHROW(synchronize(kGpu));
  for (const BadCall& c : bad_calls()) {
    check_parts(error_of(c.call), c.parts, c.name);
    CHECK(error_of(c.call).find("detected") == std::string::npos);
    CHECK(memory::pending_check_count(kGpu) == 0);
    CHECK_NOTHROW(synchronize(kGpu));  // nothing left over
  }
}

TEST_CASE("cuda deferred index checks: many calls recycle their slots and free their records") {
  SyncIndexChecks off(false);
  REQUIRE_NOTHROW(synchronize(kGpu));
  const Tensor w = random_tensor({50, 8}, {kFloat32, kGpu}, 9);
  const Tensor idx = from_vector<int64_t>({1, 49, 0, 7}, {4}, {kInt64, kGpu});
  const Tensor logits = random_tensor({4, 50}, {kFloat32, kGpu}, 10);
  auto round = [&](int n) {
    for (int i = 0; i < n; ++i) {
      const Tensor y = ops::embedding(w, idx);
      const Tensor g = ops::embedding_backward(y, idx, 50);
      const Tensor l = ops::cross_entropy(logits, idx).loss;
      if (i % 50 == 49) (void)l.item<float>();  // a sync every 50 steps, as a training loop logs
    }
    synchronize(kGpu);
  };
  round(100);  // warm-up: the slot pool and the allocator's cache reach their size
  const size_t slots = memory::check_slot_count(kGpu);
  const int64_t allocated = memory::stats(kGpu).allocated_bytes.current;
  round(2000);
  CHECK(memory::pending_check_count(kGpu) == 0);
  // At most 3 checks a step and 50 steps between syncs are in flight: a bounded pool.
  CHECK(memory::check_slot_count(kGpu) <= std::max<size_t>(slots, 3 * 50 + 3));
  CHECK(memory::stats(kGpu).allocated_bytes.current == allocated);
}
