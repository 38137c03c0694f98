// nn::MultiheadAttention on CUDA against the same module on the CPU: the same
// parameters and inputs, forward (output and returned weights) and backward (every input,
// parameter and float-mask gradient) in float32, float16 and bfloat16 (the 16-bit types
// compute in float on both sides), over the fused self-attention path, cross-attention,
// kdim/vdim projections, masks, causal, sequence-first layout and dropout (the same
// Philox mask on both devices for the same seed); plus a mismatched-device error. And
// scaled_dot_product_attention (autograd/ops/attention.h), forward and backward, likewise.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "autograd/ops/attention.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "nn/attention.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kTypes[] = {kFloat32, kFloat16, kBFloat16};

/// The CPU and CUDA modules share their (random, f32-drawn) parameters, both then in dt.
struct ModulePair {
  std::shared_ptr<nn::MultiheadAttention> cpu, gpu;
};
ModulePair make_modules(int64_t E, int64_t H, DType dt, nn::MultiheadAttentionOptions o, uint64_t seed) {
  manual_seed(seed);
  ModulePair m{std::make_shared<nn::MultiheadAttention>(E, H, o), std::make_shared<nn::MultiheadAttention>(E, H, o)};
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : m.cpu->state_dict())
    state[name] = random_tensor(t.sizes(), TensorOptions(kFloat32), seed++, Layout::Contiguous, -0.6, 0.6);
  m.cpu->load_state_dict(state);
  m.gpu->load_state_dict(state);
  m.cpu->to(dt);
  m.gpu->to(kGpu, dt);
  return m;
}

/// A leaf on each device with the same values.
struct Leaf {
  Tensor cpu, gpu;
};
Leaf leaf(const Shape& s, DType dt, uint64_t seed, bool grad = true) {
  Leaf l{random_tensor(s, TensorOptions(dt), seed), random_tensor(s, {dt, kGpu}, seed)};
  if (grad) l.cpu.requires_grad_(), l.gpu.requires_grad_();
  return l;
}
Leaf mask_of(const Tensor& cpu) { return {cpu, cpu.to(kGpu)}; }

/// Relative to the largest |expected|: sums of many rounded products differ by a few
/// roundings of the stored type between the two devices.
double module_tol(DType dt) { return dt == kFloat32 ? 5e-5 : dt == kFloat16 ? 8e-3 : 4e-2; }

void check_same(const Tensor& gpu, const Tensor& cpu, DType dt, const std::string& what) {
  REQUIRE_MESSAGE(gpu.defined() == cpu.defined(), what);
  if (!cpu.defined()) return;
  CHECK_MESSAGE(gpu.device() == kGpu, what);
  CHECK_MESSAGE(gpu.dtype() == cpu.dtype(), what);
  REQUIRE_MESSAGE(gpu.sizes() == cpu.sizes(), what, ": ", shape_str(gpu.sizes()), " vs ", shape_str(cpu.sizes()));
  const std::vector<double> expect = values_of(cpu);
  double scale = 1.0;
  for (double e : expect) scale = std::max(scale, std::fabs(e));
  check_close(gpu, expect, module_tol(dt), module_tol(dt) * scale, what);
}

struct Inputs {
  Leaf q, k, v;
  bool self = false;  // pass q as key and value (the fused path)
  bool kv_same = false;
};

/// Forward and backward on both devices; compares output, weights and every gradient.
void run_and_compare(ModulePair& m, Inputs& in, const nn::AttentionForwardOptions& o_cpu,
                     const nn::AttentionForwardOptions& o_gpu, DType dt, const std::string& what,
                     uint64_t dropout_seed = 0) {
  auto run = [&](nn::MultiheadAttention& mod, const Tensor& q, const Tensor& k, const Tensor& v,
                 const nn::AttentionForwardOptions& o) {
    mod.zero_grad();
    if (dropout_seed) manual_seed(dropout_seed);
    const Tensor& key = in.self ? q : k;
    const Tensor& value = in.self ? q : in.kv_same ? key : v;
    nn::AttentionOutput r = mod.forward(q, key, value, o);
    // A fixed random cotangent on the output (and on the weights, when returned).
    Tensor loss = sum(mul(r.output, random_tensor(r.output.sizes(), {dt, r.output.device()}, 501)));
    if (r.weights.defined())
      loss = add(loss, sum(mul(r.weights, random_tensor(r.weights.sizes(), {dt, r.weights.device()}, 502))));
    loss.backward();
    return r;
  };
  for (Leaf* l : {&in.q, &in.k, &in.v})
    if (l->cpu.defined()) l->cpu.set_grad(Tensor()), l->gpu.set_grad(Tensor());
  const nn::AttentionOutput rc = run(*m.cpu, in.q.cpu, in.k.cpu, in.v.cpu, o_cpu);
  const nn::AttentionOutput rg = run(*m.gpu, in.q.gpu, in.k.gpu, in.v.gpu, o_gpu);
  const std::string name = what + " " + dtype_name(dt);
  check_same(rg.output, rc.output, dt, name + " output");
  check_same(rg.weights, rc.weights, dt, name + " weights");
  check_same(in.q.gpu.grad(), in.q.cpu.grad(), dt, name + " grad query");
  if (!in.self) check_same(in.k.gpu.grad(), in.k.cpu.grad(), dt, name + " grad key");
  if (!in.self && !in.kv_same) check_same(in.v.gpu.grad(), in.v.cpu.grad(), dt, name + " grad value");
  const auto pc = m.cpu->named_parameters(), pg = m.gpu->named_parameters();
  REQUIRE(pc.size() == pg.size());
  for (size_t i = 0; i < pc.size(); ++i)
    check_same(pg[i].second.grad(), pc[i].second.grad(), dt, name + " grad " + pc[i].first);
  if (o_cpu.attn_mask.defined() && o_cpu.attn_mask.requires_grad())
    check_same(o_gpu.attn_mask.grad(), o_cpu.attn_mask.grad(), dt, name + " grad attn_mask");
}

Tensor bool_mask(const Shape& s, uint64_t seed, double p_masked = 0.3) {
  std::vector<double> v = random_values(numel_of(s), seed, 0.0, 1.0);
  for (double& x : v) x = x < p_masked ? 1.0 : 0.0;
  return make_tensor(v, s, TensorOptions(kBool));
}

}  // namespace

TEST_CASE("cuda attention: self-attention (fused path) with padding and causal matches the CPU") {
  const int64_t B = 2, L = 7, E = 16, H = 4;
  for (DType dt : kTypes) {
    ModulePair m = make_modules(E, H, dt, {}, 1);
    Inputs in{leaf({B, L, E}, dt, 11), {}, {}, /*self=*/true};
    run_and_compare(m, in, {}, {}, dt, "self");
    const Leaf pad = mask_of(bool_mask({B, L}, 12));
    for (bool need : {false, true})
      for (bool causal : {false, true}) {
        const std::string what = std::string("self padding") + (causal ? " causal" : "") + (need ? " weights" : "");
        run_and_compare(m, in, {.key_padding_mask = pad.cpu, .need_weights = need, .is_causal = causal},
                        {.key_padding_mask = pad.gpu, .need_weights = need, .is_causal = causal}, dt, what);
      }
    run_and_compare(m, in, {.need_weights = true, .average_attn_weights = false, .is_causal = true},
                    {.need_weights = true, .average_attn_weights = false, .is_causal = true}, dt,
                    "self causal weights per head");
  }
}

TEST_CASE("cuda attention: a batch whose every key is padded gives out_proj's bias and zero gradients on both") {
  // The CPU's rule (Note [Masked softmax]): a row without keys has zero weights. The fused
  // 16-bit path must agree, and the other batch must not see NaN.
  const int64_t B = 2, L = 5, E = 16, H = 2;
  for (DType dt : kTypes) {
    ModulePair m = make_modules(E, H, dt, {}, 3);
    Inputs in{leaf({B, L, E}, dt, 13), {}, {}, /*self=*/true};
    std::vector<double> pad(B * L, 0.0);
    for (int64_t s = 0; s < L; ++s) pad[s] = 1.0;  // batch 0: all padding
    pad[L + 3] = 1.0;                              // batch 1: one padded key
    const Leaf mask = mask_of(make_tensor(pad, {B, L}, TensorOptions(kBool)));
    for (bool causal : {false, true})
      run_and_compare(m, in, {.key_padding_mask = mask.cpu, .is_causal = causal},
                      {.key_padding_mask = mask.gpu, .is_causal = causal}, dt,
                      std::string("fully padded batch") + (causal ? " causal" : ""));
    const nn::AttentionOutput r = m.gpu->forward(in.q.gpu, in.q.gpu, in.q.gpu, {.key_padding_mask = mask.gpu});
    const std::vector<double> out = values_of(r.output), bias = values_of(m.gpu->out_proj->bias);
    for (int64_t t = 0; t < L; ++t)
      for (int64_t e = 0; e < E; ++e) CHECK(out[size_t(t * E + e)] == bias[size_t(e)]);
    for (double x : out) CHECK(std::isfinite(x));
  }
}

TEST_CASE("cuda attention: cross-attention, masks, kdim/vdim and sequence-first layout match the CPU") {
  const int64_t B = 2, L = 5, S = 9, E = 16, H = 2;
  for (DType dt : kTypes) {
    ModulePair m = make_modules(E, H, dt, {}, 2);
    Inputs kv{leaf({B, L, E}, dt, 21), leaf({B, S, E}, dt, 22), {}, false, /*kv_same=*/true};
    // A float (B*H, L, S) mask, itself differentiable.
    Leaf am = leaf({B * H, L, S}, dt, 23);
    run_and_compare(m, kv, {.attn_mask = am.cpu, .need_weights = true}, {.attn_mask = am.gpu, .need_weights = true}, dt,
                    "key is value, float mask");
    Inputs sep{leaf({B, L, E}, dt, 24), leaf({B, S, E}, dt, 25), leaf({B, S, E}, dt, 26)};
    const Leaf pad = mask_of(bool_mask({B, S}, 27)), bm = mask_of(bool_mask({L, S}, 28));
    run_and_compare(m, sep, {.key_padding_mask = pad.cpu, .attn_mask = bm.cpu},
                    {.key_padding_mask = pad.gpu, .attn_mask = bm.gpu}, dt, "separate k, v, bool masks");

    ModulePair mk = make_modules(E, H, dt, {.kdim = 6, .vdim = 10}, 3);
    Inputs kd{leaf({B, L, E}, dt, 29), leaf({B, S, 6}, dt, 30), leaf({B, S, 10}, dt, 31)};
    run_and_compare(mk, kd, {.key_padding_mask = pad.cpu, .need_weights = true, .is_causal = true},
                    {.key_padding_mask = pad.gpu, .need_weights = true, .is_causal = true}, dt, "kdim/vdim causal");

    ModulePair ms = make_modules(E, H, dt, {.batch_first = false}, 4);
    Inputs seq{leaf({L, B, E}, dt, 32), leaf({S, B, E}, dt, 33), leaf({S, B, E}, dt, 34)};
    run_and_compare(ms, seq, {.key_padding_mask = pad.cpu}, {.key_padding_mask = pad.gpu}, dt, "sequence-first");
  }
}

TEST_CASE("cuda attention: dropout in training draws the same mask on both devices") {
  const int64_t B = 2, L = 6, E = 16, H = 4;
  for (DType dt : kTypes) {
    ModulePair m = make_modules(E, H, dt, {.dropout = 0.3}, 5);
    Inputs in{leaf({B, L, E}, dt, 41), {}, {}, /*self=*/true};
    run_and_compare(m, in, {}, {}, dt, "dropout", /*dropout_seed=*/77);
    run_and_compare(m, in, {.need_weights = true, .average_attn_weights = false},
                    {.need_weights = true, .average_attn_weights = false}, dt, "dropout weights", 78);
  }
}

TEST_CASE("cuda attention: inputs or masks on another device than the module throw") {
  ModulePair m = make_modules(8, 2, kFloat32, {}, 6);
  const Tensor xg = zeros({2, 3, 8}, {kFloat32, kGpu}), xc = zeros({2, 3, 8});
  check_error([&] { m.gpu->forward(xg, xc, xc); }, {"MultiheadAttention", "cpu", "cuda"});
  check_error(
      [&] {
        m.gpu->forward(xg, xg, xg, {.key_padding_mask = zeros({2, 3}, kBool)});
      },
      {"MultiheadAttention", "cpu", "cuda"});
  check_error([&] { m.cpu->forward(xg, xg, xg); }, {"cuda", "cpu"});
}

// ---- scaled_dot_product_attention (autograd/ops/attention.h) ----------------------------

TEST_CASE("cuda nn_functional: scaled_dot_product_attention forward and backward match the CPU") {
  const int64_t B = 2, H = 4, L = 16, S = 24, E = 32;
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    for (int mode = 0; mode < 3; ++mode) {  // plain, bool padding mask, causal
      const std::string what = std::string(dtype_name(dt)) + " mode " + std::to_string(mode);
      const DevicePair q = random_pair({B, H, L, E}, dt, 400), k = random_pair({B, H, S, E}, dt, 401),
                       v = random_pair({B, H, S, E}, dt, 402), g = random_pair({B, H, L, E}, dt, 403);
      std::vector<double> pad(size_t(B * S), 1.0);
      for (int64_t s = 20; s < S; ++s) pad[size_t(S + s)] = 0;
      const DevicePair mask = mode == 1 ? pair_of(from_vector(pad, {B, 1, 1, S}).to(kBool)) : DevicePair{};
      Tensor out[2];
      TensorList grads[2];
      for (int side = 0; side < 2; ++side) {
        const Tensor qs = (side ? q.gpu : q.cpu).detach().requires_grad_();
        const Tensor ks = (side ? k.gpu : k.cpu).detach().requires_grad_();
        const Tensor vs = (side ? v.gpu : v.cpu).detach().requires_grad_();
        out[side] = scaled_dot_product_attention(qs, ks, vs, side ? mask.gpu : mask.cpu, mode == 2);
        out[side].backward(side ? g.gpu : g.cpu);
        grads[side] = {qs.grad(), ks.grad(), vs.grad()};
      }
      const double t = tol(dt, 8);
      check_same(out[1], out[0], t, t, "out " + what);
      check_same(grads[1][0], grads[0][0], t, t, "dq " + what);
      check_same(grads[1][1], grads[0][1], t, t, "dk " + what);
      check_same(grads[1][2], grads[0][2], t, t, "dv " + what);
    }
  }
}

TEST_CASE("cuda nn_functional: scaled_dot_product_attention on mismatched devices is an error") {
  const Tensor xg = zeros({2, 3}, {kFloat32, kGpu});
  check_error(
      [&] {
        scaled_dot_product_attention(xg, zeros({2, 3}), xg);
      },
      {"scaled_dot_product_attention", "one device"});
}
