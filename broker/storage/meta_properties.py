"""meta.properties: which node and cluster a log dir belongs to (Kafka's KRaft v1 format)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from broker.storage.atomic_file import write_atomically
from broker.storage.errors import StorageError
from broker.storage.uuid_text import format_uuid, parse_uuid

FILE_NAME = "meta.properties"
VERSION = 1
# Kafka reserves the first 100 uuids with a zero high half (UNASSIGNED, LOST, MIGRATING, ...).
_RESERVED_BELOW = 100


@dataclass(frozen=True)
class MetaProperties:
    node_id: int
    cluster_id: str
    directory_id: uuid.UUID | None  # None only when read from an older file that lacks it
    version: int = VERSION

    def to_text(self) -> str:
        if self.directory_id is None:
            raise ValueError("a meta.properties we write always carries a directory.id")
        return (
            "#\n# Written by Strata: the node and cluster this log dir belongs to.\n"
            f"version={self.version}\n"
            f"node.id={self.node_id}\n"
            f"cluster.id={self.cluster_id}\n"
            f"directory.id={format_uuid(self.directory_id)}\n"
        )


def new_directory_id() -> uuid.UUID:
    while True:
        candidate = uuid.uuid4()
        if candidate.int >> 64 != 0 or (candidate.int & (2**64 - 1)) >= _RESERVED_BELOW:
            return candidate


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties subset: key=value lines, '#'/'!' comments (enough for the keys we write)."""
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def read_meta_properties(path: Path) -> MetaProperties:
    """The file's content; directory_id is None when the file predates directory ids."""
    props = parse_properties(path.read_text("utf-8"))
    try:
        version = int(props["version"])
        node_id = int(props["node.id"])
        cluster_id = props["cluster.id"]
    except (KeyError, ValueError) as exc:
        raise StorageError(f"{path} is malformed ({exc!r}); expected version, node.id and cluster.id") from None
    if version != VERSION:
        raise StorageError(f"{path} has version {version}; only version {VERSION} (KRaft) is supported")
    if "directory.id" not in props:
        return MetaProperties(node_id, cluster_id, None, version)
    try:
        directory_id = parse_uuid(props["directory.id"])
    except ValueError:
        raise StorageError(f"{path} holds a malformed directory.id {props['directory.id']!r}") from None
    return MetaProperties(node_id, cluster_id, directory_id, version)


def write_meta_properties(path: Path, meta: MetaProperties) -> None:
    write_atomically(path, meta.to_text().encode("utf-8"))
