#include "core/error.h"

#include <cstring>

namespace frugal {

namespace detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  // Only the file's base name: the message is for users, the line for us.
  const char* base = std::strrchr(file, '/');
  throw Error(msg, str_cat(base ? base + 1 : file, ":", line));
}

[[noreturn]] void throw_error(const ErrorSite& site, const std::string& msg) { throw_error(site.file, site.line, msg); }

}  // namespace detail

[[noreturn]] void rethrow_with_context(const Error& e, const std::string& context) {
  const std::string message = context + std::string(e.message());
  if (dynamic_cast<const OutOfMemoryError*>(&e)) throw OutOfMemoryError(message, e.location());
  throw Error(message, e.location());
}

}  // namespace frugal
