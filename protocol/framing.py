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

    def feed(self, data: bytes) -> list:
        """Add received bytes; return every frame now complete (without its size prefix).

        A frame that arrives whole in one read is a zero-copy memoryview of `data` (immutable
        bytes); a frame that spans reads is assembled in the buffer and copied out once.
        """
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        frames = []
        pos = 0
        n = len(buf)
        view = memoryview(buf)
        try:
            while n - pos >= 4:
                size = _SIZE.unpack_from(buf, pos)[0]
                if size < 0 or size > self.max_frame:
                    raise ProtocolError(f"frame size {size} is outside 0..{self.max_frame}", offset=pos)
                if n - pos - 4 < size:
                    break
                if buf is data:
                    frames.append(view[pos + 4 : pos + 4 + size])
                else:  # no named sub-view may outlive this: the bytearray is resized below
                    frames.append(bytes(view[pos + 4 : pos + 4 + size]))
                pos += 4 + size
        finally:
            if buf is self._buf:
                view.release()  # the bytearray may not be resized while a view of it exists
        if buf is self._buf:
            if pos:
                del self._buf[:pos]
        elif pos < n:
            self._buf += data[pos:]
        return frames

    @property
    def pending(self) -> int:
        """Bytes buffered toward an incomplete frame."""
        return len(self._buf)

    @property
    def incomplete_size(self) -> int | None:
        """The declared size (prefix included) of the frame being assembled, once its 4-byte prefix
        is buffered; None otherwise. A server reserves memory for it before reading further."""
        if len(self._buf) < 4:
            return None
        return 4 + _SIZE.unpack_from(self._buf, 0)[0]


def frame(parts: list) -> list:
    """Prefix a list of bytes-like parts with their total size (for writelines)."""
    size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
    return [_SIZE.pack(size), *parts]
