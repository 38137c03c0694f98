// Rendezvous and launch: the TCP store across threads and forked processes, the
// process environment init_process_group reads, and frugal-run (its environment,
// its output prefixes, and stopping every rank when one fails).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "parallel/init.h"
#include "parallel/tcp_store.h"
#include "tests/cpu/launch_test_util.h"
#include "tests/error_text.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::parallel;
using namespace std::chrono_literals;
using frugal::detail::str_cat;
using frugal::testing::check_contains;
using frugal::testing::error_of;
using frugal::testing::frugal_run_path;
using frugal::testing::run_command;

TEST_CASE("tcp_store: set, waiting get and add across rank threads") {
  TcpStore server("127.0.0.1", 0, /*serve=*/true, 10s);
  const int n = 4, port = server.port();
  std::vector<std::string> seen(n);
  std::vector<int64_t> counts(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      TcpStore store("127.0.0.1", port, false, 10s);
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * (n - r)));  // later ranks set first
      store.set("key" + std::to_string(r), std::string(size_t(r + 1), char('a' + r)));
      for (int q = 0; q < n; ++q) seen[size_t(r)] += store.get("key" + std::to_string(q)) + "|";
      counts[size_t(r)] = store.add("arrived", 1);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) CHECK(seen[size_t(r)] == "a|bb|ccc|dddd|");
  std::sort(counts.begin(), counts.end());
  CHECK(counts == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(server.add("arrived", 10) == 14);
  CHECK(server.add("fresh", -3) == -3);
}

TEST_CASE("tcp_store: a get nobody answers times out naming the key; clients wait for a late server") {
  TcpStore server("127.0.0.1", 0, true, 200ms);
  const auto start = std::chrono::steady_clock::now();
  check_contains(error_of([&] { server.get("nccl_unique_id"); }),
                 {"tcp_store get 'nccl_unique_id'", "timed out after 200 ms"});
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  check_contains(error_of([&] { server.get("other"); }), {"connection failed earlier"});

  int port = 0;
  { port = TcpStore("127.0.0.1", 0, true, 1s).port(); }  // a port that was free a moment ago
  std::string got;
  std::thread client([&] {
    TcpStore store("127.0.0.1", port, false, 10s);  // retries until the server below is up
    got = store.get("ready");
  });
  std::this_thread::sleep_for(300ms);
  TcpStore late("127.0.0.1", port, true, 10s);
  late.set("ready", "yes");
  client.join();
  CHECK(got == "yes");
  check_contains(error_of([] { TcpStore("127.0.0.1", 1, false, 100ms); }), {"no server at 127.0.0.1:1", "MASTER_PORT"});
}

TEST_CASE("tcp_store: rendezvous across forked processes") {
  TcpStore server("127.0.0.1", 0, true, 20s);
  const int n = 3, port = server.port();
  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // a rank: publish its pid, read the others', count in
      int code = 1;
      try {
        TcpStore store("127.0.0.1", port, false, 20s);
        store.set("pid" + std::to_string(r), std::to_string(::getpid()));
        bool ok = true;
        for (int q = 0; q < n; ++q) ok = ok && !store.get("pid" + std::to_string(q)).empty();
        store.add("done", 1);
        code = ok ? 0 : 2;
      } catch (...) { code = 3; }
      _exit(code);
    }
    children.push_back(pid);
  }
  std::vector<std::string> pids;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    ::waitpid(children[size_t(r)], &status, 0);
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "rank ", r, " status ", status);
    pids.push_back(server.get("pid" + std::to_string(r)));
    CHECK(pids.back() == std::to_string(children[size_t(r)]));
  }
  CHECK(server.add("done", 0) == n);
}

namespace {

const char* const kLaunchVariables[] = {"RANK",
                                        "WORLD_SIZE",
                                        "LOCAL_RANK",
                                        "MASTER_ADDR",
                                        "MASTER_PORT",
                                        "OMPI_COMM_WORLD_RANK",
                                        "OMPI_COMM_WORLD_SIZE",
                                        "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "SLURM_PROCID",
                                        "SLURM_NTASKS",
                                        "SLURM_LOCALID",
                                        "SLURM_JOB_ID",
                                        "SLURM_STEP_NODELIST",
                                        "SLURM_JOB_NODELIST"};

// Unsets every variable read_process_env reads, now and again when the test ends.
struct CleanLaunchEnv {
  CleanLaunchEnv() { clear(); }
  ~CleanLaunchEnv() { clear(); }
  static void clear() {
    for (const char* v : kLaunchVariables) ::unsetenv(v);
  }
};

}  // namespace

TEST_CASE("init_process_group: the environment it needs, and a clear error without it") {
  CleanLaunchEnv clean;
  check_contains(error_of([] { read_process_env(); }), {"RANK, WORLD_SIZE, MASTER_PORT not set", "frugal-run"});
  ::setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  ::setenv("MASTER_PORT", "29555", 1);
  const ProcessEnv env = read_process_env();
  CHECK(env.rank == 3);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.master_addr == "127.0.0.1");
  CHECK(env.master_port == 29555);
  ::setenv("RANK", "5", 1);  // RANK wins over the mpirun variable, and must be below WORLD_SIZE
  check_contains(error_of([] { read_process_env(); }), {"RANK 5 out of range for WORLD_SIZE 4"});
  ::setenv("RANK", "x1", 1);
  check_contains(error_of([] { read_process_env(); }), {"RANK='x1'"});
#ifndef FRUGAL_WITH_CUDA
  ::setenv("RANK", "0", 1);
  check_contains(error_of([] { init_process_group({.backend = Backend::Nccl}); }),
                 {"built without CUDA", "tcp backend", "run_ranks"});
#endif
#ifndef FRUGAL_WITH_MPI
  check_contains(error_of([] { init_process_group({.backend = Backend::Mpi}); }), {"built without MPI", "tcp"});
#endif
  check_contains(error_of([] { process_store(); }), {"init_process_group first"});
}

TEST_CASE("read_process_env: Slurm's variables, after explicit and mpirun's ones; the master from the node list") {
  CleanLaunchEnv clean;
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_JOB_ID", "123456", 1);
  ::setenv("SLURM_JOB_NODELIST", "gpu[3-4],login", 1);
  ::setenv("SLURM_STEP_NODELIST", "node[07-08,11],gpu5", 1);
  ProcessEnv env = read_process_env();
  CHECK(env.rank == 5);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.master_addr == "node07");              // the step's first host, not the job's
  CHECK(env.master_port == kSlurmBasePort + 456);  // 123456 % 1000: no MASTER_PORT set
  ::unsetenv("SLURM_STEP_NODELIST");
  CHECK(read_process_env().master_addr == "gpu3");
  ::setenv("MASTER_ADDR", "head", 1);
  ::setenv("MASTER_PORT", "29600", 1);
  env = read_process_env();
  CHECK(env.master_addr == "head");
  CHECK(env.master_port == 29600);
  // mpirun's variables come before Slurm's, explicit ones before both.
  ::setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  env = read_process_env();
  CHECK(env.rank == 2);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);  // SLURM_LOCALID: mpirun set no local rank here
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  env = read_process_env();
  CHECK(env.rank == 0);
  CHECK(env.world_size == 2);
  CHECK(env.local_rank == 0);
  ::setenv("SLURM_JOB_ID", "x", 1);  // a malformed variable is named
  ::unsetenv("MASTER_PORT");
  check_contains(error_of([] { read_process_env(); }), {"SLURM_JOB_ID='x'"});
}

TEST_CASE("first_host_of_nodelist: compressed Slurm host lists") {
  CHECK(first_host_of_nodelist("node[01-04,07],gpu5") == "node01");
  CHECK(first_host_of_nodelist("gpu5,node[01-04]") == "gpu5");
  CHECK(first_host_of_nodelist("node7") == "node7");
  CHECK(first_host_of_nodelist("n[9,3-4]") == "n9");
  CHECK(first_host_of_nodelist("rack[2-3]-node[010-012]") == "rack2-node010");
  CHECK(first_host_of_nodelist("a-b[5]") == "a-b5");
  check_contains(error_of([] { first_host_of_nodelist("node[01-04"); }), {"unmatched '['", "node[01-04"});
  check_contains(error_of([] { first_host_of_nodelist("node]1"); }), {"unmatched ']'"});
  check_contains(error_of([] { first_host_of_nodelist(""); }), {"no host"});
}

TEST_CASE("init_process_group: backends by name, and auto's choice") {
  CHECK(parse_backend("nccl") == Backend::Nccl);
  CHECK(parse_backend("tcp") == Backend::Tcp);
  CHECK(parse_backend("gloo") == Backend::Tcp);  // what a PyTorch user types
  CHECK(parse_backend("mpi") == Backend::Mpi);
  CHECK(parse_backend("auto") == Backend::Auto);
  check_contains(error_of([] { parse_backend("ucc"); }), {"unknown backend 'ucc'", "auto, nccl, tcp (or gloo) or mpi"});
  CHECK(resolve_backend(Backend::Mpi) == Backend::Mpi);
  CHECK(resolve_backend(Backend::Auto) == (cuda_device_count() > 0 ? Backend::Nccl : Backend::Tcp));
}

TEST_CASE("frugal-run: starts N ranks with their environment and prefixes their output") {
  const auto [code, out] = run_command(frugal_run_path() +
                                       " --nproc 3 --master-port 29411 sh -c "
                                       "'echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK a=$MASTER_ADDR p=$MASTER_PORT\"'");
  CHECK(code == 0);
  for (int r = 0; r < 3; ++r)
    check_contains(out, {str_cat("[rank ", r, "] r=", r, " w=3 l=", r, " a=127.0.0.1 p=29411")});
  // Without --master-port every rank still gets the same port.
  const auto [code2, out2] = run_command(frugal_run_path() + " --nproc 2 sh -c 'echo port=$MASTER_PORT'");
  CHECK(code2 == 0);
  const auto at = out2.find("port=");
  REQUIRE(at != std::string::npos);
  const std::string port = out2.substr(at, out2.find('\n', at) - at);
  check_contains(out2, {"[rank 0] " + port, "[rank 1] " + port});
  CHECK(run_command(frugal_run_path() + " --nproc 0 true").first == 2);
}

TEST_CASE("frugal-run: multi-node ranks and environment, and usage errors for bad combinations") {
  const std::string run = frugal_run_path();
  const auto [code, out] =
      run_command(run +
                  " --nnodes 3 --node-rank 2 --master-addr 10.1.2.3 --master-port 29412 "
                  "--nproc-per-node 2 sh -c 'echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK "
                  "lw=$LOCAL_WORLD_SIZE g=$GROUP_RANK n=$NODE_RANK a=$MASTER_ADDR:$MASTER_PORT\"'");
  CHECK(code == 0);
  for (int local = 0; local < 2; ++local)
    check_contains(
        out, {str_cat("[rank ", 4 + local, "] r=", 4 + local, " w=6 l=", local, " lw=2 g=2 n=2 a=10.1.2.3:29412")});
  const std::pair<std::string, std::vector<std::string>> bad[] = {
      {"--nnodes 2 --node-rank 0 --master-addr 127.0.0.1 true", {"--nnodes 2 needs", "--master-port"}},
      {"--nnodes 2 --master-addr 127.0.0.1 --master-port 29413 true", {"--nnodes 2 needs --node-rank"}},
      {"--nnodes 2 --node-rank 2 --master-addr h --master-port 29413 true", {"--node-rank 2 must be below --nnodes 2"}},
      {"--nproc-per-node 2 --bogus 1 true", {"unknown option --bogus"}},
      {"--nproc 2", {"no program to run"}},
      {"--nnodes 0 true", {"--nnodes", "an integer in [1, 65536]"}},
  };
  for (const auto& [args, parts] : bad) {
    CAPTURE(args);
    const auto [c, o] = run_command(run + " " + args);
    CHECK(c == 2);
    std::vector<std::string> expect = parts;
    expect.push_back("usage: frugal-run");
    check_contains(o, expect);
  }
}

TEST_CASE("frugal-run: a failing rank stops the others and its exit code is returned") {
  const auto start = std::chrono::steady_clock::now();
  const auto [code, out] =
      run_command(frugal_run_path() + " --nproc 3 sh -c 'if [ $RANK = 1 ]; then echo dying; exit 3; fi; sleep 60'");
  CHECK(std::chrono::steady_clock::now() - start < 30s);  // the sleepers were stopped
  CHECK(code == 3);
  check_contains(out, {"[rank 1] dying", "frugal-run: rank 1 exited with code 3; stopping the other ranks",
                       "FAILED: rank 1 exited with code 3"});

  const auto dir = std::filesystem::temp_directory_path() / ("frugal_run_logs_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto [code2, out2] =
      // Each rank kills itself once both have logged (else the first kill stops the other before it wrote).
      run_command(frugal_run_path() + " --nproc 2 --log-dir " + dir.string() + " sh -c 'echo hello $RANK; until [ " +
                  "$(cat " + dir.string() + "/rank_*.log | wc -l) -ge 2 ]; do sleep 0.01; done; kill -9 $$'");
  CHECK(code2 == 128 + 9);
  check_contains(out2, {"killed by signal 9"});
  for (int r = 0; r < 2; ++r) {
    std::FILE* f = std::fopen((dir / ("rank_" + std::to_string(r) + ".log")).c_str(), "r");
    REQUIRE(f != nullptr);
    char line[64] = {};
    CHECK(std::fgets(line, sizeof(line), f) != nullptr);
    std::fclose(f);
    CHECK(std::string(line) == str_cat("hello ", r, "\n"));
  }
  std::filesystem::remove_all(dir);
}
