#include "tensor/ops/matmul.h"

#include <algorithm>
#include <atomic>
#include <optional>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/unary.h"

namespace frugal::ops {

// Note [Matmul reduction to a batched GEMM]
// Every product here becomes one call of a batched GEMM kernel on 3-D operands,
// out (B, M, N) = a (B, M, K) @ b (B, K, N), as in PyTorch's matmul:
// - a 1-D first operand becomes a row (1, K) and a 1-D second one a column (K, 1);
//   the result is allocated without that dim, and viewed as (B, M, N) for the kernel;
// - the batch dims (all but the last two) broadcast. Each operand is expanded to
//   the broadcast batch and its batch dims are folded into one dim with a single
//   stride when the strides allow it, which includes stride 0 for an operand that
//   is broadcast along the whole batch (both BLAS backends read it in place). Only
//   an operand whose expanded batch cannot be described by one stride, such as
//   (B, 1, M, K) against (1, H, K, N), is copied (expanded and made contiguous),
//   which is what PyTorch does too;
// - when the second operand has no batch dims, a's batch dims are folded into M
//   instead, (B, M, K) @ (K, N) -> (B*M, K) @ (K, N): one large GEMM, not B small
//   ones, provided the folded matrix can be read in place (or a must be copied anyway);
// - K == 0 gives zeros and an empty result returns at once, so kernels never see
//   either case.

// Note [Matmul operand layout]
// BLAS libraries read a matrix in place when one of its two dims has unit stride
// and the other (the leading dimension, "ld") is at least the size of the first:
// row-major (stride (ld, 1), ld >= cols) or column-major (stride (1, ld), ld >= rows).
// A transposed view of a dense matrix is column-major, so mm(a, w.t()) reads w where
// it lies: no copy. A size-1 dim may carry any stride; blas_layout() rewrites it so
// the kernels can rely on one rule: the matrix is row-major exactly when its last
// stride is 1, and its ld is then stride(-2), else stride(-1). Operands with no such
// layout (a slice with a step, a broadcast row) are copied, once, into row-major.

namespace {

std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_gelu_forward_epilogue{GeluEpilogues{}.forward}, g_gelu_backward_epilogue{GeluEpilogues{}.backward};

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  FRUGAL_CHECK(a.defined() && b.defined(), op, ": undefined tensor operand");
  check_same_device(op, a, b);
  FRUGAL_CHECK(a.dtype() == b.dtype(), op, ": expected both operands to have the same dtype, got ", a.describe(),
               " and ", b.describe(), " (like PyTorch, ", op,
               " does not promote types: convert one operand with .to(dtype))");
  FRUGAL_CHECK(is_floating(a.dtype()), op, ": not implemented for ", dtype_name(a.dtype()), " on ", a.device().str(),
               " (", a.describe(), "); supported dtypes: float32, float64, float16, bfloat16");
}

/// Size and stride of dims [begin, end) of `t` seen as a single dim, when one stride
/// describes them all (size-1 dims are ignored, stride 0 folds with stride 0).
std::optional<std::pair<int64_t, int64_t>> fold_dims(const Tensor& t, int64_t begin, int64_t end) {
  int64_t size = 1, stride = 0, expected = 0;
  bool have = false;
  for (int64_t d = end - 1; d >= begin; --d) {
    const int64_t n = t.size(d), s = t.stride(d);
    size *= n;
    if (n == 1) continue;
    if (have && s != expected) return std::nullopt;
    if (!have) stride = s, have = true;
    expected = s * n;
  }
  return std::make_pair(size, stride);
}

/// `t` (..., R, C) as (B, R, C) with one batch stride: a view when possible, else a
/// contiguous copy. See Note [Matmul reduction to a batched GEMM].
Tensor fold_batch(const Tensor& t) {
  const int64_t nd = t.dim();
  if (auto f = fold_dims(t, 0, nd - 2))
    return t.as_strided({f->first, t.size(-2), t.size(-1)}, {f->second, t.stride(-2), t.stride(-1)},
                        t.storage_offset());
  return t.contiguous().view({-1, t.size(-2), t.size(-1)});
}

/// Row and column strides that put a (R, C) matrix with strides (sr, sc) in a BLAS
/// layout (Note [Matmul operand layout]), or nothing when it has none.
std::optional<std::pair<int64_t, int64_t>> blas_strides(int64_t R, int64_t C, int64_t sr, int64_t sc) {
  if (R == 1) sr = -1;  // -1: free, any stride will do
  if (C == 1) sc = -1;
  if ((sc == -1 || sc == 1) && (sr == -1 || sr >= std::max<int64_t>(1, C)))
    return std::make_pair(sr == -1 ? std::max<int64_t>(1, C) : sr, int64_t(1));
  if ((sr == -1 || sr == 1) && (sc == -1 || sc >= std::max<int64_t>(1, R)))
    return std::make_pair(int64_t(1), sc == -1 ? std::max<int64_t>(1, R) : sc);
  return std::nullopt;
}

/// `t` (B, R, C) or (R, C) as a view with canonical strides in a BLAS layout, or a
/// row-major copy when it has none.
Tensor blas_layout(const Tensor& t) {
  const bool batched = t.dim() == 3;
  const int64_t R = t.size(-2), C = t.size(-1);
  if (auto s = blas_strides(R, C, t.stride(-2), t.stride(-1))) {
    if (s->first == t.stride(-2) && s->second == t.stride(-1)) return t;  // already canonical
    if (!batched) return t.as_strided({R, C}, {s->first, s->second}, t.storage_offset());
    return t.as_strided({t.size(0), R, C}, {t.stride(0), s->first, s->second}, t.storage_offset());
  }
  // Copy the matrices; a batch broadcast with stride 0 stays broadcast (one copy, not B).
  if (batched && t.size(0) > 1 && t.stride(0) == 0) return blas_layout(t.narrow(0, 0, 1).clone().expand(t.sizes()));
  return blas_layout(t.clone());
}

/// out (B, M, N) = a (B, M, K) @ b (B, K, N); out is fresh and contiguous.
void run_bmm(const char* op, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  if (a.size(2) == 0) {  // K == 0: a sum over nothing
    zero_(out);
    return;
  }
  const Tensor a3 = blas_layout(a), b3 = blas_layout(b);
  FRUGAL_DEVICE_DISPATCH(op, out.device(), bmm_kernel, out, a3, b3);
}

std::string inner_mismatch(const char* op, const Tensor& a, const Tensor& b, int64_t ka, int64_t kb) {
  return detail::str_cat(op, ": inner dimensions do not match: ", a.describe(), " @ ", b.describe(), " (", ka, " vs ",
                         kb, ")");
}

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
void set_gelu_epilogues(GeluEpilogues e) {
  g_gelu_forward_epilogue.store(e.forward, std::memory_order_relaxed);
  g_gelu_backward_epilogue.store(e.backward, std::memory_order_relaxed);
}
GeluEpilogues gelu_epilogues() {
  return {g_gelu_forward_epilogue.load(std::memory_order_relaxed),
          g_gelu_backward_epilogue.load(std::memory_order_relaxed)};
}
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

Shape check_matmul(const Tensor& a, const Tensor& b) {
  check_pair("matmul", a, b);
  FRUGAL_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got ", a.describe(),
               " and ", b.describe());
  const int64_t K = a.size(-1), Kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  FRUGAL_CHECK(K == Kb, inner_mismatch("matmul", a, b, K, Kb));
  const Shape batch_a(a.sizes().begin(), a.sizes().end() - std::min<int64_t>(a.dim(), 2));
  const Shape batch_b(b.sizes().begin(), b.sizes().end() - std::min<int64_t>(b.dim(), 2));
  Shape out_shape;
  try {
    out_shape = broadcast_shapes(batch_a, batch_b, "matmul");
  } catch (const Error&) {
    FRUGAL_FAIL("matmul: batch dimensions ", shape_str(batch_a), " of ", a.describe(), " and ", shape_str(batch_b),
                " of ", b.describe(), " cannot be broadcast");
  }
  if (a.dim() > 1) out_shape.push_back(a.size(-2));
  if (b.dim() > 1) out_shape.push_back(b.size(-1));
  return out_shape;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  const Shape out_shape = check_matmul(a, b);
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;  // (..., M, K)
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;  // (..., K, N)
  const int64_t M = a2.size(-2), K = a2.size(-1), N = b2.size(-1);
  const Shape batch_a(a2.sizes().begin(), a2.sizes().end() - 2);
  const Shape batch_b(b2.sizes().begin(), b2.sizes().end() - 2);
  const Shape batch(out_shape.begin(), out_shape.end() - (a.dim() > 1) - (b.dim() > 1));
  Tensor out = empty(out_shape, a.options());
  if (out.numel() == 0) return out;
  if (K == 0) {  // a sum over nothing
    zero_(out);
    return out;
  }

  // (B, M, K) @ (K, N): fold a's batch into its rows when the strides allow.
  // Folding is taken when the folded matrix is readable in place, or when a's own
  // matrices are not either (then one copy of a folds).
  if (!batch_a.empty() && batch_b.empty()) {
    const auto rows = fold_dims(a2, 0, a2.dim() - 1);
    const bool fold_in_place = rows && blas_strides(rows->first, K, rows->second, a2.stride(-1));
    if (fold_in_place || !blas_strides(M, K, a2.stride(-2), a2.stride(-1))) {
      const Tensor af = fold_in_place
                            ? a2.as_strided({1, rows->first, K}, {0, rows->second, a2.stride(-1)}, a2.storage_offset())
                            : a2.contiguous().view({1, -1, K});
      run_bmm("matmul", out.view({1, af.size(1), N}), af, b2.unsqueeze(0));
      return out;
    }
  }
  Shape shape_a = batch, shape_b = batch;
  shape_a.insert(shape_a.end(), {M, K});
  shape_b.insert(shape_b.end(), {K, N});
  const Tensor af = fold_batch(batch_a == batch ? a2 : a2.expand(shape_a));
  const Tensor bf = fold_batch(batch_b == batch ? b2 : b2.expand(shape_b));
  run_bmm("matmul", out.view({af.size(0), M, N}), af, bf);
  return out;
}

Tensor mm(const Tensor& a, const Tensor& b) {
  check_pair("mm", a, b);
  return mm(a, b, a.dtype());
}

Tensor mm(const Tensor& a, const Tensor& b, DType out_dtype) {
  check_pair("mm", a, b);
  if (out_dtype != a.dtype()) {
    FRUGAL_CHECK((a.dtype() == kFloat16 || a.dtype() == kBFloat16) && out_dtype == kFloat32, "mm: a result in ",
                 dtype_name(out_dtype), " needs float16 or bfloat16 operands and a float32 result, got ", a.describe(),
                 " and ", b.describe());
  }
  FRUGAL_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D operands, got ", a.describe(), " and ", b.describe());
  FRUGAL_CHECK(a.size(1) == b.size(0), inner_mismatch("mm", a, b, a.size(1), b.size(0)));
  Tensor out = empty({a.size(0), b.size(1)}, {out_dtype, a.device()});
  run_bmm("mm", out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0));
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_pair("bmm", a, b);
  FRUGAL_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D operands, got ", a.describe(), " and ", b.describe());
  FRUGAL_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: ", a.describe(), " and ", b.describe(),
               " (bmm does not broadcast; use matmul)");
  FRUGAL_CHECK(a.size(2) == b.size(1), inner_mismatch("bmm", a, b, a.size(2), b.size(1)));
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, a.options());
  run_bmm("bmm", out, a, b);
  return out;
}

void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_pair(op, x, weight);
  FRUGAL_CHECK(weight.dim() == 2, op, ": weight must be 2-D (out_features, in_features), got ", weight.describe());
  FRUGAL_CHECK(x.dim() >= 1, op, ": input must have at least 1 dimension, got ", x.describe());
  FRUGAL_CHECK(x.size(-1) == weight.size(1), op, ": input ", x.describe(), " has ", x.size(-1), " features but weight ",
               weight.describe(), " expects ", weight.size(1));
  if (bias.defined()) {
    check_same_device(op, x, bias);
    FRUGAL_CHECK(bias.dtype() == x.dtype(), op, ": bias ", bias.describe(), " must have the dtype of input ",
                 x.describe());
    FRUGAL_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": bias ", bias.describe(),
                 " must be 1-D with out_features = ", weight.size(0), " elements (weight ", weight.describe(), ")");
  }
}

namespace {

/// One linear's operands (checked by check_linear) as its kernels take them: out (..., N)
/// allocated, and when it has elements, out2 its (M, N) view and x2 the input as (M, K) (a view
/// when its leading dims fold, else a copy).
struct LinearProblem {
  Tensor out, out2, x2;
  int64_t M = 0, N = 0, K = 0;
};

LinearProblem linear_problem(const Tensor& x, const Tensor& weight) {
  LinearProblem p;
  p.K = weight.size(1), p.N = weight.size(0);
  Shape out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(p.N);
  p.out = empty(out_shape, x.options());
  if (p.out.numel() == 0) return p;
  p.M = p.out.numel() / p.N;
  p.out2 = p.out.view({p.M, p.N});
  const auto rows = fold_dims(x, 0, x.dim() - 1);
  p.x2 = rows ? x.as_strided({p.M, p.K}, {rows->second, x.stride(-1)}, x.storage_offset())
              : x.contiguous().view({p.M, p.K});
  return p;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear("linear", x, weight, bias);
  const LinearProblem p = linear_problem(x, weight);
  if (p.M == 0) return p.out;
  if (p.K == 0) {
    if (bias.defined()) copy_into(p.out2, bias);  // broadcasts over the rows
    else zero_(p.out2);
    return p.out;
  }
  FRUGAL_DEVICE_DISPATCH("linear", x.device(), linear_kernel, p.out2, blas_layout(p.x2), blas_layout(weight.t()),
                         bias.defined() ? bias.contiguous() : Tensor());
  return p.out;
}

LinearGelu linear_gelu_tanh(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear("linear_gelu_tanh", x, weight, bias);
#ifdef FRUGAL_WITH_CUDA
  if (x.is_cuda() && gelu_epilogues().forward) {
    const LinearProblem p = linear_problem(x, weight);
    if (p.M > 0 && p.K > 0) {
      const Tensor pre = empty(p.out.sizes(), p.out.options());
      if (cuda::linear_gelu_tanh_kernel(p.out2, pre.view({p.M, p.N}), blas_layout(p.x2), blas_layout(weight.t()),
                                        bias.defined() ? bias.contiguous() : Tensor()))
        return {p.out, pre};
    }
  }
#endif
  Tensor pre = linear(x, weight, bias);  // (Note [GELU epilogues]: the composed ops)
  Tensor out = gelu_tanh(pre);
  return {std::move(out), std::move(pre)};
}

GeluGrads matmul_gelu_tanh_backward(const Tensor& g, const Tensor& weight, const Tensor& pre, bool with_bias) {
  constexpr const char* op = "matmul_gelu_tanh_backward";
  check_pair(op, g, weight);
  check_pair(op, g, pre);
  FRUGAL_CHECK(g.dim() == 2 && weight.dim() == 2 && pre.dim() == 2 && weight.size(0) == g.size(1) &&
                   pre.size(0) == g.size(0) && pre.size(1) == weight.size(1),
               op, ": expected g (M, out), weight (out, in) and pre (M, in), got ", g.describe(), ", ",
               weight.describe(), " and ", pre.describe());
#ifdef FRUGAL_WITH_CUDA
  if (!g.is_cuda() || g.numel() == 0 || pre.numel() == 0 || !gelu_epilogues().backward) return {};
  Tensor grad_pre = empty(pre.sizes(), g.options());
  Tensor grad_bias = with_bias ? empty({pre.size(1)}, g.options()) : Tensor();
  if (!cuda::matmul_dgelu_tanh_kernel(grad_pre, grad_bias, blas_layout(g), blas_layout(weight), pre.contiguous()))
    return {};
  return {std::move(grad_pre), std::move(grad_bias)};
#else
  (void)with_bias;
  return {};  // the CPU has no fused kernel: the caller runs mm, unary_backward and sum
#endif
}

LinearWeightBiasGrads linear_backward_weight_bias(const Tensor& g, const Tensor& x, DType weight_dtype) {
  check_pair("linear_backward_weight_bias", g, x);
  FRUGAL_CHECK(g.dim() == 2 && x.dim() == 2 && g.size(0) == x.size(0),
               "linear_backward_weight_bias: expected g (M, out) and x (M, in), got ", g.describe(), " and ",
               x.describe());
  FRUGAL_CHECK(
      weight_dtype == g.dtype() || ((g.dtype() == kFloat16 || g.dtype() == kBFloat16) && weight_dtype == kFloat32),
      "linear_backward_weight_bias: a weight gradient in ", dtype_name(weight_dtype),
      " needs operands of that dtype, or float16/bfloat16 ones for float32, got ", g.describe());
#ifdef FRUGAL_WITH_CUDA
  if (!g.is_cuda() || g.numel() == 0 || x.numel() == 0) return {};
  const TensorOptions out_options(weight_dtype, g.device());
  Tensor weight = empty({g.size(1), x.size(1)}, out_options);
  // The epilogue writes the bias gradient in the weight gradient's dtype (Note [Bias gradient epilogue]).
  Tensor bias = empty({g.size(1)}, out_options);
  if (!cuda::linear_backward_weight_bias_kernel(weight, bias, blas_layout(g.t()), blas_layout(x))) return {};
  return {weight, bias.dtype() == g.dtype() ? bias : bias.to(g.dtype())};  // float32 sums, rounded once
#else
  return {};  // the CPU has no fused kernel: the caller runs mm and sum
#endif
}

}  // namespace frugal::ops
