// The in-process communicator (parallel/thread_communicator.h) against serial
// references: every collective at 2 and 4 ranks in f32/f64/f16, point to point,
// split and make_groups, and the failure paths (timeouts, a dead rank, a rank that
// left, disagreeing calls). Checks run on the main thread after run_ranks returns:
// each rank thread only records what it saw.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include "parallel/thread_communicator.h"
#include "tensor/ops/fill.h"
#include "tests/error_text.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::parallel;
using namespace frugal::testing;
using namespace std::chrono_literals;
using frugal::detail::str_cat;

namespace {

constexpr DType kCommDTypes[] = {kFloat32, kFloat64, kFloat16};

// Tolerance for a reduction of n values in [-2, 2] stored in `t` (sums reach 2n).
double reduce_atol(DType t, int n) { return default_rtol(t) * 2.0 * n; }

// Every rank's result equals rank 0's, bit for bit (the backend reduces once, in rank order).
void check_identical(const std::vector<Tensor>& results) {
  const auto first = values_of(results[0]);
  for (size_t r = 1; r < results.size(); ++r) CHECK_MESSAGE(values_of(results[r]) == first, "rank ", r, " differs");
}

}  // namespace

TEST_CASE("threads communicator: all_reduce sum/avg/max match a serial reference, bit-identical on every rank") {
  for (int n : {2, 4})
    for (DType dt : kCommDTypes)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        const Shape shape{3, 5};
        std::vector<Tensor> tensors;
        std::vector<std::vector<double>> inputs;
        for (int r = 0; r < n; ++r) {
          // Odd ranks pass a transposed (non-contiguous) view: reduced in place all the same.
          tensors.push_back(
              random_tensor(shape, TensorOptions(dt), 100 + r, r % 2 ? Layout::Transposed : Layout::Contiguous));
          inputs.push_back(values_of(tensors.back()));
        }
        std::vector<double> expected(inputs[0].size());
        for (size_t i = 0; i < expected.size(); ++i) {
          double acc = inputs[0][i];
          for (int r = 1; r < n; ++r)
            acc = op == ReduceOp::Max ? std::max(acc, inputs[size_t(r)][i]) : acc + inputs[size_t(r)][i];
          expected[i] = op == ReduceOp::Avg ? acc / n : acc;
        }
        run_ranks(n, [&](Communicator& c) { all_reduce(c, tensors[size_t(c.rank())], op); });
        const std::string what = str_cat("all_reduce ", to_string(op), " ", n, " ranks ", dtype_name(dt));
        for (int r = 0; r < n; ++r)
          check_close(tensors[size_t(r)], expected, default_rtol(dt), reduce_atol(dt, n), what);
        check_identical(tensors);
      }
}

TEST_CASE("threads communicator: all_gather, reduce_scatter and broadcast match serial references") {
  for (int n : {2, 4})
    for (DType dt : kCommDTypes) {
      const std::string what = str_cat(n, " ranks ", dtype_name(dt));
      std::vector<Tensor> in, gathered, full, chunk, bcast;
      std::vector<std::vector<double>> in_vals, full_vals, bcast_vals;
      for (int r = 0; r < n; ++r) {
        in.push_back(random_tensor({2, 3}, TensorOptions(dt), 10 + r, Layout::Strided));
        gathered.push_back(zeros({n, 2, 3}, TensorOptions(dt)));
        full.push_back(random_tensor({n * 4}, TensorOptions(dt), 20 + r));
        chunk.push_back(zeros({2, 2}, TensorOptions(dt)));
        bcast.push_back(random_tensor({7}, TensorOptions(dt), 30 + r));
        in_vals.push_back(values_of(in.back()));
        full_vals.push_back(values_of(full.back()));
        bcast_vals.push_back(values_of(bcast.back()));
      }
      const int root = n - 1;
      run_ranks(n, [&](Communicator& c) {
        const size_t r = size_t(c.rank());
        auto g = c.all_gather(in[r], gathered[r]);
        auto s = c.reduce_scatter(full[r], chunk[r], ReduceOp::Sum);
        auto b = c.broadcast(bcast[r], root);
        b->wait();  // out of issue order: each Work stands alone
        s->wait();
        g->wait();
      });
      std::vector<double> gather_ref;
      for (int r = 0; r < n; ++r)
        gather_ref.insert(gather_ref.end(), in_vals[size_t(r)].begin(), in_vals[size_t(r)].end());
      for (int r = 0; r < n; ++r) {
        CHECK_MESSAGE(values_of(gathered[size_t(r)]) == gather_ref, "all_gather ", what);
        std::vector<double> chunk_ref(4);
        for (int i = 0; i < 4; ++i)
          for (int q = 0; q < n; ++q) chunk_ref[size_t(i)] += full_vals[size_t(q)][size_t(r * 4 + i)];
        check_close(chunk[size_t(r)], chunk_ref, default_rtol(dt), reduce_atol(dt, n), "reduce_scatter " + what);
        CHECK_MESSAGE(values_of(bcast[size_t(r)]) == bcast_vals[size_t(root)], "broadcast ", what);
      }
    }
}

TEST_CASE("threads communicator: all_gather into a view of its own output (in place, as ZeRO does)") {
  const int n = 4;
  std::vector<Tensor> buffers;
  for (int r = 0; r < n; ++r) buffers.push_back(full({n * 3}, double(r + 1), TensorOptions(kFloat64)));
  run_ranks(n, [&](Communicator& c) {
    const Tensor& buf = buffers[size_t(c.rank())];
    c.all_gather(buf.narrow(0, c.rank() * 3, 3), buf)->wait();
  });
  std::vector<double> expected;
  for (int r = 0; r < n; ++r) expected.insert(expected.end(), 3, double(r + 1));
  for (const Tensor& b : buffers) CHECK(values_of(b) == expected);
}

TEST_CASE("threads communicator: send/recv match in order per pair, recv may be posted first") {
  for (int n : {2, 4}) {
    std::vector<std::vector<double>> got(static_cast<size_t>(n));
    run_ranks(n, [&](Communicator& c) {
      const int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      Tensor a = zeros({3}, TensorOptions(kFloat64)), b = zeros({2, 2}, TensorOptions(kFloat32));
      auto ra = c.recv(a, prev);  // posted before the peer sends
      c.barrier();
      Tensor msg = full({3}, 10.0 * r + 1, TensorOptions(kFloat64));
      c.send(msg, next);
      ops::fill_(msg, -1.0);  // send has copied: the caller may reuse its tensor at once
      c.send(full({4}, 10.0 * r + 2, TensorOptions(kFloat32)), next);
      auto rb = c.recv(b, prev);
      rb->wait();
      ra->wait();
      std::vector<double> v = values_of(a), w = values_of(b);
      v.insert(v.end(), w.begin(), w.end());
      got[size_t(r)] = v;
    });
    for (int r = 0; r < n; ++r) {
      const double p = 10.0 * ((r + n - 1) % n);
      CHECK(got[size_t(r)] == std::vector<double>{p + 1, p + 1, p + 1, p + 2, p + 2, p + 2, p + 2});
    }
  }
}

TEST_CASE("threads communicator: send_recv exchanges with both neighbours of a ring, in order with plain sends") {
  for (int n : {2, 3}) {
    std::vector<std::vector<double>> got{size_t(n)};
    run_ranks(n, [&](Communicator& c) {
      const int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      c.send(full({2}, 100.0 + r, TensorOptions(kFloat64)), next);  // matched before the exchange's message
      Tensor first = zeros({2}, TensorOptions(kFloat64)), second = zeros({3}, TensorOptions(kFloat64));
      c.recv(first, prev)->wait();
      auto [sent, received] = c.send_recv(full({3}, 10.0 * r, TensorOptions(kFloat64)), next, second, prev);
      received->wait();
      sent->wait();
      std::vector<double> v = values_of(first), w = values_of(second);
      v.insert(v.end(), w.begin(), w.end());
      got[size_t(r)] = v;
    });
    for (int r = 0; r < n; ++r) {
      const double p = double((r + n - 1) % n);
      CHECK(got[size_t(r)] == std::vector<double>{100 + p, 100 + p, 10 * p, 10 * p, 10 * p});
    }
  }
}

TEST_CASE("threads communicator: barrier holds every rank until all reached it") {
  const int n = 4;
  std::atomic<int> arrived{0};
  std::vector<int> seen(n);
  run_ranks(n, [&](Communicator& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * c.rank()));
    arrived++;
    c.barrier();
    seen[size_t(c.rank())] = arrived.load();
  });
  for (int r = 0; r < n; ++r) CHECK(seen[size_t(r)] == n);
}

TEST_CASE("threads communicator: split orders by key, then parent rank; negative color opts out") {
  const int n = 4;
  struct Seen {
    int rank = -9, size = -9;
    double sum = 0;
    bool left_out = false;
  };
  std::vector<Seen> seen(n);
  run_ranks(n, [&](Communicator& c) {
    const int r = c.rank();
    // Ranks 0 and 2 form one group, keyed in reverse; rank 1 and 3 share key 0 (then parent order).
    const int color = r == 3 ? -1 : r % 2;
    auto sub = c.split(color, r % 2 == 0 ? -r : 0);
    Seen& s = seen[size_t(r)];
    if (!sub) {
      s.left_out = true;
      return;
    }
    s.rank = sub->rank(), s.size = sub->size();
    Tensor t = full({1}, double(1 << r), TensorOptions(kFloat64));
    all_reduce(*sub, t);
    s.sum = t.item<double>();
  });
  CHECK(seen[0].rank == 1);
  CHECK(seen[2].rank == 0);
  CHECK(seen[0].size == 2);
  CHECK(seen[0].sum == 5);  // ranks 0 and 2
  CHECK(seen[2].sum == 5);
  CHECK(seen[1].size == 1);
  CHECK(seen[1].rank == 0);
  CHECK(seen[1].sum == 2);
  CHECK(seen[3].left_out);
}

namespace {

// Runs make_groups on a world of tp*pp*dp ranks and checks each group's members (its
// all_gather of world ranks) and each rank's coordinates against the rank formula.
void check_grid(int tp, int pp, int dp) {
  const int n = tp * pp * dp;
  struct Seen {
    int tp_rank, pp_rank, dp_rank, tp_group_rank, pp_group_rank, dp_group_rank;
    std::vector<double> tp_members, pp_members, dp_members;
  };
  std::vector<Seen> seen(static_cast<size_t>(n));
  run_ranks(n, [&](const std::shared_ptr<Communicator>& world) {
    ParallelGroups g = make_groups(world, tp, pp, dp);
    auto members = [&](Communicator& c) {
      Tensor out = zeros({c.size()}, TensorOptions(kFloat64));
      c.all_gather(full({1}, double(world->rank()), TensorOptions(kFloat64)), out)->wait();
      return values_of(out);
    };
    seen[size_t(world->rank())] = {g.tp_rank,          g.pp_rank,      g.dp_rank,          g.tensor->rank(),
                                   g.pipeline->rank(), g.data->rank(), members(*g.tensor), members(*g.pipeline),
                                   members(*g.data)};
  });
  for (int r = 0; r < n; ++r) {
    const Seen& s = seen[size_t(r)];
    const int t = r % tp, p = (r / tp) % pp, d = r / (tp * pp);
    CHECK(s.tp_rank == t);
    CHECK(s.pp_rank == p);
    CHECK(s.dp_rank == d);
    CHECK(s.tp_group_rank == t);
    CHECK(s.pp_group_rank == p);
    CHECK(s.dp_group_rank == d);
    std::vector<double> tp_ref, pp_ref, dp_ref;
    for (int i = 0; i < tp; ++i) tp_ref.push_back((d * pp + p) * tp + i);
    for (int i = 0; i < pp; ++i) pp_ref.push_back((d * pp + i) * tp + t);
    for (int i = 0; i < dp; ++i) dp_ref.push_back((i * pp + p) * tp + t);
    CHECK_MESSAGE(s.tp_members == tp_ref, "tensor group of world rank ", r);
    CHECK_MESSAGE(s.pp_members == pp_ref, "pipeline group of world rank ", r);
    CHECK_MESSAGE(s.dp_members == dp_ref, "data group of world rank ", r);
  }
}

}  // namespace

TEST_CASE("threads communicator: make_groups on a 2x2 (tp x pp) and a 2x1x2 (tp x pp x dp) grid") {
  SUBCASE("tp 2, pp 2, dp 1") { check_grid(2, 2, 1); }
  SUBCASE("tp 2, pp 1, dp 2") { check_grid(2, 1, 2); }
  SUBCASE("tp 1, pp 2, dp 2") { check_grid(1, 2, 2); }
  check_error([] { run_ranks(4, [](const std::shared_ptr<Communicator>& w) { make_groups(w, 3, 1, 1); }); },
              {"make_groups", "tp 3", "world size 4"});
}

TEST_CASE("threads communicator: a collective past its timeout names op, rank, sequence number and the absent") {
  std::string rank1_error;
  const std::string err = error_of([&] {
    run_ranks(
        3,
        [&](Communicator& c) {
          c.barrier();  // #1 completes
          if (c.rank() == 1) {
            std::this_thread::sleep_for(300ms);  // misses all_reduce #2
            rank1_error = error_of([&] { c.barrier(); });
            return;
          }
          all_reduce(c, zeros({2}));
        },
        100ms);
  });
  // Ranks 0 and 2 both time out; whichever did first is the root cause run_ranks reports.
  check_contains(err, {"run_ranks: rank ", "all_reduce #2 on rank ", "timed out after 100 ms", "not arrived: rank 1"});
  // The late rank is not left hanging: its next call fails, naming the rank that timed out.
  check_contains(rank1_error, {"barrier #2 on rank 1", "failed: ", "timed out"});
}

TEST_CASE("threads communicator: a rank that throws fails the others' pending and later calls") {
  std::vector<std::string> errors(4);
  const auto start = std::chrono::steady_clock::now();
  const std::string err = error_of([&] {
    run_ranks(4, [&](Communicator& c) {  // the default timeout (10 minutes): nobody may wait for it
      if (c.rank() == 2) {
        std::this_thread::sleep_for(50ms);
        FRUGAL_FAIL("boom");
      }
      errors[size_t(c.rank())] = error_of([&] { all_reduce(c, zeros({4})); });
    });
  });
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  check_contains(err, {"run_ranks: rank 2 failed: boom"});
  for (int r : {0, 1, 3})
    check_contains(errors[size_t(r)], {str_cat("all_reduce #1 on rank ", r), "rank 2 failed: boom"});
}

TEST_CASE("threads communicator: a rank that returns early fails collectives and recvs waiting for it") {
  std::string coll, p2p;
  run_ranks(3, [&](Communicator& c) {
    if (c.rank() == 2) return;
    if (c.rank() == 0) coll = error_of([&] { all_reduce(c, zeros({1})); });
    if (c.rank() == 1) {
      p2p = error_of([&] { c.recv(zeros({1}), 2)->wait(); });
      error_of([&] { all_reduce(c, zeros({1})); });  // joins #1, so only rank 2 is missing from it
    }
  });
  check_contains(coll, {"all_reduce #1 on rank 0", "rank 2 exited without joining it"});
  check_contains(p2p, {"recv #1 from rank 2 on rank 1", "rank 2 exited without joining it"});
}

TEST_CASE("threads communicator: failures reach split groups, named by world rank") {
  std::string err;
  const std::string root = error_of([&] {
    run_ranks(4, [&](Communicator& c) {
      auto sub = c.split(c.rank() % 2, c.rank());
      if (c.rank() == 3) {
        std::this_thread::sleep_for(50ms);
        throw std::runtime_error("lost the device");
      }
      if (c.rank() == 1) err = error_of([&] { all_reduce(*sub, zeros({1})); });  // waits for rank 3
    });
  });
  check_contains(root, {"run_ranks: rank 3 failed: lost the device"});
  check_contains(err, {"all_reduce #1 on rank 0 (world rank 1)", "rank 3 failed: lost the device"});
}

TEST_CASE("threads communicator: disagreeing calls fail on every rank with both calls named") {
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& c) {
    errors[size_t(c.rank())] = error_of([&] {
      if (c.rank() == 0) all_reduce(c, zeros({4}));
      else c.broadcast(zeros({5}), 0)->wait();
    });
  });
  for (const auto& e : errors)
    check_contains(e, {"#1", "disagree", "rank 0: all_reduce float32[4]", "rank 1: broadcast float32[5]"});
  check_error([] { run_ranks(2, [](Communicator& c) { c.all_gather(zeros({2}), zeros({3})); }); },
              {"all_gather", "output", "float32[3]"});
  check_error([] { run_ranks(2, [](Communicator& c) { c.send(zeros({1}), c.rank()); }); }, {"send", "bad peer"});
}
