// WordPiece (nn/data/wordpiece.h): a small vocab written to a temp file, and cases whose
// expected tokens were worked out by hand from Hugging Face's BertTokenizer algorithm (Note
// [WordPiece pipeline]); UTF-8 decoding against Python's bytes.decode(errors="replace");
// every error of from_file, token_id, decode and encode_for_bert.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "nn/data/unicode_text.h"
#include "nn/data/wordpiece.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using namespace frugal::data;
using namespace std::string_view_literals;

namespace {

// id = line number from 0.
const char* kVocab =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"               // 0-4
    "un\n##aff\n##able\nhello\nworld\n##world\n"         // 5-10
    ",\n!\n'\ndon\nt\na\n##a\n##b\n"                     // 11-18
    "cafe\nuber\nmanana\nangstrom\nnaive\n"              // 19-23
    "\xe4\xbd\xa0\n\xe5\xa5\xbd\n$\n5\nthe\nsat\n"       // 24-29: 你 好
    "[\nmask\n]\ncaf\xc3\xa9\nHello\n"                   // 30-34: café
    "\xe2\x80\x94\n\xc2\xab\n\xc2\xbb\n\xe3\x80\x82\n";  // 35-38: — « » 。

// A vocab file in the temp directory, removed at the end of the test.
struct VocabFile {
  std::string path;
  explicit VocabFile(std::string_view contents, const std::string& stem = "frugal_wordpiece_vocab")
      : path(temp_path(stem, ".txt")) {
    std::ofstream(path, std::ios::binary) << contents;
  }
  ~VocabFile() { std::filesystem::remove(path); }
};

using Tokens = std::vector<std::string>;

}  // namespace

TEST_CASE("wordpiece: reads vocab.txt with ids = line numbers") {
  VocabFile file(kVocab);
  const WordPiece wp = WordPiece::from_file(file.path);
  CHECK(wp.size() == 39);
  CHECK(wp.token_id("[UNK]") == 1);
  CHECK(wp.token_id("##able") == 7);
  CHECK(wp.token_id("\xe3\x80\x82") == 38);
  CHECK(wp.token(0) == "[PAD]");
  CHECK(wp.contains("hello"));
  CHECK(!wp.contains("Hellos"));

  VocabFile crlf("[UNK]\r\n\r\nhello\r\nworld", "frugal_wordpiece_crlf");  // a blank line keeps its id
  const WordPiece w2 = WordPiece::from_file(crlf.path);
  CHECK(w2.size() == 4);
  CHECK(w2.token_id("hello") == 2);
  CHECK(w2.token_id("world") == 3);
  CHECK(!w2.contains(""));
}

TEST_CASE("wordpiece: BERT uncased rules, hand-checked") {
  VocabFile file(kVocab);
  const WordPiece wp = WordPiece::from_file(file.path);
  // Greedy longest match: "unaffable" -> un, then ##aff (not ##a), then ##able.
  CHECK(wp.encode("unaffable") == std::vector<int64_t>{5, 6, 7});
  CHECK(wp.tokenize("unaffable") == Tokens{"un", "##aff", "##able"});
  // Lower-case, accent stripped, punctuation split off.
  CHECK(wp.encode("H\xc3\xa9llo, WORLD!") == std::vector<int64_t>{8, 11, 9, 12});
  // é ü ñ Å ö ï: lower-cased, NFD, marks dropped; U+0130 lower-cases to i + U+0307.
  CHECK(wp.tokenize("Caf\xc3\xa9 \xc3\x9c"
                    "BER Ma\xc3\xb1"
                    "ana \xc3\x85ngstr\xc3\xb6m na\xc3\xafve") ==
        Tokens{"cafe", "uber", "manana", "angstrom", "naive"});
  CHECK(wp.tokenize("NA\xc4\xb0VE") == Tokens{"naive"});
  CHECK(wp.tokenize("cafe\xcc\x81") == Tokens{"cafe"});  // e + COMBINING ACUTE ACCENT
  // CJK ideographs are words of their own, even inside a word; 世 is not in the vocab.
  CHECK(wp.tokenize("\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96") == Tokens{"\xe4\xbd\xa0", "\xe5\xa5\xbd", "[UNK]"});
  CHECK(wp.tokenize("a\xe4\xbd\xa0"
                    "a") == Tokens{"a", "\xe4\xbd\xa0", "a"});
  // Punctuation inside words, ASCII symbols HF counts as punctuation, Unicode P* characters.
  CHECK(wp.tokenize("don't") == Tokens{"don", "'", "t"});
  CHECK(wp.tokenize("$5") == Tokens{"$", "5"});
  CHECK(wp.tokenize("a~a") == Tokens{"a", "[UNK]", "a"});
  CHECK(wp.tokenize("hello\xe2\x80\x94world") == Tokens{"hello", "\xe2\x80\x94", "world"});  // em dash
  CHECK(wp.tokenize("\xc2\xabhello\xc2\xbb") == Tokens{"\xc2\xab", "hello", "\xc2\xbb"});    // « »
  CHECK(wp.tokenize("hello\xe3\x80\x82") == Tokens{"hello", "\xe3\x80\x82"});                // 。
  // Whitespace (tab, NBSP, ideographic space) splits; controls (soft hyphen, ZWSP, NUL, DEL) vanish.
  CHECK(wp.tokenize("hello\t\xc2\xa0world\xe3\x80\x80!") == Tokens{"hello", "world", "!"});
  CHECK(wp.tokenize("hel\xc2\xadlo") == Tokens{"hello"});
  CHECK(wp.tokenize("hello\xe2\x80\x8bworld") == Tokens{"hello", "##world"});
  CHECK(wp.tokenize("hel\0lo\x7f"sv) == Tokens{"hello"});
  // A word no pieces cover is one [UNK], even when a prefix matched ("un" of "unx").
  CHECK(wp.tokenize("xyz") == Tokens{"[UNK]"});
  CHECK(wp.tokenize("unx hello") == Tokens{"[UNK]", "hello"});
  // Empty and whitespace-only text.
  CHECK(wp.encode("").empty());
  CHECK(wp.encode(" \t\n\r \xc2\xa0\xe3\x80\x80 ").empty());
  // Special tokens stay whole, with or without spaces; lower-case "[mask]" is not one.
  CHECK(wp.encode("the [MASK] sat") == std::vector<int64_t>{28, 4, 29});
  CHECK(wp.encode("the[MASK]sat") == std::vector<int64_t>{28, 4, 29});
  CHECK(wp.encode("[CLS] hello [SEP][PAD]") == std::vector<int64_t>{2, 8, 3, 0});
  CHECK(wp.encode("[mask]") == std::vector<int64_t>{30, 31, 32});
  CHECK(wp.encode("[MASK][MASK] a [MASK][UNK]") == std::vector<int64_t>{4, 4, 16, 4, 1});
}

TEST_CASE("wordpiece: max_input_chars_per_word counts code points") {
  VocabFile file(kVocab);
  const WordPiece wp = WordPiece::from_file(file.path);
  std::vector<int64_t> hundred(100, 17);  // a ##a ##a ... (100 pieces)
  hundred[0] = 16;
  CHECK(wp.encode(std::string(100, 'a')) == hundred);
  CHECK(wp.encode(std::string(101, 'a')) == std::vector<int64_t>{1});
  CHECK(wp.encode(std::string(101, 'a') + " a") == std::vector<int64_t>{1, 16});

  const WordPiece short_words = WordPiece::from_file(file.path, {.max_input_chars_per_word = 3});
  CHECK(short_words.tokenize("aaa aaaa \xc3\xa1\xc3\xa1\xc3\xa1") ==
        Tokens{"a", "##a", "##a", "[UNK]", "a", "##a", "##a"});
}

TEST_CASE("wordpiece: lower_case and strip_accents off") {
  VocabFile file(kVocab);
  const WordPiece cased = WordPiece::from_file(file.path, {.lower_case = false, .strip_accents = false});
  CHECK(cased.tokenize("caf\xc3\xa9 Hello hello Cafe") == Tokens{"caf\xc3\xa9", "Hello", "hello", "[UNK]"});
  const WordPiece keep_accents = WordPiece::from_file(file.path, {.strip_accents = false});
  CHECK(keep_accents.tokenize("CAF\xc3\x89 Hello") == Tokens{"caf\xc3\xa9", "hello"});
}

TEST_CASE("wordpiece: unicode tables agree with Python's str.lower and unicodedata") {
  using V = std::vector<char32_t>;
  // ΟΣ -> ος (final sigma), ΣΟ -> σο, Σ alone -> σ, ΟΣ + combining acute -> ος + acute.
  CHECK(unicode::lower({0x39F, 0x3A3}) == V{0x3BF, 0x3C2});
  CHECK(unicode::lower({0x3A3, 0x39F}) == V{0x3C3, 0x3BF});
  CHECK(unicode::lower({0x3A3}) == V{0x3C3});
  CHECK(unicode::lower({0x39F, 0x3A3, 0x301}) == V{0x3BF, 0x3C2, 0x301});
  CHECK(unicode::lower({'A', 0xC5, 0x130, 0x178, 0x416}) == V{'a', 0xE5, 'i', 0x307, 0xFF, 0x436});
  V nfd;
  unicode::append_nfd(nfd, 0x390);  // ΐ: iota, diaeresis, acute
  unicode::append_nfd(nfd, 0x151);  // ő
  unicode::append_nfd(nfd, 0xC6);   // Æ has none
  CHECK(nfd == V{0x3B9, 0x308, 0x301, 'o', 0x30B, 0xC6});
  CHECK(unicode::is_whitespace(0x2029));  // str.split() splits on PARAGRAPH SEPARATOR
  CHECK(!unicode::is_whitespace(0x200B));
  CHECK(unicode::is_control(0x200B));
  CHECK(unicode::is_combining_mark(0x302A));
  CHECK(!unicode::is_punctuation(0x2044));  // FRACTION SLASH is Sm
  CHECK(unicode::is_punctuation(0x2045));
}

TEST_CASE("wordpiece: invalid UTF-8 is replaced, then dropped") {
  // Python's b.decode("utf-8", errors="replace") on the same bytes.
  using unicode::decode_utf8;
  const char32_t R = unicode::kReplacement;
  CHECK(decode_utf8("\xe4\xbd"
                    "a") == std::vector<char32_t>{R, 'a'});                     // truncated
  CHECK(decode_utf8("\xc0\xaf") == std::vector<char32_t>{R, R});                // overlong '/'
  CHECK(decode_utf8("\xe0\x80\xaf") == std::vector<char32_t>{R, R, R});         // overlong '/'
  CHECK(decode_utf8("\xed\xa0\x80") == std::vector<char32_t>{R, R, R});         // surrogate
  CHECK(decode_utf8("\xf4\x90\x80\x80") == std::vector<char32_t>{R, R, R, R});  // above U+10FFFF
  CHECK(decode_utf8("\xf0\x9f\x98!") == std::vector<char32_t>{R, '!'});
  CHECK(decode_utf8("\x80\xbf") == std::vector<char32_t>{R, R});
  CHECK(decode_utf8("\xf0\x9f\x98\x80\xc3\xa9") == std::vector<char32_t>{0x1F600, 0xE9});
  CHECK(unicode::valid_utf8("\xef\xbf\xbd"));  // U+FFFD itself is valid
  size_t bad = 0;
  CHECK(!unicode::valid_utf8("ab\xc3", &bad));
  CHECK(bad == 2);

  VocabFile file(kVocab);
  const WordPiece wp = WordPiece::from_file(file.path);
  CHECK(wp.tokenize("hello\xffworld") == Tokens{"hello", "##world"});  // dropped, not a space
  CHECK(wp.tokenize("hello \xe4\xbd") == Tokens{"hello"});
  CHECK(wp.tokenize("a\xc0\xaf"
                    "a") == Tokens{"a", "##a"});  // never a '/'
  CHECK(wp.encode("\xed\xa0\x80\xff\xfe").empty());
}

TEST_CASE("wordpiece: decode and encode_for_bert") {
  VocabFile file(kVocab);
  const WordPiece wp = WordPiece::from_file(file.path);
  CHECK(wp.decode(wp.encode("unaffable Hello, world!")) == "unaffable hello , world !");
  CHECK(wp.decode(wp.encode("the [MASK] sat")) == "the [MASK] sat");
  CHECK(wp.decode({6, 5}) == "##aff un");  // as HF: only " ##" is removed
  CHECK(wp.decode({}).empty());

  CHECK(wp.encode_for_bert("hello world !", 100) == std::vector<int64_t>{2, 8, 9, 12, 3});
  CHECK(wp.encode_for_bert("hello world !", 5) == std::vector<int64_t>{2, 8, 9, 12, 3});
  CHECK(wp.encode_for_bert("hello world !", 4) == std::vector<int64_t>{2, 8, 9, 3});
  CHECK(wp.encode_for_bert("hello world !", 2) == std::vector<int64_t>{2, 3});
  CHECK(wp.encode_for_bert("", 8) == std::vector<int64_t>{2, 3});
}

TEST_CASE("wordpiece: errors name the file, the line and the token") {
  VocabFile file(kVocab);
  const WordPiece wp = WordPiece::from_file(file.path);
  check_error([&] { wp.token_id("[FOO]"); }, {"WordPiece::token_id", "'[FOO]'", file.path, "39 tokens"});
  check_error([&] { wp.decode({8, 39}); }, {"id 39", file.path, "39 tokens"});
  check_error([&] { wp.encode_for_bert("hello", 1); }, {"encode_for_bert", "max_len 1", "at least 2"});

  const std::string missing = temp_path("frugal_wordpiece_missing", ".txt");
  check_error([&] { WordPiece::from_file(missing); }, {"WordPiece::from_file", "cannot open", missing});
  const std::string dir = std::filesystem::temp_directory_path().string();
  check_error([&] { WordPiece::from_file(dir); }, {"WordPiece::from_file", dir, "not a regular file"});
  {
    VocabFile empty("", "frugal_wordpiece_empty");
    check_error([&] { WordPiece::from_file(empty.path); }, {"WordPiece::from_file", empty.path, "is empty"});
  }
  {
    VocabFile dup("[UNK]\nhello\nworld\nhello\n", "frugal_wordpiece_dup");
    check_error([&] { WordPiece::from_file(dup.path); },
                {dup.path, "line 4", "'hello'", "already on line 2", "ids 1 and 3"});
  }
  {
    VocabFile no_unk("hello\nworld\n", "frugal_wordpiece_nounk");
    check_error([&] { WordPiece::from_file(no_unk.path); }, {no_unk.path, "no unknown token '[UNK]'"});
    check_error([&] { WordPiece::from_file(file.path, {.unk_token = "<unk>"}); }, {file.path, "'<unk>'"});
    // Without [CLS], encode works but encode_for_bert names the missing token.
    const WordPiece plain = WordPiece::from_file(no_unk.path, {.unk_token = "hello"});
    CHECK(plain.encode("world xyz") == std::vector<int64_t>{1, 0});
    check_error([&] { plain.encode_for_bert("world", 8); }, {"'[CLS]'", no_unk.path});
  }
  {
    VocabFile bad(
        "[UNK]\nab\xff"
        "c\n",
        "frugal_wordpiece_badutf8");
    check_error([&] { WordPiece::from_file(bad.path); }, {bad.path, "line 2", "not valid UTF-8", "byte 3", "0xff"});
  }
  check_error([&] { WordPiece::from_file(file.path, {.max_input_chars_per_word = 0}); },
              {"max_input_chars_per_word is 0"});
}
