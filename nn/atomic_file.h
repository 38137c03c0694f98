#pragma once
// Writing a file whole or not at all: every file frugal saves (safetensors checkpoints, the
// index of a sharded checkpoint, a metrics log rewritten on resume) is written here.
//
// Note [Temporary files of a save]
// Every atomic write of the library goes through AtomicFileWriter (save_safetensors, the
// index.json of save_sharded_checkpoint, MetricsLog's truncate_after). It writes
// `path.tmp.<pid>.<random>` in path's directory, fsyncs it, renames it over `path` and
// fsyncs the directory: rename is atomic, so readers see the old file or the new one, and a
// failed write never touches the old one. What is at `path` is checked first, a symbolic link
// is written through and a replaced file keeps its permission bits (Note [Saving over what is
// there] in nn/file.h). The name is unique per write (pid and 64 random bits, created with
// O_EXCL), so two threads or processes writing the same path never share a temporary: each
// rename installs a complete file and the last one wins.
//
// A write that is killed leaves its temporary behind; the next write of the same path
// removes such leftovers. A leftover is only removed when two independent signs say
// its writer is gone, so a live write can never lose its file:
//   1. the pid in its name is not alive here (kill(pid, 0) fails with ESRCH). A live
//      writer's pid always is, unless it runs in another pid namespace (a container
//      sharing the directory); a recycled pid only keeps a leftover longer;
//   2. flock(LOCK_EX | LOCK_NB) on it succeeds. Every writer holds an exclusive flock on
//      its temporary from creation until after the rename, and the kernel drops it when
//      the writer dies, however it dies. Where flock is unsupported the lock attempt
//      fails, and nothing is removed.
// Only regular files whose name is exactly `<name of path>.tmp.<digits>.<16 hex digits>`
// are considered, and the name must still be the file that was locked when it is
// unlinked. Cleaning is best effort: it never fails a write.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace frugal::nn {

/// A file written through a locked temporary that commit() renames over `path` (see Note
/// [Temporary files of a save]); destroyed without commit(), it removes the temporary and
/// `path` stays as it was. Errors read "<op>: cannot <step> <temporary>: <reason>; <path> is
/// unchanged" (or "was not created" when nothing was there). Not copyable or movable.
class AtomicFileWriter {
 public:
  /// Checks what is at `path` (save_target), removes leftovers of killed writes of it and
  /// creates the temporary. Throws frugal::Error starting with `op`.
  AtomicFileWriter(const std::string& path, std::string op);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  /// Appends bytes; small pieces (a header, small tensors) are buffered into few large writes.
  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  /// Flushes, fsyncs, renames the temporary over the path and fsyncs the directory.
  void commit();

  /// `path.tmp.<pid>.<16 hex digits>` beside the file written (a link's target).
  const std::string& temporary_path() const { return temp_; }

 private:
  // Throws for the system call that just failed, while errno still describes it.
  [[noreturn]] void fail(ErrorSite step, const std::string& file, const std::string& to = "") const;
  void flush();
  void write_all(const void* data, size_t n);

  std::string path_;    // as given: what the error messages name
  std::string target_;  // what is replaced: path_, or the target of the link at path_
  std::string temp_;
  std::string op_;
  bool existed_ = false;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<uint8_t> buffer_;
};

/// Replaces `path` by `bytes` through an AtomicFileWriter: all of them or, on an error
/// (thrown naming `op`), the file as it was.
void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& op);

}  // namespace frugal::nn
