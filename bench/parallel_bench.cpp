// Tensor, pipeline and data parallelism on a BERT-shaped encoder, f32, one AdamW training
// step per iteration, every mode on the same model and data (bench/parallel_bench_modes.h):
//   frugal-run --nproc 4 build/bench/parallel_bench [--model base|large] [--batch 32] [--iters 10]
//                        [--micro-batches 8] [--modes single,tp,pp,ddp,ddp-weak,zero1,zero2,zero3,offload,grid]
//   build/bench/parallel_bench --threads 4 --model tiny [--batch 16]   # CPU smoke run
//   frugal-run --nproc 2 build/bench/parallel_bench --backend tcp --model tiny   # CPU processes
//   mpirun -np 2 build/bench/parallel_bench --backend mpi --model tiny          # the same under mpirun
// Models: base (12 layers x 768, 12 heads, MLP 3072, seq 128), large (24 x 1024, 16 heads,
// 4096, seq 128), tiny (4 x 64, 4 heads, 128, seq 16). Modes, N ranks:
//   single    the plain layers (TensorParallelEncoderLayer without a communicator), rank 0 alone
//   tp        N-way tensor parallel: heads and MLP split across the N ranks
//   pp        N pipeline stages, --micro-batches micro-batches, 1F1B
//   ddp       N replicas, the global batch split over them, gradients all-reduced in 25 MiB buckets
//   ddp-weak  N replicas, a whole batch each (as DDP is usually measured: what communication costs)
//   zero1     as ddp with AdamW's state sharded over the ranks (parallel/zero.h)
//   zero2     as zero1 with the gradients sharded too: 25 MiB buckets reduce-scattered in backward
//   zero3     fully sharded (parallel/fsdp.h): parameters too, each encoder layer a unit gathered
//             around its forward and backward, its gradients reduce-scattered as its backward ends
//   offload   as ddp with optim::OffloadAdamW: the AdamW state in pinned host memory, the update
//             on the CPU (optim/offload_adam.h); `offload_host_state_mib:` says how much
//   grid      2-way TP x N/2 pipeline stages (1F1B), N even and >= 4
// --modes defaults to every mode that applies to N. --threads N runs N ranks as threads of
// this process over CPU tensors (the in-process communicator) instead of one process per GPU.
// --backend picks init_process_group's backend for process ranks: auto (nccl with a GPU,
// else tcp), nccl, tcp (CPU processes, any launcher) or mpi (CPU processes under mpirun).
// Prints the model, a table (samples/s, scaling efficiency = samples/s / (N * single's
// samples/s), peak allocated memory per rank, measured and theoretical pipeline bubble)
// and `name: value` lines (single_, TP_, PP_, DDP_, DDP_weak_, ZeRO1_, ZeRO2_, ZeRO3_, grid_ ...),
// with per-rank model-state MiB (parameters, gradients, AdamW moments) for the data-parallel modes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/parallel_bench_modes.h"
#include "core/error.h"
#include "examples/flags.h"
#include "parallel/init.h"
#include "parallel/thread_communicator.h"

using namespace frugal;

namespace {
const char* kUsage =
    "usage: parallel_bench [--model base|large|tiny] [--batch N] [--iters N] [--micro-batches N]\n"
    "                      [--modes single,tp,pp,ddp,ddp-weak,zero1,zero2,zero3,offload,grid] [--threads N]\n"
    "                      [--backend auto|nccl|tcp|mpi]\n";
}  // namespace

int run(int argc, char** argv) {
  bench::BenchOptions opts;
  std::string modes;
  int threads = 0;
  parallel::Backend backend = parallel::Backend::Auto;
  cli::parse_or_exit("parallel_bench", kUsage, [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--batch")) opts.batch = flags.positive();
      else if (flags.is("--iters")) opts.iters = int(flags.integer(1, 1 << 20));
      else if (flags.is("--model")) opts.model = bench::model_config(flags.text());
      else if (flags.is("--micro-batches")) opts.micro_batches = int(flags.integer(1, 1 << 20));
      else if (flags.is("--modes")) modes = flags.text();
      else if (flags.is("--threads")) threads = int(flags.integer(0, 1 << 10));
      else if (flags.is("--backend")) {
        const std::string name = flags.text();
        try {
          backend = parallel::parse_backend(name);
        } catch (const Error&) { throw cli::UsageError("--backend: '" + name + "' is not auto, nccl, tcp or mpi"); }
      } else flags.unknown();
    }
  });
  auto choose_modes = [&](int ranks) {
    opts.modes = modes.empty() ? bench::default_modes(opts.model, ranks) : bench::parse_modes(modes);
  };
  auto bench_world = [&](const std::shared_ptr<parallel::Communicator>& world) {
    const auto results = bench::run_modes(world, opts);
    if (world->rank() == 0) bench::print_report(results, opts, *world);
    world->barrier();
  };
  if (threads > 0) {
    choose_modes(threads);
    parallel::run_ranks(threads, bench_world);
  } else {
    auto world = parallel::init_process_group({.backend = backend, .timeout = std::chrono::minutes(10)});
    choose_modes(world->size());
    bench_world(world);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());  // the messages name parallel_bench
    return 1;
  }
}
