"""Wire primitives shared by the generated codecs and the record-batch code.

Readers take ``(buf, pos)`` and return ``(value, new_pos)``; ``buf`` is a memoryview or bytes.
They raise only ``ProtocolError`` (or IndexError/struct.error, which the generated codecs turn
into ``ProtocolError`` with the field name attached).
"""

from __future__ import annotations

import struct
from uuid import UUID

from protocol.errors import ProtocolError

ZERO_UUID = UUID(int=0)

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
UINT16 = struct.Struct(">H")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")
FLOAT64 = struct.Struct(">d")


def read_uvarint(buf, pos: int) -> tuple[int, int]:
    """Unsigned LEB128, at most 5 bytes (Kafka's unsigned varint is 32-bit)."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("unsigned varint longer than 5 bytes", offset=pos)
        if shift == 28 and buf[pos] > 0x0F:
            raise ProtocolError("unsigned varint exceeds 32 bits", offset=pos)


def read_uvarlong(buf, pos: int) -> tuple[int, int]:
    """Unsigned LEB128, at most 10 bytes."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtocolError("varlong longer than 10 bytes", offset=pos)


def read_varint(buf, pos: int) -> tuple[int, int]:
    """Zig-zag signed varint (32-bit)."""
    v, pos = read_uvarint(buf, pos)
    return (v >> 1) ^ -(v & 1), pos


def read_varlong(buf, pos: int) -> tuple[int, int]:
    """Zig-zag signed varlong (64-bit)."""
    v, pos = read_uvarlong(buf, pos)
    return (v >> 1) ^ -(v & 1), pos


_SMALL = [bytes([i]) for i in range(128)]


def uvarint(v: int) -> bytes:
    if v < 0x80:
        return _SMALL[v]
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def varint(v: int) -> bytes:
    """Zig-zag encode; works for 32 and 64 bit values alike."""
    return uvarint((v << 1) ^ (v >> 63))


def uvarint_size(v: int) -> int:
    n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


def varint_size(v: int) -> int:
    return uvarint_size((v << 1) ^ (v >> 63))


def check_len(buf, pos: int, n: int) -> int:
    """End position of an n-byte item at pos, or ProtocolError if the buffer is shorter."""
    end = pos + n
    if n < 0 or end > len(buf):
        raise ProtocolError(f"length {n} runs past the end of the buffer ({len(buf) - pos} bytes left)", offset=pos)
    return end
