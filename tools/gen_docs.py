"""The docs site's generated pages: every config key, tool option, metric and API, read from the
code at each build, so the reference cannot drift from what the processes do.

mkdocs.yml names this file as a hook: `on_files` adds the pages to the build (they are never
written into docs/). `python -m tools.gen_docs OUT_DIR` writes the same pages as files, to read
them without building the site.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# mkdocs loads this file by path: document the tree it sits in, not whichever copy is installed
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# how the processes read a key (the same pattern tests/test_config_table.py walks the code with)
_READ = re.compile(r"""(?:\.(?:int|str|bool|list|get|has|float)\(|props\[|listener_prop\([^,]+,[^,]+,|_int\([^,]+,)\s*"""
                   r"""["']([a-z][a-z0-9_]*(?:\.[a-z0-9_-]+)+)["']""")
_NOT_CONFIG = {"directory.id", "node.id", "version", "security.protocol", "sasl.mechanism", "sasl.username",
               "sasl.password"}  # meta.properties fields and --command-config keys read with the same calls
_GENERATED_NOTE = ("!!! note \"Generated\"\n    This page is generated from the code at every build "
                   "(`tools/gen_docs.py`, {source}); edit the code, not the page.\n\n")


def _cell(text: object) -> str:
    s = "" if text is None else str(text)
    return s.replace("|", "\\|").replace("\n", " ")


def _code(text: object) -> str:
    s = "" if text is None else str(text)
    return f"`{s}`" if s else ""


def _table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def _sources(*dirs: str) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for d in dirs for p in sorted((ROOT / d).rglob("*.py"))
            if "generated" not in p.parts}


def _keys_read(*dirs: str) -> set[str]:
    return {m.group(1) for t in _sources(*dirs).values() for m in _READ.finditer(t)} - _NOT_CONFIG


def _honoured(name: str) -> str:
    from metadata import config_effects as fx

    refused = fx.REFUSED.get(name)
    if refused is not None:
        allowed, why = refused
        only = f"only `{allowed}` accepted: " if allowed is not None else ""
        return f"**refused**: {only}{why}"
    ignored = fx.IGNORED.get(name)
    if ignored is not None:
        return f"ignored: {ignored}"
    differs = fx.DIFFERS.get(name)
    return "yes" if differs is None else f"yes, {differs}"


def _diskless_defaults() -> dict[str, str]:
    """diskless.* keys and their defaults, from DisklessConfig.from_props' `props.get(KEY, d.FIELD)`."""
    from broker.diskless.config import DisklessConfig

    tree = ast.parse((ROOT / "broker/diskless/config.py").read_text())
    base = DisklessConfig(storage_url="")
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            key = node.args[0].value
            default: object = None
            if len(node.args) > 1:
                arg = node.args[1]
                if isinstance(arg, ast.Attribute):
                    default = getattr(base, arg.attr, None)
                elif isinstance(arg, ast.Constant):
                    default = arg.value
            out[key] = "" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
    # its default is computed from the first log dir
    out["diskless.storage.url"] = "file://<first log dir>/diskless-objects"
    return out


def broker_configs() -> str:
    from metadata import config_effects as fx
    from metadata.broker_defaults import BROKER_CATALOG
    from metadata.config_defs import BROKER_CONFIGS

    read = _keys_read("broker", "node", "metadata")
    diskless = _diskless_defaults()
    names = sorted(set(BROKER_CATALOG) | set(BROKER_CONFIGS) | set(fx.STRATA_KEYS) | set(diskless)
                   | {k for k in read if k.startswith(fx.STRATA_PREFIXES) and not k.startswith("listener.name.")})
    rows = []
    for name in names:
        type_, default = BROKER_CATALOG.get(name, ("", None))
        if not type_ and name in BROKER_CONFIGS:
            type_ = BROKER_CONFIGS[name].type
        if name in diskless:
            default = diskless[name]
        kafka = "yes" if name in BROKER_CATALOG else "no"
        rows.append((f"`{name}`", type_, _code(default), "yes" if name in BROKER_CONFIGS else "",
                     kafka, _honoured(name)))
    prefixes = ", ".join(f"`{p}*`" for p in fx.STRATA_PREFIXES)
    return ("# Broker configs\n\n" + _GENERATED_NOTE.format(
        source="`metadata/broker_defaults.py`, `metadata/config_defs.py`, `metadata/config_effects.py`, "
               "`broker/diskless/config.py`")
        + "Every key a broker's `server.properties` (or `kafka-configs.sh --alter --entity-type brokers`) "
          "takes. *Type* and *default* are Kafka 4.0's where the key is Kafka's, else Strata's; *dynamic*: "
          "settable at runtime per broker or cluster-wide; *Kafka 4.0*: the key is in Kafka 4.0's broker catalog "
          "(no: Strata's own key, or a Kafka key outside that catalog, such as the quorum timeouts); *honoured*: what Strata does with it "
          "(see [Configuration](../configuration.md)).\n\n"
        + _table(("key", "type", "default", "dynamic", "Kafka 4.0", "honoured"), rows)
        + f"\nKey families read by prefix: {prefixes} (`listener.name.<listener>.<key>` sets `<key>` for one "
          "listener).\n")


def controller_configs() -> str:
    from metadata.broker_defaults import BROKER_CATALOG

    read = _keys_read("controller") | _keys_read("node")
    rows = []
    for name in sorted(read):
        type_, default = BROKER_CATALOG.get(name, ("", None))
        rows.append((f"`{name}`", type_, _code(default), "yes" if name in BROKER_CATALOG else "no",
                     _honoured(name)))
    return ("# Controller configs\n\n" + _GENERATED_NOTE.format(source="the keys `controller/` and `node/` read")
            + "The keys a controller's `server.properties` is read for (`python -m controller --config F`), "
              "found in the code that reads them; types and defaults as on the [broker page](broker-configs.md). "
              "A key not listed here has no effect on a controller; one that is refused is refused at start.\n\n"
            + _table(("key", "type", "default", "Kafka 4.0", "honoured"), rows))


def topic_configs() -> str:
    from metadata.config_defs import TOPIC_CONFIGS

    rows = []
    for name, d in sorted(TOPIC_CONFIGS.items()):
        synonyms = ", ".join(f"`{s}`" + (f" (x{m})" if m != 1 else "") for s, m in d.synonyms)
        rows.append((f"`{name}`", d.type, _code(d.default), synonyms, _honoured(name)))
    return ("# Topic configs\n\n" + _GENERATED_NOTE.format(source="`metadata/config_defs.py`, "
                                                                   "`metadata/config_effects.py`")
            + "Every topic key (`kafka-topics.sh --create --config`, `kafka-configs.sh --entity-type topics`), "
              "Kafka's names, types and defaults. *Broker synonyms* set the cluster-wide default, tried in "
              "order (a multiplier converts the unit). `diskless.enable` is Strata's (KIP-1164), set at "
              "creation only.\n\n"
            + _table(("key", "type", "default", "broker synonyms", "honoured"), rows))


def _help_of(build: Callable[[], argparse.ArgumentParser]) -> list[tuple[str, str]]:
    """(title, help text) of a parser and each of its subcommands, 100 columns wide."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        ap = build()
        out = [("", ap.format_help())]
        for action in ap._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out.append((name, sub.format_help()))
        return out
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _devcluster_parser() -> argparse.ArgumentParser:
    from tools import devcluster

    captured: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        captured.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign, assignment]
    try:
        with contextlib.suppress(SystemExit):
            devcluster.parse_args([])
    finally:
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]
    return captured[0]


def tools_page() -> str:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    parts = ["# Tool options\n\n", _GENERATED_NOTE.format(source="each tool's argument parser, `build_parser()`"),
             "Every option of every script `pip install` puts on `PATH` (`pyproject.toml`'s scripts), as its "
             "own `--help` prints it. What each does, with Kafka's formats and Strata's departures: "
             "[Tools](../tools.md).\n\n"]
    entries: list[tuple[str, Callable[[], argparse.ArgumentParser]]] = []
    for script, target in sorted(scripts.items()):
        module = importlib.import_module(target.split(":")[0])
        entries.append((script, module.build_parser))
    entries.append(("python -m tools.devcluster", _devcluster_parser))
    for script, build in entries:
        parts.append(f"## {script}\n\n")
        for title, text in _help_of(build):
            if title:
                parts.append(f"### {script} {title}\n\n")
            parts.append("```text\n" + text.rstrip() + "\n```\n\n")
    return "".join(parts)


def _resolve(e: ast.expr, strings: dict[str, str]) -> str | None:
    """A string expression's value: a literal, a variable holding one, or a sum of those."""
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return e.value
    if isinstance(e, ast.Name):
        return strings.get(e.id)
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
        left, right = _resolve(e.left, strings), _resolve(e.right, strings)
        return left + right if left is not None and right is not None else None
    return None


def _metric_families() -> list[tuple[str, str, str, str]]:
    """(name, type, help, where) of every `Family(...)` the node, broker and controller build,
    resolving names built from a string variable plus a literal."""
    out = []
    for path, text in _sources("node", "broker", "controller").items():
        tree = ast.parse(text)
        strings: dict[str, str] = {}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                strings[node.targets[0].id] = node.value.value
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Family":
                if len(node.args) < 3:
                    continue
                name, type_, help_ = (_resolve(a, strings) for a in node.args[:3])
                if name is None:
                    continue  # a name made at runtime (pushed client telemetry): described on the Metrics page
                where = path.split("/")[0]
                out.append((name, type_ or "", help_ or "", {"node": "broker, controller"}.get(where, where)))
    return sorted(set(out))


def metrics_page() -> str:
    rows = [(f"`{n}`", t, w, h) for n, t, h, w in _metric_families()]
    return ("# Metric reference\n\n" + _GENERATED_NOTE.format(source="every metric family the processes export")
            + "Every metric family a node's `/metrics` endpoint serves (`metrics.listener`), with its help "
              "text. Labels and what the numbers mean: [Metrics](../metrics.md). KIP-714 metrics pushed by "
              "clients are exported under their own names (see Metrics, client telemetry).\n\n"
            + _table(("metric", "type", "served by", "help"), rows))


def apis_page() -> str:
    import broker.apis.catalog  # noqa: F401  (registers every broker handler)
    from broker.apis.registry import HANDLERS
    from controller.apis.catalog import handlers
    from protocol.generated import REQUESTS

    def name(key: int) -> str:
        cls = REQUESTS.get(key)
        return cls.__name__.removesuffix("Request") if cls is not None else f"UNKNOWN({key})"

    controller = handlers()
    rows = []
    for key in sorted(set(HANDLERS) | set(controller)):
        b = HANDLERS.get(key)
        c = controller.get(key)
        broker_v = f"{b.min_version}-{b.max_version}" if b is not None else ""
        if b is not None and b.enabled is not None:
            broker_v += " (when enabled by config)"
        rows.append((key, name(key), broker_v, f"{c[0]}-{c[1]}" if c is not None else "",
                     "Strata's" if key >= 1000 else "Kafka's"))
    return ("# APIs and versions\n\n" + _GENERATED_NOTE.format(
        source="the brokers' handler registry (`broker/apis/`) and the controllers' (`controller/apis/`), "
               "which ApiVersions advertises exactly")
        + "Every API a broker and a controller serve and the versions of each, as their ApiVersions answers "
          "list them. Keys from 1000 are Strata's own (see [Development](../development.md#api-keys-of-stratas-own-apis)).\n\n"
        + _table(("key", "API", "broker", "controller", "key of"), rows))


def _included(path: str, title: str | None = None, links: dict[str, str] | None = None) -> Callable[[], str]:
    """A file outside docs/ as a page, its relative links pointed at their pages in the site."""

    def page() -> str:
        text = (ROOT / path).read_text()
        for old, new in (links or {}).items():
            text = text.replace(f"]({old})", f"]({new})")
        note = f"<!-- included from {path} at build time: edit that file -->\n\n"
        return (f"# {title}\n\n" if title else "") + note + text

    return page


PAGES: dict[str, Callable[[], str]] = {
    "reference/broker-configs.md": broker_configs,
    "reference/controller-configs.md": controller_configs,
    "reference/topic-configs.md": topic_configs,
    "reference/tools.md": tools_page,
    "reference/metrics.md": metrics_page,
    "reference/apis.md": apis_page,
    "architecture.md": _included("ARCHITECTURE.md", links={"docs/design-notes.md": "design-notes.md"}),
    "bench-results.md": _included("bench/README.md"),
}


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: the generated pages join the docs/ files."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gen_docs", description="Write the generated docs pages.")
    ap.add_argument("out", type=Path, help="directory to write the pages into")
    a = ap.parse_args(argv)
    for path, make in PAGES.items():
        target = a.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(make())
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
