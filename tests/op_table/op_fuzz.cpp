// op_fuzz: runs the differential op table (tests/op_table/op_table.h) for as long as one
// likes. Cases go round-robin over the chosen ops, so every op gets its share; the same
// (--seed, op, case index) always makes the same case, so a failure printed here is
// reproduced by `--op NAME --seed S` with enough --cases to reach its index.
//
//   op_fuzz --cases 20000 --seed 7 [--device cuda] [--op softmax] [--dtype f16] [--first 0] [--all-failures]
//           [--trace: print each case before running it, to find one that crashes]
//   op_fuzz --grad [--cases N] [--seed S] [--device cuda] [--op NAME] [--dtype f16 | --amp f16] [--first I]
//           the differentiable op table (tests/op_table/grad_table.h): on the CPU each case is a
//           gradcheck, an autocast check and a float32/float16/bfloat16 check; with --dtype only
//           the last in those dtypes, with --amp only the autocast check; on CUDA the last two.
//   op_fuzz --grad --gradgrad [--cases N] [--op NAME]: only the double backward against central
//           differences of gradients, for the ops that have one (Note [Double backward]).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "examples/flags.h"
#include "tests/op_table/grad_table.h"
#include "tests/op_table/op_table.h"

using namespace frugal;
using namespace frugal::optest;

namespace {

struct Args {
  int64_t cases = 1000, first = 0;
  uint64_t seed = 1;
  std::string device = "cpu";
  std::vector<std::string> ops;
  std::vector<DType> dtypes, amp;
  bool grad = false;
  bool gradgrad = false;  // --grad --gradgrad: only the double backward check
  bool all_failures = false;
  bool trace = false;
};

const char* kUsage =
    "usage: op_fuzz [--cases N] [--seed S] [--device cpu|cuda] [--op NAME]... [--dtype T]... [--first I]\n"
    "               [--all-failures] [--trace] [--list]\n"
    "       op_fuzz --grad [--cases N] [--seed S] [--device cpu|cuda] [--op NAME]... [--dtype T]... [--amp T]...\n"
    "               [--first I] [--list]\n"
    "       op_fuzz --grad --gradgrad [--cases N] [--seed S] [--op NAME]... [--first I]\n";

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "op_fuzz: %s\n%s", why, kUsage);
  std::exit(2);
}

/// The dtype a --dtype or --amp value names ("f16", "bfloat16").
DType dtype_flag(cli::Flags& flags) {
  const std::string v = flags.text();
  try {
    return parse_dtype(v);
  } catch (const Error&) {
    throw cli::UsageError(flags.flag() + ": expected a dtype (f32, f16, bf16, ...), got \"" + v + "\"");
  }
}

Args parse(int argc, char** argv) {
  return cli::parse_or_exit("op_fuzz", kUsage, [&] {
    Args a;
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--cases")) a.cases = flags.positive();
      else if (flags.is("--seed")) a.seed = flags.seed();
      else if (flags.is("--device")) a.device = flags.choice({"cpu", "cuda"});
      else if (flags.is_repeatable("--op")) a.ops.push_back(flags.text());
      else if (flags.is_repeatable("--dtype")) a.dtypes.push_back(dtype_flag(flags));
      else if (flags.is_repeatable("--amp")) a.amp.push_back(dtype_flag(flags));
      else if (flags.is("--grad")) a.grad = true;
      else if (flags.is("--gradgrad")) a.gradgrad = a.grad = true;
      else if (flags.is("--first")) a.first = flags.non_negative();
      else if (flags.is("--all-failures")) a.all_failures = true;
      else if (flags.is("--trace")) a.trace = true;
      else if (flags.is("--list")) {
        if (a.grad)
          for (const GradEntry& e : grad_table()) std::printf("%s\n", e.name.c_str());
        else
          for (const OpEntry& e : op_table()) std::printf("%s\n", e.name.c_str());
        std::exit(0);
      } else flags.unknown();
    }
    return a;
  });
}

struct Tally {
  const OpEntry* op;
  int64_t next = 0, run = 0, failed = 0;
};

/// One case of the differentiable table: every check the arguments select.
GradResult grad_case(const GradEntry& e, const Args& a, Device device, int64_t index) {
  GradResult r;
  const auto take = [&](const GradResult& one) {
    r.ran = r.ran || one.ran;
    if (!one.ok && r.ok) r = one;
  };
  if (a.gradgrad) return run_gradgradcheck(e, a.seed, index);  // float64 on the CPU
  const bool only_amp = !a.amp.empty() && a.dtypes.empty(), only_dtype = !a.dtypes.empty() && a.amp.empty();
  if (device.is_cpu() && !only_amp && !only_dtype) take(run_gradcheck(e, a.seed, index));
  if (!only_dtype)
    for (DType low : a.amp.empty() ? std::vector<DType>{kFloat16, kBFloat16} : a.amp)
      take(run_autocast(e, a.seed, index, device, low));
  if (!only_amp)
    for (DType dt : a.dtypes.empty() ? std::vector<DType>{kFloat32, kFloat16, kBFloat16} : a.dtypes)
      take(run_dtype(e, a.seed, index, device, dt));
  return r;
}

/// op_fuzz --grad: round-robin over the differentiable table's entries.
int grad_main(const Args& args) {
  Device device = kCPU;
  if (args.device == "cuda") {
    if (cuda_device_count() == 0) usage("--device cuda, but no GPU is visible");
    device = cuda();
  } else if (args.device != "cpu") {
    usage("--device must be cpu or cuda");
  }
  std::vector<const GradEntry*> entries;
  for (const GradEntry& e : grad_table())
    if (args.ops.empty() || std::find(args.ops.begin(), args.ops.end(), e.name) != args.ops.end())
      entries.push_back(&e);
  if (entries.empty()) usage("no differentiable op of that name (see --grad --list)");
  const auto start = std::chrono::steady_clock::now();
  int64_t done = 0, failed = 0, not_run = 0;
  std::vector<int64_t> fails(entries.size(), 0);
  // An op whose graph has no double backward never runs under --gradgrad: stop after 100
  // rounds in a row in which no case ran, instead of looping for ever.
  int64_t idle_rounds = 0;
  for (int64_t i = args.first; done < args.cases && idle_rounds < 100; ++i) {
    const int64_t done_before = done;
    for (size_t k = 0; k < entries.size() && done < args.cases; ++k) {
      const GradResult r = grad_case(*entries[k], args, device, i);
      if (!r.ran) {
        ++not_run;
        continue;
      }
      ++done;
      if (!r.ok) {
        ++failed;
        if (fails[k]++ == 0 || args.all_failures) std::printf("FAILED %s\n", r.message.c_str());
      }
    }
    idle_rounds = done == done_before ? idle_rounds + 1 : 0;
  }
  std::printf("%lld cases of %zu differentiable ops, %lld failed (%lld not run: %s); seed %llu, device %s, %.1f s\n",
              (long long)done, entries.size(), (long long)failed, (long long)not_run,
              args.gradgrad ? "no double backward" : "not on this device", (unsigned long long)args.seed,
              args.device.c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (args.grad) return grad_main(args);
  RunOptions options;
  if (args.device == "cuda") {
    if (cuda_device_count() == 0) usage("--device cuda, but no GPU is visible");
    options.device = cuda();
    options.dtypes = {kFloat32, kFloat16, kBFloat16};
  } else if (args.device != "cpu") {
    usage("--device must be cpu or cuda");
  }
  if (!args.dtypes.empty()) options.dtypes = args.dtypes;
  options.trace = args.trace;
  std::vector<Tally> tallies;
  for (const OpEntry& e : op_table())
    if (args.ops.empty() || std::find(args.ops.begin(), args.ops.end(), e.name) != args.ops.end())
      tallies.push_back({&e, args.first});
  if (tallies.empty()) usage("no op of that name (see --list)");

  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_report = start;
  int64_t done = 0, failed = 0, idle = 0;
  for (size_t k = 0; done < args.cases && idle < int64_t(tallies.size()); k = (k + 1) % tallies.size()) {
    Tally& t = tallies[k];
    const CaseResult r = run_case(*t.op, args.seed, t.next++, options);
    if (!r.ran) {  // the op has no case for these dtypes / this device
      ++idle;
      continue;
    }
    idle = 0;
    ++done, ++t.run;
    if (!r.ok) {
      ++failed;
      if (t.failed++ == 0 || args.all_failures) std::printf("\rFAILED %s\n", r.message.c_str());
    }
    const Clock::time_point now = Clock::now();
    if (now - last_report > std::chrono::seconds(1) || done == args.cases) {
      last_report = now;
      const double secs = std::chrono::duration<double>(now - start).count(), rate = double(done) / secs;
      std::printf("\r%lld/%lld cases  %.0f/s  ETA %.0fs  %lld failed   ", (long long)done, (long long)args.cases, rate,
                  double(args.cases - done) / rate, (long long)failed);
      std::fflush(stdout);
    }
  }
  std::printf("\n\n%-32s %8s %8s\n", "op", "cases", "failed");
  for (const Tally& t : tallies)
    if (t.run > 0) std::printf("%-32s %8lld %8lld\n", t.op->name.c_str(), (long long)t.run, (long long)t.failed);
  std::printf("%-32s %8lld %8lld\n", "total", (long long)done, (long long)failed);
  std::printf("seed %llu, device %s, %.1f s\n", (unsigned long long)args.seed, args.device.c_str(),
              std::chrono::duration<double>(Clock::now() - start).count());
  return failed == 0 ? 0 : 1;
}
