"""The broker's connection to the active controller: reconnects with backoff, shared by
registration, heartbeats, metadata fetches and forwarded admin requests.

With a quorum (`controller.quorum.voters` of several entries, or
`controller.quorum.bootstrap.servers`, where the voters are learnt from DescribeQuorum's nodes
and follow the quorum's changes, KIP-853) the channel follows the leader, as
a KRaft broker does: it asks a voter for the leader (DescribeQuorum), keeps talking to it, and on
a lost connection or a NOT_CONTROLLER answer (a standby, or a leader that just lost its epoch:
nothing was applied) finds the leader again and sends once more. Leader hints from Fetch answers
(`leader_moved`) move it at once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from metadata.voters import describe_quorum_request, node_addresses
from node.client import ClientError, NodeClient
from node.security import ClientSecurity
from protocol.errors import Errors

log = structlog.get_logger(__name__)

NOT_CONTROLLER_RETRY_S = 30.0  # how long a request keeps looking for an active controller


def is_not_controller(resp: Any) -> bool:
    """NOT_CONTROLLER at the top or on any item (one or two levels down)."""
    if getattr(resp, "error_code", 0) == Errors.NOT_CONTROLLER:
        return True
    for name in getattr(resp, "_fields", ()):
        items = getattr(resp, name, None)
        if not isinstance(items, list):
            continue
        for item in items:
            if getattr(item, "error_code", 0) == Errors.NOT_CONTROLLER:
                return True
            for sub in getattr(item, "_fields", ()):
                inner = getattr(item, sub, None)
                if isinstance(inner, list) and any(getattr(x, "error_code", 0) == Errors.NOT_CONTROLLER for x in inner):
                    return True
    return False


class ControllerChannel:
    def __init__(self, voters: dict[int, tuple[str, int]], node_id: int, security: ClientSecurity | None = None,
                 bootstrap_servers: tuple[tuple[str, int], ...] = ()) -> None:
        """`voters`: controller.quorum.voters; or empty, with `bootstrap_servers`: the voters are
        learnt from the quorum (DescribeQuorum's nodes, the metadata log's KRAFT_VOTERS records,
        KIP-853) and follow its changes. The broker's channels share one `voters` map, so what one
        learns all know."""
        self.voters = voters
        self.bootstrap_servers = bootstrap_servers
        self.security = security
        self.client_id = f"broker-{node_id}"
        self._leader: int | None = self._order[0] if self._single else None
        self._next = 0  # round robin over voters while no leader is known
        self._client: NodeClient | None = None
        self._client_voter: int | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def _order(self) -> list[int]:
        return sorted(self.voters)

    @property
    def _single(self) -> bool:
        return len(self._order) == 1 and not self.bootstrap_servers

    @property
    def leader(self) -> int | None:
        return self._leader

    def leader_moved(self, leader_id: int | None, address: tuple[str, int] | None = None) -> None:
        """A hint (from a Fetch answer) that another voter leads, or (None) that ours no longer does;
        with a dynamic quorum it may say where that voter listens (KIP-853)."""
        if leader_id is not None and address is not None and self.bootstrap_servers \
                and self.voters.get(leader_id) != address:
            self.voters[leader_id] = address
        if leader_id is not None and leader_id not in self.voters:
            leader_id = None
        if leader_id != self._leader:
            log.info("controller_leader_hint", leader=leader_id, previous=self._leader)
            self._leader = self._order[0] if self._single else leader_id

    def learn(self, voters: dict[int, tuple[str, int]]) -> None:
        """The voters of a dynamic quorum as it names them now (a change over time); nothing for
        a static one."""
        if self.bootstrap_servers and voters and voters != self.voters:
            log.info("controller_voters_learnt",
                     voters=",".join(f"{i}@{h}:{p}" for i, (h, p) in sorted(voters.items())))
            self.voters.clear()
            self.voters.update(voters)

    async def _refresh_voters(self, client: NodeClient) -> None:
        """On a new connection to a dynamic quorum's leader: the voters as it names them now,
        so the channel can still find the quorum after every voter it knew has left."""
        try:
            resp = await client.request(describe_quorum_request(), timeout=2)
            self.learn(node_addresses(resp.nodes))
        except (ClientError, TimeoutError) as e:
            log.debug("controller_voters_refresh_failed", error=str(e))

    async def _find_leader(self) -> int | None:
        """Ask voters (then a bootstrap server) in turn who leads; returns a voter to try (the
        leader if one answered), None if there is none to try."""
        targets: list[tuple[int | None, tuple[str, int]]] = []
        for _ in range(len(self._order)):
            vid = self._order[self._next % len(self._order)]
            self._next += 1
            targets.append((vid, self.voters[vid]))
        if self.bootstrap_servers:
            targets.append((None, self.bootstrap_servers[self._next % len(self.bootstrap_servers)]))
        for _vid, (host, port) in targets:
            client = NodeClient(host, port, client_id=self.client_id, timeout=2, security=self.security)
            try:
                await client.connect()
                resp = await client.request(describe_quorum_request(), timeout=2)
                self.learn(node_addresses(resp.nodes))
                part = resp.topics[0].partitions[0]
                if part.leader_id in self.voters:
                    return int(part.leader_id)
            except (ClientError, TimeoutError, IndexError):
                continue
            finally:
                await client.close()
        return self._order[self._next % len(self._order)] if self._order else None

    async def _connected(self) -> NodeClient:
        async with self._lock:
            if self._client is not None and self._client.connected and self._client_voter == self._leader:
                return self._client
            if self._client is not None:
                await self._client.close()
                self._client = None
            delay = 0.05
            warned = False
            while not self._closed:
                target = self._leader
                if target is None or target not in self.voters:
                    target = await self._find_leader()
                if target is None:
                    if not warned:
                        log.warning("waiting_for_controller", controller="controller.quorum.bootstrap.servers",
                                    error="no controller answered")
                        warned = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                host, port = self.voters[target]
                try:
                    self._client = await NodeClient(
                        host, port, client_id=self.client_id, timeout=30, security=self.security
                    ).connect()
                    self._client_voter = target
                    self._leader = target
                    if self.bootstrap_servers:
                        await self._refresh_voters(self._client)
                    if warned:
                        log.info("controller_reachable", controller=f"{host}:{port}", node=target)
                    return self._client
                except ClientError as e:
                    if not warned:
                        log.warning("waiting_for_controller", controller=f"{host}:{port}", error=str(e))
                        warned = True
                    if not self._single:
                        self._leader = None
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
            raise ClientError("controller channel closed")

    async def request(
        self, body: Any, version: int | None = None, *, timeout: float | None = None, retry: bool = True
    ) -> Any:
        """Send to the active controller; with retry, a lost connection is re-established and the
        request sent again (only for requests safe to repeat). A NOT_CONTROLLER answer is always
        sent again, to the leader found meanwhile (nothing was applied)."""
        deadline = time.monotonic() + max(timeout or 0, NOT_CONTROLLER_RETRY_S)
        delay = 0.05
        while True:
            client = await self._connected()
            try:
                resp = await client.request(body, version, timeout=timeout)
            except ClientError:
                if not self._single:
                    self._leader = None
                if not retry or self._closed:
                    raise
                await client.close()
                await asyncio.sleep(0.1)
                continue
            if is_not_controller(resp) and time.monotonic() < deadline and not self._closed:
                if not self._single and self._leader == self._client_voter:
                    self._leader = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            return resp

    @property
    def quorum(self) -> bool:
        """More than one voter: losing the connection does not mean no controller is reachable."""
        return not self._single

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.connected

    async def version_for(self, api_key: int) -> int:
        return (await self._connected()).version_for(api_key)

    async def close(self) -> None:
        self._closed = True
        if self._client is not None:
            await self._client.close()
