"""Our codecs against independent implementations, in both directions.

Oracles: kio (kio.schema.<api>.v<N>), kafka-python 3.0 (JSON-driven kafka.protocol.* classes and
the hand-written kafka.protocol.old Struct classes) and aiokafka 0.14 (aiokafka.protocol.*).
For every (api, version) both sides model, seeded random values built from our spec model:
  * ours.encode(v) == theirs.encode()            (byte for byte)
  * Ours.decode(their bytes, v) == our value     (their encoding, our decoder)
  * their decode of our bytes, mapped back == our value (our encoding, their decoder)
Values a library cannot represent are first narrowed in our object (kio: error codes must be
known ErrorCode members, *_ms durations/timestamps must fit timedelta/datetime; the Struct
libraries: no known tagged fields, since they only carry a raw tag dict).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import inspect
import io
import pkgutil
import random
import uuid
from pathlib import Path

import pytest
from kafka.protocol.api_header import RequestHeader as KpRequestHeader
from kafka.protocol.api_header import ResponseHeader as KpResponseHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.base import BaseField
from kafka.protocol.schemas.fields.codecs import BitField
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_schema_field_type,
    is_optional,
)

from protocol.codegen.emit import api_module_name
from protocol.codegen.spec import FieldSpec, MessageSpec, StructSpec, load_all
from protocol.generated import (
    METADATA_RECORDS,
    REQUESTS,
    RESPONSES,
    RequestHeader,
    ResponseHeader,
)

ROOT = Path(__file__).resolve().parents[1]

ZERO_UUID = uuid.UUID(int=0)
SAMPLES = 4  # random values per (api, version) and oracle
INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
ALPHABET = "abcXYZ09-_. \u00e9\u00df\u4e16\U0001f600"

# Strata's own fields (tags >= 1000): no other library knows
# them, so they stay at their defaults in every oracle comparison.
STRATA_ONLY = {
    ("MetadataResponse", "StartOffset"),
    ("MetadataResponse", "Chunks"),
    ("DescribeTopicPartitionsResponse", "StartOffset"),
    ("DescribeTopicPartitionsResponse", "Chunks"),
    # KIP-253 (docs/concepts/partition-counts.md)
    ("MetadataResponse", "MarkedForDeletion"),
    ("MetadataResponse", "UndeletedPartitionCount"),
    # KIP-1164's produce gateways (docs/concepts/diskless.md)
    ("MetadataResponse", "PreferredProduceBrokers"),
    ("ProduceRequest", "UndeletedPartitionCount"),
    ("HeartbeatRequest", "Positions"),
    ("HeartbeatRequest", "InterestedPartitions"),
    ("HeartbeatResponse", "Positions"),
    ("HeartbeatResponse", "WantedPartitions"),
    ("DescribeLogDirsResponse", "ChunkStartOffset"),
    ("AssignReplicasToDirsRequest", "ChunkStartOffset"),
    ("AssignReplicasToDirsResponse", "ChunkStartOffset"),
}


def message_class(spec: MessageSpec):
    """The generated class of a spec (None if not generated yet: see test_every_spec_is_generated)."""
    table = {"request": REQUESTS, "response": RESPONSES, "metadata": METADATA_RECORDS}.get(spec.type)
    if table is not None:
        cls = table.get(spec.api_key)
    else:
        cls = {"RequestHeader": RequestHeader, "ResponseHeader": ResponseHeader}.get(spec.name)
    return cls if cls is not None and cls.NAME == spec.name else None


SPECS = [spec for spec in load_all(ROOT / "schemas") if message_class(spec) is not None]


def struct_class(spec: MessageSpec, s: StructSpec):
    msg_cls = message_class(spec)
    return msg_cls if s is spec.root else getattr(msg_cls, s.name)


def present(s: StructSpec, cls, v: int) -> list[tuple[FieldSpec, str]]:
    assert len(cls._fields) == len(s.fields)
    return [(f, a) for f, a in zip(s.fields, cls._fields) if v in f.versions]


# ---------------------------------------------------------------- seeded random values
def rand_primitive(kind: str, rnd: random.Random):
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        if rnd.random() < 0.3:
            return rnd.choice([lo, hi, 0, max(lo, -1), 1])
        return rnd.randint(lo, hi)
    if kind == "bool":
        return rnd.random() < 0.5
    if kind == "float64":
        return rnd.choice([0.0, -1.5, 1e300, rnd.uniform(-1e9, 1e9)])
    if kind == "string":
        return "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 6)))
    if kind in ("bytes", "records"):
        return rnd.randbytes(rnd.randint(0, 9))
    if kind == "uuid":
        return ZERO_UUID if rnd.random() < 0.2 else uuid.UUID(int=rnd.getrandbits(128))
    raise AssertionError(kind)


def rand_struct(spec: MessageSpec, s: StructSpec, v: int, rnd: random.Random, depth: int = 0):
    cls = struct_class(spec, s)
    kw = {}
    for f, a in present(s, cls, v):
        if (spec.name, f.name) in STRATA_ONLY:
            continue
        if v in f.tagged and rnd.random() < 0.4:
            continue  # default
        if v in f.nullable and rnd.random() < 0.2:
            kw[a] = None
        elif f.kind == "struct":
            kw[a] = rand_struct(spec, f.struct, v, rnd, depth + 1)
        elif f.kind == "array":
            n = rnd.randint(0, 3 if depth < 2 else 1)
            if f.elem_is_struct:
                kw[a] = [rand_struct(spec, f.struct, v, rnd, depth + 1) for _ in range(n)]
            else:
                kw[a] = [rand_primitive(f.elem_type, rnd) for _ in range(n)]
        else:
            kw[a] = rand_primitive(f.kind, rnd)
    return cls(**kw)


def samples(spec: MessageSpec, v: int, oracle: str):
    rnd = random.Random(f"{oracle}/{spec.name}/{v}")
    cls = message_class(spec)
    yield cls()
    for _ in range(SAMPLES):
        yield rand_struct(spec, spec.root, v, rnd)


def check_roundtrips(spec: MessageSpec, v: int, ours, theirs_bytes: bytes, theirs_decoded_as_ours) -> None:
    cls = message_class(spec)
    ours_bytes = ours.encode(v)
    assert ours_bytes == theirs_bytes, (
        f"{spec.name} v{v}: bytes differ\nours   {ours_bytes.hex()}\ntheirs {theirs_bytes.hex()}\n{ours!r}"
    )
    assert cls.decode(theirs_bytes, v) == ours, f"{spec.name} v{v}: our decode of their bytes"
    assert theirs_decoded_as_ours == ours, (
        f"{spec.name} v{v}: their decode of our bytes\n{theirs_decoded_as_ours!r}\n{ours!r}"
    )


def _bytes(x):
    return None if x is None else bytes(x)


# ================================================================ kio

ERROR_CODES = sorted(int(e.value) for e in ErrorCode)
MS = datetime.timedelta(milliseconds=1)


def kio_module(spec: MessageSpec, v: int) -> str:
    if spec.type == "header":
        return f"kio.schema.{'request' if spec.name == 'RequestHeader' else 'response'}_header.v{v}.header"
    return f"kio.schema.{api_module_name(spec)}.v{v}.{spec.type}"


def _kio_pairs():
    out = []
    for spec in SPECS:
        if spec.type == "metadata":
            continue
        for v in spec.versions():
            try:
                mod = importlib.import_module(kio_module(spec, v))
            except ImportError:
                continue
            out.append((spec, v, getattr(mod, spec.name)))
    return out


KIO_PAIRS = _kio_pairs()


def kio_match(spec: MessageSpec, s: StructSpec, v: int, kcls) -> list[tuple[FieldSpec, str, object]]:
    """(our field, our attribute, kio field or None for Strata-only fields).

    kio drops the unit from duration/timestamp names (throttle_time_ms -> throttle_time,
    timeout_ms -> timeout, log_append_time_ms -> log_append_time ...): a name ending in _ms
    matches the kio name without it. Every other field must match by name, both ways.
    """
    kfields = {kf.name: kf for kf in dataclasses.fields(kcls)}
    out = []
    for f, a in present(s, struct_class(spec, s), v):
        kf = kfields.pop(a, None)
        if kf is None and a.endswith("_ms"):
            kf = kfields.pop(a[:-3], None)
        if kf is None:
            kf = kfields.pop(a + "_", None)  # kio appends "_" to builtin names (id -> id_)
        if kf is None:
            assert (spec.name, f.name) in STRATA_ONLY, f"{spec.name} v{v} {s.name}.{a}: no kio field"
        out.append((f, a, kf))
    assert not kfields, f"{spec.name} v{v} {s.name}: kio fields we lack: {sorted(kfields)}"
    return out


def _to_kio_prim(x, ktype: str, optional: bool):
    """(our value narrowed to what kio can carry, kio value)."""
    if x is None:
        return None, None
    if ktype == "error_code":
        if x not in ERROR_CODES:
            x = ERROR_CODES[x % len(ERROR_CODES)]
        return x, ErrorCode(x)
    if ktype == "timedelta_i32":
        return x, datetime.timedelta(milliseconds=x)
    if ktype == "timedelta_i64":
        if abs(x) > 2**40:
            x %= 2**40
        return x, datetime.timedelta(milliseconds=x)
    if ktype == "datetime_i64":
        if optional and x == -1:
            return x, None
        if not 0 <= x < 2**41:
            x = abs(x + 2) % 2**41
        return x, datetime.datetime.fromtimestamp(x / 1000, tz=datetime.UTC)
    if ktype in ("bytes", "records"):
        return bytes(x), bytes(x)
    if ktype == "uuid" and x == ZERO_UUID and optional:
        return x, None  # kio's optional uuid: None is the zero uuid (and its tagged default)
    return x, x


def _from_kio_prim(y, ktype: str):
    if y is None:
        return {"datetime_i64": -1, "uuid": ZERO_UUID}.get(ktype)
    if ktype == "error_code":
        return int(y)
    if ktype in ("timedelta_i32", "timedelta_i64"):
        return y // MS
    if ktype == "datetime_i64":
        return round(y.timestamp() * 1000)
    if ktype in ("bytes", "records"):
        return bytes(y)
    return y


def to_kio(spec: MessageSpec, s: StructSpec, v: int, obj, kcls):
    kw = {}
    for f, a, kf in kio_match(spec, s, v, kcls):
        val = getattr(obj, a)
        if kf is None:
            continue
        kind = classify_field(kf)
        if isinstance(kind, EntityField):
            if val is not None:
                val = to_kio(spec, f.struct, v, val, kind.type_)
            if v in f.tagged and val in (None, get_tagged_field_default(kf)):
                # Our absent tagged struct is None; kio's is its default instance, which (like
                # Kafka) it never writes. Narrow ours to None when it equals that default.
                setattr(obj, a, None)
                val = get_tagged_field_default(kf)
            kw[kf.name] = val
        elif isinstance(kind, EntityTupleField):
            kw[kf.name] = None if val is None else tuple(to_kio(spec, f.struct, v, x, kind.type_) for x in val)
        elif isinstance(kind, PrimitiveTupleField):
            if val is None:
                kw[kf.name] = None
            else:
                pairs = [_to_kio_prim(x, get_schema_field_type(kf), False) for x in val]
                setattr(obj, a, [p[0] for p in pairs])
                kw[kf.name] = tuple(p[1] for p in pairs)
        else:
            ours, theirs = _to_kio_prim(val, get_schema_field_type(kf), is_optional(kf))
            setattr(obj, a, ours)
            kw[kf.name] = theirs
    return kcls(**kw)


def from_kio(spec: MessageSpec, s: StructSpec, v: int, kobj, kcls):
    kw = {}
    for f, a, kf in kio_match(spec, s, v, kcls):
        if kf is None:
            continue
        val = getattr(kobj, kf.name)
        kind = classify_field(kf)
        if isinstance(kind, EntityField):
            if v in f.tagged and val == get_tagged_field_default(kf):
                val = None
            kw[a] = None if val is None else from_kio(spec, f.struct, v, val, kind.type_)
        elif isinstance(kind, EntityTupleField):
            kw[a] = None if val is None else [from_kio(spec, f.struct, v, x, kind.type_) for x in val]
        elif isinstance(kind, PrimitiveTupleField):
            kw[a] = None if val is None else [_from_kio_prim(x, get_schema_field_type(kf)) for x in val]
        else:
            kw[a] = _from_kio_prim(val, get_schema_field_type(kf))
    return struct_class(spec, s)(**kw)


@pytest.mark.parametrize(("spec", "v", "kcls"), KIO_PAIRS, ids=[f"{s.name}-v{v}" for s, v, _ in KIO_PAIRS])
def test_kio(spec: MessageSpec, v: int, kcls):
    write = entity_writer(kcls)
    read = entity_reader(kcls)
    for ours in samples(spec, v, "kio"):
        kobj = to_kio(spec, spec.root, v, ours, kcls)  # also narrows `ours`
        buf = io.BytesIO()
        write(buf, kobj)
        theirs = buf.getvalue()
        ours_bytes = ours.encode(v)
        decoded, size = read(ours_bytes, 0)
        assert size == len(ours_bytes)
        check_roundtrips(spec, v, ours, theirs, from_kio(spec, spec.root, v, decoded, kcls))


# ================================================================ kafka-python 3.0 (JSON-driven)

# kafka-python patches these int32 bit sets into Python sets under a new name (json_patch):
# they are compared as sets of bit numbers, None for Kafka's "not requested" value -2**31.
KP_RENAMES = {
    "clusterauthorizedoperations": "authorized_operations",
    "topicauthorizedoperations": "authorized_operations",
}


def _kp_message_classes():
    import kafka.protocol as kp

    for m in pkgutil.walk_packages(kp.__path__, "kafka.protocol."):
        if ".old" not in m.name and "generate_stubs" not in m.name:
            importlib.import_module(m.name)
    todo, found = [ApiMessage], {}
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__dict__.get("_class_version") is None and "_json" in sub.__dict__:
                found[(sub.API_KEY, sub.type)] = sub
    return found


def _kp_pairs():
    classes = _kp_message_classes()
    out = []
    for spec in SPECS:
        if spec.type in ("request", "response"):
            kcls = classes.get((spec.api_key, spec.type))
        elif spec.type == "header":
            kcls = KpRequestHeader if spec.name == "RequestHeader" else KpResponseHeader
        else:
            kcls = None
        if kcls is None:
            continue
        lo, hi = BaseField.parse_versions(kcls._json["validVersions"])
        out += [(spec, v, kcls) for v in spec.versions() if lo <= v <= hi]
    return out


KP_PAIRS = _kp_pairs()


def kp_match(spec: MessageSpec, s: StructSpec, v: int, kstruct):
    kfields = {kf._name.lower(): kf for kf in kstruct._fields if kf.for_version_q(v)}
    out = []
    for f, a in present(s, struct_class(spec, s), v):
        kf = kfields.pop(f.name.lower(), None) or kfields.pop(KP_RENAMES.get(f.name.lower(), "?"), None)
        if kf is None:
            assert (spec.name, f.name) in STRATA_ONLY, f"{spec.name} v{v} {s.name}.{f.name}: no kafka-python field"
        out.append((f, a, kf))
    assert not kfields, f"{spec.name} v{v} {s.name}: kafka-python fields we lack: {sorted(kfields)}"
    return out


def _is_bitfield(kf) -> bool:
    return getattr(kf, "_type", None) is BitField


def _to_bits(x: int):
    if x == -(2**31):
        return None
    return {b for b in range(32) if (x & 0xFFFFFFFF) >> b & 1}


def _from_bits(bits) -> int:
    if bits is None:
        return -(2**31)
    n = sum(1 << b for b in bits)
    return n - 2**32 if n >= 2**31 else n


def to_kp(spec: MessageSpec, s: StructSpec, v: int, obj, kstruct, data_class, top: bool):
    kw = {}
    for f, a, kf in kp_match(spec, s, v, kstruct):
        if kf is None:
            continue
        val = getattr(obj, a)
        if v in f.tagged and val == getattr(struct_class(spec, s)(), a):
            continue  # kafka-python writes every tagged field it is given; we write non-defaults
        if kf.is_struct():
            val = None if val is None else to_kp(spec, f.struct, v, val, kf, kf.data_class, False)
        elif kf.is_struct_array():
            sub = kf.array_of
            val = None if val is None else [to_kp(spec, f.struct, v, x, sub, sub.data_class, False) for x in val]
        elif _is_bitfield(kf):
            val = _to_bits(val)
        elif f.kind in ("bytes", "records") or f.elem_type == "bytes":
            val = _bytes(val)
        kw[kf.name] = val
    return data_class(version=v, **kw)


def from_kp(spec: MessageSpec, s: StructSpec, v: int, kobj, kstruct):
    kw = {}
    for f, a, kf in kp_match(spec, s, v, kstruct):
        if kf is None:
            continue
        val = getattr(kobj, kf.name)
        if kf.is_struct():
            val = None if val is None else from_kp(spec, f.struct, v, val, kf)
        elif kf.is_struct_array():
            val = None if val is None else [from_kp(spec, f.struct, v, x, kf.array_of) for x in val]
        elif _is_bitfield(kf):
            val = _from_bits(val)
        elif f.kind == "uuid" and val is None:
            val = ZERO_UUID
        elif f.kind in ("bytes", "records"):
            val = _bytes(val)
        kw[a] = val
    return struct_class(spec, s)(**kw)


@pytest.mark.parametrize(("spec", "v", "kcls"), KP_PAIRS, ids=[f"{s.name}-v{v}" for s, v, _ in KP_PAIRS])
def test_kafka_python(spec: MessageSpec, v: int, kcls):
    header = spec.type == "header"
    for ours in samples(spec, v, "kafka-python"):
        kobj = to_kp(spec, spec.root, v, ours, kcls._struct, kcls, True)
        if header:
            flexible = v == spec.flexible.lo
            theirs = kobj.encode(flexible=flexible)
            decoded = kcls.decode(io.BytesIO(ours.encode(v)), flexible=flexible)
        else:
            # ApiMessage.encode/decode: the body only (header=False), without the per-API
            # overrides (MetadataRequest and DeleteTopicsRequest fill fields in on encode;
            # ApiVersionsResponse decodes any error response as v0, as brokers send it).
            theirs = ApiMessage.encode(kobj, version=v)
            decoded = ApiMessage.decode.__func__(kcls, ours.encode(v), version=v)
        check_roundtrips(spec, v, ours, bytes(theirs), from_kp(spec, spec.root, v, decoded, kcls._struct))


# ================================================================ Struct-based: aiokafka 0.14, kafka.protocol.old
def _struct_classes(package: str, bases: tuple[type, type]) -> dict[tuple[int, str, int], type]:
    pkg = importlib.import_module(package)
    found = {}
    for m in pkgutil.iter_modules(pkg.__path__, package + "."):
        mod = importlib.import_module(m.name)
        for _, c in inspect.getmembers(mod, inspect.isclass):
            if not c.__module__.startswith(package) or inspect.isabstract(c):
                continue
            key, ver = c.__dict__.get("API_KEY"), c.__dict__.get("API_VERSION")
            if not (isinstance(key, int) and isinstance(ver, int) and "SCHEMA" in c.__dict__):
                continue
            kind = "request" if issubclass(c, bases[0]) else "response" if issubclass(c, bases[1]) else None
            if kind:
                found[(key, kind, ver)] = c
    return found


def _aiokafka_classes():
    from aiokafka.protocol.api import RequestStruct, Response

    return _struct_classes("aiokafka.protocol", (RequestStruct, Response))


def _kp_old_classes():
    from kafka.protocol.old.api import Request, Response

    return _struct_classes("kafka.protocol.old", (Request, Response))


def _struct_pairs(classes):
    out = []
    for spec in SPECS:
        if spec.type not in ("request", "response"):
            continue
        for v in spec.versions():
            c = classes.get((spec.api_key, spec.type, v))
            if c is not None:
                out.append((spec, v, c))
    return out


AIOKAFKA_PAIRS = _struct_pairs(_aiokafka_classes())
KP_OLD_PAIRS = _struct_pairs(_kp_old_classes())


# Pairs where the oracle's hand-written schema is wrong (checked against Kafka's specs), so no
# comparison is possible. Everything else they define is compared.
STRUCT_ORACLE_DEFECTS = {
    # aiokafka declares ListOffsets v4/v5 CurrentLeaderEpoch as Int64; Kafka's is int32 (aiokafka
    # never sends them: "Not yet supported").
    ("aiokafka", "ListOffsetsRequest", 4),
    ("aiokafka", "ListOffsetsRequest", 5),
    # kafka.protocol.old declares DescribeLogDirs v0 Partitions as one Int32; Kafka's is []int32.
    ("kafka-python-old", "DescribeLogDirsRequest", 0),
    # both declare DescribeAcls v2 as v1's layout; Kafka's v2 is its first flexible version
    # (compact strings, tagged fields), as the kio oracle and Kafka's clients encode it.
    ("aiokafka", "DescribeAclsRequest", 2),
    ("aiokafka", "DescribeAclsResponse", 2),
    ("kafka-python-old", "DescribeAclsRequest", 2),
    ("kafka-python-old", "DescribeAclsResponse", 2),
}


def _tname(t) -> str:
    return t.__name__ if isinstance(t, type) else type(t).__name__


def _to_their_prim(t, x):
    n = _tname(t)
    if n == "BitField":
        return _to_bits(x)
    if n == "UUID":
        return None if x == ZERO_UUID else x
    if isinstance(x, memoryview):
        return bytes(x)
    return x


def _from_their_prim(t, x):
    n = _tname(t)
    if n == "BitField":
        return _from_bits(x)
    if n == "UUID" and x is None:
        return ZERO_UUID
    return x


def our_items(spec: MessageSpec, s: StructSpec, v: int, obj, narrow: bool) -> list:
    """Our struct as a flat list of wire items: inline structs spliced in, arrays of structs as
    lists of item tuples, tag sections left out (the Struct libraries model grouping and tags
    differently: an inline Schema, a one-field struct as a bare value, a tag dict or none)."""
    cls = struct_class(spec, s)
    default = cls()
    items: list = []
    for f, a in present(s, cls, v):
        if v in f.tagged:
            if narrow:
                setattr(obj, a, getattr(default, a))  # they carry tags only as raw bytes
            continue
        val = getattr(obj, a)
        if f.kind == "struct":
            assert v not in f.nullable
            items += our_items(spec, f.struct, v, val, narrow)
        elif f.kind == "array" and f.elem_is_struct:
            items.append(None if val is None else [tuple(our_items(spec, f.struct, v, x, narrow)) for x in val])
        elif f.kind == "array":
            items.append(None if val is None else list(val))
        else:
            items.append(val)
    if narrow:
        obj.unknown_tags = None
    return items


def build_theirs(schema, it, where: str) -> tuple:
    out = []
    for name, t in zip(schema.names, schema.fields):
        n = _tname(t)
        if n == "Schema":
            out.append(build_theirs(t, it, where))
        elif n == "TaggedFields":
            out.append({})
        elif n in ("Array", "CompactArray"):
            x = next(it)
            sub = t.array_of
            if x is None:
                out.append(None)
            elif _tname(sub) == "Schema":
                elems = []
                for e in x:
                    eit = iter(e if isinstance(e, tuple) else [e])
                    elems.append(build_theirs(sub, eit, where))
                    assert next(eit, StopIteration) is StopIteration, f"{where}: {name} element layout differs"
                out.append(elems)
            else:
                out.append([_to_their_prim(sub, e[0] if isinstance(e, tuple) and len(e) == 1 else e) for e in x])
        else:
            out.append(_to_their_prim(t, next(it)))
    return tuple(out)


def their_items(schema, values) -> list:
    items: list = []
    for t, val in zip(schema.fields, values):
        n = _tname(t)
        if n == "Schema":
            items += their_items(t, val)
        elif n == "TaggedFields":
            continue
        elif n in ("Array", "CompactArray"):
            sub = t.array_of
            if val is None:
                items.append(None)
            elif _tname(sub) == "Schema":
                items.append([tuple(their_items(sub, e)) for e in val])
            else:
                items.append([_from_their_prim(sub, e) for e in val])
        else:
            items.append(_from_their_prim(t, val))
    return items


def _normalize(x):
    """Struct elements are tuples, arrays lists; a one-item struct element is its bare value
    (an Array(String) is an array of one-field structs on the wire)."""
    if isinstance(x, tuple):
        return _normalize(x[0]) if len(x) == 1 else tuple(_normalize(y) for y in x)
    if isinstance(x, list):
        return [_normalize(y) for y in x]
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    return x


def _struct_oracle(spec: MessageSpec, v: int, tcls, name: str):
    if (name, spec.name, v) in STRUCT_ORACLE_DEFECTS:
        pytest.skip("oracle schema defect, see STRUCT_ORACLE_DEFECTS")
    cls = message_class(spec)
    schema = tcls.SCHEMA
    for ours in samples(spec, v, name):
        items = our_items(spec, spec.root, v, ours, narrow=True)
        it = iter(items)
        values = build_theirs(schema, it, f"{spec.name} v{v}")
        assert next(it, StopIteration) is StopIteration, f"{spec.name} v{v}: layout differs"
        # Schema.encode/decode: their codec, without class hooks (kafka.protocol.old decodes an
        # ApiVersions error response as v0, like a broker sends it).
        theirs = schema.encode(list(values))
        ours_bytes = ours.encode(v)
        assert ours_bytes == theirs, f"{spec.name} v{v}: bytes differ\nours   {ours_bytes.hex()}\ntheirs {theirs.hex()}"
        assert cls.decode(theirs, v) == ours
        buf = io.BytesIO(ours_bytes)
        decoded = schema.decode(buf)
        assert buf.tell() == len(ours_bytes)
        got = _normalize(their_items(schema, decoded))
        assert got == _normalize(items), f"{spec.name} v{v}: their decode of our bytes"


@pytest.mark.parametrize(("spec", "v", "tcls"), AIOKAFKA_PAIRS, ids=[f"{s.name}-v{v}" for s, v, _ in AIOKAFKA_PAIRS])
def test_aiokafka(spec: MessageSpec, v: int, tcls):
    _struct_oracle(spec, v, tcls, "aiokafka")


@pytest.mark.parametrize(("spec", "v", "tcls"), KP_OLD_PAIRS, ids=[f"{s.name}-v{v}" for s, v, _ in KP_OLD_PAIRS])
def test_kafka_python_old(spec: MessageSpec, v: int, tcls):
    _struct_oracle(spec, v, tcls, "kafka-python-old")


# ================================================================ coverage
def test_oracle_coverage(capsys):
    counts = {
        "kio": len(KIO_PAIRS),
        "kafka-python": len(KP_PAIRS),
        "kafka-python-old": len(KP_OLD_PAIRS),
        "aiokafka": len(AIOKAFKA_PAIRS),
    }
    apis = {
        name: len({(s.name) for s, _, _ in pairs})
        for name, pairs in (
            ("kio", KIO_PAIRS),
            ("kafka-python", KP_PAIRS),
            ("kafka-python-old", KP_OLD_PAIRS),
            ("aiokafka", AIOKAFKA_PAIRS),
        )
    }
    with capsys.disabled():
        print("\noracle coverage (message/version pairs, messages):", {k: (counts[k], apis[k]) for k in counts})
    # Every listed oracle defect names a pair that exists (the list cannot go stale silently).
    by_oracle = {"aiokafka": AIOKAFKA_PAIRS, "kafka-python-old": KP_OLD_PAIRS}
    for oracle, name, v in STRUCT_ORACLE_DEFECTS:
        assert any(s.name == name and pv == v for s, pv, _ in by_oracle[oracle]), (oracle, name, v)
    assert counts["kio"] >= 400
    assert counts["kafka-python"] >= 350
    assert counts["kafka-python-old"] >= 100
    assert counts["aiokafka"] >= 80
