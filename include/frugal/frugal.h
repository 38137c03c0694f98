#pragma once
// frugal's public API in one include, for a program built on the installed library:
//
//   #include <frugal/frugal.h>   // Cflags from `pkg-config --cflags frugal`
//
// It covers what a training loop uses: Tensor and its factories, the differentiable ops,
// grad mode, autocast and checkpointing, the nn modules and data loading, the optimizers
// and schedules, the allocator's statistics, the profiler and the training helpers (progress
// line, evaluation, checkpoints, metrics log; it parses in under a second).
// The raw ops without autograd (<frugal/tensor/ops/...>), the parallel layer
// (<frugal/parallel/...>) and the models (<frugal/models/...>) are included by path: a
// program opts into them.
//
// The includes are quoted and layer-relative, as everywhere in frugal, so this header
// works both installed (-I<includedir>/frugal) and from a Meson subproject (the source
// root is on the include path).

// core/, memory/
#include "core/device.h"
#include "core/error.h"
#include "core/stream.h"
#include "core/threads.h"
#include "memory/allocator.h"

// tensor/
#include "tensor/dtype.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/random.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

// autograd/
#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/offload.h"
#include "autograd/ops/all.h"
#include "autograd/recompute_cheap.h"

// nn/
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/batch_norm.h"
#include "nn/block_memory.h"
#include "nn/block_planner.h"
#include "nn/channels_last.h"
#include "nn/checkpoint.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/data/dataloader.h"
#include "nn/data/dataset.h"
#include "nn/data/idx.h"
#include "nn/data/transforms.h"
#include "nn/data/wordpiece.h"
#include "nn/group_norm.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/low_rank.h"
#include "nn/low_rank_conv.h"
#include "nn/memory_planner.h"
#include "nn/module.h"
#include "nn/pooling.h"
#include "nn/rms_norm.h"
#include "nn/safetensors.h"
#include "nn/upsampling.h"

// optim/
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

// profiler/
#include "profiler/session.h"

// train/
#include "train/checkpoints.h"
#include "train/checks.h"
#include "train/evaluate.h"
#include "train/metrics_log.h"
#include "train/progress.h"
