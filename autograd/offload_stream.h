#pragma once
// Internal: the side streams and events under autograd/offload.cpp (Note [Offloaded saved
// tensors]). Defined in offload_stream.cpp, which only CUDA builds compile: call these only
// for CUDA devices, and only under `#if FRUGAL_WITH_CUDA`.
#include <cstddef>

#include "core/device.h"
#include "core/stream.h"

namespace frugal::autograd::detail {

/// `device`'s offload stream: one per device, created on first use (non-blocking, so the
/// legacy default stream does not serialise it), never destroyed.
Stream offload_stream(Device device);

/// Copies `nbytes` from `src` to `dst` (one on `device`, the other pinned host memory) on
/// the offload stream of `device`, once the work queued so far on the current stream of
/// `device` is done (which produced the source, or last used the destination's block).
/// Returns an event that completes with the copy; give it back with release_event.
void* copy_on_offload_stream(void* dst, const void* src, size_t nbytes, Device device);

/// Makes the current stream of `device` wait for `event` (no host wait). When the copy has
/// not completed yet, the wait is bracketed by timing events: take_stall_ms reads them.
void wait_on_current_stream(void* event, Device device);

/// Makes the current stream of `device` wait for `event`, unmeasured (no stall probe; for
/// waits nobody reads the stall of, which would otherwise pile up probes).
void wait_on_current_stream_untimed(void* event, Device device);

/// Blocks the host until the copy behind `event` is done (OffloadAdamW reads gradients the
/// offload stream brought to the host).
void wait_on_host(void* event);

/// The milliseconds the current streams stalled in wait_on_current_stream since the last
/// call; waits on the host for the timing events still pending.
double take_stall_ms();

/// Returns an event to the pool.
void release_event(void* event);

}  // namespace frugal::autograd::detail
