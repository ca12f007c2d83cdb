"""tools/cluster.py: configs, start/stop, kill/restart, and that no process or port outlives it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import FAST_FENCING, ROOT, ClusterFactory
from tools.admin import Admin
from tools.cluster import CONTROLLER, Cluster, ClusterError, port_open


def metadata_brokers(host: str, port: int) -> set[int]:
    async def go() -> set[int]:
        async with Admin([(host, port)], timeout=10) as admin:
            md = await admin.metadata([])
            return {b.node_id for b in md.brokers}

    return asyncio.run(go())


def alive(pid: int) -> bool:
    """A zombie (killed, not yet reaped by whoever inherited it) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def assert_all_gone(pids: list[int], ports: list[int]) -> None:
    assert wait_until(lambda: not any(alive(p) for p in pids)), [p for p in pids if alive(p)]
    # the kernel closes a killed process's sockets as it exits; under load give it the same time
    assert wait_until(lambda: not [p for p in ports if port_open("127.0.0.1", p)]), [
        p for p in ports if port_open("127.0.0.1", p)
    ]
    for p in ports:  # and each port can be bound again (as a restarted node would)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))


# ---- configs (no processes)


def test_configs_are_pure_and_complete(tmp_path: Path) -> None:
    base = tmp_path / "never-created"
    c = Cluster(
        base,
        brokers=3,
        broker_overrides={"num.partitions": 3, "log.retention.ms": "1000"},
        per_broker_overrides={2: {"broker.rack": "b", "auto.create.topics.enable": None}},
    )
    cfg = c.generate_configs()
    assert not base.exists(), "generate_configs must not touch the disk"
    assert list(cfg) == ["controller", "broker-1", "broker-2", "broker-3"]

    ctl = cfg["controller"]
    assert ctl["process.roles"] == "controller" and ctl["node.id"] == "100"
    assert ctl["listeners"] == f"CONTROLLER://127.0.0.1:{c.controller_port}"
    assert ctl["controller.listener.names"] == "CONTROLLER"
    assert ctl["controller.quorum.voters"] == f"100@127.0.0.1:{c.controller_port}"
    assert ctl["log.dirs"] == str(base / "controller" / "metadata")
    assert ctl["num.partitions"] == "3", "the controller applies topic defaults to CreateTopics too"

    for i in (1, 2, 3):
        b = cfg[f"broker-{i}"]
        port = c.broker_port(i)
        assert b["process.roles"] == "broker" and b["node.id"] == str(i)
        assert b["listeners"] == f"PLAINTEXT://127.0.0.1:{port}"
        assert b["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{port}"
        assert b["controller.quorum.voters"] == ctl["controller.quorum.voters"]
        assert b["log.dirs"].split(",") == [str(base / f"broker-{i}" / "logs-0"), str(base / f"broker-{i}" / "logs-1")]
        assert b["num.partitions"] == "3" and b["default.replication.factor"] == "1"
        assert b["log.retention.ms"] == "1000"
    assert cfg["broker-1"]["auto.create.topics.enable"] == "true"
    assert "auto.create.topics.enable" not in cfg["broker-2"], "None removes a key"
    assert cfg["broker-2"]["broker.rack"] == "b" and "broker.rack" not in cfg["broker-1"]

    ports = [c.controller_port] + [c.broker_port(i) for i in (1, 2, 3)]
    assert len(set(ports)) == 4
    assert c.bootstrap == ",".join(f"127.0.0.1:{c.broker_port(i)}" for i in (1, 2, 3))
    assert c.log_path(2) == base / "broker-2.log" and c.log_path(CONTROLLER) == base / "controller.log"


def test_fixed_ports(tmp_path: Path) -> None:
    c = Cluster(tmp_path, brokers=3, port_base=19092)
    assert c.controller_port == 19091
    assert [c.broker_port(i) for i in (1, 2, 3)] == [19092, 19093, 19094]
    assert c.bootstrap == "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
    with pytest.raises(ValueError):
        Cluster(tmp_path, brokers=2, ports={1: 5000, 2: 5000})


def test_busy_port_fails_fast(cluster_factory: ClusterFactory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(ClusterError, match=f"broker-2 port {port}"):
            cluster_factory(ports={2: port})
        assert time.monotonic() - t < 5


# ---- real processes


def test_start_and_stop(cluster_factory: ClusterFactory) -> None:
    c = cluster_factory()
    for i in c.broker_ids:
        assert metadata_brokers("127.0.0.1", c.broker_port(i)) == {1, 2, 3}
        assert (c.node_dir(i) / "server.properties").is_file()
        assert c.log_path(i).stat().st_size > 0
    assert port_open("127.0.0.1", c.controller_port)
    pids = [c.pid(n) for n in c.node_names]
    assert all(pids) and all(alive(p) for p in pids)

    c.stop()
    assert not any(c.is_running(n) for n in c.node_names)
    assert_all_gone(pids, list(c.ports.values()))
    c.stop()  # idempotent


def test_kill_and_restart_broker(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(broker_overrides=FAST_FENCING, controller_overrides=FAST_FENCING)
    old = cluster.pid(2)
    assert cluster.kill(2) == -signal.SIGKILL
    assert not cluster.is_running(2) and not alive(old)
    assert not port_open("127.0.0.1", cluster.broker_port(2))
    # the others keep serving
    assert {1, 3} <= metadata_brokers("127.0.0.1", cluster.broker_port(1))

    cluster.restart(2)
    assert cluster.is_running(2) and cluster.pid(2) != old
    assert metadata_brokers("127.0.0.1", cluster.broker_port(2)) == {1, 2, 3}
    assert "starting broker-2" in cluster.log_path(2).read_text().split("====")[-1]

    # SIGTERM is a clean shutdown, well inside the grace period (no SIGKILL needed)
    assert cluster.terminate(3, timeout=30) != -signal.SIGKILL
    assert not port_open("127.0.0.1", cluster.broker_port(3))
    cluster.start_node(3)
    assert metadata_brokers("127.0.0.1", cluster.broker_port(3)) == {1, 2, 3}


def test_context_manager(tmp_path: Path) -> None:
    with Cluster(tmp_path / "c", brokers=1) as c:
        assert metadata_brokers("127.0.0.1", c.broker_port(1)) == {1}
        pids = [c.pid(n) for n in c.node_names]
    assert_all_gone(pids, list(c.ports.values()))


def test_failed_start_reports_the_log_and_cleans_up(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "c", per_broker_overrides={2: {"node.id": "two"}})
    try:
        with pytest.raises(ClusterError) as e:
            c.start(timeout=30)
        msg = str(e.value)
        assert msg.startswith("broker-2 ")
        last = [line for line in c.log_path(2).read_text().splitlines() if line.strip()][-1]
        assert last in msg, "the error shows the tail of the node's log"
        assert not any(c.is_running(n) for n in c.node_names), "start() stops what it started"
    finally:
        c.stop()


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_nodes_die_with_the_launching_process(tmp_path: Path, how: str) -> None:
    """No stop() call at all: interpreter exit (atexit/finalize) or SIGKILL (PR_SET_PDEATHSIG)."""
    if how == "sigkill" and sys.platform != "linux":
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tools.cluster import Cluster
        c = Cluster({str(tmp_path / "c")!r}, brokers=2)
        c.start()
        print(" ".join(str(c.pid(n)) for n in c.node_names))
        print(" ".join(str(p) for p in c.ports.values()), flush=True)
        if {how!r} == "sigkill":
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        ports = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 3, f"launcher script failed; see {tmp_path / 'c'}"
        if how == "sigkill":
            proc.kill()
        assert proc.wait(60) in (0, -signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_all_gone(pids, ports)
