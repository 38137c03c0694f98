#include "models/resnet.h"

#include "autograd/checkpoint.h"
#include "autograd/ops/all.h"
#include "models/config_json.h"
#include "nn/init.h"

namespace frugal::models {

namespace {

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(in, out, 3,
                                      nn::Conv2dModuleOptions{.stride = stride, .padding = 1, .bias = false});
}

std::shared_ptr<nn::Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride = 1) {
  return std::make_shared<nn::Conv2d>(in, out, 1, nn::Conv2dModuleOptions{.stride = stride, .bias = false});
}

std::shared_ptr<nn::BatchNorm2d> bn(int64_t channels) { return std::make_shared<nn::BatchNorm2d>(channels); }

/// The projection shortcut (1x1 conv + batch norm) when the block changes shape, else null.
std::shared_ptr<nn::Sequential> shortcut(int64_t in, int64_t out, int64_t stride) {
  if (stride == 1 && in == out) return nullptr;
  return std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::UnaryModule>>{conv1x1(in, out, stride), bn(out)});
}

/// relu(bn(x) + residual) (relu(bn(x)) without a residual): one fused op, or three.
Tensor bn_relu(nn::BatchNorm2d& bn, const Tensor& x, bool fused, const Tensor& residual = Tensor()) {
  if (fused) return bn.forward_relu(x, residual);
  Tensor y = bn.forward(x);
  return relu(residual.defined() ? y + residual : y);
}

/// conv(x) for a convolution without bias, with its output's statistics for a fused batch norm.
ConvWithStats conv_stats(nn::Conv2d& conv, const Tensor& x, bool stats = true) {
  return conv2d_stats(x, conv.weight, conv.options, stats);
}

/// conv(relu(bn(x))) with bn fused into the convolution (Note [Convolution batch-norm fusion]).
ConvWithStats bn_relu_conv(nn::BatchNorm2d& bn, const ConvWithStats& x, nn::Conv2d& conv, bool stats = true) {
  return bn_relu_conv2d(x, bn.args_for(x.out), conv.weight, conv.options, stats);
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, BlockFusion f) : fusion(f) {
  conv1 = register_module("conv1", conv3x3(in_planes, planes, stride));
  bn1 = register_module("bn1", bn(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, 1));
  bn2 = register_module("bn2", bn(planes));
  if (auto ds = shortcut(in_planes, planes * expansion, stride)) downsample = register_module("downsample", ds);
}

Tensor BasicBlock::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  if (fusion.conv_bn) {
    const Tensor y2 = bn_relu_conv(*bn1, conv_stats(*conv1, x), *conv2, false).out;
    return bn_relu(*bn2, y2, true, downsample ? (*downsample)(x) : x);
  }
  Tensor out = bn_relu(*bn1, (*conv1)(x), fusion.bn_relu);
  return bn_relu(*bn2, (*conv2)(out), fusion.bn_relu, downsample ? (*downsample)(x) : x);
}

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, BlockFusion f) : fusion(f) {
  conv1 = register_module("conv1", conv1x1(in_planes, planes));
  bn1 = register_module("bn1", bn(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, stride));  // v1.5: the stride is here
  bn2 = register_module("bn2", bn(planes));
  conv3 = register_module("conv3", conv1x1(planes, planes * expansion));
  bn3 = register_module("bn3", bn(planes * expansion));
  if (auto ds = shortcut(in_planes, planes * expansion, stride)) downsample = register_module("downsample", ds);
}

Tensor Bottleneck::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  if (fusion.conv_bn) {
    const ConvWithStats y2 = bn_relu_conv(*bn1, conv_stats(*conv1, x), *conv2);
    const Tensor y3 = bn_relu_conv(*bn2, y2, *conv3, false).out;
    return bn_relu(*bn3, y3, true, downsample ? (*downsample)(x) : x);
  }
  Tensor out = bn_relu(*bn1, (*conv1)(x), fusion.bn_relu);
  out = bn_relu(*bn2, (*conv2)(out), fusion.bn_relu);
  return bn_relu(*bn3, (*conv3)(out), fusion.bn_relu, downsample ? (*downsample)(x) : x);
}

ResNet::ResNet(BlockType block_, std::array<int64_t, 4> blocks, ResNetOptions o)
    : block(block_), blocks_per_layer(blocks), options(o), memory_plan(plan_of(o)) {
  FRUGAL_CHECK(o.num_classes > 0 && o.in_channels > 0, "ResNet: num_classes and in_channels must be positive, got ",
               o.num_classes, " and ", o.in_channels);
  for (int64_t n : blocks) FRUGAL_CHECK(n > 0, "ResNet: every layer needs at least one block, got ", n);
  conv1 = register_module(
      "conv1", o.small_input_stem
                   ? conv3x3(o.in_channels, 64, 1)
                   : std::make_shared<nn::Conv2d>(o.in_channels, 64, 7,
                                                  nn::Conv2dModuleOptions{.stride = 2, .padding = 3, .bias = false}));
  bn1 = register_module("bn1", bn(64));
  int64_t in_planes = 64;
  layer1 = register_module("layer1", make_layer(in_planes, 64, blocks[0], 1));
  layer2 = register_module("layer2", make_layer(in_planes, 128, blocks[1], 2));
  layer3 = register_module("layer3", make_layer(in_planes, 256, blocks[2], 2));
  layer4 = register_module("layer4", make_layer(in_planes, 512, blocks[3], 2));
  fc = register_module("fc", std::make_shared<nn::Linear>(in_planes, o.num_classes));

  // torchvision's init: convs kaiming_normal_(fan_out, relu); batch norms keep 1 and 0.
  for (auto& [name, m] : named_modules())
    if (auto* conv = dynamic_cast<nn::Conv2d*>(m.get()))
      nn::init::kaiming_normal_(conv->weight, 0.0, nn::init::FanMode::FanOut);
  if (o.zero_init_residual)
    for (auto& [name, m] : named_modules()) {
      if (auto* b = dynamic_cast<Bottleneck*>(m.get())) nn::init::zeros_(b->bn3->weight);
      if (auto* b = dynamic_cast<BasicBlock*>(m.get())) nn::init::zeros_(b->bn2->weight);
    }
}

std::shared_ptr<nn::Sequential> ResNet::make_layer(int64_t& in_planes, int64_t planes, int64_t blocks, int64_t stride) {
  auto layer = std::make_shared<nn::Sequential>();
  const BlockFusion fusion{.bn_relu = options.fused_bn_relu, .conv_bn = options.fused_conv_bn};
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t s = i == 0 ? stride : 1;
    if (block == BlockType::Basic) {
      layer->push_back(std::make_shared<BasicBlock>(in_planes, planes, s, fusion));
      in_planes = planes * BasicBlock::expansion;
    } else {
      layer->push_back(std::make_shared<Bottleneck>(in_planes, planes, s, fusion));
      in_planes = planes * Bottleneck::expansion;
    }
  }
  return layer;
}

Tensor ResNet::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  FRUGAL_CHECK(x.dim() == 4 && x.size(1) == options.in_channels, "ResNet: expected input (N, ", options.in_channels,
               ", H, W), got ", x.describe());
  memory_plan.check_fits(num_blocks(), "ResNet (block 0 is the stem)");
  // The stem is block 0 of the memory plan: its feature maps, at the highest resolution, are
  // among the step's largest, for ~3% of the FLOPs.
  Tensor h = nn::run_block(
      memory_plan, 0, [this](const Tensor& in) { return stem(in); }, x);
  size_t index = 1;
  for (const auto& layer : {layer1, layer2, layer3, layer4})
    for (size_t i = 0; i < layer->size(); ++i) {
      std::shared_ptr<nn::UnaryModule> blk = (*layer)[i];
      // The closure owns the block: backward may replay it after forward has returned.
      h = nn::run_block(
          memory_plan, index++, [blk](const Tensor& in) { return (*blk)(in); }, h);
    }
  h = adaptive_avg_pool2d(h, 1).flatten(1);  // (N, C)
  return (*fc)(h);
}

Tensor ResNet::stem(const Tensor& x) {
  Tensor h = bn_relu(*bn1, (*conv1)(x), options.fused_bn_relu);
  return options.small_input_stem ? h : max_pool2d(h, 3, {.stride = 2, .padding = 1});
}

int64_t ResNet::num_blocks() const {
  return static_cast<int64_t>(1 + layer1->size() + layer2->size() + layer3->size() + layer4->size());
}

nn::BlockMemoryPlan ResNet::plan_of(const ResNetOptions& o) {
  nn::BlockMemoryPlan p = nn::BlockMemoryPlan::from_checkpoint(o.checkpoint_blocks, o.checkpoint_policy);
  if (p.fallback != nn::BlockMemory::Keep)
    p.blocks = {nn::BlockMemory::Keep};  // checkpoint_blocks: the residual blocks
  return p;
}

std::shared_ptr<ResNet> resnet(int64_t depth, ResNetOptions o) {
  switch (depth) {
    case 18: return std::make_shared<ResNet>(BlockType::Basic, std::array<int64_t, 4>{2, 2, 2, 2}, o);
    case 34: return std::make_shared<ResNet>(BlockType::Basic, std::array<int64_t, 4>{3, 4, 6, 3}, o);
    case 50: return std::make_shared<ResNet>(BlockType::Bottleneck, std::array<int64_t, 4>{3, 4, 6, 3}, o);
    case 101: return std::make_shared<ResNet>(BlockType::Bottleneck, std::array<int64_t, 4>{3, 4, 23, 3}, o);
    case 152: return std::make_shared<ResNet>(BlockType::Bottleneck, std::array<int64_t, 4>{3, 8, 36, 3}, o);
    default: FRUGAL_FAIL("resnet: depth must be 18, 34, 50, 101 or 152, got ", depth);
  }
}

ResNetOptions resnet_options_from_json(const json::Value& c, int64_t* depth, const std::string& file) {
  const std::string what = config_name("ResNet", file);
  json_check_keys(c,
                  {"depth", "blocks_per_layer", "num_classes", "in_channels", "small_input_stem", "zero_init_residual",
                   "checkpoint_blocks", "checkpoint_policy", "fused_bn_relu", "fused_conv_bn"},
                  what);
  ResNetOptions o;
  o.num_classes = json_int(c, "num_classes", o.num_classes, what, 1, kMaxConfigDim);
  o.in_channels = json_int(c, "in_channels", o.in_channels, what, 1, kMaxConfigDim);
  o.small_input_stem = json_bool(c, "small_input_stem", o.small_input_stem, what);
  o.zero_init_residual = json_bool(c, "zero_init_residual", o.zero_init_residual, what);
  o.checkpoint_blocks = json_bool(c, "checkpoint_blocks", o.checkpoint_blocks, what);
  o.checkpoint_policy = json_checkpoint_policy(c, o.checkpoint_policy, what);
  o.fused_bn_relu = json_bool(c, "fused_bn_relu", o.fused_bn_relu, what);
  o.fused_conv_bn = json_bool(c, "fused_conv_bn", o.fused_conv_bn, what);
  if (depth) *depth = json_int(c, "depth", *depth, what);
  return o;
}

std::shared_ptr<ResNet> resnet_from_json(const json::Value& c, int64_t depth, const std::string& file) {
  const std::string what = config_name("ResNet", file);
  const ResNetOptions o = resnet_options_from_json(c, &depth, file);
  FRUGAL_CHECK(depth == 18 || depth == 34 || depth == 50 || depth == 101 || depth == 152, what,
               ": 'depth' must be 18, 34, 50, 101 or 152, got ", depth);
  const BlockType block = depth < 50 ? BlockType::Basic : BlockType::Bottleneck;
  const json::Value* blocks = c.find("blocks_per_layer");
  if (!blocks) return resnet(depth, o);
  FRUGAL_CHECK(blocks->is_array() && blocks->items.size() == 4, what,
               ": 'blocks_per_layer' must be an array of 4 integers");
  std::array<int64_t, 4> counts{};
  for (size_t i = 0; i < 4; ++i) {
    const json::Value& item = blocks->items[i];
    const std::optional<uint64_t> n = item.as_uint64();
    FRUGAL_CHECK(n && *n > 0 && *n <= uint64_t(kMaxConfigLayers), what,
                 ": 'blocks_per_layer' must hold 4 integers in [1, ", kMaxConfigLayers, "], got ",
                 item.type == json::Value::Type::Number ? item.text : json::type_name(item.type), " at index ", i);
    counts[i] = int64_t(*n);
  }
  return std::make_shared<ResNet>(block, counts, o);
}

}  // namespace frugal::models
