// cuDNN's fused attention (tensor/cuda/attention_cudnn.cu, Note [cuDNN attention]) against the
// float64 formula (tests/flash_attention_reference.h) on the same float16/bfloat16 inputs:
// forward (out, lse) and backward (dq, dk, dv) at ViT's length (197), L != S (77 over 45 and
// back), E = 128, causal, scale; sequence-major strided inputs and packed qkv (one projection's
// chunks) with the results' layouts (Note [Flash attention layouts]); a dout in another layout
// than out; scaled_dot_product_attention's autograd. Every case first asserts that the call
// really goes to cuDNN (ops::attention_backend_for) and runs with the backend forced to cudnn,
// so a shape cuDNN refuses fails with its reason instead of passing on our kernels; and the
// calls that must stay on frugal's kernels (masks, the Flash setting, the CPU) do. Dropout runs
// on cuDNN's own mask (its RNG node), which the tests read back through the forward itself
// (cudnn_dropout_factors) and check against the formula with it; the mask's statistics; and
// that a mask is drawn again only by whoever drew it, whatever the backend setting.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "tensor/cuda_graph.h"
#include "tensor/factory.h"
#include "tensor/ops/flash_attention.h"
#include "tensor/random.h"
#include "tests/flash_attention_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using ops::AttentionBackend;

namespace {

const Device kGpu = cuda(0);

/// The factors (0 or 1 / (1 - p)) by which cuDNN's own dropout scales the (B, H, L, S) weights
/// of a forward on the range Generator(seed) hands out after `draws_before` such forwards, read
/// back through that forward itself: with q = k = 0 every weight a row keeps is the same 1 / n,
/// and with the one-hot v[s][e] = (s == j E + e), out[l][e] is weight (l, j E + e), nonzero
/// exactly where it was kept (one forward per block j of E keys). q, k, v take `gpu_view`, as the
/// call the factors are for does, so that both run the same plan. Call it with the backend on cudnn.
template <typename View>
std::vector<double> cudnn_dropout_factors(const AttentionCase& c, DType dt, bool causal, double p, uint64_t seed,
                                          View gpu_view, int draws_before = 0, const Tensor& mask = Tensor()) {
  const ops::FlashAttentionOptions o{mask, causal, {}, p};
  const Tensor q = gpu_view(zeros({c.B, c.H, c.L, c.E}, {dt})), k = gpu_view(zeros({c.B, c.H, c.S, c.E}, {dt}));
  std::vector<double> factors(size_t(c.B * c.H * c.L * c.S), 0.0);
  for (int64_t j = 0; j * c.E < c.S; ++j) {
    std::vector<double> one_hot(size_t(c.B * c.H * c.S * c.E), 0.0);
    for (int64_t bh = 0; bh < c.B * c.H; ++bh)
      for (int64_t e = 0; e < c.E && j * c.E + e < c.S; ++e) one_hot[size_t((bh * c.S + j * c.E + e) * c.E + e)] = 1.0;
    const Tensor v = gpu_view(make_tensor(one_hot, {c.B, c.H, c.S, c.E}, {dt}));
    Generator gen(seed);
    for (int i = 0; i < draws_before; ++i) ops::flash_attention_forward(q, k, v, o, &gen);
    const ops::FlashAttentionForward f = ops::flash_attention_forward(q, k, v, o, &gen);
    REQUIRE(f.range.drawn_by == Generator::kCudnnRng);
    const std::vector<double> out = values_of(f.out);
    for (int64_t bhl = 0; bhl < c.B * c.H * c.L; ++bhl)
      for (int64_t e = 0; e < c.E && j * c.E + e < c.S; ++e)
        factors[size_t(bhl * c.S + j * c.E + e)] = out[size_t(bhl * c.E + e)] != 0.0 ? 1.0 / (1.0 - p) : 0.0;
  }
  return factors;
}

/// Runs the raw ops on `in` (moved to the GPU, `gpu_view` applied) and `mask` (a CPU tensor or
/// undefined, moved to the GPU) with the backend forced to cudnn, after asserting that the call
/// goes there, and checks all five results against the float64 reference.
template <typename View>
void check_cudnn(const AttentionCase& c, const AttentionInputs& in, bool causal, std::optional<double> scale,
                 View gpu_view, double p = 0.0, const Tensor& mask = Tensor()) {
  const DType dt = in.q.dtype();
  INFO("B=", c.B, " H=", c.H, " L=", c.L, " S=", c.S, " E=", c.E, " ", std::string(dtype_name(dt)), " causal=", causal,
       " scale=", scale ? *scale : -1.0, " p=", p, " mask=", mask.defined() ? mask.describe() : "none");
  const Tensor q = gpu_view(in.q), k = gpu_view(in.k), v = gpu_view(in.v), g = gpu_view(in.g);
  const Tensor gpu_mask = mask.defined() ? mask.to(kGpu) : Tensor();
  const ops::FlashAttentionOptions o{gpu_mask, causal, scale, p};
  const ops::AttentionBackendGuard cudnn(AttentionBackend::Cudnn);
  REQUIRE(ops::attention_backend_for(q, k, v, o) == AttentionBackend::Cudnn);
  Generator gen(4321);
  const ops::FlashAttentionForward f = ops::flash_attention_forward(q, k, v, o, &gen);
  const ops::FlashAttentionGrads gr = ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
  const std::vector<double> factors =
      p > 0.0 ? cudnn_dropout_factors(c, dt, causal, p, 4321, gpu_view, 0, gpu_mask) : std::vector<double>{};
  const AttentionReference ref =
      attention_reference(in.q, in.k, in.v, mask, causal, scale ? *scale : 1.0 / std::sqrt(double(c.E)), factors, in.g);
  CHECK(f.out.dtype() == dt);
  CHECK(f.lse.dtype() == kFloat32);
  CHECK(f.range.seed == (p > 0.0 ? 4321u : 0u));
  CHECK(f.range.drawn_by == (p > 0.0 ? Generator::kCudnnRng : 0));
  CHECK(relative_error(f.out, ref.out, "out") <= out_tol(dt));
  CHECK(relative_error(f.lse, ref.lse, "lse") <= 1e-4);
  CHECK(relative_error(gr.dq, ref.dq, "dq") <= grad_tol(dt));
  CHECK(relative_error(gr.dk, ref.dk, "dk") <= grad_tol(dt));
  CHECK(relative_error(gr.dv, ref.dv, "dv") <= grad_tol(dt));
}

void check_cudnn(const AttentionCase& c, const AttentionInputs& in, bool causal, std::optional<double> scale = {},
                 double p = 0.0, const Tensor& mask = Tensor()) {
  check_cudnn(
      c, in, causal, scale, [](const Tensor& t) { return t.to(kGpu); }, p, mask);
}

/// A (B, 1, 1, S) bool key padding mask: batch b keeps S - b S / (B - 1) keys, so the first
/// keeps all and the last none (its rows have no key); the first ones, or with `left` the last
/// ones (then a causal row before the first kept key keeps none either).
Tensor padding_mask(int64_t B, int64_t S, bool left = false) {
  std::vector<double> keep(size_t(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t kept = S - b * S / (B - 1);
      keep[size_t(b * S + s)] = (left ? s >= S - kept : s < kept) ? 1.0 : 0.0;
    }
  return make_tensor(keep, {B, 1, 1, S}, {kBool});
}

}  // namespace

TEST_CASE("attention cudnn: ViT's length, L != S, E = 128, causal, scale vs the float64 formula") {
  uint64_t seed = 1;
  for (DType dt : {kFloat16, kBFloat16})
    for (const AttentionCase& c :
         {AttentionCase{2, 3, 197, 197, 64}, AttentionCase{2, 3, 77, 45, 64}, AttentionCase{2, 3, 45, 77, 64},
          AttentionCase{2, 3, 128, 128, 128}, AttentionCase{1, 2, 200, 77, 128}, AttentionCase{2, 2, 96, 130, 32}}) {
      const AttentionInputs in = attention_inputs(c, dt, seed);
      seed += 4;
      check_cudnn(c, in, false);
      check_cudnn(c, in, true);
    }
  const AttentionCase c{2, 3, 64, 90, 64};
  check_cudnn(c, attention_inputs(c, kFloat16, 100), false, 0.3);
  check_cudnn(c, attention_inputs(c, kBFloat16, 104), true, 0.05);
}

TEST_CASE("attention cudnn: strided (B, L, H, E) inputs") {
  const AttentionCase c{2, 3, 197, 197, 64};
  for (DType dt : {kFloat16, kBFloat16}) {
    const AttentionInputs in = attention_inputs(c, dt, 200);
    // The same values stored as (B, L, H, E) on the GPU and viewed as (B, H, L, E).
    check_cudnn(c, in, false, {},
                [](const Tensor& t) { return t.transpose(1, 2).contiguous().to(kGpu).transpose(1, 2); });
  }
}

TEST_CASE("attention cudnn: packed q, k, v of one projection, and result layouts") {
  // Note [Flash attention layouts]: q, k, v as chunk(x, 3, -1) + split heads of one (B, T, 3 H E)
  // projection, dout as out_proj's backward hands it over; the gradients must come back as
  // views of one (B, T, 3, H, E) buffer with q, k, v's strides.
  const int64_t B = 2, H = 3, T = 197;
  uint64_t seed = 300;
  for (DType dt : {kFloat16, kBFloat16})
    for (int64_t E : {64, 128})
      for (bool causal : {false, true}) {
        INFO(std::string(dtype_name(dt)), " E=", E, " causal=", causal);
        const int64_t D = H * E;
        const Tensor x = random_tensor({B, T, 3 * D}, {dt}, seed++, Layout::Contiguous, -1.0, 1.0);
        const Tensor g = random_tensor({B, T, H, E}, {dt}, seed++, Layout::Contiguous, -1.0, 1.0).transpose(1, 2);
        auto heads = [&](const Tensor& from, int64_t i) {
          return from.narrow(2, i * D, D).unflatten(-1, {H, E}).transpose(1, 2);
        };
        const AttentionReference ref = attention_reference(heads(x, 0), heads(x, 1), heads(x, 2), Tensor(), causal,
                                                           1.0 / std::sqrt(double(E)), {}, g);
        const Tensor gx = x.to(kGpu), gg = g.transpose(1, 2).to(kGpu).transpose(1, 2);
        const Tensor q = heads(gx, 0), k = heads(gx, 1), v = heads(gx, 2);
        const ops::FlashAttentionOptions o{Tensor(), causal, {}, 0.0};
        const ops::AttentionBackendGuard cudnn(AttentionBackend::Cudnn);
        REQUIRE(ops::attention_backend_for(q, k, v, o) == AttentionBackend::Cudnn);
        const auto f = ops::flash_attention_forward(q, k, v, o);
        const auto gr = ops::flash_attention_backward(gg, q, k, v, f.out, f.lse, o, f.range);
        CHECK(f.out.strides() == Shape({T * H * E, E, H * E, 1}));
        CHECK(gr.dq.strides() == q.strides());
        CHECK(gr.dk.strides() == k.strides());
        CHECK(gr.dv.strides() == v.strides());
        CHECK((gr.dq.shares_storage(gr.dk) && gr.dq.shares_storage(gr.dv)));
        CHECK(gr.dk.storage_offset() - gr.dq.storage_offset() == D);
        CHECK(gr.dv.storage_offset() - gr.dk.storage_offset() == D);
        CHECK(relative_error(f.out, ref.out, "out") <= out_tol(dt));
        CHECK(relative_error(f.lse, ref.lse, "lse") <= 1e-4);
        CHECK(relative_error(gr.dq, ref.dq, "dq") <= grad_tol(dt));
        CHECK(relative_error(gr.dk, ref.dk, "dk") <= grad_tol(dt));
        CHECK(relative_error(gr.dv, ref.dv, "dv") <= grad_tol(dt));
      }
}

TEST_CASE("attention cudnn: a dout in another layout than out, and agreement with frugal's kernels") {
  // out is sequence-major (q is), dout contiguous: the backward's own plan (or, without one, our
  // backward on cuDNN's out and lse) must give the same gradients.
  const AttentionCase c{2, 4, 77, 77, 64};
  const AttentionInputs in = attention_inputs(c, kFloat16, 400);
  auto seq_major = [](const Tensor& t) { return t.transpose(1, 2).contiguous().to(kGpu).transpose(1, 2); };
  const Tensor q = seq_major(in.q), k = seq_major(in.k), v = seq_major(in.v), g = in.g.to(kGpu);
  const ops::FlashAttentionOptions o{Tensor(), true, {}, 0.0};
  const AttentionReference ref =
      attention_reference(in.q, in.k, in.v, Tensor(), true, 1.0 / std::sqrt(double(c.E)), {}, in.g);
  ops::FlashAttentionForward f;
  ops::FlashAttentionGrads gr;
  {
    const ops::AttentionBackendGuard cudnn(AttentionBackend::Cudnn);
    REQUIRE(ops::attention_backend_for(q, k, v, o) == AttentionBackend::Cudnn);
    f = ops::flash_attention_forward(q, k, v, o);
    gr = ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
  }
  CHECK(relative_error(gr.dq, ref.dq, "dq") <= grad_tol(kFloat16));
  CHECK(relative_error(gr.dk, ref.dk, "dk") <= grad_tol(kFloat16));
  CHECK(relative_error(gr.dv, ref.dv, "dv") <= grad_tol(kFloat16));
  // Our kernels on the same inputs: the same out and lse (either backend's forward feeds either
  // backward, Note [cuDNN attention]), and our backward on cuDNN's out and lse.
  const ops::AttentionBackendGuard flash(AttentionBackend::Flash);
  CHECK(ops::attention_backend_for(q, k, v, o) == AttentionBackend::Flash);
  const ops::FlashAttentionForward own = ops::flash_attention_forward(q, k, v, o);
  CHECK(relative_error(f.out, values_of(own.out), "out vs own") <= 2 * out_tol(kFloat16));
  CHECK(relative_error(f.lse, values_of(own.lse), "lse vs own") <= 1e-4);
  const ops::FlashAttentionGrads mixed = ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
  CHECK(relative_error(mixed.dq, ref.dq, "own dq from cuDNN's forward") <= grad_tol(kFloat16));
  CHECK(relative_error(mixed.dv, ref.dv, "own dv from cuDNN's forward") <= grad_tol(kFloat16));
}

TEST_CASE("attention cudnn: scaled_dot_product_attention's autograd takes the cuDNN path") {
  const AttentionCase c{2, 3, 197, 197, 64};
  const AttentionInputs in = attention_inputs(c, kFloat32, 500);
  const AttentionReference ref =
      attention_reference(in.q, in.k, in.v, Tensor(), false, 1.0 / std::sqrt(64.0), {}, in.g);
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO(std::string(dtype_name(dt)));
    const Tensor q = in.q.to(kGpu, dt).requires_grad_(), k = in.k.to(kGpu, dt).requires_grad_();
    const Tensor v = in.v.to(kGpu, dt).requires_grad_();
    const ops::AttentionBackendGuard cudnn(AttentionBackend::Cudnn);
    REQUIRE(ops::attention_backend_for(q, k, v, {}) == AttentionBackend::Cudnn);
    const Tensor out = scaled_dot_product_attention(q, k, v, Tensor());
    CHECK(out.grad_fn_name() == "FlashAttentionBackward");
    CHECK(relative_error(out, ref.out, "sdpa out") <= out_tol(dt));
    const TensorList grads = autograd::grad({sum(mul(out, in.g.to(kGpu, dt)))}, {q, k, v});
    CHECK(relative_error(grads[0], ref.dq, "sdpa dq") <= grad_tol(dt));
    CHECK(relative_error(grads[1], ref.dk, "sdpa dk") <= grad_tol(dt));
    CHECK(relative_error(grads[2], ref.dv, "sdpa dv") <= grad_tol(dt));
  }
}

TEST_CASE("attention cudnn: dropout on cuDNN's own mask, read back, gives the formula's out and gradients") {
  uint64_t seed = 600;
  for (DType dt : {kFloat16, kBFloat16})
    for (const AttentionCase& c : {AttentionCase{2, 3, 197, 197, 64}, AttentionCase{2, 3, 77, 45, 64},
                                   AttentionCase{2, 4, 128, 128, 64}, AttentionCase{1, 2, 130, 96, 128}}) {
      const AttentionInputs in = attention_inputs(c, dt, seed);
      seed += 4;
      check_cudnn(c, in, false, {}, 0.1);
      check_cudnn(c, in, true, {}, 0.3);
    }
  // Sequence-major inputs, as a projection's heads arrive.
  const AttentionCase c{2, 3, 197, 197, 64};
  check_cudnn(
      c, attention_inputs(c, kFloat16, 700), false, {},
      [](const Tensor& t) { return t.transpose(1, 2).contiguous().to(kGpu).transpose(1, 2); }, 0.2);
}

TEST_CASE("attention cudnn: cuDNN's mask keeps 1 - p, is new at each call and the same from the same range") {
  const ops::AttentionBackendGuard cudnn(AttentionBackend::Cudnn);
  const AttentionCase c{4, 8, 256, 128, 128};  // 1M weights
  auto to_gpu = [](const Tensor& t) { return t.to(kGpu); };
  auto kept_fraction = [](const std::vector<double>& f) {
    double kept = 0.0;
    for (double x : f) kept += x != 0.0;
    return kept / double(f.size());
  };
  auto differing_fraction = [](const std::vector<double>& a, const std::vector<double>& b) {
    double differ = 0.0;
    for (size_t i = 0; i < a.size(); ++i) differ += (a[i] != 0.0) != (b[i] != 0.0);
    return differ / double(a.size());
  };
  for (double p : {0.1, 0.5}) {
    INFO("p=", p);
    const double n = double(c.B * c.H * c.L * c.S), sigma = std::sqrt(p * (1.0 - p) / n);
    const std::vector<double> first = cudnn_dropout_factors(c, kFloat16, false, p, 11, to_gpu);
    CHECK(std::abs(kept_fraction(first) - (1.0 - p)) <= 6.0 * sigma);
    // The same range draws the same mask (what a backward and a checkpoint's recompute rely on).
    CHECK(differing_fraction(first, cudnn_dropout_factors(c, kFloat16, false, p, 11, to_gpu)) == 0.0);
    // The generator's next range (the next layer's call) and another seed draw independent
    // masks: they differ in 2 p (1 - p) of the weights.
    const double independent = 2.0 * p * (1.0 - p), tol = 6.0 * std::sqrt(independent * (1.0 - independent) / n);
    CHECK(std::abs(differing_fraction(first, cudnn_dropout_factors(c, kFloat16, false, p, 11, to_gpu, 1)) -
                   independent) <= tol);
    CHECK(std::abs(differing_fraction(first, cudnn_dropout_factors(c, kFloat16, false, p, 12, to_gpu)) - independent) <=
          tol);
  }
}

TEST_CASE("attention cudnn: a dropout mask is drawn again only by whoever drew it, whatever the backend setting") {
  // cuDNN's forward with the setting on flash for the backward (and a dout in another layout
  // than out) still runs cuDNN's backward on its mask; our forward's backward with the setting
  // on cudnn still runs ours on dropout()'s mask. Either way the formula's gradients.
  const AttentionCase c{2, 4, 77, 77, 64};
  const AttentionInputs in = attention_inputs(c, kFloat16, 800);
  auto to_gpu = [](const Tensor& t) { return t.to(kGpu); };
  const Tensor q = in.q.to(kGpu), k = in.k.to(kGpu), v = in.v.to(kGpu);
  const Tensor g_other_layout = in.g.transpose(1, 2).contiguous().to(kGpu).transpose(1, 2);
  const ops::FlashAttentionOptions o{Tensor(), false, {}, 0.25};
  for (bool cudnn_first : {true, false}) {
    INFO("forward on ", cudnn_first ? "cuDNN" : "flash");
    const AttentionBackend first = cudnn_first ? AttentionBackend::Cudnn : AttentionBackend::Flash;
    const AttentionBackend second = cudnn_first ? AttentionBackend::Flash : AttentionBackend::Cudnn;
    Generator gen(99);
    ops::FlashAttentionForward f;
    std::vector<double> factors;
    {
      const ops::AttentionBackendGuard guard(first);
      REQUIRE(ops::attention_backend_for(q, k, v, o) == first);
      f = ops::flash_attention_forward(q, k, v, o, &gen);
      if (cudnn_first) factors = cudnn_dropout_factors(c, kFloat16, false, 0.25, 99, to_gpu);
    }
    CHECK(f.range.drawn_by == (cudnn_first ? Generator::kCudnnRng : 0));
    if (!cudnn_first) factors = dropout_factors({c.B, c.H, c.L, c.S}, 0.25, f.range);
    const ops::AttentionBackendGuard guard(second);
    const ops::FlashAttentionGrads gr =
        ops::flash_attention_backward(cudnn_first ? g_other_layout : in.g.to(kGpu), q, k, v, f.out, f.lse, o, f.range);
    const AttentionReference ref =
        attention_reference(in.q, in.k, in.v, Tensor(), false, 1.0 / std::sqrt(64.0), factors, in.g);
    CHECK(relative_error(f.out, ref.out, "out") <= out_tol(kFloat16));
    CHECK(relative_error(gr.dq, ref.dq, "dq") <= grad_tol(kFloat16));
    CHECK(relative_error(gr.dk, ref.dk, "dk") <= grad_tol(kFloat16));
    CHECK(relative_error(gr.dv, ref.dv, "dv") <= grad_tol(kFloat16));
  }
}

TEST_CASE("attention cudnn: dropout in a CUDA graph: replay k draws eager call k's mask") {
  // The RNG node reads its seed and offset from device words written at each replay from the
  // graph's base (Note [Graph-safe random numbers]): a replay must not repeat the captured mask.
  const ops::AttentionBackendGuard cudnn(AttentionBackend::Cudnn);
  const AttentionCase c{2, 3, 128, 128, 64};
  const AttentionInputs in = attention_inputs(c, kFloat16, 900);
  const Tensor q = in.q.to(kGpu), k = in.k.to(kGpu), v = in.v.to(kGpu), g = in.g.to(kGpu);
  const ops::FlashAttentionOptions o{Tensor(), false, {}, 0.2};
  auto call = [&] {
    const ops::FlashAttentionForward f = ops::flash_attention_forward(q, k, v, o);
    const ops::FlashAttentionGrads gr = ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
    return std::vector<Tensor>{f.out, gr.dq, gr.dk, gr.dv};
  };
  const int replays = 3, warmup = 2;
  manual_seed(3);
  std::vector<std::vector<Tensor>> eager;  // the capture's warm-up calls, then one per replay
  for (int i = 0; i < warmup + replays; ++i) eager.push_back(call());
  manual_seed(3);
  std::vector<Tensor> captured;
  CudaGraph graph;
  graph.capture([&] { captured = call(); }, {.warmup = warmup});
  std::vector<double> previous_out;
  for (int i = 0; i < replays; ++i) {
    CAPTURE(i);
    graph.replay();
    const std::vector<Tensor>& want = eager[size_t(warmup + i)];
    const std::vector<double> out = values_of(captured[0]);
    CHECK(out == values_of(want[0]));  // the forward is deterministic: bit for bit
    // dq accumulates across key blocks in cuDNN's own order; another mask would be off by O(1).
    CHECK(relative_error(captured[1], values_of(want[1]), "dq") <= 1e-3);
    CHECK(relative_error(captured[2], values_of(want[2]), "dk") <= 1e-3);
    CHECK(relative_error(captured[3], values_of(want[3]), "dv") <= 1e-3);
    CHECK(out != previous_out);
    previous_out = out;
  }
}

TEST_CASE("attention cudnn: bool and additive masks as cuDNN's bias, rows without keys, vs the float64 formula") {
  uint64_t seed = 500;
  for (DType dt : {kFloat16, kBFloat16})
    for (const AttentionCase& c :
         {AttentionCase{3, 2, 197, 197, 64}, AttentionCase{3, 2, 128, 128, 64}, AttentionCase{3, 2, 77, 45, 64}}) {
      const AttentionInputs in = attention_inputs(c, dt, seed);
      seed += 4;
      const Tensor padding = padding_mask(c.B, c.S);
      check_cudnn(c, in, false, {}, 0.0, padding);
      check_cudnn(c, in, true, {}, 0.0, padding);
      // Left padding under is_causal: the causal rows before a batch's first key keep none.
      check_cudnn(c, in, true, {}, 0.0, padding_mask(c.B, c.S, true));
      check_cudnn(c, in, false, {}, 0.1, padding);
      // Additive, (1, H, L, S), in q's dtype: values in [-2, 2], a quarter -inf, query row 3 all -inf.
      std::vector<double> add =
          values_of(random_tensor({1, c.H, c.L, c.S}, {kFloat64}, seed, Layout::Contiguous, -2, 2));
      for (size_t i = 0; i < add.size(); ++i)
        if (i % 4 == 1 || (int64_t(i) / c.S) % c.L == 3) add[i] = -INFINITY;
      check_cudnn(c, in, false, {}, 0.0, make_tensor(add, {1, c.H, c.L, c.S}, {dt}));
      // A (L, S) bool mask keeping about 2 keys in 3, broadcast over batches and heads.
      std::vector<double> keep = random_values(c.L * c.S, seed + 1, 0.0, 3.0);
      for (double& x : keep) x = x < 2.0 ? 1.0 : 0.0;
      check_cudnn(c, in, false, 0.2, 0.0, make_tensor(keep, {c.L, c.S}, {kBool}));
    }
  // A packed projection's views with a padding mask, as MultiheadAttention and BERT call it.
  const AttentionCase c{4, 3, 128, 128, 64};
  const AttentionInputs in = attention_inputs(c, kFloat16, 900);
  check_cudnn(
      c, in, false, {}, [](const Tensor& t) { return t.transpose(1, 2).contiguous().to(kGpu).transpose(1, 2); }, 0.0,
      padding_mask(c.B, c.S));
}

TEST_CASE(
    "attention cudnn: masks taken as they are or copied (1-D, expanded, transposed) give frugal's kernels' results") {
  const int64_t B = 2, H = 3, T = 197, E = 64;
  const AttentionInputs in = attention_inputs({B, H, T, T, E}, kFloat16, 700);
  const Tensor q = in.q.to(kGpu), k = in.k.to(kGpu), v = in.v.to(kGpu), g = in.g.to(kGpu);
  std::vector<double> keys = random_values(T, 701, -2.0, 2.0), full = random_values(B * T * H * T, 702, -2.0, 2.0);
  for (size_t i = 0; i < keys.size(); i += 5) keys[i] = -INFINITY;
  for (size_t i = 0; i < full.size(); i += 3) full[i] = -INFINITY;
  const Tensor per_key = make_tensor(keys, {T}, {kFloat16, kGpu});                                 // 1-D: used as it is
  const Tensor expanded = make_tensor(keys, {1, 1, 1, T}, {kFloat16, kGpu}).expand({B, H, T, T});  // stride 0: copied
  const Tensor transposed = make_tensor(full, {B, T, H, T}, {kFloat16, kGpu}).transpose(1, 2);     // copied
  const Tensor left_padding = padding_mask(B, T, true).to(kGpu);
  for (const auto& [name, mask, causal] :
       {std::tuple{"1-D", per_key, false}, std::tuple{"expanded", expanded, false},
        std::tuple{"transposed", transposed, true}, std::tuple{"left padding, causal", left_padding, true}}) {
    INFO(name);
    const ops::FlashAttentionOptions o{mask, causal, {}, 0.0};
    std::vector<std::vector<double>> want;
    {
      const ops::AttentionBackendGuard flash(AttentionBackend::Flash);
      const ops::FlashAttentionForward f = ops::flash_attention_forward(q, k, v, o);
      const ops::FlashAttentionGrads gr = ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
      for (const Tensor& t : {f.out, f.lse, gr.dq, gr.dk, gr.dv}) want.push_back(values_of(t));
    }
    const ops::AttentionBackendGuard cudnn(AttentionBackend::Cudnn);
    REQUIRE(ops::attention_backend_for(q, k, v, o) == AttentionBackend::Cudnn);
    const ops::FlashAttentionForward f = ops::flash_attention_forward(q, k, v, o);
    const ops::FlashAttentionGrads gr = ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
    CHECK(relative_error(f.out, want[0], "out") <= 2 * out_tol(kFloat16));
    CHECK(relative_error(f.lse, want[1], "lse") <= 1e-4);
    CHECK(relative_error(gr.dq, want[2], "dq") <= 2 * grad_tol(kFloat16));
    CHECK(relative_error(gr.dk, want[3], "dk") <= 2 * grad_tol(kFloat16));
    CHECK(relative_error(gr.dv, want[4], "dv") <= 2 * grad_tol(kFloat16));
  }
}

TEST_CASE("attention cudnn: key-broadcast masks, the flash setting and the CPU stay on frugal's kernels") {
  const int64_t B = 2, H = 3, T = 197, E = 64;
  const Tensor q = randn({B, H, T, E}, {kFloat16, kGpu}), k = randn({B, H, T, E}, {kFloat16, kGpu});
  const Tensor v = randn({B, H, T, E}, {kFloat16, kGpu});
  const Tensor bool_mask = ones({B, 1, 1, T}, {kBool, kGpu}), float_mask = zeros({B, 1, T, T}, {kFloat16, kGpu});
  const Tensor per_query = ones({B, 1, T, 1}, {kBool, kGpu});  // broadcast over keys: cuDNN takes no such bias
  for (AttentionBackend setting : {AttentionBackend::Auto, AttentionBackend::Cudnn}) {
    INFO(ops::attention_backend_name(setting));
    const ops::AttentionBackendGuard guard(setting);
    CHECK(ops::attention_backend_for(q, k, v, {}) == AttentionBackend::Cudnn);
    CHECK(ops::attention_backend_for(q, k, v, {Tensor(), true, {}, 0.0}) == AttentionBackend::Cudnn);
    CHECK(ops::attention_backend_for(q, k, v, {Tensor(), false, {}, 0.1}) == AttentionBackend::Cudnn);
    CHECK(ops::attention_backend_for(q, k, v, {bool_mask, false, {}, 0.0}) == AttentionBackend::Cudnn);
    CHECK(ops::attention_backend_for(q, k, v, {float_mask, true, {}, 0.1}) == AttentionBackend::Cudnn);
    CHECK(ops::attention_backend_for(q.cpu(), k.cpu(), v.cpu(), {}) == AttentionBackend::Flash);
  }
  CHECK(ops::attention_backend_for(q, k, v, {per_query, false, {}, 0.0}) == AttentionBackend::Flash);
  {
    const ops::AttentionBackendGuard cudnn(AttentionBackend::Cudnn);
    CHECK_THROWS_WITH(ops::flash_attention_forward(q, k, v, {per_query, false, {}, 0.0}),
                      doctest::Contains("broadcasts over the keys"));
  }
  const ops::AttentionBackendGuard flash(AttentionBackend::Flash);
  CHECK(ops::attention_backend() == AttentionBackend::Flash);
  CHECK(ops::attention_backend_for(q, k, v, {}) == AttentionBackend::Flash);
  CHECK(ops::attention_backend_for(q, k, v, {bool_mask, false, {}, 0.0}) == AttentionBackend::Flash);
}
