#pragma once
// Low-rank (SVD) factorization of a Conv2d along its channels.
//
// A Conv2d weight W (out, in, kh, kw) is the matrix W2 (out, in*kh*kw) applied to every
// im2col patch (Note [Convolution as GEMM] in tensor/ops/conv.h). Its truncated SVD
// W2 ~ (U_r S_r) Vh_r splits the layer into two convolutions:
//   down: kh x kw, in -> rank channels, weight Vh_r (rank, in, kh, kw), the original
//         stride, padding and dilation, no bias;
//   up:   1 x 1, rank -> out channels, weight U_r S_r (out, rank, 1, 1), the original bias.
// rank * (in*kh*kw + out) parameters instead of out * in*kh*kw, with the error of the
// best rank-r approximation of W2 (Eckart-Young), as for LowRankLinear (nn/low_rank.h).
// Grouped convolutions (groups > 1) are refused: their weight is one matrix per group,
// not one matrix. compress() factorizes Conv2d layers only with CompressPolicy::convs.
#include <memory>
#include <string>

#include "nn/conv.h"
#include "nn/low_rank.h"
#include "tensor/ops/svd.h"

namespace frugal::nn {

/// y = up(down(x)) as above. Parameters "down.weight" (rank, in, kh, kw), "up.weight"
/// (out, rank, 1, 1), "up.bias" (out), like LowRankLinear. Both are nn::Conv2d.
class LowRankConv2d : public UnaryModule {
 public:
  /// Fresh factors, each initialised as a Conv2d of its shape. 1 <= rank <= min(out,
  /// in*kh*kw); options.groups must be 1; options.bias goes to `up`.
  LowRankConv2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size, int64_t rank,
                Conv2dModuleOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LowRankConv2d"; }
  std::string extra_repr() const override;
  /// up.weight @ down.weight as a (out, in, kh, kw) conv weight: the dense conv this layer applies.
  Tensor dense_weight() const;

  std::shared_ptr<Conv2d> down, up;
  const int64_t in_channels, out_channels;
  const Int2 kernel_size;
  const int64_t rank;
};

/// The rank-`rank` channel factorization of layer.weight as a LowRankConv2d on the layer's
/// device and dtype (SVD in float32, float64 for float64 weights). Throws, naming the
/// layer, when groups != 1, when rank is outside [1, min(out, in*kh*kw)], or when
/// rank * (in*kh*kw + out) >= out * in*kh*kw (unless options.require_saving is false).
std::shared_ptr<LowRankConv2d> to_low_rank(const Conv2d& layer, int64_t rank, LowRankOptions options = {});
/// As above with the rank chosen by rank_for_energy on the reshaped weight's spectrum.
std::shared_ptr<LowRankConv2d> to_low_rank(const Conv2d& layer, Energy energy, LowRankOptions options = {});

/// ||W - dense_weight||_F / ||W||_F for a conv weight W (out, in, kh, kw), in float64.
double relative_error(const Tensor& weight, const LowRankConv2d& low_rank);

namespace detail {
/// "Conv2d(in=3, out=8, kernel_size=(3, 3))" (with ", groups=G" when grouped), for messages.
std::string conv_str(const Conv2d& layer);
/// The thin SVD of layer.weight reshaped to (out, in*kh*kw); groups must be 1.
ops::SVDResult conv_weight_svd(const Conv2d& layer);
/// The LowRankConv2d of rank `rank` from conv_weight_svd's factors (no checks beyond the module's).
std::shared_ptr<LowRankConv2d> build_low_rank_conv(const Conv2d& layer, const ops::SVDResult& f, int64_t rank);
}  // namespace detail

}  // namespace frugal::nn
