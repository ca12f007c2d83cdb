"""Compare our specs' wire layouts with a reference copy of Kafka's specs.

``python -m protocol.codegen.compare REFERENCE_DIR [NAME ...]`` prints, per message, each
version whose layout differs, and exits non-zero if any does. Only versions both sides
define are compared; versions beyond the reference are listed as unchecked.
"""

from __future__ import annotations

import sys
from pathlib import Path

from protocol.codegen.spec import MessageSpec, load_all, wire_layout

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _first_difference(a: object, b: object, path: str = "") -> str:
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                label = x[0] if isinstance(x, list) and x and isinstance(x[0], str) else i
                return _first_difference(x, y, f"{path}/{label}")
        if len(a) != len(b):
            return f"{path}: ours has {len(a)} entries, reference {len(b)}"
    return f"{path}: ours {a!r} != reference {b!r}"


def compare(ours: list[MessageSpec], ref: list[MessageSpec]) -> tuple[list[str], list[str]]:
    """Returns (differences, notes)."""
    by_name = {s.name: s for s in ref}
    diffs: list[str] = []
    notes: list[str] = []
    for s in ours:
        r = by_name.get(s.name)
        if r is None:
            notes.append(f"{s.name}: no reference, unchecked")
            continue
        if s.api_key != r.api_key or s.type != r.type:
            diffs.append(f"{s.name}: apiKey/type {s.api_key}/{s.type} != {r.api_key}/{r.type}")
        unchecked = []
        for v in s.versions():
            if v not in r.valid:
                unchecked.append(v)
                continue
            if (v in s.flexible) != (v in r.flexible):
                diffs.append(f"{s.name} v{v}: flexible differs")
                continue
            a, b = wire_layout(s, v), wire_layout(r, v)
            if a != b:
                diffs.append(f"{s.name} v{v}: {_first_difference(a, b)}")
        if unchecked:
            notes.append(f"{s.name}: versions {unchecked} beyond the reference, unchecked")
    return diffs, notes


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m protocol.codegen.compare REFERENCE_DIR [NAME ...]", file=sys.stderr)
        return 2
    ref = load_all(Path(argv[0]))
    ours = load_all(SCHEMAS)
    if argv[1:]:
        ours = [s for s in ours if s.name in argv[1:]]
    diffs, notes = compare(ours, ref)
    for n in notes:
        print("note:", n)
    for d in diffs:
        print("DIFF:", d)
    print(f"{len(ours)} specs compared, {len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
