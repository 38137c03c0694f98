#pragma once
// Errors. Every failure in frugal throws frugal::Error with a message that names
// the op, the shapes, the dtypes and the devices involved (docs/design.md, "Errors").
#include <sstream>
#include <stdexcept>
#include <string>

namespace frugal {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by the allocator when a request cannot be met even after freeing its cache.
/// The allocator stays consistent: free tensors and go on.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace frugal

/// FRUGAL_CHECK(cond, "matmul: ", a.shape(), " vs ", b.shape()) throws frugal::Error
/// with the streamed message when cond is false.
#define FRUGAL_CHECK(cond, ...)                                                                  \
  do {                                                                                           \
    if (!(cond)) [[unlikely]]                                                                    \
      ::frugal::detail::throw_error(__FILE__, __LINE__, ::frugal::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define FRUGAL_FAIL(...) ::frugal::detail::throw_error(__FILE__, __LINE__, ::frugal::detail::str_cat(__VA_ARGS__))
