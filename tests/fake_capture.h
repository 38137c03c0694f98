#pragma once
// A CUDA graph capture faked on the CPU (tests/cpu/test_graph_capture.cpp, test_masked_ops.cpp):
// the capture state the ops consult, without a GPU.
#include "core/graph_capture.h"

namespace frugal::testing {

/// A capture of the CPU's one stream into pool `key` for the scope.
class FakeCapture {
 public:
  explicit FakeCapture(const void* key)
      : capture_{.pool_key = key, .device = kCPU, .stream = nullptr, .replay_checks = {}} {
    core::set_current_graph_capture(&capture_);
  }
  ~FakeCapture() { core::set_current_graph_capture(nullptr); }
  /// What CudaGraph.replay runs first.
  void check_replay() const {
    for (const auto& check : capture_.replay_checks) check();
  }
  FakeCapture(const FakeCapture&) = delete;
  FakeCapture& operator=(const FakeCapture&) = delete;

 private:
  core::GraphCapture capture_;
};

}  // namespace frugal::testing
