// bench/offload_capacity_modes.h at tiny sizes on the CPU: the capacity search under the CPU
// arena's limit (AdamW's state counts against it, OffloadAdamW's pinned state does not),
// against the BERT parameter count written out by hand and the bytes each optimizer must
// hold on the device; and the throughput table's shape.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/offload_capacity_modes.h"

using namespace frugal;
using namespace frugal::bench;

namespace {

/// BertForMaskedLM's parameters (tied decoder: its weight is the word embeddings; no pooler).
int64_t bert_mlm_parameters(int64_t h, int64_t layers, int64_t vocab, int64_t positions) {
  const int64_t embeddings = (vocab + positions + 2) * h + 2 * h;  // word, position, token type, LayerNorm
  const int64_t layer = 4 * (h * h + h) + 2 * (4 * h * h) + 4 * h + h + 2 * (2 * h);  // q k v o, FFN, 2 LayerNorms
  const int64_t head = h * h + h + 2 * h + vocab;  // transform dense, LayerNorm, decoder bias
  return embeddings + layers * layer + head;
}

}  // namespace

TEST_CASE("offload_capacity: OffloadAdamW trains a larger model than AdamW under the same device limit") {
  const CapacityOptions o{.device = kCPU,
                          .memory_limit_bytes = size_t(12) << 20,
                          .dtype = kFloat32,
                          .layers = 1,
                          .batch = 1,
                          .seq_len = 8,
                          .vocab = 128,
                          .min_hidden = 64,
                          .max_hidden = 640};
  CHECK(hidden_ladder(o) == std::vector<int64_t>{64, 128, 192, 256, 320, 384, 512, 640});
  const CapacityResult adamw = largest_trainable(o, "adamw");
  const CapacityResult offload = largest_trainable(o, "offload_adamw");
  for (const CapacityResult* r : {&adamw, &offload}) {
    CAPTURE(r->optimizer);
    REQUIRE(!r->trials.empty());
    // The search went up the ladder to a width that ran out of memory, then bisected to 64:
    // the narrowest width that did not fit is at most 64 wider than the largest that did.
    int64_t narrowest_failure = INT64_MAX;
    for (const CapacityTrial& t : r->trials)
      if (!t.fits) narrowest_failure = std::min(narrowest_failure, t.hidden);
    REQUIRE(narrowest_failure < INT64_MAX);
    CHECK(narrowest_failure - r->largest().hidden == 64);
    for (const CapacityTrial& t : r->trials) {
      CAPTURE(t.hidden);
      if (!t.fits) continue;  // (it may have run out while building the model, before counting)
      CHECK(t.parameters == bert_mlm_parameters(t.hidden, o.layers, o.vocab, 64));
      CHECK(t.step_ms > 0);
      CHECK(t.peak_device_bytes <= int64_t(o.memory_limit_bytes) + (int64_t(64) << 20));
      // AdamW holds weights, gradients and both moments on the device (16 bytes per float32
      // parameter); OffloadAdamW holds only weights and gradients there, and moments on the host.
      if (r == &adamw) CHECK(t.peak_device_bytes >= 16 * t.parameters);
      else CHECK(t.host_state_bytes == 8 * t.parameters);
    }
  }
  CHECK(adamw.largest().hidden > 0);
  CHECK(offload.largest().parameters > adamw.largest().parameters);
}

TEST_CASE("offload_capacity: the CPU throughput table has a row per optimizer, dtype and thread count") {
  const std::vector<AdamThroughput> rows = cpu_adam_throughput(4096, {1, 2}, 1);
  REQUIRE(rows.size() == 8);  // {float32, float16} x {adamw, offload_adamw} x {1, 2}
  CHECK(rows[0].optimizer == "adamw");
  CHECK(rows[2].optimizer == "offload_adamw");
  CHECK(rows[4].dtype == kFloat16);
  for (const AdamThroughput& r : rows) {
    CHECK(r.step_ms > 0);
    // GB/s counts, per element: weight read + write (float32 master for OffloadAdamW), both
    // float32 moments read + written, the gradient read, and OffloadAdamW's rounded 16-bit weight.
    const double bytes = r.dtype == kFloat32 ? 28.0 : r.optimizer == "adamw" ? 2 * 2 + 16 + 2 : 2 * 4 + 16 + 2 + 2;
    CHECK(r.gb_per_s * 1e9 / r.params_per_s == doctest::Approx(bytes).epsilon(1e-9));
  }
}
