"""OpenTelemetry's MetricsData v1 (the protobuf a KIP-714 client pushes in PushTelemetry), decoded
into flat data points. Sans-IO, and only what a metrics exporter reads: the resource's attributes,
each metric's name and kind, and each number data point's attributes, time and value (gauges and
sums); a histogram point gives its count and sum. Unknown fields are skipped, as protobuf wants.

Field numbers are opentelemetry-proto's (metrics/v1/metrics.proto, common/v1/common.proto)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import ProtocolError

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
_D = struct.Struct("<d")
_Q = struct.Struct("<Q")
_q = struct.Struct("<q")


@dataclass
class Point:
    metric: str
    kind: str  # gauge, sum, histogram_count, histogram_sum
    value: float
    attributes: dict[str, str] = field(default_factory=dict)
    time_unix_nano: int = 0
    monotonic: bool = False


@dataclass
class Metrics:
    resource: dict[str, str]
    points: list[Point]


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtocolError("protobuf varint runs past the end")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtocolError("protobuf varint too long")


def _fields(buf: memoryview, known: dict[int, int]) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of the fields in `known` (number -> the wire type its
    proto declares): an int for varints and fixed, a memoryview for LEN. Other fields are skipped;
    a known field of another wire type is malformed (a varint where bytes belong must never
    become a length to allocate)."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        value: Any
        if wt == VARINT:
            value, pos = _varint(buf, pos)
        elif wt == FIXED64:
            if pos + 8 > len(buf):
                raise ProtocolError("protobuf fixed64 runs past the end")
            value, pos = _Q.unpack_from(buf, pos)[0], pos + 8
        elif wt == LEN:
            n, pos = _varint(buf, pos)
            if pos + n > len(buf):
                raise ProtocolError("protobuf field runs past the end")
            value, pos = buf[pos:pos + n], pos + n
        elif wt == FIXED32:
            if pos + 4 > len(buf):
                raise ProtocolError("protobuf fixed32 runs past the end")
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ProtocolError(f"protobuf wire type {wt} is not supported")
        expected = known.get(num)
        if expected is None:
            continue
        if wt != expected:
            raise ProtocolError(f"protobuf field {num} has wire type {wt}, not {expected}")
        yield num, wt, value


# The fields read, with their declared wire types (opentelemetry-proto v1)
_METRICS_DATA = {1: LEN}  # resource_metrics
_RESOURCE_METRICS = {1: LEN, 2: LEN}  # resource, scope_metrics
_RESOURCE = {1: LEN}  # attributes
_SCOPE_METRICS = {2: LEN}  # metrics
_METRIC = {1: LEN, 5: LEN, 7: LEN, 9: LEN}  # name, gauge, sum, histogram
_POINTS = {1: LEN}  # data_points (gauge, histogram)
_SUM = {1: LEN, 3: VARINT}  # data_points, is_monotonic
_NUMBER_POINT = {3: FIXED64, 4: FIXED64, 6: FIXED64, 7: LEN}  # time, as_double, as_int, attributes
_HISTOGRAM_POINT = {3: FIXED64, 4: FIXED64, 5: FIXED64, 9: LEN}  # time, count, sum, attributes
_KEY_VALUE = {1: LEN, 2: LEN}
_ANY_VALUE = {1: LEN, 2: VARINT, 3: VARINT, 4: FIXED64}  # string, bool, int, double


def _double(bits: int) -> float:
    return float(_D.unpack(_Q.pack(bits))[0])


def _any_value(buf: memoryview) -> str:
    """AnyValue as text: string 1, bool 2, int 3, double 4 (arrays and maps are left out)."""
    for num, _, v in _fields(buf, _ANY_VALUE):
        if num == 1:
            return bytes(v).decode("utf-8", "replace")
        if num == 2:
            return "true" if v else "false"
        if num == 3:
            n = int(v)
            return str(n - (1 << 64) if n >= 1 << 63 else n)
        if num == 4:
            return repr(_double(v))
    return ""


def _attributes(kvs: list[memoryview]) -> dict[str, str]:
    out = {}
    for kv in kvs:
        key, value = "", ""
        for num, _, v in _fields(kv, _KEY_VALUE):
            if num == 1:
                key = bytes(v).decode("utf-8", "replace")
            elif num == 2:
                value = _any_value(v)
        if key:
            out[key] = value
    return out


def _number_point(buf: memoryview, name: str, kind: str, monotonic: bool) -> Point | None:
    attrs: list[memoryview] = []
    value: float | None = None
    t = 0
    for num, _, v in _fields(buf, _NUMBER_POINT):
        if num == 7:
            attrs.append(v)
        elif num == 3:
            t = int(v)
        elif num == 4:
            value = _double(v)
        elif num == 6:
            n = int(v)
            value = float(_q.unpack(_Q.pack(n))[0])
    if value is None:
        return None
    return Point(name, kind, value, _attributes(attrs), t, monotonic)


def _histogram_points(buf: memoryview, name: str) -> list[Point]:
    attrs: list[memoryview] = []
    count, total, t = 0, None, 0
    for num, _, v in _fields(buf, _HISTOGRAM_POINT):
        if num == 9:
            attrs.append(v)
        elif num == 3:
            t = int(v)
        elif num == 4:
            count = int(v)
        elif num == 5:
            total = _double(v)
    a = _attributes(attrs)
    out = [Point(name, "histogram_count", float(count), a, t, True)]
    if total is not None:
        out.append(Point(name, "histogram_sum", total, dict(a), t, True))
    return out


def _metric(buf: memoryview) -> list[Point]:
    name = ""
    out: list[Point] = []
    bodies: list[tuple[int, memoryview]] = []
    for num, _, v in _fields(buf, _METRIC):
        if num == 1:
            name = bytes(v).decode("utf-8", "replace")
        elif num in (5, 7, 9):  # gauge, sum, histogram
            bodies.append((num, v))
    for kind, body in bodies:
        parts = list(_fields(body, _SUM if kind == 7 else _POINTS))
        monotonic = kind == 7 and any(n == 3 and v for n, _, v in parts)
        for num, _, v in parts:
            if num != 1:
                continue
            if kind == 9:
                out += _histogram_points(v, name)
            else:
                p = _number_point(v, name, "gauge" if kind == 5 else "sum", monotonic)
                if p is not None:
                    out.append(p)
    return out


def decode_metrics_data(data: bytes) -> list[Metrics]:
    """Every ResourceMetrics of a MetricsData message. Raises ProtocolError when it is not one."""
    out = []
    try:
        for _, _, rm in _fields(memoryview(data), _METRICS_DATA):
            resource: dict[str, str] = {}
            points: list[Point] = []
            for n2, _, v2 in _fields(rm, _RESOURCE_METRICS):
                if n2 == 1:
                    resource = _attributes([v for _, _, v in _fields(v2, _RESOURCE)])
                elif n2 == 2:
                    for _, _, v3 in _fields(v2, _SCOPE_METRICS):
                        points += _metric(v3)
            out.append(Metrics(resource, points))
    except (ValueError, UnicodeError, struct.error) as e:
        raise ProtocolError(f"not an OpenTelemetry MetricsData message: {e}") from None
    return out
