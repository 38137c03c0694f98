#!/usr/bin/env python3
"""Checks that the docs (docs/*.md, README.md) still say what the code does.

    python3 tools/check_docs.py [ROOT]     check the tree at ROOT (default: this repo)
    python3 tools/check_docs.py --self-test  break small trees on purpose, expect each caught
    python3 tools/check_docs.py --graph [ROOT]  print the folder include graph

Exits 1 and prints a table of what drifted; prints one line and exits 0 when nothing did.
The conventions it holds the docs to are in docs/design.md, "Docs"; in short:

  excerpt    A fenced block preceded by `<!-- from: PATH -->` is an excerpt of PATH (from
             the repository root): its lines, stripped of surrounding whitespace, appear
             in PATH in order and contiguously; a line `...` or `// ...` skips source
             lines. Blank lines are ignored on both sides. A blockquote right after a
             paragraph that names a Note is an excerpt of that Note's comment text.
  block      A fenced cpp/c++/cuda block must say what it is: `<!-- from: PATH -->`, or
             `<!-- example -->` (code for the reader to write, not quoted). Blocks in
             other languages (sh, python, none: commands, output, drawings) are not
             excerpts unless marked `from:`.
  example    The files an example block includes (`#include "..."`) exist.
  note       Every reference to a Note, in the docs and in every source file (.h .cpp
             .cu .cuh .py .build .sh), names exactly one definition: a comment line that
             holds only the Note's title in brackets, followed by a comment line of text.
             "Note [X] in FILE" must name the file the definition is in.
  file:line  An error sample's `[file.cpp:N]` names a FRUGAL_CHECK or FRUGAL_FAIL that
             starts at line N (or spans it) in a file of that name, and the check's
             longest string literal appears in the sample.
  link/path  Relative links (and their #anchors) and repository paths written in the
             docs exist.
  name       A backticked code name in the docs (one with `_` or `::`, or camel case)
             occurs in the source.
  section    Citations `(docs/design.md, "Section")` name a heading of docs/design.md;
             nothing cites DESIGN.md.
  layers     No folder includes a folder at its own rank or below it in the layer
             table of docs/design.md, "Layers".
  graph      The include graph quoted in docs/internals.md after
             `<!-- generated: include-graph -->` is the one --graph prints.
"""
import difflib
import os
import re
import shutil
import sys
import tempfile

SOURCE_EXTS = (".h", ".cpp", ".cu", ".cuh", ".py", ".build", ".sh")
EXCERPT_LANGS = {"cpp", "c++", "cuda", "c", "cxx", "h"}
CODE_FOLDERS = ("memory", "tensor", "autograd", "nn", "optim", "parallel", "profiler", "models", "train",
                "tests", "bench", "examples", "tools", "fuzz", "docs")
ELISIONS = {"...", "// ...", "# ..."}
PLACEHOLDER_NOTES = {"...", "Title", "X"}  # "`// Note [Title]`": the syntax, not a Note
NOTE_DEF = re.compile(r"^\s*(?://|#)\s*Note \[([^\]]+)\]\s*$")
COMMENT_TEXT = re.compile(r"^\s*(?://|#)\s*\S")
NOTE_REF = re.compile(r"Note\s+\[([^\]]{1,160}?)\]", re.S)
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*(from|example|generated)\s*:?\s*(.*?)\s*-->\s*$")
LINK = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s]+)\)")
ERROR_SAMPLE = re.compile(r"\[([A-Za-z0-9_.-]+\.(?:h|cpp|cu|cuh)):(\d+)\]")
SECTION_REF = re.compile(r"\(docs/design\.md,\s*\"([^\"]+)\"\)")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([A-Za-z0-9_]+)/')


class Problem:
    def __init__(self, check, where, what):
        self.check, self.where, self.what = check, where, what


# ---- reading the tree ---------------------------------------------------------------

def walk_sources(root):
    """Repository-relative paths of the source files (build folders and dot folders skipped)."""
    out = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and not x.startswith("build")
                         and not (rel == "." and x == "subprojects"))
        for f in sorted(files):
            if f.endswith(SOURCE_EXTS) or f == "meson_options.txt":
                out.append(os.path.normpath(os.path.join(rel, f)))
    return out


def doc_files(root):
    docs = []
    ddir = os.path.join(root, "docs")
    if os.path.isdir(ddir):
        docs = ["docs/" + f for f in sorted(os.listdir(ddir)) if f.endswith(".md")]
    if os.path.exists(os.path.join(root, "README.md")):
        docs.append("README.md")
    return docs


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def strip_comment(line):
    return re.sub(r"^\s*(?://+|#+|\*)\s?", "", line)


def flatten_comments(text):
    """The text with comment markers dropped, so a Note title broken over two comment
    lines reads as one."""
    return "\n".join(strip_comment(l) for l in text.split("\n"))


def normalize_title(t):
    return re.sub(r"\s+", " ", re.sub(r"\n\s*(?:>\s*)?", " ", t)).strip()


# ---- markdown -------------------------------------------------------------------------

class Block:
    def __init__(self, lang, start, lines, marker, indent):
        self.lang, self.start, self.lines, self.marker, self.indent = lang, start, lines, marker, indent


def parse_markdown(text):
    """Fenced blocks (with the marker comment before each) and the prose lines
    (line number, text) outside them."""
    lines = text.split("\n")
    blocks, prose = [], []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            fence, lang = m.group(2), m.group(3).lower()
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            marker = MARKER.match(lines[j]) if j >= 0 and i - j <= 2 else None
            body, k = [], i + 1
            while k < len(lines) and not lines[k].strip().startswith(fence[:3]):
                body.append(lines[k])
                k += 1
            blocks.append(Block(lang, i + 1, body, (marker.group(1), marker.group(2)) if marker else None,
                                len(m.group(1))))
            i = k + 1
            continue
        prose.append((i + 1, lines[i]))
        i += 1
    return blocks, prose


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[`*_~]", "", s)  # emphasis marks vanish (GitHub keeps underscores inside words; close enough)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(text):
    _, prose = parse_markdown(text)
    return [re.sub(r"^#+\s*", "", l).strip() for _, l in prose if re.match(r"^#{1,6}\s", l)]


def backtick_spans(prose):
    """(line, span) for each inline code span of the prose (spans stay on one line)."""
    for n, line in prose:
        for m in re.finditer(r"(`+)(.+?)\1", line):
            yield n, m.group(2).strip()


# ---- the checks -------------------------------------------------------------------------

class Tree:
    def __init__(self, root):
        self.root = root
        self.sources = walk_sources(root)
        self.docs = doc_files(root)
        self.text = {}
        self.self_path = None
        me = os.path.realpath(__file__)
        for rel in self.sources + self.docs:
            if os.path.realpath(os.path.join(root, rel)) == me:
                self.self_path = rel  # this file's patterns would read as references
            self.text[rel] = read(root, rel)
        self.by_base = {}
        for rel in self.sources:
            self.by_base.setdefault(os.path.basename(rel), []).append(rel)
        self._words = None

    def words(self):
        if self._words is None:
            self._words = set()
            for rel in self.sources:
                self._words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", self.text[rel]))
        return self._words


def find_sequence(src, segments, loose_ends=False):
    """Whether the segments (lists of stripped lines) occur in src (list of stripped
    lines) in order, each contiguous; returns (ok, the first excerpt line that could not
    be placed, the source line closest to it). With loose_ends (prose quotes), the
    quote's first line may be the end of a source line and its last line the start of
    one: a quote starts and stops at sentences, not at line breaks."""
    last = (len(segments) - 1, len(segments[-1]) - 1) if segments else None

    def same(si, li, line):
        want = segments[si][li]
        if want == line:
            return True
        if not loose_ends:
            return False
        if (si, li) == (0, 0) and line.endswith(want) and (si, li) != last:
            return True
        if (si, li) == last and line.startswith(want) and (si, li) != (0, 0):
            return True
        return (si, li) == (0, 0) == last and want in line

    def place(segs, si, start):
        if si == len(segs):
            return True
        seg = segs[si]
        for p in range(start, len(src) - len(seg) + 1):
            if all(same(si, li, src[p + li]) for li in range(len(seg))) and place(segs, si + 1, p + len(seg)):
                return True
        return False

    if place(segments, 0, 0):
        return True, None, None
    # The first line that breaks: the longest prefix of the excerpt that still places.
    flat = [(si, li) for si, seg in enumerate(segments) for li in range(len(seg))]
    good = 0
    for k, (si, li) in enumerate(flat, 1):
        if not place(segments[:si] + [segments[si][:li + 1]], 0, 0):
            break
        good = k
    si, li = flat[min(good, len(flat) - 1)]
    bad = segments[si][li]
    close = difflib.get_close_matches(bad, src, n=1, cutoff=0.6)
    return False, bad, close[0] if close else None


def excerpt_segments(lines):
    segments, cur = [], []
    for l in lines:
        s = l.strip()
        if not s:
            continue
        if s in ELISIONS:
            if cur:
                segments.append(cur)
            cur = []
            continue
        cur.append(s)
    if cur:
        segments.append(cur)
    return segments


def short(s, n=70):
    s = s.strip()
    return s if len(s) <= n else s[:n - 3] + "..."


def check_excerpt(tree, doc, where, lines, source, problems):
    path = os.path.normpath(source)
    if path not in tree.text:
        if not os.path.isfile(os.path.join(tree.root, path)):
            problems.append(Problem("excerpt", where, f"names {source}, which does not exist"))
            return
        tree.text[path] = read(tree.root, path)
    src = [l.strip() for l in tree.text[path].split("\n") if l.strip()]
    ok, bad, close = find_sequence(src, excerpt_segments(lines))
    if not ok:
        hint = f'; closest: "{short(close)}"' if close else ""
        problems.append(Problem("excerpt", where, f'not in {path}: "{short(bad)}"{hint}'))


def note_definitions(tree, problems):
    defs = {}
    for rel in tree.sources:
        if rel == tree.self_path:
            continue
        lines = tree.text[rel].split("\n")
        for i, line in enumerate(lines):
            m = NOTE_DEF.match(line)
            if m and i + 1 < len(lines) and COMMENT_TEXT.match(lines[i + 1]) \
                    and not NOTE_DEF.match(lines[i + 1]):
                defs.setdefault(m.group(1).strip(), []).append((rel, i + 1))
    for title, where in sorted(defs.items()):
        if len(where) > 1:
            places = ", ".join(f"{r}:{n}" for r, n in where)
            problems.append(Problem("note", f"{where[0][0]}:{where[0][1]}",
                                    f"Note [{title}] is defined {len(where)} times: {places}"))
    return defs


def note_text(tree, defs, title):
    """The comment lines of a Note's body, markers stripped (up to a blank comment line,
    the next Note or the end of the comment)."""
    rel, n = defs[title][0]
    lines = tree.text[rel].split("\n")
    out = []
    for line in lines[n:]:
        if not re.match(r"^\s*(?://|#)", line) or NOTE_DEF.match(line):
            break
        out.append(strip_comment(line).strip())
    return rel, out


def check_notes(tree, problems):
    defs = note_definitions(tree, problems)
    for rel in tree.sources + tree.docs:
        if rel == tree.self_path:
            continue
        text = tree.text[rel]
        flat = flatten_comments(text) if not rel.endswith(".md") else text
        for m in NOTE_REF.finditer(flat):
            title = normalize_title(m.group(1))
            if title in PLACEHOLDER_NOTES:
                continue
            line = flat.count("\n", 0, m.start()) + 1
            where = f"{rel}:{line}"
            if title not in defs:
                close = difflib.get_close_matches(title, list(defs), n=1, cutoff=0.6)
                hint = f" (did you mean Note [{close[0]}]?)" if close else ""
                problems.append(Problem("note", where, f"Note [{title}] is defined nowhere{hint}"))
                continue
            after = flat[m.end():m.end() + 200]
            named = re.match(r"\s+in\s+(?:\[([^\]]+)\]\([^)]*\)|`([^`]+)`|([\w./-]+\.(?:h|cpp|cu|cuh|py|build)))",
                             after)
            if named:
                said = (named.group(1) or named.group(2) or named.group(3)).strip().rstrip(".,;:)")
                if re.search(r"\.(h|cpp|cu|cuh|py|build)$", said):
                    actual = [r for r, _ in defs[title]]
                    if not any(a == said or a.endswith("/" + said) for a in actual):
                        problems.append(Problem("note", where, f"Note [{title}] is said to be in {said}, "
                                                               f"but it is in {actual[0]}"))
    return defs


def check_file_lines(tree, doc, numbered_lines, problems):
    for n, line in numbered_lines:
        for m in ERROR_SAMPLE.finditer(line):
            base, num = m.group(1), int(m.group(2))
            where = f"{doc}:{n}"
            files = tree.by_base.get(base, [])
            if not files:
                problems.append(Problem("file:line", where, f"[{base}:{num}]: no file named {base}"))
                continue
            verdicts = [throw_at(tree.text[f].split("\n"), num, line) for f in files]
            if any(v is True for v in verdicts):
                continue
            detail = next((v for v in verdicts if isinstance(v, str)), "no FRUGAL_CHECK or FRUGAL_FAIL there")
            near = nearest_throw(tree, files, line)
            hint = f"; the message is thrown at {near}" if near else ""
            problems.append(Problem("file:line", where, f"[{base}:{num}]: {detail}{hint}"))


def invocation(lines, start):
    """The text of the macro call that starts on lines[start] (0-based), and its last line."""
    depth, text, began = 0, [], False
    for k in range(start, min(len(lines), start + 20)):
        seg = lines[k] if k > start else lines[k][lines[k].find("FRUGAL_"):]
        text.append(seg)
        for ch in re.sub(r'"(?:\\.|[^"\\])*"', '""', seg):
            if ch == "(":
                depth += 1
                began = True
            elif ch == ")":
                depth -= 1
        if began and depth <= 0:
            return "\n".join(text), k
    return "\n".join(text), start


def literals(call):
    return [bytes(s, "utf-8").decode("unicode_escape", errors="ignore")
            for s in re.findall(r'"((?:\\.|[^"\\])*)"', call)]


def throw_at(lines, num, sample):
    """True when a check that starts at line num (or spans it) matches the sample."""
    for start in range(num - 1, max(-1, num - 6), -1):
        if start >= len(lines) or not re.search(r"\bFRUGAL_(?:CHECK|FAIL)\s*\(", lines[start]):
            continue
        call, last = invocation(lines, start)
        if last < num - 1:
            continue
        lits = [s for s in literals(call) if len(s.strip()) >= 4]
        if not lits or max(lits, key=len).strip() in sample:
            return True
        return f"the check there says \"{short(max(lits, key=len), 40)}\", not in the sample"
    return None


def nearest_throw(tree, files, sample):
    for f in files:
        lines = tree.text[f].split("\n")
        for i, l in enumerate(lines):
            if re.search(r"\bFRUGAL_(?:CHECK|FAIL)\s*\(", l):
                lits = [s for s in literals(invocation(lines, i)[0]) if len(s.strip()) >= 8]
                if lits and max(lits, key=len).strip() in sample:
                    return f"{f}:{i + 1}"
    return None


def check_links(tree, doc, text, prose, problems):
    ddir = os.path.dirname(doc)
    for n, line in prose:
        for m in LINK.finditer(line):
            target = m.group(2)
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(ddir, path)) if path else doc
            where = f"{doc}:{n}"
            if path and not os.path.exists(os.path.join(tree.root, full)):
                problems.append(Problem("link", where, f"{target}: {full} does not exist"))
                continue
            if anchor and full.endswith(".md"):
                body = tree.text.get(full) or read(tree.root, full)
                if anchor not in {slug(h) for h in headings(body)}:
                    problems.append(Problem("link", where, f"{target}: no heading #{anchor} in {full}"))


PATHLIKE = re.compile(r"^(?:%s)/[A-Za-z0-9_./-]*$" % "|".join(CODE_FOLDERS))
BARE_PATH = re.compile(r"(?<![\w./`-])((?:%s)/[A-Za-z0-9_./-]*\.(?:h|cpp|cu|cuh|py|build|sh|md))(?![\w/])"
                       % "|".join(CODE_FOLDERS))


def check_paths(tree, doc, prose, problems):
    seen = set()
    for n, span in backtick_spans(prose):
        tok = span.split()[0] if span.split() else ""
        tok = tok.rstrip(".,;:")
        if PATHLIKE.match(tok) and (n, tok) not in seen:
            seen.add((n, tok))
            if not os.path.exists(os.path.join(tree.root, tok)):
                problems.append(Problem("path", f"{doc}:{n}", f"`{tok}` does not exist"))
    for n, line in prose:
        line = LINK.sub(lambda m: m.group(1), line)  # link texts are checked with their links
        for m in BARE_PATH.finditer(re.sub(r"`[^`]*`", "", line)):
            tok = m.group(1).rstrip(".")
            if not os.path.exists(os.path.join(tree.root, tok)):
                problems.append(Problem("path", f"{doc}:{n}", f"{tok} does not exist"))


CODE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def code_like(word):
    return ("_" in word.strip("_") or re.match(r"^[A-Z][a-z0-9]+[A-Z]", word) is not None
            or re.match(r"^[a-z]+[A-Z]", word) is not None or re.match(r"^k[A-Z]", word) is not None)


def check_names(tree, doc, prose, problems):
    words = tree.words()
    for n, span in backtick_spans(prose):
        if PATHLIKE.match(span.split()[0] if span.split() else "") or span.startswith(("--", "-D", "build/")):
            continue
        for w in CODE_NAME.findall(re.sub(r'"[^"]*"', "", span)):
            if code_like(w) and w not in words:
                problems.append(Problem("name", f"{doc}:{n}", f"`{short(span, 50)}`: {w} occurs nowhere in the source"))


def check_sections(tree, problems):
    design = "docs/design.md"
    titles = set(headings(tree.text[design])) if design in tree.text else set()
    for rel in tree.sources + tree.docs:
        if rel == tree.self_path:
            continue
        text = tree.text[rel]
        for m in SECTION_REF.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            if design not in tree.text:
                problems.append(Problem("section", f"{rel}:{line}", f"cites {design}, which does not exist"))
            elif m.group(1) not in titles:
                problems.append(Problem("section", f"{rel}:{line}",
                                        f"cites (docs/design.md, \"{m.group(1)}\"): no such heading"))
        for m in re.finditer(r"(?<![\w/])DESIGN\.md", text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(Problem("section", f"{rel}:{line}",
                                    "cites DESIGN.md, which is not in the project (cite docs/design.md, \"Section\")"))


# ---- layers ------------------------------------------------------------------------------

def layer_table(tree, problems):
    """{folder: rank} from the table under docs/design.md's "Layers" heading: rows
    `| rank | `folder/` ... |`."""
    text = tree.text.get("docs/design.md", "")
    m = re.search(r"^## Layers\s*$(.*?)(?=^## )", text + "\n## ", re.M | re.S)
    ranks = {}
    if m:
        for row in re.finditer(r"^\|\s*(\d+)\s*\|\s*([^|]+)\|", m.group(1), re.M):
            for folder in re.findall(r"`([a-z_]+)/`", row.group(2)):
                ranks[folder] = int(row.group(1))
    if not ranks:
        problems.append(Problem("layers", "docs/design.md", 'no layer table under "## Layers" '
                                                            "(rows: | rank | `folder/` ... |)"))
    return ranks


def include_graph(tree, ranks):
    edges = {}
    where = {}
    for rel in tree.sources:
        if not rel.endswith((".h", ".cpp", ".cu", ".cuh")):
            continue
        folder = rel.split("/")[0]
        for i, line in enumerate(tree.text[rel].split("\n")):
            m = INCLUDE.match(line)
            if m and m.group(1) != folder and m.group(1) in ranks:
                edges.setdefault(folder, set()).add(m.group(1))
                where.setdefault((folder, m.group(1)), f"{rel}:{i + 1}")
    return edges, where


def graph_text(tree, ranks):
    edges, _ = include_graph(tree, ranks)
    order = sorted(ranks, key=lambda f: (ranks[f], list(ranks).index(f)))
    width = max(len(f) for f in order) + 2
    out = []
    for f in order:
        if not os.path.isdir(os.path.join(tree.root, f)):
            continue
        targets = sorted(edges.get(f, ()), key=lambda t: (-ranks[t], order.index(t)))
        out.append(f"{f + '/':<{width}} -> " + (" ".join(t + "/" for t in targets) if targets else "(nothing)"))
    return out


def check_layers(tree, problems):
    ranks = layer_table(tree, problems)
    if not ranks:
        return
    for d in sorted(os.listdir(tree.root)):
        if d in CODE_FOLDERS and d not in ranks and d != "docs" and os.path.isdir(os.path.join(tree.root, d)):
            problems.append(Problem("layers", "docs/design.md", f"folder {d}/ is missing from the layer table"))
    edges, where = include_graph(tree, ranks)
    for src, targets in sorted(edges.items()):
        for t in sorted(targets):
            if src in ranks and ranks[t] >= ranks[src]:
                problems.append(Problem("layers", where[(src, t)],
                                        f"{src}/ (rank {ranks[src]}) includes {t}/ (rank {ranks[t]}): "
                                        "a folder includes only folders above it"))
    doc = "docs/internals.md"
    if doc in tree.text:
        blocks, _ = parse_markdown(tree.text[doc])
        for b in blocks:
            if b.marker and b.marker[0] == "generated" and b.marker[1] == "include-graph":
                want = graph_text(tree, ranks)
                have = [l.rstrip() for l in b.lines if l.strip()]
                if have != want:
                    diff = [l for l in difflib.unified_diff(have, want, lineterm="", n=0)
                            if l[:1] in "+-" and l[:3] not in ("+++", "---")]
                    problems.append(Problem("graph", f"{doc}:{b.start}",
                                            "include graph is stale (tools/check_docs.py --graph prints it): "
                                            + "; ".join(diff[:4])))


# ---- the docs ------------------------------------------------------------------------------

def check_doc(tree, doc, defs, problems):
    text = tree.text[doc]
    blocks, prose = parse_markdown(text)
    for b in blocks:
        where = f"{doc}:{b.start}"
        kind, arg = b.marker if b.marker else (None, "")
        if kind == "from":
            check_excerpt(tree, doc, where, b.lines, arg, problems)
        elif kind == "example":
            for k, line in enumerate(b.lines):  # what the reader is told to include exists
                m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
                if m and not os.path.isfile(os.path.join(tree.root, m.group(1))):
                    problems.append(Problem("example", f"{doc}:{b.start + 1 + k}",
                                            f'#include "{m.group(1)}": no such file'))
        elif kind == "generated":
            pass
        elif b.lang in EXCERPT_LANGS:
            problems.append(Problem("block", where, f"```{b.lang} block says neither where it is from "
                                                    "(<!-- from: PATH -->) nor that it is an example (<!-- example -->)"))
    # Blockquotes: excerpts of the Note the paragraph before them names.
    lines = text.split("\n")
    prose_nums = {n for n, _ in prose}
    i = 0
    while i < len(lines):
        if i + 1 in prose_nums and lines[i].startswith(">"):
            j = i
            while j < len(lines) and lines[j].startswith(">"):
                j += 1
            quote = [l[1:].strip() for l in lines[i:j]]
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            para = []
            while k >= 0 and lines[k].strip():
                para.insert(0, lines[k])
                k -= 1
            marker = MARKER.match(lines[i - 1]) if i > 0 else None
            titles = [normalize_title(t) for t in NOTE_REF.findall("\n".join(para))]
            where = f"{doc}:{i + 1}"
            if marker and marker.group(1) == "from":
                check_excerpt(tree, doc, where, quote, marker.group(2), problems)
            elif titles and titles[-1] in defs:
                rel, body = note_text(tree, defs, titles[-1])
                src = [l for l in body if l]
                segs = excerpt_segments(quote)
                ok, bad, close = find_sequence(src, segs, loose_ends=True)
                if not ok:
                    hint = f'; closest: "{short(close)}"' if close else ""
                    problems.append(Problem("excerpt", where,
                                            f'not in Note [{titles[-1]}] ({rel}): "{short(bad)}"{hint}'))
            i = j
            continue
        i += 1
    check_file_lines(tree, doc, list(enumerate(lines, 1)), problems)  # samples sit in blocks too
    check_links(tree, doc, text, prose, problems)
    check_paths(tree, doc, prose, problems)
    check_names(tree, doc, prose, problems)


def check(root):
    tree = Tree(root)
    problems = []
    defs = check_notes(tree, problems)
    for doc in tree.docs:
        check_doc(tree, doc, defs, problems)
    check_sections(tree, problems)
    check_layers(tree, problems)
    return tree, problems, defs


def table(problems):
    rows = [("check", "where", "what drifted")] + [(p.check, p.where, p.what) for p in problems]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    out = []
    for i, r in enumerate(rows):
        out.append(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}")
        if i == 0:
            out.append(f"{'-' * w0}  {'-' * w1}  {'-' * 12}")
    return "\n".join(out)


# ---- self-test ------------------------------------------------------------------------------

def self_test():
    """Builds a small tree that passes, then breaks it one way at a time and expects the
    matching check to fire."""
    N = "Note"  # spelled apart so this file holds no reference of its own
    files = {
        "docs/design.md": "# design\n\n## Layers\n\n| rank | folder | holds |\n|---|---|---|\n"
                          "| 0 | `memory/` | errors |\n| 1 | `tensor/` | ops |\n\n## Errors\n\nText.\n",
        "memory/error.h": f"#pragma once\n// Errors (docs/design.md, \"Errors\").\n//\n// {N} [Alpha rule]\n"
                          "// Every failure throws.\n// It names the op.\n#define FRUGAL_CHECK(c, ...) x\n",
        "tensor/op.cpp": '#include "memory/error.h"\n\nvoid op_kernel(int a) {\n'
                         f'  // see {N} [Alpha rule] in memory/error.h\n'
                         '  FRUGAL_CHECK(a > 0, "op: expected a positive size, got ", a);\n'
                         '  int b = a;\n  int c = b;\n}\n',
        "docs/internals.md": "# internals\n\nSee [the op](../tensor/op.cpp) and `tensor/op.cpp`, "
                             f"`op_kernel`, {N} [Alpha rule]:\n\n> Every failure throws.\n> It names\n\n"
                             "<!-- from: tensor/op.cpp -->\n```cpp\nvoid op_kernel(int a) {\n  ...\n"
                             "  int b = a;\n```\n\n<!-- example -->\n```cpp\n#include \"memory/error.h\"\nop_kernel(3);\n```\n\n"
                             "```\nop: expected a positive size, got -1  [op.cpp:5]\n```\n\n"
                             "<!-- generated: include-graph -->\n```\nmemory/  -> (nothing)\n"
                             "tensor/  -> memory/\n```\n",
    }
    breaks = [
        ("excerpt", "docs/internals.md", "  int b = a;", "  int b = 2 * a;"),
        ("excerpt", "docs/internals.md", "> Every failure throws.", "> Every failure returns."),
        ("block", "docs/internals.md", "<!-- example -->\n", ""),
        ("note", "docs/internals.md", f"{N} [Alpha rule]:", f"{N} [Beta rule]:"),
        ("note", "tensor/op.cpp", f"{N} [Alpha rule] in memory/error.h", f"{N} [Alpha rule] in tensor/op.h"),
        ("note", "tensor/op.cpp", "  int c = b;\n", f"  int c = b;\n// {N} [Alpha rule]\n// Again.\n"),
        ("file:line", "docs/internals.md", "[op.cpp:5]", "[op.cpp:6]"),
        ("file:line", "docs/internals.md", "positive size, got -1", "negative size, got -1"),
        ("link", "docs/internals.md", "(../tensor/op.cpp)", "(../tensor/gone.cpp)"),
        ("path", "docs/internals.md", "`tensor/op.cpp`", "`tensor/gone.cpp`"),
        ("name", "docs/internals.md", "`op_kernel`", "`op_kernels`"),
        ("section", "memory/error.h", '"Errors"', '"Mistakes"'),
        ("section", "memory/error.h", '(docs/design.md, "Errors")', "(DESIGN.md)"),
        ("layers", "memory/error.h", "#pragma once\n", '#pragma once\n#include "tensor/op.h"\n'),
        ("graph", "docs/internals.md", "tensor/  -> memory/", "tensor/  -> (nothing)"),
        ("example", "docs/internals.md", "#include \"memory/error.h\"", "#include \"tensor/op.h\""),
        ("excerpt", "memory/error.h", "// It names the op.", "// It lists the op."),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        def build(mutation=None):
            shutil.rmtree(tmp)
            for rel, body in files.items():
                if mutation and mutation[1] == rel:
                    assert mutation[2] in body, mutation
                    body = body.replace(mutation[2], mutation[3], 1)
                os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
                with open(os.path.join(tmp, rel), "w") as f:
                    f.write(body)
            return check(tmp)[1]

        clean = build()
        if clean:
            print("self-test: the unbroken tree fails:\n" + table(clean))
            failures += 1
        for b in breaks:
            got = build(b)
            kinds = {p.check for p in got}
            ok = b[0] in kinds
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {b[0]:<9} {b[1]}: {short(b[2], 30)!r} -> {short(b[3], 30)!r}"
                  + ("" if ok else f"  (got: {sorted(kinds) or 'nothing'})"))
    print(f"self-test: {'the unbroken tree passes' if not clean else 'the unbroken tree FAILS'}; "
          f"{sum(1 for _ in breaks) - (failures - (1 if clean else 0))} of {len(breaks)} breaks caught")
    return 1 if failures else 0


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if "--self-test" in argv:
        return self_test()
    if "--graph" in argv:
        tree = Tree(root)
        print("\n".join(graph_text(tree, layer_table(tree, []))))
        return 0
    tree, problems, defs = check(root)
    if problems:
        print(f"check_docs: {len(problems)} statements in the docs no longer match the code\n")
        print(table(problems))
        return 1
    nblocks = sum(1 for d in tree.docs for b in parse_markdown(tree.text[d])[0] if b.marker and b.marker[0] == "from")
    print(f"check_docs: {len(tree.docs)} docs agree with the code ({nblocks} excerpts, {len(defs)} Notes, "
          f"{len(tree.sources)} source files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
