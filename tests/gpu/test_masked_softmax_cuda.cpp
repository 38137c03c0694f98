// masked_softmax on CUDA against the CPU op on the same inputs: bool, float and causal
// masks, fully masked rows, short and long rows, in every floating dtype; mismatched devices.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/masked_softmax.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

TEST_CASE("cuda nn_functional: masked_softmax matches the CPU for every mask kind and row length") {
  uint64_t seed = 300;
  for (int64_t S : {5, 77, 1500}) {
    const int64_t B = 2, H = 3, L = 6;
    for (DType dt : kFloatTypes) {
      const std::string what = name_of(dt, {B, H, L, S});
      const DevicePair x = random_pair({B, H, L, S}, dt, seed++, Layout::Contiguous, -4, 4);
      std::vector<double> pad(size_t(B * S), 1.0);
      for (int64_t s = S / 2; s < S; ++s) pad[size_t(S + s)] = 0;  // batch 1 pads its second half
      const DevicePair bmask = pair_of(from_vector(pad, {B, 1, 1, S}).to(kBool));
      std::vector<double> add = random_values(L * S, seed++, -2, 2);
      for (int64_t s = 0; s < S; ++s) add[size_t(S + s)] = -INFINITY;  // row 1 fully masked: zeros
      const DevicePair fmask = pair_of(make_tensor(add, {L, S}, dt));
      const double t = tol(dt, std::sqrt(double(S) / 5.0));
      check_same(ops::masked_softmax(x.gpu, bmask.gpu, false, 0.125),
                 ops::masked_softmax(x.cpu, bmask.cpu, false, 0.125), t, t * 0.01, "bool " + what);
      check_same(ops::masked_softmax(x.gpu, fmask.gpu), ops::masked_softmax(x.cpu, fmask.cpu), t, t * 0.01,
                 "float " + what);
      check_same(ops::masked_softmax(x.gpu, Tensor(), true, 0.5), ops::masked_softmax(x.cpu, Tensor(), true, 0.5), t,
                 t * 0.01, "causal " + what);
    }
  }
}

TEST_CASE("cuda nn_functional: masked_softmax on mismatched devices is an error naming both tensors") {
  const Tensor xg = zeros({2, 3}, {kFloat32, kGpu});
  check_error([&] { ops::masked_softmax(xg, zeros({3}, kBool)); }, {"masked_softmax", "one device", "bool[3] cpu"});
}
