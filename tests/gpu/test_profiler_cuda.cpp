// The memory profiler on cuda:0: ops get device times from CUDA events, and the
// categories and the peak agree with the CUDA allocator's own statistics.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <thread>

#include "autograd/ops/loss.h"
#include "core/json.h"
#include "memory/allocator.h"
#include "memory/caching_allocator.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "profiler/session.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tensor/random.h"

using namespace frugal;
using core::Category;
using memory::TraceAction;

namespace {

const Device kGpu = cuda(0);

struct Net : nn::UnaryModule {
  std::shared_ptr<nn::Linear> fc1 = register_module("fc1", std::make_shared<nn::Linear>(64, 256));
  std::shared_ptr<nn::ReLU> act = register_module("act", std::make_shared<nn::ReLU>());
  std::shared_ptr<nn::Linear> fc2 = register_module("fc2", std::make_shared<nn::Linear>(256, 10));
  Tensor forward(const Tensor& x) override { return (*fc2)((*act)((*fc1)(x))); }
  std::string type_name() const override { return "Net"; }
};

int64_t rounded(const Tensor& t) { return static_cast<int64_t>(memory::detail::round_size(t.impl().storage->nbytes)); }

}  // namespace

TEST_CASE("profiler cuda: device times from CUDA events, categories and the peak") {
  manual_seed(11);
  Net net;
  net.to(kGpu);
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  const Tensor x = randn({128, 64}).to(kGpu), y = randint(0, 10, {128}).to(kGpu);

  profiler::Session session({.device = kGpu});
  session.attach(net);
  synchronize(kGpu);
  memory::reset_peak(kGpu);
  session.start();
  opt.zero_grad();
  Tensor loss = cross_entropy(net(x), y);
  loss.backward();
  opt.step();  // first step: creates the moments
  loss = Tensor();
  // A new thread's first cuBLAS call allocates its workspace.
  std::thread([&] { Tensor z = ops::matmul(x, x.transpose(0, 1)); }).join();
  session.stop();
  const memory::MemoryStats stats = memory::stats(kGpu);

  // Every op recorded on the GPU has a device time; ops that launch kernels take some.
  std::map<std::string, double> device_ms;
  for (const core::OpRecord& r : session.op_records()) {
    CHECK(r.device_start_ms >= 0.0);
    CHECK(r.device_ms >= 0.0);
    device_ms[r.op] += r.device_ms;
  }
  CHECK(device_ms.at("LinearBackward") > 0.0);
  CHECK(device_ms.at("CrossEntropyBackward") > 0.0);
  CHECK(device_ms.at("Adam") > 0.0);
  for (const profiler::OpTime& t : session.op_times())
    if (t.op == "LinearBackward") CHECK(t.device_total_ms == doctest::Approx(device_ms["LinearBackward"]));

  // Categories.
  int64_t param_bytes = 0, grad_bytes = 0;
  for (const Tensor& p : net.parameters()) {
    param_bytes += rounded(p);
    grad_bytes += rounded(p.grad());
  }
  int64_t state_bytes = 0, workspace_bytes = 0;
  for (const memory::TraceEvent& e : session.events()) {
    if (e.action != TraceAction::Alloc) continue;
    if (e.category == Category::OptimizerState) state_bytes += int64_t(e.size);
    if (e.category == Category::Workspace) workspace_bytes += int64_t(e.size);
  }
  CHECK(state_bytes >= 2 * param_bytes);  // the moments, and the fused kernel's entry table
  CHECK(workspace_bytes > 0);
  const profiler::TimelinePoint& end = session.timeline().back();
  CHECK(end.by_category[size_t(Category::Parameters)] == param_bytes);
  CHECK(end.by_category[size_t(Category::Gradients)] == grad_bytes);
  CHECK(end.allocated == stats.allocated_bytes.current);

  // The peak: the allocator's, and the table adds up to it.
  CHECK(session.peak_allocated() == stats.allocated_bytes.peak);
  int64_t sum = 0;
  for (const profiler::AllocationGroup& g : session.live_at_peak()) sum += g.bytes;
  CHECK(sum == session.peak_allocated());
  CHECK(session.category_bytes_at_peak()[size_t(Category::Parameters)] == param_bytes);

  // The Chrome trace has the device track.
  const json::Value doc = json::parse(session.chrome_trace());
  size_t device_spans = 0;
  for (const json::Value& e : doc.find("traceEvents")->items)
    if (e.find("ph")->text == "X" && e.find("pid")->text == "1") ++device_spans;
  CHECK(device_spans == session.op_records().size());
}
