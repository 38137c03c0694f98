// FullyShardedDataParallel (parallel/fsdp.h) over NCCL with one rank on one GPU: the
// all-gathers (forward prefetch and the backward's re-gather) and reduce-scatters run on the
// communicator's stream, ordered against the compute stream by events (Note [Communication
// stream]); the gathered buffers are freed while that stream may still be busy. Checked
// against the plain model trained with optim::AdamW on the same GPU: weights after each step
// (f32), with and without checkpointing; bfloat16 gathered parameters under autocast against
// the plain model under autocast (SGD updates); per-rank bytes (two units gathered at most).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "autograd/autocast.h"
#include "autograd/ops/all.h"
#include "nn/activation.h"
#include "nn/checkpoint.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/fsdp.h"
#include "parallel/nccl_communicator.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr optim::AdamWOptions kOpts{.lr = 0.01, .weight_decay = 0.1};

class Net : public nn::UnaryModule {
 public:
  Net(uint64_t seed, bool checkpointed) : checkpointed_(checkpointed) {
    manual_seed(seed);
    net = register_module(
        "net",
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
            std::make_shared<nn::Linear>(48, 96), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(96, 96),
            std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(96, 5)}));
    to(cuda());
  }
  Tensor forward(const Tensor& x) override {
    return checkpointed_ ? nn::checkpoint_sequential(*net, int64_t(net->size()), x) : (*net)(x);
  }
  std::shared_ptr<nn::Sequential> net;

 private:
  bool checkpointed_;
};

std::shared_ptr<parallel::Communicator> one_rank() {
  return std::make_shared<parallel::NcclCommunicator>(parallel::nccl_unique_id(), 0, 1, cuda());
}

/// Three AdamW steps of the FSDP-wrapped model against the plain one on the same GPU.
void check_against_plain(bool checkpointed) {
  const int64_t steps = 3;
  const Tensor x = random_tensor({steps, 16, 48}, kFloat32, 401).to(cuda());
  const Tensor y = random_tensor({steps, 16, 5}, kFloat32, 402).to(cuda());
  auto ref = std::make_shared<Net>(40, false);
  auto model = std::make_shared<Net>(40, checkpointed);
  optim::AdamW ref_opt(ref->parameters(), kOpts);
  parallel::FullyShardedDataParallel fsdp(model, one_rank(), {.units = {"net.0", "net.2", "net.4"}});
  optim::AdamW opt(fsdp.parameters(), kOpts);
  for (int64_t s = 0; s < steps; ++s) {
    CAPTURE(s);
    mse_loss(ref->forward(x[s]), y[s]).backward();
    ref_opt.step();
    ref_opt.zero_grad();
    mse_loss(fsdp.forward(x[s]), y[s]).backward();
    const parallel::FullyShardMemoryReport mem = fsdp.memory_report();
    CHECK(mem.gathered_bytes == 0);
    CHECK(mem.param_grad_bytes == 0);
    CHECK(mem.gathered_units_peak == 2);
    CHECK(mem.gathered_bytes_peak == 4 * ((48 * 96 + 96) + (96 * 96 + 96)));
    opt.step();
    opt.zero_grad();
    std::map<std::string, Tensor> want;
    for (const auto& [k, v] : ref->state_dict()) want[k] = v;
    for (const auto& [name, t] : fsdp.full_state_dict())
      check_close(values_of(t.cpu()), values_of(want.at(name).cpu()), 1e-5, 1e-6, name);
  }
}

}  // namespace

// On the H200 (2026-12-02) the first version of these passed every check and then died
// with SIGSEGV in teardown: shards marked as used on the NCCL stream were freed after the
// communicator had destroyed that stream. Communicators now take their streams from a pool
// that never destroys them (Note [Communication streams outlive communicators]); the first
// case is that regression.
TEST_CASE("cuda nccl stream: a tensor a collective used may outlive its communicator") {
  Tensor t = ones({1024}, {kFloat32, cuda()});
  {
    auto comm = one_rank();
    comm->all_reduce(t)->wait();  // marks t's block as used on the communicator's stream
  }
  CHECK(values_of(t.cpu())[0] == 1.0);
  t = Tensor();             // the block's free records an event on that stream, which must still exist
  auto again = one_rank();  // a new communicator (on the pooled stream) works
  Tensor u = ones({8}, {kFloat32, cuda()});
  again->all_reduce(u)->wait();
  CHECK(values_of(u.cpu())[7] == 1.0);
}

TEST_CASE("fsdp cuda: one NCCL rank trains as the plain model; gathers and frees on the comm stream") {
  check_against_plain(/*checkpointed=*/false);
}

TEST_CASE("fsdp cuda: checkpointed units regather in the recompute") { check_against_plain(/*checkpointed=*/true); }

TEST_CASE("fsdp cuda: bfloat16 gathered parameters under autocast follow the plain model under autocast") {
  const Tensor x = random_tensor({16, 48}, kFloat32, 411).to(cuda());
  const Tensor y = random_tensor({16, 5}, kFloat32, 412).to(cuda());
  auto ref = std::make_shared<Net>(41, false);
  auto model = std::make_shared<Net>(41, false);
  std::map<std::string, Tensor> initial;
  for (const auto& [k, v] : ref->state_dict()) initial[k] = v.clone();
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.5});  // updates that scale with the gradients
  parallel::FullyShardedDataParallel fsdp(model, one_rank(),
                                          {.units = {"net.0", "net.2", "net.4"}, .param_dtype = kBFloat16});
  optim::SGD opt(fsdp.parameters(), {.lr = 0.5});
  for (int s = 0; s < 2; ++s) {
    {
      AutocastGuard amp(cuda(), kBFloat16);
      mse_loss(ref->forward(x), y).backward();
    }
    ref_opt.step();
    ref_opt.zero_grad();
    {
      AutocastGuard amp(cuda(), kBFloat16);
      mse_loss(fsdp.forward(x), y).backward();
    }
    CHECK(fsdp.memory_report().gathered_bytes_peak == 2 * ((48 * 96 + 96) + (96 * 96 + 96)));  // 2 bytes each
    opt.step();
    opt.zero_grad();
  }
  std::map<std::string, Tensor> want;
  for (const auto& [k, v] : ref->state_dict()) want[k] = v;
  // The same bf16 products; the gradients' rounding differs (bf16 .grad here, f32 there):
  // the updates agree to bf16 precision.
  for (const auto& [name, t] : fsdp.full_state_dict()) {
    const std::vector<double> got = values_of(t.cpu()), expected = values_of(want.at(name).cpu()),
                              start = values_of(initial.at(name).cpu());
    std::vector<double> got_update, want_update;
    double scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      got_update.push_back(got[i] - start[i]);
      want_update.push_back(expected[i] - start[i]);
      scale = std::max(scale, std::fabs(want_update.back()));
    }
    check_close(got_update, want_update, 2e-2, 2e-2 * scale, name + " update");
  }
}
