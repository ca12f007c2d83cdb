"""A live broker's node.id cannot be taken over (Kafka's DUPLICATE_BROKER_REGISTRATION).

A second broker process started with the id of a live broker is refused by the controller, gives
up after two session timeouts with one clear line and exit status 1, and the live broker keeps
every leadership and ISR place it had.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import ROOT
from tools.cluster import free_ports, render_properties

SESSION_MS = 2000
CONTROLLER = {"broker.session.timeout.ms": SESSION_MS}
BROKERS = {"broker.session.timeout.ms": SESSION_MS, "broker.heartbeat.interval.ms": 500}


def placement(admin: AdminClient, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return {p.id: (p.leader, tuple(sorted(p.isrs))) for p in md.partitions.values()}


def impostor_config(c, tmp_path) -> object:
    """Broker 1's config with its own port and log dirs."""
    props = dict(line.split("=", 1) for line in c.config_path(1).read_text().splitlines()
                 if "=" in line and not line.startswith("#"))
    port = free_ports(1)[0]
    props["listeners"] = f"PLAINTEXT://127.0.0.1:{port}"
    props["advertised.listeners"] = f"PLAINTEXT://127.0.0.1:{port}"
    props["log.dirs"] = str(tmp_path / "impostor-logs")
    cfg = tmp_path / "impostor.properties"
    cfg.write_text(render_properties(props))
    return cfg


def broker_cmd(cfg) -> list[str]:
    return [sys.executable, "-P", "-m", "broker", "--config", str(cfg)]


def test_second_process_with_a_live_id_is_refused(cluster_factory, tmp_path):
    c = cluster_factory(brokers=2, broker_overrides=BROKERS, controller_overrides=CONTROLLER)
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic("kept", 4, 2)])["kept"].result(30)
    deadline = time.monotonic() + 30
    while {leader for leader, _ in placement(admin, "kept").values()} != {1, 2} and time.monotonic() < deadline:
        time.sleep(0.2)
    before = placement(admin, "kept")
    assert {leader for leader, _ in before.values()} == {1, 2}, before

    cfg = impostor_config(c, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    r = subprocess.run(broker_cmd(cfg), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("broker: node.id 1 is in use by another live broker"), last
    assert "Traceback" not in r.stderr
    assert "broker_registration_failed" in r.stderr and "error_code=101" in r.stderr
    assert took >= 2 * SESSION_MS / 1000  # it waited for the old session to run out first

    # the live broker was never evicted: same leaders, same ISRs, still serving
    assert placement(admin, "kept") == before
    assert c.is_running(1)
    assert "broker_registration_refused" in c.log_path("controller").read_text()
    assert "heartbeat_stale_epoch" not in c.log_path(1).read_text()


def test_a_broker_whose_id_was_taken_while_it_was_away_stops(cluster_factory, tmp_path):
    """Broker 1 stalls (SIGSTOP) past its session, so it is fenced and a new process takes its id;
    when it wakes, its heartbeat is told STALE_BROKER_EPOCH, registering again is refused, and it
    shuts down with one clear line instead of looping forever."""
    c = cluster_factory(brokers=2, broker_overrides=BROKERS, controller_overrides=CONTROLLER)
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    pgid = os.getpgid(c.pid(1))
    os.killpg(pgid, signal.SIGSTOP)
    impostor = None
    try:
        deadline = time.monotonic() + 30
        while 1 in {b.id for b in admin.list_topics(timeout=10).brokers.values()}:
            assert time.monotonic() < deadline, "broker 1 was never fenced"
            time.sleep(0.2)
        cfg = impostor_config(c, tmp_path)
        out = open(tmp_path / "impostor.log", "wb")
        impostor = subprocess.Popen(broker_cmd(cfg), cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while b"broker_started" not in (tmp_path / "impostor.log").read_bytes():
            assert impostor.poll() is None and time.monotonic() < deadline, (tmp_path / "impostor.log").read_text()
            time.sleep(0.2)
    finally:
        os.killpg(pgid, signal.SIGCONT)
    try:
        assert c.process(1).wait(timeout=30) == 1
        text = c.log_path(1).read_text()
        assert "heartbeat_stale_epoch" in text and "broker_id_taken" in text
        assert text.strip().splitlines()[-1].startswith("broker: node.id 1 is in use by another live broker")
        assert "Traceback" not in text
        assert impostor.poll() is None  # the new holder of the id is untouched
    finally:
        impostor.terminate()
        impostor.wait(30)
