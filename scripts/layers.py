#!/usr/bin/env python3
"""Prints kiln's module import graph and fails on a cycle or an upward import.

    scripts/layers.py            # from anywhere; exits 1 on a violation

Each top-level module of src/ (a folder or a file: `weights`, `iree`, ...)
stands on one floor of FLOORS, in pipeline order; the binary (main.rs) is
the top floor. A module may import (`crate::m::...`, `kiln::m::...` in
main.rs) only modules on lower floors: an import from its own floor or a
higher one is an error, and so is a module missing from FLOORS. With
every import going down a floor, the graph has no cycle. Paths within a
module (`super::`, `self::`) are its own business; lib.rs's own items
(`crate::peak_rss`) are the floor-0 module `lib`, its re-exports the
modules they come from.

Test code (`#[cfg(test)]` items and the files they declare) may reach up:
a test of a layer may check it through the layers above it (IREE, the
interpreter). Its edges are printed apart and never fail.
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

# Lowest first. A floor's modules import only from the floors below it.
FLOORS = [
    ["atomic", "lib"],  # crash-safe file writes, which every writer uses; lib.rs's own items
    ["weights", "iree"],  # data: checkpoints, parameter archives, element and tensor types; the IREE tools
    ["graph", "tokenizer"],  # the IR; text to token ids
    ["trace", "interp"],  # building graphs; running them on the CPU
    ["lower", "npy"],  # graphs to StableHLO, weights to util.globals; values as .npy files
    ["check", "inspect"],  # IREE against the interpreter; what a file holds
    ["models"],  # the front-ends
    ["export"],  # a checkpoint to a directory, compiled and run
    ["main"],  # the CLI
]

SRC = Path(__file__).resolve().parent.parent / "src"


def strip(text):
    """`text` without comments and string literals, lines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if text[i] == "\n" else "")
                    i += 1
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and (m := re.compile(r"'(\\.|[^\\'])'").match(text, i)):
            out.append("' '")
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(text, open_brace):
    """The index after the brace that closes the one at `open_brace`."""
    depth = 0
    for j in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    return len(text)


CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*")
TEST_MOD_FILE = re.compile(r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")


def split_tests(text):
    """(library code, test code, names of `#[cfg(test)] mod x;` files)."""
    lib, test, test_mods, i = [], [], [], 0
    for m in CFG_TEST.finditer(text):
        if m.start() < i:
            continue
        lib.append(text[i : m.start()])
        if f := TEST_MOD_FILE.match(text, m.end()):
            test_mods.append(f.group(1))
            i = f.end()
            continue
        semi, brace = text.find(";", m.end()), text.find("{", m.end())
        end = semi + 1 if brace < 0 or 0 <= semi < brace else block_end(text, brace)
        test.append(text[m.end() : end])
        i = end
    lib.append(text[i:])
    return "".join(lib), "".join(test), test_mods


def module_of(path):
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def root_items():
    """Crate-root names and the module each stands for: `pub use m::{a, b}`
    re-exports, and `lib` for the items lib.rs defines itself."""
    lib = strip((SRC / "lib.rs").read_text())
    items = {}
    for m in re.finditer(r"pub use (\w+)::\{?([\w\s,]+)\}?;", lib):
        for name in m.group(2).replace(",", " ").split():
            items[name] = m.group(1)
    for m in re.finditer(r"pub(?:\([^)]*\))? fn (\w+)", lib):
        items[m.group(1)] = "lib"
    return items


def main():
    floor = {m: i for i, mods in enumerate(FLOORS) for m in mods}
    root = root_items()
    test_files = set()
    edges = {"lib": defaultdict(set), "test": defaultdict(set)}
    files = sorted(p for p in SRC.rglob("*.rs") if p.name != "lib.rs")
    texts = {p: strip(p.read_text()) for p in files}
    # `#[cfg(test)] mod x;` makes x.rs (or x/mod.rs) test code.
    for p, text in texts.items():
        for name in split_tests(text)[2]:
            here = p.parent if p.name in ("mod.rs", "main.rs") else p.parent / p.stem
            test_files.update({here / f"{name}.rs", here / name / "mod.rs"})
    for p, text in texts.items():
        lib, test, _ = split_tests(text)
        if p in test_files or any(d / "mod.rs" in test_files for d in p.parents):
            lib, test = "", text
        prefix = "kiln" if p.name == "main.rs" and p.parent == SRC else "crate"
        src = module_of(p)
        for kind, code in (("lib", lib), ("test", test)):
            for m in re.finditer(rf"\b{prefix}::(\w+)", code):
                dst = root.get(m.group(1), m.group(1))
                if dst != src:
                    edges[kind][(src, dst)].add(p.relative_to(SRC.parent).as_posix())

    errors = []
    modules = {module_of(p) for p in files} | {"lib"}
    for (a, b), where in sorted({**edges["lib"], **edges["test"]}.items()):
        if b not in modules:
            errors.append(f"{a} names crate::{b}, which is no module of src/ in {', '.join(sorted(where))}")
    for m in sorted(modules - floor.keys()):
        errors.append(f"module {m} is on no floor: add it to FLOORS in {Path(__file__).name}")
    for (a, b), where in sorted(edges["lib"].items()):
        if a in floor and b in floor and floor[b] >= floor[a]:
            side = "its own floor" if floor[b] == floor[a] else f"floor {floor[b]}, above its {floor[a]}"
            errors.append(f"{a} imports {b} ({side}) in {', '.join(sorted(where))}")

    for i, mods in enumerate(FLOORS):
        print(f"floor {i}: {', '.join(mods)}")
        for m in mods:
            deps = sorted({b for (a, b) in edges["lib"] if a == m}, key=lambda b: (floor.get(b, -1), b))
            tests = sorted({b for (a, b) in edges["test"] if a == m} - set(deps), key=lambda b: (floor.get(b, -1), b))
            line = f"  {m} -> {', '.join(deps) or '(nothing)'}"
            if tests:
                line += f"   [tests also: {', '.join(tests)}]"
            print(line)
    if errors:
        print(f"\n{len(errors)} violation(s):", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    n = len(edges["lib"])
    print(f"\nok: {n} imports between {len(modules)} modules, each from a lower floor; no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
