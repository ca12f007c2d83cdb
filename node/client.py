"""An async connection to a Kafka-protocol peer: our brokers, controller, tools and tests use it.

Requests are pipelined (correlation ids), versions negotiated once with ApiVersions: each call
uses the highest version both sides know unless the caller pins one.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from node.causes import cause
from node.scram import PLAIN, AuthenticationError, ScramClient
from node.security import PLAINTEXT_CLIENT, ClientSecurity
from node.waits import READ_SLICE, Eventual, read_next_step, wait_within
from protocol.errors import ProtocolError, error_name
from protocol.framing import DEFAULT_MAX_FRAME, FrameReader, frame_joined
from protocol.generated import REQUESTS, RESPONSES
from protocol.generated.api_versions import ApiVersionsRequest, ApiVersionsResponse
from protocol.generated.sasl_authenticate import SaslAuthenticateRequest
from protocol.generated.sasl_handshake import SaslHandshakeRequest
from protocol.headers import decode_response, encode_request


class ClientError(Exception):
    """The peer is unreachable, went away, or does not speak the API we need."""


class ConnectionClosed(ClientError):
    """The peer closed the connection (no error on our side)."""


def _api(key: int) -> str:
    return RESPONSES[key].NAME.removesuffix("Response")


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
        self._protocol: _ClientProtocol | None = None
        self._pending: dict[int, tuple[asyncio.Future | Eventual, int, int]] = {}  # (waiter, api key, version)
        self._ids = itertools.count(1)
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._protocol is not None and not self._closed

    async def connect(self) -> NodeClient:
        loop = asyncio.get_running_loop()
        try:
            _, self._protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _ClientProtocol(self), self.host, self.port,
                                       ssl=self.security.ssl), self.timeout
            )
        except (TimeoutError, OSError) as e:  # ssl.SSLError is an OSError
            why = cause(e, timeout=self.timeout, tls=self.security.ssl is not None)
            raise ClientError(f"cannot connect to {self.host}:{self.port}: {why}") from None
        try:
            resp = await self.request(ApiVersionsRequest(client_software_name="strata", client_software_version="0.1"), 3)
            if resp.error_code == 35:  # peer is older: it answered with a v0 body listing its versions
                resp = await self.request(ApiVersionsRequest(), 0)
        except ClientError as e:
            # the first request is where a plaintext client meets a TLS listener: it hangs up
            raise ClientError(f"{e} (is security.protocol {self.security.protocol} what the listener expects?)"
                              ) from None
        if resp.error_code:
            raise ClientError(f"ApiVersions to {self.host}:{self.port} failed: {error_name(resp.error_code)}")
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
            raise ClientError(f"SASL handshake with {where} failed: {error_name(resp.error_code)} "
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
            raise ClientError(f"SASL authentication with {where} failed: {error_name(resp.error_code)}"
                              + (f": {resp.error_message}" if resp.error_message else ""))
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
        proto = self._writable()
        key = body.API_KEY
        if self._reauth_at and key not in (17, 36) and asyncio.get_running_loop().time() >= self._reauth_at:
            async with self._reauth_lock:
                if asyncio.get_running_loop().time() >= self._reauth_at:
                    self._reauth_at = 0.0
                    await self._authenticate()
        v = self.version_for(key) if version is None else version
        cid = next(self._ids) & 0x7FFFFFFF
        parts = encode_request(body, v, cid, self.client_id)
        fut = None
        if expect_response:
            fut = asyncio.get_running_loop().create_future()
            self._pending[cid] = (fut, key, v)
        try:
            proto.transport.writelines(frame_joined(parts))
            if proto.write_paused:
                await proto.drained()
            if fut is None:
                return None
            return await wait_within(fut, timeout or self.timeout, TimeoutError())
        except TimeoutError:
            raise ClientError(f"{_api(key)} to {self.host}:{self.port} timed out after {timeout or self.timeout:g} s"
                              ) from None
        except ConnectionError as e:
            raise ClientError(f"connection to {self.host}:{self.port} lost: {cause(e)}") from None
        except ConnectionClosed as e:
            # a SASL listener hangs up on a request before authentication: say which request
            hint = "" if self.security.sasl or key in (17, 18, 36) else (
                f" (a SASL listener closes connections that did not authenticate: is security.protocol "
                f"{self.security.protocol} right?)")
            raise ClientError(f"{e} while waiting for the answer to {_api(key)}{hint}") from None
        finally:
            if fut is not None:
                self._pending.pop(cid, None)

    def send_nowait(self, body: Any, version: int, *, timeout: float | None = None) -> Eventual | None:
        """`request`, for a caller that continues in the read callback: the response (or a
        ClientError) settles the returned Eventual there, a loop step before an awaiting task
        would see it. None when the request cannot go out without waiting (a re-authentication
        is due, or the socket's buffer is full): use `request` then."""
        proto = self._writable()
        loop = proto.loop
        if proto.write_paused or (self._reauth_at and loop.time() >= self._reauth_at):
            return None
        key = body.API_KEY
        cid = next(self._ids) & 0x7FFFFFFF
        ev = Eventual()
        self._pending[cid] = (ev, key, version)
        # the error is made only if it is needed (a follower sends one of these a Fetch)
        timer = loop.call_later(timeout or self.timeout, self._timed_out, ev, key)

        def settled(_: Eventual) -> None:
            timer.cancel()
            self._pending.pop(cid, None)

        ev.on_done(settled)
        proto.transport.writelines(frame_joined(encode_request(body, version, cid, self.client_id)))
        return ev

    def _timed_out(self, ev: Eventual, key: int) -> None:
        if not ev.done():
            ev.set_exception(ClientError(f"{RESPONSES[key].NAME} to {self.host}:{self.port} timed out"))

    def _writable(self) -> _ClientProtocol:
        proto = self._protocol
        if proto is None or self._closed or proto.transport.is_closing():
            raise ClientError(f"not connected to {self.host}:{self.port}")
        return proto

    def _answer(self, f: memoryview) -> None:
        """One response frame: resolve its request's future right here, in the read callback
        (a receive task would cost a loop step per response, and a follower's acks=all
        round trip crosses several)."""
        cid = int.from_bytes(f[:4], "big", signed=True)
        entry = self._pending.get(cid)
        if entry is None:
            return
        fut, key, v = entry
        if fut.done():
            return
        try:
            _, resp = decode_response(f, key, v)
            fut.set_result(resp)
        except ProtocolError as e:
            fut.set_exception(ClientError(f"bad response from {self.host}:{self.port}: {e}"))

    def _lost(self, err: Exception) -> None:
        self._closed = True
        for fut, _, _ in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(err)

    async def close(self) -> None:
        self._closed = True
        proto = self._protocol
        if proto is not None:
            proto.transport.close()
            await asyncio.wait({proto.closed}, timeout=2.0)  # never hang a shutdown on a dead peer

    async def __aenter__(self) -> NodeClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _ClientProtocol(asyncio.Protocol):
    """The socket side of a NodeClient: frames in, futures resolved, write flow control."""

    def __init__(self, client: NodeClient) -> None:
        self.client = client
        self.frames = FrameReader(DEFAULT_MAX_FRAME)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.write_paused = False
        self._drain: asyncio.Future | None = None
        # kept: asyncio.get_running_loop() checks the process id, a syscall, at every call
        self.loop = asyncio.get_running_loop()
        self.closed: asyncio.Future = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.frames.feed(data)
        except ProtocolError as e:
            self.client._lost(ClientError(f"connection to {self.client.host}:{self.client.port} failed: {e}"))
            self.transport.abort()
            return
        for f in frames:
            self.client._answer(f)
        if self.frames.pending >= READ_SLICE:
            read_next_step(self.transport, lambda: not self.closed.done())

    def connection_lost(self, exc: Exception | None) -> None:
        c = self.client
        detail = f" failed: {cause(exc)}" if exc is not None else " closed by the peer"
        c._lost((ClientError if exc is not None else ConnectionClosed)(f"connection to {c.host}:{c.port}{detail}"))
        self.resume_writing()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    async def drained(self) -> None:
        """Wait until the transport's write buffer is below its low-water mark (or the
        connection is gone: the request's future then says so)."""
        if self.write_paused and not self.closed.done():
            if self._drain is None:
                self._drain = asyncio.get_running_loop().create_future()
            await self._drain


__all__ = ["ApiVersionsResponse", "ClientError", "NodeClient"]
