#include "train/checkpoints.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "nn/safetensors.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "train/checks.h"

namespace frugal::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSuffix = ".safetensors";

// The keys of `file` under "<prefix>.", without it, sorted (the map's order).
optim::StateDict part(const nn::SafetensorsFile& file, const std::string& prefix) {
  optim::StateDict out;
  const std::string p = prefix + ".";
  for (const auto& [name, t] : file.tensors)
    if (name.compare(0, p.size(), p) == 0) out.emplace_back(name.substr(p.size()), t);
  return out;
}

void add(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix, const optim::StateDict& dict) {
  for (const auto& [name, t] : dict) out.emplace_back(prefix + "." + name, t);
}

Tensor int64_scalar(int64_t v) { return from_vector(std::vector<int64_t>{v}, Shape{}); }
Tensor uint64_scalar(uint64_t v) {  // the bits, as int64 (safetensors has no U64 here)
  int64_t bits;
  std::memcpy(&bits, &v, sizeof v);
  return int64_scalar(bits);
}

int64_t read_int64(const nn::SafetensorsFile& file, const std::string& key, const std::string& path) {
  auto it = file.tensors.find(key);
  FRUGAL_CHECK(it != file.tensors.end(), "CheckpointManager::load: ", path, " has no '", key, "'");
  const Tensor& t = it->second;
  FRUGAL_CHECK(t.dtype() == kInt64 && t.numel() == 1, "CheckpointManager::load: ", path, ": '", key,
               "' must be one int64, got ", t.numel(), " values of ", dtype_name(t.dtype()));
  return t.item<int64_t>();
}

}  // namespace

CheckpointManager::CheckpointManager(std::string dir, CheckpointOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  FRUGAL_CHECK(!dir_.empty(), "CheckpointManager: the directory is empty");
  FRUGAL_CHECK(options_.keep_last >= 0, "CheckpointManager: keep_last must be >= 0, got ", options_.keep_last);
  FRUGAL_CHECK(!options_.prefix.empty() && options_.prefix.find('/') == std::string::npos,
               "CheckpointManager: prefix '", options_.prefix, "' must be a non-empty file name");
}

std::string CheckpointManager::path_for(int64_t step) const {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%08" PRId64, step);
  return (fs::path(dir_) / (options_.prefix + "-" + digits + kSuffix)).string();
}

std::string CheckpointManager::save(int64_t step, const TrainState& state,
                                    const std::map<std::string, std::string>& metadata) {
  FRUGAL_CHECK(step >= 0, "CheckpointManager::save: step must be >= 0, got ", step);
  FRUGAL_CHECK(!metadata.count("step"), "CheckpointManager::save: metadata key 'step' is the manager's own");
  const std::string path = path_for(step);
  require_writable(path, "CheckpointManager::save");  // before the tensors are gathered
  std::vector<std::pair<std::string, Tensor>> tensors;
  if (state.model) add(tensors, "model", state.model->state_dict());
  if (state.optimizer) add(tensors, "optim", state.optimizer->state_dict());
  if (state.scaler) add(tensors, "scaler", state.scaler->state_dict());
  if (state.scheduler) add(tensors, "scheduler", state.scheduler->state_dict());
  if (state.rng) {
    const Generator& gen = default_generator();
    tensors.emplace_back("rng.seed", uint64_scalar(gen.seed()));
    tensors.emplace_back("rng.offset", uint64_scalar(gen.offset()));
  }
  if (state.loader) {
    const data::DataLoader::Position pos = state.loader->position();
    tensors.emplace_back("data.epoch", int64_scalar(pos.epoch));
    tensors.emplace_back("data.batch", int64_scalar(pos.batch));
  }
  require_finite(tensors, path);  // a diverged run must not push out a good checkpoint
  std::map<std::string, std::string> meta = metadata;
  meta["step"] = std::to_string(step);
  nn::save_safetensors(path, tensors, meta);  // atomic: a temporary, then rename

  if (options_.keep_last > 0) {  // only now: the new checkpoint is in place
    // The file just written is one of the kept whatever its step (a run restarted from an
    // older checkpoint, or a new run in an old directory, saves steps below the newest).
    std::vector<CheckpointFile> all = list();
    std::erase_if(all, [&](const CheckpointFile& f) { return f.path == path; });
    if (!all.empty() && all.back().step > step)
      std::fprintf(stderr,
                   "CheckpointManager: saved step %lld while %s holds a later step (%lld) from another run; "
                   "resume() picks the highest step\n",
                   static_cast<long long>(step), dir_.c_str(), static_cast<long long>(all.back().step));
    const size_t keep = size_t(options_.keep_last) - 1;
    for (size_t i = 0; i + keep < all.size(); ++i) {
      std::error_code ec;
      fs::remove(all[i].path, ec);  // one that cannot be removed is left; the next save retries
    }
  }
  return path;
}

std::vector<CheckpointFile> CheckpointManager::list() const {
  std::vector<CheckpointFile> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  const std::string head = options_.prefix + "-";
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t tail = std::strlen(kSuffix);
    if (name.size() <= head.size() + tail || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail, tail, kSuffix) != 0 || !entry.is_regular_file(ec))
      continue;
    const std::string digits = name.substr(head.size(), name.size() - head.size() - tail);
    if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;  // not one of ours (e.g. a temporary "ckpt-1.safetensors.tmp.*" ends otherwise anyway)
    out.push_back({entry.path().string(), std::stoll(digits)});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointFile> CheckpointManager::latest() const {
  std::vector<CheckpointFile> all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::map<std::string, std::string> CheckpointManager::metadata(const std::string& path) const {
  return nn::load_safetensors(path).metadata;
}

int64_t CheckpointManager::load(const std::string& path, const TrainState& state) const {
  const nn::SafetensorsFile file = nn::load_safetensors(path);
  auto step_it = file.metadata.find("step");
  FRUGAL_CHECK(step_it != file.metadata.end(), "CheckpointManager::load: ", path,
               " has no 'step' metadata (not written by CheckpointManager::save)");
  int64_t step = -1;
  try {
    size_t used = 0;
    step = std::stoll(step_it->second, &used);
    if (used != step_it->second.size()) step = -1;
  } catch (const std::exception&) { step = -1; }
  FRUGAL_CHECK(step >= 0, "CheckpointManager::load: ", path, ": metadata 'step' must be a non-negative integer, got \"",
               step_it->second, "\"");

  // Everything asked for must be there before anything is loaded.
  const optim::StateDict model = part(file, "model"), optim = part(file, "optim"), scaler = part(file, "scaler"),
                         scheduler = part(file, "scheduler");
  const auto require = [&](bool wanted, const optim::StateDict& dict, const char* what, const char* prefix) {
    FRUGAL_CHECK(!wanted || !dict.empty(), "CheckpointManager::load: ", path, " holds no ", what, " state (no '",
                 prefix, ".*' keys): it was saved without one");
  };
  require(state.model, model, "model", "model");
  require(state.optimizer, optim, "optimizer", "optim");
  require(state.scaler && state.scaler->is_enabled(), scaler, "GradScaler", "scaler");
  require(state.scheduler, scheduler, "LR scheduler", "scheduler");
  int64_t rng_seed = 0, rng_offset = 0, data_epoch = 0, data_batch = 0;
  if (state.rng) rng_seed = read_int64(file, "rng.seed", path), rng_offset = read_int64(file, "rng.offset", path);
  if (state.loader)
    data_epoch = read_int64(file, "data.epoch", path), data_batch = read_int64(file, "data.batch", path);

  if (state.model) {
    std::map<std::string, Tensor> dict(model.begin(), model.end());
    state.model->load_state_dict(dict);
  }
  if (state.optimizer) state.optimizer->load_state_dict(optim);
  if (state.scaler && state.scaler->is_enabled()) state.scaler->load_state_dict(scaler);
  if (state.scheduler) state.scheduler->load_state_dict(scheduler);
  if (state.rng) {
    uint64_t seed, offset;
    std::memcpy(&seed, &rng_seed, sizeof seed);
    std::memcpy(&offset, &rng_offset, sizeof offset);
    default_generator().set_state(seed, offset);
  }
  if (state.loader) state.loader->set_position({data_epoch, data_batch});
  return step;
}

std::optional<int64_t> CheckpointManager::resume(const TrainState& state) const {
  const std::optional<CheckpointFile> last = latest();
  if (!last) return std::nullopt;
  return load(last->path, state);
}

}  // namespace frugal::train
