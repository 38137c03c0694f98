#pragma once
// Every differentiable op in one include, for model code and examples:
//
//   #include "autograd/ops/all.h"
//   Tensor y = frugal::softmax(frugal::matmul(q, k.transpose(-1, -2)) * scale, -1);
#include "autograd/ops/conv.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
