#include "tensor/cuda/loops.cuh"
#include "tensor/dispatch.h"
#include "tensor/ops/fill.h"

namespace frugal::ops::cuda {

namespace {
template <typename T>
struct Constant {
  T value;
  __device__ T operator()() const { return value; }
};
}  // namespace

void fill_kernel(const Tensor& t, double value) {
  const ElementwiseLayout L = make_elementwise_layout("fill_", t, {});
  dispatch_all(t.dtype(), "fill_", t.device(), [&]<typename T>() {
    const T v = std::is_same_v<T, bool> ? T(value != 0.0) : T(static_cast<opmath_t<T>>(value));
    cuda_map<T>(L, t.device(), Constant<T>{v});
  });
}

}  // namespace frugal::ops::cuda
