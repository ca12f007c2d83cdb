"""The exactly-once loop of tests/test_eos_loop.py (confluent-kafka read-process-write, offsets in
the transaction, the transaction coordinator's broker kill -9ed mid-transaction and restarted,
then another broker kill -9ed and restarted while the loop goes on) over diskless topics: input and output both diskless, and a diskless input with a classic
output, on the local store and on SeaweedFS. The output, read with read_committed, holds every
input exactly once."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.eos_app import KILL_COORDINATOR, PARTITIONS, TXN_ID
from tests.s3_server import SeaweedS3, s3_server  # noqa: F401
from tests.test_eos_loop import APP_LIMIT_S, BROKER, CONTROLLER, fill_input, read_output, txn_coordinator
from tools.cluster import REPO_ROOT, Cluster

pytestmark = pytest.mark.slow

N = 100_000
DISKLESS = {"diskless.metadata.topic.num.partitions": "3", "diskless.wal.max.ms": "50"}
DOWN_S = 3.0  # each killed broker stays down this long


def run_with_two_kills(c: Cluster, n: int, coordinator: int) -> tuple[dict, list[int]]:
    """Run tests/eos_app.py over `n` inputs: when it asks (inside an open transaction), kill -9 the
    transaction coordinator's broker and restart it DOWN_S later; then kill -9 another broker
    (the next one) and restart it DOWN_S later, while the loop goes on. The application's
    counters and the brokers killed, in order."""
    app = subprocess.Popen([sys.executable, "-m", "tests.eos_app", c.bootstrap, str(n), KILL_COORDINATOR],
                           cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert app.stdin is not None and app.stdout is not None
    second = next(b for b in (1, 2, 3) if b != coordinator)
    plan = [coordinator, second]
    killed: list[int] = []
    down: tuple[int, float] | None = None  # (broker, killed at)
    deadline = time.monotonic() + APP_LIMIT_S
    try:
        while True:
            assert time.monotonic() < deadline, "the application neither finished nor failed in time"
            if down is not None and time.monotonic() - down[1] > DOWN_S:
                c.start_node(down[0], wait=False)
                down = None
                if len(killed) == 1:  # the second kill, while the loop goes on
                    c.kill(second)
                    killed.append(second)
                    down = (second, time.monotonic())
            ready, _, _ = select.select([app.stdout], [], [], 0.2)
            if not ready:
                continue
            line = app.stdout.readline()
            assert line, f"the application exited ({app.wait()}) without a result"
            event = json.loads(line)
            if "kill" in event:
                c.kill(plan[0])
                killed.append(plan[0])
                down = (plan[0], time.monotonic())
                app.stdin.write("killed\n")
                app.stdin.flush()
            elif "done" in event:
                if down is not None:
                    c.start_node(down[0], wait=False)
                return event["done"], killed
            else:
                raise AssertionError(f"application failed: {event.get('failed', event)}")
    finally:
        if app.poll() is None:
            app.kill()
        app.wait()


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
        counts, killed = run_with_two_kills(c, N, victim)
        assert killed == [victim, next(b for b in (1, 2, 3) if b != victim)], f"the loop ended first: {killed}"
        looped = time.monotonic()
        out = read_output(c, N)
        assert len(out) == N, f"{len(out)} output messages, {len(set(out))} distinct"
        assert set(out) == {b"out-%d" % i for i in range(N)}
        if store == "local":
            assert any(f.is_file() for f in (tmp_path / "objects").rglob("*"))  # the data went diskless
        print(f"fill {filled - started:.1f}s, loop {looped - filled:.1f}s (brokers {killed} killed; {counts}), "
              f"verify {time.monotonic() - looped:.1f}s")
