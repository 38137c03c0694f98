// Probes of the data pipeline at its limits (2026-12-05 findings): a DataLoader whose prefetch
// is INT64_MAX hung (the workers' window overflowed), one whose worker threads the system
// refuses aborted the process (std::terminate on unwinding), and mask_for_mlm passed ids
// outside the vocab through as labels.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "nn/data/dataloader.h"
#include "nn/data/dataset.h"
#include "nn/data/mlm_masking.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::data;
using namespace frugal::testing;

namespace {
TensorDataset counting(int64_t n) {
  const Tensor x = arange(0.0, double(n), 1.0, TensorOptions(kInt64)).reshape({n, 1});
  return TensorDataset(x, x.clone());
}
}  // namespace

TEST_CASE("probe data limits: prefetch = INT64_MAX delivers every batch (the window does not overflow)") {
  const int64_t n = 2000;
  DataLoader loader(counting(n), {.batch_size = 1, .shuffle = true, .seed = 5, .prefetch = INT64_MAX, .workers = 2});
  std::set<int64_t> seen;
  int64_t batches = 0;
  for (Batch& b : loader) {
    seen.insert(b.inputs.data_ptr<int64_t>()[0]);
    ++batches;
  }
  CHECK(batches == n);
  CHECK(int64_t(seen.size()) == n);
}

TEST_CASE("probe data limits: worker threads the system refuses give an error naming workers, not an abort") {
  // In a child process whose address space is capped a little above what it uses, 2000 worker
  // threads (8 MiB of stack each) cannot all start: the loader must stop the ones it started
  // and throw. Exit codes: 0 the error, 2 another error, 3 no error at all.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(60);  // a hang fails the test instead of stalling it
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t cap = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE)) + (rlim_t(512) << 20);
    const struct rlimit limit = {cap, cap};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(4);
    int code = 3;
    try {
      DataLoader loader(counting(4000), {.batch_size = 1, .prefetch = 1, .workers = 2000});
      for (Batch& b : loader) (void)b;
    } catch (const Error& e) {
      const std::string what = e.what();
      code = what.find("DataLoader: could not start worker thread") != std::string::npos &&
                     what.find("workers = 2000") != std::string::npos
                 ? 0
                 : 2;
    } catch (...) { code = 2; }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE_MESSAGE(WIFEXITED(status), "the child died of signal ", WTERMSIG(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("probe data limits: mask_for_mlm refuses ids outside the vocab, naming the position") {
  const MlmMasking m{.vocab_size = 50, .mask_id = 4, .special_ids = {0, 1, 2, 3, 4}};
  Generator gen(1);
  for (const std::vector<int64_t>& bad : std::vector<std::vector<int64_t>>{{2, 999999, 7, 3}, {2, -100, 7, 3}}) {
    std::vector<int64_t> ids = bad, labels(ids.size());
    check_error([&] { mask_for_mlm(ids, labels, m, gen); },
                {"mask_for_mlm", "id " + std::to_string(bad[1]), "position 1", "vocab of 50"});
  }
  // Ids within the vocab still mask: one of the three non-special positions at least.
  std::vector<int64_t> ids = {2, 10, 11, 12, 3}, labels(ids.size());
  CHECK(mask_for_mlm(ids, labels, m, gen) >= 1);
}
