"""Load our JSON message specs (Kafka's spec format) into a small typed model.

The format is Apache Kafka's: a top-level object with ``name``, ``type``, ``apiKey``,
``validVersions``, ``flexibleVersions``, ``fields`` and optional ``commonStructs``; each
field has ``name``, ``type``, ``versions`` and optionally ``nullableVersions``,
``taggedVersions``/``tag``, ``flexibleVersions`` (a per-field override), ``default``,
``ignorable``, ``mapKey`` and, for struct types, ``fields``. ``//`` line comments are
allowed, as in Kafka's files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

PRIMITIVES = {
    "bool",
    "int8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "float64",
    "string",
    "uuid",
    "bytes",
    "records",
}
# Types that may carry a null on the wire.
NULLABLE_KINDS = {"string", "bytes", "records", "array", "struct"}


class SpecError(ValueError):
    """A spec file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Versions:
    """An inclusive version range; ``hi`` is None for an open range ("3+")."""

    lo: int
    hi: int | None

    NONE: Versions = None  # type: ignore[assignment]  # set below

    @classmethod
    def parse(cls, text: str | None, *, where: str) -> Versions:
        if text is None or text == "none":
            return cls(1, 0)  # empty range
        text = str(text).strip()
        m = re.fullmatch(r"(\d+)(\+|-(\d+))?", text)
        if not m:
            raise SpecError(f"{where}: bad version range {text!r}")
        lo = int(m.group(1))
        if m.group(2) == "+":
            return cls(lo, None)
        if m.group(3) is not None:
            return cls(lo, int(m.group(3)))
        return cls(lo, lo)

    def __contains__(self, v: int) -> bool:
        return self.lo <= v and (self.hi is None or v <= self.hi)

    @property
    def empty(self) -> bool:
        return self.hi is not None and self.hi < self.lo

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.hi is None:
            return f"{self.lo}+"
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"


Versions.NONE = Versions(1, 0)


@dataclass
class FieldSpec:
    name: str
    type: str  # as written: "int32", "[]int32", "[]Foo", "Foo", "string" ...
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    flexible_override: Versions | None  # per-field "flexibleVersions" (header ClientId)
    default: object
    ignorable: bool
    map_key: bool
    about: str
    struct: StructSpec | None = None  # for struct and array-of-struct types

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def elem_type(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def kind(self) -> str:
        """'array', 'struct' or the primitive name."""
        if self.is_array:
            return "array"
        if self.type in PRIMITIVES:
            return self.type
        return "struct"

    @property
    def elem_is_struct(self) -> bool:
        return self.elem_type not in PRIMITIVES


@dataclass
class StructSpec:
    name: str
    versions: Versions
    fields: list[FieldSpec]


# A commonStruct while a spec loads: built, or the function that builds it on first use.
Common: TypeAlias = "StructSpec | Callable[[Path], StructSpec]"


@dataclass
class MessageSpec:
    path: Path
    name: str
    type: str  # request, response, header, metadata, data
    api_key: int | None
    valid: Versions
    flexible: Versions
    root: StructSpec
    common: dict[str, StructSpec] = field(default_factory=dict)
    about: str = ""

    def versions(self) -> range:
        hi = self.valid.hi if self.valid.hi is not None else self.valid.lo
        return range(self.valid.lo, hi + 1)

    def structs(self) -> list[StructSpec]:
        """Every struct, root first, each once (common structs may be used many times)."""
        seen: dict[str, StructSpec] = {}

        def walk(s: StructSpec) -> None:
            if s.name in seen:
                return
            seen[s.name] = s
            for f in s.fields:
                if f.struct is not None:
                    walk(f.struct)

        walk(self.root)
        return list(seen.values())


def strip_comments(text: str) -> str:
    """Drop ``//`` comments that are outside strings."""
    out = []
    for line in text.splitlines():
        in_str = False
        esc = False
        cut = len(line)
        for i, ch in enumerate(line):
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = not in_str
            elif not in_str and ch == "/" and line[i : i + 2] == "//":
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


def _parse_default(raw: Any, ftype: str, where: str) -> object:
    kind = ftype if ftype in PRIMITIVES else ("array" if ftype.startswith("[]") else "struct")
    if raw is None:
        return {
            "bool": False,
            "string": "",
            "bytes": b"",
            "records": None,
            "uuid": None,  # generator substitutes the zero UUID
            "float64": 0.0,
            "array": [],
            "struct": None,
        }.get(kind, 0)
    if raw == "null":
        return None
    if kind == "bool":
        if str(raw).lower() not in ("true", "false"):
            raise SpecError(f"{where}: bad bool default {raw!r}")
        return str(raw).lower() == "true"
    if kind in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        s = str(raw)
        return int(s, 16) if s.lower().startswith(("0x", "-0x")) else int(s)
    if kind == "float64":
        return float(raw)
    if kind == "string":
        return str(raw)
    raise SpecError(f"{where}: type {ftype} cannot have a default")


def _field(obj: dict, parent: str, path: Path, common: dict[str, Common]) -> FieldSpec:
    where = f"{path.name}: {parent}.{obj.get('name', '?')}"
    for key in ("name", "type", "versions"):
        if key not in obj:
            raise SpecError(f"{where}: missing {key!r}")
    ftype = obj["type"]
    versions = Versions.parse(obj["versions"], where=where)
    tag = obj.get("tag")
    tagged = Versions.parse(obj.get("taggedVersions"), where=where)
    if (tag is None) != tagged.empty:
        raise SpecError(f"{where}: 'tag' and 'taggedVersions' go together")
    fo = obj.get("flexibleVersions")
    f = FieldSpec(
        name=obj["name"],
        type=ftype,
        versions=versions,
        nullable=Versions.parse(obj.get("nullableVersions"), where=where),
        tagged=tagged,
        tag=None if tag is None else int(tag),
        flexible_override=None if fo is None else Versions.parse(fo, where=where),
        default=_parse_default(obj.get("default"), ftype, where),
        ignorable=bool(obj.get("ignorable", False)),
        map_key=bool(obj.get("mapKey", False)),
        about=obj.get("about", ""),
    )
    elem = ftype[2:] if ftype.startswith("[]") else ftype
    if elem not in PRIMITIVES:
        if "fields" in obj:
            f.struct = _struct(elem, versions, obj["fields"], path, common)
        elif elem in common:
            c = common[elem]
            f.struct = c(path) if callable(c) else c
        else:
            raise SpecError(f"{where}: struct type {elem} has no fields and no commonStruct")
    if not f.nullable.empty and f.kind not in NULLABLE_KINDS and elem != "uuid":
        raise SpecError(f"{where}: type {ftype} cannot be nullable")
    return f


def _struct(name: str, versions: Versions, fields: list, path: Path, common: dict[str, Common]) -> StructSpec:
    s = StructSpec(name=name, versions=versions, fields=[])
    for fobj in fields:
        s.fields.append(_field(fobj, name, path, common))
    names = [f.name for f in s.fields]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SpecError(f"{path.name}: {name} repeats field(s) {sorted(dup)}")
    tags = [f.tag for f in s.fields if f.tag is not None]
    if len(tags) != len(set(tags)):
        raise SpecError(f"{path.name}: {name} repeats a tag")
    return s


def load_spec(path: Path) -> MessageSpec:
    try:
        obj = json.loads(strip_comments(path.read_text()))
    except json.JSONDecodeError as e:
        raise SpecError(f"{path.name}: not JSON: {e}") from None
    for key in ("name", "type", "validVersions", "fields"):
        if key not in obj:
            raise SpecError(f"{path.name}: missing {key!r}")
    valid = Versions.parse(obj["validVersions"], where=path.name)
    common: dict = {}
    # Common structs may refer to each other in any order: build each on first use.
    raw = {c["name"]: c for c in obj.get("commonStructs", [])}

    def builder(cname: str):
        def build(path: Path) -> StructSpec:
            c = raw[cname]
            s = _struct(cname, Versions.parse(c.get("versions", "0+"), where=path.name), c["fields"], path, common)
            common[cname] = s
            return s

        return build

    for cname in raw:
        common[cname] = builder(cname)
    for cname in raw:
        if callable(common[cname]):
            common[cname](path)
    root = _struct(obj["name"], valid, obj["fields"], path, common)
    return MessageSpec(
        path=path,
        name=obj["name"],
        type=obj["type"],
        api_key=obj.get("apiKey"),
        valid=valid,
        flexible=Versions.parse(obj.get("flexibleVersions", "none"), where=path.name),
        root=root,
        common=common,
        about=obj.get("about", ""),
    )


def load_all(root: Path) -> list[MessageSpec]:
    return [load_spec(p) for p in sorted(root.rglob("*.json"))]


def wire_layout(spec: MessageSpec, version: int) -> list:
    """A version's wire layout as plain nested lists, for comparing two specs of one message.

    Names are compared case-insensitively; docs, defaults and ignorable do not affect bytes
    and are left out.
    """
    flexible = version in spec.flexible

    def struct_layout(s: StructSpec) -> list:
        out: list = []
        tagged: list = []
        for f in s.fields:
            if version not in f.versions:
                continue
            fflex = flexible if f.flexible_override is None else version in f.flexible_override
            entry: list = [
                f.name.lower(),
                f.type if f.struct is None else ("[]" if f.is_array else "") + "struct",
                version in f.nullable,
                fflex,
            ]
            if f.struct is not None:
                entry.append(struct_layout(f.struct))
            if version in f.tagged:
                tagged.append([f.tag, *entry])
            else:
                out.append(entry)
        if flexible:
            out.append(["<tagged>", sorted(tagged, key=lambda t: t[0])])
        return out

    return struct_layout(spec.root)
