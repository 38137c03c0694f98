#pragma once
// Command-line flags for the example, bench and tool programs. Every value is parsed
// whole and range-checked, and a mistake names the flag and the text it got:
//   --epochs: expected a positive integer, got "2abc"
// where std::stoll reads "2abc" as 2 and "1e3" as 1, and std::stoull reads "-1" as 2^64 - 1.
//
//   const Args args = cli::parse_or_exit("train", kUsage, [&] {
//     Args a;
//     cli::Flags flags(argc, argv);
//     while (flags.next()) {
//       if (flags.is("--epochs")) a.epochs = flags.positive();
//       else if (flags.is("--lr")) a.lr = flags.positive_real();
//       else if (flags.is("--no-amp")) a.amp = false;
//       else flags.unknown();
//     }
//     return a;
//   });
//
// It lives with the examples because programs are its only users (the library reads no
// command lines) and bench/ and tools/ already build on examples/. Header-only and
// standard C++ only, so that a program that does not link frugal (frugal-run) can use it.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace frugal::cli {

/// `text` as a whole base-10 integer in [lo, hi]; nullopt when it is empty, has anything
/// before or after the digits ("2abc", "1e3", " 2", "+2") or lies outside the range.
inline std::optional<int64_t> parse_int(std::string_view text, int64_t lo = std::numeric_limits<int64_t>::min(),
                                        int64_t hi = std::numeric_limits<int64_t>::max()) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || stop != end || v < lo || v > hi) return std::nullopt;
  return v;
}

/// `text` as a whole unsigned 64-bit integer; nullopt as parse_int, and for any sign ("-1").
inline std::optional<uint64_t> parse_uint(std::string_view text) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || stop != end) return std::nullopt;
  return v;
}

/// `text` as a whole finite number ("0.1", "1e-3") in [lo, hi]; nullopt when it is empty,
/// has anything after the number, overflows, or is inf or nan.
inline std::optional<double> parse_real(std::string_view text, double lo = -std::numeric_limits<double>::max(),
                                        double hi = std::numeric_limits<double>::max()) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || stop != end || !std::isfinite(v) || v < lo || v > hi) return std::nullopt;
  return v;
}

/// A command-line mistake; the message names the flag and what it got.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
/// Thrown by Flags::next() on -h or --help.
struct HelpRequested {};

/// *parsed, or throws UsageError(`<flag>: expected <what>, got "<text>"`).
template <typename T>
T expect(const std::optional<T>& parsed, std::string_view flag, std::string_view text, std::string_view what) {
  if (!parsed)
    throw UsageError(std::string(flag) + ": expected " + std::string(what) + ", got \"" + std::string(text) + "\"");
  return *parsed;
}

/// Walks argv flag by flag; a flag that takes a value reads it with one of the typed
/// getters, which consume the next argument.
class Flags {
 public:
  Flags(int argc, char** argv) : args_(argv + (argc > 0), argv + argc) {}

  /// Moves to the next flag; false after the last. Throws HelpRequested on -h / --help.
  bool next() {
    if (next_ >= args_.size()) return false;
    flag_at_ = next_;
    flag_ = args_[next_++];
    if (flag_ == "-h" || flag_ == "--help") throw HelpRequested{};
    return true;
  }
  /// True when the current flag is `name`. Throws UsageError when it was given before: see
  /// Note [A flag given twice].
  bool is(std::string_view name) { return is(name, /*repeatable=*/false); }
  /// As is(), for a flag that may be given more than once (`--corpus A --corpus B`).
  bool is_repeatable(std::string_view name) { return is(name, /*repeatable=*/true); }
  const std::string& flag() const { return flag_; }

  /// The flag's value: the next argument, which must not itself be a flag ("--x").
  std::string text() {
    if (next_ >= args_.size() || args_[next_].rfind("--", 0) == 0) throw UsageError(flag_ + ": missing value");
    return args_[next_++];
  }
  /// The flag's optional value: the next argument, unless there is none or it is a flag
  /// (`--checkpoint` and `--checkpoint selective` both parse).
  std::optional<std::string> optional_text() {
    if (next_ >= args_.size() || args_[next_].rfind("--", 0) == 0) return std::nullopt;
    return args_[next_++];
  }
  /// An integer >= 1.
  int64_t positive() { return integer(1, std::numeric_limits<int64_t>::max(), "a positive integer"); }
  /// An integer >= 0.
  int64_t non_negative() { return integer(0, std::numeric_limits<int64_t>::max(), "a non-negative integer"); }
  /// An integer in [lo, hi].
  int64_t integer(int64_t lo, int64_t hi) {
    return integer(lo, hi, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  /// A random seed: any integer in [0, 2^64 - 1].
  uint64_t seed() {
    const std::string v = text();
    return expect(parse_uint(v), v, "an integer in [0, 18446744073709551615]");
  }
  /// A finite number > 0.
  double positive_real() {
    const std::string v = text();
    const std::optional<double> x = parse_real(v);
    return expect(x && *x > 0 ? x : std::nullopt, v, "a positive number");
  }
  /// A finite number in [lo, hi].
  double real(double lo, double hi) {
    const std::string v = text();
    std::ostringstream range;
    range << "a number in [" << lo << ", " << hi << "]";
    return expect(parse_real(v, lo, hi), v, range.str());
  }
  /// One of `choices` ("mlp", "cnn"); else UsageError(`--model: expected mlp or cnn, got "x"`).
  std::string choice(std::initializer_list<std::string_view> choices) {
    const std::string v = text();
    std::string what;
    size_t k = 0;
    for (const std::string_view c : choices) {
      if (c == v) return v;
      what += (k == 0 ? "" : k + 1 == choices.size() ? " or " : ", ") + std::string(c);
      ++k;
    }
    throw UsageError(flag_ + ": expected " + what + ", got \"" + v + "\"");
  }
  /// A device as frugal::Device spells it: cpu, cuda or cuda:N (checked here, so that a
  /// typo is a usage error naming the flag, not a failure after the data has loaded).
  std::string device() {
    const std::string v = text();
    const bool ok =
        v == "cpu" || v == "cuda" || (v.rfind("cuda:", 0) == 0 && parse_int(std::string_view(v).substr(5), 0, 1 << 20));
    return expect(ok ? std::optional<std::string>(v) : std::nullopt, v, "cpu, cuda or cuda:N");
  }
  /// Throws UsageError("unknown option <flag>"): the last branch of a program's flag chain.
  [[noreturn]] void unknown() const { throw UsageError("unknown option " + flag_); }

 private:
  // Note [A flag given twice]
  // `--epochs 1 ... --epochs 10` is most often an edited command line whose old value was
  // left behind, and "the last one wins" would then silently train for what the user did
  // not mean; so a flag given twice is refused, naming it. Only flags that collect a list
  // (is_repeatable) may repeat. The check sits in is(), where the program names the flag,
  // not in next(), so that flags it does not know still read "unknown option". A program may
  // test one argument with is() several times: it is the argument's position, not the
  // number of matches, that tells a repeat.
  bool is(std::string_view name, bool repeatable) {
    if (flag_ != name) return false;
    for (const auto& [seen, at] : seen_)
      if (seen == flag_) {
        if (at != flag_at_ && !repeatable) throw UsageError(flag_ + ": given twice");
        return true;
      }
    seen_.emplace_back(flag_, flag_at_);
    return true;
  }
  int64_t integer(int64_t lo, int64_t hi, const std::string& what) {
    const std::string v = text();
    return expect(parse_int(v, lo, hi), v, what);
  }
  template <typename T>
  T expect(const std::optional<T>& parsed, const std::string& text, const std::string& what) const {
    return cli::expect(parsed, flag_, text, what);
  }

  std::vector<std::string> args_;
  size_t next_ = 0;
  size_t flag_at_ = 0;  // args_ index of flag_
  std::string flag_;
  std::vector<std::pair<std::string, size_t>> seen_;  // each flag matched by is(), at its first position
};

/// Returns parse(). A UsageError prints "<program>: <message>" and `usage` to stderr and
/// exits 2; --help prints `usage` to stdout and exits 0.
template <typename Parse>
auto parse_or_exit(const char* program, const char* usage, Parse&& parse) {
  try {
    return parse();
  } catch (const HelpRequested&) {
    std::fputs(usage, stdout);
    std::exit(0);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n%s", program, e.what(), usage);
    std::exit(2);
  }
}

}  // namespace frugal::cli
