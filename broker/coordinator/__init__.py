"""Coordinators: state machines whose state lives in an internal, compacted topic and moves with the
leadership of its partitions (group coordinator on __consumer_offsets, transaction coordinator on
__transaction_state; a diskless coordinator to come)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.ports import ImageSource


def wall_clock_ms() -> int:
    """Now, in ms since the epoch: what coordinator records and timeouts are stamped with."""
    return time.time_ns() // 1_000_000


async def metadata_caught_up(metadata: ImageSource) -> None:
    """Return once the broker's metadata has caught up with the controller. A restarted broker
    first replays its own, stale, metadata log and briefly believes it still leads what it led
    before it went down: a coordinator loading then would act (send markers, write state) for
    partitions that moved. A load waits for this; if leadership does not survive the catch-up
    the load is cancelled meanwhile. A metadata source without `caught_up` (a MetadataView has
    it) is taken as caught up."""
    caught_up = getattr(metadata, "caught_up", None)
    if caught_up is not None and not caught_up.is_set():
        await caught_up.wait()
