// CPU flash attention (see Note [Flash attention]): one (batch, head) pair per thread, one
// query row at a time. A row's scores live in an S-long buffer, never the (L, S) matrix,
// so the CPU path keeps the fused op's memory bound; the math is the formula itself, in
// opmath (float, double for float64), and is the reference the CUDA kernels are tested on.
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops/flash_attention.h"

namespace frugal::ops::cpu {

namespace {

/// Read-only view of one (batch, head) slice of a (B, H, N, E) operand.
template <typename T>
struct Rows {
  const T* base;
  int64_t row_stride;
  const T* operator[](int64_t i) const { return base + i * row_stride; }
};

template <typename T>
Rows<T> slice(const Tensor& t, const int64_t (&s)[3], int64_t b, int64_t h) {
  return {t.data_ptr<T>() + b * s[0] + h * s[1], s[2]};
}

/// The scaled, masked scores of query row l of slice (b, h), into `row` (S entries; -inf
/// where masked); returns their logsumexp (-inf when every key is masked).
template <typename T, typename Acc>
Acc score_row(std::vector<Acc>& row, const T* q, const Rows<T>& k, const Tensor& mask, const FlashAttentionParams& p,
              int64_t b, int64_t h, int64_t l) {
  const int64_t mask_row = b * p.mask_stride[0] + h * p.mask_stride[1] + l * p.mask_stride[2];
  Acc m = Acc(-INFINITY);
  for (int64_t s = 0; s < p.S; ++s) {
    Acc v = Acc(-INFINITY);
    const bool visible = !p.causal || s <= l;
    if (visible && (p.mask_kind != 1 || mask.data_ptr<bool>()[mask_row + s * p.mask_stride[3]])) {
      Acc dot = 0;
      const T* kr = k[s];
      for (int64_t e = 0; e < p.E; ++e) dot += Acc(q[e]) * Acc(kr[e]);
      v = dot * Acc(p.scale);
      if (p.mask_kind == 2) v += Acc(mask.data_ptr<T>()[mask_row + s * p.mask_stride[3]]);
    }
    row[size_t(s)] = v;
    if (v > m) m = v;
  }
  if (m == Acc(-INFINITY)) return m;
  Acc sum = 0;
  for (int64_t s = 0; s < p.S; ++s) sum += std::exp(row[size_t(s)] - m);
  return m + std::log(sum);
}

/// Turns `row` (scores) into the weights exp(score - lse), zero for an empty row.
template <typename Acc>
void weights_row(std::vector<Acc>& row, Acc lse) {
  for (auto& x : row) x = lse == Acc(-INFINITY) ? Acc(0) : std::exp(x - lse);
}

/// Dropout's factor for weight (b, h, l, s): 1 / (1 - p) if kept, else 0.
template <typename Acc>
Acc dropout_factor(const FlashAttentionParams& p, int64_t b, int64_t h, int64_t l, int64_t s) {
  if (p.dropout_p == 0.0) return Acc(1);
  const uint64_t index = uint64_t(((b * p.H + h) * p.L + l) * p.S + s);
  return flash_dropout_keep(p.range, index, float(1.0 - p.dropout_p)) ? Acc(1.0 / (1.0 - p.dropout_p)) : Acc(0);
}

}  // namespace

void flash_attention_forward_kernel(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& mask, const FlashAttentionParams& p) {
  require_host_range(p.range, "Attention dropout on the CPU");
  dispatch_floating(q.dtype(), "flash_attention_forward", q.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    using Stat = std::conditional_t<std::is_same_v<T, double>, double, float>;  // lse's dtype
    Stat* lse_p = lse.data_ptr<Stat>();
#pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < p.B * p.H; ++bh) {
      const int64_t b = bh / p.H, h = bh % p.H;
      const Rows<T> qs = slice<T>(q, p.q_stride, b, h), ks = slice<T>(k, p.k_stride, b, h),
                    vs = slice<T>(v, p.v_stride, b, h), os = slice<T>(out, p.o_stride, b, h);
      std::vector<Acc> row(size_t(p.S)), acc(size_t(p.E));
      for (int64_t l = 0; l < p.L; ++l) {
        const Acc row_lse = score_row<T, Acc>(row, qs[l], ks, mask, p, b, h, l);
        weights_row(row, row_lse);
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t s = 0; s < p.S; ++s) {
          const Acc w = row[size_t(s)] * dropout_factor<Acc>(p, b, h, l, s);
          if (w == Acc(0)) continue;
          const T* vr = vs[s];
          for (int64_t e = 0; e < p.E; ++e) acc[size_t(e)] += w * Acc(vr[e]);
        }
        T* o = const_cast<T*>(os[l]);
        for (int64_t e = 0; e < p.E; ++e) o[e] = T(acc[size_t(e)]);
        lse_p[bh * p.L + l] = Stat(row_lse);
      }
    }
  });
}

// D_l = dout_l . out_l;  per key s: dv_s += P'_ls dout_l, dP_ls = dout_l . v_s,
// dS_ls = P_ls (dP_ls f_ls - D_l) with f the dropout factor and P' = P f;
// dq_l = scale sum_s dS_ls k_s, dk_s += scale dS_ls q_l.
void flash_attention_backward_kernel(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& mask, const FlashAttentionParams& p) {
  require_host_range(p.range, "Attention dropout on the CPU");
  dispatch_floating(q.dtype(), "flash_attention_backward", q.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    using Stat = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const Stat* lse_p = lse.data_ptr<Stat>();
#pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < p.B * p.H; ++bh) {
      const int64_t b = bh / p.H, h = bh % p.H;
      const Rows<T> qs = slice<T>(q, p.q_stride, b, h), ks = slice<T>(k, p.k_stride, b, h),
                    vs = slice<T>(v, p.v_stride, b, h), dos = slice<T>(dout, p.o_stride, b, h),
                    os = slice<T>(out, p.out_stride, b, h), dqs = slice<T>(dq, p.dq_stride, b, h),
                    dks = slice<T>(dk, p.dk_stride, b, h), dvs = slice<T>(dv, p.dv_stride, b, h);
      std::vector<Acc> row(size_t(p.S)), dq_acc(size_t(p.E));
      std::vector<Acc> dk_acc(size_t(p.S * p.E), Acc(0)), dv_acc(size_t(p.S * p.E), Acc(0));
      for (int64_t l = 0; l < p.L; ++l) {
        // Recompute the weights: the scores are those of the forward; the statistics its lse.
        score_row<T, Acc>(row, qs[l], ks, mask, p, b, h, l);
        weights_row(row, Acc(lse_p[bh * p.L + l]));
        const T* g = dos[l];
        const T* o = os[l];
        Acc D = 0;
        for (int64_t e = 0; e < p.E; ++e) D += Acc(g[e]) * Acc(o[e]);
        std::fill(dq_acc.begin(), dq_acc.end(), Acc(0));
        for (int64_t s = 0; s < p.S; ++s) {
          const Acc w = row[size_t(s)];
          if (w == Acc(0)) continue;
          const Acc f = dropout_factor<Acc>(p, b, h, l, s);
          const T* vr = vs[s];
          const T* kr = ks[s];
          Acc dP = 0;
          for (int64_t e = 0; e < p.E; ++e) dP += Acc(g[e]) * Acc(vr[e]);
          const Acc dS = w * (dP * f - D) * Acc(p.scale);
          Acc* dvr = &dv_acc[size_t(s * p.E)];
          Acc* dkr = &dk_acc[size_t(s * p.E)];
          const T* qr = qs[l];
          for (int64_t e = 0; e < p.E; ++e) {
            dvr[e] += w * f * Acc(g[e]);
            dq_acc[size_t(e)] += dS * Acc(kr[e]);
            dkr[e] += dS * Acc(qr[e]);
          }
        }
        T* dqr = const_cast<T*>(dqs[l]);
        for (int64_t e = 0; e < p.E; ++e) dqr[e] = T(dq_acc[size_t(e)]);
      }
      for (int64_t s = 0; s < p.S; ++s) {
        T* dkr = const_cast<T*>(dks[s]);
        T* dvr = const_cast<T*>(dvs[s]);
        for (int64_t e = 0; e < p.E; ++e) {
          dkr[e] = T(dk_acc[size_t(s * p.E + e)]);
          dvr[e] = T(dv_acc[size_t(s * p.E + e)]);
        }
      }
    }
  });
}

}  // namespace frugal::ops::cpu
