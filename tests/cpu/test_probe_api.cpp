// Probes for silent wrong answers and crashes in the APIs around the ops, on the CPU:
// autograd::grad (side effects, retain_graph, unused and non-leaf inputs, views and in-place
// ops, grad_outputs), copy_/detach/requires_grad_ under autograd, checkpoint with no_grad,
// Module::load_state_dict and the safetensors round trip (bit-exact, failed saves, truncated
// and corrupted files, names), LR schedulers past their end and at tiny lengths, the
// DataLoader at its edges, clip_grad_norm_ with inf/NaN and missing gradients, size overflow
// in views, and what a training loop meets (NaN weights, checkpoint pruning). Every value is
// checked against a float64 reference computed here. A failing case here is a finding.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "nn/container.h"
#include "nn/data/dataloader.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/safetensors.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"
#include "train/checkpoints.h"
#include "train/evaluate.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

namespace fs = std::filesystem;
using Values = std::vector<double>;
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

/// A float64 leaf requiring grad holding `v` in `shape`.
Tensor leaf_of(const Values& v, const Shape& shape) {
  Tensor t = from_vector(v, shape, TensorOptions(kFloat64));
  t.requires_grad_();
  return t;
}

/// The raw bytes of t (contiguous, host).

// A module with parameters and buffers of several dtypes.
struct Mixed : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Tensor scale, count, flags, half;
  Mixed() {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2));
    scale = register_parameter("scale", zeros({4}, kFloat64));
    count = register_buffer("count", zeros({}, kInt64));
    flags = register_buffer("flags", zeros({3}, kBool));
    half = register_buffer("half", zeros({5}, kBFloat16));
  }
  std::string type_name() const override { return "Mixed"; }
};

std::map<std::string, Values> snapshot(const nn::Module& m) {
  std::map<std::string, Values> out;
  for (const auto& [name, t] : m.state_dict()) out[name] = values_of(t);
  return out;
}

void check_same_snapshot(const std::map<std::string, Values>& a, const std::map<std::string, Values>& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, v] : a) {
    const Values& w = b.at(name);
    REQUIRE(v.size() == w.size());
    for (size_t i = 0; i < v.size(); ++i)
      CHECK_MESSAGE(std::memcmp(&v[i], &w[i], sizeof(double)) == 0, name, "[", i, "] changed: ", v[i], " -> ", w[i]);
  }
}

}  // namespace

// ============================================================================================
// autograd::grad
// ============================================================================================

TEST_CASE("probe: grad leaves existing .grad of leaves and retained non-leaves bit-identical") {
  Tensor x = leaf_of({0.5, -1.25, 2.0}, {3}), w = leaf_of({1.5, 0.25, -3.0}, {3});
  x.set_grad(from_vector(Values{7, 8, 9}, {3}, TensorOptions(kFloat64)));
  Tensor h = x * w;
  h.retain_grad();
  Tensor y = sum(exp(h));
  const Tensor xg_before = x.grad();
  const TensorList g = autograd::grad({y}, {x}, {}, /*retain_graph=*/true);
  CHECK(x.grad().impl_ptr() == xg_before.impl_ptr());
  CHECK(values_of(x.grad()) == Values{7, 8, 9});
  CHECK_FALSE(w.grad().defined());
  CHECK_FALSE(h.grad().defined());
  // d/dx sum(exp(x w)) = w exp(x w)
  const Values xv = values_of(x), wv = values_of(w);
  Values expect;
  for (int i = 0; i < 3; ++i) expect.push_back(wv[i] * std::exp(xv[i] * wv[i]));
  check_close(g[0], expect, 1e-14, 0, "dy/dx");
  CHECK_FALSE(g[0].requires_grad());  // no create_graph: the result is a plain tensor
  // The graph is still there: a backward afterwards accumulates onto the old .grad.
  y.backward();
  Values acc = {7, 8, 9};
  for (int i = 0; i < 3; ++i) acc[i] += expect[i];
  check_close(x.grad(), acc, 1e-14, 0, "x.grad after backward");
}

TEST_CASE("probe: grad with retain_graph=false, then again, is a clear error; retained runs agree") {
  Tensor x = leaf_of({0.1, 0.2, 0.3}, {3});
  {
    Tensor y = sum(exp(x) * exp(x));
    const TensorList g1 = autograd::grad({y}, {x}, {}, /*retain_graph=*/true);
    const TensorList g2 = autograd::grad({y}, {x}, {}, /*retain_graph=*/false);
    CHECK(values_of(g1[0]) == values_of(g2[0]));
    check_error([&] { autograd::grad({y}, {x}); }, {"retain_graph"});
    check_error([&] { y.backward(); }, {"retain_graph"});
  }
}

TEST_CASE("probe: grad of non-leaf inputs through views and in-place ops") {
  const Values xv = {0.5, -1.0, 2.0, 0.25, -0.75, 1.5};
  Tensor x = leaf_of(xv, {2, 3});
  Tensor h = x * 3.0;        // non-leaf input
  Tensor v = h.t();          // a view (3, 2)
  Tensor z = v * 1.0;        // fresh non-leaf
  mul_(z, 2.0);              // in place on a non-leaf: z = 2 v
  Tensor loss = sum(z * z);  // = 4 sum(h^2)
  const TensorList g = autograd::grad({loss}, {x, h, z}, {}, /*retain_graph=*/true);
  Values gx, gh, gz;
  for (double a : xv) gh.push_back(8 * 3 * a), gx.push_back(8 * 3 * a * 3);
  // z is (3, 2): z[j][i] = 2 * 3 * x[i][j]; dloss/dz = 2 z
  for (int j = 0; j < 3; ++j)
    for (int i = 0; i < 2; ++i) gz.push_back(2 * 2 * 3 * xv[i * 3 + j]);
  check_close(g[0], gx, 1e-14, 0, "d/dx");
  check_close(g[1], gh, 1e-14, 0, "d/dh");
  check_close(g[2], gz, 1e-14, 0, "d/dz (after the in-place op)");
  CHECK_FALSE(x.grad().defined());
  // The same input twice, and an input that is the output itself.
  const TensorList twice = autograd::grad({loss}, {x, x, loss}, {}, /*retain_graph=*/true);
  check_close(twice[0], gx, 1e-14, 0, "first copy");
  check_close(twice[1], gx, 1e-14, 0, "second copy");
  check_close(twice[2], {1.0}, 0, 0, "d loss / d loss");
}

TEST_CASE("probe: grad with grad_outputs of another shape, count or an input without grad: clear errors") {
  Tensor x = leaf_of({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = x * x;
  check_error([&] { autograd::grad({y}, {x}, {ones({1, 3}, kFloat64)}, true); }, {"[1, 3]", "[2, 3]"});
  check_error([&] { autograd::grad({y}, {x}, {ones({6}, kFloat64)}, true); }, {"[6]", "[2, 3]"});
  check_error(
      [&] {
        autograd::grad({y}, {x}, {ones({2, 3}, kFloat64), ones({2, 3}, kFloat64)}, true);
      },
      {"1 roots", "2 gradients"});
  check_error([&] { autograd::grad({y}, {x}, {}, true); }, {"scalar"});
  Tensor plain = ones({2, 3}, kFloat64);
  check_error([&] { autograd::grad({sum(y)}, {plain}, {}, true); }, {"does not require grad"});
  // grad_outputs in float32 for a float64 output: the gradient is 2 x g, in x's dtype
  const TensorList g = autograd::grad({y}, {x}, {full({2, 3}, 0.5, kFloat32)}, true);
  CHECK(g[0].dtype() == kFloat64);
  check_close(g[0], {1, 2, 3, 4, 5, 6}, 1e-7, 0, "2 x * 0.5");
  // allow_unused with an unused non-leaf
  Tensor other = x * 2.0;
  const TensorList u = autograd::grad({sum(y)}, {other, x}, {}, true, /*allow_unused=*/true);
  CHECK_FALSE(u[0].defined());
  check_close(u[1], {2, 4, 6, 8, 10, 12}, 0, 0, "used input");
}

TEST_CASE("probe: grad through a checkpoint touches no .grad of the region's captured parameters") {
  // engine.h: inside a grad() run the nested recompute "touches no .grad".
  Tensor x = leaf_of({0.3, -0.2, 0.9}, {1, 3}), w = leaf_of({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  auto block = [&](const Tensor& in) { return tanh(matmul(in, w)); };
  const TensorList g = autograd::grad({sum(autograd::checkpoint(block, x))}, {x});
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  const TensorList ref = autograd::grad({sum(block(x))}, {x});
  check_close(g[0], values_of(ref[0]), 1e-14, 0, "dx through checkpoint");
}

TEST_CASE("probe: checkpoint with a no_grad region inside equals the plain function; under no_grad records nothing") {
  const Values xv = {0.5, -1.5, 2.0};
  auto fn = [](const Tensor& in) {
    Tensor c;
    {
      autograd::NoGradGuard ng;
      c = in * 2.0;  // a constant for autograd
    }
    return in * c;  // d/dx = c = 2x (not 4x)
  };
  Tensor x1 = leaf_of(xv, {3}), x2 = leaf_of(xv, {3});
  sum(fn(x1)).backward();
  sum(autograd::checkpoint(fn, x2)).backward();
  check_close(x1.grad(), {1.0, -3.0, 4.0}, 0, 0, "plain");
  check_close(x2.grad(), {1.0, -3.0, 4.0}, 0, 0, "checkpointed");
  {
    autograd::NoGradGuard ng;
    Tensor y = autograd::checkpoint(fn, x2);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn_name().empty());
  }
}

// ============================================================================================
// copy_, detach, requires_grad_
// ============================================================================================

TEST_CASE("probe: copy_ sends the gradient to the source, none to the overwritten values") {
  Tensor a = leaf_of({1, 2, 3}, {3}), b = leaf_of({-1, 0.5, 4}, {3}), c = leaf_of({2, 3, 5}, {3});
  Tensor y = a * a;
  y.copy_(b);
  sum(y * c).backward();
  check_close(a.grad(), {0, 0, 0}, 0, 0, "overwritten");
  check_close(b.grad(), {2, 3, 5}, 0, 0, "source");
  check_close(c.grad(), {-1, 0.5, 4}, 0, 0, "other factor");
}

TEST_CASE("probe: copy_ into a full-span view of a buffer without grad is refused, never a lost gradient") {
  // buf.t() spans buf's storage and has no view node (buf needs no grad), so the copy is
  // recorded on the view only: buf now holds src's values, but autograd does not know.
  Tensor src = leaf_of({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor buf = zeros({2, 3}, kFloat64);
  bool threw = false;
  try {
    buf.t().copy_(src);
  } catch (const Error&) { threw = true; }
  if (threw) return;  // refusing the write is a fine answer
  CHECK(values_of(buf) == Values{1, 3, 5, 2, 4, 6});
  // PyTorch: buf becomes a non-leaf (CopySlices) and src gets the gradient through it.
  CHECK_MESSAGE(buf.requires_grad(), "buf holds values of src but does not require grad");
  Tensor w = from_vector(Values{1, 10, 100, 1000, 10000, 100000}, {2, 3}, TensorOptions(kFloat64));
  Tensor loss = sum(mul(buf, w)) + sum(src * 0.0);
  loss.backward();
  // d loss / d src[i][j] = w[j][i]
  check_close(src.grad(), {1, 1000, 10, 10000, 100, 100000}, 0, 0, "gradient through buf");
}

TEST_CASE("probe: copy_ into a view of a leaf that requires grad is refused, also a view made under no_grad") {
  Tensor w = leaf_of({1, 2, 3, 4}, {2, 2});
  Tensor src = leaf_of({9, 9, 9, 9}, {2, 2});
  check_error([&] { w.t().copy_(src); }, {"copy_"});
  check_error([&] { w.view({4}).copy_(src.view({4})); }, {"copy_"});
  Tensor v;
  {
    autograd::NoGradGuard ng;
    v = w.view({4});  // an alias of the leaf, taken without grad
  }
  bool threw = false;
  try {
    v.copy_(src.view({4}));
  } catch (const Error&) { threw = true; }
  CHECK_MESSAGE(threw,
                "a leaf that requires grad was overwritten through a no_grad view while grad mode is on: ", "w is now ",
                values_of(w)[0], ", ", values_of(w)[1], ", ... and its .grad will describe old values");
  CHECK(values_of(w) == Values{1, 2, 3, 4});
}

TEST_CASE("probe: in place through a detach()ed alias of a saved tensor is caught in backward") {
  Tensor x = leaf_of({0.1, 0.2}, {2});
  Tensor y = exp(x);  // saves its output
  {
    Tensor d = y.detach();
    ops::mul_(d, 2.0);  // raw write through the alias: bumps the shared version
  }
  check_error([&] { sum(y).backward(); }, {"ExpBackward"});
  // requires_grad_ interplay
  Tensor n = x * 2.0;
  check_error([&] { n.requires_grad_(false); }, {"non-leaf"});
  check_error([&] { zeros({2}, kInt64).requires_grad_(); }, {"floating"});
  Tensor dd = n.detach();
  CHECK(dd.is_leaf());
  CHECK_FALSE(dd.requires_grad());
  dd.requires_grad_();
  sum(dd * 3.0).backward();
  check_close(dd.grad(), {3, 3}, 0, 0, "detached leaf");
  CHECK_FALSE(x.grad().defined());
}

// ============================================================================================
// load_state_dict and safetensors
// ============================================================================================

TEST_CASE("probe: load_state_dict errors name keys and shapes and change nothing") {
  Mixed m;
  {
    autograd::NoGradGuard ng;
    m.fc->weight.copy_(from_vector(Values{1, 2, 3, 4, 5, 6}, {2, 3}, TensorOptions(kFloat32)));
  }
  const auto before = snapshot(m);
  std::map<std::string, Tensor> good;
  for (const auto& [name, t] : m.state_dict()) good[name] = full_like(t, 1.0);
  // a wrong shape for one key: every other key must stay as it was
  auto bad = good;
  bad["fc.bias"] = ones({3});
  check_error([&] { m.load_state_dict(bad); }, {"fc.bias", "[3]", "[2]"});
  check_same_snapshot(before, snapshot(m));
  check_error([&] { m.load_state_dict(bad, /*strict=*/false); }, {"fc.bias"});
  check_same_snapshot(before, snapshot(m));
  // missing and unexpected
  auto missing = good;
  missing.erase("scale");
  missing["scale.typo"] = ones({4});
  check_error([&] { m.load_state_dict(missing); }, {"missing keys", "scale", "unexpected keys", "scale.typo"});
  check_same_snapshot(before, snapshot(m));
  // non-strict: loads what matches, ignores the rest
  m.load_state_dict(missing, /*strict=*/false);
  CHECK(values_of(m.fc->weight) == Values(6, 1.0));
  CHECK(values_of(m.scale) == Values(4, 0.0));
}

TEST_CASE("probe: load_state_dict with an undefined tensor names the key") {
  Mixed m;
  const auto before = snapshot(m);
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : m.state_dict()) state[name] = t.clone();
  state["fc.bias"] = Tensor();
  check_error([&] { m.load_state_dict(state); }, {"fc.bias"});
  check_same_snapshot(before, snapshot(m));
}

TEST_CASE("probe: load_state_dict converts dtypes exactly as a cast would") {
  Mixed m;
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : m.state_dict()) state[name] = t.clone();
  state["scale"] = from_vector(Values{0.1, -2.5, 1e-300, 3}, {4}, TensorOptions(kFloat32));  // f32 into f64
  state["count"] = scalar_tensor(41, TensorOptions(kInt32));
  state["flags"] = from_vector(Values{0, 2, -1}, {3}, TensorOptions(kFloat64));
  state["half"] = from_vector(Values{1, 1.00390625, 3.14159, -0.0, 65504}, {5}, TensorOptions(kFloat64));
  m.load_state_dict(state);
  check_close(m.scale, {double(0.1f), -2.5, 0.0, 3}, 0, 0, "f32 -> f64");
  CHECK(m.scale.dtype() == kFloat64);
  CHECK(m.count.dtype() == kInt64);
  CHECK(m.count.item<int64_t>() == 41);
  CHECK(values_of(m.flags) == Values{0, 1, 1});
  CHECK(m.half.dtype() == kBFloat16);
  check_close(m.half, values_of(state["half"].to(kBFloat16)), 0, 0, "f64 -> bf16");
}

TEST_CASE("probe: state_dict through safetensors is bit-exact (NaN payloads, -0, denormals, inf)") {
  Mixed a;
  {
    autograd::NoGradGuard ng;
    const double nan_payload = [] {
      uint64_t bits = 0x7ff8000000001234ull;
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }();
    a.scale.copy_(from_vector(Values{-0.0, 4.9e-324, kInf, nan_payload}, {4}, TensorOptions(kFloat64)));
    a.fc->weight.copy_(from_vector(Values{-0.0, 1e-45, -kInf, kNaN, 3.4e38, 1.0 / 3}, {2, 3}, TensorOptions(kFloat32)));
    a.count.copy_(scalar_tensor(double(int64_t(1) << 53), TensorOptions(kInt64)));
    a.flags.copy_(from_vector(Values{1, 0, 1}, {3}, TensorOptions(kBool)));
    a.half.copy_(from_vector(Values{-0.0, 1e-40, kInf, 1.5, -2}, {5}, TensorOptions(kFloat64)));
  }
  ScratchDir dir("probe_api_st");
  const std::string path = (dir.path / "m.safetensors").string();
  nn::save_safetensors(path, a.state_dict());
  const nn::SafetensorsFile f = nn::load_safetensors(path);
  Mixed b;
  b.load_state_dict(f.tensors);
  const auto sa = a.state_dict(), sb = b.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    CAPTURE(sa[i].first);
    CHECK(sa[i].second.dtype() == sb[i].second.dtype());
    CHECK(bytes_of(sa[i].second) == bytes_of(sb[i].second));
  }
  // a non-contiguous and a storage-offset tensor save as their values
  Tensor base = from_vector(Values{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}, TensorOptions(kFloat64));
  nn::save_safetensors(
      path, {{"t", base.t()}, {"n", base.narrow(0, 1, 2)}, {"e", base.select(1, 2).unsqueeze(1).expand({3, 2})}});
  const nn::SafetensorsFile g = nn::load_safetensors(path);
  CHECK(values_of(g.tensors.at("t")) == values_of(base.t()));
  CHECK(values_of(g.tensors.at("n")) == Values{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(values_of(g.tensors.at("e")) == Values{2, 2, 6, 6, 10, 10});
}

TEST_CASE("probe: a failed save leaves the file at the path as it was") {
  ScratchDir dir("probe_api_fail");
  const std::string path = (dir.path / "keep.safetensors").string();
  nn::save_safetensors(path, {{"x", ones({3})}});
  const std::string original = read_file(path);
  // an undefined tensor, a duplicate name, a reserved name: all checked before writing
  check_error([&] { nn::save_safetensors(path, {{"x", Tensor()}}); }, {"undefined"});
  check_error([&] { nn::save_safetensors(path, {{"a", ones({1})}, {"a", ones({1})}}); }, {"twice"});
  check_error([&] { nn::save_safetensors(path, {{"__metadata__", ones({1})}}); }, {"reserved"});
  CHECK(read_file(path) == original);
  // the target is a directory, the parent is a file
  const std::string sub = (dir.path / "adir").string();
  fs::create_directories(fs::path(sub) / "inner");
  check_error([&] { nn::save_safetensors(sub, {{"x", ones({3})}}); }, {sub});
  CHECK(fs::is_directory(fs::path(sub) / "inner"));
  check_error([&] { nn::save_safetensors(path + "/below", {{"x", ones({3})}}); }, {"below"});
  CHECK(read_file(path) == original);
  for (const auto& e : fs::directory_iterator(dir.path))
    CHECK_MESSAGE(e.path().filename().string().find(".tmp.") == std::string::npos, "left a temporary ", e.path());
}

TEST_CASE("probe: every truncation and many byte flips of a checkpoint load or throw frugal::Error") {
  ScratchDir dir("probe_api_trunc");
  const std::string path = (dir.path / "c.safetensors").string();
  nn::save_safetensors(path,
                       {{"w", from_vector(Values{1, 2, 3, 4, 5, 6}, {2, 3}, TensorOptions(kFloat32))},
                        {"b", ones({2}, kBFloat16)},
                        {"i", from_vector(Values{7, 8}, {2}, TensorOptions(kInt64))},
                        {"m", ones({2}, kBool)}},
                       {{"k", "v"}});
  const std::string whole = read_file(path);
  int loaded = 0, threw = 0;
  for (size_t n = 0; n < whole.size(); ++n) {
    const auto* p = reinterpret_cast<const uint8_t*>(whole.data());
    try {
      (void)nn::parse_safetensors(p, n);
      ++loaded;
    } catch (const Error&) { ++threw; }
  }
  CHECK(loaded == 0);  // no proper prefix is a valid file: the tensors must tile the data exactly
  CHECK(threw == int(whole.size()));
  uint64_t s = 12345;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad = whole;
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const size_t at = size_t(s % bad.size());
    bad[at] = char(uint8_t(bad[at]) ^ uint8_t(1u << ((s >> 20) % 8)));
    try {
      const nn::SafetensorsFile f = nn::parse_safetensors(reinterpret_cast<const uint8_t*>(bad.data()), bad.size());
      for (const auto& [name, t] : f.tensors) (void)values_of(t);
    } catch (const Error&) {}
  }
  // A file cut short on disk: a clear error naming it
  write_file(path, whole.substr(0, whole.size() - 3));
  check_error([&] { nn::load_safetensors(path); }, {path});
}

TEST_CASE("probe: save_safetensors writes only names that load_safetensors reads back") {
  // Names are JSON strings: they must be UTF-8. A save that accepts a name its own loader
  // rejects writes a checkpoint that can never be read.
  ScratchDir dir("probe_api_names");
  const std::string path = (dir.path / "n.safetensors").string();
  for (const std::string& name : {std::string("ok\xc3\xa9"), std::string("bad\xff"), std::string("half\xc3"),
                                  std::string("nul\0in", 6), std::string("")}) {
    CAPTURE(name);
    bool saved = true;
    try {
      nn::save_safetensors(path, {{name, ones({2})}});
    } catch (const Error&) { saved = false; }
    if (!saved) continue;  // refusing is fine
    std::string err;
    try {
      const nn::SafetensorsFile f = nn::load_safetensors(path);
      CHECK(f.tensors.count(name) == 1);
    } catch (const Error& e) { err = e.what(); }
    CHECK_MESSAGE(err.empty(), "saved, but the file does not load: ", err);
  }
  // the same for metadata
  bool saved = true;
  try {
    nn::save_safetensors(path, {{"x", ones({2})}}, {{"key", "value\xfe"}});
  } catch (const Error&) { saved = false; }
  if (saved) {
    std::string err;
    try {
      (void)nn::load_safetensors(path);
    } catch (const Error& e) { err = e.what(); }
    CHECK_MESSAGE(err.empty(), "saved metadata, but the file does not load: ", err);
  }
}

// ============================================================================================
// LR schedulers
// ============================================================================================

namespace {
std::vector<Tensor> one_param() { return {leaf_of({1, 2}, {2})}; }
double cosine(double base, double eta, double t, double T) {
  return eta + (base - eta) * (1 + std::cos(std::numbers::pi * t / T)) / 2;
}
}  // namespace

TEST_CASE("probe: LR schedulers past their end and at lengths 1, against closed forms") {
  const double base = 0.3;
  {  // LinearLR total_iters = 1: start at start_factor, then base forever
    auto ps = one_param();
    optim::SGD opt(ps, {.lr = base});
    optim::LinearLR s(opt, {.start_factor = 0.5, .end_factor = 1.0, .total_iters = 1});
    CHECK(opt.param_groups()[0].lr == doctest::Approx(0.15).epsilon(1e-15));
    for (int t = 1; t <= 1000; ++t) {
      s.step();
      CHECK(opt.param_groups()[0].lr == doctest::Approx(base).epsilon(1e-15));
    }
  }
  {  // LinearLR decaying to 0 stays at 0
    auto ps = one_param();
    optim::SGD opt(ps, {.lr = base});
    optim::LinearLR s(opt, {.start_factor = 1.0, .end_factor = 0.0, .total_iters = 3});
    for (int t = 0; t < 10; ++t) {
      CAPTURE(t);
      CHECK(opt.param_groups()[0].lr == doctest::Approx(base * (1.0 - std::min(t, 3) / 3.0)).epsilon(1e-15).scale(1));
      s.step();
    }
  }
  {  // StepLR far out
    auto ps = one_param();
    optim::SGD opt(ps, {.lr = base});
    optim::StepLR s(opt, {.step_size = 1, .gamma = 0.5});
    for (int t = 0; t < 1100; ++t) s.step();
    CHECK(opt.param_groups()[0].lr == base * std::pow(0.5, 1100.0));  // 0 once it underflows, never NaN
  }
  {  // WarmupCosineLR with total_steps 1, warmup 0; then past the end (the documented closed form goes on)
    auto ps = one_param();
    optim::SGD opt(ps, {.lr = base});
    optim::WarmupCosineLR s(opt, {.warmup_steps = 0, .total_steps = 1, .eta_min = 0.01});
    for (int t = 0; t < 6; ++t) {
      CAPTURE(t);
      CHECK(opt.param_groups()[0].lr == doctest::Approx(cosine(base, 0.01, t, 1)).epsilon(1e-14));
      s.step();
    }
  }
  {  // WarmupCosineLR with warmup_steps = total_steps - 1
    auto ps = one_param();
    optim::SGD opt(ps, {.lr = base});
    optim::WarmupCosineLR s(opt, {.warmup_steps = 4, .total_steps = 5, .start_factor = 0.1});
    for (int t = 0; t < 12; ++t) {
      CAPTURE(t);
      const double e = t < 4 ? base * (0.1 + 0.9 * t / 4.0) : cosine(base, 0, t - 4, 1);
      CHECK(opt.param_groups()[0].lr == doctest::Approx(e).epsilon(1e-14).scale(1e-15));
      s.step();
    }
  }
  {  // SequentialLR past its last milestone
    auto ps = one_param();
    optim::SGD opt(ps, {.lr = base});
    auto a = std::make_shared<optim::LinearLR>(opt, optim::LinearLROptions{.start_factor = 0.1, .total_iters = 2});
    auto b = std::make_shared<optim::StepLR>(opt, optim::StepLROptions{.step_size = 2, .gamma = 0.5});
    auto c = std::make_shared<optim::CosineAnnealingLR>(opt, optim::CosineAnnealingLROptions{.T_max = 3});
    optim::SequentialLR s(opt, {a, b, c}, {2, 5});
    for (int t = 0; t < 20; ++t) {
      CAPTURE(t);
      double e;
      if (t < 2) e = base * (0.1 + 0.9 * t / 2.0);
      else if (t < 5) e = base * std::pow(0.5, (t - 2) / 2);
      else e = cosine(base, 0, t - 5, 3);
      CHECK(opt.param_groups()[0].lr == doctest::Approx(e).epsilon(1e-14).scale(1e-15));
      s.step();
    }
  }
}

TEST_CASE("probe: LR scheduler load_state_dict refuses a last_epoch that is not a representable step count") {
  auto ps = one_param();
  optim::SGD opt(ps, {.lr = 0.3});
  optim::StepLR s(opt, {.step_size = 2, .gamma = 0.5});
  for (double bad : {kInf, 1e300, 9.3e18}) {
    CAPTURE(bad);
    optim::StateDict d = {{"last_epoch", scalar_tensor(bad, TensorOptions(kFloat64))},
                          {"base_lrs", from_vector(Values{0.3}, {1}, TensorOptions(kFloat64))}};
    bool threw = false;
    try {
      s.load_state_dict(d);
    } catch (const Error&) { threw = true; }
    CHECK_MESSAGE(threw, "accepted last_epoch ", bad, ": last_epoch() is now ", s.last_epoch(), " and lr ",
                  opt.param_groups()[0].lr);
    CHECK(s.last_epoch() >= 0);
  }
  check_error(
      [&] {
        s.load_state_dict({{"last_epoch", scalar_tensor(kNaN, TensorOptions(kFloat64))},
                           {"base_lrs", from_vector(Values{0.3}, {1}, TensorOptions(kFloat64))}});
      },
      {"last_epoch"});
}

// ============================================================================================
// DataLoader
// ============================================================================================

namespace {
data::TensorDataset numbered(int64_t n, int64_t width = 2) {
  Values in, tg;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < width; ++k) in.push_back(double(i * 10 + k));
    tg.push_back(double(i));
  }
  return data::TensorDataset(from_vector(in, {n, width}, TensorOptions(kFloat32)),
                             from_vector(tg, {n}, TensorOptions(kInt64)));
}

// Every batch of one pass: the targets (the sample numbers) of each.
std::vector<std::vector<int64_t>> pass_of(data::DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (data::Batch& b : loader) {
    std::vector<int64_t> ids = b.targets.tolist<int64_t>();
    const std::vector<double> in = values_of(b.inputs);
    REQUIRE(b.inputs.size(0) == int64_t(ids.size()));
    const int64_t w = b.inputs.numel() / std::max<int64_t>(b.inputs.size(0), 1);
    for (size_t r = 0; r < ids.size(); ++r)
      for (int64_t k = 0; k < w; ++k) CHECK(in[r * size_t(w) + size_t(k)] == double(ids[r] * 10 + k));
    out.push_back(ids);
  }
  return out;
}

struct Generic : data::Dataset {
  int64_t n;
  explicit Generic(int64_t n) : n(n) {}
  int64_t size() const override { return n; }
  data::Example get(int64_t i) const override {
    check_index("Generic", i, n);
    return {full({2}, double(i * 10)), scalar_tensor(double(i), TensorOptions(kInt64))};
  }
};
}  // namespace

TEST_CASE("probe: DataLoader with a batch size near INT64_MAX yields the whole dataset once") {
  data::TensorDataset ds = numbered(5);
  for (int64_t bs :
       {int64_t(6), int64_t(1) << 62, std::numeric_limits<int64_t>::max() - 1, std::numeric_limits<int64_t>::max()}) {
    CAPTURE(bs);
    data::DataLoader keep(ds, {.batch_size = bs});
    CHECK(keep.size() == 1);
    if (keep.size() == 1) {  // a negative size() would make a pass run forever
      const auto batches = pass_of(keep);
      REQUIRE(batches.size() == 1);
      CHECK(batches[0] == std::vector<int64_t>{0, 1, 2, 3, 4});
    }
    data::DataLoader drop(ds, {.batch_size = bs, .drop_last = true});
    CHECK(drop.size() == 0);
    if (drop.size() == 0) CHECK(pass_of(drop).empty());
  }
}

TEST_CASE("probe: DataLoader on empty datasets, zero-width samples, and shuffles that cover every sample once") {
  {
    data::TensorDataset empty_ds = numbered(0);
    for (bool drop : {false, true}) {
      data::DataLoader l(empty_ds, {.batch_size = 3, .shuffle = true, .drop_last = drop});
      CHECK(l.size() == 0);
      CHECK(pass_of(l).empty());
      CHECK(pass_of(l).empty());
    }
    data::DataLoader g(std::make_shared<Generic>(0), {.batch_size = 2});
    data::Batch b;
    CHECK_FALSE(g.next(b));
  }
  {  // samples with no features
    data::TensorDataset zw(zeros({5, 0}), arange(5));
    data::DataLoader l(zw, {.batch_size = 2});
    std::vector<int64_t> seen;
    for (data::Batch& b : l) {
      CHECK(b.inputs.size(1) == 0);
      for (int64_t t : b.targets.tolist<int64_t>()) seen.push_back(t);
    }
    CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4});
  }
  const int64_t n = 23;
  data::TensorDataset ds = numbered(n);
  for (int64_t bs : {1, 4, 23, 30}) {
    for (bool drop : {false, true}) {
      CAPTURE(bs);
      CAPTURE(drop);
      data::DataLoader a(ds, {.batch_size = bs, .shuffle = true, .seed = 99, .drop_last = drop, .prefetch = 0});
      data::DataLoader b(
          ds, {.batch_size = bs, .shuffle = true, .seed = 99, .drop_last = drop, .prefetch = 3, .workers = 3});
      data::DataLoader c(std::make_shared<Generic>(n),
                         {.batch_size = bs, .shuffle = true, .seed = 99, .drop_last = drop, .workers = 2});
      for (int epoch = 0; epoch < 3; ++epoch) {
        a.set_epoch(epoch), b.set_epoch(epoch), c.set_epoch(epoch);
        const auto pa = pass_of(a), pb = pass_of(b);
        std::vector<std::vector<int64_t>> pc;
        for (data::Batch& x : c) pc.push_back(x.targets.tolist<int64_t>());
        CHECK(pa == pb);
        CHECK(pa == pc);
        std::multiset<int64_t> seen;
        for (const auto& batch : pa) {
          CHECK(int64_t(batch.size()) <= bs);
          if (drop) CHECK(int64_t(batch.size()) == bs);
          seen.insert(batch.begin(), batch.end());
        }
        const int64_t expect_n = drop ? (n / bs) * bs : n;
        CHECK(int64_t(seen.size()) == expect_n);
        CHECK(int64_t(std::set<int64_t>(seen.begin(), seen.end()).size()) == expect_n);  // no repeats
        CHECK(int64_t(pa.size()) == a.size());
      }
    }
  }
}

// ============================================================================================
// clip_grad_norm_
// ============================================================================================

namespace {
// PyTorch's clip_grad_norm_ in float64: the total norm and the scaled gradients.
double ref_clip(std::vector<Values>& grads, double max_norm, double p) {
  double acc = 0;
  bool nan = false;
  for (const Values& g : grads)
    for (double x : g) {
      if (std::isnan(x)) nan = true;
      acc = std::isinf(p) ? std::max(acc, std::fabs(x)) : acc + std::pow(std::fabs(x), p);
    }
  double total = std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
  if (nan) total = kNaN;
  double coef = max_norm / (total + 1e-6);
  if (!(coef >= 1.0) || std::isnan(coef)) {
    for (Values& g : grads)
      for (double& x : g) x *= coef;
  }
  return total;
}
}  // namespace

TEST_CASE("probe: clip_grad_norm_ with inf, NaN and missing gradients, norms 1, 2, inf, mixed dtypes") {
  struct Case {
    const char* what;
    Values g0, g1;
  };
  const Case cases[] = {
      {"finite", {3, -4, 0.5}, {1e-3, -2, 7, 0}},           {"+inf", {3, kInf, 0.5}, {1e-3, -2, 7, 0}},
      {"-inf", {3, -4, 0.5}, {1e-3, -kInf, 7, 0}},          {"nan", {3, -4, kNaN}, {1e-3, -2, 7, 0}},
      {"nan and inf", {kNaN, -4, 0.5}, {1e-3, kInf, 7, 0}}, {"zeros", {0, 0, 0}, {0, 0, 0, 0}},
  };
  for (const Case& c : cases) {
    for (double p : {1.0, 2.0, kInf}) {
      for (double max_norm : {0.0, 1.0, 1e9}) {
        CAPTURE(c.what);
        CAPTURE(p);
        CAPTURE(max_norm);
        Tensor a = leaf_of({0, 0, 0}, {3});
        Tensor b = from_vector(Values{0, 0, 0, 0}, {2, 2}, TensorOptions(kFloat32));
        b.requires_grad_();
        Tensor none = leaf_of({100, 200}, {2});  // no gradient: ignored
        a.set_grad(from_vector(c.g0, {3}, TensorOptions(kFloat64)));
        b.set_grad(from_vector(c.g1, {2, 2}, TensorOptions(kFloat32)).t());  // strided gradient
        std::vector<Values> ref = {c.g0, values_of(b.grad())};
        const double expect = ref_clip(ref, max_norm, p);
        const double got = optim::clip_grad_norm_({none, a, b}, max_norm, p);
        if (std::isnan(expect)) CHECK(std::isnan(got));
        else if (std::isinf(expect)) CHECK(got == expect);
        else CHECK(got == doctest::Approx(expect).epsilon(1e-6));
        check_close(a.grad(), ref[0], 1e-12, 0, "float64 grad");
        check_close(b.grad(), ref[1], 1e-6, 0, "float32 grad");
        CHECK_FALSE(none.grad().defined());
      }
    }
  }
}

// ============================================================================================
// Size overflow
// ============================================================================================

TEST_CASE("probe: views, expand and reshape whose element count overflows are clear errors") {
  const int64_t big = int64_t(1) << 62;
  Tensor one = ones({1, 1}, kFloat32);
  check_error([&] { (void)one.expand({big, 4}); }, {"expand"});
  check_error([&] { (void)one.expand({int64_t(1) << 32, int64_t(1) << 32}); }, {"expand"});
  check_error([&] { (void)one.expand({3, -1, big, 1}).expand({2, 3, 1, big, 1}); }, {"expand"});
  check_error([&] { (void)ones({4}).view({big, big, 0}); }, {"view"});
  check_error([&] { (void)ones({4}).reshape({-1, big, big}); }, {"reshape"});
  check_error([&] { (void)zeros({0}).reshape({-1, 0}); }, {"reshape"});
  check_error([&] { (void)ones({4}).unflatten(0, {big, big}); }, {"view"});
  check_error([&] { (void)ones({4}).as_strided({2, 2}, {big, big}, 0); }, {"as_strided"});
  check_error([&] { (void)ones({4}).narrow(0, std::numeric_limits<int64_t>::max(), 2); }, {"narrow"});
  check_error([&] { (void)ones({4}).select(0, std::numeric_limits<int64_t>::min()); }, {"select"});
  check_error([&] { (void)empty({big, 8}, kFloat32); }, {"empty"});
  // numel past 2^31 through stride 0 is legal and exact, and a reduction over a part of it is right
  const int64_t n = (int64_t(1) << 31) + 5;
  Tensor e = ones({1}, kFloat64).expand({n});
  CHECK(e.numel() == n);
  CHECK(e.stride(0) == 0);
  Tensor e2 = ones({1, 1}, kFloat64).expand({int64_t(1) << 20, int64_t(1) << 20});
  CHECK(e2.numel() == int64_t(1) << 40);
  CHECK(e2.flatten().numel() == int64_t(1) << 40);  // a copy would be 8 TiB: must be refused or a view
}

// ============================================================================================
// Training loop
// ============================================================================================

TEST_CASE("probe: evaluate on a model whose weights are NaN reports a NaN loss, not a number") {
  auto model = std::make_shared<nn::Linear>(2, 3);
  {
    autograd::NoGradGuard ng;
    model->weight.copy_(full({3, 2}, kNaN));
  }
  data::TensorDataset ds(from_vector(Values{1, 2, 3, 4, 5, 6}, {3, 2}, TensorOptions(kFloat32)),
                         from_vector(Values{0, 1, 2}, {3}, TensorOptions(kInt64)));
  data::DataLoader loader(ds, {.batch_size = 2});
  const train::EvalResult r = train::evaluate(*model, loader);
  CHECK(std::isnan(r.loss));
  CHECK(r.samples == 3);
}

TEST_CASE("probe: CheckpointManager keep_last never deletes the checkpoint it has just written") {
  ScratchDir dir("probe_api_ckpt");
  auto model = std::make_shared<nn::Linear>(2, 2);
  train::CheckpointManager ckpt(dir.path.string(), {.keep_last = 1});
  const train::TrainState state{.model = model.get(), .rng = false};
  const std::string late = ckpt.save(10, state);
  CHECK(fs::exists(late));
  // A new run in the same directory (or a resume from an older file) saves a lower step.
  const std::string early = ckpt.save(5, state);
  CHECK_MESSAGE(fs::exists(early), "save(5) returned ", early, " but deleted it (keep_last kept step 10)");
}
