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
        self.known: dict[int, tuple[str, int]] = {}  # other controllers' addresses, learnt (KIP-853)
        self.security = security
        self._peers: dict[int, NodeClient] = {}
        self._connect_locks: dict[int, asyncio.Lock] = {}

    def learn(self, addresses: dict[int, tuple[str, int]]) -> None:
        """Addresses of controllers (from a voter set or a DescribeQuorum answer); a controller
        at a new address is dialled there from now on."""
        for node, address in addresses.items():
            old = self.known.get(node)
            self.known[node] = address
            if old is not None and old != address:
                peer = self._peers.pop(node, None)
                if peer is not None:
                    asyncio.get_running_loop().create_task(peer.close())

    def knows(self, node: int) -> bool:
        return node in self.voters or node in self.known

    async def ask_address(self, host: str, port: int, body: Any, timeout: float) -> Any | None:
        """One request on a connection of its own (a bootstrap server, whose id is unknown)."""
        client = NodeClient(host, port, client_id=f"raft-{self.node_id}", timeout=timeout, security=self.security)
        try:
            await client.connect()
            return await client.request(body, timeout=timeout)
        except (ClientError, TimeoutError, OSError, ProtocolError) as e:
            log.debug("raft_bootstrap_unreachable", server=f"{host}:{port}", error=str(e))
            return None
        finally:
            await client.close()

    async def ask(self, voter: int, body: Any, timeout: float, version: int | None = None) -> Any | None:
        """One request to a voter; None if it cannot be reached or did not answer in time."""
        client = None
        try:
            async with self._connect_locks.setdefault(voter, asyncio.Lock()):
                client = self._peers.get(voter)
                if client is None or not client.connected:
                    address = self.voters.get(voter) or self.known.get(voter)
                    if address is None:
                        return None
                    host, port = address
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
