#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "autograd/grad_mode.h"
#include "optim/multi_tensor.h"
#include "tensor/cpu/loops.h"  // parallel_for_if
#include "tensor/device_dispatch.h"
#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"  // clamp

namespace frugal::optim {

namespace {

/// The defined gradients of `params`, checked to share one device.
std::vector<Tensor> gradients(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  FRUGAL_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0 (or infinity), got ", max_norm);
  FRUGAL_CHECK(norm_type > 0 || std::isinf(norm_type), "clip_grad_norm_: norm_type must be positive or infinity, got ",
               norm_type);
  FRUGAL_CHECK(!(std::isinf(norm_type) && norm_type < 0), "clip_grad_norm_: norm_type -inf is not supported");
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    FRUGAL_CHECK(p.defined(), "clip_grad_norm_: got an undefined parameter");
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!grads.empty())
      FRUGAL_CHECK(g.device() == grads[0].device(),
                   "clip_grad_norm_: gradients on different devices: ", grads[0].describe(), " and ", g.describe());
    grads.push_back(g.detach());
  }
  return grads;
}

/// The dtype of the total norm: float64 when a gradient is float64, else float32 (PyTorch's is
/// the gradients' dtype; frugal's 16-bit gradients get a float32 norm, computed in float64).
DType norm_dtype(const std::vector<Tensor>& grads) {
  for (const Tensor& g : grads)
    if (g.dtype() == kFloat64) return kFloat64;
  return kFloat32;
}

/// sum of |g|^p over g (max |g| for p = inf), in double; NaN propagates.
double cpu_power_sum(const Tensor& grad, double p) {
  const Tensor g = grad.contiguous();
  const int64_t n = g.numel();
  return dispatch_floating(g.dtype(), "clip_grad_norm_", kCPU, [&]<typename T>() {
    const T* x = g.data_ptr<T>();
    if (std::isinf(p)) {
      double m = 0.0;
      bool nan = false;
#pragma omp parallel for reduction(max : m) reduction(|| : nan) if (n >= (1 << 17))
      for (int64_t i = 0; i < n; ++i) {
        const double a = std::fabs(double(opmath_t<T>(x[i])));
        nan = nan || std::isnan(a);
        m = std::max(m, a);
      }
      return nan ? std::numeric_limits<double>::quiet_NaN() : m;
    }
    // Fixed blocks summed in block order, not an OpenMP reduction(+): that adds the
    // threads' partials in the order they finish, so the norm's last bits (and the
    // clipped gradients) changed from run to run (Note [CPU determinism] in core/threads.h).
    constexpr int64_t kBlock = int64_t(1) << 16;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<double> part(size_t(blocks), 0.0);
    ops::cpu::parallel_for_if(n >= (1 << 17), blocks, [&](int64_t b) {
      double s = 0.0;
      for (int64_t i = b * kBlock, end = std::min(n, i + kBlock); i < end; ++i) {
        const double a = std::fabs(double(opmath_t<T>(x[i])));
        s += p == 2.0 ? a * a : p == 1.0 ? a : std::pow(a, p);
      }
      part[size_t(b)] = s;
    });
    double s = 0.0;
    for (const double v : part) s += v;
    return s;
  });
}

/// The CPU path: returns the total norm (double) after scaling the gradients.
/// Throws when `total` is NaN or infinite (clip_grad_norm_'s error_if_nonfinite), before scaling.
void check_finite_total(double total, double p) {
  FRUGAL_CHECK(std::isfinite(total), "clip_grad_norm_: the total norm of order ", p,
               " of the gradients is non-finite (", total,
               "), so it cannot be clipped; pass error_if_nonfinite = false ", "to scale the gradients by it anyway");
}

/// acc combined with one gradient's power sum s: their sum, or for p = inf their max; NaN propagates.
double add_part(double acc, double s, double p) {
  if (!std::isinf(p)) return acc + s;
  return std::isnan(s) || std::isnan(acc) ? std::numeric_limits<double>::quiet_NaN() : std::max(acc, s);
}

/// The total norm from the combined power sums; scales the gradients by
/// clamp(max_norm / (total + 1e-6), max = 1) and returns the total.
double clip_by_total(const std::vector<Tensor>& grads, double max_norm, double p, double acc, bool error_if_nonfinite) {
  const double total = std::isinf(p) || p == 1.0 ? acc : p == 2.0 ? std::sqrt(acc) : std::pow(acc, 1.0 / p);
  if (error_if_nonfinite) check_finite_total(total, p);
  const double coef = max_norm / (total + 1e-6);
  if (!(coef >= 1.0))  // clamp(coef, max=1): scale when coef < 1 or NaN
    for (const Tensor& g : grads) ops::mul_(g, coef);
  return total;
}

double clip_cpu(const std::vector<Tensor>& grads, double max_norm, double p, bool error_if_nonfinite = false) {
  double acc = 0.0;
  for (const Tensor& g : grads) acc = add_part(acc, cpu_power_sum(g, p), p);
  return clip_by_total(grads, max_norm, p, acc, error_if_nonfinite);
}

#ifdef FRUGAL_WITH_CUDA
/// The CUDA path (Note [Clipping without a sync]): returns the 0-d total norm (norm_dtype).
Tensor clip_cuda(const std::vector<Tensor>& grads, double max_norm, double p, bool error_if_nonfinite) {
  const Device device = grads[0].device();
  // Dense gradients (any memory order), by dtype; another strided gradient is normed
  // through a contiguous copy and scaled with ops::mul_.
  struct ByType {
    DType dtype;
    std::vector<detail::NormEntry> norm, scale;  // scale: the dense gradients only
    int64_t chunks = 0;                          // of `norm`
  };
  std::vector<ByType> groups;
  std::vector<Tensor> copies, strided;
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const ByType& b) { return b.dtype == g.dtype(); });
    if (it == groups.end()) it = groups.insert(groups.end(), ByType{g.dtype(), {}, {}, 0});
    if (is_dense(g)) {  // any dense memory order is walked flat
      it->norm.push_back({g.data(), g.numel(), 0, 0});
      it->scale.push_back({g.data(), g.numel(), 0, 0});
    } else {
      const Tensor& c = copies.emplace_back(g.contiguous());
      strided.push_back(g);
      it->norm.push_back({c.data(), c.numel(), 0, 0});
    }
    it->chunks += (g.numel() + detail::kChunk - 1) / detail::kChunk;
  }
  int64_t chunks = 0;
  for (const ByType& b : groups) chunks += b.chunks;
  if (chunks == 0) return zeros({}, TensorOptions(norm_dtype(grads), device));

  Tensor partials = empty({chunks}, TensorOptions(kFloat64, device));
  int64_t offset = 0;
  for (ByType& b : groups) {
    cuda::norm_partials(device, b.dtype, b.norm, p, partials.data_ptr<double>(), offset);
    offset += b.chunks;
  }
  const Tensor reduced = std::isinf(p) ? ops::amax(partials) : ops::sum(partials);  // 0-d float64
  Tensor total = empty({}, TensorOptions(norm_dtype(grads), device));
  Tensor coef = empty({}, TensorOptions(kFloat64, device));
  cuda::clip_coefficient(device, reduced.data_ptr<double>(), p, max_norm, total.dtype(), total.data(),
                         coef.data_ptr<double>());

  if (error_if_nonfinite) check_finite_total(total.to(kCPU, kFloat64).item<double>(), p);  // a sync, asked for
  // Scale in place: the dense gradients in one launch per dtype, the strided ones with mul_.
  for (ByType& b : groups) cuda::scale(device, b.dtype, b.scale, coef.data_ptr<double>());
  for (const Tensor& g : strided) ops::mul_(g, coef);
  for (const Tensor& g : grads)
    if (is_dense(g)) g.bump_version();
  return total;
}
#endif

/// The CUDA path, or a clear error in a CPU-only build.
Tensor clip_device(const std::vector<Tensor>& grads, double max_norm, double p, bool error_if_nonfinite = false) {
#ifdef FRUGAL_WITH_CUDA
  return clip_cuda(grads, max_norm, p, error_if_nonfinite);
#else
  (void)max_norm, (void)p, (void)error_if_nonfinite;
  throw_no_cuda("clip_grad_norm_", grads[0].device());
#endif
}

}  // namespace

Tensor clip_grad_norm_async(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, max_norm, norm_type);
  if (grads.empty()) return zeros({}, TensorOptions(kFloat32));
  if (grads[0].is_cuda()) return clip_device(grads, max_norm, norm_type);
  return scalar_tensor(clip_cpu(grads, max_norm, norm_type), TensorOptions(norm_dtype(grads)));
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  FRUGAL_CHECK(clip_value >= 0, "clip_grad_value_: clip_value must be >= 0 (or infinity), got ", clip_value);
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : params) {
    const Tensor g = p.defined() ? p.grad() : Tensor();
    if (!g.defined()) continue;
    ops::copy_into(g, ops::clamp(g, -clip_value, clip_value));
    g.bump_version();
  }
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, max_norm, norm_type);
  if (grads.empty()) return 0.0;
  if (!grads[0].is_cuda()) return clip_cpu(grads, max_norm, norm_type, error_if_nonfinite);
  return clip_device(grads, max_norm, norm_type, error_if_nonfinite).to(kCPU, kFloat64).item<double>();  // one sync
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       const std::function<double(double part, bool is_max)>& combine) {
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(params, max_norm, norm_type);
  const double p = norm_type;
  double acc = 0.0;
  for (const Tensor& g : grads) {
    double part;
    if (g.device().is_cpu()) {
      part = cpu_power_sum(g, p);
    } else {  // a host read per gradient
      const Tensor a = ops::abs(g.to(kFloat64));
      part = (std::isinf(p) ? ops::amax(a) : ops::sum(ops::pow(a, p))).item<double>();
    }
    acc = add_part(acc, part, p);
  }
  // Every process calls combine, with or without gradients: it is a collective.
  return clip_by_total(grads, max_norm, p, combine(acc, std::isinf(p)), /*error_if_nonfinite=*/false);
}

}  // namespace frugal::optim
