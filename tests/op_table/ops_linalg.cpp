// Matrix products (tensor/ops/matmul.h) on operands in every layout: transposed
// (column-major), stepped, offset, broadcast batch and broadcast rows (stride 0).
#include "tensor/ops/matmul.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

/// Mostly small, now and then large enough for Eigen's blocked GEMM (not its small-product path).
int64_t mat_size(Rng& rng) { return rng.chance(0.08) ? rng.range(20, 70) : random_size(rng, 9, 0.05, 0.15); }

/// C[b..., m, n] = sum_k A[b..., m, k] B[b..., k, n] with NumPy batch broadcasting; a 1-D
/// operand is a row (first) or a column (second) whose dim the result drops.
Host matmul_ref(const Host& a, const Host& b) {
  const Host a2 = a.dim() == 1 ? Host{true, {1, a.sizes[0]}, a.v} : a;
  const Host b2 = b.dim() == 1 ? Host{true, {b.sizes[0], 1}, b.v} : b;
  const int64_t M = a2.size(-2), K = a2.size(-1), N = b2.size(-1);
  const Shape batch =
      broadcast(Shape(a2.sizes.begin(), a2.sizes.end() - 2), Shape(b2.sizes.begin(), b2.sizes.end() - 2));
  Shape full = batch;
  full.insert(full.end(), {M, N});
  Host c = host_zeros(full);
  size_t i = 0;
  for_each_index(full, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> ia(idx.begin(), idx.end() - 2), ib = ia;
    ia.insert(ia.end(), {idx[idx.size() - 2], 0});
    ib.insert(ib.end(), {0, idx.back()});
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      ia.back() = k;
      ib[ib.size() - 2] = k;
      s += a2.at_broadcast(ia) * b2.at_broadcast(ib);
    }
    c.v[i++] = s;
  });
  Shape out = batch;
  if (a.dim() > 1) out.push_back(M);
  if (b.dim() > 1) out.push_back(N);
  c.sizes = out;
  return c;
}

Expected rounded(Host h, DType dt, int64_t K) {
  for (double& v : h.v) v = round_to(dt, v);
  return {std::move(h), dt, tol_sum(dt, K, 4.0)};
}

}  // namespace

void add_linalg_ops(std::vector<OpEntry>& t) {
  t.push_back({"matmul", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const int64_t M = mat_size(rng), K = mat_size(rng), N = mat_size(rng);
                 const Shape batch = random_shape(rng, {.min_dims = 0, .max_dims = 2, .max_size = 4, .max_numel = 12});
                 Shape sa = broadcast_operand(rng, batch), sb = broadcast_operand(rng, batch);
                 sa.insert(sa.end(), {M, K});
                 sb.insert(sb.end(), {K, N});
                 if (rng.chance(0.15)) sa = {K};  // a row vector
                 if (rng.chance(0.15)) sb = {K};  // a column vector
                 s.inputs = {random_input(rng, sa, dt), random_input(rng, sb, dt)};
                 s.run = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::matmul(in[0], in[1])}; };
                 s.reference = [dt, K](const std::vector<Host>& in) {
                   return std::vector<Expected>{rounded(matmul_ref(in[0], in[1]), dt, K)};
                 };
                 return s;
               }});
  for (bool widen : {false, true}) {
    t.push_back({widen ? "mm_float32_out" : "mm", widen ? std::vector<DType>{kFloat16, kBFloat16} : kFloats,
                 [widen](Rng& rng, DType dt) {
                   Sample s;
                   const int64_t M = mat_size(rng), K = mat_size(rng), N = mat_size(rng);
                   s.inputs = {random_input(rng, {M, K}, dt), random_input(rng, {K, N}, dt)};
                   s.run = [widen](const std::vector<Tensor>& in) {
                     return std::vector<Tensor>{widen ? ops::mm(in[0], in[1], kFloat32) : ops::mm(in[0], in[1])};
                   };
                   s.reference = [dt, K, widen](const std::vector<Host>& in) {
                     return std::vector<Expected>{rounded(matmul_ref(in[0], in[1]), widen ? kFloat32 : dt, K)};
                   };
                   return s;
                 }});
  }
  t.push_back({"bmm", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const int64_t B = random_size(rng, 4, 0.05), M = mat_size(rng), K = mat_size(rng), N = mat_size(rng);
                 s.inputs = {random_input(rng, {B, M, K}, dt), random_input(rng, {B, K, N}, dt)};
                 s.run = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::bmm(in[0], in[1])}; };
                 s.reference = [dt, K](const std::vector<Host>& in) {
                   return std::vector<Expected>{rounded(matmul_ref(in[0], in[1]), dt, K)};
                 };
                 return s;
               }});
  t.push_back({"linear", kFloats, [](Rng& rng, DType dt) {
                 Sample s;
                 const int64_t K = mat_size(rng), N = mat_size(rng);
                 Shape sx = random_shape(rng, {.min_dims = 0, .max_dims = 3, .max_size = 5, .max_numel = 40});
                 sx.push_back(K);
                 const bool bias = rng.chance(0.6);
                 s.inputs = {random_input(rng, sx, dt), random_input(rng, {N, K}, dt),
                             bias ? random_input(rng, {N}, dt) : Tensor()};
                 s.run = [](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ops::linear(in[0], in[1], in[2])};
                 };
                 s.reference = [dt, K, N](const std::vector<Host>& in) {
                   Shape out = in[0].sizes;
                   out.back() = N;
                   const Host& x = in[0];
                   Expected e = make_expected(out, dt, tol_sum(dt, K + 1, 4.0), [&](std::vector<int64_t> idx) {
                     const int64_t n = idx.back();
                     double acc = in[2].defined ? in[2].v[size_t(n)] : 0.0;
                     for (int64_t k = 0; k < K; ++k) {
                       idx.back() = k;
                       acc += x.at(idx) * in[1].at({n, k});
                     }
                     return acc;
                   });
                   return std::vector<Expected>{e};
                 };
                 return s;
               }});
}

}  // namespace frugal::optest
