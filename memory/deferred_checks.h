#pragma once
// Deferred checks: device-side validation whose verdict reaches the host later, at a
// synchronization the host makes anyway (Note [Deferred index checks]).
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/data_ptr.h"
#include "core/graph_capture.h"
#include "core/stream.h"

namespace frugal::memory {

// Note [Deferred index checks]
// CUDA ops that read indices (index_gather / index_scatter_add: embedding and its
// backward, gather, index_select, scatter_add, one_hot; the cross entropy forward) check
// every index on the device and record the first bad one in a 3-word device record
// {flag, value, position} (Note [Index validation]). Reading that record right after the
// kernel would stall the host until the GPU caught up: at the end of a forward the host
// could not queue the backward, and the GPU idled while it did. So by default the read
// is deferred:
//   - the op's front-end (tensor/ops/index.cpp, loss.cpp) gets the record back from the
//     CUDA kernel in IndexError::record and calls defer_check with the stream and a
//     CheckMessage: a closure holding only values (op name, describe() strings, shapes,
//     the valid range) that formats exactly the error the synchronous path throws;
//   - defer_check queues a copy of the record into a slot of pinned host memory on the
//     op's stream, records an event after it and files the check in its device's
//     PendingChecks (one per device, under a mutex: ops may run on several threads);
//   - resolve_checks(device) reads the slots whose events have completed (it never
//     waits), frees them for reuse, and throws frugal::Error with the first failed
//     check's message plus a note saying where it was detected. It runs wherever the
//     host waits for the device anyway: synchronize(device) and every device-to-host
//     copy (memcpy_across in tensor/cuda/copy.cu: .cpu(), .item(), tolist()). After the
//     throw the failed checks are gone: later ops and syncs work normally.
//   - defer_check itself also reaps the oldest completed checks, so a loop that never
//     synchronizes neither grows without bound nor goes on silently after a bad index:
//     a failure already visible on the host is thrown by the next checked op.
// The CPU kernels know the answer at once and still throw at the op. So does CUDA under
// set_sync_checks(true) (ops::set_sync_index_checks, or FRUGAL_SYNC_INDEX_CHECKS=1 in
// the environment): the front-end then reads the record right after the kernel, for
// debugging. Event waits inside the allocator and cuDNN's autotuning timers
// do not resolve checks: they run under locks or inside other ops, where an unrelated
// error would be a surprise; a profiler stop syncs without resolving for the same reason.

// Note [Index checks in a CUDA graph]
// A captured op's check cannot be filed as above: the capture runs no kernel, and the op's
// record may be reused by a later op of the same capture before a replay's end. Inside a
// capture defer_check instead copies the record, right after the op (a captured
// device-to-device copy), into a word of its own in the graph's pool that nothing else
// uses while the graph lives, and asks the graph to file an ordinary deferred check of
// that word after each replay (GraphCapture::after_replay): replays raise bad indices at
// the next synchronization, as eager steps do.

/// Formats a failed check's error from its record's value and position.
using CheckMessage = std::function<std::string(int64_t value, int64_t position)>;

/// Whether checks are read right after their kernel (true) or deferred (false, the
/// default unless the environment sets FRUGAL_SYNC_INDEX_CHECKS=1).
bool sync_checks();
void set_sync_checks(bool on);

/// Queues the read of the record {flag, value, position} (3 int64 in device memory on
/// stream.device) after the work already on `stream`, and files the check. Throws the
/// first earlier check of this device that has already failed.
void defer_check(Stream stream, const void* record, CheckMessage message);

/// Resolves the device's checks whose records have reached the host (never waits);
/// throws frugal::Error for the first failed one. No-op on the CPU.
void resolve_checks(Device device);

/// Checks of `device` not resolved yet, and slots made so far (tests).
size_t pending_check_count(Device device);
size_t check_slot_count(Device device);

namespace detail {

/// How records reach the host: CUDA copies and events, or a fake in tests.
class CheckTransport {
 public:
  virtual ~CheckTransport() = default;
  /// A reusable event for a new slot (never destroyed: slots live as long as the process).
  virtual void* create_event() = 0;
  /// Queues on `stream`: 3 int64 from device `record` to host `slot`, then records `event`.
  virtual void copy_record(Stream stream, const void* record, int64_t* slot, void* event) = 0;
  virtual bool completed(void* event) = 0;
  /// Queues on `stream` a device-to-device copy of the 3-word record (Note [Index checks in
  /// a CUDA graph]).
  virtual void copy_record_on_device(Stream stream, const void* record, void* copy) = 0;
};

/// One device's pending checks and its pool of pinned slots (see the Note).
class PendingChecks {
 public:
  PendingChecks(std::string device_name, std::unique_ptr<CheckTransport> transport);
  PendingChecks(const PendingChecks&) = delete;
  PendingChecks& operator=(const PendingChecks&) = delete;

  void add(Stream stream, const void* record, CheckMessage message);
  /// Inside a graph capture: copies the record to a word of the graph's and has every
  /// replay file a check of that word (Note [Index checks in a CUDA graph]).
  void add_captured(core::GraphCapture& capture, Stream stream, const void* record, CheckMessage message);
  void resolve();
  size_t pending() const;
  size_t slots() const;

 private:
  struct Slot {
    int64_t* host;
    void* event;
  };
  struct Pending {
    Slot slot;
    CheckMessage message;
  };
  Slot take_slot();
  // Retires completed checks (only the oldest run of them when `oldest_only`), freeing
  // their slots; returns the error text of the first failed one, or "".
  std::string retire(bool oldest_only, const char* where, bool keep_newest);

  std::string device_name_;
  std::unique_ptr<CheckTransport> transport_;
  mutable std::mutex mu_;
  std::vector<DataPtr> chunks_;  // pinned blocks the slots live in
  std::vector<Slot> free_;
  std::deque<Pending> pending_;  // in the order they were filed
  size_t slots_ = 0;
};

/// The CUDA transport of device `index` (memory/cuda_backend.cpp; a clear error in
/// builds without CUDA).
std::unique_ptr<CheckTransport> make_cuda_check_transport(int index);

}  // namespace detail
}  // namespace frugal::memory
