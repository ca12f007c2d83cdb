"""Metadata snapshots: `<log dir>/__cluster_metadata-0/<end offset, 20 digits>.checkpoint`.

A snapshot is the whole MetadataImage written as metadata records in record batches (offsets
counted from 0 inside the file, leader epoch as in the log). Its end offset is the first log
offset it does not cover, Kafka's SnapshotId.EndOffset. Files are written to a .tmp name, fsynced
and renamed, so a crash leaves either no snapshot or a complete one; a restart loads the latest
and replays the log from its end offset.
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from controller.log_dirs import write_atomically
from controller.metadata_log import fsync_dir
from metadata.image import MetadataImage
from metadata.records import decode_record, encode_record
from protocol.errors import ProtocolError
from protocol.generated.metadata_records.access_control_entry_record import AccessControlEntryRecord
from protocol.generated.metadata_records.chunk_record import ChunkRecord
from protocol.generated.metadata_records.client_quota_record import ClientQuotaRecord
from protocol.generated.metadata_records.config_record import ConfigRecord
from protocol.generated.metadata_records.feature_level_record import FeatureLevelRecord
from protocol.generated.metadata_records.partition_record import PartitionRecord
from protocol.generated.metadata_records.producer_ids_record import ProducerIdsRecord
from protocol.generated.metadata_records.register_broker_record import RegisterBrokerRecord
from protocol.generated.metadata_records.topic_record import TopicRecord
from protocol.generated.metadata_records.undeleted_partition_count_record import UndeletedPartitionCountRecord
from protocol.generated.metadata_records.user_scram_credential_record import UserScramCredentialRecord
from protocol.records import Record, decode_batches, encode_batch, iter_batches
from protocol.records.batch import BATCH_HEADER_SIZE, read_header

SUFFIX = ".checkpoint"
_NAME_RE = re.compile(r"(\d{20})\.checkpoint")
RECORDS_PER_BATCH = 1000  # keeps each batch well under a fetch's max bytes


class SnapshotError(Exception):
    """A snapshot file is unreadable or fails its checks."""


def snapshot_name(end_offset: int) -> str:
    return f"{end_offset:020d}{SUFFIX}"


def image_records(image: MetadataImage) -> Iterator[Any]:
    """The records that rebuild `image` when replayed on an empty one."""
    for name, level in sorted(image.features.items()):
        yield FeatureLevelRecord(name=name, feature_level=level)
    for b in sorted(image.brokers.values(), key=lambda b: b.id):
        yield RegisterBrokerRecord(
            broker_id=b.id,
            incarnation_id=b.incarnation_id,
            broker_epoch=b.epoch,
            end_points=[RegisterBrokerRecord.BrokerEndpoint(e.listener, e.host, e.port, e.security_protocol)
                        for e in b.endpoints],
            rack=b.rack,
            fenced=b.fenced,
            in_controlled_shutdown=b.in_controlled_shutdown,
            log_dirs=list(b.log_dirs),
        )
    topic_names = {t.name for t in image.topics.values()}
    for (rtype, rname), entries in sorted(image.configs.items()):
        if rtype == 2 and rname in topic_names:
            continue  # written after the topic's TopicRecord
        for k, v in sorted(entries.items()):
            yield ConfigRecord(resource_type=rtype, resource_name=rname, name=k, value=v)
    for t in sorted(image.topics.values(), key=lambda t: t.name):
        yield TopicRecord(name=t.name, topic_id=t.id)
        for k, v in sorted(image.topic_config(t.name).items()):
            yield ConfigRecord(resource_type=2, resource_name=t.name, name=k, value=v)
        for p in sorted(t.partitions.values(), key=lambda p: p.partition):
            yield PartitionRecord(
                partition_id=p.partition,
                topic_id=t.id,
                replicas=list(p.replicas),
                isr=list(p.isr),
                removing_replicas=list(p.removing_replicas),
                adding_replicas=list(p.adding_replicas),
                leader=p.leader,
                leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch,
                directories=list(p.directories),
                start_offset=p.start_offset if p.start_offset > 0 else -1,
                start_timestamp=p.start_timestamp,
                diskless_coordinator=p.diskless_coordinator,
                eligible_leader_replicas=list(p.elr) if p.elr else None,
                last_known_elr=list(p.last_known_elr) if p.last_known_elr else None,
                leader_epoch_after_creation=[
                    PartitionRecord.PartitionEpochAfterCreation(i, e) for i, e in p.epochs_after_creation
                ],
                leader_epoch_before_deletion=[
                    PartitionRecord.PartitionEpochBeforeDeletion(i, e) for i, e in p.epochs_before_deletion
                ],
            )
        if t.undeleted_count >= 0:
            yield UndeletedPartitionCountRecord(topic_id=t.id, undeleted_partition_count=t.undeleted_count)
        for partition, chunks in sorted(t.chunks.items()):
            for c in chunks:
                yield ChunkRecord(
                    partition_id=partition,
                    topic_id=t.id,
                    start_offset=c.start_offset,
                    start_timestamp=c.start_timestamp,
                    stop_offset=c.stop_offset,
                    end_offset=c.end_offset,
                    chunk_epoch=c.chunk_epoch,
                    replicas=list(c.replicas),
                    directories=list(c.directories),
                    isr=list(c.isr),
                    removing_replicas=list(c.removing_replicas),
                    adding_replicas=list(c.adding_replicas),
                    log_start_offset=c.log_start_offset,
                )
    for entity, values in sorted(image.client_quotas.items(), key=lambda kv: repr(kv[0])):
        for k, v in sorted(values.items()):
            yield ClientQuotaRecord(
                entity=[ClientQuotaRecord.EntityData(t, n) for t, n in entity], key=k, value=v, remove=False
            )
    for acl_id, a in sorted(image.acls.items()):
        yield AccessControlEntryRecord(id=acl_id, resource_type=a.resource_type, resource_name=a.resource_name,
                                       pattern_type=a.pattern_type, principal=a.principal, host=a.host,
                                       operation=a.operation, permission_type=a.permission)
    for (name, mechanism), cred in sorted(image.scram.items()):
        yield UserScramCredentialRecord(name=name, mechanism=mechanism, salt=cred.salt, stored_key=cred.stored_key,
                                        server_key=cred.server_key, iterations=cred.iterations)
    if image.next_producer_id > 0:
        yield ProducerIdsRecord(broker_id=-1, broker_epoch=-1, next_producer_id=image.next_producer_id)


def encode_snapshot(image: MetadataImage, leader_epoch: int, timestamp_ms: int) -> bytes:
    out = []
    batch: list[Record] = []
    offset = 0

    def flush() -> None:
        nonlocal offset, batch
        if batch:
            out.append(
                encode_batch(
                    batch, base_offset=offset, partition_leader_epoch=leader_epoch, base_timestamp=timestamp_ms
                )
            )
            offset += len(batch)
            batch = []

    for r in image_records(image):
        batch.append(Record(value=encode_record(r)))
        if len(batch) >= RECORDS_PER_BATCH:
            flush()
    flush()
    return b"".join(out)


class SnapshotStore:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in self.dir.glob(f"*{SUFFIX}.tmp"):
            p.unlink()  # an unfinished write from before a crash

    def list(self) -> list[int]:
        """End offsets of the snapshots on disk, oldest first."""
        return sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := _NAME_RE.fullmatch(p.name)))

    def latest(self) -> int | None:
        offsets = self.list()
        return offsets[-1] if offsets else None

    def path(self, end_offset: int) -> Path:
        return self.dir / snapshot_name(end_offset)

    def epoch(self, end_offset: int) -> int:
        """The leader epoch a snapshot's batches carry (that of its last record); 0 if empty."""
        try:
            with open(self.path(end_offset), "rb") as f:
                head = f.read(BATCH_HEADER_SIZE)
        except OSError:
            return 0
        return read_header(head).partition_leader_epoch if len(head) == BATCH_HEADER_SIZE else 0

    def write(self, data: bytes, end_offset: int) -> int:
        """Blocking (run it in a thread). Returns the size written."""
        write_atomically(self.path(end_offset), data)
        return len(data)

    def load(self, end_offset: int) -> builtins.list[Any]:  # `list` in this class body is the method above
        """Every record of a snapshot, after checking each batch's CRC and framing."""
        path = self.path(end_offset)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise SnapshotError(f"cannot read snapshot {path.name}: {e.strerror}") from None
        try:
            covered = sum(h.size for _, h in iter_batches(data, check_crc=True))
            if covered != len(data):
                raise SnapshotError(f"snapshot {path.name} has {len(data) - covered} trailing bytes")
            return [decode_record(r.value)[0] for b in decode_batches(data) if not b.header.is_control
                    for r in b.records]
        except (ProtocolError, TypeError) as e:
            raise SnapshotError(f"snapshot {path.name} is corrupt: {e}") from None

    def read_range(self, end_offset: int, position: int, max_bytes: int) -> tuple[int, bytes] | None:
        """(total size, bytes from position) of a snapshot, or None if it is gone. Blocking."""
        try:
            fd = os.open(self.path(end_offset), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if position >= size:
                return size, b""
            return size, os.pread(fd, max(0, min(max_bytes, size - position)), position)
        finally:
            os.close(fd)

    def delete_older_than(self, end_offset: int) -> int:
        """Blocking. Keeps the snapshot at end_offset and newer ones."""
        doomed = [o for o in self.list() if o < end_offset]
        for o in doomed:
            self.path(o).unlink(missing_ok=True)
        if doomed:
            fsync_dir(self.dir)
        return len(doomed)
