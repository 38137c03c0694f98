#!/usr/bin/env python3
"""Writes nn/data/unicode_tables.inc from Python's unicodedata and str.lower(): the canonical
decompositions, canonical combining classes and primary compositions that
nn/data/unicode_text.cpp's NFD and NFC use (Note [Unicode normalization] in unicode_text.h), and
the character classes and lower-case mapping of Hugging Face's BasicTokenizer (Note [Unicode
coverage]), each complete over every code point. Run with a Python whose
unicodedata.unidata_version the Notes name (3.11: Unicode 14.0.0); the output depends on nothing
else, so running it again gives the same file:

    python3 tools/gen_unicode_tables.py > nn/data/unicode_tables.inc

Hangul syllables are left out of the normalization tables: unicode_text.cpp decomposes and
composes them algorithmically (Unicode chapter 3.12), as unicodedata does.
"""
import random
import sys
import unicodedata as ud

UNICODE_VERSION = "14.0.0"
CODE_POINTS = range(0x110000)
CAPITAL_SIGMA, SMALL_SIGMA, FINAL_SIGMA = "\u03a3", "\u03c3", "\u03c2"

HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3


def decompositions():
    """(cp, first, second or 0): the one-level canonical decompositions."""
    out = []
    for cp in range(0x110000):
        if HANGUL_FIRST <= cp <= HANGUL_LAST:
            continue
        d = ud.decomposition(chr(cp))
        if not d or d.startswith("<"):
            continue  # none, or a compatibility decomposition
        parts = [int(x, 16) for x in d.split()]
        assert len(parts) in (1, 2), hex(cp)
        out.append((cp, parts[0], parts[1] if len(parts) == 2 else 0))
    return out


def compositions(decomps):
    """(first, second, composite): the primary composites, i.e. the pairs that NFC composes."""
    out = []
    for cp, a, b in decomps:
        # Not excluded: a singleton, a non-starter decomposition or a CompositionExclusions.txt
        # entry would not survive NFC(NFD(cp)).
        if b and ud.normalize("NFC", ud.normalize("NFD", chr(cp))) == chr(cp):
            out.append((a, b, cp))
    return sorted(out)


def class_runs():
    """(first, last, class): runs of equal non-zero canonical combining class."""
    runs = []
    for cp in range(0x110000):
        c = ud.combining(chr(cp))
        if c == 0:
            continue
        if runs and runs[-1][1] == cp - 1 and runs[-1][2] == c:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, c])
    return runs


def ranges(member):
    """[first, last] runs of the code points for which member(cp) holds, sorted."""
    out = []
    for cp in CODE_POINTS:
        if member(cp):
            if out and out[-1][1] == cp - 1:
                out[-1][1] = cp
            else:
                out.append([cp, cp])
    return out


def category(cp):
    return ud.category(chr(cp))


def is_ascii_punctuation(cp):
    """HF's _is_punctuation counts these ASCII symbols ($ + < = > ^ ` | ~) as punctuation too."""
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126


def lower_tables():
    """(runs, specials): str.lower() of each code point. A run [first, last, step, delta] maps
    first, first + step, ... last (step 1 or 2: Latin and Cyrillic alternate capital and small
    letters) to cp + delta, and nothing between them; specials are the code points whose lower
    case is more than one code point (U+0130 -> i U+0307)."""
    runs, specials = [], []
    for cp in CODE_POINTS:
        low = chr(cp).lower()
        if len(low) > 1:
            specials.append((cp, [ord(c) for c in low]))
            continue
        delta = ord(low) - cp
        if delta == 0:
            continue
        if runs:
            first, last, step, d = runs[-1]
            gap = cp - last
            if d == delta and gap in (1, 2) and (first == last or gap == step):
                runs[-1] = [first, cp, gap, delta]
                continue
        runs.append([cp, cp, 1, delta])
    assert all(len(to) <= 3 for cp, to in specials)
    return runs, specials


def sigma_sets():
    """(cased, ignorable): the code points with which CPython's str.lower() applies Final_Sigma
    (a capital sigma after a cased letter, not before one, case-ignorable ones skipped both
    ways), read from its behaviour. The first non-ignorable code point before the sigma must be
    cased, so a code point both cased and ignorable counts as ignorable only."""
    cased = {cp for cp in CODE_POINTS if (chr(cp) + CAPITAL_SIGMA).lower()[-1] == FINAL_SIGMA}
    ignorable = {cp for cp in CODE_POINTS if ("A" + chr(cp) + CAPITAL_SIGMA).lower()[-1] == FINAL_SIGMA} - cased
    # The same sets seen from the other side of the sigma.
    after = {cp for cp in CODE_POINTS if ("A" + CAPITAL_SIGMA + chr(cp)).lower()[1] == SMALL_SIGMA}
    assert after == cased, "cased code points after the sigma differ"
    return cased, ignorable


def emulate_lower(text, mapping, cased, ignorable):
    """unicode_text.cpp's lower(), in Python: `mapping` (the runs and specials, flattened), then
    Final_Sigma from the two sets."""
    def cased_at(i, direction):
        while 0 <= i < len(text) and ord(text[i]) in ignorable:
            i += direction
        return 0 <= i < len(text) and ord(text[i]) in cased

    out = []
    for i, c in enumerate(text):
        if c == CAPITAL_SIGMA and cased_at(i - 1, -1) and not cased_at(i + 1, 1):
            out.append(FINAL_SIGMA)
        else:
            out.append(mapping.get(ord(c), c))
    return "".join(out)


def check_lower(runs, specials, cased, ignorable):
    """The tables give str.lower() on every code point, and on random words around sigmas."""
    mapping = {}
    for first, last, step, delta in runs:
        for cp in range(first, last + 1, step):
            mapping[cp] = chr(cp + delta)
    mapping.update((cp, "".join(map(chr, to))) for cp, to in specials)
    for cp in CODE_POINTS:
        assert mapping.get(cp, chr(cp)) == chr(cp).lower(), hex(cp)
    assert all(cp not in mapping for cp in range(0x80) if not 0x41 <= cp <= 0x5A), "unicode_text.cpp's ASCII path"
    rng = random.Random(0)
    pool = sorted(cased)[::7] + sorted(ignorable)[::5] + [0x20, 0x2E, 0x27, 0x130, 0x10FFFF] + [0x3A3] * 100
    for _ in range(50000):
        word = "".join(chr(rng.choice(pool)) for _ in range(rng.randint(1, 6)))
        assert emulate_lower(word, mapping, cased, ignorable) == word.lower(), ascii(word)


def check_fast_path(decomps, comps):
    """unicode_text.cpp's nfc() returns text below U+0300 unchanged: check that this is exact."""
    for cp in range(0x300):
        assert ud.combining(chr(cp)) == 0
        assert ud.normalize("NFC", chr(cp)) == chr(cp), hex(cp)
    assert all(b >= 0x300 for a, b, c in comps), "a composition whose second code point is below U+0300"


def rows(items, per_line):
    lines = []
    for i in range(0, len(items), per_line):
        lines.append("    " + " ".join(items[i:i + per_line]))
    return "\n".join(lines)


def main():
    assert ud.unidata_version == UNICODE_VERSION, "Python %s has Unicode %s; the Notes say %s" % (
        sys.version.split()[0], ud.unidata_version, UNICODE_VERSION)
    decomps = decompositions()
    comps = compositions(decomps)
    runs = class_runs()
    check_fast_path(decomps, comps)
    lower_runs, lower_specials = lower_tables()
    cased, ignorable = sigma_sets()
    check_lower(lower_runs, lower_specials, cased, ignorable)
    # HF's BasicTokenizer: _is_whitespace (with U+2028/2029, on which str.split() splits),
    # _is_control, _is_punctuation and _run_strip_accents's "Mn".
    classes = [
        ("kSpaces", "Zs, and Zl/Zp (U+2028/2029), on which str.split() splits",
         ranges(lambda cp: category(cp) in ("Zs", "Zl", "Zp"))),
        ("kControls", "C* (Cc, Cf, Cs, Co and unassigned Cn), as HF's _is_control",
         ranges(lambda cp: category(cp).startswith("C"))),
        ("kPunctuation", "ASCII 33-47, 58-64, 91-96, 123-126 and P*, as HF's _is_punctuation",
         ranges(lambda cp: is_ascii_punctuation(cp) or category(cp).startswith("P"))),
        ("kMarks", "Mn, the marks that HF's _run_strip_accents drops",
         ranges(lambda cp: category(cp) == "Mn")),
        ("kCased", "cased and not case-ignorable, for Final_Sigma", ranges(lambda cp: cp in cased)),
        ("kCaseIgnorable", "case-ignorable for Final_Sigma", ranges(lambda cp: cp in ignorable)),
    ]
    h = lambda x: "0x%04X" % x
    out = sys.stdout
    out.write("#pragma once\n")
    out.write("// Generated by tools/gen_unicode_tables.py from Python's unicodedata and str.lower() (Unicode\n")
    out.write("// %s); do not edit. Included by nn/data/unicode_text.cpp only (Note [Unicode normalization],\n"
              % ud.unidata_version)
    out.write("// Note [Unicode coverage]).\n")
    out.write("// clang-format off\n")
    out.write("#include <cstdint>\n\nnamespace frugal::data::unicode::tables {\n\n")
    out.write("struct Decomposition {\n  char32_t cp, first, second;  // second is 0 for a singleton\n};\n")
    out.write("struct Composition {\n  char32_t first, second, composite;\n};\n")
    out.write("struct ClassRun {\n  char32_t first, last;\n  uint8_t combining_class;\n};\n")
    out.write("struct Range {\n  char32_t first, last;\n};\n")
    out.write("struct LowerRun {  // first, first + step, ..., last map to cp + delta\n"
              "  char32_t first, last;\n  int32_t delta;\n  uint8_t step;\n};\n")
    out.write("struct LowerSpecial {  // a lower case of more than one code point\n"
              "  char32_t cp, to[3];\n};\n\n")
    out.write("// The %d one-level canonical decompositions, sorted by code point (Hangul syllables left out).\n"
              % len(decomps))
    out.write("constexpr Decomposition kDecompositions[] = {\n")
    out.write(rows(["{%s, %s, %s}," % (h(c), h(a), h(b)) for c, a, b in decomps], 4) + "\n};\n\n")
    out.write("// The %d primary composites (canonical pairs not excluded from composition), sorted by pair.\n"
              % len(comps))
    out.write("constexpr Composition kCompositions[] = {\n")
    out.write(rows(["{%s, %s, %s}," % (h(a), h(b), h(c)) for a, b, c in comps], 4) + "\n};\n\n")
    out.write("// The %d runs of equal non-zero canonical combining class, sorted; every other code point is 0.\n"
              % len(runs))
    out.write("constexpr ClassRun kCombiningClasses[] = {\n")
    out.write(rows(["{%s, %s, %d}," % (h(a), h(b), c) for a, b, c in runs], 5) + "\n};\n\n")
    for name, what, table in classes:
        out.write("// %s: %s (%d ranges).\n" % (name, what, len(table)))
        out.write("constexpr Range %s[] = {\n" % name)
        out.write(rows(["{%s, %s}," % (h(a), h(b)) for a, b in table], 6) + "\n};\n\n")
    out.write("// str.lower() of the code points it changes into one code point (%d runs).\n"
              % len(lower_runs))
    out.write("constexpr LowerRun kLowerRuns[] = {\n")
    out.write(rows(["{%s, %s, %d, %d}," % (h(a), h(b), d, st) for a, b, st, d in lower_runs], 4) + "\n};\n\n")
    out.write("// str.lower() of the code points it changes into more than one.\n")
    out.write("constexpr LowerSpecial kLowerSpecials[] = {\n")
    out.write(rows(["{%s, {%s}}," % (h(cp), ", ".join(map(h, to))) for cp, to in lower_specials], 4) + "\n};\n\n")
    out.write("}  // namespace frugal::data::unicode::tables\n")
    out.write("// clang-format on\n")


if __name__ == "__main__":
    main()
