"""Log directory formatting: meta.properties, written by `kafka-storage.sh format` or, for a
quorum of one voter, on first start.

Each log dir gets Kafka's v1 meta.properties (cluster.id, node.id, directory.id, version). On
later starts the stored ids must match the config, so a controller is never pointed at another
cluster's or node's data by mistake. Voters of a larger quorum must share one cluster id chosen
before they start (Kafka's rule: its nodes never format themselves): an id drawn by each voter
alone would make every vote between them refused as INCONSISTENT_CLUSTER_ID.
"""

from __future__ import annotations

import base64
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from controller.metadata_log import fsync_dir
from node.config import ConfigError, parse_properties

META_PROPERTIES = "meta.properties"


class StartupError(Exception):
    """The on-disk state cannot be used with this config (exit code 2, like a bad config)."""


@dataclass(frozen=True)
class DirMeta:
    path: Path
    cluster_id: str
    node_id: int
    directory_id: uuid.UUID


def random_id() -> str:
    """A random UUID in Kafka's string form: base64url without padding, never starting with '-'
    (so it cannot be mistaken for a command-line flag, a rule Kafka follows too)."""
    while True:
        s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not s.startswith("-"):
            return s


def id_to_uuid(s: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)))


def uuid_to_id(u: uuid.UUID) -> str:
    """Kafka's string form of a UUID (the inverse of id_to_uuid)."""
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def write_atomically(path: Path, data: bytes) -> None:
    """tmp + fsync + rename + fsync(dir): a crash leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _read_meta(path: Path) -> dict[str, str]:
    try:
        return parse_properties(path.read_text())
    except OSError as e:
        raise StartupError(f"cannot read {path}: {e.strerror}") from None


def meta_text(cluster_id: str, node_id: int, directory_id: str, writer: str) -> str:
    return (f"#Written by {writer}\n"
            f"cluster.id={cluster_id}\ndirectory.id={directory_id}\nnode.id={node_id}\nversion=1\n")


def unformatted_quorum_message(log_dirs: tuple[Path, ...], voters: int) -> str:
    return (f"log dirs {','.join(str(d) for d in log_dirs)} are not formatted and controller.quorum.voters names "
            f"{voters} voters: set cluster.id (the same value on every voter; `kafka-storage.sh random-uuid` makes "
            "one) or run `kafka-storage.sh format -t <cluster id> -c <this config>` on each voter first")


def ensure_formatted(
    log_dirs: tuple[Path, ...], node_id: int, configured_cluster_id: str | None, voters: int = 1
) -> list[DirMeta]:
    """Check every log dir's meta.properties, formatting the dirs that have none.

    The cluster id comes from an already formatted dir, else from `cluster.id`, else is new: only
    for a quorum of one voter, which has nobody to agree with."""
    existing: dict[Path, dict[str, str]] = {}
    for d in log_dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StartupError(f"log.dirs: cannot create {d}: {e.strerror}") from None
        meta_path = d / META_PROPERTIES
        if meta_path.exists():
            existing[d] = _read_meta(meta_path)
        elif any(p.name != "lost+found" for p in d.iterdir()):
            raise StartupError(f"log dir {d} holds files but no {META_PROPERTIES}; refusing to format it")
    cluster_ids = {m.get("cluster.id") for m in existing.values()}
    if len(cluster_ids) > 1:
        raise StartupError(f"log dirs belong to different clusters: {sorted(str(c) for c in cluster_ids)}")
    stored = next(iter(cluster_ids), None)
    if stored is not None and configured_cluster_id is not None and stored != configured_cluster_id:
        raise StartupError(f"cluster.id {configured_cluster_id} does not match the id {stored} stored in the log dirs")
    if stored is None and configured_cluster_id is None and voters > 1:
        raise StartupError(unformatted_quorum_message(log_dirs, voters))
    cluster_id = stored or configured_cluster_id or random_id()
    out = []
    for d in log_dirs:
        meta = existing.get(d)
        if meta is None:
            new_id = random_id()
            text = meta_text(cluster_id, node_id, new_id, "the Strata controller on first start")
            write_atomically(d / META_PROPERTIES, text.encode())
            out.append(DirMeta(d, cluster_id, node_id, id_to_uuid(new_id)))
            continue
        try:
            stored_node = int(meta.get("node.id", ""))
        except ValueError:
            raise StartupError(f"{d / META_PROPERTIES}: node.id is missing or not a number") from None
        if stored_node != node_id:
            raise StartupError(
                f"node.id {node_id} does not match the node.id {stored_node} stored in {d / META_PROPERTIES}"
            )
        if meta.get("version") != "1":
            raise StartupError(f"{d / META_PROPERTIES}: unsupported version {meta.get('version')!r} (expected 1)")
        try:
            directory_id = id_to_uuid(meta["directory.id"])
        except (KeyError, ValueError):
            raise StartupError(f"{d / META_PROPERTIES}: directory.id is missing or malformed") from None
        out.append(DirMeta(d, cluster_id, node_id, directory_id))
    return out


__all__ = ["ConfigError", "DirMeta", "StartupError", "ensure_formatted", "meta_text", "random_id",
           "unformatted_quorum_message", "write_atomically"]
