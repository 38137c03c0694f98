#pragma once
// Internal: the arena (caching) allocator. One instance per device (and one for
// the pinned host pool), over a RawBackend that supplies segments. Device-agnostic:
// the policy below is the same for CUDA and host memory.
//
// Note [Sizes and pools]
// ~~~~~~~~~~~~~~~~~~~~~~
// Following PyTorch's CUDACachingAllocator:
//  * requests are rounded up to a multiple of 512 bytes (kMinBlockSize), so blocks
//    stay aligned and near-equal sizes share cached blocks;
//  * requests <= 1 MiB (kSmallSize) go to the small pool, whose segments are 2 MiB
//    (kSmallBuffer); larger ones go to the large pool: under 10 MiB (kMinLargeAlloc)
//    they get a 20 MiB segment (kLargeBuffer) that several such requests can share,
//    otherwise a segment of the request rounded up to 2 MiB (kRoundLarge);
//  * keeping small blocks apart stops them from pinning large segments that could
//    otherwise be given back, which is most of the fragmentation fight.
//
// Note [Best fit, split and merge]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each pool keeps its free blocks in a set ordered by (stream, size, address);
// lower_bound finds the smallest block on the right stream that fits. If the rest
// of it is worth keeping (>= 512 B in the small pool, > 1 MiB in the large pool,
// where a smaller remainder would only be an unusable sliver) it is split off as a
// new free block. Blocks of one segment form a doubly linked list in address order;
// a block that is freed merges with free neighbours, so a segment whose blocks are
// all free is one block again and can be given back by empty_cache. Free blocks of a
// segment that is partly in use are "inactive split" bytes: cached but not
// releasable, the measure of fragmentation (MemoryStats::fragmentation()).
//
// Note [Stream-aware reuse]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A block belongs to the stream it was allocated on, and a freed block is reused
// only by allocations on that stream: work on one stream runs in order, so a
// kernel queued after the free cannot overtake one queued before it that still
// reads the block. Nothing is synchronised on free. If the block was also used on
// other streams (record_stream), ordering on its own stream is not enough: at free
// we record an event on each of those streams and park the block (AwaitingEvents);
// allocations poll the parked events (lazily, cheapest first per stream since
// events on one stream complete in order) and return a block to its pool once all
// of its events have completed. empty_cache and the out-of-memory path wait for
// the events instead. The host has one stream and never parks a block.
//
// Note [Out of memory]
// ~~~~~~~~~~~~~~~~~~~~
// When no cached block fits, a new segment is needed. If the backend has no memory
// or the segment would take reserved bytes past the cap (set_memory_limit), we wait
// for parked blocks, give back every wholly free segment of all streams and pools,
// and try once more (num_alloc_retries). If that fails too we count num_ooms and
// throw OutOfMemoryError saying what was asked and what is allocated, reserved,
// cached and free. Nothing is half-done at the throw, so the caller can free
// tensors and allocate again.
//
// Note [Poisoning host blocks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Host segments come from mmap (or cudaHostAlloc) and are carved up here, so to
// AddressSanitizer a segment is one addressable mapping: a kernel that writes past
// a tensor's end lands in the rounding tail or a neighbouring block, and nothing is
// reported. Under ASan (memory/asan.h; the calls compile to nothing otherwise) an
// allocator of host memory (device kCPU: the CPU allocator and the pinned pool;
// device memory has no host shadow) keeps ASan's shadow in step with block states:
//  * a new segment is poisoned whole, so every free block is unaddressable;
//  * allocate unpoisons exactly the requested [ptr, ptr + nbytes); the rounding
//    tail up to the block's size stays poisoned;
//  * free poisons the whole block, so a use after free is reported while the block
//    sits in the cache or is parked on events (until it is handed out again: there
//    is no quarantine);
//  * a segment is unpoisoned before it goes back to the system, whose next mapping
//    at that address must start addressable (not every ASan runtime's munmap
//    interceptor clears the shadow).
// We poison rather than bypass the cache with a malloc per tensor (which would get
// ASan's redzones and quarantine) so that the rounding, split, merge and best-fit
// code stays the code under test, with the same sizes and pointers as in a normal
// build: the allocator's tests keep their hand-computed layouts under ASan.
// Granularity: ASan keeps one shadow byte per 8-byte granule, saying "the first k
// bytes are addressable", so a region can end mid-granule but not start there.
// Every block starts 512-aligned (page-aligned segments, sizes in multiples of
// 512), hence on a granule boundary, and the end of the request is exact to the
// byte: for nbytes = 1001, byte 1000 is addressable and byte 1001 is not. The slack
// that remains is the missing redzone: a request that fills its block exactly
// (nbytes a multiple of 512) has no tail, so its overrun is reported when the next
// block is free or cached, but not when that block is live.
//
// Note [Graph pools]
// ~~~~~~~~~~~~~~~~~~
// A CUDA graph replays its kernels on the addresses they had at capture, so the memory
// the capture allocated must stay the graph's, and nothing the graph reads may be handed
// to anyone else while it lives. Blocks are keyed by a stream handle (Note [Stream-aware
// reuse]); a graph pool is a key that is no stream, the graph's pool_key
// (core/graph_capture.h), and while its capture runs on this thread:
//  * allocations on the captured stream (and every pinned allocation of that thread: an
//    upload's staging buffer, read again at each replay) are made under that key, so
//    they come from segments only the graph uses;
//  * a device block of the pool freed during the capture goes back to the pool and may
//    serve a later allocation of the same capture: the captured stream runs them in order;
//  * any other block this thread frees during the capture - one allocated before it, or a
//    pinned one, whose contents a replay reads as they were when captured - is held, not
//    reused, until the pool is released;
//  * parked blocks are not polled (cudaEventQuery is illegal while capturing), and running
//    out of memory throws at once instead of waiting for events and freeing segments.
// After the capture, freed pool blocks go back to the pool, which nothing else draws
// from. release_graph_pool (the graph destroyed, its replays finished) gives the pool's
// segments to the captured stream and frees the held blocks as usual.
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/data_ptr.h"
#include "core/stream.h"
#include "memory/asan.h"
#include "memory/backend.h"
#include "memory/stats.h"
#include "memory/trace.h"

namespace frugal::memory::detail {

inline constexpr size_t kMinBlockSize = 512;            // rounding unit and smallest block
inline constexpr size_t kSmallSize = 1 << 20;           // largest request served by the small pool
inline constexpr size_t kSmallBuffer = 2 << 20;         // small-pool segment size
inline constexpr size_t kLargeBuffer = 20 << 20;        // segment for large requests under kMinLargeAlloc
inline constexpr size_t kMinLargeAlloc = 10 << 20;      // from here a segment is sized to the request
inline constexpr size_t kRoundLarge = 2 << 20;          // large segments are multiples of this
inline constexpr size_t kMaxRequest = size_t{1} << 56;  // beyond any device; keeps rounding from overflowing

/// Rounded block size for a request of `nbytes` (> 0).
size_t round_size(size_t nbytes);
/// Size of the segment to allocate for a block of rounded size `size`.
size_t segment_size(size_t size);

enum class PoolKind : uint8_t { Small, Large };

struct Segment;

// A run of bytes within a segment: handed out, parked, or free in a pool.
struct Block {
  void* ptr = nullptr;
  size_t size = 0;         // rounded
  size_t requested = 0;    // while Allocated
  void* stream = nullptr;  // the segment's stream (see Note [Stream-aware reuse])
  Segment* segment = nullptr;
  Block* prev = nullptr;  // neighbours within the segment, in address order
  Block* next = nullptr;
  BlockState state = BlockState::Free;
  int pending_events = 0;
  std::vector<Stream> stream_uses;  // other streams this allocation was used on

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

class CachingAllocator;

// Memory obtained from the backend in one piece; its blocks tile it.
struct Segment {
  void* base;
  size_t size;
  PoolKind pool;
  void* stream;
  Block* head;  // lowest-addressed block
  CachingAllocator* owner;
};

/// Orders free blocks for best fit: by stream, then size, then address.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const;
};

class CachingAllocator {
 public:
  /// `name` labels messages ("cuda:0", "cpu", "pinned host"); DataPtrs carry `device`.
  CachingAllocator(std::string name, Device device, std::unique_ptr<RawBackend> backend);
  /// Gives the cached segments back. Every DataPtr it made must be gone by then.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// As memory::allocate, for use on `stream` (its handle keys the pools).
  DataPtr allocate(size_t nbytes, Stream stream);
  /// Frees the block behind a DataPtr this allocator made (the DataPtr deleter).
  static void free_deleter(void* block, void* ptr);
  /// Notes that `p` is used on `stream` (checked by the caller). Returns false,
  /// doing nothing, when `p` was not made by this allocator.
  bool record_stream(const DataPtr& p, Stream stream);

  MemoryStats stats() const;
  void reset_peak();
  void reset_stats();
  void empty_cache();
  void set_limit(size_t bytes);
  size_t limit() const;
  size_t total_memory() const { return backend_->total_memory(); }
  std::vector<SegmentInfo> snapshot() const;
  void enable_trace(size_t capacity);
  std::vector<TraceEvent> trace_events() const;
  std::optional<TraceEvent> trace_peak() const;
  /// Records that the block at `ptr` now holds `category` (when tracing; see memory::relabel).
  void trace_relabel(const void* ptr, core::Category category);

  /// Makes `key` a graph pool (Note [Graph pools]); `reuse`: whether its blocks freed during
  /// the capture may serve the capture's later allocations (device memory, yes; pinned
  /// staging, read again at every replay, no).
  void begin_graph_pool(const void* key, bool reuse);
  /// Gives the pool's segments to `owner` (their blocks then behave as any of that stream's)
  /// and frees the blocks held during the capture. Call once the graph's work is done.
  void release_graph_pool(const void* key, Stream owner);

  const std::string& name() const { return name_; }
  Device device() const { return device_; }

 private:
  struct Pool {
    std::set<Block*, BlockOrder> free_blocks;
  };
  struct EventQueue {  // events recorded on one stream, oldest first
    Stream stream;
    std::deque<std::pair<void*, Block*>> events;
  };
  struct GraphPool {
    const void* key = nullptr;  // the graph's pool_key: its blocks' stream field
    bool reuse = true;
    std::vector<Block*> held;  // freed during the capture, not reused until release
  };
  struct SegmentOrder {  // by base address
    bool operator()(const Segment* a, const Segment* b) const;
  };

  void free_block(Block* block);
  /// The pool of the graph capturing on this thread, if it is one of this allocator's.
  GraphPool* capturing_pool();
  Pool& pool(PoolKind kind) { return kind == PoolKind::Small ? small_pool_ : large_pool_; }
  Block* take_best_fit(PoolKind kind, void* stream, size_t size);
  Block* allocate_segment(PoolKind kind, void* stream, size_t size);
  void split(Block* block, size_t size);
  void return_to_pool(Block* block);
  void merge_into(Block* dst, Block* src);
  void insert_free(Block* block);
  void erase_free(Block* block);
  void park_until_events(Block* block);
  void process_completed_events();
  void wait_all_events();
  void release_cached_segments();
  void free_segment(Block* block);
  Block* new_block();
  void delete_block(Block* block);
  EventQueue& queue_for(Stream stream);
  [[noreturn]] void throw_out_of_memory(size_t nbytes, size_t seg_size, const char* note = "");
  void update(StatCounter PoolStats::*stat, PoolKind kind, int64_t delta);
  void trace(TraceAction action, void* ptr, size_t size, size_t requested, void* stream);
  // ASan shadow of host memory; nothing without ASan (see Note [Poisoning host blocks]).
  void poison(const void* ptr, size_t size) const {
    if (kAsan && device_.is_cpu()) asan_poison(ptr, size);
  }
  void unpoison(const void* ptr, size_t size) const {
    if (kAsan && device_.is_cpu()) asan_unpoison(ptr, size);
  }

  const std::string name_;
  const Device device_;
  const std::unique_ptr<RawBackend> backend_;

  mutable std::mutex mutex_;  // guards everything below
  Pool small_pool_;
  Pool large_pool_;
  std::set<Segment*, SegmentOrder> segments_;  // every segment, for snapshot, record_stream and teardown
  std::vector<EventQueue> event_queues_;
  size_t pending_events_ = 0;  // across event_queues_
  size_t limit_ = 0;           // on reserved bytes; 0 = none
  MemoryStats stats_;
  std::unique_ptr<TraceRing> trace_;
  // Block objects freed by merges, reused by splits: a small allocation splits its
  // block and its free merges it back, so without these every tensor would cost a
  // heap allocation and a free for the Block alone.
  std::vector<Block*> spare_blocks_;
  std::vector<GraphPool> graph_pools_;  // Note [Graph pools]
};

/// The allocator serving `device` (CPU or a checked CUDA device); `op` names the
/// caller in the error thrown for a device that does not exist.
CachingAllocator& allocator_for(Device device, const char* op);
/// The pinned host pool.
CachingAllocator& pinned_allocator();
/// The table memory_summary prints, for any allocator's stats.
std::string format_summary(const std::string& title, const MemoryStats& stats, size_t limit);

}  // namespace frugal::memory::detail
