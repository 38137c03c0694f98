#pragma once
// Opening the files that frugal reads (checkpoints, config JSON, datasets), whose paths
// come from users and command lines.
//
// Note [Opening untrusted paths]
// open(O_RDONLY) on a FIFO blocks until a writer appears, so `run_model --weights` on
// a FIFO once hung before the regular-file check could run; a directory or a device is
// no checkpoint either, and opening some devices has side effects. So the path is
// stat()ed first and anything but a regular file is refused without being opened; then
// it is opened O_NONBLOCK (which cannot block even if the path became a FIFO since the
// stat) and the opened file is fstat()ed again, so what is read is what was checked.
#include <cstdint>
#include <string>

namespace frugal::nn {

/// A regular file opened for reading (see Note [Opening untrusted paths]). Move-only.
class ReadOnlyFile {
 public:
  /// Throws frugal::Error "<op>: cannot open <path>: <reason>" or "<op>: <path> is not a
  /// regular file (a FIFO)", naming what the path is.
  ReadOnlyFile(const std::string& path, const char* op);
  ~ReadOnlyFile();
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&&) = delete;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  int fd() const { return fd_; }
  /// The size when it was opened, in bytes.
  uint64_t size() const { return size_; }
  /// Hands the descriptor over (to gzdopen, which closes it); this object then owns nothing.
  int release();
  /// The whole file; throws naming `op` and the path when it is larger than `max_bytes`
  /// or a read fails.
  std::string read_all(uint64_t max_bytes) const;

 private:
  std::string path_;
  const char* op_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace frugal::nn
