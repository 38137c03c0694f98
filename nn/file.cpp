#include "nn/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"

namespace frugal::nn {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

[[noreturn]] void system_error(ErrorSite what, const std::string& path, int err) {
  detail::throw_error(what, detail::str_cat(what.text, " ", path, ": ", std::strerror(err)));
}

}  // namespace

namespace {

/// Where a chain of symbolic links starting at `path` ends (the last name may not exist yet):
/// each link read as written, a relative one from its own directory, as open() follows them.
std::string link_target(const std::string& path, const char* op) {
  namespace fs = std::filesystem;
  fs::path p = path;
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p.string();
    const fs::path next = fs::read_symlink(p, ec);
    FRUGAL_CHECK(!ec, op, ": cannot read the symbolic link ", p.string(), ": ", ec.message());
    p = next.is_absolute() ? next : p.parent_path() / next;
  }
  FRUGAL_FAIL(op, ": ", path, ": too many levels of symbolic links");
}

}  // namespace

SaveTarget save_target(const std::string& path, const char* op) {
  SaveTarget target{path};
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return target;
    system_error(std::string(op) + ": cannot stat", path, errno);
  }
  if (S_ISLNK(st.st_mode)) {
    // Followed by hand: weakly_canonical gives a dangling link's own path, and the rename
    // then replaced the link with the file (a probe of 2026-12-05).
    target.path = link_target(path, op);
    if (::stat(target.path.c_str(), &st) != 0) {  // a dangling link: its target is created
      const int err = errno;
      if (err != ENOENT) system_error(std::string(op) + ": cannot stat", target.path, err);
      const std::filesystem::path dir = std::filesystem::path(target.path).parent_path();
      std::error_code ec;
      FRUGAL_CHECK(std::filesystem::is_directory(dir.empty() ? "." : dir, ec), op, ": ", path, " links to ",
                   target.path, ", whose directory does not exist");
      return target;
    }
  }
  FRUGAL_CHECK(S_ISREG(st.st_mode), op, ": ", path, " is ", kind_of(st.st_mode),
               ", not a regular file; a save never replaces it (Note [Saving over what is there])");
  target.exists = true;
  target.mode = uint32_t(st.st_mode & 07777);
  return target;
}

ReadOnlyFile::ReadOnlyFile(const std::string& path, const char* op) : path_(path), op_(op) {
  const std::string cannot = std::string(op) + ": cannot open";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) system_error(cannot, path, errno);
  FRUGAL_CHECK(S_ISREG(st.st_mode), op, ": ", path, " is not a regular file (", kind_of(st.st_mode), ")");
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) system_error(cannot, path, errno);
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {  // replaced between the stat and the open
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    FRUGAL_CHECK(S_ISREG(st.st_mode), op, ": ", path, " is not a regular file (", kind_of(st.st_mode), ")");
    system_error(std::string(op) + ": cannot stat", path, err);
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);  // plain blocking reads from here on
  size_ = uint64_t(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)), op_(other.op_), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

int ReadOnlyFile::release() { return std::exchange(fd_, -1); }

std::string ReadOnlyFile::read_all(uint64_t max_bytes) const {
  FRUGAL_CHECK(size_ <= max_bytes, op_, ": ", path_, " is ", size_, " bytes, more than the limit of ", max_bytes);
  std::string out(size_t(size_), '\0');
  size_t have = 0;
  while (have < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + have, out.size() - have, off_t(have));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) system_error(std::string(op_) + ": cannot read", path_, errno);
    if (n == 0) break;  // shrank since the fstat
    have += size_t(n);
  }
  out.resize(have);
  return out;
}

}  // namespace frugal::nn
