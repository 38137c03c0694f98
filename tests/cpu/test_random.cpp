// The Philox generator (Random123's known answers) and the random fills: seeded and
// reproducible streams, their distributions, strided targets, and a generator shared by threads.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/random.h"
#include "tensor/philox.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("philox: Random123 known-answer vectors") {
  struct Kat {
    uint32_t c[4], k[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const PhiloxResult r = philox4x32_10(k.c[0], k.c[1], k.c[2], k.c[3], k.k[0], k.k[1]);
    for (int i = 0; i < 4; ++i) CHECK(r.x[i] == k.out[i]);
  }
}

TEST_CASE("random: seeded, reproducible, right distributions") {
  manual_seed(42);
  Tensor a = rand({10000});
  manual_seed(42);
  Tensor b = rand({10000});
  CHECK(values_of(a) == values_of(b));
  Tensor c = rand({10000});  // the stream moved on
  CHECK(values_of(a) != values_of(c));

  const std::vector<double> u = values_of(a);
  double mean = 0;
  for (double x : u) {
    REQUIRE(x >= 0.0);
    REQUIRE(x < 1.0);
    mean += x / double(u.size());
  }
  CHECK(mean == doctest::Approx(0.5).epsilon(0.02));

  Generator g(7);
  const std::vector<double> n = values_of(randn({200000}, kFloat64, &g));
  double m = 0, sq = 0;
  for (double x : n) m += x / double(n.size());
  for (double x : n) sq += (x - m) * (x - m) / double(n.size());
  CHECK(std::fabs(m) < 0.01);
  CHECK(std::sqrt(sq) == doctest::Approx(1.0).epsilon(0.01));

  // Element i is philox word i % 4 of counter i / 4: check against the block function directly.
  Generator g2(123);
  const std::vector<double> v = values_of(rand({8}, kFloat64, &g2));
  for (int i = 0; i < 8; ++i) CHECK(v[i] == double(philox_uniform(philox4x32(123, uint64_t(i / 4)).x[i % 4])));

  const std::vector<double> ri = values_of(randint(-3, 4, {5000}));
  std::vector<int> hist(7, 0);
  for (double x : ri) {
    REQUIRE(x >= -3);
    REQUIRE(x < 4);
    ++hist[size_t(x + 3)];
  }
  for (int h : hist) CHECK(h > 500);
  check_error([] { randint(3, 3, {2}); }, {"randint", "3"});
  check_error([] { rand({2}, kInt32); }, {"uniform_", "int32"});

  // A strided target gets the same values a dense one would.
  Generator g3(5), g4(5);
  Tensor dense = rand({3, 4}, kFloat32, &g3);
  Tensor strided = zeros({4, 3}).t();
  ops::uniform_(strided, 0, 1, &g4);
  CHECK(values_of(strided) == values_of(dense));
}

// Rank threads share the default generator while a checkpoint reads its state (under
// TSan, the unlocked seed()/offset() of before were a data race).
TEST_CASE("random: one generator, threads drawing while another reads its state") {
  Generator g(5);
  constexpr int kDrawers = 2, kDraws = 500;
  std::vector<std::vector<uint64_t>> firsts(kDrawers);
  std::vector<std::thread> threads;
  for (int t = 0; t < kDrawers; ++t)
    threads.emplace_back([&g, &mine = firsts[size_t(t)]] {
      for (int i = 0; i < kDraws; ++i) mine.push_back(g.reserve(3).counter);
    });
  bool monotone = true, seed_kept = true;
  uint64_t last = 0;
  for (int i = 0; i < 2 * kDraws; ++i) {
    const uint64_t now = g.offset();
    monotone = monotone && now >= last && now % 3 == 0;
    seed_kept = seed_kept && g.seed() == 5;
    last = now;
  }
  for (auto& th : threads) th.join();
  CHECK(monotone);
  CHECK(seed_kept);
  CHECK(g.offset() == uint64_t(3 * kDrawers * kDraws));
  std::vector<uint64_t> all;  // every reservation got its own counters: 0, 3, 6, ...
  for (const auto& v : firsts) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  bool distinct = true;
  for (size_t i = 0; i < all.size(); ++i) distinct = distinct && all[i] == 3 * i;
  CHECK(distinct);
}

TEST_CASE("random: manual_seed seeds and rewinds the one default generator; set_state replays a position") {
  manual_seed(11);
  const std::vector<double> first = values_of(rand({64}));
  rand({1000});
  CHECK(default_generator().offset() > 0);
  manual_seed(11);  // every generator: the CPU and each CUDA device draw from this one
  CHECK(default_generator().seed() == 11);
  CHECK(default_generator().offset() == 0);
  CHECK(values_of(rand({64})) == first);

  // What a checkpoint saves (train/checkpoints.h): (seed, offset) resumes the stream.
  const uint64_t seed = default_generator().seed(), offset = default_generator().offset();
  const std::vector<double> next = values_of(randn({33}));
  manual_seed(999);
  rand({5});
  default_generator().set_state(seed, offset);
  CHECK(values_of(randn({33})) == next);
}
