// Probes for silent wrong answers in REPRODUCIBILITY on the CPU: a user who seeds a run
// expects the same bits every time. (1) Run to run at a fixed thread count: every op
// below, run twice (and more) on the same input in one process, gives identical bytes;
// the sizes are chosen so the threaded paths run (kParallelGrain = 32768 elements,
// kGemmBlockMacs = 2^18 multiply-adds, clip_grad_norm_'s 2^17), and the thread counts
// include more threads than cores, where the OS schedules the team differently every
// time. (2) Across thread counts: every op gives the same bits with 1 thread and with
// several (Note [CPU determinism] in core/threads.h says what frugal guarantees; each
// check here follows from it). (3) Whole training runs (an MLP and a CNN with dropout and
// AdamW, a DataLoader with shuffle and 0 or 2 workers) repeat bit for bit. (4) The default
// generator gives the same sequence after manual_seed whatever other threads draw from
// their own generators. Every expectation is a bit-identity between two runs of the same
// computation (so no frugal number is copied into a test), or a float64 loop where a value
// is checked.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/all.h"
#include "core/threads.h"
#include "nn/activation.h"
#include "nn/batch_norm.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/data/dataloader.h"
#include "nn/data/transforms.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/pooling.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "tensor/factory.h"
#include "tensor/ops/index.h"
#include "tensor/ops/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// Sets the thread count for its lifetime (set_num_threads), restoring the previous one.
struct Threads {
  explicit Threads(int n) : before(get_num_threads()) { set_num_threads(n); }
  ~Threads() { set_num_threads(before); }
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;
  int before;
};

/// The thread counts a case runs under: one, the machine's default, and more than the
/// cores (an oversubscribed team finishes in a different order every run).
std::vector<int> thread_counts() {
  const int dflt = get_num_threads();
  std::vector<int> t{1, std::max(dflt, 2), std::max(dflt, 2) * 2 + 1};
  return t;
}

using Bytes = std::vector<std::vector<uint8_t>>;

Bytes bytes_all(const std::vector<Tensor>& ts) {
  Bytes b;
  for (const Tensor& t : ts) b.push_back(t.defined() ? bytes_of(t) : std::vector<uint8_t>{});
  return b;
}

/// Leaves the host cache full of `value`: blocks of many sizes filled, then freed, so the
/// next ops get memory that holds it. An op that reads memory it did not write then gives
/// other bits than on a fresh arena.
void dirty_host_cache(double value) {
  std::vector<Tensor> held;
  for (const int64_t n : {int64_t(1) << 22, int64_t(1) << 20, int64_t(1) << 18, int64_t(1) << 16, int64_t(1) << 14,
                          int64_t(1) << 12, int64_t(1) << 10, int64_t(256), int64_t(64), int64_t(16)})
    for (int k = 0; k < 3; ++k) held.push_back(full({n}, value, kFloat32));
}

using Fn = std::function<std::vector<Tensor>()>;

/// f's outputs' bytes under each of thread_counts(), after checking that under each count
/// `reps` runs (the second on a cache full of NaN, the third of 1e30) agree bit for bit.
std::vector<Bytes> bytes_per_thread_count(const std::string& what, const Fn& f, int reps = 3) {
  std::vector<Bytes> out;
  for (const int threads : thread_counts()) {
    Threads guard(threads);
    const Bytes first = bytes_all(f());
    for (int r = 1; r < reps; ++r) {
      dirty_host_cache(r % 2 ? std::nan("") : 1e30);
      const Bytes again = bytes_all(f());
      REQUIRE(again.size() == first.size());
      for (size_t i = 0; i < first.size(); ++i)
        CHECK_MESSAGE(again[i] == first[i], what, ": output ", i, " differs between run 0 and run ", r, " with ",
                      threads, " threads");
    }
    out.push_back(first);
  }
  return out;
}

/// Checks f is the same every run at each thread count, and the same for every thread count.
void same_for_all_threads(const std::string& what, const Fn& f, int reps = 3) {
  const std::vector<Bytes> per = bytes_per_thread_count(what, f, reps);
  const std::vector<int> counts = thread_counts();
  for (size_t t = 1; t < per.size(); ++t)
    for (size_t i = 0; i < per[0].size(); ++i)
      CHECK_MESSAGE(per[t][i] == per[0][i], what, ": output ", i, " with ", counts[t],
                    " threads differs from 1 thread's");
}

/// out = f(leaves), then backward from a fixed random gradient: {out, each leaf's grad}.
/// The leaves are fresh copies of `inputs` (requires_grad) on every call.
std::vector<Tensor> forward_backward(const std::vector<Tensor>& inputs,
                                     const std::function<Tensor(const std::vector<Tensor>&)>& f, uint64_t seed = 99) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    Tensor l = t.detach().clone();
    if (t.is_floating_point()) l.requires_grad_();
    leaves.push_back(l);
  }
  const Tensor out = f(leaves);
  out.backward(random_tensor(out.sizes(), out.dtype(), seed));
  std::vector<Tensor> r{out.detach()};
  for (const Tensor& l : leaves)
    if (l.is_floating_point()) r.push_back(l.grad());
  return r;
}

/// A uint8 tensor (storage only: written through its bytes) holding `values` mod 256.
Tensor byte_tensor(const std::vector<int64_t>& values, const Shape& sizes) {
  Tensor t = empty(sizes, {kUInt8, kCPU});
  uint8_t* p = t.data_ptr<uint8_t>();
  for (size_t k = 0; k < values.size(); ++k) p[k] = uint8_t(values[k] & 255);
  return t;
}

uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

}  // namespace

TEST_CASE("probe determinism: clip_grad_norm_ gives the same norm and gradients every run and for every thread count") {
  // Three gradients, each over clip_grad_norm_'s threading threshold (2^17 elements). Its
  // OpenMP reduction(+) added the threads' partials in the order they finished: with 5
  // threads on 2 cores the norm's last bit changed every few runs (507.509...354 vs ...355),
  // and so did the clipped gradients (Note [CPU determinism] in core/threads.h).
  const std::vector<Shape> shapes{{1 << 18}, {600, 500}, {3, 70001}};
  std::vector<std::vector<double>> values;
  for (size_t i = 0; i < shapes.size(); ++i) values.push_back(random_values(numel_of(shapes[i]), 100 + i, -1.0, 1.0));
  // float64 reference of the 2-norm, summed in long double.
  long double ss = 0;
  for (const auto& v : values)
    for (double x : v) ss += (long double)x * x;
  const double want = double(std::sqrt(ss));
  for (const double p : {2.0, 1.0, 3.0}) {
    for (const DType dt : {kFloat32, kFloat64}) {
      std::vector<uint64_t> norm_per_count;
      for (const int threads : thread_counts()) {
        Threads guard(threads);
        uint64_t first_norm = 0;
        Bytes first;
        for (int rep = 0; rep < 40; ++rep) {
          std::vector<Tensor> params;
          for (size_t i = 0; i < shapes.size(); ++i) {
            Tensor w = zeros(shapes[i], dt);
            w.requires_grad_();
            w.set_grad(make_tensor(values[i], shapes[i], dt));
            params.push_back(w);
          }
          const double norm = optim::clip_grad_norm_(params, 1.0, p);
          if (p == 2.0 && rep == 0) CHECK(norm == doctest::Approx(want).epsilon(1e-6));
          std::vector<Tensor> grads;
          for (const Tensor& w : params) grads.push_back(w.grad());
          if (rep == 0) {
            first_norm = bits_of(norm);
            first = bytes_all(grads);
            norm_per_count.push_back(first_norm);
            CHECK_MESSAGE(first_norm == norm_per_count[0], "p=", p, " ", std::string(dtype_name(dt)),
                          ": the norm with ", threads, " threads differs from 1 thread's");
            continue;
          }
          CHECK_MESSAGE(bits_of(norm) == first_norm, "p=", p, " ", std::string(dtype_name(dt)), " threads=", threads,
                        " run ", rep, ": norm ", norm, " differs from run 0's in its bits");
          CHECK_MESSAGE(bytes_all(grads) == first, "p=", p, " ", std::string(dtype_name(dt)), " threads=", threads,
                        " run ", rep, ": clipped gradients differ from run 0's");
          if (bits_of(norm) != first_norm) break;
        }
      }
    }
  }
}

TEST_CASE("probe determinism: sum/mean/var/amax along every dim and over all: the same bits every run and thread count") {
  // Shapes that take each threaded path of tensor/cpu/reduce.cpp: few long rows (a row cut
  // into chunks), many short rows, long columns with few outputs (R cut into chunks), and
  // a 3-d tensor reduced over every dim, a pair of dims and all, also as a permuted view.
  // The chunks follow the sizes only (Note [Reduction chunks follow the sizes]).
  struct Case {
    Shape shape;
    bool permuted;
  };
  const std::vector<Case> cases{
      {{3, 90001}, false}, {{90001, 3}, false}, {{33, 129, 47}, false}, {{47, 129, 33}, true}, {{1 << 20}, false}};
  for (const DType dt : {kFloat32, kFloat64}) {
    for (const Case& c : cases) {
      Tensor x = random_tensor(c.shape, dt, 7, Layout::Contiguous, -3.0, 5.0);
      if (c.permuted) x = x.permute({2, 0, 1});
      std::vector<std::vector<int64_t>> dim_sets{{}};
      for (int64_t d = 0; d < x.dim(); ++d) dim_sets.push_back({d});
      if (x.dim() == 3) dim_sets.push_back({0, 2});
      for (const auto& dims : dim_sets) {
        const std::string what = std::string(dtype_name(dt)) + " " + shape_str(c.shape) +
                                 (c.permuted ? " permuted" : "") + " dims " + std::to_string(dims.size()) +
                                 (dims.empty() ? "" : " first " + std::to_string(dims[0]));
        same_for_all_threads(what, [&] {
          return std::vector<Tensor>{sum(x, dims), mean(x, dims, true), var(x, dims), amax(x, dims)};
        });
      }
    }
  }
}

TEST_CASE("probe determinism: reductions across thread counts: the same bits, within ulps of the exact sum") {
  // Note [Reduction chunks follow the sizes]: a sum's chunks do not depend on the thread
  // count (PyTorch's at::parallel_reduce splits by threads, frugal by sizes), so its bits
  // agree across counts; amax is exact in any order. The reference: long double sums of the
  // float64 values.
  const Tensor x64 = random_tensor({3, 90001}, kFloat64, 11, Layout::Contiguous, -3.0, 5.0);
  const Tensor x32 = x64.to(kFloat32);
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{1}, {}})
    same_for_all_threads("amax", [&] {
      return std::vector<Tensor>{amax(x64, dims), amax(x64.t(), dims), amax(x32, dims),
                                 amax(x32.t().contiguous(), dims)};
    });
  same_for_all_threads("sums", [&] {
    return std::vector<Tensor>{sum(x64, {1}), sum(x32, {1}), sum(x64.t().contiguous(), {0}), sum(x64),
                               sum(x32.t(), {0})};
  });
  const std::vector<double> v = values_of(x64), v32 = values_of(x32);
  for (const int threads : thread_counts()) {
    Threads guard(threads);
    const std::vector<double> got64 = values_of(sum(x64, {1})), got32 = values_of(sum(x32, {1}));
    const std::vector<double> col64 = values_of(sum(x64.t().contiguous(), {0}));  // the same sums as columns
    for (int64_t r = 0; r < 3; ++r) {
      long double want = 0, want32 = 0;
      for (int64_t j = 0; j < 90001; ++j) {
        want += v[size_t(r * 90001 + j)];
        want32 += v32[size_t(r * 90001 + j)];
      }
      CHECK(got64[size_t(r)] == doctest::Approx(double(want)).epsilon(1e-14));
      // A column sum of few outputs is cut into 64 chunks of rows (Note [Reduction chunks
      // follow the sizes]); one accumulator down the 90001 rows erred by 1.3e-14.
      CHECK(col64[size_t(r)] == doctest::Approx(double(want)).epsilon(2e-15));
      CHECK(got32[size_t(r)] == float(want32));  // accumulated in double, rounded once: the exact sum's float
    }
  }
}

TEST_CASE("probe determinism: matmul and linear with a long K, transposed and batched, forward and backward") {
  // Note [Eigen runs single-threaded]: the blocks of a product depend only on its shape, so
  // its bits do not depend on the run or the thread count.
  for (const DType dt : {kFloat32, kFloat64}) {
    const std::string d = dtype_name(dt);
    const Tensor a = random_tensor({96, 6000}, dt, 1), b = random_tensor({6000, 80}, dt, 2);
    same_for_all_threads("matmul " + d, [&] {
      return forward_backward({a, b}, [](const std::vector<Tensor>& t) { return matmul(t[0], t[1]); });
    });
    // Transposed operands (column-major storage) and a batch whose products run one per thread.
    const Tensor at = random_tensor({96, 6000}, dt, 3, Layout::Transposed);
    const Tensor bt = random_tensor({6000, 80}, dt, 4, Layout::Transposed);
    same_for_all_threads("matmul transposed " + d, [&] {
      return std::vector<Tensor>{matmul(at, bt), matmul(bt.t(), at.t())};
    });
    const Tensor ba = random_tensor({6, 64, 700}, dt, 5), bb = random_tensor({6, 700, 72}, dt, 6);
    same_for_all_threads("bmm " + d, [&] {
      return forward_backward({ba, bb}, [](const std::vector<Tensor>& t) { return matmul(t[0], t[1]); });
    });
    // linear: x (B, T, in) with a bias; its gradient sums over B*T rows.
    const Tensor x = random_tensor({4, 50, 3000}, dt, 7), w = random_tensor({200, 3000}, dt, 8),
                 bias = random_tensor({200}, dt, 9);
    same_for_all_threads("linear " + d, [&] {
      return forward_backward({x, w}, [](const std::vector<Tensor>& t) { return linear(t[0], t[1]); });
    });
    // With a bias: its gradient is a column sum over the 200 rows, cut by the sizes only
    // (Note [Reduction chunks follow the sizes]).
    same_for_all_threads("linear with bias " + d, [&] {
      return forward_backward({x, w, bias}, [](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); });
    });
  }
}

TEST_CASE("probe determinism: conv2d forward and backward (padded, strided, grouped, 1x1) at every thread count") {
  // Note [CPU convolution threading]: chunks of samples in parallel, the weight gradient's chunk partials added
  // in chunk order: one thread, two and five agree bit for bit, run after run.
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  const std::vector<Case> cases{
      {{9, 6, 24, 24}, {12, 6, 3, 3}, {.padding = 1}},
      {{7, 8, 31, 29}, {10, 4, 5, 3}, {.stride = 2, .padding = {2, 1}, .groups = 2}},
      {{5, 16, 20, 20}, {24, 16, 1, 1}, {}},
      {{1, 12, 64, 64}, {16, 12, 3, 3}, {.padding = 1, .dilation = 2}},  // one sample: the GEMM is blocked instead
      {{40, 3, 12, 12}, {8, 3, 3, 3}, {}},                               // many samples per weight-gradient chunk
  };
  for (const DType dt : {kFloat32, kFloat64})
    for (const Case& c : cases) {
      const Tensor x = random_tensor(c.x, dt, 1), w = random_tensor(c.w, dt, 2), b = random_tensor({c.w[0]}, dt, 3);
      same_for_all_threads("conv2d " + name_of(dt, c.x) + " w " + shape_str(c.w), [&] {
        return forward_backward({x, w, b}, [&](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], c.o); });
      });
    }
}

TEST_CASE("probe determinism: layer_norm and batch_norm forward and backward, and batch norm's running statistics") {
  for (const DType dt : {kFloat32, kFloat64}) {
    const std::string d = dtype_name(dt);
    // layer_norm: many rows (its parameter gradients are summed in fixed row blocks).
    const Tensor x = random_tensor({3000, 96}, dt, 1), w = random_tensor({96}, dt, 2), b = random_tensor({96}, dt, 3);
    same_for_all_threads("layer_norm " + d, [&] {
      return forward_backward({x, w, b},
                              [](const std::vector<Tensor>& t) { return layer_norm(t[0], {96}, t[1], t[2]); });
    });
    // Few long rows, over two trailing dims, on a transposed input.
    const Tensor xt = random_tensor({4, 300, 200}, dt, 4).transpose(1, 2);
    same_for_all_threads("layer_norm transposed " + d, [&] {
      return forward_backward({xt}, [](const std::vector<Tensor>& t) { return layer_norm(t[0], {200, 300}); });
    });
    // batch_norm in training: the outputs, the gradients and the updated running statistics.
    const Tensor bx = random_tensor({16, 8, 20, 20}, dt, 5), bw = random_tensor({8}, dt, 6),
                 bb = random_tensor({8}, dt, 7);
    same_for_all_threads("batch_norm " + d, [&] {
      Tensor rm = zeros({8}, dt), rv = ones({8}, dt);
      std::vector<Tensor> r = forward_backward(
          {bx, bw, bb}, [&](const std::vector<Tensor>& t) { return batch_norm(t[0], rm, rv, t[1], t[2], true); });
      r.push_back(rm);
      r.push_back(rv);
      return r;
    });
  }
}

TEST_CASE(
    "probe determinism: softmax, log_softmax and cross_entropy forward and backward, along the last dim and dim 0") {
  for (const DType dt : {kFloat32, kFloat64}) {
    const std::string d = dtype_name(dt);
    const Tensor x = random_tensor({200, 1000}, dt, 1, Layout::Contiguous, -6.0, 6.0);
    same_for_all_threads("softmax " + d, [&] {
      return forward_backward({x}, [](const std::vector<Tensor>& t) { return softmax(t[0], -1); });
    });
    same_for_all_threads("softmax dim 0 " + d, [&] {
      return forward_backward({x}, [](const std::vector<Tensor>& t) { return softmax(t[0], 0); });
    });
    same_for_all_threads("log_softmax dim 0 of a transposed input " + d, [&] {
      return forward_backward({x.t()}, [](const std::vector<Tensor>& t) { return log_softmax(t[0], 0); });
    });
    // cross_entropy: every target, one ignored, label smoothing, mean and sum.
    std::vector<int64_t> tv(200);
    for (int64_t i = 0; i < 200; ++i) tv[size_t(i)] = (i * 37) % 1000;
    tv[5] = -100;
    const Tensor target = from_vector(tv, {200});
    same_for_all_threads("cross_entropy per row " + d, [&] {
      return forward_backward({x, target}, [&](const std::vector<Tensor>& t) {
        return cross_entropy(t[0], t[1], {.label_smoothing = 0.1, .reduction = Reduction::None});
      });
    });
    // Mean and sum add the rows' losses through sum (Note [Reduction chunks follow the sizes]).
    for (const Reduction red : {Reduction::Mean, Reduction::Sum})
      same_for_all_threads("cross_entropy " + d, [&] {
        return forward_backward({x, target}, [&](const std::vector<Tensor>& t) {
          return cross_entropy(t[0], t[1], {.label_smoothing = 0.1, .reduction = red});
        });
      });
  }
}

TEST_CASE("probe determinism: scatter_add, index_add, gather, index_select and embedding with repeated indices") {
  // Duplicate indices are the classic source of run-to-run differences (atomics: Note
  // [Scatter accumulation]); on the CPU the scatter is serial, so the bits must not depend
  // on the run or the thread count. Values: against a float64 loop.
  const int64_t V = 5, D = 16, N = 30000;  // 480000 elements, three distinct rows hit thousands of times each
  std::vector<int64_t> rows(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) rows[size_t(i)] = i % 7 == 0 ? 4 : (i * i + 3 * i) % 3;  // 4 is rarer; 3 never
  const Tensor idx1 = from_vector(rows, {N});
  std::vector<int64_t> full_rows(static_cast<size_t>(N * D));
  for (int64_t i = 0; i < N * D; ++i) full_rows[size_t(i)] = rows[size_t(i / D)];
  const Tensor idx2 = from_vector(full_rows, {N, D});
  for (const DType dt : {kFloat32, kFloat64}) {
    const std::string d = dtype_name(dt);
    const Tensor self = random_tensor({V, D}, dt, 1), src = random_tensor({N, D}, dt, 2, Layout::Transposed);
    const auto per = bytes_per_thread_count("index ops " + d, [&] {
      std::vector<Tensor> r =
          forward_backward({self, src}, [&](const std::vector<Tensor>& t) { return scatter_add(t[0], 0, idx2, t[1]); });
      for (const Tensor& t :
           forward_backward({self, src}, [&](const std::vector<Tensor>& t) { return index_add(t[0], 0, idx1, t[1]); }))
        r.push_back(t);
      // embedding backward sums the output gradient's rows per index; gather's and
      // index_select's backward scatter-add into the table the same way.
      for (const Tensor& t : forward_backward({self}, [&](const std::vector<Tensor>& t) {
             return embedding(t[0], idx1.view({100, N / 100}));
           }))
        r.push_back(t);
      for (const Tensor& t :
           forward_backward({self}, [&](const std::vector<Tensor>& t) { return gather(t[0], 0, idx2); }))
        r.push_back(t);
      for (const Tensor& t :
           forward_backward({self}, [&](const std::vector<Tensor>& t) { return index_select(t[0], 0, idx1); }))
        r.push_back(t);
      return r;
    });
    const std::vector<int> counts = thread_counts();
    for (size_t t = 1; t < per.size(); ++t)
      for (size_t i = 0; i < per[0].size(); ++i)
        CHECK_MESSAGE(per[t][i] == per[0][i], "index ops ", d, ": output ", i, " with ", counts[t],
                      " threads differs from 1 thread's");
  }
  // The float64 values: scatter_add's output and embedding's weight gradient by a loop.
  const Tensor self = random_tensor({V, D}, kFloat64, 1), src = random_tensor({N, D}, kFloat64, 2);
  const std::vector<double> sv = values_of(self), xv = values_of(src);
  std::vector<double> want = sv;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < D; ++j) want[size_t(rows[size_t(i)] * D + j)] += xv[size_t(i * D + j)];
  Threads guard(thread_counts().back());
  check_close(scatter_add(self, 0, idx2, src), want, 1e-12, 1e-12, "scatter_add float64");
  check_close(index_add(self, 0, idx1, src), want, 1e-12, 1e-12, "index_add float64");
  std::vector<double> gw(size_t(V * D), 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < D; ++j) gw[size_t(rows[size_t(i)] * D + j)] += xv[size_t(i * D + j)];
  check_close(ops::embedding_backward(src, idx1, V), gw, 1e-12, 1e-12, "embedding_backward float64");
}

TEST_CASE("probe determinism: flash_attention forward and backward, with a mask, causal and seeded dropout") {
  // Each (b, h) is one work item, handed out dynamically; dropout's mask is a function of
  // (seed, counter, position) (Note [Counter-based RNG]), so neither the run nor the thread
  // count may change a bit.
  for (const DType dt : {kFloat32, kFloat64}) {
    const std::string d = dtype_name(dt);
    const Tensor q = random_tensor({2, 5, 96, 32}, dt, 1), k = random_tensor({2, 5, 80, 32}, dt, 2),
                 v = random_tensor({2, 5, 80, 32}, dt, 3);
    std::vector<int64_t> mv(96 * 80);
    for (size_t i = 0; i < mv.size(); ++i) mv[i] = (i * 7) % 5 != 0;
    const Tensor mask = from_vector(mv, {96, 80}).to(kBool);
    for (const bool causal : {false, true})
      same_for_all_threads(std::string("flash_attention ") + d + (causal ? " causal" : " masked"), [&] {
        Generator gen(17);
        return forward_backward({q, k, v}, [&](const std::vector<Tensor>& t) {
          return flash_attention(t[0], t[1], t[2], causal ? Tensor() : mask, causal, 0.2, {}, &gen);
        });
      });
  }
}

TEST_CASE("probe determinism: gelu_mlp forward and backward") {
  for (const DType dt : {kFloat32, kFloat64}) {
    const Tensor x = random_tensor({3, 90, 256}, dt, 1), w1 = random_tensor({700, 256}, dt, 2),
                 b1 = random_tensor({700}, dt, 3), w2 = random_tensor({256, 700}, dt, 4);
    // The bias gradients are column sums, cut by the sizes only (Note [Reduction chunks follow
    // the sizes]).
    const Tensor b2 = random_tensor({256}, dt, 5);
    same_for_all_threads(std::string("gelu_mlp ") + dtype_name(dt), [&] {
      return forward_backward({x, w1, b1, w2, b2},
                              [](const std::vector<Tensor>& t) { return gelu_mlp(t[0], t[1], t[2], t[3], t[4]); });
    });
  }
}

namespace {

/// What a training run leaves: each step's loss (bits) and every parameter and buffer's bytes.
struct RunResult {
  std::vector<uint64_t> losses;
  Bytes state;
};

/// 20 steps of AdamW on `model` over `loader` (epochs as needed), with clip_grad_norm_, seeded by
/// manual_seed(seed) before the model is built: the initialisation and dropout draw from
/// the default generator.
RunResult train_20_steps(const std::function<std::shared_ptr<nn::Sequential>()>& make, data::DataLoader& loader,
                         uint64_t seed) {
  manual_seed(seed);
  const std::shared_ptr<nn::Sequential> model = make();
  model->train();
  optim::AdamW opt(model->parameters(), {.lr = 3e-3, .weight_decay = 0.05});
  RunResult r;
  for (int64_t epoch = 0; r.losses.size() < 20; ++epoch) {
    loader.set_epoch(epoch);
    for (data::Batch& b : loader) {
      opt.zero_grad();
      const Tensor loss = cross_entropy((*model)(b.inputs), b.targets);
      loss.backward();
      optim::clip_grad_norm_(model->parameters(), 0.5);
      opt.step();
      r.losses.push_back(bits_of(loss.item<double>()));
      if (r.losses.size() == 20) break;
    }
  }
  std::vector<Tensor> state;
  for (const auto& [name, p] : model->named_parameters()) state.push_back(p);
  for (const auto& [name, b] : model->named_buffers()) state.push_back(b);
  r.state = bytes_all(state);
  return r;
}

void check_same_run(const RunResult& a, const RunResult& b, const std::string& what) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    CHECK_MESSAGE(a.losses[i] == b.losses[i], what, ": the loss of step ", i, " differs");
  REQUIRE(a.state.size() == b.state.size());
  for (size_t i = 0; i < a.state.size(); ++i)
    CHECK_MESSAGE(a.state[i] == b.state[i], what, ": parameter or buffer ", i, " differs after 20 steps");
}

}  // namespace

TEST_CASE(
    "probe determinism: an MLP with dropout trained 20 steps with AdamW repeats bit for bit, 0 or 2 loader workers, any thread count") {
  // A first layer of 64 x 2560 weights takes clip_grad_norm_'s threaded path (2^17 elements).
  const Tensor x = random_tensor({320, 64}, kFloat32, 1);
  std::vector<int64_t> yv(320);
  for (size_t i = 0; i < yv.size(); ++i) yv[i] = int64_t((i * 7 + i / 3) % 10);
  const data::TensorDataset ds(x, from_vector(yv, {320}));
  auto make = [] {
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
        std::make_shared<nn::Linear>(64, 2560), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.3),
        std::make_shared<nn::Linear>(2560, 10)});
  };
  std::optional<RunResult> one_thread;  // Note [CPU determinism]: every count gives its bits
  for (const int threads : thread_counts()) {
    Threads guard(threads);
    data::DataLoader serial(ds, {.batch_size = 32, .shuffle = true, .seed = 5, .prefetch = 0});
    data::DataLoader workers(ds, {.batch_size = 32, .shuffle = true, .seed = 5, .prefetch = 2, .workers = 2});
    const RunResult first = train_20_steps(make, serial, 42);
    const std::string t = std::to_string(threads) + " threads";
    check_same_run(first, train_20_steps(make, serial, 42), "MLP run twice, " + t);
    check_same_run(first, train_20_steps(make, workers, 42), "MLP with 2 loader workers, " + t);
    if (!one_thread) one_thread = first;
    else check_same_run(*one_thread, first, "MLP with " + t + " against 1 thread");
    const RunResult other = train_20_steps(make, serial, 43);
    CHECK_MESSAGE(other.losses != first.losses, "another seed must give another run");
  }
}

TEST_CASE(
    "probe determinism: a CNN with batch norm, dropout and random augmentation repeats bit for bit, 0 or 2 workers, any thread count") {
  // Images augmented by RandomCrop and RandomHorizontalFlip in the loader's workers (each
  // sample's draws from its own generator: Note [Per-sample randomness]).
  const int64_t N = 96;
  std::vector<int64_t> pix(size_t(N * 16 * 16));
  for (size_t i = 0; i < pix.size(); ++i) pix[i] = int64_t((i * 2654435761u) >> 7) % 256;
  std::vector<int64_t> labels(static_cast<size_t>(N));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 10);
  const auto images = std::make_shared<data::ImageDataset>(byte_tensor(pix, {N, 1, 16, 16}), from_vector(labels, {N}));
  const auto augmented = std::make_shared<data::TransformedDataset>(
      images, data::Compose({data::RandomCrop(16, 2), data::RandomHorizontalFlip(), data::ToFloat()}), 9);
  auto make = [] {
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
        std::make_shared<nn::Conv2d>(1, 8, 3, nn::Conv2dModuleOptions{.padding = 1}), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::MaxPool2d>(2),
        std::make_shared<nn::Conv2d>(8, 16, 3, nn::Conv2dModuleOptions{.padding = 1}),
        std::make_shared<nn::BatchNorm2d>(16), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
        std::make_shared<nn::Flatten>(), std::make_shared<nn::Dropout>(0.25), std::make_shared<nn::Linear>(256, 10)});
  };
  std::optional<RunResult> one_thread;
  for (const int threads : thread_counts()) {
    Threads guard(threads);
    data::DataLoader serial(augmented, {.batch_size = 16, .shuffle = true, .seed = 5, .prefetch = 0});
    data::DataLoader workers(augmented, {.batch_size = 16, .shuffle = true, .seed = 5, .prefetch = 2, .workers = 2});
    const RunResult first = train_20_steps(make, serial, 7);
    const std::string t = std::to_string(threads) + " threads";
    check_same_run(first, train_20_steps(make, serial, 7), "CNN run twice, " + t);
    check_same_run(first, train_20_steps(make, workers, 7), "CNN with 2 loader workers, " + t);
    if (!one_thread) one_thread = first;
    else check_same_run(*one_thread, first, "CNN with " + t + " against 1 thread");
  }
}

TEST_CASE("probe determinism: after manual_seed the default generator's numbers ignore other threads' own generators") {
  // The sequence a user draws after manual_seed: fills large enough to run on threads, a
  // view, randint, dropout and an init. Under 1 thread alone, then under several threads
  // while another thread runs a loader whose workers augment from their own generators and
  // draws from a Generator of its own: the bytes must be the same.
  auto sequence = [] {
    manual_seed(2024);
    std::vector<Tensor> r;
    r.push_back(rand({300001}));
    r.push_back(randn({70001}, kFloat64));
    Tensor strided = zeros({400, 600});
    nn::init::normal_(strided.slice(1, 0, 600, 3), 0.0, 2.0);  // a view: element i of the dense copy
    r.push_back(strided);
    r.push_back(randint(-5, 1000, {90001}));
    r.push_back(dropout(ones({200003}), 0.3));
    r.push_back(rand({7}));
    return r;
  };
  Bytes alone;
  {
    Threads guard(1);
    alone = bytes_all(sequence());
  }
  std::vector<int64_t> pix(64 * 3 * 12 * 12);
  for (size_t i = 0; i < pix.size(); ++i) pix[i] = int64_t(i % 251);
  const auto images = std::make_shared<data::ImageDataset>(byte_tensor(pix, {64, 3, 12, 12}),
                                                           from_vector(std::vector<int64_t>(64, 1), {64}));
  const auto augmented = std::make_shared<data::TransformedDataset>(
      images,
      data::Compose({data::RandomCrop(10, 1), data::RandomHorizontalFlip(), data::ToFloat(), data::RandomErasing(0.7)}),
      3);
  auto load_all = [&](int64_t workers) {
    data::DataLoader loader(augmented, {.batch_size = 8,
                                        .shuffle = true,
                                        .seed = 1,
                                        .prefetch = workers ? 2 : 0,
                                        .workers = std::max<int64_t>(workers, 1)});
    std::vector<Tensor> batches;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      loader.set_epoch(epoch);
      for (data::Batch& b : loader) batches.push_back(b.inputs);
    }
    return bytes_all(batches);
  };
  const Bytes quiet_batches = load_all(0);  // no other thread drawing
  for (const int threads : thread_counts()) {
    Threads guard(threads);
    std::atomic<bool> started{false};
    Bytes busy_batches;
    std::thread other([&] {
      Generator own(77);
      started = true;
      for (int i = 0; i < 20; ++i) (void)rand({50000}, {}, &own);
      busy_batches = load_all(2);
      for (int i = 0; i < 20; ++i) (void)randn({50000}, {}, &own);
    });
    while (!started) std::this_thread::yield();
    for (int rep = 0; rep < 3; ++rep) CHECK_MESSAGE(bytes_all(sequence()) == alone, threads, " threads, run ", rep);
    other.join();
    CHECK_MESSAGE(busy_batches == quiet_batches, "the loader's augmentations changed while the main thread drew");
  }
}
