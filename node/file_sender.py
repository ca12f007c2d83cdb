"""Writing answers that hold FileRegions: zero copy from the page cache on plaintext sockets.

An answer whose parts include FileRegions (a Fetch answer's large reads) goes out through a
FileSender. On a plaintext socket it takes the socket over from the transport once the
transport's buffer is empty: bytes parts go out with os.writev, regions with os.sendfile (the
kernel moves the file's pages to the socket, nothing is copied through the process: Kafka's
FileRecords.writeTo). When the socket is full it waits for it to be writable, watching a
duplicate of the socket's descriptor (the event loop will not watch the transport's own), and
every answer queued meanwhile waits behind it, in order. The transport gets the socket back when
the queue is empty. On TLS the regions are read (os.pread) and written through the transport.

A region that comes up short (its file was truncated under it: an unclean leader change) cannot
be sent: the frame's size is already on the wire, so the connection is closed, as Kafka's
FileRecords.writeTo fails the send.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import os
import socket
from collections.abc import Callable

from protocol.file_region import FileRegion

# writev takes at most IOV_MAX (1024 on Linux) buffers per call
_IOV_MAX = 1024


def _set_cork(fd: int, on: int) -> None:
    try:
        # family, type and protocol given: without them the socket object asks the kernel for
        # each (three syscalls), twice an answer; setsockopt on the descriptor needs none of them
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd) as sock:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, on)
            finally:
                sock.detach()  # the descriptor stays ours
    except OSError:
        pass  # not a TCP socket: nothing to cork


class SendStats:
    """Bytes of FileRegions this process sent, by path (exposed as broker metrics)."""

    def __init__(self) -> None:
        self.sendfile_bytes = 0  # zero copy: os.sendfile to a plaintext socket
        self.read_bytes = 0  # read and written through the transport (TLS)


STATS = SendStats()


class ShortRegionError(OSError):
    """A region's file ended before the region did."""


class FileSender:
    def __init__(self, transport: asyncio.Transport, sock_fd: int | None, on_drained: Callable[[], None],
                 on_error: Callable[[BaseException], None]) -> None:
        self.transport = transport
        self.sock_fd = sock_fd  # None: TLS, regions are read and written through the transport
        self.on_drained = on_drained  # the queue is empty again: the transport writes as before
        self.on_error = on_error
        self.queue: collections.deque = collections.deque()
        # A duplicate of the socket's descriptor, held while answers are queued: written and
        # watched instead of the transport's own, so a transport closing its descriptor (which
        # a new socket may then reuse) can never point a write of ours at another connection.
        self._fd: int | None = None
        self._watching = False
        self._closed = False

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    def send(self, parts: list) -> None:
        """Queue an answer's framed parts (bytes-like and FileRegions) and write what can be."""
        if self._closed:
            return
        self.queue.extend(parts)
        if self._fd is None and self.sock_fd is not None:
            self._fd = os.dup(self.sock_fd)
            # corked while the burst lasts: each partition's few header bytes would otherwise go
            # out as a packet of their own (TCP_NODELAY) between the regions' pages
            _set_cork(self._fd, 1)
        if not self._watching:
            self._pump()

    def close(self) -> None:
        """The connection is gone: give back the descriptors (queued regions' too)."""
        self._closed = True
        self._release()
        for p in self.queue:
            if isinstance(p, FileRegion):
                p.close()
        self.queue.clear()

    def _pump(self) -> None:
        if self._closed:
            return
        try:
            done = self._write_tls() if self._fd is None else self._write_socket(self._fd)
        except OSError as e:
            self.close()
            self.on_error(e)
            return
        if done:
            self._release()
            self.on_drained()
        elif not self._watching and self._fd is not None:
            self._watching = True
            asyncio.get_running_loop().add_writer(self._fd, self._pump)

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            if self._watching:
                self._watching = False
                asyncio.get_running_loop().remove_writer(fd)
            _set_cork(fd, 0)  # what is held goes out now
            os.close(fd)

    def _write_tls(self) -> bool:
        q = self.queue
        while q:
            p = q.popleft()
            if isinstance(p, FileRegion):
                data = os.pread(p.fd, p.size, p.position)
                p.close()
                if len(data) != p.size:
                    raise ShortRegionError(errno.EIO, f"file region of {p.size} bytes read {len(data)}")
                STATS.read_bytes += len(data)
                p = data
            self.transport.write(p)
        return True

    def _write_socket(self, fd: int) -> bool:
        """Write until the queue is empty (True) or the socket is full (False)."""
        if self.transport.get_write_buffer_size():
            return False  # the transport's own bytes go first
        q = self.queue
        while q:
            head = q[0]
            if isinstance(head, FileRegion):
                try:
                    sent = os.sendfile(fd, head.fd, head.position, head.size)
                except BlockingIOError:
                    return False
                if sent == 0:
                    raise ShortRegionError(errno.EIO, f"file region ended {head.size} bytes early")
                STATS.sendfile_bytes += sent
                head.position += sent
                head.size -= sent
                if not head.size:
                    q.popleft().close()
                continue  # a short send: the next one says whether the socket is full or the file short
            run: list = []
            for p in q:
                if isinstance(p, FileRegion) or len(run) == _IOV_MAX:
                    break
                run.append(p)
            try:
                sent = os.writev(fd, run)
            except BlockingIOError:
                return False
            for _ in range(len(run)):
                size = len(q[0])
                if sent < size:
                    if sent:
                        q[0] = memoryview(q[0])[sent:]
                    return False
                sent -= size
                q.popleft()
        return True
