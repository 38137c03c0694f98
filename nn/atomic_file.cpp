#include "nn/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "nn/file.h"

namespace frugal::nn {

namespace {

constexpr const char* kTempInfix = ".tmp.";
constexpr size_t kRandomDigits = 16;
constexpr size_t kBufferBytes = size_t(4) << 20;

// path's directory ("." for a bare name) and the file's name in it.
std::pair<std::string, std::string> split_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

uint64_t random_u64() {
  static thread_local std::mt19937_64 gen{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}() ^
                                          uint64_t(::getpid())};
  return gen();
}

std::string hex(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(kRandomDigits, '0');
  for (size_t i = kRandomDigits; i-- > 0; v >>= 4) s[i] = digits[v & 15];
  return s;
}

// The pid in `name` when it is `<base>.tmp.<pid>.<16 hex>`, else 0.
pid_t temp_owner(const std::string& name, const std::string& base) {
  const std::string prefix = base + kTempInfix;
  if (name.size() <= prefix.size() + kRandomDigits + 1 || name.compare(0, prefix.size(), prefix) != 0) return 0;
  const size_t dot = name.size() - kRandomDigits - 1;
  if (name[dot] != '.' || dot == prefix.size()) return 0;
  for (size_t i = dot + 1; i < name.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return 0;
  int64_t pid = 0;
  for (size_t i = prefix.size(); i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9' || pid > (int64_t(1) << 40)) return 0;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid > 0 && pid <= std::numeric_limits<pid_t>::max() ? pid_t(pid) : 0;
}

bool process_is_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Removes the temporaries of earlier writes of `path` whose writers are gone (Note
// [Temporary files of a save]).
void remove_stale_temporaries(const std::string& path) {
  const auto [dir, base] = split_path(path);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const int dfd = ::dirfd(d);
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    const pid_t owner = temp_owner(name, base);
    if (owner == 0 || !process_is_gone(owner)) continue;
    // O_NONBLOCK: a FIFO of that name must not hang the write; O_NOFOLLOW: never a link's target.
    const int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat locked {};
    struct stat named {};
    if (::fstat(fd, &locked) == 0 && S_ISREG(locked.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        ::fstatat(dfd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 && named.st_dev == locked.st_dev &&
        named.st_ino == locked.st_ino)
      ::unlinkat(dfd, name.c_str(), 0);
    ::close(fd);  // drops the lock
  }
  ::closedir(d);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(const std::string& path, std::string op) : path_(path), op_(std::move(op)) {
  FRUGAL_CHECK(!path.empty(), op_, ": the path is empty");
  const SaveTarget target = save_target(path, op_.c_str());  // Note [Saving over what is there]
  target_ = target.path;
  existed_ = target.exists;
  remove_stale_temporaries(target_);
  // The replaced file's permission bits, else 0644 as any new file (umask applies); mkstemp's
  // 0600 would change what saves make.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    temp_ = target_ + kTempInfix + std::to_string(::getpid()) + "." + hex(random_u64());
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode_t(target.mode));
    if (fd_ < 0 && (errno != EEXIST || attempt == 100)) fail("create", temp_);
  }
  if (existed_) ::fchmod(fd_, mode_t(target.mode));  // the old file's bits, past the umask
  ::flock(fd_, LOCK_EX);  // uncontended: the file is new. Unsupported (ENOLCK): cleaners skip it
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) ::unlink(temp_.c_str());  // still locked: no cleaner can be looking at it
  if (fd_ >= 0) ::close(fd_);
}

void AtomicFileWriter::write(const void* data, size_t n) {
  FRUGAL_CHECK(!committed_, op_, ": write after commit(): ", path_, " was written already");
  if (buffer_.size() + n > kBufferBytes) flush();
  if (n >= kBufferBytes) {
    write_all(data, n);
  } else {
    const auto* bytes = static_cast<const uint8_t*>(data);
    buffer_.insert(buffer_.end(), bytes, bytes + n);
  }
}

void AtomicFileWriter::commit() {
  FRUGAL_CHECK(!committed_, op_, ": commit() twice: ", path_, " was written already");
  flush();
  if (::fsync(fd_) != 0) fail("fsync", temp_);
  // Renamed while still open, so still locked: see Note [Temporary files of a save].
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("rename", temp_, target_);
  committed_ = true;
  // The data is fsynced; a close error now (NFS reports deferred write errors at close)
  // cannot mean lost bytes, and the file is in place already.
  ::close(fd_);
  fd_ = -1;
  // Make the rename itself durable. A directory that cannot be opened or synced (some
  // filesystems) is not an error.
  const int dfd = ::open(split_path(target_).first.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void AtomicFileWriter::fail(ErrorSite step, const std::string& file, const std::string& to) const {
  const int err = errno;
  detail::throw_error(
      step, detail::str_cat(op_, ": cannot ", step.text, " ", file, to.empty() ? "" : " to ", to, ": ",
                            std::strerror(err), "; ", path_, existed_ ? " is unchanged" : " was not created"));
}

void AtomicFileWriter::flush() {
  write_all(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFileWriter::write_all(const void* data, size_t n) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, bytes, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write", temp_);
    bytes += w;
    n -= size_t(w);
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& op) {
  AtomicFileWriter file(path, op);
  file.write(bytes);
  file.commit();
}

}  // namespace frugal::nn
