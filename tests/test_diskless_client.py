"""The broker-side coordinator client's batching: lookups made in one turn of the event loop go
out as one request per target broker, the targets in parallel; a request that fails answers each
of its items with the failure answer."""

from __future__ import annotations

import asyncio

from broker.diskless.coordinator_client import RequestBatcher


def test_one_request_per_target_per_loop_turn() -> None:
    async def run() -> None:
        sent: list[tuple[int, list[str]]] = []
        in_flight = 0
        overlapped = False

        async def send(target: int, items: list[str]) -> list[str]:
            nonlocal in_flight, overlapped
            if target == 9:
                raise ConnectionError("peer gone")
            sent.append((target, items))
            in_flight += 1
            await asyncio.sleep(0.01)
            overlapped = overlapped or in_flight > 1
            in_flight -= 1
            return [f"{target}:{i}" for i in items]

        batcher: RequestBatcher[str, str] = RequestBatcher(send, lambda item: f"failed:{item}")
        # a Fetch asking for five partitions of coordinators on brokers 1 and 2, and one on a dead broker
        futs = [batcher.add(t, i) for t, i in ((1, "a"), (2, "b"), (1, "c"), (2, "d"), (1, "e"), (9, "f"))]
        assert await asyncio.gather(*futs, return_exceptions=True) == [
            "1:a", "2:b", "1:c", "2:d", "1:e", "failed:f"]
        assert sorted(sent) == [(1, ["a", "c", "e"]), (2, ["b", "d"])]
        assert overlapped  # the two brokers' requests were in flight together
        # the next turn of the loop: a new request
        assert await batcher.add(1, "g") == "1:g"
        assert sent[-1] == (1, ["g"])

    asyncio.run(run())
