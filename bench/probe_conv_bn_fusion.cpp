// Which convolution + batch-norm fusions cuDNN's graph API plans on this GPU, and what they
// would save at ResNet-50's layers (issue 18: "convolution + batch-norm statistics fusions
// where cuDNN's graph API supports them on Hopper"). For each layer, float16, channels-last:
//   conv        y = conv(x): the one-operation graph conv2d runs (runtime-compiled engines allowed)
//   conv+stats  y = conv(x) and per-channel sum(y), sum(y^2) (GENSTATS, float32) in one graph
//   sbr+conv    y = conv(relu(x * scale + bias)) with y's statistics: the previous layer's
//               batch-norm apply and ReLU as the convolution's prologue (cudnn-frontend's
//               "SBRCS" sample; NVIDIA's MLPerf ResNet is built on it)
//   frugal      what a training forward runs today: conv2d, then batch_norm_add_relu (statistics
//               pass, then the normalize + ReLU pass) on its output
// It prints whether cuDNN built a plan, the first plan's workspace, and the median ms of 20
// runs after warm-up (CUDA events). A missing plan prints its reason; nothing here is used by
// the library.
//   probe_conv_bn_fusion [--batch 128]
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "tensor/cuda/conv_graph.h"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/cudnn_backend.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/conv.h"

using namespace frugal;
using namespace frugal::ops::cuda;

namespace {

using Dims = std::array<int64_t, 4>;

/// A (N, C, H, W) layer: x (N, C, H, W) -> y (N, K, H / stride, W / stride), R x R filter.
struct Layer {
  const char* name;
  int64_t N, C, H, W, K, R, stride;
  int64_t pad() const { return R / 2; }
  int64_t OH() const { return (H + 2 * pad() - R) / stride + 1; }
  int64_t OW() const { return (W + 2 * pad() - R) / stride + 1; }
};

/// An operation graph under construction: owns its descriptors.
class Graph {
 public:
  cudnnBackendDescriptor_t tensor(int64_t uid, Dims dims, cudnnDataType_t type, bool is_virtual = false) {
    const int64_t c = dims[1], h = dims[2], w = dims[3];
    const Dims strides{c * h * w, 1, w * c, c};  // channels-last
    const int64_t alignment = 16;
    Descriptor& d = own(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    if (is_virtual) d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    d.finalize();
    return d.get();
  }
  cudnnBackendDescriptor_t virtual_tensor(Dims dims) { return tensor(next_virtual_++, dims, CUDNN_DATA_FLOAT, true); }

  void conv(const Layer& l, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w, cudnnBackendDescriptor_t y) {
    const Conv2dOptions options{.stride = l.stride, .padding = l.pad()};
    frugal::ops::Conv2dGeometry geometry =
        frugal::ops::conv2d_geometry("probe_conv_bn_fusion", {l.N, l.C, l.H, l.W}, {l.K, l.C, l.R, l.R}, options);
    geometry.channels_last = true;
    Descriptor& c = owned_.emplace_back(convolution_descriptor(geometry));
    const float alpha = 1.0f, beta = 0.0f;
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, c.get())
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    add(op);
  }
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y) {
    const cudnnDataType_t math = CUDNN_DATA_FLOAT;
    Descriptor& pw = own(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    pw.finalize();
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get())
        .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    add(op);
  }
  void genstats(cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t sum, cudnnBackendDescriptor_t sq_sum) {
    const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
    const cudnnDataType_t math = CUDNN_DATA_FLOAT;
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode)
        .set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math)
        .set(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y)
        .set(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum)
        .set(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sq_sum);
    add(op);
  }

  /// The finalized graph's first plan (heuristics A, then the fallback list) and its
  /// workspace; false and `why` when cuDNN builds none.
  bool plan(cudnnHandle_t h, Descriptor& out, int64_t& workspace, std::string& why) {
    Descriptor& graph = own(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()), ops_.data())
        .set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, h);
    if (!graph.try_finalize()) return why = "the operation graph does not finalize", false;
    int configs = 0;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      for (Descriptor& config : suggested_configs(graph, mode)) {
        ++configs;
        Descriptor p(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        p.set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h).set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
        if (!p.try_finalize()) continue;
        int64_t n = 0;
        cudnnBackendGetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                 &workspace);
        out = std::move(p);
        return true;
      }
    }
    why = configs == 0 ? "no engine configuration suggested"
                       : std::to_string(configs) + " configurations, none finalized";
    return false;
  }

 private:
  Descriptor& own(cudnnBackendDescriptorType_t type) { return owned_.emplace_back(type); }
  void add(Descriptor& op) {
    op.finalize();
    ops_.push_back(op.get());
  }
  std::deque<Descriptor> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = 100;
};

enum Uid : int64_t { kX = 1, kW, kY, kSum, kSqSum, kScale, kBias };

/// Median ms of `runs` calls of f after 3 warm-ups, timed with CUDA events on the device's stream.
double median_ms(Device device, const std::function<void()>& f, int runs = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaStream_t s = stream_for(device);
  std::vector<double> ms;
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a, s);
    f();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string layer, pattern, plan;
  double ms = -1;
};

/// Plans and times one fused pattern; `prologue` adds scale-bias-ReLU on x, `stats` GENSTATS on y.
Row run_pattern(const Layer& l, const char* pattern, bool prologue, bool stats, Device device,
                const std::vector<std::pair<int64_t, void*>>& operands) {
  Row row{l.name, pattern, "", -1};
  cudnnHandle_t h = cudnn_handle(device);
  Graph g;
  cudnnBackendDescriptor_t x = g.tensor(kX, {l.N, l.C, l.H, l.W}, CUDNN_DATA_HALF);
  cudnnBackendDescriptor_t w = g.tensor(kW, {l.K, l.C, l.R, l.R}, CUDNN_DATA_HALF);
  cudnnBackendDescriptor_t y = g.tensor(kY, {l.N, l.K, l.OH(), l.OW()}, CUDNN_DATA_HALF);
  cudnnBackendDescriptor_t conv_in = x;
  std::vector<int64_t> uids{kX, kW, kY};
  if (prologue) {
    cudnnBackendDescriptor_t scale = g.tensor(kScale, {1, l.C, 1, 1}, CUDNN_DATA_HALF);
    cudnnBackendDescriptor_t bias = g.tensor(kBias, {1, l.C, 1, 1}, CUDNN_DATA_HALF);
    cudnnBackendDescriptor_t scaled = g.virtual_tensor({l.N, l.C, l.H, l.W});
    cudnnBackendDescriptor_t shifted = g.virtual_tensor({l.N, l.C, l.H, l.W});
    cudnnBackendDescriptor_t relu = g.virtual_tensor({l.N, l.C, l.H, l.W});
    g.pointwise(CUDNN_POINTWISE_MUL, x, scale, scaled);
    g.pointwise(CUDNN_POINTWISE_ADD, scaled, bias, shifted);
    g.pointwise(CUDNN_POINTWISE_RELU_FWD, shifted, nullptr, relu);
    conv_in = relu;
    uids.push_back(kScale), uids.push_back(kBias);
  }
  g.conv(l, conv_in, w, y);
  if (stats) {
    g.genstats(y, g.tensor(kSum, {1, l.K, 1, 1}, CUDNN_DATA_FLOAT), g.tensor(kSqSum, {1, l.K, 1, 1}, CUDNN_DATA_FLOAT));
    uids.push_back(kSum), uids.push_back(kSqSum);
  }
  Descriptor plan;
  int64_t workspace = 0;
  std::string why;
  try {
    if (!g.plan(h, plan, workspace, why)) return row.plan = "none: " + why, row;
  } catch (const Error& e) { return row.plan = std::string("none: ") + e.what(), row; }
  row.plan = "yes, workspace " + std::to_string(workspace) + " B";
  std::vector<void*> pointers;
  for (int64_t uid : uids)
    for (const auto& [id, ptr] : operands)
      if (id == uid) pointers.push_back(ptr);
  const Tensor ws = empty({std::max<int64_t>(workspace, 1)}, {kBool, device});
  void* ws_ptr = ws.data();
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws_ptr);
  pack.finalize();
  const cudnnStatus_t first = cudnnBackendExecute(h, plan.get(), pack.get());
  if (first != CUDNN_STATUS_SUCCESS) return row.plan += std::string(", execute: ") + cudnnGetErrorString(first), row;
  row.ms = median_ms(device, [&] { cudnnBackendExecute(cudnn_handle(device), plan.get(), pack.get()); });
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 128;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--batch") == 0) N = std::atoll(argv[i + 1]);
  const Device device = cuda(0);
  const Layer layers[] = {{"conv2 3x3 64->64 @56", N, 64, 56, 56, 64, 3, 1},
                          {"conv2 1x1 256->64 @56", N, 256, 56, 56, 64, 1, 1},
                          {"conv4 3x3 256->256 @14", N, 256, 14, 14, 256, 3, 1},
                          {"conv5 1x1 2048->512 @7", N, 2048, 7, 7, 512, 1, 1}};
  std::vector<Row> rows;
  for (const Layer& l : layers) {
    const Tensor x = to_channels_last(randn({l.N, l.C, l.H, l.W}, {kFloat16, device}));
    const Tensor w = to_channels_last(randn({l.K, l.C, l.R, l.R}, {kFloat16, device}));
    const Tensor y = empty_channels_last({l.N, l.K, l.OH(), l.OW()}, {kFloat16, device});
    const Tensor sum = empty({l.K}, {kFloat32, device}), sq_sum = empty({l.K}, {kFloat32, device});
    const Tensor scale = ones({l.C}, {kFloat16, device}), bias = zeros({l.C}, {kFloat16, device});
    const std::vector<std::pair<int64_t, void*>> operands{
        {kX, x.data()},          {kW, w.data()},         {kY, y.data()},      {kSum, sum.data()},
        {kSqSum, sq_sum.data()}, {kScale, scale.data()}, {kBias, bias.data()}};
    rows.push_back(run_pattern(l, "conv", false, false, device, operands));
    rows.push_back(run_pattern(l, "conv+stats", false, true, device, operands));
    rows.push_back(run_pattern(l, "sbr+conv+stats", true, true, device, operands));
    // What frugal's training forward runs: conv2d, then batch_norm_add_relu on its output.
    const Tensor rm = zeros({l.K}, {kFloat32, device}), rv = ones({l.K}, {kFloat32, device});
    const Tensor gamma = ones({l.K}, {kFloat32, device}), beta = zeros({l.K}, {kFloat32, device});
    Row conv_row{l.name, "frugal conv2d", "", -1}, bn_row{l.name, "frugal bn+relu (train)", "", -1};
    const Conv2dOptions options{.stride = {l.stride, l.stride}, .padding = {l.pad(), l.pad()}};
    conv_row.ms = median_ms(device, [&] { ops::conv2d(x, w, Tensor(), options); });
    const Tensor out = ops::conv2d(x, w, Tensor(), options);
    bn_row.ms = median_ms(device, [&] { ops::batch_norm_add_relu(out, Tensor(), rm, rv, gamma, beta, true); });
    rows.push_back(conv_row), rows.push_back(bn_row);
  }
  std::printf("cuDNN %zu, %s, float16 channels-last, batch %lld (median ms of 20 after warm-up)\n", cudnnGetVersion(),
              "conv + batch-norm fusions", static_cast<long long>(N));
  std::printf("%-24s %-24s %10s  %s\n", "layer", "pattern", "ms", "plan");
  for (const Row& r : rows) {
    char ms[32];
    std::snprintf(ms, sizeof ms, r.ms < 0 ? "-" : "%.3f", r.ms);
    std::printf("%-24s %-24s %10s  %s\n", r.layer.c_str(), r.pattern.c_str(), ms, r.plan.c_str());
  }
  return 0;
}
