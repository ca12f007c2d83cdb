"""A records value that stays in its file until it is sent: a descriptor and a byte range.

Storage hands a Fetch answer's large reads over as regions instead of bytes; the server sends
them with os.sendfile on plaintext connections, from the page cache to the socket with no copy
through the process (Kafka's FileRecords.writeTo / transferTo), and reads them on TLS ones. The
codecs only need its length (`len()`), as for any bytes-like records value.

The region owns its descriptor (a duplicate, so no later close or reuse of the file's own
descriptor can point it at another file): whoever ends its use calls close(); a region dropped
unsent is closed when it is collected.
"""

from __future__ import annotations

import os


class FileRegion:
    __slots__ = ("fd", "position", "size")

    def __init__(self, fd: int, position: int, size: int) -> None:
        self.fd = fd
        self.position = position
        self.size = size

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, position={self.position}, size={self.size})"


class RegionParts(list):
    """An answer's parts that include FileRegions: the server sends these through its region
    path (every other answer is plain bytes and never scanned for regions)."""

    __slots__ = ()


def with_regions(parts: list) -> list:
    """`parts` marked as RegionParts if any part is a FileRegion."""
    for p in parts:
        if type(p) is FileRegion:
            return RegionParts(parts)
    return parts
