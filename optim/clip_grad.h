#pragma once
// Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_.
//
// Note [Clipping without a sync]
// The total norm is ||(||g_1||_p, ..., ||g_n||_p)||_p = (sum_i sum |g_i|^p)^(1/p) (the
// largest |g| for p = inf) over every parameter that has a gradient. Gradients are
// scaled in place by clamp(max_norm / (total + 1e-6), max = 1), which leaves them
// unchanged unless total > max_norm (a NaN or inf total makes them NaN, as in PyTorch).
// On CUDA the norm is one multi-tensor kernel writing per-chunk partial sums, a frugal
// reduction (ops::sum or ops::amax) over them, and a one-thread kernel that computes
// the total and the coefficient on the device; one more multi-tensor kernel scales
// every gradient by the coefficient it reads from device memory. Nothing waits for the
// host, so clip_grad_norm_async() queues all of it and returns the norm as a 0-d device
// tensor. clip_grad_norm_() returns a double, which costs exactly one host sync (the
// copy of that 0-d tensor, after the scaling has been queued). The CUDA partials
// accumulate in float64; the returned norm and the coefficient are float64 when any
// gradient is float64 and float32 otherwise, as PyTorch's (whose norm has the gradients'
// dtype; for 16-bit gradients frugal's is float32). On the CPU the norm and the coefficient
// are computed in double.
#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::optim {

/// Scales the gradients of `params` (those that have one, all on one device) so that
/// their total `norm_type`-norm (> 0, or infinity) is at most `max_norm` (>= 0: a negative
/// or NaN one, which PyTorch takes and which flips or poisons every gradient, is refused); returns the
/// total norm before clipping. One host sync on CUDA (see Note [Clipping without a sync]).
/// With error_if_nonfinite, a NaN or infinite total norm throws before any gradient is scaled
/// (torch's flag; without it the gradients become NaN, as PyTorch's do).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

/// clip_grad_norm_ over gradients sharded across processes (FSDP's shards hold part of every
/// gradient): this process's sum of |g|^p (max |g| for p = inf) goes through `combine`, an
/// all-reduce over the ranks (a max when is_max), before the root is taken, so every rank clips
/// by the whole model's norm. Every rank must call it. The gradients may be on any one device
/// (off the CPU, one host read per gradient).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       const std::function<double(double part, bool is_max)>& combine);
/// Clamps every gradient of `params` (those that have one) into [-clip_value, clip_value] in
/// place, as torch.nn.utils.clip_grad_value_ (NaN stays NaN); clip_value must be >= 0.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

/// As clip_grad_norm_, without the sync: returns the total norm as a 0-d tensor on the
/// gradients' device (the CPU when no parameter has a gradient), float64 when a gradient is
/// float64, float32 otherwise. For training loops.
Tensor clip_grad_norm_async(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace frugal::optim
