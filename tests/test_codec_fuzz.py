"""Fuzzing every generated decoder (every message, every version).

Decoders must raise only ProtocolError on bad input, and must never allocate in proportion to
a length read from the wire before checking it against the buffer. Cases:
(a) random bytes, (b) valid encodings truncated at every position (random positions for long
ones), (c) valid encodings with random byte flips, (d) crafted frames whose array / string /
bytes / tagged-field length is huge (2**31-1, compact 2**31 and more) inside ~20 bytes, decoded
under tracemalloc with a 1 MB peak bound.
"""

from __future__ import annotations

import random
import tracemalloc
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codegen.spec import FieldSpec, MessageSpec, StructSpec, load_all
from protocol.errors import ProtocolError
from protocol.generated import (
    METADATA_RECORDS,
    REQUESTS,
    RESPONSES,
    RequestHeader,
    ResponseHeader,
)
from protocol.primitives import uvarint

ROOT = Path(__file__).resolve().parents[1]

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
FIXED_SIZE = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "float64": 8,
    "uuid": 16,
}
MEMORY_BOUND = 1 << 20


def message_class(spec: MessageSpec):
    """The generated class of a spec (None if not generated yet: see test_every_spec_is_generated)."""
    table = {"request": REQUESTS, "response": RESPONSES, "metadata": METADATA_RECORDS}.get(spec.type)
    if table is not None:
        cls = table.get(spec.api_key)
    else:
        cls = {"RequestHeader": RequestHeader, "ResponseHeader": ResponseHeader}.get(spec.name)
    return cls if cls is not None and cls.NAME == spec.name else None


SPECS = [spec for spec in load_all(ROOT / "schemas") if message_class(spec) is not None]


CASES = [(spec, v) for spec in SPECS for v in spec.versions()]
IDS = [f"{spec.name}-v{v}" for spec, v in CASES]


def decode_ok_or_protocol_error(cls, data: bytes, v: int):
    """Decode; anything but success or ProtocolError fails the test. A success must re-encode."""
    try:
        obj = cls.decode(data, v)
    except ProtocolError:
        return None
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{cls.NAME} v{v}: {type(e).__name__}: {e} on input {data.hex()}") from e
    # Whatever decoded must encode again, and that encoding is a fixed point.
    try:
        again = obj.encode(v)
    except ProtocolError:
        return obj
    assert cls.decode(again, v).encode(v) == again, f"{cls.NAME} v{v}: not a fixed point: {data.hex()}"
    return obj


# ---------------------------------------------------------------- valid encodings
def _value(kind: str, mode: str):
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        return {"min": lo, "max": hi}.get(mode, 0)
    return {
        "bool": mode == "max",
        "float64": {"min": -1.5, "max": 2.5e300}.get(mode, 0.0),
        "string": {"max": "h\u00e9\u4e16\U0001f600", "min": "x"}.get(mode, ""),
        "bytes": {"max": b"\x01\x02\x03", "min": b"\x00"}.get(mode, b""),
        "records": {"max": b"\xff" * 9, "min": b"\x00"}.get(mode, b""),
        "uuid": {"max": uuid.UUID(int=2**128 - 1), "min": uuid.UUID(int=1)}.get(mode, uuid.UUID(int=0)),
    }[kind]


def build(spec: MessageSpec, msg_cls, s: StructSpec, v: int, mode: str):
    cls = msg_cls if s is spec.root else getattr(msg_cls, s.name)
    kw = {}
    for f, a in zip(s.fields, cls._fields):
        if v not in f.versions:
            continue
        if mode == "null" and v in f.nullable:
            kw[a] = None
        elif f.kind == "struct":
            kw[a] = build(spec, msg_cls, f.struct, v, mode)
        elif f.kind == "array":
            if mode == "empty":
                kw[a] = []
            elif f.elem_is_struct:
                kw[a] = [build(spec, msg_cls, f.struct, v, mode) for _ in range(1 if mode == "null" else 2)]
            else:
                kw[a] = [_value(f.elem_type, mode)] * 2
        else:
            kw[a] = _value(f.kind, "zero" if mode in ("null", "empty") else mode)
    if mode == "max" and v in spec.flexible:
        kw["unknown_tags"] = {max([f.tag for f in s.fields if f.tag is not None] + [0]) + 1: b"\x05"}
    return cls(**kw)


def valid_encodings(spec: MessageSpec, v: int) -> list[bytes]:
    cls = message_class(spec)
    out = [cls().encode(v)]
    for mode in ("null", "empty", "min", "max"):
        out.append(build(spec, cls, spec.root, v, mode).encode(v))
    return out


# ---------------------------------------------------------------- crafted huge lengths
def _fflex(f: FieldSpec, v: int, flex: bool) -> bool:
    return flex if f.flexible_override is None else v in f.flexible_override


def _huge(kind: str, fflex: bool) -> list[bytes]:
    if fflex:
        return [uvarint(2**31), uvarint(2**31 + 1), uvarint(2**32 - 1), b"\xff\xff\xff\xff\x7f"]
    if kind == "string":
        return [b"\x7f\xff"]
    return [b"\x7f\xff\xff\xff", b"\x40\x00\x00\x00"]


def _empty(kind: str, fflex: bool) -> bytes:
    if fflex:
        return b"\x01"
    return b"\x00\x00" if kind == "string" else b"\x00\x00\x00\x00"


def craft(s: StructSpec, v: int, flex: bool) -> tuple[bytes, list[bytes]]:
    """(a minimal valid encoding of s, prefixes that end in a huge length at each variable field)."""
    out = b""
    crafts: list[bytes] = []
    for f in s.fields:
        if v not in f.versions or v in f.tagged:
            continue
        ff = _fflex(f, v, flex)
        k = f.kind
        if k in FIXED_SIZE:
            out += b"\x00" * FIXED_SIZE[k]
        elif k in ("string", "bytes", "records"):
            crafts += [out + h for h in _huge(k, ff)]
            out += _empty(k, ff)
        elif k == "struct":
            marker = b"\x01" if v in f.nullable else b""
            sub, sub_crafts = craft(f.struct, v, flex)
            crafts += [out + marker + c for c in sub_crafts]
            out += marker + sub
        else:  # array
            one = uvarint(2) if ff else b"\x00\x00\x00\x01"
            crafts += [out + h for h in _huge("array", ff)]
            if f.elem_is_struct:
                _, sub_crafts = craft(f.struct, v, flex)
                crafts += [out + one + c for c in sub_crafts]
            elif f.elem_type in ("string", "bytes"):
                crafts += [out + one + h for h in _huge(f.elem_type, ff)]
            out += _empty("array", ff)
    if flex:
        crafts.append(out + uvarint(2**31))  # tag count
        crafts.append(out + b"\x01" + uvarint(2**31) + uvarint(2**31))  # unknown tag, huge size
        for f in s.fields:
            if v in f.versions and v in f.tagged:
                crafts.append(out + b"\x01" + uvarint(f.tag) + uvarint(2**31 - 1))
                if f.kind in ("string", "bytes", "array"):
                    for h in _huge(f.kind, True):
                        crafts.append(out + b"\x01" + uvarint(f.tag) + uvarint(len(h) + 4) + h)
        out += b"\x00"
    return out, crafts


def crafted_frames(spec: MessageSpec, v: int) -> list[bytes]:
    _, crafts = craft(spec.root, v, v in spec.flexible)
    return [c + b"\x00" * max(0, 20 - len(c)) for c in crafts]


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize(("spec", "v"), CASES, ids=IDS)
def test_truncated_encodings(spec: MessageSpec, v: int):
    """Every strict prefix of a valid encoding is a ProtocolError (never another exception)."""
    cls = message_class(spec)
    rnd = random.Random(f"{spec.name}{v}")
    for data in valid_encodings(spec, v):
        assert cls.decode(data, v).encode(v) == data
        cuts = range(len(data)) if len(data) <= 1024 else rnd.sample(range(len(data)), 256)
        for cut in cuts:
            try:
                cls.decode(data[:cut], v)
            except ProtocolError:
                continue
            except Exception as e:  # noqa: BLE001
                raise AssertionError(f"{spec.name} v{v} cut {cut}: {type(e).__name__}: {e}") from e
            raise AssertionError(f"{spec.name} v{v}: prefix of {cut} bytes decoded: {data[:cut].hex()}")
        # decode_from on a memoryview of a larger buffer stops at the right place.
        _, end = cls.decode_from(memoryview(data + b"\xee" * 3), 0, v)
        assert end == len(data)


@pytest.mark.parametrize(("spec", "v"), CASES, ids=IDS)
def test_random_bytes_and_flips(spec: MessageSpec, v: int):
    cls = message_class(spec)
    encodings = valid_encodings(spec, v)

    flips = st.tuples(
        st.sampled_from(encodings),
        st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=4),
    ).map(lambda t: _flip(*t))
    spliced = st.tuples(st.sampled_from(encodings), st.integers(0, 1 << 16), st.binary(max_size=12)).map(
        lambda t: t[0][: t[1] % (len(t[0]) + 1)] + t[2]
    )

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.one_of(st.binary(max_size=48), flips, spliced))
    def check(data: bytes):
        decode_ok_or_protocol_error(cls, data, v)

    check()


def _flip(data: bytes, changes: list[tuple[int, int]]) -> bytes:
    if not data:
        return bytes(b for _, b in changes)
    buf = bytearray(data)
    for pos, b in changes:
        buf[pos % len(buf)] = b
    return bytes(buf)


@pytest.mark.parametrize(("spec", "v"), CASES, ids=IDS)
def test_huge_lengths_do_not_allocate(spec: MessageSpec, v: int):
    cls = message_class(spec)
    frames = crafted_frames(spec, v)
    if not frames:
        # Only fixed-size fields: nothing carries a length. The frame is still rejected if short.
        assert all(f.kind in FIXED_SIZE for f in spec.root.fields if v in f.versions)
        frames = [b"\xff" * 3]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        for frame in frames:
            try:
                cls.decode(frame, v)
            except ProtocolError:
                continue
            except Exception as e:  # noqa: BLE001
                raise AssertionError(f"{spec.name} v{v}: {type(e).__name__}: {e} on {frame.hex()}") from e
            raise AssertionError(f"{spec.name} v{v}: crafted frame decoded: {frame.hex()}")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"{spec.name} v{v}: peak {peak} bytes"


def test_crafted_frames_cover_every_variable_length_field():
    """Every message-version with a length on the wire gets crafted frames (not vacuous)."""
    total = 0
    for spec, v in CASES:
        frames = crafted_frames(spec, v)
        total += len(frames)
        fixed_only = v not in spec.flexible and all(f.kind in FIXED_SIZE for f in spec.root.fields if v in f.versions)
        assert frames or fixed_only, (spec.name, v)
    assert total > 5 * len(CASES), total


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", b"\xff" * 5, b"\x80\x80\x80\x80\x80\x80", b"\xff\xff\xff\xff\xff\xff\xff\xff\x7f"],
    ids=["empty", "zero", "ones", "long-varint", "varint-overflow"],
)
def test_edge_frames_all_decoders(data: bytes):
    for spec, v in CASES:
        decode_ok_or_protocol_error(message_class(spec), data, v)


def test_unsupported_version_is_protocol_error():
    for spec in SPECS:
        cls = message_class(spec)
        for v in (spec.versions()[-1] + 1, -1):
            with pytest.raises(ProtocolError):
                cls.decode(b"\x00" * 16, v)
            with pytest.raises(ProtocolError):
                cls().encode(v)
