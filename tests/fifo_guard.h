#pragma once
// Tests that a reader refuses a FIFO without blocking in open(): a reader that does block
// is released by a watchdog (which opens the write end after a timeout), so such a test
// fails instead of hanging the suite.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace frugal::testing {

/// Makes a FIFO at `path` and runs `body` (which should throw on it); returns false if
/// `body` blocked for `timeout` and the watchdog had to unblock it.
inline bool returns_without_blocking_on_fifo(const std::string& path, const std::function<void()>& body,
                                             std::chrono::seconds timeout = std::chrono::seconds(10)) {
  if (::mkfifo(path.c_str(), 0600) != 0) return false;
  std::mutex m;
  std::condition_variable cv;
  bool done = false, fired = false;
  std::thread watchdog([&] {
    std::unique_lock lock(m);
    if (cv.wait_for(lock, timeout, [&] { return done; })) return;
    fired = true;
    // A reader blocked in open(O_RDONLY) returns once a writer opens; O_NONBLOCK fails
    // (ENXIO) while no reader is there, so this never blocks the watchdog itself.
    while (!done) {
      lock.unlock();
      const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      lock.lock();
    }
  });
  struct Finish {  // also when body throws
    std::mutex& m;
    std::condition_variable& cv;
    bool& done;
    std::thread& watchdog;
    ~Finish() {
      {
        std::lock_guard lock(m);
        done = true;
      }
      cv.notify_all();
      watchdog.join();
    }
  };
  {
    Finish finish{m, cv, done, watchdog};
    body();
  }
  return !fired;
}

}  // namespace frugal::testing
