#include "nn/pooling.h"

#include "autograd/ops/pool.h"
#include "autograd/ops/pool1d.h"

namespace frugal::nn {

namespace {
/// "3" for (3, 3), "(3, 1)" otherwise, as PyTorch prints the sizes it was given.
std::string compact(Int2 v) { return v.h == v.w ? std::to_string(v.h) : v.str(); }
std::string boolean(bool b) { return b ? "true" : "false"; }
}  // namespace

MaxPool2d::MaxPool2d(Int2 kernel, MaxPool2dOptions o) : kernel_size(kernel), options(o) {
  FRUGAL_CHECK(kernel.h > 0 && kernel.w > 0, "MaxPool2d: kernel_size must be positive, got ", kernel.str());
}

Tensor MaxPool2d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return max_pool2d(x, kernel_size, options);
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + compact(kernel_size) + ", stride=" + compact(pool_stride(options.stride, kernel_size)) +
         ", padding=" + compact(options.padding) + ", dilation=" + compact(options.dilation) +
         ", ceil_mode=" + boolean(options.ceil_mode);
}

AvgPool2d::AvgPool2d(Int2 kernel, AvgPool2dOptions o) : kernel_size(kernel), options(o) {
  FRUGAL_CHECK(kernel.h > 0 && kernel.w > 0, "AvgPool2d: kernel_size must be positive, got ", kernel.str());
}

Tensor AvgPool2d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return avg_pool2d(x, kernel_size, options);
}

std::string AvgPool2d::extra_repr() const {
  std::string s = "kernel_size=" + compact(kernel_size) +
                  ", stride=" + compact(pool_stride(options.stride, kernel_size)) +
                  ", padding=" + compact(options.padding);
  if (options.ceil_mode) s += ", ceil_mode=true";
  if (!options.count_include_pad) s += ", count_include_pad=false";
  return s;
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Int2 size) : output_size(size) {
  FRUGAL_CHECK(size.h > 0 && size.w > 0, "AdaptiveAvgPool2d: output_size must be positive, got ", size.str());
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return adaptive_avg_pool2d(x, output_size);
}

// The 1-D layers print as torch's: MaxPool1d its ints, AvgPool1d 1-tuples.
MaxPool1d::MaxPool1d(int64_t kernel, MaxPool1dOptions o) : kernel_size(kernel), options(o) {
  FRUGAL_CHECK(kernel > 0, "MaxPool1d: kernel_size must be positive, got ", kernel);
}

Tensor MaxPool1d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return max_pool1d(x, kernel_size, options);
}

std::string MaxPool1d::extra_repr() const {
  return "kernel_size=" + std::to_string(kernel_size) +
         ", stride=" + std::to_string(options.stride == 0 ? kernel_size : options.stride) +
         ", padding=" + std::to_string(options.padding) + ", dilation=" + std::to_string(options.dilation) +
         ", ceil_mode=" + boolean(options.ceil_mode);
}

AvgPool1d::AvgPool1d(int64_t kernel, AvgPool1dOptions o) : kernel_size(kernel), options(o) {
  FRUGAL_CHECK(kernel > 0, "AvgPool1d: kernel_size must be positive, got ", kernel);
}

Tensor AvgPool1d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return avg_pool1d(x, kernel_size, options);
}

std::string AvgPool1d::extra_repr() const {
  const auto tuple1 = [](int64_t v) { return "(" + std::to_string(v) + ",)"; };
  std::string s = "kernel_size=" + tuple1(kernel_size) +
                  ", stride=" + tuple1(options.stride == 0 ? kernel_size : options.stride) +
                  ", padding=" + tuple1(options.padding);
  if (options.ceil_mode) s += ", ceil_mode=true";
  if (!options.count_include_pad) s += ", count_include_pad=false";
  return s;
}

AdaptiveAvgPool1d::AdaptiveAvgPool1d(int64_t size) : output_size(size) {
  FRUGAL_CHECK(size > 0, "AdaptiveAvgPool1d: output_size must be positive, got ", size);
}

Tensor AdaptiveAvgPool1d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return adaptive_avg_pool1d(x, output_size);
}

}  // namespace frugal::nn
