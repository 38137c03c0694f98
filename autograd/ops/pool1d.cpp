// max_pool1d, avg_pool1d and adaptive_avg_pool1d through the 2-D differentiable ops.
#include "autograd/ops/pool1d.h"

#include "autograd/ops/pool.h"

namespace frugal {

Tensor max_pool1d(const Tensor& x, int64_t kernel, const MaxPool1dOptions& o) {
  ops::check_pool1d_tensor("max_pool1d", x);
  ops::pool1d_output_length("max_pool1d", x.sizes(), kernel, o.stride, o.padding, o.dilation, o.ceil_mode);
  return max_pool2d(x.unsqueeze(-2), {1, kernel}, ops::max_pool1d_as_2d(kernel, o)).squeeze(-2);
}

Tensor avg_pool1d(const Tensor& x, int64_t kernel, const AvgPool1dOptions& o) {
  ops::check_pool1d_tensor("avg_pool1d", x);
  ops::pool1d_output_length("avg_pool1d", x.sizes(), kernel, o.stride, o.padding, 1, o.ceil_mode);
  return avg_pool2d(x.unsqueeze(-2), {1, kernel}, ops::avg_pool1d_as_2d(kernel, o)).squeeze(-2);
}

Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size) {
  ops::check_pool1d_tensor("adaptive_avg_pool1d", x);
  ops::check_adaptive_pool1d("adaptive_avg_pool1d", x.sizes(), output_size);
  return adaptive_avg_pool2d(x.unsqueeze(-2), {1, output_size}).squeeze(-2);
}

}  // namespace frugal
