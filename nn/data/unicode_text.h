#pragma once
// The pieces of Unicode that BERT's text normalisation needs (nn/data/wordpiece.h): UTF-8
// decoding and encoding, and the character classes, lower-casing and accent stripping of
// Hugging Face's BasicTokenizer, which asks Python's unicodedata for them. frugal carries no
// Unicode database, only the range tables these need, generated from Python's own (Note
// [Unicode coverage], Note [Unicode normalization]).
//
// Note [Invalid UTF-8]
// Text is decoded with replacement, never rejected: each maximal ill-formed subsequence
// (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, a code
// point above U+10FFFF) becomes one U+FFFD, as Unicode's "best practice" (chapter 3, U+FFFD
// substitution of maximal subparts) and Python's bytes.decode(errors="replace") do. BERT's
// clean-up then drops U+FFFD, so a corpus with a bad byte tokenises as Hugging Face tokenises
// the same file read with errors="replace", instead of aborting a training run over one
// byte. The vocabulary file is the exception: a token that is not valid UTF-8 could never be
// matched, so from_file rejects it and names the line.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.h"

namespace frugal::data::unicode {

constexpr char32_t kReplacement = 0xFFFD;

/// The code points of `text`, each ill-formed subsequence replaced by U+FFFD (Note [Invalid
/// UTF-8]).
std::vector<char32_t> decode_utf8(std::string_view text);
/// Whether `text` is well-formed UTF-8; if not, `bad_offset` gets the offset of the first bad byte.
bool valid_utf8(std::string_view text, size_t* bad_offset = nullptr);
/// Appends the UTF-8 encoding of `cp` (a scalar value) to `out`.
using frugal::append_utf8;

// Note [Unicode coverage]
// Each class is HF's definition evaluated by Python 3.11's unicodedata (Unicode 14), for every
// code point: tools/gen_unicode_tables.py writes the ranges into nn/data/unicode_tables.inc
// from unicodedata and str.lower(), and checks the lower-casing there against str.lower() on
// every code point and on random words. On 80000 random strings over all planes (with stray
// bytes), WordPiece's ids matched a Python transcription of HF's BertTokenizer under Python 3.11
// with each combination of lower_case and strip_accents; a later Python (a later Unicode) may
// differ on the code points it newly assigns.
// - whitespace: tab, newline, carriage return, every Zs, and U+2028/2029 (Zl, Zp), which HF
//   keeps as letters but Python's str.split() then splits on.
// - control, which clean-up drops: every C* code point but tab, newline and carriage return
//   (HF's _is_control): Cc, Cf, Co, Cs and unassigned (Cn), so a code point that Unicode 14
//   does not assign (a newer emoji) is dropped, as HF under Python 3.11 drops it.
// - punctuation: ASCII 33-47, 58-64, 91-96, 123-126 (as HF, including $ + < = > ^ ` | ~,
//   which Unicode calls symbols) and every P* code point (the Arabic comma U+060C, the danda
//   U+0964, ...).
// - CJK ideographs: HF's _is_chinese_char ranges exactly (not a Unicode property).
// - combining marks, which accent stripping drops: every Mn (HF's _run_strip_accents); the
//   spacing (Mc) and enclosing (Me) marks stay.
// - lower-case: str.lower(): each code point's full lower-case mapping (U+0130 becomes "i"
//   U+0307), and Final_Sigma, under which a capital sigma becomes U+03C2 when, skipping
//   case-ignorable code points, a cased one comes before it and none after it; "cased" and
//   "case-ignorable" are the sets with which CPython decides this.
// - NFD and NFC (Note [Unicode normalization]).
// Lower-casing must see every letter that NFC (step 5 of Note [WordPiece pipeline]) can make:
// "K" U+0301 composes to U+1E30, which, left upper-case, NFD would then strip back to "K".
bool is_whitespace(char32_t cp);
bool is_control(char32_t cp);
bool is_punctuation(char32_t cp);
bool is_cjk(char32_t cp);
bool is_combining_mark(char32_t cp);
/// Lower-cases `word` as str.lower() does (Note [Unicode coverage]): U+0130 becomes two code
/// points, and a capital sigma ending a word becomes the final sigma U+03C2 (Final_Sigma).
std::vector<char32_t> lower(const std::vector<char32_t>& word);

// Note [Unicode normalization]
// NFD and NFC as Python's unicodedata.normalize gives them (UAX #15): NFD decomposes every
// code point fully by its canonical decompositions, then sorts each run of combining marks
// stably by canonical combining class; NFC then composes, left to right, each code point
// with the last starter before it when the pair has a primary composite and no code point
// between them is a starter or has a combining class at least its own. A primary composite
// is a canonical pair not excluded from composition (CompositionExclusions.txt, singletons
// such as U+212B ANGSTROM SIGN -> U+00C5, and decompositions that start with a mark), so
// U+0958 stays U+0915 U+093C. Hangul syllables decompose into and compose from their jamo by
// arithmetic (Unicode chapter 3.12). The decompositions, combining classes and primary
// composites are tables that tools/gen_unicode_tables.py writes from unicodedata into
// nn/data/unicode_tables.inc; every code point of Unicode 14 is covered.

/// Appends the full canonical decomposition of `cp` (itself where it has none), without
/// reordering marks (Note [Unicode normalization]).
void append_nfd(std::vector<char32_t>& out, char32_t cp);
/// unicodedata.normalize("NFD", text) (Note [Unicode normalization]).
std::vector<char32_t> nfd(const std::vector<char32_t>& text);
/// unicodedata.normalize("NFC", text) (Note [Unicode normalization]).
std::vector<char32_t> nfc(const std::vector<char32_t>& text);

}  // namespace frugal::data::unicode
