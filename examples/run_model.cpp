// Runs one of frugal's models (ResNet, BERT, ViT) on PyTorch-written weights and inputs and
// writes what it computed, for the parity check against PyTorch (tools/parity_models.py)
// and as the smallest example of loading a torchvision / Hugging Face checkpoint.
//
//   run_model --model resnet18|resnet50|bert_base|bert|vit_b16|vit [--config-json FILE]
//             --weights W.safetensors --inputs X.safetensors --out Y.safetensors
//             [--device cuda] [--amp] [--train-mode] [--backward]
//
// Inputs (by name in X): pixel_values (N, C, H, W) float for resnet and vit; input_ids,
// attention_mask, token_type_ids (B, T) int64 for bert (the last two optional); labels for
// --backward ((N) class indices; (B, T) token ids or -100 for BERT masked LM).
// Outputs (in Y, float32 unless integer): logits; loss (with labels); grad.<parameter>
// for every parameter (with --backward); buffer.<name> for every buffer (with
// --train-mode: batch norm running statistics after the forward).
//
// --config-json: resnet18/resnet50 take {"depth", "blocks_per_layer", "num_classes", "in_channels",
// "small_input_stem", "zero_init_residual", "checkpoint_blocks"} (depth overrides the
// model name); bert/bert_base take a Hugging Face config.json (its "architectures"
// picks the head: BertForSequenceClassification, else BertForMaskedLM); vit/vit_b16 take
// {"image_size", "patch_size", "in_channels", "num_layers", "num_heads", "hidden_dim",
// "mlp_dim", "num_classes", "dropout", "attention_dropout", "checkpoint_blocks"}.
// Without it: torchvision's resnet18/resnet50, bert-base, vit_b_16.
// --amp runs forward and loss under AutocastGuard(float16) on the device, and the backward
// with GradScaler's dynamic loss scale (the gradients written are unscaled).
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "examples/flags.h"
#include "models/bert.h"
#include "models/config_json.h"
#include "models/pretrained.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/safetensors.h"
#include "train/checks.h"

using namespace frugal;

namespace {

// Backward of loss. Under --amp it is scaled as GradScaler does (start at 2^16, halve while
// a gradient overflows), so float16 gradients do not underflow; the gradients written are
// unscaled.
void backward_scaled(nn::Module& model, const Tensor& loss, bool amp) {
  if (!amp) return loss.backward();
  for (double scale = 65536.0;; scale /= 2) {
    model.zero_grad();
    (loss * scale).backward(Tensor(), /*retain_graph=*/true);
    bool finite = true;
    for (auto& [name, p] : model.named_parameters())
      if (p.grad().defined()) finite = finite && std::isfinite(sum(p.grad().to(kFloat64)).item<double>());
    if (finite || scale < 2) {
      autograd::NoGradGuard no_grad;
      for (auto& [name, p] : model.named_parameters())
        if (p.grad().defined()) p.set_grad(p.grad() / scale);
      return;
    }
  }
}

struct Args {
  std::string model, config_json, weights, inputs, out, device = "cpu";
  bool amp = false, train_mode = false, backward = false;
};

const char* kUsage =
    "usage: run_model --model resnet18|resnet50|bert_base|bert|vit_b16|vit [--config-json FILE]\n"
    "                 --weights W.safetensors --inputs X.safetensors --out Y.safetensors\n"
    "                 [--device cuda] [--amp] [--train-mode] [--backward]\n";

Args parse(int argc, char** argv) {
  Args a;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--model")) a.model = flags.choice({"resnet18", "resnet50", "bert_base", "bert", "vit_b16", "vit"});
    else if (flags.is("--config-json")) a.config_json = flags.text();
    else if (flags.is("--weights")) a.weights = flags.text();
    else if (flags.is("--inputs")) a.inputs = flags.text();
    else if (flags.is("--out")) a.out = flags.text();
    else if (flags.is("--device")) a.device = flags.device();
    else if (flags.is("--amp")) a.amp = true;
    else if (flags.is("--train-mode")) a.train_mode = true;
    else if (flags.is("--backward")) a.backward = true;
    else flags.unknown();
  }
  for (const auto& [value, flag] : {std::pair{&a.model, "--model"}, std::pair{&a.weights, "--weights"},
                                    std::pair{&a.inputs, "--inputs"}, std::pair{&a.out, "--out"}})
    if (value->empty()) throw cli::UsageError(std::string(flag) + " is required");
  if (a.model == "bert" && a.config_json.empty()) throw cli::UsageError("--model bert needs --config-json");
  return a;
}

/// What one forward produced.
struct Outputs {
  Tensor logits, loss;
};

/// A model behind one interface: its module (for weights, modes, grads) and its forward.
struct Runner {
  std::shared_ptr<nn::Module> module;
  models::TiedKeys tied;
  std::function<Outputs(const std::map<std::string, Tensor>&)> forward;
};

Tensor input(const std::map<std::string, Tensor>& in, const std::string& name, bool required) {
  auto it = in.find(name);
  if (it != in.end()) return it->second;
  FRUGAL_CHECK(!required, "the inputs file has no tensor '", name, "'");
  return Tensor();
}

Runner make_runner(const Args& a) {
  std::optional<json::Value> config;
  if (!a.config_json.empty()) config = models::read_json_file(a.config_json);
  Runner r;
  if (a.model == "resnet18" || a.model == "resnet50") {
    const int64_t depth = a.model == "resnet18" ? 18 : 50;
    auto net = config ? models::resnet_from_json(*config, depth, a.config_json) : models::resnet(depth);
    r.module = net;
    r.forward = [net](const std::map<std::string, Tensor>& in) {
      Outputs o{net->forward(input(in, "pixel_values", true)), Tensor()};
      if (Tensor labels = input(in, "labels", false); labels.defined()) o.loss = cross_entropy(o.logits, labels);
      return o;
    };
  } else if (a.model == "vit" || a.model == "vit_b16") {
    auto net = std::make_shared<models::VisionTransformer>(config ? models::ViTConfig::from_json(*config, a.config_json)
                                                                  : models::vit_b_16());
    r.module = net;
    r.forward = [net](const std::map<std::string, Tensor>& in) {
      Outputs o{net->forward(input(in, "pixel_values", true)), Tensor()};
      if (Tensor labels = input(in, "labels", false); labels.defined()) o.loss = cross_entropy(o.logits, labels);
      return o;
    };
  } else if (a.model == "bert" || a.model == "bert_base") {
    const models::BertConfig c = config ? models::BertConfig::from_json(*config, a.config_json) : models::bert_base();
    std::string arch = "BertForMaskedLM";
    if (config)
      if (const json::Value* archs = config->find("architectures"); archs && archs->is_array() && !archs->items.empty())
        arch = archs->items[0].text;
    if (arch == "BertForSequenceClassification") {
      auto net = std::make_shared<models::BertForSequenceClassification>(c);
      r.module = net;
      r.forward = [net](const std::map<std::string, Tensor>& in) {
        auto o = net->forward(input(in, "input_ids", true), input(in, "attention_mask", false),
                              input(in, "token_type_ids", false), input(in, "labels", false));
        return Outputs{o.logits, o.loss};
      };
    } else {
      FRUGAL_CHECK(arch == "BertForMaskedLM" || arch == "BertForPreTraining", "architecture '", arch,
                   "' is not supported (BertForMaskedLM or BertForSequenceClassification)");
      auto net = std::make_shared<models::BertForMaskedLM>(c);
      r.module = net;
      r.tied = net->tied_keys();
      r.forward = [net](const std::map<std::string, Tensor>& in) {
        auto o = net->forward(input(in, "input_ids", true), input(in, "attention_mask", false),
                              input(in, "token_type_ids", false), input(in, "labels", false), {.logits = true});
        return Outputs{o.logits, o.loss};
      };
    }
  } else {
    FRUGAL_FAIL("unknown --model '", a.model, "'");  // parse() takes only the models above
  }
  return r;
}

/// Host float32 for floating tensors (as the goldens are stored), the tensor itself otherwise.
Tensor for_file(const Tensor& t) { return is_floating(t.dtype()) ? t.detach().to(kCPU, kFloat32) : t.to(kCPU); }

int run(const Args& a) {
  const Device device(a.device);
  train::require_writable(a.out, "--out");  // now, not after the forward and backward
  Runner r = make_runner(a);
  models::load_safetensors_into(*r.module, a.weights, r.tied);
  r.module->to(device);
  r.module->train(a.train_mode);
  std::map<std::string, Tensor> inputs;
  for (auto& [name, t] : nn::load_safetensors(a.inputs).tensors) inputs[name] = t.to(device);
  FRUGAL_CHECK(!a.backward || inputs.count("labels"), "--backward needs 'labels' in the inputs file");

  Outputs out;
  if (a.amp) {
    AutocastGuard amp(device, kFloat16);
    out = r.forward(inputs);
  } else {
    out = r.forward(inputs);
  }
  if (a.backward) backward_scaled(*r.module, out.loss, a.amp);

  std::vector<std::pair<std::string, Tensor>> results{{"logits", for_file(out.logits)}};
  if (out.loss.defined()) results.emplace_back("loss", for_file(out.loss));
  if (a.backward)
    for (auto& [name, p] : r.module->named_parameters())
      if (p.grad().defined()) results.emplace_back("grad." + name, for_file(p.grad()));
  if (a.train_mode)
    for (auto& [name, b] : r.module->named_buffers())
      if (!b.requires_grad()) results.emplace_back("buffer." + name, for_file(b));  // not the tied weights
  nn::save_safetensors(a.out, results);
  std::printf("run_model: %s (%lld parameters) on %s%s%s: logits %s", a.model.c_str(),
              (long long)r.module->num_parameters(), a.device.c_str(), a.amp ? " amp" : "",
              a.train_mode ? " train" : " eval", shape_str(out.logits.sizes()).c_str());
  if (out.loss.defined()) std::printf(", loss %.6f", out.loss.to(kFloat64).item<double>());
  std::printf(" -> %s (%zu tensors)\n", a.out.c_str(), results.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = cli::parse_or_exit("run_model", kUsage, [&] { return parse(argc, argv); });
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run_model: %s\n", e.what());
    return 1;
  }
}
