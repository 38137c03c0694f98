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

template <size_t N>
bool in(const tables::Range (&table)[N], char32_t cp) {
  const auto* r = std::upper_bound(std::begin(table), std::end(table), cp,
                                   [](char32_t c, const tables::Range& x) { return c < x.first; });
  return r != std::begin(table) && cp <= (r - 1)->last;
}

// HF's _is_chinese_char: not a Unicode property, so written here rather than generated.
constexpr tables::Range kCjk[] = {{0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xF900, 0xFAFF},   {0x20000, 0x2A6DF},
                                  {0x2A700, 0x2B73F}, {0x2B740, 0x2B81F}, {0x2B820, 0x2CEAF}, {0x2F800, 0x2FA1F}};

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

// Note [Unicode coverage]: the generated tables of nn/data/unicode_tables.inc.
bool is_whitespace(char32_t cp) { return cp == '\t' || cp == '\n' || cp == '\r' || in(tables::kSpaces, cp); }
bool is_control(char32_t cp) { return cp != '\t' && cp != '\n' && cp != '\r' && in(tables::kControls, cp); }
bool is_punctuation(char32_t cp) { return in(tables::kPunctuation, cp); }
bool is_cjk(char32_t cp) { return in(kCjk, cp); }
bool is_combining_mark(char32_t cp) { return in(tables::kMarks, cp); }

namespace {
void append_lower(std::vector<char32_t>& out, char32_t cp) {
  if (cp < 0x80) {  // ASCII, most text: only A-Z change (tools/gen_unicode_tables.py checks this)
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  const auto& runs = tables::kLowerRuns;
  const auto* r = std::upper_bound(std::begin(runs), std::end(runs), cp,
                                   [](char32_t c, const tables::LowerRun& x) { return c < x.first; });
  if (r != std::begin(runs) && cp <= (--r)->last && (cp - r->first) % r->step == 0) {
    out.push_back(char32_t(int64_t(cp) + r->delta));
    return;
  }
  for (const tables::LowerSpecial& s : tables::kLowerSpecials) {  // one entry (U+0130) in Unicode 14
    if (s.cp != cp) continue;
    for (char32_t to : s.to)
      if (to) out.push_back(to);
    return;
  }
  out.push_back(cp);
}
}  // namespace

std::vector<char32_t> lower(const std::vector<char32_t>& word) {
  std::vector<char32_t> out;
  out.reserve(word.size());
  // Final_Sigma as CPython's str.lower() decides it: the first code point from i going `dir`
  // that is not case-ignorable is cased; running off the word is not.
  const auto cased_at = [&](size_t i, int dir) {
    for (; i < word.size(); i += size_t(dir))  // from 0 going back, i wraps past word.size()
      if (!in(tables::kCaseIgnorable, word[i])) return in(tables::kCased, word[i]);
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

// The canonical ordering algorithm: each run of non-starters sorted stably by combining class.
// A stable sort, not an insertion sort, so that a long run of marks (a corpus's garbage) costs
// n log n rather than n^2.
void order_marks(std::vector<char32_t>& s) {
  const auto by_class = [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); };
  for (size_t i = 0; i < s.size();) {
    if (combining_class(s[i]) == 0) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < s.size() && combining_class(s[end]) != 0) ++end;
    if (end - i > 1) std::stable_sort(s.begin() + ptrdiff_t(i), s.begin() + ptrdiff_t(end), by_class);
    i = end;
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
