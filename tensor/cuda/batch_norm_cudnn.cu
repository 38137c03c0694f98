// cuDNN's persistent NHWC batch norm, plain and fused with ReLU or add + ReLU
// (Note [Channels-last batch norm] and Note [Batch norm add ReLU] in tensor/ops/batch_norm.h).
//
// Note [cuDNN persistent batch norm]
// CUDNN_BATCHNORM_SPATIAL_PERSISTENT keeps a channel's partial sums on chip across the
// whole batch, so the training forward and backward read x once each in NHWC order;
// it is the mode PyTorch picks for channels-last training. The Ex entry points take
// the fused variants (CUDNN_BATCHNORM_OPS_BN_ACTIVATION: y = relu(bn(x)), and
// CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION: y = relu(bn(x) + z)), a
// workspace (per call, from the arena) and a reserve space (from the arena too, kept
// by the caller from the forward to the backward: the fused backward reads the ReLU
// mask from it). These are cuDNN's legacy batch norm functions, still present in
// cuDNN 9 (marked deprecated in favour of the graph API, warning only with
// CUDNN_WARN_DEPRECATED). When cuDNN reports CUDNN_STATUS_NOT_SUPPORTED while sizing
// the problem, the forward writes nothing and returns an undefined reserve, and the
// front-end runs frugal's own kernels instead.
#include <climits>

#include "tensor/cuda/cuda_utils.h"
#include "tensor/cuda/cudnn_handle.h"
#include "tensor/factory.h"
#include "tensor/ops/batch_norm.h"

namespace frugal::ops::cuda {

namespace {

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

int to_int(int64_t v) {
  FRUGAL_CHECK(v >= 0 && v <= INT_MAX, "batch_norm: size ", v, " is too large for cuDNN");
  return int(v);
}

cudnnDataType_t data_type(DType t) {
  switch (t) {
    case kFloat16: return CUDNN_DATA_HALF;
    case kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: FRUGAL_FAIL("batch_norm: cuDNN's persistent batch norm takes float16 or bfloat16, got ", dtype_name(t));
  }
}

/// The descriptors of one problem: x (and y, z, dx, dy, dz: the same) as NHWC, the (C)
/// parameters as cuDNN derives them (float32), and ReLU.
class Descriptors {
 public:
  explicit Descriptors(const Tensor& x) {
    FRUGAL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    FRUGAL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&param_));
    FRUGAL_CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu_));
    FRUGAL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, data_type(x.dtype()), to_int(x.size(0)),
                                                  to_int(x.size(1)), to_int(x.size(2)), to_int(x.size(3))));
    FRUGAL_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(param_, x_, kMode));
    FRUGAL_CUDNN_CHECK(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  }
  ~Descriptors() {
    cudnnDestroyActivationDescriptor(relu_);
    cudnnDestroyTensorDescriptor(param_);
    cudnnDestroyTensorDescriptor(x_);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  cudnnTensorDescriptor_t x() const { return x_; }
  cudnnTensorDescriptor_t param() const { return param_; }
  cudnnActivationDescriptor_t relu() const { return relu_; }

 private:
  cudnnTensorDescriptor_t x_ = nullptr, param_ = nullptr;
  cudnnActivationDescriptor_t relu_ = nullptr;
};

/// An arena tensor of `bytes` bytes on `device` (a zero-byte one for 0).
Tensor bytes_on(Device device, size_t bytes) { return empty({int64_t(bytes)}, {kBool, device}); }

void* ptr(const Tensor& t) { return t.defined() && t.numel() > 0 ? t.data() : nullptr; }

/// True when the call succeeded, false when cuDNN reports the problem unsupported; throws otherwise.
bool supported(cudnnStatus_t status) {
  if (status == CUDNN_STATUS_NOT_SUPPORTED) return false;
  FRUGAL_CUDNN_CHECK(status);
  return true;
}

constexpr float kOne = 1.0f, kZero = 0.0f;

/// cuDNN's name for what follows the normalization.
cudnnBatchNormOps_t ops_for(bool residual, bool relu) {
  return residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
         : relu   ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION
                  : CUDNN_BATCHNORM_OPS_BN;
}

}  // namespace

Tensor batch_norm_cudnn_forward(const Tensor& out, const Tensor& mean, const Tensor& invstd, const Tensor& x,
                                const Tensor& residual, bool relu, const Tensor& weight, const Tensor& bias,
                                const Tensor& running_mean, const Tensor& running_var, double momentum, double eps) {
  if (x.dtype() != kFloat16 && x.dtype() != kBFloat16) return Tensor();
  DeviceGuard guard(x.device());
  const Descriptors d(x);
  const bool fused = residual.defined();
  const cudnnBatchNormOps_t ops = ops_for(fused, relu);
  const cudnnActivationDescriptor_t act = fused || relu ? d.relu() : nullptr;
  cudnnHandle_t h = cudnn_handle(x.device());
  size_t ws_bytes = 0, reserve_bytes = 0;
  if (!supported(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, kMode, ops, d.x(), fused ? d.x() : nullptr,
                                                                          d.x(), d.param(), act, &ws_bytes)) ||
      !supported(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, kMode, ops, act, d.x(), &reserve_bytes)))
    return Tensor();
  const Tensor workspace = bytes_on(x.device(), ws_bytes);
  Tensor reserve = bytes_on(x.device(), reserve_bytes);
  // cuDNN checks the problem before it launches anything: a refusal here has written nothing either.
  if (!supported(cudnnBatchNormalizationForwardTrainingEx(
          h, kMode, ops, &kOne, &kZero, d.x(), x.data(), fused ? d.x() : nullptr, fused ? residual.data() : nullptr,
          d.x(), out.data(), d.param(), weight.data(), bias.data(), momentum, ptr(running_mean), ptr(running_var), eps,
          mean.data(), invstd.data(), act, ptr(workspace), ws_bytes, ptr(reserve), reserve_bytes)))
    return Tensor();
  return reserve;
}

void batch_norm_cudnn_backward(const Tensor& grad_x, const Tensor& grad_residual, const Tensor& grad_weight,
                               const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x, const Tensor& out,
                               bool relu, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                               const Tensor& invstd, const Tensor& reserve, double eps) {
  DeviceGuard guard(x.device());
  const Descriptors d(x);
  const bool fused = grad_residual.defined();
  relu = relu || fused;
  FRUGAL_CHECK(!relu || (out.defined() && bias.defined()),
               "batch_norm_add_relu_backward: cuDNN's fused backward needs the forward's output and bias");
  const cudnnBatchNormOps_t ops = ops_for(fused, relu);
  const cudnnActivationDescriptor_t act = relu ? d.relu() : nullptr;
  const cudnnTensorDescriptor_t y_desc = relu ? d.x() : nullptr, dz_desc = fused ? d.x() : nullptr;
  cudnnHandle_t h = cudnn_handle(x.device());
  size_t ws_bytes = 0;
  FRUGAL_CUDNN_CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, kMode, ops, d.x(), y_desc, d.x(), dz_desc,
                                                                       d.x(), d.param(), act, &ws_bytes));
  const Tensor workspace = bytes_on(x.device(), ws_bytes);
  FRUGAL_CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
      h, kMode, ops, &kOne, &kZero, &kOne, &kZero, d.x(), x.data(), y_desc, relu ? out.data() : nullptr, d.x(),
      grad_out.data(), dz_desc, fused ? grad_residual.data() : nullptr, d.x(), grad_x.data(), d.param(), weight.data(),
      relu ? bias.data() : nullptr, grad_weight.data(), grad_bias.data(), eps, mean.data(), invstd.data(), act,
      ptr(workspace), ws_bytes, ptr(reserve), size_t(reserve.numel())));
}

}  // namespace frugal::ops::cuda
