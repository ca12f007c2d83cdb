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
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return every frame now complete (without its size prefix)."""
        self._buf += data
        frames = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            size = _SIZE.unpack_from(buf, pos)[0]
            if size < 0 or size > self.max_frame:
                raise ProtocolError(f"frame size {size} is outside 0..{self.max_frame}", offset=pos)
            if len(buf) - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames

    @property
    def pending(self) -> int:
        """Bytes buffered toward an incomplete frame."""
        return len(self._buf)


def frame(parts: list) -> list:
    """Prefix a list of bytes-like parts with their total size (for writelines)."""
    size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
    return [_SIZE.pack(size), *parts]
