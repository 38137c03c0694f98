// Probes of the programs' command lines (examples/, bench/train_step, tools/frugal-run,
// tests/op_fuzz), run as a user runs them: --help exits 0 with the usage; a bad flag exits 2
// with one line naming it, before any data is read; a path the run would write at its end is
// checked before the run; nothing ends in an uncaught exception (abort, exit 134). Each
// program is stopped by its flags before it trains, so every case takes well under a second.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "examples/flags.h"
#include "tests/cpu/launch_test_util.h"
#include "tests/error_text.h"
#include "tests/test_util.h"
#include "train/checks.h"

using namespace frugal;
using frugal::testing::built_program;
using frugal::testing::check_contains;
using frugal::testing::error_of;
using frugal::testing::frugal_run_path;
using frugal::testing::run_command;
using frugal::testing::ScratchDir;

namespace {

/// A program of the build tree ("examples/fashion_mnist"); "" with a warning when the build
/// left it out (-Dexamples=disabled, -Dbench=disabled), so that its checks are skipped.
std::string program(const std::string& relative) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe");
  const auto path = self.parent_path().parent_path() / relative;
  if (std::filesystem::exists(path)) return path.string();
  WARN_MESSAGE(false, relative, " not built: its command-line probes are skipped");
  return "";
}

/// The program's first output line ("fashion_mnist: --epochs: given twice").
std::string first_line(const std::string& out) { return out.substr(0, out.find('\n')); }

/// Runs `prog args`; checks it exits `code` with a first line that starts with `name: ` and
/// contains every one of `parts`, and that no exception escaped main.
void check_refused(const std::string& prog, const std::string& args, int code, const std::vector<std::string>& parts) {
  if (prog.empty()) return;
  const std::string name = std::filesystem::path(prog).filename().string();
  const auto [c, out] = run_command(prog + " " + args);
  CAPTURE(name);
  CAPTURE(args);
  CAPTURE(out);
  CHECK(c == code);
  CHECK(out.find("terminate called") == std::string::npos);
  const std::string line = first_line(out);
  CHECK(line.rfind(name + ": ", 0) == 0);
  check_contains(line, parts);
}

/// cli::Flags over `args` (argv[0] added), for the parser's own probes.
struct Argv {
  std::vector<std::string> args;
  std::vector<char*> argv;
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    args.insert(args.begin(), "prog");
    for (std::string& s : args) argv.push_back(s.data());
  }
  cli::Flags flags() { return cli::Flags(int(argv.size()), argv.data()); }
};

}  // namespace

TEST_CASE("probe cli: a flag given twice is refused naming it; a repeatable flag collects every value") {
  // Before: the last --epochs won and the run trained for what the first one did not say.
  auto epochs_then = [](std::vector<std::string> args) {
    Argv a(std::move(args));
    cli::Flags flags = a.flags();
    std::vector<std::string> corpus;
    int64_t epochs = 0;
    while (flags.next()) {
      if (flags.is("--epochs")) epochs = flags.positive();
      else if (flags.is_repeatable("--corpus")) corpus.push_back(flags.text());
      else if (flags.is("--no-amp")) continue;
      else flags.unknown();
    }
    return std::pair{epochs, corpus};
  };
  CHECK(error_of([&] { epochs_then({"--epochs", "1", "--epochs", "10"}); }) == "--epochs: given twice");
  CHECK(error_of([&] { epochs_then({"--no-amp", "--epochs", "2", "--no-amp"}); }) == "--no-amp: given twice");
  const auto [epochs, corpus] = epochs_then({"--corpus", "a", "--epochs", "3", "--corpus", "b", "--corpus", "c"});
  CHECK(epochs == 3);
  CHECK(corpus == std::vector<std::string>{"a", "b", "c"});
  // An unknown flag given twice is still reported as unknown.
  CHECK(error_of([&] { epochs_then({"--bogus", "--bogus"}); }) == "unknown option --bogus");
  // One argument tested by is() twice is no repeat (a program's flag chain may do so).
  Argv twice({"--epochs", "4"});
  cli::Flags flags = twice.flags();
  REQUIRE(flags.next());
  CHECK(flags.is("--epochs"));
  CHECK(flags.is("--epochs"));

  check_refused(program("examples/fashion_mnist"), "--epochs 1 --epochs 2 --steps 1", 2, {"--epochs: given twice"});
  check_refused(program("bench/train_step"), "--model vit_b16 --batch 1 --batch 2", 2, {"--batch: given twice"});
  // frugal-run reads its own options; --nproc and --nproc_per_node are one option.
  const std::string run = frugal_run_path();
  for (const char* args : {"--nproc 1 --nproc 2 true", "--nproc 1 --nproc_per_node 2 true"}) {
    const auto [code, out] = run_command(run + " " + args);
    CAPTURE(args);
    CHECK(code == 2);
    check_contains(first_line(out), {"frugal-run: --nproc", ": given twice"});
  }
}

TEST_CASE("probe cli: choices and devices are checked as flags, exit 2 naming the flag, before any data is read") {
  // cli::Flags::choice and ::device.
  auto one = [](std::vector<std::string> args, bool device) {
    Argv a(std::move(args));
    cli::Flags flags = a.flags();
    REQUIRE(flags.next());
    return device ? flags.device() : flags.choice({"mlp", "cnn", "lm"});
  };
  CHECK(one({"--model", "cnn"}, false) == "cnn");
  CHECK(error_of([&] { one({"--model", "CNN"}, false); }) == "--model: expected mlp, cnn or lm, got \"CNN\"");
  for (const char* ok : {"cpu", "cuda", "cuda:0", "cuda:7"}) CHECK(one({"--device", ok}, true) == ok);
  for (const char* bad : {"xyz", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda1", "cuda:1x", "CPU", ""})
    CHECK_MESSAGE(error_of([&] {
                    one({"--device", bad}, true);
                  }) == std::string("--device: expected cpu, cuda or cuda:N, got \"") + bad + "\"",
                  bad);

  // Before: exit 1 after the dataset had loaded (fashion_mnist), "Device: cannot parse"
  // without the flag, an abort (tensor_tour), or usage alone (train_step, run_model).
  const std::string fashion = program("examples/fashion_mnist");
  check_refused(fashion, "--model foo", 2, {"--model: expected mlp or cnn, got \"foo\""});
  check_refused(fashion, "--device xyz", 2, {"--device: expected cpu, cuda or cuda:N, got \"xyz\""});
  check_refused(program("examples/tensor_tour"), "--device xyz", 2, {"--device: expected cpu, cuda or cuda:N"});
  check_refused(program("examples/train_resnet"), "--device gpu", 2, {"--device: expected cpu, cuda or cuda:N"});
  check_refused(program("examples/train_vit"), "--device cuda:x", 2, {"--device: expected cpu, cuda or cuda:N"});
  check_refused(program("examples/profile_memory"), "--device xyz", 2, {"--device: expected cpu, cuda or cuda:N"});
  check_refused(program("examples/bert_mlm"), "--optim sgd", 2,
                {"--optim: expected adamw, galore or offload_adamw, got \"sgd\""});
  const std::string run_model = program("examples/run_model");
  check_refused(run_model, "--model foo", 2, {"--model: expected resnet18, resnet50, bert_base, bert, vit_b16 or vit"});
  check_refused(run_model, "--model resnet18 --weights w --inputs x", 2, {"--out is required"});
  check_refused(run_model, "--model bert --weights w --inputs x --out y", 2, {"--model bert needs --config-json"});
  const std::string train_step = program("bench/train_step");
  check_refused(train_step, "--model mlp --batch 2", 2,
                {"--model: expected resnet50, bert_base, bert_large, bert_mlm or vit_b16, got \"mlp\""});
  check_refused(train_step, "--batch 2", 2, {"--model is required"});
  check_refused(train_step, "--model vit_b16", 2, {"--batch is required"});
  check_refused(train_step, "--model vit_b16 --batch 1 --optim adam", 2, {"--optim: expected sgd, adamw"});
  check_refused(train_step, "--model vit_b16 --batch 1 --fused-conv-bn yes", 2,
                {"--fused-conv-bn: expected auto, on or off, got \"yes\""});
  // op_fuzz read its numbers with std::stoll: "abc" aborted, "10x" ran 10 cases.
  const std::string op_fuzz = built_program("tests/op_fuzz");
  check_refused(op_fuzz, "--cases abc", 2, {"--cases: expected a positive integer, got \"abc\""});
  check_refused(op_fuzz, "--cases 10x", 2, {"--cases: expected a positive integer, got \"10x\""});
  check_refused(op_fuzz, "--seed -1", 2, {"--seed: expected an integer in [0, 18446744073709551615], got \"-1\""});
  check_refused(op_fuzz, "--dtype f99", 2, {"--dtype: expected a dtype", "\"f99\""});
  check_refused(op_fuzz, "--device tpu", 2, {"--device: expected cpu or cuda, got \"tpu\""});
  // The benchmarks: svd_compress aborted on a bad device, bench_ops printed its usage to
  // stdout, bench_resnet_ops read --batch with atoll ("0", "abc": a zero batch).
  check_refused(program("bench/svd_compress"), "--device xyz", 2, {"--device: expected cpu, cuda or cuda:N"});
  check_refused(program("bench/svd_compress"), "--model big", 2,
                {"--model: expected small, vit21m or vitb16, got \"big\""});
  check_refused(program("bench/bench_ops"), "--device xyz", 2, {"--device: expected cpu or cuda, got \"xyz\""});
  check_refused(program("bench/bench_resnet_ops"), "--batch abc", 2, {"--batch: expected a positive integer"});
}

TEST_CASE("probe cli: --help prints the usage and exits 0; an unknown flag exits 2 naming it") {
  // Before: tensor_tour ran its tour for --help and for any flag, run_model said "unknown
  // option --help" (exit 1), custom_model looked for a dataset in "--help", frugal-run and
  // op_fuzz refused --help (exit 2).
  const std::vector<std::pair<std::string, std::string>> programs = {
      {"examples/tensor_tour", "tensor_tour"},
      {"examples/custom_model", "custom_model"},
      {"examples/run_model", "run_model"},
      {"examples/fashion_mnist", "fashion_mnist"},
      {"examples/profile_memory", "profile_memory"},
      {"examples/train_resnet", "train_resnet"},
      {"examples/train_vit", "train_vit"},
      {"examples/train_autoencoder", "train_autoencoder"},
      {"examples/bert_mlm", "bert_mlm"},
      {"bench/train_step", "train_step"},
      {"tests/op_fuzz", "op_fuzz"},
      {"bench/bench_ops", "bench_ops"},
      {"bench/bench_resnet_ops", "bench_resnet_ops"},
      {"bench/svd_compress", "svd_compress"},
      {"tools/frugal-run", "frugal-run"}};
  for (const auto& [relative, name] : programs) {
    const std::string prog = program(relative);
    if (prog.empty()) continue;
    CAPTURE(name);
    // stdout alone: the usage is the answer, not an error.
    const auto [code, out] = run_command("{ " + prog + " --help 2>/dev/null; }");
    CHECK(code == 0);
    CHECK(out.rfind("usage: " + name, 0) == 0);
    if (name != "frugal-run") check_refused(prog, "--bogus", 2, {"unknown option --bogus"});
  }
  check_refused(program("examples/custom_model"), "a b", 2, {"at most one argument"});
  check_refused(program("examples/tensor_tour"), "--device", 2, {"--device: missing value"});
}

TEST_CASE("probe cli: an output path is checked before the run, and its error is one line, not an abort") {
  ScratchDir dir("probe_cli");
  const std::string file = (dir.path / "a_file").string();  // a regular file: nothing can be made under it
  std::fclose(std::fopen(file.c_str(), "w"));
  // Before: profile_memory profiled, then aborted on std::filesystem_error (exit 134).
  const std::string profile = program("examples/profile_memory");
  check_refused(profile, "--steps 1 --batch 2 --out " + file, 1, {"--out: cannot create directory '" + file + "'"});
  check_refused(profile, "--steps 1 --batch 2 --out " + file + "/sub", 1, {"--out:", file + "/sub"});
  // Before: run_model loaded the weights and ran the model first (here it failed on the missing
  // weights instead of the --out the user must fix too).
  check_refused(program("examples/run_model"),
                "--model resnet18 --weights /nonexistent/w.safetensors --inputs x --out " + file + "/y.safetensors", 1,
                {"--out: cannot write '" + file + "/y.safetensors'"});
  // Before: train_step timed its steps, then failed writing the profile.
  check_refused(program("bench/train_step"),
                "--model vit_b16 --batch 1 --device cpu --steps 1 --warmup 0 --profile " + file + "/p", 1,
                {"--profile: cannot create directory '" + file + "/p'"});
  // Before: each rank failed to open its log (exit 127) after frugal-run had started them all.
  const auto [code, out] = run_command(frugal_run_path() + " --nproc 2 --log-dir " + file + " true");
  CHECK(code == 2);
  check_contains(first_line(out), {"frugal-run: --log-dir: cannot write into '" + file + "' (not a directory)"});
  const auto [code2, out2] = run_command(frugal_run_path() + " --log-dir " + (dir.path / "none").string() + " true");
  CHECK(code2 == 2);
  check_contains(first_line(out2), {"--log-dir: cannot write into", "No such file or directory"});
  // A directory that does not exist yet is made, as the programs made it before.
  const std::filesystem::path made = dir.path / "new" / "profile";
  CHECK_NOTHROW(train::require_writable_dir(made.string(), "--out"));
  CHECK(std::filesystem::is_directory(made));
}

TEST_CASE("probe cli: --resume that points nowhere is refused before the dataset is read, and makes no directory") {
  const std::string fashion = program("examples/fashion_mnist");
  if (fashion.empty()) return;
  ScratchDir dir("probe_cli_resume");
  // The data directory does not exist either: the error must be the one about --resume
  // (before: the dataset's, after the directory had been made).
  const std::string nowhere = (dir.path / "typo").string(), data = (dir.path / "no_data").string();
  check_refused(fashion, "--resume --checkpoint-dir " + nowhere + " --data-dir " + data, 1,
                {"--resume: --checkpoint-dir '" + nowhere + "' does not exist"});
  CHECK(!std::filesystem::exists(nowhere));
  const std::string empty = (dir.path / "empty").string();
  std::filesystem::create_directories(empty);
  check_refused(fashion, "--resume --checkpoint-dir " + empty + " --data-dir " + data, 1,
                {"--resume: no checkpoint in " + empty});
}

TEST_CASE("probe cli: in a log a training run prints steps with rate and ETA; a diverged run exits 1 naming the step") {
  const std::string vit = program("examples/train_vit");
  if (vit.empty()) return;
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    WARN_MESSAGE(false, "Fashion-MNIST not installed: the training-run probes are skipped");
    return;
  }
  const std::string tiny = "--limit 32 --batch 8 --test-limit 8 --layers 1 --hidden 16 --heads 2 --mlp 16 --epochs 1";
  // Output to a pipe, as in a log. Before: only the epoch's summary, no step and no ETA
  // (Note [Progress in a log]).
  const auto [code, out] = run_command(vit + " " + tiny);
  CAPTURE(out);
  CHECK(code == 0);
  check_contains(out, {"epoch 1/1  step 2/4  loss ", " img/s  ETA ", "epoch 1/1  mean loss ", "test_accuracy: "});
  CHECK(out.find('\r') == std::string::npos);  // no redrawn lines in a file
  const auto [code2, out2] = run_command(vit + " " + tiny + " --lr 1e30");
  CHECK(code2 == 1);
  check_contains(out2,
                 {"train_vit: training diverged at epoch 1, step ", "the loss is nan", "try a lower learning rate"});
  CHECK(out2.find("test_accuracy") == std::string::npos);
}
