#pragma once
// Building and planning cuDNN operation graphs with the backend API: what the fused graph ops
// (attention_cudnn.cu, conv_bn_graph.cu) share. Include only from CUDA translation units.
#include <cudnn.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "tensor/cuda/conv_graph.h"
#include "tensor/cuda/cudnn_backend.h"

namespace frugal::ops::cuda {

using GraphDims = std::vector<int64_t>;
inline constexpr cudnnDataType_t kGraphF32 = CUDNN_DATA_FLOAT;

/// One operation graph under construction, owning its tensors and operations. Every call
/// throws frugal::Error (naming the cuDNN call and cuDNN's reason) when cuDNN refuses.
class GraphBuilder {
 public:
  /// `io`: the data type of the graph's main operands; virtual tensors get ids from `first_virtual`
  /// on (above every id the caller gives its own tensors).
  GraphBuilder(cudnnDataType_t io, int64_t first_virtual) : io_(io), next_uid_(first_virtual) {}

  cudnnDataType_t io() const { return io_; }
  /// The ids of the non-virtual tensors, each once: what a variant pack must supply.
  const std::vector<int64_t>& uids() const { return uids_; }

  /// A tensor the caller supplies (16-byte aligned), of `type`.
  cudnnBackendDescriptor_t tensor(int64_t uid, const GraphDims& dims, const GraphDims& strides, cudnnDataType_t type) {
    uids_.push_back(uid);
    return make_tensor(uid, dims, strides, type, false, false);
  }
  /// A tensor that lives only inside the fused kernel.
  cudnnBackendDescriptor_t virtual_tensor(const GraphDims& dims, const GraphDims& strides,
                                          cudnnDataType_t type = kGraphF32) {
    return make_tensor(next_uid_++, dims, strides, type, true, false);
  }
  /// A float scalar passed by value (a host pointer in the variant pack), with as many dims
  /// as the other operands, all 1, as cudnn-frontend gives its fused scalars.
  /// The same descriptor for every use of one id.
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    for (const auto& [id, d] : scalars_)
      if (id == uid) return d;
    uids_.push_back(uid);
    const GraphDims ones{1, 1, 1, 1};
    scalars_.emplace_back(uid, make_tensor(uid, ones, ones, kGraphF32, false, true));
    return scalars_.back().second;
  }

  /// y = mode(x[, b[, t]]), computed in `math`; `axis` for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnDataType_t math = kGraphF32, cudnnBackendDescriptor_t t = nullptr,
                 int64_t axis = -1) {
    Descriptor& pw = own(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    const float alpha1 = 1.0f, alpha2 = 1.0f;
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get())
        .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha1)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha2);
    if (b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    add(op);
  }
  /// y = Bernoulli(keep) draws (1 kept, 0 dropped) from cuDNN's Philox stream of `seed` at
  /// `offset`, (1, 1, 1, 1) int64 device tensors.
  void bernoulli(cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t seed, cudnnBackendDescriptor_t offset,
                 double keep) {
    Descriptor& rng = own(CUDNN_BACKEND_RNG_DESCRIPTOR);
    const cudnnRngDistribution_t distribution = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    rng.set(CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &distribution)
        .set(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep)
        .finalize();
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RNG_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_RNG_DESC, rng.get())
        .set(CUDNN_ATTR_OPERATION_RNG_SEED, seed)
        .set(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset);
    add(op);
  }
  /// c = a b over the last two dims, batched over the first two, accumulated in float32; m, n,
  /// k, if given, are (B, 1, 1, 1) int32 tensors overriding the product's sizes per batch.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
              cudnnBackendDescriptor_t m = nullptr, cudnnBackendDescriptor_t n = nullptr,
              cudnnBackendDescriptor_t k = nullptr) {
    Descriptor& mm = own(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &kGraphF32).finalize();
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    if (m != nullptr) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m);
    if (n != nullptr) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n);
    if (k != nullptr) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k);
    add(op);
  }
  /// y = reduce(x) over the dims where y has size 1, in float32.
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor& red = own(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &kGraphF32)
        .finalize();
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
    add(op);
  }
  /// y = x with other dims and strides (a transpose, here).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add(op);
  }

  /// One direction of the convolution `conv` (convolution_descriptor()): Forward y = conv(x, w),
  /// BackwardData x = dgrad(y, w), BackwardFilter w = wgrad(x, y); alpha 1, beta 0.
  void convolution(ConvDirection d, const Descriptor& conv, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                   cudnnBackendDescriptor_t y) {
    const ConvOperationNames names = conv_operation_names(d);
    const float alpha = 1.0f, beta = 0.0f;
    Descriptor& op = own(names.kind);
    op.set(names.x, x)
        .set(names.w, w)
        .set(names.y, y)
        .set(names.conv, conv)
        .set(names.alpha, CUDNN_TYPE_FLOAT, 1, &alpha)
        .set(names.beta, CUDNN_TYPE_FLOAT, 1, &beta);
    add(op);
  }
  /// Per-channel sum(y) and sum(y^2) over every other dim, in float32 (GENSTATS).
  void genstats(cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t sum, cudnnBackendDescriptor_t sq_sum) {
    const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode)
        .set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &kGraphF32)
        .set(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y)
        .set(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum)
        .set(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sq_sum);
    add(op);
  }

  /// The finalized operation graph of everything added.
  Descriptor finalize(cudnnHandle_t h) {
    Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()), ops_.data())
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    graph.finalize();
    return graph;
  }

 private:
  Descriptor& own(cudnnBackendDescriptorType_t type) { return owned_.emplace_back(type); }
  void add(Descriptor& op) {
    op.finalize();
    ops_.push_back(op.get());
  }
  cudnnBackendDescriptor_t make_tensor(int64_t uid, const GraphDims& dims, const GraphDims& strides,
                                       cudnnDataType_t type, bool is_virtual, bool by_value) {
    const int64_t alignment = 16;
    Descriptor& d = own(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, int64_t(dims.size()), dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, int64_t(strides.size()), strides.data())
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    if (is_virtual) d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    d.finalize();
    return d.get();
  }

  cudnnDataType_t io_;
  std::deque<Descriptor> owned_;  // a deque: references to its elements survive emplace_back
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::vector<int64_t> uids_;
  std::vector<std::pair<int64_t, cudnnBackendDescriptor_t>> scalars_;
  int64_t next_uid_;
};

/// One executable plan and the workspace it needs.
struct Plan {
  Descriptor config, plan;
  int64_t workspace = 0;
};

/// Up to `max_plans` plans cuDNN builds for `graph`: heuristics mode A, then the fallback list,
/// in that order, each engine configuration that `accept` takes (all by default) and that
/// finalizes.
inline std::vector<Plan> make_plans(cudnnHandle_t h, const Descriptor& graph, size_t max_plans,
                                    const std::function<bool(const Descriptor&)>& accept = {}) {
  std::vector<Plan> plans;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (Descriptor& config : suggested_configs(graph, mode)) {
      if (plans.size() >= max_plans) return plans;
      if (accept && !accept(config)) continue;
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h).set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      if (!plan.try_finalize()) continue;
      int64_t n = 0, workspace = 0;
      if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                   &workspace) != CUDNN_STATUS_SUCCESS)
        continue;
      plans.push_back(Plan{std::move(config), std::move(plan), workspace});
    }
  }
  return plans;
}

}  // namespace frugal::ops::cuda
