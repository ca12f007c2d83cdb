"""The code's structure, checked by reading it (an AST scan, so it stays true as the code grows).

- No import circle among the hand-written modules, counting every import: module level,
  ``TYPE_CHECKING`` blocks and imports inside functions alike.
- Only ``broker/__main__.py`` imports ``broker.broker``: components get what they use through
  their constructors, never the whole Broker.
- No parameter typed ``Any`` where a component, the broker or a partition is passed.
- No hand-written class over 700 lines, no hand-written file over 1,000 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.graphs import cycles

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "metadata", "node", "broker", "controller", "client", "connector", "tools", "pyspark_strata")
GENERATED = ROOT / "protocol" / "generated"
MAX_CLASS_LINES = 700
MAX_FILE_LINES = 1000
# parameter names that carry a component: typed Any, a reader cannot tell what it may use
COMPONENT_PARAMS = frozenset({"broker", "partition", "replicas", "replica_manager", "coordinator", "metadata",
                              "image", "services", "log", "controller", "channel", "loader"})


def hand_written() -> dict[str, Path]:
    """Module name -> file, for every hand-written module (generated codecs excluded)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if GENERATED in path.parents:
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every hand-written module `name` imports, wherever the import statement stands."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def add(target: str) -> None:
        # `from a.b import c` may name a module a.b.c or a symbol of a.b: take the longest module
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                add(f"{mod}.{alias.name}" if mod else alias.name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = hand_written()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_no_import_circle() -> None:
    found = cycles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_only_the_entry_point_imports_the_broker() -> None:
    importers = sorted(name for name, deps in import_graph().items() if "broker.broker" in deps)
    assert importers == ["broker.__main__"], importers


def _annotation_is_any(ann: ast.expr | None) -> bool:
    if ann is None:
        return False
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        return ann.value.strip() in ("Any", "typing.Any")
    return (isinstance(ann, ast.Name) and ann.id == "Any") or (
        isinstance(ann, ast.Attribute) and ann.attr == "Any")


def test_no_component_typed_any() -> None:
    bad = []
    for name, path in hand_written().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    if arg.arg in COMPONENT_PARAMS and _annotation_is_any(arg.annotation):
                        bad.append(f"{name}:{node.lineno} {node.name}({arg.arg}: Any)")
    assert not bad, bad


def test_no_class_or_file_too_long() -> None:
    bad = []
    for name, path in hand_written().items():
        text = path.read_text()
        lines = text.count("\n") + 1
        if lines > MAX_FILE_LINES:
            bad.append(f"{name}: {lines} lines (file)")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    bad.append(f"{name}.{node.name}: {size} lines (class)")
    assert not bad, bad


def test_the_scan_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The scanner itself: function-local and TYPE_CHECKING imports count, and a circle is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x.y import Z\n"
                   "def f():\n    import x.w\n")
    modules = {"x.y": src, "x.w": src, "x": src, "m": src}
    assert imports_of("m", src, modules) == {"x.y", "x.w"}
