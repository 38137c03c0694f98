// The caching allocator on cuda:0: the CPU suite's core properties on device
// memory, plus what only a GPU has: cross-stream reuse guarded by events, real
// device out-of-memory, and the page-locked host pool. Exact layout checks use a
// private CachingAllocator over the real CUDA backend; the public API is checked
// through deltas. Streams are held busy with a host function that waits for the
// test's signal, so "work still running" is certain, not a race.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "memory/allocator.h"
#include "memory/caching_allocator.h"

using namespace frugal;
using namespace frugal::memory;

namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;
const Device kGpu = cuda(0);

struct CudaAllocatorFixture {
  CudaAllocatorFixture() { reset(); }
  ~CudaAllocatorFixture() { reset(); }
  static void reset() {
    synchronize(kGpu);
    set_memory_limit(0, kGpu);
    empty_cache(kGpu);
  }
};

// A non-blocking stream (no implicit sync with the legacy default stream).
class TestStream {
 public:
  TestStream() { FRUGAL_CUDA_CHECK(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking)); }
  ~TestStream() {  // blocks cached for this handle must not meet a new stream's work early
    (void)cudaStreamSynchronize(handle_);
    (void)cudaStreamDestroy(handle_);
  }
  cudaStream_t get() const { return handle_; }
  Stream stream() const { return Stream{handle_, kGpu}; }

 private:
  cudaStream_t handle_ = nullptr;
};

// Holds a stream busy until release(): everything queued after it waits.
class StreamBlocker {
 public:
  explicit StreamBlocker(cudaStream_t s) : stream_(s) { FRUGAL_CUDA_CHECK(cudaLaunchHostFunc(s, &wait, this)); }
  ~StreamBlocker() {
    release();
    (void)cudaStreamSynchronize(stream_);
  }
  void release() { released_ = true; }

 private:
  static void CUDART_CB wait(void* self) {
    auto* blocker = static_cast<StreamBlocker*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);  // never hang the suite
    while (!blocker->released_ && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  cudaStream_t stream_;
  std::atomic<bool> released_{false};
};

BlockState state_of(const std::vector<SegmentInfo>& segments, void* ptr) {
  for (const SegmentInfo& seg : segments)
    for (const BlockInfo& b : seg.blocks)
      if (b.ptr == ptr) return b.state;
  FAIL("no block starts at ", ptr);
  return BlockState::Free;
}

// Fills `p` with `value` on the device and reads it back.
bool device_bytes_hold(const DataPtr& p, unsigned char value) {
  FRUGAL_CUDA_CHECK(cudaMemset(p.get(), value, p.size()));
  std::vector<unsigned char> host(p.size());
  FRUGAL_CUDA_CHECK(cudaMemcpy(host.data(), p.get(), p.size(), cudaMemcpyDeviceToHost));
  for (unsigned char c : host)
    if (c != value) return false;
  return true;
}

}  // namespace

TEST_CASE("cuda allocator: split, merge and reuse on a private allocator over cuda:0") {
  memory::detail::CachingAllocator a("cuda:0 (private)", kGpu, memory::detail::make_cuda_device_backend(0));
  const Stream s{nullptr, kGpu};
  DataPtr A = a.allocate(100 * KiB, s);
  DataPtr B = a.allocate(100 * KiB, s);
  DataPtr C = a.allocate(100 * KiB, s);
  CHECK(static_cast<char*>(B.get()) == static_cast<char*>(A.get()) + 100 * KiB);
  CHECK(static_cast<char*>(C.get()) == static_cast<char*>(B.get()) + 100 * KiB);
  CHECK(reinterpret_cast<uintptr_t>(A.get()) % 512 == 0);
  CHECK(a.stats().inactive_split_bytes.current == int64_t(2 * MiB - 300 * KiB));
  CHECK(device_bytes_hold(B, 0x5a));

  void* a_ptr = A.get();
  B = DataPtr();
  A = DataPtr();
  CHECK(a.stats().inactive_split_bytes.current == int64_t(2 * MiB - 100 * KiB));
  DataPtr D = a.allocate(200 * KiB, s);  // the merged A+B block, by best fit
  CHECK(D.get() == a_ptr);
  const int64_t hits = a.stats().cache_hits;
  void* d_ptr = D.get();
  D = DataPtr();
  DataPtr E = a.allocate(200 * KiB, s);
  CHECK(E.get() == d_ptr);
  CHECK(a.stats().cache_hits == hits + 1);
  E = DataPtr();
  C = DataPtr();
  MemoryStats st = a.stats();
  CHECK(st.inactive_split_bytes.current == 0);
  CHECK(st.allocated_bytes.current == 0);
  CHECK(st.reserved_bytes.current == int64_t(2 * MiB));
  a.empty_cache();
  CHECK(a.stats().reserved_bytes.current == 0);
  CHECK(a.stats().num_segment_frees == 1);
}

TEST_CASE_FIXTURE(CudaAllocatorFixture, "cuda allocator: stats return to baseline after frees") {
  const MemoryStats base = stats(kGpu);
  {
    std::vector<DataPtr> ptrs;
    for (size_t n : {size_t(1), 700 * KiB, 3 * MiB, 15 * MiB + 1}) ptrs.push_back(allocate(kGpu, n));
    for (const DataPtr& p : ptrs) CHECK(p.device() == kGpu);
    const MemoryStats s = stats(kGpu);
    CHECK(s.allocated_bytes.current - base.allocated_bytes.current ==
          int64_t(512 + 700 * KiB + 3 * MiB + 15 * MiB + 512));
    CHECK(s.requested_bytes.current - base.requested_bytes.current == int64_t(1 + 700 * KiB + 3 * MiB + 15 * MiB + 1));
    CHECK(device_bytes_hold(ptrs[3], 0x11));
  }
  MemoryStats s = stats(kGpu);
  CHECK(s.allocated_bytes.current == base.allocated_bytes.current);
  CHECK(s.requested_bytes.current == base.requested_bytes.current);
  CHECK(s.active_blocks.current == base.active_blocks.current);
  CHECK(s.reserved_bytes.current > base.reserved_bytes.current);
  empty_cache(kGpu);
  s = stats(kGpu);
  CHECK(s.reserved_bytes.current == base.reserved_bytes.current);
  CHECK(s.num_segment_frees - base.num_segment_frees == s.num_segment_allocs - base.num_segment_allocs);

  reset_peak(kGpu);
  DataPtr five = allocate(kGpu, 5 * MiB);
  five = DataPtr();
  CHECK(stats(kGpu).allocated_bytes.peak == base.allocated_bytes.current + int64_t(5 * MiB));
  CHECK(memory_summary(kGpu).find("device cuda:0") != std::string::npos);
}

TEST_CASE_FIXTURE(CudaAllocatorFixture,
                  "cuda allocator: a block used on another stream is reused only after its event") {
  TestStream s1, s2;
  DataPtr p = allocate(kGpu, 1 * MiB, s1.stream());  // first block of a fresh 2 MiB segment on s1
  void* ptr = p.get();
  (void)allocate(kGpu, 1 * MiB, s2.stream());  // caches a segment for s2: no cudaMalloc while s2 is held
  {
    StreamBlocker busy(s2.get());
    FRUGAL_CUDA_CHECK(cudaMemsetAsync(ptr, 0, 1 * MiB, s2.get()));  // queued behind the blocker
    record_stream(p, s2.stream());
    p = DataPtr();
    CHECK(state_of(snapshot(kGpu), ptr) == BlockState::AwaitingEvents);
    CHECK(stats(kGpu).active_blocks.current >= 1);

    DataPtr while_busy = allocate(kGpu, 1 * MiB, s1.stream());
    CHECK(while_busy.get() != ptr);
    DataPtr other_stream = allocate(kGpu, 1 * MiB, s2.stream());
    CHECK(other_stream.get() != ptr);

    busy.release();
    FRUGAL_CUDA_CHECK(cudaStreamSynchronize(s2.get()));
    DataPtr after = allocate(kGpu, 1 * MiB, s1.stream());  // the event has completed: polled here
    CHECK(after.get() == ptr);
    CHECK(state_of(snapshot(kGpu), ptr) == BlockState::Allocated);

    // empty_cache waits for pending events rather than leaking or reusing early.
    record_stream(after, s2.stream());
    after = DataPtr();
  }
  empty_cache(kGpu);
  for (const SegmentInfo& seg : snapshot(kGpu)) CHECK(seg.stream != static_cast<void*>(s1.get()));
  CHECK_THROWS_AS(record_stream(allocate(kGpu, 16), Stream{nullptr, kCPU}), Error);
}

TEST_CASE_FIXTURE(CudaAllocatorFixture, "cuda allocator: the current stream decides which blocks are reused") {
  TestStream s;
  {
    StreamGuard guard(s.stream());
    CHECK(current_stream(kGpu) == s.stream());
    DataPtr p = allocate(kGpu, 4 * KiB);
    bool found = false;
    for (const SegmentInfo& seg : snapshot(kGpu))
      for (const BlockInfo& b : seg.blocks)
        if (b.ptr == p.get()) found = (seg.stream == static_cast<void*>(s.get()));
    CHECK(found);
  }
  CHECK(current_stream(kGpu) == Stream{nullptr, kGpu});
  synchronize(kGpu);
}

TEST_CASE_FIXTURE(CudaAllocatorFixture, "cuda allocator: a memory cap is enforced and the allocator recovers") {
  const size_t reserved = size_t(stats(kGpu).reserved_bytes.current);
  set_memory_limit(reserved + 1024 * MiB, kGpu);
  const MemoryStats before = stats(kGpu);
  DataPtr first = allocate(kGpu, 600 * MiB);
  const std::string allocated = format_bytes(stats(kGpu).allocated_bytes.current) + " allocated";
  std::string message;
  try {
    (void)allocate(kGpu, 600 * MiB);
  } catch (const OutOfMemoryError& e) { message = e.what(); }
  CHECK(message.find("cuda:0 out of memory: tried to allocate 600.00 MiB") == 0);
  CHECK(message.find(allocated) != std::string::npos);
  CHECK(message.find("memory limit") != std::string::npos);
  CHECK(message.find("device free") != std::string::npos);
  CHECK(stats(kGpu).num_ooms - before.num_ooms == 1);
  CHECK(stats(kGpu).num_alloc_retries - before.num_alloc_retries == 1);

  first = DataPtr();
  DataPtr second = allocate(kGpu, 600 * MiB);
  CHECK(device_bytes_hold(second, 0x33));
  second = DataPtr();
  DataPtr bigger = allocate(kGpu, 800 * MiB);  // 600 cached + 800 > 1024: the retry frees the cache
  CHECK(stats(kGpu).reserved_bytes.current == int64_t(reserved + 800 * MiB));
  CHECK(stats(kGpu).num_ooms - before.num_ooms == 1);

  set_memory_fraction(0.5, kGpu);
  size_t free_bytes = 0, total = 0;
  FRUGAL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  CHECK(memory_limit(kGpu) == size_t(0.5 * double(total)));
}

TEST_CASE_FIXTURE(CudaAllocatorFixture, "cuda allocator: device out of memory is reported, then allocation goes on") {
  const MemoryStats before = stats(kGpu);
  DataPtr held = allocate(kGpu, 64 * MiB);
  const std::string allocated = format_bytes(stats(kGpu).allocated_bytes.current) + " allocated";
  std::string message;
  try {
    (void)allocate(kGpu, size_t(1) << 50);  // 1 PiB
  } catch (const OutOfMemoryError& e) { message = e.what(); }
  CHECK(message.find("tried to allocate 1.00 PiB") != std::string::npos);
  CHECK(message.find(allocated) != std::string::npos);
  CHECK(message.find("device free") != std::string::npos);
  CHECK(message.find("no memory limit set") != std::string::npos);
  CHECK(cudaGetLastError() == cudaSuccess);  // the failed cudaMalloc left no error behind
  DataPtr after = allocate(kGpu, 8 * MiB);
  CHECK(device_bytes_hold(after, 0x44));
  CHECK(stats(kGpu).num_ooms - before.num_ooms == 1);
}

TEST_CASE("cuda allocator: devices beyond the count are named in the error") {
  const int count = cuda_device_count();
  REQUIRE(count >= 1);
  std::string message;
  try {
    (void)allocate(cuda(count), 16);
  } catch (const Error& e) { message = e.what(); }
  CHECK(message.find("allocate: " + cuda(count).str() + " does not exist; this process sees " +
                     std::to_string(count)) == 0);
}

TEST_CASE("cuda allocator: the pinned pool is page-locked and waits for async copies") {
  REQUIRE(pinned_is_page_locked());
  TestStream s;
  DataPtr device = allocate(kGpu, 4 * MiB, s.stream());
  DataPtr host = allocate_pinned(4 * MiB);
  cudaPointerAttributes attributes{};
  FRUGAL_CUDA_CHECK(cudaPointerGetAttributes(&attributes, host.get()));
  CHECK(attributes.type == cudaMemoryTypeHost);
  std::memset(host.get(), 0x77, 4 * MiB);
  void* host_ptr = host.get();
  {
    StreamBlocker busy(s.get());
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(device.get(), host.get(), 4 * MiB, cudaMemcpyHostToDevice, s.get()));
    record_stream(host, s.stream());
    host = DataPtr();
    DataPtr while_copying = allocate_pinned(4 * MiB);  // must not be the buffer the copy still reads
    CHECK(while_copying.get() != host_ptr);
    std::memset(while_copying.get(), 0x00, 4 * MiB);
    busy.release();
    FRUGAL_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    DataPtr after = allocate_pinned(4 * MiB);
    CHECK(after.get() == host_ptr);
  }
  std::vector<unsigned char> back(4 * MiB);
  FRUGAL_CUDA_CHECK(cudaMemcpy(back.data(), device.get(), back.size(), cudaMemcpyDeviceToHost));
  CHECK(std::all_of(back.begin(), back.end(), [](unsigned char c) { return c == 0x77; }));
  CHECK(pinned_stats().allocated_bytes.current == 0);
  CHECK(pinned_memory_summary().find("pinned host memory") != std::string::npos);
}

TEST_CASE_FIXTURE(CudaAllocatorFixture, "cuda allocator: concurrent alloc/free keeps stats consistent") {
  const MemoryStats before = stats(kGpu);
  auto worker = [](int id) {
    std::vector<DataPtr> live;
    for (int i = 0; i < 2000; ++i) {
      if (live.size() < 8 && (i * 7 + id) % 3 != 0)
        live.push_back(allocate(kGpu, size_t(512 * (1 + (i * 131 + id) % 400))));
      else if (!live.empty()) live.erase(live.begin() + (i % live.size()));
    }
  };
  std::vector<std::thread> threads;
  for (int id = 0; id < 4; ++id) threads.emplace_back(worker, id);
  for (auto& t : threads) t.join();
  const MemoryStats s = stats(kGpu);
  CHECK(s.allocated_bytes.current == before.allocated_bytes.current);
  CHECK(s.active_blocks.current == before.active_blocks.current);
  CHECK(s.num_allocs - before.num_allocs == s.num_frees - before.num_frees);
}
