#pragma once
// CUDA graphs: a piece of GPU work - a whole static-shape training step - captured once and
// replayed with one launch, so the host's per-kernel cost is paid once (Note [CUDA graphs]).
//
//   CudaGraph graph;                   // on cuda:0
//   graph.capture([&] {                // run eagerly `warmup` times, then captured
//     Tensor loss = mse_loss(model.forward(static_x), static_y);
//     loss.backward();
//     opt.step();                      // SGD (hyperparameters are frozen; replay() checks them)
//     opt.zero_grad();
//   });
//   for (...) {
//     static_x.copy_(next_x), static_y.copy_(next_y);  // the inputs the graph reads, in place
//     graph.replay();                                   // forward, backward and step, one launch
//   }
//
// Note [CUDA graphs]
// A captured kernel reads and writes the addresses it had at capture, and takes the values
// of its scalar arguments as they were. Hence the rules:
//  * Static tensors. The inputs the captured function reads (static_x) and everything it
//    updates (weights, optimizer state) must stay alive, and be refilled in place between
//    replays. Memory the capture allocates comes from the graph's own pool (Note [Graph
//    pools] in memory/caching_allocator.h), so replays never meet another tensor there,
//    and tensors made inside the capture (the loss, gradients) hold each replay's values.
//  * Warm-up first: `warmup` eager runs (2 by default) on the capture stream create the
//    optimizer state, the cuBLAS workspace and cuDNN's plans, so the capture records only
//    the steady-state step. The function should start or end with opt.zero_grad() so that
//    each replay writes the gradients afresh rather than adding to the last replay's.
//  * Nothing host-side replays. Work the host decides anew each step cannot be captured,
//    and refuses with an error naming it (core::refuse_in_graph_capture): synchronize and
//    host reads (item()), Adam-type steps (their bias corrections follow a host step
//    count), SGD's first momentum step, GradScaler (its scale is a host value and step()
//    reads the inf flag on the host), draws from a Generator other than the default one.
//  * Random numbers from the default generator (dropout) are graph-safe: each replay
//    draws the counters an eager step would at that point (Note [Graph-safe random
//    numbers] in tensor/random.h).
//    SGD's lr, momentum and weight decay go into its kernel as values: replay() checks
//    that none changed since the capture (an LR scheduler) and refuses if one did.
//  * One stream. The capture runs on a stream of its own (the legacy default stream cannot
//    be captured) after the caller's stream's work; replay() launches on the caller's
//    current stream. Replay graphs captured on one device from one stream at a time: they
//    share that capture stream's cuBLAS workspace.
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"

namespace frugal {

struct CudaGraphOptions {
  int warmup = 2;  ///< eager runs of the function before the capture (>= 0)
};

class CudaGraph {
 public:
  /// A graph for work on `device` (a CUDA device; throws in a build or process without one).
  explicit CudaGraph(Device device = cuda());
  /// Waits for the replays still running, then gives the graph's memory back.
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// Runs `fn` options.warmup times, then captures it. Throws if this graph holds a capture
  /// already, if another capture runs on this thread, or if `fn` does what a replay would get
  /// wrong (Note [CUDA graphs]); then nothing is captured and the graph can capture again.
  void capture(const std::function<void()>& fn, CudaGraphOptions options = {});
  /// Launches the captured work on the current stream, after checking that what the capture
  /// froze has not changed. Throws before capture().
  void replay();

  bool captured() const;
  /// Nodes (kernels, copies, memsets) of the captured graph.
  int64_t nodes() const;
  Device device() const { return device_; }

 private:
  struct Impl;
  Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace frugal
