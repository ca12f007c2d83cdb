"""A TCP proxy in front of one node (a broker's client listener, or the controller as one broker
sees it), for faults a real network has: answers lost or late. Threads, so it keeps forwarding
while a test's own code blocks (e.g. in Cluster.start)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.cluster import Cluster


class TcpProxy:
    """Listens on `port`, forwards each connection to host:target_port.

    - `swallow` (an Event): while set, requests still reach the node but its answers are dropped,
      as a crash between append and answer leaves things.
    - `hold()` / `release()`: while held, the node's answers wait in the proxy and arrive in order
      on release, as over a link that stalls: a broker behind a held controller connection keeps
      serving clients from a metadata image that no longer moves.
    - `cut()` / `heal()`: a network partition: open connections are reset and new ones refused
      until healed (a quorum test cuts the links between controllers).
    - `delay` (seconds): each answer's first bytes after a request wait this long, as from a
      server slow to respond (an object store under load); 0 forwards at once.
    """

    def __init__(self, host: str, target_port: int | Callable[[], int]) -> None:
        self.host = host
        # A callable is asked at each connection: a proxy made before Cluster.start points at the
        # node's port even if start chose new ports (one it had chosen was taken meanwhile,
        # by this very proxy's listener, say).
        self._target = target_port
        self.swallow = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._cut = False
        self.delay = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def target_port(self) -> int:
        return self._target() if callable(self._target) else self._target

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            socks, self._socks = self._socks, []
        for sock in socks:
            _drop(sock)

    def heal(self) -> None:
        self._cut = False

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut:
                _drop(client)
                continue
            try:
                upstream = socket.create_connection((self.host, self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the node is down: the client retries
                continue
            with self._lock:
                self._socks += [client, upstream]
            asked = threading.Event()  # a request went up since the last answer began
            threading.Thread(target=self._pump, args=(client, upstream, False, asked), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True, asked), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool, asked: threading.Event) -> None:
        try:
            while data := src.recv(65536):
                if answers:
                    self._flowing.wait()
                    if self.swallow.is_set():
                        continue
                    if asked.is_set():
                        asked.clear()
                        if self.delay > 0:
                            time.sleep(self.delay)
                else:
                    asked.set()
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            _drop(sock)

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for sock in self._socks:
                _drop(sock)


def _drop(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def voter_links(c: Cluster) -> dict[tuple[int, int], TcpProxy]:
    """Before the cluster starts: each controller reaches each other voter through a proxy of its
    own (link a->b), so a test can cut one voter off; returns the links by (from, to)."""
    links = {(a, b): TcpProxy(c.host, lambda b=b: c.ports[b]) for a in c.controller_ids for b in c.controller_ids
             if a != b}
    for a in c.controller_ids:
        voters = ",".join(f"{b}@{c.host}:{c.ports[b] if a == b else links[(a, b)].port}" for b in c.controller_ids)
        c.per_controller_overrides[a] = {"controller.quorum.voters": voters}
    return links
