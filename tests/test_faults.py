"""Jepsen-style: a seeded schedule of kill -9s, SIGSTOP pauses, restarts, network partitions
from the controller or from the other brokers, slow and full disks and wall-clock jumps, of brokers under idempotent acks=all producers, a transactional producer and
a live read_committed consumer on a classic and a diskless topic, then the history checker over everything
sent, acknowledged and read (tests/faults/). STRATA_FAULT_SEED=N replays another schedule; the
long runs are bench/faults.py. The checker itself is tested first on histories made by hand."""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest

from tests.faults.checker import History, anomalies, check, summary
from tests.faults.clock import clock_unavailable
from tests.faults.disks import disks_unavailable
from tests.faults.run import DISKLESS_BROKER, DISKLESS_CONTROLLER, run_schedule, wire_broker_faults
from tests.faults.schedule import CLOCK, FULL, SLOW, SPLIT, plan, wire_links
from tests.faults.split import split_unavailable


def _valid() -> History:
    h = History(attempted={"p0:0", "p0:1", "p0:2", "p1:0"})
    h.acked = {"p0:0": (0, 0), "p0:1": (0, 1), "p1:0": (1, 0)}
    h.final = [(0, 0, "p0:0"), (0, 1, "p0:1"), (1, 0, "p1:0"), (0, 2, "p0:2")]  # p0:2: sent, outcome unknown
    h.reads = [[(0, 0, "p0:0"), (1, 0, "p1:0"), (0, 1, "p0:1")]]
    h.attempted |= {"t0:0", "t0:1", "t0:2", "t0:3", "t0:4", "t0:5"}
    h.txns = [(["t0:0", "t0:1"], "committed"), (["t0:2", "t0:3"], "aborted"), (["t0:4", "t0:5"], "unknown")]
    h.final += [(1, 1, "t0:0"), (2, 0, "t0:1")]
    return h


def test_the_checker_passes_a_valid_history_and_names_each_anomaly() -> None:
    assert anomalies(check(_valid())) == 0, summary(check(_valid()))
    h = _valid()
    h.acked["p0:2"] = (0, None)  # delivered, offset unknown (a lost answer proved by a later success)
    assert anomalies(check(h)) == 0, summary(check(h))
    h.acked["p0:2"] = (1, None)  # ... but in another partition than the one it is in
    assert check(h)["inconsistent"], summary(check(h))
    cases = {
        "lost": lambda h: h.final.remove((0, 1, "p0:1")),
        "duplicated": lambda h: h.final.append((0, 3, "p0:0")),
        "inconsistent": lambda h: h.reads[0].append((0, 2, "p1:0")),
        "nonmonotonic": lambda h: h.reads[0].append((0, 0, "p0:0")),
        "reordered": lambda h: h.final.extend([(2, 0, "p0:2"), (2, 1, "p0:1")]),
        "phantom": lambda h: h.final.append((1, 9, "p9:0")),
        "aborted_read": lambda h: h.reads[0].append((2, 5, "t0:3")),
        "non_atomic": lambda h: h.final.append((2, 1, "t0:4")),
    }
    for kind, spoil in cases.items():
        h = _valid()
        spoil(h)
        result = check(h)
        assert result[kind], (kind, summary(result))
    h = _valid()
    h.final.remove((2, 0, "t0:1"))  # half of a committed transaction: lost, and not atomic
    assert check(h)["lost"] and check(h)["non_atomic"]


def test_the_checker_finds_write_cycles_and_circular_information_flow() -> None:
    """Transactions 0 and 1 write partitions 0 and 1 in opposite orders: a write cycle (G0). Each
    reads a value the other wrote: circular information flow (G1c)."""
    def history(final: list, reads: dict[int, list[str]]) -> History:
        h = History(attempted={"a:0", "a:1", "b:0", "b:1"})
        h.txns = [(["a:0", "a:1"], "committed"), (["b:0", "b:1"], "committed")]
        h.final, h.txn_reads = final, reads
        return h

    ordered = [(0, 0, "a:0"), (0, 1, "b:0"), (1, 0, "a:1"), (1, 1, "b:1")]
    assert anomalies(check(history(ordered, {1: ["a:0"]}))) == 0  # 0 before 1 everywhere: no cycle
    crossed = [(0, 0, "a:0"), (0, 1, "b:0"), (1, 0, "b:1"), (1, 1, "a:1")]
    assert check(history(crossed, {}))["G0"] == [[0, 1]]
    read_back = history([(0, 0, "a:0"), (1, 0, "b:0"), (1, 1, "b:1"), (2, 0, "a:1")], {0: ["b:0"], 1: ["a:1"]})
    result = check(read_back)
    assert result["G1c"] == [[0, 1]] and not result["G0"], summary(result)
    aborted = history(crossed, {})
    aborted.txns[1] = (["b:0", "b:1"], "aborted")  # an aborted transaction is in no cycle (its read is G1a)
    assert not check(aborted)["G0"]


def test_a_schedule_is_the_same_for_the_same_seed() -> None:
    assert plan(7, 60, [1, 2, 3], 6) == plan(7, 60, [1, 2, 3], 6)
    assert plan(7, 60, [1, 2, 3], 6) != plan(8, 60, [1, 2, 3], 6)
    assert all(1.0 <= f.at <= 48.0 for f in plan(7, 60, [1, 2, 3], 20))  # healed for the last fifth


def test_random_faults_lose_duplicate_and_reorder_nothing(cluster_factory, tmp_path) -> None:
    """A classic RF 3 topic and a diskless topic (local store) under one schedule."""
    seed = int(os.environ.get("STRATA_FAULT_SEED", "1"))
    store = {"diskless.storage.url": f"file://{tmp_path / 'objects'}"}  # shared by the brokers, as a bucket is
    c = cluster_factory(start=False, brokers=3,
                        broker_overrides={"replica.lag.time.max.ms": 3000, **DISKLESS_BROKER, **store},
                        controller_overrides={"broker.session.timeout.ms": 6000, **DISKLESS_CONTROLLER})
    links = wire_links(c)  # network partitions between a node and the controller
    try:
        c.start()
        out = run_schedule(c, seed, seconds=40, faults=6, links=links, diskless=True,
                           replay=f"STRATA_FAULT_SEED={seed} .venv/bin/pytest tests/test_faults.py -k random")
    finally:
        c.stop()
        for link in {id(x): x for xs in links.values() for x in xs}.values():
            link.close()
    assert out.anomalies == 0, f"seed {seed}: {out.summary()}"
    assert len(out.applied) >= 4, out.applied  # the nemesis did its work (overlapping faults on one node are skipped)
    for topic, (h, result) in out.by_topic.items():
        outcomes = {o: sum(1 for _, x in h.txns if x == o) for o in ("committed", "aborted", "unknown")}
        print(f"seed {seed} {topic}: transactions {outcomes}; {len(h.attempted)} sent, {len(h.acked)} acknowledged, "
              f"{len(h.final)} read at the end, {sum(map(len, h.reads))} read live; {summary(result)}")
        assert len(h.acked) >= (len(h.attempted) - 3 * len(h.txns)) * 0.9, f"{topic}: most sends are acknowledged"
        assert outcomes["committed"] >= 10 and outcomes["aborted"] >= 2, (topic, outcomes)
    print(f"delivery errors {out.delivery_errors}")


def test_disk_faults_partitions_between_brokers_and_clock_jumps_lose_nothing(cluster_factory, tmp_path) -> None:
    """Each broker's second log dir is a tmpfs behind a FUSE passthrough (tests/faults/disks.py):
    slow disks (every write and fsync there late by schedule.SLOW_DISK_S) and full disks (the
    tmpfs filled: the broker takes the dir offline at its next write there, and is restarted once
    the space is freed); brokers cut off from the other brokers by iptables (a cut leader shrinks
    its ISR, and min.insync.replicas=2 then refuses acks=all writes until it heals); a broker's
    wall clock jumping forward or back by minutes and back again; kill -9s. One schedule, a
    classic RF 3 topic with idempotent and transactional producers."""
    reasons = [r for r in (disks_unavailable(), split_unavailable(), clock_unavailable()) if r]
    if reasons:
        pytest.skip("; ".join(reasons))
    seed = int(os.environ.get("STRATA_FAULT_SEED", "128"))
    c = cluster_factory(start=False, brokers=3, broker_overrides={"replica.lag.time.max.ms": 3000},
                        controller_overrides={"broker.session.timeout.ms": 6000})
    with ExitStack() as stack:
        faults = wire_broker_faults(c, stack, tmp_path)
        c.start()
        out = run_schedule(c, seed, seconds=40, faults=8, **faults, kinds=(SLOW, FULL, SPLIT, "kill", CLOCK),
                           replay=f"STRATA_FAULT_SEED={seed} .venv/bin/pytest tests/test_faults.py -k disk_faults")
        # the faulty dirs held the topic's replicas (read before they are unmounted)
        assert any(d.name.startswith("faults-") for b in c.broker_ids
                   for d in (c.node_dir(b) / "logs-1.backing").iterdir())
    assert out.anomalies == 0, f"seed {seed}: {out.summary()}"
    filled = {f.node for f in out.faults if f.kind == FULL}
    for b in set(c.broker_ids) - filled:  # a slow disk is not a failed one
        assert "log_dir_offline" not in c.log_path(b).read_text(errors="replace"), f"broker {b} lost a log dir"
    applied = {a.split()[1] for a in out.applied}
    offline = [b for b in filled if "No space left" in c.log_path(b).read_text(errors="replace")]
    if "STRATA_FAULT_SEED" not in os.environ:  # the default schedule has each of these faults
        assert {SLOW, FULL, SPLIT, "kill", CLOCK} <= applied, out.applied
        assert offline, "no full disk was taken offline"  # its full disks last 4.6 and 6.9 s
    h = out.history
    print(f"seed {seed}: {len(h.attempted)} sent, {len(h.acked)} acknowledged, {len(h.final)} read at the end; "
          f"{summary(out.result)}; delivery errors {out.delivery_errors}; full dirs taken offline on {offline}")
    assert len(h.acked) >= (len(h.attempted) - 3 * len(h.txns)) * 0.9, "most sends are acknowledged"
