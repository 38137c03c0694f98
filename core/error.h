#pragma once
// Errors. Every failure in frugal throws frugal::Error with a message that names
// the op, the shapes, the dtypes and the devices involved (docs/design.md, "Errors").
//
// Note [Error locations]
// An error ends in "  [file.cpp:line]", where it was detected: the message is for
// users, the location for us. FRUGAL_CHECK records the line of the check itself, so
// a helper that throws on its callers' behalf (a parser's fail(), a reader's
// bad_file()) would give every error the helper's own line: all safetensors errors
// once ended in the same "[safetensors.cpp:83]". Such a helper takes its first
// message piece as an ErrorSite, whose defaulted __builtin_FILE() and __builtin_LINE()
// are evaluated at the call, and throws with throw_error(site, ...): the location then
// names the check that failed. (std::source_location would do the same, but clang
// before 15 cannot compile libstdc++'s, and the fuzz targets are built with clang 14.)
// A caller that adds context to an error it caught (the file it was reading) rethrows
// with rethrow_with_context, which keeps the first location and the error's type.
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace frugal {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what), message_size_(what.size()) {}
  /// what() is `message` + "  [" + `location` + "]".
  Error(const std::string& message, std::string_view location)
      : std::runtime_error(message + "  [" + std::string(location) + "]"), message_size_(message.size()) {}
  /// The message without the trailing "  [file:line]".
  std::string_view message() const { return std::string_view(what(), message_size_); }
  /// "file.cpp:line", or "" when the error was made without one.
  std::string_view location() const {
    const std::string_view all(what());
    return all.size() > message_size_ + 3 ? all.substr(message_size_ + 3, all.size() - message_size_ - 4) : "";
  }

 private:
  size_t message_size_;  // a size, not a second string: copying an exception must not throw
};

/// Thrown by the allocator when a request cannot be met even after freeing its cache.
/// The allocator stays consistent: free tensors and go on.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

/// The first piece of an error message and where the error was detected (see
/// Note [Error locations]): `void fail(ErrorSite first, const Args&... rest)`.
struct ErrorSite {
  std::string_view text;
  const char* file;
  int line;
  ErrorSite(const char* t, const char* f = __builtin_FILE(), int l = __builtin_LINE()) : text(t), file(f), line(l) {}
  ErrorSite(std::string_view t, const char* f = __builtin_FILE(), int l = __builtin_LINE())
      : text(t), file(f), line(l) {}
  ErrorSite(const std::string& t, const char* f = __builtin_FILE(), int l = __builtin_LINE())
      : text(t), file(f), line(l) {}
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
/// Throws `msg` located where `site` was made (see Note [Error locations]).
[[noreturn]] void throw_error(const ErrorSite& site, const std::string& msg);
}  // namespace detail

/// Throws `e` again (as an OutOfMemoryError if it was one) with `context` before its
/// message and its original location: "load_safetensors: w.st: " + "JSON: ...".
[[noreturn]] void rethrow_with_context(const Error& e, const std::string& context);

}  // namespace frugal

/// FRUGAL_CHECK(cond, "matmul: ", a.shape(), " vs ", b.shape()) throws frugal::Error
/// with the streamed message when cond is false.
#define FRUGAL_CHECK(cond, ...)                                                                  \
  do {                                                                                           \
    if (!(cond)) [[unlikely]]                                                                    \
      ::frugal::detail::throw_error(__FILE__, __LINE__, ::frugal::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define FRUGAL_FAIL(...) ::frugal::detail::throw_error(__FILE__, __LINE__, ::frugal::detail::str_cat(__VA_ARGS__))
