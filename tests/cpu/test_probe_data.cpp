// Probes for silent wrong answers on the CPU in the data and text pipeline, against what
// Hugging Face's BertTokenizer, Python, torchvision, torch.utils.data and gzip document:
// WordPiece vocab files read as Python's universal newlines read them, every ASCII character
// through BasicTokenizer's rules, greedy longest-match-first without backtracking, special
// tokens next to punctuation and stray bytes, every stray UTF-8 byte replaced by one U+FFFD
// and dropped, strip_accents without lower_case, words cut by punctuation before the length
// limit; transforms on channels-last and transposed views against float64 loops and replayed
// draws; a DataLoader over a TensorDataset subclass, epochs that never mix, drop_last; IDX
// files in damaged, concatenated or padded gzip streams. Expected values are worked out here
// from the documented rules. A failing case here is a finding.
#include <doctest/doctest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "nn/data/dataloader.h"
#include "nn/data/dataset.h"
#include "nn/data/idx.h"
#include "nn/data/mlm_masking.h"
#include "nn/data/transforms.h"
#include "nn/data/unicode_text.h"
#include "nn/data/wordpiece.h"
#include "nn/module.h"
#include "tensor/factory.h"
#include "tests/test_util.h"
#include "train/evaluate.h"

using namespace frugal;
using namespace frugal::testing;
using namespace frugal::data;
using namespace std::string_view_literals;

namespace {

using Tokens = std::vector<std::string>;
using Ids = std::vector<int64_t>;

// A file in the temp directory holding `contents`, removed at the end of the test.
struct TempFile {
  std::string path;
  explicit TempFile(std::string_view contents, const std::string& stem, const std::string& ext = ".txt")
      : path(temp_path(stem, ext)) {
    write_file(path, std::string(contents));
  }
  ~TempFile() { std::filesystem::remove(path); }
};

WordPiece vocab_of(std::string_view contents, WordPieceOptions options = {}) {
  TempFile f(contents, "frugal_probe_data_vocab");
  return WordPiece::from_file(f.path, options);
}

// The lines Python's open(path, "r", newline=None).readlines() yields, each with its line end
// stripped, as HF's load_vocab does with rstrip("\n"): a line ends at "\n", "\r\n" or a lone
// "\r" (universal newlines). Written from Python's documentation, not from WordPiece.
std::vector<std::string> python_lines(std::string_view text) {
  std::vector<std::string> lines;
  std::string line;
  bool open = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      lines.push_back(line), line.clear(), open = false;
    } else {
      line += c, open = true;
    }
  }
  if (open) lines.push_back(line);
  return lines;
}

// The bytes of an IDX file of unsigned bytes: 0, 0, 0x08, ndim, big-endian sizes, data.
std::string idx_bytes(const std::vector<uint32_t>& shape, const std::vector<uint8_t>& data) {
  std::string out = {0, 0, 0x08, char(shape.size())};
  for (uint32_t s : shape)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(char(uint8_t(s >> shift)));
  out.append(data.begin(), data.end());
  return out;
}

// `bytes` as one gzip member (what gzip(1) writes), compressed with zlib's deflate.
std::string gzip_member(const std::string& bytes) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, uLong(bytes.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = uInt(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::vector<uint8_t> byte_pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t((i * 2654435761u + seed * 40503u) >> 7);
  return v;
}

// Every element as double, row-major, whatever the dtype and layout (uint8 read as 0..255).
std::vector<double> elements(const Tensor& t) { return t.to(kCPU, kFloat64).contiguous().tolist<double>(); }

// A (C, H, W) view whose memory is (H, W, C): channels-last, as an image decoded to HWC and
// permuted, the way torchvision's ToTensor sees a PIL image.
Tensor channels_last_view(const Tensor& hwc) { return hwc.permute({2, 0, 1}); }

// `s` with control bytes and bytes >= 0x80 written as \xNN, for test messages.
std::string escaped(std::string_view s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (char ch : s) {
    const auto b = uint8_t(ch);
    if (b >= 32 && b < 127) out += ch;
    else out += std::string("\\x") + digits[b >> 4] + digits[b & 15];
  }
  return out;
}

}  // namespace

// ---- WordPiece: the vocab file -----------------------------------------------------------

TEST_CASE("probe data: a vocab's lines end at LF, CRLF or a lone CR, as Python's universal newlines (HF load_vocab)") {
  // HF's load_vocab: open(vocab_file, "r", encoding="utf-8").readlines(), token = line.rstrip("\n"),
  // id = line index. In text mode Python ends a line at "\n", "\r\n" and a lone "\r".
  const std::string_view files[] = {
      "[UNK]\nhello\nworld\n",        // LF, trailing newline
      "[UNK]\nhello\nworld",          // no trailing newline
      "[UNK]\r\nhello\r\nworld\r\n",  // CRLF
      "[UNK]\r\nhello\r\nworld",      // CRLF, none at the end
      "[UNK]\rhello\rworld\r",        // classic Mac OS: lone CR
      "[UNK]\nhello\rworld\r\n",      // mixed
      "[UNK]\n\nhello\n\n\nworld\n",  // blank lines keep their ids
      "[UNK]\r\r\nhello\n\r\rworld",  // CR then CRLF: two line ends
      "[UNK]\nhello \nworld\t\n",     // trailing spaces are part of the token, as rstrip("\n") leaves them
  };
  for (std::string_view text : files) {
    INFO("vocab " << escaped(text));
    const std::vector<std::string> lines = python_lines(text);
    const WordPiece wp = vocab_of(text);
    REQUIRE(wp.size() == int64_t(lines.size()));
    for (size_t id = 0; id < lines.size(); ++id) {
      CHECK(wp.token(int64_t(id)) == lines[id]);
      if (!lines[id].empty()) CHECK(wp.token_id(lines[id]) == int64_t(id));
    }
    CHECK(!wp.contains("hello\rworld"));
  }
}

TEST_CASE("probe data: vocab errors are clear: a token twice, no [UNK], invalid UTF-8, empty file") {
  // frugal refuses a duplicate where HF silently keeps the later id (documented in wordpiece.h).
  check_error([] { vocab_of("[UNK]\nhello\r\nhello\n"); }, {"line 3", "'hello'", "line 2"});
  check_error([] { vocab_of("hello\nworld\n"); }, {"no unknown token '[UNK]'"});
  check_error([] { vocab_of("[UNK]\nhe\xc3llo\n"); }, {"line 2", "not valid UTF-8", "0xc3"});
  check_error([] { vocab_of(""); }, {"is empty"});
  // A lone CR splits the line, so a token that only looks duplicated with it is two tokens.
  const WordPiece wp = vocab_of("[UNK]\rab\ncd\r\n");
  CHECK(wp.size() == 3);
  CHECK(wp.token_id("cd") == 2);
}

// ---- WordPiece: BasicTokenizer on every ASCII character ------------------------------------

TEST_CASE("probe data: every ASCII character between two letters splits, vanishes or joins as BasicTokenizer says") {
  // Vocab: [UNK], "a", "b", "##b", and for every printable non-space ASCII c other than
  // letters: c and "##c"; for every lower-case letter and digit c: "##c".
  std::string text = "[UNK]\na\nb\n##b\n";
  for (int c = 33; c < 127; ++c) {
    if (c >= 'A' && c <= 'Z') continue;
    if (!std::isalnum(c)) text += std::string(1, char(c)) + "\n";
    if (c != 'b') text += "##" + std::string(1, char(c)) + "\n";
  }
  const WordPiece wp = vocab_of(text);
  for (int c = 0; c < 128; ++c) {
    INFO("character " << c);
    const std::string s = std::string("a") + char(c) + "b";
    // HF's rules: _clean_text drops 0 and Cc (0-31 but \t \n \r, and 127) and turns \t \n \r
    // and ' ' into a space; _is_punctuation is ASCII 33-47, 58-64, 91-96, 123-126; the rest
    // joins the word, lower-cased, and WordPiece matches "a" "##c" "##b".
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    const bool control = !space && (c < 32 || c == 127);
    const bool punct = (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    Tokens expected;
    if (space) expected = {"a", "b"};
    else if (control) expected = {"a", "##b"};
    else if (punct) expected = {"a", std::string(1, char(c)), "b"};
    else if (char(std::tolower(c)) == 'b') expected = {"a", "##b", "##b"};
    else expected = {"a", "##" + std::string(1, char(std::tolower(c))), "##b"};
    CHECK(wp.tokenize(s) == expected);
  }
}

TEST_CASE("probe data: WordPiece is greedy longest-match-first and never backtracks; one bad piece is one [UNK]") {
  const WordPiece wp = vocab_of("[UNK]\na\nab\n##bc\n##d\nx\n##y\n,\n");
  // HF's WordpieceTokenizer: the longest vocab entry that prefixes the word, then the longest
  // "##" entry that prefixes the rest, and so on; a rest that no entry prefixes makes the
  // whole word one unk_token, even where a shorter first piece would have worked ("abc" is
  // not "a" "##bc": "ab" is taken first and "##c" is missing).
  CHECK(wp.tokenize("abc") == Tokens{"[UNK]"});
  CHECK(wp.tokenize("abd") == Tokens{"ab", "##d"});
  CHECK(wp.tokenize("abdd") == Tokens{"ab", "##d", "##d"});
  CHECK(wp.tokenize("xyz") == Tokens{"[UNK]"});  // one [UNK], not "x" "##y" [UNK]
  CHECK(wp.tokenize("xy,abc,abd") == Tokens{"x", "##y", ",", "[UNK]", ",", "ab", "##d"});
  CHECK(wp.encode("a ab") == Ids{1, 2});
}

TEST_CASE(
    "probe data: the 100-character limit applies to the pieces after punctuation splitting and accent stripping") {
  const WordPiece wp = vocab_of("[UNK]\na\n##a\n,\ne\n##e\n\xe4\xbd\xa0\n");
  // 60 a, a comma, 60 a: one whitespace word of 121 characters, but BasicTokenizer splits the
  // comma off first, so WordPiece sees two words of 60.
  Tokens sixty = {"a"};
  for (int k = 1; k < 60; ++k) sixty.push_back("##a");
  Tokens expected = sixty;
  expected.push_back(",");
  expected.insert(expected.end(), sixty.begin(), sixty.end());
  CHECK(wp.tokenize(std::string(60, 'a') + "," + std::string(60, 'a')) == expected);
  // 60 x (e + COMBINING ACUTE): 120 code points in the text, 60 once the accents are stripped.
  std::string accented;
  for (int k = 0; k < 60; ++k) accented += "e\xcc\x81";
  Tokens sixty_e = {"e"};
  for (int k = 1; k < 60; ++k) sixty_e.push_back("##e");
  CHECK(wp.tokenize(accented) == sixty_e);
  // 150 CJK ideographs without a space: each is a word of its own, none is too long.
  std::string cjk;
  for (int k = 0; k < 150; ++k) cjk += "\xe4\xbd\xa0";
  CHECK(wp.tokenize(cjk) == Tokens(150, "\xe4\xbd\xa0"));
  CHECK(wp.tokenize(std::string(101, 'a')) == Tokens{"[UNK]"});
}

TEST_CASE("probe data: special tokens are cut out whole next to punctuation, stray bytes and lower-case look-alikes") {
  const WordPiece wp = vocab_of("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n,\n.\n[\n]\nmask\n");
  CHECK(wp.tokenize("a,[MASK].") == Tokens{"a", ",", "[MASK]", "."});
  CHECK(wp.tokenize("\xff[MASK]\xe4") == Tokens{"[MASK]"});  // U+FFFD on each side, dropped
  CHECK(wp.tokenize("[[MASK]]") == Tokens{"[", "[MASK]", "]"});
  CHECK(wp.tokenize("[MASK") == Tokens{"[", "mask"});
  CHECK(wp.tokenize("[MASK][mask]") == Tokens{"[MASK]", "[", "mask", "]"});  // matching is case-sensitive
  CHECK(wp.tokenize("[CLS][SEP][PAD][UNK]") == Tokens{"[CLS]", "[SEP]", "[PAD]", "[UNK]"});
  // A control character inside: HF's added-tokens trie sees the raw text, where it is no
  // special token; the uncased tokenizer lower-cases it before BasicTokenizer, so the cleaned
  // "[mask]" is punctuation and a word.
  CHECK(wp.tokenize("[MA\x01SK]") == Tokens{"[", "mask", "]"});
}

TEST_CASE(
    "probe data: every stray or truncated UTF-8 sequence becomes one dropped U+FFFD and never eats the next byte") {
  const WordPiece wp = vocab_of("[UNK]\na\n##a\nb\n##b\n");
  // Python's bytes.decode("utf-8", "replace") replaces each maximal ill-formed subpart by one
  // U+FFFD; BertTokenizer's _clean_text drops U+FFFD. So "a" <bad> "b" is the word "ab".
  std::vector<std::string> bad;
  for (int b = 0x80; b < 0x100; ++b) bad.push_back(std::string(1, char(b)));  // every lone byte >= 0x80
  for (const char* s : {"\xc3", "\xe4\xbd", "\xe0\xa0", "\xed\x9f", "\xf0\x9f", "\xf0\x9f\x98", "\xf4\x8f\xbf"})
    bad.push_back(s);  // each valid sequence's proper prefixes
  for (const std::string& s : bad) {
    INFO("bytes " << escaped(s));
    CHECK(wp.tokenize("a" + s + "b") == Tokens{"a", "##b"});
    CHECK(wp.tokenize("a" + s) == Tokens{"a"});  // at the very end of the text
    CHECK(wp.tokenize(s + "a") == Tokens{"a"});
    CHECK(wp.tokenize("a" + s + " b") == Tokens{"a", "b"});
  }
  // A truncated sequence at the end of a text that is itself a view into a longer buffer: the
  // decoder must stop at the view's end, not read the bytes after it.
  const std::string buffer = "a\xe4\xbd\xa0";
  CHECK(wp.tokenize(std::string_view(buffer).substr(0, 3)) == Tokens{"a"});
}

TEST_CASE("probe data: strip_accents without lower_case strips and keeps the case, as HF with do_lower_case=False") {
  const WordPiece wp =
      vocab_of("[UNK]\nCafe\nUber\ncafe\n", WordPieceOptions{.lower_case = false, .strip_accents = true});
  // HF's BasicTokenizer: `elif self.strip_accents: token = self._run_strip_accents(token)`.
  CHECK(wp.tokenize("Caf\xc3\xa9 \xc3\x9c"
                    "ber caf\xc3\xa9") == Tokens{"Cafe", "Uber", "cafe"});
}

TEST_CASE("probe data: encode_for_bert puts the vocab's [CLS] first and [SEP] last and cuts the text to max_len") {
  // bert-base's ids: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103; here shifted so no id is its line's default.
  std::string text;
  for (int k = 0; k < 7; ++k) text += "unused" + std::to_string(k) + "\n";
  text += "[UNK]\n[SEP]\n[CLS]\na\nb\nc\n";  // [UNK] 7, [SEP] 8, [CLS] 9, a 10, b 11, c 12
  const WordPiece wp = vocab_of(text);
  for (int64_t max_len = 2; max_len <= 8; ++max_len) {
    INFO("max_len " << max_len);
    const Ids body = {10, 11, 12, 8, 10};  // "a b c [SEP] a": a [SEP] in the text is the token, kept
    Ids expected = {9};
    for (int64_t k = 0; k < std::min<int64_t>(max_len - 2, 5); ++k) expected.push_back(body[size_t(k)]);
    expected.push_back(8);
    CHECK(wp.encode_for_bert("a b c [SEP] a", max_len) == expected);
  }
}

TEST_CASE("probe data: without accent stripping NFC composes first, as HF's BasicTokenizer does") {
  // HF's BasicTokenizer.tokenize runs unicodedata.normalize("NFC", text) before it splits, so
  // with strip_accents off (a cased vocab) a decomposed e + U+0301 is U+00E9, the vocab's caf\xc3\xa9.
  const WordPiece cased =
      vocab_of("[UNK]\ncaf\xc3\xa9\ncafe\n##\xcc\x81\n", WordPieceOptions{.lower_case = false, .strip_accents = false});
  CHECK(cased.tokenize("caf\xc3\xa9") == Tokens{"caf\xc3\xa9"});
  CHECK(cased.tokenize("cafe\xcc\x81") == Tokens{"caf\xc3\xa9"});
  CHECK(cased.encode("cafe\xcc\x81") == Ids{1});
  // With stripping (the uncased default) both spellings agree, with HF as well.
  const WordPiece uncased = vocab_of("[UNK]\ncafe\n");
  CHECK(uncased.tokenize("CAF\xc3\x89") == Tokens{"cafe"});
  CHECK(uncased.tokenize("CAFE\xcc\x81") == Tokens{"cafe"});
}

// ---- transforms -------------------------------------------------------------------------

TEST_CASE("probe data: ToFloat and per-channel Normalize on a channels-last uint8 view equal float64 loops") {
  const int64_t H = 4, W = 5, C = 3;
  Tensor hwc = empty({H, W, C}, {kUInt8, kCPU});
  for (int64_t k = 0; k < hwc.numel(); ++k) hwc.data_ptr<uint8_t>()[k] = uint8_t((k * 53 + 7) % 256);
  const Tensor img = channels_last_view(hwc);
  REQUIRE(!img.is_contiguous());
  const std::vector<double> mean = {0.485, 0.456, 0.406}, stdv = {0.229, 0.224, 0.225};
  Generator gen(0);
  const Tensor f = ToFloat()(img, gen);
  const Tensor n = Normalize(mean, stdv)(f, gen);
  const Tensor n1 = Normalize({0.5}, {0.25})(f, gen);  // one mean and std for every channel
  std::vector<double> ref_f, ref_n, ref_n1;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const double v = hwc.data_ptr<uint8_t>()[(y * W + x) * C + c] / 255.0;  // torchvision: float() / 255
        ref_f.push_back(v);
        ref_n.push_back((v - mean[size_t(c)]) / stdv[size_t(c)]);
        ref_n1.push_back((v - 0.5) / 0.25);
      }
  CHECK(f.sizes() == Shape{C, H, W});
  check_close(f, ref_f, 1e-6, 1e-7, "ToFloat");
  check_close(n, ref_n, 1e-5, 1e-6, "Normalize per channel");
  check_close(n1, ref_n1, 1e-5, 1e-6, "Normalize one for all");
  // Normalize takes float images only, as torchvision's ("Input tensor should be a float tensor").
  check_error([&] { Normalize(mean, stdv)(img, gen); }, {"Normalize", "float32", "ToFloat"});
  // The source image is untouched.
  for (int64_t k = 0; k < hwc.numel(); ++k) REQUIRE(hwc.data_ptr<uint8_t>()[k] == uint8_t((k * 53 + 7) % 256));
}

TEST_CASE("probe data: RandomCrop, RandomHorizontalFlip and RandomErasing on channels-last and transposed views") {
  const int64_t H = 6, W = 7, C = 3;
  Tensor hwc = empty({H, W, C}, {kFloat32, kCPU});
  const std::vector<double> v = random_values(hwc.numel(), 21);
  for (int64_t k = 0; k < hwc.numel(); ++k) hwc.data_ptr<float>()[k] = float(v[size_t(k)]);
  // Two views of one logical (C, H, W) image: channels-last, and a (C, W, H) buffer transposed.
  const auto at = [&](int64_t c, int64_t y, int64_t x) { return double(hwc.data_ptr<float>()[(y * W + x) * C + c]); };
  Tensor cwh = empty({C, W, H}, {kFloat32, kCPU});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) cwh.data_ptr<float>()[(c * W + x) * H + y] = float(at(c, y, x));
  const Tensor views[] = {channels_last_view(hwc), cwh.transpose(1, 2)};
  for (const Tensor& img : views) {
    REQUIRE(img.sizes() == Shape{C, H, W});
    REQUIRE(!img.is_contiguous());
    for (uint64_t seed = 0; seed < 40; ++seed) {
      INFO("seed " << seed);
      // RandomCrop(4, padding 1): the padded image is 8 x 9, top in [0, 4], left in [0, 5].
      Generator gen(seed), replay(seed);
      const Tensor crop = RandomCrop(4, 1)(img, gen);
      const int64_t top = draw_below(replay, 5), left = draw_below(replay, 6);
      std::vector<double> ref;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < 4; ++y)
          for (int64_t x = 0; x < 4; ++x) {
            const int64_t sy = top + y - 1, sx = left + x - 1;
            ref.push_back(sy >= 0 && sy < H && sx >= 0 && sx < W ? at(c, sy, sx) : 0.0);
          }
      CHECK(elements(crop) == ref);
      // RandomHorizontalFlip(0.5): mirrored when its one draw is below p.
      const Tensor flip = RandomHorizontalFlip(0.5)(img, gen);
      const bool flipped = draw_uniform(replay) < 0.5;
      ref.clear();
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < H; ++y)
          for (int64_t x = 0; x < W; ++x) ref.push_back(at(c, y, flipped ? W - 1 - x : x));
      CHECK(elements(flip) == ref);
      // RandomErasing(p = 1): the box of torchvision's get_params, set to 7 in every channel.
      const Tensor erased = RandomErasing(1.0, {0.1, 0.3}, {0.5, 2.0}, 7.0)(img, gen);
      REQUIRE(draw_uniform(replay) < 1.0);
      int64_t bt = 0, bl = 0, bh = 0, bw = 0;
      for (int attempt = 0; attempt < 10; ++attempt) {
        const double area = double(H * W) * (0.1 + 0.2 * draw_uniform(replay));
        const double aspect = std::exp(std::log(0.5) + (std::log(2.0) - std::log(0.5)) * draw_uniform(replay));
        const auto h = int64_t(std::nearbyint(std::sqrt(area * aspect)));
        const auto w = int64_t(std::nearbyint(std::sqrt(area / aspect)));
        if (!(h < H && w < W)) continue;
        bt = draw_below(replay, H - h + 1), bl = draw_below(replay, W - w + 1), bh = h, bw = w;
        break;
      }
      ref.clear();
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < H; ++y)
          for (int64_t x = 0; x < W; ++x)
            ref.push_back(y >= bt && y < bt + bh && x >= bl && x < bl + bw ? 7.0 : at(c, y, x));
      CHECK(elements(erased) == ref);
      CHECK(gen.offset() == replay.offset());
    }
  }
  // None of them wrote into the source image.
  for (int64_t k = 0; k < hwc.numel(); ++k) REQUIRE(hwc.data_ptr<float>()[k] == float(v[size_t(k)]));
}

TEST_CASE("probe data: ImageDataset of a channels-last batch and TransformedDataset replay per (seed, epoch, sample)") {
  const int64_t N = 5, H = 4, W = 4, C = 2;
  Tensor nhwc = empty({N, H, W, C}, {kUInt8, kCPU});
  for (int64_t k = 0; k < nhwc.numel(); ++k) nhwc.data_ptr<uint8_t>()[k] = uint8_t((k * 29 + 3) % 251);
  const auto at = [&](int64_t n, int64_t c, int64_t y, int64_t x) {
    return double(nhwc.data_ptr<uint8_t>()[((n * H + y) * W + x) * C + c]);
  };
  std::vector<int64_t> label_values = {4, 3, 2, 1, 0};
  auto images = std::make_shared<ImageDataset>(nhwc.permute({0, 3, 1, 2}), from_vector(label_values, {N}));
  for (int64_t i = 0; i < N; ++i) {
    const Example e = images->get(i);
    std::vector<double> ref;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) ref.push_back(at(i, c, y, x));
    CHECK(elements(e.input) == ref);
    CHECK(e.target.item<int64_t>() == label_values[size_t(i)]);
  }
  const Compose augment({RandomCrop(3, 1), RandomHorizontalFlip(0.5), ToFloat()});
  const TransformedDataset train(images, augment, /*seed=*/77);
  int differing = 0;
  for (int64_t epoch = 0; epoch < 3; ++epoch)
    for (int64_t i = 0; i < N; ++i) {
      INFO("epoch " << epoch << " sample " << i);
      const std::vector<double> got = elements(train.get_at_epoch(i, epoch).input);
      CHECK(elements(train.get_at_epoch(i, epoch).input) == got);  // reproducible
      // Replayed from the seed alone: top, left, then the flip's draw.
      Generator replay(TransformedDataset::sample_seed(77, epoch, i));
      const int64_t top = draw_below(replay, 4), left = draw_below(replay, 4);
      const bool flipped = draw_uniform(replay) < 0.5;
      std::vector<double> ref;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < 3; ++y)
          for (int64_t x = 0; x < 3; ++x) {
            const int64_t cx = flipped ? 2 - x : x, sy = top + y - 1, sx = left + cx - 1;
            ref.push_back(sy >= 0 && sy < H && sx >= 0 && sx < W ? float(at(i, c, sy, sx)) / 255.0f : 0.0);
          }
      CHECK(got == ref);
      if (epoch > 0 && got != elements(train.get_at_epoch(i, epoch - 1).input)) ++differing;
    }
  CHECK(differing > 0);  // augmentations differ across epochs
  CHECK(elements(train.get(2).input) == elements(train.get_at_epoch(2, 0).input));
}

// ---- datasets and the loader ------------------------------------------------------------

namespace {

// Sample i of epoch e is input (i, e, 1000) and target i: which epoch a sample came from is visible.
class EpochTagged : public Dataset {
 public:
  explicit EpochTagged(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override { return get_at_epoch(i, 0); }
  Example get_at_epoch(int64_t i, int64_t epoch) const override {
    check_index("EpochTagged", i, n_);
    return {from_vector(std::vector<float>{float(i), float(epoch), 1000.0f}, {3}),
            from_vector(std::vector<int64_t>{i}, {})};
  }

 private:
  int64_t n_;
};

}  // namespace

TEST_CASE("probe data: next() across passes never mixes epochs; drop_last drops the tail of each epoch's order") {
  for (const bool drop_last : {false, true})
    for (const int64_t workers : {1, 3}) {
      INFO("drop_last " << drop_last << " workers " << workers);
      const int64_t n = 10, B = 4;
      DataLoader loader(
          std::make_shared<EpochTagged>(n),
          {.batch_size = B, .shuffle = true, .seed = 5, .drop_last = drop_last, .prefetch = 2, .workers = workers});
      // torch: len = n // B with drop_last, ceil(n / B) without.
      CHECK(loader.size() == (drop_last ? 2 : 3));
      std::set<std::vector<int64_t>> orders;
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        const std::vector<int64_t> order = loader.order(epoch);
        orders.insert(order);
        std::vector<int64_t> seen;
        Batch b;
        for (int64_t k = 0; k < loader.size(); ++k) {
          REQUIRE(loader.next(b));
          const std::vector<float> in = b.inputs.tolist<float>();
          const int64_t rows = b.inputs.size(0);
          CHECK(rows == (k < 2 ? B : n % B));
          for (int64_t r = 0; r < rows; ++r) {
            CHECK(in[size_t(3 * r + 1)] == float(epoch));  // every sample of this batch is of this epoch
            seen.push_back(int64_t(in[size_t(3 * r)]));
          }
          CHECK(b.targets.sizes() == Shape{rows});
        }
        CHECK(!loader.next(b));  // the pass ends here; the next call starts the next epoch
        const std::vector<int64_t> expected(order.begin(), order.begin() + (drop_last ? 8 : 10));
        CHECK(seen == expected);
      }
      CHECK(orders.size() == 3);  // each epoch its own permutation
      // The same seed gives the same orders in a new loader; another seed another.
      DataLoader again(std::make_shared<EpochTagged>(n), {.batch_size = B, .shuffle = true, .seed = 5});
      DataLoader other(std::make_shared<EpochTagged>(n), {.batch_size = B, .shuffle = true, .seed = 6});
      for (int64_t epoch = 0; epoch < 3; ++epoch) CHECK(again.order(epoch) == loader.order(epoch));
      CHECK(other.order(0) != loader.order(0));
    }
}

TEST_CASE("probe data: a loader over a Dataset that holds a TensorDataset delivers what its get_at_epoch returns") {
  // A TensorDataset subclass would be read by the loader's fast path, which gathers the
  // tensors' rows and never calls get_at_epoch; TensorDataset is therefore final, and a
  // dataset that changes its samples wraps one instead, as here.
  static_assert(std::is_final_v<TensorDataset>, "the DataLoader's fast path would bypass a subclass's get");
  class Shifted : public Dataset {
   public:
    explicit Shifted(TensorDataset base) : base_(std::move(base)) {}
    int64_t size() const override { return base_.size(); }
    Example get(int64_t i) const override { return get_at_epoch(i, 0); }
    Example get_at_epoch(int64_t i, int64_t epoch) const override {
      Example e = base_.get(i);
      const float v = e.input.item<float>();
      return {from_vector(std::vector<float>{v + 100.0f * float(epoch + 1)}, {1}), e.target};
    }

   private:
    TensorDataset base_;
  };
  const int64_t n = 7;
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t i = 0; i < n; ++i) xs.push_back(float(i)), ys.push_back(i);
  auto ds = std::make_shared<Shifted>(TensorDataset(from_vector(xs, {n, 1}), from_vector(ys, {n})));
  DataLoader loader(ds, {.batch_size = 3, .workers = 2});
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<float> got;
    for (Batch& b : loader)
      for (float v : b.inputs.tolist<float>()) got.push_back(v);
    std::vector<float> expected;
    for (int64_t i = 0; i < n; ++i) expected.push_back(float(i) + 100.0f * float(epoch + 1));
    CHECK(got == expected);
  }
}

// ---- IDX in gzip ------------------------------------------------------------------------

TEST_CASE("probe data: a gzipped IDX file cut inside its trailer, or with a bad CRC or length, is refused naming it") {
  const std::vector<uint8_t> data = byte_pattern(3 * 16 * 16, 4);
  const std::string raw = idx_bytes({3, 16, 16}, data);
  const std::string gz = gzip_member(raw);
  // Cut: 1 to 8 bytes of the 8-byte trailer (CRC-32, then ISIZE) missing. gzip -t refuses each
  // ("unexpected end of file"); the data bytes are all there, but nothing vouches for them.
  for (size_t cut = 1; cut <= 8; ++cut) {
    INFO("cut " << cut);
    TempFile f(gz.substr(0, gz.size() - cut), "frugal_probe_data_cut", ".gz");
    check_error([&] { read_idx(f.path); }, {"read_idx", f.path});
  }
  // A flipped bit in the CRC, then in ISIZE: zlib's "incorrect data check" / "incorrect length check".
  for (size_t at : {gz.size() - 8, gz.size() - 1}) {
    std::string bad = gz;
    bad[at] = char(bad[at] ^ 0x10);
    TempFile f(bad, "frugal_probe_data_crc", ".gz");
    check_error([&] { read_idx(f.path); }, {"read_idx", f.path});
  }
  // The intact file reads back byte for byte.
  TempFile ok(gz, "frugal_probe_data_ok", ".gz");
  const IdxData idx = read_idx(ok.path);
  CHECK(idx.shape == std::vector<int64_t>{3, 16, 16});
  CHECK(idx.bytes == data);
}

TEST_CASE("probe data: a gzip file of several members reads as their concatenation, as gunzip does") {
  const std::vector<uint8_t> data = byte_pattern(2 * 10 * 10, 9);
  const std::string raw = idx_bytes({2, 10, 10}, data);
  // Header and first image in one member, the second image in another (cat a.gz b.gz > c.gz).
  const size_t split = 4 + 3 * 4 + 100;
  TempFile f(gzip_member(raw.substr(0, split)) + gzip_member(raw.substr(split)), "frugal_probe_data_members", ".gz");
  const IdxData idx = read_idx(f.path);
  CHECK(idx.shape == std::vector<int64_t>{2, 10, 10});
  CHECK(idx.bytes == data);
  const Tensor images = idx_images_to_tensor(idx);
  std::vector<double> ref;
  for (uint8_t b : data) ref.push_back(double(float(b) / 255.0f));
  CHECK(elements(images) == ref);
}

// ---- a consumer of the loader ----------------------------------------------------------

TEST_CASE("probe data: evaluate covers a whole pass even when the loader was left in the middle of one") {
  // train/evaluate.h: "One pass over `loader` (which starts a pass ...)". Inputs are the
  // logits themselves; the first batch's samples are all misclassified, the rest right.
  struct PassThrough : nn::UnaryModule {
    Tensor forward(const Tensor& x) override { return x; }
  };
  const int64_t n = 10, B = 4;
  std::vector<float> logits;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    labels.push_back(i % 2);
    const bool right = i >= B;
    logits.push_back(labels.back() == 0 ? (right ? 3.0f : -3.0f) : (right ? -3.0f : 3.0f));
    logits.push_back(-logits.back());
  }
  DataLoader loader(TensorDataset(from_vector(logits, {n, 2}), from_vector(labels, {n})), {.batch_size = B});
  PassThrough model;
  // Reference in double: log(1 + e^-6) for the right ones, log(1 + e^6) for the wrong ones.
  const double loss = (double(n - B) * std::log1p(std::exp(-6.0)) + double(B) * std::log1p(std::exp(6.0))) / double(n);
  for (const int64_t taken : {0, 1, 2}) {
    INFO(taken << " batches taken before evaluate");
    Batch b;
    for (int64_t k = 0; k < taken; ++k) REQUIRE(loader.next(b));
    const train::EvalResult r = train::evaluate(model, loader);
    CHECK(r.samples == n);
    CHECK(r.accuracy == doctest::Approx(double(n - B) / double(n)).epsilon(1e-12));
    CHECK(r.loss == doctest::Approx(loss).epsilon(1e-6));
  }
}

// ---- NFC and MLM masking ----------------------------------------------------------------

TEST_CASE("probe data: NFC as unicodedata.normalize: reordering, Hangul, composition exclusions, singletons") {
  // Expected values from the Unicode Character Database (as Python 3.11's unicodedata, Unicode
  // 14), reasoned out by hand: U+0323 DOT BELOW has combining class 220 and U+0302 CIRCUMFLEX
  // 230, so either order sorts to a U+0323 U+0302; a + U+0323 = U+1EA1, U+1EA1 + U+0302 =
  // U+1EAD. Hangul: L U+1112 (index 18), V U+1161 (0), T U+11AB (4) give U+AC00 + (18 * 21 + 0)
  // * 28 + 4 = U+D55C. U+0958 DEVANAGARI QA is in CompositionExclusions.txt: NFC leaves
  // U+0915 U+093C. U+212B ANGSTROM SIGN is a singleton decomposition to U+00C5, which is then
  // its NFC; A + U+030A composes to U+00C5 too.
  using V = std::vector<char32_t>;
  CHECK(unicode::nfc({'a', 0x323, 0x302}) == V{0x1EAD});
  CHECK(unicode::nfc({'a', 0x302, 0x323}) == V{0x1EAD});
  CHECK(unicode::nfc({0xE2, 0x323}) == V{0x1EAD});  // a-circumflex + dot below: decomposed and reordered first
  CHECK(unicode::nfd({0x1EAD}) == V{'a', 0x323, 0x302});
  CHECK(unicode::nfd({'a', 0x302, 0x323}) == V{'a', 0x323, 0x302});
  CHECK(unicode::nfc({0x1112, 0x1161, 0x11AB}) == V{0xD55C});
  CHECK(unicode::nfc({0x1100, 0x1161}) == V{0xAC00});  // L + V, no T
  CHECK(unicode::nfd({0xD55C}) == V{0x1112, 0x1161, 0x11AB});
  CHECK(unicode::nfc({0x958}) == V{0x915, 0x93C});
  CHECK(unicode::nfc({0x915, 0x93C}) == V{0x915, 0x93C});
  CHECK(unicode::nfc({0x212B}) == V{0xC5});
  CHECK(unicode::nfc({'A', 0x30A}) == V{0xC5});
  CHECK(unicode::nfc({'a', 0x301, 0x300}) == V{0xE1, 0x300});  // U+0300 blocked by U+0301 of its own class 230
  CHECK(unicode::nfc({0x301, 'a'}) == V{0x301, 'a'});          // a mark first composes with nothing
  CHECK(unicode::nfc({0x37E, 0x387}) == V{';', 0xB7});         // singletons
  CHECK(unicode::nfc({'a', 'b', 0xE9}) == V{'a', 'b', 0xE9});

  // Through a cased WordPiece: every spelling of a token gets the token's id, as in HF.
  const WordPiece cased = vocab_of("[UNK]\n\xe1\xba\xad\n\xed\x95\x9c\n\xe0\xa4\x95\xe0\xa4\xbc\n\xc3\x85\n",
                                   WordPieceOptions{.lower_case = false, .strip_accents = false});
  CHECK(cased.encode("\xe1\xba\xad a\xcc\xa3\xcc\x82 a\xcc\x82\xcc\xa3") == Ids{1, 1, 1});  // U+1EAD three ways
  CHECK(cased.encode("\xed\x95\x9c \xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab") == Ids{2, 2});    // U+D55C, jamo
  CHECK(cased.encode("\xe0\xa5\x98 \xe0\xa4\x95\xe0\xa4\xbc") == Ids{3, 3});                // U+0958 -> U+0915 U+093C
  CHECK(cased.encode("\xe2\x84\xab \xc3\x85 A\xcc\x8a") == Ids{4, 4, 4});                   // U+212B, U+00C5, A U+030A
}

TEST_CASE("probe data: U+037E and U+0387 split words as punctuation with and without lower_case and strip_accents") {
  // HF: NFC maps U+037E GREEK QUESTION MARK to ';' and U+0387 GREEK ANO TELEIA to U+00B7 MIDDLE
  // DOT (singleton decompositions); both are Po, so _run_split_on_punc cuts them out under
  // every setting. Both are Po themselves too (unicodedata.category).
  CHECK(unicode::is_punctuation(0x37E));
  CHECK(unicode::is_punctuation(0x387));
  for (const bool lower_case : {false, true}) {
    for (const bool strip_accents : {false, true}) {
      INFO("lower_case " << lower_case << ", strip_accents " << strip_accents);
      const WordPiece wp = vocab_of("[UNK]\na\nb\n;\n\xc2\xb7\n",
                                    WordPieceOptions{.lower_case = lower_case, .strip_accents = strip_accents});
      CHECK(wp.tokenize("a\xcd\xbe"
                        "b") == Tokens{"a", ";", "b"});
      CHECK(wp.tokenize("a\xce\x87"
                        "b") == Tokens{"a", "\xc2\xb7", "b"});
      CHECK(wp.encode("a\xcd\xbe"
                      "b\xce\x87"
                      "a") == Ids{1, 3, 2, 4, 1});
    }
  }
}

TEST_CASE("probe data: mask_for_mlm never selects a special id; 15% selected, of those 80% [MASK], 10% random") {
  // HF's DataCollatorForLanguageModeling: special_tokens_mask from get_special_tokens_mask(
  // already_has_special_tokens=True), i.e. every id of all_special_ids ([PAD] [UNK] [CLS] [SEP]
  // [MASK] for BertTokenizer), gets probability 0; the others are selected with 0.15; a
  // selected one is [MASK] with 0.8, random with 0.1 (bernoulli 0.5 of the remaining 0.2),
  // unchanged otherwise; labels -100 where not selected. bert-base's special ids.
  const WordPiece wp = vocab_of("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\n");
  const std::vector<int64_t> sids = wp.special_ids();
  CHECK(std::set<int64_t>(sids.begin(), sids.end()) == std::set<int64_t>{0, 1, 2, 3, 4});
  const std::set<int64_t> special = {0, 100, 101, 102, 103};
  const MlmMasking masking{.vocab_size = 1000, .mask_id = 103, .special_ids = {0, 100, 101, 102, 103}};
  Generator gen(1234);
  const int64_t T = 512, sequences = 400;
  int64_t eligible = 0, selected = 0, masked = 0, random = 0, unchanged = 0;
  std::set<int64_t> random_ids;
  for (int64_t s = 0; s < sequences; ++s) {
    std::vector<int64_t> ids(T), labels(T, 7);
    for (int64_t i = 0; i < T; ++i)  // every 7th a special id ([UNK], a literal [MASK], ...), else a word
      ids[size_t(i)] = i % 7 == 0 ? std::vector<int64_t>{0, 100, 101, 102, 103}[size_t((i / 7 + s) % 5)]
                                  : 104 + (i * 37 + s * 11) % 896;
    const std::vector<int64_t> original = ids;
    const int64_t n = mask_for_mlm(ids, labels, masking, gen);
    int64_t in_seq = 0;
    for (size_t i = 0; i < size_t(T); ++i) {
      const bool is_special = special.count(original[i]) > 0;
      eligible += !is_special;
      if (labels[i] == -100) {
        REQUIRE(ids[i] == original[i]);  // not selected: the input is untouched
        continue;
      }
      REQUIRE(!is_special);  // a special id is never a target
      REQUIRE(labels[i] == original[i]);
      ++in_seq;
      if (ids[i] == 103) {
        ++masked;
      } else if (ids[i] == original[i]) {
        ++unchanged;  // (a random draw equal to the original, p = 1/895, counts here)
      } else {
        REQUIRE(special.count(ids[i]) == 0);  // a random replacement is a word
        REQUIRE((ids[i] >= 0 && ids[i] < 1000));
        ++random, random_ids.insert(ids[i]);
      }
    }
    CHECK(n == in_seq);
    selected += in_seq;
  }
  // ~175,000 eligible: the selected share's standard deviation is 0.0008, the bounds are 12 of
  // them; the three shares of ~26,000 selected have deviations 0.0025 and 0.0019 (bounds 8).
  const double p = double(selected) / double(eligible);
  CHECK(p > 0.14);
  CHECK(p < 0.16);
  const double pm = double(masked) / double(selected), pr = double(random) / double(selected),
               pu = double(unchanged) / double(selected);
  CHECK(pm > 0.78);
  CHECK(pm < 0.82);
  CHECK(pr > 0.085);
  CHECK(pr < 0.115);
  CHECK(pu > 0.085);
  CHECK(pu < 0.115);
  CHECK(random_ids.size() > 700);  // ~2,600 draws over 895 words reach ~850 of them

  // Every sequence with a word predicts something, still never a special id; one without has
  // no target at all.
  const MlmMasking never{
      .vocab_size = 1000, .mask_id = 103, .special_ids = {0, 100, 101, 102, 103}, .select_probability = 0.0};
  std::vector<int64_t> ids = {101, 100, 500, 103, 102}, labels(5);
  CHECK(mask_for_mlm(ids, labels, never, gen) == 1);
  CHECK(ids == Ids{101, 100, 103, 103, 102});
  CHECK(labels == Ids{-100, -100, 500, -100, -100});
  ids = {101, 100, 0, 102};
  labels.assign(4, 7);
  CHECK(mask_for_mlm(ids, labels, masking, gen) == 0);
  CHECK(ids == Ids{101, 100, 0, 102});
  CHECK(labels == Ids{-100, -100, -100, -100});
  // A [MASK] that is not among the special ids would be selectable: refused.
  CHECK_THROWS_WITH_AS(mask_for_mlm(ids, labels, {.vocab_size = 1000, .mask_id = 103, .special_ids = {101, 102}}, gen),
                       doctest::Contains("not among special_ids"), Error);
}

TEST_CASE("probe data: set_epoch after a loop left mid-pass ends that pass; position() names the new epoch") {
  // 10 samples, batches of 3, shuffled: break after one batch of epoch 0, then set_epoch(1).
  // A checkpoint taken here must say epoch 1, batch 0 (not epoch 0, batch 1), and the next
  // pass must deliver epoch 1's order from its first batch.
  std::vector<double> v(10);
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i);
  data::TensorDataset ds(from_vector(v, {10, 1}), from_vector(v, {10}));
  data::DataLoader loader(ds, {.batch_size = 3, .shuffle = true, .seed = 7});
  for (data::Batch& b : loader) {
    CHECK(b.inputs.size(0) == 3);
    break;
  }
  CHECK(loader.position().epoch == 0);
  CHECK(loader.position().batch == 1);
  loader.set_epoch(1);
  CHECK(loader.position().epoch == 1);
  CHECK(loader.position().batch == 0);
  const std::vector<int64_t> want = loader.order(1);
  std::vector<double> got;
  for (data::Batch& b : loader)
    for (double x : values_of(b.targets)) got.push_back(x);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == double(want[i]));
  CHECK(loader.position().epoch == 2);
}
