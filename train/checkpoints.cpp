#include "train/checkpoints.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

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

// Note [Checkpoint checksum]
// safetensors has no checksum, and a bit flipped in a tensor's data (a bad disk, a copy cut
// and resumed) parses fine and loads as another number. save() therefore records a 64-bit
// hash of every tensor - name, dtype, shape and bytes, in name order - and of every metadata
// entry but the checksum itself (a flipped bit in "optimizer" or a user's "model_kind" would
// otherwise refuse an intact run, or in "step" be caught only by the name check) as the
// metadata "checksum" = "v2-<16 hex digits>", and load() recomputes it before it uses
// anything. Not a cryptographic hash: it catches damage, not tampering. Eight bytes per
// multiply, so hashing costs a fraction of reading the file. Files saved before the metadata
// was covered hold 16 bare hex digits, a hash of the tensors alone, checked as such (a flipped
// bit in the "v2-" makes the value such a hash, which then fails). A file without "checksum"
// (saved before it was added, or a flipped bit in the key) loads unchecked, with a warning.
class Hash {
 public:
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (; n >= 8; p += 8, n -= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      word(w);
    }
    uint64_t last = 0;
    std::memcpy(&last, p, n);
    word(last ^ (uint64_t(n) << 56));  // the tail, and its length
  }
  void word(uint64_t w) {
    h_ ^= w * 0x9E3779B97F4A7C15ull;
    h_ = ((h_ << 29) | (h_ >> 35)) * 0xBF58476D1CE4E5B9ull;
  }
  std::string hex() const {
    uint64_t z = h_;  // splitmix64's finalizer: every input bit reaches every output bit
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    char out[17];
    std::snprintf(out, sizeof out, "%016" PRIx64, z);
    return out;
  }

 private:
  uint64_t h_ = 0x243F6A8885A308D3ull;
};

constexpr const char* kChecksumV2 = "v2-";

// Note [Checkpoint checksum]'s hash of (name, tensor) pairs sorted by name, and with
// `metadata` (nullptr: a file of the first format, tensors only) of its entries but "checksum".
std::string checksum(const std::vector<std::pair<std::string, const Tensor*>>& sorted,
                     const std::map<std::string, std::string>* metadata) {
  Hash h;
  for (const auto& [name, t] : sorted) {
    h.bytes(name.data(), name.size());
    h.word(uint64_t(t->dtype()));
    h.word(uint64_t(t->dim()));
    for (int64_t d : t->sizes()) h.word(uint64_t(d));
    const Tensor c = t->to(kCPU).contiguous();
    h.bytes(c.data(), size_t(c.numel()) * c.element_size());
  }
  if (!metadata) return h.hex();
  h.word(~uint64_t(0));  // where the tensors end: no tensor's name can continue into a key
  for (const auto& [key, value] : *metadata) {
    if (key == "checksum") continue;
    h.bytes(key.data(), key.size());
    h.bytes(value.data(), value.size());
  }
  return kChecksumV2 + h.hex();
}

int64_t read_int64(const nn::SafetensorsFile& file, const std::string& key, const std::string& path) {
  auto it = file.tensors.find(key);
  FRUGAL_CHECK(it != file.tensors.end(), "CheckpointManager::load: ", path, " has no '", key, "'");
  const Tensor& t = it->second;
  FRUGAL_CHECK(t.dtype() == kInt64 && t.numel() == 1, "CheckpointManager::load: ", path, ": '", key,
               "' must be one int64, got ", t.numel(), " values of ", dtype_name(t.dtype()));
  return t.item<int64_t>();
}

/// Every named generator is set, named once and not the default generator (saved as "rng.*").
void check_generators(const TrainState& state, const std::string& where) {
  std::vector<std::string> names;
  for (const auto& [name, gen] : state.generators) {
    FRUGAL_CHECK(!name.empty() && name != "seed" && name != "offset", where, ": TrainState::generators needs a ",
                 "name other than '', 'seed' and 'offset' for each generator, got '", name, "'");
    FRUGAL_CHECK(gen != nullptr, where, ": TrainState::generators['", name, "'] is null");
    FRUGAL_CHECK(gen != &default_generator(), where, ": TrainState::generators['", name,
                 "'] is the default generator, which TrainState::rng saves");
    FRUGAL_CHECK(std::find(names.begin(), names.end(), name) == names.end(), where, ": TrainState::generators names '",
                 name, "' twice");
    names.push_back(name);
  }
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
  // list() reads back at most 18 digits (any int64 below 10^18): a larger step would be saved
  // but never found by resume() or pruned by keep_last.
  FRUGAL_CHECK(step >= 0 && step < int64_t(1000000000000000000),
               "CheckpointManager::save: step must be in [0, 10^18), got ", step);
  for (const char* own : {"step", "optimizer", "checksum"})
    FRUGAL_CHECK(!metadata.count(own), "CheckpointManager::save: metadata key '", own, "' is the manager's own");
  FRUGAL_CHECK(!state.grads || state.model, "CheckpointManager::save: TrainState::grads saves the model's gradients; ",
               "it needs the model");
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
  check_generators(state, "CheckpointManager::save");
  for (const auto& [name, gen] : state.generators) {
    tensors.emplace_back("rng." + name + ".seed", uint64_scalar(gen->seed()));
    tensors.emplace_back("rng." + name + ".offset", uint64_scalar(gen->offset()));
  }
  if (state.loader) {
    const data::DataLoader& loader = *state.loader;
    const data::DataLoader::Position pos = loader.position();
    tensors.emplace_back("data.epoch", int64_scalar(pos.epoch));
    tensors.emplace_back("data.batch", int64_scalar(pos.batch));
    // What the order of an epoch depends on, so that a load can tell the position means the same batches.
    tensors.emplace_back("data.samples", int64_scalar(loader.samples()));
    tensors.emplace_back("data.batch_size", int64_scalar(loader.options().batch_size));
    tensors.emplace_back("data.shuffle", int64_scalar(loader.options().shuffle ? 1 : 0));
    tensors.emplace_back("data.seed", uint64_scalar(loader.options().seed));
  }
  require_finite(tensors, path);  // a diverged run must not push out a good checkpoint
  if (state.grads)                // after the check: the gradients of a step the GradScaler will skip are inf
    for (const auto& [name, p] : state.model->named_parameters())
      if (p.grad().defined()) tensors.emplace_back("grad." + name, p.grad());

  std::map<std::string, std::string> meta = metadata;
  meta["step"] = std::to_string(step);
  if (state.optimizer) meta["optimizer"] = state.optimizer->name();
  std::vector<std::pair<std::string, const Tensor*>> sorted;
  for (const auto& [name, t] : tensors) sorted.emplace_back(name, &t);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  meta["checksum"] = checksum(sorted, &meta);  // Note [Checkpoint checksum]
  nn::save_safetensors(path, tensors, meta);   // atomic: a temporary, then rename

  if (options_.keep_last > 0) {  // only now: the new checkpoint is in place
    // The file just written is one of the kept whatever its step (a run restarted from an
    // older checkpoint, or a new run in an old directory, saves steps below the newest).
    std::vector<CheckpointFile> all = list();
    std::erase_if(all, [&](const CheckpointFile& f) { return f.path == path; });
    const size_t keep = size_t(options_.keep_last) - 1;
    if (!all.empty() && all.back().step > step && keep > 0)  // kept (keep_last 1 removes it below)
      std::fprintf(stderr,
                   "CheckpointManager: saved step %lld while %s holds a later step (%lld) from another run; "
                   "resume() picks the highest step\n",
                   static_cast<long long>(step), dir_.c_str(), static_cast<long long>(all.back().step));
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
    const int64_t step = std::stoll(digits);
    // Only the name save() gives that step ("ckpt-00000001", not "ckpt-1"): keep_last's pruning
    // deletes what list() returns, and a user's own file must never be among them.
    if (fs::path(path_for(step)).filename().string() != name) continue;
    out.push_back({entry.path().string(), step});
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

namespace {

// A file read whole that passed the checks a damaged file fails: it is safetensors, it is a
// checkpoint (a "step") and its tensors hash to its checksum.
struct Intact {
  std::string path;
  nn::SafetensorsFile file;
  int64_t step = -1;
};

// The first half of load(): throws when the file at `path` is damaged (Note [Resume falls back
// past damaged checkpoints]), before anything of a run is touched.
Intact read_intact(const std::string& path) {
  Intact out{path, nn::load_safetensors(path)};
  const nn::SafetensorsFile& file = out.file;
  const std::string where = "CheckpointManager::load: " + path;
  auto step_it = file.metadata.find("step");
  FRUGAL_CHECK(step_it != file.metadata.end(), where,
               " has no 'step' metadata (not written by CheckpointManager::save)");
  int64_t step = -1;
  try {
    size_t used = 0;
    step = std::stoll(step_it->second, &used);
    if (used != step_it->second.size()) step = -1;
  } catch (const std::exception&) { step = -1; }
  FRUGAL_CHECK(step >= 0, where, ": metadata 'step' must be a non-negative integer, got \"", step_it->second, "\"");
  auto sum = file.metadata.find("checksum");  // Note [Checkpoint checksum]
  if (sum != file.metadata.end()) {
    std::vector<std::pair<std::string, const Tensor*>> sorted;
    for (const auto& [name, t] : file.tensors) sorted.emplace_back(name, &t);  // a map: sorted by name
    const bool v2 = sum->second.starts_with(kChecksumV2);
    const std::string actual = checksum(sorted, v2 ? &file.metadata : nullptr);
    FRUGAL_CHECK(actual == sum->second, where, " is corrupt: its tensors", v2 ? " and metadata" : "", " hash to ",
                 actual, ", but it was saved with checksum ", sum->second,
                 " (a damaged copy or disk?); nothing was loaded");
  } else {
    std::fprintf(stderr,
                 "CheckpointManager: %s has no checksum (saved before frugal wrote one?); loading it unchecked\n",
                 path.c_str());
  }
  out.step = step;
  return out;
}

// The second half of load(): restores `state` from an intact file, or throws, changing nothing,
// when the file does not fit the run (Note [Checkpoint load is all or nothing]).
int64_t restore(const Intact& intact, const TrainState& state, const ResumeOptions& options) {
  const nn::SafetensorsFile& file = intact.file;
  const std::string& path = intact.path;
  const int64_t step = intact.step;
  const std::string where = "CheckpointManager::load: " + path;
  for (const auto& [key, want] : options.expect_metadata) {
    auto it = file.metadata.find(key);
    FRUGAL_CHECK(it != file.metadata.end(), where, " has no metadata '", key, "' (this run expects \"", want,
                 "\"); nothing was loaded");
    FRUGAL_CHECK(it->second == want, where, " holds metadata ", key, " = \"", it->second, "\", but this run expects \"",
                 want, "\"; nothing was loaded");
  }
  if (auto type = file.metadata.find("optimizer"); state.optimizer && type != file.metadata.end())
    FRUGAL_CHECK(type->second == state.optimizer->name(), where, " holds the state of a ", type->second,
                 " optimizer, but this run's optimizer is ", state.optimizer->name(),
                 ": their states do not mean the same; nothing was loaded");

  // Everything asked for must be there before anything is loaded.
  const optim::StateDict model = part(file, "model"), optim = part(file, "optim"), scaler = part(file, "scaler"),
                         scheduler = part(file, "scheduler"), grads = part(file, "grad");
  const auto require = [&](bool wanted, const optim::StateDict& dict, const char* what, const char* prefix) {
    FRUGAL_CHECK(!wanted || !dict.empty(), where, " holds no ", what, " state (no '", prefix,
                 ".*' keys): it was saved without one");
  };
  require(state.model, model, "model", "model");
  require(state.optimizer, optim, "optimizer", "optim");
  require(state.scaler && state.scaler->is_enabled(), scaler, "GradScaler", "scaler");
  require(state.scheduler, scheduler, "LR scheduler", "scheduler");
  FRUGAL_CHECK(!state.grads || state.model, where, ": TrainState::grads restores the model's gradients; it needs the ",
               "model");
  FRUGAL_CHECK(state.grads || grads.empty(), where, " holds the gradients of ", grads.size(),
               " parameters (saved between the micro-steps of gradient accumulation); set TrainState::grads to ",
               "restore them, or the next step would miss them");
  std::map<std::string, Tensor> params;
  if (state.model)
    for (const auto& [name, p] : state.model->named_parameters()) params.emplace(name, p);
  for (const auto& [name, g] : grads) {
    auto it = params.find(name);
    FRUGAL_CHECK(it != params.end(), where, ": 'grad.", name, "' is the gradient of no parameter of the model");
    FRUGAL_CHECK(g.sizes() == it->second.sizes() && g.dtype() == it->second.dtype(), where, ": 'grad.", name, "' is ",
                 g.describe(), ", but the parameter is ", it->second.describe());
  }
  int64_t rng_seed = 0, rng_offset = 0, data_epoch = 0, data_batch = 0;
  if (state.rng) rng_seed = read_int64(file, "rng.seed", path), rng_offset = read_int64(file, "rng.offset", path);
  check_generators(state, where);
  for (const auto& [key, t] : file.tensors) {  // a stream saved but not named here would restart
    const std::string_view k = key;
    if (!k.starts_with("rng.") || !k.ends_with(".seed") || k == "rng.seed") continue;
    const std::string name(k.substr(4, k.size() - 4 - 5));
    FRUGAL_CHECK(
        std::any_of(state.generators.begin(), state.generators.end(), [&](const auto& g) { return g.first == name; }),
        where, " holds the state of generator '", name, "', which this run does not name in ",
        "TrainState::generators: its stream would restart from its seed; nothing was loaded");
  }
  std::vector<std::pair<int64_t, int64_t>> generator_states;  // (seed, offset) of state.generators, in order
  for (const auto& [name, gen] : state.generators) {
    const int64_t seed = read_int64(file, "rng." + name + ".seed", path);
    generator_states.emplace_back(seed, read_int64(file, "rng." + name + ".offset", path));
  }
  if (state.loader) {
    const data::DataLoader& loader = *state.loader;
    data_epoch = read_int64(file, "data.epoch", path), data_batch = read_int64(file, "data.batch", path);
    // A position names batches of an order: the same order or none (files from before these keys are not checked).
    std::vector<std::pair<const char*, int64_t>> order = {{"samples", loader.samples()},
                                                          {"batch_size", loader.options().batch_size},
                                                          {"shuffle", loader.options().shuffle ? 1 : 0}};
    if (loader.options().shuffle) order.emplace_back("seed", int64_t(loader.options().seed));  // the bits
    for (const auto& [what, mine] : order) {
      const std::string key = std::string("data.") + what;
      if (!file.tensors.count(key)) continue;
      const int64_t saved = read_int64(file, key, path);
      FRUGAL_CHECK(saved == mine, where, ": the checkpoint's loader had ", what, " ", saved, ", this run's loader has ",
                   mine, ": its position (epoch ", data_epoch, ", batch ", data_batch,
                   ") would name other samples; nothing was loaded");
    }
    FRUGAL_CHECK(data_epoch >= 0 && data_batch >= 0 && data_batch <= loader.size(), where,
                 ": the loader's position (epoch ", data_epoch, ", batch ", data_batch,
                 ") is outside this run's loader, which has ", loader.size(), " batches an epoch");
  }

  // Each part's own load checks it whole and changes nothing when it throws; the parts
  // loaded before it are put back (Note [Checkpoint load is all or nothing]).
  optim::StateDict old_optim, old_scaler, old_scheduler;
  const bool scaled = state.scaler && state.scaler->is_enabled();
  if (state.optimizer) old_optim = state.optimizer->state_dict();
  if (scaled) old_scaler = state.scaler->state_dict();
  if (state.scheduler) old_scheduler = state.scheduler->state_dict();
  const char* loading = "";
  bool optim_done = false, scaler_done = false, scheduler_done = false;
  const auto put_back = [&] {  // the schedule first: the optimizer's own lrs come last
    if (scheduler_done) state.scheduler->load_state_dict(old_scheduler);
    if (scaler_done) state.scaler->load_state_dict(old_scaler);
    if (optim_done) state.optimizer->load_state_dict(old_optim);
  };
  try {
    if (state.optimizer) {
      loading = "optimizer";
      state.optimizer->load_state_dict(optim);
      optim_done = true;
    }
    if (scaled) {
      loading = "GradScaler";
      state.scaler->load_state_dict(scaler);
      scaler_done = true;
    }
    if (state.scheduler) {
      loading = "LR scheduler";
      state.scheduler->load_state_dict(scheduler);
      scheduler_done = true;
    }
    if (state.model) {  // last: nothing to put back (its load checks every key and shape before it writes)
      loading = "model";
      std::map<std::string, Tensor> dict(model.begin(), model.end());
      state.model->load_state_dict(dict);
    }
  } catch (const Error& e) {
    put_back();
    rethrow_with_context(e, where + ": the " + loading + " refused it (nothing was loaded): ");
  } catch (...) {
    put_back();
    throw;
  }

  // Nothing below can fail: it was all checked above.
  if (state.grads) {
    for (const auto& [name, p] : params) {
      auto it = file.tensors.find("grad." + name);
      if (it == file.tensors.end()) {
        if (p.grad().defined()) p.set_grad(Tensor());
        continue;
      }
      Tensor g = it->second.to(p.device(), p.dtype());
      p.set_grad(g.shares_storage(it->second) ? g.clone() : g);
    }
  }
  if (state.rng) {
    uint64_t seed, offset;
    std::memcpy(&seed, &rng_seed, sizeof seed);
    std::memcpy(&offset, &rng_offset, sizeof offset);
    default_generator().set_state(seed, offset);
  }
  for (size_t k = 0; k < state.generators.size(); ++k)
    state.generators[k].second->set_state(std::bit_cast<uint64_t>(generator_states[k].first),
                                          std::bit_cast<uint64_t>(generator_states[k].second));
  if (state.loader) state.loader->set_position({data_epoch, data_batch});
  return step;
}

}  // namespace

int64_t CheckpointManager::load(const std::string& path, const TrainState& state) const {
  // Checks first, loads after: Note [Checkpoint load is all or nothing].
  return restore(read_intact(path), state, {});
}

std::optional<int64_t> CheckpointManager::resume(const TrainState& state) const { return resume(state, {}).step; }

ResumeResult CheckpointManager::resume(const TrainState& state, const ResumeOptions& options) const {
  // Note [Resume falls back past damaged checkpoints].
  std::vector<CheckpointFile> files = list();
  ResumeResult result;
  if (files.empty()) return result;
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    std::optional<Intact> intact;
    try {
      intact.emplace(read_intact(it->path));
      // The step list() ranked it by is its name's: a file whose metadata says another step
      // (a flipped bit, a copy under another name) would resume at a step it does not hold.
      FRUGAL_CHECK(intact->step == it->step, "its metadata says step ", intact->step, " but its name says ", it->step);
    } catch (const OutOfMemoryError&) {
      throw;  // says nothing about the file
    } catch (const Error& e) {
      result.skipped.push_back({it->path, std::string(e.message()), ""});
      std::fprintf(stderr, "CheckpointManager::resume: skipping damaged %s: %s\n", it->path.c_str(),
                   result.skipped.back().reason.c_str());
      continue;
    }
    result.step = restore(*intact, state, options);  // does not fit: an error, not a fallback
    result.path = it->path;
    break;
  }
  if (!result.step) {
    std::string all;
    for (const DamagedCheckpoint& d : result.skipped) all += "\n  " + d.path + ": " + d.reason;
    FRUGAL_FAIL("CheckpointManager::resume: every checkpoint in ", dir_, " is damaged; nothing was loaded, and none ",
                "was renamed:", all);
  }
  // Out of list()'s way, or the run's next saves (lower steps) would rank below them.
  for (DamagedCheckpoint& d : result.skipped) {
    std::error_code ec, seen;
    for (int n = 0; n < 1000 && d.moved_to.empty() && !ec; ++n) {  // never over an earlier one
      const std::string aside = d.path + ".damaged" + (n ? "." + std::to_string(n) : "");
      if (fs::symlink_status(aside, seen).type() != fs::file_type::not_found) continue;
      fs::rename(d.path, aside, ec);
      if (!ec) d.moved_to = aside;
    }
    if (!d.moved_to.empty())
      std::fprintf(stderr, "CheckpointManager::resume: renamed damaged %s to %s\n", d.path.c_str(), d.moved_to.c_str());
    else if (fs::exists(d.path, seen))  // else another process of the run moved it first
      std::fprintf(stderr,
                   "CheckpointManager::resume: cannot rename damaged %s aside (%s); until it is moved, keep_last "
                   "counts it among the newest\n",
                   d.path.c_str(), ec ? ec.message().c_str() : "no free name");
  }
  return result;
}

}  // namespace frugal::train
