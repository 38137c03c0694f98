// roll, movedim, pixel_shuffle and pixel_unshuffle (autograd/ops/rearrange.h): PyTorch's
// arguments and checks, composed of differentiable views (narrow, permute, reshape) and cat.
#include "autograd/ops/rearrange.h"

#include "autograd/ops/join.h"
#include "core/instrument.h"
#include "tensor/shape.h"

namespace frugal {

Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  core::OpScope scope("roll");
  FRUGAL_CHECK(x.defined(), "roll: undefined input tensor");
  FRUGAL_CHECK(!shifts.empty(), "roll: shifts must not be empty (x ", x.describe(), ")");
  if (dims.empty()) {
    FRUGAL_CHECK(shifts.size() == 1, "roll: without dims, shifts must hold one value, got ", shifts.size());
    return roll(x.flatten(), shifts, {0}).reshape(x.sizes());
  }
  FRUGAL_CHECK(shifts.size() == dims.size(), "roll: shifts and dims must have the same length, got ", shifts.size(),
               " and ", dims.size());
  Tensor out = x;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], x.dim(), "roll"), n = x.size(d);
    if (n == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;  // in [0, n): the last s entries come first
    if (s != 0) out = cat({out.narrow(d, n - s, s), out.narrow(d, 0, n - s)}, d);
  }
  return out.shares_storage(x) ? out.clone() : out;  // a fresh tensor, as torch.roll
}

Tensor movedim(const Tensor& x, const std::vector<int64_t>& source, const std::vector<int64_t>& destination) {
  FRUGAL_CHECK(x.defined(), "movedim: undefined input tensor");
  FRUGAL_CHECK(source.size() == destination.size(), "movedim: source and destination must have the same length, got ",
               source.size(), " and ", destination.size());
  const int64_t n = x.dim();
  std::vector<int64_t> order(size_t(n), -1);  // order[destination] = source
  std::vector<bool> moved(size_t(n), false);
  for (size_t i = 0; i < source.size(); ++i) {
    const int64_t s = wrap_dim(source[i], n, "movedim"), d = wrap_dim(destination[i], n, "movedim");
    FRUGAL_CHECK(!moved[size_t(s)], "movedim: repeated dim ", source[i], " in source");
    FRUGAL_CHECK(order[size_t(d)] < 0, "movedim: repeated dim ", destination[i], " in destination");
    moved[size_t(s)] = true;
    order[size_t(d)] = s;
  }
  int64_t next = 0;  // the dims not moved fill the free positions in their order
  for (int64_t& o : order) {
    if (o >= 0) continue;
    while (moved[size_t(next)]) ++next;
    o = next++;
  }
  return x.permute(order);
}

namespace {

/// x's dims as (*batch, C, H, W), checked for pixel_shuffle or pixel_unshuffle.
void check_pixel_input(const char* op, const Tensor& x, int64_t factor) {
  FRUGAL_CHECK(x.defined(), op, ": undefined input tensor");
  FRUGAL_CHECK(x.dim() >= 3, op, ": expects an input of at least 3 dims (*, C, H, W), got ", x.describe());
  FRUGAL_CHECK(factor > 0, op, ": the factor must be positive, got ", factor);
}

/// x's leading (batch) dims followed by `tail`.
Shape with_batch(const Tensor& x, std::initializer_list<int64_t> tail) {
  Shape s(x.sizes().begin(), x.sizes().end() - 3);
  s.insert(s.end(), tail);
  return s;
}

/// The permutation of a (*, a, b, c, d, e) view that takes its last five dims to `last5`.
std::vector<int64_t> batch_permutation(int64_t batch, std::initializer_list<int64_t> last5) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < batch; ++i) p.push_back(i);
  for (int64_t d : last5) p.push_back(batch + d);
  return p;
}

}  // namespace

Tensor pixel_shuffle(const Tensor& x, int64_t r) {
  core::OpScope scope("pixel_shuffle");
  check_pixel_input("pixel_shuffle", x, r);
  const int64_t c = x.size(-3), h = x.size(-2), w = x.size(-1), batch = x.dim() - 3;
  FRUGAL_CHECK(c % (r * r) == 0, "pixel_shuffle: the channels (", c,
               ") must be divisible by upscale_factor^2 = ", r * r, ", got ", x.describe());
  // (*, C, r, r, H, W) -> (*, C, H, r, W, r) -> (*, C, H r, W r)
  const Tensor blocks = x.reshape(with_batch(x, {c / (r * r), r, r, h, w}));
  const Tensor out =
      blocks.permute(batch_permutation(batch, {0, 3, 1, 4, 2})).reshape(with_batch(x, {c / (r * r), h * r, w * r}));
  return out.shares_storage(x) ? out.clone() : out;  // a fresh tensor (r = 1 reshapes to a view), as torch's
}

Tensor pixel_unshuffle(const Tensor& x, int64_t r) {
  core::OpScope scope("pixel_unshuffle");
  check_pixel_input("pixel_unshuffle", x, r);
  const int64_t c = x.size(-3), h = x.size(-2), w = x.size(-1), batch = x.dim() - 3;
  FRUGAL_CHECK(h % r == 0 && w % r == 0, "pixel_unshuffle: the height and width (", h, ", ", w,
               ") must be divisible by downscale_factor = ", r, ", got ", x.describe());
  // (*, C, H, r, W, r) -> (*, C, r, r, H, W) -> (*, C r^2, H, W)
  const Tensor blocks = x.reshape(with_batch(x, {c, h / r, r, w / r, r}));
  const Tensor out =
      blocks.permute(batch_permutation(batch, {0, 2, 4, 1, 3})).reshape(with_batch(x, {c * r * r, h / r, w / r}));
  return out.shares_storage(x) ? out.clone() : out;
}

}  // namespace frugal
