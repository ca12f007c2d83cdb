"""Which cluster this broker belongs to, checked before any log dir is used: the quorum's id
(asked of the controller) against `cluster.id` if set and against every log dir already
formatted (by `kafka-storage.sh format` or an earlier start). A mismatch stops the broker with
one line, as Kafka's broker refuses meta.properties of another cluster."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from broker.storage.errors import StorageError
from broker.storage.meta_properties import FILE_NAME, read_meta_properties


class ClusterIdMismatch(Exception):
    """This broker's configured or stored cluster id is not the controller quorum's."""


def check_cluster_id(quorum_id: str, props: Mapping[str, str], log_dirs: Iterable[Path]) -> None:
    configured = (props.get("cluster.id") or "").strip()
    if configured and configured != quorum_id:
        raise ClusterIdMismatch(f"cluster.id {configured} differs from the controller quorum's cluster id {quorum_id} "
                                "(set cluster.id to the quorum's, or point controller.quorum.voters at its quorum)")
    for d in log_dirs:
        path = Path(d) / FILE_NAME
        try:
            stored = read_meta_properties(path).cluster_id if path.exists() else None
        except (OSError, StorageError):
            continue  # an unreadable dir is the log dir check's to report (it goes offline)
        if stored is not None and stored != quorum_id:
            raise ClusterIdMismatch(
                f"log dir {d} was formatted for cluster {stored}, but the controller quorum's cluster id is "
                f"{quorum_id} (run kafka-storage.sh format -t {quorum_id} on an empty dir, or point log.dirs elsewhere)")
