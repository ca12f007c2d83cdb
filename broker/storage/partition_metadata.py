"""partition.metadata: the topic id a replica dir belongs to (Kafka's format), so a dir left
behind by a deleted topic is never mistaken for a new topic of the same name."""

from __future__ import annotations

import uuid
from pathlib import Path

from broker.storage.atomic_file import read_ascii_file, write_atomically
from broker.storage.errors import StorageError
from broker.storage.uuid_text import format_uuid, parse_uuid

VERSION = 0


def read_topic_id(path: Path | str) -> uuid.UUID | None:
    try:
        text = read_ascii_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageError(f"cannot read {path}: {exc}") from exc
    if text is None:
        return None
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    if fields.get("version") != str(VERSION) or "topic_id" not in fields:
        raise StorageError(f"{path} is not a version {VERSION} partition metadata file")
    try:
        return parse_uuid(fields["topic_id"])
    except ValueError:
        raise StorageError(f"{path} holds a malformed topic id {fields['topic_id']!r}") from None


def write_topic_id(path: Path | str, topic_id: uuid.UUID, *, sync: bool = True) -> None:
    write_atomically(path, f"version: {VERSION}\ntopic_id: {format_uuid(topic_id)}\n".encode("ascii"), sync=sync)


def topic_id_at_open(path: Path | str, expected: uuid.UUID | None, *, sync: bool = True) -> uuid.UUID | None:
    """The topic id a replica dir belongs to: the stored one, else `expected`, which is then
    written (Kafka's UnifiedLog.initializeTopicId). The caller compares it with `expected`."""
    stored = read_topic_id(path)
    if stored is None and expected is not None:
        write_topic_id(path, expected, sync=sync)
        return expected
    return stored
