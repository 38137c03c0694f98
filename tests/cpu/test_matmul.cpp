// matmul, mm, bmm and linear on the CPU against a naive float64 triple loop.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16};

struct Reference {
  std::vector<double> values;
  Shape shape;
};

// NumPy's matmul written out: 1-D operands become a row / a column (and that dim is
// dropped from the result), batch dims broadcast, each product is a triple loop in double.
Reference reference_matmul(const std::vector<double>& a, Shape sa, const std::vector<double>& b, Shape sb) {
  const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    const int64_t da = i < nb - ba.size() ? 1 : ba[i - (nb - ba.size())];
    const int64_t db = i < nb - bb.size() ? 1 : bb[i - (nb - bb.size())];
    batch[i] = da == 1 ? db : da;
  }
  Reference r;
  r.shape = batch;
  if (!a_vec) r.shape.push_back(M);
  if (!b_vec) r.shape.push_back(N);
  const int64_t B = numel_of(batch);
  r.values.assign(size_t(B * M * N), 0.0);
  for (int64_t i = 0; i < B; ++i) {
    const auto idx = unravel(i, batch);
    const int64_t ia = broadcast_index(idx, ba), ib = broadcast_index(idx, bb);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += a[size_t((ia * M + m) * K + k)] * b[size_t((ib * K + k) * N + n)];
        r.values[size_t((i * M + m) * N + n)] = s;
      }
  }
  return r;
}

// Inputs are exact in their dtype; the result carries the accumulation error (float32
// accumulation for the 16-bit types, growing like sqrt(K) for random signs) and one
// rounding to the output dtype.
double atol_for(DType t, int64_t K) { return default_rtol(t) * std::sqrt(double(std::max<int64_t>(K, 1))); }

void check_matmul(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor out = ops::matmul(a, b);
  const Reference r = reference_matmul(values_of(a), a.sizes(), values_of(b), b.sizes());
  REQUIRE_MESSAGE(out.sizes() == r.shape, what, ": shape ", shape_str(out.sizes()), " vs ", shape_str(r.shape));
  CHECK(out.dtype() == a.dtype());
  CHECK(out.is_contiguous());
  check_close(out, r.values, default_rtol(a.dtype()), atol_for(a.dtype(), a.size(-1)), what);
}

std::string name(DType t, const Shape& sa, Layout la, const Shape& sb, Layout lb) {
  return detail::str_cat(dtype_name(t), " ", shape_str(sa), " ", layout_name(la), " @ ", shape_str(sb), " ",
                         layout_name(lb));
}

void check_shapes(const Shape& sa, const Shape& sb, uint64_t seed) {
  for (DType t : kFloatTypes)
    for (Layout la : kAllLayouts)
      for (Layout lb : kAllLayouts) {
        const Tensor a = random_tensor(sa, {t}, seed, la), b = random_tensor(sb, {t}, seed + 1, lb);
        check_matmul(a, b, name(t, sa, la, sb, lb));
      }
}

int64_t cpu_allocs() { return memory::stats(kCPU).num_allocs; }

}  // namespace

TEST_CASE("matmul: 1-D @ 1-D is a dot product giving a 0-d tensor") {
  check_shapes({7}, {7}, 1);
  const Tensor d = ops::matmul(from_vector<float>({1, 2, 3}), from_vector<float>({4, 5, 6}));
  CHECK(d.dim() == 0);
  CHECK(d.item<float>() == 32.0f);
}

TEST_CASE("matmul: 1-D and 2-D operands are promoted and the added dim squeezed") {
  check_shapes({5}, {5, 3}, 10);  // (K) @ (K, N) -> (N)
  check_shapes({4, 5}, {5}, 20);  // (M, K) @ (K) -> (M)
}

TEST_CASE("matmul: 2-D products in every layout pair") {
  check_shapes({13, 17}, {17, 11}, 30);
  check_shapes({1, 9}, {9, 1}, 31);  // size-1 dims with free strides
  check_shapes({6, 1}, {1, 5}, 32);  // K == 1: an outer product
  // Large enough for Eigen's blocked, packed and threaded path.
  for (DType t : {kFloat32, kFloat64, kBFloat16}) {
    const Tensor a = random_tensor({150, 300}, {t}, 33, Layout::Transposed), b = random_tensor({300, 170}, {t}, 34);
    check_matmul(a, b, name(t, {150, 300}, Layout::Transposed, {300, 170}, Layout::Contiguous));
  }
}

TEST_CASE("matmul: batched with broadcast batch dims") {
  check_shapes({2, 1, 5, 6}, {1, 3, 6, 4}, 40);  // (B, 1, M, K) @ (1, H, K, N) -> (B, H, M, N)
  check_shapes({3, 5, 6}, {6, 4}, 41);           // batch folded into M when a's strides allow
  check_shapes({5, 6}, {2, 3, 6, 4}, 42);        // a broadcast over the whole batch (stride 0)
  check_shapes({6}, {2, 6, 4}, 43);              // 1-D @ 3-D -> (2, 4)
  check_shapes({2, 5, 6}, {6}, 44);              // 3-D @ 1-D -> (2, 5)
  check_shapes({4, 1, 3, 2}, {5, 2, 3}, 45);     // (4, 1) with (5,) batch -> (4, 5)
  check_shapes({3, 4, 5}, {3, 5, 2}, 46);        // equal batches
}

TEST_CASE("matmul: expanded and sliced operands") {
  for (DType t : kFloatTypes) {
    // A row broadcast with stride 0 has no BLAS layout: copied.
    const Tensor row = random_tensor({1, 6}, {t}, 50).expand({4, 6});
    check_matmul(row, random_tensor({6, 3}, {t}, 51), detail::str_cat(dtype_name(t), " expanded row"));
    // A batch slice with a step: one batch stride still describes it.
    const Tensor a = random_tensor({6, 4, 5}, {t}, 52).slice(0, 0, 6, 2);
    check_matmul(a, random_tensor({3, 5, 2}, {t}, 53, Layout::Transposed), detail::str_cat(dtype_name(t), " step"));
    // Columns of a wider matrix: row-major with a leading dimension > cols.
    const Tensor cols = random_tensor({7, 12}, {t}, 54).narrow(1, 2, 5);
    check_matmul(cols, random_tensor({5, 8}, {t}, 55).narrow(1, 1, 4), detail::str_cat(dtype_name(t), " narrow"));
    // A permuted 4-D operand (the attention pattern q @ k^T).
    const Tensor q = random_tensor({2, 5, 3, 4}, {t}, 56).permute({0, 2, 1, 3});  // (B, H, T, D)
    const Tensor k = random_tensor({2, 5, 3, 4}, {t}, 57).permute({0, 2, 3, 1});  // (B, H, D, T)
    check_matmul(q, k, detail::str_cat(dtype_name(t), " attention scores"));
  }
}

TEST_CASE("matmul: transposed views are read in place; only unmappable operands are copied") {
  const Tensor a = random_tensor({32, 48}, {kFloat32}, 60), b = random_tensor({40, 48}, {kFloat32}, 61);
  int64_t before = cpu_allocs();
  Tensor out = ops::mm(a, b.t());
  CHECK(cpu_allocs() - before == 1);  // the output only
  const Tensor v =
      random_tensor({48}, {kFloat32}, 62).expand({2, 3, 48}).unsqueeze(2);  // (2, 3, 1, 48), stride-0 batch
  before = cpu_allocs();
  out = ops::matmul(v, b.t());
  CHECK(cpu_allocs() - before == 1);
  check_close(out, reference_matmul(values_of(v), v.sizes(), values_of(b.t()), {48, 40}).values, 1e-5, 1e-4, "v");
  const Tensor strided = random_tensor({32, 48}, {kFloat32}, 63, Layout::Strided);
  before = cpu_allocs();
  out = ops::mm(strided, b.t());
  CHECK(cpu_allocs() - before == 2);  // one copy of the strided operand, and the output
}

TEST_CASE("matmul: K == 0 gives zeros, empty dims give empty results") {
  for (DType t : kFloatTypes) {
    const Tensor z = ops::matmul(empty({3, 0}, {t}), empty({0, 4}, {t}));
    CHECK(z.sizes() == Shape{3, 4});
    check_close(z, std::vector<double>(12, 0.0), 0, 0, "K == 0");
    CHECK(ops::matmul(empty({0}, {t}), empty({0}, {t})).item<double>() == 0.0);
    CHECK(ops::matmul(empty({0, 5}, {t}), random_tensor({5, 4}, {t}, 70)).sizes() == Shape{0, 4});
    CHECK(ops::matmul(random_tensor({2, 5}, {t}, 71), empty({5, 0}, {t})).sizes() == Shape{2, 0});
    CHECK(ops::matmul(empty({0, 3, 5}, {t}), random_tensor({5, 2}, {t}, 72)).sizes() == Shape{0, 3, 2});
    CHECK(ops::bmm(empty({2, 3, 0}, {t}), empty({2, 0, 4}, {t})).sizes() == Shape{2, 3, 4});
    const Tensor lin = ops::linear(empty({3, 0}, {t}), empty({2, 0}, {t}), from_vector<double>({1.5, -2}, {2}, {t}));
    check_close(lin, {1.5, -2, 1.5, -2, 1.5, -2}, 0, 0, "linear with K == 0 is the bias");
  }
}

TEST_CASE("matmul: 16-bit inputs accumulate in float32") {
  // 4096 ones summed: a float16 accumulator stalls at 2048, a bfloat16 one at 256.
  for (DType t : {kFloat16, kBFloat16}) {
    const Tensor s = ops::matmul(ones({1, 4096}, {t}), ones({4096, 1}, {t}));
    CHECK(s.item<double>() == 4096.0);
  }
  // float16 results with K = 1024 stay within the output rounding plus sqrt(K) accumulation.
  check_matmul(random_tensor({9, 1024}, {kFloat16}, 80), random_tensor({1024, 7}, {kFloat16}, 81, Layout::Transposed),
               "float16 K=1024");
}

TEST_CASE("mm and bmm") {
  for (DType t : kFloatTypes)
    for (Layout l : kAllLayouts) {
      const Tensor a = random_tensor({6, 9}, {t}, 90, l), b = random_tensor({9, 4}, {t}, 91, l);
      const Reference r = reference_matmul(values_of(a), a.sizes(), values_of(b), b.sizes());
      check_close(ops::mm(a, b), r.values, default_rtol(t), atol_for(t, 9), name(t, {6, 9}, l, {9, 4}, l) + " mm");
      const Tensor x = random_tensor({3, 6, 9}, {t}, 92, l), y = random_tensor({3, 9, 4}, {t}, 93, l);
      const Reference rb = reference_matmul(values_of(x), x.sizes(), values_of(y), y.sizes());
      const Tensor o = ops::bmm(x, y);
      CHECK(o.sizes() == Shape{3, 6, 4});
      check_close(o, rb.values, default_rtol(t), atol_for(t, 9), name(t, {3, 6, 9}, l, {3, 9, 4}, l) + " bmm");
    }
}

TEST_CASE("linear: x @ weight^T + bias") {
  for (DType t : kFloatTypes)
    for (Layout lx : kAllLayouts)
      for (Layout lw : kAllLayouts)
        for (bool with_bias : {true, false}) {
          const Shape sx{2, 3, 7};
          const Tensor x = random_tensor(sx, {t}, 100, lx), w = random_tensor({5, 7}, {t}, 101, lw);
          const Tensor bias = with_bias ? random_tensor({5}, {t}, 102) : Tensor();
          const auto vx = values_of(x), vw = values_of(w);
          const auto vb = with_bias ? values_of(bias) : std::vector<double>(5, 0.0);
          std::vector<double> expected(6 * 5);
          for (int64_t m = 0; m < 6; ++m)
            for (int64_t n = 0; n < 5; ++n) {
              double s = vb[size_t(n)];
              for (int64_t k = 0; k < 7; ++k) s += vx[size_t(m * 7 + k)] * vw[size_t(n * 7 + k)];
              expected[size_t(m * 5 + n)] = s;
            }
          const Tensor y = ops::linear(x, w, bias);
          CHECK(y.sizes() == Shape{2, 3, 5});
          check_close(y, expected, default_rtol(t), atol_for(t, 7),
                      detail::str_cat(dtype_name(t), " x ", layout_name(lx), " w ", layout_name(lw),
                                      with_bias ? " with bias" : " without bias"));
        }
  // 1-D input: (in) -> (out)
  const Tensor y = ops::linear(from_vector<float>({1, 2}), from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2}),
                               from_vector<float>({10, 20, 30}));
  CHECK(y.sizes() == Shape{3});
  CHECK(y.tolist<float>() == std::vector<float>{11, 22, 33});
}

TEST_CASE("matmul: error paths name the op and the operands") {
  const Tensor a = random_tensor({2, 3}, {kFloat32}, 1), b = random_tensor({4, 5}, {kFloat32}, 2);
  check_error([&] { ops::matmul(a, b); }, {"matmul", "inner dimensions", "float32[2, 3] cpu", "float32[4, 5] cpu"});
  check_error([&] { ops::matmul(random_tensor({3}, {kFloat32}, 3), random_tensor({4}, {kFloat32}, 4)); },
              {"matmul", "inner dimensions", "[3]", "[4]"});
  check_error(
      [&] {
        ops::matmul(zeros({2, 2, 3}), zeros({3, 3, 4}));
      },
      {"matmul", "batch dimensions", "[2]", "[3]", "cannot be broadcast"});
  check_error(
      [&] {
        ops::matmul(zeros({2, 3}), zeros({3, 4}, {kFloat64}));
      },
      {"matmul", "same dtype", "float32[2, 3] cpu", "float64[3, 4] cpu", "does not promote"});
  check_error([&] { ops::matmul(scalar_tensor(2.0), zeros({3})); },
              {"matmul", "at least 1 dimension", "float32[] cpu"});
  check_error(
      [&] {
        ops::matmul(zeros({2, 3}, {kInt32}), zeros({3, 2}, {kInt32}));
      },
      {"matmul", "not implemented for int32 on cpu"});
  check_error([&] { ops::matmul(zeros({2, 3}, {kInt64}), zeros({3, 2}, {kInt64})); }, {"matmul", "int64"});
  check_error([&] { ops::matmul(Tensor(), zeros({3})); }, {"matmul", "undefined"});
  check_error([&] { ops::mm(zeros({2, 2, 3}), zeros({3, 2})); }, {"mm", "2-D", "[2, 2, 3]"});
  check_error([&] { ops::mm(a, b); }, {"mm", "inner dimensions", "[2, 3]", "[4, 5]"});
  check_error([&] { ops::mm(a, b.to(kFloat16)); }, {"mm", "same dtype", "float16"});
  check_error([&] { ops::bmm(zeros({2, 3}), zeros({3, 2})); }, {"bmm", "3-D"});
  check_error([&] { ops::bmm(zeros({2, 2, 3}), zeros({3, 3, 2})); }, {"bmm", "batch sizes differ", "[2, 2, 3]"});
  check_error([&] { ops::bmm(zeros({2, 2, 3}), zeros({2, 4, 2})); }, {"bmm", "inner dimensions"});
  check_error(
      [&] {
        ops::linear(zeros({4, 3}), zeros({5, 2}), Tensor());
      },
      {"linear", "3 features", "float32[5, 2] cpu", "expects 2"});
  check_error([&] { ops::linear(zeros({4, 3}), zeros({5, 3}), zeros({4})); }, {"linear", "bias", "[4]", "5"});
  check_error([&] { ops::linear(zeros({4, 3}), zeros({5, 3}), zeros({5}, {kFloat64})); }, {"linear", "bias", "dtype"});
  check_error([&] { ops::linear(zeros({4, 3}), zeros({3}), Tensor()); }, {"linear", "weight must be 2-D"});
  check_error([&] { ops::linear(scalar_tensor(1.0), zeros({2, 1}), Tensor()); }, {"linear", "at least 1 dimension"});
  check_error(
      [&] {
        ops::linear(zeros({4, 3}, {kInt64}), zeros({2, 3}, {kInt64}), Tensor());
      },
      {"linear", "not implemented for int64"});
}

TEST_CASE("matmul: allow_tf32 defaults to off and round-trips") {
  CHECK_FALSE(ops::allow_tf32());
  ops::set_allow_tf32(true);
  CHECK(ops::allow_tf32());
  ops::set_allow_tf32(false);
  CHECK_FALSE(ops::allow_tf32());
}
