"""The role-change log lines of a metadata delta (broker/replication/role_changes.py), built with
fake partitions: a small delta logs a line a partition, a bulk one a summary line."""

from __future__ import annotations

from types import SimpleNamespace

from structlog.testing import capture_logs

from broker.replication.role_changes import BULK, NAMED, RoleChanges


def fake_partition(index: int, leader: int) -> SimpleNamespace:
    info = SimpleNamespace(leader=leader, leader_epoch=3, isr=(1, 2))
    return SimpleNamespace(topic="t", index=index, info=info, log=SimpleNamespace(log_end_offset=7))


def apply(changes: RoleChanges, kinds: list[str | None]) -> None:
    for i, kind in enumerate(kinds):
        changes.record(fake_partition(i, 1 if kind == "leader" else 2), kind)  # type: ignore[arg-type]
    changes.summary(metadata_offset=42)


def test_a_small_delta_logs_each_change():
    with capture_logs() as logs:
        apply(RoleChanges(3), ["leader", None, "follower"])
    assert [(e["event"], e["partition"]) for e in logs] == [("became_leader", 0), ("became_follower", 2)]
    assert logs[0]["log_end_offset"] == 7 and logs[0]["isr"] == [1, 2] and logs[1]["leader"] == 2


def test_a_bulk_delta_logs_one_summary_line():
    n = BULK + 50
    kinds: list[str | None] = ["leader"] * (n - 10) + ["follower"] * 10
    with capture_logs() as logs:
        apply(RoleChanges(n), kinds)
    # the per-partition lines are at debug, below the INFO level the tests (as a broker) run at
    [summary] = logs
    assert summary["event"] == "replica_roles_changed"
    assert (summary["became_leader"], summary["became_follower"]) == (n - 10, 10)
    assert summary["first_leaders"] == [f"t-{i}" for i in range(NAMED)]
    assert summary["first_followers"] == [f"t-{i}" for i in range(n - 10, n - 10 + NAMED)]
    assert summary["metadata_offset"] == 42


def test_a_bulk_delta_without_role_changes_logs_nothing():
    with capture_logs() as logs:
        apply(RoleChanges(BULK + 1), [None] * (BULK + 1))
    assert logs == []
