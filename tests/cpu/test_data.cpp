// Data loading: IDX files (MNIST/Fashion-MNIST) written by the test itself, raw and
// gzipped, and every error they can have; the real Fashion-MNIST when it is installed;
// TensorDataset/DataLoader batching, shuffling, prefetching, early exit and errors.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "memory/pinned.h"
#include "nn/data/dataloader.h"
#include "nn/data/dataset.h"
#include "nn/data/idx.h"
#include "tensor/factory.h"
#include "tests/fifo_guard.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using namespace frugal::data;

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "frugal_data_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// The bytes of an IDX file of unsigned bytes: 0, 0, 0x08, ndim, big-endian sizes, data.
std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& shape, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, uint8_t(shape.size())};
  for (uint32_t s : shape)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(s >> shift));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// Deterministic bytes.
std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t((i * 2654435761u + seed * 40503u) >> 7);
  return v;
}

// A dataset whose sample i is identifiable: inputs[i] = (i, i + 0.5, -i) (float32) and
// targets[i] = (2i, 2i + 1) (int64).
TensorDataset numbered_dataset(int64_t n) {
  std::vector<float> in;
  std::vector<int64_t> tg;
  for (int64_t i = 0; i < n; ++i) {
    in.insert(in.end(), {float(i), float(i) + 0.5f, -float(i)});
    tg.insert(tg.end(), {2 * i, 2 * i + 1});
  }
  return TensorDataset(from_vector(in, {n, 3}), from_vector(tg, {n, 2}));
}

// Checks that `b` holds exactly the samples `indices` of numbered_dataset, row by row,
// and returns them read back from the targets.
void check_batch(const Batch& b, const std::vector<int64_t>& indices) {
  const int64_t n = int64_t(indices.size());
  REQUIRE(b.inputs.sizes() == Shape{n, 3});
  REQUIRE(b.targets.sizes() == Shape{n, 2});
  CHECK(b.inputs.dtype() == kFloat32);
  CHECK(b.targets.dtype() == kInt64);
  CHECK(b.inputs.device() == kCPU);
  const std::vector<float> in = b.inputs.tolist<float>();
  const std::vector<int64_t> tg = b.targets.tolist<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = indices[size_t(r)];
    CHECK(in[size_t(3 * r)] == float(i));
    CHECK(in[size_t(3 * r + 1)] == float(i) + 0.5f);
    CHECK(in[size_t(3 * r + 2)] == -float(i));
    CHECK(tg[size_t(2 * r)] == 2 * i);
    CHECK(tg[size_t(2 * r + 1)] == 2 * i + 1);
  }
}

// The sample indices of one full pass, batch by batch, read from the targets.
std::vector<std::vector<int64_t>> run_pass(DataLoader& loader) {
  std::vector<std::vector<int64_t>> batches;
  for (Batch& b : loader) {
    std::vector<int64_t> idx;
    const std::vector<int64_t> tg = b.targets.tolist<int64_t>();
    for (size_t r = 0; r < tg.size(); r += 2) idx.push_back(tg[r] / 2);
    check_batch(b, idx);
    batches.push_back(idx);
  }
  return batches;
}

std::vector<int64_t> flatten(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

}  // namespace

// ---- IDX files ------------------------------------------------------------------------

TEST_CASE("idx: raw and gzipped files read back byte for byte") {
  TempDir dir;
  const std::vector<uint8_t> images = pattern(4 * 5 * 3, 1);
  const std::vector<uint8_t> labels = {3, 0, 9, 1};
  for (bool gz : {false, true}) {
    INFO("gzip: " << gz);
    const std::string ip = dir.file(gz ? "img.gz" : "img"), lp = dir.file(gz ? "lbl.gz" : "lbl");
    (gz ? write_gz : write_raw)(ip, idx_bytes({4, 5, 3}, images));
    (gz ? write_gz : write_raw)(lp, idx_bytes({4}, labels));

    const IdxData img = read_idx(ip);
    CHECK(img.path == ip);
    CHECK(img.shape == std::vector<int64_t>{4, 5, 3});
    CHECK(img.bytes == images);
    const Tensor t = idx_images_to_tensor(img);
    REQUIRE(t.sizes() == Shape{4, 1, 5, 3});
    CHECK(t.dtype() == kFloat32);
    const std::vector<float> v = t.tolist<float>();
    for (size_t i = 0; i < images.size(); ++i) CHECK(double(v[i]) == doctest::Approx(images[i] / 255.0).epsilon(1e-7));

    const Tensor l = idx_labels_to_tensor(read_idx(lp));
    CHECK(l.dtype() == kInt64);
    CHECK(l.tolist<int64_t>() == std::vector<int64_t>{3, 0, 9, 1});
  }
  // Extremes of the scaling, and an empty file of labels.
  const std::string ep = dir.file("edge");
  write_raw(ep, idx_bytes({1, 1, 2}, {0, 255}));
  CHECK(idx_images_to_tensor(read_idx(ep)).tolist<float>() == std::vector<float>{0.0f, 1.0f});
  write_raw(ep, idx_bytes({0}, {}));
  CHECK(idx_labels_to_tensor(read_idx(ep)).sizes() == Shape{0});
}

TEST_CASE("idx: malformed files are rejected with the file named") {
  TempDir dir;
  const std::string p = dir.file("bad-idx");
  auto expect = [&](const std::vector<uint8_t>& bytes, std::vector<std::string> parts, bool gz = false) {
    (gz ? write_gz : write_raw)(p, bytes);
    parts.push_back(p);
    check_error([&] { read_idx(p); }, parts);
  };
  check_error([&] { read_idx(dir.file("missing")); }, {"read_idx: cannot open", dir.file("missing"), "No such file"});
  // gzopen on a FIFO blocked in open() until a writer came.
  CHECK(returns_without_blocking_on_fifo(dir.file("fifo"), [&] {
    check_error([&] { read_idx(dir.file("fifo")); }, {"read_idx", dir.file("fifo"), "not a regular file (a FIFO)"});
  }));
  check_error([&] { read_idx(dir.path.string()); }, {"read_idx", "not a regular file (a directory)"});
  expect({0, 0}, {"file is 2 bytes, too short for the 4-byte magic number"});
  expect({0, 0}, {"gzip data is 2 bytes, too short for the 4-byte magic number"}, /*gz=*/true);
  expect({0x1f, 0x9c, 0x08, 0x01, 0, 0, 0, 0}, {"not an IDX file", "0x1f9c0801"});
  expect({0, 0, 0x0D, 0x01, 0, 0, 0, 1, 0, 0, 0, 0}, {"element type 0x0d", "0x00000d01", "only 0x08"});
  expect({0, 0, 0x08, 0x00}, {"declares 0 dimensions"});
  expect({0, 0, 0x08, 0x03, 0, 0, 0, 2, 0, 0}, {"file ends inside the sizes of its 3 dimensions"});
  expect(idx_bytes({3, 4}, pattern(7, 2)), {"[3, 4]", "need 12 data bytes but the file holds only 7"});
  expect(idx_bytes({3, 4}, pattern(7, 2)), {"need 12 data bytes but the file holds only 7"}, /*gz=*/true);
  expect(idx_bytes({2}, {1, 2, 3}), {"need 2 data bytes but the file holds more"});
  expect(idx_bytes({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}), {"hold too many elements"});
  // A gzip stream cut short: zlib reports the damage.
  {
    const std::string gz = dir.file("cut.gz");
    write_gz(gz, idx_bytes({64, 64}, pattern(4096, 3)));
    std::vector<uint8_t> bytes;
    {
      std::ifstream in(gz, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    bytes.resize(bytes.size() / 2);
    write_raw(p, bytes);
    check_error([&] { read_idx(p); }, {p});
  }
  // The converters check which kind of file they were given.
  write_raw(p, idx_bytes({2}, {1, 2}));
  check_error(
      [&] { idx_images_to_tensor(read_idx(p)); },
      {"idx_images_to_tensor", p, "has 1 dimensions", "magic 0x00000801", "an image file has 3 (magic 0x00000803)"});
  write_raw(p, idx_bytes({1, 2, 2}, {1, 2, 3, 4}));
  check_error([&] { idx_labels_to_tensor(read_idx(p)); },
              {"idx_labels_to_tensor", p, "has 3 dimensions", "a label file has 1 (magic 0x00000801)"});
  IdxData forged{"forged", {2, 2, 2}, {1, 2, 3}};
  check_error([&] { idx_images_to_tensor(forged); }, {"forged", "3 bytes do not match dimensions [2, 2, 2]"});
}

TEST_CASE("fashion-mnist: loads the four files, gzipped or raw, and checks them") {
  TempDir dir;
  const std::vector<uint8_t> train_img = pattern(3 * 28 * 28, 5), test_img = pattern(2 * 28 * 28, 6);
  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_bytes({3, 28, 28}, train_img));
  write_raw(dir.file("train-labels-idx1-ubyte"), idx_bytes({3}, {9, 0, 4}));
  write_raw(dir.file("t10k-images-idx3-ubyte"), idx_bytes({2, 28, 28}, test_img));
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({2}, {7, 7}));

  const FashionMnist d = load_fashion_mnist(dir.path.string());
  CHECK(d.train_images.sizes() == Shape{3, 1, 28, 28});
  CHECK(d.test_images.sizes() == Shape{2, 1, 28, 28});
  CHECK(d.train_labels.tolist<int64_t>() == std::vector<int64_t>{9, 0, 4});
  CHECK(d.test_labels.tolist<int64_t>() == std::vector<int64_t>{7, 7});
  const std::vector<float> v = d.test_images.tolist<float>();
  for (size_t i = 0; i < test_img.size(); i += 97) CHECK(double(v[i]) == doctest::Approx(test_img[i] / 255.0));

  SUBCASE("a missing file") {
    fs::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
    check_error([&] { load_fashion_mnist(dir.path.string()); },
                {"neither", dir.file("t10k-labels-idx1-ubyte.gz"), dir.file("t10k-labels-idx1-ubyte"), "exists"});
  }
  SUBCASE("images and labels disagree in count") {
    write_raw(dir.file("train-labels-idx1-ubyte"), idx_bytes({2}, {1, 2}));
    check_error([&] { load_fashion_mnist(dir.path.string()); },
                {"holds 3 images but", dir.file("train-labels-idx1-ubyte"), "holds 2 labels"});
  }
  SUBCASE("a label outside [0, 10)") {
    write_raw(dir.file("train-labels-idx1-ubyte"), idx_bytes({3}, {1, 10, 2}));
    check_error([&] { load_fashion_mnist(dir.path.string()); }, {"label 10 at index 1 is outside [0, 10)"});
  }
  SUBCASE("images that are not 28x28") {
    write_raw(dir.file("t10k-images-idx3-ubyte"), idx_bytes({2, 27, 28}, pattern(2 * 27 * 28, 1)));
    check_error([&] { load_fashion_mnist(dir.path.string()); }, {"holds 27x28 images, expected 28x28"});
  }
}

TEST_CASE("fashion-mnist: the real dataset, when installed (Debian: dataset-fashion-mnist)") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("Fashion-MNIST not installed in " << dir << ": skipped");
    return;
  }
  const FashionMnist d = load_fashion_mnist(dir);
  CHECK(d.train_images.sizes() == Shape{60000, 1, 28, 28});
  CHECK(d.train_labels.sizes() == Shape{60000});
  CHECK(d.test_images.sizes() == Shape{10000, 1, 28, 28});
  CHECK(d.test_labels.sizes() == Shape{10000});
  // Published facts about the dataset: balanced classes, the first training item is an
  // ankle boot (9), the first test item too, and the training pixel mean is 0.2860.
  for (const auto& [labels, per_class] : {std::pair{d.train_labels, 6000}, std::pair{d.test_labels, 1000}}) {
    std::vector<int64_t> count(10, 0);
    for (int64_t l : labels.tolist<int64_t>()) ++count[size_t(l)];
    CHECK(count == std::vector<int64_t>(10, per_class));
  }
  CHECK(d.train_labels.tolist<int64_t>()[0] == 9);
  CHECK(d.test_labels.tolist<int64_t>()[0] == 9);
  const std::vector<float> px = d.train_images.tolist<float>();
  double sum = 0;
  float lo = 1, hi = 0;
  for (float x : px) sum += x, lo = std::min(lo, x), hi = std::max(hi, x);
  CHECK(sum / double(px.size()) == doctest::Approx(0.2860).epsilon(0.001));
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
}

// ---- TensorDataset and DataLoader -------------------------------------------------------

TEST_CASE("dataloader: every sample exactly once per epoch, batches hold the right rows") {
  const TensorDataset ds = numbered_dataset(103);
  CHECK(ds.size() == 103);
  for (int64_t prefetch : {0, 1, 2, 5}) {
    INFO("prefetch " << prefetch);
    DataLoader loader(ds, {.batch_size = 10, .shuffle = true, .seed = 5, .prefetch = prefetch});
    CHECK(loader.size() == 11);
    for (int epoch = 0; epoch < 3; ++epoch) {
      const auto batches = run_pass(loader);
      REQUIRE(batches.size() == 11);
      for (size_t b = 0; b < 10; ++b) CHECK(batches[b].size() == 10);
      CHECK(batches[10].size() == 3);  // the last, partial batch
      std::vector<int64_t> all = flatten(batches);
      CHECK(all == loader.order(epoch));  // in the announced order
      std::sort(all.begin(), all.end());
      std::vector<int64_t> expected(103);
      std::iota(expected.begin(), expected.end(), 0);
      CHECK(all == expected);  // a permutation: each sample once
    }
    CHECK(loader.epoch() == 3);
  }
}

TEST_CASE("dataloader: orders are reproducible, differ across epochs and seeds, and are uniform") {
  const TensorDataset ds = numbered_dataset(50);
  DataLoader a(ds, {.batch_size = 7, .shuffle = true, .seed = 42});
  DataLoader b(ds, {.batch_size = 7, .shuffle = true, .seed = 42});
  DataLoader c(ds, {.batch_size = 7, .shuffle = true, .seed = 43});
  const std::vector<int64_t> a0 = flatten(run_pass(a)), a1 = flatten(run_pass(a));
  CHECK(a0 != a1);
  CHECK(flatten(run_pass(b)) == a0);  // same seed, same epoch
  b.set_epoch(1);
  CHECK(flatten(run_pass(b)) == a1);
  CHECK(flatten(run_pass(c)) != a0);  // another seed
  // set_epoch picks the epoch of the next pass, which then advances.
  a.set_epoch(7);
  CHECK(flatten(run_pass(a)) == a.order(7));
  CHECK(flatten(run_pass(a)) == a.order(8));
  CHECK(a.epoch() == 9);

  // Without shuffle: the dataset's order, every epoch.
  DataLoader seq(ds, {.batch_size = 8});
  std::vector<int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(flatten(run_pass(seq)) == identity);
  CHECK(flatten(run_pass(seq)) == identity);

  // Fisher-Yates with an unbiased generator: over 6000 epochs, each of 6 samples comes
  // first about 1000 times (binomial sd ~29; allow 5 sd).
  DataLoader small(numbered_dataset(6), {.batch_size = 6, .shuffle = true, .seed = 9});
  std::vector<int> first(6, 0), last(6, 0);
  for (int e = 0; e < 6000; ++e) {
    const std::vector<int64_t> o = small.order(e);
    ++first[size_t(o.front())];
    ++last[size_t(o.back())];
  }
  for (int i = 0; i < 6; ++i) {
    CHECK(std::abs(first[size_t(i)] - 1000) < 145);
    CHECK(std::abs(last[size_t(i)] - 1000) < 145);
  }
}

TEST_CASE("dataloader: drop_last, batch larger than the dataset, empty dataset") {
  const TensorDataset ds = numbered_dataset(103);
  DataLoader drop(ds, {.batch_size = 10, .shuffle = true, .seed = 1, .drop_last = true});
  CHECK(drop.size() == 10);
  const auto batches = run_pass(drop);
  REQUIRE(batches.size() == 10);
  std::vector<int64_t> all = flatten(batches);
  CHECK(all.size() == 100);
  CHECK(std::set<int64_t>(all.begin(), all.end()).size() == 100);  // no sample twice
  const std::vector<int64_t> order = drop.order(0);
  CHECK(all == std::vector<int64_t>(order.begin(), order.begin() + 100));  // the 3 left out are the last 3

  DataLoader whole(ds, {.batch_size = 500});
  CHECK(whole.size() == 1);
  CHECK(run_pass(whole).at(0).size() == 103);
  DataLoader none(ds, {.batch_size = 500, .drop_last = true});
  CHECK(none.size() == 0);
  CHECK(run_pass(none).empty());

  DataLoader empty_loader(numbered_dataset(0), {.batch_size = 4, .shuffle = true});
  CHECK(empty_loader.size() == 0);
  CHECK(run_pass(empty_loader).empty());
  Batch b;
  CHECK_FALSE(empty_loader.next(b));
}

TEST_CASE("dataloader: next() walks one epoch, returns false, then starts the next") {
  const TensorDataset ds = numbered_dataset(20);
  DataLoader loader(ds, {.batch_size = 6, .shuffle = true, .seed = 3});
  for (int epoch = 0; epoch < 2; ++epoch) {
    const std::vector<int64_t> order = loader.order(epoch);
    Batch b;
    int64_t seen = 0;
    while (loader.next(b)) {
      const int64_t n = b.inputs.size(0);
      check_batch(b, std::vector<int64_t>(order.begin() + seen, order.begin() + seen + n));
      seen += n;
    }
    CHECK(seen == 20);
  }
}

TEST_CASE("dataloader: leaving a pass early never deadlocks") {
  const TensorDataset ds = numbered_dataset(1000);
  for (int64_t prefetch : {0, 1, 2, 8}) {
    INFO("prefetch " << prefetch);
    {
      DataLoader loader(ds, {.batch_size = 3, .shuffle = true, .prefetch = prefetch});
      for (Batch& b : loader) {
        CHECK(b.inputs.size(0) == 3);
        break;  // the worker is blocked on a full queue now
      }
      // A new pass after an abandoned one starts from the beginning of the next epoch.
      const std::vector<int64_t> order = loader.order(1);
      size_t seen = 0;
      for (Batch& b : loader) {
        check_batch(b, std::vector<int64_t>(order.begin() + int64_t(seen), order.begin() + int64_t(seen) + 3));
        seen += 3;
        if (seen == 6) break;
      }
    }  // destroyed with a worker waiting: joined cleanly
    DataLoader unused(ds, {.batch_size = 3, .prefetch = prefetch});
    Batch b;
    CHECK(unused.next(b));  // started, then destroyed mid-pass
  }
}

TEST_CASE("dataloader: non-contiguous dataset tensors and batches in pinned memory") {
  // inputs (N, 2, 3) stored transposed; targets a strided view.
  const int64_t n = 9;
  const Tensor inputs = random_tensor({n, 2, 3}, {kFloat64, kCPU}, 3, Layout::Transposed);
  const Tensor targets = random_tensor({n}, {kFloat32, kCPU}, 4, Layout::Strided);
  REQUIRE_FALSE(inputs.is_contiguous());
  const std::vector<double> in = values_of(inputs), tg = values_of(targets);
  DataLoader loader(TensorDataset(inputs, targets), {.batch_size = 4, .shuffle = true, .seed = 8});
  const std::vector<int64_t> order = loader.order(0);
  const memory::MemoryStats before = memory::pinned_stats();
  int64_t seen = 0;
  for (Batch& b : loader) {
    const int64_t rows = b.inputs.size(0);
    CHECK(b.inputs.sizes() == Shape{rows, 2, 3});
    CHECK(b.targets.sizes() == Shape{rows});
    CHECK(b.inputs.is_contiguous());
    const std::vector<double> bi = values_of(b.inputs), bt = values_of(b.targets);
    for (int64_t r = 0; r < rows; ++r) {  // rows gathered by hand from the original views
      const int64_t i = order[size_t(seen + r)];
      for (int64_t k = 0; k < 6; ++k) CHECK(bi[size_t(r * 6 + k)] == in[size_t(i * 6 + k)]);
      CHECK(bt[size_t(r)] == tg[size_t(i)]);
    }
    seen += rows;
  }
  CHECK(seen == n);
  CHECK(memory::pinned_stats().num_allocs > before.num_allocs);  // staged through the pinned pool
}

TEST_CASE("dataloader: an error in the worker reaches the consumer, in order") {
  // Batches of 4 MiB against a 1 MiB cap on the pinned pool: the worker's allocation fails.
  const TensorDataset ds(zeros({64, 16384}, {kFloat32, kCPU}), zeros({64}, {kInt64, kCPU}));
  memory::empty_pinned_cache();
  memory::set_pinned_memory_limit(size_t(1) << 20);
  for (int64_t prefetch : {0, 2}) {
    INFO("prefetch " << prefetch);
    DataLoader loader(ds, {.batch_size = 64, .prefetch = prefetch});
    Batch b;
    check_error([&] { loader.next(b); }, {"pinned host out of memory", "tried to allocate 4.00 MiB"});
  }
  memory::set_pinned_memory_limit(0);
  DataLoader loader(ds, {.batch_size = 64});
  Batch b;
  CHECK(loader.next(b));  // the loader recovers once memory is available
  CHECK(b.inputs.sizes() == Shape{64, 16384});
}

TEST_CASE("dataloader and dataset: invalid arguments") {
  const Tensor x = zeros({4, 2}), y = zeros({3});
  check_error([&] { TensorDataset bad(x, y); },
              {"TensorDataset", "float32[4, 2] cpu", "float32[3] cpu", "differ in their number of samples"});
  check_error([&] { TensorDataset bad(zeros({}), zeros({})); }, {"TensorDataset", "need a first (sample) dimension"});
  check_error([&] { TensorDataset bad(x, Tensor()); }, {"TensorDataset", "must be defined"});
  const TensorDataset ds(x, zeros({4}));
  check_error([&] { DataLoader bad(ds, {.batch_size = 0}); }, {"DataLoader: batch_size must be >= 1, got 0"});
  check_error([&] { DataLoader bad(ds, {.prefetch = -1}); }, {"DataLoader: prefetch must be >= 0, got -1"});
  if (cuda_device_count() == 0)
    check_error([&] { DataLoader bad(ds, {.device = cuda(0)}); }, {"DataLoader: device cuda:0 is not available"});
  DataLoader loader(ds);
  check_error([&] { loader.set_epoch(-1); }, {"epoch must be >= 0"});
  Tensor d = from_data_ptr(memory::allocate(kCPU, 16), {2, 2}, kFloat32);
  CHECK(d.sizes() == Shape{2, 2});
  check_error(
      [&] {
        from_data_ptr(memory::allocate(kCPU, 8), {2, 2}, kFloat32);
      },
      {"from_data_ptr: 8 bytes cannot hold float32[2, 2] (16 bytes)"});
  // 2^62 x 4 bytes once wrapped to 0, which 16 bytes "held".
  check_error(
      [&] {
        from_data_ptr(memory::allocate(kCPU, 16), {int64_t(1) << 62, 1}, kFloat32);
      },
      {"from_data_ptr", "float32[4611686018427387904, 1]", "more than 2^63 - 1 bytes"});
  check_error([&] { from_data_ptr(memory::allocate(kCPU, 16), {2, -2}, kFloat32); }, {"from_data_ptr", "negative"});
}
