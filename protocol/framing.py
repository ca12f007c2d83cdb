"""Kafka's size-prefixed frames, sans-IO: bytes in, whole frames out.

Like h11, the reader holds a bounded buffer: a frame whose declared size is above
``max_frame`` (the broker's ``socket.request.max.bytes``, Kafka's default 100 MiB) is refused
before a byte of it is buffered.
"""

from __future__ import annotations

import struct

from protocol.errors import ProtocolError

_SIZE = struct.Struct(">i")
DEFAULT_MAX_FRAME = 104857600  # Kafka's socket.request.max.bytes default


class FrameReader:
    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        # received bytes toward the next frame(s), not yet copied anywhere: the first starts at a
        # frame boundary (memoryviews of the immutable bytes the transport handed us)
        self._chunks: list = []
        self._have = 0  # their total size
        self._want: int | None = None  # the size (prefix included) of the frame they start, once known

    def feed(self, data: bytes) -> list:
        """Add received bytes; return every frame now complete (without its size prefix).

        Frames are zero-copy memoryviews of immutable bytes: of `data` when a frame arrives whole
        in one read; a frame that spans reads is joined once, when its last byte arrives (a 1 MB
        frame read in 256 KiB pieces is copied once, not grown in a buffer and copied out again).
        """
        if self._chunks:
            self._chunks.append(data)
            self._have += len(data)
            if self._want is None:
                self._want = self._declared()
            if self._want is None or self._have < self._want:
                return []
            buf = b"".join(self._chunks)
            self._chunks.clear()
            self._have = 0
            self._want = None
        else:
            buf = data
        frames = []
        pos = 0
        n = len(buf)
        view = memoryview(buf)
        while n - pos >= 4:
            size = _SIZE.unpack_from(buf, pos)[0]
            if size < 0 or size > self.max_frame:
                raise ProtocolError(f"frame size {size} is outside 0..{self.max_frame}", offset=pos)
            if n - pos - 4 < size:
                self._want = 4 + size
                break
            frames.append(view[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos < n:
            self._chunks.append(view[pos:])
            self._have = n - pos
        return frames

    def _declared(self) -> int | None:
        """The buffered frame's size with its prefix, once its 4-byte prefix has arrived."""
        if self._have < 4:
            return None
        head = b""
        for chunk in self._chunks:  # the prefix may span reads of a few bytes each
            head += bytes(chunk[: 4 - len(head)])
            if len(head) == 4:
                break
        size = _SIZE.unpack(head)[0]
        if size < 0 or size > self.max_frame:
            raise ProtocolError(f"frame size {size} is outside 0..{self.max_frame}", offset=0)
        return 4 + size

    @property
    def pending(self) -> int:
        """Bytes buffered toward an incomplete frame."""
        return self._have

    @property
    def incomplete_size(self) -> int | None:
        """The declared size (prefix included) of the frame being assembled, once its 4-byte prefix
        is buffered; None otherwise. A server reserves memory for it before reading further."""
        if self._want is None and self._have >= 4:
            self._want = self._declared()
        return self._want


def frame(parts: list) -> list:
    """Prefix a list of bytes-like parts with their total size (for writelines)."""
    size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
    return [_SIZE.pack(size), *parts]


JOIN_MAX = 64 * 1024


def frame_joined(parts: list) -> list:
    """frame() of bytes and byte memoryviews, joined into one buffer when under JOIN_MAX: a small
    answer's ~15 encoded parts then cost one copy in C, not a size sum in Python and a buffer
    each in the transport; a large one keeps its parts (no copy of megabytes of records)."""
    size = sum(map(len, parts))  # len of a byte memoryview is its size
    if size > JOIN_MAX:
        return [_SIZE.pack(size), *parts]
    return [_SIZE.pack(size) + b"".join(parts)]
