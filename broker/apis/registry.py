"""The broker's handler registry: each API module registers its handlers with
``@api(key, min_version, max_version)``; ApiVersions advertises exactly what is registered, so
nothing unimplemented is ever offered (librdkafka acts on every advertised key).

Handlers receive a RequestContext whose ``services`` names what they may use; they never see the
Broker. This module imports no handler, so registering one makes no import circle; the list of
handler modules lives in ``broker.apis.catalog``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol.generated.api_versions import ApiVersionsResponse

if TYPE_CHECKING:
    from broker.services import BrokerServices
    from node.server import Connection


@dataclass
class RequestContext:
    services: BrokerServices
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    connection: Connection | None

    @property
    def listener(self) -> str:
        """The listener the request came in on: Metadata and FindCoordinator answer with the
        brokers' endpoints on it, as Kafka does."""
        conn = self.connection
        if conn is not None and conn.listener is not None:
            return conn.listener
        return self.services.config.listener.listener


Handler = Callable[[RequestContext, Any], Coroutine[Any, Any, Any]]
# whether a handler serves on this broker (a feature switched off by config is neither advertised
# nor served: librdkafka acts on every advertised key)
Enabled = Callable[[Any], bool]


@dataclass(frozen=True)
class ApiEntry:
    key: int
    min_version: int
    max_version: int
    handler: Handler
    enabled: Enabled | None = None  # called with the BrokerConfig; None: always served

    def served(self, config: Any) -> bool:
        return self.enabled is None or config is None or self.enabled(config)


HANDLERS: dict[int, ApiEntry] = {}


def api(key: int, min_version: int, max_version: int, enabled: Enabled | None = None) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[key] = ApiEntry(key, min_version, max_version, fn, enabled)
        return fn

    return register


def advertised_versions(config: Any = None) -> list[ApiVersionsResponse.ApiVersion]:
    """The ApiVersions list: every registered handler's key and version range (those this
    broker's `config` serves)."""
    return [
        ApiVersionsResponse.ApiVersion(api_key=e.key, min_version=e.min_version, max_version=e.max_version)
        for e in sorted(HANDLERS.values(), key=lambda e: e.key) if e.served(config)
    ]
