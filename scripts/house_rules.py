#!/usr/bin/env python3
"""The house rules a reader relies on, checked over src/:

- no function longer than 80 lines (a table of data aside: a function whose
  body is marked `// house: table` on the line above its `fn`);
- no import loop among the files of one module folder (`store`, `web`, …):
  file A naming `super::b` or `crate::<module>::b` while b names a;
- no file of `web` reaching `store` (the web layer goes through `app`).

Prints what it finds, longest first, and exits 1 if any rule is broken.
Usage: python3 scripts/house_rules.py [--max-lines N]
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
MAX_LINES = 80

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def strip_code(text):
    """The text with comments, strings and char literals blanked out
    (newlines kept), so braces can be counted."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif re.match(r'(?:b?r)(#*)"', text[i:i + 260]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'(?:b?r)(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(?:\\[^']{1,10}|[^\\'])'", text[i:])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(path):
    raw = open(path, encoding="utf-8").read()
    raw_lines = raw.split("\n")
    lines = strip_code(raw).split("\n")
    found = []
    for number, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        if number > 0 and "house: table" in raw_lines[number - 1]:
            continue
        depth, opened, end = 0, False, None
        for k in range(number, len(lines)):
            for ch in lines[k]:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
                elif ch == ";" and not opened and depth == 0:
                    end = k  # a declaration without a body
                    break
            if end is not None or (opened and depth == 0):
                end = k if end is None else end
                break
        if end is None or not opened:
            continue
        length = end - number + 1
        if length > MAX_LINES:
            found.append((length, os.path.relpath(path, ROOT), number + 1, m.group(1)))
    return found


def module_files(folder):
    """file stem → path for the files of one module folder (a `x/mod.rs`
    counts as `x`)."""
    files = {}
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if entry.endswith(".rs") and entry != "mod.rs":
            files[entry[:-3]] = path
        elif os.path.isdir(path):
            inner = os.path.join(path, "mod.rs")
            if os.path.exists(inner):
                files[entry] = inner
    return files


def names_used(path, module, siblings):
    text = strip_code(open(path, encoding="utf-8").read())
    used = set()
    for sibling in siblings:
        pattern = r"(?:\bsuper::|\bcrate::%s::)%s\b" % (module, sibling)
        if re.search(pattern, text):
            used.add(sibling)
        # `use super::{a, b::c}` / `use crate::store::{a, b}`
    for group in re.findall(r"(?:\bsuper|\bcrate::%s)::\{([^}]*)\}" % module, text):
        for name in re.findall(r"\b([a-z_][a-z0-9_]*)\b", group):
            if name in siblings:
                used.add(name)
    return used


def import_loops(module):
    folder = os.path.join(SRC, module)
    files = module_files(folder)
    graph = {name: names_used(path, module, set(files) - {name}) for name, path in files.items()}
    loops, seen = [], set()

    def walk(start, node, trail):
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                cycle = tuple(trail)
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    loops.append(cycle)
            elif nxt not in trail and len(trail) < 6:
                walk(start, nxt, trail + [nxt])

    for name in sorted(graph):
        walk(name, name, [name])
    return loops


def web_reaching_store():
    found = []
    for folder, _, entries in os.walk(os.path.join(SRC, "web")):
        for entry in sorted(entries):
            if entry.endswith(".rs"):
                path = os.path.join(folder, entry)
                text = strip_code(open(path, encoding="utf-8").read())
                if re.search(r"\bcrate::store\b", text):
                    found.append(os.path.relpath(path, ROOT))
    return found


def main():
    global MAX_LINES
    if "--max-lines" in sys.argv:
        MAX_LINES = int(sys.argv[sys.argv.index("--max-lines") + 1])
    broken = False

    functions = []
    for folder, _, entries in os.walk(SRC):
        for entry in entries:
            if entry.endswith(".rs"):
                functions += long_functions(os.path.join(folder, entry))
    functions.sort(reverse=True)
    print(f"house rules: functions in src/ over {MAX_LINES} lines: {len(functions)}")
    for length, path, line, name in functions:
        print(f"  {length:4} lines  {path}:{line}  {name}")
    broken |= bool(functions)

    modules = sorted(
        d for d in os.listdir(SRC) if os.path.isdir(os.path.join(SRC, d))
    )
    for module in modules:
        loops = import_loops(module)
        if loops:
            broken = True
            print(f"house rules: import loops among the files of src/{module}: {len(loops)}")
            for cycle in loops:
                print("  " + " → ".join(cycle + (cycle[0],)))
    print(f"house rules: import loops checked in src/{{{','.join(modules)}}}")

    reaching = web_reaching_store()
    print(f"house rules: files of src/web that reach store: {len(reaching)}")
    for path in reaching:
        print(f"  {path}")
    broken |= bool(reaching)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
