"""An async connection to a Kafka-protocol peer: our brokers, controller, tools and tests use it.

Requests are pipelined (correlation ids), versions negotiated once with ApiVersions: each call
uses the highest version both sides know unless the caller pins one.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from node.scram import PLAIN, AuthenticationError, ScramClient
from node.security import PLAINTEXT_CLIENT, ClientSecurity
from node.waits import wait_within
from protocol.errors import ProtocolError
from protocol.framing import DEFAULT_MAX_FRAME, FrameReader, frame
from protocol.generated import REQUESTS, RESPONSES
from protocol.generated.api_versions import ApiVersionsRequest, ApiVersionsResponse
from protocol.generated.sasl_authenticate import SaslAuthenticateRequest
from protocol.generated.sasl_handshake import SaslHandshakeRequest
from protocol.headers import decode_response, encode_request


class ClientError(Exception):
    """The peer is unreachable, went away, or does not speak the API we need."""


class NodeClient:
    def __init__(self, host: str, port: int, *, client_id: str = "strata", timeout: float = 30.0,
                 security: ClientSecurity | None = None) -> None:
        self.host = host
        self.security = security or PLAINTEXT_CLIENT
        self._reauth_at = 0.0  # loop time to re-authenticate at (KIP-368), 0: never
        self._reauth_lock = asyncio.Lock()
        self.port = port
        self.client_id = client_id
        self.timeout = timeout
        self.versions: dict[int, tuple[int, int]] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, tuple[asyncio.Future, int, int]] = {}
        self._ids = itertools.count(1)
        self._recv_task: asyncio.Task | None = None
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._closed

    async def connect(self) -> NodeClient:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.security.ssl), self.timeout
            )
        except (TimeoutError, OSError) as e:  # ssl.SSLError is an OSError
            raise ClientError(f"cannot connect to {self.host}:{self.port}: {e}") from None
        self._recv_task = asyncio.get_running_loop().create_task(self._receive())
        resp = await self.request(ApiVersionsRequest(client_software_name="strata", client_software_version="0.1"), 3)
        if resp.error_code == 35:  # peer is older: it answered with a v0 body listing its versions
            resp = await self.request(ApiVersionsRequest(), 0)
        if resp.error_code:
            raise ClientError(f"ApiVersions to {self.host}:{self.port} failed with error {resp.error_code}")
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        if self.security.sasl:
            try:
                await self._authenticate()
            except ClientError:
                await self.close()
                raise
        return self

    async def _authenticate(self) -> None:
        """SaslHandshake + SaslAuthenticate with this client's mechanism and credentials."""
        sec = self.security
        where = f"{self.host}:{self.port}"
        mech = sec.mechanism or PLAIN
        resp = await self.request(SaslHandshakeRequest(mechanism=mech), 1)
        if resp.error_code:
            raise ClientError(f"SASL handshake with {where} failed: error {resp.error_code} "
                              f"(enabled there: {', '.join(resp.mechanisms)})")
        user, password = sec.username or "", sec.password or ""
        try:
            if mech == PLAIN:
                resp = await self._sasl_token(f"\0{user}\0{password}".encode(), where)
            else:
                scram = ScramClient(mech, user, password)
                first = await self._sasl_token(scram.first(), where)
                resp = await self._sasl_token(scram.final(first.auth_bytes), where)
                scram.check_server_final(resp.auth_bytes)
        except AuthenticationError as e:
            raise ClientError(f"SASL authentication with {where} failed: {e}") from None
        lifetime = resp.session_lifetime_ms
        if lifetime > 0:  # re-authenticate before the session ends, as Kafka's clients (85%)
            self._reauth_at = asyncio.get_running_loop().time() + lifetime * 0.85 / 1000

    async def _sasl_token(self, token: bytes, where: str) -> Any:
        resp = await self.request(SaslAuthenticateRequest(auth_bytes=token), min(self.version_for(36), 2))
        if resp.error_code:
            raise ClientError(f"SASL authentication with {where} failed: {resp.error_message or resp.error_code}")
        return resp

    def version_for(self, api_key: int) -> int:
        ours = REQUESTS[api_key]
        if not self.versions:
            return ours.MAX_VERSION
        theirs = self.versions.get(api_key)
        if theirs is None:
            raise ClientError(f"{self.host}:{self.port} does not serve {ours.NAME}")
        hi = min(ours.MAX_VERSION, theirs[1])
        if hi < max(ours.MIN_VERSION, theirs[0]):
            raise ClientError(f"no common version of {ours.NAME} with {self.host}:{self.port}")
        return hi

    async def request(
        self, body: Any, version: int | None = None, *, timeout: float | None = None, expect_response: bool = True
    ) -> Any:
        if not self.connected:
            raise ClientError(f"not connected to {self.host}:{self.port}")
        key = body.API_KEY
        if self._reauth_at and key not in (17, 36) and asyncio.get_running_loop().time() >= self._reauth_at:
            async with self._reauth_lock:
                if asyncio.get_running_loop().time() >= self._reauth_at:
                    self._reauth_at = 0.0
                    await self._authenticate()
        v = self.version_for(key) if version is None else version
        cid = next(self._ids) & 0x7FFFFFFF
        parts = encode_request(body, v, cid, self.client_id)
        assert self._writer is not None
        self._writer.writelines(frame(parts))
        if not expect_response:
            await self._writer.drain()
            return None
        fut = asyncio.get_running_loop().create_future()
        self._pending[cid] = (fut, key, v)
        try:
            await self._writer.drain()
            return await wait_within(fut, timeout or self.timeout, TimeoutError())
        except TimeoutError:
            raise ClientError(f"{RESPONSES[key].NAME} to {self.host}:{self.port} timed out") from None
        except ConnectionError as e:
            raise ClientError(f"connection to {self.host}:{self.port} lost: {e}") from None
        finally:
            self._pending.pop(cid, None)

    async def _receive(self) -> None:
        frames = FrameReader(DEFAULT_MAX_FRAME)
        err: Exception = ClientError(f"connection to {self.host}:{self.port} closed")
        try:
            assert self._reader is not None
            while data := await self._reader.read(1 << 20):
                for f in frames.feed(data):
                    cid = int.from_bytes(f[:4], "big", signed=True)
                    entry = self._pending.get(cid)
                    if entry is None:
                        continue
                    fut, key, v = entry
                    if fut.done():
                        continue
                    try:
                        _, resp = decode_response(f, key, v)
                        fut.set_result(resp)
                    except ProtocolError as e:
                        fut.set_exception(ClientError(f"bad response from {self.host}:{self.port}: {e}"))
        except (OSError, ProtocolError) as e:
            err = ClientError(f"connection to {self.host}:{self.port} failed: {e}")
        except asyncio.CancelledError:
            pass
        finally:
            self._closed = True
            for fut, _, _ in list(self._pending.values()):
                if not fut.done():
                    fut.set_exception(err)

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            waiter = asyncio.ensure_future(self._writer.wait_closed())
            await asyncio.wait({waiter}, timeout=2.0)  # never hang a shutdown on a dead peer
            if not waiter.done():
                waiter.cancel()
            elif not waiter.cancelled() and waiter.exception() is not None:
                pass  # the connection was already broken; closing it is all we wanted
        if self._recv_task is not None:
            self._recv_task.cancel()
            try:
                await self._recv_task
            except (asyncio.CancelledError, Exception):
                pass

    async def __aenter__(self) -> NodeClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["ApiVersionsResponse", "ClientError", "NodeClient"]
