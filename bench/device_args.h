#pragma once
// The command line of the benchmarks that print one table on either device (bench_sort,
// bench_interpolate): [--device cpu|cuda] [--reps N] [--threads N].
#include <string>

#include "examples/flags.h"

namespace frugal::bench {

struct DeviceArgs {
  std::string device = "cpu";
  int reps = 20;    // timed calls; the median is reported
  int threads = 2;  // CPU threads (the quiet machine's two cores)
};

/// `program`'s arguments; a bad one prints the usage and exits 2 (cli::parse_or_exit).
inline DeviceArgs parse_device_args(const char* program, int argc, char** argv) {
  const std::string usage = std::string("usage: ") + program + " [--device cpu|cuda] [--reps N] [--threads N]\n";
  return cli::parse_or_exit(program, usage.c_str(), [&] {
    DeviceArgs a;
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--device")) a.device = flags.choice({"cpu", "cuda"});
      else if (flags.is("--reps")) a.reps = int(flags.positive());
      else if (flags.is("--threads")) a.threads = int(flags.integer(1, 1024));
      else flags.unknown();
    }
    return a;
  });
}

}  // namespace frugal::bench
