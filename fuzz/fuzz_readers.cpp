// libFuzzer target for the readers of the other files frugal takes from users: config
// JSON (models::read_json_file, then the ResNet, ViT and BERT config readers, and for
// small accepted ViT and BERT configs the model itself, built and run once) and IDX
// datasets (data::read_idx, raw or gzipped, then the image/label tensors). The first
// byte picks the reader; the rest is the file, served from a memfd so that the readers'
// own open/stat/read path runs. Any input must be read or rejected with frugal::Error;
// a crash, a sanitizer report or an error from a model its reader accepted is a bug.
//
// Build and run: see fuzz_safetensors.cpp, with
//   buildfuzz/fuzz/fuzz_readers -max_total_time=120 -jobs=1 -dict=fuzz/readers.dict \
//       /tmp/fuzz_readers_corpus fuzz/corpus_readers
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "models/bert.h"
#include "models/config_json.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/data/idx.h"
#include "tensor/factory.h"

using namespace frugal;

namespace {

// One memfd for the whole run, rewritten per input; its /proc path is what readers open.
const std::string& file_with(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("fuzz_readers", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != ssize_t(size)) std::abort();
  return path;
}

// Small enough to build and run in a few milliseconds.
bool small(const models::ViTConfig& c) {
  return c.image_size <= 16 && c.in_channels <= 4 && c.num_layers <= 2 && c.hidden_dim <= 16 && c.mlp_dim <= 32 &&
         c.num_classes <= 16;
}
bool small(const models::BertConfig& c) {
  return c.vocab_size <= 64 && c.hidden_size <= 16 && c.num_hidden_layers <= 2 && c.intermediate_size <= 32 &&
         c.max_position_embeddings <= 16 && c.type_vocab_size <= 4 && c.num_labels <= 8;
}

void read_configs(const std::string& path) {
  json::Value config;
  try {
    config = models::read_json_file(path);
  } catch (const Error&) { return; }
  autograd::NoGradGuard no_grad;
  try {
    int64_t depth = 18;
    models::resnet_options_from_json(config, &depth, path);  // (building a ResNet takes too long per input)
  } catch (const Error&) {}
  try {
    const models::ViTConfig c = models::ViTConfig::from_json(config, path);
    if (small(c)) {  // accepted: it must build and run
      models::VisionTransformer vit(c);
      const Tensor logits = vit.forward(zeros({1, c.in_channels, c.image_size, c.image_size}));
      if (logits.sizes() != Shape{1, c.num_classes}) std::abort();
    }
  } catch (const Error& e) {
    if (std::string(e.message()).rfind("ViT config", 0) != 0) throw;  // not the reader's rejection
  }
  try {
    const models::BertConfig c = models::BertConfig::from_json(config, path);
    if (small(c)) {
      models::BertForMaskedLM mlm(c);
      const int64_t T = std::min<int64_t>(4, c.max_position_embeddings);
      std::vector<int64_t> ids(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) ids[size_t(i)] = i % c.vocab_size;
      const Tensor logits = mlm.forward(from_vector(ids, {1, T})).logits;
      if (logits.sizes() != Shape{1, T, c.vocab_size}) std::abort();
    }
  } catch (const Error& e) {
    if (std::string(e.message()).rfind("BERT config", 0) != 0) throw;
  }
}

void read_dataset(const std::string& path) {
  try {
    const data::IdxData idx = data::read_idx(path);
    if (idx.shape.size() == 3) data::idx_images_to_tensor(idx);
    if (idx.shape.size() == 1) data::idx_labels_to_tensor(idx);
  } catch (const Error&) {}
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string& path = file_with(data + 1, size - 1);
  if (data[0] % 2 == 0) read_configs(path);
  else read_dataset(path);
  return 0;
}
