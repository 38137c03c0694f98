// quantize_blockwise / dequantize_blockwise and the relu masks on CUDA against the CPU: the
// hardware e4m3 conversion of cuda_fp8.h (__nv_cvt_float_to_fp8, satfinite) gives the codes of
// the CPU's software encoder bit for bit, and the same scales and values, in float32, float16
// and bfloat16, contiguous and strided, at sizes that take many blocks and a short last one;
// every e4m3 rounding edge (every code, midpoints and their neighbours) through a scale of 1.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tensor/factory.h"
#include "tensor/ops/quantize.h"
#include "tensor/ops/quantize_math.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using ops::QuantFormat;

namespace {

/// Quantizes the pair on both devices: codes and scales bit for bit, dequantized values too.
void check_pair(const DevicePair& x, QuantFormat format, int64_t block, const std::string& what) {
  INFO(what, " ", std::string(ops::to_string(format)), " block ", block, " ", x.gpu.describe());
  const ops::Quantized qc = ops::quantize_blockwise(x.cpu, format, block);
  const ops::Quantized qg = ops::quantize_blockwise(x.gpu, format, block);
  REQUIRE(qg.codes.device() == kGpu);
  const std::vector<uint8_t> cc = bytes_of(qc.codes), cg = bytes_of(qg.codes);
  int64_t mismatches = 0;
  for (size_t i = 0; i < cc.size(); ++i)
    if (cc[i] != cg[i] && mismatches++ < 5) MESSAGE("code ", i, ": cuda ", int(cg[i]), " cpu ", int(cc[i]));
  CHECK(mismatches == 0);
  check_same(qg.scales, qc.scales, 0, 0, "scales");
  const Tensor dc = ops::dequantize_blockwise(qc.codes, qc.scales, format, block, x.cpu.dtype(), x.cpu.sizes());
  const Tensor dg = ops::dequantize_blockwise(qg.codes, qg.scales, format, block, x.gpu.dtype(), x.gpu.sizes());
  check_same(dg, dc, 0, 0, "dequantized");
}

}  // namespace

TEST_CASE("cuda quantize: codes, scales and values bit for bit the CPU's in every dtype and layout") {
  uint64_t seed = 1;
  for (QuantFormat format : {QuantFormat::Fp8E4M3, QuantFormat::Int8}) {
    for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
      for (Layout layout : kAllLayouts) {
        const DevicePair x = random_pair({37, 129}, dt, seed++, layout, -5.0, 5.0);
        for (int64_t block : {1, 32, 100, 256, 1024, 5000}) check_pair(x, format, block, layout_name(layout));
      }
      // Large (many thread blocks, a short last block), permuted, narrowed, a wide range.
      check_pair(random_pair({1 << 20 | 77}, dt, seed++), format, 256, "large");
      const DevicePair p = random_pair({6, 7, 8, 9}, dt, seed++);
      check_pair({p.cpu.permute({3, 1, 0, 2}), p.gpu.permute({3, 1, 0, 2})}, format, 64, "permuted");
      check_pair({p.cpu.narrow(1, 2, 4), p.gpu.narrow(1, 2, 4)}, format, 48, "narrowed");
      std::vector<double> wide = random_values(4096, seed++, -1.0, 1.0);
      for (size_t i = 0; i < wide.size(); ++i) wide[i] *= std::pow(10.0, double(i % 9) - 6.0);
      check_pair(on_both(wide, {4096}, dt), format, 256, "wide range");
    }
  }
}

TEST_CASE("cuda quantize: the hardware e4m3 conversion equals the software encoder at every edge") {
  // One block whose absmax is 448 has scale 1, so the codes are the encoder's of the values
  // themselves: every code's value, the midpoints between neighbours (ties) and the floats
  // beside them, subnormals, the region past 448 that saturates (reached from a block with a
  // larger absmax: 900 / 2 scales to 448 * (450 / 448) etc.), signed zeros, NaN and inf.
  std::vector<double> v;
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = ops::quant::e4m3_decode(uint8_t(c)), hi = ops::quant::e4m3_decode(uint8_t(c + 1));
    const float mid = 0.5f * (lo + hi);
    for (float f : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) v.insert(v.end(), {f, -f});
  }
  v.insert(v.end(), {448.0, -0.0, 1e-40, -1e-40, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()});
  const DevicePair x = on_both(v, {int64_t(v.size())}, kFloat32);
  check_pair(x, QuantFormat::Fp8E4M3, int64_t(v.size()), "edges, scale 1");
  check_pair(x, QuantFormat::Int8, int64_t(v.size()), "edges, scale 1");
  check_pair(x, QuantFormat::Fp8E4M3, 7, "edges, small blocks");
  // The vector paths (Note [Vectorized quantization]: a dense tensor, a block of 8k): the same
  // edges, NaN and inf in blocks of 64, 256 (its own kernel, 4 blocks per warp) and 1024 with a
  // short last one; and 1-D views starting
  // 1 and 8 elements in, dense but misaligned (the element-wise path) and aligned again.
  for (int64_t block : {8, 64, 256, 1024}) {
    check_pair(x, QuantFormat::Fp8E4M3, block, "edges, vector path");
    check_pair(x, QuantFormat::Int8, block, "edges, vector path");
  }
  for (DType dt : {kFloat32, kFloat16, kBFloat16})
    for (int64_t start : {1, 8}) {
      const DevicePair r = random_pair({4099}, dt, 77);
      check_pair({r.cpu.narrow(0, start, 4000), r.gpu.narrow(0, start, 4000)}, QuantFormat::Fp8E4M3, 256,
                 "1-D view from " + std::to_string(start));
    }
  // Blocks of 256 with NaN of either sign but no inf take the kernel's fast path (codes two
  // per conversion, NaN codes made 0x7F after it); a block with an inf takes the exact one.
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    std::vector<double> w = random_values(4 * 256 + 40, 31, -3.0, 3.0);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    w[3] = nan, w[300] = -nan, w[301] = nan, w[767] = -nan;           // blocks 0, 1 and 2: NaN only
    w[800] = std::numeric_limits<double>::infinity(), w[801] = -nan;  // block 3: inf and NaN
    w[1030] = -nan;                                                   // the short last block
    check_pair(on_both(w, {int64_t(w.size())}, dt), QuantFormat::Fp8E4M3, 256, "NaN without inf, block 256");
  }
  // Values just past 448 after the division: a block of 449 and 448.9 and neighbours.
  const DevicePair sat = on_both({449.0, 448.9, 448.5, 464.0, 463.9, 1.0, -449.0}, {7}, kFloat32);
  check_pair(sat, QuantFormat::Fp8E4M3, 7, "saturation");
}

TEST_CASE("cuda quantize: relu_mask and apply_relu_mask bit for bit the CPU's") {
  for (DType dt : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      std::vector<double> yv = random_values(333 * 17, 5, -1.0, 1.0);
      yv[0] = 0.0, yv[1] = -0.0, yv[2] = std::numeric_limits<double>::quiet_NaN();
      const DevicePair y = on_both(yv, {333, 17}, dt, layout), g = random_pair({333, 17}, dt, 6, layout);
      const Tensor mc = ops::relu_mask(y.cpu), mg = ops::relu_mask(y.gpu);
      CHECK_MESSAGE(bytes_of(mg) == bytes_of(mc), name_of(dt, layout));
      check_same(ops::apply_relu_mask(g.gpu, mg), ops::apply_relu_mask(g.cpu, mc), 0, 0, name_of(dt, layout));
    }
    for (int64_t start : {1, 8}) {  // dense views, misaligned and aligned (the vector path)
      const DevicePair y = random_pair({1003}, dt, 7), g = random_pair({1003}, dt, 8);
      const Tensor yc = y.cpu.narrow(0, start, 995), yg = y.gpu.narrow(0, start, 995);
      const Tensor gc = g.cpu.narrow(0, start, 995), gg = g.gpu.narrow(0, start, 995);
      const Tensor mc = ops::relu_mask(yc), mg = ops::relu_mask(yg);
      CHECK_MESSAGE(bytes_of(mg) == bytes_of(mc), name_of(dt, Layout::Contiguous), " from ", start);
      check_same(ops::apply_relu_mask(gg, mg), ops::apply_relu_mask(gc, mc), 0, 0, "apply_relu_mask on a view");
    }
  }
}
