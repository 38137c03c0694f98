#pragma once
// The measurements of bench/offload_capacity: the largest BERT-shaped model that trains a
// step under a device memory limit with AdamW vs with OffloadAdamW (Note [CPU offload]),
// and the CPU AdamW's throughput. The cpu suite runs them at tiny sizes
// (tests/cpu/test_offload_capacity.cpp); the program prints them as tables.
//
//   CapacityOptions o{.device = kCPU, .memory_limit_bytes = 64 << 20};
//   CapacityResult adamw = largest_trainable(o, "adamw"), offload = largest_trainable(o, "offload_adamw");
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "tensor/dtype.h"

namespace frugal::bench {

struct CapacityOptions {
  Device device = kCPU;
  size_t memory_limit_bytes = 0;  // the device arena's cap (memory::set_memory_limit) during each trial
  DType dtype = kFloat32;         // the parameters' (compute) dtype
  int64_t layers = 2, batch = 2, seq_len = 16, vocab = 512;
  int64_t min_hidden = 64, max_hidden = 8192;  // the width ladder's ends (multiples of 64, heads of 64)
};

/// One trial: a BertForMaskedLM of `hidden` width trained for two steps (the second timed).
struct CapacityTrial {
  int64_t hidden = 0, parameters = 0;  // parameters: 0 when the model could not even be built
  bool fits = false;
  double step_ms = 0;             // the second step, forward + backward + optimizer
  int64_t peak_device_bytes = 0;  // the device arena's peak allocated bytes
  int64_t host_state_bytes = 0;   // the optimizer's state in host memory (OffloadAdamW)
};

struct CapacityResult {
  std::string optimizer;
  std::vector<CapacityTrial> trials;  // up the ladder to the first that did not fit, then the bisection
  /// The largest trial that fit; hidden == 0 when none did.
  CapacityTrial largest() const;
};

/// Widths 64, 128, ... growing by about 1.25x (multiples of 64) from min_hidden to max_hidden.
std::vector<int64_t> hidden_ladder(const CapacityOptions& o);

/// Walks the ladder with `optimizer` ("adamw", "offload_adamw", or "offload_adamw_release":
/// OffloadAdamW with release_device_grads) until a trial runs out of device memory under the
/// limit, then bisects between the last width that fit and that one (to a multiple of 64);
/// the limit is removed again afterwards.
CapacityResult largest_trainable(const CapacityOptions& o, const std::string& optimizer);

/// One AdamW step over `numel` parameters of `dtype` on the CPU with `threads` threads.
struct AdamThroughput {
  std::string optimizer;
  DType dtype;
  int threads;
  double step_ms, params_per_s, gb_per_s;  // gb_per_s: the bytes a step reads and writes, over its time
};
/// OffloadAdamW vs optim::AdamW on one parameter of `numel` elements, float32 and float16,
/// for each thread count (median of `reps` steps).
std::vector<AdamThroughput> cpu_adam_throughput(int64_t numel, const std::vector<int>& threads, int reps);

}  // namespace frugal::bench
