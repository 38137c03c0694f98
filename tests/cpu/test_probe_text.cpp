// Probes for silent wrong answers in WordPiece's text rules (nn/data/wordpiece.h) against
// Hugging Face's slow BertTokenizer: Unicode classes and lower-casing beyond the Latin, Greek
// and Cyrillic blocks (Note [Unicode coverage]), a capital that NFC composes with a mark before
// lower-casing, strip_accents following lower_case when unset (HF's strip_accents=None), and
// canonical reordering of a long run of marks. The expected tokens are the output of a Python
// transcription of BertTokenizer (google-research/bert's tokenization.py with NFC first and
// unicodedata of Python 3.11, Unicode 14), written out beside each input; the code point
// samples are Python's str.lower() and unicodedata.category(). A failing case here is a finding.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "nn/data/unicode_text.h"
#include "nn/data/wordpiece.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::data;

namespace {

std::string utf8(std::u32string_view text) {
  std::string out;
  for (char32_t cp : text) unicode::append_utf8(out, cp);
  return out;
}

std::vector<std::string> utf8_tokens(const std::vector<std::u32string>& tokens) {
  std::vector<std::string> out;
  for (const std::u32string& t : tokens) out.push_back(utf8(t));
  return out;
}

// A vocab of [UNK] then `tokens`, one a line, read with `options`.
WordPiece vocab_of(const std::vector<std::u32string>& tokens, WordPieceOptions options = {}) {
  const std::string path = testing::temp_path("frugal_probe_text_vocab", ".txt");
  {
    std::ofstream out(path, std::ios::binary);
    out << "[UNK]\n";
    for (const std::u32string& t : tokens) out << utf8(t) << '\n';
  }
  WordPiece wp = WordPiece::from_file(path, options);
  std::filesystem::remove(path);
  return wp;
}

using Tokens = std::vector<std::string>;

}  // namespace

TEST_CASE("probe text: an ASCII capital that NFC composes with a mark is still lower-cased (uncased defaults)") {
  // NFC (step 5) runs before lower-casing, so "K" U+0301 reaches lower() as U+1E30, "A" U+0323
  // as U+1EA0, and S/T with comma below are U+0218/U+021A from the start: lower() must know them,
  // or NFD strips them back to a capital that no uncased vocab holds.
  const WordPiece wp = vocab_of({U"k", U"K", U"hanh", U"stiinta", U"S", U"##ti", U"##in", U"##T", U"##a"});
  CHECK(wp.tokenize(utf8(U"K\u0301")) == Tokens{"k"});                       // reference: ['k']
  CHECK(wp.tokenize(utf8(U"HA\u0323NH")) == Tokens{"hanh"});                 // reference: ['hanh']
  CHECK(wp.tokenize(utf8(U"H\u0323ANH")) == Tokens{"hanh"});                 // reference: ['hanh']
  CHECK(wp.tokenize(utf8(U"\u0218TIIN\u021A\u0102")) == Tokens{"stiinta"});  // reference: ['stiinta']
  CHECK(wp.tokenize(utf8(U"\u1E30 \u1EA0")) == Tokens{"k", "[UNK]"});        // reference: ['k', '[UNK]'] (no "a")
}

TEST_CASE("probe text: punctuation, marks, controls and capitals of every script split, vanish and lower as HF's") {
  struct Case {
    std::u32string text;
    std::vector<std::u32string> uncased, cased;  // the reference's words with do_lower_case True, False
  };
  const std::vector<Case> cases = {
      // Arabic comma U+060C and question mark U+061F (Po)
      {U"\u0645\u0631\u062D\u0628\u0627\u060C \u0627\u0644\u0639\u0627\u0644\u0645\u061F",
       {U"\u0645\u0631\u062D\u0628\u0627", U"\u060C", U"\u0627\u0644\u0639\u0627\u0644\u0645", U"\u061F"},
       {U"\u0645\u0631\u062D\u0628\u0627", U"\u060C", U"\u0627\u0644\u0639\u0627\u0644\u0645", U"\u061F"}},
      // Arabic harakat (Mn)
      {U"\u0645\u064E\u0631\u0652\u062D\u064E\u0628\u064B\u0627",
       {U"\u0645\u0631\u062D\u0628\u0627"},
       {U"\u0645\u064E\u0631\u0652\u062D\u064E\u0628\u064B\u0627"}},
      // Devanagari virama U+094D (Mn), vowel sign U+093F (Mc), danda U+0964 (Po)
      {U"\u0915\u094D\u0937\u0924\u094D\u0930\u093F\u092F\u0964",
       {U"\u0915\u0937\u0924\u0930\u093F\u092F", U"\u0964"},
       {U"\u0915\u094D\u0937\u0924\u094D\u0930\u093F\u092F", U"\u0964"}},
      // Hebrew points (Mn)
      {U"\u05E9\u05B8\u05C1\u05DC\u05D5\u05B9\u05DD",
       {U"\u05E9\u05DC\u05D5\u05DD"},
       {U"\u05E9\u05B8\u05C1\u05DC\u05D5\u05B9\u05DD"}},
      // Hebrew maqaf U+05BE (Pd)
      {U"\u05D1\u05D9\u05EA\u05BE\u05E1\u05E4\u05E8",
       {U"\u05D1\u05D9\u05EA", U"\u05BE", U"\u05E1\u05E4\u05E8"},
       {U"\u05D1\u05D9\u05EA", U"\u05BE", U"\u05E1\u05E4\u05E8"}},
      // P* of Supplemental Punctuation, Mongolian, Myanmar, Tibetan, Tai Viet
      {U"\u2E42\u2E53\u1800\u104A\u0F14\uAA5C",
       {U"\u2E42", U"\u2E53", U"\u1800", U"\u104A", U"\u0F14", U"\uAA5C"},
       {U"\u2E42", U"\u2E53", U"\u1800", U"\u104A", U"\u0F14", U"\uAA5C"}},
      // unassigned U+0378 (Cn): dropped
      {U"a\u0378b", {U"ab"}, {U"ab"}},
      // soft hyphen U+00AD and LANGUAGE TAG U+E0001 (Cf): dropped
      {U"x\u00ADy x\U000E0001y", {U"xy", U"xy"}, {U"xy", U"xy"}},
      // Final_Sigma skips ' and . (case-ignorable) before a cased letter
      {U"\u0391\u03A3'\u0391 \u039F\u0394\u039F\u03A3.\u0391 \u039F\u0394\u039F\u03A3.",
       {U"\u03B1\u03C3", U"'", U"\u03B1", U"\u03BF\u03B4\u03BF\u03C3", U".", U"\u03B1", U"\u03BF\u03B4\u03BF\u03C2",
        U"."},
       {U"\u0391\u03A3", U"'", U"\u0391", U"\u039F\u0394\u039F\u03A3", U".", U"\u0391", U"\u039F\u0394\u039F\u03A3",
        U"."}},
      // U+0345 is cased and case-ignorable: skipped
      {U"\u03A3\u0345\u03A3", {U"\u03C3\u03C2"}, {U"\u03A3\u0345\u03A3"}},
      // Latin Extended, titlecase, circled letter, Roman numeral, capital sharp s
      {U"\u1E30 \u01F8 \u1EA0 \u01C5 \u24B6 \u216B \u1E9E",
       {U"k", U"n", U"a", U"\u01C6", U"\u24D0", U"\u217B", U"\u00DF"},
       {U"\u1E30", U"\u01F8", U"\u1EA0", U"\u01C5", U"\u24B6", U"\u216B", U"\u1E9E"}},
      // Cherokee, Georgian Mtavruli, Deseret, Cyrillic Extended-B, Latin Extended-D
      {U"\u13E3\u13B3\u13A9 \u1C9B\u1C90\u1CA0\u1C97 \U00010400\U00010401 \uA640\uA642 \uA7B4",
       {U"\uABB3\uAB83\uAB79", U"\u10DB\u10D0\u10E0\u10D7", U"\U00010428\U00010429", U"\uA641\uA643", U"\uA7B5"},
       {U"\u13E3\u13B3\u13A9", U"\u1C9B\u1C90\u1CA0\u1C97", U"\U00010400\U00010401", U"\uA640\uA642", U"\uA7B4"}},
  };
  std::vector<std::u32string> words;  // every expected word is in the vocab, so each comes out whole
  for (const Case& c : cases) {
    words.insert(words.end(), c.uncased.begin(), c.uncased.end());
    words.insert(words.end(), c.cased.begin(), c.cased.end());
  }
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  const WordPiece uncased = vocab_of(words), cased = vocab_of(words, {.lower_case = false});
  for (const Case& c : cases) {
    INFO("text: " << utf8(c.text));
    CHECK(uncased.tokenize(utf8(c.text)) == utf8_tokens(c.uncased));
    CHECK(cased.tokenize(utf8(c.text)) == utf8_tokens(c.cased));
  }
}

TEST_CASE("probe text: lower() is str.lower() and the classes are HF's on code points of every plane") {
  // Code points at the edges of the C*, P*, Mn and lower-case ranges, and one every 0x4000 of
  // every plane; lower: chr(cp).lower(); classes: P _is_punctuation, C _is_control, M category
  // Mn, from Python 3.11's unicodedata (Unicode 14).
  struct Sample {
    char32_t cp, lower;
    std::string_view classes;
  };
  const Sample samples[] = {
      {0x0000, 0x0000, "C"},     {0x001F, 0x001F, "C"},     {0x0020, 0x0020, ""},      {0x0021, 0x0021, "P"},
      {0x002F, 0x002F, "P"},     {0x0030, 0x0030, ""},      {0x0041, 0x0061, ""},      {0x005A, 0x007A, ""},
      {0x005B, 0x005B, "P"},     {0x00AB, 0x00AB, "P"},     {0x00AC, 0x00AC, ""},      {0x0100, 0x0101, ""},
      {0x012E, 0x012F, ""},      {0x012F, 0x012F, ""},      {0x014A, 0x014B, ""},      {0x0176, 0x0177, ""},
      {0x0177, 0x0177, ""},      {0x0181, 0x0253, ""},      {0x0182, 0x0183, ""},      {0x0187, 0x0188, ""},
      {0x0188, 0x0188, ""},      {0x018E, 0x01DD, ""},      {0x018F, 0x0259, ""},      {0x0191, 0x0192, ""},
      {0x0192, 0x0192, ""},      {0x0196, 0x0269, ""},      {0x0197, 0x0268, ""},      {0x019C, 0x026F, ""},
      {0x019D, 0x0272, ""},      {0x01A0, 0x01A1, ""},      {0x01A4, 0x01A5, ""},      {0x01A5, 0x01A5, ""},
      {0x01A9, 0x0283, ""},      {0x01AA, 0x01AA, ""},      {0x01AF, 0x01B0, ""},      {0x01B0, 0x01B0, ""},
      {0x01B7, 0x0292, ""},      {0x01B8, 0x01B9, ""},      {0x01C4, 0x01C6, ""},      {0x01C5, 0x01C6, ""},
      {0x01C8, 0x01C9, ""},      {0x01C9, 0x01C9, ""},      {0x01DE, 0x01DF, ""},      {0x01EE, 0x01EF, ""},
      {0x01EF, 0x01EF, ""},      {0x01F6, 0x0195, ""},      {0x01F7, 0x01BF, ""},      {0x0218, 0x0219, ""},
      {0x021A, 0x021B, ""},      {0x0220, 0x019E, ""},      {0x0221, 0x0221, ""},      {0x023B, 0x023C, ""},
      {0x023C, 0x023C, ""},      {0x0241, 0x0242, ""},      {0x0242, 0x0242, ""},      {0x0245, 0x028C, ""},
      {0x0246, 0x0247, ""},      {0x0300, 0x0300, "M"},     {0x036F, 0x036F, "M"},     {0x0370, 0x0371, ""},
      {0x0376, 0x0377, ""},      {0x0377, 0x0377, ""},      {0x0378, 0x0378, "C"},     {0x0388, 0x03AD, ""},
      {0x038A, 0x03AF, ""},      {0x038B, 0x038B, "C"},     {0x0391, 0x03B1, ""},      {0x03A1, 0x03C1, ""},
      {0x03A2, 0x03A2, "C"},     {0x03A3, 0x03C3, ""},      {0x03C2, 0x03C2, ""},      {0x03D8, 0x03D9, ""},
      {0x03EE, 0x03EF, ""},      {0x03EF, 0x03EF, ""},      {0x03F9, 0x03F2, ""},      {0x03FA, 0x03FB, ""},
      {0x0400, 0x0450, ""},      {0x040F, 0x045F, ""},      {0x0410, 0x0430, ""},      {0x048A, 0x048B, ""},
      {0x04BE, 0x04BF, ""},      {0x04BF, 0x04BF, ""},      {0x04D0, 0x04D1, ""},      {0x052E, 0x052F, ""},
      {0x052F, 0x052F, ""},      {0x055A, 0x055A, "P"},     {0x055F, 0x055F, "P"},     {0x0560, 0x0560, ""},
      {0x05B0, 0x05B0, "M"},     {0x05BE, 0x05BE, "P"},     {0x05F3, 0x05F3, "P"},     {0x05F4, 0x05F4, "P"},
      {0x05F5, 0x05F5, "C"},     {0x060C, 0x060C, "P"},     {0x064B, 0x064B, "M"},     {0x06D4, 0x06D4, "P"},
      {0x06D5, 0x06D5, ""},      {0x06E7, 0x06E7, "M"},     {0x06E8, 0x06E8, "M"},     {0x06E9, 0x06E9, ""},
      {0x085F, 0x085F, "C"},     {0x0860, 0x0860, ""},      {0x0898, 0x0898, "M"},     {0x089F, 0x089F, "M"},
      {0x08A0, 0x08A0, ""},      {0x094D, 0x094D, "M"},     {0x0964, 0x0964, "P"},     {0x0970, 0x0970, "P"},
      {0x0971, 0x0971, ""},      {0x09CD, 0x09CD, "M"},     {0x09CE, 0x09CE, ""},      {0x0A37, 0x0A37, "C"},
      {0x0A38, 0x0A38, ""},      {0x0ABC, 0x0ABC, "M"},     {0x0ABD, 0x0ABD, ""},      {0x0B04, 0x0B04, "C"},
      {0x0B05, 0x0B05, ""},      {0x0B62, 0x0B62, "M"},     {0x0B63, 0x0B63, "M"},     {0x0B64, 0x0B64, "C"},
      {0x0BC3, 0x0BC3, "C"},     {0x0BC5, 0x0BC5, "C"},     {0x0BC6, 0x0BC6, ""},      {0x0C81, 0x0C81, "M"},
      {0x0C82, 0x0C82, ""},      {0x0CC9, 0x0CC9, "C"},     {0x0CCA, 0x0CCA, ""},      {0x0DCA, 0x0DCA, "M"},
      {0x0DCB, 0x0DCB, "C"},     {0x0DF0, 0x0DF0, "C"},     {0x0DF1, 0x0DF1, "C"},     {0x0DF2, 0x0DF2, ""},
      {0x0DF4, 0x0DF4, "P"},     {0x0DF5, 0x0DF5, "C"},     {0x0F39, 0x0F39, "M"},     {0x0F3A, 0x0F3A, "P"},
      {0x0F85, 0x0F85, "P"},     {0x0F86, 0x0F86, "M"},     {0x105E, 0x105E, "M"},     {0x1060, 0x1060, "M"},
      {0x1061, 0x1061, ""},      {0x10C7, 0x2D27, ""},      {0x10C8, 0x10C8, "C"},     {0x1249, 0x1249, "C"},
      {0x124A, 0x124A, ""},      {0x13F0, 0x13F8, ""},      {0x13F5, 0x13FD, ""},      {0x13F6, 0x13F6, "C"},
      {0x1400, 0x1400, "P"},     {0x1401, 0x1401, ""},      {0x1754, 0x1754, "C"},     {0x175F, 0x175F, "C"},
      {0x1760, 0x1760, ""},      {0x17B7, 0x17B7, "M"},     {0x17BD, 0x17BD, "M"},     {0x17BE, 0x17BE, ""},
      {0x17D8, 0x17D8, "P"},     {0x17DA, 0x17DA, "P"},     {0x17DB, 0x17DB, ""},      {0x1A17, 0x1A17, "M"},
      {0x1A18, 0x1A18, "M"},     {0x1A19, 0x1A19, ""},      {0x1A8A, 0x1A8A, "C"},     {0x1A8F, 0x1A8F, "C"},
      {0x1A90, 0x1A90, ""},      {0x1B34, 0x1B34, "M"},     {0x1B35, 0x1B35, ""},      {0x1B5A, 0x1B5A, "P"},
      {0x1B60, 0x1B60, "P"},     {0x1B61, 0x1B61, ""},      {0x1BEF, 0x1BEF, "M"},     {0x1BF1, 0x1BF1, "M"},
      {0x1BF2, 0x1BF2, ""},      {0x1CD3, 0x1CD3, "P"},     {0x1CD4, 0x1CD4, "M"},     {0x1E00, 0x1E01, ""},
      {0x1E30, 0x1E31, ""},      {0x1E94, 0x1E95, ""},      {0x1E95, 0x1E95, ""},      {0x1EA0, 0x1EA1, ""},
      {0x1F08, 0x1F00, ""},      {0x1F0F, 0x1F07, ""},      {0x1F10, 0x1F10, ""},      {0x1F38, 0x1F30, ""},
      {0x1F3F, 0x1F37, ""},      {0x1F40, 0x1F40, ""},      {0x1F68, 0x1F60, ""},      {0x1F6F, 0x1F67, ""},
      {0x1F70, 0x1F70, ""},      {0x1FA8, 0x1FA0, ""},      {0x1FAF, 0x1FA7, ""},      {0x1FB0, 0x1FB0, ""},
      {0x1FBC, 0x1FB3, ""},      {0x1FBD, 0x1FBD, ""},      {0x1FD4, 0x1FD4, "C"},     {0x1FD5, 0x1FD5, "C"},
      {0x1FD6, 0x1FD6, ""},      {0x1FD8, 0x1FD0, ""},      {0x1FD9, 0x1FD1, ""},      {0x1FDA, 0x1F76, ""},
      {0x1FEA, 0x1F7A, ""},      {0x1FEB, 0x1F7B, ""},      {0x1FEC, 0x1FE5, ""},      {0x1FFA, 0x1F7C, ""},
      {0x1FFB, 0x1F7D, ""},      {0x1FFC, 0x1FF3, ""},      {0x208D, 0x208D, "P"},     {0x208E, 0x208E, "P"},
      {0x208F, 0x208F, "C"},     {0x20E5, 0x20E5, "M"},     {0x20F0, 0x20F0, "M"},     {0x20F1, 0x20F1, "C"},
      {0x212A, 0x006B, ""},      {0x212B, 0x00E5, ""},      {0x2160, 0x2170, ""},      {0x216F, 0x217F, ""},
      {0x2170, 0x2170, ""},      {0x2983, 0x2983, "P"},     {0x2998, 0x2998, "P"},     {0x2999, 0x2999, ""},
      {0x2C00, 0x2C30, ""},      {0x2C2F, 0x2C5F, ""},      {0x2C30, 0x2C30, ""},      {0x2C63, 0x1D7D, ""},
      {0x2C64, 0x027D, ""},      {0x2C6D, 0x0251, ""},      {0x2C6E, 0x0271, ""},      {0x2C70, 0x0252, ""},
      {0x2C71, 0x2C71, ""},      {0x2C7E, 0x023F, ""},      {0x2C7F, 0x0240, ""},      {0x2C80, 0x2C81, ""},
      {0x2CF2, 0x2CF3, ""},      {0x2CF3, 0x2CF3, ""},      {0x2D97, 0x2D97, "C"},     {0x2D9F, 0x2D9F, "C"},
      {0x2DA0, 0x2DA0, ""},      {0x2E00, 0x2E00, "P"},     {0x2E2E, 0x2E2E, "P"},     {0x2E2F, 0x2E2F, ""},
      {0x3030, 0x3030, "P"},     {0x3031, 0x3031, ""},      {0x4000, 0x4000, ""},      {0x8000, 0x8000, ""},
      {0xA673, 0xA673, "P"},     {0xA674, 0xA674, "M"},     {0xA6F8, 0xA6F8, "C"},     {0xA6FF, 0xA6FF, "C"},
      {0xA700, 0xA700, ""},      {0xA722, 0xA723, ""},      {0xA72E, 0xA72F, ""},      {0xA72F, 0xA72F, ""},
      {0xA77D, 0x1D79, ""},      {0xA77E, 0xA77F, ""},      {0xA78D, 0x0265, ""},      {0xA78E, 0xA78E, ""},
      {0xA7AA, 0x0266, ""},      {0xA7AB, 0x025C, ""},      {0xA7AD, 0x026C, ""},      {0xA7AE, 0x026A, ""},
      {0xA7B1, 0x0287, ""},      {0xA7B2, 0x029D, ""},      {0xA7B4, 0xA7B5, ""},      {0xA7C2, 0xA7C3, ""},
      {0xA7C3, 0xA7C3, ""},      {0xA7C6, 0x1D8E, ""},      {0xA7C7, 0xA7C8, ""},      {0xA7D6, 0xA7D7, ""},
      {0xA7D8, 0xA7D9, ""},      {0xA7D9, 0xA7D9, ""},      {0xA80B, 0xA80B, "M"},     {0xA80C, 0xA80C, ""},
      {0xA8FC, 0xA8FC, "P"},     {0xA8FD, 0xA8FD, ""},      {0xA9E5, 0xA9E5, "M"},     {0xA9E6, 0xA9E6, ""},
      {0xAADE, 0xAADE, "P"},     {0xAADF, 0xAADF, "P"},     {0xAAE0, 0xAAE0, ""},      {0xAAEC, 0xAAEC, "M"},
      {0xAAED, 0xAAED, "M"},     {0xAAEE, 0xAAEE, ""},      {0xAB2F, 0xAB2F, "C"},     {0xAB30, 0xAB30, ""},
      {0xC000, 0xC000, ""},      {0xFE54, 0xFE54, "P"},     {0xFE61, 0xFE61, "P"},     {0xFE62, 0xFE62, ""},
      {0xFE75, 0xFE75, "C"},     {0xFE76, 0xFE76, ""},      {0xFF0C, 0xFF0C, "P"},     {0xFF0F, 0xFF0F, "P"},
      {0xFF10, 0xFF10, ""},      {0xFF5D, 0xFF5D, "P"},     {0xFF5E, 0xFF5E, ""},      {0x10000, 0x10000, ""},
      {0x102D1, 0x102D1, "C"},   {0x102DF, 0x102DF, "C"},   {0x102E0, 0x102E0, "M"},   {0x10400, 0x10428, ""},
      {0x10427, 0x1044F, ""},    {0x10428, 0x10428, ""},    {0x1057C, 0x105A3, ""},    {0x1058A, 0x105B1, ""},
      {0x1058B, 0x1058B, "C"},   {0x10768, 0x10768, "C"},   {0x1077F, 0x1077F, "C"},   {0x10780, 0x10780, ""},
      {0x10857, 0x10857, "P"},   {0x10858, 0x10858, ""},    {0x10A05, 0x10A05, "M"},   {0x10A06, 0x10A06, "M"},
      {0x10A07, 0x10A07, "C"},   {0x10A3B, 0x10A3B, "C"},   {0x10A3E, 0x10A3E, "C"},   {0x10A3F, 0x10A3F, "M"},
      {0x10B39, 0x10B39, "P"},   {0x10B3F, 0x10B3F, "P"},   {0x10B40, 0x10B40, ""},    {0x10C80, 0x10CC0, ""},
      {0x10CB2, 0x10CF2, ""},    {0x10CB3, 0x10CB3, "C"},   {0x10FCC, 0x10FCC, "C"},   {0x10FDF, 0x10FDF, "C"},
      {0x10FE0, 0x10FE0, ""},    {0x11073, 0x11073, "M"},   {0x11074, 0x11074, "M"},   {0x11075, 0x11075, ""},
      {0x110BB, 0x110BB, "P"},   {0x110BC, 0x110BC, "P"},   {0x110BD, 0x110BD, "C"},   {0x111CF, 0x111CF, "M"},
      {0x111D0, 0x111D0, ""},    {0x111DB, 0x111DB, "P"},   {0x111DC, 0x111DC, ""},    {0x11311, 0x11311, "C"},
      {0x11312, 0x11312, "C"},   {0x11313, 0x11313, ""},    {0x11438, 0x11438, "M"},   {0x1143F, 0x1143F, "M"},
      {0x11440, 0x11440, ""},    {0x1145D, 0x1145D, "P"},   {0x1145E, 0x1145E, "M"},   {0x11633, 0x11633, "M"},
      {0x1163A, 0x1163A, "M"},   {0x1163B, 0x1163B, ""},    {0x1171B, 0x1171B, "C"},   {0x1171C, 0x1171C, "C"},
      {0x1171D, 0x1171D, "M"},   {0x1173C, 0x1173C, "P"},   {0x1173E, 0x1173E, "P"},   {0x1173F, 0x1173F, ""},
      {0x1193B, 0x1193B, "M"},   {0x1193C, 0x1193C, "M"},   {0x1193D, 0x1193D, ""},    {0x11A8A, 0x11A8A, "M"},
      {0x11A96, 0x11A96, "M"},   {0x11A97, 0x11A97, ""},    {0x11A9E, 0x11A9E, "P"},   {0x11AA2, 0x11AA2, "P"},
      {0x11AA3, 0x11AA3, "C"},   {0x11CA8, 0x11CA8, "C"},   {0x11CA9, 0x11CA9, ""},    {0x11D3F, 0x11D3F, "M"},
      {0x11D45, 0x11D45, "M"},   {0x11D46, 0x11D46, ""},    {0x12FF1, 0x12FF1, "P"},   {0x12FF2, 0x12FF2, "P"},
      {0x12FF3, 0x12FF3, "C"},   {0x14000, 0x14000, "C"},   {0x14647, 0x14647, "C"},   {0x167FF, 0x167FF, "C"},
      {0x16800, 0x16800, ""},    {0x16FE2, 0x16FE2, "P"},   {0x16FE3, 0x16FE3, ""},    {0x18000, 0x18000, ""},
      {0x1AFFF, 0x1AFFF, "C"},   {0x1B000, 0x1B000, ""},    {0x1C000, 0x1C000, "C"},   {0x1CF00, 0x1CF00, "M"},
      {0x1CF2D, 0x1CF2D, "M"},   {0x1CF2E, 0x1CF2E, "C"},   {0x1D4A3, 0x1D4A3, "C"},   {0x1D4A4, 0x1D4A4, "C"},
      {0x1D4A5, 0x1D4A5, ""},    {0x1DAA1, 0x1DAA1, "M"},   {0x1DAAF, 0x1DAAF, "M"},   {0x1DAB0, 0x1DAB0, "C"},
      {0x1E025, 0x1E025, "C"},   {0x1E026, 0x1E026, "M"},   {0x1E900, 0x1E922, ""},    {0x1E921, 0x1E943, ""},
      {0x1E922, 0x1E922, ""},    {0x1EE28, 0x1EE28, "C"},   {0x1EE29, 0x1EE29, ""},    {0x1EE8A, 0x1EE8A, "C"},
      {0x1EE8B, 0x1EE8B, ""},    {0x1F7F1, 0x1F7F1, "C"},   {0x1F7FF, 0x1F7FF, "C"},   {0x1F800, 0x1F800, ""},
      {0x20000, 0x20000, ""},    {0x24000, 0x24000, ""},    {0x28000, 0x28000, ""},    {0x2C000, 0x2C000, ""},
      {0x2CEA2, 0x2CEA2, "C"},   {0x2CEAF, 0x2CEAF, "C"},   {0x2CEB0, 0x2CEB0, ""},    {0x30000, 0x30000, ""},
      {0x34000, 0x34000, "C"},   {0x38000, 0x38000, "C"},   {0x3C000, 0x3C000, "C"},   {0x40000, 0x40000, "C"},
      {0x44000, 0x44000, "C"},   {0x48000, 0x48000, "C"},   {0x4C000, 0x4C000, "C"},   {0x50000, 0x50000, "C"},
      {0x54000, 0x54000, "C"},   {0x58000, 0x58000, "C"},   {0x5C000, 0x5C000, "C"},   {0x60000, 0x60000, "C"},
      {0x64000, 0x64000, "C"},   {0x68000, 0x68000, "C"},   {0x6C000, 0x6C000, "C"},   {0x70000, 0x70000, "C"},
      {0x74000, 0x74000, "C"},   {0x78000, 0x78000, "C"},   {0x7C000, 0x7C000, "C"},   {0x80000, 0x80000, "C"},
      {0x84000, 0x84000, "C"},   {0x88000, 0x88000, "C"},   {0x8C000, 0x8C000, "C"},   {0x90000, 0x90000, "C"},
      {0x94000, 0x94000, "C"},   {0x98000, 0x98000, "C"},   {0x9C000, 0x9C000, "C"},   {0xA0000, 0xA0000, "C"},
      {0xA4000, 0xA4000, "C"},   {0xA8000, 0xA8000, "C"},   {0xAC000, 0xAC000, "C"},   {0xB0000, 0xB0000, "C"},
      {0xB4000, 0xB4000, "C"},   {0xB8000, 0xB8000, "C"},   {0xBC000, 0xBC000, "C"},   {0xC0000, 0xC0000, "C"},
      {0xC4000, 0xC4000, "C"},   {0xC8000, 0xC8000, "C"},   {0xCC000, 0xCC000, "C"},   {0xD0000, 0xD0000, "C"},
      {0xD4000, 0xD4000, "C"},   {0xD8000, 0xD8000, "C"},   {0xDC000, 0xDC000, "C"},   {0xE0000, 0xE0000, "C"},
      {0xE4000, 0xE4000, "C"},   {0xE8000, 0xE8000, "C"},   {0xEC000, 0xEC000, "C"},   {0xF0000, 0xF0000, "C"},
      {0xF4000, 0xF4000, "C"},   {0xF8000, 0xF8000, "C"},   {0xFC000, 0xFC000, "C"},   {0x100000, 0x100000, "C"},
      {0x104000, 0x104000, "C"}, {0x108000, 0x108000, "C"}, {0x10C000, 0x10C000, "C"}, {0x10FFFF, 0x10FFFF, "C"},
  };
  for (const Sample& s : samples) {
    INFO("U+" << std::hex << uint32_t(s.cp));
    CHECK(unicode::lower({s.cp}) == std::vector<char32_t>{s.lower});
    CHECK(unicode::is_punctuation(s.cp) == (s.classes.find('P') != std::string_view::npos));
    CHECK(unicode::is_control(s.cp) == (s.classes.find('C') != std::string_view::npos));
    CHECK(unicode::is_combining_mark(s.cp) == (s.classes.find('M') != std::string_view::npos));
  }
  CHECK(unicode::lower({0x130}) == std::vector<char32_t>{'i', 0x307});  // 'İ'.lower() is two code points
}

TEST_CASE("probe text: Final_Sigma skips the code points str.lower() counts as case-ignorable") {
  using V = std::vector<char32_t>;
  // Python: 'ΑΣ\'Α'.lower() == 'ασ\'α' (the apostrophe is MidLetter, so case-ignorable);
  // 'ΑΣ\'Α'[:3].lower() == 'ας\''; 'Α\u00adΣ'.lower() == 'α\u00adς' (a soft hyphen, Cf, is skipped);
  // 'Α\u0345Σ'.lower() == 'α\u0345ς'; '\u0345Σ'.lower() == '\u0345σ' (U+0345 is cased, but also
  // case-ignorable, so skipped: nothing cased precedes the sigma); 'ΑΣ\U0001D7CE'.lower() ==
  // 'ας\U0001D7CE' (a digit is neither); 'ΑΣ\U00010428'.lower() == 'ασ\U00010428' (Deseret is cased).
  CHECK(unicode::lower({0x391, 0x3A3, '\'', 0x391}) == V{0x3B1, 0x3C3, '\'', 0x3B1});
  CHECK(unicode::lower({0x391, 0x3A3, '\''}) == V{0x3B1, 0x3C2, '\''});
  CHECK(unicode::lower({0x391, 0xAD, 0x3A3}) == V{0x3B1, 0xAD, 0x3C2});
  CHECK(unicode::lower({0x391, 0x345, 0x3A3}) == V{0x3B1, 0x345, 0x3C2});
  CHECK(unicode::lower({0x345, 0x3A3}) == V{0x345, 0x3C3});
  CHECK(unicode::lower({0x391, 0x3A3, 0x1D7CE}) == V{0x3B1, 0x3C2, 0x1D7CE});
  CHECK(unicode::lower({0x391, 0x3A3, 0x10428}) == V{0x3B1, 0x3C3, 0x10428});
}

TEST_CASE("probe text: strip_accents unset follows lower_case, as HF's strip_accents=None") {
  const WordPiece uncased = vocab_of({U"caf\u00E9", U"cafe", U"Cafe", U"Caf\u00E9"});
  CHECK(!uncased.options().strip_accents.has_value());
  CHECK(uncased.tokenize(utf8(U"Caf\u00E9")) == Tokens{"cafe"});  // reference (True, None): ['cafe']
  // bert-base-cased's tokenizer_config.json has only {"do_lower_case": false}: accents stay.
  const WordPiece cased = vocab_of({U"caf\u00E9", U"cafe", U"Cafe", U"Caf\u00E9"}, {.lower_case = false});
  CHECK(cased.tokenize(utf8(U"Caf\u00E9 cafe\u0301")) == utf8_tokens({U"Caf\u00E9", U"caf\u00E9"}));  // (False, None)
  const WordPiece cased_stripped =
      vocab_of({U"caf\u00E9", U"cafe", U"Cafe", U"Caf\u00E9"}, {.lower_case = false, .strip_accents = true});
  CHECK(cased_stripped.tokenize(utf8(U"Caf\u00E9")) == Tokens{"Cafe"});  // reference (False, True): ['Cafe']
  const WordPiece lower_only =
      vocab_of({U"caf\u00E9", U"cafe", U"Cafe", U"Caf\u00E9"}, {.lower_case = true, .strip_accents = false});
  CHECK(lower_only.tokenize(utf8(U"CAF\u00C9")) == utf8_tokens({U"caf\u00E9"}));  // reference (True, False): ['café']
}

TEST_CASE("probe text: canonical reordering sorts a long run of marks stably by combining class") {
  // unicodedata.normalize("NFD", "a" + "\u0301\u0316\u0327\u0302\u0323"): classes 230 220 202
  // 230 220 -> U+0327 (202), U+0316, U+0323 (220), U+0301, U+0302 (230).
  CHECK(unicode::nfd({'a', 0x301, 0x316, 0x327, 0x302, 0x323}) ==
        std::vector<char32_t>{'a', 0x327, 0x316, 0x323, 0x301, 0x302});
  // "a" + "\u0301\u0316" * n gives "a" + "\u0316" * n + "\u0301" * n; an insertion sort took
  // about n^2 / 2 steps here (seconds for this n), a stable sort n log n.
  const size_t n = 100000;
  std::vector<char32_t> text{'a'}, expected{'a'};
  for (size_t i = 0; i < n; ++i) text.insert(text.end(), {0x301, 0x316});
  expected.insert(expected.end(), n, 0x316);
  expected.insert(expected.end(), n, 0x301);
  CHECK(unicode::nfd(text) == expected);
  // NFC then composes "a" with the first U+0301, which U+0316 (220 < 230) does not block.
  expected.erase(expected.begin() + ptrdiff_t(n + 1));
  expected[0] = 0xE1;
  CHECK(unicode::nfc(text) == expected);
}
