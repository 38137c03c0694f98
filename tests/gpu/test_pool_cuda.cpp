// max_pool2d, avg_pool2d and adaptive_avg_pool2d (frugal's kernels) on CUDA against the CPU
// ops on the same inputs: forward and every gradient through autograd, in float32, float16,
// bfloat16 and float64, on small odd configurations and on ResNet-50's pools (the stem max
// pool, global average pooling); the argmax indices; mismatched devices.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "autograd/ops/pool.h"
#include "tensor/factory.h"
#include "tensor/ops/pool.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda pooling: forward and backward match the CPU, ResNet's pools included") {
  struct MaxCase {
    Shape x;
    Int2 k;
    MaxPool2dOptions o;
  };
  const MaxCase max_cases[] = {
      {{2, 3, 9, 7}, 3, {.stride = 2, .padding = 1}},
      {{2, 2, 9, 9}, {3, 2}, {.stride = {2, 1}, .padding = 1, .dilation = {2, 1}, .ceil_mode = true}},
      {{8, 64, 112, 112}, 3, {.stride = 2, .padding = 1}},  // ResNet's stem pool
  };
  uint64_t seed = 1;
  for (const MaxCase& c : max_cases) {
    const Tensor x = random_tensor(c.x, kFloat64, ++seed);
    const Shape ys = ops::max_pool2d(x, c.k, c.o).out.sizes();
    for (DType t : kFloatTypes) {
      compare_devices([&](const std::vector<Tensor>& in) { return max_pool2d(in[0], c.k, c.o); }, {x}, ys, t, ++seed,
                      "max_pool2d " + shape_str(c.x));
      const Tensor xt = x.to(t);
      CHECK(ops::max_pool2d(xt.to(kGpu), c.k, c.o).indices.cpu().tolist<int64_t>() ==
            ops::max_pool2d(xt, c.k, c.o).indices.tolist<int64_t>());
    }
  }
  struct AvgCase {
    Shape x;
    Int2 k;
    AvgPool2dOptions o;
  };
  const AvgCase avg_cases[] = {
      {{2, 3, 9, 7}, 3, {.stride = 2, .padding = 1}},
      {{2, 2, 7, 8}, {3, 2}, {.stride = {2, 3}, .padding = 1, .ceil_mode = true, .count_include_pad = false}},
      {{8, 256, 28, 28}, 2, {}},
  };
  for (const AvgCase& c : avg_cases) {
    const Tensor x = random_tensor(c.x, kFloat64, ++seed);
    const Shape ys = ops::avg_pool2d(x, c.k, c.o).sizes();
    for (DType t : kFloatTypes)
      compare_devices([&](const std::vector<Tensor>& in) { return avg_pool2d(in[0], c.k, c.o); }, {x}, ys, t, ++seed,
                      "avg_pool2d " + shape_str(c.x));
  }
  const std::pair<Shape, Int2> adaptive_cases[] = {
      {{8, 2048, 7, 7}, 1},      // global average pooling: a warp per output
      {{2, 3, 13, 11}, {4, 5}},  // thread per output, overlapping windows
      {{2, 3, 3, 4}, {5, 7}},    // growing
      {{2, 4, 64, 48}, {2, 3}},  // large windows, several outputs per plane
  };
  for (const auto& [xs, out] : adaptive_cases) {
    const Tensor x = random_tensor(xs, kFloat64, ++seed);
    const Shape ys = ops::adaptive_avg_pool2d(x, out).sizes();
    for (DType t : kFloatTypes)
      compare_devices([&](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], out); }, {x}, ys, t,
                      ++seed, "adaptive_avg_pool2d " + shape_str(xs));
  }
  const Tensor xg = random_tensor({2, 3, 8, 8}, {kFloat32, kGpu}, 1, Layout::Transposed);
  check_dtype_norm_close(ops::max_pool2d(xg, 2).out, ops::max_pool2d(xg.cpu(), 2).out, 0, "non-contiguous max");
  const ops::MaxPool2dResult r = ops::max_pool2d(xg, 2);
  check_error([&] { ops::max_pool2d_backward(r.out, r.indices.cpu(), xg.sizes(), 2); },
              {"max_pool2d_backward", "cuda", "cpu"});
}
