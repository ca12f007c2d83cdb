"""Helpers the generated codecs call: strings, bytes, records and tagged-field sections.

Readers return (value, pos) and raise ProtocolError (or IndexError/struct.error, which the
generated code converts) on short or bad input; lengths are checked against the buffer
before anything is allocated.
"""

from __future__ import annotations

import struct
from typing import Any
from uuid import UUID, SafeUUID

from protocol.errors import ProtocolError
from protocol.primitives import INT16, INT32, ZERO_UUID, read_uvarint, uvarint

__all__ = ["ZERO_UUID", "read_uvarint", "uvarint"]

NULL_INT32 = b"\xff\xff\xff\xff"
NULL_INT16 = b"\xff\xff"
NULL_UVARINT = b"\x00"

# Errors that malformed input can raise inside generated decoders.
_DECODE_ERRORS = (struct.error, IndexError, ValueError, TypeError, OverflowError, UnicodeDecodeError)

_unpack_h = INT16.unpack_from
_unpack_i = INT32.unpack_from
_pack_h = INT16.pack
_pack_i = INT32.pack


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()  # Any: the default of a typed list or struct parameter, replaced at once


def _malformed(exc: Exception, field: str, pos: int) -> ProtocolError:
    if isinstance(exc, (struct.error, IndexError)):
        reason = "truncated input"
    elif isinstance(exc, UnicodeDecodeError):
        reason = "string is not valid UTF-8"
    else:
        reason = f"malformed input: {exc}"
    return ProtocolError(reason, field=field, offset=pos)


# Decoded UUIDs by their 16 bytes: the same topic ids come again in every Fetch, Produce and
# metadata record, and UUID(bytes=...) checks its arguments in Python (about 3 µs). UUIDs are
# immutable, so one object serves every decode; bounded: past the limit the table starts over.
_UUIDS: dict[bytes, UUID] = {}
_UUIDS_LIMIT = 1 << 14
_SAFE_UNKNOWN = SafeUUID.unknown


def uuid_of(raw: bytes) -> UUID:
    u = _UUIDS.get(raw)
    if u is None:
        u = object.__new__(UUID)
        object.__setattr__(u, "int", int.from_bytes(raw, "big"))  # what UUID.__init__ sets
        object.__setattr__(u, "is_safe", _SAFE_UNKNOWN)
        if len(_UUIDS) >= _UUIDS_LIMIT:
            _UUIDS.clear()
        _UUIDS[bytes(raw)] = u
    return u


def check_len(buf, pos: int, n: int) -> int:
    end = pos + n
    if n < 0 or end > len(buf):
        raise ProtocolError(f"length {n} runs past the end of the buffer ({len(buf) - pos} bytes left)")
    return end


# ---------------------------------------------------------------- readers
def read_str(buf, pos: int):
    n = _unpack_h(buf, pos)[0]
    pos += 2
    if n < 0:
        raise ProtocolError("null string in a non-nullable field")
    end = check_len(buf, pos, n)
    return str(buf[pos:end], "utf-8"), end


def read_str_n(buf, pos: int):
    n = _unpack_h(buf, pos)[0]
    pos += 2
    if n < 0:
        return None, pos
    end = check_len(buf, pos, n)
    return str(buf[pos:end], "utf-8"), end


def read_cstr(buf, pos: int):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise ProtocolError("null string in a non-nullable field")
    end = check_len(buf, pos, n - 1)
    return str(buf[pos:end], "utf-8"), end


def read_cstr_n(buf, pos: int):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = check_len(buf, pos, n - 1)
    return str(buf[pos:end], "utf-8"), end


def read_bytes(buf, pos: int):
    n = _unpack_i(buf, pos)[0]
    pos += 4
    if n < 0:
        raise ProtocolError("null bytes in a non-nullable field")
    end = check_len(buf, pos, n)
    return bytes(buf[pos:end]), end


def read_bytes_n(buf, pos: int):
    n = _unpack_i(buf, pos)[0]
    pos += 4
    if n < 0:
        return None, pos
    end = check_len(buf, pos, n)
    return bytes(buf[pos:end]), end


def read_cbytes(buf, pos: int):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise ProtocolError("null bytes in a non-nullable field")
    end = check_len(buf, pos, n - 1)
    return bytes(buf[pos:end]), end


def read_cbytes_n(buf, pos: int):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = check_len(buf, pos, n - 1)
    return bytes(buf[pos:end]), end


# Records stay a memoryview of the request buffer: the broker appends them without a copy.
def read_rec(buf, pos: int):
    n = _unpack_i(buf, pos)[0]
    pos += 4
    if n < 0:
        raise ProtocolError("null records in a non-nullable field")
    end = check_len(buf, pos, n)
    return buf[pos:end], end


def read_rec_n(buf, pos: int):
    n = _unpack_i(buf, pos)[0]
    pos += 4
    if n < 0:
        return None, pos
    end = check_len(buf, pos, n)
    return buf[pos:end], end


def read_crec(buf, pos: int):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise ProtocolError("null records in a non-nullable field")
    end = check_len(buf, pos, n - 1)
    return buf[pos:end], end


def read_crec_n(buf, pos: int):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = check_len(buf, pos, n - 1)
    return buf[pos:end], end


# ---------------------------------------------------------------- writers
def _null(what: str) -> ProtocolError:
    return ProtocolError(f"null {what} in a non-nullable field")


def write_str(parts: list, s: str) -> None:
    if s is None:
        raise _null("string")
    b = s.encode()
    parts.append(_pack_h(len(b)))
    parts.append(b)


def write_str_n(parts: list, s: str | None) -> None:
    if s is None:
        parts.append(NULL_INT16)
        return
    b = s.encode()
    parts.append(_pack_h(len(b)))
    parts.append(b)


def write_cstr(parts: list, s: str) -> None:
    if s is None:
        raise _null("string")
    b = s.encode()
    parts.append(uvarint(len(b) + 1))
    parts.append(b)


def write_cstr_n(parts: list, s: str | None) -> None:
    if s is None:
        parts.append(NULL_UVARINT)
        return
    b = s.encode()
    parts.append(uvarint(len(b) + 1))
    parts.append(b)


def _blen(b) -> int:
    if isinstance(b, (list, tuple)):  # records given as several parts (file reads)
        return sum(_blen(x) for x in b)
    return b.nbytes if isinstance(b, memoryview) else len(b)


def _append(parts: list, b) -> None:
    if isinstance(b, (list, tuple)):
        parts.extend(b)
    else:
        parts.append(b)


def write_bytes(parts: list, b) -> None:
    if b is None:
        raise _null("bytes")
    parts.append(_pack_i(_blen(b)))
    _append(parts, b)


def write_bytes_n(parts: list, b) -> None:
    if b is None:
        parts.append(NULL_INT32)
        return
    parts.append(_pack_i(_blen(b)))
    _append(parts, b)


def write_cbytes(parts: list, b) -> None:
    if b is None:
        raise _null("bytes")
    parts.append(uvarint(_blen(b) + 1))
    _append(parts, b)


def write_cbytes_n(parts: list, b) -> None:
    if b is None:
        parts.append(NULL_UVARINT)
        return
    parts.append(uvarint(_blen(b) + 1))
    _append(parts, b)


def write_tags(parts: list, known: list | None, unknown: dict | None) -> None:
    """A tagged-field section: known [(tag, bytes)] and unknown {tag: bytes}, by tag order."""
    items = list(known or ())
    if unknown:
        items.extend(unknown.items())
        items.sort(key=lambda t: t[0])
    parts.append(uvarint(len(items)))
    for tag, data in items:
        parts.append(uvarint(tag))
        parts.append(uvarint(len(data)))
        parts.append(data)
