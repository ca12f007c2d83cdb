"""The index searches (offset and time index) against a plain scan: every field, strict or not,
values below, between, on and past the entries, windows smaller and larger than the in-memory
search window."""

from __future__ import annotations

import random
from pathlib import Path

from broker.storage.index_file import OffsetIndex, TimeIndex


def _plain(entries: list[tuple[int, int]], field: int, value: int, strict: bool) -> int:
    found = -1
    for i, e in enumerate(entries):
        if e[field] < value or (e[field] == value and not strict):
            found = i
    return found


def test_last_at_most_agrees_with_a_plain_scan(tmp_path: Path) -> None:
    rng = random.Random(7)
    for count in (0, 1, 2, 3, 511, 512, 513, 1500, 5000):
        off = OffsetIndex(tmp_path / f"{count}.index", 1000, 10 * 1024 * 1024)
        tim = TimeIndex(tmp_path / f"{count}.timeindex", 1000, 10 * 1024 * 1024)
        o = p = t = 0
        for _ in range(count):
            o, p, t = o + rng.randint(1, 5), p + rng.randint(1, 9000), t + rng.randint(1, 3)
            off.append(1000 + o, p)
            tim.maybe_append(t, 1000 + o)
        for index, entries in ((off, [(e[0], e[1]) for e in _entries(off)]), (tim, _entries(tim))):
            assert len(entries) == count
            for field in (0, 1):
                keys = [e[field] for e in entries] or [0]
                probes = {-1, 0, keys[0], keys[-1], keys[-1] + 1, *(rng.randint(-2, keys[-1] + 3) for _ in range(40)), *keys[:3],
                          *keys[-3:], *(keys[i] for i in rng.sample(range(len(keys)), min(20, len(keys))))}
                for value in probes:
                    for strict in (False, True):
                        assert index.last_at_most(field, value, strict=strict) == _plain(entries, field, value, strict), (
                            count, field, value, strict)
        off.close()
        tim.close()


def _entries(index) -> list[tuple[int, int]]:
    return [index.entry(i) for i in range(index.entries)]
