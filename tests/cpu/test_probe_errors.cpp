// Probes for bad input (docs/design.md, "Dtype dispatch": bad input gets a frugal::Error that
// names the op, the shapes, the dtypes and the devices, never a crash, a hang or a silent wrong
// answer). The first cases sweep every entry of the differentiable op table
// (tests/op_table/grad_table.h) with each input replaced in turn by an undefined Tensor, a
// bool, a uint8 (Note [Storage-only uint8]), an int64 or a float64 tensor of its shape; the
// rest go through tables of wrong shapes, out-of-range dims, negative sizes, size-0 and 0-d
// inputs, raw in-place ops on tensors that require grad, and non-finite parameters. A call
// either throws frugal::Error whose message names the op and the offending tensor, or returns
// what PyTorch returns: for a dtype it accepts, the float64 run on the same values (PyTorch
// promotes `float32 op int64` to float32 and computes on the same numbers).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/index.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/random.h"
#include "tensor/ops/reduce.h"
#include "tests/op_table/entry_util.h"
#include "tests/op_table/grad_table.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::optest;

namespace {

constexpr uint64_t kSeed = 7;
constexpr int64_t kCasesPerOp = 3;  // samples of each entry (optional inputs present or not, shapes)

/// The names an entry's error may give for a bad input k: its own ("pow(x, e)" -> "pow",
/// "Tensor::copy_" -> "copy_"), an in-place op's out-of-place name ("masked_fill" for
/// masked_fill_), "clone" for input 0 of the entries that clone it before writing into it, and
/// "copy_" for Tensor::to (a conversion is a copy: "copy_: not implemented for uint8").
std::vector<std::string> op_words(const std::string& entry, size_t k) {
  std::string s = entry.substr(0, entry.find('('));
  if (s.rfind("Tensor::", 0) == 0) s = s.substr(8);
  std::vector<std::string> w = {s};
  const bool inplace = s.back() == '_';
  if (inplace) w.push_back(s.substr(0, s.size() - 1));
  if (inplace && k == 0) w.push_back("clone");
  if (s == "to") w.push_back("copy_");
  if (s == "batch_norm_relu") w.push_back("batch_norm_add_relu");  // its name with a residual
  return w;
}
/// Ops whose result has input 0's dtype by definition (PyTorch's masked_fill and in-place
/// ops): their float64 reference is rounded to that dtype before the comparison.
bool keeps_input0_dtype(const std::string& entry) {
  const std::string s = entry.substr(0, entry.find('('));
  return s == "masked_fill" || s.back() == '_';
}
/// Ops documented to take a floating attn_mask (added to the scores) where the sampler drew a
/// bool one.
bool takes_float_mask(const std::string& entry) {
  return entry == "flash_attention" || entry == "scaled_dot_product_attention" || entry == "masked_softmax";
}
/// Ops documented to take a floating target where the sampler drew an integer one
/// (cosine_embedding_loss's y of 1 and -1, in any numeric dtype as PyTorch's).
bool takes_float_target(const std::string& entry) { return entry == "cosine_embedding_loss"; }

/// What one call did.
struct Outcome {
  enum Kind { Ok, FrugalError, OtherError } kind = Ok;
  std::string message;  // the frugal::Error's message without its location, or what() of another
  Tensor out;
};

Outcome call(const std::function<Tensor()>& f) {
  Outcome o;
  try {
    o.out = f();
  } catch (const Error& e) {
    o.kind = Outcome::FrugalError;
    o.message = std::string(e.message());
  } catch (const std::exception& e) {
    o.kind = Outcome::OtherError;
    o.message = e.what();
  }
  return o;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// "" when got equals want (float64 values) within a float32 tolerance; NaN matches NaN.
std::string differs(const Tensor& got, const Tensor& want, bool round_to_got = false) {
  if (!got.defined() || !want.defined()) return got.defined() == want.defined() ? "" : "one output is undefined";
  if (got.sizes() != want.sizes()) return "shape " + shape_str(got.sizes()) + ", expected " + shape_str(want.sizes());
  const Host g = read_host(got.detach().contiguous()), w = read_host(want.detach().contiguous());
  double peak = 1.0;
  for (double v : w.v)
    if (std::isfinite(v)) peak = std::max(peak, std::fabs(v));
  for (size_t i = 0; i < g.v.size(); ++i) {
    double b = w.v[i];
    if (round_to_got && got.dtype() == kBool) b = b != 0.0;
    if (round_to_got && is_integral(got.dtype())) b = std::trunc(b);  // as .to(): toward zero
    const double a = g.v[i];
    if (std::isnan(a) && std::isnan(b)) continue;
    if (a == b) continue;
    if (std::fabs(a - b) <= 1e-3 * (std::fabs(b) + peak)) continue;
    return cat_str("element ", i, " is ", a, ", expected ", b);
  }
  return "";
}

/// A uint8 tensor of x's shape holding |x| truncated (uint8 is written through data_ptr: every
/// cast into it is refused, Note [Storage-only uint8]).
Tensor uint8_of(const Tensor& x) {
  const Host h = read_host(x.detach());
  Tensor u = empty(x.sizes(), kUInt8);
  uint8_t* p = u.data_ptr<uint8_t>();
  for (size_t i = 0; i < h.v.size(); ++i) p[i] = uint8_t(std::fabs(h.v[i]));
  return u;
}

/// One replacement of an input.
struct Mutation {
  std::string what;  // "undefined", "bool", "uint8", "int64", "float64", "float32"
  Tensor value;      // the replacement (undefined for "undefined")
};

/// The replacements of input `x` (float32 when floating): an undefined Tensor, and other
/// dtypes of its shape holding its values (bool: x != 0; integers: truncated; uint8: |x|).
std::vector<Mutation> mutations_of(const Tensor& x) {
  std::vector<Mutation> m = {{"undefined", Tensor()}};
  const Tensor d = x.detach().to(kFloat64);
  if (x.is_floating_point()) {
    m.push_back({"bool", x.detach().to(kBool)});
    m.push_back({"uint8", uint8_of(x)});
    m.push_back({"int64", d.to(kInt64)});
    m.push_back({"float64", d.clone()});
  } else {
    m.push_back({"float32", x.to(kFloat32)});
    m.push_back({"uint8", uint8_of(x)});
  }
  return m;
}

/// The tally of a sweep: how many (op, bad input) pairs ran, and how each ended.
struct Tally {
  int64_t pairs = 0, refused = 0, accepted = 0;
  std::set<std::string> ops;
};

}  // namespace

TEST_CASE("probe errors: every differentiable op with each input undefined, bool, uint8, int64 or float64") {
  const bool verbose = std::getenv("FRUGAL_PROBE_VERBOSE") != nullptr;
  Tally tally;
  for (const GradEntry& e : grad_table()) {
    // An input that some sample leaves undefined is optional: undefined is its default.
    std::set<size_t> optional;
    for (int64_t i = 0; i < 40; ++i) {
      Rng rng(uint64_t(i) * 7919 + 1);
      const GradSample s = e.sample(rng);
      for (size_t k = 0; k < s.inputs.size(); ++k)
        if (!s.inputs[k].value.defined()) optional.insert(k);
    }
    for (int64_t c = 0; c < kCasesPerOp; ++c) {
      Rng rng(kSeed * 1000003 + uint64_t(c));
      const GradSample s = e.sample(rng);
      // The good call: float32 inputs (differentiable ones requiring grad), and its float64 twin.
      TensorList good, ref;
      for (const GradInput& gi : s.inputs) {
        Tensor g = gi.value, r = gi.value;
        if (g.defined() && g.is_floating_point()) {
          g = g.to(kFloat32);
          r = g.to(kFloat64);
          if (gi.grad) g.requires_grad_();
        }
        good.push_back(g);
        ref.push_back(r);
      }
      for (size_t k = 0; k < s.inputs.size(); ++k) {
        if (!good[k].defined()) continue;
        for (const Mutation& m : mutations_of(good[k])) {
          if (m.what == "undefined" && optional.count(k)) continue;
          // The method entries compute their arguments from the input's shape before the call
          // (an undefined input fails there); the next case calls each method on one directly.
          if (m.what == "undefined" && e.name.rfind("Tensor::", 0) == 0 && e.name != "Tensor::copy_") continue;
          TensorList in = good, in_ref = ref;
          in[k] = m.value;
          in_ref[k] = m.value.defined() ? m.value.to(kFloat64) : m.value;
          const std::string what = cat_str(e.name, " input ", k, " (", describe(good[k]), ") as ",
                                           m.value.defined() ? describe(m.value) : "undefined", ", params ", s.params);
          if (verbose) std::fprintf(stderr, "%s\n", what.c_str());
          const Outcome o = call([&] { return s.f(in); });
          ++tally.pairs;
          tally.ops.insert(e.name);
          if (o.kind == Outcome::OtherError) {
            FAIL_CHECK(what, ": threw a non-frugal exception: ", o.message);
            continue;
          }
          if (o.kind == Outcome::FrugalError) {
            ++tally.refused;
            const std::string tensor_word = m.what == "undefined" ? "undefined" : m.what;
            const std::vector<std::string> words = op_words(e.name, k);
            const bool named =
                std::any_of(words.begin(), words.end(), [&](const std::string& w) { return has(o.message, w); });
            CHECK_MESSAGE((named && has(o.message, tensor_word)), what, ": the error '", o.message, "' does not name '",
                          words[0], "' and '", tensor_word, "'");
            if (verbose) std::fprintf(stderr, "  -> error: %s\n", o.message.c_str());
            continue;
          }
          ++tally.accepted;
          if (verbose) std::fprintf(stderr, "  -> accepted: %s\n", describe(o.out).c_str());
          // Accepted: never an undefined input that is not optional, never an index or a mask
          // of a floating dtype (PyTorch refuses both); otherwise PyTorch's result, the float64
          // run on the same values (views and copies of uint8 included).
          const bool index_as_float = !good[k].is_floating_point() && m.what == "float32" &&
                                      !takes_float_mask(e.name) && !takes_float_target(e.name);
          CHECK_MESSAGE((m.what != "undefined" && !index_as_float), what, ": accepted, giving ", describe(o.out));
          if (m.what == "undefined" || index_as_float) continue;
          const Outcome want = call([&] { return s.f(in_ref); });
          REQUIRE_MESSAGE(want.kind == Outcome::Ok, what, ": the float64 run threw ", want.message);
          const std::string why = differs(o.out, want.out, k == 0 && keeps_input0_dtype(e.name));
          CHECK_MESSAGE(why.empty(), what, ": accepted, but ", why);
          // Backward through a mixed-dtype graph: each gradient in its input's dtype.
          if (o.out.requires_grad() && o.out.numel() > 0) {
            const Outcome b = call([&] {
              frugal::sum(o.out.to(kFloat64)).backward();
              return Tensor();
            });
            CHECK_MESSAGE(b.kind == Outcome::Ok, what, ": forward accepted, backward threw: ", b.message);
            for (size_t j = 0; j < in.size(); ++j)
              if (in[j].defined() && in[j].requires_grad() && in[j].grad().defined())
                CHECK_MESSAGE(in[j].grad().dtype() == in[j].dtype(), what, ": the gradient of input ", j, " is ",
                              describe(in[j].grad()), " for ", describe(in[j]));
          }
        }
      }
    }
  }
  MESSAGE(tally.pairs, " (op, bad input) calls over ", tally.ops.size(), " ops: ", tally.refused, " refused, ",
          tally.accepted, " accepted");
}

namespace {

/// A bad call and what its frugal::Error must say.
struct BadCall {
  std::string label;
  std::function<void()> call;
  std::vector<std::string> parts;  // the op's name, the offending tensor ("float32[2, 3]"), ...
};

/// Runs every call: each must throw frugal::Error (never another exception) containing its parts.
int64_t check_refused(const std::vector<BadCall>& calls) {
  for (const BadCall& c : calls) {
    const Outcome o = call([&] {
      c.call();
      return Tensor();
    });
    if (o.kind == Outcome::Ok) {
      FAIL_CHECK(c.label, ": accepted; expected a frugal::Error naming ", c.parts.empty() ? "" : c.parts[0]);
      continue;
    }
    CHECK_MESSAGE(o.kind == Outcome::FrugalError, c.label, ": threw a non-frugal exception: ", o.message);
    for (const std::string& p : c.parts)
      CHECK_MESSAGE(has(o.message, p), c.label, ": the error '", o.message, "' lacks '", p, "'");
  }
  return int64_t(calls.size());
}

Tensor f32(const Shape& s) {
  return frugal::testing::make_tensor(frugal::testing::random_values(numel_of(s), 3), s, kFloat32);
}
Tensor i64(const Shape& s, int64_t hi = 2) {
  std::vector<double> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(int64_t(i) % hi);
  return from_vector(v, s, TensorOptions(kInt64));
}

}  // namespace

TEST_CASE("probe errors: every Tensor method that is an op, on an undefined tensor, names itself") {
  const Tensor u;
  const std::vector<BadCall> calls = {
      {"view", [&] { u.view({2}); }, {"view", "undefined"}},
      {"reshape", [&] { u.reshape({2}); }, {"reshape", "undefined"}},
      {"permute", [&] { u.permute({0}); }, {"permute", "undefined"}},
      {"transpose", [&] { u.transpose(0, 1); }, {"transpose", "undefined"}},
      {"t", [&] { u.t(); }, {"t: ", "undefined"}},
      {"narrow", [&] { u.narrow(0, 0, 1); }, {"narrow", "undefined"}},
      {"slice", [&] { u.slice(0, 0, 1, 1); }, {"slice", "undefined"}},
      {"select", [&] { u.select(0, 0); }, {"select", "undefined"}},
      {"expand", [&] { u.expand({2}); }, {"expand", "undefined"}},
      {"squeeze()", [&] { u.squeeze(); }, {"squeeze", "undefined"}},
      {"squeeze(d)", [&] { u.squeeze(0); }, {"squeeze", "undefined"}},
      {"unsqueeze", [&] { u.unsqueeze(0); }, {"unsqueeze", "undefined"}},
      {"flatten", [&] { u.flatten(0, -1); }, {"flatten", "undefined"}},
      {"unflatten", [&] { u.unflatten(0, {1}); }, {"unflatten", "undefined"}},
      {"contiguous", [&] { u.contiguous(); }, {"contiguous", "undefined"}},
      {"clone", [&] { u.clone(); }, {"clone", "undefined"}},
      {"to(dtype)", [&] { u.to(kFloat64); }, {"to: ", "undefined"}},
      {"to(device)", [&] { u.to(kCPU); }, {"to: ", "undefined"}},
      {"copy_ from undefined", [&] { f32({2}).copy_(u); }, {"copy_", "undefined", "float32[2]"}},
      {"split", [&] { frugal::split(u, 1, 0); }, {"split", "undefined"}},
      {"chunk", [&] { frugal::chunk(u, 2, 0); }, {"chunk", "undefined"}},
      {"dropout p=0", [&] { frugal::dropout(u, 0.0); }, {"dropout", "undefined"}},
      {"dropout eval", [&] { frugal::dropout(u, 0.5, false); }, {"dropout", "undefined"}},
      {"add_ other", [&] { frugal::add_(f32({2}), u); }, {"add_", "undefined", "float32[2]"}},
      {"matmul",
       [&] {
         frugal::matmul(f32({2, 2}), u);
       },
       {"matmul", "undefined", "float32[2, 2]"}},
  };
  MESSAGE(check_refused(calls), " undefined-tensor calls");
}

// conv2d and the pools check their geometry from shapes alone (conv2d_geometry and
// window_geometry take Shapes, shared with CUDA), so their errors give the shapes without the
// dtype: the parts below ask for the shape there.
TEST_CASE("probe errors: shapes that do not broadcast or match name the op and both tensors") {
  const Tensor x23 = f32({2, 3}), x43 = f32({4, 3});
  Conv2dOptions co;
  const std::vector<BadCall> calls = {
      {"matmul inner dims", [&] { matmul(x23, x43); }, {"matmul", "float32[2, 3]", "float32[4, 3]"}},
      {"matmul batch dims",
       [&] {
         matmul(f32({2, 2, 3}), f32({3, 3, 2}));
       },
       {"matmul", "[2, 2, 3]", "[3, 3, 2]"}},
      {"matmul 0-d", [&] { matmul(f32({}), x23); }, {"matmul", "float32[]", "float32[2, 3]"}},
      {"linear in_features",
       [&] {
         linear(x23, f32({5, 4}));
       },
       {"linear", "float32[2, 3]", "float32[5, 4]"}},
      {"linear bias",
       [&] {
         linear(x23, f32({5, 3}), f32({4}));
       },
       {"linear", "float32[4]"}},
      {"add no broadcast", [&] { frugal::add(x23, f32({4})); }, {"add", "[2, 3]", "[4]"}},
      {"mul no broadcast", [&] { frugal::mul(x23, x43); }, {"mul", "[2, 3]", "[4, 3]"}},
      {"where no broadcast", [&] { frugal::where(frugal::gt(x23, 0.0), x23, x43); }, {"where", "[2, 3]", "[4, 3]"}},
      {"add_ into a smaller self", [&] { frugal::add_(f32({3}), x23); }, {"add_", "[2, 3]", "[3]"}},
      {"conv2d channels",
       [&] {
         conv2d(f32({1, 3, 5, 5}), f32({4, 2, 3, 3}), Tensor(), co);
       },
       {"conv2d", "[1, 3, 5, 5]", "[4, 2, 3, 3]"}},
      {"conv2d 3-D weight",
       [&] {
         conv2d(f32({1, 3, 5, 5}), f32({4, 3, 3}), Tensor(), co);
       },
       {"conv2d", "[4, 3, 3]"}},
      {"conv2d bias",
       [&] {
         conv2d(f32({1, 3, 5, 5}), f32({4, 3, 3, 3}), f32({3}), co);
       },
       {"conv2d", "float32[3]"}},
      {"conv2d kernel > input",
       [&] {
         conv2d(f32({1, 3, 2, 2}), f32({4, 3, 3, 3}), Tensor(), co);
       },
       {"conv2d", "[1, 3, 2, 2]"}},
      {"layer_norm normalized_shape", [&] { layer_norm(x23, {4}); }, {"layer_norm", "float32[2, 3]", "[4]"}},
      {"layer_norm weight", [&] { layer_norm(x23, {3}, f32({4})); }, {"layer_norm", "float32[4]"}},
      {"batch_norm running_mean",
       [&] {
         batch_norm(f32({2, 3, 2}), f32({4}), f32({3}), Tensor(), Tensor(), false);
       },
       {"batch_norm", "float32[4]"}},
      {"cross_entropy target batch",
       [&] { cross_entropy(x23, i64({3})); },
       {"cross_entropy", "float32[2, 3]", "int64[3]"}},
      {"cross_entropy target rank",
       [&] {
         cross_entropy(x23, i64({2, 1}));
       },
       {"cross_entropy", "int64[2, 1]"}},
      {"cross_entropy float target of another shape",
       [&] { cross_entropy(x23, f32({2})); },
       {"cross_entropy", "float32[2]"}},
      {"index_select float index", [&] { index_select(x23, 0, f32({2})); }, {"index_select", "float32[2]"}},
      {"index_select 2-D index",
       [&] {
         index_select(x23, 0, i64({1, 2}));
       },
       {"index_select", "int64[1, 2]"}},
      {"gather index rank", [&] { gather(x23, 1, i64({2})); }, {"gather", "int64[2]", "float32[2, 3]"}},
      {"gather float index",
       [&] {
         gather(x23, 1, f32({2, 3}));
       },
       {"gather", "float32[2, 3]"}},
      {"embedding float indices", [&] { embedding(x43, f32({2})); }, {"embedding", "float32[2]"}},
      {"embedding 1-D weight", [&] { embedding(f32({4}), i64({2})); }, {"embedding", "float32[4]"}},
      {"scatter_add src rank",
       [&] {
         scatter_add(x23, 1, i64({2, 3}), f32({6}));
       },
       {"scatter_add", "float32[6]"}},
      {"one_hot float", [&] { one_hot(f32({3}), 4); }, {"one_hot", "float32[3]"}},
      {"where float condition", [&] { frugal::where(x23, x23, x23); }, {"where", "float32[2, 3]"}},
      {"masked_fill float mask", [&] { masked_fill(x23, x23, 0.0); }, {"masked_fill", "float32[2, 3]"}},
      {"cat shapes",
       [&] {
         cat({x23, f32({2, 4})}, 0);
       },
       {"cat", "float32[2, 3]", "float32[2, 4]"}},
      {"stack shapes",
       [&] {
         stack({x23, x43}, 0);
       },
       {"stack", "float32[2, 3]", "float32[4, 3]"}},
      {"max_pool2d 2-D input", [&] { max_pool2d(x23, Int2(2, 2)); }, {"max_pool2d", "[2, 3]"}},
      {"avg_pool2d window > padded input",
       [&] {
         avg_pool2d(f32({1, 1, 2, 2}), Int2(3, 3));
       },
       {"avg_pool2d", "[1, 1, 2, 2]"}},
      {"sdpa E mismatch",
       [&] {
         scaled_dot_product_attention(f32({1, 2, 4}), f32({1, 3, 5}), f32({1, 3, 4}));
       },
       {"scaled_dot_product_attention", "float32[1, 2, 4]", "float32[1, 3, 5]"}},
      {"flash_attention S mismatch",
       [&] {
         flash_attention(f32({1, 1, 2, 4}), f32({1, 1, 3, 4}), f32({1, 1, 2, 4}));
       },
       {"flash_attention", "float32[1, 1, 3, 4]", "float32[1, 1, 2, 4]"}},
      {"masked_softmax mask shape",
       [&] { masked_softmax(x23, frugal::gt(x43, 0.0)); },
       {"masked_softmax", "[4, 3]", "[2, 3]"}},
      {"mse_loss float64 target",
       [&] {
         mse_loss(x23, f32({2, 3}).to(kFloat64));
       },
       {"mse_loss", "float32[2, 3]", "float64[2, 3]"}},
      {"copy_ no broadcast",
       [&] {
         f32({2, 3}).copy_(f32({4}));
       },
       {"copy_", "[2, 3]", "[4]"}},
  };
  MESSAGE(check_refused(calls), " mismatched-shape calls");
}

TEST_CASE("probe errors: dims out of range (rank, -rank-1) and negative sizes name the op") {
  const Tensor x = f32({2, 3, 4});
  const Tensor idx = i64({2});
  std::vector<BadCall> calls;
  for (int64_t d : {int64_t(3), int64_t(-4)}) {
    const std::string ds = std::to_string(d);
    auto add = [&](const std::string& op, std::function<void()> f) {
      calls.push_back({op + " dim " + ds, std::move(f), {op, "dim " + ds, "out of range"}});
    };
    add("sum", [=] { frugal::sum(x, {d}); });
    add("mean", [=] { frugal::mean(x, {d}); });
    add("var", [=] { frugal::var(x, {d}); });
    add("amax", [=] { frugal::amax(x, {d}); });
    add("amin", [=] { frugal::amin(x, {d}); });
    add("argmax", [=] { frugal::argmax(x, d); });
    add("argmin", [=] { frugal::argmin(x, d); });
    add("softmax", [=] { frugal::softmax(x, d); });
    add("log_softmax", [=] { frugal::log_softmax(x, d); });
    add("cat", [=] { frugal::cat({x, x}, d); });
    add("split", [=] { frugal::split(x, 1, d); });
    add("split_with_sizes", [=] { frugal::split_with_sizes(x, {1, 1}, d); });
    add("chunk", [=] { frugal::chunk(x, 2, d); });
    add("index_select", [=] { frugal::index_select(x, d, idx); });
    add("gather", [=] { frugal::gather(x, d, i64({2, 3, 4})); });
    add("scatter_add", [=] { frugal::scatter_add(x, d, i64({2, 3, 4}), x); });
    add("index_add", [=] { frugal::index_add(x, d, idx, x); });
    add("transpose", [=] { x.transpose(0, d); });
    add("narrow", [=] { x.narrow(d, 0, 1); });
    add("slice", [=] { x.slice(d, 0, 1, 1); });
    add("select", [=] { x.select(d, 0); });
    add("squeeze", [=] { x.squeeze(d); });
    add("flatten", [=] { x.flatten(0, d); });
    add("unflatten", [=] { x.unflatten(d, {1, 2}); });
    add("size", [=] { (void)x.size(d); });
    add("stride", [=] { (void)x.stride(d); });
  }
  for (int64_t d : {int64_t(4), int64_t(-5)}) {  // stack and unsqueeze take rank + 1 dims
    const std::string ds = std::to_string(d);
    calls.push_back({"stack dim " + ds, [=] { frugal::stack({x, x}, d); }, {"stack", "dim " + ds, "out of range"}});
    calls.push_back({"unsqueeze dim " + ds, [=] { x.unsqueeze(d); }, {"unsqueeze", "dim " + ds, "out of range"}});
  }
  calls.push_back({"permute repeated dim", [=] { x.permute({0, 0, 1}); }, {"permute", "[0, 0, 1]"}});
  calls.push_back({"permute dim 3", [=] { x.permute({0, 1, 3}); }, {"permute", "dim 3"}});
  calls.push_back({"sum repeated dim", [=] { frugal::sum(x, {1, -2}); }, {"sum", "dim"}});
  // Negative sizes, lengths and counts.
  calls.push_back({"view -2", [=] { x.view({-2, 12}); }, {"view", "-2"}});
  calls.push_back({"view two -1", [=] { x.view({-1, -1}); }, {"view", "-1"}});
  calls.push_back({"reshape -3", [=] { x.reshape({-3, 8}); }, {"reshape", "-3"}});
  calls.push_back({"expand -2", [=] { f32({1, 4}).expand({-2, 4}); }, {"expand", "-2"}});
  calls.push_back({"narrow length -1", [=] { x.narrow(1, 1, -1); }, {"narrow", "-1"}});
  calls.push_back({"slice step 0", [=] { x.slice(1, 0, 3, 0); }, {"slice", "step"}});
  calls.push_back({"split size -1", [=] { frugal::split(x, -1, 0); }, {"split", "-1"}});
  calls.push_back({"split_with_sizes -1",
                   [=] {
                     frugal::split_with_sizes(x, {3, -1}, 0);
                   },
                   {"split_with_sizes", "-1"}});
  calls.push_back({"chunk 0", [=] { frugal::chunk(x, 0, 0); }, {"chunk", "0"}});
  calls.push_back({"empty -1", [] { empty({2, -1}); }, {"-1"}});
  calls.push_back({"zeros -1", [] { zeros({-1}); }, {"-1"}});
  calls.push_back({"full -3", [] { full({-3}, 1.0); }, {"-3"}});
  calls.push_back({"rand -1", [] { rand({-1}); }, {"-1"}});
  calls.push_back({"randn -1", [] { randn({3, -1}); }, {"-1"}});
  calls.push_back({"randint -1", [] { randint(0, 5, {-1}); }, {"-1"}});
  calls.push_back({"arange step 0", [] { arange(0.0, 1.0, 0.0); }, {"arange", "step"}});
  calls.push_back({"unflatten product", [=] { x.unflatten(1, {2, 2}); }, {"unflatten", "[2, 2]", "float32[2, 3, 4]"}});
  calls.push_back({"adaptive_avg_pool2d 0 output",
                   [] {
                     adaptive_avg_pool2d(f32({1, 1, 4, 4}), Int2(0, 2));
                   },
                   {"adaptive_avg_pool2d"}});
  calls.push_back({"max_pool2d kernel 0", [] { max_pool2d(f32({1, 1, 4, 4}), Int2(0, 2)); }, {"max_pool2d"}});
  calls.push_back({"one_hot num_classes too small", [] { one_hot(i64({3}, 3), 2); }, {"one_hot"}});
  MESSAGE(check_refused(calls), " out-of-range calls");
}

TEST_CASE("probe errors: size-0 and 0-d inputs give PyTorch's result or a clear refusal") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Expect {
    std::string label;
    std::function<Tensor()> f;
    Shape shape;                     // PyTorch's result shape ...
    std::vector<double> values;      // ... and values (row-major), or
    std::vector<std::string> error;  // non-empty: PyTorch refuses, so must frugal, naming these
  };
  const Tensor s = full({}, 2.5);  // 0-d
  const std::vector<Expect> table = {
      // torch.sum(torch.zeros(0)) == 0; torch.mean over an empty dim is NaN.
      {"sum of (0,)", [] { return frugal::sum(f32({0})); }, {}, {0.0}, {}},
      {"mean of (0, 3) over dim 0",
       [] {
         return frugal::mean(f32({0, 3}), {0});
       },
       {3},
       {nan, nan, nan},
       {}},
      {"sum of (0, 3) over dim 1",
       [] {
         return frugal::sum(f32({0, 3}), {1});
       },
       {0},
       {},
       {}},
      // torch.amax / argmax refuse an empty reduced dim ("Expected reduction dim 0 to have non-zero size").
      {"amax of (0, 3) over dim 0",
       [] {
         return frugal::amax(f32({0, 3}), {0});
       },
       {},
       {},
       {"amax", "[0, 3]"}},
      {"amin of (0,)", [] { return frugal::amin(f32({0})); }, {}, {}, {"amin", "[0]"}},
      {"argmax of (0, 3) over dim 0",
       [] {
         return frugal::argmax(f32({0, 3}), 0);
       },
       {},
       {},
       {"argmax", "[0, 3]"}},
      {"amax of (0, 3) over dim 1",
       [] {
         return frugal::amax(f32({0, 3}), {1});
       },
       {0},
       {},
       {}},
      // 0-d: a reduction over dim 0 or -1 is the value; softmax of a scalar is 1, log_softmax 0.
      {"sum of 0-d over dim -1", [&] { return frugal::sum(s, {-1}); }, {}, {2.5}, {}},
      {"amax of 0-d", [&] { return frugal::amax(s, {0}); }, {}, {2.5}, {}},
      {"softmax of 0-d", [&] { return frugal::softmax(s, 0); }, {}, {1.0}, {}},
      {"log_softmax of 0-d", [&] { return frugal::log_softmax(s, -1); }, {}, {0.0}, {}},
      {"argmax of 0-d", [&] { return frugal::argmax(s, 0); }, {}, {0.0}, {}},
      // torch.var of one element with correction 1 is NaN (0 / 0), as is var of a 0-d tensor.
      {"var of (1,)", [] { return frugal::var(f32({1})); }, {}, {nan}, {}},
      {"softmax of (0, 3)",
       [] {
         return frugal::softmax(f32({0, 3}), 1);
       },
       {0, 3},
       {},
       {}},
      {"softmax of (3, 0)",
       [] {
         return frugal::softmax(f32({3, 0}), 1);
       },
       {3, 0},
       {},
       {}},
      // (2, 0) @ (0, 3) is zeros(2, 3).
      {"matmul with k = 0",
       [] {
         return matmul(f32({2, 0}), f32({0, 3}));
       },
       {2, 3},
       {0, 0, 0, 0, 0, 0},
       {}},
      {"linear of (0, 3)",
       [] {
         return linear(f32({0, 3}), f32({2, 3}));
       },
       {0, 2},
       {},
       {}},
      {"layer_norm of (0, 4)",
       [] {
         return layer_norm(f32({0, 4}), {4});
       },
       {0, 4},
       {},
       {}},
      // F.cross_entropy of an empty batch: mean NaN (0 / 0), sum 0.
      {"cross_entropy mean of N = 0",
       [] {
         return cross_entropy(f32({0, 3}), i64({0}));
       },
       {},
       {nan},
       {}},
      {"cross_entropy sum of N = 0",
       [] {
         CrossEntropyOptions o;
         o.reduction = Reduction::Sum;
         return cross_entropy(f32({0, 3}), i64({0}), o);
       },
       {},
       {0.0},
       {}},
      {"mse_loss mean of (0,)", [] { return mse_loss(f32({0}), f32({0})); }, {}, {nan}, {}},
      {"index_select with no indices",
       [] {
         return index_select(f32({2, 3}), 0, i64({0}));
       },
       {0, 3},
       {},
       {}},
      {"embedding of no ids",
       [] {
         return embedding(f32({4, 3}), i64({0}));
       },
       {0, 3},
       {},
       {}},
      {"conv2d of N = 0",
       [] {
         return conv2d(f32({0, 2, 4, 4}), f32({3, 2, 3, 3}));
       },
       {0, 3, 2, 2},
       {},
       {}},
      {"cat of 0-d",
       [&] {
         return cat({s, s});
       },
       {},
       {},
       {"cat", "float32[]"}},
      {"max_pool2d of H = 0",
       [] {
         return max_pool2d(f32({1, 1, 0, 4}), Int2(1, 1));
       },
       {},
       {},
       {"max_pool2d", "[1, 1, 0, 4]"}},
      // F.batch_norm in training refuses one value per channel ("Expected more than 1 value per
      // channel when training"): the batch variance would be 0 and every output 0.
      {"batch_norm training on one value per channel",
       [] {
         return batch_norm(f32({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true);
       },
       {},
       {},
       {"batch_norm", "[1, 3]"}},
  };
  for (const Expect& e : table) {
    const Outcome o = call(e.f);
    if (!e.error.empty()) {
      CHECK_MESSAGE(
          o.kind == Outcome::FrugalError, e.label, ": expected a frugal::Error, got ",
          o.kind == Outcome::Ok ? "the result " + describe(o.out) + " " + str(std::vector<int64_t>()) : o.message);
      for (const std::string& p : e.error)
        if (o.kind == Outcome::FrugalError)
          CHECK_MESSAGE(has(o.message, p), e.label, ": '", o.message, "' lacks '", p, "'");
      continue;
    }
    REQUIRE_MESSAGE(o.kind == Outcome::Ok, e.label, ": threw ", o.message);
    CHECK_MESSAGE(o.out.sizes() == e.shape, e.label, ": shape ", shape_str(o.out.sizes()), ", PyTorch's ",
                  shape_str(e.shape));
    if (o.out.sizes() != e.shape) continue;
    const Host h = read_host(o.out.detach());
    for (size_t i = 0; i < e.values.size(); ++i)
      CHECK_MESSAGE((h.v[i] == e.values[i] || (std::isnan(h.v[i]) && std::isnan(e.values[i])) ||
                     std::fabs(h.v[i] - e.values[i]) < 1e-6),
                    e.label, ": element ", i, " is ", h.v[i], ", PyTorch's ", e.values[i]);
  }
  MESSAGE(table.size(), " size-0 and 0-d calls");
}

TEST_CASE("probe errors: a raw in-place op on a tensor saved for backward makes that backward throw") {
  // The raw ops (tensor/ops) are autograd's no-grad path (optimizer steps), as torch.no_grad()
  // writes are: allowed on a tensor that requires grad, but each bumps the version, so a node
  // that saved the old value refuses to run (Note [Saved tensor versions]) instead of using the
  // new one. y = x * x saves x.
  const std::vector<std::pair<std::string, std::function<void(const Tensor&)>>> writes = {
      {"ops::add_", [](const Tensor& x) { ops::add_(x, 1.0); }},
      {"ops::sub_", [](const Tensor& x) { ops::sub_(x, f32({3})); }},
      {"ops::mul_", [](const Tensor& x) { ops::mul_(x, 2.0); }},
      {"ops::div_", [](const Tensor& x) { ops::div_(x, f32({3})); }},
      {"ops::masked_fill_", [](const Tensor& x) { ops::masked_fill_(x, ops::gt(x, 0.0), 0.0); }},
      {"ops::fill_", [](const Tensor& x) { ops::fill_(x, 3.0); }},
      {"ops::zero_", [](const Tensor& x) { ops::zero_(x); }},
      // (ops::copy_into, the primitive under clone() and to(), is documented not to bump the
      // version; Tensor::copy_ does, also under NoGradGuard, as torch.no_grad(): x.copy_(src).)
      {"copy_ under NoGradGuard",
       [](const Tensor& x) {
         autograd::NoGradGuard no_grad;
         x.copy_(f32({3}));
       }},
      {"ops::uniform_", [](const Tensor& x) { ops::uniform_(x, 0.0, 1.0); }},
      {"ops::normal_", [](const Tensor& x) { ops::normal_(x, 0.0, 1.0); }},
      {"ops::scatter_add_", [](const Tensor& x) { ops::scatter_add_(x, 0, i64({3}, 3), f32({3})); }},
      {"a view's ops::add_", [](const Tensor& x) { ops::add_(x.detach().slice(0, 0, 2, 1), 1.0); }},
  };
  for (const auto& [name, write] : writes) {
    Tensor x = f32({3});
    x.requires_grad_();
    const Tensor y = frugal::mul(x, x);
    const Outcome w = call([&] {
      write(x);
      return Tensor();
    });
    REQUIRE_MESSAGE(w.kind == Outcome::Ok, name, ": the write on a tensor that requires grad threw ", w.message);
    const Outcome o = call([&] {
      frugal::sum(y).backward();
      return Tensor();
    });
    CHECK_MESSAGE(o.kind == Outcome::FrugalError, name, ": backward after the write ",
                  o.kind == Outcome::Ok ? "ran with the new values" : "threw " + o.message);
    if (o.kind == Outcome::FrugalError)
      CHECK_MESSAGE((has(o.message, "MulBackward") && has(o.message, "float32[3]")), name, ": '", o.message, "'");
  }
}

TEST_CASE("probe errors: a raw op that views a tensor requiring grad says to call the differentiable op") {
  // The raw reductions and matmul view their inputs with as_strided, which autograd refuses
  // for a tensor that requires grad; the refusal must point at the cause (a raw op called
  // where the differentiable one was meant), not only at as_strided.
  Tensor x = f32({2, 3});
  x.requires_grad_();
  const std::vector<std::pair<std::string, std::function<Tensor()>>> raw_calls = {
      {"ops::sum", [&] { return ops::sum(x, {1}); }},
      {"ops::matmul", [&] { return ops::matmul(x.transpose(0, 1), f32({2, 4})); }},
  };
  for (const auto& [name, run] : raw_calls) {
    const Outcome o = call(run);
    CHECK_MESSAGE(o.kind == Outcome::FrugalError, name, ": ", o.message);
    CHECK_MESSAGE((has(o.message, "frugal::ops") && has(o.message, "autograd/ops/all.h") &&
                   has(o.message, "requires grad")),
                  name, ": '", o.message, "'");
  }
  autograd::NoGradGuard no_grad;  // the advice works: under no-grad the raw op runs
  CHECK(ops::sum(x, {1}).sizes() == Shape{2});
}

TEST_CASE("probe errors: NaN, inf and out-of-range parameters that must be finite are refused, naming the op") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Tensor x = f32({2, 3});
  auto param = [] {
    Tensor p = f32({3});
    p.requires_grad_();
    return p;
  };
  std::vector<BadCall> calls;
  for (double v : {nan, inf, -inf}) {
    const std::string vs = cat_str(v);  // "nan", "inf", "-inf"
    calls.push_back({"dropout p " + vs, [=] { frugal::dropout(x, v); }, {"dropout", vs}});
    calls.push_back({"dropout p " + vs + " in eval", [=] { frugal::dropout(x, v, false); }, {"dropout", vs}});
    calls.push_back({"sdpa dropout_p " + vs,
                     [=] { scaled_dot_product_attention(x, x, x, Tensor(), false, v); },
                     {"scaled_dot_product_attention", vs}});
    calls.push_back({"flash_attention dropout_p " + vs,
                     [=] {
                       flash_attention(f32({1, 1, 2, 4}), f32({1, 1, 2, 4}), f32({1, 1, 2, 4}), Tensor(), false, v);
                     },
                     {"flash_attention", vs}});
    calls.push_back({"layer_norm eps " + vs, [=] { layer_norm(x, {3}, Tensor(), Tensor(), v); }, {"layer_norm", vs}});
    calls.push_back({"batch_norm eps " + vs,
                     [=] {
                       batch_norm(f32({2, 3}), f32({3}), ones({3}), Tensor(), Tensor(), true, 0.1, v);
                     },
                     {"batch_norm", vs}});
    calls.push_back({"batch_norm momentum " + vs,
                     [=] {
                       batch_norm(f32({2, 3}), f32({3}), ones({3}), Tensor(), Tensor(), true, v);
                     },
                     {"batch_norm", vs}});
    calls.push_back({"cross_entropy label_smoothing " + vs,
                     [=] {
                       CrossEntropyOptions o;
                       o.label_smoothing = v;
                       cross_entropy(x, i64({2}), o);
                     },
                     {"cross_entropy", vs}});
    calls.push_back({"SGD lr " + vs,
                     [=] {
                       optim::SGDOptions o;
                       o.lr = v;
                       optim::SGD opt({param()}, o);
                     },
                     {"SGD", vs}});
    calls.push_back({"SGD momentum " + vs,
                     [=] {
                       optim::SGDOptions o;
                       o.momentum = v;
                       optim::SGD opt({param()}, o);
                     },
                     {"SGD", vs}});
    calls.push_back({"AdamW lr " + vs,
                     [=] {
                       optim::AdamWOptions o;
                       o.lr = v;
                       optim::AdamW opt({param()}, o);
                     },
                     {"AdamW", vs}});
    calls.push_back({"AdamW beta1 " + vs,
                     [=] {
                       optim::AdamWOptions o;
                       o.beta1 = v;
                       optim::AdamW opt({param()}, o);
                     },
                     {"AdamW", vs}});
    calls.push_back({"AdamW eps " + vs,
                     [=] {
                       optim::AdamWOptions o;
                       o.eps = v;
                       optim::AdamW opt({param()}, o);
                     },
                     {"AdamW", vs}});
    calls.push_back({"AdamW weight_decay " + vs,
                     [=] {
                       optim::AdamWOptions o;
                       o.weight_decay = v;
                       optim::AdamW opt({param()}, o);
                     },
                     {"AdamW", vs}});
  }
  calls.push_back({"dropout p 1.5", [=] { frugal::dropout(x, 1.5); }, {"dropout", "1.5"}});
  calls.push_back({"dropout p -0.1", [=] { frugal::dropout(x, -0.1); }, {"dropout", "-0.1"}});
  calls.push_back({"layer_norm eps -1", [=] { layer_norm(x, {3}, Tensor(), Tensor(), -1.0); }, {"layer_norm", "-1"}});
  calls.push_back({"SGD lr -1",
                   [=] {
                     optim::SGDOptions o;
                     o.lr = -1.0;
                     optim::SGD opt({param()}, o);
                   },
                   {"SGD", "-1"}});
  MESSAGE(check_refused(calls), " parameter calls");
}
