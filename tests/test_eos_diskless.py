"""The exactly-once loop of tests/test_eos_loop.py (confluent-kafka read-process-write, offsets in
the transaction, the transaction coordinator's broker kill -9ed mid-transaction and restarted)
over diskless topics: input and output both diskless, and a diskless input with a classic
output, on the local store and on SeaweedFS. The output, read with read_committed, holds every
input exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.eos_app import KILL_COORDINATOR, PARTITIONS, TXN_ID
from tests.s3_server import SeaweedS3, s3_server  # noqa: F401
from tests.test_eos_loop import BROKER, CONTROLLER, fill_input, read_output, run_application, txn_coordinator
from tools.cluster import Cluster

pytestmark = pytest.mark.slow

N = 100_000
DISKLESS = {"diskless.metadata.topic.num.partitions": "3", "diskless.wal.max.ms": "50"}


def create_topics(c: Cluster, diskless: set[str]) -> None:
    a = AdminClient({"bootstrap.servers": c.bootstrap})
    for t in ("eos-in", "eos-out"):
        if t in diskless:
            topic = NewTopic(t, PARTITIONS, 1, config={"diskless.enable": "true"})
        else:
            topic = NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"})
        a.create_topics([topic])[t].result(30)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("diskless", "store"), [({"eos-in", "eos-out"}, "local"), ({"eos-in", "eos-out"}, "s3"),
                                                 ({"eos-in"}, "local")],
                         ids=["both-diskless-local", "both-diskless-s3", "diskless-in-local"])
def test_exactly_once_loop_on_diskless_topics(tmp_path: Path, diskless: set[str], store: str,
                                              request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = {**BROKER, **DISKLESS, "diskless.storage.url": f"file://{tmp_path / 'objects'}"}
    if store == "s3":
        s3: SeaweedS3 = request.getfixturevalue("s3_server")
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)  # the brokers inherit them (obstore reads AWS_*)
        broker.update({"diskless.storage.url": f"s3://{s3.bucket}/wal", "diskless.storage.s3.endpoint": s3.endpoint,
                       "diskless.storage.s3.region": "us-east-1"})
    with Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=broker,
                 controller_overrides={**CONTROLLER, **DISKLESS}) as c:
        create_topics(c, diskless)
        started = time.monotonic()
        fill_input(c, N)
        filled = time.monotonic()
        victim = txn_coordinator(c, TXN_ID)
        counts, killed_at = run_application(c, N, KILL_COORDINATOR, victim)
        assert killed_at is not None
        looped = time.monotonic()
        out = read_output(c, N)
        assert len(out) == N, f"{len(out)} output messages, {len(set(out))} distinct"
        assert set(out) == {b"out-%d" % i for i in range(N)}
        if store == "local":
            assert any(f.is_file() for f in (tmp_path / "objects").rglob("*"))  # the data went diskless
        print(f"fill {filled - started:.1f}s, loop {looped - filled:.1f}s (coordinator {victim} killed; {counts}), "
              f"verify {time.monotonic() - looped:.1f}s")
