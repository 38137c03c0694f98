#pragma once
// The memory profiler: records one device's allocator events (each naming its op,
// module and category, see core/instrument.h) and every op's host and device
// times between start() and stop(), then answers "what filled my memory" and
// "where did the time go":
//
//   profiler::Session session({.device = cuda()});
//   session.attach(model);  // dotted module names, and the bytes the model holds
//   session.attach(opt);    // the optimizer's state
//   session.start();
//   ... one training step ...
//   session.stop();
//   std::cout << session.top_allocations_table() << session.op_time_table();
//   session.write_chrome_trace("trace.json");  // Perfetto / chrome://tracing
//   session.write_timeline_svg("timeline.svg");
//
// Note [Replaying the trace]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// start() takes the allocator's snapshot (blocks already live: attached
// parameters, gradients and optimizer state get their category and module, the
// rest are "other" from before the start) and turns on the trace. stop() replays
// the events in order over that live set: an alloc adds a block with its op,
// module and category, a free removes it, a relabel moves its bytes to another
// category. The replay yields the per-category timeline; a second replay up to
// the event of peak allocated bytes yields the blocks live at the peak, whose
// sizes add up to the peak exactly (both count rounded block sizes). If the ring
// overflowed, the lost bytes appear as one "(trace overflow)" group so the sum
// still holds; raise Options::trace_capacity to see them.
//
// Note [The peak outlives the ring]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The peak cannot be read off the events kept: when the ring overflows, the highest
// point may be among those it overwrote, and the highest kept event would then be
// reported as the peak, too low and at the wrong time. The ring therefore keeps a copy
// of its highest event apart from the ring (memory::trace_peak), and that is the
// session's peak. When it is not among the kept events, none of them shows what was
// live at that moment, so all of it is the "(trace overflow)" group. The timeline after an
// overflow is replayed from the first kept event over an empty set; each point's bytes that
// no kept event explains (blocks made by lost events) are counted as "other", so that every
// point's categories still add up to its allocated bytes.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/instrument.h"
#include "memory/allocator.h"
#include "memory/trace.h"
#include "tensor/tensor.h"

namespace frugal::nn {
class Module;
}
namespace frugal::optim {
class Optimizer;
}

namespace frugal::profiler {

struct Options {
  Device device = kCPU;  ///< whose allocator is traced and where CUDA events time ops
  /// Allocator events kept (the oldest are dropped past it; 128 bytes each, made at start():
  /// 32 MiB at the default; lost_events() says when a run needed more).
  size_t trace_capacity = size_t{1} << 18;
  bool time_ops = true;  ///< record op times (host always; CUDA events on a GPU)
};

/// Bytes live at the peak that share an op, a module and a category.
struct AllocationGroup {
  std::string op;      ///< the op that allocated them; "(outside ops)", "(before start)"
  std::string module;  ///< dotted module path, "" outside every module
  core::Category category;
  int64_t bytes;  ///< rounded block sizes, as allocated_bytes counts them
  int64_t blocks;
};

/// One row of the op time table.
struct OpTime {
  std::string op;
  int64_t calls;
  double total_ms;         ///< host time inside the op, nested ops included
  double self_ms;          ///< host time not inside a nested recorded op
  double device_total_ms;  ///< CUDA: summed event times; -1 on the CPU
};

/// The state after one trace event (or at the start, for the first point).
struct TimelinePoint {
  int64_t time_ns;  ///< steady clock
  int64_t allocated;
  int64_t reserved;
  std::array<int64_t, core::kNumCategories> by_category;  ///< indexed by Category
};

/// A live block at the end of the session, for the snapshot dump.
struct BlockOwner {
  std::string op, module;
  core::Category category;
};

class Session {
 public:
  explicit Session(Options options = {});
  /// Stops a recording still running.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Names `model`'s modules by their dotted paths (the model itself as `name`, or
  /// "(TypeName)") and marks the bytes its parameters, buffers and gradients hold now
  /// as parameters / gradients, so blocks made before start() are attributed too.
  /// Call it after the model is on its device; again after moving it.
  void attach(const nn::Module& model, const std::string& name = "");
  /// Marks the optimizer's current state buffers as optimizer_state.
  void attach(const optim::Optimizer& optimizer);

  /// Starts recording (one session at a time per process). Clears earlier results.
  void start();
  /// Stops recording, synchronizes the device, and analyses what was recorded.
  void stop();
  bool running() const { return running_; }

  // ---- results, after stop() ----------------------------------------------------------
  const Options& options() const { return options_; }
  const std::vector<memory::TraceEvent>& events() const { return events_; }
  const std::vector<core::OpRecord>& op_records() const { return ops_; }
  /// The dotted name `attach` gave a module; "" for none, "module@0x..." for one not attached.
  std::string module_name(const void* module) const;
  /// Allocated bytes at the start and at the peak (the highest point of the session).
  int64_t start_allocated() const { return start_allocated_; }
  int64_t peak_allocated() const { return peak_allocated_; }
  /// Steady-clock time of the peak, and of the start and stop calls.
  int64_t peak_time_ns() const { return peak_time_ns_; }
  int64_t start_time_ns() const { return start_ns_; }
  int64_t stop_time_ns() const { return stop_ns_; }
  /// Every group live at the peak, largest first; their bytes add up to peak_allocated().
  const std::vector<AllocationGroup>& live_at_peak() const { return at_peak_; }
  /// Bytes per category at the peak (indexed by Category).
  std::array<int64_t, core::kNumCategories> category_bytes_at_peak() const;
  /// One point per trace event, after the start point.
  const std::vector<TimelinePoint>& timeline() const { return timeline_; }
  /// Per op name, by self time, largest first.
  std::vector<OpTime> op_times() const;
  /// Allocator events lost to the ring's overflow (0 when the trace is complete).
  uint64_t lost_events() const { return lost_events_; }
  /// The allocator's segments and blocks at stop().
  const std::vector<memory::SegmentInfo>& final_snapshot() const { return final_snapshot_; }

  // ---- exports (profiler/chrome_trace.cpp, reports.cpp, timeline_svg.cpp) ------------
  /// Chrome trace JSON: "X" events per op (forward, backward, optimizer; module in
  /// args; on CUDA also a device-time track), "C" counters of allocated and reserved
  /// bytes and bytes by category, "i" instant events for out-of-memory failures.
  std::string chrome_trace() const;
  /// "What filled my memory": the top `n` groups live at the peak, then one row for the
  /// rest, a total equal to the peak, and the bytes per category.
  std::string top_allocations_table(size_t n = 15) const;
  /// Op, calls, total ms, self ms, mean ms, share of self time (and device ms on CUDA).
  std::string op_time_table(size_t n = 30) const;
  /// The segments and blocks at stop(), each live block with its op, module and category.
  std::string snapshot_text(size_t max_blocks = 200) const;
  /// A timeline picture: bytes by category stacked over time, reserved as a line,
  /// the peak marked and labelled, axes in ms and MiB, a legend.
  std::string timeline_svg(int width = 960, int height = 480) const;
  /// All the text reports in one.
  std::string report(size_t top_n = 15) const;
  void write_chrome_trace(const std::string& path) const;
  void write_timeline_svg(const std::string& path) const;
  /// Both of the above into `dir` (created if missing): dir/trace.json and dir/timeline.svg.
  void write_files(const std::string& dir) const;

 private:
  struct Live {
    int64_t size;
    core::Category category;
    const char* op;
    const void* module;
  };
  using LiveMap = std::unordered_map<const void*, Live>;

  LiveMap initial_live() const;
  void analyse();
  void replay(const LiveMap& initial, size_t until, LiveMap& live, std::vector<TimelinePoint>* timeline) const;
  std::string op_label(const char* op) const;

  Options options_;
  bool running_ = false;
  std::unordered_map<const void*, std::string> module_names_;
  /// What attach() learnt of a tensor's block: used only while that storage lives and still
  /// has the block (the allocator hands a freed block to the next tensor of its size).
  struct KnownBlock {
    core::Category category;
    const void* module;
    std::weak_ptr<Storage> storage;
    static KnownBlock of(const Tensor& t, core::Category category, const void* module) {
      return {category, module, t.impl().storage};
    }
  };
  std::unordered_map<const void*, KnownBlock> known_blocks_;  // from attach

  // Recorded
  int64_t start_ns_ = 0, stop_ns_ = 0;
  int64_t start_allocated_ = 0, start_reserved_ = 0;
  std::vector<memory::SegmentInfo> start_snapshot_, final_snapshot_;
  std::vector<memory::TraceEvent> events_;
  std::optional<memory::TraceEvent> ring_peak_;  // Note [The peak outlives the ring]
  std::vector<core::OpRecord> ops_;

  // Analysed
  uint64_t lost_events_ = 0;
  int64_t peak_allocated_ = 0, peak_time_ns_ = 0;
  std::vector<TimelinePoint> timeline_;
  std::vector<AllocationGroup> at_peak_;
  std::unordered_map<const void*, BlockOwner> owners_at_stop_;
};

}  // namespace frugal::profiler
