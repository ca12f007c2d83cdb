"""Round trips of every generated message, in every version, driven by the spec model.

For each (message, version): (a) the default object, (b) Hypothesis values built from the spec
(only fields present in that version get values; None only where nullable; tagged fields
sometimes at their default), (c) explicit cases: every nullable field null, everything empty,
everything at its extreme and every tagged field set, unknown tagged fields kept.
"""

from __future__ import annotations

import uuid
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codegen.spec import FieldSpec, MessageSpec, StructSpec, load_all
from protocol.generated import (
    METADATA_RECORDS,
    REQUESTS,
    RESPONSES,
    RequestHeader,
    ResponseHeader,
)
from protocol.generated.control_records.leader_change_message import LeaderChangeMessage
from protocol.generated.control_records.voters_record import VotersRecord

ROOT = Path(__file__).resolve().parents[1]

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}

ALL_SPECS = load_all(ROOT / "schemas")


def message_class(spec: MessageSpec):
    """The generated class of a spec (None if not generated yet: see test_every_spec_is_generated)."""
    table = {"request": REQUESTS, "response": RESPONSES, "metadata": METADATA_RECORDS}.get(spec.type)
    if table is not None:
        cls = table.get(spec.api_key)
    else:
        cls = {"RequestHeader": RequestHeader, "ResponseHeader": ResponseHeader,
               "LeaderChangeMessage": LeaderChangeMessage, "VotersRecord": VotersRecord}.get(spec.name)
    return cls if cls is not None and cls.NAME == spec.name else None


def struct_class(msg_cls, spec: MessageSpec, s: StructSpec):
    return msg_cls if s is spec.root else getattr(msg_cls, s.name)


def attrs(cls, s: StructSpec) -> list[tuple[FieldSpec, str]]:
    assert len(cls._fields) == len(s.fields), (cls, s.name)
    return list(zip(s.fields, cls._fields))


def known_tags(s: StructSpec) -> set[int]:
    return {f.tag for f in s.fields if f.tag is not None}


SPECS = [spec for spec in ALL_SPECS if message_class(spec) is not None]
CASES = [(spec, v) for spec in SPECS for v in spec.versions()]
IDS = [f"{spec.name}-v{v}" for spec, v in CASES]


SPEC_OF = {message_class(spec): spec for spec in SPECS}


def canonical(obj, s: StructSpec, v: int):
    """What a decoder gives back: a tagged struct equal to its default is not written, so it
    reads back as absent (None), as Kafka skips such a tagged field."""
    import copy

    obj = copy.deepcopy(obj)

    def walk(o, st_: StructSpec) -> None:
        for f, name in zip(st_.fields, o._fields):
            if v not in f.versions or f.struct is None:
                continue
            val = getattr(o, name)
            if val is None:
                continue
            if f.is_array:
                for x in val:
                    walk(x, f.struct)
                continue
            if v in f.tagged and val == type(val)():
                setattr(o, name, None)
            else:
                walk(val, f.struct)

    walk(obj, s)
    return obj


def roundtrip(cls, obj, v: int):
    data = obj.encode(v)
    back = cls.decode(data, v)
    obj = canonical(obj, SPEC_OF[cls].root, v)
    assert back == obj, f"{cls.NAME} v{v}: {obj!r} -> {bytes(data).hex()} -> {back!r}"
    # Re-encoding the decoded object gives the same bytes.
    assert back.encode(v) == data
    # decode_from at an offset inside a larger buffer.
    back2, end = cls.decode_from(b"\x07\x07" + data + b"\x09", 2, v)
    assert end == 2 + len(data) and back2 == obj
    return data


# ---------------------------------------------------------------- Hypothesis strategies
def _primitive_st(kind: str) -> st.SearchStrategy:
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        return st.one_of(st.sampled_from([lo, hi, 0, -1 if lo < 0 else 1]), st.integers(lo, hi))
    return {
        "bool": st.booleans(),
        "float64": st.floats(allow_nan=False),
        "string": st.text(max_size=6),
        "bytes": st.binary(max_size=6),
        "records": st.binary(max_size=12),
        "uuid": st.one_of(st.just(uuid.UUID(int=0)), st.uuids()),
    }[kind]


def field_st(spec: MessageSpec, msg_cls, f: FieldSpec, v: int, depth: int) -> st.SearchStrategy:
    k = f.kind
    if k == "struct":
        base = struct_st(spec, msg_cls, f.struct, v, depth + 1)
    elif k == "array":
        if f.elem_is_struct:
            elem = struct_st(spec, msg_cls, f.struct, v, depth + 1)
        else:
            elem = _primitive_st(f.elem_type)
        base = st.lists(elem, max_size=3 if depth < 2 else 2)
    else:
        base = _primitive_st(k)
    if v in f.nullable:
        base = st.one_of(st.none(), base)
    return base


@cache
def _struct_st_cached(spec_idx: int, struct_name: str, v: int, depth: int) -> st.SearchStrategy:
    spec = SPECS[spec_idx]
    s = spec.root if struct_name == spec.root.name else next(x for x in spec.structs() if x.name == struct_name)
    msg_cls = message_class(spec)
    cls = struct_class(msg_cls, spec, s)
    default = cls()
    kw = {}
    for f, a in attrs(cls, s):
        if v not in f.versions:
            continue
        fs = field_st(spec, msg_cls, f, v, depth)
        if v in f.tagged:
            fs = st.one_of(st.just(getattr(default, a)), fs)
        kw[a] = fs
    if v in spec.flexible:
        taken = known_tags(s)
        tag = st.integers(0, 2**20).filter(lambda t: t not in taken)
        kw["unknown_tags"] = st.one_of(st.none(), st.dictionaries(tag, st.binary(max_size=4), max_size=2))
    return st.builds(cls, **kw)


def struct_st(spec: MessageSpec, msg_cls, s: StructSpec, v: int, depth: int = 0) -> st.SearchStrategy:
    return _struct_st_cached(SPECS.index(spec), s.name, v, depth)


# ---------------------------------------------------------------- explicit builders
def _extreme_value(kind: str, mode: str):
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        return {"min": lo, "max": hi}.get(mode, 0)
    return {
        "bool": mode == "max",
        "float64": {"min": -1.5e308, "max": float("inf")}.get(mode, 0.0),
        "string": {"max": "h\u00e9\u4e16\U0001f600" * 3, "min": "x"}.get(mode, ""),
        "bytes": {"max": bytes(range(256)), "min": b"\x00"}.get(mode, b""),
        "records": {"max": b"\xff" * 70, "min": b"\x00"}.get(mode, b""),
        "uuid": {"max": uuid.UUID(int=2**128 - 1), "min": uuid.UUID(int=1)}.get(mode, uuid.UUID(int=0)),
    }[kind]


def build(spec: MessageSpec, msg_cls, s: StructSpec, v: int, mode: str):
    """mode: 'null' (nullable fields null, other arrays one element), 'empty' (everything empty
    or zero, nullable fields present), 'min' / 'max' (extreme values, tagged fields set)."""
    cls = struct_class(msg_cls, spec, s)
    kw = {}
    for f, a in attrs(cls, s):
        if v not in f.versions:
            continue
        if mode == "null" and v in f.nullable:
            kw[a] = None
            continue
        k = f.kind
        if k == "struct":
            kw[a] = build(spec, msg_cls, f.struct, v, mode)
        elif k == "array":
            if mode == "empty":
                kw[a] = []
            elif f.elem_is_struct:
                kw[a] = [build(spec, msg_cls, f.struct, v, mode) for _ in range(1 if mode == "null" else 2)]
            else:
                kw[a] = [_extreme_value(f.elem_type, mode)] * 2
        else:
            kw[a] = _extreme_value(k, "zero" if mode in ("null", "empty") else mode)
    if mode == "max" and v in spec.flexible:
        kw["unknown_tags"] = {max(known_tags(s) | {0}) + 1: b"\x01\x02", 2**20: b""}
    return cls(**kw)


# ---------------------------------------------------------------- tests
def test_every_spec_is_generated():
    missing = [spec.name for spec in ALL_SPECS if message_class(spec) is None]
    assert not missing, f"specs without a generated class (run python -m protocol.codegen): {missing}"


def test_every_generated_class_has_a_spec():
    covered = {id(message_class(spec)) for spec in SPECS}
    for table in (REQUESTS, RESPONSES, METADATA_RECORDS):
        for cls in table.values():
            assert id(cls) in covered, cls.NAME
    for spec in SPECS:
        cls = message_class(spec)
        assert cls.NAME == spec.name
        assert (cls.MIN_VERSION, cls.MAX_VERSION) == (spec.versions()[0], spec.versions()[-1])
    assert len(CASES) > 400


@pytest.mark.parametrize(("spec", "v"), CASES, ids=IDS)
def test_default_roundtrip(spec: MessageSpec, v: int):
    cls = message_class(spec)
    roundtrip(cls, cls(), v)


@pytest.mark.parametrize(("spec", "v"), CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["null", "empty", "min", "max"])
def test_explicit_roundtrip(spec: MessageSpec, v: int, mode: str):
    cls = message_class(spec)
    obj = build(spec, cls, spec.root, v, mode)
    data = roundtrip(cls, obj, v)
    if mode == "max" and v in spec.flexible:
        # Every tagged field set and unknown tags kept in tag order at the end of the root.
        back = cls.decode(data, v)
        assert back.unknown_tags == obj.unknown_tags
        for f, a in attrs(cls, spec.root):
            if v in f.versions and v in f.tagged:
                assert getattr(back, a) == getattr(obj, a) != getattr(cls(), a), a


@pytest.mark.parametrize(("spec", "v"), CASES, ids=IDS)
def test_hypothesis_roundtrip(spec: MessageSpec, v: int):
    cls = message_class(spec)

    @settings(
        max_examples=15,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(struct_st(spec, cls, spec.root, v))
    def check(obj):
        roundtrip(cls, obj, v)

    check()


@pytest.mark.parametrize(
    ("spec", "v"), [c for c in CASES if c[1] in c[0].flexible], ids=lambda x: getattr(x, "name", x)
)
def test_tagged_fields_only_written_when_set(spec: MessageSpec, v: int):
    """A default object writes an empty tag section; setting one tagged field adds exactly its tag."""
    cls = message_class(spec)
    base = cls().encode(v)
    for f, a in attrs(cls, spec.root):
        if v not in f.versions or v not in f.tagged:
            continue
        one = build(spec, cls, spec.root, v, "max")
        obj = cls(**{a: getattr(one, a)})
        data = obj.encode(v)
        assert data != base and cls.decode(data, v) == obj
        assert getattr(cls.decode(base, v), a) == getattr(cls(), a)


@pytest.mark.parametrize(
    ("spec", "v"), [c for c in CASES if c[1] not in c[0].flexible], ids=lambda x: getattr(x, "name", x)
)
def test_non_flexible_rejects_nothing_extra(spec: MessageSpec, v: int):
    """Non-flexible versions carry no tag section: one extra byte is a trailing-bytes error."""
    from protocol.errors import ProtocolError

    cls = message_class(spec)
    data = cls().encode(v)
    with pytest.raises(ProtocolError):
        cls.decode(data + b"\x00", v)
