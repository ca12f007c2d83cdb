"""The broker's connection to the controller: reconnects with backoff, shared by registration,
heartbeats, metadata fetches and forwarded admin requests."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from node.client import ClientError, NodeClient
from node.security import ClientSecurity

log = structlog.get_logger(__name__)


class ControllerChannel:
    def __init__(self, host: str, port: int, node_id: int, security: ClientSecurity | None = None) -> None:
        self.host = host
        self.security = security
        self.port = port
        self.client_id = f"broker-{node_id}"
        self._client: NodeClient | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def _connected(self) -> NodeClient:
        async with self._lock:
            if self._client is not None and self._client.connected:
                return self._client
            delay = 0.05
            warned = False
            while not self._closed:
                try:
                    self._client = await NodeClient(
                        self.host, self.port, client_id=self.client_id, timeout=30, security=self.security
                    ).connect()
                    if warned:
                        log.info("controller_reachable", controller=f"{self.host}:{self.port}")
                    return self._client
                except ClientError as e:
                    if not warned:
                        log.warning("waiting_for_controller", controller=f"{self.host}:{self.port}", error=str(e))
                        warned = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
            raise ClientError("controller channel closed")

    async def request(
        self, body: Any, version: int | None = None, *, timeout: float | None = None, retry: bool = True
    ) -> Any:
        """Send to the controller; with retry, a lost connection is re-established and the
        request sent again (only for requests safe to repeat)."""
        while True:
            client = await self._connected()
            try:
                return await client.request(body, version, timeout=timeout)
            except ClientError:
                if not retry or self._closed:
                    raise
                await client.close()
                await asyncio.sleep(0.1)

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.connected

    async def version_for(self, api_key: int) -> int:
        return (await self._connected()).version_for(api_key)

    async def close(self) -> None:
        self._closed = True
        if self._client is not None:
            await self._client.close()
