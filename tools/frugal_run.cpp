// frugal-run: starts N local ranks of a program, as torchrun --standalone does.
//
//   frugal-run --nproc 2 [--master-port P] [--log-dir DIR] prog args...
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT (a free port unless given). Output lines are prefixed "[rank r] ", or
// go to DIR/rank_r.log with --log-dir. When a rank exits non-zero (or is killed),
// the others are stopped (SIGTERM, then SIGKILL after 5 s) so nothing hangs, and
// frugal-run reports which rank failed and exits with its code (128 + signal when
// it was killed by a signal). Exit 0 when every rank exits 0.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "examples/flags.h"

namespace {

struct Rank {
  pid_t pid = -1;
  int out = -1;         // read end of the rank's stdout+stderr pipe (-1 when done or logging to a file)
  std::string partial;  // an unfinished output line
  bool exited = false;
  int status = 0;
};

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

int usage() {
  std::fprintf(stderr, "usage: frugal-run --nproc N [--master-port P] [--log-dir DIR] prog args...\n");
  return 2;
}

// A port nobody listens on now (the kernel's choice of a free ephemeral port).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 29500;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

void emit(int rank, const std::string& line) {
  std::string s = "[rank " + std::to_string(rank) + "] " + line + "\n";
  (void)!::write(STDOUT_FILENO, s.data(), s.size());
}

// Reads what rank r wrote; prints whole lines with their prefix. False at EOF.
bool pump(int r, Rank& rank) {
  char buf[4096];
  const ssize_t n = ::read(rank.out, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!rank.partial.empty()) emit(r, rank.partial);
    rank.partial.clear();
    ::close(rank.out);
    rank.out = -1;
    return false;
  }
  rank.partial.append(buf, size_t(n));
  size_t start = 0, nl;
  while ((nl = rank.partial.find('\n', start)) != std::string::npos) {
    emit(r, rank.partial.substr(start, nl - start));
    start = nl + 1;
  }
  rank.partial.erase(0, start);
  return true;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string how(int status) {
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "exited with code " + std::to_string(exit_code(status));
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0, port = 0, i = 1;
  std::string log_dir;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    try {
      if (a == "--nproc" || a == "--nproc-per-node" || a == "--nproc_per_node")
        nproc = int(frugal::cli::expect(frugal::cli::parse_int(v, 1, 4096), a, v, "an integer in [1, 4096]"));
      else if (a == "--master-port" || a == "--master_port")
        port = int(frugal::cli::expect(frugal::cli::parse_int(v, 1, 65535), a, v, "a port in [1, 65535]"));
      else if (a == "--log-dir") log_dir = v;
      else return usage();
    } catch (const frugal::cli::UsageError& e) {
      std::fprintf(stderr, "frugal-run: %s\n", e.what());
      return usage();
    }
  }
  if (nproc < 1 || i >= argc) return usage();
  if (port == 0) port = free_port();

  std::vector<Rank> ranks(static_cast<size_t>(nproc));
  for (int r = 0; r < nproc; ++r) {
    int fds[2] = {-1, -1};
    if (log_dir.empty() && ::pipe(fds) != 0) {
      std::perror("frugal-run: pipe");
      return 1;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("frugal-run: fork");
      return 1;
    }
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: stopping a rank stops what it started too
      int out = fds[1];
      if (!log_dir.empty()) {
        const std::string path = log_dir + "/rank_" + std::to_string(r) + ".log";
        out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out < 0) {
          std::fprintf(stderr, "frugal-run: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
          _exit(127);
        }
      } else {
        ::close(fds[0]);
      }
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
      ::close(out);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::execvp(argv[i], argv + i);
      std::fprintf(stderr, "frugal-run: cannot run %s: %s\n", argv[i], std::strerror(errno));
      _exit(127);
    }
    ::setpgid(pid, pid);
    ranks[size_t(r)].pid = pid;
    if (log_dir.empty()) {
      ::close(fds[1]);
      ranks[size_t(r)].out = fds[0];
    }
  }
  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);

  int failed = -1;  // the first rank that failed
  int running = nproc;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto stop_all = [&](int sig) {
    for (auto& rk : ranks)
      if (!rk.exited) ::kill(-rk.pid, sig);
  };
  while (running > 0) {
    std::vector<pollfd> fds;
    std::vector<int> owner;
    for (int r = 0; r < nproc; ++r)
      if (ranks[size_t(r)].out >= 0) fds.push_back({ranks[size_t(r)].out, POLLIN, 0}), owner.push_back(r);
    if (!fds.empty()) {
      if (::poll(fds.data(), fds.size(), 50) > 0)
        for (size_t k = 0; k < fds.size(); ++k)
          if (fds[k].revents) pump(owner[k], ranks[size_t(owner[k])]);
    } else {
      ::usleep(20000);
    }
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (int r = 0; r < nproc; ++r) {
        Rank& rk = ranks[size_t(r)];
        if (rk.pid != pid || rk.exited) continue;
        rk.exited = true, rk.status = status, --running;
        if (exit_code(status) != 0 && failed < 0 && !stopping) {
          failed = r;
          std::fprintf(stderr, "frugal-run: rank %d %s; stopping the other ranks\n", r, how(status).c_str());
        }
      }
    }
    if (g_signal && !stopping) {
      std::fprintf(stderr, "frugal-run: got signal %d; stopping the ranks\n", int(g_signal));
      if (failed < 0) failed = -2;
    }
    if ((failed != -1) && !stopping && running > 0) {
      stopping = true;
      stop_all(SIGTERM);
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      stop_all(SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
  }
  // Drain what the ranks wrote last (their pipes may outlive them a moment).
  for (int r = 0; r < nproc; ++r)
    while (ranks[size_t(r)].out >= 0) {
      pollfd p{ranks[size_t(r)].out, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) {
        ::close(ranks[size_t(r)].out);
        ranks[size_t(r)].out = -1;
        break;
      }
      pump(r, ranks[size_t(r)]);
    }
  if (failed == -2) return 130;
  if (failed >= 0) {
    std::fprintf(stderr, "frugal-run: FAILED: rank %d %s\n", failed, how(ranks[size_t(failed)].status).c_str());
    return exit_code(ranks[size_t(failed)].status);
  }
  return 0;
}
