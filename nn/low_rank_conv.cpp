#include "nn/low_rank_conv.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"

namespace frugal::nn {

LowRankConv2d::LowRankConv2d(int64_t in, int64_t out, Int2 kernel, int64_t r, Conv2dModuleOptions options)
    : in_channels(in), out_channels(out), kernel_size(kernel), rank(r) {
  FRUGAL_CHECK(in > 0 && out > 0, "LowRankConv2d: channels must be positive, got in=", in, " out=", out);
  FRUGAL_CHECK(kernel.h > 0 && kernel.w > 0, "LowRankConv2d: kernel_size must be positive, got ", kernel.str());
  FRUGAL_CHECK(options.groups == 1, "LowRankConv2d: groups must be 1, got groups=", options.groups,
               " (a grouped conv's weight is one matrix per group, not one matrix)");
  const int64_t patch = in * kernel.h * kernel.w;
  FRUGAL_CHECK(r >= 1 && r <= std::min(out, patch), "LowRankConv2d: rank ", r, " is outside [1, min(out=", out,
               ", in*kh*kw=", patch, ")]");
  down = register_module("down", std::make_shared<Conv2d>(in, r, kernel,
                                                          Conv2dModuleOptions{.stride = options.stride,
                                                                              .padding = options.padding,
                                                                              .dilation = options.dilation,
                                                                              .bias = false}));
  up = register_module("up", std::make_shared<Conv2d>(r, out, Int2(1), Conv2dModuleOptions{.bias = options.bias}));
}

Tensor LowRankConv2d::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  FRUGAL_CHECK((x.dim() == 3 || x.dim() == 4) && x.size(-3) == in_channels, "LowRankConv2d: expected input (N, ",
               in_channels, ", H, W) or (", in_channels, ", H, W), got ", x.describe());
  return up->forward(down->forward(x));
}

std::string LowRankConv2d::extra_repr() const {
  const Conv2dOptions& o = down->options;
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + kernel_size.str() + ", rank=" + std::to_string(rank) +
                  ", stride=" + o.stride.str();
  if (o.padding != Int2(0)) s += ", padding=" + o.padding.str();
  if (o.dilation != Int2(1)) s += ", dilation=" + o.dilation.str();
  if (!up->bias.defined()) s += ", bias=false";
  return s;
}

Tensor LowRankConv2d::dense_weight() const {
  autograd::NoGradGuard no_grad;
  const int64_t patch = in_channels * kernel_size.h * kernel_size.w;
  return ops::matmul(up->weight.detach().reshape({out_channels, rank}), down->weight.detach().reshape({rank, patch}))
      .reshape({out_channels, in_channels, kernel_size.h, kernel_size.w});
}

namespace detail {

std::string conv_str(const Conv2d& layer) {
  std::string s = "Conv2d(in=" + std::to_string(layer.in_channels) + ", out=" + std::to_string(layer.out_channels) +
                  ", kernel_size=" + layer.kernel_size.str();
  if (layer.options.groups != 1) s += ", groups=" + std::to_string(layer.options.groups);
  return s + ")";
}

ops::SVDResult conv_weight_svd(const Conv2d& layer) {
  FRUGAL_CHECK(layer.options.groups == 1, "to_low_rank: ", conv_str(layer), " has groups=", layer.options.groups,
               "; only groups=1 convolutions are factorized (a grouped conv's weight is one matrix per group)");
  const Tensor w = layer.weight.detach().reshape(
      {layer.out_channels, layer.in_channels * layer.kernel_size.h * layer.kernel_size.w});
  return ops::svd(w.dtype() == kFloat64 ? w : w.to(kFloat32));
}

std::shared_ptr<LowRankConv2d> build_low_rank_conv(const Conv2d& layer, const ops::SVDResult& f, int64_t rank) {
  autograd::NoGradGuard no_grad;
  const int64_t in = layer.in_channels, out = layer.out_channels;
  const Int2 k = layer.kernel_size;
  const Conv2dOptions& o = layer.options;
  auto m = std::make_shared<LowRankConv2d>(
      in, out, k, rank,
      Conv2dModuleOptions{
          .stride = o.stride, .padding = o.padding, .dilation = o.dilation, .bias = layer.bias.defined()});
  m->to(layer.weight.device(), layer.weight.dtype());
  // W2 ~ (U_r diag(S_r)) Vh_r: down.weight = Vh_r as (r, in, kh, kw), up.weight = U_r S_r as (out, r, 1, 1).
  ops::copy_into(m->down->weight, f.Vh.narrow(0, 0, rank).reshape({rank, in, k.h, k.w}));
  ops::copy_into(m->up->weight, ops::mul(f.U.narrow(1, 0, rank), f.S.narrow(0, 0, rank)).reshape({out, rank, 1, 1}));
  if (layer.bias.defined()) ops::copy_into(m->up->bias, layer.bias.detach());
  keep_trainability(layer, layer.weight, layer.bias, *m, m->down->weight, m->up->weight, m->up->bias);
  return m;
}

}  // namespace detail

namespace {

void check_rank(const Conv2d& layer, int64_t rank, LowRankOptions options, const std::string& how) {
  const int64_t patch = layer.in_channels * layer.kernel_size.h * layer.kernel_size.w, out = layer.out_channels;
  FRUGAL_CHECK(rank >= 1 && rank <= std::min(out, patch), "to_low_rank: rank ", rank, how, " is outside [1, ",
               std::min(out, patch), "] for ", detail::conv_str(layer));
  if (options.require_saving) {
    const int64_t largest = (patch * out - 1) / (patch + out);  // the largest rank that saves
    FRUGAL_CHECK(rank * (patch + out) < patch * out, "to_low_rank: rank ", rank, how, " saves no parameters for ",
                 detail::conv_str(layer), ": rank * (in*kh*kw + out) = ", rank * (patch + out),
                 " >= out * in*kh*kw = ", patch * out,
                 largest >= 1 ? " (ranks up to " + std::to_string(largest) + " save)" : " (no rank saves)",
                 "; pass LowRankOptions{.require_saving = false} to factorize anyway");
  }
}

}  // namespace

std::shared_ptr<LowRankConv2d> to_low_rank(const Conv2d& layer, int64_t rank, LowRankOptions options) {
  const ops::SVDResult f = detail::conv_weight_svd(layer);  // refuses groups != 1 first
  check_rank(layer, rank, options, "");
  return detail::build_low_rank_conv(layer, f, rank);
}

std::shared_ptr<LowRankConv2d> to_low_rank(const Conv2d& layer, Energy energy, LowRankOptions options) {
  const ops::SVDResult f = detail::conv_weight_svd(layer);
  const int64_t rank = std::max<int64_t>(1, rank_for_energy(f.S, energy));
  check_rank(layer, rank, options, " (energy " + std::to_string(energy.fraction) + ")");
  return detail::build_low_rank_conv(layer, f, rank);
}

double relative_error(const Tensor& weight, const LowRankConv2d& low_rank) {
  autograd::NoGradGuard no_grad;
  const int64_t out = low_rank.out_channels, r = low_rank.rank;
  const Int2 k = low_rank.kernel_size;
  // The product in float64, so that float32 factors are not rounded again.
  const Tensor approx = ops::matmul(low_rank.up->weight.detach().to(kCPU, kFloat64).reshape({out, r}),
                                    low_rank.down->weight.detach().to(kCPU, kFloat64).reshape({r, -1}))
                            .reshape({out, low_rank.in_channels, k.h, k.w});
  return detail::relative_frobenius_error(weight, approx, low_rank.repr());
}

}  // namespace frugal::nn
