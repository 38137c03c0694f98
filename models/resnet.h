#pragma once
// ResNet (He et al., 2015) as torchvision builds it: v1.5, where a Bottleneck strides on
// its 3x3 conv, not its first 1x1. ResNet-18/34 stack BasicBlocks, ResNet-50/101/152
// Bottlenecks. Parameter and buffer names are torchvision's ("conv1.weight",
// "layer1.0.downsample.1.running_mean", "fc.bias"), so its checkpoints load unchanged.
//
//   auto net = models::resnet50({.num_classes = 10});
//   Tensor logits = net->forward(images);  // images (N, 3, H, W) -> (N, 10)
#include <array>
#include <memory>

#include "autograd/checkpoint.h"
#include "nn/batch_norm.h"
#include "nn/block_memory.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"

namespace frugal::json {
struct Value;
}

namespace frugal::models {

struct ResNetOptions {
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  /// For small images (28x28 Fashion-MNIST, 32x32 CIFAR): conv1 is a 3x3, stride 1,
  /// padding 1 conv and there is no max pool, so layer1 sees the full resolution. The
  /// state-dict keys do not change (the pool has no parameters); conv1.weight's shape does.
  bool small_input_stem = false;
  /// Start each block's last batch norm weight at zero, so every residual branch starts as
  /// the identity (Goyal et al., 2017), as torchvision's zero_init_residual.
  bool zero_init_residual = false;
  /// Run each residual block under autograd::checkpoint: its activations are recomputed in
  /// backward instead of kept. The recompute leaves the batch norm running statistics alone
  /// (torch.utils.checkpoint updates them a second time; Note [Checkpoint recompute]).
  bool checkpoint_blocks = false;
  /// What a checkpointed block keeps: Full (its input only) or Selective (also its
  /// convolutions' outputs, so only batch norm and ReLU run again: Note [Selective checkpoint]).
  autograd::CheckpointPolicy checkpoint_policy = autograd::CheckpointPolicy::Full;
  /// Compute each relu(bn(.)) and relu(bn(.) + shortcut) as one op (BatchNorm2d::forward_relu:
  /// cuDNN's fused BN+ReLU / BN+add+ReLU for channels-last float16 training on CUDA). Same
  /// parameters, state-dict keys and results as the unfused blocks.
  bool fused_bn_relu = false;
  /// Fuse each block's inner batch norms into the convolutions around them (Note
  /// [Convolution batch-norm fusion]): a convolution also returns its output's batch
  /// statistics, and the next one applies bn + ReLU as its prologue, so relu(bn(.)) is
  /// neither written nor kept. Implies fused_bn_relu for the block tails. Same parameters,
  /// state-dict keys and results (to rounding) as the unfused blocks. Under checkpoint_policy
  /// Selective the fused convolutions are replayed, not kept as plain conv2d outputs are.
  bool fused_conv_bn = false;
};

/// How a block runs its batch norms (ResNetOptions::fused_bn_relu, fused_conv_bn).
struct BlockFusion {
  bool bn_relu = false, conv_bn = false;
};

enum class BlockType { Basic, Bottleneck };

/// Two 3x3 convs (ResNet-18/34). Children: conv1, bn1, conv2, bn2[, downsample].
class BasicBlock : public nn::UnaryModule {
 public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, BlockFusion fusion = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "BasicBlock"; }

  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Sequential> downsample;  // null when the shortcut is the identity
  const BlockFusion fusion;
};

/// 1x1 (reduce), 3x3 (stride), 1x1 (expand by 4) (ResNet-50/101/152). Children: conv1,
/// bn1, conv2, bn2, conv3, bn3[, downsample].
class Bottleneck : public nn::UnaryModule {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, BlockFusion fusion = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Bottleneck"; }

  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::Sequential> downsample;
  const BlockFusion fusion;
};

/// The network: stem (conv1, bn1, relu, maxpool), layer1..layer4 (nn::Sequential of
/// blocks, widths 64/128/256/512 times the expansion, strides 1/2/2/2), global average
/// pool and fc. Initialised as torchvision: convs kaiming_normal_(fan_out, relu), batch
/// norms weight 1 and bias 0, fc as nn.Linear.
class ResNet : public nn::UnaryModule {
 public:
  ResNet(BlockType block, std::array<int64_t, 4> blocks_per_layer, ResNetOptions options = {});
  /// x (N, in_channels, H, W) -> logits (N, num_classes).
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ResNet"; }

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::Linear> fc;
  const BlockType block;
  const std::array<int64_t, 4> blocks_per_layer;
  const ResNetOptions options;
  /// What each block keeps for backward (Note [Block memory plan]): block 0 is the stem
  /// (conv1, bn1, ReLU, max pool), then the residual blocks from layer1.0 on. Starts as
  /// options.checkpoint_blocks and checkpoint_policy say (they leave the stem as it is).
  /// nn::BlockPlanner sets it.
  nn::BlockMemoryPlan memory_plan;
  /// The stem and the residual blocks over all four layers (17 for ResNet-50).
  int64_t num_blocks() const;
  /// x (N, in_channels, H, W) -> the first residual block's input.
  Tensor stem(const Tensor& x);

 private:
  static nn::BlockMemoryPlan plan_of(const ResNetOptions& o);
  std::shared_ptr<nn::Sequential> make_layer(int64_t& in_planes, int64_t planes, int64_t blocks, int64_t stride);
};

/// depth 18, 34, 50, 101 or 152 (torchvision's resnetNN); anything else throws.
std::shared_ptr<ResNet> resnet(int64_t depth, ResNetOptions options = {});
inline std::shared_ptr<ResNet> resnet18(ResNetOptions o = {}) { return resnet(18, o); }
inline std::shared_ptr<ResNet> resnet34(ResNetOptions o = {}) { return resnet(34, o); }
inline std::shared_ptr<ResNet> resnet50(ResNetOptions o = {}) { return resnet(50, o); }
inline std::shared_ptr<ResNet> resnet101(ResNetOptions o = {}) { return resnet(101, o); }
inline std::shared_ptr<ResNet> resnet152(ResNetOptions o = {}) { return resnet(152, o); }

/// Reads frugal's ResNet config JSON (all keys optional): {"depth": 18, "num_classes": 10,
/// "in_channels": 1, "small_input_stem": true, "zero_init_residual": false,
/// "checkpoint_blocks": false, "checkpoint_policy": "full", "fused_bn_relu": false}. When `depth` is given, *depth is
/// read from "depth" (and keeps its value if the key is absent). Unknown keys and values out of range (Note [Config
/// ranges]) throw, naming the key and `file`, the config's path (if it came from one).
ResNetOptions resnet_options_from_json(const json::Value& config, int64_t* depth = nullptr,
                                       const std::string& file = "");

/// The model a ResNet config JSON describes: resnet_options_from_json's keys plus
/// "blocks_per_layer": [n1, n2, n3, n4], which replaces the depth's block counts and keeps
/// its block type (depth 18 with [1, 1, 1, 1] is torchvision's ResNet(BasicBlock, [1, 1, 1, 1])).
std::shared_ptr<ResNet> resnet_from_json(const json::Value& config, int64_t default_depth,
                                         const std::string& file = "");

}  // namespace frugal::models
