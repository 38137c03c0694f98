// Pre-trains a small BERT (models::BertForMaskedLM) with masked-language modelling on plain
// text found offline (default: /usr/share/common-licenses, present on Debian and Ubuntu):
// AdamW, linear warm-up then cosine learning rate, gradient clipping at 1.0, and mixed
// precision (float16 autocast + GradScaler) on CUDA. Prints the loss as it falls and, at
// the end, "mlm_loss_first: x" (the first step's loss) and "mlm_loss_last: y" (the mean over
// the last report window).
//
//   bert_mlm [--corpus PATH]... [--device cpu|cuda] [--steps 1000] [--batch 32] [--seq-len 128]
//            [--lr 5e-4] [--warmup 0.1] [--vocab 8000 | --vocab-file vocab.txt] [--no-amp]
//            [--compress-saved fp8|int8 (saved activations in 8 bits: autograd/compress.h)]
//            [--layers 4] [--hidden 256] [--heads 4] [--intermediate 1024]
//            [--optim adamw|galore|offload_adamw] [--galore-rank 128] [--galore-gap 200]
//
// --optim galore trains with GaLoreAdamW (optim/galore.h, Note [GaLore]): the Adam moments of
// every weight matrix whose smaller side exceeds --galore-rank live in a rank --galore-rank
// subspace of its gradient, recomputed by an SVD every --galore-gap steps (alpha 0.25, the
// same weight decay). The run ends with "optimizer_state_bytes: N", the bytes of the
// optimizer's moments and projections, for any optimizer. --optim offload_adamw trains with
// OffloadAdamW (optim/offload_adam.h, Note [CPU offload]): AdamW with its master weights and
// moments in pinned host memory, updated on the CPU.
//
// --corpus takes files or directories (read recursively; symlinks to a file already read
// and files with a NUL byte, i.e. not text, are skipped); it may repeat. The default is
// /usr/share/common-licenses plus every /usr/share/doc/*/copyright (about 240 KB and 20 MB
// on a Debian 13 development machine; both exist on Debian and Ubuntu).
//
// Note [bert_mlm tokenizer]
// With --vocab-file PATH (a Hugging Face vocab.txt, e.g. bert-base-uncased's), the corpus is
// tokenised by data::WordPiece (nn/data/wordpiece.h): the vocab's size is the model's
// vocab_size and [PAD]/[UNK]/[CLS]/[SEP]/[MASK] take the vocab's ids (all five must be in it).
// The flag is not --vocab PATH because --vocab N already sets the size of the default
// tokenizer, and one flag that is a number or a path would be a stringly-typed option.
// Without it the tokenizer is word level, built from the corpus itself: text is lower-cased
// and split into runs of ASCII letters and digits, each other non-space byte being a token
// of its own. The vocab is [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4 (Hugging Face's
// special tokens), then the words seen at least twice, most frequent first (ties
// alphabetical), up to --vocab ids in all; other words map to [UNK]. Either way the token
// stream of the whole corpus is cut into windows of seq_len - 2 tokens framed by [CLS] ...
// [SEP]; each batch takes windows at random offsets, so no padding is needed.
//
// Masking is data::mask_for_mlm's, drawn afresh for every batch (Note [BERT masking] in
// nn/data/mlm_masking.h): 15% of the tokens selected, of those 80% [MASK], 10% a random
// token, 10% unchanged, and never a special token ([PAD] [UNK] [CLS] [SEP] [MASK], whether
// framing the window or found in the corpus), as Hugging Face's DataCollatorForLanguageModeling.
//
// Loading a Hugging Face checkpoint instead of training:
//   bert_mlm --load-hf-checkpoint W.safetensors [--config-json config.json] [--device cuda]
// loads a BertForMaskedLM state_dict written by PyTorch (tools/parity_models.py writes
// exactly that: model.state_dict() through safetensors.torch.save_file) or by
// save_pretrained (which drops the tied decoder keys) with models::load_safetensors_into and
// the model's tied keys, reports how many tensors it loaded, and runs a forward on
// "[CLS] the quick brown [MASK] jumps over the lazy dog . [SEP]" in bert-base-uncased's ids
// (no tokenizer: this proves that the weights load and run). Without --config-json the
// shape is bert-base. To try it without PyTorch:
//   bert_mlm --write-hf-checkpoint W.safetensors [--config-json config.json]
// writes a freshly initialised model's state dict in save_pretrained's form (without the
// tied aliases) and prints the same forward, so the two runs' numbers must match.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "examples/flags.h"
#include "examples/mnist_train.h"  // compress_saved_option
#include "models/bert.h"
#include "models/config_json.h"
#include "models/pretrained.h"
#include "nn/data/mlm_masking.h"
#include "nn/data/transforms.h"  // draw_below
#include "nn/data/wordpiece.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/galore.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/offload_adam.h"
#include "tensor/factory.h"
#include "train/checks.h"
#include "train/progress.h"

using namespace frugal;

namespace {

// The special tokens' ids: those of the word-level vocab below, or a vocab.txt's.
struct SpecialIds {
  int64_t pad = 0, unk = 1, cls = 2, sep = 3, mask = 4;
};
constexpr int64_t kFirstWord = 5;  // the word-level vocab's first word

// The text of every regular file under `paths`, each file once (by canonical path).
std::string read_corpus(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  std::set<fs::path> files;
  for (const std::string& p : paths) {
    FRUGAL_CHECK(fs::exists(p), "--corpus: path '", p, "' does not exist");
    if (fs::is_directory(p)) {
      for (const auto& entry : fs::recursive_directory_iterator(p))
        if (fs::is_regular_file(entry.path())) files.insert(fs::canonical(entry.path()));
    } else {
      files.insert(fs::canonical(p));
    }
  }
  std::string text;
  size_t used = 0;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    const std::string content = s.str();
    if (content.find('\0') != std::string::npos) continue;  // compressed or binary
    text += content;
    text += '\n';
    ++used;
  }
  std::printf("corpus: %zu text files, %zu bytes\n", used, text.size());
  return text;
}

// Note [bert_mlm tokenizer].
std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (unsigned char c : text) {
    if (std::isalnum(c)) {
      word += char(std::tolower(c));
      continue;
    }
    if (!word.empty()) words.push_back(std::move(word)), word.clear();
    if (!std::isspace(c)) words.emplace_back(1, char(c));
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

struct Tokenized {
  int64_t vocab_size = 0;
  std::vector<int64_t> ids;  // the corpus as one token stream
  SpecialIds special;
  data::MlmMasking masking;  // the vocab's size, [MASK] and special ids (Note [BERT masking])
};

Tokenized tokenize(const std::string& text, int64_t max_vocab) {
  const std::vector<std::string> words = split_words(text);
  std::unordered_map<std::string, int64_t> counts;
  for (const std::string& w : words) ++counts[w];
  std::vector<std::pair<std::string, int64_t>> by_count;
  for (const auto& [w, n] : counts)
    if (n >= 2) by_count.emplace_back(w, n);
  std::sort(by_count.begin(), by_count.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  Tokenized t;
  t.vocab_size = kFirstWord;  // after [PAD] [UNK] [CLS] [SEP] [MASK]
  std::unordered_map<std::string, int64_t> id_of;
  for (const auto& [w, n] : by_count) {
    if (t.vocab_size >= max_vocab) break;
    id_of[w] = t.vocab_size++;
  }
  t.ids.reserve(words.size());
  int64_t unknown = 0;
  for (const std::string& w : words) {
    auto it = id_of.find(w);
    t.ids.push_back(it == id_of.end() ? t.special.unk : it->second);
    unknown += it == id_of.end();
  }
  t.masking = {.vocab_size = t.vocab_size, .mask_id = t.special.mask, .special_ids = {0, 1, 2, 3, 4}};
  std::printf("tokenizer: %zu tokens, vocab %lld (%lld distinct words), %.1f%% [UNK]\n", t.ids.size(),
              (long long)t.vocab_size, (long long)counts.size(),
              100.0 * double(unknown) / double(std::max<size_t>(1, t.ids.size())));
  return t;
}

// Note [bert_mlm tokenizer]: the corpus through a Hugging Face vocab.txt.
Tokenized tokenize_wordpiece(const std::string& text, const data::WordPiece& wp) {
  Tokenized t;
  t.vocab_size = wp.size();
  t.special = {.pad = wp.token_id("[PAD]"),
               .unk = wp.token_id("[UNK]"),
               .cls = wp.token_id("[CLS]"),
               .sep = wp.token_id("[SEP]"),
               .mask = wp.token_id("[MASK]")};
  FRUGAL_CHECK(t.vocab_size > 5, "--vocab-file ", wp.path(), " holds only ", t.vocab_size,
               " tokens: the special tokens and at least one word are needed");
  t.ids = wp.encode(text);
  t.masking = {.vocab_size = t.vocab_size, .mask_id = t.special.mask, .special_ids = wp.special_ids()};
  const int64_t unknown = std::count(t.ids.begin(), t.ids.end(), t.special.unk);
  std::printf("tokenizer: WordPiece %s: %zu tokens, vocab %lld, %.1f%% [UNK]\n", wp.path().c_str(), t.ids.size(),
              (long long)t.vocab_size, 100.0 * double(unknown) / double(std::max<size_t>(1, t.ids.size())));
  return t;
}

struct MlmBatch {
  Tensor input_ids, labels;  // (B, T) int64
};

// `batch` windows at random offsets, framed by [CLS]/[SEP] and masked (Note [BERT masking]).
MlmBatch make_batch(const Tokenized& tok, int64_t batch, int64_t seq_len, Generator& gen, Device device) {
  const std::vector<int64_t>& stream = tok.ids;
  const int64_t body = seq_len - 2;
  std::vector<int64_t> inputs(batch * seq_len), labels(batch * seq_len);
  for (int64_t b = 0; b < batch; ++b) {
    const std::span<int64_t> in(&inputs[b * seq_len], size_t(seq_len));
    const int64_t start = data::draw_below(gen, int64_t(stream.size()) - body + 1);
    in[0] = tok.special.cls, in[seq_len - 1] = tok.special.sep;
    std::copy(stream.begin() + start, stream.begin() + start + body, in.begin() + 1);
    data::mask_for_mlm(in, std::span<int64_t>(&labels[b * seq_len], size_t(seq_len)), tok.masking, gen);
  }
  return {from_vector(inputs, {batch, seq_len}).to(device), from_vector(labels, {batch, seq_len}).to(device)};
}

// The forward on one sentence that --write-hf-checkpoint and --load-hf-checkpoint both print.
void sample_forward(models::BertForMaskedLM& model, Device device) {
  // "[CLS] the quick brown [MASK] jumps over the lazy dog . [SEP]" in bert-base-uncased's vocab.
  std::vector<int64_t> ids = {101, 1996, 4248, 2829, 103, 14523, 2058, 1996, 13971, 3899, 1012, 102};
  const int64_t vocab = model.bert->config.vocab_size, masked = 4;
  for (int64_t& id : ids) id %= vocab;  // a smaller vocab still runs (the ids then mean nothing)
  autograd::NoGradGuard no_grad;
  model.eval();
  Tensor logits = model.forward(from_vector(ids, {1, int64_t(ids.size())}).to(device)).logits.to(kFloat64).to(kCPU);
  Tensor at_mask = logits.select(1, masked).select(0, 0);
  std::printf("forward: logits (%lld, %lld, %lld), mean %.6f, std %.6f; [MASK] position: top id %lld (logit %.4f)\n",
              (long long)logits.size(0), (long long)logits.size(1), (long long)logits.size(2),
              mean(logits).item<double>(), std::sqrt(var(logits).item<double>()),
              (long long)argmax(at_mask, 0).item<int64_t>(), amax(at_mask).item<double>());
}

models::BertConfig checkpoint_config(const std::string& config_json) {
  if (config_json.empty()) return models::bert_base();
  models::BertConfig c = models::BertConfig::from_json(models::read_json_file(config_json));
  return c;
}

int load_checkpoint(const std::string& path, const std::string& config_json, Device device) {
  models::BertForMaskedLM model(checkpoint_config(config_json));
  const size_t in_file = nn::load_safetensors(path).tensors.size();
  models::load_safetensors_into(model, path, model.tied_keys());  // strict: every key matched
  model.to(device);
  std::printf("loaded %zu tensors from %s into BertForMaskedLM (%zu state-dict keys, %lld parameters)\n", in_file,
              path.c_str(), model.state_dict().size(), (long long)model.num_parameters());
  sample_forward(model, device);
  return 0;
}

int write_checkpoint(const std::string& path, const std::string& config_json, Device device) {
  manual_seed(0);
  models::BertForMaskedLM model(checkpoint_config(config_json));
  nn::NamedTensors state;
  std::set<std::string> aliases;
  for (const auto& [alias, source] : model.tied_keys()) aliases.insert(alias);
  for (auto& [name, t] : model.state_dict())
    if (!aliases.count(name)) state.emplace_back(name, t);  // as save_pretrained: the tied alias is dropped
  nn::save_safetensors(path, state, {{"format", "pt"}});
  std::printf("wrote %zu tensors to %s (%zu tied aliases left out)\n", state.size(), path.c_str(), aliases.size());
  model.to(device);
  sample_forward(model, device);
  return 0;
}

const char* kUsage =
    "usage: bert_mlm [--corpus PATH]... [--device cpu|cuda[:N]] [--steps N] [--batch N] [--seq-len N]\n"
    "                [--lr X] [--warmup F (fraction of the steps, in [0, 1])] [--vocab N | --vocab-file vocab.txt]\n"
    "                [--no-amp] [--layers N] [--hidden N] [--heads N] [--intermediate N] [--compress-saved fp8|int8]\n"
    "                [--optim adamw|galore|offload_adamw] [--galore-rank R] [--galore-gap T]\n"
    "       bert_mlm --load-hf-checkpoint W.safetensors [--config-json config.json] [--device cuda]\n"
    "       bert_mlm --write-hf-checkpoint W.safetensors [--config-json config.json]\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> corpus;
  std::string device_name = "cpu", load_path, write_path, config_json, vocab_file, optim_name = "adamw";
  int64_t steps = 1000, batch = 32, seq_len = 128, max_vocab = 8000, galore_rank = 128, galore_gap = 200;
  double lr = 5e-4, warmup = 0.1;
  bool amp = true;
  std::optional<autograd::CompressOptions> compress_saved;  // --compress-saved fp8|int8
  models::BertConfig config{.hidden_size = 256,
                            .num_hidden_layers = 4,
                            .num_attention_heads = 4,
                            .intermediate_size = 1024,
                            .max_position_embeddings = 128};
  cli::parse_or_exit("bert_mlm", kUsage, [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--no-amp")) amp = false;
      else if (flags.is("--compress-saved")) compress_saved = examples::compress_saved_option(flags.text());
      else if (flags.is_repeatable("--corpus")) corpus.push_back(flags.text());
      else if (flags.is("--device")) device_name = flags.device();
      else if (flags.is("--steps")) steps = flags.positive();
      else if (flags.is("--batch")) batch = flags.positive();
      else if (flags.is("--seq-len")) seq_len = flags.positive();
      else if (flags.is("--lr")) lr = flags.positive_real();
      else if (flags.is("--warmup")) warmup = flags.real(0, 1);
      else if (flags.is("--vocab")) max_vocab = flags.positive();
      else if (flags.is("--vocab-file")) vocab_file = flags.text();
      else if (flags.is("--layers")) config.num_hidden_layers = flags.positive();
      else if (flags.is("--hidden")) config.hidden_size = flags.positive();
      else if (flags.is("--heads")) config.num_attention_heads = flags.positive();
      else if (flags.is("--intermediate")) config.intermediate_size = flags.positive();
      else if (flags.is("--load-hf-checkpoint")) load_path = flags.text();
      else if (flags.is("--write-hf-checkpoint")) write_path = flags.text();
      else if (flags.is("--config-json")) config_json = flags.text();
      else if (flags.is("--optim")) optim_name = flags.choice({"adamw", "galore", "offload_adamw"});
      else if (flags.is("--galore-rank")) galore_rank = flags.positive();
      else if (flags.is("--galore-gap")) galore_gap = flags.positive();
      else flags.unknown();
    }
  });
  try {
    const Device device(device_name);
    if (!write_path.empty()) return write_checkpoint(write_path, config_json, device);
    if (!load_path.empty()) return load_checkpoint(load_path, config_json, device);
    amp = amp && device.is_cuda();  // autocast here is CUDA float16
    FRUGAL_CHECK(!vocab_file.empty() || max_vocab > kFirstWord, "--vocab ", max_vocab, " must be at least ",
                 kFirstWord + 1, " (the special tokens and one word)");
    FRUGAL_CHECK(seq_len >= 3 && seq_len <= config.max_position_embeddings, "--seq-len ", seq_len, " must be in [3, ",
                 config.max_position_embeddings, "]");
    if (corpus.empty()) {
      corpus.push_back("/usr/share/common-licenses");
      namespace fs = std::filesystem;
      if (fs::is_directory("/usr/share/doc"))
        for (const auto& entry : fs::directory_iterator("/usr/share/doc"))
          if (fs::is_regular_file(entry.path() / "copyright")) corpus.push_back(entry.path() / "copyright");
    }
    std::optional<data::WordPiece> wordpiece;  // read before the corpus, so that a bad file fails at once
    if (!vocab_file.empty()) wordpiece = data::WordPiece::from_file(vocab_file);
    const std::string text = read_corpus(corpus);
    const Tokenized tok = wordpiece ? tokenize_wordpiece(text, *wordpiece) : tokenize(text, max_vocab);
    FRUGAL_CHECK(int64_t(tok.ids.size()) >= seq_len, "the corpus has only ", tok.ids.size(),
                 " tokens, fewer than --seq-len ", seq_len);
    config.vocab_size = tok.vocab_size;

    manual_seed(0);
    Generator gen(0);  // the batches' offsets and masks
    models::BertForMaskedLM model(config);
    model.to(device);
    std::unique_ptr<optim::Optimizer> optimizer;
    if (optim_name == "galore")
      optimizer = std::make_unique<optim::GaLoreAdamW>(
          model.parameters(),
          optim::GaLoreOptions{.lr = lr, .weight_decay = 0.01, .rank = galore_rank, .update_proj_gap = galore_gap});
    else if (optim_name == "offload_adamw")
      optimizer = std::make_unique<optim::OffloadAdamW>(model.parameters(),
                                                        optim::OffloadAdamWOptions{.lr = lr, .weight_decay = 0.01});
    else
      optimizer =
          std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = lr, .weight_decay = 0.01});
    optim::Optimizer& opt = *optimizer;
    const int64_t warmup_steps = std::min<int64_t>(int64_t(warmup * double(steps)), steps - 1);
    optim::WarmupCosineLR schedule(opt, {.warmup_steps = warmup_steps, .total_steps = steps, .start_factor = 0.01});
    optim::GradScaler scaler({.enabled = amp});
    std::printf(
        "bert_mlm: BERT %lld layers, hidden %lld, %lld heads, intermediate %lld, vocab %lld (%lld parameters), "
        "batch %lld x %lld tokens, %lld steps (%lld warm-up), %s, %s%s%s%s\n",
        (long long)config.num_hidden_layers, (long long)config.hidden_size, (long long)config.num_attention_heads,
        (long long)config.intermediate_size, (long long)config.vocab_size, (long long)model.num_parameters(),
        (long long)batch, (long long)seq_len, (long long)steps, (long long)warmup_steps, opt.name(),
        device_name.c_str(), amp ? ", amp float16" : "", compress_saved ? ", saved tensors in " : "",
        compress_saved ? autograd::to_string(compress_saved->format) : "");

    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const int64_t report_every = std::max<int64_t>(1, std::min<int64_t>(50, steps / 10));
    // A run counted in steps: no epoch shown; in a log, a line per report window.
    train::Progress progress({.epochs = -1, .unit = "tokens", .log_every = report_every});
    progress.start_epoch(0, steps);
    const std::vector<Tensor> params = model.parameters();
    train::LossWatch watch(opt, &scaler);  // each window's losses summed on the device (Note [Non-finite loss])
    double first = NAN, last = NAN;
    model.train();
    for (int64_t step = 1; step <= steps; ++step) {
      MlmBatch b = make_batch(tok, batch, seq_len, gen, device);
      Tensor loss;
      {
        AutocastGuard autocast(device, kFloat16, amp);
        std::optional<autograd::CompressSavedTensors> compress;
        if (compress_saved) compress.emplace(*compress_saved);
        loss = model.forward(b.input_ids, Tensor(), Tensor(), b.labels).loss;
      }
      opt.zero_grad();
      scaler.scale(loss).backward();
      scaler.unscale_(opt);
      optim::clip_grad_norm_async(params, 1.0);
      scaler.step(opt);
      scaler.update();
      schedule.step();
      watch.add(loss, 0, step);
      if (step == 1) first = loss.to(kFloat64).item<double>();
      if (watch.pending() == report_every || step == steps) {
        last = watch.check().mean();  // the loss shown: the mean of this window's steps that trained
        char lr[32];
        std::snprintf(lr, sizeof lr, "lr %.2e", schedule.last_lr()[0]);
        progress.update(step, step * batch * seq_len, last, lr);
      }
    }
    progress.break_line();
    std::printf("train: %.1f s\nmlm_loss_first: %.4f\nmlm_loss_last: %.4f\noptimizer_state_bytes: %lld\n",
                std::chrono::duration<double>(clock::now() - start).count(), first, last, (long long)opt.state_bytes());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bert_mlm: %s\n", e.what());
    return 1;
  }
}
