#!/usr/bin/env python3
"""Fails when a StableHLO constraint that kiln's shape rules name has no lit test.

    scripts/constraint_tests.py   # from anywhere; exits 1 on a constraint without a test

src/graph/ops names a spec constraint (docs/spec.md of openxla/stablehlo)
two ways:
  - a tag in a comment: `// dot_general_c10`, `/// reshape_c1 (same element
    type)`, `/// compare_c1..c3` (a range names its first constraint);
  - the rule of an error: `ShapeError::new("gather", "C13", ...)`, or a
    helper given the op and the rule, `same_dtype("pad", "C1", ...)`; an
    `op` argument is the op of `let op = "...";` in the function. A rule a
    whole family shares (the op is a parameter: `infer_binary(op, ...)`) is
    named by its function's comment tags (`add_c1 and friends`).
A constraint `op_cN` is covered when a file under test/lit expects an error
of `op (CN)`, the text kiln prints (`node %y: dot_general (C10): ...`).
kiln's own rules (`"kiln"`) are not spec constraints and are not listed.

EXCEPTIONS names the constraints no graph text can break, with the reason;
one that gets a test, or whose tag goes away, must leave the list.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS = ROOT / "src" / "graph" / "ops"
LIT = ROOT / "test" / "lit"

# Rules on the result type: kiln infers the result type from the operands
# and attributes, so graph text cannot break them; a declared type that
# differs fails as kiln's own result-type error (error-wrong-result-type.kiln).
RESULT_TYPE = "a rule on the result type, which kiln infers"
EXCEPTIONS = {
    "dynamic_slice_c1": RESULT_TYPE + " (the operand's element type)",
    "dynamic_update_slice_c1": RESULT_TYPE + " (the operand's type)",
    "transpose_c4": RESULT_TYPE + " (the operand's dims, permuted)",
    "reduce_c8": RESULT_TYPE + " (the reduced dims dropped)",
    "dot_general_c12": RESULT_TYPE + " (batch dims, then the free dims of lhs, then of rhs)",
}

COMMENT_TAG = re.compile(r"\b([a-z][a-z0-9_]*?)_c(\d+)\b")
# `f("op", "C3"` or `f(op, "C3"`: ShapeError::new and the helpers taking (op, rule).
RULE_CALL = re.compile(r'\b\w+\(\s*(?:"(\w+)"|(\w+))\s*,\s*"C(\d+)"')
LET_OP = re.compile(r'\blet op = "(\w+)";')


def tags():
    """{`op_cN`: [where it is named]} for src/graph/ops."""
    found = {}
    for path in sorted(OPS.glob("*.rs")):
        text = path.read_text()
        rel = path.relative_to(ROOT).as_posix()
        for lineno, line in enumerate(text.splitlines(), 1):
            comment = line.find("//")
            if comment >= 0:
                for m in COMMENT_TAG.finditer(line[comment:]):
                    found.setdefault(f"{m.group(1)}_c{m.group(2)}", []).append(f"{rel}:{lineno}")
        for m in RULE_CALL.finditer(text):
            op = m.group(1)
            if op is None and m.group(2) == "op":
                fn = text.rfind("fn ", 0, m.start())
                lets = LET_OP.findall(text, fn, m.start())
                op = lets[-1] if lets else None
            if op is not None:
                lineno = text.count("\n", 0, m.start()) + 1
                found.setdefault(f"{op}_c{m.group(3)}", []).append(f"{rel}:{lineno}")
    return found


def main():
    expected = "\n".join(p.read_text() for p in sorted(LIT.iterdir()) if p.suffix in (".kiln", ".test"))
    named = tags()
    errors = []
    covered = 0
    for tag in sorted(named):
        op, rule = tag.rsplit("_c", 1)
        # Whole op names: `dynamic_slice (C1)` is not `real_dynamic_slice (C1)`.
        tested = re.search(rf"(?<!\w){re.escape(op)} \(C{rule}\)", expected) is not None
        where = ", ".join(named[tag])
        if tag in EXCEPTIONS:
            if tested:
                errors.append(f"{tag} ({where}) has a lit test now: remove it from EXCEPTIONS in {Path(__file__).name}")
        elif tested:
            covered += 1
        else:
            errors.append(f"{tag} ({where}): no lit test under test/lit expects `{op} (C{rule})`")
    for tag in sorted(EXCEPTIONS.keys() - named.keys()):
        errors.append(f"{tag} is in EXCEPTIONS but src/graph/ops no longer names it")
    if errors:
        print(f"{len(errors)} constraint(s) whose lit tests and EXCEPTIONS disagree:", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    print(
        f"ok: {covered} constraints named in src/graph/ops have a lit test; no graph text breaks "
        f"{', '.join(sorted(EXCEPTIONS))} (EXCEPTIONS in {Path(__file__).name})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
