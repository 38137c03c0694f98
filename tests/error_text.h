#pragma once
// Error-message checks for tests whose failures are std::exceptions from other threads
// or processes (check_error in test_util.h covers a frugal::Error thrown in place).
#include <doctest/doctest.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace frugal::testing {

/// The message of the exception `fn` throws ("" when it does not).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) { return e.what(); }
  return "";
}

/// `text` is not empty and contains every one of `parts`.
inline void check_contains(const std::string& text, const std::vector<std::string>& parts) {
  REQUIRE_MESSAGE(!text.empty(), "expected an error or output, got none");
  for (const auto& p : parts) CHECK_MESSAGE(text.find(p) != std::string::npos, "'", text, "' lacks '", p, "'");
}

}  // namespace frugal::testing
