#pragma once
// A pid that names a killed writer's leftover (Note [Temporary files of a save]).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

namespace frugal::testing {

/// A pid that no process has now: a child that exited and was reaped (the kernel hands pids
/// out in increasing order, so it is not reused within a test).
inline pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return pid;
}

}  // namespace frugal::testing
