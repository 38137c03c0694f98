#include "memory/caching_allocator.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "core/graph_capture.h"

namespace frugal::memory::detail {

namespace {

void bump(StatCounter& stat, int64_t delta) {
  stat.current += delta;
  if (delta > 0) {
    stat.allocated += delta;
    stat.peak = std::max(stat.peak, stat.current);
  } else {
    stat.freed -= delta;
  }
}

constexpr StatCounter PoolStats::*kAllStats[] = {
    &PoolStats::allocated_bytes,      &PoolStats::reserved_bytes, &PoolStats::requested_bytes,
    &PoolStats::inactive_split_bytes, &PoolStats::active_blocks,  &PoolStats::segments,
};

template <typename Fn>
void for_each_stat(MemoryStats& s, Fn fn) {
  for (PoolStats* pool : {static_cast<PoolStats*>(&s), &s.small_pool, &s.large_pool})
    for (auto member : kAllStats) fn(pool->*member);
}

bool worth_splitting(const Block* block, size_t size) {
  size_t rest = block->size - size;
  return block->segment->pool == PoolKind::Small ? rest >= kMinBlockSize : rest > kSmallSize;
}

}  // namespace

size_t round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

bool BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return std::less<void*>{}(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return std::less<void*>{}(a->ptr, b->ptr);
}

bool CachingAllocator::SegmentOrder::operator()(const Segment* a, const Segment* b) const {
  return std::less<void*>{}(a->base, b->base);
}

CachingAllocator::CachingAllocator(std::string name, Device device, std::unique_ptr<RawBackend> backend)
    : name_(std::move(name)), device_(device), backend_(std::move(backend)) {}

// The process-wide allocators are never destroyed (tensors in static objects may
// outlive them). A private instance must outlive its DataPtrs; we give back what
// is free and leave anything still in use to the process.
CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  release_cached_segments();
  for (Block* b : spare_blocks_) delete b;
}

Block* CachingAllocator::new_block() {
  if (spare_blocks_.empty()) return new Block();
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  return b;
}

void CachingAllocator::delete_block(Block* block) {
  constexpr size_t kMaxSpareBlocks = 4096;  // bounds what a burst of frees leaves behind
  if (spare_blocks_.size() >= kMaxSpareBlocks) {
    delete block;
    return;
  }
  *block = Block{};
  try {
    spare_blocks_.push_back(block);
  } catch (...) {  // no memory to remember it: give it back instead
    delete block;
  }
}

// ---- Allocation ------------------------------------------------------------------

DataPtr CachingAllocator::allocate(size_t nbytes, Stream stream) {
  if (nbytes == 0) return DataPtr(nullptr, 0, device_, nullptr, nullptr);
  std::lock_guard lock(mutex_);
  if (nbytes > kMaxRequest) throw_out_of_memory(nbytes, nbytes);
  const bool capturing = capturing_pool() != nullptr;
  if (!capturing) process_completed_events();  // see Note [Graph pools]

  const size_t size = round_size(nbytes);
  const PoolKind kind = size <= kSmallSize ? PoolKind::Small : PoolKind::Large;
  Block* block = take_best_fit(kind, stream.handle, size);
  if (block) {
    ++stats_.cache_hits;
  } else {
    const size_t seg_size = segment_size(size);
    block = allocate_segment(kind, stream.handle, seg_size);
    if (!block && capturing)
      throw_out_of_memory(nbytes, seg_size,
                          " A CUDA graph capture cannot wait for memory to be freed: capture with "
                          "more memory free (Note [Graph pools]).");
    if (!block) {  // see Note [Out of memory]
      ++stats_.num_alloc_retries;
      release_cached_segments();
      block = take_best_fit(kind, stream.handle, size);  // waited-for blocks may fit now
      if (!block) block = allocate_segment(kind, stream.handle, seg_size);
      if (!block) throw_out_of_memory(nbytes, seg_size);
    }
  }
  if (worth_splitting(block, size)) split(block, size);

  block->state = BlockState::Allocated;
  block->requested = nbytes;
  unpoison(block->ptr, nbytes);  // the rounding tail stays poisoned
  ++stats_.num_allocs;
  update(&PoolStats::allocated_bytes, kind, static_cast<int64_t>(block->size));
  update(&PoolStats::requested_bytes, kind, static_cast<int64_t>(nbytes));
  update(&PoolStats::active_blocks, kind, 1);
  trace(TraceAction::Alloc, block->ptr, block->size, nbytes, block->stream);
  return DataPtr(block->ptr, nbytes, device_, &CachingAllocator::free_deleter, block);
}

Block* CachingAllocator::take_best_fit(PoolKind kind, void* stream, size_t size) {
  auto& free_blocks = pool(kind).free_blocks;
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = free_blocks.lower_bound(&key);
  if (it == free_blocks.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  erase_free(block);
  return block;
}

Block* CachingAllocator::allocate_segment(PoolKind kind, void* stream, size_t seg_size) {
  if (limit_ != 0 && static_cast<size_t>(stats_.reserved_bytes.current) + seg_size > limit_) return nullptr;
  auto segment = std::make_unique<Segment>(Segment{nullptr, seg_size, kind, stream, nullptr, this});
  auto block = std::make_unique<Block>();
  void* base = backend_->allocate_segment(seg_size);
  if (!base) return nullptr;

  segment->base = base;
  segment->head = block.get();
  block->ptr = base;
  block->size = seg_size;
  block->stream = stream;
  block->segment = segment.get();
  segments_.insert(segment.release());
  poison(base, seg_size);  // see Note [Poisoning host blocks]
  ++stats_.num_segment_allocs;
  update(&PoolStats::reserved_bytes, kind, static_cast<int64_t>(seg_size));
  update(&PoolStats::segments, kind, 1);
  trace(TraceAction::SegmentAlloc, base, seg_size, 0, stream);
  return block.release();
}

// Cuts `block` (not in a pool) to `size`; the rest becomes a free block after it.
void CachingAllocator::split(Block* block, size_t size) {
  Block* rest = new_block();
  rest->ptr = static_cast<char*>(block->ptr) + size;
  rest->size = block->size - size;
  rest->stream = block->stream;
  rest->segment = block->segment;
  rest->prev = block;
  rest->next = block->next;
  if (rest->next) rest->next->prev = rest;
  block->next = rest;
  block->size = size;
  insert_free(rest);
}

// ---- Free ------------------------------------------------------------------------

void CachingAllocator::free_deleter(void* block, void* /*ptr*/) {
  auto* b = static_cast<Block*>(block);
  b->segment->owner->free_block(b);
}

void CachingAllocator::free_block(Block* block) {
  std::lock_guard lock(mutex_);
  const PoolKind kind = block->segment->pool;
  ++stats_.num_frees;
  update(&PoolStats::allocated_bytes, kind, -static_cast<int64_t>(block->size));
  update(&PoolStats::requested_bytes, kind, -static_cast<int64_t>(block->requested));
  trace(TraceAction::Free, block->ptr, block->size, block->requested, block->stream);
  block->requested = 0;
  poison(block->ptr, block->size);
  if (GraphPool* capture = capturing_pool()) {  // Note [Graph pools]
    if (block->stream == capture->key && capture->reuse) {
      block->stream_uses.clear();  // the captured stream orders them; the pool outlives the graph's work
      return_to_pool(block);
    } else {
      block->state = BlockState::AwaitingEvents;  // awaiting the graph's release
      capture->held.push_back(block);
    }
    return;
  }
  if (block->stream_uses.empty()) return_to_pool(block);
  else park_until_events(block);
}

CachingAllocator::GraphPool* CachingAllocator::capturing_pool() {
  const core::GraphCapture* capture = core::current_graph_capture();
  if (!capture) return nullptr;
  for (GraphPool& pool : graph_pools_)
    if (pool.key == capture->pool_key) return &pool;
  return nullptr;
}

void CachingAllocator::begin_graph_pool(const void* key, bool reuse) {
  std::lock_guard lock(mutex_);
  for (const GraphPool& pool : graph_pools_)
    FRUGAL_CHECK(pool.key != key, name_, ": graph pool ", key, " exists already");
  graph_pools_.push_back(GraphPool{.key = key, .reuse = reuse, .held = {}});
}

void CachingAllocator::release_graph_pool(const void* key, Stream owner) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(graph_pools_.begin(), graph_pools_.end(), [&](const GraphPool& p) { return p.key == key; });
  if (it == graph_pools_.end()) return;
  const std::vector<Block*> held = std::move(it->held);
  graph_pools_.erase(it);
  for (Segment* segment : segments_) {
    if (segment->stream != key) continue;
    segment->stream = owner.handle;
    for (Block* b = segment->head; b; b = b->next) {
      if (b->state != BlockState::Free) {
        b->stream = owner.handle;
        continue;
      }
      erase_free(b);  // the free sets are ordered by stream first: move it across
      b->stream = owner.handle;
      insert_free(b);
    }
  }
  for (Block* b : held) {
    b->state = BlockState::Allocated;
    if (b->stream_uses.empty()) return_to_pool(b);
    else park_until_events(b);
  }
}

// Merges `block` with its free neighbours and makes the result reusable.
void CachingAllocator::return_to_pool(Block* block) {
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour && neighbour->state == BlockState::Free) {
      erase_free(neighbour);
      merge_into(block, neighbour);
    }
  }
  update(&PoolStats::active_blocks, block->segment->pool, -1);
  insert_free(block);
}

void CachingAllocator::merge_into(Block* dst, Block* src) {
  if (src == dst->prev) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
    else dst->segment->head = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  dst->size += src->size;
  delete_block(src);
}

// A pooled block's neighbours change only by merging it, which takes it out of
// the pool first, so is_split() reads the same at insert and erase.
void CachingAllocator::insert_free(Block* block) {
  block->state = BlockState::Free;
  pool(block->segment->pool).free_blocks.insert(block);
  if (block->is_split())
    update(&PoolStats::inactive_split_bytes, block->segment->pool, static_cast<int64_t>(block->size));
}

void CachingAllocator::erase_free(Block* block) {
  pool(block->segment->pool).free_blocks.erase(block);
  if (block->is_split())
    update(&PoolStats::inactive_split_bytes, block->segment->pool, -static_cast<int64_t>(block->size));
}

// ---- Streams and events (Note [Stream-aware reuse]) --------------------------------

bool CachingAllocator::record_stream(const DataPtr& p, Stream stream) {
  std::lock_guard lock(mutex_);
  Segment key{p.get(), 0, PoolKind::Small, nullptr, nullptr, nullptr};
  auto it = segments_.upper_bound(&key);  // first segment above p
  if (it == segments_.begin()) return false;
  Segment* segment = *std::prev(it);
  if (static_cast<char*>(p.get()) >= static_cast<char*>(segment->base) + segment->size) return false;
  Block* block = segment->head;
  while (block && block->ptr != p.get()) block = block->next;
  if (block != p.context() || block->state != BlockState::Allocated) return false;

  if (stream == Stream{block->stream, device_}) return true;  // its own stream: ordered already
  for (const GraphPool& pool : graph_pools_)                  // a graph's block: not reused until its work is done
    if (pool.key == block->stream) return true;
  auto& uses = block->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  return true;
}

CachingAllocator::EventQueue& CachingAllocator::queue_for(Stream stream) {
  for (EventQueue& q : event_queues_)
    if (q.stream == stream) return q;
  event_queues_.push_back(EventQueue{stream, {}});
  return event_queues_.back();
}

void CachingAllocator::park_until_events(Block* block) {
  block->state = BlockState::AwaitingEvents;
  for (Stream s : block->stream_uses) {
    queue_for(s).events.emplace_back(backend_->record_event(s), block);
    ++block->pending_events;
    ++pending_events_;
  }
  block->stream_uses.clear();
}

void CachingAllocator::process_completed_events() {
  if (pending_events_ == 0) return;
  for (EventQueue& q : event_queues_) {
    // Events on one stream complete in order: stop at the first that has not.
    while (!q.events.empty() && backend_->event_completed(q.events.front().first)) {
      auto [event, block] = q.events.front();
      q.events.pop_front();
      backend_->release_event(event);
      --pending_events_;
      if (--block->pending_events == 0) return_to_pool(block);
    }
  }
}

void CachingAllocator::wait_all_events() {
  for (EventQueue& q : event_queues_) {
    for (auto [event, block] : q.events) {
      backend_->wait_event(event);
      backend_->release_event(event);
      --pending_events_;
      if (--block->pending_events == 0) return_to_pool(block);
    }
    q.events.clear();
  }
}

// ---- Giving memory back -----------------------------------------------------------

void CachingAllocator::release_cached_segments() {
  wait_all_events();
  for (Pool* p : {&small_pool_, &large_pool_}) {
    std::vector<Block*> whole;
    for (Block* b : p->free_blocks)
      if (!b->is_split()) whole.push_back(b);
    for (Block* b : whole) free_segment(b);
  }
}

// `block` is free and spans its whole segment.
void CachingAllocator::free_segment(Block* block) {
  Segment* segment = block->segment;
  erase_free(block);
  unpoison(segment->base, segment->size);  // the system's next mapping here starts addressable
  backend_->free_segment(segment->base, segment->size);
  ++stats_.num_segment_frees;
  update(&PoolStats::reserved_bytes, segment->pool, -static_cast<int64_t>(segment->size));
  update(&PoolStats::segments, segment->pool, -1);
  trace(TraceAction::SegmentFree, segment->base, segment->size, 0, segment->stream);
  segments_.erase(segment);
  delete segment;
  delete_block(block);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  FRUGAL_CHECK(!capturing_pool(), name_,
               ": empty_cache cannot run inside a CUDA graph capture (it waits for the "
               "device; Note [Graph pools])");
  release_cached_segments();
}

void CachingAllocator::throw_out_of_memory(size_t nbytes, size_t seg_size, const char* note) {
  ++stats_.num_ooms;
  trace(TraceAction::Oom, nullptr, seg_size, nbytes, nullptr);
  const int64_t allocated = stats_.allocated_bytes.current;
  const int64_t reserved = stats_.reserved_bytes.current;
  std::string cap = limit_ ? "memory limit " + format_bytes(static_cast<int64_t>(limit_)) : "no memory limit set";
  throw OutOfMemoryError(::frugal::detail::str_cat(
      name_, " out of memory: tried to allocate ", format_bytes(static_cast<int64_t>(nbytes)),
      " (needing a new segment of ", format_bytes(static_cast<int64_t>(seg_size)), "); ", format_bytes(allocated),
      " allocated, ", format_bytes(reserved), " reserved, ", format_bytes(reserved - allocated),
      " of it cached but free; ", cap, "; ", backend_->memory_info(),
      ". Free tensors (or lower the cap) and allocate again.", note));
}

// ---- Statistics ---------------------------------------------------------------------

void CachingAllocator::update(StatCounter PoolStats::*stat, PoolKind kind, int64_t delta) {
  // Through a named reference: g++ 12 applies .* to a copy of a parenthesised ?: operand.
  PoolStats& pool_stats = kind == PoolKind::Small ? stats_.small_pool : stats_.large_pool;
  bump(stats_.*stat, delta);
  bump(pool_stats.*stat, delta);
}

void CachingAllocator::trace(TraceAction action, void* ptr, size_t size, size_t requested, void* stream) {
  if (!trace_) return;
  TraceEvent event{};
  event.action = action;
  event.ptr = ptr;
  event.size = size;
  event.requested = requested;
  event.stream = stream;
  event.allocated_bytes = stats_.allocated_bytes.current;
  event.reserved_bytes = stats_.reserved_bytes.current;
  trace_->record(event);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  for_each_stat(stats_, [](StatCounter& s) { s.peak = s.current; });
}

void CachingAllocator::reset_stats() {
  std::lock_guard lock(mutex_);
  for_each_stat(stats_, [](StatCounter& s) { s = StatCounter{s.current, s.current, 0, 0}; });
  for (int64_t* counter : {&stats_.num_allocs, &stats_.num_frees, &stats_.cache_hits, &stats_.num_alloc_retries,
                           &stats_.num_ooms, &stats_.num_segment_allocs, &stats_.num_segment_frees})
    *counter = 0;
}

void CachingAllocator::set_limit(size_t bytes) {
  std::lock_guard lock(mutex_);
  limit_ = bytes;
}

size_t CachingAllocator::limit() const {
  std::lock_guard lock(mutex_);
  return limit_;
}

std::vector<SegmentInfo> CachingAllocator::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<SegmentInfo> out;
  out.reserve(segments_.size());
  for (const Segment* s : segments_) {
    SegmentInfo info{s->base, s->size, s->pool == PoolKind::Small, s->stream, {}};
    for (const Block* b = s->head; b; b = b->next)
      info.blocks.push_back(BlockInfo{b->ptr, b->size, b->requested, b->state});
    out.push_back(std::move(info));
  }
  return out;
}

void CachingAllocator::enable_trace(size_t capacity) {
  // Built (and the old one freed) outside the lock: a ring of a million events is 128 MiB to
  // zero, which every other thread's allocation would otherwise wait for.
  std::unique_ptr<TraceRing> ring = capacity ? std::make_unique<TraceRing>(capacity) : nullptr;
  {
    std::lock_guard lock(mutex_);
    std::swap(trace_, ring);
  }
}

std::optional<TraceEvent> CachingAllocator::trace_peak() const {
  std::lock_guard lock(mutex_);
  return trace_ ? trace_->peak() : std::nullopt;
}

void CachingAllocator::trace_relabel(const void* ptr, core::Category category) {
  std::lock_guard lock(mutex_);
  if (!trace_) return;
  TraceEvent event{};
  event.action = TraceAction::Relabel;
  event.ptr = const_cast<void*>(ptr);
  event.category = category;
  event.allocated_bytes = stats_.allocated_bytes.current;
  event.reserved_bytes = stats_.reserved_bytes.current;
  trace_->record(event);
}

std::vector<TraceEvent> CachingAllocator::trace_events() const {
  std::lock_guard lock(mutex_);
  return trace_ ? trace_->events() : std::vector<TraceEvent>{};
}

}  // namespace frugal::memory::detail
