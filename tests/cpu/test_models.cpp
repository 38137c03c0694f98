// models/: ResNet, BERT and ViT. Parameter counts against the published ones, state-dict
// keys against torchvision's / Hugging Face's (spelled out below from their model code),
// forward shapes, the BERT mask and weight tying, checkpoint_blocks (same gradients), and,
// when tools/parity_models.py --golden has written tests/golden/, logits, loss, gradients
// and running statistics against PyTorch's on the same weights and inputs.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "memory/allocator.h"
#include "models/bert.h"
#include "models/config_json.h"
#include "models/pretrained.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/block_planner.h"
#include "nn/init.h"
#include "nn/safetensors.h"
#include "profiler/session.h"
#include "tests/cpu/interpolate_golden.h"
#include "tests/fifo_guard.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

std::set<std::string> key_set(const nn::Module& m) {
  std::set<std::string> keys;
  for (auto& [name, t] : m.state_dict()) keys.insert(name);
  return keys;
}

void add_keys(std::set<std::string>& keys, const std::string& prefix, std::initializer_list<const char*> names) {
  for (const char* n : names) keys.insert(prefix + n);
}

void add_bn(std::set<std::string>& keys, const std::string& prefix) {
  add_keys(keys, prefix, {".weight", ".bias", ".running_mean", ".running_var", ".num_batches_tracked"});
}

/// max |a - b| / max |b|: the error relative to the reference's scale (elementwise relative
/// errors are meaningless where the reference crosses zero).
// max|a - b| / max(max|b|, floor).
double max_rel_error(const Tensor& a, const Tensor& b, double floor = 1e-30) {
  REQUIRE(a.sizes() == b.sizes());
  const std::vector<double> x = values_of(a), y = values_of(b);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / std::max(scale, floor);
}

/// Every parameter's gradient, by name.
std::map<std::string, Tensor> grads_of(const nn::Module& m) {
  std::map<std::string, Tensor> g;
  for (auto& [name, p] : m.named_parameters())
    if (p.grad().defined()) g[name] = p.grad();
  return g;
}

void check_same_grads(const nn::Module& a, const nn::Module& b, double tol = 1e-6) {
  const auto ga = grads_of(a), gb = grads_of(b);
  REQUIRE(ga.size() == a.named_parameters().size());
  REQUIRE(ga.size() == gb.size());
  double worst = 0;
  for (auto& [name, g] : ga) worst = std::max(worst, max_rel_error(g, gb.at(name)));
  CHECK(worst <= tol);
}

void copy_weights(const nn::Module& from, nn::Module& to) {
  const auto sd = from.state_dict();
  to.load_state_dict(std::map<std::string, Tensor>(sd.begin(), sd.end()));
}

models::BertConfig tiny_bert() {
  models::BertConfig c;
  c.vocab_size = 50, c.hidden_size = 16, c.num_hidden_layers = 2, c.num_attention_heads = 2;
  c.intermediate_size = 32, c.max_position_embeddings = 12, c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0, c.num_labels = 3;
  return c;
}

models::ViTConfig tiny_vit() {
  models::ViTConfig c;
  c.image_size = 8, c.patch_size = 4, c.num_layers = 2, c.num_heads = 2, c.hidden_dim = 8, c.mlp_dim = 16;
  c.num_classes = 5;
  return c;
}

}  // namespace

TEST_CASE("models: parameter counts match torchvision and Hugging Face") {
  manual_seed(0);
  CHECK(models::resnet50()->num_parameters() == 25557032);
  CHECK(models::resnet18()->num_parameters() == 11689512);
  // The transformers with one layer (initialising all of them takes a minute): the published
  // count less 11 layers, 7,087,872 parameters each in both BERT-base and ViT-B.
  constexpr int64_t layer = 7087872;
  models::ViTConfig vit = models::vit_b_16();
  vit.num_layers = 1;
  CHECK(models::VisionTransformer(vit).num_parameters() == 86567656 - 11 * layer);
  models::BertConfig bert = models::bert_base();
  bert.num_hidden_layers = 1;
  // Tied decoder counted once, as torch's parameters() does.
  CHECK(models::BertForMaskedLM(bert).num_parameters() == 109514298 - 11 * layer);
  CHECK(models::BertForSequenceClassification(bert).num_parameters() == 109482240 + 768 * 2 + 2 - 11 * layer);
}

TEST_CASE("models: ResNet-18 state-dict keys are torchvision's") {
  std::set<std::string> want;
  want.insert("conv1.weight");
  add_bn(want, "bn1");
  for (int layer = 1; layer <= 4; ++layer)
    for (int block = 0; block < 2; ++block) {
      const std::string p = "layer" + std::to_string(layer) + "." + std::to_string(block) + ".";
      want.insert(p + "conv1.weight");
      add_bn(want, p + "bn1");
      want.insert(p + "conv2.weight");
      add_bn(want, p + "bn2");
      if (layer > 1 && block == 0) {
        want.insert(p + "downsample.0.weight");
        add_bn(want, p + "downsample.1");
      }
    }
  add_keys(want, "fc", {".weight", ".bias"});
  auto net = models::resnet18({.num_classes = 10, .in_channels = 1, .small_input_stem = true});
  CHECK(key_set(*net) == want);
  CHECK(net->conv1->weight.sizes() == Shape{64, 1, 3, 3});
  CHECK(net->layer2->operator[](0)->named_parameters().size() == 9);  // 2 convs, 2 bns, downsample conv + bn
  // ResNet-50: Bottleneck keys, and v1.5's stride on the 3x3.
  auto r50 = models::resnet50();
  const auto keys50 = key_set(*r50);
  CHECK(keys50.count("layer3.5.conv3.weight") == 1);
  CHECK(keys50.count("layer4.0.downsample.1.running_var") == 1);
  CHECK(keys50.size() == 320);  // 161 parameters + 159 buffers (53 batch norms x 3)
  auto* b = dynamic_cast<models::Bottleneck*>((*r50->layer2)[0].get());
  REQUIRE(b != nullptr);
  CHECK(b->conv1->options.stride == Int2(1));
  CHECK(b->conv2->options.stride == Int2(2));
}

TEST_CASE("models: ResNet init and forward shapes") {
  manual_seed(1);
  auto net =
      models::resnet18({.num_classes = 10, .in_channels = 1, .small_input_stem = true, .zero_init_residual = true});
  // kaiming_normal_(fan_out, relu): std sqrt(2 / (out * k * k)).
  const std::vector<double> w = values_of(net->layer3->operator[](1)->named_parameters()[0].second);
  double sq = 0;
  for (double v : w) sq += v * v;
  CHECK(std::sqrt(sq / double(w.size())) == doctest::Approx(std::sqrt(2.0 / (256 * 9))).epsilon(0.02));
  auto* blk = dynamic_cast<models::BasicBlock*>((*net->layer1)[0].get());
  REQUIRE(blk != nullptr);
  CHECK(values_of(blk->bn2->weight) == std::vector<double>(64, 0.0));  // zero_init_residual
  CHECK(values_of(blk->bn1->weight) == std::vector<double>(64, 1.0));
  CHECK(net->forward(randn({2, 1, 28, 28})).sizes() == Shape{2, 10});
  net->eval();
  auto standard = models::resnet18({.num_classes = 7});
  CHECK(standard->forward(randn({1, 3, 64, 64})).sizes() == Shape{1, 7});
  CHECK_THROWS_WITH_AS(standard->forward(randn({1, 1, 64, 64})), doctest::Contains("ResNet: expected input (N, 3"),
                       Error);
  CHECK_THROWS_WITH_AS(models::resnet(20), doctest::Contains("depth must be 18, 34, 50, 101 or 152"), Error);
}

TEST_CASE("models: BERT state-dict keys are Hugging Face's") {
  const models::BertConfig c = tiny_bert();
  std::set<std::string> body;
  add_keys(body, "bert.embeddings.",
           {"word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight", "LayerNorm.weight",
            "LayerNorm.bias"});
  for (int i = 0; i < 2; ++i)
    add_keys(body, "bert.encoder.layer." + std::to_string(i) + ".",
             {"attention.self.query.weight", "attention.self.query.bias", "attention.self.key.weight",
              "attention.self.key.bias", "attention.self.value.weight", "attention.self.value.bias",
              "attention.output.dense.weight", "attention.output.dense.bias", "attention.output.LayerNorm.weight",
              "attention.output.LayerNorm.bias", "intermediate.dense.weight", "intermediate.dense.bias",
              "output.dense.weight", "output.dense.bias", "output.LayerNorm.weight", "output.LayerNorm.bias"});
  std::set<std::string> mlm = body;
  add_keys(mlm, "cls.predictions.",
           {"bias", "transform.dense.weight", "transform.dense.bias", "transform.LayerNorm.weight",
            "transform.LayerNorm.bias", "decoder.weight", "decoder.bias"});
  CHECK(key_set(models::BertForMaskedLM(c)) == mlm);
  std::set<std::string> cls = body;
  add_keys(cls, "", {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight", "classifier.bias"});
  CHECK(key_set(models::BertForSequenceClassification(c)) == cls);
  // BertModel alone: the same names without "bert.".
  const auto plain = key_set(models::BertModel(c));
  CHECK(plain.count("encoder.layer.1.attention.self.key.weight") == 1);
  CHECK(plain.count("pooler.dense.bias") == 1);
  CHECK(plain.size() == cls.size() - 2);
}

TEST_CASE("models: ViT state-dict keys are torchvision's") {
  std::set<std::string> want{"class_token",       "conv_proj.weight", "conv_proj.bias",    "encoder.pos_embedding",
                             "encoder.ln.weight", "encoder.ln.bias",  "heads.head.weight", "heads.head.bias"};
  for (int i = 0; i < 2; ++i)
    add_keys(want, "encoder.layers.encoder_layer_" + std::to_string(i) + ".",
             {"ln_1.weight", "ln_1.bias", "self_attention.in_proj_weight", "self_attention.in_proj_bias",
              "self_attention.out_proj.weight", "self_attention.out_proj.bias", "ln_2.weight", "ln_2.bias",
              "mlp.0.weight", "mlp.0.bias", "mlp.3.weight", "mlp.3.bias"});
  models::VisionTransformer vit(tiny_vit());
  CHECK(key_set(vit) == want);
  CHECK(vit.pos_embedding.sizes() == Shape{1, 5, 8});
  CHECK(values_of(vit.head->weight) == std::vector<double>(5 * 8, 0.0));  // torchvision zero-inits the head
  CHECK(vit.forward(randn({3, 3, 8, 8})).sizes() == Shape{3, 5});
  CHECK_THROWS_WITH_AS(vit.forward(randn({3, 3, 16, 16})), doctest::Contains("VisionTransformer: expected input"),
                       Error);
}

TEST_CASE("models: interpolate_embeddings fits a ViT checkpoint to another image size, as torchvision's") {
  // The grid of a (1, 1 + 36, 2) pos_embedding is the (1, 2, 6, 6) input of the golden case
  // pos_embed_bicubic_ac_f64 (x[k] = 2 sin(0.731 k)); fitted to 10 x 10 patches it must be
  // PyTorch's bicubic, align_corners=True output, after the class token's row.
  const auto& goldens = interpolate_goldens();
  const auto golden = std::find_if(goldens.begin(), goldens.end(), [](const InterpolateGolden& g) {
    return std::string(g.name) == "pos_embed_bicubic_ac_f64";
  });
  REQUIRE(golden != goldens.end());
  std::vector<double> pos{0.5, -0.25};  // the class token's row
  for (int64_t i = 0; i < 36; ++i)
    for (int64_t c = 0; c < 2; ++c) pos.push_back(2 * std::sin(0.731 * double(c * 36 + i)));
  std::map<std::string, Tensor> state{{"encoder.pos_embedding", from_vector<double>(pos, {1, 37, 2})},
                                      {"class_token", zeros({1, 1, 2}, kFloat64)}};
  models::interpolate_embeddings(state, 40, 4);  // 10 x 10 patches
  const Tensor fitted = state.at("encoder.pos_embedding");
  REQUIRE(fitted.sizes() == Shape{1, 101, 2});
  std::vector<double> want{0.5, -0.25};
  for (int64_t j = 0; j < 100; ++j)
    for (int64_t c = 0; c < 2; ++c) want.push_back(golden->y_values[size_t(c * 100 + j)]);
  check_close(fitted, want, 1e-12, 1e-12, "fitted pos_embedding");
  CHECK(state.at("class_token").sizes() == Shape{1, 1, 2});  // nothing else changes
  models::interpolate_embeddings(state, 43, 4);  // still 10 x 10 (rounded down): unchanged
  CHECK(state.at("encoder.pos_embedding").data_ptr<double>() == fitted.data_ptr<double>());

  // A tiny ViT trained on 8 x 8 images (2 x 2 patches) fine-tunes on 16 x 16 (4 x 4).
  manual_seed(5);
  models::VisionTransformer small(tiny_vit());
  nn::init::normal_(small.pos_embedding, 0.0, 0.02);
  std::map<std::string, Tensor> weights;
  for (auto& [name, t] : small.state_dict()) weights[name] = t;
  models::interpolate_embeddings(weights, 16, 4, InterpolateMode::Bilinear);
  models::ViTConfig big_config = tiny_vit();
  big_config.image_size = 16;
  models::VisionTransformer big(big_config);
  big.load_state_dict(weights);
  CHECK(big.pos_embedding.sizes() == Shape{1, 17, 8});
  check_close(big.pos_embedding.slice(1, 0, 1), values_of(small.pos_embedding.slice(1, 0, 1)), 0, 0, "class row");
  CHECK(big.forward(randn({2, 3, 16, 16})).sizes() == Shape{2, 5});

  std::map<std::string, Tensor> empty;
  check_error([&] { models::interpolate_embeddings(empty, 16, 4); },
              {"interpolate_embeddings", "no 'encoder.pos_embedding'"});
  std::map<std::string, Tensor> odd{{"encoder.pos_embedding", zeros({1, 6, 4})}};
  check_error([&] { models::interpolate_embeddings(odd, 16, 4); },
              {"interpolate_embeddings", "float32[1, 6, 4]", "5 patch rows", "not a square"});
  check_error([&] { models::interpolate_embeddings(state, 2, 4); }, {"interpolate_embeddings", "patch_size 4"});
}

TEST_CASE("models: BERT mask hides padded keys; MLM ignores label -100; decoder is tied") {
  manual_seed(2);
  const models::BertConfig c = tiny_bert();
  models::BertForMaskedLM mlm(c);
  mlm.eval();
  const Tensor ids = from_vector<int64_t>({5, 7, 9, 11, 13, 2, 3, 4}, {2, 4});
  const Tensor mask = from_vector<int64_t>({1, 1, 1, 0, 1, 1, 1, 1}, {2, 4});
  const Tensor other = from_vector<int64_t>({5, 7, 9, 42, 13, 2, 3, 4}, {2, 4});  // a different padded token
  const Tensor a = mlm.forward(ids, mask).logits, b = mlm.forward(other, mask).logits;
  CHECK(a.sizes() == Shape{2, 4, 50});
  CHECK(max_rel_error(a.narrow(1, 0, 3), b.narrow(1, 0, 3)) < 1e-6);  // unpadded tokens do not see it
  CHECK(max_rel_error(a.narrow(1, 3, 1), b.narrow(1, 3, 1)) > 1e-3);  // (the padded one does change)
  // The additive mask: 0 where attended, float32's lowest where not.
  const std::vector<double> m = values_of(models::bert_additive_mask(mask, kFloat32));
  CHECK(m[2] == 0.0);
  CHECK(m[3] == double(std::numeric_limits<float>::lowest()));

  // Loss over labels != -100 only, against cross entropy of the picked rows.
  const Tensor labels = from_vector<int64_t>({-100, 8, -100, -100, 1, -100, -100, 30}, {2, 4});
  mlm.train();
  const models::BertMlmOutput out = mlm.forward(ids, mask, Tensor(), labels, {.logits = true});
  const Tensor rows = cat({out.logits.select(0, 0).narrow(0, 1, 1), out.logits.select(0, 1).narrow(0, 0, 1),
                           out.logits.select(0, 1).narrow(0, 3, 1)});
  const double want = cross_entropy(rows, from_vector<int64_t>({8, 1, 30}, {3})).item<double>();
  CHECK(out.loss.item<double>() == doctest::Approx(want).epsilon(1e-6));
  // Without {.logits = true} the loss comes from linear_cross_entropy, and no logits.
  const models::BertMlmOutput fused = mlm.forward(ids, mask, Tensor(), labels);
  CHECK_FALSE(fused.logits.defined());
  CHECK(fused.loss.item<double>() == doctest::Approx(want).epsilon(1e-6));

  // Tied: the decoder's weight is the embedding; its gradient is the sum of both uses.
  const auto sd = mlm.state_dict();
  auto find = [&](const std::string& k) {
    return std::find_if(sd.begin(), sd.end(), [&](auto& kv) { return kv.first == k; })->second;
  };
  CHECK(find("cls.predictions.decoder.weight").impl_ptr() == find("bert.embeddings.word_embeddings.weight").impl_ptr());
  CHECK(find("cls.predictions.decoder.bias").impl_ptr() == find("cls.predictions.bias").impl_ptr());
  out.loss.backward();
  const Tensor g = mlm.bert->embeddings->word_embeddings->weight.grad();
  REQUIRE(g.defined());
  CHECK(values_of(g.select(0, 40)) != std::vector<double>(16, 0.0));  // not an input; the decoder uses it

  // Without the tie, pad_token_id's row (0, padding the second sequence) gets no gradient.
  models::BertForSequenceClassification cls(c);
  const Tensor padded = from_vector<int64_t>({5, 7, 9, 11, 13, 2, 0, 0}, {2, 4});
  cls.forward(padded, mask, Tensor(), from_vector<int64_t>({0, 2}, {2})).loss.backward();
  const Tensor gc = cls.bert->embeddings->word_embeddings->weight.grad();
  CHECK(values_of(gc.select(0, 0)) == std::vector<double>(16, 0.0));
  CHECK(values_of(gc.select(0, 5)) != std::vector<double>(16, 0.0));
}

TEST_CASE("models: load_safetensors_into fills a tied key the checkpoint omits") {
  manual_seed(3);
  const models::BertConfig c = tiny_bert();
  models::BertForMaskedLM a(c), b(c);
  const std::string path = temp_path("frugal_test_bert_tied");
  nn::NamedTensors sd;
  for (auto& [name, t] : a.state_dict())
    if (name.rfind("cls.predictions.decoder.", 0) != 0) sd.emplace_back(name, t);  // as save_pretrained writes
  nn::save_safetensors(path, sd);
  models::load_safetensors_into(b, path, b.tied_keys());
  std::filesystem::remove(path);
  CHECK(values_of(b.bert->embeddings->word_embeddings->weight) ==
        values_of(a.bert->embeddings->word_embeddings->weight));
  CHECK(values_of(b.decoder_bias) == values_of(a.decoder_bias));
  CHECK_THROWS_WITH_AS(models::load_safetensors_into(b, "/nonexistent.safetensors"), doctest::Contains("nonexistent"),
                       Error);
}

TEST_CASE("models: checkpoint_blocks gives the same gradients, with either checkpoint_policy") {
  // Selective keeps the convolutions', projections' and attention's outputs and recomputes
  // the rest (Note [Selective checkpoint]); both policies must leave the gradients alone.
  const std::array<autograd::CheckpointPolicy, 2> policies{autograd::CheckpointPolicy::Full,
                                                           autograd::CheckpointPolicy::Selective};
  SUBCASE("ResNet-18, train mode") {
    models::ResNetOptions o{.num_classes = 4, .in_channels = 1, .small_input_stem = true};
    manual_seed(4);
    auto plain = models::resnet18(o);
    const Tensor x = randn({2, 1, 8, 8}), y = from_vector<int64_t>({1, 3}, {2});
    cross_entropy(plain->forward(x), y).backward();
    for (autograd::CheckpointPolicy policy : policies) {
      CAPTURE(autograd::to_string(policy));
      o.checkpoint_blocks = true;
      o.checkpoint_policy = policy;
      manual_seed(4);
      auto ckpt = models::resnet18(o);
      cross_entropy(ckpt->forward(x), y).backward();
      check_same_grads(*plain, *ckpt);
    }
  }
  SUBCASE("BERT, with dropout (replayed)") {
    models::BertConfig c = tiny_bert();
    c.hidden_dropout_prob = 0.1, c.attention_probs_dropout_prob = 0.1;
    manual_seed(5);
    models::BertForSequenceClassification plain(c);
    const Tensor ids = randint(0, 50, {2, 6}),
                 mask = from_vector<int64_t>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
    const Tensor y = from_vector<int64_t>({2, 0}, {2});
    manual_seed(6);
    plain.forward(ids, mask, Tensor(), y).loss.backward();
    for (autograd::CheckpointPolicy policy : policies) {
      CAPTURE(autograd::to_string(policy));
      c.checkpoint_blocks = true;
      c.checkpoint_policy = policy;
      manual_seed(5);
      models::BertForSequenceClassification ckpt(c);
      manual_seed(6);
      ckpt.forward(ids, mask, Tensor(), y).loss.backward();
      check_same_grads(plain, ckpt);
    }
  }
  SUBCASE("ViT, with dropout (replayed)") {
    models::ViTConfig c = tiny_vit();
    c.dropout = 0.1, c.attention_dropout = 0.1;
    manual_seed(7);
    models::VisionTransformer plain(c);
    nn::init::normal_(plain.head->weight, 0.0, 0.5);  // torchvision's zero head would stop every gradient
    const Tensor x = randn({2, 3, 8, 8}), y = from_vector<int64_t>({4, 1}, {2});
    manual_seed(8);
    cross_entropy(plain.forward(x), y).backward();
    for (autograd::CheckpointPolicy policy : policies) {
      CAPTURE(autograd::to_string(policy));
      c.checkpoint_blocks = true;
      c.checkpoint_policy = policy;
      models::VisionTransformer ckpt(c);
      copy_weights(plain, ckpt);
      manual_seed(8);
      cross_entropy(ckpt.forward(x), y).backward();
      check_same_grads(plain, ckpt);
    }
  }
}

TEST_CASE("models: a ViT block lets each layer norm's output go once the next projection has run") {
  // Forward without grad (a checkpoint's first pass) of one block, MLP 8x wide, so the MLP
  // phase is the peak: x (1 unit = B*T*hidden floats), mlp.0's output and GELU's output
  // (8 units each). A layer norm output held to the block's end would add a unit each.
  models::ViTConfig c = tiny_vit();
  c.hidden_dim = 64, c.mlp_dim = 512, c.num_heads = 2;
  manual_seed(8);
  models::EncoderBlock block(c);
  const Tensor input = randn({4, 8, c.hidden_dim});
  const int64_t unit = input.numel() * int64_t(sizeof(float));
  NoGradGuard no_grad;
  memory::empty_cache(kCPU);
  const int64_t before = memory::stats(kCPU).allocated_bytes.current;
  memory::reset_peak(kCPU);
  const Tensor y = block.forward(input);
  const int64_t peak = memory::stats(kCPU).allocated_bytes.peak - before;
  MESSAGE("block forward peak above its input: ", double(peak) / double(unit), " units");
  CHECK(peak >= 17 * unit);
  CHECK(peak < 17 * unit + unit / 2);
  CHECK(y.sizes() == input.sizes());
}

/// A fused ResNet (`fuse` sets its options) against the unfused blocks: BasicBlock (ResNet-18)
/// and Bottleneck (ResNet-50 blocks, one per layer), with and without the projection
/// shortcut: logits, loss, gradients and running statistics after a train step, then eval
/// logits (running statistics used), within `tol` (relative), in `dtype`.
void check_fusion_matches(const std::function<void(models::ResNetOptions&)>& fuse, double tol, DType dtype = kFloat32) {
  for (models::BlockType type : {models::BlockType::Basic, models::BlockType::Bottleneck}) {
    CAPTURE(type == models::BlockType::Basic ? "Basic" : "Bottleneck");
    models::ResNetOptions o{.num_classes = 4, .in_channels = 2, .small_input_stem = true};
    manual_seed(11);
    auto plain = std::make_shared<models::ResNet>(type, std::array<int64_t, 4>{2, 1, 1, 1}, o);
    fuse(o);
    auto fused = std::make_shared<models::ResNet>(type, std::array<int64_t, 4>{2, 1, 1, 1}, o);
    copy_weights(*plain, *fused);
    plain->to(dtype), fused->to(dtype);
    const Tensor x = randn({3, 2, 8, 8}).to(dtype), y = from_vector<int64_t>({1, 3, 0}, {3});
    const Tensor loss_plain = cross_entropy(plain->forward(x), y), loss_fused = cross_entropy(fused->forward(x), y);
    CHECK(max_rel_error(loss_fused, loss_plain) <= tol);
    loss_plain.backward();
    loss_fused.backward();
    check_same_grads(*plain, *fused, tol);
    const auto buffers_plain = plain->named_buffers(), buffers_fused = fused->named_buffers();
    REQUIRE(buffers_plain.size() == buffers_fused.size());
    for (size_t i = 0; i < buffers_plain.size(); ++i) {
      CAPTURE(buffers_plain[i].first);
      CHECK(buffers_plain[i].first == buffers_fused[i].first);
      CHECK(max_rel_error(buffers_fused[i].second, buffers_plain[i].second) <= tol);
    }
    plain->eval(), fused->eval();
    CHECK(max_rel_error(fused->forward(x), plain->forward(x)) <= 10 * tol);
  }
}

TEST_CASE("models: ResNet fused_bn_relu equals the unfused blocks") {
  // The CPU's batch_norm_relu rounds bn(x) + residual once where the unfused ops round
  // twice: float32 differences only.
  check_fusion_matches([](models::ResNetOptions& o) { o.fused_bn_relu = true; }, 1e-6);
  CHECK(models::resnet_options_from_json(json::parse(R"({"fused_bn_relu": true})")).fused_bn_relu);
}

TEST_CASE("models: ResNet fused_conv_bn equals the unfused blocks") {
  // Batch statistics from sums (E[y^2] - E[y]^2) instead of Welford's update, and bn folded
  // into scale and shift (Note [Convolution batch-norm fusion]): the same function, other
  // roundings, so compared in float64, where they vanish. (In float32 they do not: layer4
  // normalizes 3 values per channel here, and batch norm's backward amplifies a rounding by
  // 1 / sqrt(var); the GPU test compares both forms against float64 at real sizes.)
  check_fusion_matches([](models::ResNetOptions& o) { o.fused_conv_bn = true; }, 1e-9, kFloat64);
  CHECK(models::resnet_options_from_json(json::parse(R"({"fused_conv_bn": true})")).fused_conv_bn);
}

TEST_CASE("models: the profiler names BERT's modules by their Hugging Face paths") {
  manual_seed(4);
  models::BertForMaskedLM mlm(tiny_bert());
  const Tensor ids = from_vector<int64_t>({5, 7, 9, 11, 13, 2, 3, 4}, {2, 4});
  const Tensor labels = from_vector<int64_t>({-100, 8, -100, -100, 1, -100, -100, 30}, {2, 4});
  profiler::Session session({.device = kCPU});
  session.attach(mlm);
  session.start();
  mlm.forward(ids, Tensor(), Tensor(), labels).loss.backward();
  session.stop();
  std::set<std::string> modules;
  for (const core::OpRecord& op : session.op_records()) modules.insert(session.module_name(op.module));
  CHECK(modules.count("bert.embeddings.word_embeddings") == 1);
  CHECK(modules.count("bert.encoder.layer.0.attention.self") == 1);
  CHECK(modules.count("bert.encoder.layer.0.attention.self.query") == 1);
  CHECK(modules.count("bert.encoder.layer.1.output.dense") == 1);
  CHECK(modules.count("cls.predictions.transform.dense") == 1);
}

TEST_CASE("models: config JSON") {
  const json::Value bert = json::parse(
      R"({"architectures": ["BertForMaskedLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 100, "hidden_act": "gelu", "model_type": "bert",
          "id2label": {"0": "a", "1": "b", "2": "c"}})");
  const models::BertConfig c = models::BertConfig::from_json(bert);
  CHECK(c.hidden_size == 64);
  CHECK(c.num_hidden_layers == 2);
  CHECK(c.num_labels == 3);
  CHECK(c.layer_norm_eps == 1e-12);
  CHECK_THROWS_WITH_AS(models::BertConfig::from_json(json::parse(R"({"hidden_act": "relu"})")),
                       doctest::Contains("hidden_act 'relu' is not supported"), Error);
  int64_t depth = 18;
  const models::ResNetOptions r = models::resnet_options_from_json(
      json::parse(R"({"depth": 50, "num_classes": 10, "small_input_stem": true})"), &depth);
  CHECK(depth == 50);
  CHECK(r.num_classes == 10);
  CHECK(r.small_input_stem);
  CHECK_THROWS_WITH_AS(models::resnet_options_from_json(json::parse(R"({"num_clases": 10})")),
                       doctest::Contains("unknown keys num_clases"), Error);
  auto r10 = models::resnet_from_json(json::parse(R"({"blocks_per_layer": [1, 1, 1, 1], "num_classes": 10})"), 18);
  CHECK(r10->num_parameters() == 4910922);  // torchvision ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
  CHECK(r10->layer4->size() == 1);
  const models::ViTConfig v = models::ViTConfig::from_json(json::parse(R"({"image_size": 32, "patch_size": 8})"));
  CHECK(v.image_size == 32);
  CHECK(v.hidden_dim == 768);
  // checkpoint_policy: "full" (the default, so older configs read as before) or "selective".
  CHECK(v.checkpoint_policy == autograd::CheckpointPolicy::Full);
  CHECK(models::ViTConfig::from_json(json::parse(R"({"checkpoint_blocks": true, "checkpoint_policy": "selective"})"))
            .checkpoint_policy == autograd::CheckpointPolicy::Selective);
  CHECK(models::BertConfig::from_json(json::parse(R"({"checkpoint_policy": "selective"})")).checkpoint_policy ==
        autograd::CheckpointPolicy::Selective);
  CHECK(models::resnet_options_from_json(json::parse(R"({"checkpoint_policy": "full"})")).checkpoint_policy ==
        autograd::CheckpointPolicy::Full);
  check_error([] { models::ViTConfig::from_json(json::parse(R"({"checkpoint_policy": "some"})"), "v.json"); },
              {"ViT config v.json", "'checkpoint_policy' must be \"full\" or \"selective\", got \"some\""});
}

TEST_CASE("models: config values out of range are rejected, naming the key and the file") {
  auto parse = [](const char* text) { return json::parse(text); };
  // {"num_classes": 2^62} once built a Linear whose weight wrapped to 0 bytes: exit 139.
  check_error([&] { models::resnet_from_json(parse(R"({"num_classes": 4611686018427387904})"), 18, "r.json"); },
              {"ResNet config r.json", "'num_classes' must be an integer in [1, 2147483647], got 4611686018427387904"});
  check_error([&] { models::resnet_from_json(parse(R"({"in_channels": 0})"), 18, "r.json"); },
              {"ResNet config r.json", "'in_channels'"});
  check_error([&] { models::resnet_from_json(parse(R"({"depth": 19})"), 18, "r.json"); },
              {"ResNet config r.json", "'depth' must be 18, 34, 50, 101 or 152, got 19"});
  check_error([&] { models::resnet_from_json(parse(R"({"blocks_per_layer": [1, 100000, 1, 1]})"), 18, "r.json"); },
              {"ResNet config r.json", "'blocks_per_layer' must hold 4 integers in [1, 10000], got 100000 at index 1"});
  check_error([&] { models::resnet_from_json(parse(R"({"blocks_per_layer": [1, 1, 1, "2"]})"), 18); },
              {"ResNet config:", "got string at index 3"});

  check_error([&] { models::ViTConfig::from_json(parse(R"({"hidden_dim": 4611686018427387904})"), "v.json"); },
              {"ViT config v.json", "'hidden_dim' must be an integer in [1, 2147483647]"});
  check_error([&] { models::ViTConfig::from_json(parse(R"({"hidden_dim": 100, "num_heads": 12})"), "v.json"); },
              {"ViT config v.json", "'hidden_dim' (100) must be divisible by 'num_heads' (12)"});
  check_error([&] { models::ViTConfig::from_json(parse(R"({"image_size": 30, "patch_size": 8})"), "v.json"); },
              {"ViT config v.json", "'image_size' (30) must be a multiple of 'patch_size' (8)"});
  check_error([&] { models::ViTConfig::from_json(parse(R"({"num_layers": 0})"), "v.json"); }, {"'num_layers'"});
  check_error([&] { models::ViTConfig::from_json(parse(R"({"dropout": 1.5})"), "v.json"); },
              {"ViT config v.json", "'dropout' must be a finite number in [0, 1], got 1.5"});
  check_error([&] { models::ViTConfig::from_json(parse(R"({"attention_dropout": 1e999})"), "v.json"); },
              {"'attention_dropout' must be a finite number"});

  // num_attention_heads 0 once reached hidden_size % 0 (SIGFPE).
  check_error([&] { models::BertConfig::from_json(parse(R"({"num_attention_heads": 0})"), "b.json"); },
              {"BERT config b.json", "'num_attention_heads' must be an integer in [1, 2147483647], got 0"});
  // 10^20 does not fit int64: strtoll once saturated it to 2^63 - 1 silently.
  check_error([&] { models::BertConfig::from_json(parse(R"({"vocab_size": 100000000000000000000})"), "b.json"); },
              {"'vocab_size' must be an integer", "got 100000000000000000000"});
  check_error([&] { models::BertConfig::from_json(parse(R"({"hidden_size": 2.5})"), "b.json"); },
              {"'hidden_size' must be an integer"});
  check_error([&] { models::BertConfig::from_json(parse(R"({"vocab_size": 100, "pad_token_id": 100})"), "b.json"); },
              {"'pad_token_id' must be an integer in [0, 99], got 100"});
  check_error([&] { models::BertConfig::from_json(parse(R"({"hidden_size": 100, "num_attention_heads": 12})")); },
              {"BERT config:", "'hidden_size' (100) must be divisible by 'num_attention_heads' (12)"});
  check_error([&] { models::BertConfig::from_json(parse(R"({"layer_norm_eps": 0})"), "b.json"); },
              {"'layer_norm_eps' must be a finite number"});

  // Sizes each in range whose product is not: the tensor factories' checks catch it
  // before any memory is touched (the embedding is (2^31 - 1)^2 x 4 bytes > 2^63).
  const models::BertConfig huge = models::BertConfig::from_json(
      parse(R"({"vocab_size": 2147483647, "hidden_size": 2147483647, "num_attention_heads": 1})"));
  check_error([&] { models::BertForMaskedLM mlm(huge); },
              {"float32[2147483647, 2147483647]", "more than 2^63 - 1 bytes"});
}

TEST_CASE("models: read_json_file names the file in every error, and refuses a FIFO without blocking") {
  namespace fs = std::filesystem;
  std::string pattern = (fs::temp_directory_path() / "frugal_config_XXXXXX").string();
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  const fs::path dir = pattern;
  auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const std::string bad = write("bad.json", "{\n  \"depth\": 18,\n  \"num_classes\": 10,,\n}");
  check_error([&] { models::read_json_file(bad); },
              {"read_json_file: " + bad + ": JSON: expected a string key at byte 37 (line 3, column 21)"});
  const std::string array = write("array.json", "[1]");
  check_error([&] { models::read_json_file(array); }, {array, "holds a JSON array, expected an object"});
  check_error([&] { models::read_json_file((dir / "missing.json").string()); },
              {"read_json_file: cannot open", "missing.json", "No such file"});
  check_error([&] { models::read_json_file(dir.string()); }, {dir.string(), "not a regular file (a directory)"});
  const std::string fifo = (dir / "config.json").string();
  CHECK(returns_without_blocking_on_fifo(fifo, [&] {
    check_error([&] { models::read_json_file(fifo); }, {"read_json_file", fifo, "not a regular file (a FIFO)"});
  }));
  const std::string good = write("good.json", R"({"num_classes": 10, "blocks_per_layer": [1, 1, 1, 1]})");
  CHECK(models::resnet_from_json(models::read_json_file(good), 18, good)->options.num_classes == 10);
  fs::remove_all(dir);
}

// ---- PyTorch goldens (tools/parity_models.py --golden writes them) -------------------------

#include "golden_dir.h"  // FRUGAL_GOLDEN_DIR: the source tree's tests/golden (tests/meson.build)

namespace {

std::string golden(const std::string& file) { return std::string(FRUGAL_GOLDEN_DIR) + "/" + file; }

/// Runs forward (and backward when the golden has grads) as run_model does, and compares.
void check_against_golden(const std::string& model, const std::string& mode,
                          const nn::BlockMemoryPlan& plan = nn::BlockMemoryPlan::uniform(nn::BlockMemory::Keep)) {
  const std::string prefix = model + "_";
  const std::string golden_file = golden(prefix + "golden_" + mode + ".safetensors");
  if (!std::filesystem::exists(golden_file)) {
    MESSAGE("skipped: no PyTorch golden " << golden_file
                                          << " (run tools/parity_models.py --golden on the GPU machine)");
    return;
  }
  const json::Value config = models::read_json_file(golden(prefix + "config.json"));
  std::map<std::string, Tensor> in = nn::load_safetensors(golden(prefix + "inputs.safetensors")).tensors;
  const std::map<std::string, Tensor> want = nn::load_safetensors(golden_file).tensors;
  auto opt = [&](const char* k) { return in.count(k) ? in.at(k) : Tensor(); };
  std::shared_ptr<nn::Module> module;
  std::function<std::pair<Tensor, Tensor>()> run;  // logits, loss
  if (model.rfind("resnet", 0) == 0) {
    auto net = models::resnet_from_json(config, 18);
    net->memory_plan = plan;
    module = net;
    run = [&, net] {
      Tensor logits = net->forward(in.at("pixel_values"));
      return std::pair{logits, cross_entropy(logits, in.at("labels"))};
    };
  } else if (model.rfind("vit", 0) == 0) {
    auto net = std::make_shared<models::VisionTransformer>(models::ViTConfig::from_json(config));
    net->memory_plan = plan;
    module = net;
    run = [&, net] {
      Tensor logits = net->forward(in.at("pixel_values"));
      return std::pair{logits, cross_entropy(logits, in.at("labels"))};
    };
  } else {
    auto net = std::make_shared<models::BertForMaskedLM>(models::BertConfig::from_json(config));
    net->bert->memory_plan = plan;
    module = net;
    run = [&, net] {
      // The loss and the gradients through linear_cross_entropy (the default with labels);
      // the logits from a second forward without labels (eval mode: the same values).
      const Tensor loss =
          net->forward(in.at("input_ids"), opt("attention_mask"), opt("token_type_ids"), in.at("labels")).loss;
      NoGradGuard no_grad;
      return std::pair{net->forward(in.at("input_ids"), opt("attention_mask"), opt("token_type_ids")).logits, loss};
    };
  }
  models::TiedKeys tied;
  if (auto* mlm = dynamic_cast<models::BertForMaskedLM*>(module.get())) tied = mlm->tied_keys();
  models::load_safetensors_into(*module, golden(prefix + "weights.safetensors"), tied);  // strict: same keys as torch
  module->train(mode == "train");
  auto [logits, loss] = run();
  loss.backward();
  CAPTURE(model);
  CAPTURE(mode);
  const std::string memory_choice = nn::to_string(plan.fallback);
  CAPTURE(memory_choice);
  // Bounds as tools/parity_models.py: 1e-4 for outputs and buffers, 1e-3 for gradients, and a
  // gradient that is zero in exact arithmetic (BERT's key bias) is measured against 1e-3 x
  // the model's largest gradient. ResNet-10 in train mode is looser (1e-3 / 5e-3): at 32x32
  // its last stage is 1x1, so batch norm normalizes 2 values per channel and amplifies
  // float32 rounding; the GPU parity run (ResNet-18 at 64x64) meets the tight bounds.
  const bool ill_conditioned = model == "resnet10" && mode == "train";
  const double out_bound = ill_conditioned ? 1e-3 : 1e-4, grad_bound = ill_conditioned ? 5e-3 : 1e-3;
  CHECK(max_rel_error(logits, want.at("logits")) <= out_bound);
  CHECK(max_rel_error(loss, want.at("loss")) <= out_bound);
  const auto grads = grads_of(*module);
  const auto buffers = module->named_buffers();
  double grad_scale = 0;
  for (const auto& [key, ref] : want)
    if (key.rfind("grad.", 0) == 0) grad_scale = std::max(grad_scale, max_abs(ref));
  int64_t compared = 0;
  for (const auto& [key, ref] : want) {
    CAPTURE(key);
    if (key.rfind("grad.", 0) == 0) {
      REQUIRE(grads.count(key.substr(5)) == 1);
      CHECK(max_rel_error(grads.at(key.substr(5)), ref, 1e-3 * grad_scale) <= grad_bound);
      ++compared;
    } else if (key.rfind("buffer.", 0) == 0) {
      auto it = std::find_if(buffers.begin(), buffers.end(), [&](auto& kv) { return kv.first == key.substr(7); });
      REQUIRE(it != buffers.end());
      CHECK(max_rel_error(it->second, ref) <= out_bound);
      ++compared;
    }
  }
  MESSAGE(model << " " << mode << ": logits, loss and " << compared << " gradients/buffers compared with PyTorch");
}

}  // namespace

TEST_CASE("models: logits, loss and gradients match PyTorch's goldens (CPU, float32)") {
  check_against_golden("resnet10", "train");
  check_against_golden("resnet10", "eval");
  check_against_golden("bert", "eval");
  check_against_golden("vit", "eval");
}

TEST_CASE("models: the PyTorch goldens hold with every block under each lossless memory choice") {
  for (nn::BlockMemory choice : nn::BlockPlanner::lossless()) {
    const nn::BlockMemoryPlan plan = nn::BlockMemoryPlan::uniform(choice);
    // A replayed forward updates batch norm's running statistics a second time (as
    // torch.utils.checkpoint does), so the train-mode buffers are compared only without replay.
    const bool replays = choice == nn::BlockMemory::Selective || choice == nn::BlockMemory::Checkpoint ||
                         choice == nn::BlockMemory::CheckpointOffload || choice == nn::BlockMemory::CheckpointRecompute;
    if (!replays) check_against_golden("resnet10", "train", plan);
    check_against_golden("resnet10", "eval", plan);
    check_against_golden("bert", "eval", plan);
    check_against_golden("vit", "eval", plan);
  }
}
