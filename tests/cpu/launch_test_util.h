#pragma once
// Helpers of the tests that start processes (test_launch.cpp, test_process_backends.cpp):
// a shell command's exit code and output, and the programs built next to the test binary.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

namespace frugal::testing {

/// Runs a shell command; returns its exit code and stdout+stderr.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

/// A program of the build tree, by its path under the build root ("tools/frugal-run").
inline std::string built_program(const std::string& relative) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe");  // build/tests/frugal_cpu_tests
  const auto path = self.parent_path().parent_path() / relative;
  REQUIRE_MESSAGE(std::filesystem::exists(path), path.string(), " missing: build it (ninja -C build ", relative, ")");
  return path.string();
}

/// tools/frugal-run next to this test binary in the build tree.
inline std::string frugal_run_path() { return built_program("tools/frugal-run"); }

}  // namespace frugal::testing
