"""The OpenTelemetry MetricsData decoder (protocol/otlp.py), sans-IO: a hand-built message decodes
to its points, and malformed input (a field of another wire type, random damage) is a
ProtocolError, never another exception or a huge allocation."""

from __future__ import annotations

import random
import struct

import pytest

from protocol.errors import ProtocolError
from protocol.otlp import decode_metrics_data


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | 0x80 if v else b)
        if not v:
            return bytes(out)


def _len(num: int, body: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(body)) + body


def _var(num: int, v: int) -> bytes:
    return _varint(num << 3) + _varint(v)


def _fixed64(num: int, raw: bytes) -> bytes:
    return _varint(num << 3 | 1) + raw


def _kv(key: str, value: str) -> bytes:
    return _len(1, key.encode()) + _len(2, _len(1, value.encode()))


def _message(metric: bytes) -> bytes:
    resource = _len(1, _len(1, _kv("service.name", "app")))  # ResourceMetrics.resource.attributes
    return _len(1, resource + _len(2, _len(2, metric)))


def _sum_metric() -> bytes:
    point = (_fixed64(3, struct.pack("<Q", 1_000)) + _fixed64(4, struct.pack("<d", 2.5))
             + _len(7, _kv("topic", "t")))
    return _len(1, b"producer.sent") + _len(7, _len(1, point) + _var(3, 1))


def test_decodes_a_monotonic_sum() -> None:
    [m] = decode_metrics_data(_message(_sum_metric()))
    assert m.resource == {"service.name": "app"}
    [p] = m.points
    assert (p.metric, p.kind, p.value, p.attributes, p.time_unix_nano, p.monotonic) == (
        "producer.sent", "sum", 2.5, {"topic": "t"}, 1_000, True)


@pytest.mark.parametrize("metric", [
    _var(1, 1 << 40),  # a name sent as a varint: never bytes(2**40)
    _len(1, b"m") + _var(7, 5),  # a sum as a varint
    _len(1, b"m") + _len(5, _var(1, 3)),  # a gauge's data point as a varint
    _len(1, b"m") + _len(5, _len(1, _var(4, 7))),  # as_double as a varint
    _len(1, b"m") + _len(5, _len(1, _fixed64(4, bytes(8)) + _var(7, 1))),  # attributes as a varint
])
def test_a_field_of_another_wire_type_is_refused(metric: bytes) -> None:
    with pytest.raises(ProtocolError, match="wire type"):
        decode_metrics_data(_message(metric))


def test_random_damage_is_a_protocol_error_or_a_decode() -> None:
    good = _message(_sum_metric())
    rng = random.Random(7)
    for _ in range(2_000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            decode_metrics_data(bytes(data))
        except ProtocolError:
            pass
