// The process backends (tcp: Note [TCP backend]; mpi: Note [MPI backend]) across real
// processes: build/tests/dist_check runs in every rank and compares each collective with
// the threads backend (bit for bit) and DDP / ZeRO-1 / ZeRO-2 training with one process
// (1e-5 relative); it is started by frugal-run on one "node" and on two (two frugal-runs
// on this host), by hand without any launcher (a rank that dies, one that never joins), and
// by mpirun (skipped, with a message, where mpirun or the MPI build is missing). In-process
// thread ranks, each with its own store connection, check the tcp backend's error messages.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "parallel/tcp_communicator.h"
#include "parallel/tcp_store.h"
#include "tensor/factory.h"
#include "tests/cpu/launch_test_util.h"
#include "tests/error_text.h"

using namespace frugal;
using namespace frugal::parallel;
using namespace std::chrono_literals;
using frugal::detail::str_cat;
using frugal::testing::built_program;
using frugal::testing::check_contains;
using frugal::testing::error_of;
using frugal::testing::frugal_run_path;
using frugal::testing::run_command;

namespace {

// A port that was free a moment ago (the kernel's choice).
int free_port() { return TcpStore("127.0.0.1", 0, true, 1s).port(); }

std::string dist_check() { return built_program("tests/dist_check"); }

// Each rank's one line, as frugal-run prefixes it.
void check_ranks_ok(const std::string& out, int n, const std::string& mode, const std::string& what) {
  for (int r = 0; r < n; ++r)
    check_contains(out, {str_cat("[rank ", r, "] dist_check ", mode, ": rank ", r, "/", n, " ok: ", what)});
}

// Two ranks started by hand (no launcher): RANK/WORLD_SIZE/MASTER_PORT set per process.
std::pair<int, std::string> run_pair_by_hand(const std::string& args) {
  const int port = free_port();
  const std::string env = str_cat("WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=", port, " ");
  return run_command(str_cat("sh -c '", env, "RANK=0 ", dist_check(), " ", args, " & p=$!; ", env, "RANK=1 ",
                             dist_check(), " ", args, "; b=$?; wait $p; a=$?; echo codes=$a,$b'"));
}

bool mpirun_usable() {
#ifdef FRUGAL_WITH_MPI
  return run_command("command -v mpirun").first == 0;
#else
  return false;
#endif
}

// mpirun as root (CI) needs Open MPI's two opt-ins; --oversubscribe: more ranks than cores.
std::string mpirun(int n) {
  return str_cat(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 mpirun -np ", n,
      " ");
}

// body(comm, rank) on two thread ranks of the tcp backend, each with its own store connection.
void on_two_tcp_ranks(const std::function<void(TcpCommunicator&, int)>& body) {
  TcpStore server("127.0.0.1", 0, true, 10s);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      TcpStore store("127.0.0.1", server.port(), false, 10s);
      TcpCommunicator comm(store, r, 2, "127.0.0.1", 10s);
      body(comm, r);
    });
  for (auto& t : ranks) t.join();
}

}  // namespace

TEST_CASE("tcp backend: every collective over 2 and 3 processes is bit-identical to the threads backend") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    const auto [code, out] =
        run_command(str_cat(frugal_run_path(), " --nproc ", n, " ", dist_check(), " --mode collectives --backend tcp"));
    CHECK(code == 0);
    check_ranks_ok(out, n, "collectives", "102 results bit-identical to the threads backend (tcp backend)");
  }
}

TEST_CASE("tcp backend: DDP, ZeRO-1 and ZeRO-2 over 2 and 3 processes equal one process on the whole batch") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    // --backend auto: tcp on a machine without a GPU (nccl with one would need CUDA tensors).
    const std::string backend = cuda_device_count() > 0 ? "tcp" : "auto";
    const auto [code, out] =
        run_command(str_cat(frugal_run_path(), " --nproc ", n, " ", dist_check(), " --mode train --backend ", backend));
    CHECK(code == 0);
    check_ranks_ok(out, n, "train", "ddp zero1 zero2 equal one process over 3 AdamW steps");
  }
}

TEST_CASE("frugal-run: two nodes on one host (two launchers, --nnodes 2) train as one world") {
  const int port = free_port();
  auto node = [&](int r) {
    return str_cat(frugal_run_path(), " --nnodes 2 --node-rank ", r, " --master-addr 127.0.0.1 --master-port ", port,
                   " --nproc-per-node 1 ", dist_check(), " --mode train --backend tcp");
  };
  const auto [code, out] =
      run_command(str_cat("sh -c '", node(0), " & p=$!; ", node(1), "; b=$?; wait $p; a=$?; echo codes=$a,$b'"));
  CHECK(code == 0);
  check_contains(out, {"codes=0,0"});
  check_ranks_ok(out, 2, "train", "ddp zero1 zero2 equal one process");
}

TEST_CASE("tcp backend: a rank that dies mid-step fails the others at once, with or without frugal-run") {
  for (const char* how : {"0", "1"}) {  // _exit(3), SIGKILL
    CAPTURE(how);
    const auto start = std::chrono::steady_clock::now();
    const auto [code, out] = run_pair_by_hand(str_cat("--mode die --signal ", how));
    CHECK(std::chrono::steady_clock::now() - start < 20s);
    check_contains(out, {str_cat("codes=1,", how[0] == '1' ? 137 : 3), "dist_check die: rank 0/2 failed as expected",
                         "tcp all_reduce #2 on rank 0", "rank 1"});
    // Closed before rank 0 sent (it reads EOF) or while it sent (broken pipe): both name rank 1 and why.
    const bool named = out.find("rank 1 closed its connection (it exited or was killed)") != std::string::npos ||
                       out.find("sending to rank 1 failed") != std::string::npos;
    CHECK_MESSAGE(named, out);
  }
  // frugal-run blames the rank that died, not the survivor that failed on its connection: the
  // survivor lingers, as one that reports or cleans up does (when both exit at once, which
  // failed first is a race that the output's end only usually settles).
  const auto [code, out] =
      run_command(str_cat(frugal_run_path(), " --nproc 2 ", dist_check(), " --mode die --linger-ms 1000"));
  CHECK(code == 3);
  check_contains(
      out, {"frugal-run: rank 1 exited with code 3; stopping the other ranks", "FAILED: rank 1 exited with code 3"});
}

TEST_CASE("tcp backend: a rank that never joins makes the others time out naming op, rank and sequence number") {
  const auto start = std::chrono::steady_clock::now();
  const auto [code, out] = run_pair_by_hand("--mode hang --timeout-ms 400 --sleep-ms 700");
  CHECK(std::chrono::steady_clock::now() - start < 20s);
  check_contains(out, {"codes=1,0", "tcp all_reduce #2 on rank 0 timed out after 400 ms waiting for rank 1",
                       "dist_check hang: rank 1/2 left without joining all_reduce #2"});
}

TEST_CASE("tcp backend: errors name the op, the shapes and dtypes, and both sides of a disagreement") {
  std::string errors[2];
  on_two_tcp_ranks([&](TcpCommunicator& comm, int r) {
    errors[r] = error_of([&] { comm.reduce_scatter(zeros({7}), zeros({3})); });
    const Tensor wide = zeros({4, 2});
    check_contains(error_of([&] { comm.all_gather(zeros({4}), wide.transpose(0, 1)); }),
                   {"tcp all_gather: output must be contiguous", "float32[4] cpu", "float32[2, 4] cpu"});
    // Rank 0 runs all_reduce #1 while rank 1 runs all_gather #1: both fail, naming both.
    const std::string e = error_of([&] {
      if (r == 0) comm.all_reduce(ones({4}));
      else comm.all_gather(ones({2}), zeros({4}));
    });
    if (r == 0) check_contains(e, {"tcp all_reduce #1 on rank 0: rank 1 sent 8 bytes of its all_gather #1"});
    else check_contains(e, {"tcp all_gather #1 on rank 1: rank 0 sent 8 bytes of its all_reduce #1"});
    // The failure poisons the communicator: later calls say so (Note [TCP backend]).
    check_contains(error_of([&] { comm.barrier(); }), {"tcp barrier #2", "failed earlier", "sent 8 bytes"});
  });
  for (const auto& e : errors)
    check_contains(e, {"tcp reduce_scatter", "split into 2", "float32[7] cpu", "float32[3] cpu"});
}

TEST_CASE("mpi backend: collectives, training and the timeout under mpirun") {
  if (!mpirun_usable()) {
    MESSAGE("skipped: needs the MPI build (libopenmpi-dev found by meson) and mpirun (openmpi-bin)");
    return;
  }
  const auto [code, out] = run_command(mpirun(2) + dist_check() + " --mode collectives --backend mpi");
  CHECK(code == 0);
  for (int r = 0; r < 2; ++r)
    check_contains(out, {str_cat("rank ", r, "/2 ok: 102 results bit-identical to the threads backend (mpi backend)")});
  const auto [code3, out3] = run_command(mpirun(3) + dist_check() + " --mode train --backend mpi");
  CHECK(code3 == 0);
  for (int r = 0; r < 3; ++r) check_contains(out3, {str_cat("rank ", r, "/3 ok: ddp zero1 zero2 equal one process")});
  const auto start = std::chrono::steady_clock::now();
  const auto [code_hang, out_hang] =
      run_command(mpirun(2) + dist_check() + " --mode hang --backend mpi --timeout-ms 400 --sleep-ms 20000");
  CHECK(std::chrono::steady_clock::now() - start < 15s);  // mpirun stops the sleeper once rank 0 fails
  CHECK(code_hang != 0);
  check_contains(out_hang, {"mpi all_reduce #2 on rank 0 timed out after 400 ms"});
  // Under frugal-run each process would be an MPI world of one: refused, naming the fix.
  const auto [code_fr, out_fr] =
      run_command(str_cat(frugal_run_path(), " --nproc 2 ", dist_check(), " --mode collectives --backend mpi"));
  CHECK(code_fr != 0);
  check_contains(out_fr, {"WORLD_SIZE=2 but MPI's world says 1", "mpirun", "tcp backend"});
}

TEST_CASE("tcp backend: ranks that disagree on dtype or reduce op fail, naming both, instead of mixing bits") {
  // int32 against float32 (the same bytes) and Max against Sum passed the byte-count check and
  // gave each rank a different, meaningless result.
  for (int variant : {0, 1}) {
    CAPTURE(variant);
    std::string errors[2];
    on_two_tcp_ranks([&](TcpCommunicator& comm, int r) {
      errors[r] = error_of([&] {
        if (variant == 0) comm.all_reduce(ones({4}, r == 1 ? kInt32 : kFloat32));
        else comm.all_reduce(ones({4}), r == 1 ? ReduceOp::Max : ReduceOp::Sum);
      });
    });
    if (variant == 0) {
      check_contains(errors[0], {"tcp all_reduce #1 on rank 0: rank 1 runs this all_reduce with (int32, sum), this "
                                 "rank with (float32, sum)"});
      check_contains(errors[1], {"rank 0 runs this all_reduce with (float32, sum), this rank with (int32, sum)"});
    } else {
      check_contains(errors[0], {"rank 1 runs this all_reduce with (float32, max), this rank with (float32, sum)"});
      check_contains(errors[1], {"every rank must pass the same dtype and reduce op"});
    }
  }
}

TEST_CASE("tcp backend: ranks that disagree on broadcast's root fail at the broadcast, naming both roots") {
  // Each its own root: both sent and returned, each keeping its own tensor (caught, if at all,
  // at the next collective); each the other's: both waited until the timeout.
  for (int variant : {0, 1}) {
    CAPTURE(variant);
    std::string errors[2];
    on_two_tcp_ranks([&](TcpCommunicator& comm, int r) {
      errors[r] = error_of([&] { comm.broadcast(full({3}, double(r)), variant == 0 ? r : 1 - r); });
    });
    const int root0 = variant == 0 ? 0 : 1, root1 = 1 - root0;
    check_contains(errors[0],
                   {"tcp broadcast #1 on rank 0: rank 1 runs this broadcast with (float32, root " +
                        std::to_string(root1) + "), this rank with (float32, root " + std::to_string(root0) + ")",
                    "same dtype and root"});
    CHECK_FALSE(errors[1].empty());
  }
  on_two_tcp_ranks([&](TcpCommunicator& comm, int r) {  // agreeing ranks still get the root's values
    const Tensor t = full({3}, double(r + 5));
    comm.broadcast(t, 1);
    CHECK(t.tolist<float>() == std::vector<float>{6, 6, 6});
  });
}
