// Probes for silent wrong answers in the nn::Module API as a PyTorch user relies on it:
// state_dict key order and names for nested modules, Sequential and ModuleList past ten
// children, undefined buffers (torch's register_buffer(name, None)), name validation,
// named_* recursion, non-strict load_state_dict's key lists, to() on the CPU, the module
// options of Conv2d and the pools against float64 loops, Flatten, activation modules, an
// empty Sequential, and the module tree printout. Every expectation comes from
// torch/nn/modules/module.py (cited per case) or from a float64 loop written here, never
// from frugal's output. (test_probe_modules.cpp covers tied parameters, train/eval,
// BatchNorm statistics, to(dtype), LayerNorm, Embedding padding and an empty Linear.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "nn/activation.h"
#include "nn/batch_norm.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/pooling.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;
using Names = std::vector<std::string>;

void set_values(const Tensor& t, double v) {
  autograd::NoGradGuard no_grad;
  t.copy_(full(t.sizes(), v, TensorOptions(t.dtype())));
}

// Registration order deliberately mixes kinds: a parameter, a submodule, then a buffer.
struct Inner : nn::Module {
  Tensor w, stat;
  std::shared_ptr<nn::Linear> fc;
  Inner() {
    w = register_parameter("w", zeros({2}));
    fc = register_module("fc", std::make_shared<nn::Linear>(2, 2));
    stat = register_buffer("stat", zeros({2}));
  }
  std::string type_name() const override { return "Inner"; }
};

// A buffer first, then two submodules, then a parameter.
struct Outer : nn::Module {
  Tensor scale, gain;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<Inner> inner;
  Outer() {
    scale = register_buffer("scale", ones({1}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(3));
    inner = register_module("inner", std::make_shared<Inner>());
    gain = register_parameter("gain", ones({1}));
  }
  std::string type_name() const override { return "Outer"; }
};

// torch.nn.Module.state_dict (module.py) calls self._save_to_state_dict -- every parameter of
// self._parameters, then every persistent buffer of self._buffers -- and only then recurses
// into self._modules in order. So a module's own buffers come before its children's
// parameters, whatever order they were registered in.
const Names kTorchStateDictOrder = {"gain",
                                    "scale",
                                    "bn.weight",
                                    "bn.bias",
                                    "bn.running_mean",
                                    "bn.running_var",
                                    "bn.num_batches_tracked",
                                    "inner.w",
                                    "inner.stat",
                                    "inner.fc.weight",
                                    "inner.fc.bias"};

}  // namespace

TEST_CASE("probe module api: state_dict lists each module's parameters, then its buffers, then its children's") {
  Outer m;
  CHECK(names_of(m.state_dict()) == kTorchStateDictOrder);
  // A model with buffers only in the leaves: Sequential(Conv2d, BatchNorm2d, ...) as in ResNet.
  nn::Sequential seq{std::make_shared<nn::Conv2d>(3, 4, 3), std::make_shared<nn::BatchNorm2d>(4),
                     std::make_shared<nn::ReLU>(), std::make_shared<nn::BatchNorm2d>(4)};
  CHECK(names_of(seq.state_dict()) == Names{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                            "1.running_var", "1.num_batches_tracked", "3.weight", "3.bias",
                                            "3.running_mean", "3.running_var", "3.num_batches_tracked"});
  // Loading a state in torch's order through the NamedTensors overload still pairs by name.
  Outer other;
  nn::NamedTensors state;
  double v = 1.0;
  for (const auto& name : kTorchStateDictOrder) {
    const Tensor t = entry(m.state_dict(), name);  // a copy: the state_dict is a temporary
    state.emplace_back(name, full(t.sizes(), v++, TensorOptions(t.dtype())));
  }
  other.load_state_dict(state);
  v = 1.0;
  for (const auto& name : kTorchStateDictOrder) {
    for (double x : values_of(entry(other.state_dict(), name))) CHECK_MESSAGE(x == v, name);
    v += 1.0;
  }
}

TEST_CASE("probe module api: named_parameters/buffers/modules/children recurse depth first, own entries first") {
  // torch: named_parameters/named_buffers go through _named_members over named_modules()
  // (self, then each child's subtree in registration order), each module's own entries first;
  // recurse=False takes self only. named_modules() here leaves out self (documented in module.h).
  Outer m;
  CHECK(names_of(m.named_parameters()) ==
        Names{"gain", "bn.weight", "bn.bias", "inner.w", "inner.fc.weight", "inner.fc.bias"});
  CHECK(names_of(m.named_buffers()) ==
        Names{"scale", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "inner.stat"});
  CHECK(names_of(m.named_parameters(/*recurse=*/false)) == Names{"gain"});
  CHECK(names_of(m.named_buffers(/*recurse=*/false)) == Names{"scale"});
  CHECK(names_of(m.inner->named_parameters()) == Names{"w", "fc.weight", "fc.bias"});  // no parent prefix
  CHECK(names_of(m.named_children()) == Names{"bn", "inner"});
  CHECK(names_of(m.named_modules()) == Names{"bn", "inner", "inner.fc"});
  const auto kids = m.children();
  REQUIRE(kids.size() == 2);
  CHECK(kids[0].get() == m.bn.get());
  CHECK(kids[1].get() == m.inner.get());
  // parameters() holds the registered tensors themselves, in named_parameters()'s order.
  const std::vector<Tensor> ps = m.parameters();
  REQUIRE(ps.size() == 6);
  CHECK(&ps[0].impl() == &m.gain.impl());
  CHECK(&ps[3].impl() == &m.inner->w.impl());
  CHECK(&ps[5].impl() == &m.inner->fc->bias.impl());
  CHECK(m.num_parameters() == 1 + 3 + 3 + 2 + 4 + 2);
  // A parameter registered with requires_grad=false is still a parameter (torch's
  // nn.Parameter(t, requires_grad=False) is listed by parameters()).
  struct Frozen : nn::Module {
    Tensor a, b;
    Frozen() {
      a = register_parameter("a", ones({2}), /*requires_grad=*/false);
      b = register_parameter("b", ones({3}));
    }
  } frozen;
  CHECK(names_of(frozen.named_parameters()) == Names{"a", "b"});
  CHECK_FALSE(frozen.a.requires_grad());
  CHECK(frozen.b.requires_grad());
}

TEST_CASE(
    "probe module api: Sequential and ModuleList past ten children: 'layers.10' after 'layers.9', forward in index "
    "order") {
  struct Net : nn::Module {
    std::shared_ptr<nn::Sequential> layers;
    std::shared_ptr<nn::ModuleList<nn::Linear>> heads;
    Net() {
      layers = register_module("layers", std::make_shared<nn::Sequential>());
      heads = register_module("heads", std::make_shared<nn::ModuleList<nn::Linear>>());
      for (int k = 0; k < 12; ++k) layers->push_back(std::make_shared<nn::Linear>(1, 1));
      for (int k = 0; k < 11; ++k) heads->push_back(std::make_shared<nn::Linear>(1, 1, nn::LinearOptions{false}));
    }
  } net;
  Names expected;
  for (int k = 0; k < 12; ++k) {
    expected.push_back("layers." + std::to_string(k) + ".weight");
    expected.push_back("layers." + std::to_string(k) + ".bias");
  }
  for (int k = 0; k < 11; ++k) expected.push_back("heads." + std::to_string(k) + ".weight");
  CHECK(names_of(net.state_dict()) == expected);
  CHECK(names_of(net.named_parameters()) == expected);
  Names mods{"layers"};
  for (int k = 0; k < 12; ++k) mods.push_back("layers." + std::to_string(k));
  mods.push_back("heads");
  for (int k = 0; k < 11; ++k) mods.push_back("heads." + std::to_string(k));
  CHECK(names_of(net.named_modules()) == mods);

  // A checkpoint held in a std::map (keys sorted as strings: "layers.10" before "layers.2")
  // loads each value into the layer of its own number.
  std::map<std::string, Tensor> ckpt;
  for (int k = 0; k < 12; ++k) {
    ckpt["layers." + std::to_string(k) + ".weight"] = full({1, 1}, 1.0 + k / 8.0);
    ckpt["layers." + std::to_string(k) + ".bias"] = full({1}, k / 4.0 - 1.0);
  }
  for (int k = 0; k < 11; ++k) ckpt["heads." + std::to_string(k) + ".weight"] = full({1, 1}, double(k));
  net.load_state_dict(ckpt);
  for (int k = 0; k < 11; ++k) CHECK(values_of((*net.heads)[size_t(k)]->weight) == Values{double(k)});
  // forward runs layer 0, 1, ..., 9, 10, 11: y = (...((x w0 + b0) w1 + b1) ...) w11 + b11.
  const Values xs = {0.5, -1.25, 3.0};
  auto reference = [&](int replaced, double rw, double rb) {
    Values out;
    for (double x : xs) {
      double y = x;
      for (int k = 0; k < 12; ++k) y = k == replaced ? y * rw + rb : y * (1.0 + k / 8.0) + (k / 4.0 - 1.0);
      out.push_back(y);
    }
    return out;
  };
  const Tensor x = from_vector(xs, {3, 1}, TensorOptions(kFloat32));
  check_close(net.layers->forward(x), reference(-1, 0, 0), 1e-5, 1e-5, "12-layer chain");
  // replace_module("10", ...) puts the new layer at position 10 of forward and of the keys.
  auto fresh = std::make_shared<nn::Linear>(1, 1);
  set_values(fresh->weight, -2.0);
  set_values(fresh->bias, 0.5);
  net.layers->replace_module("10", fresh);
  CHECK((*net.layers)[10].get() == fresh.get());
  CHECK(names_of(net.state_dict()) == expected);
  CHECK(&entry(net.state_dict(), "layers.10.weight").impl() == &fresh->weight.impl());
  check_close(net.layers->forward(x), reference(10, -2.0, 0.5), 1e-5, 1e-5, "chain with layer 10 replaced");
}

TEST_CASE(
    "probe module api: an undefined buffer (torch's register_buffer(name, None)) is in neither named_buffers nor "
    "state_dict") {
  // torch: register_buffer(name, None) is allowed; _named_members skips None ("if v is None or
  // v in memo: continue"), _save_to_state_dict skips None buffers, and _load_from_state_dict
  // builds local_state from the non-None ones, so a state's key for it is unexpected.
  struct WithNone : nn::Module {
    Tensor w, mask, b;
    WithNone() {
      w = register_parameter("w", ones({2}));
      mask = register_buffer("mask", Tensor());
      b = register_buffer("b", ones({1}));
    }
    void again() { register_buffer("mask", zeros({1})); }
  };
  WithNone a, b;
  CHECK(names_of(a.named_buffers()) == Names{"b"});
  CHECK(names_of(a.state_dict()) == Names{"w", "b"});
  for (const auto& [name, t] : a.state_dict()) CHECK_MESSAGE(t.defined(), name);
  // a model with one round-trips into another
  set_values(a.w, 3.0);
  set_values(a.b, 4.0);
  b.load_state_dict(a.state_dict());
  CHECK(values_of(b.w) == Values{3.0, 3.0});
  CHECK(values_of(b.b) == Values{4.0});
  // a state that holds a value for it: unexpected (torch: not in local_state)
  std::map<std::string, Tensor> state{{"w", ones({2})}, {"b", ones({1})}, {"mask", ones({1})}};
  check_error([&] { b.load_state_dict(state); }, {"unexpected keys (1)", "mask"});
  const auto result = b.load_state_dict(state, /*strict=*/false);
  CHECK(result.missing_keys.empty());
  CHECK(result.unexpected_keys == Names{"mask"});
  CHECK_FALSE(b.mask.defined());
  // to() passes it by; its name stays taken (torch: the name is in _buffers).
  a.to(kFloat64);
  CHECK(a.w.dtype() == kFloat64);
  CHECK_FALSE(a.mask.defined());
  check_error([&] { a.again(); }, {"'mask'", "already registered"});
  // In a nested module the same holds under its prefix.
  struct Holder : nn::Module {
    std::shared_ptr<WithNone> child;
    Holder() { child = register_module("child", std::make_shared<WithNone>()); }
  } holder;
  CHECK(names_of(holder.state_dict()) == Names{"child.w", "child.b"});
  CHECK(names_of(holder.named_buffers()) == Names{"child.b"});
}

TEST_CASE(
    "probe module api: register_* refuses empty and dotted names and cross-kind collisions, registering nothing") {
  // torch (module.py register_parameter/register_buffer/add_module): '' and names with '.'
  // raise KeyError; a name already used by another kind raises KeyError("attribute '...'
  // already exists"). torch lets register_parameter replace a parameter of the same name;
  // frugal refuses any second registration (loud, never a silent overwrite).
  struct Reg : nn::Module {
    Tensor w;
    std::shared_ptr<nn::Linear> sub;
    Reg() {
      w = register_parameter("w", ones({1}));
      sub = register_module("sub", std::make_shared<nn::Linear>(1, 1));
    }
    void param(const std::string& n) { register_parameter(n, ones({1})); }
    void buffer(const std::string& n) { register_buffer(n, ones({1})); }
    void module(const std::string& n) { register_module(n, std::make_shared<nn::ReLU>()); }
    void null_module() { register_module("act", std::shared_ptr<nn::ReLU>()); }
  };
  Reg r;
  const Names before = names_of(r.state_dict());
  check_error([&] { r.param(""); }, {"Reg", "invalid name ''"});
  check_error([&] { r.buffer(""); }, {"Reg", "invalid name ''"});
  check_error([&] { r.module(""); }, {"Reg", "invalid name ''"});
  check_error([&] { r.module("a.b"); }, {"Reg", "'a.b'"});
  check_error([&] { r.buffer("x.y"); }, {"Reg", "'x.y'"});
  check_error([&] { r.param("sub"); }, {"Reg", "'sub'", "already registered"});   // parameter over a submodule
  check_error([&] { r.module("w"); }, {"Reg", "'w'", "already registered"});      // submodule over a parameter
  check_error([&] { r.buffer("sub"); }, {"Reg", "'sub'", "already registered"});  // buffer over a submodule
  check_error([&] { r.buffer("w"); }, {"Reg", "'w'", "already registered"});      // buffer over a parameter
  check_error([&] { r.param("w"); }, {"Reg", "'w'", "already registered"});
  check_error([&] { r.null_module(); }, {"Reg", "'act'", "null"});
  CHECK(names_of(r.state_dict()) == before);
  CHECK(names_of(r.named_children()) == Names{"sub"});
  // the refused null module left its name free
  r.module("act");
  CHECK(names_of(r.named_children()) == Names{"sub", "act"});
}

TEST_CASE("probe module api: non-strict load_state_dict of a nested model reports dotted missing and unexpected keys") {
  // torch (module.py load_state_dict / _load_from_state_dict): each module checks its own
  // local_state (parameters, then persistent buffers) under its prefix, in module order, so
  // missing_keys come in state_dict order; every key under a module's prefix whose first
  // component is neither a child nor a local name is unexpected. Present keys load; missing
  // ones keep their values.
  Outer m;
  set_values(m.inner->fc->bias, 7.0);
  set_values(m.bn->num_batches_tracked, 5.0);
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : m.state_dict()) state[name] = full(t.sizes(), 2.0, TensorOptions(t.dtype()));
  state.erase("inner.fc.bias");
  state.erase("bn.num_batches_tracked");
  state.erase("gain");
  state["inner.fc.scale"] = ones({2});  // a name the Linear lacks
  state["bn.running_std"] = ones({3});  // one the BatchNorm lacks
  state["head.weight"] = ones({2, 2});  // a child the model lacks
  const auto r = m.load_state_dict(state, /*strict=*/false);
  CHECK(r.missing_keys == Names{"gain", "bn.num_batches_tracked", "inner.fc.bias"});
  CHECK(std::set<std::string>(r.unexpected_keys.begin(), r.unexpected_keys.end()) ==
        std::set<std::string>{"inner.fc.scale", "bn.running_std", "head.weight"});
  CHECK(values_of(m.inner->fc->bias) == Values{7.0, 7.0});
  CHECK(values_of(m.bn->num_batches_tracked) == Values{5.0});
  CHECK(values_of(m.gain) == Values{1.0});
  CHECK(values_of(m.inner->fc->weight) == Values(4, 2.0));
  CHECK(values_of(m.bn->running_var) == Values(3, 2.0));
  CHECK(values_of(m.scale) == Values{2.0});
  // strict: one error naming all of them
  check_error([&] { m.load_state_dict(state); },
              {"missing keys (3)", "inner.fc.bias", "unexpected keys (3)", "bn.running_std", "head.weight"});
}

TEST_CASE("probe module api: to(kCPU) and to(own dtype) are no-ops keeping every tensor's identity and version") {
  // torch: Module.to -> _apply(convert); t.to(device) returns t itself when nothing changes,
  // and the parameter objects are kept (module.py _apply: param_applied is assigned into
  // param.data), so handles held elsewhere (an optimizer's) stay valid. Modules are not
  // copyable here (a copy would alias every tensor or split the tie silently).
  static_assert(!std::is_copy_constructible_v<nn::Linear>);
  static_assert(!std::is_copy_assignable_v<nn::Sequential>);
  static_assert(!std::is_move_constructible_v<nn::Module>);
  Outer m;
  Tensor held = m.inner->fc->weight;
  held.set_grad(full(held.sizes(), 0.5));
  const Tensor grad_before = held.grad();
  std::vector<const TensorImpl*> impls;
  std::vector<const void*> data;
  std::vector<uint64_t> versions;
  for (const auto& [name, t] : m.state_dict()) {
    impls.push_back(&t.impl());
    data.push_back(t.data());
    versions.push_back(t.version());
  }
  const std::vector<Values> vals = [&] {
    std::vector<Values> v;
    for (const auto& [name, t] : m.state_dict()) v.push_back(values_of(t));
    return v;
  }();
  m.to(kCPU);
  m.to(kFloat32);
  m.to(kCPU, kFloat32);
  size_t i = 0;
  for (const auto& [name, t] : m.state_dict()) {
    CAPTURE(name);
    CHECK(&t.impl() == impls[i]);
    CHECK(t.data() == data[i]);
    CHECK(t.version() == versions[i]);
    CHECK(values_of(t) == vals[i]);
    ++i;
  }
  CHECK(m.bn->num_batches_tracked.dtype() == kInt64);  // integer buffers keep their dtype
  CHECK(held.grad().data() == grad_before.data());
  // A round trip through float64 keeps the TensorImpls (handles see the new data).
  m.to(kFloat64);
  m.to(kFloat32);
  CHECK(&m.inner->fc->weight.impl() == &held.impl());
  CHECK(held.dtype() == kFloat32);
  CHECK(held.grad().dtype() == kFloat32);
  // zero_grad() defaults to set_to_none=True (torch 2.x Module.zero_grad) for nested modules.
  m.zero_grad();
  CHECK_FALSE(held.grad().defined());
}

namespace {

// float64 conv2d as torch.nn.functional.conv2d defines it (zero padding, dilation, groups).
Values conv2d_reference(const Values& x, const Shape& xs, const Values& w, const Shape& ws, const Values* bias,
                        Int2 stride, Int2 pad, Int2 dil, int64_t groups, int64_t* oh_out, int64_t* ow_out) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  const int64_t K = ws[0], Cg = ws[1], R = ws[2], S = ws[3];
  const int64_t OH = (H + 2 * pad.h - dil.h * (R - 1) - 1) / stride.h + 1;
  const int64_t OW = (W + 2 * pad.w - dil.w * (S - 1) - 1) / stride.w + 1;
  *oh_out = OH, *ow_out = OW;
  const int64_t Kg = K / groups;
  Values out(size_t(N * K * OH * OW), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = bias ? (*bias)[size_t(k)] : 0.0;
          const int64_t g = k / Kg;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t r = 0; r < R; ++r)
              for (int64_t s = 0; s < S; ++s) {
                const int64_t h = oh * stride.h - pad.h + r * dil.h, ww = ow * stride.w - pad.w + s * dil.w;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                acc += x[size_t(((n * C + g * Cg + c) * H + h) * W + ww)] * w[size_t(((k * Cg + c) * R + r) * S + s)];
              }
          out[size_t(((n * K + k) * OH + oh) * OW + ow)] = acc;
        }
  (void)C;
  return out;
}

}  // namespace

TEST_CASE("probe module api: Conv2d's stride, padding, dilation, groups and bias=false reach the convolution") {
  manual_seed(11);
  nn::Conv2d conv(4, 6, {3, 2}, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {2, 1}, .groups = 2, .bias = false});
  CHECK(names_of(conv.named_parameters()) == Names{"weight"});
  CHECK(conv.weight.sizes() == Shape{6, 2, 3, 2});
  CHECK_FALSE(conv.bias.defined());
  // torch Conv2d.extra_repr: '{in}, {out}, kernel_size=..., stride=...' then padding, dilation,
  // groups when not default, bias=False without one (C++ spelling 'false').
  CHECK(conv.extra_repr() ==
        "4, 6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=2, bias=false");
  const Shape xs{2, 4, 7, 6};
  const Tensor x = random_tensor(xs, TensorOptions(kFloat32), 21, Layout::Transposed);
  int64_t OH = 0, OW = 0;
  const Values ref = conv2d_reference(values_of(x), xs, values_of(conv.weight), conv.weight.sizes(), nullptr, {2, 1},
                                      {1, 2}, {2, 1}, 2, &OH, &OW);
  CHECK(OH == 3);
  CHECK(OW == 9);
  const Tensor y = conv(x);
  CHECK(y.sizes() == Shape{2, 6, OH, OW});
  check_close(y, ref, 1e-5, 1e-5, "Conv2d grouped dilated, no bias");

  // With a bias, on an unbatched (C, H, W) strided view: torch treats it as a batch of one.
  nn::Conv2d biased(3, 2, 3, {.padding = 1});
  CHECK(biased.extra_repr() == "3, 2, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1)");
  const Shape us{1, 3, 5, 4};
  const Tensor u = random_tensor({3, 5, 4}, TensorOptions(kFloat32), 22, Layout::Strided);
  const Values bias = values_of(biased.bias);
  const Values uref =
      conv2d_reference(values_of(u), us, values_of(biased.weight), biased.weight.sizes(), &bias, 1, 1, 1, 1, &OH, &OW);
  const Tensor uy = biased(u);
  CHECK(uy.sizes() == Shape{2, 5, 4});
  check_close(uy, uref, 1e-5, 1e-5, "Conv2d unbatched with bias");
}

namespace {

// float64 pools as torch's max_pool2d / avg_pool2d define them (ATen Pool.h
// pooling_output_shape and AvgPool2d.cpp's divisor), on (P, H, W) planes.
int64_t pooled(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const double num = double(in + 2 * p - d * (k - 1) - 1) / double(s);
  int64_t out = int64_t(ceil_mode ? std::ceil(num) : std::floor(num)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

Values max_pool_reference(const Values& x, int64_t P, int64_t H, int64_t W, Int2 k, Int2 s, Int2 p, Int2 d, bool ceil,
                          Shape* out_hw) {
  const int64_t OH = pooled(H, k.h, s.h, p.h, d.h, ceil), OW = pooled(W, k.w, s.w, p.w, d.w, ceil);
  *out_hw = {OH, OW};
  Values out;
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < k.h; ++i)
          for (int64_t j = 0; j < k.w; ++j) {
            const int64_t h = oh * s.h - p.h + i * d.h, w = ow * s.w - p.w + j * d.w;
            if (h >= 0 && h < H && w >= 0 && w < W) m = std::max(m, x[size_t((pl * H + h) * W + w)]);
          }
        out.push_back(m);
      }
  return out;
}

Values avg_pool_reference(const Values& x, int64_t P, int64_t H, int64_t W, Int2 k, Int2 s, Int2 p, bool ceil,
                          bool count_include_pad, Shape* out_hw) {
  const int64_t OH = pooled(H, k.h, s.h, p.h, 1, ceil), OW = pooled(W, k.w, s.w, p.w, 1, ceil);
  *out_hw = {OH, OW};
  Values out;
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t h0 = oh * s.h - p.h, w0 = ow * s.w - p.w;
        int64_t h1 = std::min(h0 + k.h, H + p.h), w1 = std::min(w0 + k.w, W + p.w);
        const int64_t pool_size = (h1 - h0) * (w1 - w0);
        h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
        h1 = std::min(h1, H), w1 = std::min(w1, W);
        double sum = 0.0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) sum += x[size_t((pl * H + h) * W + w)];
        out.push_back(sum / double(count_include_pad ? pool_size : (h1 - h0) * (w1 - w0)));
      }
  return out;
}

}  // namespace

TEST_CASE(
    "probe module api: MaxPool2d and AvgPool2d modules: stride defaults to the kernel; padding, dilation, ceil_mode, "
    "count_include_pad") {
  // torch.nn.MaxPool2d / AvgPool2d: stride=None means stride = kernel_size.
  const int64_t N = 2, C = 3, H = 8, W = 7;
  const Tensor x = random_tensor({N, C, H, W}, TensorOptions(kFloat32), 31, Layout::Strided);
  const Values xv = values_of(x);
  Shape hw;
  {
    nn::MaxPool2d pool({3, 2});
    CHECK(pool.extra_repr() == "kernel_size=(3, 2), stride=(3, 2), padding=0, dilation=1, ceil_mode=false");
    const Values ref = max_pool_reference(xv, N * C, H, W, {3, 2}, {3, 2}, 0, 1, false, &hw);
    const Tensor y = pool(x);
    CHECK(y.sizes() == Shape{N, C, hw[0], hw[1]});
    check_close(y, ref, 0, 0, "MaxPool2d default stride");
  }
  {
    nn::MaxPool2d pool(3, {.stride = 2, .padding = 1, .dilation = {1, 2}, .ceil_mode = true});
    const Values ref = max_pool_reference(xv, N * C, H, W, 3, 2, 1, {1, 2}, true, &hw);
    const Tensor y = pool(x);
    CHECK(y.sizes() == Shape{N, C, hw[0], hw[1]});
    check_close(y, ref, 0, 0, "MaxPool2d stride 2 pad 1 dilation (1, 2) ceil");
  }
  {
    nn::AvgPool2d pool(3, {.padding = 1, .ceil_mode = true, .count_include_pad = false});
    const Values ref = avg_pool_reference(xv, N * C, H, W, 3, 3, 1, true, false, &hw);
    CHECK(hw == Shape{3, 3});  // ceil((8+2-3)/3)+1 = 4, but window 4 would start in the padding
    const Tensor y = pool(x);
    CHECK(y.sizes() == Shape{N, C, 3, 3});
    check_close(y, ref, 1e-6, 1e-6, "AvgPool2d default stride, pad 1, ceil, count_include_pad=false");
  }
  {
    nn::AvgPool2d pool({2, 3}, {.stride = {3, 2}, .padding = 1, .ceil_mode = true});
    const Values ref = avg_pool_reference(xv, N * C, H, W, {2, 3}, {3, 2}, 1, true, true, &hw);
    const Tensor y = pool(x);
    CHECK(y.sizes() == Shape{N, C, hw[0], hw[1]});
    check_close(y, ref, 1e-6, 1e-6, "AvgPool2d ceil, count_include_pad=true (windows past the padding)");
  }
  {  // unbatched (C, H, W), as torch accepts
    nn::MaxPool2d pool(2);
    const Tensor u = x.select(0, 1);
    const Values ref = max_pool_reference(values_of(u), C, H, W, 2, 2, 0, 1, false, &hw);
    const Tensor y = pool(u);
    CHECK(y.sizes() == Shape{C, hw[0], hw[1]});
    check_close(y, ref, 0, 0, "MaxPool2d unbatched");
  }
}

TEST_CASE("probe module api: AdaptiveAvgPool2d shrinks and grows by torch's floor/ceil bins") {
  // ATen AdaptiveAveragePooling.cpp: bin i spans [floor(i*in/out), ceil((i+1)*in/out)).
  const int64_t P = 2, H = 5, W = 7;
  const Tensor x = random_tensor({1, P, H, W}, TensorOptions(kFloat32), 41, Layout::Transposed);
  const Values xv = values_of(x);
  for (Int2 out : {Int2(3, 2), Int2(1, 1), Int2(7, 9), Int2(5, 7)}) {
    CAPTURE(out.str());
    Values ref;
    for (int64_t p = 0; p < P; ++p)
      for (int64_t i = 0; i < out.h; ++i)
        for (int64_t j = 0; j < out.w; ++j) {
          const int64_t h0 = (i * H) / out.h, h1 = ((i + 1) * H + out.h - 1) / out.h;
          const int64_t w0 = (j * W) / out.w, w1 = ((j + 1) * W + out.w - 1) / out.w;
          double s = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) s += xv[size_t((p * H + h) * W + w)];
          ref.push_back(s / double((h1 - h0) * (w1 - w0)));
        }
    nn::AdaptiveAvgPool2d pool(out);
    const Tensor y = pool(x);
    CHECK(y.sizes() == Shape{1, P, out.h, out.w});
    check_close(y, ref, 1e-6, 1e-6, "adaptive " + out.str());
  }
}

TEST_CASE("probe module api: Flatten(start_dim, end_dim) on views, negative dims, and a 0-d input") {
  // torch.nn.Flatten(start_dim=1, end_dim=-1) is torch.flatten(x, start_dim, end_dim).
  const Tensor x = random_tensor({2, 3, 4, 5}, TensorOptions(kFloat32), 51, Layout::Transposed);
  const Values xv = values_of(x);  // row-major values of the logical tensor
  struct Case {
    int64_t start, end;
    Shape expect;
  };
  for (const Case& c : {Case{1, -1, {2, 60}}, Case{0, -1, {120}}, Case{-3, -2, {2, 12, 5}}, Case{2, 2, {2, 3, 4, 5}},
                        Case{0, 1, {6, 4, 5}}, Case{-1, -1, {2, 3, 4, 5}}}) {
    CAPTURE(c.start);
    CAPTURE(c.end);
    nn::Flatten f(c.start, c.end);
    const Tensor y = f(x);
    CHECK(y.sizes() == c.expect);
    CHECK(values_of(y) == xv);  // flattening keeps row-major order
  }
  CHECK(nn::Flatten().extra_repr() == "start_dim=1, end_dim=-1");
  // gradient passes through unchanged
  Tensor p = param_tensor(random_values(24, 52), {2, 3, 4});
  sum(mul(nn::Flatten()(p.transpose(1, 2)), 3.0)).backward();
  CHECK(values_of(p.grad()) == Values(24, 3.0));
  // torch.flatten on a 0-d tensor gives shape [1], but its dims are still checked against the
  // range [-1, 0] (ATen flatten: maybe_wrap_dim first): nn.Flatten() (start_dim=1) refuses it.
  const Tensor s = scalar_tensor(2.5);
  CHECK(nn::Flatten(0, -1)(s).sizes() == Shape{1});
  check_error([&] { (void)nn::Flatten()(s); }, {"flatten"});
  check_error([&] { (void)nn::Flatten(2, 3)(from_vector(Values{1, 2}, {2})); }, {"flatten"});
  check_error([&] { (void)nn::Flatten(2, 1)(x); }, {"flatten", "start_dim"});
}

TEST_CASE("probe module api: activation modules compute torch's formulas on views, GELU's approximate flag included") {
  // torch.nn.ReLU, GELU(approximate='none'|'tanh'), Tanh, SiLU, Sigmoid documented formulas.
  Values v = random_values(30, 61, -6.0, 6.0);
  v[0] = 0.0, v[1] = -0.0, v[2] = 20.0, v[3] = -20.0;
  const Tensor x = make_tensor(v, {5, 6}, TensorOptions(kFloat64), Layout::Transposed);
  const Values xv = values_of(x);
  auto apply = [&](double (*f)(double)) {
    Values out;
    for (double a : xv) out.push_back(f(a));
    return out;
  };
  check_close(nn::ReLU()(x), apply([](double a) { return a > 0 ? a : 0.0; }), 0, 0, "ReLU");
  check_close(nn::GELU()(x), apply([](double a) { return 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))); }), 1e-12, 1e-15,
              "GELU exact");
  check_close(nn::GELU(true)(x), apply([](double a) {
                return 0.5 * a * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a)));
              }),
              1e-12, 1e-15, "GELU tanh");
  check_close(nn::Tanh()(x), apply([](double a) { return std::tanh(a); }), 1e-12, 1e-15, "Tanh");
  check_close(nn::SiLU()(x), apply([](double a) { return a / (1 + std::exp(-a)); }), 1e-12, 1e-15, "SiLU");
  check_close(nn::Sigmoid()(x), apply([](double a) { return 1 / (1 + std::exp(-a)); }), 1e-12, 1e-15, "Sigmoid");
  CHECK(nn::GELU(true).extra_repr() == "approximate='tanh'");
  CHECK(nn::ReLU().named_parameters().empty());
}

TEST_CASE("probe module api: an empty Sequential is the identity (values and gradient) and prints as 'Sequential()'") {
  // torch.nn.Sequential.forward: for module in self: input = module(input); return input.
  nn::Sequential empty_seq;
  CHECK(empty_seq.size() == 0);
  CHECK(empty_seq.named_parameters().empty());
  Tensor p = param_tensor(random_values(6, 71), {2, 3});
  const Tensor view = p.transpose(0, 1);
  const Tensor y = empty_seq(view);
  CHECK(y.sizes() == Shape{3, 2});
  CHECK(values_of(y) == values_of(view));
  sum(mul(y, 2.0)).backward();
  CHECK(values_of(p.grad()) == Values(6, 2.0));
  CHECK(empty_seq.repr() == "Sequential()");
}

TEST_CASE("probe module api: the module tree prints as torch's Module.__repr__") {
  // torch module.py __repr__: extra_lines = extra_repr().split('\n'); child_lines =
  // '(' + key + '): ' + repr(child) with _addindent(2); main = name + '(' and, when there are
  // lines: a single extra line and no children on one line, else '\n  ' + '\n  '.join(lines)
  // + '\n'; then ')'. So a module with settings and children prints its settings on a line of
  // their own, and a multi-line extra_repr is indented.
  struct Tagged : nn::Module {
    std::shared_ptr<nn::Linear> fc;
    Tagged() { fc = register_module("fc", std::make_shared<nn::Linear>(2, 3)); }
    std::string type_name() const override { return "Tagged"; }
    std::string extra_repr() const override { return "tag=x"; }
  };
  struct Multi : nn::Module {
    std::string type_name() const override { return "Multi"; }
    std::string extra_repr() const override { return "a=1\nb=2"; }
  };
  struct Tree : nn::Module {
    Tree() {
      register_module("seq",
                      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                          std::make_shared<nn::Sequential>(
                              std::initializer_list<std::shared_ptr<nn::UnaryModule>>{std::make_shared<nn::ReLU>()}),
                          std::make_shared<nn::Flatten>()}));
      register_module("tagged", std::make_shared<Tagged>());
      register_module("multi", std::make_shared<Multi>());
    }
    std::string type_name() const override { return "Tree"; }
  };
  CHECK(Tagged().repr() ==
        "Tagged(\n"
        "  tag=x\n"
        "  (fc): Linear(in_features=2, out_features=3, bias=true)\n"
        ")");
  CHECK(Multi().repr() == "Multi(\n  a=1\n  b=2\n)");
  const std::string expected =
      "Tree(\n"
      "  (seq): Sequential(\n"
      "    (0): Sequential(\n"
      "      (0): ReLU()\n"
      "    )\n"
      "    (1): Flatten(start_dim=1, end_dim=-1)\n"
      "  )\n"
      "  (tagged): Tagged(\n"
      "    tag=x\n"
      "    (fc): Linear(in_features=2, out_features=3, bias=true)\n"
      "  )\n"
      "  (multi): Multi(\n"
      "    a=1\n"
      "    b=2\n"
      "  )\n"
      ")";
  Tree tree;
  CHECK(tree.repr() == expected);
  std::ostringstream os;
  os << tree;
  CHECK(os.str() == expected);
}

TEST_CASE("module api: a non-persistent buffer moves with the module but is not in state_dict") {
  // torch: register_buffer(name, t, persistent=False) adds the name to _non_persistent_buffers_set;
  // named_buffers() lists it, _apply (to/half/cuda) converts it, _save_to_state_dict skips it and
  // _load_from_state_dict's local_state leaves it out, so a state's key for it is unexpected.
  struct Rotary : nn::Module {
    Tensor w, table, steps;
    Rotary() {
      w = register_parameter("w", ones({2}));
      table = register_buffer("table", full({3}, 0.5), /*persistent=*/false);
      steps = register_buffer("steps", zeros({1}, kInt64));
    }
  };
  struct Holder : nn::Module {
    std::shared_ptr<Rotary> child;
    Holder() { child = register_module("child", std::make_shared<Rotary>()); }
  } a, b;
  CHECK(names_of(a.named_buffers()) == Names{"child.table", "child.steps"});
  CHECK(names_of(a.state_dict()) == Names{"child.w", "child.steps"});
  set_values(a.child->w, 3.0);
  set_values(b.child->table, 7.0);
  b.load_state_dict(a.state_dict());  // strict: the table is neither expected nor missing
  CHECK(values_of(b.child->w) == Values{3.0, 3.0});
  CHECK(values_of(b.child->table) == Values{7.0, 7.0, 7.0});  // its own, untouched
  std::map<std::string, Tensor> with_table{
      {"child.w", ones({2})}, {"child.steps", zeros({1}, kInt64)}, {"child.table", ones({3})}};
  check_error([&] { b.load_state_dict(with_table); }, {"unexpected keys (1)", "child.table"});
  CHECK(b.load_state_dict(with_table, /*strict=*/false).unexpected_keys == Names{"child.table"});
  a.to(kFloat64);  // converted with the module; the integer buffer keeps its dtype
  CHECK(a.child->table.dtype() == kFloat64);
  CHECK(a.child->steps.dtype() == kInt64);
  CHECK(values_of(a.child->table) == Values{0.5, 0.5, 0.5});
}

TEST_CASE("module api: register_parameter of an undefined tensor reserves the name, as torch's None") {
  // torch: register_parameter("bias", None) is what Linear(bias=False) does; the name is taken,
  // parameters() and state_dict() skip it.
  struct NoBias : nn::Module {
    Tensor weight, bias;
    NoBias() {
      weight = register_parameter("weight", ones({2, 2}));
      bias = register_parameter("bias", Tensor());
    }
    void again() { register_buffer("bias", ones({1})); }
  } m;
  CHECK(names_of(m.named_parameters()) == Names{"weight"});
  CHECK(names_of(m.state_dict()) == Names{"weight"});
  CHECK(m.num_parameters() == 4);
  check_error([&] { m.again(); }, {"'bias'", "already registered"});
  m.to(kFloat64);
  m.zero_grad(false);
  CHECK(m.weight.dtype() == kFloat64);
  CHECK_FALSE(m.bias.defined());
}

TEST_CASE("module api: apply visits children before parents, each child of a module once, as torch's Module.apply") {
  // torch: def apply(self, fn): for module in self.children(): module.apply(fn); fn(self).
  // children() skips a module registered twice under one parent (memo).
  struct Leaf : nn::Module {};
  struct Mid : nn::Module {
    Mid() {
      auto shared = register_module("a", std::make_shared<Leaf>());
      register_module("b", std::make_shared<Leaf>());
      register_module("a_again", shared);
    }
  };
  struct Top : nn::Module {
    std::shared_ptr<Mid> mid;
    Top() {
      mid = register_module("mid", std::make_shared<Mid>());
      register_module("last", std::make_shared<Leaf>());
    }
  } top;
  std::vector<const nn::Module*> order;
  top.apply([&](nn::Module& m) { order.push_back(&m); });
  const std::vector<const nn::Module*> expected{&top.get_submodule("mid.a"), &top.get_submodule("mid.b"), top.mid.get(),
                                                &top.get_submodule("last"), &top};
  CHECK(order == expected);
  // the README's use: initialize every Linear
  nn::Sequential net;
  net.push_back(std::make_shared<nn::Linear>(3, 4));
  net.push_back(std::make_shared<nn::ReLU>());
  net.push_back(std::make_shared<nn::Linear>(4, 2));
  int linears = 0;
  net.apply([&](nn::Module& m) {
    if (auto* lin = dynamic_cast<nn::Linear*>(&m)) {
      set_values(lin->weight, 0.25);
      ++linears;
    }
  });
  CHECK(linears == 2);
  for (const auto& [name, p] : net.named_parameters())
    if (name.ends_with("weight")) CHECK(values_of(p) == Values(size_t(p.numel()), 0.25));
}

TEST_CASE("module api: get_submodule walks dotted paths and names the part that is missing") {
  nn::Sequential net;
  auto inner = std::make_shared<nn::Sequential>();
  inner->push_back(std::make_shared<nn::Linear>(2, 2));
  net.push_back(inner);
  CHECK(&net.get_submodule("") == &net);
  CHECK(&net.get_submodule("0") == inner.get());
  CHECK(&net.get_submodule("0.0") == (*inner)[0].get());
  check_error([&] { net.get_submodule("0.1"); }, {"get_submodule('0.1')", "at '0'", "no submodule '1'"});
  check_error([&] { net.get_submodule("0..0"); }, {"no submodule ''"});
  check_error([&] { net.get_submodule("x"); }, {"Sequential has no submodule 'x'"});
}

TEST_CASE("module api: requires_grad_(false) freezes every parameter: no .grad, and an optimizer step leaves them") {
  // torch: Module.requires_grad_ sets p.requires_grad_ on every parameter; frozen leaves get no .grad.
  nn::Sequential net;
  auto first = std::make_shared<nn::Linear>(3, 3);
  auto second = std::make_shared<nn::Linear>(3, 1);
  net.push_back(first);
  net.push_back(second);
  first->requires_grad_(false);
  for (const Tensor& p : first->parameters()) CHECK_FALSE(p.requires_grad());
  for (const Tensor& p : second->parameters()) CHECK(p.requires_grad());
  Tensor x = ones({2, 3});
  sum(net.forward(x)).backward();
  for (const Tensor& p : first->parameters()) CHECK_FALSE(p.grad().defined());
  for (const Tensor& p : second->parameters()) CHECK(p.grad().defined());
  net.requires_grad_(true);
  for (const Tensor& p : net.parameters()) CHECK(p.requires_grad());
}

TEST_CASE("module api: an integer buffer refuses a loaded value it cannot hold; a negative batch count is caught") {
  // num_batches_tracked loaded from a float state: NaN, 2.5 or 1e30 would convert as a cast
  // does (0, 2, INT64_MAX), numbers the checkpoint never held.
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), 2.5, 1e30, -1e30}) {
    CAPTURE(bad);
    nn::BatchNorm2d bn(2);
    auto state = bn.state_dict();
    for (auto& [name, t] : state)
      if (name == "num_batches_tracked") t = full({}, bad, kFloat64);
    check_error([&] { bn.load_state_dict(state); }, {"num_batches_tracked", "not an integer int64 can store"});
    CHECK(values_of(bn.num_batches_tracked) == Values{0.0});  // nothing was written
  }
  {  // an integral float loads, as torch's cast
    nn::BatchNorm2d bn(2);
    auto state = bn.state_dict();
    for (auto& [name, t] : state)
      if (name == "num_batches_tracked") t = full({}, 7.0, kFloat32);
    bn.load_state_dict(state);
    CHECK(values_of(bn.num_batches_tracked) == Values{7.0});
  }
  // A negative count passes the load (an integer) but momentum None divides by it: refused at
  // the forward that would have made running_var negative (torch's gives -0.25 momentum).
  nn::BatchNorm2d bn(2, {.momentum = std::nullopt});
  auto state = bn.state_dict();
  for (auto& [name, t] : state)
    if (name == "num_batches_tracked") t = full({}, -5.0, kInt64);
  bn.load_state_dict(state);
  const Tensor x = arange(16, kFloat32).view({2, 2, 2, 2});
  check_error([&] { (void)bn(x); }, {"num_batches_tracked is -4", "1 / count"});
}
