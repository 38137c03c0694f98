#pragma once
// The pinned (page-locked) host pool. Copies between the host and a GPU are
// asynchronous only from pinned memory, and cudaHostAlloc is slow (it maps the
// pages for the device), so pinned buffers are cached like device memory: same
// arena policy, own statistics. Without CUDA (or without a GPU) the pool serves
// plain host memory, so code that stages through it runs unchanged on the CPU.
#include <cstddef>
#include <string>

#include "core/data_ptr.h"
#include "memory/stats.h"

namespace frugal::memory {

/// `nbytes` of pinned host memory (device kCPU). Before the block is reused, the
/// copies it took part in must be complete: call record_stream(p, stream) with the
/// stream of every asynchronous copy that reads or writes it.
/// `nbytes == 0` yields an empty DataPtr. Throws OutOfMemoryError as allocate does.
DataPtr allocate_pinned(size_t nbytes);

/// The pinned pool's statistics (kept apart from stats(kCPU)).
MemoryStats pinned_stats();
/// Sets every peak of the pinned pool to its current value.
void reset_pinned_peak();
/// Gives the pinned pool's wholly free segments back to the system.
void empty_pinned_cache();
/// Caps the pinned pool's reserved bytes; 0 removes the cap.
void set_pinned_memory_limit(size_t bytes);
/// The pinned pool's table, as memory_summary prints a device's.
std::string pinned_memory_summary();
/// Whether allocate_pinned returns page-locked memory (CUDA build with a GPU present).
bool pinned_is_page_locked();

}  // namespace frugal::memory
