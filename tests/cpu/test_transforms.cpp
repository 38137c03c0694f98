// Datasets and transforms: uint8 -> float conversion, ImageDataset, each transform against
// a naive loop that replays the same draws from the same seed (crop offsets, flips, the
// erasing box computed here from torchvision's algorithm), Normalize in float64,
// TransformedDataset's per-sample randomness, collate, and a DataLoader over any Dataset
// whose batches do not depend on its number of workers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "nn/data/dataloader.h"
#include "nn/data/dataset.h"
#include "nn/data/transforms.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using namespace frugal::data;

namespace {

// A uint8 tensor of `sizes` holding bytes (k * 37 + salt) mod 256 in row-major order.
Tensor byte_tensor(const Shape& sizes, uint32_t salt = 0) {
  Tensor t = empty(sizes, {kUInt8, kCPU});
  uint8_t* p = t.data_ptr<uint8_t>();
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = uint8_t((uint32_t(k) * 37u + salt) % 256u);
  return t;
}

// A float32 tensor of `sizes` with values from random_values(seed).
Tensor float_tensor(const Shape& sizes, uint64_t seed) {
  Tensor t = empty(sizes, {kFloat32, kCPU});
  const std::vector<double> v = random_values(t.numel(), seed);
  float* p = t.data_ptr<float>();
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = float(v[size_t(k)]);
  return t;
}

// Every element as a double, row-major (uint8, float32, int64).
std::vector<double> values(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<double> out(size_t(c.numel()));
  for (int64_t k = 0; k < c.numel(); ++k) {
    if (c.dtype() == kUInt8) out[size_t(k)] = c.data_ptr<uint8_t>()[k];
    else if (c.dtype() == kFloat32) out[size_t(k)] = c.data_ptr<float>()[k];
    else if (c.dtype() == kInt64) out[size_t(k)] = double(c.data_ptr<int64_t>()[k]);
    else FAIL("values: unexpected dtype");
  }
  return out;
}

// The reference crop: pad `x` (C, H, W) with `pad` zeros on each side, then cut the
// size x size window at (top, left), element by element.
std::vector<double> ref_crop(const Tensor& x, int64_t size, int64_t pad, int64_t top, int64_t left) {
  const int64_t C = x.size(0), H = x.size(1), W = x.size(2), Hp = H + 2 * pad, Wp = W + 2 * pad;
  const std::vector<double> in = values(x);
  std::vector<double> padded(size_t(C * Hp * Wp), 0.0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t j = 0; j < W; ++j)
        padded[size_t((c * Hp + y + pad) * Wp + j + pad)] = in[size_t((c * H + y) * W + j)];
  std::vector<double> out;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < size; ++y)
      for (int64_t j = 0; j < size; ++j) out.push_back(padded[size_t((c * Hp + top + y) * Wp + left + j)]);
  return out;
}

std::vector<double> ref_flip(const Tensor& x) {
  const int64_t C = x.size(0), H = x.size(1), W = x.size(2);
  const std::vector<double> in = values(x);
  std::vector<double> out(in.size());
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t j = 0; j < W; ++j) out[size_t((c * H + y) * W + j)] = in[size_t((c * H + y) * W + W - 1 - j)];
  return out;
}

// torchvision.transforms.RandomErasing.get_params + F.erase, written from its source, with
// the draws taken from `gen` in the documented order.
std::vector<double> ref_erase(const Tensor& x, Generator& gen, double p, double s0, double s1, double r0, double r1,
                              double value, bool* erased) {
  std::vector<double> out = values(x);
  *erased = false;
  if (!(draw_uniform(gen) < p)) return out;
  const int64_t C = x.size(0), H = x.size(1), W = x.size(2);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double area = double(H * W) * (s0 + (s1 - s0) * draw_uniform(gen));
    const double lr0 = std::log(r0), lr1 = std::log(r1);
    const double aspect = std::exp(lr0 + (lr1 - lr0) * draw_uniform(gen));
    const double hh = std::sqrt(area * aspect), ww = std::sqrt(area / aspect);
    // Python's round: to the nearest, halves to even.
    auto py_round = [](double v) {
      const double f = std::floor(v), d = v - f;
      if (d > 0.5) return int64_t(f) + 1;
      if (d < 0.5) return int64_t(f);
      return int64_t(f) % 2 == 0 ? int64_t(f) : int64_t(f) + 1;
    };
    const int64_t h = py_round(hh), w = py_round(ww);
    if (!(h < H && w < W)) continue;
    const int64_t top = draw_below(gen, H - h + 1), left = draw_below(gen, W - w + 1);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = top; y < top + h; ++y)
        for (int64_t j = left; j < left + w; ++j) out[size_t((c * H + y) * W + j)] = value;
    *erased = true;
    return out;
  }
  return out;
}

std::shared_ptr<const Dataset> image_dataset(int64_t n, const Shape& image) {
  Shape sizes = image;
  sizes.insert(sizes.begin(), n);
  Tensor labels = empty({n}, {kInt64, kCPU});
  for (int64_t i = 0; i < n; ++i) labels.data_ptr<int64_t>()[i] = i;
  return std::make_shared<ImageDataset>(byte_tensor(sizes, 11), labels);
}

}  // namespace

TEST_CASE("uint8: .to() reads the bytes as the numbers 0..255, exactly, in any layout") {
  const Tensor b = byte_tensor({3, 5, 7});
  const std::vector<double> ref = values(b);
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
    INFO(std::string(dtype_name(dt)));
    const Tensor f = b.to(dt).to(kFloat64);
    CHECK(f.tolist<double>() == ref);  // 0..255 are exact in every one of them
  }
  const Tensor t = b.transpose(0, 2);  // non-contiguous: (7, 5, 3)
  CHECK(values(t.to(kFloat32)) == values(t.contiguous()));
  const std::vector<double> tv = values(t.to(kFloat32));
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t k = 0; k < 3; ++k) CHECK(tv[size_t((i * 5 + j) * 3 + k)] == ref[size_t((k * 5 + j) * 7 + i)]);
  const std::vector<double> bools = values(b.to(kBool).to(kInt64));
  for (size_t k = 0; k < ref.size(); ++k) CHECK(bools[k] == (ref[k] != 0 ? 1.0 : 0.0));
  check_error([&] { (void)zeros({2}).to(kUInt8); }, {"copy_", "uint8"});  // into uint8: still storage only
}

TEST_CASE("ImageDataset and TensorDataset: samples are views of the rows, indices are checked") {
  const Tensor images = byte_tensor({4, 3, 5}, 2);  // (N, H, W): one channel
  Tensor labels = empty({4}, {kInt64, kCPU});
  for (int64_t i = 0; i < 4; ++i) labels.data_ptr<int64_t>()[i] = 10 + i;
  const ImageDataset ds(images, labels);
  CHECK(ds.size() == 4);
  CHECK(ds.images().sizes() == Shape{4, 1, 3, 5});
  for (int64_t i = 0; i < 4; ++i) {
    const Example e = ds.get(i);
    CHECK(e.input.sizes() == Shape{1, 3, 5});
    CHECK(e.input.dtype() == kUInt8);
    CHECK(values(e.input) == values(images.select(0, i)));
    CHECK(e.target.dim() == 0);
    CHECK(values(e.target) == std::vector<double>{double(10 + i)});
  }
  const ImageDataset ds4(byte_tensor({2, 3, 4, 4}), zeros({2}, {kInt64, kCPU}));
  CHECK(ds4.get(1).input.sizes() == Shape{3, 4, 4});
  check_error([&] { ds.get(4); }, {"ImageDataset::get", "index 4", "dataset of 4 samples"});
  check_error([&] { ds.get(-1); }, {"ImageDataset::get", "index -1"});
  check_error(
      [&] {
        ImageDataset bad(zeros({2, 3, 3}), labels.narrow(0, 0, 2));
      },
      {"ImageDataset", "float32[2, 3, 3]", "uint8"});
  check_error([&] { ImageDataset bad(byte_tensor({2, 3}), labels.narrow(0, 0, 2)); }, {"ImageDataset", "uint8[2, 3]"});
  check_error([&] { ImageDataset bad(images, zeros({4})); }, {"ImageDataset", "labels float32[4] cpu", "int64"});
  check_error([&] { ImageDataset bad(images, labels.narrow(0, 0, 3)); }, {"differ in their number of samples"});
  const TensorDataset td(float_tensor({5, 2}, 1), zeros({5}, {kInt64, kCPU}));
  CHECK(values(td.get(3).input) == values(td.inputs().select(0, 3)));
  check_error([&] { td.get(5); }, {"TensorDataset::get", "index 5", "dataset of 5 samples"});
}

TEST_CASE("ToFloat and Normalize against float64 loops") {
  Generator gen(0);
  const Tensor b = byte_tensor({2, 16, 16}, 3);  // 512 bytes: every value 0..255 twice
  const Tensor f = ToFloat{}(b, gen);
  CHECK(f.dtype() == kFloat32);
  const std::vector<double> in = values(b), out = values(f);
  for (size_t k = 0; k < in.size(); ++k) CHECK(out[k] == double(float(in[k]) / 255.0f));  // torchvision's x / 255
  CHECK(values(ToFloat{}(f, gen)) == out);                                                // float32 passes
  const Normalize norm({0.25, 0.5}, {0.5, 0.125});
  const Tensor x = float_tensor({2, 3, 4}, 7).transpose(1, 2);  // non-contiguous (2, 4, 3)
  const std::vector<double> xv = values(x), nv = values(norm(x, gen));
  for (size_t k = 0; k < xv.size(); ++k) {
    const size_t c = k / 12;
    const double ref = (xv[k] - norm.mean[c]) / norm.std[c];
    CHECK(nv[k] == doctest::Approx(ref).epsilon(1e-6));
  }
  const std::vector<double> one = values(Normalize({0.5}, {2.0})(x, gen));  // one value for all channels
  for (size_t k = 0; k < xv.size(); ++k) CHECK(one[k] == doctest::Approx((xv[k] - 0.5) / 2.0).epsilon(1e-6));
  CHECK(gen.offset() == 0);  // the deterministic transforms draw nothing
}

TEST_CASE("RandomCrop replays its two draws, pads with zeros, and reaches every offset") {
  for (DType dt : {kUInt8, kFloat32}) {
    INFO(std::string(dtype_name(dt)));
    const Tensor x = dt == kUInt8 ? byte_tensor({2, 6, 5}, 1) : float_tensor({2, 6, 5}, 4);
    const RandomCrop crop(4, 2);  // padded 10 x 9: top in [0, 6], left in [0, 5]
    std::vector<int> seen(7 * 6, 0);
    for (uint64_t seed = 0; seed < 400; ++seed) {
      Generator gen(seed), replay(seed);
      const Tensor y = crop(x, gen);
      const int64_t top = draw_below(replay, 7), left = draw_below(replay, 6);
      ++seen[size_t(top * 6 + left)];
      CHECK(y.sizes() == Shape{2, 4, 4});
      CHECK(y.dtype() == dt);
      CHECK(values(y) == ref_crop(x, 4, 2, top, left));
      CHECK(gen.offset() == replay.offset());
    }
    for (int s : seen) CHECK(s > 0);  // 42 offsets, 400 draws: each one reached
  }
  Generator gen(3);
  const Tensor x = byte_tensor({1, 4, 4});
  CHECK(values(RandomCrop(4)(x, gen)) == values(x));  // the whole image: the identity
}

TEST_CASE("RandomHorizontalFlip replays its draw and flips a fraction p") {
  const Tensor x = byte_tensor({3, 2, 5}, 9);
  const RandomHorizontalFlip flip(0.3);
  int flipped = 0;
  const int n = 4000;
  for (int seed = 0; seed < n; ++seed) {
    Generator gen{uint64_t(seed)}, replay{uint64_t(seed)};
    const bool expect = draw_uniform(replay) < 0.3;
    flipped += expect;
    CHECK(values(flip(x, gen)) == (expect ? ref_flip(x) : values(x)));
  }
  CHECK(std::abs(double(flipped) / n - 0.3) < 0.03);
  Generator gen(1);
  CHECK(values(RandomHorizontalFlip(1.0)(x, gen)) == ref_flip(x));
  CHECK(values(RandomHorizontalFlip(0.0)(x, gen)) == values(x));
}

TEST_CASE("RandomErasing follows torchvision's algorithm, draw for draw") {
  const Tensor x = float_tensor({3, 9, 7}, 5);
  for (double p : {1.0, 0.5}) {
    const RandomErasing erase(p, {0.02, 0.33}, {0.3, 3.3}, -1.5);
    int erased_count = 0;
    for (uint64_t seed = 0; seed < 300; ++seed) {
      Generator gen(seed), replay(seed);
      bool erased = false;
      const std::vector<double> ref = ref_erase(x, replay, p, 0.02, 0.33, 0.3, 3.3, -1.5, &erased);
      erased_count += erased;
      CHECK(values(erase(x, gen)) == ref);
      CHECK(gen.offset() == replay.offset());
    }
    CHECK(erased_count > (p == 1.0 ? 250 : 100));
  }
  // No box fits a 2 x 2 image at 99-100% of its area: 1 + 10 x 2 draws, then unchanged.
  const Tensor small = float_tensor({1, 2, 2}, 6);
  Generator gen(4);
  CHECK(values(RandomErasing(1.0, {0.99, 1.0}, {1.0, 1.0})(small, gen)) == values(small));
  CHECK(gen.offset() == 21);
}

TEST_CASE("Compose applies its transforms in order on one generator") {
  const Tensor x = byte_tensor({1, 8, 8}, 5);
  const Compose t({RandomCrop(6, 1), RandomHorizontalFlip(0.5), ToFloat(), Normalize({0.5}, {0.25})});
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Generator gen(seed), replay(seed);
    Tensor y = RandomCrop(6, 1)(x, replay);
    y = RandomHorizontalFlip(0.5)(y, replay);
    y = Normalize({0.5}, {0.25})(ToFloat()(y, replay), replay);
    CHECK(values(t(x, gen)) == values(y));
  }
}

TEST_CASE("TransformedDataset: sample i of epoch e depends on (seed, e, i) only") {
  const auto base = image_dataset(12, {1, 6, 6});
  const Compose augment({RandomCrop(6, 2), RandomHorizontalFlip(0.5), ToFloat()});
  const TransformedDataset ds(base, augment, 7);
  CHECK(ds.size() == 12);
  int differ_epochs = 0;
  for (int64_t i = 0; i < 12; ++i) {
    const Example a = ds.get_at_epoch(i, 3);
    Generator replay(TransformedDataset::sample_seed(7, 3, i));
    CHECK(values(a.input) == values(augment(base->get(i).input, replay)));
    CHECK(values(a.target) == values(base->get(i).target));
    CHECK(values(ds.get_at_epoch(i, 3).input) == values(a.input));  // same call, same result
    CHECK(values(ds.get(i).input) == values(ds.get_at_epoch(i, 0).input));
    differ_epochs += values(ds.get_at_epoch(i, 4).input) != values(a.input);
  }
  CHECK(differ_epochs >= 6);  // other epochs, other crops
  CHECK(TransformedDataset::sample_seed(7, 3, 1) != TransformedDataset::sample_seed(8, 3, 1));
  CHECK(TransformedDataset::sample_seed(7, 3, 1) != TransformedDataset::sample_seed(7, 1, 3));
  check_error([&] { ds.get(12); }, {"TransformedDataset::get", "index 12", "dataset of 12 samples"});
}

TEST_CASE("collate stacks examples and names the one that differs") {
  const auto base = image_dataset(3, {2, 3, 3});
  const Batch b = collate({base->get(2), base->get(0)});
  CHECK(b.inputs.sizes() == Shape{2, 2, 3, 3});
  CHECK(b.inputs.dtype() == kUInt8);
  std::vector<double> expect = values(base->get(2).input), second = values(base->get(0).input);
  expect.insert(expect.end(), second.begin(), second.end());
  CHECK(values(b.inputs) == expect);
  CHECK(values(b.targets) == std::vector<double>{2, 0});
  const Example odd{byte_tensor({2, 3, 4}), zeros({}, {kInt64, kCPU})};
  check_error(
      [&] {
        collate({base->get(0), odd});
      },
      {"collate: example 1's input uint8[2, 3, 4] cpu", "example 0's uint8[2, 3, 3] cpu"});
  check_error([&] { collate({}); }, {"collate: no examples"});
}

TEST_CASE("dataloader over a Dataset: batches are identical with 1 and 3 workers") {
  const auto base = image_dataset(37, {1, 8, 8});
  auto ds = std::make_shared<TransformedDataset>(
      base, Compose({RandomCrop(8, 2), RandomHorizontalFlip(0.5), ToFloat(), Normalize({0.5}, {0.25})}), 3);
  auto run = [&](int64_t workers, int64_t prefetch) {
    DataLoader loader(ds, {.batch_size = 5, .shuffle = true, .seed = 9, .prefetch = prefetch, .workers = workers});
    CHECK(loader.size() == 8);
    std::vector<std::vector<double>> out;
    for (int epoch = 0; epoch < 2; ++epoch) {
      const std::vector<int64_t> order = loader.order(epoch);
      int64_t b = 0;
      for (Batch& batch : loader) {
        const int64_t count = std::min<int64_t>(5, 37 - b * 5);
        CHECK(batch.inputs.sizes() == Shape{count, 1, 8, 8});
        CHECK(batch.inputs.dtype() == kFloat32);
        std::vector<Example> expect;
        for (int64_t k = 0; k < count; ++k) expect.push_back(ds->get_at_epoch(order[size_t(b * 5 + k)], epoch));
        const Batch ref = collate(expect);
        CHECK(values(batch.inputs) == values(ref.inputs));
        CHECK(values(batch.targets) == values(ref.targets));
        out.push_back(values(batch.inputs));
        ++b;
      }
      CHECK(b == 8);
    }
    return out;
  };
  const auto one = run(1, 2);
  CHECK(run(3, 2) == one);
  CHECK(run(3, 1) == one);
  CHECK(run(4, 0) == one);  // no thread
  CHECK(one[0] != one[8]);  // epoch 1 is another order and other augmentations
  const auto tensors = std::make_shared<TensorDataset>(float_tensor({9, 2}, 3), zeros({9}, {kInt64, kCPU}));
  check_error([&] { DataLoader bad(tensors, {.workers = 0}); }, {"DataLoader: workers must be >= 1, got 0"});
}

TEST_CASE("dataloader over a Dataset: an error in a sample reaches the consumer, in order") {
  const auto base = image_dataset(20, {1, 4, 4});
  // A transform that throws for sample 13 alone (the only one whose first byte is this).
  const Transform fail_13 = [](const Tensor& image, Generator&) -> Tensor {
    FRUGAL_CHECK(values(image)[0] != double((13 * 16 * 37 + 11) % 256), "sample 13 is broken");
    return image;
  };
  auto ds = std::make_shared<TransformedDataset>(base, fail_13, 0);
  for (int64_t workers : {1, 3}) {
    DataLoader loader(ds, {.batch_size = 4, .workers = workers});
    Batch b;
    for (int k = 0; k < 3; ++k) CHECK(loader.next(b));  // samples 0..11
    check_error([&] { loader.next(b); }, {"sample 13 is broken"});
    CHECK(loader.next(b));  // a new pass starts
  }
}

TEST_CASE("transforms: wrong rank, dtype or size name the transform and the shape") {
  Generator gen(0);
  const Tensor flat = byte_tensor({4, 4});
  check_error([&] { RandomCrop(2)(flat, gen); }, {"RandomCrop: expected an image (C, H, W), got uint8[4, 4] cpu"});
  check_error(
      [&] {
        RandomHorizontalFlip()(byte_tensor({1, 2, 2, 2}), gen);
      },
      {"RandomHorizontalFlip", "uint8[1, 2, 2, 2] cpu"});
  check_error([&] { ToFloat()(flat, gen); }, {"ToFloat", "uint8[4, 4] cpu"});
  check_error(
      [&] {
        ToFloat()(zeros({1, 2, 2}, {kInt64, kCPU}), gen);
      },
      {"ToFloat: expected a uint8 or float32 image", "int64[1, 2, 2] cpu"});
  check_error(
      [&] {
        Normalize({0.5}, {0.5})(byte_tensor({1, 2, 2}), gen);
      },
      {"Normalize: expected a float32 image", "uint8[1, 2, 2] cpu"});
  check_error(
      [&] {
        Normalize({0.5, 0.5}, {0.5, 0.5})(zeros({3, 2, 2}), gen);
      },
      {"Normalize: 2 means and stds for an image of 3 channels", "float32[3, 2, 2] cpu"});
  check_error([&] { RandomErasing()(byte_tensor({1, 2, 2}), gen); }, {"RandomErasing", "uint8[1, 2, 2] cpu"});
  check_error(
      [&] {
        RandomCrop(9, 2)(byte_tensor({1, 4, 6}), gen);
      },
      {"RandomCrop: a 9x9 crop does not fit the image uint8[1, 4, 6] cpu padded by 2 (8x10)"});
  check_error([&] { Normalize({0.5}, {0.0}); }, {"Normalize: every std must be positive"});
  check_error([&] { Normalize({0.5, 1}, {0.5}); }, {"Normalize: mean and std need one value per channel"});
  check_error([&] { RandomCrop(0); }, {"RandomCrop: size must be >= 1"});
  check_error([&] { RandomHorizontalFlip(1.5); }, {"RandomHorizontalFlip: p must lie in [0, 1], got 1.5"});
  check_error([&] { RandomErasing(0.5, {0.5, 0.1}); }, {"RandomErasing: scale"});
  check_error([&] { TransformedDataset(nullptr, ToFloat(), 0); }, {"TransformedDataset: the dataset is null"});
}

namespace {
// A Dataset that is not a TensorDataset, over one: the loader takes its general path.
struct Wrapped : Dataset {
  explicit Wrapped(TensorDataset d) : inner(std::move(d)) {}
  int64_t size() const override { return inner.size(); }
  Example get(int64_t i) const override { return inner.get(i); }
  TensorDataset inner;
};
}  // namespace

TEST_CASE("dataloader: a Dataset's general path delivers what the TensorDataset fast path does") {
  const TensorDataset td(float_tensor({23, 3, 2}, 8), byte_tensor({23, 1}).to(kInt64));
  for (int64_t workers : {1, 2}) {
    DataLoader fast(td, {.batch_size = 4, .shuffle = true, .seed = 2});
    DataLoader general(std::make_shared<Wrapped>(td),
                       {.batch_size = 4, .shuffle = true, .seed = 2, .drop_last = true, .workers = workers});
    CHECK(general.size() == 5);
    Batch a, b;
    for (int64_t k = 0; k < 5; ++k) {
      REQUIRE(fast.next(a));
      REQUIRE(general.next(b));
      CHECK(b.inputs.sizes() == Shape{4, 3, 2});
      CHECK(values(a.inputs) == values(b.inputs));
      CHECK(values(a.targets) == values(b.targets));
    }
    CHECK(!general.next(b));
  }
}
