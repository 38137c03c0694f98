// frugal-run: starts the ranks of a program on this host, as torchrun does.
//
//   frugal-run --nproc 2 [--master-port P] [--log-dir DIR] prog args...      # one host
//   frugal-run --nnodes 2 --node-rank R --master-addr HOST --master-port P
//              --nproc-per-node K prog args...    # on each host, R = 0 and 1
//
// --nproc is --nproc-per-node (K, default 1). Rank `local` of node R gets RANK = R * K +
// local, WORLD_SIZE = N * K, LOCAL_RANK = local, LOCAL_WORLD_SIZE = K, GROUP_RANK and
// NODE_RANK = R, MASTER_ADDR (default 127.0.0.1) and MASTER_PORT (a free port on one
// node; several nodes must agree on one, so --nnodes > 1 needs --master-addr and
// --master-port). Output lines are prefixed "[rank r] " (global ranks), or go to
// DIR/rank_r.log with --log-dir. When a local rank exits non-zero (or is killed), the
// others on this node are stopped (SIGTERM, then SIGKILL after 5 s) so nothing hangs,
// and frugal-run reports which rank failed and exits with its code (128 + signal when it
// was killed by a signal). The ranks on other nodes see its connections close and fail
// in turn (Note [TCP backend] in parallel/tcp_communicator.h). Exit 0 when every local
// rank exits 0. With K > 1 and OMP_NUM_THREADS unset, each rank gets OMP_NUM_THREADS =
// (the cores its affinity allows) / K, so CPU ranks do not oversubscribe the host.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
  // When its output ended (it exits then): of several ranks that fail at once, the one
  // whose output ended first is the root cause, the others failed because of it.
  std::chrono::steady_clock::time_point eof_at = std::chrono::steady_clock::time_point::max();
};

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

const char* kUsage =
    "usage: frugal-run [--nnodes N --node-rank R --master-addr HOST --master-port P]\n"
    "                  --nproc-per-node K (or --nproc K) [--log-dir DIR] prog args...\n";

int usage() {
  std::fputs(kUsage, stderr);
  return 2;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "frugal-run: %s\n", message.c_str());
  return usage();
}

// The cores this process may run on: its affinity mask (a Slurm cpuset or a container's
// limit), not every core the machine has online.
long usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
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
    rank.eof_at = std::chrono::steady_clock::now();
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
  int nproc = 1, port = 0, nnodes = 1, node_rank = 0, i = 1;
  std::string log_dir, master_addr;
  bool node_rank_given = false;
  std::vector<std::string> given;  // the options read so far, by their canonical names
  for (; i < argc && argv[i][0] == '-'; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") return std::fputs(kUsage, stdout), 0;
    if (i + 1 >= argc) return usage_error(a + " needs a value");
    const std::string v = argv[++i];
    // --nproc_per_node is torchrun's spelling of --nproc-per-node, and --nproc ours: one option.
    std::string name = a == "--nproc" ? "--nproc-per-node" : a;
    std::replace(name.begin(), name.end(), '_', '-');
    if (std::find(given.begin(), given.end(), name) != given.end())
      return usage_error(a + ": given twice");  // see Note [A flag given twice] in examples/flags.h
    given.push_back(name);
    try {
      using frugal::cli::expect, frugal::cli::parse_int;
      if (a == "--nproc" || a == "--nproc-per-node" || a == "--nproc_per_node")
        nproc = int(expect(parse_int(v, 1, 4096), a, v, "an integer in [1, 4096]"));
      else if (a == "--nnodes") nnodes = int(expect(parse_int(v, 1, 65536), a, v, "an integer in [1, 65536]"));
      else if (a == "--node-rank" || a == "--node_rank")
        node_rank = int(expect(parse_int(v, 0, 65535), a, v, "an integer in [0, 65535]")), node_rank_given = true;
      else if (a == "--master-addr" || a == "--master_addr") master_addr = v;
      else if (a == "--master-port" || a == "--master_port")
        port = int(expect(parse_int(v, 1, 65535), a, v, "a port in [1, 65535]"));
      else if (a == "--log-dir") log_dir = v;
      else return usage_error("unknown option " + a);
    } catch (const frugal::cli::UsageError& e) { return usage_error(e.what()); }
  }
  if (i >= argc) return usage_error("no program to run");
  if (node_rank >= nnodes)
    return usage_error("--node-rank " + std::to_string(node_rank) + " must be below --nnodes " +
                       std::to_string(nnodes));
  if (nnodes > 1 && (port == 0 || master_addr.empty() || !node_rank_given))
    return usage_error("--nnodes " + std::to_string(nnodes) +
                       " needs --node-rank, --master-addr and --master-port: every node must name the same master "
                       "(the host of node 0) and port");
  if (!log_dir.empty()) {  // checked here, not by each rank after it has started
    struct stat st {};
    std::string why;
    if (::stat(log_dir.c_str(), &st) != 0) why = std::strerror(errno);
    else if (!S_ISDIR(st.st_mode)) why = "not a directory";
    else if (::access(log_dir.c_str(), W_OK | X_OK) != 0) why = std::strerror(errno);
    if (!why.empty()) return usage_error("--log-dir: cannot write into '" + log_dir + "' (" + why + ")");
  }
  if (master_addr.empty()) master_addr = "127.0.0.1";
  if (port == 0) port = free_port();
  const int world_size = nnodes * nproc, first_rank = node_rank * nproc;

  std::vector<Rank> ranks(static_cast<size_t>(nproc));
  for (int r = 0; r < nproc; ++r) {
    const int global = first_rank + r;
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
        const std::string path = log_dir + "/rank_" + std::to_string(global) + ".log";
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
      ::setenv("RANK", std::to_string(global).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
      ::setenv("NODE_RANK", std::to_string(node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      // K ranks sharing this host's cores: each gets its share of OpenMP threads unless told
      // (torchrun sets 1; a CPU rank computing alone wants its share).
      if (nproc > 1 && !std::getenv("OMP_NUM_THREADS"))
        ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1L, usable_cores() / nproc)).c_str(), 1);
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

  int failed = -1;        // the first rank that failed
  int first_failed = -1;  // of the failed ranks reaped so far, the one whose output ended first
  // Failures within kBlameWindow of the first are compared before one is blamed (below).
  constexpr auto kBlameWindow = std::chrono::milliseconds(300);
  auto blame_deadline = std::chrono::steady_clock::time_point::max();
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
          if (fds[k].revents) pump(first_rank + owner[k], ranks[size_t(owner[k])]);
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
        if (exit_code(status) != 0 && (first_failed < 0 || rk.eof_at < ranks[size_t(first_failed)].eof_at))
          first_failed = r;
        if (exit_code(status) != 0 && blame_deadline == std::chrono::steady_clock::time_point::max())
          blame_deadline = std::chrono::steady_clock::now() + kBlameWindow;
      }
    }
    // A rank that dies takes its connections down first and exits a moment later, so a peer
    // that fails on the broken connection can be reaped before it (more so on a loaded
    // machine): the failures of a short window are compared before one is blamed.
    const bool blame_now = first_failed >= 0 && (running == 0 || std::chrono::steady_clock::now() >= blame_deadline);
    if (blame_now && failed < 0 && !stopping) {
      failed = first_failed;
      std::fprintf(stderr, "frugal-run: rank %d %s; stopping the other ranks\n", first_rank + failed,
                   how(ranks[size_t(failed)].status).c_str());
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
      pump(first_rank + r, ranks[size_t(r)]);
    }
  if (failed == -2) return 130;
  if (failed >= 0) {
    std::fprintf(stderr, "frugal-run: FAILED: rank %d %s\n", first_rank + failed,
                 how(ranks[size_t(failed)].status).c_str());
    return exit_code(ranks[size_t(failed)].status);
  }
  return 0;
}
