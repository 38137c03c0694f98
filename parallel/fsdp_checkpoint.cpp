// Sharded and consolidated checkpoints of FullyShardedDataParallel.
//
// Note [Sharded checkpoint]
// A sharded checkpoint is a directory: index.json (rank 0 writes it) and one safetensors file
// per rank, holding that rank's flat_param_<u> shards, "optim.<key>" for its optimizer's
// state (Note [Optimizer state dict]: the moments of the shards only) and "buffer.<name>"
// for the module's buffers. The index records the world size, the generation and the units'
// layouts (names, parameter names, shapes, offsets), so a load into another world size or
// another model fails naming what differs, before anything is changed.
// Crash safety: a save must never destroy the checkpoint it replaces, and the files of one
// checkpoint must belong together. So each save is a new generation g (the old index's + 1):
//   1. every rank writes shard-<r>-of-<P>.g<g>.safetensors (save_safetensors: temporary,
//      fsync, rename), names no old file uses;
//   2. barrier; rank 0 writes index.json the same way (write_file_atomically, see Note
//      [Temporary files of a save]): the one atomic switch from generation g-1 to g;
//   3. barrier; each rank deletes its generation g-1 file.
// A failure before 2 leaves the old index naming the old files, all intact; after 2 the new
// checkpoint is complete, and a stale old file at worst wastes space.
#include "parallel/fsdp_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

#include "autograd/grad_mode.h"
#include "core/json.h"
#include "nn/atomic_file.h"
#include "nn/file.h"
#include "nn/safetensors.h"
#include "optim/optimizer.h"

namespace frugal::parallel {

namespace {
namespace fs = std::filesystem;

constexpr const char* kFormat = "frugal-fsdp-sharded";
constexpr uint64_t kMaxIndexBytes = uint64_t(64) << 20;

std::string shard_file(int rank, int world, uint64_t generation) {
  char name[96];
  std::snprintf(name, sizeof name, "shard-%05d-of-%05d.g%llu.safetensors", rank, world,
                static_cast<unsigned long long>(generation));
  return name;
}

std::string shape_json(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string index_json(const FullyShardedDataParallel& fsdp, uint64_t generation) {
  const int P = fsdp.comm()->size();
  std::ostringstream o;
  o << "{\n  \"format\": " << json::quote(kFormat) << ",\n  \"version\": 1,\n  \"world_size\": " << P
    << ",\n  \"generation\": " << generation << ",\n  \"shards\": [";
  for (int r = 0; r < P; ++r) o << (r ? ", " : "") << json::quote(shard_file(r, P, generation));
  o << "],\n  \"units\": [";
  const auto& units = fsdp.layout();
  for (size_t u = 0; u < units.size(); ++u) {
    const FullyShardUnitLayout& l = units[u];
    o << (u ? "," : "") << "\n    {\"name\": " << json::quote(l.name) << ", \"numel\": " << l.numel
      << ", \"padded\": " << l.padded << ", \"params\": [";
    for (size_t j = 0; j < l.params.size(); ++j)
      o << (j ? ", " : "") << "{\"name\": " << json::quote(l.params[j]) << ", \"shape\": " << shape_json(l.shapes[j])
        << ", \"offset\": " << l.offsets[j] << "}";
    o << "]}";
  }
  o << "\n  ]\n}\n";
  return o.str();
}

/// The index in `dir`, or nullopt when there is none.
std::optional<json::Value> read_index(const std::string& dir, const char* op) {
  const std::string path = (fs::path(dir) / "index.json").string();
  if (!fs::exists(path)) return std::nullopt;
  const nn::ReadOnlyFile file(path, op);
  try {
    return json::parse(file.read_all(kMaxIndexBytes));
  } catch (const Error& e) { FRUGAL_FAIL(op, ": ", path, " is not a valid index: ", e.what()); }
}

uint64_t uint_field(const json::Value& v, const char* key, const std::string& path, const char* op) {
  const json::Value* f = v.find(key);
  const auto n = f ? f->as_uint64() : std::nullopt;
  FRUGAL_CHECK(n.has_value(), op, ": ", path, ": \"", key, "\" is missing or not a non-negative integer");
  return *n;
}

/// Throws unless the index describes this model's units on this many ranks.
void check_index(const json::Value& index, const FullyShardedDataParallel& fsdp, const std::string& path) {
  const char* op = "load_sharded_checkpoint";
  const json::Value* format = index.find("format");
  FRUGAL_CHECK(index.is_object() && format && format->is_string() && format->text == kFormat, op, ": ", path,
               " is not a FullyShardedDataParallel index (format \"", kFormat, "\")");
  const uint64_t world = uint_field(index, "world_size", path, op);
  FRUGAL_CHECK(world == uint64_t(fsdp.comm()->size()), op, ": ", path, " was saved by ", world,
               " ranks, but this run has ", fsdp.comm()->size(),
               "; a sharded checkpoint loads only at its world size (save_consolidated for any other)");
  const json::Value* units = index.find("units");
  const auto& layout = fsdp.layout();
  FRUGAL_CHECK(units && units->is_array() && units->items.size() == layout.size(), op, ": ", path, " has ",
               units && units->is_array() ? units->items.size() : 0, " units, this model ", layout.size());
  for (size_t u = 0; u < layout.size(); ++u) {
    const json::Value& unit = units->items[u];
    const json::Value* name = unit.find("name");
    const json::Value* params = unit.find("params");
    FRUGAL_CHECK(name && name->is_string() && name->text == layout[u].name, op, ": ", path, ": unit ", u, " is '",
                 name && name->is_string() ? name->text : "?", "' in the checkpoint, '", layout[u].name,
                 "' in this model");
    FRUGAL_CHECK(params && params->is_array() && params->items.size() == layout[u].params.size(), op, ": ", path,
                 ": unit '", layout[u].name, "' has another number of parameters than this model's ",
                 layout[u].params.size());
    for (size_t j = 0; j < layout[u].params.size(); ++j) {
      const json::Value& p = params->items[j];
      const json::Value* pname = p.find("name");
      const json::Value* shape = p.find("shape");
      Shape saved;
      if (shape && shape->is_array())
        for (const json::Value& d : shape->items) saved.push_back(int64_t(d.as_uint64().value_or(0)));
      FRUGAL_CHECK(pname && pname->is_string() && pname->text == layout[u].params[j], op, ": ", path, ": unit '",
                   layout[u].name, "' parameter ", j, " is '", pname && pname->is_string() ? pname->text : "?",
                   "' in the checkpoint, '", layout[u].params[j], "' in this model");
      FRUGAL_CHECK(saved == layout[u].shapes[j], op, ": ", path, ": shape mismatch for '", layout[u].params[j],
                   "': ", shape_str(saved), " in the checkpoint, ", shape_str(layout[u].shapes[j]), " in this model");
    }
  }
}

std::string shard_name_from(const json::Value& index, int rank, const std::string& path) {
  const json::Value* shards = index.find("shards");
  FRUGAL_CHECK(
      shards && shards->is_array() && shards->items.size() > size_t(rank) && shards->items[size_t(rank)].is_string(),
      "load_sharded_checkpoint: ", path, " names no shard file for rank ", rank);
  const std::string& name = shards->items[size_t(rank)].text;
  FRUGAL_CHECK(name.find('/') == std::string::npos && name != "." && name != "..", "load_sharded_checkpoint: ", path,
               ": shard name '", name, "' must be a file name in the checkpoint's directory");
  return name;
}
}  // namespace

void save_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir, const optim::Optimizer* opt) {
  Communicator& comm = *fsdp.comm();
  const int r = comm.rank(), P = comm.size();
  std::error_code ec;
  fs::create_directories(dir, ec);
  FRUGAL_CHECK(fs::is_directory(dir), "save_sharded_checkpoint: cannot create the directory ", dir, ": ", ec.message());
  // Every rank reads the old index before rank 0 may replace it (the barrier below).
  const std::optional<json::Value> old = read_index(dir, "save_sharded_checkpoint");
  const std::string index_path = (fs::path(dir) / "index.json").string();
  const uint64_t old_generation = old ? uint_field(*old, "generation", index_path, "save_sharded_checkpoint") : 0;
  const uint64_t generation = old_generation + 1;

  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::vector<Tensor> shards = fsdp.parameters();
  for (size_t u = 0; u < shards.size(); ++u) tensors.emplace_back("flat_param_" + std::to_string(u), shards[u]);
  if (opt)
    for (const auto& [key, t] : opt->state_dict()) tensors.emplace_back("optim." + key, t);
  for (const auto& [name, b] : fsdp.module()->named_buffers()) tensors.emplace_back("buffer." + name, b);
  nn::save_safetensors((fs::path(dir) / shard_file(r, P, generation)).string(), tensors,
                       {{"format", kFormat},
                        {"rank", std::to_string(r)},
                        {"world_size", std::to_string(P)},
                        {"generation", std::to_string(generation)}});
  comm.barrier();
  if (r == 0) nn::write_file_atomically(index_path, index_json(fsdp, generation), "save_sharded_checkpoint");
  comm.barrier();
  if (old) {  // generation g-1's files: each rank its own, rank 0 those of ranks beyond P
    const json::Value* shards_old = old->find("shards");
    const uint64_t old_world = uint_field(*old, "world_size", index_path, "save_sharded_checkpoint");
    if (shards_old && shards_old->is_array())
      for (size_t k = 0; k < shards_old->items.size(); ++k) {
        const std::string name = shards_old->items[k].text;
        const bool mine = int(k) == r || (r == 0 && k >= size_t(P));
        // Only the name this code gave that shard: an index edited to list another file
        // (index.json itself) must not make a save delete it.
        if (mine && name == shard_file(int(k), int(old_world), old_generation) &&
            name != shard_file(int(k), P, generation))
          fs::remove(fs::path(dir) / name, ec);
      }
  }
}

void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir, optim::Optimizer* opt) {
  const char* op = "load_sharded_checkpoint";
  const std::string index_path = (fs::path(dir) / "index.json").string();
  const std::optional<json::Value> index = read_index(dir, op);
  FRUGAL_CHECK(index.has_value(), op, ": no checkpoint in ", dir, " (", index_path, " does not exist)");
  check_index(*index, fsdp, index_path);
  const int r = fsdp.comm()->rank();
  const std::string path = (fs::path(dir) / shard_name_from(*index, r, index_path)).string();
  FRUGAL_CHECK(fs::exists(path), op, ": the shard file of rank ", r, ", ", path, ", named by ", index_path,
               ", is missing");
  const nn::SafetensorsFile file = nn::load_safetensors(path, fsdp.comm()->device());
  // The shard says whose it is: another rank's (an index listing one file twice) has the same
  // sizes and would load without a word.
  const uint64_t generation = uint_field(*index, "generation", index_path, op);
  const std::pair<const char*, std::string> expected[] = {{"rank", std::to_string(r)},
                                                          {"world_size", std::to_string(fsdp.comm()->size())},
                                                          {"generation", std::to_string(generation)}};
  for (const auto& [key, want] : expected) {
    const auto it = file.metadata.find(key);
    FRUGAL_CHECK(it != file.metadata.end() && it->second == want, op, ": ", path, " is not rank ", r,
                 "'s shard of generation ", generation, ": its metadata has ", key, " = ",
                 it == file.metadata.end() ? std::string("(none)") : it->second, ", expected ", want);
  }

  // Check everything, then copy.
  const std::vector<Tensor> shards = fsdp.parameters();
  std::vector<Tensor> saved(shards.size());
  for (size_t u = 0; u < shards.size(); ++u) {
    const std::string key = "flat_param_" + std::to_string(u);
    auto it = file.tensors.find(key);
    FRUGAL_CHECK(it != file.tensors.end(), op, ": ", path, " has no tensor ", key);
    FRUGAL_CHECK(it->second.sizes() == shards[u].sizes() && it->second.dtype() == shards[u].dtype(), op, ": ", path,
                 ": ", key, " is ", it->second.describe(), ", this rank's shard is ", shards[u].describe());
    saved[u] = it->second;
  }
  const nn::NamedTensors buffers = fsdp.module()->named_buffers();
  for (const auto& [name, b] : buffers) {
    auto it = file.tensors.find("buffer." + name);
    FRUGAL_CHECK(it != file.tensors.end() && it->second.sizes() == b.sizes(), op, ": ", path, ": buffer '", name,
                 "' is missing or has another shape than ", shape_str(b.sizes()));
  }
  optim::StateDict optim_state;
  for (const auto& [key, t] : file.tensors)
    if (key.rfind("optim.", 0) == 0) optim_state.emplace_back(key.substr(6), t);
  FRUGAL_CHECK(!opt || !optim_state.empty(), op, ": ", path,
               " holds no optimizer state; it was saved without an optimizer");
  if (opt) opt->load_state_dict(optim_state);  // validates everything before it changes anything
  autograd::NoGradGuard no_grad;
  fsdp.free_gathered();
  for (size_t u = 0; u < shards.size(); ++u) shards[u].detach().copy_(saved[u]);
  for (const auto& [name, b] : buffers) b.detach().copy_(file.tensors.at("buffer." + name));
}

void save_consolidated(FullyShardedDataParallel& fsdp, const std::string& path) {
  const nn::NamedTensors full = fsdp.full_state_dict();
  if (fsdp.comm()->rank() == 0) nn::save_safetensors(path, full);
  fsdp.comm()->barrier();
}

}  // namespace frugal::parallel
