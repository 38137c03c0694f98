#pragma once
// Transforms: callables on one example's image, (C, H, W) on the host, as
// torchvision.transforms. Each takes the Generator it draws from, so augmentation is a
// function of the generator's state: TransformedDataset gives sample i of epoch e a
// generator seeded from (seed, e, i) (Note [Per-sample randomness] in transforms.cpp).
//
//   data::Compose augment({data::RandomCrop(28, 2), data::RandomHorizontalFlip(0.5), data::ToFloat(),
//                          data::Normalize({0.2860}, {0.3530})});
//   auto train = std::make_shared<data::TransformedDataset>(images, augment, /*seed=*/1);
//   data::DataLoader loader(train, {.batch_size = 128, .shuffle = true, .workers = 4});
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "nn/data/dataset.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal::data {

/// image (C, H, W) -> image; draws what it needs from `gen`.
using Transform = std::function<Tensor(const Tensor& image, Generator& gen)>;

/// The draws every random transform makes, in the order documented on each; public so that
/// a test (or a user) can replay them. One Philox counter of `gen` per draw.
/// Uniform in [0, 1), 53 random bits.
double draw_uniform(Generator& gen);
/// Uniform integer in [0, bound), bound >= 1, without modulo bias.
int64_t draw_below(Generator& gen, int64_t bound);

/// uint8 -> float32 / 255 (torchvision's ToTensor scaling); float32 passes unchanged.
struct ToFloat {
  Tensor operator()(const Tensor& image, Generator& gen) const;
};

/// out[c] = (image[c] - mean[c]) / std[c], float32; one mean and std per channel, or one for all.
struct Normalize {
  Normalize(std::vector<double> mean, std::vector<double> std);
  Tensor operator()(const Tensor& image, Generator& gen) const;
  std::vector<double> mean, std;
};

/// A size x size window of the image padded with `padding` zeros on each side, at
/// (top, left) = (draw_below(Hp - size + 1), draw_below(Wp - size + 1)), Hp = H + 2 padding:
/// two draws, as torchvision.transforms.RandomCrop(size, padding). Any dtype.
struct RandomCrop {
  RandomCrop(int64_t size, int64_t padding = 0);
  Tensor operator()(const Tensor& image, Generator& gen) const;
  int64_t size, padding;
};

/// Mirrors the image left-right when draw_uniform() < p: one draw. Any dtype.
struct RandomHorizontalFlip {
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor operator()(const Tensor& image, Generator& gen) const;
  double p;
};

/// torchvision.transforms.RandomErasing on float32: when draw_uniform() < p, up to 10
/// attempts, each drawing area = H W uniform(scale), log aspect = uniform(log ratio) (two
/// draws), h = round(sqrt(area aspect)), w = round(sqrt(area / aspect)); the first with
/// h < H and w < W draws (top, left) = (draw_below(H - h + 1), draw_below(W - w + 1)) and
/// sets that box of every channel to `value`. After 10 misses the image is unchanged.
struct RandomErasing {
  explicit RandomErasing(double p = 0.5, std::pair<double, double> scale = {0.02, 0.33},
                         std::pair<double, double> ratio = {0.3, 3.3}, double value = 0.0);
  Tensor operator()(const Tensor& image, Generator& gen) const;
  double p;
  std::pair<double, double> scale, ratio;
  double value;
};

/// The transforms in order, each drawing from the same generator.
struct Compose {
  explicit Compose(std::vector<Transform> transforms) : transforms(std::move(transforms)) {}
  Tensor operator()(const Tensor& image, Generator& gen) const;
  std::vector<Transform> transforms;
};

/// (dataset's input transformed, target) for each sample; the transform of sample i in
/// epoch e draws from a Generator seeded by sample_seed(seed, e, i) and nothing else, so
/// what a loader delivers does not depend on its worker count or the order of the calls.
class TransformedDataset : public Dataset {
 public:
  TransformedDataset(std::shared_ptr<const Dataset> dataset, Transform transform, uint64_t seed = 0);

  int64_t size() const override { return dataset_->size(); }
  /// Sample i as in epoch 0.
  Example get(int64_t i) const override { return get_at_epoch(i, 0); }
  Example get_at_epoch(int64_t i, int64_t epoch) const override;
  /// The seed of sample i's generator in `epoch`: Philox4x32-10 keyed by `seed` at
  /// counter (i, epoch); see Note [Per-sample randomness].
  static uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t i);

 private:
  std::shared_ptr<const Dataset> dataset_;
  Transform transform_;
  uint64_t seed_;
};

}  // namespace frugal::data
