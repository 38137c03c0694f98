// The measurements of bench/offload_capacity (see offload_capacity_modes.h).
#include "bench/offload_capacity_modes.h"

#include <algorithm>
#include <memory>

#include "autograd/grad_mode.h"
#include "bench/bench_util.h"
#include "core/error.h"
#include "core/stream.h"
#include "core/threads.h"
#include "memory/allocator.h"
#include "memory/pinned.h"
#include "models/bert.h"
#include "optim/adam.h"
#include "optim/offload_adam.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"

namespace frugal::bench {

namespace {

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, std::vector<Tensor> params) {
  if (name == "adamw") return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-4});
  FRUGAL_CHECK(name == "offload_adamw" || name == "offload_adamw_release", "offload_capacity: unknown optimizer '",
               name, "' (adamw, offload_adamw or offload_adamw_release)");
  return std::make_unique<optim::OffloadAdamW>(
      std::move(params),
      optim::OffloadAdamWOptions{.lr = 1e-4, .release_device_grads = name == "offload_adamw_release"});
}

models::BertConfig encoder_config(const CapacityOptions& o, int64_t hidden) {
  models::BertConfig c;
  c.vocab_size = o.vocab;
  c.hidden_size = hidden;
  c.num_hidden_layers = o.layers;
  c.num_attention_heads = hidden / 64;
  c.intermediate_size = 4 * hidden;
  c.max_position_embeddings = std::max<int64_t>(o.seq_len, 64);
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.0;
  return c;
}

/// Builds the model of width `hidden` under the limit and trains it two steps.
CapacityTrial try_width(const CapacityOptions& o, const std::string& optimizer, int64_t hidden) {
  CapacityTrial t{.hidden = hidden};
  try {
    auto net = std::make_shared<models::BertForMaskedLM>(encoder_config(o, hidden));
    net->to(o.device, o.dtype);
    net->train();
    t.parameters = net->num_parameters();
    const Tensor ids = randint(0, o.vocab, {o.batch, o.seq_len}, TensorOptions(kInt64, o.device));
    const Tensor labels = randint(0, o.vocab, {o.batch, o.seq_len}, TensorOptions(kInt64, o.device));
    std::unique_ptr<optim::Optimizer> opt = make_optimizer(optimizer, net->parameters());
    for (int step = 0; step < 2; ++step) {  // the first allocates the optimizer's state
      const double start = now_seconds();
      opt->zero_grad();
      net->forward(ids, Tensor(), Tensor(), labels).loss.backward();
      opt->step();
      synchronize(o.device);
      t.step_ms = (now_seconds() - start) * 1e3;
    }
    t.fits = true;
    t.peak_device_bytes = memory::stats(o.device).allocated_bytes.peak;
    if (const auto* offload = dynamic_cast<const optim::OffloadAdamW*>(opt.get()))
      t.host_state_bytes = offload->host_state_bytes();
  } catch (const OutOfMemoryError&) { t.fits = false; }
  return t;
}

}  // namespace

CapacityTrial CapacityResult::largest() const {
  CapacityTrial best;
  for (const CapacityTrial& t : trials)
    if (t.fits && t.parameters > best.parameters) best = t;
  return best;
}

std::vector<int64_t> hidden_ladder(const CapacityOptions& o) {
  std::vector<int64_t> ladder;
  for (int64_t h = std::max<int64_t>(64, o.min_hidden / 64 * 64); h <= o.max_hidden;
       h = std::max(h + 64, (h * 5 / 4 + 32) / 64 * 64))
    ladder.push_back(h);
  return ladder;
}

CapacityResult largest_trainable(const CapacityOptions& o, const std::string& optimizer) {
  CapacityResult result{.optimizer = optimizer, .trials = {}};
  const size_t previous_limit = memory::memory_limit(o.device);
  auto trial = [&](int64_t hidden) {
    // The trial may reserve memory_limit_bytes above what the device holds already; the
    // pinned pool starts empty too, so host state of earlier widths does not pile up.
    memory::empty_cache(o.device);
    memory::empty_pinned_cache();
    memory::reset_peak(o.device);
    memory::set_memory_limit(size_t(memory::stats(o.device).reserved_bytes.current) + o.memory_limit_bytes, o.device);
    result.trials.push_back(try_width(o, optimizer, hidden));
    memory::set_memory_limit(previous_limit, o.device);
    return result.trials.back().fits;
  };
  int64_t fits = 0, fails = 0;  // the widest width that fit and the narrowest that did not
  for (const int64_t hidden : hidden_ladder(o)) {
    if (!trial(hidden)) {
      fails = hidden;
      break;
    }
    fits = hidden;
  }
  // Between the last rung that fit and the first that did not, bisect to a multiple of 64.
  while (fits > 0 && fails > 0 && fails - fits > 64) {
    const int64_t mid = (fits + fails) / 2 / 64 * 64;
    (trial(mid) ? fits : fails) = mid;
  }
  memory::empty_cache(o.device);
  memory::empty_pinned_cache();
  return result;
}

std::vector<AdamThroughput> cpu_adam_throughput(int64_t numel, const std::vector<int>& threads, int reps) {
  autograd::NoGradGuard no_grad;
  const int saved_threads = get_num_threads();
  std::vector<AdamThroughput> out;
  for (const DType dtype : {kFloat32, kFloat16}) {
    const Tensor values = randn({numel}).to(dtype), grad = ops::mul(randn({numel}), 1e-2).to(dtype);
    for (const char* name : {"adamw", "offload_adamw"}) {
      for (const int n : threads) {
        set_num_threads(n);
        Tensor p = values.clone();
        p.requires_grad_();
        p.set_grad(grad);
        std::unique_ptr<optim::Optimizer> opt = make_optimizer(name, {p});
        const double s = time_median([&] { opt->step(); }, 1, reps);
        // Per element a step reads and writes the weight (the float32 master, for OffloadAdamW)
        // and both float32 moments, and reads the gradient; OffloadAdamW also writes the
        // rounded 16-bit weight.
        const double weight = std::string(name) == "adamw" ? double(element_size(dtype)) : 4.0;
        const double bytes_per = 2 * weight + 16 + double(element_size(dtype)) +
                                 (std::string(name) == "offload_adamw" && dtype != kFloat32 ? 2.0 : 0.0);
        out.push_back({.optimizer = name,
                       .dtype = dtype,
                       .threads = n,
                       .step_ms = s * 1e3,
                       .params_per_s = double(numel) / s,
                       .gb_per_s = bytes_per * double(numel) / s / 1e9});
      }
    }
  }
  set_num_threads(saved_threads);
  return out;
}

}  // namespace frugal::bench
