// roll, movedim, pixel_shuffle and pixel_unshuffle (autograd/ops/rearrange.h) against index loops
// written here from PyTorch's definitions: shifts past the size and negative, several dims, no
// dims, size-0 dims, transposed inputs, batch dims; the errors; gradcheck and gradgradcheck; the
// PixelShuffle / PixelUnshuffle modules.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "autograd/ops/rearrange.h"
#include "nn/upsampling.h"
#include "tensor/factory.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// out[i] = x[source(i)] over out's shape, from x's values (row-major).
std::vector<double> gather_reference(const Tensor& x, const Shape& out_shape,
                                     const std::function<std::vector<int64_t>(const std::vector<int64_t>&)>& source) {
  const std::vector<double> xv = values_of(x);
  std::vector<double> out;
  for (int64_t i = 0; i < numel_of(out_shape); ++i)
    out.push_back(xv[size_t(ravel(source(unravel(i, out_shape)), x.sizes()))]);
  return out;
}

std::vector<double> roll_reference(const Tensor& x, const std::vector<int64_t>& shifts,
                                   const std::vector<int64_t>& dims) {
  return gather_reference(x, x.sizes(), [&](std::vector<int64_t> idx) {
    for (size_t i = 0; i < dims.size(); ++i) {
      const size_t d = size_t(dims[i] < 0 ? dims[i] + x.dim() : dims[i]);
      const int64_t n = x.size(int64_t(d));
      idx[d] = (((idx[d] - shifts[i]) % n) + n) % n;  // out[j] = x[j - shift]
    }
    return idx;
  });
}

}  // namespace

TEST_CASE("rearrange: roll matches an index loop (several dims, negative and large shifts, no dims, views)") {
  const Tensor x = make_tensor(random_values(3 * 4 * 5, 1), {3, 4, 5}, kFloat32);
  struct Case {
    std::vector<int64_t> shifts, dims;
  };
  for (const Case& c : {Case{{1}, {0}}, Case{{-2}, {1}}, Case{{7}, {2}}, Case{{2, -1}, {0, 2}}, Case{{13, 4}, {-1, -2}},
                        Case{{0}, {1}}, Case{{-9, 9, 1}, {0, 1, 2}}}) {
    const std::string what = "shifts " + std::to_string(c.shifts[0]) + " dims " + std::to_string(c.dims[0]);
    const Tensor y = roll(x, c.shifts, c.dims);
    REQUIRE(y.sizes() == x.sizes());
    CHECK_MESSAGE(!y.shares_storage(x), what);
    check_close(y, roll_reference(x, c.shifts, c.dims), 0, 0, what);
    const Tensor xt = x.transpose(0, 2);  // a non-contiguous input
    check_close(roll(xt, c.shifts, c.dims), roll_reference(xt.contiguous(), c.shifts, c.dims), 0, 0, what + " of x.t");
  }
  // No dims: the flattened tensor rolled, the shape kept (torch.roll(x, 3)).
  const std::vector<double> xv = values_of(x);
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) want[(i + 3) % xv.size()] = xv[i];
  check_close(roll(x, {3}), want, 0, 0, "roll without dims");
  CHECK(roll(zeros({0, 3}, kFloat32), {2}, {0}).sizes() == Shape{0, 3});
  CHECK(roll(zeros({2, 0}, kFloat32), {1}, {1}).sizes() == Shape{2, 0});
  check_close(roll(make_tensor({1, 2, 3}, {3}, kInt64), {1}, {0}), {3, 1, 2}, 0, 0, "int64");
  check_error([&] { roll(x, {1, 2}, {0}); }, {"roll", "same length"});
  check_error([&] { roll(x, {1, 2}); }, {"roll", "one value"});
  check_error([&] { roll(x, {1}, {3}); }, {"roll"});
  check_error([&] { roll(x, {}, {}); }, {"roll", "shifts"});
}

TEST_CASE("rearrange: movedim is torch.movedim's permutation") {
  const Tensor x = make_tensor(random_values(2 * 3 * 4 * 5, 2), {2, 3, 4, 5}, kFloat32);
  CHECK(movedim(x, {0}, {3}).sizes() == Shape{3, 4, 5, 2});
  CHECK(movedim(x, {-1}, {0}).sizes() == Shape{5, 2, 3, 4});
  CHECK(movedim(x, {0, 1}, {2, 0}).sizes() == Shape{3, 4, 2, 5});
  const Tensor y = movedim(x, {1, 3}, {0, 1});  // (3, 5, 2, 4): y[c, w, n, h] = x[n, c, h, w]
  REQUIRE(y.sizes() == Shape{3, 5, 2, 4});
  CHECK(y.shares_storage(x));  // a view, as torch's
  check_close(y,
              gather_reference(x, y.sizes(),
                               [](const std::vector<int64_t>& i) {
                                 return std::vector<int64_t>{i[2], i[0], i[3], i[1]};
                               }),
              0, 0, "movedim values");
  check_error([&] { movedim(x, {0, 0}, {1, 2}); }, {"movedim", "repeated", "source"});
  check_error([&] { movedim(x, {0, 1}, {2, 2}); }, {"movedim", "repeated", "destination"});
  check_error([&] { movedim(x, {0}, {1, 2}); }, {"movedim", "same length"});
}

TEST_CASE("rearrange: pixel_shuffle and pixel_unshuffle match index loops and invert each other") {
  for (const Shape& shape : {Shape{2, 12, 3, 2}, Shape{8, 2, 3}, Shape{2, 1, 4, 5, 5}}) {
    const int64_t r = 2;
    const Tensor x = make_tensor(random_values(numel_of(shape), 3), shape, kFloat64);
    const Tensor y = pixel_shuffle(x, r);
    const int64_t b = int64_t(shape.size()) - 3, c = shape[size_t(b)] / (r * r);
    Shape out(shape.begin(), shape.begin() + b);
    out.insert(out.end(), {c, shape[size_t(b) + 1] * r, shape[size_t(b) + 2] * r});
    REQUIRE(y.sizes() == out);
    CHECK(!y.shares_storage(x));
    // y[..., c, h r + i, w r + j] = x[..., c r^2 + i r + j, h, w]
    check_close(y,
                gather_reference(x, out,
                                 [&](std::vector<int64_t> idx) {
                                   const size_t k = size_t(b);
                                   const int64_t ch = idx[k], h = idx[k + 1], w = idx[k + 2];
                                   idx[k] = ch * r * r + (h % r) * r + w % r, idx[k + 1] = h / r, idx[k + 2] = w / r;
                                   return idx;
                                 }),
                0, 0, "pixel_shuffle " + shape_str(shape));
    check_close(pixel_unshuffle(y, r), values_of(x), 0, 0, "pixel_unshuffle inverts " + shape_str(shape));
    CHECK(pixel_unshuffle(y, r).sizes() == shape);
  }
  const Tensor t = make_tensor(random_values(2 * 4 * 6 * 6, 4), {2, 4, 6, 6}, kFloat32).transpose(2, 3);
  check_close(pixel_unshuffle(t, 3), values_of(pixel_unshuffle(t.contiguous(), 3)), 0, 0, "a transposed input");
  check_error([&] { pixel_shuffle(zeros({1, 3, 2, 2}, kFloat32), 2); }, {"pixel_shuffle", "divisible", "4"});
  check_error([&] { pixel_unshuffle(zeros({1, 3, 5, 4}, kFloat32), 2); }, {"pixel_unshuffle", "divisible"});
  check_error([&] { pixel_shuffle(zeros({4, 4}, kFloat32), 2); }, {"pixel_shuffle", "3 dims"});
  check_error([&] { pixel_shuffle(zeros({1, 4, 2, 2}, kFloat32), 0); }, {"pixel_shuffle", "positive"});
  nn::PixelShuffle up(2);
  nn::PixelUnshuffle down(2);
  const Tensor z = make_tensor(random_values(16, 5), {1, 4, 2, 2}, kFloat32);
  check_close(up.forward(z), values_of(pixel_shuffle(z, 2)), 0, 0, "PixelShuffle");
  check_close(down.forward(up.forward(z)), values_of(z), 0, 0, "PixelUnshuffle");
  CHECK(up.extra_repr() == "upscale_factor=2");
  CHECK(down.extra_repr() == "downscale_factor=2");
  check_error([] { nn::PixelShuffle{0}; }, {"PixelShuffle", "positive"});
}

TEST_CASE("rearrange: gradients, first and second order") {
  const Tensor x = leaf({3, 4, 2}, 6);
  check_gradcheck([](const TensorList& in) { return roll(in[0], {1, -3}, {0, 1}); }, {x});
  check_gradcheck([](const TensorList& in) { return roll(in[0], {5}); }, {x});
  check_gradcheck([](const TensorList& in) { return movedim(in[0], {0}, {2}); }, {x});
  const Tensor p = leaf({2, 8, 2, 3}, 7);
  check_gradcheck([](const TensorList& in) { return pixel_shuffle(in[0], 2); }, {p});
  check_gradcheck([](const TensorList& in) { return pixel_unshuffle(in[0], 2); }, {leaf({1, 2, 4, 6}, 8)});
  const autograd::GradcheckResult gg =
      autograd::gradgradcheck([](const TensorList& in) { return roll(pixel_shuffle(in[0], 2), {1}, {-1}); }, {p});
  CHECK_MESSAGE(gg.ok, gg.report);
}
