#include "nn/data/transforms.h"

#include <cmath>
#include <cstring>

#include "tensor/factory.h"
#include "tensor/philox.h"

namespace frugal::data {

// Note [Per-sample randomness]
// A loader with several workers prepares samples in an order that depends on thread timing,
// so nothing random may depend on a shared, advancing state. TransformedDataset gives each
// (epoch, sample) its own Generator, seeded with one Philox4x32-10 block keyed by the
// dataset's seed at the counter (i, epoch, tag): a pure function of (seed, epoch, i), the
// way the loader's shuffle is one of (seed, epoch) (Note [DataLoader pipeline]). The tag
// word keeps these counters apart from the shuffle's (k, epoch) under the same seed, so a
// loader and a dataset seeded alike do not draw correlated numbers. Inside one sample the
// transforms draw in a fixed order, one Generator counter per draw (draw_uniform,
// draw_below), so a test replays a sample's crop and flip from the seed alone.

namespace {

constexpr uint32_t kSampleTag = 0x41554721u;  // "AUG!": the counter's last word

uint64_t draw_word(Generator& gen) {
  const Generator::Range r = gen.reserve(1);
  const PhiloxResult x = philox4x32(r.seed, r.counter);
  return (uint64_t(x.x[0]) << 32) | x.x[1];
}

// `image` (C, H, W) on the host, contiguous; throws naming the transform and the shape.
Tensor checked_image(const char* who, const Tensor& image) {
  FRUGAL_CHECK(image.defined(), who, ": the image is an undefined tensor");
  FRUGAL_CHECK(image.dim() == 3, who, ": expected an image (C, H, W), got ", image.describe());
  FRUGAL_CHECK(image.device().is_cpu(), who, ": expected an image on the host, got ", image.describe());
  return image.contiguous();
}

Tensor checked_float_image(const char* who, const Tensor& image) {
  Tensor x = checked_image(who, image);
  FRUGAL_CHECK(x.dtype() == kFloat32, who, ": expected a float32 image (C, H, W) (ToFloat converts uint8), got ",
               image.describe());
  return x;
}

}  // namespace

double draw_uniform(Generator& gen) { return double(draw_word(gen) >> 11) * 0x1.0p-53; }

int64_t draw_below(Generator& gen, int64_t bound) {
  FRUGAL_CHECK(bound >= 1, "draw_below: bound must be >= 1, got ", bound);
  const uint64_t b = uint64_t(bound);
  const uint64_t threshold = (0 - b) % b;  // 2^64 mod b: words below it would bias the result
  while (true) {
    const uint64_t r = draw_word(gen);
    if (r >= threshold) return int64_t(r % b);
  }
}

Tensor ToFloat::operator()(const Tensor& image, Generator&) const {
  const Tensor x = checked_image("ToFloat", image);
  if (x.dtype() == kFloat32) return x;
  FRUGAL_CHECK(x.dtype() == kUInt8, "ToFloat: expected a uint8 or float32 image (C, H, W), got ", image.describe());
  Tensor out = empty(x.sizes(), {kFloat32, kCPU});
  const uint8_t* in = x.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  for (int64_t k = 0; k < x.numel(); ++k) o[k] = float(in[k]) / 255.0f;  // as torchvision: x.float() / 255
  return out;
}

Normalize::Normalize(std::vector<double> mean_, std::vector<double> std_)
    : mean(std::move(mean_)), std(std::move(std_)) {
  FRUGAL_CHECK(!mean.empty() && mean.size() == std.size(),
               "Normalize: mean and std need one value per channel each, got ", mean.size(), " and ", std.size());
  for (double s : std) FRUGAL_CHECK(s > 0, "Normalize: every std must be positive, got ", s);
}

Tensor Normalize::operator()(const Tensor& image, Generator&) const {
  const Tensor x = checked_float_image("Normalize", image);
  const int64_t C = x.size(0), plane = x.size(1) * x.size(2);
  FRUGAL_CHECK(mean.size() == 1 || int64_t(mean.size()) == C, "Normalize: ", mean.size(),
               " means and stds for an image of ", C, " channels ", image.describe());
  Tensor out = empty(x.sizes(), {kFloat32, kCPU});
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t c = 0; c < C; ++c) {
    const size_t k = mean.size() == 1 ? 0 : size_t(c);
    const float m = float(mean[k]), s = float(std[k]);
    for (int64_t j = 0; j < plane; ++j) o[c * plane + j] = (in[c * plane + j] - m) / s;
  }
  return out;
}

RandomCrop::RandomCrop(int64_t size_, int64_t padding_) : size(size_), padding(padding_) {
  FRUGAL_CHECK(size >= 1 && padding >= 0, "RandomCrop: size must be >= 1 and padding >= 0, got size ", size,
               " and padding ", padding);
}

Tensor RandomCrop::operator()(const Tensor& image, Generator& gen) const {
  const Tensor x = checked_image("RandomCrop", image);
  const int64_t C = x.size(0), H = x.size(1), W = x.size(2);
  const int64_t Hp = H + 2 * padding, Wp = W + 2 * padding;
  FRUGAL_CHECK(size <= Hp && size <= Wp, "RandomCrop: a ", size, "x", size, " crop does not fit the image ",
               image.describe(), " padded by ", padding, " (", Hp, "x", Wp, ")");
  const int64_t top = draw_below(gen, Hp - size + 1), left = draw_below(gen, Wp - size + 1);
  // out[c, y, x] = padded[c, top + y, left + x] = image[c, top + y - padding, left + x - padding] or 0.
  Tensor out = empty({C, size, size}, {x.dtype(), kCPU});
  const size_t es = x.element_size();
  const auto* in = static_cast<const uint8_t*>(x.data());
  auto* o = static_cast<uint8_t*>(out.data());
  std::memset(o, 0, size_t(out.numel()) * es);
  // Columns of the window that fall inside the image: x in [x0, x1).
  const int64_t x0 = std::max<int64_t>(0, padding - left), x1 = std::min<int64_t>(size, W + padding - left);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < size; ++y) {
      const int64_t sy = top + y - padding;
      if (sy < 0 || sy >= H || x1 <= x0) continue;
      std::memcpy(o + size_t((c * size + y) * size + x0) * es, in + size_t((c * H + sy) * W + left + x0 - padding) * es,
                  size_t(x1 - x0) * es);
    }
  return out;
}

RandomHorizontalFlip::RandomHorizontalFlip(double p_) : p(p_) {
  FRUGAL_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must lie in [0, 1], got ", p);
}

Tensor RandomHorizontalFlip::operator()(const Tensor& image, Generator& gen) const {
  const Tensor x = checked_image("RandomHorizontalFlip", image);
  if (!(draw_uniform(gen) < p)) return x;
  const int64_t rows = x.size(0) * x.size(1), W = x.size(2);
  Tensor out = empty(x.sizes(), {x.dtype(), kCPU});
  const size_t es = x.element_size();
  const auto* in = static_cast<const uint8_t*>(x.data());
  auto* o = static_cast<uint8_t*>(out.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < W; ++j) std::memcpy(o + size_t(r * W + j) * es, in + size_t(r * W + W - 1 - j) * es, es);
  return out;
}

RandomErasing::RandomErasing(double p_, std::pair<double, double> scale_, std::pair<double, double> ratio_,
                             double value_)
    : p(p_), scale(scale_), ratio(ratio_), value(value_) {
  FRUGAL_CHECK(p >= 0 && p <= 1, "RandomErasing: p must lie in [0, 1], got ", p);
  FRUGAL_CHECK(0 <= scale.first && scale.first <= scale.second && scale.second <= 1,
               "RandomErasing: scale must satisfy 0 <= min <= max <= 1, got (", scale.first, ", ", scale.second, ")");
  FRUGAL_CHECK(0 < ratio.first && ratio.first <= ratio.second,
               "RandomErasing: ratio must satisfy 0 < min <= max, got (", ratio.first, ", ", ratio.second, ")");
}

Tensor RandomErasing::operator()(const Tensor& image, Generator& gen) const {
  const Tensor x = checked_float_image("RandomErasing", image);
  if (!(draw_uniform(gen) < p)) return x;
  const int64_t C = x.size(0), H = x.size(1), W = x.size(2);
  const double area = double(H * W), log_lo = std::log(ratio.first), log_hi = std::log(ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * (scale.first + (scale.second - scale.first) * draw_uniform(gen));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * draw_uniform(gen));
    // Python's round(): halves to even, as std::nearbyint in the default rounding mode.
    const auto h = int64_t(std::nearbyint(std::sqrt(erase_area * aspect)));
    const auto w = int64_t(std::nearbyint(std::sqrt(erase_area / aspect)));
    if (!(h < H && w < W)) continue;
    const int64_t top = draw_below(gen, H - h + 1), left = draw_below(gen, W - w + 1);
    Tensor out = x.clone();
    float* o = out.data_ptr<float>();
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = top; y < top + h; ++y)
        for (int64_t j = left; j < left + w; ++j) o[(c * H + y) * W + j] = float(value);
    return out;
  }
  return x;
}

Tensor Compose::operator()(const Tensor& image, Generator& gen) const {
  Tensor x = image;
  for (const Transform& t : transforms) x = t(x, gen);
  return x;
}

TransformedDataset::TransformedDataset(std::shared_ptr<const Dataset> dataset, Transform transform, uint64_t seed)
    : dataset_(std::move(dataset)), transform_(std::move(transform)), seed_(seed) {
  FRUGAL_CHECK(dataset_ != nullptr, "TransformedDataset: the dataset is null");
  FRUGAL_CHECK(bool(transform_), "TransformedDataset: the transform is empty");
}

uint64_t TransformedDataset::sample_seed(uint64_t seed, int64_t epoch, int64_t i) {
  FRUGAL_CHECK(epoch >= 0 && epoch <= int64_t(UINT32_MAX) && i >= 0, "TransformedDataset: epoch ", epoch,
               " and sample ", i, " must lie in [0, 2^32) and be >= 0");
  const PhiloxResult x = philox4x32_10(uint32_t(i), uint32_t(uint64_t(i) >> 32), uint32_t(epoch), kSampleTag,
                                       uint32_t(seed), uint32_t(seed >> 32));
  return (uint64_t(x.x[0]) << 32) | x.x[1];
}

Example TransformedDataset::get_at_epoch(int64_t i, int64_t epoch) const {
  check_index("TransformedDataset::get", i, size());
  Example e = dataset_->get_at_epoch(i, epoch);
  Generator gen(sample_seed(seed_, epoch, i));
  e.input = transform_(e.input, gen);
  return e;
}

}  // namespace frugal::data
