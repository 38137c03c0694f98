// Which convolution + batch-norm fusions cuDNN's graph API plans on this GPU, and what they
// would save at ResNet-50's layers (issue 18: "convolution + batch-norm statistics fusions
// where cuDNN's graph API supports them on Hopper"). For each layer, float16, channels-last:
//   conv        y = conv(x): the one-operation graph conv2d runs (runtime-compiled engines allowed)
//   conv+stats  y = conv(x) and per-channel sum(y), sum(y^2) (GENSTATS, float32) in one graph
//   sbr+conv    y = conv(relu(x * scale + bias)) with y's statistics: the previous layer's
//               batch-norm apply and ReLU as the convolution's prologue (cudnn-frontend's
//               "SBRCS" sample; NVIDIA's MLPerf ResNet is built on it)
//   wgrad       the weight gradient conv_wgrad(x, dy), and sbr+wgrad the same of
//               relu(x * scale + bias): the backward's fusion of the same prologue
//   frugal      conv2d, then batch_norm_add_relu (statistics pass, then the normalize + ReLU
//               pass) on its output: the unfused training forward
// The prologue's scale and bias are tried in float16 and in float32 (what the library's
// fused op, tensor/ops/conv_bn.h, passes). It prints whether cuDNN built a plan, the first
// plan's workspace, and the median ms of 20 runs after warm-up (CUDA events).
//   probe_conv_bn_fusion [--batch 128]
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "examples/flags.h"
#include "tensor/cuda/conv_graph.h"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/cudnn_backend.h"
#include "tensor/cuda/cudnn_graph.h"
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

enum Uid : int64_t { kX = 1, kW, kY, kSum, kSqSum, kScale, kBias, kFirstVirtual = 100 };

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

/// A packed channels-last (N, C, H, W) tensor's strides.
GraphDims nhwc(const GraphDims& d) { return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]}; }

enum class Pattern { Conv, ConvStats, SbrConvStats, Wgrad, SbrWgrad };

const char* name_of(Pattern p) {
  switch (p) {
    case Pattern::Conv: return "conv";
    case Pattern::ConvStats: return "conv+stats";
    case Pattern::SbrConvStats: return "sbr+conv+stats";
    case Pattern::Wgrad: return "wgrad";
    case Pattern::SbrWgrad: return "sbr+wgrad";
  }
  return "?";
}

/// Plans and times one pattern: the forward ones on x -> y, the weight gradients on (x, dy = y) -> w.
/// `scale_type`: the data type of the scale-bias-ReLU prologue's per-channel tensors.
Row run_pattern(const Layer& l, Pattern pattern, cudnnDataType_t scale_type, Device device,
                const std::vector<std::pair<int64_t, void*>>& operands) {
  Row row{l.name, name_of(pattern), "", -1};
  if (scale_type == CUDNN_DATA_FLOAT) row.pattern += " (f32 scale)";
  cudnnHandle_t h = cudnn_handle(device);
  GraphBuilder g(CUDNN_DATA_HALF, kFirstVirtual);
  const GraphDims xd{l.N, l.C, l.H, l.W}, wd{l.K, l.C, l.R, l.R}, yd{l.N, l.K, l.OH(), l.OW()}, cd{1, l.C, 1, 1};
  const bool prologue = pattern == Pattern::SbrConvStats || pattern == Pattern::SbrWgrad;
  const bool wgrad = pattern == Pattern::Wgrad || pattern == Pattern::SbrWgrad;
  Descriptor conv;
  try {
    cudnnBackendDescriptor_t x = g.tensor(kX, xd, nhwc(xd), CUDNN_DATA_HALF);
    cudnnBackendDescriptor_t w = g.tensor(kW, wd, nhwc(wd), CUDNN_DATA_HALF);
    cudnnBackendDescriptor_t y = g.tensor(kY, yd, nhwc(yd), CUDNN_DATA_HALF);
    if (prologue) {
      cudnnBackendDescriptor_t scaled = g.virtual_tensor(xd, nhwc(xd)), shifted = g.virtual_tensor(xd, nhwc(xd)),
                               relu = g.virtual_tensor(xd, nhwc(xd));
      g.pointwise(CUDNN_POINTWISE_MUL, x, g.tensor(kScale, cd, nhwc(cd), scale_type), scaled);
      g.pointwise(CUDNN_POINTWISE_ADD, scaled, g.tensor(kBias, cd, nhwc(cd), scale_type), shifted);
      g.pointwise(CUDNN_POINTWISE_RELU_FWD, shifted, nullptr, relu);
      x = relu;
    }
    ops::Conv2dGeometry geometry = ops::conv2d_geometry("probe_conv_bn_fusion", {l.N, l.C, l.H, l.W},
                                                        {l.K, l.C, l.R, l.R}, {.stride = l.stride, .padding = l.pad()});
    geometry.channels_last = true;
    conv = convolution_descriptor(geometry);
    g.convolution(wgrad ? ConvDirection::BackwardFilter : ConvDirection::Forward, conv, x, w, y);
    if (pattern == Pattern::ConvStats || pattern == Pattern::SbrConvStats) {
      const GraphDims kd{1, l.K, 1, 1};
      g.genstats(y, g.tensor(kSum, kd, nhwc(kd), CUDNN_DATA_FLOAT), g.tensor(kSqSum, kd, nhwc(kd), CUDNN_DATA_FLOAT));
    }
  } catch (const Error& e) { return row.plan = std::string("none: ") + e.what(), row; }
  Descriptor op_graph;
  try {
    op_graph = g.finalize(h);
  } catch (const Error& e) { return row.plan = "none: the operation graph does not finalize", row; }
  std::vector<Plan> plans = make_plans(h, op_graph, 1);
  if (plans.empty()) return row.plan = "none: no engine configuration finalized", row;
  const Plan& plan = plans[0];
  row.plan = "yes, workspace " + std::to_string(plan.workspace) + " B";
  std::vector<void*> pointers;
  for (int64_t uid : g.uids())
    for (const auto& [id, ptr] : operands)
      if (id == uid) pointers.push_back(ptr);
  const Tensor ws = empty({std::max<int64_t>(plan.workspace, 1)}, {kBool, device});
  void* ws_ptr = ws.data();
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(g.uids().size()), g.uids().data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws_ptr);
  pack.finalize();
  const cudnnStatus_t first = cudnnBackendExecute(h, plan.plan.get(), pack.get());
  if (first != CUDNN_STATUS_SUCCESS) return row.plan += std::string(", execute: ") + cudnnGetErrorString(first), row;
  row.ms = median_ms(device, [&] { cudnnBackendExecute(cudnn_handle(device), plan.plan.get(), pack.get()); });
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 128;
  cli::parse_or_exit("probe_conv_bn_fusion", "usage: probe_conv_bn_fusion [--batch N]\n", [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--batch")) N = flags.positive();
      else flags.unknown();
    }
    return 0;
  });
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
    const Tensor scale32 = ones({l.C}, {kFloat32, device}), bias32 = zeros({l.C}, {kFloat32, device});
    const std::vector<std::pair<int64_t, void*>> operands{
        {kX, x.data()},          {kW, w.data()},         {kY, y.data()},      {kSum, sum.data()},
        {kSqSum, sq_sum.data()}, {kScale, scale.data()}, {kBias, bias.data()}};
    const std::vector<std::pair<int64_t, void*>> operands32{
        {kX, x.data()},          {kW, w.data()},           {kY, y.data()},        {kSum, sum.data()},
        {kSqSum, sq_sum.data()}, {kScale, scale32.data()}, {kBias, bias32.data()}};
    for (Pattern p : {Pattern::Conv, Pattern::ConvStats, Pattern::SbrConvStats, Pattern::Wgrad, Pattern::SbrWgrad}) {
      rows.push_back(run_pattern(l, p, CUDNN_DATA_HALF, device, operands));
      if (p == Pattern::SbrConvStats || p == Pattern::SbrWgrad)
        rows.push_back(run_pattern(l, p, CUDNN_DATA_FLOAT, device, operands32));
    }
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
