#pragma once
// UTF-8 encoding of one code point, shared by the JSON reader and the text tokenizers,
// and the well-formedness rules the reader and the safetensors writer apply.
#include <cstddef>
#include <string>
#include <string_view>

namespace frugal {

/// Appends code point `cp` (at most U+10FFFF, no surrogate: the caller has checked) to `out`
/// as 1 to 4 UTF-8 bytes.
inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

/// The length (2 to 4) of a well-formed UTF-8 sequence led by byte b0 (>= 0x80), with the
/// range [*lo, *hi] its second byte must lie in (the later ones: [0x80, 0xBF]); 0 when b0
/// leads none. The ranges rule out overlong forms, surrogates (U+D800..U+DFFF) and code
/// points above U+10FFFF.
inline size_t utf8_lead(unsigned b0, unsigned* lo, unsigned* hi) {
  *lo = 0x80, *hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) return 2;
  if (b0 == 0xE0) return *lo = 0xA0, 3;
  if ((b0 >= 0xE1 && b0 <= 0xEC) || (b0 >= 0xEE && b0 <= 0xEF)) return 3;
  if (b0 == 0xED) return *hi = 0x9F, 3;
  if (b0 == 0xF0) return *lo = 0x90, 4;
  if (b0 >= 0xF1 && b0 <= 0xF3) return 4;
  if (b0 == 0xF4) return *hi = 0x8F, 4;
  return 0;
}

/// Whether s is well-formed UTF-8 (what a strict JSON reader accepts in a string).
inline bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    unsigned lo, hi;
    const size_t len = utf8_lead(b0, &lo, &hi);
    if (len == 0 || s.size() - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80u) || b > (k == 1 ? hi : 0xBFu)) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace frugal
