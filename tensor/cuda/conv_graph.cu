// Convolutions through cuDNN's graph (backend) API.
//
// Note [cuDNN graph API convolutions]
// cuDNN 9 implements its legacy cudnnConvolution* calls on top of the graph API, and a
// legacy call pays for that on the host every time: a ResNet-50 training step measured
// ~90 us of host time per forward convolution and ~150 us per backward one, so the
// host, not the GPU, set the pace (bench/train_step's "fwd+bwd host ms"). Here, as in
// PyTorch, each (device, dtype, direction, shape, layout, pointer alignment, TF32,
// benchmark) problem builds its operation graph and execution plans once; a call then
// only fills a variant pack (the three pointers and the workspace) and executes.
//
// Plans come from cuDNN's heuristics (mode A, then the fallback list), minus the engines
// PyTorch also avoids: those that down-convert their inputs, those that compile at run
// time (NVRTC; a cold start of seconds), and for float32 without ops::allow_tf32() those
// with the tensor-core note (TF32). Under set_cudnn_benchmark the first call times up to
// kMaxTimedPlans of them on the call's own operands (the outputs are overwritten, the
// inputs only read) and orders them fastest first; otherwise the heuristics' order
// stands. A call runs the first plan whose workspace the arena can provide. When no
// plan can be built, or no workspace had, run_convolution_graph returns false and
// tensor/cuda/conv.cu runs the legacy API, which always has a no-workspace algorithm.
#include "tensor/cuda/conv_graph.h"

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "core/instrument.h"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/cudnn_backend.h"
#include "tensor/cuda/cudnn_graph.h"
#include "tensor/cuda/cudnn_handle.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"

namespace frugal::ops::cuda {

namespace {

constexpr int kMaxTimedPlans = 12;                            // what benchmark mode times per problem
constexpr int64_t kMaxBenchmarkWorkspace = int64_t(1) << 30;  // bytes a timed plan may ask for
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;            // the operands' ids in a variant pack

cudnnDataType_t data_type(DType t) {
  switch (t) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    default: FRUGAL_FAIL("conv2d: the cuDNN graph path does not take ", dtype_name(t));
  }
}

/// cuDNN picks vectorized kernels by the operands' alignment (at most 16 bytes matter).
int64_t alignment_of(const void* p) { return pointer_alignment(p, 16); }

/// A packed 4-D tensor of logical dims (n, c, h, w), NCHW or NHWC in memory.
Descriptor make_tensor(int64_t uid, DType t, std::array<int64_t, 4> dims, bool nhwc, int64_t alignment) {
  const int64_t c = dims[1], h = dims[2], w = dims[3];
  const std::array<int64_t, 4> strides =
      nhwc ? std::array<int64_t, 4>{c * h * w, 1, w * c, c} : std::array<int64_t, 4>{c * h * w, h * w, w, 1};
  const cudnnDataType_t type = data_type(t);
  Descriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  d.finalize();
  return d;
}

/// Everything one problem's plans refer to, kept alive with them; plans fastest first.
struct PlanSet {
  std::vector<Descriptor> tensors, ops;
  std::vector<Plan> plans;
};

/// Whether an engine configuration is one we run (see the Note): no input down-conversion,
/// no run-time compilation, no TF32 on float32 unless allowed.
bool acceptable(const Descriptor& config, DType dtype) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                               engine.out()) != CUDNN_STATUS_SUCCESS)
    return false;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> numerical{};
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               int64_t(numerical.size()), &n, numerical.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < n; ++i) {
    if (numerical[size_t(i)] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
    if (numerical[size_t(i)] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && dtype == kFloat32 && !allow_tf32()) return false;
  }
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               int64_t(behavior.size()), &n, behavior.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < n; ++i)
    if (behavior[size_t(i)] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) return false;
  return true;
}

/// Queues one execution of `plan` on x, w, y; cudnn's status on failure (nothing thrown).
cudnnStatus_t execute(cudnnHandle_t h, const Plan& plan, void* x, void* w, void* y, void* workspace) {
  void* pointers[3] = {x, w, y};
  const int64_t uids[3] = {kUidX, kUidW, kUidY};
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers)
      .set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  return cudnnBackendExecute(h, plan.plan.get(), pack.get());
}

/// Milliseconds per execution of `plan` on the call's operands, or a negative number when it
/// cannot run (no workspace, or cuDNN refuses at execution).
float time_plan(cudnnHandle_t h, const Plan& plan, Device device, void* x, void* w, void* y) {
  if (plan.workspace > kMaxBenchmarkWorkspace) return -1;
  Tensor ws = try_workspace(plan.workspace, device);
  if (plan.workspace > 0 && !ws.defined()) return -1;
  void* ws_ptr = ws.defined() ? ws.data() : nullptr;
  if (execute(h, plan, x, w, y, ws_ptr) != CUDNN_STATUS_SUCCESS) return -1;  // also the warm-up
  constexpr int kRuns = 3;
  void* start = core::record_timing_event(device);
  for (int i = 0; i < kRuns; ++i) execute(h, plan, x, w, y, ws_ptr);
  void* stop = core::record_timing_event(device);
  FRUGAL_CUDA_CHECK(cudaStreamSynchronize(stream_for(device)));
  const double ms = core::timing_event_elapsed_ms(start, stop);
  core::release_timing_event(start);
  core::release_timing_event(stop);
  return float(ms / kRuns);
}

/// Builds the plans for one problem (see the Note); an empty set when cuDNN offers none.
std::shared_ptr<const PlanSet> build_plans(cudnnHandle_t h, ConvDirection d, const Conv2dGeometry& g, DType dtype,
                                           Device device, void* x, void* w, void* y) {
  auto set = std::make_shared<PlanSet>();
  const bool nhwc = g.channels_last;
  set->tensors.push_back(make_tensor(kUidX, dtype, {g.N, g.C, g.H, g.W}, nhwc, alignment_of(x)));
  set->tensors.push_back(make_tensor(kUidW, dtype, {g.K, g.C / g.groups, g.R, g.S}, nhwc, alignment_of(w)));
  set->tensors.push_back(make_tensor(kUidY, dtype, {g.N, g.K, g.OH, g.OW}, nhwc, alignment_of(y)));
  set->ops.push_back(convolution_descriptor(g));
  const ConvOperationNames names = conv_operation_names(d);
  const float alpha = 1.0f, beta = 0.0f;
  Descriptor op(names.kind);
  op.set(names.x, set->tensors[0])
      .set(names.w, set->tensors[1])
      .set(names.y, set->tensors[2])
      .set(names.conv, set->ops[0])
      .set(names.alpha, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(names.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  if (!op.try_finalize()) return set;
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, op).set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, h);
  if (!graph.try_finalize()) return set;

  const size_t wanted = cudnn_benchmark() ? size_t(kMaxTimedPlans) : 4;  // a few spares in case of OOM
  set->plans = make_plans(h, graph, wanted, [&](const Descriptor& config) { return acceptable(config, dtype); });
  set->ops.push_back(std::move(op));
  set->ops.push_back(std::move(graph));
  if (cudnn_benchmark() && set->plans.size() > 1) {
    std::vector<std::pair<float, size_t>> timed;  // (ms, index), runnable plans only
    for (size_t i = 0; i < set->plans.size(); ++i) {
      const float ms = time_plan(h, set->plans[i], device, x, w, y);
      if (ms >= 0) timed.emplace_back(ms, i);
    }
    if (!timed.empty()) {
      std::stable_sort(timed.begin(), timed.end());
      std::vector<Plan> ordered;
      for (const auto& [ms, i] : timed) ordered.push_back(std::move(set->plans[i]));
      set->plans = std::move(ordered);
    }
  }
  return set;
}

using PlanKey = std::tuple<int, int, int, bool, bool, std::array<int64_t, 18>>;  // device, dtype, direction,
                                                                                 // tf32, benchmark, geometry

PlanKey make_key(ConvDirection d, const Conv2dGeometry& g, DType dtype, Device device, void* x, void* w, void* y) {
  return {device.index,
          int(dtype),
          int(d),
          dtype == kFloat32 && allow_tf32(),
          cudnn_benchmark(),
          {g.N, g.C, g.H, g.W, g.K, g.R, g.S, g.stride.h, g.stride.w, g.padding.h, g.padding.w, g.dilation.h,
           g.dilation.w, g.groups, int64_t(g.channels_last), alignment_of(x), alignment_of(w), alignment_of(y)}};
}

}  // namespace

ConvOperationNames conv_operation_names(ConvDirection d) {
  switch (d) {
    case ConvDirection::Forward:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case ConvDirection::BackwardData:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case ConvDirection::BackwardFilter:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  }
  FRUGAL_FAIL("conv2d: unknown convolution direction");
}

Descriptor convolution_descriptor(const Conv2dGeometry& g) {
  const int64_t spatial_dims = 2;
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;  // 16-bit data accumulate in float32
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t padding[2] = {g.padding.h, g.padding.w}, stride[2] = {g.stride.h, g.stride.w},
                dilation[2] = {g.dilation.h, g.dilation.w};
  Descriptor d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  d.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial_dims)
      .set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding)
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation)
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
  d.finalize();
  return d;
}

Tensor workspace(int64_t bytes, Device device) {
  if (bytes <= 0) return {};
  core::CategoryScope category(core::Category::Workspace);  // for the memory profiler
  return empty({bytes}, {kBool, device});                   // from the arena, on this stream
}

Tensor try_workspace(int64_t bytes, Device device) {
  try {
    return workspace(bytes, device);
  } catch (const OutOfMemoryError&) { return {}; }
}

bool run_convolution_graph(ConvDirection d, const Conv2dGeometry& g, DType dtype, Device device, void* x, void* w,
                           void* y) {
  if (dtype != kFloat32 && dtype != kFloat16 && dtype != kBFloat16) return false;
  DeviceGuard guard(device);
  cudnnHandle_t h = cudnn_handle(device);
  const PlanKey key = make_key(d, g, dtype, device, x, w, y);
  std::shared_ptr<const PlanSet> set = plan_cache<PlanKey, PlanSet>().lookup(key);
  if (set == nullptr) {
    set = build_plans(h, d, g, dtype, device, x, w, y);
    plan_cache<PlanKey, PlanSet>().insert(key, set);
  }
  for (const Plan& plan : set->plans) {
    Tensor ws = try_workspace(plan.workspace, device);
    if (plan.workspace > 0 && !ws.defined()) continue;
    FRUGAL_CUDNN_CHECK(execute(h, plan, x, w, y, ws.defined() ? ws.data() : nullptr));
    return true;
  }
  return false;
}

}  // namespace frugal::ops::cuda
