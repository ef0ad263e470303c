#!/usr/bin/env python3
"""Lists the functions longer than a limit (120 lines by default) in C++ sources.

Usage: scripts/long_functions.py [--max N] [--all] [paths...]
       (paths default to lib tools include; folders are searched for *.h, *.cc, *.cu)

Counts braces, so it needs no compiler: comments, string and character literals (raw strings
too) and preprocessor lines are blanked first, then every brace block opened outside a
function body, namespace, class, struct, union, enum or `extern "C"` block is taken as a
function (or an initialised variable, such as a table) and measured from the first line of
its declaration to its closing brace. A brace in a constructor's initialiser list (`x_{1}`)
is skipped. Exits 1 when a function is over the limit, so a check can call it.
"""

import argparse
import os
import re
import sys

SCOPE_KEYWORDS = re.compile(r"^(?:template\s*<.*>\s*)?(?:namespace|class|struct|union|enum)\b|"
                            r"^extern\s+\"\s*\"|^\s*$")


def blank(text):
    """Returns text with comments, literals and preprocessor lines replaced by spaces.

    Newlines are kept, so offsets map to the same line numbers."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":
            # A preprocessor line, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        at_line_start = False
        if c == "\n":
            at_line_start = True
            out.append(c)
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and (i == 0 or not (
                text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                # A digit separator (1'000'000), not a character literal.
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def name_of(header):
    """The name a block's declaration gives: the identifier before its first parenthesis
    (operators and qualified names included), else before `=`."""
    h = " ".join(header.split())
    m = re.search(r"((?:[\w~]+::)*(?:operator\s*[^\s(]+|[\w~]+))\s*(?:<[^()]*>)?\s*\(", h)
    if m and "=" not in h[:m.start()]:
        return m.group(1)
    m = re.search(r"([\w:]+)\s*(?:\[[^\]]*\])?\s*=", h)
    if m:
        return m.group(1)
    return h[:60]


def functions(path):
    """Yields (name, first line, last line) of every top-level block in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = blank(f.read())
    line_starts = [0]
    for m in re.finditer("\n", text):
        line_starts.append(m.end())

    def line_of(offset):
        lo, hi = 0, len(line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    header_start = 0  # where the declaration in front of the next brace starts
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in ";}":
            header_start = i + 1
            i += 1
        elif c == "{":
            header = text[header_start:i]
            stripped = header.strip()
            if SCOPE_KEYWORDS.search(stripped):
                # A namespace or class: its members are read at this level.
                header_start = i + 1
                i += 1
                continue
            if re.search(r"\)\s*(?:const\s*)?(?:noexcept\s*)?:[^:]", stripped) and re.search(
                    r"[\w>]$", stripped):
                # A brace initialiser in a constructor's initialiser list.
                i = skip_block(text, i)
                continue
            end = skip_block(text, i)
            first = header_start + (len(header) - len(header.lstrip()))
            yield name_of(header), line_of(first), line_of(max(end - 1, i))
            header_start = end
            i = end
        else:
            i += 1


def skip_block(text, i):
    """Returns the offset after the brace that closes the one at i."""
    depth = 0
    n = len(text)
    while i < n:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def sources(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, dirs, files in os.walk(p):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".h", ".cc", ".cu", ".cpp", ".hpp")):
                    yield os.path.join(root, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=120, help="longest allowed (lines)")
    parser.add_argument("--all", action="store_true", help="list every function, sorted")
    parser.add_argument("paths", nargs="*", default=["lib", "tools", "include"])
    args = parser.parse_args()
    found = []
    for path in sources(args.paths):
        for name, first, last in functions(path):
            length = last - first + 1
            if args.all or length > args.max:
                found.append((length, path, first, name))
    found.sort(key=lambda f: (-f[0], f[1], f[2]))
    for length, path, first, name in found:
        print(f"{length:5d}  {path}:{first}  {name}")
    return 1 if any(f[0] > args.max for f in found) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # piped into head
        sys.exit(0)
