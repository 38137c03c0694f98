// Probes for silent wrong answers in the memory accounting: the arena allocator's
// statistics, its trace and snapshot, the profiler's attribution and the report
// tables. Every probe's reference is what the test itself allocates and frees,
// re-derived from Note [Sizes and pools] and Note [Best fit, split and merge], or
// an independent recount (of a snapshot, of a trace, of nested intervals).
// test_allocator.cpp, test_profiler.cpp and the "probe memory" cases of
// test_probe_lowrank_memory.cpp (a reference model of the arena) are not repeated.
#include <doctest/doctest.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "autograd/ops/all.h"
#include "core/error.h"
#include "core/instrument.h"
#include "memory/allocator.h"
#include "memory/caching_allocator.h"
#include "memory/trace.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "profiler/session.h"
#include "tensor/factory.h"
#include "tensor/random.h"

using namespace frugal;
using memory::BlockState;
using memory::MemoryStats;
using memory::PoolStats;
using memory::StatCounter;
using memory::TraceAction;
using memory::detail::CachingAllocator;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;
constexpr Stream kHost{nullptr, kCPU};

size_t rounded(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }  // Note [Sizes and pools]

// Host memory whose "other streams" complete only when the test says so.
class EventBackend final : public memory::detail::RawBackend {
 public:
  EventBackend() : host_(memory::detail::make_cpu_backend()) {}
  void* allocate_segment(size_t n) override { return host_->allocate_segment(n); }
  void free_segment(void* base, size_t n) override { host_->free_segment(base, n); }
  size_t total_memory() const override { return host_->total_memory(); }
  std::string memory_info() const override { return "event backend"; }
  void* record_event(Stream) override {
    events.push_back(std::make_unique<bool>(false));
    return events.back().get();
  }
  bool event_completed(void* e) override { return *static_cast<bool*>(e); }
  void wait_event(void* e) override { *static_cast<bool*>(e) = true; }
  void release_event(void*) override {}
  void complete_all() {
    for (auto& e : events) *e = true;
  }
  std::vector<std::unique_ptr<bool>> events;

 private:
  std::unique_ptr<memory::detail::RawBackend> host_;
};

// The statistics recounted from a snapshot: what each block's state says it is.
struct Recount {
  int64_t allocated = 0, requested = 0, reserved = 0, inactive_split = 0, awaiting = 0, segments = 0;
  int64_t allocated_blocks = 0, awaiting_blocks = 0;
};

Recount recount(const std::vector<memory::SegmentInfo>& snapshot, bool small_pool, bool large_pool) {
  Recount r;
  for (const memory::SegmentInfo& seg : snapshot) {
    if (seg.small_pool ? !small_pool : !large_pool) continue;
    r.reserved += int64_t(seg.size);
    ++r.segments;
    const char* expected = static_cast<const char*>(seg.base);
    for (const memory::BlockInfo& b : seg.blocks) {
      CHECK_MESSAGE(b.ptr == expected, "blocks tile their segment in address order");
      expected = static_cast<const char*>(b.ptr) + b.size;
      switch (b.state) {
        case BlockState::Allocated:
          r.allocated += int64_t(b.size), r.requested += int64_t(b.requested), ++r.allocated_blocks;
          break;
        case BlockState::AwaitingEvents:
          CHECK(b.requested == 0);
          r.awaiting += int64_t(b.size), ++r.awaiting_blocks;
          break;
        case BlockState::Free:
          CHECK(b.requested == 0);
          if (seg.blocks.size() > 1) r.inactive_split += int64_t(b.size);
          break;
      }
    }
    CHECK_MESSAGE(expected == static_cast<const char*>(seg.base) + seg.size, "blocks cover their segment");
  }
  return r;
}

// Every current statistic of `s` (each pool and both) against a recount of `a`'s snapshot.
void check_against_snapshot(const CachingAllocator& a, const std::string& when) {
  INFO(when);
  const MemoryStats s = a.stats();
  const auto snap = a.snapshot();
  const std::pair<const PoolStats*, Recount> pools[] = {
      {&s.small_pool, recount(snap, true, false)},
      {&s.large_pool, recount(snap, false, true)},
      {&s, recount(snap, true, true)},
  };
  for (const auto& [p, r] : pools) {
    CHECK(p->allocated_bytes.current == r.allocated);
    CHECK(p->requested_bytes.current == r.requested);
    CHECK(p->reserved_bytes.current == r.reserved);
    CHECK(p->inactive_split_bytes.current == r.inactive_split);
    CHECK(p->segments.current == r.segments);
    // Documented in memory/stats.h: active blocks include those waiting on events.
    CHECK(p->active_blocks.current == r.allocated_blocks + r.awaiting_blocks);
    CHECK(p->fragmentation() == (r.reserved ? double(r.inactive_split) / double(r.reserved) : 0.0));
  }
}

/// Every timeline point's categories are non-negative and add up to its allocated bytes.
void check_timeline_adds_up(const profiler::Session& session) {
  for (size_t i = 0; i < session.timeline().size(); ++i) {
    const profiler::TimelinePoint& p = session.timeline()[i];
    int64_t sum = 0;
    for (int64_t b : p.by_category) {
      CHECK(b >= 0);
      sum += b;
    }
    INFO("timeline point ", i);
    CHECK(sum == p.allocated);
  }
}

}  // namespace

// ---- Units ----------------------------------------------------------------------------------

TEST_CASE("probe memory: format_bytes switches unit where the rounded value reaches 1024, never prints 1024.00") {
  using memory::format_bytes;
  // The reference: the largest unit whose value, rounded to two decimals, is below 1024.
  auto reference = [](int64_t bytes) {
    const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    const long double magnitude = bytes < 0 ? -static_cast<long double>(bytes) : static_cast<long double>(bytes);
    const std::string sign = bytes < 0 ? "-" : "";
    if (magnitude < 1024) return sign + std::to_string(static_cast<int64_t>(magnitude)) + " B";
    long double v = magnitude / 1024;
    int u = 0;
    while (u < 5 && std::llround(v * 100) >= 1024 * 100) v /= 1024, ++u;
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s%.2Lf %s", sign.c_str(), v, units[u]);
    return std::string(buf);
  };
  const int64_t cases[] = {
      1023,
      1024,
      1048570,           // 1023.994 KiB: still KiB
      1048571,           // 1023.995 KiB rounds to 1024.00: 1.00 MiB
      int64_t(MiB) - 1,  // the last byte below a MiB
      int64_t(MiB),
      int64_t(1024 * MiB) - 1,  // below a GiB by a byte
      int64_t(1024 * MiB) - int64_t(6 * KiB),
      (int64_t(1) << 40) - 1,
      -int64_t(MiB) + 1,
      std::numeric_limits<int64_t>::max(),
  };
  for (int64_t b : cases) {
    INFO("bytes = ", b);
    CHECK(format_bytes(b) == reference(b));
    CHECK(format_bytes(b).find("1024.00") == std::string::npos);
  }
  CHECK(format_bytes(int64_t(MiB) - 1) == "1.00 MiB");
  CHECK(format_bytes(std::numeric_limits<int64_t>::min()) == "-8.00 EiB");
}

TEST_CASE("probe memory: every line of memory_summary's table is as wide as its rules, for 4-digit values too") {
  MemoryStats s;
  // Values whose text has four digits before the point ("1023.50 KiB", "1000.00 MiB").
  const int64_t wide = int64_t(1023 * KiB + 512), wider = int64_t(1000 * MiB);
  for (PoolStats* p : {static_cast<PoolStats*>(&s), &s.small_pool, &s.large_pool})
    for (StatCounter* c : {&p->allocated_bytes, &p->reserved_bytes, &p->requested_bytes, &p->inactive_split_bytes})
      *c = StatCounter{wide, wider, wider, wider - wide};
  s.active_blocks = s.segments = StatCounter{12345678901, 12345678901, 12345678901, 0};
  const std::string table = memory::detail::format_summary("probe", s, size_t(1000 * MiB));
  CHECK(table.find(memory::format_bytes(wide)) != std::string::npos);
  std::istringstream lines(table);
  std::string line, first;
  std::getline(lines, first);
  while (std::getline(lines, line)) {
    INFO(line);
    CHECK(line.size() == first.size());
    CHECK(line.back() == '|');
  }
}

// ---- The arena ------------------------------------------------------------------------------

TEST_CASE("probe memory: blocks parked on events: stats and snapshot agree at every step; empty_cache frees them") {
  auto* backend = new EventBackend;
  CachingAllocator a("probe", kCPU, std::unique_ptr<memory::detail::RawBackend>(backend));
  const Stream other{reinterpret_cast<void*>(0x10), kCPU};  // another "stream" of this fake device
  std::vector<DataPtr> p;
  for (size_t n : {size_t(1000), size_t(3000), size_t(1), size_t(5 * MiB), size_t(12 * MiB + 7)})
    p.push_back(a.allocate(n, kHost));
  check_against_snapshot(a, "allocated");
  const int64_t allocated = a.stats().allocated_bytes.current;
  REQUIRE(allocated == int64_t(1024 + 3072 + 512 + 5 * MiB + 12 * MiB + 512));

  // The middle small block and the first large block are used on the other stream.
  REQUIRE(a.record_stream(p[1], other));
  REQUIRE(a.record_stream(p[3], other));
  p[1] = DataPtr();  // parked
  check_against_snapshot(a, "one parked");
  CHECK(a.stats().allocated_bytes.current == allocated - 3072);
  p[0] = DataPtr();  // its free neighbour may not merge with the parked block
  p[2] = DataPtr();
  check_against_snapshot(a, "neighbours of a parked block freed");
  p[3] = DataPtr();
  check_against_snapshot(a, "a large block parked");
  {
    const MemoryStats s = a.stats();
    CHECK(s.allocated_bytes.current == int64_t(12 * MiB + 512));
    CHECK(s.num_frees == 4);
    CHECK(s.small_pool.active_blocks.current == 1);  // the parked small block
  }
  // An allocation polls the events: none has completed, so nothing parked is reused.
  DataPtr q = a.allocate(3000, kHost);
  CHECK(q.get() != nullptr);
  check_against_snapshot(a, "allocated while blocks are parked");
  q = DataPtr();
  backend->complete_all();
  q = a.allocate(100, kHost);  // polls: both parked blocks come back and merge
  check_against_snapshot(a, "events completed");
  q = DataPtr();
  p[4] = DataPtr();
  check_against_snapshot(a, "all freed");
  CHECK(a.stats().allocated_bytes.current == 0);
  CHECK(a.stats().active_blocks.current == 0);
  a.empty_cache();
  check_against_snapshot(a, "after empty_cache");
  CHECK(a.stats().reserved_bytes.current == 0);
  CHECK(a.snapshot().empty());
  CHECK(a.stats().num_segment_frees == a.stats().num_segment_allocs);

  // empty_cache waits for parked blocks instead of leaving their segments behind.
  DataPtr r = a.allocate(2000, kHost);
  REQUIRE(a.record_stream(r, other));
  r = DataPtr();
  CHECK(a.stats().reserved_bytes.current == int64_t(2 * MiB));
  a.empty_cache();
  check_against_snapshot(a, "empty_cache over a parked block");
  CHECK(a.stats().reserved_bytes.current == 0);
  CHECK(a.stats().active_blocks.current == 0);
}

TEST_CASE("probe memory: several threads at once: exact totals at a barrier and at the end, and a trace that pairs") {
  CachingAllocator a("probe", kCPU, memory::detail::make_cpu_backend());
  a.enable_trace(size_t(1) << 16);
  constexpr int kThreads = 4, kPerThread = 200;
  // Thread t allocates sizes(t, i): odd sizes in both pools, rounding edges, 0 and 1 byte.
  auto size_of = [](int t, int i) -> size_t {
    const size_t edges[] = {0, 1, 511, 512, 513, 4097, 100001, MiB, MiB + 1, 3 * MiB + 5};
    return edges[(size_t(i) * 7 + size_t(t)) % std::size(edges)] + (i % 3 == 0 ? size_t(t) : 0);
  };
  int64_t expected_allocated = 0, expected_requested = 0, expected_allocs = 0;
  int64_t small_allocated = 0, small_requested = 0;
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kPerThread; ++i) {
      const size_t n = size_of(t, i);
      if (n == 0) continue;
      expected_allocated += int64_t(rounded(n));
      expected_requested += int64_t(n);
      ++expected_allocs;
      // A small-pool block is exactly its rounded size (the rest is always split off). Large
      // blocks may carry an unsplit remainder (<= 1 MiB), so only the total is exact for them.
      if (rounded(n) <= MiB) small_allocated += int64_t(rounded(n)), small_requested += int64_t(n);
    }
  std::barrier sync(kThreads + 1);
  std::vector<std::vector<DataPtr>> held(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        held[size_t(t)].push_back(a.allocate(size_of(t, i), kHost));
        if (i % 5 == 4) held[size_t(t)].erase(held[size_t(t)].begin() + i / 2 - 1);  // free one, keep its size
      }
      sync.arrive_and_wait();  // all allocated: the main thread checks
      sync.arrive_and_wait();  // checked: free everything
      held[size_t(t)].clear();
    });
  sync.arrive_and_wait();
  {
    // What is held now: the allocations not freed in the loop above.
    int64_t now_requested = 0, now_blocks = 0;
    for (const auto& v : held)
      for (const DataPtr& d : v)
        if (d) now_requested += int64_t(d.size()), ++now_blocks;
    const MemoryStats s = a.stats();
    CHECK(s.requested_bytes.current == now_requested);
    CHECK(s.active_blocks.current == now_blocks);
    check_against_snapshot(a, "at the barrier");
    for (StatCounter PoolStats::*m :
         {&PoolStats::allocated_bytes, &PoolStats::requested_bytes, &PoolStats::reserved_bytes,
          &PoolStats::inactive_split_bytes, &PoolStats::active_blocks, &PoolStats::segments}) {
      CHECK((s.small_pool.*m).current + (s.large_pool.*m).current == (s.*m).current);
      CHECK((s.small_pool.*m).allocated + (s.large_pool.*m).allocated == (s.*m).allocated);
      CHECK((s.small_pool.*m).freed + (s.large_pool.*m).freed == (s.*m).freed);
    }
  }
  sync.arrive_and_wait();
  for (auto& th : threads) th.join();
  const MemoryStats s = a.stats();
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.requested_bytes.current == 0);
  CHECK(s.active_blocks.current == 0);
  CHECK(s.num_allocs == expected_allocs);
  CHECK(s.num_frees == expected_allocs);
  CHECK(s.requested_bytes.allocated == expected_requested);
  CHECK(s.requested_bytes.freed == expected_requested);
  CHECK(s.small_pool.allocated_bytes.allocated == small_allocated);
  CHECK(s.small_pool.requested_bytes.allocated == small_requested);
  CHECK(s.allocated_bytes.allocated >= expected_allocated);
  CHECK(s.allocated_bytes.allocated == s.allocated_bytes.freed);

  // The trace: complete, seq dense, times ordered, every alloc freed once with its sizes,
  // and its running totals replay to the allocator's.
  const auto events = a.trace_events();
  REQUIRE(!events.empty());
  CHECK(events.front().seq == 0);
  std::map<void*, std::pair<size_t, size_t>> live;  // ptr -> (size, requested)
  int64_t allocated = 0, reserved = 0, allocs = 0, frees = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const memory::TraceEvent& e = events[i];
    INFO("event ", i, " ", std::string(memory::to_string(e.action)));
    CHECK(e.seq == i);
    if (i) CHECK(e.time_ns >= events[i - 1].time_ns);
    switch (e.action) {
      case TraceAction::Alloc:
        CHECK(live.count(e.ptr) == 0);
        if (rounded(e.requested) <= MiB) CHECK(e.size == rounded(e.requested));
        else CHECK((e.size >= rounded(e.requested) && e.size - rounded(e.requested) <= MiB));
        live[e.ptr] = {e.size, e.requested}, allocated += int64_t(e.size), ++allocs;
        break;
      case TraceAction::Free:
        REQUIRE(live.count(e.ptr) == 1);
        CHECK(live[e.ptr] == std::make_pair(e.size, e.requested));
        live.erase(e.ptr), allocated -= int64_t(e.size), ++frees;
        break;
      case TraceAction::SegmentAlloc: reserved += int64_t(e.size); break;
      case TraceAction::SegmentFree: reserved -= int64_t(e.size); break;
      default: break;
    }
    CHECK(e.allocated_bytes == allocated);
    CHECK(e.reserved_bytes == reserved);
  }
  CHECK(live.empty());
  CHECK(allocs == expected_allocs);
  CHECK(frees == expected_allocs);
  CHECK(reserved == s.reserved_bytes.current);
}

TEST_CASE("probe memory: the out-of-memory message's numbers are the stats at the throw; a huge request changes none") {
  CachingAllocator a("probe", kCPU, memory::detail::make_cpu_backend());
  a.enable_trace(64);
  DataPtr held = a.allocate(3 * MiB + 1, kHost);  // 20 MiB segment, block 3 MiB + 512
  DataPtr small = a.allocate(777, kHost);         // 2 MiB segment
  DataPtr gone = a.allocate(11 * MiB, kHost);     // 12 MiB segment, freed: cached until the retry
  gone = DataPtr();
  a.set_limit(30 * MiB);
  std::string message;
  try {
    (void)a.allocate(18 * MiB + 3, kHost);  // fits no cached block; 22 + 20 MiB > 30 MiB even after the retry
  } catch (const OutOfMemoryError& e) { message = e.what(); }
  const MemoryStats s = a.stats();
  REQUIRE(!message.empty());
  using memory::format_bytes;
  const int64_t allocated = int64_t(3 * MiB + 512 + 1024), reserved = int64_t(22 * MiB);  // the 12 MiB went back
  CHECK(s.allocated_bytes.current == allocated);
  CHECK(s.reserved_bytes.current == reserved);
  CHECK(message.find("tried to allocate " + format_bytes(int64_t(18 * MiB + 3))) != std::string::npos);
  CHECK(message.find("segment of " + format_bytes(int64_t(20 * MiB))) != std::string::npos);
  CHECK(message.find(format_bytes(allocated) + " allocated, " + format_bytes(reserved) + " reserved, " +
                     format_bytes(reserved - allocated) + " of it cached but free") != std::string::npos);
  CHECK(message.find("memory limit " + format_bytes(int64_t(30 * MiB))) != std::string::npos);
  CHECK(s.num_ooms == 1);
  CHECK(s.num_alloc_retries == 1);
  // The trace's OOM event: the request and the segment it needed (as the message and the
  // profiler's Chrome trace read it), the totals at the throw.
  const auto events = a.trace_events();
  REQUIRE(events.back().action == TraceAction::Oom);
  CHECK(events.back().requested == 18 * MiB + 3);
  CHECK(events.back().size == 20 * MiB);
  CHECK(events.back().allocated_bytes == allocated);
  CHECK(events.back().reserved_bytes == reserved);

  // A request beyond any device: refused before anything moves.
  try {
    (void)a.allocate(std::numeric_limits<size_t>::max() / 2, kHost);
    FAIL("a huge request succeeded");
  } catch (const OutOfMemoryError& e) { message = e.what(); }
  const MemoryStats t = a.stats();
  CHECK(t.num_ooms == 2);
  CHECK(t.allocated_bytes.current == allocated);
  CHECK(t.reserved_bytes.current == reserved);
  CHECK(t.num_allocs == s.num_allocs);
  CHECK(message.find(" -") == std::string::npos);  // no negative number in it
}

TEST_CASE("probe memory: reset_peak on the pinned pool makes every peak its current value") {
  DataPtr a = memory::allocate_pinned(5 * MiB), b = memory::allocate_pinned(1000);
  a = DataPtr();
  memory::reset_pinned_peak();
  const MemoryStats s = memory::pinned_stats();
  for (const PoolStats* p : {static_cast<const PoolStats*>(&s), &s.small_pool, &s.large_pool})
    for (const StatCounter* c : {&p->allocated_bytes, &p->reserved_bytes, &p->requested_bytes, &p->inactive_split_bytes,
                                 &p->active_blocks, &p->segments})
      CHECK(c->peak == c->current);
  CHECK(s.large_pool.allocated_bytes.peak == 0);
  b = DataPtr();
  memory::empty_pinned_cache();
}

// ---- The profiler ---------------------------------------------------------------------------

TEST_CASE("probe memory: the profiler's peak is the true peak even when the ring lost the events around it") {
  memory::empty_cache(kCPU);
  profiler::Session session({.device = kCPU, .trace_capacity = 8});
  memory::reset_peak(kCPU);
  const int64_t base = memory::stats(kCPU).allocated_bytes.current;
  session.start();
  DataPtr big = memory::allocate(kCPU, 30 * MiB);  // the peak, early
  big = DataPtr();
  std::vector<DataPtr> small;
  for (int i = 0; i < 20; ++i) small.push_back(memory::allocate(kCPU, 4096));  // pushes the peak out of the ring
  session.stop();
  const MemoryStats s = memory::stats(kCPU);
  REQUIRE(session.lost_events() > 0);
  CHECK(s.allocated_bytes.peak == base + int64_t(30 * MiB));
  CHECK(session.peak_allocated() == s.allocated_bytes.peak);
  int64_t sum = 0;
  for (const profiler::AllocationGroup& g : session.live_at_peak()) {
    CHECK(g.bytes >= 0);
    sum += g.bytes;
  }
  CHECK(sum == session.peak_allocated());
  CHECK(session.top_allocations_table().find(memory::format_bytes(s.allocated_bytes.peak)) != std::string::npos);
  // The timeline too: bytes no kept event explains are "other", so each point still adds up.
  check_timeline_adds_up(session);
  // At the end what the session started with and the 20 small blocks are live.
  CHECK(session.timeline().back().allocated == base + 20 * int64_t(rounded(4096)));
}

TEST_CASE("probe memory: nested op scopes count each block once, for its innermost op; views add no bytes") {
  profiler::Session session({.device = kCPU});
  memory::reset_peak(kCPU);
  Tensor x = randn({64, 32});
  session.start();
  std::vector<DataPtr> held;
  {
    core::OpScope outer("probe_outer");
    held.push_back(memory::allocate(kCPU, 3000));
    {
      core::OpScope inner("probe_inner");
      held.push_back(memory::allocate(kCPU, 5000));
      {
        core::OpScope innermost("probe_innermost");
        held.push_back(memory::allocate(kCPU, 1));
      }
      held.push_back(memory::allocate(kCPU, 513));
    }
    held.push_back(memory::allocate(kCPU, 100));
  }
  const size_t events_before_views = memory::trace_events(kCPU).size();
  // Views share their base's storage: no allocation.
  Tensor v1 = x.transpose(0, 1), v2 = x.narrow(0, 3, 10), v3 = x.view({32, 64}), v4 = x.select(1, 2);
  Tensor v5 = x.unsqueeze(0).expand({4, 64, 32});
  const size_t events_after_views = memory::trace_events(kCPU).size();
  Tensor w = x.detach().clone().requires_grad_();  // views of a tensor autograd tracks, too
  const size_t events_before_tracked_views = memory::trace_events(kCPU).size();
  Tensor w1 = w.t(), w2 = w.slice(1, 0, 32, 2), w3 = w.flatten(), w4 = w.permute({1, 0}).unflatten(0, {4, 8});
  CHECK(memory::trace_events(kCPU).size() == events_before_tracked_views);
  session.stop();
  CHECK(events_after_views == events_before_views);
  std::map<std::string, int64_t> by_op;
  int64_t sum = 0;
  for (const profiler::AllocationGroup& g : session.live_at_peak()) by_op[g.op] += g.bytes, sum += g.bytes;
  CHECK(by_op["probe_outer"] == int64_t(rounded(3000) + rounded(100)));
  CHECK(by_op["probe_inner"] == int64_t(rounded(5000) + rounded(513)));
  CHECK(by_op["probe_innermost"] == int64_t(rounded(1)));
  CHECK(sum == session.peak_allocated());
  CHECK(session.peak_allocated() == memory::stats(kCPU).allocated_bytes.peak);
  // The op times nest the same way: self times add up to the outermost op's total.
  double self = 0, total_outer = 0;
  for (const profiler::OpTime& t : session.op_times()) {
    if (t.op.rfind("probe_", 0) == 0) self += t.self_ms;
    if (t.op == "probe_outer") total_outer = t.total_ms;
  }
  CHECK(self == doctest::Approx(total_outer).epsilon(1e-9));
}

TEST_CASE("probe memory: over a training step every timeline point's categories add up to its allocated bytes") {
  manual_seed(11);
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(16, 32), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 8)});
  Tensor x = randn({64, 16});
  profiler::Session session({.device = kCPU});
  session.attach(*net, "net");
  memory::reset_peak(kCPU);
  session.start();
  for (int step = 0; step < 2; ++step) {
    Tensor h = (*net)(x);
    Tensor loss = mean(mul(h, h));
    loss.backward();  // the graph's saved activations are freed in backward
  }
  session.stop();
  REQUIRE(session.lost_events() == 0);
  check_timeline_adds_up(session);
  int64_t sum = 0;
  for (const profiler::AllocationGroup& g : session.live_at_peak()) sum += g.bytes;
  CHECK(sum == session.peak_allocated());
  CHECK(session.peak_allocated() == memory::stats(kCPU).allocated_bytes.peak);
  // Gradients exist at the end and are counted once, as gradients, in the last point.
  int64_t grad_bytes = 0;
  for (const Tensor& p : net->parameters()) grad_bytes += int64_t(rounded(p.grad().impl().storage->nbytes));
  CHECK(session.timeline().back().by_category[size_t(core::Category::Gradients)] == grad_bytes);
  // Everything the steps made but their gradients was freed (in backward or at the end of the
  // step): no activation is left, and the session ends its start plus the gradients.
  CHECK(session.timeline().back().by_category[size_t(core::Category::Activations)] == 0);
  CHECK(session.timeline().back().allocated == session.start_allocated() + grad_bytes);
}

TEST_CASE("probe memory: the top allocations table's shown rows, rest row and total add up to the peak") {
  profiler::Session session({.device = kCPU});
  memory::reset_peak(kCPU);
  session.start();
  std::vector<DataPtr> held;
  const char* ops[] = {"probe_a", "probe_b", "probe_c", "probe_d", "probe_e"};
  for (size_t i = 0; i < std::size(ops); ++i) {
    core::OpScope op(ops[i]);
    held.push_back(memory::allocate(kCPU, (i + 1) * 100 * KiB));
  }
  session.stop();
  const auto& groups = session.live_at_peak();
  const size_t n = 2;
  REQUIRE(groups.size() > n);
  int64_t rest = 0, rest_blocks = 0;
  for (size_t i = n; i < groups.size(); ++i) rest += groups[i].bytes, rest_blocks += groups[i].blocks;
  const std::string table = session.top_allocations_table(n);
  CHECK(table.find(std::to_string(groups.size() - n) + " more groups") != std::string::npos);
  CHECK(table.find(memory::format_bytes(rest)) != std::string::npos);
  CHECK(table.find(memory::format_bytes(session.peak_allocated())) != std::string::npos);
  CHECK(groups[0].op == "probe_e");
  CHECK(groups[0].bytes == int64_t(500 * KiB));
  CHECK(table.find(" -") == std::string::npos);  // no negative figure
}

TEST_CASE("probe memory: op self times on two threads at once are each op's total less its direct children's") {
  profiler::Session session({.device = kCPU});
  session.start();
  auto work = [](const char* outer_name, const char* inner_name) {
    for (int i = 0; i < 20; ++i) {
      core::OpScope outer(outer_name);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      {
        core::OpScope inner(inner_name);
        std::this_thread::sleep_for(std::chrono::microseconds(30));
        core::OpScope leaf("probe_leaf");
      }
    }
  };
  std::thread other(work, "probe_outer_b", "probe_inner_b");
  work("probe_outer_a", "probe_inner_a");
  other.join();
  session.stop();
  // Reference: children by interval containment on the same thread, one level down.
  const auto& records = session.op_records();
  std::map<std::string, double> self_ref, total_ref;
  for (const core::OpRecord& r : records) {
    double self = double(r.end_ns - r.start_ns) / 1e6;
    for (const core::OpRecord& c : records)
      if (&c != &r && c.thread == r.thread && c.depth == r.depth + 1 && c.start_ns >= r.start_ns &&
          c.end_ns <= r.end_ns)
        self -= double(c.end_ns - c.start_ns) / 1e6;
    self_ref[r.op] += self;
    total_ref[r.op] += double(r.end_ns - r.start_ns) / 1e6;
  }
  size_t seen = 0;
  for (const profiler::OpTime& t : session.op_times()) {
    if (t.op.rfind("probe_", 0) != 0) continue;
    INFO(t.op);
    ++seen;
    CHECK(t.calls == (t.op == "probe_leaf" ? 40 : 20));
    CHECK(t.self_ms == doctest::Approx(self_ref[t.op]).epsilon(1e-9));
    CHECK(t.total_ms == doctest::Approx(total_ref[t.op]).epsilon(1e-9));
    CHECK(t.self_ms >= 0);
  }
  CHECK(seen == 5);
}
