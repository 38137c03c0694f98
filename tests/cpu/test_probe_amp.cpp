// Probes for silent wrong answers in mixed precision on the CPU, against independent
// references: GradScaler (optim/grad_scaler.h) against torch.cuda.amp.GradScaler's documented
// rules simulated in float64 (backoff and skip on inf/NaN anywhere in any group, growth after
// growth_interval clean steps, growth capped below float32 max, unscale_ -> clip_grad_norm_
// -> step unscaling once, None gradients skipped, a mid-interval state dict round trip, a
// disabled scaler as the identity, a 16-bit loss scaled in float), autocast
// (autograd/autocast.h) on views against the rounded float64 answer, its output dtypes
// against the documented policy, nested guards, the cast cache after in-place changes of a
// weight (optimizer steps, writes by hand, Module::to, FSDP gathers), batch norm's float32
// statistics of 16-bit activations, FP32 master weights of bfloat16/float16 parameters
// (OffloadAdamW) against a float64 AdamW, also after the weights are written by hand or
// reloaded, and LossWatch under bfloat16 autocast. A failing case here is a finding.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/galore.h"
#include "optim/grad_scaler.h"
#include "optim/offload_adam.h"
#include "optim/sgd.h"
#include "parallel/fsdp.h"
#include "parallel/thread_communicator.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"
#include "tests/test_util.h"
#include "train/checks.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Values = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- independent rounding: float32 -> bfloat16 / float16, round to nearest even ----------

double round_bf16(double x) {
  const float f = float(x);
  if (std::isnan(f)) return f;
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even, on the low 16 bits
  u &= 0xFFFF0000u;
  return double(std::bit_cast<float>(u));
}

double round_f16(double x) { return double(static_cast<_Float16>(float(x))); }

double round_to(DType dt, double x) {
  if (dt == kBFloat16) return round_bf16(x);
  if (dt == kFloat16) return round_f16(x);
  if (dt == kFloat32) return double(float(x));
  return x;
}

Values rounded(DType dt, Values v) {
  for (double& x : v) x = round_to(dt, x);
  return v;
}

/// The unit roundoff of a dtype.
double eps_of(DType dt) { return dt == kBFloat16 ? 0x1p-8 : dt == kFloat16 ? 0x1p-11 : 0x1p-24; }

/// a (M, K) times b (K, N), row-major, in float64.
Values matmul_ref(const Values& a, const Values& b, int64_t M, int64_t K, int64_t N) {
  Values c(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += a[size_t(i * K + k)] * b[size_t(k * N + j)];
      c[size_t(i * N + j)] = s;
    }
  return c;
}

/// `got` (a low-precision result) equals the rounding of `exact` to `dt` within one rounding
/// of dt plus float32 accumulation error (bounded by K * 2^-24 * the sum of |terms|).
void check_rounded(const Tensor& got, DType dt, const Values& exact, const Values& abs_terms, int64_t K,
                   const std::string& what) {
  const Values g = values_of(got);
  REQUIRE(g.size() == exact.size());
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = eps_of(dt) * std::fabs(exact[i]) + double(K + 2) * 0x1p-24 * abs_terms[i] +
                       std::numeric_limits<float>::denorm_min();
    if (!(std::fabs(g[i] - exact[i]) <= tol) && bad++ == 0)
      MESSAGE(what, ": first mismatch at ", i, ": got ", g[i], " want ", exact[i], " tol ", tol);
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", g.size(), " differ");
}

bool bit_equal(const Tensor& a, const Tensor& b) { return bytes_of(a) == bytes_of(b); }

void set_grad(const Tensor& p, const Values& g) { p.set_grad(make_tensor(g, p.sizes(), p.dtype())); }

/// torch's _amp_update_scale_ in float64, the scale rounded to float32 as torch stores it.
struct ScaleRef {
  double scale;
  int64_t tracker = 0;
  double growth, backoff;
  int64_t interval;
  void update(bool found_inf) {
    if (found_inf) {
      scale = double(float(scale * backoff));
      tracker = 0;
    } else if (++tracker == interval) {
      const float grown = float(scale * growth);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    }
  }
};

}  // namespace

// ---- GradScaler -----------------------------------------------------------------------

TEST_CASE("probe amp: an inf or NaN in one parameter of one param group skips the whole step and backs off") {
  // Two groups (SGD with momentum, so skipped state is visible too); every iteration's
  // gradient is g * scale; some iterations put an inf or a NaN into one element of one
  // parameter. torch: found_inf for the optimizer is the OR over all groups, the whole
  // optimizer.step is skipped, scale *= backoff, tracker = 0.
  const optim::GradScalerOptions o{
      .init_scale = 1024.0, .growth_factor = 2.0, .backoff_factor = 0.25, .growth_interval = 3};
  Tensor a = param_tensor({1.0, -2.0, 0.5}, {3}), b = param_tensor({3.0, 4.0}, {2}), c = param_tensor({-1.0}, {1});
  optim::SGD opt({{.params = {a, b}}, {.params = {c}, .lr = 0.05}}, {.lr = 0.1, .momentum = 0.9});
  optim::GradScaler scaler(o);
  ScaleRef ref{.scale = o.init_scale, .growth = 2.0, .backoff = 0.25, .interval = 3};
  // float64 SGD with momentum (torch: buf = g at the first step, then buf = m buf + g).
  Values pa = {1.0, -2.0, 0.5}, pb = {3.0, 4.0}, pc = {-1.0};
  Values ba, bb, bc;
  auto sgd = [](Values& p, Values& buf, const Values& g, double lr) {
    if (buf.empty()) buf = g;
    else
      for (size_t i = 0; i < p.size(); ++i) buf[i] = 0.9 * buf[i] + g[i];
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * buf[i];
  };
  const std::string pattern = "ccAcccBccccCcc";  // c clean; A: inf in a; B: NaN in b; C: -inf in group 1's c
  for (size_t it = 0; it < pattern.size(); ++it) {
    CAPTURE(it);
    const char k = pattern[it];
    const double s = scaler.get_scale();
    REQUIRE(s == ref.scale);
    const Values ga = {0.5 + 0.1 * double(it), -0.25, 1.0}, gb = {0.125, -1.0}, gc = {0.75};
    Values sa = {ga[0] * s, ga[1] * s, ga[2] * s}, sb = {gb[0] * s, gb[1] * s}, sc = {gc[0] * s};
    if (k == 'A') sa[1] = kInf;
    if (k == 'B') sb[0] = std::nan("");
    if (k == 'C') sc[0] = -kInf;
    set_grad(a, sa);
    set_grad(b, sb);
    set_grad(c, sc);
    const std::vector<uint8_t> a0 = bytes_of(a), b0 = bytes_of(b), c0 = bytes_of(c);
    scaler.step(opt);
    const bool bad = k != 'c';
    if (bad) {
      CHECK(bytes_of(a) == a0);  // skipped in every group
      CHECK(bytes_of(b) == b0);
      CHECK(bytes_of(c) == c0);
    } else {
      sgd(pa, ba, ga, 0.1);
      sgd(pb, bb, gb, 0.1);
      sgd(pc, bc, gc, 0.05);
    }
    scaler.update();
    ref.update(bad);
    CHECK(scaler.get_scale() == ref.scale);
    CHECK(scaler.get_growth_tracker() == ref.tracker);
    check_close(a, pa, 1e-5, 1e-6, "a");
    check_close(b, pb, 1e-5, 1e-6, "b");
    check_close(c, pc, 1e-5, 1e-6, "c");
  }
}

TEST_CASE("probe amp: unscale_ then clip_grad_norm_ then step uses the unscaled, clipped gradients exactly once") {
  for (const double scale : {65536.0, 3.0}) {  // a power of two, and one whose reciprocal rounds
    CAPTURE(scale);
    Tensor w = param_tensor({1.0, 2.0, -1.0, 0.5}, {2, 2}), bias = param_tensor({0.25, -0.75}, {2});
    Tensor frozen = param_tensor({7.0}, {1});  // never gets a gradient: skipped, as torch's None
    optim::SGD opt({w, bias, frozen}, {.lr = 1.0});
    optim::GradScaler scaler({.init_scale = scale});
    const Values gw = {3.0, -4.0, 1.0, 2.0}, gb = {-2.0, 1.0};
    const float inv = float(1.0 / double(float(scale)));  // torch: scale.double().reciprocal().float()
    auto unscaled = [&](double g) { return double(float(float(g * scale) * inv)); };
    Values sw, sb;
    for (double g : gw) sw.push_back(double(float(g * scale)));
    for (double g : gb) sb.push_back(double(float(g * scale)));
    set_grad(w, sw);
    set_grad(bias, sb);
    scaler.unscale_(opt);
    Values uw, ub;
    for (double g : gw) uw.push_back(unscaled(g));
    for (double g : gb) ub.push_back(unscaled(g));
    CHECK(values_of(w.grad()) == uw);
    CHECK(values_of(bias.grad()) == ub);
    double sq = 0;
    for (double g : uw) sq += g * g;
    for (double g : ub) sq += g * g;
    const double norm = std::sqrt(sq);  // sqrt(35)
    const double max_norm = 2.0;
    const double got_norm = optim::clip_grad_norm_({w, bias, frozen}, max_norm);
    CHECK(got_norm == doctest::Approx(norm).epsilon(1e-6));
    const double coef = std::min(1.0, max_norm / (norm + 1e-6));  // torch's clip_coef_clamped
    scaler.step(opt);
    Values ew = {1.0, 2.0, -1.0, 0.5}, eb = {0.25, -0.75};
    for (size_t i = 0; i < 4; ++i) ew[i] -= uw[i] * coef;
    for (size_t i = 0; i < 2; ++i) eb[i] -= ub[i] * coef;
    check_close(w, ew, 1e-6, 1e-7, "w");
    check_close(bias, eb, 1e-6, 1e-7, "bias");
    CHECK(values_of(frozen) == Values{7.0});
    CHECK_FALSE(frozen.grad().defined());
    scaler.update();
    CHECK(scaler.get_scale() == scale);
    CHECK(scaler.get_growth_tracker() == 1);
  }
}

TEST_CASE("probe amp: unscale_ of a strided gradient view writes back through the view and bumps its version") {
  // A gradient that is every other element of a longer buffer (not dense): unscaled through
  // a copy; the elements between must stay, and the version moves so stale copies are seen.
  Tensor p = param_tensor({1.0, 2.0, 3.0}, {3});
  Tensor buffer = from_vector<float>({8.0f, 100.0f, -16.0f, 100.0f, 32.0f, 100.0f}, {6});
  const Tensor g = buffer.slice(0, 0, 6, 2);
  p.set_grad(g);
  optim::SGD opt({p}, {.lr = 1.0});
  optim::GradScaler scaler({.init_scale = 8.0});
  const uint64_t v0 = p.grad().version();
  scaler.unscale_(opt);
  CHECK(values_of(p.grad()) == Values{1.0, -2.0, 4.0});
  CHECK(values_of(buffer) == Values{1.0, 100.0, -2.0, 100.0, 4.0, 100.0});
  CHECK(p.grad().version() != v0);
  scaler.step(opt);
  CHECK(values_of(p) == Values{0.0, 4.0, -1.0});
}

TEST_CASE("probe amp: growth stops below float32 max, and a non-power-of-two growth rounds to float32 each time") {
  // torch: new_scale = scale * growth_factor; kept only if finite; the tracker resets either way.
  for (const double growth : {2.0, 3.0, 1.5}) {
    CAPTURE(growth);
    const double init = 1e37;
    optim::GradScaler scaler({.init_scale = init, .growth_factor = growth, .growth_interval = 2});
    ScaleRef ref{.scale = double(float(init)), .growth = growth, .backoff = 0.5, .interval = 2};
    Tensor p = param_tensor({0.0}, {1});
    optim::SGD opt({p}, {.lr = 0.0});
    for (int it = 0; it < 24; ++it) {
      CAPTURE(it);
      set_grad(p, {0.0});
      scaler.step(opt);
      scaler.update();
      ref.update(false);
      CHECK(scaler.get_scale() == ref.scale);
      CHECK(scaler.get_growth_tracker() == ref.tracker);
      CHECK(std::isfinite(scaler.get_scale()));
    }
    CHECK(ref.scale * growth > double(std::numeric_limits<float>::max()));  // the cap was reached
  }
}

TEST_CASE("probe amp: a state dict saved one step before growth resumes exactly on schedule") {
  const optim::GradScalerOptions o{
      .init_scale = 256.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 4};
  Tensor p = param_tensor({1.0, 1.0}, {2});
  optim::SGD opt({p}, {.lr = 0.0});
  optim::GradScaler a(o);
  ScaleRef ref{.scale = 256.0, .growth = 2.0, .backoff = 0.5, .interval = 4};
  const std::string before =
      "cicccc"
      "ccc";  // ends with the tracker at 3 = interval - 1
  for (char k : before) {
    set_grad(p, {k == 'i' ? kInf : 1.0, 1.0});
    a.step(opt);
    a.update();
    ref.update(k == 'i');
  }
  REQUIRE(ref.tracker == 3);
  CHECK(a.get_growth_tracker() == 3);
  const optim::StateDict sd = a.state_dict();
  optim::GradScaler b({.init_scale = 2.0, .growth_interval = 100});  // everything comes from the dict
  b.load_state_dict(sd);
  for (char k : std::string("ccccci")) {
    CAPTURE(k);
    set_grad(p, {k == 'i' ? kInf : 1.0, 1.0});
    b.step(opt);
    b.update();
    ref.update(k == 'i');
    CHECK(b.get_scale() == ref.scale);
    CHECK(b.get_growth_tracker() == ref.tracker);
  }
}

TEST_CASE("probe amp: a disabled GradScaler is the identity, also around unscale_ and clip_grad_norm_") {
  Tensor p = param_tensor({1.0, 2.0}, {2}), q = param_tensor({1.0, 2.0}, {2});
  optim::SGD opt({p}, {.lr = 0.5}), twin({q}, {.lr = 0.5});
  optim::GradScaler scaler({.init_scale = 1024.0, .enabled = false});
  for (int it = 0; it < 3; ++it) {
    const Tensor loss = sum(mul(p, p));
    const Tensor scaled = scaler.scale(loss);
    CHECK(values_of(scaled) == values_of(loss));
    scaled.backward();
    sum(mul(q, q)).backward();
    scaler.unscale_(opt);
    CHECK(values_of(p.grad()) == values_of(q.grad()));
    optim::clip_grad_norm_({p}, 1.0);
    optim::clip_grad_norm_({q}, 1.0);
    scaler.step(opt);
    twin.step();
    scaler.update();
    CHECK(bit_equal(p, q));
    opt.zero_grad();
    twin.zero_grad();
  }
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE("probe amp: scale() of a float16 or bfloat16 loss multiplies in float32; backward scales by 2^16") {
  // A 16-bit loss times 2^16: torch multiplies in float32 (opmath) and rounds once, so
  // 1e-3 * 65536 = 65.5 in float16, not inf (65536 itself is not a float16).
  for (const DType dt : {kFloat16, kBFloat16}) {
    const std::string dtype_str = dtype_name(dt);
    CAPTURE(dtype_str);
    Tensor w = param_tensor({0.5, -0.25}, {2}, dt);
    const Tensor x = make_tensor({1e-3, 2e-3}, {2}, dt);
    optim::GradScaler scaler;  // 65536
    const Tensor loss = sum(mul(w, x));
    const Tensor scaled = scaler.scale(loss);
    CHECK(scaled.dtype() == loss.dtype());
    const double l = values_of(loss)[0];
    CHECK(values_of(scaled)[0] == round_to(dt, double(float(l) * 65536.0f)));
    CHECK(std::isfinite(values_of(scaled)[0]));
    // Backward: d(scaled)/dw = 65536 x. In bfloat16 that is exact; in float16 the incoming
    // gradient 65536 is itself inf (in torch too), which is what backoff is for.
    scaled.backward();
    const Values xs = values_of(x), gw = values_of(w.grad());
    for (size_t i = 0; i < 2; ++i) {
      if (dt == kBFloat16) CHECK(gw[i] == xs[i] * 65536.0);
      else CHECK_FALSE(std::isfinite(gw[i]));
    }
  }
}

TEST_CASE("probe amp: float16 and bfloat16 gradients are unscaled in float and rounded once (documented)") {
  // Unlike torch (which refuses float16 gradients in unscale_), frugal unscales them:
  // Note [Fused unscale]. Reference: float(g) * float(1/scale), rounded to the dtype.
  for (const DType dt : {kFloat16, kBFloat16}) {
    const std::string dtype_str = dtype_name(dt);
    CAPTURE(dtype_str);
    const Values g = {3.0, -1000.0, 0.0078125, 60000.0, -7.5, 1e-3};
    Tensor p = param_tensor(Values(g.size(), 0.0), {int64_t(g.size())}, dt);
    optim::SGD opt({p}, {.lr = 1.0});
    optim::GradScaler scaler({.init_scale = 3.0});
    set_grad(p, g);
    const Values stored = values_of(p.grad());
    scaler.unscale_(opt);
    const float inv = float(1.0 / 3.0);
    Values want;
    for (double s : stored) want.push_back(round_to(dt, double(float(s) * inv)));
    CHECK(values_of(p.grad()) == want);
  }
}

// ---- autocast: views, dtypes, nesting -------------------------------------------------

TEST_CASE("probe amp: matmul and linear on transposed, strided, narrowed and expanded views under autocast") {
  const int64_t M = 5, K = 7, N = 3;
  for (const DType low : {kBFloat16, kFloat16}) {
    for (const Layout la : kAllLayouts) {
      for (const Layout lb : kAllLayouts) {
        const std::string dtype_str = dtype_name(low);
        CAPTURE(dtype_str);
        CAPTURE(layout_name(la));
        CAPTURE(layout_name(lb));
        const Values av = random_values(M * K, 11), bv = random_values(K * N, 12);
        const Tensor a = make_tensor(av, {M, K}, kFloat32, la), b = make_tensor(bv, {K, N}, kFloat32, lb);
        const Values ar = rounded(low, av), br = rounded(low, bv);
        Values abs_a = ar, abs_b = br;
        for (double& v : abs_a) v = std::fabs(v);
        for (double& v : abs_b) v = std::fabs(v);
        const Values want = matmul_ref(ar, br, M, K, N), terms = matmul_ref(abs_a, abs_b, M, K, N);
        AutocastGuard amp(kCPU, low);
        const Tensor c = matmul(a, b);
        CHECK(c.dtype() == low);
        check_rounded(c, low, rounded(low, want), terms, K, "matmul");
        // linear(x, w): w is (N, K), here b's transpose (a view of b's storage).
        const Tensor y = linear(a, b.t());
        CHECK(y.dtype() == low);
        check_rounded(y, low, rounded(low, want), terms, K, "linear");
      }
    }
    // A batch broadcast by expand (stride 0) and a narrowed (offset) operand.
    const std::string dtype_str = dtype_name(low);
    CAPTURE(dtype_str);
    const Values av = random_values(M * K, 21), bv = random_values(2 * K * N, 22);
    const Tensor a = make_tensor(av, {1, M, K}, kFloat32).expand({4, M, K});
    const Tensor bwide = make_tensor(bv, {2 * K, N}, kFloat32);
    const Tensor b = bwide.narrow(0, K, K);  // rows K..2K-1
    const Values ar = rounded(low, av), br = rounded(low, Values(bv.begin() + K * N, bv.end()));
    Values abs_a = ar, abs_b = br;
    for (double& v : abs_a) v = std::fabs(v);
    for (double& v : abs_b) v = std::fabs(v);
    const Values one = rounded(low, matmul_ref(ar, br, M, K, N)), terms1 = matmul_ref(abs_a, abs_b, M, K, N);
    Values want, terms;
    for (int r = 0; r < 4; ++r) {
      want.insert(want.end(), one.begin(), one.end());
      terms.insert(terms.end(), terms1.begin(), terms1.end());
    }
    AutocastGuard amp(kCPU, low);
    const Tensor c = matmul(a, b);
    CHECK(c.dtype() == low);
    CHECK(c.sizes() == Shape{4, M, N});
    check_rounded(c, low, want, terms, K, "expanded batch matmul");
  }
}

TEST_CASE("probe amp: float32-policy ops on transposed low-precision views give float32 of the rounded inputs") {
  // softmax over dim -1 of a transposed bfloat16 view: autocast casts it to float32; the
  // answer is the float64 softmax of the bfloat16 values, to float32 accuracy.
  const int64_t R = 4, C = 6;
  for (const DType low : {kBFloat16, kFloat16}) {
    const std::string dtype_str = dtype_name(low);
    CAPTURE(dtype_str);
    const Values v = random_values(R * C, 31, -4.0, 4.0);
    const Tensor x = make_tensor(v, {R, C}, low, Layout::Transposed);
    const Values xr = rounded(low, v);
    Values want(size_t(R * C));
    for (int64_t i = 0; i < R; ++i) {
      double m = -kInf, s = 0;
      for (int64_t j = 0; j < C; ++j) m = std::max(m, xr[size_t(i * C + j)]);
      for (int64_t j = 0; j < C; ++j) s += std::exp(xr[size_t(i * C + j)] - m);
      for (int64_t j = 0; j < C; ++j) want[size_t(i * C + j)] = std::exp(xr[size_t(i * C + j)] - m) / s;
    }
    AutocastGuard amp(kCPU, low);
    const Tensor y = softmax(x, -1);
    CHECK(y.dtype() == kFloat32);
    check_close(y, want, 1e-6, 1e-7, "softmax");
    const Tensor total = sum(x.t());  // float32 sum of a (C, R) view: all 24 rounded values
    CHECK(total.dtype() == kFloat32);
    double ref = 0;
    for (double e : xr) ref += e;
    check_close(total, {ref}, 1e-6, 1e-6, "sum");
  }
}

TEST_CASE("probe amp: output dtypes follow the documented autocast policy on the CPU") {
  // Note [Autocast]: Lower -> the autocast dtype; Float32 -> float32; binary ops promote;
  // float64 and integer tensors pass untouched; other ops keep their input's dtype.
  for (const DType low : {kBFloat16, kFloat16}) {
    const std::string dtype_str = dtype_name(low);
    CAPTURE(dtype_str);
    const Tensor x = random_tensor({2, 4}, kFloat32, 1), w = random_tensor({3, 4}, kFloat32, 2);
    const Tensor b = random_tensor({3}, kFloat32, 3);
    const Tensor img = random_tensor({1, 2, 5, 5}, kFloat32, 4), k = random_tensor({3, 2, 3, 3}, kFloat32, 5);
    const Tensor target = from_vector<int64_t>({0, 2}, {2});
    const Tensor d = random_tensor({2, 4}, kFloat64, 6);
    AutocastGuard amp(kCPU, low);
    const Tensor h = linear(x, w, b);
    CHECK(h.dtype() == low);
    CHECK(matmul(x, w.t()).dtype() == low);
    CHECK(conv2d(img, k).dtype() == low);
    CHECK(relu(h).dtype() == low);  // not in either list: keeps its input's dtype
    CHECK(softmax(h, -1).dtype() == kFloat32);
    CHECK(log_softmax(h, -1).dtype() == kFloat32);
    CHECK(layer_norm(h, {3}).dtype() == kFloat32);
    CHECK(cross_entropy(h, target).dtype() == kFloat32);
    CHECK(mse_loss(h, h).dtype() == kFloat32);
    CHECK(sum(h).dtype() == kFloat32);
    CHECK(mean(h).dtype() == kFloat32);
    CHECK(exp(h).dtype() == kFloat32);
    CHECK(add(h, b).dtype() == kFloat32);  // promotes to the widest input
    CHECK(add(h, h).dtype() == low);
    CHECK(matmul(d, d.t()).dtype() == kFloat64);  // float64 is never cast
    CHECK(softmax(d, -1).dtype() == kFloat64);
  }
}

TEST_CASE("probe amp: nested guards switch dtype and off, and each exit restores the ops' previous behaviour") {
  const Tensor x = random_tensor({2, 3}, kFloat32, 7), w = random_tensor({3, 3}, kFloat32, 8);
  auto out = [&] { return matmul(x, w).dtype(); };
  CHECK(out() == kFloat32);
  {
    AutocastGuard outer(kCPU, kBFloat16);
    CHECK(out() == kBFloat16);
    {
      AutocastGuard inner(kCPU, kFloat16);
      CHECK(out() == kFloat16);
      {
        AutocastGuard off(kCPU, kBFloat16, false);
        CHECK(out() == kFloat32);
        {
          AutocastGuard cuda_only(Device(DeviceType::CUDA, 0), kFloat16);  // another device type
          CHECK(out() == kFloat32);
        }
        CHECK(out() == kFloat32);
      }
      CHECK(out() == kFloat16);
    }
    CHECK(out() == kBFloat16);
    CHECK(autocast::dtype(DeviceType::CPU) == kBFloat16);
  }
  CHECK(out() == kFloat32);
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
  CHECK_FALSE(autocast::is_enabled(DeviceType::CUDA));
  CHECK(autocast::cache_size() == 0);
}

TEST_CASE("probe amp: batch_norm of a bfloat16/float16 activation keeps its dtype with float32 statistics") {
  // Note [Autocast]: batch_norm keeps x's dtype; the statistics are float32 (as cuDNN under
  // torch.autocast). Values near 100 with a small spread: statistics summed in the low dtype
  // would lose them. Reference: float64 from the rounded inputs (torch's running_var is
  // unbiased, the normalisation biased).
  const int64_t N = 4, C = 3, H = 2, W = 2, per = N * H * W;
  for (const DType low : {kBFloat16, kFloat16}) {
    for (const bool channels_last : {false, true}) {
      const std::string dtype_str = dtype_name(low);
      CAPTURE(dtype_str);
      CAPTURE(channels_last);
      Values xv = random_values(N * C * H * W, 71, -1.0, 1.0);
      for (double& v : xv) v += 100.0;
      Tensor x = make_tensor(xv, {N, C, H, W}, low);
      if (channels_last) x = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
      const Values xr = rounded(low, xv);
      Tensor rm = make_tensor({0.5, -0.5, 1.0}, {C}, kFloat32), rv = make_tensor({1.0, 2.0, 0.5}, {C}, kFloat32);
      const Tensor w = make_tensor({1.5, -0.5, 2.0}, {C}, kFloat32), b = make_tensor({0.25, 0.0, -1.0}, {C}, kFloat32);
      Tensor y;
      {
        AutocastGuard amp(kCPU, low);
        y = batch_norm(x, rm, rv, w, b, /*training=*/true, 0.1, 1e-5);
      }
      CHECK(y.dtype() == low);
      CHECK(rm.dtype() == kFloat32);
      Values want_y(xv.size()), want_rm, want_rv;
      const Values rm0 = {0.5, -0.5, 1.0}, rv0 = {1.0, 2.0, 0.5}, wv = {1.5, -0.5, 2.0}, bv = {0.25, 0.0, -1.0};
      for (int64_t c = 0; c < C; ++c) {
        double mean = 0, sq = 0;
        auto at = [&](int64_t n, int64_t i) { return size_t((n * C + c) * H * W + i); };
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < H * W; ++i) mean += xr[at(n, i)];
        mean /= double(per);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < H * W; ++i) sq += (xr[at(n, i)] - mean) * (xr[at(n, i)] - mean);
        const double var = sq / double(per);
        want_rm.push_back(0.9 * rm0[size_t(c)] + 0.1 * mean);
        want_rv.push_back(0.9 * rv0[size_t(c)] + 0.1 * sq / double(per - 1));
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < H * W; ++i)
            want_y[at(n, i)] = (xr[at(n, i)] - mean) / std::sqrt(var + 1e-5) * wv[size_t(c)] + bv[size_t(c)];
      }
      check_close(rm, want_rm, 1e-6, 1e-6, "running_mean");
      check_close(rv, want_rv, 1e-5, 1e-6, "running_var");
      // One rounding to the low dtype, plus float32 error amplified by 1/std (about 2).
      check_close(y, want_y, 2 * eps_of(low), 1e-4, "y");
    }
  }
}

// ---- the cast cache after in-place changes of a weight --------------------------------

namespace {

/// One forward of y = x W^T under `low` autocast: W's cast comes from the cache when valid.
Tensor forward(const Tensor& x, const Tensor& w) { return linear(x, w); }

/// The same product from W's current values, cast by hand, outside any cache.
Values fresh(const Tensor& x, const Tensor& w, DType low) {
  const Values xv = rounded(low, values_of(x)), wv = rounded(low, values_of(w));
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  Values wt(size_t(K * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) wt[size_t(k * N + n)] = wv[size_t(n * K + k)];
  return rounded(low, matmul_ref(xv, wt, M, K, N));
}

/// Checks one guarded forward against the weights as they are now.
void check_current(const Tensor& x, const Tensor& w, DType low, const std::string& what) {
  const Tensor y = forward(x, w);
  const Values want = fresh(x, w, low);
  Values terms(want.size(), 0.0);
  for (double& t : terms) t = 8.0;  // |x|,|w| < 2, K = 4: a loose bound on sum |terms|
  check_rounded(y, low, want, terms, x.size(1), what);
}

}  // namespace

TEST_CASE("probe amp: a cached weight cast is never stale after an optimizer step inside one guard") {
  for (const DType low : {kBFloat16, kFloat16}) {
    for (int which = 0; which < 5; ++which) {
      const std::string dtype_str = dtype_name(low);
      CAPTURE(dtype_str);
      CAPTURE(which);
      const Tensor x = random_tensor({3, 4}, kFloat32, 41);
      Tensor w = param_tensor(random_values(8, 42), {2, 4});
      std::unique_ptr<optim::Optimizer> opt;
      if (which == 0) opt = std::make_unique<optim::SGD>(std::vector<Tensor>{w}, optim::SGDOptions{.lr = 0.01});
      if (which == 1) opt = std::make_unique<optim::Adam>(std::vector<Tensor>{w}, optim::AdamOptions{.lr = 0.1});
      if (which == 2) opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{w}, optim::AdamWOptions{.lr = 0.1});
      if (which == 3)
        opt = std::make_unique<optim::OffloadAdamW>(std::vector<Tensor>{w}, optim::OffloadAdamWOptions{.lr = 0.1});
      if (which == 4)
        opt = std::make_unique<optim::GaLoreAdamW>(std::vector<Tensor>{w}, optim::GaLoreOptions{.lr = 0.1, .rank = 1});
      optim::GradScaler scaler({.init_scale = 128.0});
      AutocastGuard amp(kCPU, low);  // one guard around three training steps
      for (int step = 0; step < 3; ++step) {
        CAPTURE(step);
        const Tensor y = forward(x, w);
        check_rounded(y, low, fresh(x, w, low), Values(6, 8.0), 4, "forward");
        opt->zero_grad();
        scaler.scale(sum(mul(y, y))).backward();
        const Values before = values_of(w);
        scaler.step(*opt);
        scaler.update();
        REQUIRE(values_of(w) != before);  // the step changed the weight
      }
      check_current(x, w, low, "after the last step");
    }
  }
}

TEST_CASE("probe amp: a cached weight cast is never stale after the weight is changed in place by hand") {
  // Everything that writes a parameter's values: torch bumps its version in each case.
  for (int which = 0; which < 6; ++which) {
    CAPTURE(which);
    const DType low = kBFloat16;
    const Tensor x = random_tensor({3, 4}, kFloat32, 51);
    auto lin = std::make_shared<nn::Linear>(4, 2, nn::LinearOptions{.bias = false});
    Tensor& w = lin->weight;
    nn::init::uniform_(w, -1.0, 1.0);
    AutocastGuard amp(kCPU, low);
    check_current(x, w, low, "first use");
    {
      autograd::NoGradGuard no_grad;
      if (which == 0) w.copy_(random_tensor({2, 4}, kFloat32, 52));
      if (which == 1) mul_(w, -0.5);
      if (which == 2) nn::init::uniform_(w, -1.0, 1.0);
      if (which == 3) nn::init::constant_(w, 0.75);
      if (which == 4) nn::init::normal_(w, 0.0, 1.0);
      if (which == 5) lin->load_state_dict(nn::NamedTensors{{"weight", random_tensor({2, 4}, kFloat32, 53)}});
    }
    check_current(x, w, low, "after the change");
  }
}

TEST_CASE("probe amp: a guard around several FSDP steps casts each step's gathered float32 weights afresh") {
  // FSDP (param_dtype float32) gathers every step's weights into the parameters' storage;
  // under one AutocastGuard around three steps each forward must use the weights the last
  // step made. Reference: the same run with a guard per step (no cast outlives a step).
  const Tensor x = random_tensor({4, 6}, kFloat32, 81), y = random_tensor({4, 3}, kFloat32, 82);
  auto run = [&](bool one_guard) {
    PerRank<Values> losses(2);
    const std::vector<std::shared_ptr<nn::Sequential>> models = {data_parallel_mlp(83), data_parallel_mlp(83)};
    parallel::run_ranks(2, [&](const std::shared_ptr<parallel::Communicator>& comm) {
      const int r = comm->rank();
      parallel::FullyShardedDataParallel fsdp(models[size_t(r)], comm, {.units = {"0", "2"}});
      optim::SGD opt(fsdp.parameters(), {.lr = 0.5});
      std::optional<AutocastGuard> outer;
      if (one_guard) outer.emplace(kCPU, kBFloat16);
      for (int s = 0; s < 3; ++s) {
        std::optional<AutocastGuard> per_step;
        if (!one_guard) per_step.emplace(kCPU, kBFloat16);
        const Tensor loss = mse_loss(fsdp.forward(rows(x, r, 2)), rows(y, r, 2));
        losses[size_t(r)].push_back(values_of(loss)[0]);
        loss.backward();
        opt.step();
        opt.zero_grad();
      }
    });
    return losses;
  };
  const PerRank<Values> want = run(false), got = run(true);
  REQUIRE(want[0][0] != want[0][2]);  // the steps changed the loss
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(got[size_t(r)] == want[size_t(r)]);
  }
}

// ---- FP32 master weights of 16-bit parameters ------------------------------------------

namespace {

/// torch's AdamW on one element in float64 (Note [Adam update]).
struct AdamWRef {
  double lr, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd;
  double m = 0, v = 0;
  int64_t t = 0;
  void step(double& p, double g) {
    ++t;
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double c1 = 1 - std::pow(b1, double(t)), c2 = 1 - std::pow(b2, double(t));
    p -= lr / c1 * m / (std::sqrt(v) / std::sqrt(c2) + eps);
  }
};

}  // namespace

TEST_CASE("probe amp: OffloadAdamW keeps float32 masters of bfloat16/float16 weights under GradScaler") {
  // Updates smaller than a 16-bit ulp accumulate in the master; the parameter is the master
  // rounded to its dtype; skipped steps leave master and moments untouched.
  for (const DType dt : {kBFloat16, kFloat16}) {
    const std::string dtype_str = dtype_name(dt);
    CAPTURE(dtype_str);
    const Values init = {1.0, -0.5, 0.25, 2.0};
    Tensor p = param_tensor(init, {4}, dt);
    optim::OffloadAdamW opt({p}, {.lr = 1e-4, .weight_decay = 0.1});
    optim::GradScaler scaler({.init_scale = 1024.0});
    std::vector<AdamWRef> ref(4, AdamWRef{.lr = 1e-4, .wd = 0.1});
    Values master = rounded(dt, init);
    const std::string pattern = "cccicccccc";
    for (size_t it = 0; it < pattern.size(); ++it) {
      CAPTURE(it);
      const double s = scaler.get_scale();
      Values g = {0.3, -0.7, 0.05 * double(it + 1), -1.1};
      Values sg;
      for (double e : g) sg.push_back(e * s);
      if (pattern[it] == 'i') sg[2] = kInf;
      set_grad(p, sg);
      scaler.step(opt);
      scaler.update();
      if (pattern[it] == 'c') {
        const Values stored = values_of(p.grad());  // the scaled gradient, in dt
        const float inv = float(1.0 / s);
        for (size_t i = 0; i < 4; ++i) ref[i].step(master[i], double(float(stored[i]) * inv));
      }
      const Tensor m = opt.master_param(p);
      REQUIRE(m.defined());
      REQUIRE(m.dtype() == kFloat32);
      check_close(m, master, 2e-6, 1e-7, "master");
      CHECK(values_of(p) == rounded(dt, values_of(m)));  // the weight is its master, rounded
    }
    // 9 clean steps of lr 1e-4 moved the master by ~1e-3 but a bfloat16 weight of 2.0 has
    // an ulp of 2^-6: only the master holds the progress.
    CHECK(std::fabs(master[3] - 2.0) > 5e-4);
  }
}

TEST_CASE("probe amp: OffloadAdamW's master follows a 16-bit weight changed by hand between steps") {
  // A bfloat16 model whose weights are replaced after training started (a checkpoint loaded
  // into the model, a layer re-initialised): the next step must update the new weights.
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);
    auto lin = std::make_shared<nn::Linear>(4, 1, nn::LinearOptions{.bias = false});
    lin->to(kBFloat16);
    Tensor& w = lin->weight;
    optim::OffloadAdamW opt(lin->parameters(), {.lr = 1e-2, .weight_decay = 0.0});
    set_grad(w, {1.0, -1.0, 0.5, 0.25});
    opt.step();                                         // the master exists now
    const Values fresh_values = {3.0, -2.0, 1.5, 0.5};  // exact in bfloat16
    {
      autograd::NoGradGuard no_grad;
      if (which == 0) lin->load_state_dict(nn::NamedTensors{{"weight", make_tensor(fresh_values, {1, 4}, kFloat32)}});
      if (which == 1) w.copy_(make_tensor(fresh_values, {1, 4}, kBFloat16));
      if (which == 2) nn::init::constant_(w, 3.0);
    }
    const Values now = values_of(w);
    REQUIRE(now == (which == 2 ? Values{3.0, 3.0, 3.0, 3.0} : fresh_values));
    // The second step, from the weights as they are now: AdamW at t = 2 on m, v of step 1.
    const Values g2 = {0.5, 0.5, -0.5, 1.0};
    set_grad(w, g2);
    opt.step();
    const Values g1 = {1.0, -1.0, 0.5, 0.25};
    Values want;
    for (size_t i = 0; i < 4; ++i) {
      AdamWRef r{.lr = 1e-2, .wd = 0.0};
      double scratch = 0;
      r.step(scratch, g1[i]);  // the moments of step 1
      double pi = now[i];
      r.step(pi, g2[i]);
      want.push_back(round_bf16(pi));
    }
    check_close(w, want, 0, 1e-12, "weight after the second step");
  }
}

TEST_CASE("probe amp: OffloadAdamW's model and optimizer loaded from one checkpoint resume bit-identically") {
  // The other side of Note [Master weights follow the parameter]: a weight that is still its
  // master rounded keeps the master's extra precision, whichever is loaded first.
  for (const bool model_first : {true, false}) {
    CAPTURE(model_first);
    auto make = [] {
      auto lin = std::make_shared<nn::Linear>(3, 2);
      lin->to(kBFloat16);
      return lin;
    };
    auto a = make();
    optim::OffloadAdamW opt_a(a->parameters(), {.lr = 1e-3});
    auto grads = [](int it) {
      return std::pair{random_values(6, 100 + uint64_t(it)), random_values(2, 200 + uint64_t(it))};
    };
    for (int it = 0; it < 3; ++it) {
      const auto [gw, gb] = grads(it);
      set_grad(a->weight, gw);
      set_grad(a->bias, gb);
      opt_a.step();
    }
    REQUIRE(values_of(opt_a.master_param(a->weight)) != values_of(a->weight));  // the master holds more
    nn::NamedTensors model_sd;
    for (const auto& [k, t] : a->state_dict()) model_sd.emplace_back(k, t.clone());
    optim::StateDict opt_sd;
    for (const auto& [k, t] : opt_a.state_dict()) opt_sd.emplace_back(k, t.clone());
    auto b = make();
    optim::OffloadAdamW opt_b(b->parameters(), {.lr = 1e-3});
    if (model_first) b->load_state_dict(model_sd);
    opt_b.load_state_dict(opt_sd);
    if (!model_first) b->load_state_dict(model_sd);
    for (int it = 3; it < 6; ++it) {
      const auto [gw, gb] = grads(it);
      for (auto* m : {&a, &b}) {
        set_grad((*m)->weight, gw);
        set_grad((*m)->bias, gb);
      }
      opt_a.step();
      opt_b.step();
      CHECK(bit_equal(a->weight, b->weight));
      CHECK(bit_equal(a->bias, b->bias));
      CHECK(bit_equal(opt_a.master_param(a->weight), opt_b.master_param(b->weight)));
    }
  }
}

TEST_CASE("probe amp: OffloadAdamW with unscale_, clip_grad_norm_ and GradScaler.step updates bfloat16 masters once") {
  Tensor p = param_tensor({0.5, -1.0, 2.0}, {3}, kBFloat16);
  optim::OffloadAdamW opt({p}, {.lr = 1e-2, .weight_decay = 0.0});
  optim::GradScaler scaler({.init_scale = 256.0});
  const Values g = {3.0, 4.0, -12.0};  // norm 13; scaled by 256: exact in bfloat16
  set_grad(p, {g[0] * 256, g[1] * 256, g[2] * 256});
  scaler.unscale_(opt);
  CHECK(values_of(p.grad()) == g);
  const double norm = optim::clip_grad_norm_({p}, 1.0);
  CHECK(norm == doctest::Approx(13.0).epsilon(1e-6));
  const Values clipped = values_of(p.grad());  // bfloat16 g * (1 / (13 + 1e-6))
  for (size_t i = 0; i < 3; ++i) CHECK(clipped[i] == round_bf16(double(float(g[i] * float(1.0 / (13.0 + 1e-6))))));
  scaler.step(opt);
  scaler.update();
  Values want = {0.5, -1.0, 2.0};
  for (size_t i = 0; i < 3; ++i) {
    AdamWRef r{.lr = 1e-2, .wd = 0.0};
    r.step(want[i], clipped[i]);
  }
  check_close(opt.master_param(p), want, 1e-6, 1e-8, "master");
  CHECK(values_of(p) == rounded(kBFloat16, values_of(opt.master_param(p))));
}

TEST_CASE("probe amp: two parameters that receive the same gradient buffer are unscaled once each") {
  // y = w1 + w2 sends one gradient tensor to both leaves; if both .grad shared it, unscale_
  // would divide it twice.
  Tensor w1 = param_tensor({1.0, 2.0}, {2}), w2 = param_tensor({3.0, 4.0}, {2});
  optim::SGD opt({w1, w2}, {.lr = 1.0});
  optim::GradScaler scaler({.init_scale = 64.0});
  const Tensor c = make_tensor({0.5, -0.25}, {2}, kFloat32);
  scaler.scale(sum(mul(add(w1, w2), c))).backward();
  scaler.unscale_(opt);
  CHECK(values_of(w1.grad()) == Values{0.5, -0.25});
  CHECK(values_of(w2.grad()) == Values{0.5, -0.25});
}

TEST_CASE("probe amp: a cached cast is not reused after Module::to changes the weight's dtype inside the guard") {
  // Under bfloat16 autocast a float32 weight of 1e5 is cast to bfloat16 99840 and cached;
  // the module then goes to float16, where 1e5 is inf: the next forward must see inf.
  auto lin = std::make_shared<nn::Linear>(2, 1, nn::LinearOptions{.bias = false});
  {
    autograd::NoGradGuard no_grad;
    lin->weight.copy_(make_tensor({1e5, 1.0}, {1, 2}, kFloat32));
  }
  const Tensor x = make_tensor({1.0, 0.0}, {1, 2}, kFloat32);
  lin->to(kFloat64);  // a round trip that leaves the weight in fresh storage (version 0),
  lin->to(kFloat32);  // as the float16 storage below will be
  AutocastGuard amp(kCPU, kBFloat16);
  CHECK(values_of((*lin)(x)) == Values{round_bf16(1e5)});
  lin->to(kFloat16);
  REQUIRE(std::isinf(values_of(lin->weight)[0]));
  CHECK(std::isinf(values_of((*lin)(x))[0]));
}

// ---- non-finite losses in the training helpers -----------------------------------------

TEST_CASE("probe amp: LossWatch reports a NaN loss under bfloat16 autocast (no GradScaler), and a finite run passes") {
  const Tensor x = random_tensor({4, 3}, kFloat32, 61);
  Tensor w = param_tensor(random_values(6, 62), {2, 3});
  optim::SGD opt({w}, {.lr = 0.1});
  train::LossWatch watch(opt);
  double sum_ref = 0;
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor loss;
    {
      AutocastGuard amp(kCPU, kBFloat16);
      const Tensor y = linear(x, w);
      loss = mean(mul(y, y));
    }
    CHECK(loss.dtype() == kFloat32);
    sum_ref += values_of(loss)[0];
    opt.zero_grad();
    loss.backward();
    opt.step();
    watch.add(loss, 1, step);
  }
  CHECK(watch.check().sum == doctest::Approx(sum_ref).epsilon(1e-12));
  // A weight that became NaN: the bfloat16 forward's loss is NaN, and that must be an error.
  {
    autograd::NoGradGuard no_grad;
    w.copy_(make_tensor({std::nan(""), 0, 0, 0, 0, 0}, {2, 3}, kFloat32));
  }
  Tensor loss;
  {
    AutocastGuard amp(kCPU, kBFloat16);
    const Tensor y = linear(x, w);
    loss = mean(mul(y, y));
  }
  check_error([&] { watch.add(loss, 1, 4); }, {"training diverged at epoch 1, step 4", "the loss is nan"});
}
