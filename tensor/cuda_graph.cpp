// CudaGraph (tensor/cuda_graph.h, Note [CUDA graphs]): capture on a stream of its own into
// a private memory pool, replay on the caller's stream.
#include "tensor/cuda_graph.h"

#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/graph_capture.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "tensor/random.h"
#if FRUGAL_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace frugal {

#if FRUGAL_WITH_CUDA

namespace {

/// The stream captures run on (never destroyed: core::side_stream).
cudaStream_t capture_stream(Device device) {
  return static_cast<cudaStream_t>(core::side_stream(device, core::SideStream::GraphCapture).handle);
}

/// `waiter` waits, on the device, for the work queued on `first` so far.
void stream_wait(cudaStream_t waiter, cudaStream_t first) {
  cudaEvent_t event = nullptr;
  FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  FRUGAL_CUDA_CHECK(cudaEventRecord(event, first));
  FRUGAL_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  FRUGAL_CUDA_CHECK(cudaEventDestroy(event));  // released once the wait is done
}

}  // namespace

struct CudaGraph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t last_replay = nullptr;  // recorded after each replay: the destructor waits for it
  bool pool = false;                  // memory::begin_graph_pool was called (keyed by this Impl)
  std::vector<std::function<void()>> replay_checks;
  std::vector<std::function<void(Stream)>> after_replay;  // re-file the captured index checks
  DataPtr rng_base;                                       // the device word each replay's generator offset is copied to
  uint64_t rng_total = 0;  // counters one replay draws (Note [Graph-safe random numbers])
};

CudaGraph::CudaGraph(Device device) : device_(device), impl_(std::make_unique<Impl>()) {
  FRUGAL_CHECK(device.is_cuda(), "CudaGraph: needs a CUDA device, got ", device.str());
  core::check_cuda_device(device, "CudaGraph");
}

CudaGraph::~CudaGraph() {
  try {
    CudaDeviceGuard guard(device_.index);
    if (impl_->last_replay) {
      FRUGAL_CUDA_CHECK(cudaEventSynchronize(impl_->last_replay));
      FRUGAL_CUDA_CHECK(cudaEventDestroy(impl_->last_replay));
    }
    if (impl_->exec) FRUGAL_CUDA_CHECK(cudaGraphExecDestroy(impl_->exec));
    if (impl_->graph) FRUGAL_CUDA_CHECK(cudaGraphDestroy(impl_->graph));
    if (impl_->pool) memory::release_graph_pool(device_, impl_.get(), Stream{capture_stream(device_), device_});
  } catch (const std::exception& e) {  // a destructor must not throw: say what was lost
    std::fprintf(stderr, "frugal: ~CudaGraph: %s (the graph's memory stays reserved)\n", e.what());
  }
}

void CudaGraph::capture(const std::function<void()>& fn, CudaGraphOptions options) {
  FRUGAL_CHECK(!impl_->exec, "CudaGraph.capture: this graph holds a capture already; make another CudaGraph");
  FRUGAL_CHECK(options.warmup >= 0, "CudaGraph.capture: warmup must be >= 0, got ", options.warmup);
  FRUGAL_CHECK(!core::current_graph_capture(), "CudaGraph.capture: another capture runs on this thread");
  CudaDeviceGuard device_guard(device_.index);
  const Stream caller = current_stream(device_);
  const cudaStream_t side = capture_stream(device_);
  stream_wait(side, static_cast<cudaStream_t>(caller.handle));  // the inputs are ready
  {
    StreamGuard stream_guard(Stream{side, device_});
    for (int i = 0; i < options.warmup; ++i) fn();

    if (!impl_->pool) memory::begin_graph_pool(device_, impl_.get());
    impl_->pool = true;
    if (!impl_->rng_base) impl_->rng_base = memory::allocate(device_, sizeof(uint64_t));
    core::GraphCapture capture{.pool_key = impl_.get(),
                               .device = device_,
                               .stream = side,
                               .replay_checks = {},
                               .rng_generator = &default_generator(),
                               .rng_base = impl_->rng_base.get(),
                               .rng_offset = 0};
    core::set_current_graph_capture(&capture);
    // Relaxed: the pools may need a new segment (cudaMalloc, cudaHostAlloc) mid-capture;
    // what must not happen while capturing refuses on its own (core::refuse_in_graph_capture).
    FRUGAL_CUDA_CHECK(cudaStreamBeginCapture(side, cudaStreamCaptureModeRelaxed));
    std::exception_ptr failed;
    try {
      fn();
    } catch (...) { failed = std::current_exception(); }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(side, &graph);
    core::set_current_graph_capture(nullptr);
    if (failed || ended != cudaSuccess) {
      if (graph) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();  // the capture's error is reported below, not by the next call
      if (failed) std::rethrow_exception(failed);
      FRUGAL_FAIL("CudaGraph.capture: CUDA ended the capture with '", cudaGetErrorString(ended),
                  "': the function did something a graph cannot hold (a synchronizing call, work on the legacy "
                  "default stream, or a wait on the host); see Note [CUDA graphs]");
    }
    impl_->graph = graph;
    FRUGAL_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, graph, 0));
    impl_->replay_checks = std::move(capture.replay_checks);
    impl_->rng_total = capture.rng_offset;
    impl_->after_replay = std::move(capture.after_replay);
  }
  stream_wait(static_cast<cudaStream_t>(caller.handle), side);  // the warm-up's results are the caller's
}

void CudaGraph::replay() {
  FRUGAL_CHECK(impl_->exec, "CudaGraph.replay: nothing captured yet (call capture() first)");
  core::refuse_in_graph_capture("CudaGraph.replay", "a replay inside another capture is not supported");
  for (const auto& check : impl_->replay_checks) check();
  CudaDeviceGuard guard(device_.index);
  const auto stream = static_cast<cudaStream_t>(current_stream(device_).handle);
  if (impl_->rng_total > 0) {  // this replay's counters, as an eager step's would be
    const uint64_t first = default_generator().reserve(impl_->rng_total).counter;
    // From pageable memory: the copy has read `first` when the call returns.
    FRUGAL_CUDA_CHECK(cudaMemcpyAsync(impl_->rng_base.get(), &first, sizeof first, cudaMemcpyHostToDevice, stream));
  }
  FRUGAL_CUDA_CHECK(cudaGraphLaunch(impl_->exec, stream));
  if (!impl_->last_replay) FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->last_replay, cudaEventDisableTiming));
  FRUGAL_CUDA_CHECK(cudaEventRecord(impl_->last_replay, stream));                // before anything below may throw
  for (const auto& filed : impl_->after_replay) filed(Stream{stream, device_});  // Note [Index checks in a CUDA graph]
}

bool CudaGraph::captured() const { return impl_->exec != nullptr; }

int64_t CudaGraph::nodes() const {
  if (!impl_->graph) return 0;
  size_t n = 0;
  FRUGAL_CUDA_CHECK(cudaGraphGetNodes(impl_->graph, nullptr, &n));
  return int64_t(n);
}

#else  // a build without CUDA: the class exists, and says why it cannot work

struct CudaGraph::Impl {};

CudaGraph::CudaGraph(Device device) : device_(device), impl_(std::make_unique<Impl>()) {
  FRUGAL_FAIL("CudaGraph: this build of frugal has no CUDA (configure with -Dcuda=enabled), asked for ", device.str());
}
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(const std::function<void()>&, CudaGraphOptions) { FRUGAL_FAIL("CudaGraph: no CUDA"); }
void CudaGraph::replay() { FRUGAL_FAIL("CudaGraph: no CUDA"); }
bool CudaGraph::captured() const { return false; }
int64_t CudaGraph::nodes() const { return 0; }

#endif

}  // namespace frugal
