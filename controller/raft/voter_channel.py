"""Requests from this voter to the other voters (Kafka's NetworkChannel): one connection per
voter, opened on first use and again after a failure, shared by the driving task and the
leader's announcements. A voter that cannot be reached is an answer of None, never an error:
Raft retries on its own timers."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from node.client import ClientError, NodeClient
from node.security import ClientSecurity
from protocol.errors import ProtocolError

log = structlog.get_logger(__name__)


class VoterChannel:
    def __init__(self, node_id: int, voters: dict[int, tuple[str, int]], security: ClientSecurity | None) -> None:
        self.node_id = node_id
        self.voters = voters  # voter id -> (host, port)
        self.security = security
        self._peers: dict[int, NodeClient] = {}
        self._connect_locks: dict[int, asyncio.Lock] = {}

    async def ask(self, voter: int, body: Any, timeout: float, version: int | None = None) -> Any | None:
        """One request to a voter; None if it cannot be reached or did not answer in time."""
        client = None
        try:
            async with self._connect_locks.setdefault(voter, asyncio.Lock()):
                client = self._peers.get(voter)
                if client is None or not client.connected:
                    host, port = self.voters[voter]
                    client = NodeClient(host, port, client_id=f"raft-{self.node_id}", timeout=timeout,
                                        security=self.security)
                    self._peers[voter] = client
                    await client.connect()
            return await client.request(body, version, timeout=timeout)
        except (ClientError, TimeoutError, OSError, ProtocolError) as e:
            log.debug("raft_peer_unreachable", voter=voter, api=type(body).__name__, error=str(e))
            if client is not None:
                await client.close()
            if self._peers.get(voter) is client:
                self._peers.pop(voter, None)
            return None

    async def close(self) -> None:
        for c in self._peers.values():
            await c.close()
