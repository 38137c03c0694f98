// data::DataLoader delivering to CUDA (Note [DataLoader pipeline]): batches staged on the
// side stream while the step's stream is busy arrive with the CPU loader's values; the
// position counts delivered batches only; an abandoned staged copy is safe.
#include <doctest/doctest.h>

#include <vector>

#include "nn/data/dataloader.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using data::Batch;
using data::DataLoader;
using data::DataLoaderOptions;
using data::TensorDataset;

namespace {

TensorDataset numbered_dataset(int64_t n) {
  std::vector<double> x(static_cast<size_t>(n * 15)), y(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(i) * 0.5;
  for (size_t i = 0; i < y.size(); ++i) y[i] = double(3 * i + 1);
  return TensorDataset(make_tensor(x, {n, 3, 5}, kFloat32), make_tensor(y, {n}, kInt64));
}

// Keeps the current stream busy for a while, so a copy on the side stream overlaps it.
void busy_step() {
  const Tensor a = ones({1024, 1024}, {kFloat32, cuda()});
  Tensor b = a;
  for (int k = 0; k < 8; ++k) b = ops::mm(a, b);
}

}  // namespace

TEST_CASE("cuda dataloader: staged batches equal the CPU loader's while the step's stream is busy") {
  const TensorDataset ds = numbered_dataset(53);
  for (int64_t workers : {1, 3}) {
    CAPTURE(workers);
    const DataLoaderOptions o{.batch_size = 4, .shuffle = true, .seed = 7, .prefetch = 3, .workers = workers};
    DataLoader host(ds, o);
    DataLoaderOptions od = o;
    od.device = cuda();
    DataLoader device(ds, od);
    for (int epoch = 0; epoch < 2; ++epoch) {
      Batch hb, db;
      int64_t n = 0;
      while (host.next(hb)) {
        REQUIRE(device.next(db));
        CAPTURE(n);
        CHECK(db.inputs.device() == cuda());
        CHECK(values_of(db.inputs) == values_of(hb.inputs));
        CHECK(values_of(db.targets) == values_of(hb.targets));
        busy_step();  // the next batch's copy, if staged, runs during this
        ++n;
        CHECK(device.position().batch == (n == device.size() ? 0 : n));  // delivered, not staged
      }
      CHECK_FALSE(device.next(db));
      CHECK(n == device.size());
    }
    // The workers keep ahead of a busy consumer, so most batches after the first of a pass are staged.
    MESSAGE("side-stream copies: ", device.side_stream_copies(), " of ", 2 * device.size());
    CHECK(device.side_stream_copies() >= device.size());
  }
}

TEST_CASE("cuda dataloader: a pass abandoned with a batch staged, then a fresh pass") {
  const TensorDataset ds = numbered_dataset(40);
  DataLoaderOptions o{.batch_size = 5, .device = cuda(), .prefetch = 2};
  DataLoader loader(ds, o);
  Batch b;
  for (int k = 0; k < 3; ++k) {
    REQUIRE(loader.next(b));
    busy_step();
  }
  loader.set_position({0, 0});  // abandons the pass and its staged copy
  for (int64_t i = 0; i < loader.size(); ++i) {
    REQUIRE(loader.next(b));
    const std::vector<double> t = values_of(b.targets);
    for (size_t r = 0; r < t.size(); ++r) CHECK(t[r] == double(3 * (i * 5 + int64_t(r)) + 1));
  }
}
