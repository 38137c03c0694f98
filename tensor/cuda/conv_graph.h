#pragma once
// Convolutions through cuDNN's graph (backend) API with cached execution plans
// (Note [cuDNN graph API convolutions] in conv_graph.cu). Include only from CUDA
// translation units.
#include "core/device.h"
#include "tensor/cuda/cudnn_backend.h"
#include "tensor/dtype.h"
#include "tensor/ops/conv.h"
#include "tensor/tensor.h"

namespace frugal::ops::cuda {

/// A convolution workspace of `bytes` from the arena on `device`'s current stream, counted
/// as workspace by the memory profiler; an undefined tensor when bytes <= 0. Throws
/// OutOfMemoryError when the arena cannot provide it.
Tensor workspace(int64_t bytes, Device device);
/// workspace(), but an undefined tensor where it would throw OutOfMemoryError.
Tensor try_workspace(int64_t bytes, Device device);

enum class ConvDirection { Forward, BackwardData, BackwardFilter };

/// The attribute names of one direction's operation: its kind, and x, w, y (or their gradients).
struct ConvOperationNames {
  cudnnBackendDescriptorType_t kind;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
ConvOperationNames conv_operation_names(ConvDirection d);

/// The finalized CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR of g (cross-correlation, float32
/// accumulation): what every direction's operation, fused graphs' included, refers to.
Descriptor convolution_descriptor(const Conv2dGeometry& g);

/// Runs direction `d` of the convolution `g` on `device` with the cached execution plan for
/// its shape (searched on first use): x (or grad_x), w (or grad_w), y (or grad_y) are the
/// device pointers of the three operands, in `dtype`, laid out as g.channels_last says.
/// Returns false, having run nothing, when the graph API has no plan for the problem or
/// none whose workspace the arena can provide: the caller then uses the legacy API.
bool run_convolution_graph(ConvDirection d, const Conv2dGeometry& g, DType dtype, Device device, void* x, void* w,
                           void* y);

}  // namespace frugal::ops::cuda
