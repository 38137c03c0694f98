#pragma once
// Every differentiable op in one include, for model code and examples:
//
//   #include "autograd/ops/all.h"
//   Tensor y = frugal::softmax(frugal::matmul(q, k.transpose(-1, -2)) * scale, -1);
//
// One header per op stem (docs/design.md, "One op, one stem"), plus the operators and
// the views' hook.
#include "autograd/ops/activation.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/batch_norm.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/conv1d.h"
#include "autograd/ops/conv_bn.h"
#include "autograd/ops/cumsum.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/flash_attention.h"
#include "autograd/ops/group_norm.h"
#include "autograd/ops/index.h"
#include "autograd/ops/interpolate.h"
#include "autograd/ops/join.h"
#include "autograd/ops/linear_cross_entropy.h"
#include "autograd/ops/logsumexp.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/masked.h"
#include "autograd/ops/masked_softmax.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/norm.h"
#include "autograd/ops/operators.h"
#include "autograd/ops/pool.h"
#include "autograd/ops/pool1d.h"
#include "autograd/ops/prob_loss.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/rms_norm.h"
#include "autograd/ops/shape_ops.h"
#include "autograd/ops/softmax.h"
#include "autograd/ops/unary.h"
#include "autograd/ops/view.h"
