// The NCCL backend against a CPU reference, run as
//   frugal-run --nproc 2 build/tests/nccl_check
// Every rank computes every rank's inputs (a formula of rank and index), so each
// checks its results against a serial reference without communication. Covers
// every collective in f32/f16/bf16/f64/int32, send/recv fused in a CommGroup,
// split, ordering after work on the compute stream, and the watchdog: rank 1 skips
// a collective and rank 0 must fail with the clear error within the shortened
// timeout. Prints a summary and exits 0 (all passed), 1 (a check failed) or 77 (fewer GPUs
// than ranks on this node: skipped, unless FRUGAL_REQUIRE_MULTI_GPU=1; tests/multi_gpu.h).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "parallel/init.h"
#include "parallel/nccl_communicator.h"
#include "tensor/factory.h"
#include "tests/multi_gpu.h"

using namespace frugal;
using namespace frugal::parallel;
using frugal::detail::str_cat;

namespace {

int g_checks = 0, g_failures = 0, g_rank = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL (rank %d): %s\n", g_rank, what.c_str());
  }
}

// Exactly representable in every tested dtype (quarters in [-5, 6]), so sums are exact.
double input_value(int rank, int64_t i, DType dt) {
  const double v = double((rank * 7 + i * 3) % 11) - 5.0;
  return dt == kInt32 ? v : v + 0.25 * rank;
}

Tensor input_tensor(int rank, int64_t n, DType dt, Device device) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = input_value(rank, i, dt);
  return from_vector(v, {n}, TensorOptions(kFloat64)).to(device, dt);
}

std::vector<double> values(const Tensor& t) { return t.to(kCPU, kFloat64).contiguous().tolist<double>(); }

bool close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::fabs(a[i] - b[i]) > tol * (1 + std::fabs(b[i]))) return false;
  return true;
}

void check_collectives(Communicator& world, DType dt) {
  const int n = world.size(), r = world.rank();
  const Device dev = world.device();
  const std::string tag = dtype_name(dt);
  const double tol = dt == kBFloat16 ? 1e-2 : dt == kFloat16 ? 1e-3 : 1e-6;
  const int64_t m = 1000;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    if (dt == kInt32 && op == ReduceOp::Avg) continue;
    Tensor t = input_tensor(r, m, dt, dev);
    world.all_reduce(t, op)->wait();
    std::vector<double> ref(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
      double acc = input_value(0, i, dt);
      for (int q = 1; q < n; ++q)
        acc = op == ReduceOp::Max ? std::max(acc, input_value(q, i, dt)) : acc + input_value(q, i, dt);
      ref[size_t(i)] = op == ReduceOp::Avg ? acc / n : acc;
    }
    check(close(values(t), ref, tol), str_cat("all_reduce ", to_string(op), " ", tag));
  }
  {  // all_gather
    Tensor out = zeros({n * m}, TensorOptions(dt, dev));
    world.all_gather(input_tensor(r, m, dt, dev), out)->wait();
    std::vector<double> ref;
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < m; ++i) ref.push_back(input_value(q, i, dt));
    check(close(values(out), ref, 0), "all_gather " + tag);
  }
  if (dt != kInt32) {  // reduce_scatter
    Tensor out = zeros({m / n}, TensorOptions(dt, dev));
    world.reduce_scatter(input_tensor(r, m, dt, dev), out, ReduceOp::Sum)->wait();
    std::vector<double> ref;
    for (int64_t i = r * (m / n); i < (r + 1) * (m / n); ++i) {
      double acc = 0;
      for (int q = 0; q < n; ++q) acc += input_value(q, i, dt);
      ref.push_back(acc);
    }
    check(close(values(out), ref, tol), "reduce_scatter " + tag);
  }
  {  // broadcast from the last rank
    Tensor t = input_tensor(r, m, dt, dev);
    world.broadcast(t, n - 1)->wait();
    std::vector<double> ref;
    for (int64_t i = 0; i < m; ++i) ref.push_back(input_value(n - 1, i, dt));
    check(close(values(t), ref, 0), "broadcast " + tag);
  }
}

// Runs fn; returns its error message ("" when it did not throw).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) { return e.what(); }
  return "";
}

}  // namespace

// Progress lines: a crash then shows which section it was in.
void section(const char* name) { std::printf("rank %d: %s\n", g_rank, name); }

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // frugal-run pipes stdout: flush each line
  if (const int skipped = testing::skip_without_gpus("nccl_check")) return skipped;
  try {
    auto world = init_process_group(std::chrono::seconds(120));
    g_rank = world->rank();
    const int n = world->size(), r = world->rank();
    const Device dev = world->device();
    check(world->backend() == "nccl" && dev.is_cuda() && n >= 2, "backend, device and world size");

    for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64, kInt32}) {
      section(dtype_name(dt));
      check_collectives(*world, dt);
    }
    section("send/recv");

    {  // send/recv both ways at once: fused in a CommGroup, it cannot deadlock
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      Tensor out = input_tensor(r, 257, kFloat32, dev), in = zeros({257}, TensorOptions(kFloat32, dev));
      std::shared_ptr<Work> sent, got;
      {
        CommGroup group;
        sent = world->send(out, next);
        got = world->recv(in, prev);
      }
      got->wait();
      sent->wait();
      std::vector<double> ref;
      for (int64_t i = 0; i < 257; ++i) ref.push_back(input_value(prev, i, kFloat32));
      check(close(values(in), ref, 0), "send/recv in a CommGroup");
    }
    {  // the same through Communicator::send_recv, with 4 MiB each way (past NCCL's eager sizes)
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      const int64_t len = int64_t(1) << 20;
      Tensor out = input_tensor(r, len, kFloat32, dev), in = zeros({len}, TensorOptions(kFloat32, dev));
      auto [sent, got] = world->send_recv(out, next, in, prev);
      got->wait();
      sent->wait();
      check(close(values(in), values(input_tensor(prev, len, kFloat32, dev)), 0), "send_recv 4 MiB around the ring");
    }
    section("CommGroup all_reduce");
    {  // several all_reduces fused into one launch
      std::vector<Tensor> ts;
      std::vector<std::shared_ptr<Work>> works;
      {
        CommGroup group;
        for (int k = 0; k < 3; ++k) {
          ts.push_back(full({16}, double(r + k), TensorOptions(kFloat32, dev)));
          works.push_back(world->all_reduce(ts.back()));
        }
      }
      for (int k = 0; k < 3; ++k) {
        works[size_t(k)]->wait();
        double ref = 0;
        for (int q = 0; q < n; ++q) ref += q + k;
        check(close(values(ts[size_t(k)]), std::vector<double>(16, ref), 0), str_cat("CommGroup all_reduce ", k));
      }
    }
    section("ordering");
    {  // ordering: the collective waits for the fill queued just before it on the compute stream
      Tensor big = full({1 << 22}, double(r + 1), TensorOptions(kFloat32, dev));
      world->all_reduce(big)->wait();
      check(close(values(big), std::vector<double>(size_t(1) << 22, n * (n + 1) / 2.0), 0),
            "all_reduce ordered after the compute stream's fill");
    }
    section("split");
    {  // split: reversed keys, and every rank alone
      auto reversed = world->split(0, n - r);
      check(reversed && reversed->size() == n && reversed->rank() == n - 1 - r, "split: size and reversed rank");
      Tensor t = full({4}, double(1 << r), TensorOptions(kFloat64, dev));
      reversed->all_reduce(t)->wait();
      check(close(values(t), std::vector<double>(4, double((1 << n) - 1)), 0), "split: all_reduce");
      auto alone = world->split(r, 0);
      check(alone && alone->size() == 1 && alone->rank() == 0, "split: singleton groups");
      auto none = world->split(r == 0 ? -1 : 0, 0);
      check((r == 0) == (none == nullptr), "split: negative color gives no communicator");
    }
    world->barrier();

    section("watchdog");
    {  // the watchdog: rank 1 skips a collective on a communicator with a 3 s timeout
      auto sub = world->split(0, r);
      sub->set_timeout(std::chrono::seconds(3));
      const auto start = std::chrono::steady_clock::now();
      std::string err;
      if (r == 0) {
        err = error_of([&] {
          sub->all_reduce(zeros({8}, TensorOptions(kFloat32, dev)))->wait();
          sub->barrier();  // polls the host; the watchdog's abort makes it throw
        });
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("rank 0: timeout error after %.1f s: %s\n", secs, err.c_str());
        check(!err.empty() && err.find("all_reduce #1") != std::string::npos &&
                  err.find("rank 0") != std::string::npos && err.find("timed out after 3000 ms") != std::string::npos,
              "timeout error names op, rank and sequence number: " + err);
        check(secs < 30, "the timeout fires within its bound");
        auto* nccl = dynamic_cast<NcclCommunicator*>(sub.get());
        check(nccl && nccl->aborted(), "the communicator is aborted");
        check(!error_of([&] { sub->all_reduce(zeros({1}, TensorOptions(kFloat32, dev))); }).empty(),
              "later calls throw");
      }
      sub.reset();  // rank 1: its communicator never saw the op; rank 0: already aborted
    }
    world->barrier();

    // Summary: every rank learns the total failure count.
    Tensor bad = full({1}, double(g_failures), TensorOptions(kFloat64, dev));
    world->all_reduce(bad)->wait();
    const int total = int(values(bad)[0]);
    std::printf("nccl_check rank %d: %d checks, %d failed here, %d failed on all ranks\n", r, g_checks, g_failures,
                total);
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("nccl_check rank %d: ERROR: %s\n", g_rank, e.what());
    return 1;
  }
}
