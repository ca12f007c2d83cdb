"""Every handler module, gathered into the one table the server dispatches on and ApiVersions
advertises (so nothing unimplemented is ever advertised)."""

from __future__ import annotations

from controller.apis import (
    acls,
    api_versions,
    chunks,
    client_quotas,
    cluster,
    configs,
    dir_assignment,
    features,
    fetch,
    partitions,
    producer_ids,
    quorum,
    scram,
    topics,
)
from controller.apis.registry import HandlerTable

HANDLER_MODULES = (
    acls, api_versions, chunks, client_quotas, cluster, configs, dir_assignment, features, fetch, partitions,
    producer_ids, quorum, scram, topics,
)


def handlers() -> HandlerTable:
    """API key -> (min version, max version, handler), over every handler module."""
    table: HandlerTable = {}
    for module in HANDLER_MODULES:
        table.update(module.HANDLERS)
    return table
