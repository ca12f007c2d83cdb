"""Base classes of the generated message types.

A generated struct is a plain ``__slots__`` class: positional-or-keyword ``__init__`` in wire
order, equality and repr by slots. Fields that a version lacks keep their defaults.
Unknown tagged fields read from the wire are kept in ``unknown_tags`` ({tag: bytes}) and
written back, so a message survives a round trip through an older schema.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeAlias

from protocol.errors import Errors, ProtocolError

# A records field's value: decoding gives a view of the request buffer; to encode, any bytes-like
# value, or a list of bytes-like parts (several file reads, sent without joining them).
Records: TypeAlias = bytes | bytearray | memoryview | list[bytes | memoryview]


class Struct:
    __slots__: tuple[str, ...] = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._fields) and _tags(self) == _tags(other)

    def __repr__(self) -> str:
        body = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__qualname__}({body})"

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts and lists, for logs, tools and tests."""
        return {f: _plain(getattr(self, f)) for f in self._fields}

    __hash__ = None  # type: ignore[assignment]  # mutable


def _tags(obj: Struct) -> dict:
    return getattr(obj, "unknown_tags", None) or {}


def _plain(v: Any) -> Any:
    if isinstance(v, Struct):
        return v.to_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, memoryview):
        return bytes(v)
    return v


class Message(Struct):
    """A top-level request, response, header or metadata record."""

    __slots__ = ()
    API_KEY: ClassVar[int | None] = None
    NAME: ClassVar[str] = ""
    KIND: ClassVar[str] = ""  # request / response / header / metadata
    MIN_VERSION: ClassVar[int] = 0
    MAX_VERSION: ClassVar[int] = 0
    FLEXIBLE_FROM: ClassVar[int | None] = None  # first flexible version, None if never
    _encoders: ClassVar[dict] = {}
    _decoders: ClassVar[dict] = {}

    @classmethod
    def is_flexible(cls, version: int) -> bool:
        return cls.FLEXIBLE_FROM is not None and version >= cls.FLEXIBLE_FROM

    @classmethod
    def _codec(cls, table: dict, version: int):
        try:
            return table[version]
        except KeyError:
            raise ProtocolError(
                f"unsupported version {version} (valid {cls.MIN_VERSION}-{cls.MAX_VERSION})",
                api=cls.NAME,
                version=version,
                error_code=Errors.UNSUPPORTED_VERSION,
            ) from None

    def encode_parts(self, version: int) -> list:
        """The encoding as a list of bytes-like parts (records stay uncopied)."""
        parts: list = []
        try:
            self._codec(self._encoders, version)(self, parts)
        except ProtocolError as e:
            if e.api is None:
                e.api, e.version = self.NAME, version
            raise
        return parts

    def encode(self, version: int) -> bytes:
        return b"".join(self.encode_parts(version))

    @classmethod
    def decode_from(cls, data, pos: int, version: int) -> tuple[Any, int]:
        """Decode at ``pos``; returns (message, position after it)."""
        dec = cls._codec(cls._decoders, version)
        buf = data if isinstance(data, memoryview) else memoryview(data)
        try:
            return dec(buf, pos)
        except ProtocolError as e:
            if e.api is None:
                e.api, e.version = cls.NAME, version
            raise
        except RecursionError:
            raise ProtocolError("message nests too deeply", api=cls.NAME, version=version) from None

    @classmethod
    def decode(cls, data, version: int) -> Any:
        """Decode a whole buffer; trailing bytes are an error."""
        msg, end = cls.decode_from(data, 0, version)
        if end != len(data):
            raise ProtocolError(f"{len(data) - end} trailing bytes", api=cls.NAME, version=version, offset=end)
        return msg
