// The CUDA flash attention kernels against the float64 formula (tests/flash_attention_reference.h)
// on the same float16/bfloat16 inputs: forward (out, lse) and backward (dq, dk, dv) over
// B=2, H=3, L=S in {1, 7, 64, 128, 200, 513} and head dims 32, 64, 80, 128; L != S; masks
// (bool key padding, bool and float full, float (L, S)); causal; dropout (the mask dropout()
// draws over the same range); strided (B, L, H, E) inputs; packed qkv views, sequence-major
// and contiguous inputs against the CPU kernels, with the results' layouts (Note [Flash
// attention layouts]); scaled_dot_product_attention's routing with and without autocast; and
// the memory bound: forward + backward at T = 2048 allocate O(T), far below one (B, H, T, T) tensor.
// Every case runs frugal's own kernels (AttentionBackend::Flash); test_attention_cudnn_cuda.cpp
// tests the cuDNN path.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/reduce.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/ops/flash_attention.h"
#include "tests/flash_attention_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const Device kGpu = cuda(0);

/// Runs the CUDA raw ops on `in` (moved to the GPU, `gpu_view` applied) and checks all five
/// results against the reference.
template <typename View>
void check_cuda(const AttentionCase& c, const AttentionInputs& in, const Tensor& mask, bool causal, double p,
                View gpu_view) {
  const DType dt = in.q.dtype();
  INFO("B=", c.B, " H=", c.H, " L=", c.L, " S=", c.S, " E=", c.E, " ", std::string(dtype_name(dt)),
       " mask=", mask.defined() ? mask.describe() : "none", " causal=", causal, " p=", p);
  const Tensor q = gpu_view(in.q), k = gpu_view(in.k), v = gpu_view(in.v), g = gpu_view(in.g);
  const Tensor m = mask.defined() ? mask.to(kGpu) : Tensor();
  const ops::FlashAttentionOptions o{m, causal, {}, p};
  Generator gen(1234);
  const ops::FlashAttentionForward f = ops::flash_attention_forward(q, k, v, o, &gen);
  const ops::FlashAttentionGrads gr = ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
  const double scale = 1.0 / std::sqrt(double(c.E));
  const AttentionReference ref = attention_reference(in.q, in.k, in.v, mask, causal, scale,
                                                     dropout_factors({c.B, c.H, c.L, c.S}, p, f.range), in.g);
  CHECK(f.out.dtype() == dt);
  CHECK(f.lse.dtype() == kFloat32);
  CHECK(relative_error(f.out, ref.out, "out") <= out_tol(dt));
  CHECK(relative_error(f.lse, ref.lse, "lse") <= 1e-4);
  CHECK(relative_error(gr.dq, ref.dq, "dq") <= grad_tol(dt));
  CHECK(relative_error(gr.dk, ref.dk, "dk") <= grad_tol(dt));
  CHECK(relative_error(gr.dv, ref.dv, "dv") <= grad_tol(dt));
}

void check_cuda(const AttentionCase& c, const AttentionInputs& in, const Tensor& mask, bool causal, double p) {
  check_cuda(c, in, mask, causal, p, [](const Tensor& t) { return t.to(kGpu); });
}

Tensor key_padding(int64_t B, int64_t S) {  // batch b > 0 loses its last keys
  std::vector<double> bits(size_t(B * S), 1.0);
  for (int64_t b = 1; b < B; ++b)
    for (int64_t s = S / 2 + 1; s < S; ++s) bits[size_t(b * S + s)] = 0.0;
  return make_tensor(bits, {B, 1, 1, S}, {kBool});
}

Tensor float_mask(const Shape& sizes, DType dt, uint64_t seed) {
  std::vector<double> m = random_values(numel_of(sizes), seed, -1.0, 1.0);
  for (size_t i = 0; i < m.size(); i += 7) m[i] = -std::numeric_limits<double>::infinity();
  return make_tensor(m, sizes, {dt});
}

}  // namespace

TEST_CASE("flash_attention cuda: shapes and head dims vs the float64 formula") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  uint64_t seed = 1;
  for (DType dt : {kFloat16, kBFloat16})
    for (int64_t E : {32, 64, 80, 128})
      for (int64_t T : {1, 7, 64, 128, 200, 513}) {
        const AttentionCase c{2, 3, T, T, E};
        check_cuda(c, attention_inputs(c, dt, seed), Tensor(), false, 0.0);
        seed += 4;
      }
}

TEST_CASE("flash_attention cuda: L != S, causal, masks") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  uint64_t seed = 500;
  for (DType dt : {kFloat16, kBFloat16}) {
    for (const AttentionCase& c : {AttentionCase{2, 3, 100, 300, 64}, AttentionCase{2, 3, 200, 77, 64},
                                   AttentionCase{1, 2, 77, 200, 128}, AttentionCase{2, 2, 130, 130, 80}}) {
      const AttentionInputs in = attention_inputs(c, dt, seed);
      seed += 4;
      check_cuda(c, in, Tensor(), false, 0.0);
      check_cuda(c, in, Tensor(), true, 0.0);
      check_cuda(c, in, key_padding(c.B, c.S), false, 0.0);
      check_cuda(c, in, key_padding(c.B, c.S), true, 0.0);
      check_cuda(c, in, float_mask({c.B, c.H, c.L, c.S}, dt, seed++), false, 0.0);
      check_cuda(c, in, float_mask({c.L, c.S}, dt, seed++), false, 0.0);
      std::vector<double> bits = random_values(c.B * c.L * c.S, seed++, 0.0, 1.0);
      for (auto& b : bits) b = b < 0.6 ? 1.0 : 0.0;
      check_cuda(c, in, make_tensor(bits, {c.B, 1, c.L, c.S}, {kBool}), false, 0.0);
    }
  }
}

TEST_CASE("flash_attention cuda: dropout keeps the weights dropout() keeps") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  uint64_t seed = 900;
  for (DType dt : {kFloat16, kBFloat16})
    for (double p : {0.1, 0.5}) {
      const AttentionCase c{2, 3, 150, 130, 64};
      check_cuda(c, attention_inputs(c, dt, seed), key_padding(c.B, c.S), p > 0.2, p);
      seed += 4;
    }
}

TEST_CASE("flash_attention cuda: strided (B, L, H, E) inputs") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  const AttentionCase c{2, 3, 70, 90, 64};
  const AttentionInputs in = attention_inputs(c, kFloat16, 1000);
  // The same values stored as (B, L, H, E) on the GPU and viewed as (B, H, L, E).
  check_cuda(c, in, Tensor(), false, 0.0,
             [](const Tensor& t) { return t.transpose(1, 2).contiguous().to(kGpu).transpose(1, 2); });
}

TEST_CASE("flash_attention cuda: packed, sequence-major and contiguous inputs vs the CPU, and result layouts") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  // Note [Flash attention layouts]: q, k, v as chunk(x, 3, -1) + split heads of one (B, T, 3 H E)
  // projection (packed), as separate (B, T, H, E) buffers (sequence-major) or contiguous.
  const int64_t B = 2, H = 3, T = 150;
  enum class Kind { Packed, SequenceMajor, Contiguous };
  uint64_t seed = 1200;
  for (DType dt : {kFloat16, kBFloat16})
    for (int64_t E : {64, 128}) {
      const int64_t D = H * E;
      const Tensor x = random_tensor({B, T, 3 * D}, {dt}, seed++, Layout::Contiguous, -1.0, 1.0);
      // dout as out_proj's backward hands it over: (B, T, H, E) memory viewed as (B, H, T, E).
      const Tensor g = random_tensor({B, T, H, E}, {dt}, seed++, Layout::Contiguous, -1.0, 1.0).transpose(1, 2);
      const Tensor gpu_x = x.to(kGpu), gpu_g = g.transpose(1, 2).to(kGpu).transpose(1, 2);
      const Shape seq_strides{T * H * E, E, H * E, 1};
      for (Kind kind : {Kind::Packed, Kind::SequenceMajor, Kind::Contiguous})
        for (bool causal : {false, true}) {
          INFO(std::string(dtype_name(dt)), " E=", E, " kind=", int(kind), " causal=", causal);
          auto heads = [&](const Tensor& from, int64_t i) {
            const Tensor t = from.narrow(2, i * D, D).unflatten(-1, {H, E}).transpose(1, 2);
            if (kind == Kind::SequenceMajor) return t.transpose(1, 2).contiguous().transpose(1, 2);
            return kind == Kind::Contiguous ? t.contiguous() : t;
          };
          const Tensor mask = key_padding(B, T);
          const ops::FlashAttentionOptions cpu_o{mask, causal, {}, 0.0}, gpu_o{mask.to(kGpu), causal, {}, 0.0};
          const auto cf = ops::flash_attention_forward(heads(x, 0), heads(x, 1), heads(x, 2), cpu_o);
          const auto cg =
              ops::flash_attention_backward(g, heads(x, 0), heads(x, 1), heads(x, 2), cf.out, cf.lse, cpu_o, cf.range);
          const Tensor q = heads(gpu_x, 0), k = heads(gpu_x, 1), v = heads(gpu_x, 2);
          const auto f = ops::flash_attention_forward(q, k, v, gpu_o);
          const auto gr = ops::flash_attention_backward(gpu_g, q, k, v, f.out, f.lse, gpu_o, f.range);
          const Shape want = kind == Kind::Contiguous ? contiguous_strides(q.sizes()) : seq_strides;
          CHECK(f.out.strides() == want);
          CHECK(gr.dq.strides() == q.strides());
          CHECK(gr.dk.strides() == k.strides());
          CHECK(gr.dv.strides() == v.strides());
          if (kind != Kind::Packed) CHECK(gr.dq.strides() == want);  // packed: q's own, checked above
          const bool one_buffer = gr.dq.shares_storage(gr.dk) && gr.dq.shares_storage(gr.dv);
          CHECK(one_buffer == (kind == Kind::Packed));
          if (kind == Kind::Packed) {
            CHECK(gr.dk.storage_offset() - gr.dq.storage_offset() == D);
            CHECK(gr.dv.storage_offset() - gr.dk.storage_offset() == D);
          }
          // The CPU kernels round once on store; the CUDA ones round P and dS as well.
          CHECK(relative_error(f.out, values_of(cf.out), "out") <= 1.5 * out_tol(dt));
          CHECK(relative_error(f.lse, values_of(cf.lse), "lse") <= 1e-4);
          CHECK(relative_error(gr.dq, values_of(cg.dq), "dq") <= 1.5 * grad_tol(dt));
          CHECK(relative_error(gr.dk, values_of(cg.dk), "dk") <= 1.5 * grad_tol(dt));
          CHECK(relative_error(gr.dv, values_of(cg.dv), "dv") <= 1.5 * grad_tol(dt));
        }
    }
}

TEST_CASE("flash_attention cuda: packed q, k, v with an odd stride on a size-1 dim") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  // One head (H = 1): its stride never addresses anything, so it may be odd; the packed
  // gradients copy it, and the pair stores must not refuse them.
  const int64_t B = 2, T = 40, E = 64;
  const Tensor x = random_tensor({B, T, 3 * E}, {kFloat16}, 1300, Layout::Contiguous, -1.0, 1.0);
  const Tensor g = random_tensor({B, 1, T, E}, {kFloat16}, 1301, Layout::Contiguous, -1.0, 1.0);
  auto heads = [&](const Tensor& from, int64_t i) {
    return from.as_strided({B, 1, T, E}, {T * 3 * E, 1, 3 * E, 1}, from.storage_offset() + i * E);
  };
  const ops::FlashAttentionOptions o{};
  const auto cf = ops::flash_attention_forward(heads(x, 0), heads(x, 1), heads(x, 2), o);
  const auto cg = ops::flash_attention_backward(g, heads(x, 0), heads(x, 1), heads(x, 2), cf.out, cf.lse, o, cf.range);
  const Tensor gx = x.to(kGpu);
  const Tensor q = heads(gx, 0), k = heads(gx, 1), v = heads(gx, 2);
  const auto f = ops::flash_attention_forward(q, k, v, o);
  ops::FlashAttentionGrads gr;
  REQUIRE_NOTHROW(gr = ops::flash_attention_backward(g.to(kGpu), q, k, v, f.out, f.lse, o, f.range));
  CHECK(relative_error(f.out, values_of(cf.out), "out") <= 1.5 * out_tol(kFloat16));
  CHECK(relative_error(gr.dq, values_of(cg.dq), "dq") <= 1.5 * grad_tol(kFloat16));
  CHECK(relative_error(gr.dk, values_of(cg.dk), "dk") <= 1.5 * grad_tol(kFloat16));
  CHECK(relative_error(gr.dv, values_of(cg.dv), "dv") <= 1.5 * grad_tol(kFloat16));
}

TEST_CASE("flash_attention cuda: contiguous views at an odd storage offset") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  // A contiguous view whose data is not 16-byte aligned (narrow of a flat buffer at element 3)
  // once reached the kernels' 16-byte cp.async loads as it was, because contiguous() returns
  // a contiguous view unchanged: a misaligned-address fault that broke the CUDA context
  // (found by the differential op table). The op must copy such views first.
  const int64_t B = 2, H = 1, T = 7, E = 32, n = B * H * T * E;
  const Tensor flat = random_tensor({4 * n + 3}, {kFloat16}, 1400, Layout::Contiguous, -1.0, 1.0);
  auto at = [&](const Tensor& from, int64_t i) { return from.narrow(0, 3 + i * n, n).view({B, H, T, E}); };
  const ops::FlashAttentionOptions o{};
  const auto cf = ops::flash_attention_forward(at(flat, 0), at(flat, 1), at(flat, 2), o);
  const auto cg =
      ops::flash_attention_backward(at(flat, 3), at(flat, 0), at(flat, 1), at(flat, 2), cf.out, cf.lse, o, cf.range);
  const Tensor gflat = flat.to(kGpu);
  REQUIRE(at(gflat, 1).is_contiguous());
  ops::FlashAttentionForward f;
  REQUIRE_NOTHROW(f = ops::flash_attention_forward(at(gflat, 0), at(gflat, 1), at(gflat, 2), o));
  ops::FlashAttentionGrads gr;
  REQUIRE_NOTHROW(gr = ops::flash_attention_backward(at(gflat, 3), at(gflat, 0), at(gflat, 1), at(gflat, 2), f.out,
                                                     f.lse, o, f.range));
  REQUIRE_NOTHROW(synchronize(kGpu));
  CHECK(relative_error(f.out, values_of(cf.out), "out") <= 1.5 * out_tol(kFloat16));
  CHECK(relative_error(gr.dq, values_of(cg.dq), "dq") <= 1.5 * grad_tol(kFloat16));
  CHECK(relative_error(gr.dk, values_of(cg.dk), "dk") <= 1.5 * grad_tol(kFloat16));
  CHECK(relative_error(gr.dv, values_of(cg.dv), "dv") <= 1.5 * grad_tol(kFloat16));
}

TEST_CASE("flash_attention cuda: scaled_dot_product_attention routes to the fused kernels") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  const AttentionCase c{2, 4, 96, 96, 64};
  const AttentionInputs in = attention_inputs(c, kFloat32, 1100);
  const Tensor mask = key_padding(c.B, c.S);
  const AttentionReference ref = attention_reference(in.q, in.k, in.v, mask, false, 0.125, {}, in.g);
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO(std::string(dtype_name(dt)));
    const Tensor q = in.q.to(kGpu, dt).requires_grad_(), k = in.k.to(kGpu, dt).requires_grad_();
    const Tensor v = in.v.to(kGpu, dt).requires_grad_();
    CHECK(ops::flash_attention_fused(q, k, v, mask.to(kGpu)));
    const Tensor out = scaled_dot_product_attention(q, k, v, mask.to(kGpu));
    CHECK(out.grad_fn_name() == "FlashAttentionBackward");
    CHECK(relative_error(out, ref.out, "sdpa out") <= out_tol(dt));
    const TensorList grads = autograd::grad({sum(mul(out, in.g.to(kGpu, dt)))}, {q, k, v});
    CHECK(relative_error(grads[0], ref.dq, "sdpa dq") <= grad_tol(dt));
    CHECK(relative_error(grads[2], ref.dv, "sdpa dv") <= grad_tol(dt));
  }
  // Under autocast float32 leaves go through the fused kernels in float16; grads come back f32.
  const Tensor q = in.q.to(kGpu).requires_grad_(), k = in.k.to(kGpu).requires_grad_();
  const Tensor v = in.v.to(kGpu).requires_grad_();
  Tensor out;
  {
    AutocastGuard amp(kGpu, kFloat16);
    out = scaled_dot_product_attention(q, k, v, mask.to(kGpu));
  }
  CHECK(out.dtype() == kFloat16);
  CHECK(relative_error(out, ref.out, "autocast out") <= 2 * out_tol(kFloat16));
  const TensorList grads = autograd::grad({sum(mul(out.to(kFloat32), in.g.to(kGpu)))}, {q, k, v});
  CHECK(grads[1].dtype() == kFloat32);
  CHECK(relative_error(grads[1], ref.dk, "autocast dk") <= 2 * grad_tol(kFloat16));
  // float32 on CUDA is not fused: the composed path.
  CHECK_FALSE(ops::flash_attention_fused(q, k, v, Tensor()));
}

TEST_CASE("flash_attention cuda: forward + backward memory stays O(T) at T = 2048") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  const int64_t B = 4, H = 8, T = 2048, E = 64;
  const Tensor q = random_tensor({B, H, T, E}, {kFloat16}, 1, Layout::Contiguous, -1.0, 1.0).to(kGpu).requires_grad_();
  const Tensor k = random_tensor({B, H, T, E}, {kFloat16}, 2, Layout::Contiguous, -1.0, 1.0).to(kGpu).requires_grad_();
  const Tensor v = random_tensor({B, H, T, E}, {kFloat16}, 3, Layout::Contiguous, -1.0, 1.0).to(kGpu).requires_grad_();
  synchronize(kGpu);
  const int64_t before = memory::stats(kGpu).allocated_bytes.current;
  memory::reset_peak(kGpu);
  {
    const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), true, 0.1);
    const TensorList grads = autograd::grad({sum(out)}, {q, k, v});
    synchronize(kGpu);
    CHECK(grads[0].sizes() == q.sizes());
  }
  const int64_t extra = memory::stats(kGpu).allocated_bytes.peak - before;
  const int64_t input_bytes = B * H * T * E * 2;   // one of q, k, v: 8 MiB
  const int64_t scores_bytes = B * H * T * T * 2;  // one (B, H, T, T) f16 tensor: 256 MiB
  MESSAGE("peak extra ", extra, " bytes = ", double(extra) / input_bytes, " x one input; scores would be ",
          scores_bytes);
  CHECK(extra < 12 * input_bytes);  // out, dout, dq, dk, dv, the f32 dq accumulator, row stats
  CHECK(extra < scores_bytes / 2);
}

TEST_CASE("flash_attention cuda: errors") {
  const ops::AttentionBackendGuard own_kernels(ops::AttentionBackend::Flash);  // not cuDNN's
  const Tensor q = zeros({1, 2, 3, 64}, {kFloat16, kGpu});
  check_error([&] { ops::flash_attention_forward(q, q.cpu(), q, {}); }, {"flash_attention_forward", "cuda", "cpu"});
  const Tensor q32 = zeros({1, 2, 3, 64}, {kFloat32, kGpu});
  check_error([&] { ops::flash_attention_forward(q32, q32, q32, {}); }, {"flash_attention_forward", "float32"});
  const Tensor big = zeros({1, 2, 3, 136}, {kFloat16, kGpu});
  check_error([&] { ops::flash_attention_forward(big, big, big, {}); }, {"flash_attention_forward", "E <= 128"});
}
