// max_pool1d, avg_pool1d and adaptive_avg_pool1d: checks in 1-D terms, then the 2-D ops on a
// 1 x L image (tensor/ops/pool1d.h).
#include "tensor/ops/pool1d.h"

#include <string>

namespace frugal::ops {

namespace {

void check_pool1d_input(const char* op, const Shape& in) {
  FRUGAL_CHECK(in.size() == 2 || in.size() == 3, op, ": expected a 2-D (C, L) or 3-D (N, C, L) input, got ",
               shape_str(in));
  FRUGAL_CHECK(in.back() > 0, op, ": the input's length must be non-zero, got ", shape_str(in));
}

}  // namespace

void check_pool1d_tensor(const char* op, const Tensor& x) {
  FRUGAL_CHECK(x.defined(), op, ": the input is undefined");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point input, got ", x.describe());
}

MaxPool2dOptions max_pool1d_as_2d(int64_t kernel, const MaxPool1dOptions& o) {
  return {.stride = {1, o.stride == 0 ? kernel : o.stride},
          .padding = {0, o.padding},
          .dilation = {1, o.dilation},
          .ceil_mode = o.ceil_mode};
}

AvgPool2dOptions avg_pool1d_as_2d(int64_t kernel, const AvgPool1dOptions& o) {
  return {.stride = {1, o.stride == 0 ? kernel : o.stride},
          .padding = {0, o.padding},
          .ceil_mode = o.ceil_mode,
          .count_include_pad = o.count_include_pad};
}

int64_t pool1d_output_length(const char* op, const Shape& in, int64_t kernel, int64_t stride, int64_t padding,
                             int64_t dilation, bool ceil_mode) {
  check_pool1d_input(op, in);
  FRUGAL_CHECK(kernel > 0, op, ": kernel size must be positive, got ", kernel);
  if (stride == 0) stride = kernel;
  FRUGAL_CHECK(stride > 0, op, ": stride must be positive, got ", stride);
  FRUGAL_CHECK(dilation > 0, op, ": dilation must be positive, got ", dilation);
  const int64_t span = dilation * (kernel - 1) + 1;
  FRUGAL_CHECK(padding >= 0 && padding <= span / 2, op, ": padding must be between 0 and half the kernel size, got ",
               padding, " for kernel ", kernel, dilation == 1 ? "" : " dilated " + std::to_string(dilation));
  const int64_t out = pooled_size(in.back(), kernel, stride, padding, dilation, ceil_mode);
  FRUGAL_CHECK(out > 0, op, ": input ", shape_str(in), " is too short for kernel ", kernel, " with padding ", padding,
               ", dilation ", dilation, ": output length ", out);
  return out;
}

// The raw ops may be handed tensors that require grad: their views go through detached handles.
Tensor max_pool1d(const Tensor& x, int64_t kernel, const MaxPool1dOptions& o) {
  check_pool1d_tensor("max_pool1d", x);
  pool1d_output_length("max_pool1d", x.sizes(), kernel, o.stride, o.padding, o.dilation, o.ceil_mode);
  return max_pool2d_values(x.detach().unsqueeze(-2), {1, kernel}, max_pool1d_as_2d(kernel, o)).squeeze(-2);
}

Tensor avg_pool1d(const Tensor& x, int64_t kernel, const AvgPool1dOptions& o) {
  check_pool1d_tensor("avg_pool1d", x);
  pool1d_output_length("avg_pool1d", x.sizes(), kernel, o.stride, o.padding, 1, o.ceil_mode);
  return avg_pool2d(x.detach().unsqueeze(-2), {1, kernel}, avg_pool1d_as_2d(kernel, o)).squeeze(-2);
}

void check_adaptive_pool1d(const char* op, const Shape& in, int64_t output_size) {
  check_pool1d_input(op, in);
  FRUGAL_CHECK(output_size > 0, op, ": output size must be positive, got ", output_size);
}

Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size) {
  check_pool1d_tensor("adaptive_avg_pool1d", x);
  check_adaptive_pool1d("adaptive_avg_pool1d", x.sizes(), output_size);
  return adaptive_avg_pool2d(x.detach().unsqueeze(-2), {1, output_size}).squeeze(-2);
}

}  // namespace frugal::ops
