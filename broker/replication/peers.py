"""Connections from this broker to other brokers for chunk work: copying chunk ranges, reading
an old chunk on a consumer's behalf, asking a chunk's replica for offsets. One connection per
peer and purpose, reconnected on demand (requests on one connection are pipelined)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from node.client import ClientError, NodeClient

if TYPE_CHECKING:
    from broker.ports import PeerDirectory
    from node.security import ClientSecurity


class PeerClients:
    def __init__(self, peers: PeerDirectory, node_id: int, security: ClientSecurity | None, purpose: str) -> None:
        self.peers = peers
        self.node_id = node_id
        self.security = security
        self.purpose = purpose
        self._clients: dict[int, NodeClient] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._closed = False

    def live(self, broker_id: int) -> bool:
        return self.peers.live(broker_id)

    async def get(self, broker_id: int, timeout: float = 10.0) -> NodeClient:
        """A connected client to `broker_id`; ClientError when it has no endpoint or refuses."""
        c = self._clients.get(broker_id)
        if c is not None and c.connected:
            return c
        lock = self._locks.setdefault(broker_id, asyncio.Lock())
        async with lock:
            c = self._clients.get(broker_id)
            if c is not None and c.connected:
                return c
            if self._closed:
                raise ClientError("broker is shutting down")
            ep = self.peers.endpoint(broker_id)
            if ep is None:
                raise ClientError(f"broker {broker_id} has no endpoint")
            client_id = f"{self.purpose}-{self.node_id}"
            c = await NodeClient(ep.host, ep.port, client_id=client_id, timeout=timeout, security=self.security).connect()
            self._clients[broker_id] = c
            return c

    async def drop(self, broker_id: int) -> None:
        c = self._clients.pop(broker_id, None)
        if c is not None:
            await c.close()

    async def close(self) -> None:
        self._closed = True
        for bid in list(self._clients):
            await self.drop(bid)
