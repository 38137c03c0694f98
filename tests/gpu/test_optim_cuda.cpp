// The fused CUDA optimizer steps and gradient clipping against the CPU implementation
// (itself checked against float64 references in tests/cpu/test_optim.cpp) on the same
// values: 50 parameters of varied sizes (odd sizes, > 1M elements), several steps,
// every option, several groups in one launch, unaligned and strided parameters, 16-bit
// and float64 parameters, state-dict resume, and one kernel launch per step.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/multi_tensor.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using optim::Adam;
using optim::AdamOptions;
using optim::AdamW;
using optim::AdamWOptions;
using optim::clip_grad_norm_;
using optim::clip_grad_norm_async;
using optim::Optimizer;
using optim::ParamGroup;
using optim::ParamState;
using optim::SGD;
using optim::SGDOptions;
using optim::StateDict;
using optim::detail::fused_launch_count;

namespace {

/// 50 shapes: tiny, odd (not multiples of 4), chunk-boundary and > 1M-element tensors.
std::vector<Shape> fifty_shapes() {
  std::vector<Shape> s = {{1},          {3},         {5},        {7, 3},  {16},    {1023},    {1024},
                          {4099},       {17, 129},   {256, 257}, {16384}, {16385}, {3, 5461}, {(1 << 20) + 3},
                          {1100, 1000}, {2, 3, 4, 5}};
  for (int64_t k = 0; s.size() < 50; ++k) s.push_back({1 + 37 * k % 2000, 1 + k % 7});
  return s;
}

/// The same parameters on the CPU and on the GPU.
struct Twins {
  std::vector<Tensor> cpu, gpu;
};

Twins make_twins(const std::vector<Shape>& shapes, DType dt, uint64_t seed) {
  Twins t;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const std::vector<double> v = random_values(numel_of(shapes[k]), seed + k);
    t.cpu.push_back(make_tensor(v, shapes[k], dt));
    t.gpu.push_back(make_tensor(v, shapes[k], {dt, cuda()}));
    t.cpu.back().requires_grad_();
    t.gpu.back().requires_grad_();
  }
  return t;
}

/// Sets the same random gradient on both twins of every parameter (none for `skip`).
void set_grads(Twins& t, uint64_t seed, int64_t skip = -1) {
  for (size_t k = 0; k < t.cpu.size(); ++k) {
    if (int64_t(k) == skip) {
      t.cpu[k].set_grad(Tensor());
      t.gpu[k].set_grad(Tensor());
      continue;
    }
    const std::vector<double> g = random_values(t.cpu[k].numel(), seed * 1000 + k);
    t.cpu[k].set_grad(make_tensor(g, t.cpu[k].sizes(), t.cpu[k].dtype()));
    t.gpu[k].set_grad(make_tensor(g, t.gpu[k].sizes(), {t.gpu[k].dtype(), cuda()}));
  }
}

double param_rtol(DType dt) { return dt == kFloat32 ? 1e-5 : dt == kFloat64 ? 1e-12 : 2 * default_rtol(dt); }

void check_twins(const Optimizer& cpu_opt, const Optimizer& gpu_opt, const Twins& t, const std::string& what) {
  for (size_t k = 0; k < t.cpu.size(); ++k) {
    const DType dt = t.cpu[k].dtype();
    // Parameters are O(1); small results come from cancellation, so the absolute term is
    // one rounding of an O(1) value in the parameter's dtype.
    const double rtol = param_rtol(dt), atol = dt == kFloat64 ? 1e-14 : dt == kFloat32 ? 1e-6 : default_rtol(dt);
    const std::string name = what + ", parameter " + std::to_string(k) + " " + t.cpu[k].describe();
    REQUIRE(t.gpu[k].is_cuda());
    check_close(t.gpu[k], values_of(t.cpu[k]), rtol, atol, name);
    const ParamState* sc = cpu_opt.state(t.cpu[k]);
    const ParamState* sg = gpu_opt.state(t.gpu[k]);
    REQUIRE_MESSAGE((sc == nullptr) == (sg == nullptr), name);
    if (!sc) continue;
    CHECK_MESSAGE(sc->step == sg->step, name);
    for (size_t b = 0; b < 3; ++b) {
      REQUIRE_MESSAGE(sc->buffers[b].defined() == sg->buffers[b].defined(), name, " buffer ", b);
      if (!sc->buffers[b].defined()) continue;
      CHECK(sg->buffers[b].device() == cuda());
      CHECK(sg->buffers[b].dtype() == sc->buffers[b].dtype());
      const double srtol = sc->buffers[b].dtype() == kFloat64 ? 1e-12 : 1e-5;
      // Inputs are O(1): momentum buffers near zero come from cancellation, where FMA
      // contraction on the GPU and separate rounding on the CPU differ by a few ulps of 1.
      check_close(sg->buffers[b], values_of(sc->buffers[b]), srtol, dt == kFloat64 ? 1e-14 : 1e-6,
                  name + " buffer " + std::to_string(b));
    }
  }
}

using MakeOpt = std::function<std::unique_ptr<Optimizer>(const std::vector<Tensor>&)>;

/// Two groups (every other parameter) with different lrs.
std::vector<ParamGroup> two_groups(const std::vector<Tensor>& ps, double lr1) {
  std::vector<ParamGroup> g(2);
  for (size_t k = 0; k < ps.size(); ++k) g[k % 2].params.push_back(ps[k]);
  g[1].lr = lr1;
  return g;
}

struct Variant {
  std::string name;
  MakeOpt make;
};

std::vector<Variant> variants() {
  return {
      {"SGD", [](const auto& ps) { return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1}); }},
      {"SGD momentum dampening wd, two groups",
       [](const auto& ps) {
         return std::make_unique<SGD>(two_groups(ps, 0.02),
                                      SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
       }},
      {"SGD nesterov maximize",
       [](const auto& ps) {
         return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.05, .momentum = 0.8, .nesterov = true, .maximize = true});
       }},
      {"Adam", [](const auto& ps) { return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01}); }},
      {"Adam amsgrad wd, two groups",
       [](const auto& ps) {
         return std::make_unique<Adam>(two_groups(ps, 0.003),
                                       AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
       }},
      {"AdamW", [](const auto& ps) { return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01}); }},
      {"AdamW amsgrad maximize betas",
       [](const auto& ps) {
         return std::make_unique<AdamW>(
             ps, AdamWOptions{
                     .lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .weight_decay = 0.1, .amsgrad = true, .maximize = true});
       }},
  };
}

}  // namespace

TEST_CASE("optim cuda: fused SGD, Adam and AdamW match the CPU on 50 parameters, one launch per step") {
  const std::vector<Shape> shapes = fifty_shapes();
  for (const Variant& v : variants()) {
    CAPTURE(v.name);
    Twins t = make_twins(shapes, kFloat32, 1);
    std::unique_ptr<Optimizer> cpu_opt = v.make(t.cpu), gpu_opt = v.make(t.gpu);
    for (int s = 0; s < 4; ++s) {
      set_grads(t, uint64_t(s + 1), s == 0 ? 7 : -1);  // parameter 7 has no gradient at step 1
      cpu_opt->step();
      const int64_t before = fused_launch_count();
      gpu_opt->step();
      CHECK_MESSAGE(fused_launch_count() - before == 1, "a step over 50 float32 parameters is one launch");
      check_twins(*cpu_opt, *gpu_opt, t, v.name + " step " + std::to_string(s + 1));
    }
  }
}

namespace {

/// Contiguous parameters of odd sizes, plus an unaligned leaf (a view offset by one
/// element) and a transposed leaf, with the same values on both devices.
Twins mixed_twins(DType dt) {
  Twins t = make_twins({{4097}, {33, 65}, {1 << 16}, {6}}, dt, 10);
  for (Device d : {kCPU, cuda()}) {
    auto& list = d.is_cpu() ? t.cpu : t.gpu;
    Tensor unaligned = make_tensor(random_values(5001, 20), {5001}, {dt, d}).narrow(0, 1, 4999);
    Tensor transposed = make_tensor(random_values(70 * 30, 21), {70, 30}, {dt, d}, Layout::Transposed);
    list.push_back(unaligned.requires_grad_());
    list.push_back(transposed.requires_grad_());
  }
  return t;
}

}  // namespace

TEST_CASE("optim cuda: unaligned, strided, 16-bit and float64 parameters") {
  for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
    for (const Variant& v : variants()) {
      CAPTURE(dtype_name(dt));
      CAPTURE(v.name);
      Twins t = mixed_twins(dt);
      REQUIRE_FALSE(t.gpu.back().is_contiguous());
      REQUIRE(t.gpu[4].storage_offset() == 1);
      std::unique_ptr<Optimizer> cpu_opt = v.make(t.cpu), gpu_opt = v.make(t.gpu);
      for (int s = 0; s < 3; ++s) {
        set_grads(t, uint64_t(40 + s));
        cpu_opt->step();
        gpu_opt->step();
        check_twins(*cpu_opt, *gpu_opt, t, v.name + " step " + std::to_string(s + 1));
      }
    }
  }
}

TEST_CASE("optim cuda: one launch per dtype, whatever the number of groups") {
  Twins a = make_twins({{100}, {3, 7}, {1 << 17}}, kFloat32, 50);
  Twins b = make_twins({{100}, {9}}, kBFloat16, 60);
  std::vector<ParamGroup> groups = {{.params = {a.gpu[0], b.gpu[0]}},
                                    {.params = {a.gpu[1]}, .lr = 0.5},
                                    {.params = {a.gpu[2], b.gpu[1]}, .weight_decay = 0.0}};
  AdamW opt(groups, {.lr = 0.01});
  set_grads(a, 1);
  set_grads(b, 2);
  const int64_t before = fused_launch_count();
  opt.step();
  CHECK(fused_launch_count() - before == 2);  // float32 and bfloat16
}

TEST_CASE("optim cuda: a state dict round trip resumes bit-identically") {
  const std::vector<Shape> shapes = {{1000}, {7, 3}, {(1 << 18) + 1}};
  for (const Variant& v : variants()) {
    CAPTURE(v.name);
    Twins t = make_twins(shapes, kFloat32, 70);
    std::unique_ptr<Optimizer> a = v.make(t.gpu);
    for (int s = 0; s < 3; ++s) {
      set_grads(t, uint64_t(80 + s));
      a->step();
    }
    StateDict saved;
    for (const auto& [k, x] : a->state_dict()) saved.emplace_back(k, x.cpu().clone());  // through the host
    std::vector<Tensor> pb;
    for (const Tensor& p : t.gpu) pb.push_back(p.detach().clone().requires_grad_());
    std::unique_ptr<Optimizer> b = v.make(pb);
    b->load_state_dict(saved);
    for (int s = 3; s < 6; ++s) {
      set_grads(t, uint64_t(80 + s));
      for (size_t k = 0; k < pb.size(); ++k) pb[k].set_grad(t.gpu[k].grad().clone());
      a->step();
      b->step();
    }
    for (size_t k = 0; k < pb.size(); ++k) {
      CHECK_MESSAGE(values_of(t.gpu[k]) == values_of(pb[k]), "parameter ", k);
      const ParamState* sa = a->state(t.gpu[k]);
      const ParamState* sb = b->state(pb[k]);
      REQUIRE((sa == nullptr) == (sb == nullptr));
      if (!sa) continue;
      for (size_t i = 0; i < 3; ++i)
        if (sa->buffers[i].defined()) {
          CHECK(sb->buffers[i].is_cuda());
          CHECK(values_of(sa->buffers[i]) == values_of(sb->buffers[i]));
        }
    }
  }
}

TEST_CASE("optim cuda: clip_grad_norm_ matches the CPU without extra launches") {
  const std::vector<Shape> shapes = fifty_shapes();
  for (double p : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    for (bool clip : {false, true}) {
      CAPTURE(p);
      CAPTURE(clip);
      Twins t = make_twins(shapes, kFloat32, 90);
      set_grads(t, 3, 5);
      // a strided gradient too
      const std::vector<double> g = random_values(12 * 9, 99);
      t.cpu[6].set_grad(Tensor());
      t.gpu[6].set_grad(Tensor());
      Tensor sc = make_tensor(random_values(12 * 9, 98), {12, 9}, kFloat32).requires_grad_();
      Tensor sg = make_tensor(random_values(12 * 9, 98), {12, 9}, {kFloat32, cuda()}).requires_grad_();
      sc.set_grad(make_tensor(g, {12, 9}, kFloat32, Layout::Transposed));
      sg.set_grad(make_tensor(g, {12, 9}, {kFloat32, cuda()}, Layout::Transposed));
      t.cpu.push_back(sc);
      t.gpu.push_back(sg);

      // the norm alone (an infinite max_norm scales nothing), then clip below or above it
      const double norm = clip_grad_norm_(t.cpu, std::numeric_limits<double>::infinity(), p);
      const double max_norm = clip ? norm / 3 : norm * 3;
      const double total_cpu = clip_grad_norm_(t.cpu, max_norm, p);
      CHECK(total_cpu == doctest::Approx(norm).epsilon(1e-12));  // threaded sums may round differently
      const int64_t before = fused_launch_count();
      const Tensor total_gpu = clip_grad_norm_async(t.gpu, max_norm, p);
      CHECK(fused_launch_count() - before == 2);  // partial norms + scaling
      CHECK(total_gpu.is_cuda());
      CHECK(total_gpu.dim() == 0);
      CHECK(total_gpu.dtype() == kFloat32);
      CHECK(double(total_gpu.item<float>()) == doctest::Approx(total_cpu).epsilon(1e-5));
      for (size_t k = 0; k < t.cpu.size(); ++k) {
        if (!t.cpu[k].grad().defined()) {
          CHECK_FALSE(t.gpu[k].grad().defined());
          continue;
        }
        check_close(t.gpu[k].grad(), values_of(t.cpu[k].grad()), 1e-5, 1e-7, "grad " + std::to_string(k));
      }
      CHECK(clip_grad_norm_(t.gpu, 1e30, p) == doctest::Approx(clip ? max_norm : total_cpu).epsilon(1e-5));
    }
  }
}

TEST_CASE("optim cuda: clip_grad_norm_ edge cases and device errors") {
  Twins t = make_twins({{5}, {1 << 12}}, kFloat32, 5);
  set_grads(t, 1);
  t.gpu[0].set_grad(make_tensor({1, std::nan(""), 2, 3, 4}, {5}, {kFloat32, cuda()}));
  CHECK(std::isnan(clip_grad_norm_(t.gpu, 1.0)));
  for (double v : values_of(t.gpu[1].grad())) CHECK(std::isnan(v));

  Twins e = make_twins({{0}, {3}}, kFloat32, 6);  // an empty gradient, and a parameter without one
  e.gpu[0].set_grad(zeros({0}, {kFloat32, cuda()}));
  CHECK(clip_grad_norm_(e.gpu, 1.0) == 0.0);

  Twins m = make_twins({{4}}, kFloat32, 7);
  set_grads(m, 1);
  std::vector<Tensor> mixed = {m.cpu[0], m.gpu[0]};
  check_error([&] { clip_grad_norm_(mixed, 1.0); }, {"clip_grad_norm_", "different devices", "cpu", "cuda:0"});
}

TEST_CASE("optim cuda: channels-last weights step in place under GradScaler and clipping, as contiguous twins") {
  // Note [Optimizer memory order]: ResNet's channels-last convolution weights and their
  // gradients go to the fused kernels (unscale, SGD, AdamW, clip) where they lie.
  const Shape shape{64, 32, 3, 3};
  const int64_t n = numel_of(shape);
  auto channels_last_leaf = [](const Tensor& t) {
    Tensor out = empty_channels_last(t.sizes(), t.options());
    out.copy_(t);
    return out.requires_grad_();
  };
  for (const bool adamw : {false, true}) {
    CAPTURE(adamw);
    const Tensor base = make_tensor(random_values(n, 41), shape, {kFloat32, cuda()});
    const Tensor flat = base.clone().requires_grad_(), cl = channels_last_leaf(base);
    const void* storage = cl.data();
    auto make = [&](const Tensor& p) -> std::unique_ptr<optim::Optimizer> {
      if (adamw) return std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 1e-2, .capturable = true});
      return std::make_unique<SGD>(std::vector<Tensor>{p}, optim::SGDOptions{.lr = 1e-2, .momentum = 0.9});
    };
    std::unique_ptr<optim::Optimizer> flat_opt = make(flat), cl_opt = make(cl);
    optim::GradScaler flat_scaler, cl_scaler;
    for (int s = 0; s < 3; ++s) {
      const Tensor g = make_tensor(random_values(n, 50 + s, -100, 100), shape, {kFloat32, cuda()});
      flat.set_grad(g.clone());
      cl.set_grad(channels_last_leaf(g).detach());
      flat_scaler.unscale_(*flat_opt);
      cl_scaler.unscale_(*cl_opt);
      clip_grad_norm_({flat}, 1.0);
      clip_grad_norm_({cl}, 1.0);
      flat_scaler.step(*flat_opt);
      cl_scaler.step(*cl_opt);
      flat_scaler.update();
      cl_scaler.update();
      // (clip's norm sums the squares in memory order, so the coefficient may differ in its last bit)
      check_close(cl, values_of(flat), 1e-6, 1e-7, "step " + std::to_string(s));
    }
    CHECK(cl.data() == storage);
    CHECK(suggests_channels_last(cl));
    CHECK(suggests_channels_last(cl.grad()));
    for (const Tensor& b : cl_opt->state(cl)->buffers)
      if (b.defined()) CHECK(b.strides() == cl.strides());
  }
}
