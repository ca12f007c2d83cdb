"""Formatting a quorum, as Kafka: a voter of a quorum of more than one never picks a cluster id
alone. Real controller and broker processes, started from their configs; the format goes through
the installed `kafka-storage.sh`.

- three voters without `cluster.id` on empty dirs refuse to start, each with one line naming what
  to set, and write nothing;
- formatted with `kafka-storage.sh format -t ID` (one voter with `--initial-controllers`, whose
  directory id it takes; `--standalone` refused for three voters), they elect a leader; a voter
  formatted with another id is refused (INCONSISTENT_CLUSTER_ID), and the refusal is logged with
  both ids, rate-limited, while the other two serve the cluster;
- a broker whose log dir was formatted for another cluster, or configured with another
  `cluster.id`, exits with one line; formatted with the quorum's id, it starts.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from controller.log_dirs import unformatted_quorum_message
from tests.conftest import installed_script, wait_for
from tools.cluster import Cluster, node_id


def storage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([installed_script("kafka-storage.sh"), *args], capture_output=True, text=True, timeout=60)


def _wait_exit(c: Cluster, node: int, timeout: float = 30.0) -> int:
    p = c.process(node)
    assert p is not None
    return p.wait(timeout)


def _last_line(path: Path) -> str:
    return path.read_text().rstrip("\n").splitlines()[-1]


def test_voters_without_cluster_id_refuse_to_start(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "c", brokers=1, controllers=3, controller_overrides={"cluster.id": None}, verbose=False)
    c.write_configs()
    try:
        for cid in c.controller_ids:
            c.start_node(cid, wait=False)
        for cid in c.controller_ids:
            assert _wait_exit(c, cid) == 2
            meta = c.node_dir(cid) / "metadata"
            assert _last_line(c.log_path(cid)) == "controller: cannot start: " + unformatted_quorum_message((meta,), 3)
            assert not (meta / "meta.properties").exists()
    finally:
        c.stop()


def test_formatted_quorum_refuses_a_foreign_voter_and_broker(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "c", brokers=1, controllers=3, controller_overrides={"cluster.id": None}, verbose=False)
    configs = {node_id(name): path for name, path in c.write_configs().items()}
    ours = storage("random-uuid").stdout.strip()
    theirs = storage("random-uuid").stdout.strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", ours) and ours != theirs
    a, b, foreign = c.controller_ids
    dir_ids = {cid: storage("random-uuid").stdout.strip() for cid in c.controller_ids}
    voters = ",".join(f"{cid}@{c.host}:{c.ports[cid]}:{dir_ids[cid]}" for cid in c.controller_ids)
    alone = storage("format", "-t", ours, "-c", str(configs[a]), "--standalone")
    assert alone.returncode == 1 and alone.stderr.startswith(
        f"Error: --standalone makes node {a} the only voter, but controller.quorum.voters names "), alone.stderr
    joining = storage("format", "-t", ours, "-c", str(configs[a]), "--no-initial-controllers")
    assert joining.returncode == 1 and joining.stderr.startswith(
        "Error: --no-initial-controllers is for a quorum without controller.quorum.voters"), joining.stderr
    out = storage("format", "-t", ours, "-c", str(configs[a]), "--initial-controllers", voters)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"Formatting metadata directory {c.node_dir(a) / 'metadata'} with cluster.id {ours}."
    assert f"directory.id={dir_ids[a]}\n" in (c.node_dir(a) / "metadata" / "meta.properties").read_text()
    assert storage("format", "-t", ours, "-c", str(configs[b])).returncode == 0
    assert storage("format", "-t", theirs, "-c", str(configs[foreign])).returncode == 0
    again = storage("format", "-t", ours, "-c", str(configs[b]))
    assert again.returncode == 1 and again.stderr.startswith("Error: Log directory ") and "--ignore-formatted" in again.stderr
    info = storage("info", "-c", str(configs[b]))
    assert info.returncode == 0 and f"Found metadata: {{cluster.id={ours}, node.id={b}, version=1}}" in info.stdout
    try:
        c.start(timeout=60)  # a majority (a, b) agrees: the cluster serves
        leader = c.active_controller()
        assert leader in (a, b)
        # the foreign voter's Fetch/Vote reach the leader and are refused, logged with both ids
        pattern = re.compile(
            r"raft_request_refused.* api='?(\w+)'? peer=(\d+) peer_cluster_id='?([\w-]+)'? cluster_id='?([\w-]+)'?")

        def refusals(node: int) -> list[tuple[str, ...]]:
            return [m.groups() for m in pattern.finditer(c.log_path(node).read_text())]

        seen = wait_for(lambda: [r for r in refusals(leader) if r[1] == str(foreign)], 20, "the refusal logged")
        assert all(r[2:] == (theirs, ours) for r in seen)
        time.sleep(3)  # the foreign voter keeps asking every few hundred ms: still one line per API
        counts: dict[tuple[str, str], int] = {}
        for api, peer, *_ in refusals(leader):
            counts[(api, peer)] = counts.get((api, peer), 0) + 1
        assert counts and all(n == 1 for n in counts.values()), counts
        # the foreign voter refuses the leader's BeginQuorumEpoch the same way, ids the other way round
        wait_for(lambda: any(r[2:] == (ours, theirs) for r in refusals(foreign)), 20, "the foreign voter's refusal")

        # a broker whose dir was formatted for another cluster exits with one line
        c.terminate(1)
        broker_cfg = configs[1]
        logs = [Path(p) for p in re.search(r"^log.dirs=(.*)$", broker_cfg.read_text(), re.M).group(1).split(",")]
        for d in logs:
            for f in sorted(d.rglob("*"), reverse=True):
                f.unlink() if f.is_file() else f.rmdir()
        assert storage("format", "-t", theirs, "-c", str(broker_cfg)).returncode == 0
        c.start_node(1, wait=False)
        assert _wait_exit(c, 1) == 1
        assert _last_line(c.log_path(1)) == (
            f"broker: cannot start: log dir {logs[0]} was formatted for cluster {theirs}, but the controller quorum's "
            f"cluster id is {ours} (run kafka-storage.sh format -t {ours} on an empty dir, or point log.dirs elsewhere)")
        # the same for a broker configured with another cluster.id (its dirs emptied again)
        for d in logs:
            (d / "meta.properties").unlink()
        broker_cfg.write_text(broker_cfg.read_text() + f"cluster.id={theirs}\n")
        c.start_node(1, wait=False)
        assert _wait_exit(c, 1) == 1
        assert _last_line(c.log_path(1)) == (
            f"broker: cannot start: cluster.id {theirs} differs from the controller quorum's cluster id {ours} "
            "(set cluster.id to the quorum's, or point controller.quorum.voters at its quorum)")
        # formatted with the quorum's id, the broker starts on those dirs (their directory ids kept)
        broker_cfg.write_text(broker_cfg.read_text().replace(f"cluster.id={theirs}\n", ""))
        assert storage("format", "-t", ours, "-c", str(broker_cfg)).returncode == 0
        ids = [(d / "meta.properties").read_text() for d in logs]
        c.start_node(1, timeout=60)
        assert [(d / "meta.properties").read_text() for d in logs] == ids
    finally:
        c.stop()

