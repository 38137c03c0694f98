#include "nn/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "nn/file.h"
#include "tensor/factory.h"

namespace frugal::data {

namespace {

constexpr uint8_t kUnsignedByte = 0x08;

std::string hex32(uint32_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) s += digits[(v >> shift) & 15];
  return s;
}

// gzFile with RAII. gzread reads gzip streams and, transparently, plain files.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    nn::ReadOnlyFile file(path, "read_idx");  // a FIFO must not hang gzopen (Note [Opening untrusted paths])
    file_ = gzdopen(file.fd(), "rb");
    FRUGAL_CHECK(file_ != nullptr, "read_idx: cannot open ", path, ": out of memory");
    file.release();  // gzclose closes it now
    gzbuffer(file_, 1 << 17);
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes (n < 2^31); returns how many were read (fewer only at the end).
  size_t read(void* p, size_t n) {
    const int got = gzread(file_, p, unsigned(n));
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(file_, &code);
      if (code == Z_ERRNO) FRUGAL_FAIL("read_idx: cannot read ", path_, ": ", std::strerror(errno));
      FRUGAL_FAIL("read_idx: ", path_, ": ", msg, " (corrupt or truncated gzip data)");
    }
    if (unsigned(got) < n) {
      // gzread reports a gzip stream cut short (even inside its CRC/length trailer, after the
      // last data byte) only as a short read with Z_BUF_ERROR pending, never as -1: without
      // this check a file missing its trailer would load with nothing vouching for its bytes.
      int code = 0;
      const char* msg = gzerror(file_, &code);
      FRUGAL_CHECK(code != Z_BUF_ERROR, "read_idx: ", path_, ": ", msg, " (truncated gzip data)");
    }
    return size_t(got);
  }

  /// "file" for a plain file, "gzip data" for a compressed one: what a byte count counts.
  const char* what() const { return gzdirect(file_) ? "file" : "gzip data"; }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

uint64_t numel_checked(const IdxData& idx) {
  uint64_t n = 1;
  for (int64_t d : idx.shape) n *= uint64_t(d);  // read_idx checked it does not overflow
  return n;
}

}  // namespace

IdxData read_idx(const std::string& path) {
  GzReader in(path);
  IdxData idx;
  idx.path = path;
  uint8_t head[4];
  const size_t got = in.read(head, 4);
  FRUGAL_CHECK(got == 4, "read_idx: ", path, ": ", in.what(), " is ", got,
               " bytes, too short for the 4-byte magic number");
  const uint32_t magic = uint32_t(head[0]) << 24 | uint32_t(head[1]) << 16 | uint32_t(head[2]) << 8 | head[3];
  FRUGAL_CHECK(head[0] == 0 && head[1] == 0, "read_idx: ", path, ": not an IDX file (magic number ", hex32(magic),
               " does not start with two zero bytes)");
  FRUGAL_CHECK(head[2] == kUnsignedByte, "read_idx: ", path, ": element type 0x", hex32(head[2]).substr(8),
               " (magic number ", hex32(magic), ") is not supported: only 0x08 (unsigned byte) is");
  const int ndim = head[3];
  FRUGAL_CHECK(ndim >= 1, "read_idx: ", path, ": magic number ", hex32(magic), " declares 0 dimensions");

  std::vector<uint8_t> dims(size_t(ndim) * 4);
  const size_t got_dims = in.read(dims.data(), dims.size());
  FRUGAL_CHECK(got_dims == dims.size(), "read_idx: ", path, ": file ends inside the sizes of its ", ndim,
               " dimensions");
  uint64_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    const uint8_t* d = dims.data() + 4 * i;
    const uint32_t size = uint32_t(d[0]) << 24 | uint32_t(d[1]) << 16 | uint32_t(d[2]) << 8 | d[3];
    idx.shape.push_back(int64_t(size));
    FRUGAL_CHECK(!__builtin_mul_overflow(total, uint64_t(size), &total) && total <= (uint64_t(1) << 48),
                 "read_idx: ", path, ": dimensions ", shape_str(idx.shape), "... hold too many elements");
  }

  // The header's promise is untrusted: grow the buffer as bytes arrive instead of
  // allocating `total` up front, so a corrupt size fails on a short read, not in malloc.
  idx.bytes.reserve(size_t(std::min<uint64_t>(total, uint64_t(64) << 20)));
  uint64_t have = 0;
  while (have < total) {
    const size_t chunk = size_t(std::min<uint64_t>(total - have, uint64_t(1) << 24));
    idx.bytes.resize(size_t(have) + chunk);
    const size_t n = in.read(idx.bytes.data() + have, chunk);
    have += n;
    FRUGAL_CHECK(n == chunk, "read_idx: ", path, ": dimensions ", shape_str(idx.shape), " need ", total,
                 " data bytes but the file holds only ", have);
  }
  uint8_t extra[64];
  const size_t trailing = in.read(extra, sizeof(extra));
  FRUGAL_CHECK(trailing == 0, "read_idx: ", path, ": dimensions ", shape_str(idx.shape), " need ", total,
               " data bytes but the file holds more (trailing bytes after the data)");
  return idx;
}

Tensor idx_images_to_tensor(const IdxData& idx) {
  FRUGAL_CHECK(idx.shape.size() == 3, "idx_images_to_tensor: ", idx.path, " has ", idx.shape.size(),
               " dimensions (magic ", hex32(0x0800u | uint32_t(idx.shape.size())),
               "); an image file has 3 (magic 0x00000803)");
  FRUGAL_CHECK(idx.bytes.size() == numel_checked(idx), "idx_images_to_tensor: ", idx.path, ": ", idx.bytes.size(),
               " bytes do not match dimensions ", shape_str(idx.shape));
  Tensor out = empty({idx.shape[0], 1, idx.shape[1], idx.shape[2]}, {kFloat32, kCPU});
  float* p = out.data_ptr<float>();
  for (size_t i = 0; i < idx.bytes.size(); ++i) p[i] = float(idx.bytes[i]) / 255.0f;
  return out;
}

Tensor idx_labels_to_tensor(const IdxData& idx) {
  FRUGAL_CHECK(idx.shape.size() == 1, "idx_labels_to_tensor: ", idx.path, " has ", idx.shape.size(),
               " dimensions (magic ", hex32(0x0800u | uint32_t(idx.shape.size())),
               "); a label file has 1 (magic 0x00000801)");
  FRUGAL_CHECK(idx.bytes.size() == numel_checked(idx), "idx_labels_to_tensor: ", idx.path, ": ", idx.bytes.size(),
               " bytes do not match dimensions ", shape_str(idx.shape));
  Tensor out = empty({idx.shape[0]}, {kInt64, kCPU});
  int64_t* p = out.data_ptr<int64_t>();
  for (size_t i = 0; i < idx.bytes.size(); ++i) p[i] = idx.bytes[i];
  return out;
}

namespace {

// dir/name.gz, else dir/name.
std::string find_file(const std::string& dir, const std::string& name) {
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  std::error_code ec;
  for (const std::string& candidate : {base.string() + ".gz", base.string()})
    if (std::filesystem::is_regular_file(candidate, ec)) return candidate;
  FRUGAL_FAIL("load_fashion_mnist: neither ", base.string(), ".gz nor ", base.string(), " exists");
}

void load_split(const std::string& dir, const std::string& prefix, Tensor& images, Tensor& labels) {
  const IdxData image_file = read_idx(find_file(dir, prefix + "-images-idx3-ubyte"));
  const IdxData label_file = read_idx(find_file(dir, prefix + "-labels-idx1-ubyte"));
  images = idx_images_to_tensor(image_file);
  labels = idx_labels_to_tensor(label_file);
  FRUGAL_CHECK(image_file.shape[1] == 28 && image_file.shape[2] == 28, "load_fashion_mnist: ", image_file.path,
               " holds ", image_file.shape[1], "x", image_file.shape[2], " images, expected 28x28");
  FRUGAL_CHECK(images.size(0) == labels.size(0), "load_fashion_mnist: ", image_file.path, " holds ", images.size(0),
               " images but ", label_file.path, " holds ", labels.size(0), " labels");
  for (size_t i = 0; i < label_file.bytes.size(); ++i)
    FRUGAL_CHECK(label_file.bytes[i] < 10, "load_fashion_mnist: ", label_file.path, ": label ",
                 int(label_file.bytes[i]), " at index ", i, " is outside [0, 10)");
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir) {
  FashionMnist data;
  load_split(dir, "train", data.train_images, data.train_labels);
  load_split(dir, "t10k", data.test_images, data.test_labels);
  return data;
}

}  // namespace frugal::data
