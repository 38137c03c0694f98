// The modules' replay of the PyTorch goldens (tests/golden_replay/replay.h): frugal's nn modules
// against PyTorch's, as users port them: the same constructor settings
// must give the same parameter shapes and state_dict keys (in torch's order), take torch's
// state_dict as it is, and give torch's outputs, input gradients, parameter gradients and
// running statistics, in train and in eval mode, on contiguous and non-contiguous inputs.
// tools/torch_golden_modules.py writes the goldens (tests/golden/modules_torch.safetensors) with
// PyTorch 1.13 in float64 from the stored float32 values; ops.cpp does the same for the
// functions underneath, so a failure here that has no twin there is in the module itself:
// its defaults, how it passes its settings on, its train/eval switch, its buffers, its names.
//
// Note [Module goldens]
// A case's "spec" names a torch module and its constructor arguments under torch's names and
// with torch's defaults (make_module maps them onto frugal's options; an argument it does not
// know fails the case, so the generator cannot ask for a setting this test would drop).
// Sequential and ModuleList nest specs; BertLayer and EncoderBlock take BertConfig's and
// ViTConfig's names (torch's peer: nn.TransformerEncoderLayer), BasicBlock and Bottleneck
// torchvision's, with the spec's "frugal" member choosing frugal's fused paths. A case runs in
// four steps, each a CHECK naming the case:
//  1. names: frugal's state_dict() keys, their order, shapes and dtypes, and the names of its
//     parameters and buffers, against torch's (a mismatch is a finding: checkpoints would not
//     load); then load_state_dict(torch's tensors, strict);
//  2. the module in the case's dtype (float32, or float64 via to()) and mode (train or eval),
//     called `repeat` times on the stored inputs (a leaf per stored base, the module fed its
//     view); the outputs of the last call are compared;
//  3. backward from every output with the stored upstream gradients; the gradients of the
//     bases and of every parameter are compared (an undefined one matches torch's zeros);
//  4. every buffer (running statistics, num_batches_tracked) after the calls.
// Floating values compare within rtol |torch| + atol max(1, max |torch|) (tol_for), integers
// exactly. The generator checks that torch's own float32 modules stay within half that bound.
//
// What frugal's modules lack, so no case asks for it: Conv2d's padding='same'/'valid' and
// padding_mode (reflect, replicate, circular); MaxPool2d's return_indices; AvgPool2d's
// divisor_override; AdaptiveAvgPool2d's None sizes; Embedding's max_norm, scale_grad_by_freq and
// sparse; LayerNorm's bias=False (torch >= 2.1); MultiheadAttention's add_bias_kv and
// add_zero_attn; BatchNorm1d/3d, InstanceNorm, Conv1d/3d, ConvTranspose2d, AdaptiveMaxPool2d,
// Softmax/LogSoftmax, PReLU, Softplus, Identity, ModuleDict, nn.TransformerEncoderLayer itself
// (BertLayer and the ViT EncoderBlock stand for it, with their libraries' names).
// Where frugal documents a deviation the cases keep away from it: an attention row whose every
// key is masked (frugal: zero weights; torch 1.13: NaN); MultiheadAttention's need_weights
// default (false in frugal, true in torch) and batch_first default (true in frugal, false in
// torch) are passed explicitly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "core/json.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/batch_norm.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/group_norm.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/pooling.h"
#include "nn/rms_norm.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"
#include "tests/golden_replay/golden_file.h"
#include "tests/golden_replay/replay.h"
#include "tests/test_util.h"

namespace frugal::testing {
namespace {

const std::string kGoldenFile = "modules_torch.safetensors";
const std::string kRemake = " (regenerate it: /usr/bin/python3 tools/torch_golden_modules.py)";

// ---- reading JSON --------------------------------------------------------------------------

/// An optional index into the case's inputs (absent or null: none).
std::optional<size_t> index_of(const json::Value& obj, const std::string& key) {
  const json::Value* v = obj.find(key);
  if (!v || v->type == json::Value::Type::Null) return std::nullopt;
  return size_t(int_of(*v));
}

// ---- the file ------------------------------------------------------------------------------

/// Checks that one case's metadata is whole and that every tensor it names is in the file with
/// the shape and dtype the metadata gives; returns those tensor names.
std::set<std::string> check_case(const GoldenFile& g, const json::Value& c) {
  const std::string id = str_of(member(c, "id"));
  std::set<std::string> names;
  auto need = [&](const std::string& what, const Shape* shape, std::optional<DType> dtype) {
    auto it = g.tensors.find(id + "." + what);
    FRUGAL_CHECK(it != g.tensors.end(), "case ", id, " has no tensor \"", what, "\"");
    if (shape)
      FRUGAL_CHECK(it->second.sizes() == *shape, "case ", id, ": tensor \"", what, "\" is ",
                   shape_str(it->second.sizes()), ", the metadata says ", shape_str(*shape));
    if (dtype)
      FRUGAL_CHECK(it->second.dtype() == *dtype, "case ", id, ": tensor \"", what, "\" is ",
                   dtype_name(it->second.dtype()), ", the metadata says ", dtype_name(*dtype));
    names.insert(it->first);
  };
  for (const char* k : {"family", "module", "name", "kind"}) str_of(member(c, k));
  FRUGAL_CHECK(member(c, "spec").is_object() && member(c, "call").is_object(), "case ", id,
               ": spec and call must be objects");
  bool_of(member(c, "train"));
  FRUGAL_CHECK(int_of(member(c, "repeat")) >= 1, "case ", id, ": repeat must be at least 1");
  const DType dt = parse_dtype(str_of(member(c, "dtype")));
  FRUGAL_CHECK(dt == kFloat32 || dt == kFloat64, "case ", id, ": dtype must be float32 or float64");
  for (const json::Value& s : member(c, "state").items) {
    FRUGAL_CHECK(s.is_array() && s.items.size() == 3, "case ", id, ": a state entry is not [key, shape, dtype]");
    const Shape shape = ints_of(s.items[1]);
    need("state." + str_of(s.items[0]), &shape, parse_dtype(str_of(s.items[2])));
  }
  for (const std::string& p : strs_of(member(c, "params"))) need("grad." + p, nullptr, kFloat64);
  for (const std::string& b : strs_of(member(c, "buffers"))) need("after." + b, nullptr, std::nullopt);
  const json::Value& ins = member(c, "inputs");
  FRUGAL_CHECK(ins.is_array() && !ins.items.empty(), "case ", id, ": no inputs");
  for (size_t i = 0; i < ins.items.size(); ++i) {
    FRUGAL_CHECK(member(ins.items[i], "view").is_array(), "case ", id, ": input ", i, " has no view list");
    need("in" + std::to_string(i), nullptr, std::nullopt);
    if (bool_of(member(ins.items[i], "grad"))) need("grad.in" + std::to_string(i), nullptr, kFloat64);
  }
  const json::Value& outs = member(c, "outputs");
  FRUGAL_CHECK(outs.is_array() && !outs.items.empty(), "case ", id, ": no outputs");
  for (size_t k = 0; k < outs.items.size(); ++k) {
    const Shape shape = ints_of(member(outs.items[k], "shape"));
    need("out" + std::to_string(k), &shape, kFloat64);
    need("gout" + std::to_string(k), &shape, kFloat32);
  }
  return names;
}

/// Reads the file and validates all of it (every case whole, every tensor named by a case and
/// every case's tensors present); throws frugal::Error saying what is wrong and how to remake it.
GoldenFile read_golden_modules() {
  const std::string path = std::string(FRUGAL_GOLDEN_DIR) + "/" + kGoldenFile;
  GoldenFile g = read_golden_file(kGoldenFile, kRemake);
  std::set<std::string> claimed, ids;
  for (const json::Value& c : g.cases.items) {
    try {
      FRUGAL_CHECK(ids.insert(str_of(member(c, "id"))).second, "a case id is used twice");
      for (const std::string& n : check_case(g, c)) claimed.insert(n);
    } catch (const std::exception& e) { FRUGAL_FAIL("torch module goldens: ", path, ": ", e.what(), kRemake); }
  }
  for (const auto& [name, t] : g.tensors)
    FRUGAL_CHECK(claimed.count(name) == 1, "torch module goldens: ", path, ": tensor \"", name, "\" belongs to no case",
                 kRemake);
  return g;
}

/// The file, loaded and validated on first use; a missing or malformed file fails the calling test case.
const GoldenFile& golden_modules() { return golden_once<read_golden_modules>(); }

// ---- building a module from its torch spec -------------------------------------------------

/// A module's torch constructor arguments, with torch's defaults; done() fails on an argument
/// no accessor read (a setting this test would otherwise drop silently).
class Config {
 public:
  Config(const json::Value* obj, std::string module) : obj_(obj), module_(std::move(module)) {
    FRUGAL_CHECK(!obj_ || obj_->is_object(), "torch module goldens: ", module_, ": config is not an object");
  }
  /// The argument, or nullptr when absent (read either way).
  const json::Value* get(const std::string& k) {
    read_.insert(k);
    return obj_ ? obj_->find(k) : nullptr;
  }
  int64_t integer(const std::string& k, std::optional<int64_t> dflt = std::nullopt) {
    const json::Value* v = get(k);
    FRUGAL_CHECK(v || dflt, "torch module goldens: ", module_, ": missing argument ", k);
    return v ? int_of(*v) : *dflt;
  }
  double num(const std::string& k, double dflt) {
    const json::Value* v = get(k);
    return v ? num_of(*v) : dflt;
  }
  bool flag(const std::string& k, bool dflt) {
    const json::Value* v = get(k);
    return v ? bool_of(*v) : dflt;
  }
  std::string text(const std::string& k, const std::string& dflt) {
    const json::Value* v = get(k);
    return v ? str_of(*v) : dflt;
  }
  /// A number that may be None: absent gives dflt, null gives nullopt.
  std::optional<double> optional_num(const std::string& k, std::optional<double> dflt) {
    const json::Value* v = get(k);
    if (!v) return dflt;
    if (v->type == json::Value::Type::Null) return std::nullopt;
    return num_of(*v);
  }
  std::optional<int64_t> optional_int(const std::string& k) {
    const json::Value* v = get(k);
    if (!v || v->type == json::Value::Type::Null) return std::nullopt;
    return int_of(*v);
  }
  /// A torch int-or-pair argument (kernel_size, stride, ...).
  Int2 pair(const std::string& k, std::optional<Int2> dflt = std::nullopt) {
    const json::Value* v = get(k);
    if (!v || v->type == json::Value::Type::Null) {
      FRUGAL_CHECK(dflt, "torch module goldens: ", module_, ": missing argument ", k);
      return *dflt;
    }
    if (!v->is_array()) return Int2(int_of(*v));
    const std::vector<int64_t> p = ints_of(*v);
    FRUGAL_CHECK(p.size() == 2, "torch module goldens: ", module_, ": ", k, " is not a pair");
    return Int2(p[0], p[1]);
  }
  /// A torch int-or-list shape argument (normalized_shape).
  Shape shape(const std::string& k) {
    const json::Value* v = get(k);
    FRUGAL_CHECK(v, "torch module goldens: ", module_, ": missing argument ", k);
    return v->is_array() ? Shape(ints_of(*v)) : Shape{int_of(*v)};
  }
  void done() const {
    if (!obj_) return;
    for (const json::Member& m : obj_->members)
      FRUGAL_CHECK(read_.count(m.key) == 1, "torch module goldens: ", module_, "(", m.key,
                   "=...): this test does not build that setting");
  }

 private:
  const json::Value* obj_;
  std::string module_;
  std::set<std::string> read_;
};

std::shared_ptr<nn::Module> make_module(const json::Value& spec);

std::shared_ptr<nn::UnaryModule> make_unary(const json::Value& spec) {
  auto u = std::dynamic_pointer_cast<nn::UnaryModule>(make_module(spec));
  FRUGAL_CHECK(u != nullptr, "torch module goldens: ", str_of(member(spec, "module")),
               " is not a one-input module, in a container");
  return u;
}

/// frugal's module for a torch spec (Note [Module goldens]).
std::shared_ptr<nn::Module> make_module(const json::Value& spec) {
  const std::string name = str_of(member(spec, "module"));
  if (name == "Sequential" || name == "ModuleList") {
    const json::Value& layers = member(spec, "layers");
    FRUGAL_CHECK(layers.is_array(), "torch module goldens: ", name, ": layers is not an array");
    if (name == "Sequential") {
      auto s = std::make_shared<nn::Sequential>();
      for (const json::Value& l : layers.items) s->push_back(make_unary(l));
      return s;
    }
    auto list = std::make_shared<nn::ModuleList<nn::UnaryModule>>();
    for (const json::Value& l : layers.items) list->push_back(make_unary(l));
    return list;
  }
  Config c(spec.find("config"), name);
  std::shared_ptr<nn::Module> m;
  if (name == "Linear") {
    const int64_t in = c.integer("in_features"), out = c.integer("out_features");
    m = std::make_shared<nn::Linear>(in, out, nn::LinearOptions{.bias = c.flag("bias", true)});
  } else if (name == "Conv2d") {
    const int64_t in = c.integer("in_channels"), out = c.integer("out_channels");
    const Int2 kernel = c.pair("kernel_size");
    nn::Conv2dModuleOptions o{.stride = c.pair("stride", 1),
                              .padding = c.pair("padding", 0),
                              .dilation = c.pair("dilation", 1),
                              .groups = c.integer("groups", 1),
                              .bias = c.flag("bias", true)};
    m = std::make_shared<nn::Conv2d>(in, out, kernel, o);
  } else if (name == "MaxPool2d") {
    const Int2 kernel = c.pair("kernel_size");
    MaxPool2dOptions o{.stride = c.pair("stride", Int2(0)),  // torch's None: the kernel size
                       .padding = c.pair("padding", 0),
                       .dilation = c.pair("dilation", 1),
                       .ceil_mode = c.flag("ceil_mode", false)};
    m = std::make_shared<nn::MaxPool2d>(kernel, o);
  } else if (name == "AvgPool2d") {
    const Int2 kernel = c.pair("kernel_size");
    AvgPool2dOptions o{.stride = c.pair("stride", Int2(0)),
                       .padding = c.pair("padding", 0),
                       .ceil_mode = c.flag("ceil_mode", false),
                       .count_include_pad = c.flag("count_include_pad", true)};
    m = std::make_shared<nn::AvgPool2d>(kernel, o);
  } else if (name == "AdaptiveAvgPool2d") {
    m = std::make_shared<nn::AdaptiveAvgPool2d>(c.pair("output_size"));
  } else if (name == "BatchNorm2d") {
    const int64_t n = c.integer("num_features");
    nn::BatchNormOptions o{.eps = c.num("eps", 1e-5),
                           .momentum = c.optional_num("momentum", 0.1),
                           .affine = c.flag("affine", true),
                           .track_running_stats = c.flag("track_running_stats", true)};
    m = std::make_shared<nn::BatchNorm2d>(n, o);
  } else if (name == "LayerNorm") {
    const Shape shape = c.shape("normalized_shape");
    m = std::make_shared<nn::LayerNorm>(
        shape,
        nn::LayerNormOptions{.eps = c.num("eps", 1e-5), .elementwise_affine = c.flag("elementwise_affine", true)});
  } else if (name == "GroupNorm") {
    const int64_t groups = c.integer("num_groups"), channels = c.integer("num_channels");
    m = std::make_shared<nn::GroupNorm>(
        groups, channels, nn::GroupNormOptions{.eps = c.num("eps", 1e-5), .affine = c.flag("affine", true)});
  } else if (name == "RMSNorm") {
    const Shape shape = c.shape("normalized_shape");
    m = std::make_shared<nn::RMSNorm>(shape,
                                      nn::RMSNormOptions{.eps = c.optional_num("eps", std::nullopt),
                                                         .elementwise_affine = c.flag("elementwise_affine", true)});
  } else if (name == "Embedding") {
    const int64_t n = c.integer("num_embeddings"), d = c.integer("embedding_dim");
    m = std::make_shared<nn::Embedding>(n, d, nn::EmbeddingOptions{.padding_idx = c.optional_int("padding_idx")});
  } else if (name == "MultiheadAttention") {
    const int64_t e = c.integer("embed_dim"), h = c.integer("num_heads");
    nn::MultiheadAttentionOptions o{.dropout = c.num("dropout", 0.0),
                                    .bias = c.flag("bias", true),
                                    .batch_first = c.flag("batch_first", false),  // torch's default
                                    .kdim = c.optional_int("kdim"),
                                    .vdim = c.optional_int("vdim")};
    m = std::make_shared<nn::MultiheadAttention>(e, h, o);
  } else if (name == "BertLayer") {
    models::BertConfig b;
    b.hidden_size = c.integer("hidden_size");
    b.num_attention_heads = c.integer("num_attention_heads");
    b.intermediate_size = c.integer("intermediate_size");
    b.layer_norm_eps = c.num("layer_norm_eps", 1e-12);
    b.hidden_dropout_prob = c.num("hidden_dropout_prob", 0.1);
    b.attention_probs_dropout_prob = c.num("attention_probs_dropout_prob", 0.1);
    m = std::make_shared<models::BertLayer>(b);
  } else if (name == "EncoderBlock") {
    models::ViTConfig v;
    v.hidden_dim = c.integer("hidden_dim");
    v.num_heads = c.integer("num_heads");
    v.mlp_dim = c.integer("mlp_dim");
    v.dropout = c.num("dropout", 0.0);
    v.attention_dropout = c.num("attention_dropout", 0.0);
    m = std::make_shared<models::EncoderBlock>(v);
  } else if (name == "BasicBlock" || name == "Bottleneck") {  // torchvision's, with frugal's fusion choice
    const int64_t in = c.integer("inplanes"), planes = c.integer("planes"), stride = c.integer("stride", 1);
    Config frugal_only(spec.find("frugal"), name);
    const std::string fusion = frugal_only.text("fusion", "none");
    FRUGAL_CHECK(fusion == "none" || fusion == "bn_relu" || fusion == "conv_bn",
                 "torch module goldens: unknown fusion ", fusion);
    frugal_only.done();
    const models::BlockFusion f{.bn_relu = fusion != "none", .conv_bn = fusion == "conv_bn"};
    if (name == "BasicBlock") m = std::make_shared<models::BasicBlock>(in, planes, stride, f);
    else m = std::make_shared<models::Bottleneck>(in, planes, stride, f);
  } else if (name == "ReLU") {
    m = std::make_shared<nn::ReLU>();
  } else if (name == "GELU") {
    const std::string approx = c.text("approximate", "none");
    FRUGAL_CHECK(approx == "none" || approx == "tanh", "torch module goldens: GELU(approximate=", approx, ")");
    m = std::make_shared<nn::GELU>(approx == "tanh");
  } else if (name == "Tanh") {
    m = std::make_shared<nn::Tanh>();
  } else if (name == "SiLU") {
    m = std::make_shared<nn::SiLU>();
  } else if (name == "Sigmoid") {
    m = std::make_shared<nn::Sigmoid>();
  } else if (name == "LeakyReLU") {
    m = std::make_shared<nn::LeakyReLU>(c.num("negative_slope", 0.01));
  } else if (name == "ELU") {
    m = std::make_shared<nn::ELU>(c.num("alpha", 1.0));
  } else if (name == "Hardtanh") {
    const double lo = c.num("min_val", -1.0), hi = c.num("max_val", 1.0);
    m = std::make_shared<nn::Hardtanh>(lo, hi);
  } else if (name == "ReLU6") {
    m = std::make_shared<nn::ReLU6>();
  } else if (name == "Hardsigmoid") {
    m = std::make_shared<nn::Hardsigmoid>();
  } else if (name == "Hardswish") {
    m = std::make_shared<nn::Hardswish>();
  } else if (name == "Mish") {
    m = std::make_shared<nn::Mish>();
  } else if (name == "Flatten") {
    const int64_t start = c.integer("start_dim", 1), end = c.integer("end_dim", -1);
    m = std::make_shared<nn::Flatten>(start, end);
  } else if (name == "Dropout") {
    m = std::make_shared<nn::Dropout>(c.num("p", 0.5));
  } else {
    FRUGAL_FAIL("torch module goldens: no frugal module for torch's ", name);
  }
  c.done();
  return m;
}

// ---- views and calls -----------------------------------------------------------------------

using Tensors = std::vector<Tensor>;

/// One forward call of the case's kind (tools/torch_golden_modules.py's forward()).
Tensors call_module(const std::string& kind, nn::Module& m, const Tensors& in, const json::Value& call) {
  if (kind == "unary") {
    auto* u = dynamic_cast<nn::UnaryModule*>(&m);
    FRUGAL_CHECK(u != nullptr, "torch module goldens: ", m.type_name(), " is not a one-input module");
    return {(*u)(in.at(0))};
  }
  if (kind == "chain") {
    auto* list = dynamic_cast<nn::ModuleList<nn::UnaryModule>*>(&m);
    FRUGAL_CHECK(list != nullptr, "torch module goldens: a chain needs a ModuleList");
    Tensor h = in.at(0);
    for (const auto& layer : *list) h = (*layer)(h);
    return {h};
  }
  if (kind == "mha") {
    auto* a = dynamic_cast<nn::MultiheadAttention*>(&m);
    FRUGAL_CHECK(a != nullptr, "torch module goldens: an mha call needs a MultiheadAttention");
    nn::AttentionForwardOptions o;
    if (auto i = index_of(call, "key_padding_mask")) o.key_padding_mask = in.at(*i);
    if (auto i = index_of(call, "attn_mask")) o.attn_mask = in.at(*i);
    auto flag = [&](const char* k) {
      const json::Value* v = call.find(k);
      return v && bool_of(*v);
    };
    o.need_weights = flag("need_weights");  // torch's default is true; the generator always says
    const json::Value* avg = call.find("average_attn_weights");
    o.average_attn_weights = avg ? bool_of(*avg) : true;
    o.is_causal = flag("is_causal");
    // The same input index is the same tensor, so `query is key` holds as it did in torch.
    nn::AttentionOutput r =
        (*a)(in.at(size_t(int_of(member(call, "query")))), in.at(size_t(int_of(member(call, "key")))),
             in.at(size_t(int_of(member(call, "value")))), o);
    if (o.need_weights) return {r.output, r.weights};
    return {r.output};
  }
  if (kind == "bert_layer") {  // x (B, T, hidden), attention_mask (B, T) of 0/1, as BertModel passes it
    auto* layer = dynamic_cast<models::BertLayer*>(&m);
    FRUGAL_CHECK(layer != nullptr, "torch module goldens: a bert_layer call needs a BertLayer");
    return {layer->forward(in.at(0), models::bert_additive_mask(in.at(1), in.at(0).dtype()))};
  }
  FRUGAL_FAIL("torch module goldens: unknown call kind ", kind);
}

// ---- comparing (as ops.cpp) ----------------------------------------------------

/// The bound for results of a module run in `dt`. float32: at least twice what torch's own
/// float32 modules miss the float64 goldens by on every case (the generator checks it), and
/// more than ten times what frugal needs on most; float64: a few roundings of short sums.
Tol tol_for(DType dt) { return dt == DType::Float32 ? Tol{1e-5, 2e-6} : Tol{1e-10, 1e-12}; }

// ---- running a case ------------------------------------------------------------------------

std::vector<std::string> names_of(const nn::NamedTensors& v) {
  std::vector<std::string> r;
  for (const auto& [n, t] : v) r.push_back(n);
  return r;
}

/// Step 1 of Note [Module goldens]: frugal's names, shapes and dtypes against torch's, then the
/// load. Returns false when the module cannot take torch's state (the rest of the case is moot).
bool check_names_and_load(const GoldenFile& g, const json::Value& c, const std::string& title, nn::Module& m) {
  const std::string id = str_of(member(c, "id"));
  std::vector<std::string> torch_keys;
  std::map<std::string, std::pair<Shape, DType>> torch_meta;
  for (const json::Value& s : member(c, "state").items) {
    torch_keys.push_back(str_of(s.items[0]));
    torch_meta[torch_keys.back()] = {ints_of(s.items[1]), parse_dtype(str_of(s.items[2]))};
  }
  const nn::NamedTensors state = m.state_dict();
  const std::vector<std::string> keys = names_of(state);
  std::vector<std::string> missing, unexpected;
  for (const auto& k : torch_keys)
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) missing.push_back(k);
  for (const auto& k : keys)
    if (!torch_meta.count(k)) unexpected.push_back(k);
  CHECK_MESSAGE((missing.empty() && unexpected.empty()),
                title << ": state_dict keys differ from torch's: torch's not in frugal's " << join(missing)
                      << ", frugal's not in torch's " << join(unexpected));
  if (!missing.empty() || !unexpected.empty()) return false;
  CHECK_MESSAGE(keys == torch_keys, title << ": state_dict key order " << join(keys) << ", torch " << join(torch_keys));
  bool shapes_match = true;
  for (const auto& [k, t] : state) {
    const auto& [shape, dtype] = torch_meta.at(k);
    const bool same = t.sizes() == shape;
    shapes_match = shapes_match && same;
    CHECK_MESSAGE(
        same, title << ": state_dict[" << k << "] shape " << shape_str(t.sizes()) << ", torch " << shape_str(shape));
    CHECK_MESSAGE(t.dtype() == dtype, title << ": state_dict[" << k << "] dtype " << std::string(dtype_name(t.dtype()))
                                            << ", torch " << std::string(dtype_name(dtype)));
  }
  if (!shapes_match) return false;
  const std::vector<std::string> params = names_of(m.named_parameters()), torch_params = strs_of(member(c, "params"));
  CHECK_MESSAGE(params == torch_params,
                title << ": named_parameters " << join(params) << ", torch " << join(torch_params));
  std::vector<std::string> buffers;  // the persistent ones: those state_dict lists
  for (const auto& k : keys)
    if (std::find(params.begin(), params.end(), k) == params.end()) buffers.push_back(k);
  const std::vector<std::string> torch_buffers = strs_of(member(c, "buffers"));
  CHECK_MESSAGE(buffers == torch_buffers, title << ": buffers " << join(buffers) << ", torch " << join(torch_buffers));

  std::map<std::string, Tensor> torch_state;
  for (const auto& k : torch_keys) torch_state[k] = stored(g, id, "state." + k);
  try {
    m.load_state_dict(torch_state, /*strict=*/true);
  } catch (const std::exception& e) {
    CHECK_MESSAGE(false, title << ": load_state_dict(torch's state_dict) threw: " << std::string(e.what()));
    return false;
  }
  return true;
}

/// Runs one case (Note [Module goldens]); every comparison is a CHECK naming the case.
void run_case(const GoldenFile& g, const json::Value& c, Device device) {
  const std::string id = str_of(member(c, "id"));
  const std::string title = case_title(c, device);
  const DType dt = parse_dtype(str_of(member(c, "dtype")));
  const Tol tol = tol_for(dt);

  std::shared_ptr<nn::Module> m = make_module(member(c, "spec"));
  if (!check_names_and_load(g, c, title, *m)) return;
  m->to(device, dt);
  m->train(bool_of(member(c, "train")));

  // Inputs: a leaf per stored base (floating ones in the case's dtype), then its views.
  const json::Value& in_meta = member(c, "inputs");
  Tensors bases, inputs;
  for (size_t i = 0; i < in_meta.items.size(); ++i) {
    Tensor base = fresh_copy(stored(g, id, "in" + std::to_string(i)), device);
    if (is_floating(base.dtype())) base = base.to(dt);
    if (bool_of(member(in_meta.items[i], "grad"))) base.requires_grad_(true);
    bases.push_back(base);
    inputs.push_back(apply_view(base, member(in_meta.items[i], "view")));
  }

  const std::string kind = str_of(member(c, "kind"));
  Tensors outs;
  for (int64_t r = int_of(member(c, "repeat")); r > 0; --r) outs = call_module(kind, *m, inputs, member(c, "call"));

  // Outputs, then backward from all of them.
  const json::Value& out_meta = member(c, "outputs");
  CHECK_MESSAGE(outs.size() == out_meta.items.size(),
                title << ": " << outs.size() << " outputs, torch " << out_meta.items.size());
  TensorList roots, grads;
  for (size_t k = 0; k < std::min(outs.size(), out_meta.items.size()); ++k) {
    check_tensor(title, "output " + std::to_string(k), outs[k], stored(g, id, "out" + std::to_string(k)), dt, tol);
    CHECK_MESSAGE(outs[k].requires_grad(), title << ": output " << k << " is not differentiable in frugal");
    if (outs[k].requires_grad()) {
      roots.push_back(outs[k]);
      grads.push_back(stored(g, id, "gout" + std::to_string(k)).to(device, outs[k].dtype()));
    }
  }
  if (!roots.empty()) {
    autograd::backward(roots, grads);
    for (size_t i = 0; i < bases.size(); ++i)
      if (bases[i].requires_grad())
        check_tensor(title, "grad of input " + std::to_string(i), bases[i].grad(),
                     stored(g, id, "grad.in" + std::to_string(i)), dt, tol);
    for (const auto& [name, p] : m->named_parameters())
      check_tensor(title, "grad of " + name, p.grad(), stored(g, id, "grad." + name), dt, tol);
  }

  // Buffers after the calls (running statistics and the batch count).
  std::map<std::string, Tensor> state;
  for (const auto& [k, t] : m->state_dict()) state[k] = t;
  for (const std::string& b : strs_of(member(c, "buffers"))) {
    auto it = state.find(b);
    if (it == state.end()) continue;  // reported in step 1
    const Tensor& want = stored(g, id, "after." + b);
    check_tensor(title, "buffer " + b + " after the forward", it->second, want,
                 is_floating(want.dtype()) ? std::optional<DType>(dt) : std::optional<DType>(want.dtype()), tol);
  }
}

}  // namespace

void replay_golden_modules(const std::vector<std::string>& families, Device device) {
  const GoldenFile& g = golden_modules();
  replay_families(g, families, device, kGoldenFile, "module",
                  [&](const json::Value& c, const std::string&) { run_case(g, c, device); });
}

void check_golden_modules_file() {
  const GoldenFile& g = golden_modules();  // validated as it is read
  std::set<std::string> families;
  for (const json::Value& c : g.cases.items) {
    const std::string title = str_of(member(c, "id")) + " " + str_of(member(c, "name"));
    families.insert(str_of(member(c, "family")));
    std::string error;
    try {
      make_module(member(c, "spec"));
    } catch (const std::exception& e) { error = e.what(); }
    CHECK_MESSAGE(error.empty(), title << ": " << error);
  }
  const std::set<std::string> known = {"linear",  "conv",      "pool",       "batchnorm", "layernorm", "groupnorm",
                                       "rmsnorm", "embedding", "activation", "attention", "container", "model"};
  CHECK_MESSAGE(families == known, "torch module goldens: families in the file "
                                       << join({families.begin(), families.end()}) << ", the test cases run "
                                       << join({known.begin(), known.end()}));
}

}  // namespace frugal::testing
