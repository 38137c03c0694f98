// OffloadAdamW on CUDA parameters (Note [CPU offload]): gradients down through the offload
// stream, the CPU update, the chunked upload. Against optim::AdamW on the GPU (its fused
// kernel, itself checked against the CPU in test_optim_cuda.cpp) to 1e-6 relative, for
// gradients set directly and for gradients from backward (the hook path), with GradScaler
// (which unscales inside the optimizer's step, leaving the hook's copies current); and the
// device memory the optimizer holds. With release_device_grads: gradients leave the device
// in backward, and steps (scaled, skipped on inf, accumulated over two backwards) equal
// those of the gradients kept.
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "autograd/ops/binary.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "memory/pinned.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/offload_adam.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using optim::AdamW;
using optim::GradScaler;
using optim::OffloadAdamW;

namespace {

const std::vector<Shape> kShapes = {{256, 384}, {3000}, {1}, {7, 9, 11}};

Tensor cuda_param(const std::vector<double>& v, const Shape& shape, DType dt) {
  Tensor t = make_tensor(v, shape, {dt, cuda()});
  t.requires_grad_();
  return t;
}

}  // namespace

TEST_CASE("offload adamw cuda: steps equal AdamW on the GPU, and the optimizer holds no device memory") {
  for (const DType dt : {kFloat32, kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    std::vector<Tensor> off, ref;
    for (size_t k = 0; k < kShapes.size(); ++k) {
      const Tensor p = cuda_param(random_values(numel_of(kShapes[k]), 30 + k), kShapes[k], dt);
      off.push_back(p);
      ref.push_back(cuda_param(values_of(p), kShapes[k], kFloat32));  // AdamW on float32 copies
    }
    // Chunks smaller than the largest parameter, so its upload overlaps its own update.
    OffloadAdamW opt(off, {.lr = 1e-2, .weight_decay = 0.1, .chunk_elements = 1 << 14});
    AdamW adamw(ref, {.lr = 1e-2, .weight_decay = 0.1});
    for (int s = 0; s < 4; ++s) {
      CAPTURE(s);
      for (size_t k = 0; k < kShapes.size(); ++k) {
        off[k].set_grad(
            make_tensor(random_values(numel_of(kShapes[k]), 100 + 10 * uint64_t(s) + k), kShapes[k], {dt, cuda()}));
        ref[k].set_grad(off[k].grad().to(kFloat32));
      }
      synchronize(cuda());
      const int64_t device_before = memory::stats(cuda()).allocated_bytes.current;
      opt.step();
      synchronize(cuda());
      // The step left nothing on the device: its state is in the pinned pool.
      CHECK(memory::stats(cuda()).allocated_bytes.current - device_before <= 0);
      adamw.step();
      for (size_t k = 0; k < kShapes.size(); ++k) {
        CAPTURE(k);
        CHECK(off[k].device() == cuda());
        const Tensor master = opt.master_param(off[k]);
        CHECK(master.device() == kCPU);
        check_close(values_of(master), values_of(ref[k]), 1e-6, 1e-7, "master vs AdamW");
        CHECK(values_of(off[k]) == values_of(master.to(dt)));  // the weights on the GPU: the master, rounded
      }
    }
    CHECK(opt.device_state_bytes() == 0);
    int64_t numel = 0;
    for (const Shape& s : kShapes) numel += numel_of(s);
    CHECK(opt.host_state_bytes() == numel * (12 + int64_t(element_size(dt))));  // master, moments, staging
    CHECK(memory::pinned_is_page_locked());
  }
}

TEST_CASE("offload adamw cuda: gradients copied during backward, with and without GradScaler, match AdamW") {
  for (const bool scaled : {false, true}) {
    CAPTURE(scaled);
    const std::vector<double> w0 = random_values(64 * 48, 5), x0 = random_values(32 * 64, 6);
    Tensor w = cuda_param(w0, {64, 48}, kFloat32), w_ref = cuda_param(w0, {64, 48}, kFloat32);
    const Tensor x = make_tensor(x0, {32, 64}, {kFloat32, cuda()});
    OffloadAdamW opt({w}, {.lr = 1e-3, .chunk_elements = 1000});
    AdamW adamw({w_ref}, {.lr = 1e-3});
    GradScaler scaler({.init_scale = 256.0, .enabled = scaled}), scaler_ref({.init_scale = 256.0, .enabled = scaled});
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      opt.zero_grad();
      adamw.zero_grad();
      const Tensor y = matmul(x, w), y_ref = matmul(x, w_ref);
      scaler.scale(sum(mul(y, y))).backward();  // the hook starts w's copy to the host here
      scaler_ref.scale(sum(mul(y_ref, y_ref))).backward();
      scaler.step(opt);
      scaler_ref.step(adamw);
      scaler.update();
      scaler_ref.update();
      check_close(values_of(w), values_of(w_ref), 1e-6, 1e-7, "weights vs AdamW");
    }
    CHECK(opt.state(w)->step == 3);
  }
}

namespace {

/// y = x W in float16 with W (64, 48): one loss to step on, `inf` making every gradient inf.
Tensor half_loss(const Tensor& x, const Tensor& w, bool inf = false) {
  const Tensor y = matmul(x, w);
  const Tensor loss = sum(mul(y, y));
  return inf ? mul(loss, std::numeric_limits<double>::infinity()) : loss;
}

}  // namespace

TEST_CASE("offload adamw cuda: release_device_grads drops gradients in backward; steps equal kept gradients") {
  const std::vector<double> w0 = random_values(64 * 48, 15), x0 = random_values(32 * 64, 16, -0.5, 0.5);
  const Tensor x = make_tensor(x0, {32, 64}, {kFloat16, cuda()});
  for (const bool scaled : {false, true}) {
    CAPTURE(scaled);
    Tensor w = cuda_param(w0, {64, 48}, kFloat16), w_kept = cuda_param(w0, {64, 48}, kFloat16);
    OffloadAdamW opt({w}, {.lr = 1e-3, .chunk_elements = 1000, .release_device_grads = true});
    OffloadAdamW kept({w_kept}, {.lr = 1e-3, .chunk_elements = 1000});
    GradScaler scaler({.init_scale = 256.0, .enabled = scaled}), scaler_kept({.init_scale = 256.0, .enabled = scaled});
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      opt.zero_grad();
      kept.zero_grad();
      scaler.scale(half_loss(x, w)).backward();
      scaler_kept.scale(half_loss(x, w_kept)).backward();
      CHECK_FALSE(w.grad().defined());  // on its way to the host since the hook ran
      CHECK(opt.holds_released_grads());
      CHECK(w_kept.grad().defined());
      scaler.step(opt);
      scaler_kept.step(kept);
      scaler.update();
      scaler_kept.update();
      CHECK_FALSE(opt.holds_released_grads());
      CHECK(values_of(w) == values_of(w_kept));
      CHECK(values_of(opt.master_param(w)) == values_of(kept.master_param(w_kept)));
    }
    CHECK(opt.state(w)->step == 3);
  }
}

TEST_CASE("offload adamw cuda: released gradients free the device memory of gradients during backward") {
  // Eight (1024, 1024) float16 weights: 16 MiB of gradients that a kept run holds after backward.
  std::vector<Tensor> ws;
  for (int k = 0; k < 8; ++k) ws.push_back(cuda_param(random_values(1024 * 1024, 40 + k), {1024, 1024}, kFloat16));
  const Tensor x = make_tensor(random_values(16 * 1024, 50), {16, 1024}, {kFloat16, cuda()});
  auto loss = [&] {
    Tensor h = x;
    for (const Tensor& w : ws) h = mul(matmul(h, w), 1.0 / 32);  // keeps float16 in range
    return sum(h);
  };
  auto grad_bytes_after_backward = [&](bool release) {
    OffloadAdamW opt(ws, {.lr = 1e-4, .release_device_grads = release});
    loss().backward();
    synchronize(cuda());
    const int64_t held = memory::stats(cuda()).allocated_bytes.current;
    opt.step();
    opt.zero_grad();
    synchronize(cuda());
    return held - memory::stats(cuda()).allocated_bytes.current;  // what backward left on the device
  };
  const int64_t kept = grad_bytes_after_backward(false), released = grad_bytes_after_backward(true);
  CHECK(kept >= 8 * 1024 * 1024 * 2);
  CHECK(released <= 0);
}

TEST_CASE("offload adamw cuda: released gradients accumulate over two backwards, skip on inf, and refuse unscale_") {
  const std::vector<double> w0 = random_values(64 * 48, 25);
  const Tensor x1 = make_tensor(random_values(32 * 64, 26, -0.5, 0.5), {32, 64}, {kFloat16, cuda()});
  const Tensor x2 = make_tensor(random_values(32 * 64, 27, -0.5, 0.5), {32, 64}, {kFloat16, cuda()});
  Tensor w = cuda_param(w0, {64, 48}, kFloat16), w_kept = cuda_param(w0, {64, 48}, kFloat16);
  OffloadAdamW opt({w}, {.lr = 1e-3, .release_device_grads = true});
  OffloadAdamW kept({w_kept}, {.lr = 1e-3});
  GradScaler scaler({.init_scale = 128.0}), scaler_kept({.init_scale = 128.0});

  // Two micro-batches: added on the host as AccumulateGrad adds on the device (float16 add_).
  scaler.scale(half_loss(x1, w)).backward();
  scaler.scale(half_loss(x2, w)).backward();
  scaler_kept.scale(half_loss(x1, w_kept)).backward();
  scaler_kept.scale(half_loss(x2, w_kept)).backward();
  CHECK_FALSE(w.grad().defined());
  scaler.step(opt);
  scaler_kept.step(kept);
  scaler.update();
  scaler_kept.update();
  CHECK(values_of(w) == values_of(w_kept));

  // An inf gradient: the step is skipped, the weights and host state stay, the scale backs off.
  const std::vector<double> before = values_of(w), master = values_of(opt.master_param(w));
  scaler.scale(half_loss(x1, w, /*inf=*/true)).backward();
  scaler.step(opt);
  scaler.update();
  CHECK(values_of(w) == before);
  CHECK(values_of(opt.master_param(w)) == master);
  CHECK(opt.state(w)->step == 1);
  CHECK(scaler.get_scale() == 64.0);
  CHECK_FALSE(opt.holds_released_grads());  // the skipped step's gradients are dropped

  // unscale_ cannot reach gradients in host memory: a clear error, not a silent no-op.
  scaler.scale(half_loss(x1, w)).backward();
  try {
    scaler.unscale_(opt);
    FAIL("unscale_ should throw");
  } catch (const Error& e) { CHECK(std::string(e.what()).find("release_device_grads") != std::string::npos); }
  opt.zero_grad();  // drops them
  CHECK_FALSE(opt.holds_released_grads());
}
