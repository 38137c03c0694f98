#include "memory/error.h"

#include <cstring>

namespace frugal::detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  // Only the file's base name: the message is for users, the line for us.
  const char* base = std::strrchr(file, '/');
  throw Error(str_cat(msg, "  [", base ? base + 1 : file, ":", line, "]"));
}

}  // namespace frugal::detail
