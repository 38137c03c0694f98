// CUDA convolution through cuDNN's convolution API (cudnnConvolutionForward,
// BackwardData, BackwardFilter).
//
// The graph API path (tensor/cuda/conv_graph.cu) runs first; this file's legacy path runs
// what it declines, float64 among them, and everything under set_cudnn_legacy_conv(true).
//
// Note [cuDNN convolution algorithms]
// cuDNN offers several algorithms per direction (implicit GEMM, FFT, Winograd, ...),
// and which is fastest depends on the shape. The first call of each (device, dtype,
// direction, shape, math mode) asks cuDNN for its candidates - heuristics
// (cudnnGet*_v7) by default, or timed runs (cudnnFind*Ex) under set_cudnn_benchmark -
// and caches them, best first, with the workspace each needs. A call then runs the
// first candidate whose workspace the arena can provide (a tensor of bytes on the
// current stream, freed when the call returns), falling back to the next on
// out-of-memory: some algorithm always needs no workspace.
//
// Precision: float16 and bfloat16 data compute in float32 (CUDNN_DATA_FLOAT compute
// type, the "pseudo half" configuration) and may use tensor cores; float32 uses FMA
// kernels only (CUDNN_FMA_MATH: no TF32) unless ops::allow_tf32(), and candidates cuDNN
// reports with tensor-op math are dropped then; float64 computes in float64. The
// candidates' own math type is set on the descriptor before the call, as cuDNN expects.
// The bias is added by a small kernel after the convolution, in float32 for the 16-bit
// types (cuDNN's fused bias path takes only one algorithm).
// Channels-last problems (geometry.channels_last, Note [Channels-last convolution] in
// tensor/ops/conv.h) describe x, y and the filter as CUDNN_TENSOR_NHWC: the same
// logical dims, NHWC memory; cuDNN's tensor-core kernels work in that order natively,
// where NCHW makes them transpose on the fly. The layout is part of the cache key.
#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "tensor/cuda/conv_graph.h"
#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/cudnn_handle.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/matmul.h"

namespace frugal::ops::cuda {

namespace {

constexpr size_t kMaxBenchmarkWorkspace = size_t(1) << 30;  // what cudnnFind*Ex may time algorithms with

cudnnDataType_t data_type(DType t) {
  switch (t) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    default: FRUGAL_FAIL("conv2d: not implemented for ", dtype_name(t), " on cuda");
  }
}

cudnnDataType_t compute_type(DType t) { return t == kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

bool tf32_allowed(DType t) { return t == kFloat32 && allow_tf32(); }

/// The math type cuDNN may search under (see Note [cuDNN convolution algorithms]).
cudnnMathType_t search_math_type(DType t) {
  if (t == kFloat16 || t == kBFloat16) return CUDNN_TENSOR_OP_MATH;
  if (t == kFloat32) return tf32_allowed(t) ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

int to_int(int64_t v) {
  FRUGAL_CHECK(v >= 0 && v <= INT_MAX, "conv2d: size ", v, " is too large for cuDNN");
  return int(v);
}

// ---- descriptors (RAII) -------------------------------------------------------------

class TensorDescriptor {
 public:
  TensorDescriptor(DType t, cudnnTensorFormat_t format, int64_t n, int64_t c, int64_t h, int64_t w) {  // packed
    FRUGAL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_));
    FRUGAL_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(desc_, format, data_type(t), to_int(n), to_int(c), to_int(h), to_int(w)));
  }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(desc_); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDescriptor {
 public:
  FilterDescriptor(DType t, cudnnTensorFormat_t format, int64_t k, int64_t c, int64_t r, int64_t s) {
    FRUGAL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_));
    FRUGAL_CUDNN_CHECK(
        cudnnSetFilter4dDescriptor(desc_, data_type(t), format, to_int(k), to_int(c), to_int(r), to_int(s)));
  }
  ~FilterDescriptor() { cudnnDestroyFilterDescriptor(desc_); }
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvolutionDescriptor {
 public:
  ConvolutionDescriptor(const Conv2dGeometry& g, DType t) {
    FRUGAL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_));
    FRUGAL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(desc_, to_int(g.padding.h), to_int(g.padding.w),
                                                       to_int(g.stride.h), to_int(g.stride.w), to_int(g.dilation.h),
                                                       to_int(g.dilation.w), CUDNN_CROSS_CORRELATION, compute_type(t)));
    FRUGAL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(desc_, to_int(g.groups)));
    set_math(search_math_type(t));
  }
  ~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(desc_); }
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
  void set_math(cudnnMathType_t m) const { FRUGAL_CUDNN_CHECK(cudnnSetConvolutionMathType(desc_, m)); }
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

cudnnTensorFormat_t format_of(const Conv2dGeometry& g) {
  return g.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}

/// The descriptors of one convolution, and the device pointers of one call:
/// x (or grad_x), w (or grad_w), y (or grad_y).
struct ConvProblem {
  const Conv2dGeometry& g;
  DType dtype;
  Device device;
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  void *x_ptr, *w_ptr, *y_ptr;

  ConvProblem(const Conv2dGeometry& geo, DType t, Device dev, void* xp, void* wp, void* yp)
      : g(geo),
        dtype(t),
        device(dev),
        x(t, format_of(geo), geo.N, geo.C, geo.H, geo.W),
        y(t, format_of(geo), geo.N, geo.K, geo.OH, geo.OW),
        w(t, format_of(geo), geo.K, geo.C / geo.groups, geo.R, geo.S),
        conv(geo, t),
        x_ptr(xp),
        w_ptr(wp),
        y_ptr(yp) {}
};

/// alpha = 1 and beta = 0 in the type cuDNN reads them as: double for double data, else float.
struct Scalars {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  const void* one(DType t) const { return t == kFloat64 ? static_cast<const void*>(&d1) : &f1; }
  const void* zero(DType t) const { return t == kFloat64 ? static_cast<const void*>(&d0) : &f0; }
};
constexpr Scalars kScalars{};

// ---- the three directions, as one interface ---------------------------------------------

enum class Direction { Forward, BackwardData, BackwardFilter };

template <Direction D>
struct Ops;

template <>
struct Ops<Direction::Forward> {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static void get(cudnnHandle_t h, const ConvProblem& p, int* n, Perf* perf) {
    FRUGAL_CUDNN_CHECK(
        cudnnGetConvolutionForwardAlgorithm_v7(h, p.x.get(), p.w.get(), p.conv.get(), p.y.get(), kCount, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvProblem& p, void* ws, size_t bytes, int* n, Perf* perf) {
    FRUGAL_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, p.x.get(), p.x_ptr, p.w.get(), p.w_ptr, p.conv.get(),
                                                              p.y.get(), p.y_ptr, kCount, n, perf, ws, bytes));
  }
  static size_t workspace(cudnnHandle_t h, const ConvProblem& p, Algo a) {
    size_t bytes = 0;
    FRUGAL_CUDNN_CHECK(
        cudnnGetConvolutionForwardWorkspaceSize(h, p.x.get(), p.w.get(), p.conv.get(), p.y.get(), a, &bytes));
    return bytes;
  }
  static void run(cudnnHandle_t h, const ConvProblem& p, Algo a, void* ws, size_t bytes) {
    FRUGAL_CUDNN_CHECK(cudnnConvolutionForward(h, kScalars.one(p.dtype), p.x.get(), p.x_ptr, p.w.get(), p.w_ptr,
                                               p.conv.get(), a, ws, bytes, kScalars.zero(p.dtype), p.y.get(), p.y_ptr));
  }
};

template <>
struct Ops<Direction::BackwardData> {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static void get(cudnnHandle_t h, const ConvProblem& p, int* n, Perf* perf) {
    FRUGAL_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w.get(), p.y.get(), p.conv.get(), p.x.get(), kCount, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvProblem& p, void* ws, size_t bytes, int* n, Perf* perf) {
    FRUGAL_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
        h, p.w.get(), p.w_ptr, p.y.get(), p.y_ptr, p.conv.get(), p.x.get(), p.x_ptr, kCount, n, perf, ws, bytes));
  }
  static size_t workspace(cudnnHandle_t h, const ConvProblem& p, Algo a) {
    size_t bytes = 0;
    FRUGAL_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w.get(), p.y.get(), p.conv.get(), p.x.get(), a, &bytes));
    return bytes;
  }
  static void run(cudnnHandle_t h, const ConvProblem& p, Algo a, void* ws, size_t bytes) {
    FRUGAL_CUDNN_CHECK(cudnnConvolutionBackwardData(h, kScalars.one(p.dtype), p.w.get(), p.w_ptr, p.y.get(), p.y_ptr,
                                                    p.conv.get(), a, ws, bytes, kScalars.zero(p.dtype), p.x.get(),
                                                    p.x_ptr));
  }
};

template <>
struct Ops<Direction::BackwardFilter> {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static void get(cudnnHandle_t h, const ConvProblem& p, int* n, Perf* perf) {
    FRUGAL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x.get(), p.y.get(), p.conv.get(), p.w.get(),
                                                                     kCount, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvProblem& p, void* ws, size_t bytes, int* n, Perf* perf) {
    FRUGAL_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        h, p.x.get(), p.x_ptr, p.y.get(), p.y_ptr, p.conv.get(), p.w.get(), p.w_ptr, kCount, n, perf, ws, bytes));
  }
  static size_t workspace(cudnnHandle_t h, const ConvProblem& p, Algo a) {
    size_t bytes = 0;
    FRUGAL_CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x.get(), p.y.get(), p.conv.get(), p.w.get(), a, &bytes));
    return bytes;
  }
  static void run(cudnnHandle_t h, const ConvProblem& p, Algo a, void* ws, size_t bytes) {
    FRUGAL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, kScalars.one(p.dtype), p.x.get(), p.x_ptr, p.y.get(), p.y_ptr,
                                                      p.conv.get(), a, ws, bytes, kScalars.zero(p.dtype), p.w.get(),
                                                      p.w_ptr));
  }
};

// ---- the algorithm cache --------------------------------------------------------------------

struct Candidate {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
};

using AlgoKey = std::tuple<int, int, int, bool, bool, std::vector<int64_t>>;  // device, dtype, direction, tf32,
                                                                              // benchmark, sizes and layout

class AlgoCache {
 public:
  bool lookup(const AlgoKey& key, std::vector<Candidate>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    *out = it->second;
    return true;
  }
  void insert(const AlgoKey& key, std::vector<Candidate> value) {
    std::lock_guard<std::mutex> lock(mu_);
    map_.emplace(key, std::move(value));
  }

 private:
  std::mutex mu_;
  std::map<AlgoKey, std::vector<Candidate>> map_;
};

AlgoCache& algo_cache() {
  static auto* cache = new AlgoCache();  // never destroyed: used until the process exits
  return *cache;
}

AlgoKey make_key(const ConvProblem& p, Direction d) {
  const Conv2dGeometry& g = p.g;
  return {p.device.index,
          int(p.dtype),
          int(d),
          tf32_allowed(p.dtype),
          cudnn_benchmark(),
          {g.N, g.C, g.H, g.W, g.K, g.R, g.S, g.stride.h, g.stride.w, g.padding.h, g.padding.w, g.dilation.h,
           g.dilation.w, g.groups, int64_t(g.channels_last)}};
}

/// The usable entries of cuDNN's answer `perf[0, n)`, in its order, with their workspace sizes.
template <Direction D>
std::vector<Candidate> usable(cudnnHandle_t h, const ConvProblem& p, const typename Ops<D>::Perf* perf, int n) {
  const bool fma_only = p.dtype == kFloat32 && !tf32_allowed(p.dtype);
  std::vector<Candidate> out;
  for (int i = 0; i < n; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    // Tensor-op math on float32 data is TF32: not unless allowed.
    if (fma_only && perf[i].mathType != CUDNN_FMA_MATH && perf[i].mathType != CUDNN_DEFAULT_MATH) continue;
    const cudnnMathType_t math = fma_only ? CUDNN_FMA_MATH : perf[i].mathType;
    p.conv.set_math(math);
    size_t bytes = 0;
    try {
      bytes = Ops<D>::workspace(h, p, perf[i].algo);
    } catch (const Error&) {
      continue;  // the algorithm does not take this problem in this math mode after all
    }
    out.push_back({int(perf[i].algo), math, bytes});
  }
  p.conv.set_math(search_math_type(p.dtype));
  return out;
}

/// Candidates for problem p, best first (see Note [cuDNN convolution algorithms]).
template <Direction D>
std::vector<Candidate> search(cudnnHandle_t h, const ConvProblem& p) {
  using O = Ops<D>;
  typename O::Perf perf[O::kCount];
  int n = 0;
  O::get(h, p, &n, perf);
  std::vector<Candidate> out = usable<D>(h, p, perf, n);
  if (cudnn_benchmark()) {  // time them, with as much workspace as the heuristics' candidates want (capped)
    size_t bytes = 0;
    for (const Candidate& c : out)
      if (c.workspace <= kMaxBenchmarkWorkspace) bytes = std::max(bytes, c.workspace);
    const Tensor ws = try_workspace(int64_t(bytes), p.device);
    if (!ws.defined()) bytes = 0;  // none needed, or none to be had: time what runs without one
    n = 0;
    O::find(h, p, ws.defined() ? ws.data() : nullptr, bytes, &n, perf);
    out = usable<D>(h, p, perf, n);  // fastest first
  }
  FRUGAL_CHECK(!out.empty(), "conv2d: cuDNN has no algorithm for input ", shape_str(p.g.input_shape()), ", weight ",
               shape_str(p.g.weight_shape()), ", stride ", p.g.stride.str(), ", padding ", p.g.padding.str(),
               ", dilation ", p.g.dilation.str(), ", groups ", p.g.groups, " in ", dtype_name(p.dtype));
  return out;
}

/// Runs direction D of problem p with the first cached candidate whose workspace can be had.
template <Direction D>
void run_convolution(const ConvProblem& p) {
  using O = Ops<D>;
  DeviceGuard guard(p.device);
  cudnnHandle_t h = cudnn_handle(p.device);
  const AlgoKey key = make_key(p, D);
  std::vector<Candidate> candidates;
  if (!algo_cache().lookup(key, &candidates)) {
    candidates = search<D>(h, p);
    algo_cache().insert(key, candidates);
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    const bool last = i + 1 == candidates.size();  // its out-of-memory error propagates
    const Tensor ws = last ? workspace(int64_t(c.workspace), p.device) : try_workspace(int64_t(c.workspace), p.device);
    if (c.workspace > 0 && !ws.defined()) continue;
    p.conv.set_math(c.math);
    O::run(h, p, typename O::Algo(c.algo), ws.defined() ? ws.data() : nullptr, c.workspace);
    return;
  }
}

// ---- the bias ------------------------------------------------------------------------------------

// y: (N, K, L) or, channels-last, (N, L, K) += bias: (K), in opmath (cuDNN's cudnnAddTensor
// does not take every dtype)
template <typename T, typename Index>
__global__ void add_bias_kernel(T* __restrict__ y, const T* __restrict__ bias, Index K, Index L, Index numel,
                                bool channels_last) {
  using Acc = opmath_t<T>;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += Index(gridDim.x) * blockDim.x)
    y[i] = T(Acc(y[i]) + Acc(bias[channels_last ? i % K : (i / L) % K]));
}

void add_bias(const Tensor& out, const Tensor& bias, const Conv2dGeometry& g) {
  DeviceGuard guard(out.device());
  const int64_t numel = out.numel(), L = g.OH * g.OW;
  dispatch_floating(out.dtype(), "conv2d", out.device(), [&]<typename T>() {
    if (numel < (int64_t(1) << 31)) {
      add_bias_kernel<T, uint32_t><<<grid_for(numel), kBlockSize, 0, stream_for(out)>>>(
          out.data_ptr<T>(), bias.data_ptr<T>(), uint32_t(g.K), uint32_t(L), uint32_t(numel), g.channels_last);
    } else {
      add_bias_kernel<T, int64_t><<<grid_for(numel), kBlockSize, 0, stream_for(out)>>>(
          out.data_ptr<T>(), bias.data_ptr<T>(), g.K, L, numel, g.channels_last);
    }
    FRUGAL_CUDA_CHECK_LAUNCH();
  });
}

/// Runs the problem through the graph API unless the legacy API was asked for; false when
/// the legacy API must run it (Note [cuDNN graph API convolutions] in conv_graph.cu).
bool run_graph_first(ConvDirection d, const Conv2dGeometry& g, const Tensor& data, void* x, void* w, void* y) {
  return !cudnn_legacy_conv() && run_convolution_graph(d, g, data.dtype(), data.device(), x, w, y);
}

}  // namespace

void conv2d_kernel(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g) {
  if (!run_graph_first(ConvDirection::Forward, g, x, x.data(), w.data(), out.data())) {
    const ConvProblem p(g, x.dtype(), x.device(), x.data(), w.data(), out.data());
    run_convolution<Direction::Forward>(p);
  }
  if (bias.defined()) add_bias(out, bias, g);  // out += bias, broadcast over N, OH, OW
}

void conv2d_backward_input_kernel(const Tensor& grad_x, const Tensor& grad_out, const Tensor& w,
                                  const Conv2dGeometry& g) {
  if (run_graph_first(ConvDirection::BackwardData, g, grad_out, grad_x.data(), w.data(), grad_out.data())) return;
  const ConvProblem p(g, grad_out.dtype(), grad_out.device(), grad_x.data(), w.data(), grad_out.data());
  run_convolution<Direction::BackwardData>(p);
}

void conv2d_backward_weight_kernel(const Tensor& grad_w, const Tensor& grad_out, const Tensor& x,
                                   const Conv2dGeometry& g) {
  if (run_graph_first(ConvDirection::BackwardFilter, g, x, x.data(), grad_w.data(), grad_out.data())) return;
  const ConvProblem p(g, x.dtype(), x.device(), x.data(), grad_w.data(), grad_out.data());
  run_convolution<Direction::BackwardFilter>(p);
}

}  // namespace frugal::ops::cuda
