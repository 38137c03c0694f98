// CUDA side of the convolution + batch-norm fusions (Note [Convolution batch-norm fusion] in
// tensor/ops/conv_bn.h): the fused cuDNN graphs, built and planned once per problem, and the
// batch_norm_finalize kernel.
//
// The graph of conv_bn_graph, float16/bfloat16 channels-last operands (scale and shift too:
// float32 ones plan no engine on cuDNN 9.14), float32 inside:
//   x --[* scale]--[+ shift]--[ReLU]--> conv(., w) --> y --[GENSTATS]--> sum, sq_sum
// the prologue only with a scale, GENSTATS only with sums. Plans come from the heuristics
// (mode A, then the fallback list) minus engines that down-convert their inputs; the first
// plan whose workspace the arena can provide runs. A problem without plans is remembered,
// and every later call of that shape goes straight to the separate ops.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "tensor/cuda/conv_graph.h"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/cudnn_backend.h"
#include "tensor/cuda/cudnn_graph.h"
#include "tensor/cuda/cudnn_handle.h"
#include "tensor/ops/conv_bn.h"
#include "tensor/ops/conv_bn_math.h"

namespace frugal::ops::cuda {

namespace {

std::atomic<int64_t> graph_runs{0};  // conv_bn_graph_runs()

constexpr size_t kMaxPlans = 3;  // spares in case the arena cannot give the first one its workspace

enum Uid : int64_t { kX = 1, kW, kY, kSum, kSqSum, kScale, kShift, kFirstVirtual = 100 };

/// A packed channels-last (N, C, H, W) tensor's strides.
GraphDims nhwc_strides(const GraphDims& d) { return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]}; }

/// One problem's graph and plans (none: the separate ops run).
struct PlanSet {
  Descriptor conv;                      // the convolution descriptor the graph refers to
  std::unique_ptr<GraphBuilder> graph;  // the tensors and operations the plans refer to
  Descriptor op_graph;
  std::vector<Plan> plans;
};

/// Whether an engine configuration keeps the graph's arithmetic (no input down-conversion).
bool keeps_precision(const Descriptor& config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                               engine.out()) != CUDNN_STATUS_SUCCESS)
    return false;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               int64_t(notes.size()), &n, notes.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  return std::none_of(notes.begin(), notes.begin() + n, [](cudnnBackendNumericalNote_t note) {
    return note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS;
  });
}

std::shared_ptr<const PlanSet> build_plans(cudnnHandle_t h, const Conv2dGeometry& g, DType dtype, bool prologue,
                                           bool stats) {
  auto set = std::make_shared<PlanSet>();
  if (cudnnGetVersion() < 90000) return set;
  try {
    const cudnnDataType_t io = dtype == kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    auto b = std::make_unique<GraphBuilder>(io, kFirstVirtual);
    const GraphDims xd{g.N, g.C, g.H, g.W}, wd{g.K, g.C, g.R, g.S}, yd{g.N, g.K, g.OH, g.OW};
    cudnnBackendDescriptor_t in = b->tensor(kX, xd, nhwc_strides(xd), io);
    cudnnBackendDescriptor_t w = b->tensor(kW, wd, nhwc_strides(wd), io);
    cudnnBackendDescriptor_t y = b->tensor(kY, yd, nhwc_strides(yd), io);
    if (prologue) {
      const GraphDims cd{1, g.C, 1, 1};
      cudnnBackendDescriptor_t scaled = b->virtual_tensor(xd, nhwc_strides(xd));
      b->pointwise(CUDNN_POINTWISE_MUL, in, b->tensor(kScale, cd, nhwc_strides(cd), io), scaled);
      cudnnBackendDescriptor_t shifted = b->virtual_tensor(xd, nhwc_strides(xd));
      b->pointwise(CUDNN_POINTWISE_ADD, scaled, b->tensor(kShift, cd, nhwc_strides(cd), io), shifted);
      cudnnBackendDescriptor_t relu = b->virtual_tensor(xd, nhwc_strides(xd));
      b->pointwise(CUDNN_POINTWISE_RELU_FWD, shifted, nullptr, relu);
      in = relu;
    }
    set->conv = convolution_descriptor(g);
    b->convolution(ConvDirection::Forward, set->conv, in, w, y);
    if (stats) {
      const GraphDims kd{1, g.K, 1, 1};
      b->genstats(y, b->tensor(kSum, kd, nhwc_strides(kd), kGraphF32),
                  b->tensor(kSqSum, kd, nhwc_strides(kd), kGraphF32));
    }
    Descriptor op_graph = b->finalize(h);
    std::vector<Plan> plans = make_plans(h, op_graph, kMaxPlans, keeps_precision);
    set->graph = std::move(b), set->op_graph = std::move(op_graph), set->plans = std::move(plans);
  } catch (const Error&) {
    set->plans.clear();  // cuDNN refused a node: no plan, the separate ops run
  }
  return set;
}

using PlanKey = std::vector<int64_t>;

PlanKey make_key(const Conv2dGeometry& g, DType dtype, Device device, bool prologue, bool stats) {
  return {device.index,
          int64_t(dtype),
          int64_t(prologue),
          int64_t(stats),
          g.N,
          g.C,
          g.H,
          g.W,
          g.K,
          g.R,
          g.S,
          g.stride.h,
          g.stride.w,
          g.padding.h,
          g.padding.w,
          g.dilation.h,
          g.dilation.w};
}

/// Runs `plan` on the operands; cuDNN's status (nothing thrown).
cudnnStatus_t execute(cudnnHandle_t h, const Plan& plan, const std::vector<int64_t>& uids,
                      const std::vector<void*>& pointers, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  return cudnnBackendExecute(h, plan.plan.get(), pack.get());
}

/// One thread per channel: mean, invstd from the sums (or the running statistics), the
/// running statistics' update, scale and shift (Note [Convolution batch-norm fusion]).
template <typename Acc>
__global__ void finalize_kernel(Acc* __restrict__ mean, Acc* __restrict__ invstd, Acc* __restrict__ scale,
                                Acc* __restrict__ shift, Acc* __restrict__ rm, Acc* __restrict__ rv,
                                const Acc* __restrict__ sum, const Acc* __restrict__ sq_sum,
                                const Acc* __restrict__ weight, const Acc* __restrict__ bias, int64_t C, int64_t count,
                                bool training, double momentum, double eps, bool half_affine) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < C)
    math::finalize_channel(c, mean, invstd, scale, shift, rm, rv, sum, sq_sum, weight, bias, count, training, momentum,
                           eps, half_affine);
}

}  // namespace

bool conv_bn_graph(const Conv2dGeometry& g, const Tensor& y, const Tensor& sum, const Tensor& sq_sum, const Tensor& x,
                   const Tensor& scale, const Tensor& shift, const Tensor& w) {
  const bool prologue = scale.defined(), stats = sum.defined();
  std::vector<int64_t> uids{kX, kW, kY};
  std::vector<void*> pointers{x.data(), w.data(), y.data()};
  if (prologue)
    uids.insert(uids.end(), {kScale, kShift}), pointers.insert(pointers.end(), {scale.data(), shift.data()});
  if (stats) uids.insert(uids.end(), {kSum, kSqSum}), pointers.insert(pointers.end(), {sum.data(), sq_sum.data()});
  // The graph declares 16-byte aligned operands.
  if (std::any_of(pointers.begin(), pointers.end(), [](void* p) { return pointer_alignment(p, 16) < 16; }))
    return false;
  const Device device = x.device();
  DeviceGuard guard(device);
  cudnnHandle_t h = cudnn_handle(device);
  const PlanKey key = make_key(g, x.dtype(), device, prologue, stats);
  std::shared_ptr<const PlanSet> set = plan_cache<PlanKey, PlanSet>().lookup(key);
  if (set == nullptr) {
    set = build_plans(h, g, x.dtype(), prologue, stats);
    plan_cache<PlanKey, PlanSet>().insert(key, set);
  }
  for (const Plan& plan : set->plans) {
    Tensor ws = try_workspace(plan.workspace, device);
    if (plan.workspace > 0 && !ws.defined()) continue;
    FRUGAL_CUDNN_CHECK(execute(h, plan, uids, pointers, ws.defined() ? ws.data() : nullptr));
    graph_runs.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  return false;
}

int64_t conv_bn_graph_runs() { return graph_runs.load(std::memory_order_relaxed); }

void batch_norm_finalize_kernel(const BatchNormAffine& out, const Tensor& sum, const Tensor& sq_sum, int64_t count,
                                const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                                const Tensor& bias, bool training, double momentum, double eps, bool half_affine) {
  const int64_t C = out.mean.numel();
  if (C == 0) return;
  DeviceGuard guard(out.mean.device());
  auto run = [&]<typename Acc>() {
    finalize_kernel<Acc><<<grid_for(C), kBlockSize, 0, stream_for(out.mean)>>>(
        out.mean.data_ptr<Acc>(), out.invstd.data_ptr<Acc>(), out.scale.data_ptr<Acc>(), out.shift.data_ptr<Acc>(),
        mut_ptr_or_null<Acc>(running_mean), mut_ptr_or_null<Acc>(running_var), ptr_or_null<Acc>(sum),
        ptr_or_null<Acc>(sq_sum), ptr_or_null<Acc>(weight), ptr_or_null<Acc>(bias), C, count, training, momentum, eps,
        half_affine);
    FRUGAL_CUDA_CHECK_LAUNCH();
  };
  if (out.mean.dtype() == kFloat64) run.template operator()<double>();
  else run.template operator()<float>();
}

}  // namespace frugal::ops::cuda
