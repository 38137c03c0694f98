// Probes for silent wrong answers when loading PyTorch-style checkpoints and configs, on the
// CPU: for tiny BERT, ViT and ResNet models, a state_dict saved with frugal's safetensors
// writer is perturbed (a key missing, an extra key, a transposed or reshaped tensor, another
// floating dtype, tied weights stored once or twice, a truncated file, a header that lies)
// and loaded into a fresh model, whose parameters and forward output are compared with the
// original's, or with values decoded here from the raw bits. Configs: defaults, unknown
// keys, wrong types and sizes that do not divide. A failing case here is a finding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "core/json.h"
#include "models/bert.h"
#include "models/config_json.h"
#include "models/pretrained.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/channels_last.h"
#include "nn/module.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/fill.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;
using State = std::map<std::string, Tensor>;

/// One tiny model of each family: how to build it (seeded) and how to run it.
struct ModelCase {
  std::string name;
  std::function<std::shared_ptr<nn::Module>(uint64_t seed)> make;
  std::function<Tensor(nn::Module&)> forward;  // a fixed input -> (..., classes)
  std::string linear_key;                      // a non-square Linear weight (out, in)
  std::string norm_key;                        // a 1-d floating tensor
};

models::BertConfig tiny_bert_config() {
  models::BertConfig c;
  c.vocab_size = 50, c.hidden_size = 16, c.num_hidden_layers = 2, c.num_attention_heads = 2;
  c.intermediate_size = 32, c.max_position_embeddings = 12, c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  return c;
}

std::vector<ModelCase> model_cases() {
  ModelCase bert{"BERT",
                 [](uint64_t seed) -> std::shared_ptr<nn::Module> {
                   manual_seed(seed);
                   auto m = std::make_shared<models::BertForMaskedLM>(tiny_bert_config());
                   m->eval();
                   return m;
                 },
                 [](nn::Module& m) {
                   const Tensor ids = from_vector<int64_t>({5, 7, 9, 11, 13, 2, 49, 1, 3, 4}, {2, 5});
                   return dynamic_cast<models::BertForMaskedLM&>(m).forward(ids).logits;
                 },
                 "bert.encoder.layer.1.intermediate.dense.weight", "bert.embeddings.LayerNorm.weight"};
  ModelCase vit{"ViT",
                [](uint64_t seed) -> std::shared_ptr<nn::Module> {
                  manual_seed(seed);
                  models::ViTConfig c;
                  c.image_size = 8, c.patch_size = 4, c.num_layers = 2, c.num_heads = 2, c.hidden_dim = 8;
                  c.mlp_dim = 16, c.num_classes = 5;
                  auto m = std::make_shared<models::VisionTransformer>(c);
                  // heads.head starts at zero (torchvision): give it values, so the output shows them
                  autograd::NoGradGuard ng;
                  m->head->weight.copy_(randn(m->head->weight.sizes()));
                  m->eval();
                  return m;
                },
                [](nn::Module& m) {
                  Generator gen(11);
                  return dynamic_cast<models::VisionTransformer&>(m).forward(randn({2, 3, 8, 8}, {}, &gen));
                },
                "encoder.layers.encoder_layer_0.mlp.0.weight", "encoder.ln.weight"};
  ModelCase resnet{"ResNet",
                   [](uint64_t seed) -> std::shared_ptr<nn::Module> {
                     manual_seed(seed);
                     auto m = std::make_shared<models::ResNet>(
                         models::BlockType::Basic, std::array<int64_t, 4>{1, 1, 1, 1},
                         models::ResNetOptions{.num_classes = 3, .in_channels = 2, .small_input_stem = true});
                     // one training step's statistics, so that running_mean/var are not 0/1
                     m->forward(randn({2, 2, 8, 8}));
                     m->eval();
                     return m;
                   },
                   [](nn::Module& m) {
                     Generator gen(12);
                     return dynamic_cast<models::ResNet&>(m).forward(randn({2, 2, 8, 8}, {}, &gen));
                   },
                   "fc.weight", "layer2.0.bn1.running_var"};
  return {bert, vit, resnet};
}

State state_of(const nn::Module& m) {
  State out;
  for (const auto& [name, t] : m.state_dict()) out[name] = t;
  return out;
}

/// Every tensor of b holds a's dtype, shape and bytes.
void check_same_state(const nn::Module& a, const nn::Module& b) {
  const State sa = state_of(a), sb = state_of(b);
  REQUIRE(sa.size() == sb.size());
  for (const auto& [name, t] : sa) {
    CAPTURE(name);
    const Tensor& u = sb.at(name);
    CHECK(u.dtype() == t.dtype());
    CHECK(u.sizes() == t.sizes());
    CHECK(bytes_of(u) == bytes_of(t));
  }
}

/// Whether any floating tensor of a and b differs: a fresh model is not the original already.
bool differs(const nn::Module& a, const nn::Module& b) {
  const State sa = state_of(a), sb = state_of(b);
  for (const auto& [name, t] : sa)
    if (is_floating(t.dtype()) && bytes_of(t) != bytes_of(sb.at(name))) return true;
  return false;
}

/// Replaces `from` by `to` (of the same length, so no offset moves) in the header of `path`.
void edit_header(const std::string& path, const std::string& from, const std::string& to) {
  REQUIRE(from.size() == to.size());
  std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  const size_t at = bytes.find(from, 8);
  REQUIRE_MESSAGE(at != std::string::npos, "no '", from, "' in the header");
  REQUIRE(at + from.size() <= 8 + n);
  bytes.replace(at, from.size(), to);
  write_file(path, bytes);
}

/// Saves `state` as a safetensors file at `path`.
void save(const std::string& path, const State& state) {
  nn::save_safetensors(path, nn::NamedTensors(state.begin(), state.end()));
}

/// The exact value of IEEE binary16 bits, decoded here (not by frugal's cast).
double decode_half(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  if (exp == 31) v = mant ? NAN : INFINITY;
  return sign ? -v : v;
}
/// The exact value of bfloat16 bits: the high half of a float32.
double decode_bfloat16(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// The values a 16-bit tensor holds, decoded from its raw bits.
Values decode16(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint16_t*>(c.data());
  Values out;
  for (int64_t i = 0; i < c.numel(); ++i)
    out.push_back(t.dtype() == kFloat16 ? decode_half(p[i]) : decode_bfloat16(p[i]));
  return out;
}

}  // namespace

// ============================================================================================
// state dicts through safetensors
// ============================================================================================

TEST_CASE("probe loading: a saved state_dict loads into a fresh model bit for bit, with the same output") {
  for (const ModelCase& mc : model_cases()) {
    CAPTURE(mc.name);
    ScratchDir dir("probe_loading_round");
    const std::string path = (dir.path / "m.safetensors").string();
    auto a = mc.make(1), b = mc.make(2);
    REQUIRE(differs(*a, *b));
    nn::save_safetensors(path, a->state_dict());
    if (mc.name == "BERT")
      models::load_safetensors_into(*b, path, dynamic_cast<models::BertForMaskedLM&>(*b).tied_keys());
    else models::load_safetensors_into(*b, path);
    check_same_state(*a, *b);
    CHECK(bytes_of(mc.forward(*a)) == bytes_of(mc.forward(*b)));
  }
}

TEST_CASE("probe loading: a missing key is refused and the random init is kept whole; non-strict reports it") {
  for (const ModelCase& mc : model_cases()) {
    CAPTURE(mc.name);
    ScratchDir dir("probe_loading_missing");
    const std::string path = (dir.path / "m.safetensors").string();
    auto a = mc.make(1), b = mc.make(2), b0 = mc.make(2);
    State s = state_of(*a);
    REQUIRE(s.erase(mc.norm_key) == 1);
    save(path, s);
    check_error([&] { models::load_safetensors_into(*b, path); }, {"missing keys (1)", mc.norm_key});
    check_same_state(*b0, *b);  // nothing was written before the error
    // Not strict: everything else loads, the missing key keeps b's value, and the result says so.
    const nn::Module::LoadResult r = b->load_state_dict(nn::load_safetensors(path).tensors, /*strict=*/false);
    CHECK(r.missing_keys == std::vector<std::string>{mc.norm_key});
    CHECK(r.unexpected_keys.empty());
    const State sa = state_of(*a), sb = state_of(*b), sb0 = state_of(*b0);
    for (const auto& [name, t] : sb) {
      CAPTURE(name);
      CHECK(bytes_of(t) == bytes_of(name == mc.norm_key ? sb0.at(name) : sa.at(name)));
    }
  }
}

TEST_CASE("probe loading: an unexpected extra key is refused naming it; non-strict reports it") {
  for (const ModelCase& mc : model_cases()) {
    CAPTURE(mc.name);
    ScratchDir dir("probe_loading_extra");
    const std::string path = (dir.path / "m.safetensors").string();
    auto a = mc.make(1), b = mc.make(2), b0 = mc.make(2);
    State s = state_of(*a);
    s["pooler.dense.weight"] = ones({4, 4});  // e.g. a head this model does not have
    save(path, s);
    check_error([&] { models::load_safetensors_into(*b, path); }, {"unexpected keys (1)", "pooler.dense.weight"});
    check_same_state(*b0, *b);
    const nn::Module::LoadResult r = b->load_state_dict(nn::load_safetensors(path).tensors, /*strict=*/false);
    CHECK(r.missing_keys.empty());
    CHECK(r.unexpected_keys == std::vector<std::string>{"pooler.dense.weight"});
    check_same_state(*a, *b);
  }
}

TEST_CASE("probe loading: a transposed or reshaped tensor is refused naming the key and both shapes") {
  for (const ModelCase& mc : model_cases()) {
    CAPTURE(mc.name);
    auto a = mc.make(1), b = mc.make(2), b0 = mc.make(2);
    const State good = state_of(*a);
    const Tensor w = good.at(mc.linear_key);  // (out, in), out != in
    REQUIRE(w.size(0) != w.size(1));
    const std::string model_shape = shape_str(w.sizes());
    // a Linear weight stored (in, out), as a y = x @ W convention would write it
    State s = good;
    s[mc.linear_key] = w.t().contiguous();
    check_error([&] { b->load_state_dict(s); }, {mc.linear_key, shape_str(w.t().sizes()), model_shape});
    // the same number of elements in another shape, and flattened
    s[mc.linear_key] = w.reshape({w.size(1), w.size(0)});
    check_error([&] { b->load_state_dict(s, /*strict=*/false); }, {mc.linear_key, model_shape});
    s[mc.linear_key] = w.reshape({-1});
    check_error([&] { b->load_state_dict(s); }, {mc.linear_key, shape_str({w.numel()}), model_shape});
    check_same_state(*b0, *b);
  }
  // a convolution weight with its channel dims swapped (same numel)
  auto r = model_cases()[2].make(1), r2 = model_cases()[2].make(2);
  State s = state_of(*r);
  const Tensor w = s.at("layer2.0.conv1.weight");  // (128, 64, 3, 3)
  s["layer2.0.conv1.weight"] = w.transpose(0, 1).contiguous();
  check_error([&] { r2->load_state_dict(s); }, {"layer2.0.conv1.weight", "[64, 128, 3, 3]", "[128, 64, 3, 3]"});
}

TEST_CASE("probe loading: float16, bfloat16 and float64 checkpoints convert as a cast; the model stays float32") {
  for (const ModelCase& mc : model_cases()) {
    for (DType dt : {kFloat16, kBFloat16, kFloat64}) {
      CAPTURE(mc.name);
      CAPTURE(dtype_name(dt));
      ScratchDir dir("probe_loading_dtype");
      const std::string path = (dir.path / "m.safetensors").string();
      auto a = mc.make(1), b = mc.make(2), ref = mc.make(3);
      State file, expected;  // what the file holds; the float32 values a cast gives, decoded here
      for (const auto& [name, t] : state_of(*a)) {
        if (!is_floating(t.dtype())) {
          file[name] = expected[name] = t;
          continue;
        }
        Values v;
        if (dt == kFloat64) {
          // values between float32 neighbours, so that the rounding shows: v * (1 + 2^-26) + 1e-9
          v = values_of(t);
          for (double& x : v) x = x * (1 + std::ldexp(1.0, -26)) + 1e-9;
          file[name] = from_vector(v, t.sizes(), TensorOptions(kFloat64));
          for (double& x : v) x = double(static_cast<float>(x));  // C++'s cast: round to nearest even
        } else {
          Tensor h = t.to(dt).contiguous();
          if (name == mc.norm_key) {  // subnormals, -0, the extremes of the 16-bit format
            const std::vector<uint16_t> special =
                dt == kFloat16 ? std::vector<uint16_t>{0x0001, 0x03ff, 0x8000, 0x0400, 0x3c01, 0x7bff}
                               : std::vector<uint16_t>{0x0001, 0x007f, 0x8000, 0x0080, 0x3f81, 0x7f7f};
            std::memcpy(h.data(), special.data(), std::min<size_t>(special.size(), size_t(h.numel())) * 2);
          }
          file[name] = h;
          v = decode16(h);
        }
        expected[name] = from_vector(v, t.sizes(), TensorOptions(kFloat32));  // exact: v is a float32
      }
      save(path, file);
      if (mc.name == "BERT")
        models::load_safetensors_into(*b, path, dynamic_cast<models::BertForMaskedLM&>(*b).tied_keys());
      else models::load_safetensors_into(*b, path);
      ref->load_state_dict(expected);
      check_same_state(*ref, *b);
      for (const auto& [name, t] : b->state_dict())
        if (is_floating(t.dtype())) CHECK_MESSAGE(t.dtype() == kFloat32, name);
      CHECK(bytes_of(mc.forward(*ref)) == bytes_of(mc.forward(*b)));
    }
  }
}

// ============================================================================================
// tied weights
// ============================================================================================

TEST_CASE("probe loading: BERT's tied weights stored under either key alone fill both") {
  const ModelCase mc = model_cases()[0];
  ScratchDir dir("probe_loading_tied_once");
  const std::string path = (dir.path / "m.safetensors").string();
  auto a = mc.make(1);
  for (const char* drop : {"bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"}) {
    CAPTURE(drop);
    auto b = mc.make(2);
    auto& mlm = dynamic_cast<models::BertForMaskedLM&>(*b);
    State s = state_of(*a);
    s.erase(drop);
    s.erase("cls.predictions.bias");  // and the bias under its alias only
    save(path, s);
    check_error([&] { models::load_safetensors_into(*b, path); }, {"missing keys", drop});  // without the ties
    models::load_safetensors_into(*b, path, mlm.tied_keys());
    check_same_state(*a, *b);
    CHECK(&mlm.bert->embeddings->word_embeddings->weight.impl() ==
          &state_of(*b)["cls.predictions.decoder.weight"].impl());
    CHECK(bytes_of(mc.forward(*a)) == bytes_of(mc.forward(*b)));
  }
}

TEST_CASE("probe loading: BERT's tied weights stored twice load when equal and are refused when they differ") {
  const ModelCase mc = model_cases()[0];
  ScratchDir dir("probe_loading_tied_twice");
  const std::string path = (dir.path / "m.safetensors").string();
  auto a = mc.make(1), b = mc.make(2), b0 = mc.make(2);
  auto& mlm = dynamic_cast<models::BertForMaskedLM&>(*b);
  State s = state_of(*a);
  // equal values in two dtypes (float16 holds them exactly), and a NaN stored twice
  Tensor emb = s.at("bert.embeddings.word_embeddings.weight").to(kFloat16).to(kFloat32);
  ops::fill_(emb.select(0, 3).select(0, 0), NAN);
  s["bert.embeddings.word_embeddings.weight"] = emb;
  s["cls.predictions.decoder.weight"] = emb.to(kFloat16);
  save(path, s);
  models::load_safetensors_into(*b, path, mlm.tied_keys());
  CHECK(bytes_of(mlm.bert->embeddings->word_embeddings->weight) == bytes_of(emb));
  // different values: refused through the file and through load_state_dict, naming both keys
  s = state_of(*a);
  s["cls.predictions.decoder.weight"] = s.at("bert.embeddings.word_embeddings.weight") * 2.0;
  save(path, s);
  auto c = mc.make(2);
  const std::vector<std::string> keys{"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"};
  check_error([&] { models::load_safetensors_into(*c, path, mlm.tied_keys()); }, keys);
  check_error([&] { c->load_state_dict(s); }, keys);
  check_error([&] { c->load_state_dict(s, /*strict=*/false); }, keys);
  check_same_state(*b0, *c);
}

TEST_CASE("probe loading: a tensor registered under two names, given two values, is refused") {
  // Any module with a shared tensor, not only those that declare tied_keys (Note [Loading shared tensors]).
  struct Tied : nn::Module {
    Tensor w;
    Tied() {
      w = register_parameter("encoder", zeros({2, 3}));
      register_parameter("decoder", w);
    }
  } m;
  const Tensor x = from_vector(Values{1, 2, 3, 4, 5, 6}, {2, 3}, TensorOptions(kFloat32));
  check_error([&] { m.load_state_dict(State{{"encoder", x}, {"decoder", x + 1.0}}); }, {"encoder", "decoder"});
  CHECK(values_of(m.w) == Values(6, 0.0));
  m.load_state_dict(State{{"encoder", x}, {"decoder", x.to(kFloat64)}});
  CHECK(values_of(m.w) == values_of(x));
  // Not strict, one of the two names: that value, and the other name reported missing.
  const auto r = m.load_state_dict(State{{"decoder", x * 3.0}}, /*strict=*/false);
  CHECK(values_of(m.w) == values_of(x * 3.0));
  CHECK(r.missing_keys == std::vector<std::string>{"encoder"});
}

// ============================================================================================
// layouts of the receiving model
// ============================================================================================

TEST_CASE("probe loading: channels-last and transposed parameters receive the values by index, in place") {
  const ModelCase mc = model_cases()[2];
  ScratchDir dir("probe_loading_layout");
  const std::string path = (dir.path / "m.safetensors").string();
  auto a = mc.make(1), b = mc.make(2);
  nn::save_safetensors(path, a->state_dict());
  nn::to_channels_last(*b);
  std::map<std::string, const void*> where;
  for (const auto& [name, t] : b->state_dict()) where[name] = t.data();
  models::load_safetensors_into(*b, path);
  for (const auto& [name, t] : b->state_dict()) {
    CAPTURE(name);
    CHECK(t.data() == where.at(name));  // the same storage: optimizers' handles stay valid
    if (t.dim() == 4) CHECK(is_channels_last(t));
    CHECK(values_of(t) == values_of(state_of(*a).at(name)));
  }
  check_close(mc.forward(*b), values_of(mc.forward(*a)), 1e-5, 1e-5, "channels-last ResNet");

  // A parameter that is a transposed view, and one with a storage offset.
  struct Strided : nn::Module {
    Tensor t, n;
    Strided() {
      t = register_parameter("t", zeros({3, 4}).t());              // (4, 3), strides (1, 4)
      n = register_parameter("n", zeros({4, 5}).narrow(1, 1, 3));  // (4, 3), offset 1
    }
  } m;
  REQUIRE_FALSE(m.t.is_contiguous());
  const Values v = random_values(12, 5);
  m.load_state_dict(State{{"t", from_vector(v, {4, 3}, TensorOptions(kFloat64))},
                          {"n", from_vector(v, {4, 3}, TensorOptions(kFloat16))}});
  CHECK(values_of(m.t) == values_of(from_vector(v, {4, 3}, TensorOptions(kFloat32))));
  CHECK(values_of(m.n) == values_of(from_vector(v, {4, 3}, TensorOptions(kFloat16))));
}

// ============================================================================================
// damaged files
// ============================================================================================

TEST_CASE("probe loading: a truncated file is refused naming the file, and the model is unchanged") {
  const ModelCase mc = model_cases()[1];
  ScratchDir dir("probe_loading_trunc");
  const std::string path = (dir.path / "m.safetensors").string(), cut = (dir.path / "cut.safetensors").string();
  auto a = mc.make(1), b = mc.make(2), b0 = mc.make(2);
  nn::save_safetensors(path, a->state_dict());
  const std::string whole = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(whole[size_t(i)]);
  for (size_t keep : {size_t(0), size_t(5), size_t(8 + n / 2), size_t(8 + n), whole.size() - 4, whole.size() - 1}) {
    CAPTURE(keep);
    write_file(cut, whole.substr(0, keep));
    check_error([&] { models::load_safetensors_into(*b, cut); }, {cut});
  }
  check_same_state(*b0, *b);
}

TEST_CASE("probe loading: a header that lies about dtype, shape or offsets is refused or caught by the shape check") {
  const ModelCase mc = model_cases()[1];
  ScratchDir dir("probe_loading_lies");
  const std::string path = (dir.path / "m.safetensors").string();
  auto a = mc.make(1), b = mc.make(2), b0 = mc.make(2);
  const std::string key = "heads.head.weight";  // (5, 8) float32: 160 bytes
  const std::string entry = "\"" + key + "\":{\"dtype\":\"F32\",\"shape\":[5,8]";
  auto fresh = [&] { nn::save_safetensors(path, a->state_dict()); };
  // dtype: F16 needs half the bytes; the parser refuses the offsets
  fresh();
  edit_header(path, entry, "\"" + key + "\":{\"dtype\":\"F16\",\"shape\":[5,8]");
  check_error([&] { models::load_safetensors_into(*b, path); }, {path, key, "F16", "160"});
  // shape: [8,5] holds the same bytes; the parser accepts it, the model's shape does not
  fresh();
  edit_header(path, entry, "\"" + key + "\":{\"dtype\":\"F32\",\"shape\":[8,5]");
  check_error([&] { models::load_safetensors_into(*b, path); }, {key, "[8, 5]", "[5, 8]"});
  // offsets: one byte longer overlaps the next tensor (or runs past the data)
  fresh();
  std::string header = read_file(path).substr(8);
  const size_t at = header.find("\"" + key + "\"");
  const size_t offs = header.find("\"data_offsets\":[", at) + 16, comma = header.find(',', offs),
               close = header.find(']', comma);
  const std::string begin = header.substr(offs, comma - offs), end = header.substr(comma + 1, close - comma - 1);
  const std::string moved = std::to_string(std::stoull(end) + 1);
  if (moved.size() == end.size()) {  // keep the header length
    edit_header(path, "[" + begin + "," + end + "]", "[" + begin + "," + moved + "]");
    check_error([&] { models::load_safetensors_into(*b, path); }, {path, key});
  }
  // a key given twice in the header
  fresh();
  edit_header(path, "\"encoder.layers.encoder_layer_0.ln_1.bias\"", "\"encoder.layers.encoder_layer_0.ln_2.bias\"");
  check_error([&] { models::load_safetensors_into(*b, path); },
              {path, "duplicate key", "encoder.layers.encoder_layer_0.ln_2.bias"});
  check_same_state(*b0, *b);
}

// ============================================================================================
// configs
// ============================================================================================

TEST_CASE("probe loading: configs given {} take the documented defaults") {
  const json::Value empty_object = json::parse("{}");
  const models::BertConfig b = models::BertConfig::from_json(empty_object);
  // bert-base-uncased's config.json, as the header documents
  CHECK(b.vocab_size == 30522);
  CHECK(b.hidden_size == 768);
  CHECK(b.num_hidden_layers == 12);
  CHECK(b.num_attention_heads == 12);
  CHECK(b.intermediate_size == 3072);
  CHECK(b.max_position_embeddings == 512);
  CHECK(b.type_vocab_size == 2);
  CHECK(b.layer_norm_eps == 1e-12);
  CHECK(b.hidden_dropout_prob == 0.1);
  const models::ViTConfig v = models::ViTConfig::from_json(empty_object), v16 = models::vit_b_16();
  CHECK(std::tie(v.image_size, v.patch_size, v.num_layers, v.num_heads, v.hidden_dim, v.mlp_dim, v.num_classes) ==
        std::tie(v16.image_size, v16.patch_size, v16.num_layers, v16.num_heads, v16.hidden_dim, v16.mlp_dim,
                 v16.num_classes));
  int64_t depth = 50;
  const models::ResNetOptions r = models::resnet_options_from_json(empty_object, &depth);
  CHECK(depth == 50);  // kept when absent
  CHECK(r.num_classes == 1000);
  CHECK(r.in_channels == 3);
  CHECK_FALSE(r.small_input_stem);
  // a config that names values builds the model it names: keys in the state_dict shapes
  auto net = models::resnet_from_json(json::parse(R"({"depth": 18, "num_classes": 7, "in_channels": 1})"), 50);
  CHECK(state_of(*net).at("fc.weight").sizes() == Shape{7, 512});
  CHECK(state_of(*net).at("conv1.weight").sizes() == Shape{64, 1, 7, 7});
}

TEST_CASE("probe loading: unknown keys and wrong types are refused naming the key and the file") {
  auto parse = [](const char* s) { return json::parse(s); };
  // ViT and ResNet configs are frugal's own: a misspelt key must not fall back to a default
  check_error([&] { models::ViTConfig::from_json(parse(R"({"patch": 8})"), "v.json"); }, {"v.json", "patch"});
  check_error([&] { models::resnet_from_json(parse(R"({"num_class": 10})"), 18, "r.json"); }, {"r.json", "num_class"});
  // wrong types
  check_error([&] { models::ViTConfig::from_json(parse(R"({"hidden_dim": "768"})"), "v.json"); },
              {"v.json", "'hidden_dim'", "number", "string"});
  check_error([&] { models::ViTConfig::from_json(parse(R"({"patch_size": 16.5})"), "v.json"); },
              {"'patch_size'", "16.5"});
  check_error([&] { models::resnet_from_json(parse(R"({"small_input_stem": 1})"), 18, "r.json"); },
              {"'small_input_stem'", "bool"});
  check_error([&] { models::resnet_from_json(parse(R"({"depth": "50"})"), 18, "r.json"); }, {"'depth'"});
  check_error([&] { models::BertConfig::from_json(parse(R"({"num_hidden_layers": [2]})"), "b.json"); },
              {"b.json", "'num_hidden_layers'", "array"});
  check_error([&] { models::BertConfig::from_json(parse(R"({"layer_norm_eps": "1e-12"})"), "b.json"); },
              {"'layer_norm_eps'"});
  // Hugging Face's config.json carries keys frugal does not use ("architectures",
  // "model_type", "transformers_version"): BERT ignores unknown keys, as documented
  const models::BertConfig c = models::BertConfig::from_json(
      parse(R"({"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 48})"));
  CHECK(c.hidden_size == 48);
}

TEST_CASE("probe loading: zero, negative and non-dividing sizes are refused naming the keys") {
  auto parse = [](const char* s) { return json::parse(s); };
  for (const char* key : {"hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers"})
    for (const char* v : {"0", "-4"}) {
      const std::string text = std::string("{\"") + key + "\": " + v + "}";
      CAPTURE(text);
      check_error([&] { models::BertConfig::from_json(parse(text.c_str()), "b.json"); }, {"b.json", key, v});
    }
  check_error([&] { models::BertConfig::from_json(parse(R"({"hidden_size": 64, "num_attention_heads": 5})")); },
              {"'hidden_size' (64)", "'num_attention_heads' (5)"});
  for (const char* key : {"image_size", "patch_size", "hidden_dim", "num_heads", "mlp_dim", "num_classes"}) {
    const std::string text = std::string("{\"") + key + "\": -1}";
    check_error([&] { models::ViTConfig::from_json(parse(text.c_str()), "v.json"); }, {"v.json", key});
  }
  check_error([&] { models::ViTConfig::from_json(parse(R"({"image_size": 32, "patch_size": 5})"), "v.json"); },
              {"'image_size' (32)", "'patch_size' (5)"});
  check_error([&] { models::ViTConfig::from_json(parse(R"({"image_size": 4, "patch_size": 8})"), "v.json"); },
              {"'image_size' (4)", "'patch_size' (8)"});
  check_error([&] { models::ViTConfig::from_json(parse(R"({"hidden_dim": 64, "num_heads": 6})"), "v.json"); },
              {"'hidden_dim' (64)", "'num_heads' (6)"});
  check_error([&] { models::resnet_from_json(parse(R"({"num_classes": 0})"), 18, "r.json"); }, {"'num_classes'"});
  check_error([&] { models::resnet_from_json(parse(R"({"in_channels": -3})"), 18, "r.json"); }, {"'in_channels'"});
  check_error([&] { models::resnet_from_json(parse(R"({"blocks_per_layer": [1, 0, 1, 1]})"), 18, "r.json"); },
              {"'blocks_per_layer'", "index 1"});
}
