#pragma once
// The pieces of Unicode that BERT's text normalisation needs (nn/data/wordpiece.h): UTF-8
// decoding and encoding, and the character classes, lower-casing and accent stripping of
// Hugging Face's BasicTokenizer, which asks Python's unicodedata for them. frugal carries no
// Unicode database: the classes are small tables over the common blocks (Note [Unicode
// coverage]); canonical normalization (NFD, NFC) has complete generated tables (Note [Unicode
// normalization]).
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
// The classes below are Python's unicodedata (Unicode 14) restricted to these blocks; the
// tables were written from unicodedata and checked against it code point by code point. On
// 9000 random strings drawn from these blocks (with stray bytes), WordPiece's tokens matched
// a Python transcription of HF's BertTokenizer except where an unassigned code point (Cn)
// occurred, which HF drops and frugal keeps:
// - whitespace: tab, newline, carriage return, every Zs, and U+2028/2029 (Zl, Zp), which HF
//   keeps as letters but Python's str.split() then splits on (complete).
// - control: every Cc and Cf (complete) and the private-use planes Co; unassigned code
//   points (Cn), which HF also drops, are kept.
// - punctuation: ASCII 33-47, 58-64, 91-96, 123-126 (as HF, including $ + < = > ^ ` | ~,
//   which Unicode calls symbols), and the P* code points of Latin-1 Supplement, Greek (U+037E, U+0387), General
//   Punctuation (U+2000-206F), Supplemental Punctuation (U+2E00-2E7F), CJK Symbols and
//   Punctuation (U+3000-303F), Katakana (U+30A0, U+30FB), CJK Compatibility and Small Form
//   Variants (U+FE30-FE6F) and the fullwidth forms (U+FF00-FFEF). Other scripts'
//   punctuation (Arabic, Devanagari, ...) stays inside words.
// - CJK ideographs: HF's _is_chinese_char ranges exactly.
// - lower-case: ASCII, Latin-1 Supplement, Latin Extended-A (with U+0130 -> "i" U+0307, as
//   str.lower()), basic Greek (U+0386-03AB) and Cyrillic (U+0400-042F); others unchanged.
// - NFD and NFC: complete (Note [Unicode normalization]).
// - combining marks (Mn), which stripping drops: U+0300-036F, U+0483-0487, U+1AB0-1ACE,
//   U+1DC0-1DFF, U+20D0-20F0 (the Mn ones), U+302A-302D, U+3099-309A and U+FE20-FE2F.
bool is_whitespace(char32_t cp);
bool is_control(char32_t cp);
bool is_punctuation(char32_t cp);
bool is_cjk(char32_t cp);
bool is_combining_mark(char32_t cp);
/// Lower-cases `word` as str.lower() does (Note [Unicode coverage]): U+0130 becomes two code
/// points, and a capital sigma ending a word becomes the final sigma U+03C2 (Unicode's
/// Final_Sigma rule, with "cased" read as a letter of the lower-case table's blocks and only
/// combining marks skipped as case-ignorable).
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
