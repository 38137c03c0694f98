// The registry of deferred checks (Note [Deferred index checks]) over a fake transport:
// copies that land only when the test says the "device" got there, so when a check can
// be resolved is under the test's control. The CUDA transport is covered by the gpu suite.
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/graph_capture.h"
#include "memory/allocator.h"
#include "memory/deferred_checks.h"
#include "tensor/factory.h"
#include "tensor/ops/index.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using frugal::memory::detail::CheckTransport;
using frugal::memory::detail::PendingChecks;

namespace {

// Queued copies run (the record lands in its slot, the event completes) when the test
// calls land(i) or land_all(), or at once when `immediate`.
class FakeTransport final : public CheckTransport {
 public:
  explicit FakeTransport(bool immediate = false) : immediate_(immediate) {}

  void* create_event() override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::make_unique<bool>(false));
    return events_.back().get();
  }
  void copy_record(Stream, const void* record, int64_t* slot, void* event) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto* done = static_cast<bool*>(event);
    *done = false;
    std::memset(slot, 0xab, 3 * sizeof(int64_t));  // what was there before is not the answer
    copies_.push_back(Copy{static_cast<const int64_t*>(record), slot, done});
    if (immediate_) land_locked(copies_.size() - 1);
  }
  bool completed(void* event) override {
    std::lock_guard<std::mutex> lock(mu_);
    return *static_cast<bool*>(event);
  }
  // A captured device copy: made now, and again at each replay_device_copies() (a replay).
  void copy_record_on_device(Stream, const void* record, void* copy) override {
    std::lock_guard<std::mutex> lock(mu_);
    device_copies_.emplace_back(record, copy);
    std::memcpy(copy, record, 3 * sizeof(int64_t));
  }
  void replay_device_copies() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [record, copy] : device_copies_) std::memcpy(copy, record, 3 * sizeof(int64_t));
  }

  void land(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    land_locked(i);
  }
  void land_all() {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < copies_.size(); ++i) land_locked(i);
  }

 private:
  std::vector<std::pair<const void*, void*>> device_copies_;
  struct Copy {
    const int64_t* record;
    int64_t* slot;
    bool* done;
    bool landed = false;
  };
  void land_locked(size_t i) {
    Copy& c = copies_.at(i);
    if (c.landed) return;
    std::memcpy(c.slot, c.record, 3 * sizeof(int64_t));
    *c.done = c.landed = true;
  }

  bool immediate_;
  std::mutex mu_;
  std::vector<std::unique_ptr<bool>> events_;
  std::vector<Copy> copies_;
};

// The "device records": they must outlive their copies, as device memory does in stream order.
struct Records {
  std::vector<std::unique_ptr<int64_t[]>> all;
  const int64_t* make(bool bad, int64_t value, int64_t position) {
    all.push_back(std::make_unique<int64_t[]>(3));
    all.back()[0] = bad ? 1 : 0;
    all.back()[1] = value;
    all.back()[2] = position;
    return all.back().get();
  }
};

memory::CheckMessage message(const std::string& op) {
  return [op](int64_t value, int64_t position) {
    return op + ": index " + std::to_string(value) + " at position " + std::to_string(position);
  };
}

const Stream kFakeStream{nullptr, kCPU};

// A registry over a fake transport that the test lands copies on.
struct FakeDevice {
  explicit FakeDevice(const char* name) : checks(name, make_fake()) {}
  std::unique_ptr<CheckTransport> make_fake() {
    auto t = std::make_unique<FakeTransport>();
    fake = t.get();
    return t;
  }
  void add(bool bad, int64_t value, int64_t position, const std::string& op) {
    checks.add(kFakeStream, rec.make(bad, value, position), message(op));
  }
  FakeTransport* fake = nullptr;
  PendingChecks checks;
  Records rec;
};

}  // namespace

TEST_CASE("deferred checks: a failed check throws its message once its record has landed, then is gone") {
  FakeDevice dev("fake:0");
  dev.add(true, 7, 2, "gather");
  CHECK(dev.checks.pending() == 1);
  CHECK_NOTHROW(dev.checks.resolve());  // not landed yet: resolving never waits
  CHECK(dev.checks.pending() == 1);
  dev.fake->land_all();
  check_error([&] { dev.checks.resolve(); },
              {"gather: index 7 at position 2", "detected at a later synchronization with fake:0",
               "FRUGAL_SYNC_INDEX_CHECKS=1", "set_sync_index_checks(true)"});
  CHECK(dev.checks.pending() == 0);
  CHECK_NOTHROW(dev.checks.resolve());  // no sticky state
  dev.add(false, 0, 0, "gather");
  dev.fake->land_all();
  CHECK_NOTHROW(dev.checks.resolve());
  CHECK(dev.checks.pending() == 0);
}

TEST_CASE("deferred checks: good records never throw and slots are recycled") {
  FakeDevice dev("fake:0");
  for (int i = 0; i < 1000; ++i) {
    dev.add(false, i, i, "embedding");
    dev.fake->land_all();
    if (i % 10 == 9) CHECK_NOTHROW(dev.checks.resolve());
  }
  CHECK_NOTHROW(dev.checks.resolve());
  CHECK(dev.checks.pending() == 0);
  // add() reaps the landed checks before it returns: one slot in flight plus the new one.
  CHECK(dev.checks.slots() <= 2);
}

TEST_CASE("deferred checks: a loop that never synchronizes stays bounded and meets its failure at a later op") {
  FakeDevice dev("fake:0");
  for (int i = 0; i < 500; ++i) {
    dev.add(false, 0, 0, "embedding");
    dev.fake->land_all();
  }
  CHECK(dev.checks.pending() <= 1);
  CHECK(dev.checks.slots() <= 2);
  dev.add(true, 42, 3, "cross_entropy");
  dev.fake->land_all();
  check_error([&] { dev.add(false, 0, 0, "embedding"); },
              {"cross_entropy: index 42 at position 3", "detected at a later index-checked op with fake:0"});
  // The check filed by the call that threw is kept, and is good.
  CHECK(dev.checks.pending() == 1);
  dev.fake->land_all();
  CHECK_NOTHROW(dev.checks.resolve());
  CHECK(dev.checks.pending() == 0);
}

TEST_CASE("deferred checks: only landed checks are resolved, in whatever order they land") {
  FakeDevice dev("fake:1");
  dev.add(false, 0, 0, "a");  // copy 0
  dev.add(true, 11, 1, "b");  // copy 1
  dev.add(true, 12, 2, "c");  // copy 2 (another stream, say)
  dev.fake->land(2);
  std::string msg;
  try {
    dev.checks.resolve();
  } catch (const Error& e) { msg = e.what(); }
  CHECK(msg.find("c: index 12 at position 2") != std::string::npos);
  CHECK(msg.find("more failed") == std::string::npos);
  CHECK(dev.checks.pending() == 2);
  dev.fake->land(0);
  dev.fake->land(1);
  check_error([&] { dev.checks.resolve(); }, {"b: index 11 at position 1"});
  CHECK(dev.checks.pending() == 0);
  // Several failures at once: the first filed is reported, the rest counted.
  dev.add(true, 21, 0, "d");
  dev.add(true, 22, 0, "e");
  dev.fake->land(3);
  dev.fake->land(4);
  check_error([&] { dev.checks.resolve(); }, {"d: index 21", "(and 1 more failed index checks)"});
  CHECK(dev.checks.pending() == 0);
}

TEST_CASE("deferred checks: a bad record that lands before add() returns is raised later, never at its own op") {
  // On a GPU a tiny kernel's copy can finish before the host leaves add(); where the
  // error appears must not depend on that race.
  PendingChecks checks("fake:0", std::make_unique<FakeTransport>(/*immediate=*/true));
  Records rec;
  CHECK_NOTHROW(checks.add(kFakeStream, rec.make(true, 7, 2), message("embedding")));
  CHECK(checks.pending() == 1);
  check_error([&] { checks.resolve(); }, {"embedding: index 7 at position 2", "detected at a later synchronization"});
  CHECK_NOTHROW(checks.add(kFakeStream, rec.make(true, 8, 0), message("gather")));
  check_error([&] { checks.add(kFakeStream, rec.make(false, 0, 0), message("embedding")); },
              {"gather: index 8 at position 0", "detected at a later index-checked op"});
  CHECK_NOTHROW(checks.resolve());
  CHECK(checks.pending() == 0);
}

TEST_CASE("deferred checks: a message that throws while older checks retire loses no check") {
  PendingChecks checks("fake:0", std::make_unique<FakeTransport>(/*immediate=*/true));
  Records rec;
  const memory::CheckMessage throwing = [](int64_t, int64_t) -> std::string { throw std::runtime_error("no memory"); };
  CHECK_NOTHROW(checks.add(kFakeStream, rec.make(true, 1, 0), throwing));
  CHECK_THROWS_AS(checks.add(kFakeStream, rec.make(false, 0, 0), message("embedding")), std::runtime_error);
  CHECK(checks.pending() == 2);  // the failing one stays, and the new one was filed
}

TEST_CASE("deferred checks: adds and resolves from several threads") {
  PendingChecks checks("fake:0", std::make_unique<FakeTransport>(/*immediate=*/true));
  constexpr int kThreads = 4, kPerThread = 300;
  std::vector<Records> recs(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        checks.add(kFakeStream, recs[size_t(t)].make(false, i, t), message("index_select"));
        if (i % 7 == 0) checks.resolve();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK_NOTHROW(checks.resolve());
  CHECK(checks.pending() == 0);
  CHECK(checks.slots() <= size_t(2 * kThreads));
}

TEST_CASE("deferred checks: the sync switch, and CPU ops still throw at the call") {
  const bool before = ops::sync_index_checks();
  ops::set_sync_index_checks(true);
  CHECK(ops::sync_index_checks());
  CHECK(memory::sync_checks());
  ops::set_sync_index_checks(false);
  CHECK_FALSE(ops::sync_index_checks());
  // Deferred mode changes nothing on the CPU: the kernel knows the answer at once.
  const Tensor x = zeros({3, 5}, {kFloat32, kCPU});
  std::string msg;
  try {
    ops::index_select(x, 1, from_vector<int64_t>({0, 9, 1}, {3}, {kInt64, kCPU}));
  } catch (const Error& e) { msg = e.what(); }
  CHECK(msg.find("index_select: index 9 is out of range for dim 1 of input float32[3, 5] cpu (valid range [0, 5)) "
                 "at position [1] of index int64[3] cpu") != std::string::npos);
  CHECK(msg.find("detected") == std::string::npos);
  CHECK(memory::pending_check_count(kCPU) == 0);
  CHECK_NOTHROW(memory::resolve_checks(kCPU));
  ops::set_sync_index_checks(before);
}

TEST_CASE("deferred checks: a check captured in a CUDA graph is copied at its op and filed after each replay") {
  auto owned = std::make_unique<FakeTransport>(/*immediate=*/true);
  FakeTransport& transport = *owned;
  PendingChecks checks("fake:0", std::move(owned));
  int key = 0;
  memory::begin_graph_pool(kCPU, &key);
  core::GraphCapture capture{.pool_key = &key, .device = kCPU, .stream = nullptr, .replay_checks = {}};
  int64_t record[3] = {0, 0, 0};  // the op's record, as the device would hold it
  core::set_current_graph_capture(&capture);
  checks.add_captured(capture, Stream{nullptr, kCPU}, record, [](int64_t value, int64_t position) {
    return "index " + std::to_string(value) + " at " + std::to_string(position);
  });
  core::set_current_graph_capture(nullptr);
  CHECK(checks.pending() == 0);  // nothing ran at capture
  REQUIRE(capture.after_replay.size() == 1);
  auto replay = [&] {
    transport.replay_device_copies();
    for (const auto& filed : capture.after_replay) filed(Stream{nullptr, kCPU});
  };
  replay();  // a clean replay: filed, and resolved without an error
  CHECK(checks.pending() == 1);
  checks.resolve();
  CHECK(checks.pending() == 0);
  record[0] = 1, record[1] = 42, record[2] = 7;  // the next replay's op meets a bad index
  replay();
  CHECK_THROWS_WITH_AS(checks.resolve(), doctest::Contains("index 42 at 7"), Error);
  capture.after_replay.clear();
  memory::release_graph_pool(kCPU, &key, Stream{nullptr, kCPU});
}
