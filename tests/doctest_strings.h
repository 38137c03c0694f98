#pragma once
// Included ahead of every test file (tests/meson.build): doctest 2.4 prints a const char* given
// to INFO, CAPTURE or MESSAGE as a pointer ("fp80x5639...") unless
// DOCTEST_CONFIG_TREAT_CHAR_STAR_AS_STRING is set, and that setting does not compile in Debian's
// doctest 2.4.9. These specializations print the text instead; comparisons are untouched.
#include <doctest/doctest.h>

namespace doctest {
template <>
struct StringMaker<const char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
template <>
struct StringMaker<char*> {
  static String convert(const char* s) { return StringMaker<const char*>::convert(s); }
};
}  // namespace doctest
