#pragma once
// safetensors I/O: the Hugging Face checkpoint format, byte for byte as the Python
// library writes it, so frugal reads published checkpoints and PyTorch reads ours.
//
// Layout: an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
// padded with spaces to a multiple of 8, then the raw little-endian, row-major data;
// offsets count from the start of the data, and the tensors tile it with no holes.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::nn {

/// Everything a safetensors file holds.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" (string -> string)
};

/// Writes `tensors` (any device, any layout; copied to contiguous host bytes) to `path`.
/// Tensors are ordered as the Python library orders them (widest dtype first, then by
/// name) and packed without gaps; `metadata`, when not empty, becomes "__metadata__".
/// Crash-safe: the bytes go to a temporary `path + ".tmp.<pid>.<random>"` in the same
/// directory, which is fsynced and then renamed over `path`, so a failed or interrupted save
/// leaves any previous file untouched, and concurrent saves of one path never collide. A
/// temporary left by a killed save is removed by the next save of `path` (see Note
/// [Temporary files of a save] in nn/atomic_file.h). Throws frugal::Error naming the file
/// (and the tensor, if one is at fault).
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads `path` (with pread: Note [Reading checkpoints with pread]) and parses it with parse_safetensors; tensors land
/// on `device`. Anything but a regular file (a FIFO, a directory) is refused without blocking.
SafetensorsFile load_safetensors(const std::string& path, Device device = kCPU);

/// Parses a whole safetensors file held in memory. Every field is validated before it is
/// used (see Note [safetensors validation] in safetensors.cpp): no input makes it read
/// outside [data, data + size). Throws frugal::Error naming the tensor at fault.
/// Dtypes: F32, F16, BF16, F64, I32, I64, BOOL, and U8 as kUInt8 (storage only: Note [Storage-only
/// uint8]; a cast reads it as numbers); the others are rejected as unsupported.
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, Device device = kCPU);

}  // namespace frugal::nn
