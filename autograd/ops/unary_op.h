#pragma once
// The one recorded unary op behind autograd/ops/unary.h and activation.h: runs ops::unary (through
// the op's checked public function) and records a UnaryBackward node, whose backward is
// ops::unary_backward. Internal to the differentiable ops; models call the named functions.
#include "tensor/ops/unary.h"
#include "tensor/tensor.h"

namespace frugal::autograd::detail {

/// y = op(x) with parameters a, b as ops::UnaryOp says, differentiable in x; saves x or y as
/// ops::unary_grad_from(op) says.
Tensor unary_op(ops::UnaryOp op, const Tensor& x, double a = 0.0, double b = 0.0);

/// g * op'(x) in differentiable ops, v = x or y as ops::unary_grad_from(op) says, joined to its
/// history: the node's backward under create_graph (Note [Double backward] in
/// autograd/graph_backward.h), also for fused ops that apply a unary op inside.
Tensor unary_grad_graph(ops::UnaryOp op, const Tensor& g, const Tensor& v, double a = 0.0, double b = 0.0);

}  // namespace frugal::autograd::detail
