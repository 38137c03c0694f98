// The programs' flag parser (examples/flags.h): whole-string values, ranges, and errors
// that name the flag and the text, checked against what std::stoll / std::stoull got wrong.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "examples/flags.h"
#include "tests/error_text.h"

using namespace frugal;
using frugal::testing::check_contains;
using frugal::testing::error_of;

namespace {

// Runs a program's flag loop over `args` (argv[0] added): --epochs, --batch-size, --seed,
// --lr, --warmup, --save, --no-amp and --checkpoint [POLICY], as the programs declare them.
struct Parsed {
  int64_t epochs = 0, batch_size = 0;
  uint64_t seed = 0;
  double lr = 0, warmup = 0;
  std::string save;
  bool amp = true;
  std::optional<std::string> checkpoint;  // --checkpoint [POLICY]: "" without a value
};
Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  Parsed p;
  cli::Flags flags(int(argv.size()), argv.data());
  while (flags.next()) {
    if (flags.is("--epochs")) p.epochs = flags.positive();
    else if (flags.is("--batch-size")) p.batch_size = flags.positive();
    else if (flags.is("--seed")) p.seed = flags.seed();
    else if (flags.is("--lr")) p.lr = flags.positive_real();
    else if (flags.is("--warmup")) p.warmup = flags.real(0, 1);
    else if (flags.is("--save")) p.save = flags.text();
    else if (flags.is("--no-amp")) p.amp = false;
    else if (flags.is("--checkpoint")) p.checkpoint = flags.optional_text().value_or("");
    else flags.unknown();
  }
  return p;
}

std::string parse_error(const std::vector<std::string>& args) {
  return error_of([&] { parse(args); });
}

}  // namespace

TEST_CASE("flags: parse_int reads the whole text or nothing") {
  CHECK(cli::parse_int("42") == 42);
  CHECK(cli::parse_int("-7") == -7);
  CHECK(cli::parse_int("9223372036854775807") == INT64_MAX);
  // std::stoll reads a prefix of each of these; they are all mistakes.
  for (const char* bad : {"2abc", "1e3", "1.5", " 2", "2 ", "+2", "", "abc", "0x10"})
    CHECK_MESSAGE(!cli::parse_int(bad), "'", bad, "'");
  CHECK(!cli::parse_int("9223372036854775808"));  // one past INT64_MAX
  CHECK(cli::parse_int("5", 1, 5) == 5);
  CHECK(!cli::parse_int("0", 1, 5));
  CHECK(!cli::parse_int("6", 1, 5));
}

TEST_CASE("flags: parse_uint takes no sign, so -1 is not 2^64 - 1") {
  CHECK(cli::parse_uint("18446744073709551615") == UINT64_MAX);
  CHECK(!cli::parse_uint("-1"));  // std::stoull("-1") == 18446744073709551615
  CHECK(!cli::parse_uint("18446744073709551616"));
  CHECK(!cli::parse_uint("7seven"));
}

TEST_CASE("flags: parse_real accepts finite numbers only") {
  CHECK(cli::parse_real("1e-3") == 1e-3);
  CHECK(cli::parse_real("1e38") == 1e38);
  CHECK(cli::parse_real("-0.5") == -0.5);
  for (const char* bad : {"inf", "nan", "-inf", "1e400", "0.1x", "", "x"}) CHECK_MESSAGE(!cli::parse_real(bad), bad);
  CHECK(cli::parse_real("1", 0, 1) == 1.0);
  CHECK(!cli::parse_real("1.01", 0, 1));
}

TEST_CASE("flags: values that std::stoll and std::stoull misread are errors naming the flag and the text") {
  check_contains(parse_error({"--batch-size", "1e3"}), {"--batch-size: expected a positive integer, got \"1e3\""});
  check_contains(parse_error({"--epochs", "2abc"}), {"--epochs: expected a positive integer, got \"2abc\""});
  check_contains(parse_error({"--epochs", "-1"}), {"--epochs: expected a positive integer, got \"-1\""});
  check_contains(parse_error({"--epochs", "0"}), {"--epochs: expected a positive integer, got \"0\""});
  check_contains(parse_error({"--seed", "-1"}), {"--seed: expected an integer in [0, 18446744073709551615]", "\"-1\""});
  check_contains(parse_error({"--lr", "0"}), {"--lr: expected a positive number, got \"0\""});
  check_contains(parse_error({"--lr", "nan"}), {"--lr: expected a positive number, got \"nan\""});
  check_contains(parse_error({"--warmup", "1.5"}), {"--warmup: expected a number in [0, 1], got \"1.5\""});
}

TEST_CASE("flags: unknown flags and missing values are errors") {
  check_contains(parse_error({"--epochs", "2", "--bogus", "1"}), {"unknown option --bogus"});
  check_contains(parse_error({"--save"}), {"--save: missing value"});
  // A flag right after a flag is a forgotten value, not a file named "--epochs".
  check_contains(parse_error({"--save", "--epochs", "2"}), {"--save: missing value"});
  CHECK_THROWS_AS(parse({"--epochs", "2", "--help"}), cli::HelpRequested);
  CHECK_THROWS_AS(parse({"-h"}), cli::HelpRequested);
}

TEST_CASE("flags: well-formed values arrive as given") {
  const Parsed p = parse({"--epochs", "3", "--batch-size", "1000", "--seed", "18446744073709551615", "--lr", "1e38",
                          "--warmup", "0", "--no-amp", "--save", "out/w.safetensors"});
  CHECK(p.epochs == 3);
  CHECK(p.batch_size == 1000);
  CHECK(p.seed == UINT64_MAX);
  CHECK(p.lr == 1e38);
  CHECK(p.warmup == 0.0);
  CHECK(!p.amp);
  CHECK(p.save == "out/w.safetensors");
  CHECK(parse({}).epochs == 0);  // nothing given: the program's defaults stand
}

TEST_CASE("flags: an optional value is taken when the next argument is not a flag") {
  CHECK(parse({"--checkpoint"}).checkpoint == "");
  CHECK(parse({"--checkpoint", "selective"}).checkpoint == "selective");
  const Parsed p = parse({"--checkpoint", "--epochs", "2"});
  CHECK(p.checkpoint == "");
  CHECK(p.epochs == 2);
  CHECK(!parse({"--epochs", "2"}).checkpoint);
}
