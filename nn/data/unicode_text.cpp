#include "nn/data/unicode_text.h"

#include <algorithm>
#include <iterator>

#include "nn/data/unicode_tables.inc"

namespace frugal::data::unicode {

namespace {

// Decodes one sequence at text[i]: returns its length and sets `cp`, or returns the length of
// the maximal ill-formed subpart (at least 1) and sets `cp` to U+FFFD (Note [Invalid UTF-8]).
size_t decode_one(std::string_view text, size_t i, char32_t& cp) {
  const auto byte = [&](size_t k) { return uint8_t(text[i + k]); };
  const uint8_t b = byte(0);
  cp = kReplacement;
  if (b < 0x80) return cp = b, 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte (Unicode Table 3-7)
  if (b >= 0xC2 && b <= 0xDF) need = 1;
  else if (b >= 0xE0 && b <= 0xEF) need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
  else if (b >= 0xF0 && b <= 0xF4) need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
  else return 1;  // a continuation byte, C0/C1 (always overlong) or F5-FF (above U+10FFFF)
  char32_t v = b & (0x3F >> need);
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= text.size()) return k;  // truncated: the prefix read so far is one U+FFFD
    const uint8_t c = byte(k);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return k;
    v = (v << 6) | (c & 0x3F);
  }
  cp = v;
  return need + 1;
}

struct Range {
  char32_t first, last;
};

template <size_t N>
bool in(const Range (&table)[N], char32_t cp) {
  const Range* r =
      std::upper_bound(std::begin(table), std::end(table), cp, [](char32_t c, const Range& x) { return c < x.first; });
  return r != std::begin(table) && cp <= (r - 1)->last;
}

// Note [Unicode coverage]: the tables, sorted by first code point.
constexpr Range kSpaces[] = {  // Zs, and Zl/Zp (U+2028/2029), on which str.split() splits
    {0x0020, 0x0020}, {0x00A0, 0x00A0}, {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}};
constexpr Range kControls[] = {  // Cc, Cf and Co
    {0x0000, 0x001F},    {0x007F, 0x009F},   {0x00AD, 0x00AD},   {0x0600, 0x0605},   {0x061C, 0x061C},
    {0x06DD, 0x06DD},    {0x070F, 0x070F},   {0x0890, 0x0891},   {0x08E2, 0x08E2},   {0x180E, 0x180E},
    {0x200B, 0x200F},    {0x202A, 0x202E},   {0x2060, 0x2064},   {0x2066, 0x206F},   {0xE000, 0xF8FF},
    {0xFEFF, 0xFEFF},    {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x13438},
    {0x1BCA0, 0x1BCA3},  {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0xFFFFD},
    {0x100000, 0x10FFFD}};
constexpr Range kPunctuation[] = {  // ASCII as HF, then P* of the blocks listed in the Note
    {33, 47},         {58, 64},         {91, 96},         {123, 126},       {0x00A1, 0x00A1}, {0x00A7, 0x00A7},
    {0x00AB, 0x00AB}, {0x00B6, 0x00B7}, {0x00BB, 0x00BB}, {0x00BF, 0x00BF}, {0x037E, 0x037E}, {0x0387, 0x0387},
    {0x2010, 0x2027}, {0x2030, 0x2043}, {0x2045, 0x2051}, {0x2053, 0x205E}, {0x2E00, 0x2E2E}, {0x2E30, 0x2E4F},
    {0x2E52, 0x2E5D}, {0x3001, 0x3003}, {0x3008, 0x3011}, {0x3014, 0x301F}, {0x3030, 0x3030}, {0x303D, 0x303D},
    {0x30A0, 0x30A0}, {0x30FB, 0x30FB}, {0xFE30, 0xFE52}, {0xFE54, 0xFE61}, {0xFE63, 0xFE63}, {0xFE68, 0xFE68},
    {0xFE6A, 0xFE6B}, {0xFF01, 0xFF03}, {0xFF05, 0xFF0A}, {0xFF0C, 0xFF0F}, {0xFF1A, 0xFF1B}, {0xFF1F, 0xFF20},
    {0xFF3B, 0xFF3D}, {0xFF3F, 0xFF3F}, {0xFF5B, 0xFF5B}, {0xFF5D, 0xFF5D}, {0xFF5F, 0xFF65}};
constexpr Range kCjk[] = {  // HF's _is_chinese_char
    {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xF900, 0xFAFF},   {0x20000, 0x2A6DF},
    {0x2A700, 0x2B73F}, {0x2B740, 0x2B81F}, {0x2B820, 0x2CEAF}, {0x2F800, 0x2FA1F}};
constexpr Range kMarks[] = {{0x0300, 0x036F}, {0x0483, 0x0487}, {0x1AB0, 0x1ABD}, {0x1ABF, 0x1ACE},
                            {0x1DC0, 0x1DFF}, {0x20D0, 0x20DC}, {0x20E1, 0x20E1}, {0x20E5, 0x20F0},
                            {0x302A, 0x302D}, {0x3099, 0x309A}, {0xFE20, 0xFE2F}};

// Upper-case runs: first..last in steps of `step` map to cp + delta.
struct CaseRun {
  char32_t first, last;
  int step, delta;
};
constexpr CaseRun kLower[] = {{0x0041, 0x005A, 1, 32}, {0x00C0, 0x00D6, 1, 32},   {0x00D8, 0x00DE, 1, 32},
                              {0x0100, 0x012E, 2, 1},  {0x0132, 0x0136, 2, 1},    {0x0139, 0x0147, 2, 1},
                              {0x014A, 0x0176, 2, 1},  {0x0178, 0x0178, 1, -121}, {0x0179, 0x017D, 2, 1},
                              {0x0386, 0x0386, 1, 38}, {0x0388, 0x038A, 1, 37},   {0x038C, 0x038C, 1, 64},
                              {0x038E, 0x038F, 1, 63}, {0x0391, 0x03A1, 1, 32},   {0x03A3, 0x03AB, 1, 32},
                              {0x0400, 0x040F, 1, 80}, {0x0410, 0x042F, 1, 32}};

}  // namespace

std::vector<char32_t> decode_utf8(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    i += decode_one(text, i, cp);
    out.push_back(cp);
  }
  return out;
}

bool valid_utf8(std::string_view text, size_t* bad_offset) {
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    const size_t n = decode_one(text, i, cp);
    if (cp == kReplacement && !(n == 3 && text.substr(i, 3) == "\xEF\xBF\xBD")) {  // a real U+FFFD is fine
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += n;
  }
  return true;
}

bool is_whitespace(char32_t cp) { return cp == '\t' || cp == '\n' || cp == '\r' || in(kSpaces, cp); }
bool is_control(char32_t cp) { return cp != '\t' && cp != '\n' && cp != '\r' && in(kControls, cp); }
bool is_punctuation(char32_t cp) { return in(kPunctuation, cp); }
bool is_cjk(char32_t cp) { return in(kCjk, cp); }
bool is_combining_mark(char32_t cp) { return in(kMarks, cp); }

namespace {
void append_lower(std::vector<char32_t>& out, char32_t cp) {
  if (cp == 0x0130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE: str.lower() gives two code points
    out.push_back('i');
    out.push_back(0x0307);
    return;
  }
  for (const CaseRun& r : kLower) {
    if (cp < r.first) break;
    if (cp <= r.last && (cp - r.first) % char32_t(r.step) == 0) {
      out.push_back(char32_t(int64_t(cp) + r.delta));
      return;
    }
  }
  out.push_back(cp);
}

// A cased letter of the blocks the lower-case table covers (for Final_Sigma).
bool is_cased(char32_t cp) {
  return (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') ||
         (cp >= 0xC0 && cp <= 0x24F && cp != 0xD7 && cp != 0xF7) || (cp >= 0x386 && cp <= 0x3FF && cp != 0x387) ||
         (cp >= 0x400 && cp <= 0x481) || (cp >= 0x48A && cp <= 0x52F);
}
}  // namespace

std::vector<char32_t> lower(const std::vector<char32_t>& word) {
  std::vector<char32_t> out;
  out.reserve(word.size());
  const auto cased_at = [&](size_t i, int dir) {  // the first non-mark from i going dir
    for (; i < word.size(); i += size_t(dir))
      if (!is_combining_mark(word[i])) return is_cased(word[i]);
    return false;
  };
  for (size_t i = 0; i < word.size(); ++i) {
    if (word[i] == 0x03A3 && i > 0 && cased_at(i - 1, -1) && !cased_at(i + 1, 1)) out.push_back(0x03C2);
    else append_lower(out, word[i]);
  }
  return out;
}

// Note [Unicode normalization]: Hangul syllables are decomposed and composed by arithmetic
// (Unicode chapter 3.12), everything else through the generated tables.
namespace {
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

int combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto& t = tables::kCombiningClasses;
  const auto* r = std::upper_bound(std::begin(t), std::end(t), cp,
                                   [](char32_t c, const tables::ClassRun& x) { return c < x.first; });
  return r != std::begin(t) && cp <= (r - 1)->last ? (r - 1)->combining_class : 0;
}

// The canonical ordering algorithm: each run of non-starters sorted stably by combining class
// (an insertion sort, as the runs are a few marks long).
void order_marks(std::vector<char32_t>& s) {
  for (size_t i = 1; i < s.size(); ++i) {
    const char32_t cp = s[i];
    const int c = combining_class(cp);
    if (c == 0) continue;
    size_t j = i;
    for (; j > 0 && combining_class(s[j - 1]) > c; --j) s[j] = s[j - 1];  // a starter (0) stops it
    s[j] = cp;
  }
}

// The primary composite of the pair (a, b), or 0 where there is none.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)  // L + V -> LV
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);  // LV + T -> LVT
  const auto& t = tables::kCompositions;
  const auto* r =
      std::lower_bound(std::begin(t), std::end(t), std::pair{a, b}, [](const tables::Composition& x, auto p) {
        return x.first != p.first ? x.first < p.first : x.second < p.second;
      });
  return r != std::end(t) && r->first == a && r->second == b ? r->composite : 0;
}
}  // namespace

void append_nfd(std::vector<char32_t>& out, char32_t cp) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + s % kNCount / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {  // the first decomposable code point is U+00C0
    const auto& t = tables::kDecompositions;
    const auto* d = std::lower_bound(std::begin(t), std::end(t), cp,
                                     [](const tables::Decomposition& x, char32_t c) { return x.cp < c; });
    if (d != std::end(t) && d->cp == cp) {  // one level of the table; each part may decompose again
      append_nfd(out, d->first);
      if (d->second) append_nfd(out, d->second);
      return;
    }
  }
  out.push_back(cp);
}

std::vector<char32_t> nfd(const std::vector<char32_t>& text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  for (char32_t cp : text) append_nfd(out, cp);
  order_marks(out);
  return out;
}

std::vector<char32_t> nfc(const std::vector<char32_t>& text) {
  // Below U+0300 every code point is its own NFC and none composes with a neighbour
  // (tools/gen_unicode_tables.py checks this), so ASCII and Latin-1 text passes unchanged.
  if (std::all_of(text.begin(), text.end(), [](char32_t cp) { return cp < 0x300; })) return text;
  std::vector<char32_t> s = nfd(text);
  if (s.empty()) return s;
  // Canonical composition (UAX #15's reference code): each code point joins the last starter
  // unless something between them blocks it, i.e. has a class of 0 or at least its own.
  size_t starter = 0, n = 1;
  int last_class = combining_class(s[0]) == 0 ? 0 : 256;  // text opening with marks: nothing to join
  for (size_t i = 1; i < s.size(); ++i) {
    const char32_t cp = s[i];
    const int c = combining_class(cp);
    if (last_class < c || last_class == 0) {
      if (const char32_t composite = compose(s[starter], cp)) {
        s[starter] = composite;
        continue;
      }
    }
    if (c == 0) starter = n;
    last_class = c;
    s[n++] = cp;
  }
  s.resize(n);
  return s;
}

}  // namespace frugal::data::unicode
