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

// Note [Saving over what is there]
// A save writes a temporary and renames it over the path (Note [Temporary files of a save]
// in nn/atomic_file.h). rename replaces whatever the path names, so a save "to" /dev/null,
// a FIFO or a device would swap it for a regular file (as root, /dev/null itself); open("wb")
// in Python or torch.save writes into them instead. So what is at the path is looked at
// first: nothing, or a regular file, is written as usual; a symbolic link is followed, and
// its target replaced, the link kept (as open("wb") writes through it); anything else is
// refused. A replaced file keeps its permission bits, so a private checkpoint stays private.

/// Where a save to `path` writes and what mode the new file gets (see Note [Saving over what
/// is there]).
struct SaveTarget {
  std::string path;      // `path`, or the target of the symbolic link at `path`
  bool exists = false;   // a regular file is there now
  uint32_t mode = 0644;  // its permission bits when it exists (the umask applies otherwise)
};
/// Throws "<op>: <path> is a FIFO (...)" when something other than a regular file (or a link
/// to one, or to nothing yet) is at `path`.
SaveTarget save_target(const std::string& path, const char* op);

}  // namespace frugal::nn
