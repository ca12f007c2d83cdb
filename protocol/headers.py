"""Request and response headers and which version of each an API version uses.

Request header v2 goes with flexible request versions, v1 otherwise. Response header v1 goes
with flexible versions, v0 otherwise, except ApiVersions, whose response always uses v0 so a
client that does not know the broker's versions yet can read it.
"""

from __future__ import annotations

import struct
from typing import Any

from protocol.errors import ProtocolError
from protocol.generated import REQUESTS, RESPONSES, RequestHeader, ResponseHeader

API_VERSIONS_KEY = 18
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id
UNSUPPORTED_VERSION = 35


class UnsupportedRequest(ProtocolError):
    """An API key or version we do not serve; the header prefix is still known."""

    def __init__(self, reason: str, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(reason, error_code=UNSUPPORTED_VERSION)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class Request:
    """A decoded request: its header, its body and the header's three numbers as plain
    attributes (read several times a request; a property each time cost a call)."""

    __slots__ = ("header", "body", "api_key", "api_version", "correlation_id")

    def __init__(self, header: Any, body: Any) -> None:
        self.header = header  # RequestHeader
        self.body = body  # the generated *Request message
        self.api_key: int = header.request_api_key
        self.api_version: int = header.request_api_version
        self.correlation_id: int = header.correlation_id


def request_header_version(api_key: int, api_version: int) -> int:
    cls = REQUESTS[api_key]
    return 2 if cls.is_flexible(api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if RESPONSES[api_key].is_flexible(api_version) else 0


def peek_header(frame) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame, for error replies."""
    if len(frame) < _PREFIX.size:
        raise ProtocolError("request header truncated", api="RequestHeader", offset=0)
    return _PREFIX.unpack_from(frame, 0)


def decode_request(frame) -> Request:
    """Parse a request frame (without its size prefix).

    Raises UnsupportedRequest for an unknown API key or version (the caller answers with
    UNSUPPORTED_VERSION) and ProtocolError for malformed bytes.
    """
    api_key, api_version, correlation_id = peek_header(frame)
    cls = REQUESTS.get(api_key)
    if cls is None:
        raise UnsupportedRequest(f"unknown API key {api_key}", api_key, api_version, correlation_id)
    if not cls.MIN_VERSION <= api_version <= cls.MAX_VERSION:
        raise UnsupportedRequest(
            f"{cls.NAME} v{api_version} is not supported (valid {cls.MIN_VERSION}-{cls.MAX_VERSION})",
            api_key, api_version, correlation_id,
        )
    mv = memoryview(frame)
    header, pos = RequestHeader.decode_from(mv, 0, request_header_version(api_key, api_version))
    body, end = cls.decode_from(mv, pos, api_version)
    if end != len(frame):
        raise ProtocolError(f"{len(frame) - end} trailing bytes", api=cls.NAME, version=api_version, offset=end)
    return Request(header, body)


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> list:
    """Response header + body as bytes-like parts, without the size prefix."""
    hv = response_header_version(api_key, api_version)
    parts = ResponseHeader(correlation_id=correlation_id).encode_parts(hv)
    parts.extend(body.encode_parts(api_version))
    return parts


def encode_request(body: Any, api_version: int, correlation_id: int, client_id: str | None) -> list:
    """Request header + body as parts, for our own clients (tools, inter-node)."""
    key = body.API_KEY
    header = RequestHeader(
        request_api_key=key, request_api_version=api_version, correlation_id=correlation_id, client_id=client_id
    )
    parts = header.encode_parts(request_header_version(key, api_version))
    parts.extend(body.encode_parts(api_version))
    return parts


def decode_response(frame, api_key: int, api_version: int) -> tuple[int, Any]:
    """(correlation id, response body) of a response frame."""
    header, pos = ResponseHeader.decode_from(frame, 0, response_header_version(api_key, api_version))
    body, end = RESPONSES[api_key].decode_from(frame, pos, api_version)
    if end != len(frame):
        raise ProtocolError(f"{len(frame) - end} trailing bytes", api=RESPONSES[api_key].NAME, version=api_version)
    return header.correlation_id, body
