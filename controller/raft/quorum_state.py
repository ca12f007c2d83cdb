"""The durable election state: `<metadata log dir>/__cluster_metadata-0/quorum-state`, Kafka's
file name and JSON layout, so a voter never votes twice in one epoch or forgets the epoch it saw,
even across a crash. Written atomically (tmp + fsync + rename) from a thread."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from controller.log_dirs import write_atomically

FILE_NAME = "quorum-state"
DATA_VERSION = 0


class QuorumStateError(Exception):
    """The file exists but cannot be read: starting blind could mean voting twice in an epoch."""


@dataclass(frozen=True)
class ElectionState:
    epoch: int = 0
    leader_id: int = -1
    voted_id: int = -1


class QuorumStateFile:
    def __init__(self, directory: Path, voters: list[int]) -> None:
        self.path = directory / FILE_NAME
        self.voters = sorted(voters)

    def read(self) -> ElectionState:
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return ElectionState()
        except OSError as e:
            raise QuorumStateError(f"cannot read {self.path}: {e.strerror}") from None
        try:
            doc = json.loads(raw)
            return ElectionState(int(doc["leaderEpoch"]), int(doc.get("leaderId", -1)), int(doc.get("votedId", -1)))
        except (ValueError, KeyError, TypeError) as e:
            raise QuorumStateError(f"{self.path} is not a quorum state file: {e}") from None

    def write(self, state: ElectionState) -> None:
        """Blocking: run it in a thread."""
        doc = {
            "clusterId": "",
            "leaderId": state.leader_id,
            "leaderEpoch": state.epoch,
            "votedId": state.voted_id,
            "appliedOffset": 0,
            "currentVoters": [{"voterId": v} for v in self.voters],
            "data_version": DATA_VERSION,
        }
        write_atomically(self.path, json.dumps(doc, separators=(",", ":")).encode())
