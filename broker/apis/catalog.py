"""Every broker API module, imported once so its handlers register (broker.apis.registry)."""

from __future__ import annotations

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
    share,
    share_admin,
    share_forward,
    share_state,
    telemetry,
    topic_partitions,
    transaction_admin,
    transactions,
    txn_markers,
)
from broker.apis.registry import HANDLERS, ApiEntry


def load_all() -> dict[int, ApiEntry]:
    """The registered handlers by API key (all of them: importing this module registered them)."""
    return HANDLERS
