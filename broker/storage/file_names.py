"""Names on disk: chunk replica dirs, segment files and the per-log files beside them."""

from __future__ import annotations

import os
import re
import sys
from typing import NamedTuple

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"  # aborted transactions whose marker is in the segment
DELETED_SUFFIX = ".deleted"  # a segment file waiting for file.delete.delay.ms
TMP_SUFFIX = ".tmp"  # a half-written checkpoint; never trusted

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
LOG_STATE_CHECKPOINT = "log-state.checkpoint"
# In a log dir, not a replica dir: every log in it was closed and the dir synced (Kafka's name).
CLEAN_SHUTDOWN_MARKER = ".kafka_cleanshutdown"

# Suffixes of replica dirs that are not live replicas (JBOD moves and deletes).
MOVE_SUFFIX = ".move"
DELETE_SUFFIX = ".delete"

_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# Greedy topic: the partition and chunk start are the last two '-'-separated numbers; anything after
# them that starts with '.' is a suffix such as ".move" or ".delete".
_REPLICA_DIR = re.compile(r"(?P<topic>.+)-(?P<partition>\d+)-(?P<chunk_start>\d+)(?P<suffix>\..*)?")
_SEGMENT_FILE = re.compile(r"(?P<base>\d{20})(?P<ext>\.log|\.index|\.timeindex|\.txnindex)(?P<deleted>\.deleted)?")


class ReplicaDirName(NamedTuple):
    topic: str
    partition: int
    chunk_start: int
    suffix: str  # "" for a live chunk replica, else e.g. ".move", ".delete"


def replica_dir_name(topic: str, partition: int, chunk_start: int) -> str:
    """`<topic>-<partition>-<chunkStart>`; refuses names that would not parse back."""
    if not _LEGAL_TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise ValueError(f"illegal topic name {topic!r}")
    if partition < 0 or chunk_start < 0:
        raise ValueError(f"partition ({partition}) and chunk start ({chunk_start}) must be >= 0")
    return f"{topic}-{partition}-{chunk_start}"


def parse_replica_dir_name(name: str) -> ReplicaDirName | None:
    """The parts of a chunk replica dir name, or None if the name is not one."""
    m = _REPLICA_DIR.fullmatch(name)
    if m is None or not _LEGAL_TOPIC.fullmatch(m["topic"]):
        return None
    return ReplicaDirName(m["topic"], int(m["partition"]), int(m["chunk_start"]), m["suffix"] or "")


def segment_file_name(base_offset: int, suffix: str) -> str:
    """Kafka's 20-digit zero-padded base offset, so names sort like offsets."""
    return f"{base_offset:020d}{suffix}"


class SegmentFileName(NamedTuple):
    base_offset: int
    suffix: str  # LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX or TXN_INDEX_SUFFIX
    deleted: bool


def parse_segment_file_name(name: str) -> SegmentFileName | None:
    m = _SEGMENT_FILE.fullmatch(name)
    if m is None:
        return None
    return SegmentFileName(int(m["base"]), m["ext"], m["deleted"] is not None)


def interned_parts(path: str) -> tuple[str, str]:
    """`path` as (its dir with the separator, its name), both interned: the files of a log share
    one dir string and same-named files (every log's first segment) one name, where a whole path
    each was about 120 bytes a file for each of 20,000 partitions. Join them again on use."""
    head, sep, name = path.rpartition(os.sep)
    return sys.intern(head + sep), sys.intern(name)
