#pragma once
// What a node's apply_graph needs to write its backward in differentiable ops.
//
// Note [Double backward]
// grad(outputs, inputs, grad_outputs, {.create_graph = true}) returns gradients that have
// history, so they can be differentiated again: a gradient penalty (WGAN-GP's
// (|d critic / d x| - 1)^2), the second derivatives of a physics-informed loss, a
// Hessian-vector product. As in PyTorch, the engine then runs each node's backward with
// grad mode on, so the ops of the formula are recorded like a forward's. A node's usual
// apply() cannot serve: it runs raw ops (frugal::ops, below autograd) on saved tensors
// stored detached (Note [Saved tensor versions]), which keeps the first-order backward
// fast and a node's state small, but records nothing. So a node that supports it also has
// apply_graph(): the same formula in the differentiable ops of autograd/ops/, reading its
// saved tensors through saved_input / saved_output below, which join the detached values
// back to the history they had: an input's through the node's own next edge (its grad_fn,
// or its leaf's AccumulateGrad), an output's through the node itself. The second
// derivative then flows through the original graph as well, as PyTorch's SavedVariable
// unpacking does, and nothing extra is kept for the usual backward. The formulas are
// PyTorch's derivatives.yaml ones, written out in frugal's ops; they need only those
// ops' first-order backward, so any order can be taken (each order's graph is made of
// nodes that have apply_graph again).
//
// Fused kernels recompute what their formula needs from the saved inputs (layer, RMS,
// group and batch norm their statistics, the GELU MLP its pre-activation, flash attention
// its weights); a backward linear in g whose adjoint is the forward (pooling, interpolate,
// masked_select) is recorded as such (linear_map), and convolution's two gradients are
// recorded ops of their own (Note [Convolution double backward]). A node without apply_graph
// (flash attention with dropout, whose mask lives in the kernel's random stream;
// linear_cross_entropy, which keeps gradients instead of its inputs; a checkpoint's replay)
// cannot be differentiated twice: grad() with create_graph checks every node that would run
// before it runs any and names those that cannot, instead of returning a gradient whose
// second derivative silently misses their terms.
// create_graph implies retain_graph: the second backward goes through the first graph.
// Autocast is off while such a run executes (a formula computes in its gradients' dtypes,
// as the first-order backward does). backward() takes create_graph too (BackwardOptions):
// .grad then keeps its history, summed out of place with an earlier .grad (AccumulateGrad's
// apply_graph), as PyTorch's; grad() is usually what is wanted, as it touches no .grad.
#include <functional>

#include "autograd/node.h"
#include "autograd/saved_tensor.h"

namespace frugal::autograd::graph {

/// The saved tensor `saved` of `node`'s input `i`, joined to that input's history (its next
/// edge): a formula built on it is differentiable with respect to the input. Where the input
/// needs no gradient it is the plain values.
Tensor saved_input(const Node& node, size_t i, const SavedTensor& saved);
/// The saved tensor `saved` of `node`'s own output `k`, joined to the node itself (an output
/// is a function of the node's inputs, and its second derivative flows through the node).
Tensor saved_output(Node& node, size_t k, const SavedTensor& saved);
/// `result` (of input i's shape, dtype and device), also depending on `node`'s input i with a
/// zero derivative: a piecewise-linear op's backward (relu's g * mask) is constant in x, and
/// as in PyTorch a second gradient with respect to x (or a bias before it) is then zeros, not
/// "unused".
Tensor with_zero_derivative(const Tensor& result, const Node& node, size_t i);
/// `out` = L(g) for a map L linear in g (a pooling's, an interpolation's or masked_select's
/// backward, run raw), recorded with L's adjoint as its backward: `adjoint(G)` in
/// differentiable ops, so it is recorded in turn at the next order. `name` names the node.
Tensor linear_map(const Tensor& out, const Tensor& g, std::function<Tensor(const Tensor&)> adjoint, const char* name);
/// rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), the means over `dims` (keepdim): the
/// input gradient of a normalization xhat = (x - mean(x)) rstd, rstd = 1 / sqrt(var(x) + eps)
/// over `dims` (layer, group and batch norm), from dxhat, the gradient of xhat; without
/// `centred` (RMS norm: xhat = x rstd) the mean(dxhat) term goes.
Tensor normalized_input_grad(const Tensor& dxhat, const Tensor& xhat, const Tensor& rstd,
                             const std::vector<int64_t>& dims, bool centred);
/// autograd::sum_to in differentiable ops: `grad` summed over the dims broadcasting
/// stretched, to `shape`.
Tensor sum_to(const Tensor& grad, const Shape& shape);
/// sum_to, then in `dtype`: the gradient of a broadcast input.
Tensor reduce_grad(const Tensor& grad, const Shape& shape, DType dtype);

}  // namespace frugal::autograd::graph
