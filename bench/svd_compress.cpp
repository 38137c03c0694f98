// Compresses a trained ViT-like Fashion-MNIST classifier with SVD low-rank layers
// (nn/low_rank.h): one energy for every layer, and parameter budgets whose per-layer
// ranks follow the singular values (Note [Parameter budget]). Each variant is measured,
// fine-tuned briefly and compared with the dense model given the same fine-tuning; then
// a dense Linear is timed against its factorization at ViT-B/16's shapes.
//
//   build/bench/svd_compress [--model small|vit21m|vitb16] [--device cpu|cuda[:N]] [--quick]
//       [--epochs N] [--finetune-steps N] [--train-limit N] [--test-limit N] [--batch-size N]
//       [--lr X] [--seed N] [--energies a,b,..] [--budgets a,b,..] [--no-linear] [--linear-only]
//       [--linear-tokens N] [--data-dir DIR]
//
// small: the README's 2-block width-64 model; vit21m: 12 blocks, hidden 384, 6 heads,
// MLP 1536, 4x4 patches (21.3M parameters); vitb16: ViT-B/16's shapes at 224px with
// random weights and images: memory and speed only. --quick shrinks any of them to run
// in seconds on a CPU. After the table, "param_ratio:" and "inference_memory_ratio:"
// (batch 1) of the row with the smallest inference memory within 1 point of the dense
// accuracy (bench/svd_compress_run.h: best_row).
//
// Memory figures come from the allocator's statistics (memory/allocator.h), counted
// from what was allocated before each model was built, so the dataset does not count.
// Each factorized layer saves one more activation for backward, its (B, T, rank)
// middle, so where activations outweigh weights (small widths, large batches) peak
// training memory can rise while parameters and optimizer state shrink.
#include <algorithm>
#include <array>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "bench/svd_compress_run.h"
#include "core/error.h"
#include "examples/flags.h"

using namespace frugal;

namespace {

struct Args {
  bench::svd::Options options;
  bool linear = true, table = true;
  int64_t linear_tokens = -1;  // -1: the device's default
};

const char* kUsage =
    "usage: svd_compress [--model small|vit21m|vitb16] [--device cpu|cuda[:N]] [--quick]\n"
    "       [--epochs N] [--finetune-steps N] [--train-limit N (0 = all 60000)] [--test-limit N]\n"
    "       [--batch-size N] [--lr X] [--seed N] [--energies a,b,..] [--budgets a,b,..]\n"
    "       [--no-linear] [--linear-only] [--linear-tokens N] [--data-dir DIR]\n";

std::vector<double> fractions(const std::string& flag, const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');)
    out.push_back(cli::expect(cli::parse_real(item, 1e-9, 1.0), flag, item, "fractions in (0, 1], comma-separated"));
  return out;
}

// The flags with a value that the second pass reads (the first skips them).
constexpr std::array<std::string_view, 11> kValueFlags = {
    "--epochs", "--finetune-steps", "--train-limit", "--test-limit",    "--batch-size", "--lr",
    "--seed",   "--energies",       "--budgets",     "--linear-tokens", "--data-dir"};

Args parse(int argc, char** argv) {
  // Two passes: model, device and --quick set the defaults that the other flags override.
  std::string model = "small", device = "cpu";
  bool quick = false;
  {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--model")) model = flags.choice({"small", "vit21m", "vitb16"});
      else if (flags.is("--device")) device = flags.device();
      else if (flags.is("--quick")) quick = true;
      else if (flags.is("--no-linear") || flags.is("--linear-only")) continue;
      else if (std::find(kValueFlags.begin(), kValueFlags.end(), flags.flag()) != kValueFlags.end()) flags.text();
      else flags.unknown();
    }
  }
  Args a{.options = bench::svd::defaults(model, Device(device), quick)};
  auto& o = a.options;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--model") || flags.is("--device")) flags.text();
    else if (flags.is("--quick")) continue;
    else if (flags.is("--epochs")) o.epochs = flags.non_negative();
    else if (flags.is("--finetune-steps")) o.finetune_steps = flags.positive();
    else if (flags.is("--train-limit")) o.train_limit = flags.non_negative();
    else if (flags.is("--test-limit")) o.test_limit = flags.non_negative();
    else if (flags.is("--batch-size")) o.batch_size = flags.positive();
    else if (flags.is("--lr")) o.lr = flags.positive_real();
    else if (flags.is("--seed")) o.seed = flags.seed();
    else if (flags.is("--energies")) o.energies = fractions("--energies", flags.text());
    else if (flags.is("--budgets")) o.budgets = fractions("--budgets", flags.text());
    else if (flags.is("--no-linear")) a.linear = false;
    else if (flags.is("--linear-only")) a.table = false;
    else if (flags.is("--linear-tokens")) a.linear_tokens = flags.positive();
    else if (flags.is("--data-dir")) o.data_dir = flags.text();
    else flags.unknown();
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = cli::parse_or_exit("svd_compress", kUsage, [&] { return parse(argc, argv); });
  const auto& o = args.options;
  try {
    if (args.table) {
      const std::vector<bench::svd::Row> rows = bench::svd::run_table(o, std::cout);
      std::fflush(stdout);
      bench::svd::print_table(o, rows, std::cout);
      std::cout << bench::svd::summary(rows, o.accuracy_tolerance);
    }
    if (args.linear) {
      // ViT-B/16's tokens at batch 32 (197 each) on a GPU; fewer on a CPU.
      const int64_t tokens = args.linear_tokens > 0 ? args.linear_tokens
                             : o.quick              ? 64
                             : o.device.is_cuda()   ? 32 * 197
                                                    : 2 * 197;
      std::cout << std::flush;
      bench::svd::linear_microbench(o.device, tokens, o.quick ? 8 : 1, o.quick ? 2 : 5, std::cout);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "svd_compress: %s\n", e.what());
    return 1;
  }
  return 0;
}
