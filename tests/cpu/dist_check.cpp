// dist_check: the process backends (tcp, mpi) checked from inside their ranks, one line
// per rank. tests/cpu/test_process_backends.cpp starts it under frugal-run, mpirun or by
// hand; run it yourself the same way:
//   frugal-run --nproc 2 build/tests/dist_check --mode collectives [--backend tcp|mpi]
//   frugal-run --nproc 3 build/tests/dist_check --mode train
//   mpirun -np 2 build/tests/dist_check --mode train --backend mpi
// Modes:
//   collectives  every collective (all_reduce sum/avg/max, all_gather, reduce_scatter,
//                broadcast, send/recv, send_recv, barrier, split) in f32, f16, bf16 and
//                int64, sizes 0, 1, 7 and 12 (odd lengths where the op allows them), a
//                non-contiguous input and a 100003-element message, each result compared
//                bit for bit with the threads backend's (run_ranks in this process, same inputs)
//   train        three AdamW steps of a small MLP under DDP, ZeRO-1 and ZeRO-2
//                (parallel::ZeroAdamW, {.stage = 2}), each rank on its share of the batch:
//                the global loss and the weights equal one process on the whole batch
//                (1e-5 relative, plus 1e-6 of the largest magnitude)
//   die          the last rank _exit(3)s (or, with --signal, SIGKILLs itself) before the
//                second all_reduce; the others must fail with an error naming it
//   hang         the last rank sleeps --sleep-ms without joining the second all_reduce; the
//                others must fail after --timeout-ms naming the op, rank and sequence number
// Prints "dist_check <mode>: rank r/n ok ..." and exits 0, or "... FAILED: <why>" and exits 1.
#define DOCTEST_CONFIG_DISABLE  // for tests/test_util.h's helpers; this program is not a doctest suite
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "autograd/ops/all.h"
#include "examples/flags.h"
#include "optim/adam.h"
#include "parallel/ddp.h"
#include "parallel/init.h"
#include "parallel/thread_communicator.h"
#include "parallel/zero.h"
#include "tests/cpu/parallel_test_util.h"

using namespace frugal;
using namespace frugal::testing;
using CommPtr = std::shared_ptr<parallel::Communicator>;
using frugal::detail::str_cat;
using Named = std::vector<std::pair<std::string, Tensor>>;

namespace {

// Rank r's input for a case: deterministic, different on every rank and case.
Tensor input(int rank, int64_t n, DType dtype, uint64_t salt) {
  if (dtype == kInt64) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double((i * 7 + rank * 13 + int64_t(salt)) % 11 - 5);
    return from_vector(v, {n}, TensorOptions(kFloat64)).to(kInt64);
  }
  return random_tensor({n}, TensorOptions(dtype), salt * 131 + uint64_t(rank));
}

// Every collective on `comm`; the named results of this rank.
Named run_collectives(const CommPtr& comm) {
  const int p = comm->size(), r = comm->rank();
  Named out;
  uint64_t salt = 1;
  for (DType dt : {kFloat32, kFloat16, kBFloat16, kInt64})
    for (int64_t n : {0, 1, 7, 12}) {
      const std::string tag = str_cat(dtype_name(dt), "[", n, "]");
      for (auto op : {parallel::ReduceOp::Sum, parallel::ReduceOp::Avg, parallel::ReduceOp::Max}) {
        Tensor t = input(r, n, dt, salt++);
        comm->all_reduce(t, op)->wait();
        out.push_back({str_cat("all_reduce ", to_string(op), " ", tag), t});
      }
      const Tensor gathered = empty({p * n}, TensorOptions(dt));
      comm->all_gather(input(r, n, dt, salt++), gathered)->wait();
      out.push_back({"all_gather " + tag, gathered});
      const Tensor chunk = empty({n}, TensorOptions(dt));  // an input of p * n: n odd is allowed
      comm->reduce_scatter(input(r, p * n, dt, salt++), chunk, parallel::ReduceOp::Sum)->wait();
      out.push_back({"reduce_scatter " + tag, chunk});
      Tensor b = input(r, n, dt, salt++);
      comm->broadcast(b, int(n % p))->wait();
      out.push_back({"broadcast " + tag, b});
    }
  // A transposed (non-contiguous) tensor reduced in place; a large message; ZeRO's in-place gather.
  const Tensor base = random_tensor({3, 5}, TensorOptions(kFloat32), 900 + uint64_t(r));
  comm->all_reduce(base.transpose(0, 1), parallel::ReduceOp::Sum)->wait();
  out.push_back({"all_reduce of a transpose", base});
  Tensor big = input(r, 100003, kFloat32, 901);
  comm->all_reduce(big, parallel::ReduceOp::Avg)->wait();
  out.push_back({"all_reduce 100003", big});
  const Tensor flat = zeros({p * 5}, TensorOptions(kFloat32));
  flat.narrow(0, r * 5, 5).copy_(input(r, 5, kFloat32, 902));
  comm->all_gather(flat.narrow(0, r * 5, 5), flat)->wait();
  out.push_back({"all_gather in place", flat});
  // Point to point around the ring: two plain sends, then a send_recv both ways.
  if (p > 1) {
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    comm->send(input(r, 4, kFloat32, 903), next);
    comm->send(input(r, 0, kFloat16, 904), next);
    const Tensor a = empty({4}, TensorOptions(kFloat32)), e = empty({0}, TensorOptions(kFloat16));
    comm->recv(a, prev)->wait();
    comm->recv(e, prev)->wait();
    out.push_back({"recv", a});
    const Tensor c = empty({6}, TensorOptions(kBFloat16));
    auto [sent, got] = comm->send_recv(input(r, 6, kBFloat16, 905), prev, c, next);
    sent->wait();
    got->wait();
    out.push_back({"send_recv", c});
  }
  comm->barrier();
  // Split: even and odd ranks, ordered by descending rank; rank 0 opts out when p > 2.
  const int color = (p > 2 && r == 0) ? -1 : r % 2;
  auto sub = comm->split(color, -r);
  if (sub) {
    Tensor s = input(r, 9, kFloat32, 906);
    sub->all_reduce(s, parallel::ReduceOp::Sum)->wait();
    out.push_back({str_cat("split all_reduce (sub rank ", sub->rank(), " of ", sub->size(), ")"), s});
  } else {
    out.push_back({"split opt-out", zeros({0})});
  }
  return out;
}

// Bit-for-bit agreement (NaN aside: none of the inputs make one).
std::string compare(const Named& got, const Named& want) {
  if (got.size() != want.size()) return str_cat(got.size(), " results, the threads backend gave ", want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].first != want[i].first) return str_cat("result ", i, " is ", got[i].first, ", expected ", want[i].first);
    const Tensor &a = got[i].second, &b = want[i].second;
    if (a.sizes() != b.sizes() || a.dtype() != b.dtype())
      return str_cat(got[i].first, ": ", a.describe(), " vs the threads backend's ", b.describe());
    const auto va = values_of(a), vb = values_of(b);
    for (size_t k = 0; k < va.size(); ++k)
      if (va[k] != vb[k]) return str_cat(got[i].first, "[", k, "] = ", va[k], ", the threads backend's ", vb[k]);
  }
  return "";
}

std::string check_collectives(const CommPtr& world) {
  const int p = world->size();
  std::vector<Named> reference(static_cast<size_t>(p));
  parallel::run_ranks(p, [&](const CommPtr& c) { reference[size_t(c->rank())] = run_collectives(c); });
  const Named mine = run_collectives(world);
  const std::string diff = compare(mine, reference[size_t(world->rank())]);
  return diff.empty() ? str_cat(mine.size(), " results bit-identical to the threads backend") : "FAILED: " + diff;
}

// The largest error of `got` against `want` relative to 1e-5 |want| + 1e-6 max|want|
// (check_equiv's tolerance): <= 1 passes.
double tolerance_ratio(const Tensor& got, const Tensor& want) {
  const auto g = values_of(got), w = values_of(want);
  double scale = 0;
  for (double x : w) scale = std::max(scale, std::fabs(x));
  double worst = 0;
  for (size_t i = 0; i < w.size(); ++i)
    worst = std::max(worst, std::fabs(g[i] - w[i]) / (1e-5 * std::fabs(w[i]) + 1e-6 * std::max(scale, 1e-30)));
  return worst;
}

constexpr optim::AdamWOptions kAdamW{.lr = 0.02, .weight_decay = 0.1};
constexpr int64_t kSteps = 3, kPerRank = 2;

std::string check_training(const CommPtr& world) {
  const int p = world->size(), r = world->rank();
  const int64_t batch = kPerRank * p;
  const Tensor x = random_tensor({kSteps, batch, 6}, TensorOptions(kFloat32), 101);
  const Tensor y = random_tensor({kSteps, batch, 3}, TensorOptions(kFloat32), 102);
  // One process on the whole batch; `init` keeps the starting weights for the ranks' models.
  const auto init = data_parallel_mlp(10), ref = data_parallel_mlp(10);
  optim::AdamW ref_opt(ref->parameters(), kAdamW);
  std::vector<double> ref_loss;
  std::vector<std::vector<Tensor>> ref_params;
  for (int64_t s = 0; s < kSteps; ++s) {
    Tensor loss = mse_loss(ref->forward(x[s]), y[s]);
    ref_loss.push_back(loss.item<double>());
    loss.backward();
    ref_opt.step();
    ref_opt.zero_grad();
    ref_params.push_back({});
    for (const Tensor& t : ref->parameters()) ref_params.back().push_back(t.detach().clone());
  }
  double worst = 0;
  std::string where;
  auto track = [&](double ratio, const std::string& what) {
    if (ratio > worst) worst = ratio, where = what;
  };
  for (const std::string mode : {"ddp", "zero1", "zero2"}) {
    // DDP starts from differently drawn weights on ranks > 0 (its broadcast fixes them); ZeRO from equal ones.
    auto model = rank_models(*init, p, /*equal=*/mode != "ddp")[size_t(r)];
    std::unique_ptr<parallel::DistributedDataParallel> ddp;
    std::unique_ptr<optim::AdamW> adamw;
    std::unique_ptr<parallel::ZeroAdamW> zero;
    if (mode == "ddp") {
      ddp = std::make_unique<parallel::DistributedDataParallel>(model, world);
      adamw = std::make_unique<optim::AdamW>(model->parameters(), kAdamW);
    } else {
      zero = std::make_unique<parallel::ZeroAdamW>(model->parameters(), world, kAdamW,
                                                   parallel::ZeroOptions{.stage = mode == "zero1" ? 1 : 2});
    }
    for (int64_t s = 0; s < kSteps; ++s) {
      const Tensor xs = rows(x[s], r, kPerRank), ys = rows(y[s], r, kPerRank);
      Tensor loss = mse_loss(ddp ? ddp->forward(xs) : model->forward(xs), ys);
      Tensor global = loss.detach().clone();  // equal shares: the mean of the ranks' losses
      world->all_reduce(global, parallel::ReduceOp::Avg)->wait();
      track(tolerance_ratio(global, full({}, ref_loss[size_t(s)], TensorOptions(kFloat32))),
            str_cat(mode, " loss at step ", s));
      loss.backward();
      if (adamw) adamw->step(), adamw->zero_grad();
      else zero->step(), zero->zero_grad();
      const auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i)
        track(tolerance_ratio(params[i], ref_params[size_t(s)][i]), str_cat(mode, " parameter ", i, " after step ", s));
    }
  }
  if (worst > 1) return str_cat("FAILED: ", where, " is off by ", worst, " x the tolerance");
  return str_cat("ddp zero1 zero2 equal one process over ", kSteps, " AdamW steps (worst ", worst,
                 " x the 1e-5 tolerance)");
}

// The last rank leaves before the second all_reduce (die: exits; hang: sleeps); the
// others must fail in it, with an error saying why.
std::string check_failure(const CommPtr& world, bool die, bool by_signal, int sleep_ms) {
  const int p = world->size(), r = world->rank();
  Tensor t = ones({4});
  world->all_reduce(t)->wait();
  if (r == p - 1) {
    std::fflush(stdout);
    if (die && by_signal) ::raise(SIGKILL);
    if (die) _exit(3);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    return "left without joining all_reduce #2";
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    world->all_reduce(t)->wait();
  } catch (const std::exception& e) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    return str_cat("failed as expected after ", ms, " ms: ", e.what());
  }
  return "FAILED: all_reduce #2 completed without the last rank";
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, backend = "tcp";
  int64_t timeout_ms = 60000, sleep_ms = 3000, linger_ms = 0;
  bool by_signal = false;
  cli::parse_or_exit("dist_check",
                     "usage: dist_check --mode collectives|train|die|hang [--backend tcp|mpi|auto] [--timeout-ms N] "
                     "[--sleep-ms N] [--signal 0|1] [--linger-ms N]\n",
                     [&] {
                       cli::Flags flags(argc, argv);
                       while (flags.next()) {
                         if (flags.is("--mode")) mode = flags.text();
                         else if (flags.is("--backend")) backend = flags.text();
                         else if (flags.is("--timeout-ms")) timeout_ms = flags.integer(1, 1 << 30);
                         else if (flags.is("--sleep-ms")) sleep_ms = flags.integer(0, 1 << 30);
                         else if (flags.is("--signal")) by_signal = flags.integer(0, 1) != 0;
                         else if (flags.is("--linger-ms")) linger_ms = flags.integer(0, 1 << 30);
                         else flags.unknown();
                       }
                     });
  int rank = -1;
  try {
    auto world = parallel::init_process_group(
        {.backend = parallel::parse_backend(backend), .timeout = std::chrono::milliseconds(timeout_ms)});
    rank = world->rank();
    std::string result;
    if (mode == "collectives") result = check_collectives(world);
    else if (mode == "train") result = check_training(world);
    else if (mode == "die" || mode == "hang") result = check_failure(world, mode == "die", by_signal, int(sleep_ms));
    else FRUGAL_FAIL("dist_check: unknown --mode '", mode, "'");
    const bool ok = result.rfind("FAILED", 0) != 0;
    const bool checks = mode == "collectives" || mode == "train";  // die/hang: the survivors' errors are the result
    std::printf("dist_check %s: rank %d/%d %s%s (%s backend)\n", mode.c_str(), rank, world->size(),
                ok && checks ? "ok: " : "", result.c_str(), world->backend().c_str());
    std::fflush(stdout);
    if (mode == "die" || mode == "hang") {
      // --linger-ms: a survivor that reports or cleans up before it exits, so that the dead
      // rank is certainly reaped first (frugal-run's blame, tests/cpu/test_process_backends.cpp).
      if (rank != world->size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(linger_ms));
      _exit(rank == world->size() - 1 ? 0 : 1);  // the dead peer's sockets: no teardown
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("dist_check %s: rank %d FAILED: %s\n", mode.c_str(), rank, e.what());
    return 1;
  }
}
