// offload_capacity: the largest model that trains on one device, with AdamW and with
// OffloadAdamW (ZeRO-Offload, Note [CPU offload]) - keeping the gradients on the device, and
// releasing them to the host in backward (release_device_grads) - and the CPU AdamW's throughput.
//
//   offload_capacity [--device cuda|cpu] [--memory-limit-gib G] [--dtype float32|float16|bfloat16]
//                    [--layers L] [--batch B] [--seq-len T] [--vocab V] [--min-hidden H] [--max-hidden H]
//                    [--adam-params N] [--threads T1,T2,...] [--reps R]
//
// Defaults: --device cuda, float16 parameters on a GPU and float32 on the CPU, 16 GiB on a
// GPU and 0.125 GiB on the CPU, 2 layers, batch 2 x 16 tokens, vocab 512.
// A BERT-shaped masked-LM (BertForMaskedLM, heads of 64, FFN 4x, no dropout) grows in width
// up a ladder (about x1.25 per rung, then a bisection to 64 past the last rung that fit); each width is built on the
// device and trained two steps (the second timed) while the device arena may reserve at most --memory-limit-gib more
// than it held before (memory::set_memory_limit, which the CPU arena honours too, so the search runs at tiny sizes on a
// CPU). OffloadAdamW's master weights and moments are in the pinned host pool, outside that limit, as on a GPU. The
// table lists every rung tried; the key figures give the largest parameter count each optimizer trained and its step
// time. Then, unless --adam-params is 0, one AdamW step over --adam-params parameters on the CPU for each thread count:
// OffloadAdamW's update against optim::AdamW's loop.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/offload_capacity_modes.h"
#include "core/threads.h"
#include "examples/flags.h"

using namespace frugal;
using namespace frugal::bench;

namespace {

struct Args {
  CapacityOptions capacity;
  double memory_limit_gib = 0;
  int64_t adam_params = int64_t(1) << 24;
  std::vector<int> threads;
  int reps = 5;
};

const char* kUsage =
    "usage: offload_capacity [--device cuda|cpu] [--memory-limit-gib G] [--dtype float32|float16|bfloat16]\n"
    "                        [--layers L] [--batch B] [--seq-len T] [--vocab V] [--min-hidden H] [--max-hidden H]\n"
    "                        [--adam-params N] [--threads T1,T2,...] [--reps R]\n";

std::vector<int> parse_threads(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto n = cli::parse_int(item, 1, 4096);
    if (!n) throw cli::UsageError("--threads: expected positive integers separated by commas, got \"" + text + "\"");
    out.push_back(int(*n));
  }
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  a.capacity.device = cuda();
  std::string dtype;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--device")) {
      const std::string d = flags.text();
      if (d != "cpu" && d != "cuda") throw cli::UsageError("--device: expected cpu or cuda, got \"" + d + "\"");
      a.capacity.device = d == "cpu" ? kCPU : cuda();
    } else if (flags.is("--memory-limit-gib")) a.memory_limit_gib = flags.positive_real();
    else if (flags.is("--dtype")) {
      dtype = flags.text();
      if (dtype != "float32" && dtype != "float16" && dtype != "bfloat16")
        throw cli::UsageError("--dtype: expected float32, float16 or bfloat16, got \"" + dtype + "\"");
    } else if (flags.is("--layers")) a.capacity.layers = flags.positive();
    else if (flags.is("--batch")) a.capacity.batch = flags.positive();
    else if (flags.is("--seq-len")) a.capacity.seq_len = flags.positive();
    else if (flags.is("--vocab")) a.capacity.vocab = flags.positive();
    else if (flags.is("--min-hidden")) a.capacity.min_hidden = flags.positive();
    else if (flags.is("--max-hidden")) a.capacity.max_hidden = flags.positive();
    else if (flags.is("--adam-params")) a.adam_params = flags.non_negative();
    else if (flags.is("--threads")) a.threads = parse_threads(flags.text());
    else if (flags.is("--reps")) a.reps = int(flags.integer(1, 1000));
    else flags.unknown();
  }
  // By default the GPU trains in float16 (what ZeRO-Offload targets); the CPU in float32.
  a.capacity.dtype = !dtype.empty() ? parse_dtype(dtype) : a.capacity.device.is_cpu() ? kFloat32 : kFloat16;
  if (a.memory_limit_gib == 0) a.memory_limit_gib = a.capacity.device.is_cpu() ? 0.125 : 16.0;
  a.capacity.memory_limit_bytes = size_t(a.memory_limit_gib * double(int64_t(1) << 30));
  if (a.threads.empty()) {
    for (int n = 1; n < get_num_threads(); n *= 2) a.threads.push_back(n);
    a.threads.push_back(get_num_threads());
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = cli::parse_or_exit("offload_capacity", kUsage, [&] { return parse(argc, argv); });
  const CapacityOptions& o = a.capacity;
  std::printf("device: %s, limit %.3f GiB, %s parameters, %lld layers, batch %lld x %lld tokens, vocab %lld\n",
              o.device.str().c_str(), a.memory_limit_gib, dtype_name(o.dtype), (long long)o.layers, (long long)o.batch,
              (long long)o.seq_len, (long long)o.vocab);
  Table trials("training one step under the limit",
               {"optimizer", "hidden", "params (M)", "fits", "step ms", "peak device MiB", "host state MiB"});
  KeyFigures figures;
  std::vector<int64_t> largest;
  for (const char* name : {"adamw", "offload_adamw", "offload_adamw_release"}) {
    const CapacityResult r = largest_trainable(o, name);
    for (const CapacityTrial& t : r.trials)
      trials.add({name, std::to_string(t.hidden), t.parameters ? fmt("%.2f", double(t.parameters) / 1e6) : "-",
                  t.fits ? "yes" : "no", t.fits ? fmt("%.1f", t.step_ms) : "-",
                  t.fits ? fmt("%.1f", double(t.peak_device_bytes) / 1048576.0) : "-",
                  t.fits ? fmt("%.1f", double(t.host_state_bytes) / 1048576.0) : "-"});
    const CapacityTrial best = r.largest();
    figures.add(std::string(name) + "_largest_params", double(best.parameters), "%.0f");
    figures.add(std::string(name) + "_largest_hidden", double(best.hidden), "%.0f");
    figures.add(std::string(name) + "_step_ms", best.step_ms, "%.1f");
    largest.push_back(best.parameters);
  }
  trials.print();
  if (largest[0] > 0) {  // how much larger a model each offload trains than AdamW does
    figures.add("offload_capacity_ratio", double(largest[1]) / double(largest[0]), "%.2f");
    figures.add("offload_release_capacity_ratio", double(largest[2]) / double(largest[0]), "%.2f");
  }

  if (a.adam_params > 0) {
    Table speed(fmt("one step over %lld parameters on the CPU", (long long)a.adam_params),
                {"optimizer", "dtype", "threads", "step ms", "Mparams/s", "GB/s"});
    for (const AdamThroughput& t : cpu_adam_throughput(a.adam_params, a.threads, a.reps)) {
      speed.add({t.optimizer, dtype_name(t.dtype), std::to_string(t.threads), fmt("%.2f", t.step_ms),
                 fmt("%.0f", t.params_per_s / 1e6), fmt("%.2f", t.gb_per_s)});
      figures.add(t.optimizer + "_" + dtype_name(t.dtype) + "_t" + std::to_string(t.threads) + "_gb_per_s", t.gb_per_s);
    }
    speed.print();
  }
  figures.print();
  return 0;
}
