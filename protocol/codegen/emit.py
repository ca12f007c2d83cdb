"""Emit one Python module per API (request + response) or per metadata record.

Each struct gets, per message version, a decode function ``(buf, pos) -> (obj, pos)`` and an
encode function ``(obj, parts) -> None`` that appends bytes-like parts. Runs of fixed-size
fields are merged into one precompiled ``struct.Struct``. Functions whose text is the same
for several versions are emitted once.
"""

from __future__ import annotations

import keyword
import re
from typing import cast

from protocol.codegen.spec import FieldSpec, MessageSpec, StructSpec, Versions

FIXED = {
    "bool": ("?", 1),
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "uint32": ("I", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
    "uuid": ("16s", 16),
}
# The annotation of each primitive's value (records: see protocol.message.Records).
PY_TYPES = {
    "bool": "bool",
    "int8": "int",
    "int16": "int",
    "uint16": "int",
    "int32": "int",
    "uint32": "int",
    "int64": "int",
    "float64": "float",
    "string": "str",
    "uuid": "UUID",
    "bytes": "bytes",
    "records": "Records",
}
INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


def snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"(?<=[A-Z])([A-Z][a-z])", r"_\1", s)
    s = s.lower()
    return s + "_" if keyword.iskeyword(s) else s


def api_module_name(spec: MessageSpec) -> str:
    name = spec.name
    for suffix in ("Request", "Response"):
        if spec.type in ("request", "response") and name.endswith(suffix):
            name = name[: -len(suffix)]
    return snake(name)


class ModuleEmitter:
    """Emits the code for one or more specs that share a module."""

    def __init__(self) -> None:
        self.structs: dict[str, str] = {}  # fmt -> constant name
        self.functions: dict[str, str] = {}  # body text (with placeholder name) -> name
        self.function_order: list[str] = []
        self.classes: list[str] = []
        self.tables: list[str] = []

    # ---------------------------------------------------------------- helpers
    def struct_const(self, fmt: str) -> str:
        if fmt not in self.structs:
            self.structs[fmt] = "_st_" + re.sub(r"[^0-9A-Za-z]", "", fmt.replace("?", "z"))
        return self.structs[fmt]

    def add_function(self, prefix: str, body: list[str]) -> str:
        """Register a function body whose def line says ``def @NAME@(...)``; dedupe by text."""
        text = "\n".join(body)
        if text in self.functions:
            return self.functions[text]
        n = sum(1 for name in self.functions.values() if name.startswith(prefix + "_v"))
        name = f"{prefix}_v{n}"
        self.functions[text] = name
        self.function_order.append(text)
        return name

    # ---------------------------------------------------------------- classes
    def default_expr(self, f: FieldSpec, cls_path: str) -> str:
        """Python source for a field's default value (a fresh object for mutable ones)."""
        if f.kind == "array":
            return "None" if f.default is None and _null_default(f) else "[]"
        if f.kind == "struct":
            if f.tag is not None or (_null_default(f)):
                return "None"
            return f"{cls_path}.{f.struct.name}()"  # type: ignore[union-attr]
        if f.kind == "uuid":
            return "ZERO_UUID"
        if f.kind == "records":
            return "None"
        if f.kind == "bytes":
            return "None" if _null_default(f) else 'b""'
        return repr(f.default)

    def py_type(self, f: FieldSpec, cls_path: str) -> str:
        """The Python type of a field's value, as an annotation (None if null or by default)."""
        if f.struct is not None:
            t = f"{cls_path}.{f.struct.name}"
        else:
            t = PY_TYPES[f.elem_type]
        if f.is_array:
            t = f"list[{t}]"
        if not f.nullable.empty or self.default_expr(f, cls_path) == "None":
            t += " | None"
        return t

    def emit_class(self, s: StructSpec, msg: MessageSpec, indent: str, cls_path: str, top: bool) -> list[str]:
        lines: list[str] = []
        base = "Message" if top else "Struct"
        lines.append(f"{indent}class {s.name}({base}):")
        doc = msg.about if top else ""
        if doc:
            lines.append(f'{indent}    """{_doc(doc)}"""')
            lines.append("")
        names = [snake(f.name) for f in s.fields]
        slots = ", ".join(repr(n) for n in names + ["unknown_tags"])
        lines.append(f"{indent}    __slots__ = ({slots},)")
        lines.append(f"{indent}    _fields = ({''.join(repr(n) + ', ' for n in names)})")
        if top:
            lines.append(f"{indent}    API_KEY = {msg.api_key!r}")
            lines.append(f"{indent}    NAME = {msg.name!r}")
            lines.append(f"{indent}    KIND = {msg.type!r}")
            lines.append(f"{indent}    MIN_VERSION = {msg.valid.lo}")
            lines.append(f"{indent}    MAX_VERSION = {msg.versions()[-1]}")
            lines.append(f"{indent}    FLEXIBLE_FROM = {msg.flexible.lo if not msg.flexible.empty else None}")
        # Field types for type checkers: annotations only (no class attributes, no runtime cost).
        lines.append("")
        for f, n in zip(s.fields, names):
            lines.append(f"{indent}    {n}: {self.py_type(f, cls_path)}")
        lines.append(f"{indent}    unknown_tags: dict[int, bytes] | None")
        # Nested struct classes, each once.
        nested: list[StructSpec] = []
        seen = set()

        def collect(st: StructSpec) -> None:
            for f in st.fields:
                if f.struct is not None and f.struct.name not in seen:
                    seen.add(f.struct.name)
                    nested.append(f.struct)
                    collect(f.struct)

        if top:
            collect(s)
            for st in nested:
                lines.append("")
                lines.extend(self.emit_class(st, msg, indent + "    ", cls_path, top=False))
        lines.append("")
        params = []
        body = []
        for f, n in zip(s.fields, names):
            d = self.default_expr(f, cls_path)
            t = self.py_type(f, cls_path)
            if d in ("[]",) or d.endswith("()"):
                params.append(f"{n}: {t} = _UNSET")
                body.append(f"{indent}        self.{n} = {d} if {n} is _UNSET else {n}")
            else:
                params.append(f"{n}: {t} = {d}")
                body.append(f"{indent}        self.{n} = {n}")
        params.append("unknown_tags: dict[int, bytes] | None = None")
        body.append(f"{indent}        self.unknown_tags = unknown_tags")
        lines.append(f"{indent}    def __init__(self, {', '.join(params)}) -> None:")
        lines.extend(body)
        return lines

    # ---------------------------------------------------------------- decode
    def read_value(self, f: FieldSpec, v: int, flex: bool, target: str, ind: str, msg: MessageSpec) -> list[str]:
        """Statements reading field f at ``pos`` into ``target`` and advancing ``pos``."""
        nullable = v in f.nullable
        fflex = flex if f.flexible_override is None else v in f.flexible_override
        k = f.kind
        out: list[str] = []
        if k in FIXED:
            c = self.struct_const(">" + FIXED[k][0])
            out.append(f"{ind}{target} = {c}.unpack_from(buf, pos)[0]")
            out.append(f"{ind}pos += {FIXED[k][1]}")
            if k == "uuid":
                out.append(f"{ind}{target} = uuid_of({target})")
            return out
        if k in ("string", "bytes", "records"):
            fn = {"string": "str", "bytes": "bytes", "records": "rec"}[k]
            fn = ("c" if fflex else "") + fn + ("_n" if nullable else "")
            out.append(f"{ind}{target}, pos = read_{fn}(buf, pos)")
            return out
        if k == "struct":
            fname = self.decoder(f.struct, v, msg)  # type: ignore[arg-type]
            if nullable:
                out.append(f"{ind}if buf[pos] == 255:")
                out.append(f"{ind}    {target} = None")
                out.append(f"{ind}    pos += 1")
                out.append(f"{ind}else:")
                out.append(f"{ind}    {target}, pos = {fname}(buf, pos + 1)")
            else:
                out.append(f"{ind}{target}, pos = {fname}(buf, pos)")
            return out
        # arrays
        if fflex:
            out.append(f"{ind}n = buf[pos]")  # one-byte varint fast path
            out.append(f"{ind}if n < 128:")
            out.append(f"{ind}    pos += 1")
            out.append(f"{ind}else:")
            out.append(f"{ind}    n, pos = read_uvarint(buf, pos)")
            out.append(f"{ind}n -= 1")
        else:
            out.append(f"{ind}n = _st_i.unpack_from(buf, pos)[0]")
            out.append(f"{ind}pos += 4")
            self.struct_const(">i")
        out.append(f"{ind}if n < 0:")
        if nullable:
            out.append(f"{ind}    {target} = None")
        else:
            out.append(f"{ind}    raise ProtocolError('null array in a non-nullable field')")
        out.append(f"{ind}else:")
        et = f.elem_type
        if et in FIXED and et != "uuid":
            code, size = FIXED[et]
            out.append(f"{ind}    if n * {size} > len(buf) - pos:")
            out.append(f"{ind}        raise ProtocolError(f'array of {{n}} items runs past the end')")
            out.append(f"{ind}    {target} = list(_unpack_from(f'>{{n}}{code}', buf, pos))")
            out.append(f"{ind}    pos += n * {size}")
            return out
        minsize = max(1, self.min_size_elem(f, v, flex))
        out.append(f"{ind}    if n * {minsize} > len(buf) - pos:")
        out.append(f"{ind}        raise ProtocolError(f'array of {{n}} items runs past the end')")
        out.append(f"{ind}    {target} = lst = []")
        out.append(f"{ind}    ap = lst.append")
        out.append(f"{ind}    for _ in range(n):")
        if f.elem_is_struct:
            fname = self.decoder(f.struct, v, msg)  # type: ignore[arg-type]
            out.append(f"{ind}        x, pos = {fname}(buf, pos)")
        else:
            elem = FieldSpec(
                name=f.name, type=et, versions=f.versions, nullable=Versions.NONE, tagged=Versions.NONE, tag=None,
                flexible_override=f.flexible_override, default=None, ignorable=False, map_key=False, about="",
            )
            out.extend(self.read_value(elem, v, flex, "x", ind + "        ", msg))
        out.append(f"{ind}        ap(x)")
        return out

    def min_size_elem(self, f: FieldSpec, v: int, flex: bool) -> int:
        et = f.elem_type
        if et in FIXED:
            return FIXED[et][1]
        if not f.elem_is_struct:
            return 1 if flex else (2 if et == "string" else 4)
        return self.min_size_struct(f.struct, v, flex)  # type: ignore[arg-type]

    def min_size_struct(self, s: StructSpec, v: int, flex: bool) -> int:
        total = 1 if flex else 0  # tagged-field count
        for f in s.fields:
            if v not in f.versions or v in f.tagged:
                continue
            fflex = flex if f.flexible_override is None else v in f.flexible_override
            k = f.kind
            if k in FIXED:
                total += FIXED[k][1]
            elif k == "struct":
                total += 1 if v in f.nullable else self.min_size_struct(f.struct, v, flex)  # type: ignore[arg-type]
            elif fflex:
                total += 1
            else:
                total += 2 if k == "string" else 4
        return total

    def decoder(self, s: StructSpec, v: int, msg: MessageSpec) -> str:
        flex = v in msg.flexible
        cls = f"_c_{msg.name}_{s.name}" if s is not msg.root else f"_c_{msg.name}"
        ind = "        "
        lines = ["def @NAME@(buf, pos):", "    f = None", "    try:"]
        present = [fl for fl in s.fields if v in fl.versions and v not in fl.tagged]
        i = 0
        while i < len(present):
            fl = present[i]
            if fl.kind in FIXED:
                run = [fl]
                while i + len(run) < len(present) and present[i + len(run)].kind in FIXED:
                    run.append(present[i + len(run)])
                fmt = ">" + "".join(FIXED[r.kind][0] for r in run)
                size = sum(FIXED[r.kind][1] for r in run)
                c = self.struct_const(fmt)
                lines.append(f"{ind}f = {fl.name!r}")
                targets = ", ".join("v_" + snake(r.name) for r in run)
                if len(run) == 1:
                    lines.append(f"{ind}{targets} = {c}.unpack_from(buf, pos)[0]")
                else:
                    lines.append(f"{ind}{targets} = {c}.unpack_from(buf, pos)")
                lines.append(f"{ind}pos += {size}")
                for r in run:
                    if r.kind == "uuid":
                        lines.append(f"{ind}v_{snake(r.name)} = uuid_of(v_{snake(r.name)})")
                i += len(run)
                continue
            lines.append(f"{ind}f = {fl.name!r}")
            lines.extend(self.read_value(fl, v, flex, "v_" + snake(fl.name), ind, msg))
            i += 1
        tagged = [fl for fl in s.fields if v in fl.versions and v in fl.tagged]
        if not present and not flex:
            lines.append(f"{ind}pass")
        if flex:
            lines.append(f"{ind}f = '<tagged fields>'")
            lines.append(f"{ind}unknown = None")
            for fl in tagged:
                lines.append(f"{ind}v_{snake(fl.name)} = {self.default_expr(fl, msg.name)}")
            lines.append(f"{ind}if buf[pos] == 0:")
            lines.append(f"{ind}    pos += 1")
            lines.append(f"{ind}else:")
            lines.append(f"{ind}    ntags, pos = read_uvarint(buf, pos)")
            lines.append(f"{ind}    for _ in range(ntags):")
            lines.append(f"{ind}        tag, pos = read_uvarint(buf, pos)")
            lines.append(f"{ind}        size, pos = read_uvarint(buf, pos)")
            lines.append(f"{ind}        end = check_len(buf, pos, size)")
            kw = "if"
            for fl in tagged:
                lines.append(f"{ind}        {kw} tag == {fl.tag}:")
                lines.append(f"{ind}            f = {fl.name!r}")
                lines.extend(self.read_value(fl, v, flex, "v_" + snake(fl.name), ind + "            ", msg))
                lines.append(f"{ind}            if pos != end:")
                lines.append(f"{ind}                raise ProtocolError('tagged field size does not match its value')")
                kw = "elif"
            if tagged:
                lines.append(f"{ind}        else:")
                lines.append(f"{ind}            if unknown is None:")
                lines.append(f"{ind}                unknown = {{}}")
                lines.append(f"{ind}            unknown[tag] = bytes(buf[pos:end])")
            else:
                lines.append(f"{ind}        if unknown is None:")
                lines.append(f"{ind}            unknown = {{}}")
                lines.append(f"{ind}        unknown[tag] = bytes(buf[pos:end])")
            lines.append(f"{ind}        pos = end")
        lines.append("    except ProtocolError as e:")
        lines.append("        if e.field is None:")
        lines.append(f"            e.field, e.offset = {s.name + '.'!r} + str(f), pos")
        lines.append("        raise")
        lines.append("    except _DECODE_ERRORS as e:")
        lines.append(f"        raise _malformed(e, {s.name + '.'!r} + str(f), pos) from None")
        args = []
        for fl in s.fields:
            if v in fl.versions:
                args.append("v_" + snake(fl.name))
            else:
                args.append(self.default_expr(fl, msg.name))
        args.append("unknown" if flex else "None")
        lines.append(f"    return {cls}({', '.join(args)}), pos")
        return self.add_function(f"_d_{msg.name}_{s.name}", lines)

    # ---------------------------------------------------------------- encode
    def write_value(self, f: FieldSpec, v: int, flex: bool, src: str, ind: str, msg: MessageSpec) -> list[str]:
        """Statements appending the encoding of ``src`` (field f) to ``parts`` via ``w``."""
        nullable = v in f.nullable
        fflex = flex if f.flexible_override is None else v in f.flexible_override
        k = f.kind
        out: list[str] = []
        if k in FIXED:
            c = self.struct_const(">" + FIXED[k][0])
            val = f"{src}.bytes" if k == "uuid" else src
            out.append(f"{ind}w({c}.pack({val}))")
            return out
        if k in ("string", "bytes", "records"):
            fn = {"string": "str", "bytes": "bytes", "records": "bytes"}[k]
            fn = ("c" if fflex else "") + fn + ("_n" if nullable else "")
            out.append(f"{ind}write_{fn}(parts, {src})")
            return out
        if k == "struct":
            fname = self.encoder(f.struct, v, msg)  # type: ignore[arg-type]
            if nullable:
                out.append(f"{ind}if {src} is None:")
                out.append(f"{ind}    w(b'\\xff')")
                out.append(f"{ind}else:")
                out.append(f"{ind}    w(b'\\x01')")
                out.append(f"{ind}    {fname}({src}, parts)")
            else:
                out.append(f"{ind}{fname}({src}, parts)")
            return out
        # arrays
        out.append(f"{ind}lst = {src}")
        out.append(f"{ind}if lst is None:")
        if nullable:
            out.append(f"{ind}    w({'NULL_UVARINT' if fflex else 'NULL_INT32'})")
        else:
            out.append(f"{ind}    raise ProtocolError({'null in non-nullable array ' + f.name!r})")
        out.append(f"{ind}else:")
        if fflex:
            out.append(f"{ind}    w(uvarint(len(lst) + 1))")
        else:
            out.append(f"{ind}    w(_st_i.pack(len(lst)))")
            self.struct_const(">i")
        et = f.elem_type
        if et in FIXED and et != "uuid":
            code = FIXED[et][0]
            out.append(f"{ind}    w(_pack(f'>{{len(lst)}}{code}', *lst))")
            return out
        out.append(f"{ind}    for x in lst:")
        if f.elem_is_struct:
            fname = self.encoder(f.struct, v, msg)  # type: ignore[arg-type]
            out.append(f"{ind}        {fname}(x, parts)")
        else:
            elem = FieldSpec(
                name=f.name, type=et, versions=f.versions, nullable=Versions.NONE, tagged=Versions.NONE, tag=None,
                flexible_override=f.flexible_override, default=None, ignorable=False, map_key=False, about="",
            )
            out.extend(self.write_value(elem, v, flex, "x", ind + "        ", msg))
        return out

    def encoder(self, s: StructSpec, v: int, msg: MessageSpec) -> str:
        flex = v in msg.flexible
        ind = "    "
        lines = ["def @NAME@(o, parts):", "    w = parts.append"]
        present = [fl for fl in s.fields if v in fl.versions and v not in fl.tagged]
        # Fields this version lacks must hold their default unless ignorable (Kafka's rule), for
        # requests and records, where a dropped field changes the meaning. Responses drop them:
        # handlers fill one response for every version, as the client's version decides.
        for fl in s.fields:
            if v in fl.versions or fl.ignorable or msg.type == "response":
                continue
            cond = self.non_default_test(fl, "o." + snake(fl.name), msg.name)
            if cond:
                lines.append(f"{ind}if {cond}:")
                lines.append(
                    f"{ind}    raise ProtocolError({fl.name + ' is not in this version and is not ignorable'!r},"
                    f" field={s.name + '.' + fl.name!r})"
                )
        i = 0
        while i < len(present):
            fl = present[i]
            if fl.kind in FIXED:
                run = [fl]
                while i + len(run) < len(present) and present[i + len(run)].kind in FIXED:
                    run.append(present[i + len(run)])
                fmt = ">" + "".join(FIXED[r.kind][0] for r in run)
                c = self.struct_const(fmt)
                vals = ", ".join(
                    f"o.{snake(r.name)}.bytes" if r.kind == "uuid" else f"o.{snake(r.name)}" for r in run
                )
                lines.append(f"{ind}w({c}.pack({vals}))")
                i += len(run)
                continue
            lines.extend(self.write_value(fl, v, flex, "o." + snake(fl.name), ind, msg))
            i += 1
        if flex:
            tagged = sorted((fl for fl in s.fields if v in fl.versions and v in fl.tagged), key=_tag)
            if not tagged:
                lines.append(f"{ind}if o.unknown_tags:")
                lines.append(f"{ind}    write_tags(parts, None, o.unknown_tags)")
                lines.append(f"{ind}else:")
                lines.append(f"{ind}    w(b'\\x00')")
            else:
                lines.append(f"{ind}tg = None")
                for fl in tagged:
                    src = "o." + snake(fl.name)
                    cond = self.non_default_test(fl, src, msg.name) or "True"
                    if fl.kind == "struct" and not fl.nullable.__contains__(v):
                        # Kafka writes a tagged struct only when it differs from the default struct
                        cond = f"{src} is not None and {src} != {msg.name}.{fl.struct.name}()"  # type: ignore[union-attr]
                    lines.append(f"{ind}if {cond}:")
                    lines.append(f"{ind}    outer, parts = parts, []")
                    lines.append(f"{ind}    w = parts.append")
                    lines.extend(self.write_value(fl, v, flex, src, ind + "    ", msg))
                    lines.append(f"{ind}    if tg is None:")
                    lines.append(f"{ind}        tg = []")
                    lines.append(f"{ind}    tg.append(({fl.tag}, b''.join(parts)))")
                    lines.append(f"{ind}    parts = outer")
                    lines.append(f"{ind}    w = parts.append")
                lines.append(f"{ind}if tg is None and not o.unknown_tags:")
                lines.append(f"{ind}    w(b'\\x00')")
                lines.append(f"{ind}else:")
                lines.append(f"{ind}    write_tags(parts, tg, o.unknown_tags)")
        return self.add_function(f"_e_{msg.name}_{s.name}", lines)

    def non_default_test(self, f: FieldSpec, src: str, cls: str) -> str | None:
        """A Python condition true when ``src`` differs from f's default, or None if always default."""
        d = self.default_expr(f, cls)
        if d == "[]":
            return f"{src}"
        if d == "None":
            return f"{src} is not None"
        if d.endswith("()"):
            return f"{src} != {d}"
        return f"{src} != {d}"

    # ---------------------------------------------------------------- module
    def add_message(self, msg: MessageSpec) -> None:
        self.classes.extend(self.emit_class(msg.root, msg, "", msg.name, top=True))
        self.classes.append("")
        self.classes.append("")
        aliases = [f"_c_{msg.name} = {msg.name}"]
        for st in msg.structs()[1:]:
            aliases.append(f"_c_{msg.name}_{st.name} = {msg.name}.{st.name}")
        self.classes.extend(aliases)
        self.classes.append("")
        self.classes.append("")
        enc = {}
        dec = {}
        for v in msg.versions():
            dec[v] = self.decoder(msg.root, v, msg)
            enc[v] = self.encoder(msg.root, v, msg)
        self.tables.append(f"{msg.name}._decoders = {{{', '.join(f'{v}: {n}' for v, n in dec.items())}}}")
        self.tables.append(f"{msg.name}._encoders = {{{', '.join(f'{v}: {n}' for v, n in enc.items())}}}")

    def render(self, header: str) -> str:
        out = [header, ""]
        out.append("from __future__ import annotations")
        out.append("")
        out.append("from struct import Struct as _Struct")
        out.append("from struct import pack as _pack")
        out.append("from struct import unpack_from as _unpack_from")
        out.append("from uuid import UUID")
        out.append("")
        out.append("from protocol.codec_runtime import (")
        for name in RUNTIME_NAMES:
            out.append(f"    {name},")
        out.append(")")
        out.append("from protocol.errors import ProtocolError")
        out.append("from protocol.message import Message, Records, Struct")
        out.append("")
        self.struct_const(">i")
        for fmt, name in sorted(self.structs.items(), key=lambda kv: kv[1]):
            out.append(f"{name} = _Struct({fmt!r})")
        out.append("")
        out.append("")
        out.extend(self.classes)
        for text in self.function_order:
            out.append(text.replace("@NAME@", self.functions[text]))
            out.append("")
            out.append("")
        out.extend(self.tables)
        out.append("")
        return "\n".join(out)


RUNTIME_NAMES = [
    "NULL_INT32",
    "NULL_UVARINT",
    "ZERO_UUID",
    "_DECODE_ERRORS",
    "_UNSET",
    "_malformed",
    "check_len",
    "read_bytes",
    "read_bytes_n",
    "read_cbytes",
    "read_cbytes_n",
    "read_crec",
    "read_crec_n",
    "read_cstr",
    "read_cstr_n",
    "read_rec",
    "read_rec_n",
    "read_str",
    "read_str_n",
    "read_uvarint",
    "uuid_of",
    "uvarint",
    "write_bytes",
    "write_bytes_n",
    "write_cbytes",
    "write_cbytes_n",
    "write_cstr",
    "write_cstr_n",
    "write_str",
    "write_str_n",
    "write_tags",
]


def _null_default(f: FieldSpec) -> bool:
    return f.default is None and f.kind in ("array", "struct", "bytes", "string") and not f.nullable.empty


def _doc(text: str) -> str:
    return text.replace('"""', "'''").replace("\\", "\\\\")


def _tag(f: FieldSpec) -> int:
    return cast(int, f.tag)  # a tagged field has its tag (spec.py checks)
