// GaLoreAdamW on CUDA (cuSOLVER SVD, cuBLAS projections, the fused Adam launch) against the
// CPU implementation (itself checked against float64 references in tests/cpu/test_galore.cpp)
// on the same values: left- and right-projected matrices and a vector, steps across a
// refresh, one fused launch per step, equal state bytes, and a resume on the GPU.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "optim/galore.h"
#include "optim/multi_tensor.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using optim::GaLoreAdamW;
using optim::GaLoreOptions;
using optim::StateDict;
using optim::detail::fused_launch_count;

TEST_CASE("galore cuda: steps match the CPU across a refresh, one fused launch per step") {
  // cuSOLVER and Eigen pick singular vectors' signs differently; galore::projection makes
  // them canonical, which matters because the moments carry over a refresh (Note [GaLore],
  // "Signs"). Random matrices have well-separated top singular values, so the subspaces
  // agree to float32 rounding.
  const std::vector<Shape> shapes = {{64, 96}, {96, 48}, {48}};
  const GaLoreOptions o{.lr = 1e-2, .weight_decay = 0.01, .rank = 8, .update_proj_gap = 2};
  std::vector<Tensor> cpu_ps, gpu_ps;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const std::vector<double> v = random_values(numel_of(shapes[k]), 10 + k);
    cpu_ps.push_back(make_tensor(v, shapes[k], kFloat32));
    gpu_ps.push_back(make_tensor(v, shapes[k], {kFloat32, cuda()}));
    cpu_ps.back().requires_grad_();
    gpu_ps.back().requires_grad_();
  }
  GaLoreAdamW cpu_opt(cpu_ps, o), gpu_opt(gpu_ps, o);
  for (int step = 0; step < 5; ++step) {  // refreshes at 0, 2 and 4; the resume steps with the saved P
    CAPTURE(step);
    for (size_t k = 0; k < shapes.size(); ++k) {
      const std::vector<double> g = random_values(numel_of(shapes[k]), 100 + 10 * uint64_t(step) + k);
      cpu_ps[k].set_grad(make_tensor(g, shapes[k], kFloat32));
      gpu_ps[k].set_grad(make_tensor(g, shapes[k], {kFloat32, cuda()}));
    }
    cpu_opt.step();
    const int64_t launches = fused_launch_count();
    gpu_opt.step();
    CHECK(fused_launch_count() - launches == 1);  // projected and plain entries in one launch
    for (size_t k = 0; k < shapes.size(); ++k) {
      CAPTURE(k);
      CHECK(gpu_ps[k].device() == cuda());
      check_close(values_of(gpu_ps[k]), values_of(cpu_ps[k]), 1e-4, 1e-5, "parameter");
    }
  }
  CHECK(gpu_opt.state_bytes() == cpu_opt.state_bytes());
  CHECK(gpu_opt.state(gpu_ps[0])->buffers[2].device() == cuda());

  // A state dict saved from the GPU resumes on the GPU bit-identically.
  StateDict saved;
  for (const auto& [key, t] : gpu_opt.state_dict()) saved.emplace_back(key, t.clone());
  std::vector<Tensor> resumed;
  for (const Tensor& p : gpu_ps) resumed.push_back(p.detach().clone().requires_grad_());
  GaLoreAdamW again(resumed, o);
  again.load_state_dict(saved);
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Tensor g = make_tensor(random_values(numel_of(shapes[k]), 500 + k), shapes[k], {kFloat32, cuda()});
    gpu_ps[k].set_grad(g);
    resumed[k].set_grad(g.clone());
  }
  gpu_opt.step();
  again.step();
  for (size_t k = 0; k < shapes.size(); ++k)
    CHECK_MESSAGE(values_of(gpu_ps[k]) == values_of(resumed[k]), "parameter ", k, " differs after resuming");
}
