#pragma once
// Channels-last (NHWC) memory format for 4-D (N, C, H, W) tensors.
//
// Note [Channels-last layout]
// A 4-D tensor keeps its logical shape (N, C, H, W) whatever its memory order; its
// strides say the order. Contiguous (NCHW) strides are (C*H*W, H*W, W, 1); channels-last
// strides are (H*W*C, 1, W*C, C): the C values of one pixel lie next to each other, the
// order cuDNN's tensor-core convolutions and persistent batch norm read fastest. As in
// PyTorch, a size-1 dim's stride does not matter, so a tensor may be both (C == 1, or
// H == W == 1): such a tensor is ambiguous and decides nothing. An op "suggests"
// channels-last for a tensor that is channels-last and not also contiguous
// (PyTorch's suggest_memory_format); ops given such inputs return channels-last
// outputs: conv2d, batch_norm, the pools, elementwise ops (Note [Elementwise output
// layout] in tensor/elementwise.h) and Tensor::to (a dtype or device change keeps the
// layout, so autocast's casts do not undo it). Tensor::contiguous() still means NCHW.
#include "tensor/factory.h"
#include "tensor/tensor.h"

namespace frugal {

/// The channels-last strides (H*W*C, 1, W*C, C) of a 4-D shape (N, C, H, W).
Shape channels_last_strides(const Shape& sizes);

/// Whether x is 4-D with channels-last memory (strides of size-1 dims ignored).
bool is_channels_last(const Tensor& x);

/// Whether x is channels-last and not also contiguous: the layout ops keep for their outputs.
bool suggests_channels_last(const Tensor& x);

/// An uninitialized channels-last tensor of 4-D shape `sizes` (N, C, H, W).
Tensor empty_channels_last(const Shape& sizes, TensorOptions opts);

/// x with channels-last memory: x itself when it already is, else a copy (4-D x only).
/// Differentiable (a permute, contiguous() and a permute back); the gradient keeps the
/// layout of the incoming one.
Tensor to_channels_last(const Tensor& x);

/// Whether x's elements fill a span of exactly numel() elements, each once: a permutation
/// of a contiguous layout (NCHW, NHWC, a transpose), PyTorch's is_non_overlapping_and_dense.
/// An elementwise loop may then walk its memory flat, whatever the order.
bool is_dense(const Tensor& x);

/// Whether a and b have the same sizes and are dense in the same memory order, so a flat
/// walk over each visits corresponding elements (strides of size-1 dims ignored).
bool same_dense_layout(const Tensor& a, const Tensor& b);

/// An uninitialized tensor of like's sizes, in like's memory order when like is dense
/// (PyTorch's empty_like with preserve_format), else contiguous.
Tensor empty_in_layout(const Tensor& like, TensorOptions opts);

/// A fresh copy of t (any device or dtype: t's options) in like's memory order (like of t's sizes).
Tensor copy_in_layout(const Tensor& t, const Tensor& like);
/// The same copy converted to `opts` (dtype and device).
Tensor copy_in_layout(const Tensor& t, const Tensor& like, TensorOptions opts);

/// One op's memory format, for the ops that keep channels-last (conv2d, the pools):
/// channels-last when an operand suggests it; `native` when the backend computes in it
/// (CUDA), else the backend computes NCHW and the result is converted (CPU).
struct OpLayout {
  bool channels_last = false, native = false;
  explicit OpLayout(const Tensor& data, const Tensor& other = Tensor())
      : channels_last(suggests_channels_last(data) || (other.defined() && suggests_channels_last(other))),
        native(channels_last && data.device().is_cuda()) {}
  /// t as the backend takes it: channels-last when native, else contiguous.
  Tensor operand(const Tensor& t) const { return native ? to_channels_last(t) : t.contiguous(); }
  /// An uninitialized result the backend writes.
  Tensor result(const Shape& shape, TensorOptions opts) const {
    return native ? empty_channels_last(shape, opts) : empty(shape, opts);
  }
  /// The backend's result in the op's format.
  Tensor finish(const Tensor& t) const { return channels_last && !native ? to_channels_last(t) : t; }
};

}  // namespace frugal
