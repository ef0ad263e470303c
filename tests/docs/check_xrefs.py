#!/usr/bin/env python3
"""Cross-reference check of the documentation (registered by tests/docs.cmake as docs_xref).

Checks README.md, CONTRIBUTING.md and docs/*.md under ROOT:
  - every Markdown link [text](path#anchor) that is not a URL names a file or folder that exists
    (relative to the linking file, as GitHub resolves it) and, with #anchor into a Markdown file,
    a heading of that file (GitHub's anchor of the heading text);
  - every backticked repository path (`lib/core/`, `docs/gpu.md`: a token that starts with one of
    ROOT's top-level folders) names a file or folder that exists, relative to ROOT; tokens with
    placeholders or globs (`lib/<name>/`, `tests/*.cmake`) are left alone;
  - every `see "Heading"` / `see FILE, "Heading"` names a heading of that file (default: this one),
    and a bare `see Heading)` (capitalized words after "see", up to punctuation) a heading of this
    file or of another checked file.
Fenced code blocks are not checked. Prints every broken reference as FILE:LINE: what is wrong, and
exits 1 if there is one.

Usage: check_xrefs.py ROOT
"""
import os
import re
import sys

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`]+)`")
SEE_HEADING = re.compile(r'\bsee\s+(?:`?([\w./-]+\.md)`?,?\s+)?"([^"]+)"', re.IGNORECASE)
SEE_BARE = re.compile(r"\bsee ([A-Z][\w-]*(?: [A-Za-z][\w-]*){0,5})(?=[).,;:]|$)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
PLACEHOLDER = re.compile(r"[<>*?{}|$\s]|\.\.\.")


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    out = []
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                out.append((number, line.rstrip("\n")))
    return out


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        result = set()
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = result
    return _anchors[path]


def check_file(root, rel, top_dirs, all_files, errors):
    path = os.path.join(root, rel)
    here = os.path.dirname(path)

    def fail(number, what):
        errors.append(f"{rel}:{number}: {what}")

    def check_anchor(number, target_path, anchor, shown):
        if not target_path.endswith(".md") or not os.path.isfile(target_path):
            return
        if anchor not in anchors(target_path):
            target_rel = os.path.relpath(target_path, root)
            fail(number, f"{shown}: no heading with anchor '#{anchor}' in {target_rel}")

    for number, line in prose_lines(path):
        # Backticked repository paths (checked before code spans are blanked for the links).
        for m in INLINE_CODE.finditer(line):
            token = m.group(1).strip()
            first = token.split("/", 1)[0]
            if "/" not in token or first not in top_dirs or PLACEHOLDER.search(token):
                continue
            token = token.split(":", 1)[0].split("#", 1)[0]
            if not os.path.exists(os.path.join(root, token)):
                fail(number, f"`{m.group(1)}`: no such file or folder in the repository")
        text = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        for m in LINK.finditer(text):
            target = m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            target_path = os.path.normpath(os.path.join(here, file_part)) if file_part else path
            if os.path.relpath(target_path, root).split(os.sep)[0] == "..":
                fail(number, f"link to '{target}' leaves the repository")
                continue
            if not os.path.exists(target_path):
                fail(number, f"link to '{target}': no such file or folder")
                continue
            if anchor:
                check_anchor(number, target_path, anchor, f"link to '{target}'")
        for m in SEE_HEADING.finditer(line):
            named, heading = m.group(1), m.group(2)
            if named:
                target_path = os.path.normpath(os.path.join(root, named))
                if not os.path.isfile(target_path):
                    target_path = os.path.normpath(os.path.join(here, named))
                if not os.path.isfile(target_path):
                    fail(number, f'see {named}, "{heading}": no such file')
                    continue
            else:
                target_path = path
            check_anchor(number, target_path, slug(heading), f'see "{heading}"')
        for m in SEE_BARE.finditer(text):
            heading = m.group(1)
            if not any(slug(heading) in anchors(os.path.join(root, f)) for f in [rel] + all_files):
                fail(number, f"see {heading}: no heading '{heading}' in {rel} or any other "
                             "checked file (quote it as a link: [text](file.md#anchor))")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    top_dirs = {e for e in os.listdir(root)
                if os.path.isdir(os.path.join(root, e)) and not e.startswith("build")
                and e != ".git"}
    files = [f for f in ("README.md", "CONTRIBUTING.md") if os.path.isfile(os.path.join(root, f))]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += sorted(os.path.join("docs", f) for f in os.listdir(docs) if f.endswith(".md"))
    errors = []
    for rel in files:
        check_file(root, rel, top_dirs, files, errors)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} broken cross-reference(s) in {len(files)} file(s)")
        return 1
    print(f"cross-references ok in {len(files)} file(s): {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
