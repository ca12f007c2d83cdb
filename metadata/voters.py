"""The metadata quorum's voter set (KIP-853), as Kafka's VoterSet and VoterSetHistory.

With `controller.quorum.voters` the set is static (kraft.version 0) and never changes. A quorum
formatted with `--standalone` or `--initial-controllers` (kraft.version 1) keeps its voter set in
the log instead: a KRAFT_VOTERS control record (type 6) holds the whole set from its offset on;
the bootstrap snapshot at offset 0 holds the first one, and every snapshot repeats the set it
covers. A replica uses the newest set in its log, committed or not (KIP-853 "Voter Changes"),
and forgets sets that a truncation removes; a broker follows the committed ones to find the
quorum.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from metadata.image import METADATA_TOPIC
from protocol.errors import ProtocolError
from protocol.generated.control_records.voters_record import VotersRecord
from protocol.generated.describe_quorum import DescribeQuorumRequest, DescribeQuorumResponse
from protocol.records import Record, decode_batches, encode_batch, iter_batches

CONTROL_KRAFT_VOTERS = 6  # Kafka's ControlRecordType.KRAFT_VOTERS
KRAFT_VERSION_MAX = 1  # the kraft.version range this controller runs (0: static, 1: KIP-853)
_KEY = CONTROL_KRAFT_VOTERS.to_bytes(4, "big")  # version 0 | type 6
ZERO_UUID = UUID(int=0)


@dataclass(frozen=True)
class Voter:
    id: int
    directory_id: UUID
    endpoints: tuple[tuple[str, str, int], ...]  # (listener, host, port), the first one dialled

    @property
    def address(self) -> tuple[str, int]:
        _, host, port = self.endpoints[0]
        return host, port


VoterSet = dict[int, Voter]


def static_voters(voters: dict[int, tuple[str, int]], listener: str) -> VoterSet:
    """`controller.quorum.voters` as a voter set: no directory ids (kraft.version 0)."""
    return {vid: Voter(vid, ZERO_UUID, ((listener, host, port),)) for vid, (host, port) in voters.items()}


def addresses(voters: VoterSet) -> dict[int, tuple[str, int]]:
    return {vid: v.address for vid, v in voters.items()}


def describe_quorum_request() -> DescribeQuorumRequest:
    """DescribeQuorum of the metadata log's one partition: who leads, and (KIP-853) the voters."""
    R = DescribeQuorumRequest
    return R(topics=[R.TopicData(topic_name=METADATA_TOPIC, partitions=[R.PartitionData(partition_index=0)])])


def node_addresses(nodes: Iterable[DescribeQuorumResponse.Node]) -> dict[int, tuple[str, int]]:
    """A DescribeQuorum answer's Nodes as id -> the address of each one's first listener."""
    return {n.node_id: (n.listeners[0].host, n.listeners[0].port) for n in nodes if n.listeners}


def voters_record(voters: VoterSet, timestamp: int) -> Record:
    R = VotersRecord
    msg = R(version=0, voters=[R.Voter(voter_id=v.id, voter_uuid=v.directory_id,
                                       endpoints=[R.Endpoint(name=n, host=h, port=p) for n, h, p in v.endpoints],
                                       k_raft_version_feature=R.KRaftVersionFeature(
                                           min_supported_version=0, max_supported_version=KRAFT_VERSION_MAX))
                               for v in sorted(voters.values(), key=lambda v: v.id)])
    return Record(key=_KEY, value=msg.encode(0), timestamp=timestamp)


def voters_batch(voters: VoterSet, epoch: int, timestamp: int, base_offset: int = 0) -> bytes:
    """One control batch holding the set (as a snapshot carries it)."""
    return encode_batch([voters_record(voters, timestamp)], base_offset=base_offset, partition_leader_epoch=epoch,
                        control=True, base_timestamp=timestamp)


def read_voters(record: Record) -> VoterSet | None:
    """The voter set in a KRAFT_VOTERS control record, None for other control types."""
    if record.key is None or bytes(record.key[:4]) != _KEY or record.value is None:
        return None
    msg = VotersRecord.decode(bytes(record.value), 0)
    return {v.voter_id: Voter(v.voter_id, v.voter_uuid, tuple((e.name, e.host, e.port) for e in v.endpoints))
            for v in msg.voters}


def voter_sets_in(data: bytes) -> list[tuple[int, VoterSet]]:
    """(offset, voter set) of each KRAFT_VOTERS record in whole record batches; only control
    batches are decoded."""
    out: list[tuple[int, VoterSet]] = []
    view = memoryview(data)
    for pos, h in iter_batches(data, check_crc=False, allow_partial_tail=True):
        if not h.is_control:
            continue
        try:
            for b in decode_batches(bytes(view[pos:pos + h.size]), check_crc=False):
                for r in b.records:
                    found = read_voters(r)
                    if found is not None:
                        out.append((r.offset, found))
        except (ProtocolError, ValueError) as e:
            raise ProtocolError(f"control batch at {h.base_offset}: {e}") from None
    return out


class VoterHistory:
    """The voter sets by the offset they start at; the newest one is in force."""

    def __init__(self, static: VoterSet | None = None) -> None:
        self.static = static  # kraft.version 0: the configured set, never changed
        self._offsets: list[int] = []
        self._sets: list[VoterSet] = []

    @property
    def dynamic(self) -> bool:
        return self.static is None

    def latest(self) -> VoterSet:
        if self.static is not None:
            return self.static
        return self._sets[-1] if self._sets else {}

    def latest_offset(self) -> int:
        """The offset of the newest set (-1: none, or the bootstrap snapshot's)."""
        return self._offsets[-1] if self._offsets else -1

    def at(self, end_offset: int) -> VoterSet:
        """The set in force just before `end_offset` (what a snapshot ending there holds)."""
        if self.static is not None:
            return self.static
        i = bisect.bisect_left(self._offsets, end_offset)
        return self._sets[i - 1] if i else {}

    def add(self, offset: int, voters: VoterSet) -> None:
        if self.static is not None:
            return
        if self._offsets and offset <= self._offsets[-1]:
            self.truncate_from(offset)
        self._offsets.append(offset)
        self._sets.append(dict(voters))

    def add_all(self, found: Iterable[tuple[int, VoterSet]]) -> None:
        for offset, voters in found:
            self.add(offset, voters)

    def truncate_from(self, end_offset: int) -> None:
        """The log was cut at `end_offset`: sets written at or after it are gone."""
        i = bisect.bisect_left(self._offsets, end_offset)
        del self._offsets[i:], self._sets[i:]

    def reset(self, end_offset: int, voters: VoterSet) -> None:
        """The log was replaced by a snapshot ending at `end_offset` that holds `voters`."""
        self._offsets, self._sets = [end_offset - 1], [dict(voters)]
