#include "nn/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <tuple>

#include "core/json.h"
#include "core/utf8.h"
#include "nn/atomic_file.h"
#include "nn/file.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"

namespace frugal::nn {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

// Note [safetensors validation]
// A checkpoint is untrusted input (it may come from anywhere, and a truncated
// download is common), so parse_safetensors checks every field before it touches a
// byte of data, with the rules of the reference implementation (safetensors'
// tensor.rs, Metadata::validate):
//   - at least 8 bytes; the header length N at most 100 MB and at most what follows it;
//   - the header is strict JSON (core/json.h: UTF-8, no duplicate keys), an object whose
//     "__metadata__" member, if any, maps strings to strings, and whose other members
//     are {"dtype": string, "shape": [uint...], "data_offsets": [begin, end]}, no more;
//   - the product of the sizes (zeros counted as 1, so that strides fit too; see Note
//     [Size overflow]) and numel * element_size fit in int64, and the latter equals
//     end - begin;
//   - every range lies inside the data, and sorted by offset the ranges tile the data
//     exactly: no overlap, no hole between tensors, nothing unused at the end.
// All arithmetic is done in uint64 with overflow checks, so the checks themselves
// cannot wrap. Only then are tensors allocated and filled.

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // as the Python library

// The dtypes frugal maps. `order` is the position in the Rust library's Dtype enum
// (BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64),
// which its writer sorts by, widest alignment first.
struct DtypeEntry {
  const char* name;
  DType dtype;
  int order;
};
constexpr DtypeEntry kDtypes[] = {
    {"F32", kFloat32, 11}, {"F16", kFloat16, 7}, {"BF16", kBFloat16, 8}, {"F64", kFloat64, 12},
    {"I32", kInt32, 9},    {"I64", kInt64, 13},  {"BOOL", kBool, 0},     {"U8", kUInt8, 1},
};
// Valid safetensors dtypes that frugal has no type for.
constexpr const char* kUnsupportedDtypes[] = {"I8",      "I16",     "U16", "U32",     "U64",     "F8_E5M2",
                                              "F8_E4M3", "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64"};

const DtypeEntry& entry_for(DType t) {
  for (const auto& e : kDtypes)
    if (e.dtype == t) return e;
  FRUGAL_FAIL("save_safetensors: no safetensors dtype for ", dtype_name(t));
}

std::string json_shape(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s.append(i ? "," : "").append(std::to_string(shape[i]));
  return s + "]";
}

// ---- reading ------------------------------------------------------------------------

struct TensorEntry {
  const std::string* name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// Throws "safetensors: <source>: <what>", located at the caller's check (Note [Error locations]).
template <typename... Args>
[[noreturn]] void bad_file(ErrorSite source, const Args&... what) {
  detail::throw_error(source, detail::str_cat("safetensors: ", source.text, ": ", what...));
}

std::string describe_value(const json::Value& v) {
  if (v.type == json::Value::Type::Number) return "the number " + v.text;
  const bool vowel = v.type == json::Value::Type::Array || v.type == json::Value::Type::Object;
  return std::string(vowel ? "an " : "a ") + json::type_name(v.type);
}

TensorEntry read_entry(const std::string& source, const std::string& name, const json::Value& info) {
  const std::string tensor = "tensor " + json::quote(name);
  if (!info.is_object()) bad_file(source, tensor, ": entry is ", describe_value(info), ", expected an object");
  for (const auto& [key, unused] : info.members)
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      bad_file(source, tensor, ": unknown field ", json::quote(key), " (expected dtype, shape, data_offsets)");
  const json::Value* dtype = info.find("dtype");
  const json::Value* shape = info.find("shape");
  const json::Value* offsets = info.find("data_offsets");
  if (!dtype || !shape || !offsets)
    bad_file(source, tensor, ": missing field \"", !dtype ? "dtype" : !shape ? "shape" : "data_offsets", "\"");

  TensorEntry e{&name, kFloat32, {}, 0, 0};
  // dtype
  if (!dtype->is_string()) bad_file(source, tensor, ": dtype is ", describe_value(*dtype), ", expected a string");
  const DtypeEntry* found = nullptr;
  for (const auto& d : kDtypes)
    if (dtype->text == d.name) found = &d;
  if (!found) {
    for (const char* u : kUnsupportedDtypes)
      if (dtype->text == u)
        bad_file(source, tensor, ": unsupported dtype ", u, " (frugal reads F32, F16, BF16, F64, I32, I64, BOOL, U8)");
    bad_file(source, tensor, ": unknown dtype ", json::quote(dtype->text));
  }
  e.dtype = found->dtype;

  // shape: the sizes, then the checks of Note [Size overflow], so that creating the tensor
  // cannot overflow. The product of max(size, 1) must fit: [2^62, 2^62, 0] holds no bytes,
  // but its strides do not fit in int64 (the reference reader rejects it too).
  if (!shape->is_array()) bad_file(source, tensor, ": shape is ", describe_value(*shape), ", expected an array");
  for (size_t i = 0; i < shape->items.size(); ++i) {
    const std::optional<uint64_t> d = shape->items[i].as_uint64();
    if (!d || *d > uint64_t(std::numeric_limits<int64_t>::max()))
      bad_file(source, tensor, ": shape[", i, "] is ", describe_value(shape->items[i]),
               ", expected a non-negative integer");
    e.shape.push_back(int64_t(*d));
  }
  int64_t extent = 1;
  bool empty = false;
  for (int64_t d : e.shape) {
    empty |= d == 0;
    if (__builtin_mul_overflow(extent, std::max<int64_t>(d, 1), &extent))
      bad_file(source, tensor, ": shape ", json_shape(e.shape), " of ", found->name,
               " overflows: its sizes multiply past 2^63 - 1 (zeros counted as 1, as strides need)");
  }
  int64_t nbytes = 0;
  if (!empty && __builtin_mul_overflow(extent, int64_t(element_size(e.dtype)), &nbytes))
    bad_file(source, tensor, ": shape ", json_shape(e.shape), " of ", found->name,
             " overflows: it needs more than 2^63 - 1 bytes");

  // data_offsets
  std::optional<uint64_t> begin, end;
  if (offsets->is_array() && offsets->items.size() == 2) {
    begin = offsets->items[0].as_uint64();
    end = offsets->items[1].as_uint64();
  }
  if (!begin || !end)
    bad_file(source, tensor, ": data_offsets must be an array of two non-negative integers [begin, end]");
  e.begin = *begin;
  e.end = *end;
  if (e.begin > e.end) bad_file(source, tensor, ": data_offsets [", e.begin, ", ", e.end, "] are not ordered");
  if (e.end - e.begin != uint64_t(nbytes))
    bad_file(source, tensor, ": data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin, " bytes but ",
             found->name, " ", json_shape(e.shape), " needs ", nbytes);
  return e;
}

// Note [Reading checkpoints with pread]
// A file is read with pread into each tensor's own buffer, not mapped: every tensor is
// copied out anyway, so a mapping saves no memory, and a file another process shortens while
// it is mapped (a copy or a save over it in place) turns the copy into SIGBUS, which kills
// the process; a short pread is an error that names the file instead.

/// What parse reads from: `size` bytes, any range copied out by `read` (a memory buffer, or a
/// file through pread: Note [Reading checkpoints with pread]).
struct ByteSource {
  uint64_t size;
  std::function<void(uint64_t offset, size_t n, void* dst)> read;
};

SafetensorsFile parse(const ByteSource& src, Device device, const std::string& source) {
  const uint64_t size = src.size;
  if (size < 8) bad_file(source, "file is ", size, " bytes, too short for the 8-byte header length");
  uint8_t length[8];
  src.read(0, 8, length);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > kMaxHeaderBytes) bad_file(source, "header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  if (n > size - 8)
    bad_file(source, "header length ", n, " exceeds the ", size - 8, " bytes that follow it (file is ", size,
             " bytes)");
  std::string text(size_t(n), '\0');
  src.read(8, size_t(n), text.data());
  json::Value header;
  try {
    header = json::parse(text, json::kDefaultMaxDepth, /*first_byte=*/8);  // error offsets count from the file's start
  } catch (const Error& e) { rethrow_with_context(e, "safetensors: " + source + ": header is not valid JSON: "); }
  if (!header.is_object()) bad_file(source, "header is ", describe_value(header), ", expected a JSON object");

  const uint64_t data_size = size - 8 - n, base = 8 + n;
  SafetensorsFile out;
  std::vector<TensorEntry> entries;
  for (const auto& [name, value] : header.members) {
    if (name == "__metadata__") {
      if (!value.is_object())
        bad_file(source, "\"__metadata__\" is ", describe_value(value), ", expected an object of strings");
      for (const auto& [key, v] : value.members) {
        if (!v.is_string())
          bad_file(source, "\"__metadata__\" value for key ", json::quote(key), " is ", describe_value(v),
                   ", expected a string");
        out.metadata.emplace(key, v.text);
      }
      continue;
    }
    TensorEntry e = read_entry(source, name, value);
    if (e.end > data_size)
      bad_file(source, "tensor ", json::quote(name), ": data_offsets [", e.begin, ", ", e.end,
               "] run past the end of the data (", data_size, " bytes: the file is ", size,
               " bytes and its data starts at byte ", 8 + n, ")");
    entries.push_back(std::move(e));
  }

  // The ranges must tile [0, data_size): sorted by (begin, end), each starts where the last ended.
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const TensorEntry& e = entries[i];
    if (e.begin < covered)
      bad_file(source, "tensor ", json::quote(*e.name), ": data_offsets [", e.begin, ", ", e.end, "] overlap tensor ",
               json::quote(*entries[i - 1].name), " [", entries[i - 1].begin, ", ", entries[i - 1].end, "]");
    if (e.begin > covered) {
      if (i == 0)
        bad_file(source, "tensor ", json::quote(*e.name), ": the data has a hole of ", e.begin,
                 " bytes before it (the first tensor must begin at offset 0)");
      bad_file(source, "tensor ", json::quote(*e.name), ": the data has a hole of ", e.begin - covered,
               " bytes between tensor ", json::quote(*entries[i - 1].name), " (ends at ", covered,
               ") and this tensor (begins at ", e.begin, ")");
    }
    covered = e.end;
  }
  if (covered != data_size)
    bad_file(source, "the tensors cover ", covered, " bytes of data but the file holds ", data_size, " (",
             data_size - covered, " unused bytes at the end of the file)");

  for (const TensorEntry& e : entries) {
    Tensor t;
    try {
      t = empty(e.shape, {e.dtype, kCPU});  // the shape is checked: only memory can run out
    } catch (const Error& err) {
      rethrow_with_context(err, "safetensors: " + source + ": tensor " + json::quote(*e.name) + ": ");
    }
    const size_t nbytes = size_t(e.end - e.begin);
    if (nbytes) src.read(base + e.begin, nbytes, t.data());
    if (e.dtype == kBool) {  // any nonzero byte is true; a C++ bool must hold exactly 0 or 1
      auto* bytes = static_cast<uint8_t*>(t.data());
      for (size_t i = 0; i < nbytes; ++i) bytes[i] = bytes[i] != 0;
    }
    out.tensors.emplace(*e.name, device.is_cpu() ? t : t.to(device));
  }
  return out;
}

}  // namespace

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, Device device) {
  const ByteSource memory{size, [data](uint64_t offset, size_t n, void* dst) { std::memcpy(dst, data + offset, n); }};
  return parse(memory, device, "<memory buffer>");
}

SafetensorsFile load_safetensors(const std::string& path, Device device) {
  const ReadOnlyFile file(path, "load_safetensors");  // see Note [Opening untrusted paths]
  // Read range by range into the tensors: Note [Reading checkpoints with pread].
  const ByteSource disk{file.size(), [&](uint64_t offset, size_t n, void* dst) {
                          auto* out = static_cast<char*>(dst);
                          for (size_t done = 0; done < n;) {
                            const ssize_t got = ::pread(file.fd(), out + done, n - done, off_t(offset + done));
                            if (got < 0 && errno == EINTR) continue;
                            if (got < 0)
                              FRUGAL_FAIL("load_safetensors: cannot read ", path, ": ", std::strerror(errno));
                            FRUGAL_CHECK(got > 0, "load_safetensors: ", path, " ended at byte ", offset + done,
                                         " while being read, ", file.size(),
                                         " bytes when it was opened (another "
                                         "process shortened it)");
                            done += size_t(got);
                          }
                        }};
  return parse(disk, device, path);
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Check everything before creating a file.
  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& item : tensors) {
    const auto& [name, t] = item;
    FRUGAL_CHECK(name != "__metadata__", "save_safetensors: ", path,
                 ": \"__metadata__\" is reserved and cannot name a tensor");
    FRUGAL_CHECK(t.defined(), "save_safetensors: ", path, ": tensor ", json::quote(name), " is undefined");
    // The header is JSON, whose strings the loader (and every other) reads only as UTF-8.
    FRUGAL_CHECK(is_valid_utf8(name), "save_safetensors: ", path, ": tensor name ", json::quote(name),
                 " is not valid UTF-8; no file was written");
    order.push_back(&item);
  }
  for (const auto& [k, v] : metadata)
    FRUGAL_CHECK(is_valid_utf8(k) && is_valid_utf8(v), "save_safetensors: ", path, ": metadata ", json::quote(k), " = ",
                 json::quote(v), " is not valid UTF-8; no file was written");
  // As the Python library: widest dtype first, then by name (bytewise).
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const int oa = entry_for(a->second.dtype()).order, ob = entry_for(b->second.dtype()).order;
    return oa != ob ? oa > ob : a->first < b->first;
  });
  for (size_t i = 1; i < order.size(); ++i)
    FRUGAL_CHECK(order[i]->first != order[i - 1]->first, "save_safetensors: ", path, ": tensor ",
                 json::quote(order[i]->first), " appears twice");

  // The header, byte for byte as serde_json writes the library's Metadata: no spaces,
  // "__metadata__" first, then each tensor's {"dtype","shape","data_offsets"}.
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header.append(first ? "" : ",").append(json::quote(k)).append(":").append(json::quote(v));
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& t = item->second;
    const uint64_t nbytes = uint64_t(t.numel()) * t.element_size();  // exact: Note [Size overflow]
    uint64_t end;
    FRUGAL_CHECK(!__builtin_add_overflow(offset, nbytes, &end), "save_safetensors: ", path, ": tensor ",
                 json::quote(item->first), " ", t.describe(), " ends past 2^64 bytes of data");
    if (header.size() > 1) header += ",";
    header += json::quote(item->first) + ":{\"dtype\":\"" + entry_for(t.dtype()).name +
              "\",\"shape\":" + json_shape(t.sizes()) + ",\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(end) + "]}";
    offset = end;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned

  AtomicFileWriter file(path, "save_safetensors");  // Note [Temporary files of a save]
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  file.write(length, 8);
  file.write(header.data(), header.size());
  for (const auto* item : order) {
    const Tensor& t = item->second;
    if (t.numel() == 0) continue;
    Tensor host = t;
    if (!t.device().is_cpu() || !t.is_contiguous()) {  // a raw copy: saving never records autograd history
      host = empty(t.sizes(), {t.dtype(), kCPU});
      ops::copy_into(host, t);
    }
    file.write(host.data(), size_t(host.numel()) * host.element_size());
  }
  file.commit();
}

}  // namespace frugal::nn
