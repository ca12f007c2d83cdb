"""One module per API family: thin translation between requests and the subsystems.

Each module registers its handlers with ``@api(key, min_version, max_version)``; ApiVersions
advertises exactly what is registered here, so nothing unimplemented is ever offered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.broker import Broker
    from node.server import Connection


@dataclass
class RequestContext:
    broker: Broker
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
        return self.broker.config.listener.listener


Handler = Callable[[RequestContext, Any], Awaitable[Any]]


@dataclass(frozen=True)
class ApiEntry:
    key: int
    min_version: int
    max_version: int
    handler: Handler


HANDLERS: dict[int, ApiEntry] = {}


def api(key: int, min_version: int, max_version: int) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[key] = ApiEntry(key, min_version, max_version, fn)
        return fn

    return register


def load_all() -> dict[int, ApiEntry]:
    """Import every API module so its handlers register."""
    from broker.apis import (  # noqa: F401
        acls,
        admin,
        api_versions,
        chunks,
        client_quotas,
        cluster,
        configs,
        diskless,
        fetch,
        groups,
        leader_epoch,
        list_offsets,
        log_dirs,
        metadata,
        partition_epochs,
        produce,
        producer_ids,
        scram,
        topic_partitions,
        transaction_admin,
        transactions,
        txn_markers,
    )

    return HANDLERS
