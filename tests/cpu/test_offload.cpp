// Offloaded saved tensors (autograd/offload.h) on the CPU, where the copies go through the
// pinned pool as memcpy (OffloadOptions::host_tensors): every output and gradient is
// compared with the same computation run without offloading (bit for bit: a round trip
// through the host changes no value), and every count with the bytes the ops save, worked
// out by hand from what each op's node keeps (MatmulBackward its two operands,
// TanhBackward its output, MulBackward its two factors).
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/offload.h"
#include "autograd/ops/all.h"
#include "memory/allocator.h"
#include "memory/pinned.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/batch_norm.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/pooling.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::offload;
using autograd::OffloadGroup;
using autograd::OffloadOptions;
using autograd::OffloadStats;

namespace {

using Block = std::function<Tensor(const Tensor&)>;

// Everything offloaded that is not a parameter, whatever its size.
const OffloadOptions kAll{.min_bytes = 0, .host_tensors = true};

// A model as a list of blocks and the parameters they use.
struct Model {
  std::vector<Block> blocks;
  std::vector<Tensor> params;
};

struct Run {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;  // the input's, then each parameter's
};

// loss = sum(y * c) through every block, each under offload() when `options` is given.
Run run(const Model& m, const Tensor& x0, uint64_t seed, const OffloadOptions* options) {
  for (const Tensor& p : m.params) p.set_grad(Tensor());
  Tensor x = x0.detach();
  x.requires_grad_();
  // The input goes through one plain op first: as a leaf that requires grad it would
  // count as a parameter and stay put.
  Tensor h = x * 1.0;
  for (const Block& b : m.blocks) h = options ? offload(b, h, *options) : b(h);
  const Tensor c = random_tensor(h.sizes(), h.dtype(), seed);
  sum(h * c).backward();
  Run r{values_of(h), {values_of(x.grad())}};
  for (const Tensor& p : m.params) r.grads.push_back(values_of(p.grad()));
  return r;
}

void check_same(const Run& got, const Run& plain) {
  CHECK_MESSAGE(got.out == plain.out, "output differs from the plain run");
  REQUIRE(got.grads.size() == plain.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i)
    CHECK_MESSAGE(got.grads[i] == plain.grads[i], "gradient ", i, " differs from the plain run");
}

void add_params(Model& m, const nn::Module& module) {
  for (const Tensor& p : module.parameters()) m.params.push_back(p);
}

Model mlp(DType dtype, int64_t depth, int64_t width) {
  manual_seed(11);
  Model m;
  for (int64_t i = 0; i < depth; ++i) {
    auto linear = std::make_shared<nn::Linear>(width, width);
    linear->to(dtype);
    add_params(m, *linear);
    m.blocks.push_back([linear](const Tensor& h) { return gelu(linear->forward(h)); });
  }
  return m;
}

// conv -> batch norm -> relu -> max pool, twice.
Model conv_net(DType dtype) {
  manual_seed(12);
  Model m;
  for (int64_t c : {3, 6}) {
    auto conv = std::make_shared<nn::Conv2d>(c, 2 * c, 3, nn::Conv2dModuleOptions{.padding = 1});
    auto bn = std::make_shared<nn::BatchNorm2d>(2 * c);
    conv->to(dtype);
    bn->to(dtype);
    add_params(m, *conv);
    add_params(m, *bn);
    m.blocks.push_back([conv, bn](const Tensor& h) { return max_pool2d(relu(bn->forward(conv->forward(h))), 2); });
  }
  return m;
}

// Pre-norm transformer blocks: x + attn(ln(x)), then + mlp(ln(x)).
Model transformer(DType dtype, int64_t blocks, int64_t dim) {
  manual_seed(13);
  Model m;
  for (int64_t i = 0; i < blocks; ++i) {
    auto ln1 = std::make_shared<nn::LayerNorm>(Shape{dim});
    auto ln2 = std::make_shared<nn::LayerNorm>(Shape{dim});
    auto attn = std::make_shared<nn::MultiheadAttention>(dim, 2, nn::MultiheadAttentionOptions{.batch_first = true});
    auto up = std::make_shared<nn::Linear>(dim, 4 * dim);
    auto down = std::make_shared<nn::Linear>(4 * dim, dim);
    for (nn::Module* mod : std::initializer_list<nn::Module*>{ln1.get(), ln2.get(), attn.get(), up.get(), down.get()}) {
      mod->to(dtype);
      add_params(m, *mod);
    }
    m.blocks.push_back([=](const Tensor& x) {
      const Tensor a = ln1->forward(x);
      const Tensor h = x + attn->forward(a, a, a).output;
      return h + down->forward(gelu(up->forward(ln2->forward(h))));
    });
  }
  return m;
}

int64_t pinned_requested() { return memory::pinned_stats().requested_bytes.current; }

}  // namespace

TEST_CASE("offload: gradients equal the plain run exactly (MLP, conv block, transformer block; f32, f64)") {
  for (DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    const Model nets[] = {mlp(dtype, 4, 16), conv_net(dtype), transformer(dtype, 2, 8)};
    const Tensor inputs[] = {random_tensor({8, 16}, dtype, 1), random_tensor({2, 3, 8, 8}, dtype, 2),
                             random_tensor({2, 5, 8}, dtype, 3)};
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      const Run plain = run(nets[i], inputs[i], 7, nullptr);
      const Run plain2 = run(nets[i], inputs[i], 7, nullptr);
      check_same(plain2, plain);  // the reference repeats itself bit for bit
      autograd::reset_offload_stats();
      const Run off = run(nets[i], inputs[i], 7, &kAll);
      check_same(off, plain);
      const OffloadStats s = autograd::offload_stats();
      CHECK(s.tensors_offloaded > 0);
      // Every copy came back, each by a prefetch: offload() restores one block ahead.
      CHECK(s.bytes_restored == s.bytes_offloaded);
      CHECK(s.on_demand == 0);
      CHECK(s.prefetched == s.tensors_offloaded);
    }
  }
}

TEST_CASE("offload: the counts are the bytes the block's ops save; parameters stay; the pinned pool holds them") {
  // tanh(x @ W): MatmulBackward saves x (64 x 128 f32 = 32 KiB) and W (a parameter,
  // 128 x 128 = 64 KiB), TanhBackward its output (64 x 128 = 32 KiB).
  const Tensor w = random_tensor({128, 128}, kFloat32, 1);
  w.requires_grad_();
  const Tensor x0 = random_tensor({64, 128}, kFloat32, 2);
  const Block block = [&](const Tensor& x) { return tanh(matmul(x, w)); };
  const int64_t act = 64 * 128 * 4, param = 128 * 128 * 4;

  // The plain run, for the gradient and the CPU arena's bytes after forward.
  std::vector<double> plain_grad;
  int64_t plain_after_forward = 0;
  {
    Tensor x = x0 * 1.0;
    Tensor y = block(x);
    plain_after_forward = memory::stats(kCPU).allocated_bytes.current;
    sum(y).backward();
    plain_grad = values_of(w.grad());
    w.set_grad(Tensor());
  }

  autograd::reset_offload_stats();
  const int64_t pinned_before = pinned_requested();
  {
    Tensor x = x0 * 1.0;
    Tensor y = offload(block, x, kAll);
    x = Tensor();  // the forward's own handle on x goes: only the saved copy is left
    OffloadStats s = autograd::offload_stats();
    CHECK(s.tensors_offloaded == 2);
    CHECK(s.bytes_offloaded == 2 * act);
    CHECK(s.bytes_kept_on_device == param);
    CHECK(s.bytes_restored == 0);
    CHECK(pinned_requested() - pinned_before == 2 * act);
    // On the "device" (here the CPU arena) x is gone, which the plain run still held
    // through MatmulBackward; y is held by the caller in both.
    CHECK(memory::stats(kCPU).allocated_bytes.current <= plain_after_forward - act);

    sum(y).backward();
    s = autograd::offload_stats();
    CHECK(s.bytes_restored == 2 * act);
    CHECK(s.prefetched == 2);
    CHECK(s.on_demand == 0);
    CHECK(s.wait_ms == 0);  // all restored ahead, none waited for
    CHECK(values_of(w.grad()) == plain_grad);
    w.set_grad(Tensor());
  }
  // The graph is gone, and with it the host copies.
  CHECK(pinned_requested() == pinned_before);
}

TEST_CASE("offload: min_bytes keeps smaller tensors on the device") {
  const Tensor w = random_tensor({32, 32}, kFloat32, 1);
  w.requires_grad_();
  const Block block = [&](const Tensor& x) { return tanh(matmul(x, w)); };
  const int64_t act = 16 * 32 * 4;  // x and the output: 2 KiB each
  for (int64_t min_bytes : {act, act + 1}) {
    CAPTURE(min_bytes);
    autograd::reset_offload_stats();
    Tensor y =
        offload(block, random_tensor({16, 32}, kFloat32, 2) * 1.0, {.min_bytes = min_bytes, .host_tensors = true});
    const OffloadStats s = autograd::offload_stats();
    const bool moved = min_bytes <= act;  // "smaller than min_bytes stay"
    CHECK(s.tensors_offloaded == (moved ? 2 : 0));
    CHECK(s.bytes_offloaded == (moved ? 2 * act : 0));
    CHECK(s.bytes_kept_on_device == 32 * 32 * 4 + (moved ? 0 : 2 * act));
  }
  // Host tensors stay where they are unless asked.
  autograd::reset_offload_stats();
  Tensor y = offload(block, random_tensor({16, 32}, kFloat32, 2) * 1.0, {.min_bytes = 0, .host_tensors = false});
  CHECK(autograd::offload_stats().tensors_offloaded == 0);
  CHECK(autograd::offload_stats().bytes_kept_on_device == 32 * 32 * 4 + 2 * act);
}

TEST_CASE("offload: a tensor saved twice is copied once, in its block or the block before") {
  const Tensor w1 = random_tensor({32, 32}, kFloat64, 1), w2 = random_tensor({32, 32}, kFloat64, 2);
  w1.requires_grad_();
  w2.requires_grad_();
  const Tensor x0 = random_tensor({8, 32}, kFloat64, 3);
  const int64_t act = 8 * 32 * 8;
  // Block 1: h * h saves h twice (MulBackward); tanh saves its output.
  // Block 2: its matmul saves that output again: shared with block 1's copy.
  const Block square_tanh = [&](const Tensor& x) {
    const Tensor h = matmul(x, w1);
    return tanh(h * h);
  };
  const Block second = [&](const Tensor& x) { return matmul(x, w2); };
  auto grads = [&](bool off) {
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    Tensor h = x0 * 1.0;
    h = off ? offload(square_tanh, h, kAll) : square_tanh(h);
    h = off ? offload(second, h, kAll) : second(h);
    sum(h).backward();
    return std::vector<std::vector<double>>{values_of(w1.grad()), values_of(w2.grad())};
  };
  const auto plain = grads(false);
  autograd::reset_offload_stats();
  CHECK(grads(true) == plain);
  const OffloadStats s = autograd::offload_stats();
  // Copies: x (block 1's matmul), h (once for two saves), h*h? no: MulBackward saves its
  // factors h, h; tanh's output t (block 1), then t again in block 2: 3 distinct tensors.
  CHECK(s.tensors_offloaded == 3);
  CHECK(s.deduplicated == 2);
  CHECK(s.bytes_offloaded == 3 * act);
  CHECK(s.bytes_restored == 3 * act);
  CHECK(s.on_demand == 0);
}

TEST_CASE("offload: views keep their layout (transposed) or are copied dense (strided)") {
  const Tensor w = random_tensor({24, 24}, kFloat64, 1);
  w.requires_grad_();
  const Block block = [&](const Tensor& x) {
    const Tensor t = tanh(x);                      // (24, 16)
    const Tensor a = matmul(t.t(), w);             // saves t.t(): a transposed, dense view
    const Tensor s = a.slice(1, 0, a.size(1), 3);  // (16, 8) of (16, 24): gaps
    return s * s;                                  // saves the strided view twice
  };
  const Tensor x0 = random_tensor({24, 16}, kFloat64, 2);
  x0.requires_grad_();  // so that tanh records (and saves) too
  auto grad_of = [&](bool off) {
    w.set_grad(Tensor());
    Tensor x = x0 * 1.0;
    sum(off ? offload(block, x, kAll) : block(x)).backward();
    return values_of(w.grad());
  };
  const auto plain = grad_of(false);
  autograd::reset_offload_stats();
  CHECK(grad_of(true) == plain);
  const OffloadStats s = autograd::offload_stats();
  // TanhBackward's t, MatmulBackward's t.t() (the same storage in another layout: a copy of
  // its own), the slice once, with the gaps of its span (from (0, 0) to (15, 21): 15 * 24 +
  // 22 elements, under kMaxGaps = 4 times its 16 x 8).
  CHECK(s.tensors_offloaded == 3);
  CHECK(s.deduplicated == 1);
  CHECK(s.bytes_offloaded == (24 * 16 + 24 * 16 + 15 * 24 + 22) * 8);
}

TEST_CASE("offload: an in-place write to a saved tensor still throws at backward") {
  const Tensor w = random_tensor({16, 16}, kFloat32, 1);
  w.requires_grad_();
  Tensor y =
      offload([&](const Tensor& x) { return tanh(matmul(x, w)); }, random_tensor({4, 16}, kFloat32, 2) * 1.0, kAll);
  // y shares its storage with the output TanhBackward saved (and offloaded).
  {
    autograd::NoGradGuard no_grad;
    mul_(y, 2.0);
  }
  check_error([&] { sum(y).backward(); }, {"TanhBackward", "modified by an in-place operation"});
}

TEST_CASE("offload: a retained graph restores again on its second backward") {
  const Model m = mlp(kFloat64, 3, 8);
  const Tensor x0 = random_tensor({4, 8}, kFloat64, 5);
  auto twice = [&](bool off) {
    for (const Tensor& p : m.params) p.set_grad(Tensor());
    Tensor h = x0 * 1.0;
    for (const Block& b : m.blocks) h = off ? offload(b, h, kAll) : b(h);
    Tensor loss = sum(h * h);
    loss.backward(Tensor(), /*retain_graph=*/true);
    loss.backward();
    std::vector<std::vector<double>> g;
    for (const Tensor& p : m.params) g.push_back(values_of(p.grad()));
    return g;
  };
  const auto plain = twice(false);
  autograd::reset_offload_stats();
  const int64_t pinned_before = pinned_requested();
  CHECK(twice(true) == plain);
  const OffloadStats s = autograd::offload_stats();
  CHECK(s.bytes_restored == 2 * s.bytes_offloaded);
  CHECK(pinned_requested() == pinned_before);
}

TEST_CASE("offload: nested with checkpoint, either way round") {
  const Model m = mlp(kFloat64, 2, 8);
  const Tensor x0 = random_tensor({4, 8}, kFloat64, 6);
  const Run plain = run(m, x0, 8, nullptr);
  const Block a = m.blocks[0], b = m.blocks[1];
  // offload(checkpoint(block)): the checkpoint's saved input goes to the host.
  // checkpoint(offload(block)): the forward saves nothing; the replay offloads and restores.
  Model nested{{[a](const Tensor& h) { return checkpoint(a, h); },
                [b](const Tensor& h) { return checkpoint([b](const Tensor& z) { return offload(b, z, kAll); }, h); }},
               m.params};
  autograd::reset_offload_stats();
  check_same(run(nested, x0, 8, &kAll), plain);
  CHECK(autograd::offload_stats().tensors_offloaded > 0);
  CHECK(autograd::offload_stats().bytes_restored == autograd::offload_stats().bytes_offloaded);
}

TEST_CASE("offload: an OffloadGroup without offload() restores on demand, or ahead with prefetch()") {
  const Tensor w = random_tensor({16, 16}, kFloat64, 1);
  w.requires_grad_();
  const Tensor x0 = random_tensor({4, 16}, kFloat64, 2);
  auto grad_of = [&](bool prefetch) {
    w.set_grad(Tensor());
    auto group = std::make_shared<OffloadGroup>(kAll);
    Tensor y;
    {
      OffloadGroup::Scope scope(group);
      y = tanh(matmul(x0 * 1.0, w));
    }
    CHECK(group->host_bytes() == 2 * 4 * 16 * 8);
    if (prefetch) group->prefetch();
    sum(y).backward();
    return values_of(w.grad());
  };
  w.set_grad(Tensor());
  sum(tanh(matmul(x0 * 1.0, w))).backward();
  const auto plain = values_of(w.grad());
  for (bool prefetch : {false, true}) {
    CAPTURE(prefetch);
    autograd::reset_offload_stats();
    CHECK(grad_of(prefetch) == plain);
    const OffloadStats s = autograd::offload_stats();
    CHECK(s.prefetched == (prefetch ? 2 : 0));
    CHECK(s.on_demand == (prefetch ? 0 : 2));
  }
}

TEST_CASE("offload: errors") {
  check_error([] { offload(nullptr, zeros({2})); }, {"offload", "empty"});
  check_error([] { OffloadGroup g({.min_bytes = -1}); }, {"offload", "min_bytes", "-1"});
  check_error([] { OffloadGroup::Scope s(nullptr); }, {"OffloadGroup::Scope", "null"});
}
