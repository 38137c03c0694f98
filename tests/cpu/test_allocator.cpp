// The caching allocator on the host. Exact layout checks (split, merge, best fit,
// stream-aware reuse, backend failure) run on private CachingAllocator instances,
// so nothing another test holds can change the answer; the public API on kCPU is
// checked through deltas after emptying the cache. References are hand-computed
// from Note [Sizes and pools] and Note [Best fit, split and merge].
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "memory/allocator.h"
#include "memory/asan.h"
#include "memory/caching_allocator.h"
#include "memory/trace.h"
#include "tensor/factory.h"

using namespace frugal;
using namespace frugal::memory;

namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;
constexpr Stream kHostStream{nullptr, kCPU};

// A host backend with a fixed capacity and hand-driven events, so tests can make
// the "system" run out and decide when work on a "stream" completes.
class FakeBackend final : public memory::detail::RawBackend {
 public:
  explicit FakeBackend(size_t capacity) : capacity_(capacity), host_(memory::detail::make_cpu_backend()) {}

  void* allocate_segment(size_t nbytes) override {
    if (used_ + nbytes > capacity_) return nullptr;
    used_ += nbytes;
    return host_->allocate_segment(nbytes);
  }
  void free_segment(void* base, size_t nbytes) override {
    used_ -= nbytes;
#if FRUGAL_ASAN  // a segment must go back unpoisoned (Note [Poisoning host blocks])
    if (__asan_region_is_poisoned(base, nbytes)) ++poisoned_at_release;
#endif
    host_->free_segment(base, nbytes);
  }
  size_t total_memory() const override { return capacity_; }
  std::string memory_info() const override { return "fake free " + format_bytes(int64_t(capacity_ - used_)); }

  struct Event {
    bool done = false;
  };
  void* record_event(Stream) override {
    events_.push_back(new Event);
    return events_.back();
  }
  bool event_completed(void* e) override { return static_cast<Event*>(e)->done; }
  void wait_event(void* e) override {
    static_cast<Event*>(e)->done = true;
    ++waits;
  }
  void release_event(void* e) override {
    events_.erase(std::find(events_.begin(), events_.end(), e));
    delete static_cast<Event*>(e);
  }
  void complete_all_events() {
    for (Event* e : events_) e->done = true;
  }
  size_t used() const { return used_; }
  int waits = 0;
  int poisoned_at_release = 0;  // segments given back with ASan poison left on them

 private:
  size_t capacity_;
  size_t used_ = 0;
  std::unique_ptr<memory::detail::RawBackend> host_;
  std::vector<Event*> events_;
};

struct PrivateAllocator {
  FakeBackend* backend;
  memory::detail::CachingAllocator allocator;
  explicit PrivateAllocator(size_t capacity = 1024 * MiB)
      : backend(new FakeBackend(capacity)),
        allocator("test", kCPU, std::unique_ptr<memory::detail::RawBackend>(backend)) {}
};

// Public-API tests start and end with no cap and an empty CPU cache.
struct CpuAllocatorFixture {
  CpuAllocatorFixture() { reset(); }
  ~CpuAllocatorFixture() { reset(); }
  static void reset() {
    set_memory_limit(0, kCPU);
    empty_cache(kCPU);
  }
};

char* at(const DataPtr& p, size_t offset = 0) { return static_cast<char*>(p.get()) + offset; }

// The state of the block at `ptr` in a snapshot (Free if there is no such block start).
BlockState state_of(const std::vector<SegmentInfo>& segments, void* ptr) {
  for (const SegmentInfo& seg : segments)
    for (const BlockInfo& b : seg.blocks)
      if (b.ptr == ptr) return b.state;
  FAIL("no block starts at ", ptr);
  return BlockState::Free;
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * fraction);
  return buf;
}

}  // namespace

TEST_CASE("allocator: format_bytes") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(int64_t(1.5 * MiB)) == "1.50 MiB");
  CHECK(format_bytes(int64_t(2) << 30) == "2.00 GiB");
  CHECK(format_bytes(-int64_t(3 * MiB)) == "-3.00 MiB");
}

TEST_CASE("allocator: request rounding and segment sizes (Note [Sizes and pools])") {
  CHECK(memory::detail::round_size(1) == 512);
  CHECK(memory::detail::round_size(512) == 512);
  CHECK(memory::detail::round_size(513) == 1024);
  CHECK(memory::detail::round_size(100000) == 100352);  // 196 * 512
  CHECK(memory::detail::segment_size(512) == 2 * MiB);
  CHECK(memory::detail::segment_size(1 * MiB) == 2 * MiB);
  CHECK(memory::detail::segment_size(1 * MiB + 512) == 20 * MiB);
  CHECK(memory::detail::segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(memory::detail::segment_size(10 * MiB) == 10 * MiB);
  CHECK(memory::detail::segment_size(11 * MiB + 512) == 12 * MiB);
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: allocate rounds, aligns and counts requested bytes") {
  const MemoryStats before = stats(kCPU);
  DataPtr p = allocate(kCPU, 1);
  DataPtr q = allocate(kCPU, 1000);
  CHECK(p.size() == 1);
  CHECK(q.size() == 1000);
  CHECK(p.device() == kCPU);
  CHECK(reinterpret_cast<uintptr_t>(p.get()) % 512 == 0);
  CHECK(reinterpret_cast<uintptr_t>(q.get()) % 512 == 0);
  const MemoryStats s = stats(kCPU);
  CHECK(s.allocated_bytes.current - before.allocated_bytes.current == 512 + 1024);
  CHECK(s.small_pool.allocated_bytes.current - before.small_pool.allocated_bytes.current == 512 + 1024);
  CHECK(s.requested_bytes.current - before.requested_bytes.current == 1 + 1000);
  CHECK(s.active_blocks.current - before.active_blocks.current == 2);
  CHECK(s.num_allocs - before.num_allocs == 2);
  std::memset(p.get(), 1, 1);
  std::memset(q.get(), 2, 1000);  // the memory is really there
}

TEST_CASE("allocator: split and merge within one segment") {
  PrivateAllocator t;
  auto& a = t.allocator;
  DataPtr A = a.allocate(100 * KiB, kHostStream);
  DataPtr B = a.allocate(100 * KiB, kHostStream);
  DataPtr C = a.allocate(100 * KiB, kHostStream);
  // One 2 MiB small segment, carved in address order.
  CHECK(at(B) == at(A, 100 * KiB));
  CHECK(at(C) == at(B, 100 * KiB));
  MemoryStats s = a.stats();
  CHECK(s.segments.current == 1);
  CHECK(s.reserved_bytes.current == int64_t(2 * MiB));
  CHECK(s.inactive_split_bytes.current == int64_t(2 * MiB - 300 * KiB));  // the tail after C

  void* a_ptr = A.get();
  B = DataPtr();
  CHECK(a.stats().inactive_split_bytes.current == int64_t(2 * MiB - 200 * KiB));
  A = DataPtr();  // merges with B's block
  CHECK(a.stats().inactive_split_bytes.current == int64_t(2 * MiB - 100 * KiB));
  auto segments = a.snapshot();
  REQUIRE(segments.size() == 1);
  REQUIRE(segments[0].blocks.size() == 3);
  CHECK(segments[0].blocks[0].ptr == a_ptr);
  CHECK(segments[0].blocks[0].size == 200 * KiB);
  CHECK(segments[0].blocks[0].state == BlockState::Free);
  CHECK(segments[0].blocks[1].state == BlockState::Allocated);
  CHECK(segments[0].blocks[1].requested == 100 * KiB);

  // Best fit: 200 KiB fits the merged block exactly, not the larger tail.
  DataPtr D = a.allocate(200 * KiB, kHostStream);
  CHECK(D.get() == a_ptr);
  D = DataPtr();
  C = DataPtr();  // everything merges back into one block spanning the segment
  s = a.stats();
  CHECK(s.inactive_split_bytes.current == 0);
  CHECK(a.snapshot()[0].blocks.size() == 1);
  CHECK(s.allocated_bytes.current == 0);
  CHECK(s.active_blocks.current == 0);
  CHECK(s.reserved_bytes.current == int64_t(2 * MiB));
  CHECK(s.num_segment_allocs == 1);
}

TEST_CASE("allocator: large pool splits only remainders over 1 MiB") {
  PrivateAllocator t;
  auto& a = t.allocator;
  DataPtr p = a.allocate(19 * MiB + 512, kHostStream);  // 20 MiB segment, remainder < 1 MiB: not split
  auto seg = a.snapshot();
  REQUIRE(seg.size() == 1);
  CHECK(seg[0].blocks.size() == 1);
  CHECK(a.stats().large_pool.allocated_bytes.current == int64_t(20 * MiB));
  DataPtr q = a.allocate(2 * MiB, kHostStream);  // a second 20 MiB segment, split 2 + 18
  CHECK(a.snapshot().size() == 2);
  CHECK(a.stats().large_pool.inactive_split_bytes.current == int64_t(18 * MiB));
  CHECK(a.stats().large_pool.fragmentation() == doctest::Approx(18.0 / 40.0));
}

TEST_CASE("allocator: fragmentation is inactive split over reserved") {
  PrivateAllocator t;
  auto& a = t.allocator;
  DataPtr A = a.allocate(512 * KiB, kHostStream);
  DataPtr B = a.allocate(512 * KiB, kHostStream);
  DataPtr C = a.allocate(512 * KiB, kHostStream);
  DataPtr big = a.allocate(12 * MiB, kHostStream);  // its own 12 MiB large segment, whole
  B = DataPtr();
  // Trapped: B (512 KiB) and the tail (512 KiB) of the 2 MiB segment; reserved 14 MiB.
  const MemoryStats s = a.stats();
  CHECK(s.inactive_split_bytes.current == int64_t(1 * MiB));
  CHECK(s.fragmentation() == doctest::Approx(1.0 / 14.0));
  CHECK(s.small_pool.fragmentation() == doctest::Approx(0.5));
  CHECK(s.large_pool.fragmentation() == 0.0);
}

TEST_CASE("allocator: a freed block is reused on its stream and counted as a cache hit") {
  PrivateAllocator t;
  auto& a = t.allocator;
  void* first = a.allocate(3000, kHostStream).get();  // freed at once
  const int64_t hits = a.stats().cache_hits;
  DataPtr again = a.allocate(3000, kHostStream);
  CHECK(again.get() == first);
  CHECK(a.stats().cache_hits == hits + 1);
  CHECK(a.stats().num_segment_allocs == 1);
}

TEST_CASE("allocator: stream-aware reuse waits for events (Note [Stream-aware reuse])") {
  PrivateAllocator t;
  auto& a = t.allocator;
  const Stream s1{reinterpret_cast<void*>(0x1), kCPU};
  const Stream s2{reinterpret_cast<void*>(0x2), kCPU};

  void* on_s1 = a.allocate(4096, s1).get();
  DataPtr other = a.allocate(4096, s2);
  CHECK(other.get() != on_s1);  // a block freed on s1 is not handed to s2
  CHECK(a.stats().segments.current == 2);

  DataPtr p = a.allocate(4096, s1);
  CHECK(p.get() == on_s1);
  CHECK(a.record_stream(p, s2));
  CHECK(a.record_stream(p, s1));  // its own stream: nothing to wait for
  void* used_on_s2 = p.get();
  p = DataPtr();
  CHECK(state_of(a.snapshot(), used_on_s2) == BlockState::AwaitingEvents);
  CHECK(a.stats().active_blocks.current == 2);  // parked blocks are still active
  CHECK(a.stats().allocated_bytes.current == 4096);

  DataPtr while_pending = a.allocate(4096, s1);
  CHECK(while_pending.get() != used_on_s2);
  t.backend->complete_all_events();
  DataPtr after = a.allocate(4096, s1);  // events are polled at allocation
  CHECK(after.get() == used_on_s2);

  // empty_cache waits for pending events instead of polling them.
  CHECK(a.record_stream(after, s2));
  after = DataPtr();
  while_pending = DataPtr();
  other = DataPtr();
  a.empty_cache();
  CHECK(t.backend->waits == 1);
  CHECK(a.stats().reserved_bytes.current == 0);
  CHECK(t.backend->used() == 0);
}

TEST_CASE("allocator: backend out of memory frees the cache, retries, then throws") {
  PrivateAllocator t(24 * MiB);
  auto& a = t.allocator;
  DataPtr held = a.allocate(12 * MiB, kHostStream);  // 12 MiB segment
  std::string message;
  try {
    (void)a.allocate(14 * MiB, kHostStream);  // needs a 14 MiB segment: only 12 MiB left
  } catch (const OutOfMemoryError& e) { message = e.what(); }
  CHECK(message.find("test out of memory") != std::string::npos);
  CHECK(message.find("tried to allocate 14.00 MiB") != std::string::npos);
  CHECK(message.find("12.00 MiB allocated, 12.00 MiB reserved, 0 B of it cached but free") != std::string::npos);
  CHECK(message.find("no memory limit set") != std::string::npos);
  CHECK(message.find("fake free 12.00 MiB") != std::string::npos);
  MemoryStats s = a.stats();
  CHECK(s.num_ooms == 1);
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.allocated_bytes.current == int64_t(12 * MiB));

  held = DataPtr();  // now cached, too small to reuse: the retry must give it back to make room
  DataPtr p = a.allocate(14 * MiB, kHostStream);
  s = a.stats();
  CHECK(s.num_alloc_retries == 2);
  CHECK(s.num_ooms == 1);
  CHECK(s.num_segment_frees == 1);
  CHECK(s.reserved_bytes.current == int64_t(14 * MiB));
  CHECK(t.backend->used() == 14 * MiB);
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: stats return to baseline; reserved stays until empty_cache") {
  const MemoryStats base = stats(kCPU);
  {
    std::vector<DataPtr> ptrs;
    for (size_t n : {size_t(1), 700 * KiB, 3 * MiB, 15 * MiB + 1}) ptrs.push_back(allocate(kCPU, n));
    const MemoryStats s = stats(kCPU);
    CHECK(s.allocated_bytes.current - base.allocated_bytes.current ==
          int64_t(512 + 700 * KiB + 3 * MiB + 15 * MiB + 512));
    CHECK(s.requested_bytes.current - base.requested_bytes.current == int64_t(1 + 700 * KiB + 3 * MiB + 15 * MiB + 1));
    CHECK(s.large_pool.active_blocks.current - base.large_pool.active_blocks.current == 2);
    CHECK(s.reserved_bytes.current > base.reserved_bytes.current);
  }
  MemoryStats s = stats(kCPU);
  CHECK(s.allocated_bytes.current == base.allocated_bytes.current);
  CHECK(s.requested_bytes.current == base.requested_bytes.current);
  CHECK(s.active_blocks.current == base.active_blocks.current);
  CHECK(s.num_frees - base.num_frees == 4);
  CHECK(s.reserved_bytes.current > base.reserved_bytes.current);  // cached
  empty_cache(kCPU);
  s = stats(kCPU);
  CHECK(s.reserved_bytes.current == base.reserved_bytes.current);
  CHECK(s.segments.current == base.segments.current);
  CHECK(s.num_segment_frees - base.num_segment_frees == s.num_segment_allocs - base.num_segment_allocs);
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: peak and reset_peak") {
  reset_peak(kCPU);
  const int64_t base = stats(kCPU).allocated_bytes.current;
  DataPtr five = allocate(kCPU, 5 * MiB);
  DataPtr three = allocate(kCPU, 3 * MiB);
  five = DataPtr();
  MemoryStats s = stats(kCPU);
  CHECK(s.allocated_bytes.current == base + int64_t(3 * MiB));
  CHECK(s.allocated_bytes.peak == base + int64_t(8 * MiB));
  CHECK(s.large_pool.allocated_bytes.peak - s.large_pool.allocated_bytes.current == int64_t(5 * MiB));
  reset_peak(kCPU);
  s = stats(kCPU);
  CHECK(s.allocated_bytes.peak == s.allocated_bytes.current);
  CHECK(s.reserved_bytes.peak == s.reserved_bytes.current);

  reset_stats(kCPU);
  s = stats(kCPU);
  CHECK(s.num_allocs == 0);
  CHECK(s.allocated_bytes.allocated == 0);
  CHECK(s.allocated_bytes.current == base + int64_t(3 * MiB));  // current values are facts
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: memory limit is enforced, reported, and recoverable") {
  const size_t reserved = size_t(stats(kCPU).reserved_bytes.current);
  set_memory_limit(reserved + 24 * MiB, kCPU);
  CHECK(memory_limit(kCPU) == reserved + 24 * MiB);
  const MemoryStats before = stats(kCPU);

  DataPtr first = allocate(kCPU, 16 * MiB);
  std::string message;
  try {
    (void)allocate(kCPU, 16 * MiB);
  } catch (const OutOfMemoryError& e) { message = e.what(); }
  CHECK(message.find("cpu out of memory") != std::string::npos);
  CHECK(message.find("tried to allocate 16.00 MiB") != std::string::npos);
  CHECK(message.find("memory limit") != std::string::npos);
  CHECK(message.find("host free") != std::string::npos);
  MemoryStats s = stats(kCPU);
  CHECK(s.num_ooms - before.num_ooms == 1);
  CHECK(s.num_alloc_retries - before.num_alloc_retries == 1);

  first = DataPtr();
  DataPtr second = allocate(kCPU, 16 * MiB);  // recovers: reuses the cached segment
  CHECK(stats(kCPU).num_ooms - before.num_ooms == 1);
  second = DataPtr();
  DataPtr bigger = allocate(kCPU, 20 * MiB);  // 16 cached + 20 > 24: the retry frees the cache
  s = stats(kCPU);
  CHECK(s.num_alloc_retries - before.num_alloc_retries == 2);
  CHECK(s.num_ooms - before.num_ooms == 1);
  CHECK(s.reserved_bytes.current == int64_t(reserved + 20 * MiB));

  set_memory_fraction(0.5, kCPU);
  CHECK(memory_limit(kCPU) == size_t(0.5 * double(memory::detail::host_physical_memory())));
  CHECK_THROWS_AS(set_memory_fraction(1.5, kCPU), Error);
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: zero-byte allocations own nothing") {
  const MemoryStats before = stats(kCPU);
  {
    DataPtr p = allocate(kCPU, 0);
    CHECK(p.size() == 0);
    CHECK(p.get() == nullptr);
    CHECK(p.device() == kCPU);
    record_stream(p, current_stream(kCPU));
  }
  const MemoryStats after = stats(kCPU);
  CHECK(after.num_allocs == before.num_allocs);
  CHECK(after.allocated_bytes.current == before.allocated_bytes.current);
}

TEST_CASE("allocator: CUDA devices that do not exist are named in the error") {
  std::string message;
  try {
    (void)allocate(cuda(7), 16);
  } catch (const Error& e) { message = e.what(); }
  CHECK(message.find("allocate: ") == 0);
  CHECK(message.find("cuda:7") != std::string::npos);
#if !FRUGAL_WITH_CUDA
  try {
    (void)allocate(cuda(0), 16);
  } catch (const Error& e) { message = e.what(); }
  CHECK(message.find("allocate: frugal was built without CUDA (device cuda:0)") == 0);
#else
  CHECK(message.find(std::to_string(cuda_device_count()) + " CUDA device(s)") != std::string::npos);
#endif
  CHECK_THROWS_AS(set_current_stream(Stream{reinterpret_cast<void*>(0x1), kCPU}), Error);
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: memory_summary and print_memory_usage") {
  DataPtr p = allocate(kCPU, 3 * MiB);
  const std::string table = memory_summary(kCPU);
  for (const char* row :
       {"Allocated memory", "Requested memory", "Reserved memory", "Inactive split memory", "Active blocks", "Segments",
        "from small pool", "from large pool", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed", "cache hits",
        "alloc retries", "OOMs", "Memory limit none", "fragmentation", "device cpu"})
    CHECK_MESSAGE(table.find(row) != std::string::npos, row);
  std::ostringstream line;
  print_memory_usage(kCPU, line);
  const MemoryStats s = stats(kCPU);
  CHECK(line.str() == "cpu allocated " + format_bytes(s.allocated_bytes.current) + " (peak " +
                          format_bytes(s.allocated_bytes.peak) + ") reserved " +
                          format_bytes(s.reserved_bytes.current) + ", frag " + percent(s.fragmentation()) + "\n");
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: snapshot shows live and cached blocks") {
  DataPtr p = allocate(kCPU, 100 * KiB);
  void* ptr = p.get();
  CHECK(state_of(snapshot(kCPU), ptr) == BlockState::Allocated);
  bool found = false;
  for (const SegmentInfo& seg : snapshot(kCPU)) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.ptr != ptr) continue;
      found = true;
      CHECK(b.requested == 100 * KiB);
      CHECK(b.size == 100 * KiB);
      CHECK(seg.small_pool);
      CHECK(static_cast<char*>(ptr) < static_cast<char*>(seg.base) + seg.size);
    }
  }
  CHECK(found);
  p = DataPtr();
  CHECK(state_of(snapshot(kCPU), ptr) == BlockState::Free);
}

TEST_CASE("allocator: trace records tagged events in a ring") {
  PrivateAllocator t;
  auto& a = t.allocator;
  a.enable_trace(4);
  {
    TraceTag tag("forward");
    DataPtr p = a.allocate(1000, kHostStream);  // segment_alloc, alloc
    {
      TraceTag inner("layer1.attention.query.weight.grad");  // longer than the capacity: truncated
      CHECK(std::string(TraceTag::current()) == std::string("layer1.attention.query.weight.grad").substr(0, 31));
    }
    CHECK(std::string(TraceTag::current()) == "forward");
  }  // free
  auto events = a.trace_events();
  REQUIRE(events.size() == 3);
  CHECK(events[0].action == TraceAction::SegmentAlloc);
  CHECK(events[0].size == 2 * MiB);
  CHECK(events[1].action == TraceAction::Alloc);
  CHECK(events[1].size == 1024);
  CHECK(events[1].requested == 1000);
  CHECK(events[1].allocated_bytes == 1024);
  CHECK(std::string(events[1].tag) == "forward");
  CHECK(events[2].action == TraceAction::Free);
  CHECK(events[2].allocated_bytes == 0);
  CHECK(std::string(TraceTag::current()).empty());

  for (int i = 0; i < 5; ++i) (void)a.allocate(512, kHostStream);  // 10 more events; the ring keeps 4
  events = a.trace_events();
  REQUIRE(events.size() == 4);
  CHECK(events.front().seq == 9);
  CHECK(events.back().seq == 12);
  CHECK(events.back().action == TraceAction::Free);
  const std::string json = trace_to_json(events);
  CHECK(json.find("\"action\": \"free\"") != std::string::npos);
  CHECK(json.find("\"seq\": 12") != std::string::npos);
  CHECK(trace_to_text(events).find("alloc") != std::string::npos);
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: pinned pool has its own stats") {
  const MemoryStats cpu_before = stats(kCPU);
  const MemoryStats before = pinned_stats();
  DataPtr p = allocate_pinned(1000);
  REQUIRE(p.get() != nullptr);
  CHECK(p.size() == 1000);
  CHECK(p.device() == kCPU);
  std::memset(p.get(), 7, 1000);
  CHECK(pinned_stats().allocated_bytes.current - before.allocated_bytes.current == 1024);
  CHECK(stats(kCPU).allocated_bytes.current == cpu_before.allocated_bytes.current);
  record_stream(p, kHostStream);
  CHECK(pinned_memory_summary().find("pinned host memory") != std::string::npos);
  p = DataPtr();
  CHECK(pinned_stats().allocated_bytes.current == before.allocated_bytes.current);
  CHECK(allocate_pinned(0).get() == nullptr);
}

// Compiled in every build, run only under ASan: elsewhere doctest reports it skipped.
TEST_CASE_FIXTURE(CpuAllocatorFixture,
                  "allocator: under ASan, bytes past the request and cached blocks are poisoned "
                  "(Note [Poisoning host blocks])" *
                      doctest::skip(!memory::detail::kAsan)) {
#if FRUGAL_ASAN
  auto poisoned = [](const void* p) { return __asan_address_is_poisoned(p) != 0; };
  auto addressable = [](const void* p, size_t n) {
    return __asan_region_is_poisoned(const_cast<void*>(p), n) == nullptr;
  };

  SUBCASE("a tensor: its requested bytes, not its rounding tail, not once freed") {
    Tensor t = empty({250});  // 1000 bytes in a 1024-byte block
    const char* p = static_cast<const char*>(t.data());
    CHECK(addressable(p, 1000));
    CHECK(poisoned(p + 1000));  // the byte just past the request
    CHECK(poisoned(p + 1023));
    t = Tensor();
    CHECK(state_of(snapshot(kCPU), const_cast<char*>(p)) == BlockState::Free);  // cached, still mapped
    CHECK(poisoned(p));
    CHECK(poisoned(p + 999));
  }
  SUBCASE("the end is exact within an 8-byte granule; the free rest of the segment is poisoned") {
    PrivateAllocator a;
    DataPtr d = a.allocator.allocate(1001, kHostStream);
    CHECK(addressable(at(d), 1001));
    CHECK(poisoned(at(d, 1001)));
    CHECK(poisoned(at(d, 1024)));         // the split-off free block
    CHECK(poisoned(at(d, 2 * MiB - 1)));  // the segment's last byte
  }
  SUBCASE("a cached block is unpoisoned exactly on reuse; merged neighbours stay poisoned") {
    PrivateAllocator a;
    DataPtr d = a.allocator.allocate(4096, kHostStream);
    DataPtr e = a.allocator.allocate(512, kHostStream);
    char* p = at(d);
    d = DataPtr();
    CHECK(state_of(a.allocator.snapshot(), p) == BlockState::Free);
    CHECK(poisoned(p));
    CHECK(poisoned(p + 4095));
    CHECK(addressable(at(e), 512));                      // the live neighbour is untouched
    DataPtr f = a.allocator.allocate(100, kHostStream);  // best fit: the freed 4096-byte block
    REQUIRE(at(f) == p);
    CHECK(addressable(p, 100));
    CHECK(poisoned(p + 100));
    f = DataPtr();
    e = DataPtr();  // merges the segment back into one free block
    CHECK(poisoned(p));
    CHECK(poisoned(p + 4096));
  }
  SUBCASE("segments go back to the system unpoisoned") {
    PrivateAllocator a;
    {
      DataPtr small = a.allocator.allocate(300, kHostStream);
      DataPtr large = a.allocator.allocate(3 * MiB + 5, kHostStream);
    }
    a.allocator.empty_cache();
    CHECK(a.backend->used() == 0);
    CHECK(a.backend->poisoned_at_release == 0);
  }
  SUBCASE("the pinned pool") {
    DataPtr p = allocate_pinned(100);
    CHECK(addressable(at(p), 100));
    CHECK(poisoned(at(p, 100)));
  }
#else
  FAIL("not an ASan build: nothing to check (run tools/sanitize.sh asan)");
#endif
}

TEST_CASE_FIXTURE(CpuAllocatorFixture, "allocator: concurrent alloc/free keeps blocks disjoint and stats consistent") {
  const MemoryStats before = stats(kCPU);
  constexpr int kThreads = 4, kIterations = 3000;
  std::atomic<int> corrupted{0};
  auto worker = [&corrupted](int id) {
    std::mt19937 rng(id);
    std::uniform_int_distribution<size_t> size(1, 64 * KiB);
    std::vector<DataPtr> live;
    for (int i = 0; i < kIterations; ++i) {
      if (live.size() < 8 && (live.empty() || rng() % 2)) {
        DataPtr p = allocate(kCPU, i % 97 == 0 ? 3 * MiB : size(rng));
        std::memset(p.get(), id, p.size());  // a shared byte would be overwritten by another thread
        live.push_back(std::move(p));
      } else {
        size_t k = rng() % live.size();
        const auto* bytes = static_cast<const unsigned char*>(live[k].get());
        if (!std::all_of(bytes, bytes + live[k].size(), [id](unsigned char c) { return c == id; })) ++corrupted;
        live.erase(live.begin() + long(k));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int id = 1; id <= kThreads; ++id) threads.emplace_back(worker, id);
  for (auto& th : threads) th.join();
  CHECK(corrupted == 0);
  const MemoryStats s = stats(kCPU);
  CHECK(s.allocated_bytes.current == before.allocated_bytes.current);
  CHECK(s.requested_bytes.current == before.requested_bytes.current);
  CHECK(s.active_blocks.current == before.active_blocks.current);
  CHECK(s.num_allocs - before.num_allocs == s.num_frees - before.num_frees);
  CHECK(s.allocated_bytes.allocated - before.allocated_bytes.allocated ==
        s.allocated_bytes.freed - before.allocated_bytes.freed);
  empty_cache(kCPU);
  CHECK(stats(kCPU).reserved_bytes.current == before.reserved_bytes.current);
}
