"""Launch a Strata cluster (1 or more controllers + N brokers) as local processes.

One launcher for `make run` (tools/devcluster.py), the test fixtures (tests/conftest.py) and the
docker configs (`docker_configs`, checked against docker-compose.yml by a test), so the three
cannot drift apart.

Layout under base_dir::

    controller.log, broker-1.log, ...          stdout+stderr of each node (appended across restarts)
    controller/server.properties               generated config
    controller/metadata/                       controller log.dirs
    broker-1/server.properties
    broker-1/logs-0/, broker-1/logs-1/         the broker's two log.dirs (JBOD)

Node ids: the controllers are 100, 101, ... (a quorum of `controllers` voters), brokers are
1..N. Nodes are addressed by id or by name ("controller" for 100, "controller-101", "broker-2"). Every process is killed when the Cluster is stopped, garbage
collected, or the interpreter exits; on Linux a node also dies with the thread that started it
(PR_SET_PDEATHSIG), so even a SIGKILLed test run leaves no broker holding a port.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from tools.bytecode import cache_outside_the_tree

CONTROLLER_ID = 100
CONTROLLER = "controller"
MAX_CONTROLLERS = 99  # controller ids are 100..198
# `make run` defaults: brokers on 9092, 9093, ... (Kafka's client port first, so the usual
# bootstrap localhost:9092 works), the controllers just below them on 9091, 9090, ...
DEFAULT_PORT_BASE = 9092
# Docker: host names are the compose service names, every config lives at one path.
DOCKER_CONFIG_PATH = "/etc/strata/server.properties"
DOCKER_DATA_DIR = PurePosixPath("/var/lib/strata")
DOCKER_CLUSTER_ID = "c3RyYXRhLWRvY2tlci1xdQ"  # the compose cluster's voters format with one id
DOCKER_INTERNAL_PORT = 29092  # every broker's listener on the compose network (one IP per container)

Overrides = Mapping[str, Any]
REPO_ROOT = Path(__file__).resolve().parent.parent
# Keys both process kinds read: in KRaft the controller applies the topic defaults to
# CreateTopics with -1 counts, the brokers to auto-created topics.
SHARED_TOPIC_DEFAULTS = ("num.partitions", "default.replication.factor")
PROGRESS_EVERY = 10.0  # seconds between "still waiting" lines


class ClusterError(RuntimeError):
    """A node failed to start or to become ready; the message holds the tail of its log."""


def is_controller_id(nid: int) -> bool:
    return CONTROLLER_ID <= nid < CONTROLLER_ID + MAX_CONTROLLERS


def controller_ids(controllers: int) -> list[int]:
    return [CONTROLLER_ID + k for k in range(controllers)]


def node_name(node: int | str) -> str:
    if isinstance(node, str):
        return node
    if node == CONTROLLER_ID:
        return CONTROLLER
    return f"controller-{node}" if is_controller_id(node) else f"broker-{node}"


def node_id(node: int | str) -> int:
    if isinstance(node, int):
        return node
    if node == CONTROLLER:
        return CONTROLLER_ID
    if node.startswith("controller-") and node[11:].isdigit() and is_controller_id(int(node[11:])):
        return int(node[11:])
    if node.startswith("broker-") and node[7:].isdigit():
        return int(node[7:])
    raise ValueError(f"unknown node {node!r}")


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _apply(props: dict[str, str], overrides: Overrides | None) -> None:
    """Overrides win; a value of None removes the key."""
    for k, v in (overrides or {}).items():
        if v is None:
            props.pop(k, None)
        else:
            props[k] = _fmt(v)


def node_configs(
    *,
    brokers: int,
    controller_ports: Mapping[int, int],
    broker_ports: Mapping[int, int],
    host_of: Callable[[str], str],
    bind_host_of: Callable[[str], str],
    dir_of: Callable[[str], PurePath],
    broker_overrides: Overrides | None = None,
    controller_overrides: Overrides | None = None,
    per_broker_overrides: Mapping[int, Overrides] | None = None,
    lname: str = "PLAINTEXT",
    per_controller_overrides: Mapping[int, Overrides] | None = None,
    cluster_id: str | None = None,
) -> dict[str, dict[str, str]]:
    """server.properties of every node, by node name. Pure: no I/O. `lname` names the brokers'
    listener (security_overrides names it after its protocol).

    host_of(name) is the host a node advertises (and others dial), bind_host_of(name) the host it
    listens on, dir_of(name) the directory its data lives under. `controller_ports` ({controller
    id: port}) holds one entry per voter of the quorum; voters must format their log dirs with
    one cluster id (`cluster_id`, as kafka-storage.sh format --cluster-id on each).
    """
    voters = ",".join(f"{cid}@{host_of(node_name(cid))}:{port}" for cid, port in sorted(controller_ports.items()))
    topic_defaults = {"num.partitions": "1", "default.replication.factor": "1"}
    _apply(topic_defaults, {k: v for k, v in (broker_overrides or {}).items() if k in SHARED_TOPIC_DEFAULTS})

    configs = {}
    for cid, port in sorted(controller_ports.items()):
        name = node_name(cid)
        controller = {
            "process.roles": "controller",
            "node.id": str(cid),
            "listeners": f"CONTROLLER://{bind_host_of(name)}:{port}",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.voters": voters,
            "log.dirs": str(dir_of(name) / "metadata"),
            **topic_defaults,
        }
        if cluster_id is not None:
            controller["cluster.id"] = cluster_id
        _apply(controller, controller_overrides)
        _apply(controller, (per_controller_overrides or {}).get(cid))
        configs[name] = controller

    for i in range(1, brokers + 1):
        name = node_name(i)
        port = broker_ports[i]
        d = dir_of(name)
        props = {
            "process.roles": "broker",
            "node.id": str(i),
            "listeners": f"{lname}://{bind_host_of(name)}:{port}",
            "advertised.listeners": f"{lname}://{host_of(name)}:{port}",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.voters": voters,
            "log.dirs": f"{d / 'logs-0'},{d / 'logs-1'}",
            "num.partitions": "1",
            "default.replication.factor": "1",
            "auto.create.topics.enable": "true",
        }
        _apply(props, broker_overrides)
        _apply(props, (per_broker_overrides or {}).get(i))
        configs[name] = props
    return configs


# users of a secure cluster (Cluster(secure=...)): SCRAM credentials bootstrapped by the
# controller and PLAIN users of the brokers' listener; the nodes authenticate as "broker"
SECURE_USERS = {"admin": "admin-secret", "broker": "broker-secret", "alice": "alice-secret", "bob": "bob-secret"}


AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def security_overrides(protocol: str, certs: Any, acls: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """(broker overrides, controller overrides) putting every listener on `protocol` (SSL,
    SASL_PLAINTEXT or SASL_SSL): the brokers' listener is named after it, the controller's stays
    CONTROLLER; the nodes authenticate to each other as user "broker" with SCRAM-SHA-512. With
    `acls`, the authorizer is on and "broker" and "admin" are the super users."""
    common = {"listener.security.protocol.map": f"CONTROLLER:{protocol},{protocol}:{protocol}"}
    if acls:
        common.update({"authorizer.class.name": AUTHORIZER, "super.users": "User:broker;User:admin"})
    if "SSL" in protocol:
        common.update({"ssl.certificate.location": str(certs.server_cert), "ssl.key.location": str(certs.server_key),
                       "ssl.ca.location": str(certs.ca)})
    broker, controller = dict(common), dict(common)
    if protocol.startswith("SASL_"):
        login = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" '
                 f'password="{SECURE_USERS["broker"]}";')
        for props in (broker, controller):
            props.update({"sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                          "sasl.mechanism.controller.protocol": "SCRAM-SHA-512", "sasl.jaas.config": login})
        broker["sasl.enabled.mechanisms"] = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
        broker[f"listener.name.{protocol.lower()}.plain.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            + " ".join(f'user_{u}="{p}"' for u, p in SECURE_USERS.items()) + ";")
        controller["sasl.enabled.mechanisms"] = "SCRAM-SHA-256,SCRAM-SHA-512"
        controller["bootstrap.scram.credentials"] = ";".join(
            f"{m}=[name={u},password={p}]" for u, p in SECURE_USERS.items() for m in ("SCRAM-SHA-256", "SCRAM-SHA-512"))
    controller["inter.broker.listener.name"] = protocol
    return broker, controller


def fixed_ports(brokers: int, port_base: int = DEFAULT_PORT_BASE) -> tuple[int, dict[int, int]]:
    """(controller port, {broker id: port}): brokers on port_base.., the controller on port_base - 1."""
    return port_base - 1, {i: port_base + i - 1 for i in range(1, brokers + 1)}


def fixed_controller_ports(controllers: int, port_base: int = DEFAULT_PORT_BASE) -> dict[int, int]:
    """{controller id: port}: the first controller on port_base - 1, the next ones below it."""
    return {cid: port_base - 1 - k for k, cid in enumerate(controller_ids(controllers))}


DOCKER_METRICS_PORT = 9404  # the JMX exporter's customary port


def prometheus_config(node_names: list[str]) -> str:
    """prometheus.yml of the compose `metrics` profile: scrape every node's /metrics."""
    targets = ", ".join(f'"{n}:{DOCKER_METRICS_PORT}"' for n in node_names)
    return ("global:\n  scrape_interval: 10s\n"
            "scrape_configs:\n  - job_name: strata\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{targets}]\n")


def docker_configs(
    brokers: int = 3,
    *,
    controllers: int = 3,
    port_base: int = DEFAULT_PORT_BASE,
    broker_overrides: Overrides | None = None,
    controller_overrides: Overrides | None = None,
    per_broker_overrides: Mapping[int, Overrides] | None = None,
) -> dict[str, dict[str, str]]:
    """The configs docker-compose.yml mounts: service name = node name = host name. A broker has
    two listeners (as Kafka's own images): PLAINTEXT on the compose network, advertised under its
    service name on DOCKER_INTERNAL_PORT (peers and other containers dial it), and EXTERNAL on a
    port distinct across the cluster, published 1:1 on the host's 127.0.0.1 and advertised as
    127.0.0.1, so a host client reaches every broker through the published ports alone."""
    _, broker_ports = fixed_ports(brokers, port_base)
    # every node serves /metrics on the same port of its own container (the `metrics` profile's
    # Prometheus scrapes them by service name)
    metrics = {"metrics.listener": f"http://0.0.0.0:{DOCKER_METRICS_PORT}"}
    two_listeners = {"listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
                     "inter.broker.listener.name": "PLAINTEXT"}
    per_broker = {
        i: {"listeners": f"PLAINTEXT://0.0.0.0:{DOCKER_INTERNAL_PORT},EXTERNAL://0.0.0.0:{port}",
            "advertised.listeners": f"PLAINTEXT://{node_name(i)}:{DOCKER_INTERNAL_PORT},EXTERNAL://127.0.0.1:{port}",
            **(per_broker_overrides or {}).get(i, {})}
        for i, port in broker_ports.items()
    }
    return node_configs(
        brokers=brokers,
        controller_ports=fixed_controller_ports(controllers, port_base),
        cluster_id=DOCKER_CLUSTER_ID if controllers > 1 else None,
        broker_ports=broker_ports,
        host_of=lambda name: name,
        bind_host_of=lambda name: "0.0.0.0",
        dir_of=lambda name: DOCKER_DATA_DIR,
        broker_overrides={**metrics, **two_listeners, **(broker_overrides or {})},
        controller_overrides={**metrics, **(controller_overrides or {})},
        per_broker_overrides=per_broker,
    )


def render_properties(props: Mapping[str, str], header: str = "") -> str:
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{k}={v}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def free_ports(n: int, host: str = "127.0.0.1", candidates: Iterable[int] | None = None) -> list[int]:
    """n distinct ports the OS considers free right now (all held open until all are chosen):
    the kernel's picks, or the first of `candidates` that bind (fewer than n if they run out)."""
    socks: list[socket.socket] = []
    try:
        for port in [0] * n if candidates is None else candidates:
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                if candidates is None:
                    raise
                continue
            socks.append(s)
            if len(socks) == n:
                break
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_in_use(host: str, port: int) -> bool:
    # SO_REUSEADDR as asyncio servers set it, so a socket in TIME_WAIT does not count as in use.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def _run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine from sync code, also when the caller is itself inside an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


async def _quorum_leader(host: str, port: int, security: Any) -> int | None:
    from metadata.voters import describe_quorum_request
    from node.client import NodeClient

    client = await NodeClient(host, port, client_id="strata-cluster", timeout=2, security=security).connect()
    try:
        resp = await client.request(describe_quorum_request(), timeout=2)
        p = resp.topics[0].partitions[0]
        return p.leader_id if not p.error_code else None
    finally:
        await client.close()


async def _metadata_brokers(host: str, port: int, timeout: float, client_props: Mapping[str, str]) -> set[int]:
    from node.security import properties_client_security  # lazy: generating configs needs no protocol package
    from tools.admin import Admin

    security = properties_client_security(client_props, "cluster") if client_props else None
    async with Admin([(host, port)], timeout=timeout, security=security) as admin:
        md = await admin.metadata([])
        return {b.node_id for b in md.brokers}


# Linux: the node gets SIGKILL when the thread that started it dies, however it dies.
_PDEATHSIG_PRELUDE = (
    "import ctypes,os,signal,sys;"
    "ctypes.CDLL(None,use_errno=True).prctl(1,int(signal.SIGKILL));"  # 1 = PR_SET_PDEATHSIG
    "os.getppid()!=int(sys.argv[1]) and os._exit(1);"  # the parent died before prctl took effect
    "os.execv(sys.executable,[sys.executable]+sys.argv[2:])"
)


def _nofile_setter(n: int) -> Callable[[], None]:
    def set_limit() -> None:  # runs in the child between fork and exec: `ulimit -n n`
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return set_limit


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    # Each node leads its own process group (start_new_session), so anything it spawned goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _reap(procs: dict[str, subprocess.Popen], grace: float = 5.0, say: Callable[[str], None] | None = None) -> None:
    """SIGTERM everything still running, SIGKILL what is left after `grace` seconds."""
    live = {n: p for n, p in procs.items() if p.poll() is None}
    for p in live.values():
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    note = time.monotonic() + 5.0
    for name, p in live.items():
        while p.poll() is None and time.monotonic() < deadline:
            if say is not None and time.monotonic() >= note:
                say(f"waiting for {name} to shut down (SIGKILL in {deadline - time.monotonic():.0f}s)")
                note = time.monotonic() + PROGRESS_EVERY
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(min(0.5, max(0.0, deadline - time.monotonic())))
        if p.poll() is None:
            if say is not None:
                say(f"{name} did not stop within {grace:.0f}s of SIGTERM; killing it")
            _signal_group(p, signal.SIGKILL)
            p.wait()


class Cluster:
    """`controllers` controllers (a Raft quorum; ids 100, 101, ...) + N brokers as subprocesses;
    a context manager.

    Ports: explicit `ports` ({node id: port}) win, else `port_base` (brokers on port_base..,
    controllers on port_base - 1, - 2, ...), else random free ports, chosen once so restarts keep
    them. Overrides: `broker_overrides` apply to every broker, `per_broker_overrides[id]` to one
    (after the former), `controller_overrides` to every controller, `per_controller_overrides[id]`
    to one; a value of None removes a key.
    `nofile` ({node id: n}) starts that node under `ulimit -n n` (soft and hard RLIMIT_NOFILE);
    change it between restarts to restart a node under another limit. `code_root` runs the nodes
    from another source tree (default: this one).
    """

    def __init__(
        self,
        base_dir: Path | str,
        brokers: int = 3,
        host: str = "127.0.0.1",
        broker_overrides: Overrides | None = None,
        controller_overrides: Overrides | None = None,
        per_broker_overrides: Mapping[int, Overrides] | None = None,
        *,
        port_base: int | None = None,
        ports: Mapping[int, int] | None = None,
        modules: Mapping[str, str] | None = None,
        verbose: bool = True,
        nofile: Mapping[int, int] | None = None,
        secure: str | None = None,
        acls: bool = False,
        code_root: Path | None = None,
        controllers: int = 1,
        per_controller_overrides: Mapping[int, Overrides] | None = None,
        dynamic_voters: int | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        if not 1 <= controllers <= MAX_CONTROLLERS:
            raise ValueError(f"a cluster needs 1 to {MAX_CONTROLLERS} controllers")
        self.controllers = controllers
        # a dynamic quorum (KIP-853): the first `dynamic_voters` controllers are formatted as its
        # voters (--initial-controllers, or --standalone for one), the others as observers (--no-initial-controllers) that
        # start() leaves stopped; no node names controller.quorum.voters, all bootstrap from the voters
        if dynamic_voters is not None and not 1 <= dynamic_voters <= controllers:
            raise ValueError(f"dynamic_voters must be 1 to {controllers}")
        self.dynamic_voters = dynamic_voters
        # the voters of one quorum format with one cluster id (chosen once: restarts keep it); as
        # Kafka's, never starting with "-", which a tool's argument parser would read as a flag
        from controller.log_dirs import random_id  # lazy: the launcher imports no node package at load

        self.cluster_id = random_id()
        self.per_controller_overrides = {int(k): dict(v) for k, v in (per_controller_overrides or {}).items()}
        self.base_dir = Path(base_dir).absolute()
        self.brokers = brokers
        self.host = host
        self.secure = secure
        self.certs = None
        secure_brokers: dict[str, str] = {}
        secure_controller: dict[str, str] = {}
        if secure is not None:
            from tools.certs import ensure_certs  # lazy: `cryptography` is needed by secure clusters only

            self.certs = ensure_certs(self.base_dir / "certs", ("localhost", host))
            secure_brokers, secure_controller = security_overrides(secure, self.certs, acls)
        self.broker_overrides = {**secure_brokers, **(broker_overrides or {})}
        self.controller_overrides = {**secure_controller, **(controller_overrides or {})}
        self.per_broker_overrides = {int(k): dict(v) for k, v in (per_broker_overrides or {}).items()}
        self.verbose = verbose
        self.nofile: dict[int, int] = dict(nofile or {})
        # node id -> group id its process runs under (a fault harness matches its packets by owner)
        self.groups: dict[int, int] = {}
        # node id -> environment variables of its process beyond ours (a preloaded fault library)
        self.node_env: dict[int, dict[str, str]] = {}
        self.code_root = Path(code_root) if code_root is not None else REPO_ROOT  # another tree's nodes (a bench's A/B)
        # role -> module run with `python -m`; another module (a profiling wrapper, a stub) can stand in
        self.modules = {"controller": "controller", "broker": "broker", **(modules or {})}
        ids = [*controller_ids(controllers), *range(1, brokers + 1)]
        if port_base is not None:
            _, bports = fixed_ports(brokers, port_base)
            chosen = {**fixed_controller_ports(controllers, port_base), **bports}
        else:
            chosen = dict(zip(ids, free_ports(len(ids), host), strict=True))
        chosen.update(ports or {})
        if len(set(chosen.values())) != len(ids):
            raise ValueError(f"two nodes share a port: {chosen}")
        self.ports: dict[int, int] = {i: chosen[i] for i in ids}
        self._random_ports = port_base is None and not ports
        self._procs: dict[str, subprocess.Popen] = {}
        # Holds only the dict, not self: the cluster can still be collected, and its processes
        # go with it; finalize also runs at interpreter exit.
        self._finalizer = weakref.finalize(self, _reap, self._procs)

    # ---- addresses
    @property
    def node_names(self) -> list[str]:
        return [node_name(i) for i in self.controller_ids] + [node_name(i) for i in self.broker_ids]

    @property
    def controller_ids(self) -> list[int]:
        return controller_ids(self.controllers)

    @property
    def broker_ids(self) -> list[int]:
        return list(range(1, self.brokers + 1))

    @property
    def controller_port(self) -> int:
        """The first controller's port (the only one's, in a cluster of one controller)."""
        return self.ports[CONTROLLER_ID]

    def active_controller(self, timeout: float = 10.0) -> int | None:
        """The quorum leader's id as a running controller reports it (DescribeQuorum), or None
        if none answers with a leader within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            for cid in self.controller_ids:
                if not self.is_running(cid):
                    continue
                try:
                    leader = _run_sync(_quorum_leader(self.host, self.ports[cid], self.client_security()))
                except Exception:  # any failure: ask the next one
                    continue
                if leader is not None and leader >= 0 and self.is_running(leader):
                    return leader
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def broker_port(self, broker_id: int) -> int:
        return self.ports[broker_id]

    def client_props(self, user: str = "admin", mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """Kafka client properties for this cluster's listeners (empty for PLAINTEXT)."""
        if self.secure is None:
            return {}
        props = {"security.protocol": self.secure}
        if self.certs is not None and "SSL" in self.secure:
            props["ssl.ca.location"] = str(self.certs.ca)
        if self.secure.startswith("SASL_"):
            props.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": SECURE_USERS[user]})
        return props

    def rdkafka_conf(self, user: str = "admin") -> dict[str, str]:
        """librdkafka (confluent-kafka) settings to reach this cluster."""
        return {"bootstrap.servers": self.bootstrap, **self.client_props(user)}

    def client_kwargs(self, library: str, user: str = "admin") -> dict[str, Any]:
        """kafka-python's or aiokafka's client arguments to reach this cluster."""
        out: dict[str, Any] = {"bootstrap_servers": self.bootstrap}
        props = self.client_props(user)
        if not props:
            return out
        out["security_protocol"] = props["security.protocol"]
        if "ssl.ca.location" in props:
            if library == "aiokafka":
                from aiokafka.helpers import create_ssl_context

                out["ssl_context"] = create_ssl_context(cafile=props["ssl.ca.location"])
            else:
                out["ssl_cafile"] = props["ssl.ca.location"]
        if "sasl.mechanism" in props:
            out.update(sasl_mechanism=props["sasl.mechanism"], sasl_plain_username=props["sasl.username"],
                       sasl_plain_password=props["sasl.password"])
        return out

    def client_security(self, user: str = "admin") -> Any:
        """node.client.NodeClient's security for this cluster (None: PLAINTEXT)."""
        from node.security import properties_client_security

        return properties_client_security(self.client_props(user), "cluster") if self.secure else None

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{self.broker_port(i)}" for i in self.broker_ids)

    def node_dir(self, node: int | str) -> Path:
        return self.base_dir / node_name(node)

    def config_path(self, node: int | str) -> Path:
        return self.node_dir(node) / "server.properties"

    def log_path(self, node: int | str) -> Path:
        return self.base_dir / f"{node_name(node)}.log"

    def metrics_url(self, node: int | str) -> str:
        """Where the running node serves /metrics (``metrics.listener`` set, its port perhaps 0):
        the port it logged last (metrics_listening) since its last start."""
        found = re.findall(r"metrics_listening\b.*?\bport=(\d+)", self.log_path(node).read_text(errors="replace"))
        if not found:
            raise ClusterError(f"{node_name(node)} logged no metrics_listening (is metrics.listener set?)")
        return f"http://{self.host}:{found[-1]}/metrics"

    # ---- configs
    @property
    def initial_controller_ids(self) -> list[int]:
        """The controllers start() starts: all, or a dynamic quorum's first voters."""
        return self.controller_ids[:self.dynamic_voters] if self.dynamic_voters else self.controller_ids

    def _dynamic_overrides(self) -> dict[str, str | None]:
        if not self.dynamic_voters:
            return {}
        servers = ",".join(f"{self.host}:{self.ports[c]}" for c in self.initial_controller_ids)
        return {"controller.quorum.voters": None, "controller.quorum.bootstrap.servers": servers}

    def generate_configs(self) -> dict[str, dict[str, str]]:
        """server.properties of every node, by node name. Pure: no I/O."""
        dynamic = self._dynamic_overrides()
        return node_configs(
            brokers=self.brokers,
            controller_ports={i: self.ports[i] for i in self.controller_ids},
            broker_ports={i: self.ports[i] for i in self.broker_ids},
            host_of=lambda name: self.host,
            bind_host_of=lambda name: self.host,
            dir_of=lambda name: self.base_dir / name,
            # the brokers of one cluster share the diskless object store, as they would a bucket
            broker_overrides={"diskless.storage.url": f"file://{self.base_dir / 'diskless-objects'}",
                              **dynamic, **self.broker_overrides},
            controller_overrides={**dynamic, **self.controller_overrides},
            per_broker_overrides=self.per_broker_overrides,
            lname=self.secure or "PLAINTEXT",
            per_controller_overrides=self.per_controller_overrides,
            cluster_id=self.cluster_id if self.controllers > 1 else None,
        )

    def _stored_cluster_id(self) -> str | None:
        """The cluster id a controller's metadata dir was formatted with (a kept `make run` dir)."""
        for cid in self.controller_ids:
            meta = self.node_dir(cid) / "metadata" / "meta.properties"
            with contextlib.suppress(OSError):
                for line in meta.read_text().splitlines():
                    if line.startswith("cluster.id="):
                        return line.split("=", 1)[1].strip()
        return None

    def write_configs(self) -> dict[str, Path]:
        self.cluster_id = self._stored_cluster_id() or self.cluster_id
        out = {}
        for name, props in self.generate_configs().items():
            path = self.config_path(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render_properties(props, "Generated by tools/cluster.py; rewritten on every start."))
            out[name] = path
        return out

    # ---- processes
    def process(self, node: int | str) -> subprocess.Popen | None:
        return self._procs.get(node_name(node))

    def is_running(self, node: int | str) -> bool:
        p = self.process(node)
        return p is not None and p.poll() is None

    def pid(self, node: int | str) -> int | None:
        p = self.process(node)
        return p.pid if p is not None else None

    def start(self, timeout: float = 60.0) -> Cluster:
        """Write configs, start the controller, then the brokers; wait until every broker's
        Metadata lists all brokers. On failure everything started is stopped and ClusterError
        says which node, with the tail of its log."""
        running = [n for n in self.node_names if self.is_running(n)]
        if running:
            raise ClusterError(f"already running: {', '.join(running)}")
        try:
            busy = [f"{node_name(i)} port {p}" for i, p in self.ports.items() if port_in_use(self.host, p)]
            if busy and self._random_ports:
                # Someone took a port between our choosing it and now: choose again.
                self.ports = dict(zip(self.ports, free_ports(len(self.ports), self.host), strict=True))
                busy = []
            self.write_configs()
            if busy:
                raise ClusterError(f"ports already in use on {self.host}: {', '.join(busy)} (another cluster running?)")
            self._format_dynamic()
            deadline = time.monotonic() + timeout
            # All at once: a broker started before the controllers waits for them, so the brokers'
            # interpreter start overlaps the controllers' (about a second off every cluster start).
            for nid in (*self.initial_controller_ids, *self.broker_ids):
                self._spawn(nid)
            self._wait_ready(self.initial_controller_ids, deadline, timeout)
            self._wait_ready(self.broker_ids, deadline, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _format_dynamic(self) -> None:
        """kafka-storage.sh format of a dynamic quorum's controllers not formatted yet."""
        if not self.dynamic_voters:
            return
        from controller.log_dirs import random_id  # lazy: the launcher imports no node package at load
        first = self.initial_controller_ids
        dir_ids = {c: random_id() for c in first}
        initial = ",".join(f"{c}@{self.host}:{self.ports[c]}:{dir_ids[c]}" for c in first)
        for cid in self.controller_ids:
            if (self.node_dir(cid) / "metadata" / "meta.properties").exists():
                continue
            how = (["--no-initial-controllers"] if cid not in first else ["--standalone"] if len(first) == 1
                   else ["--initial-controllers", initial])
            done = subprocess.run([sys.executable, "-P", "-m", "tools.kafka_storage", "format", "-t", self.cluster_id,
                                   "-c", str(self.config_path(cid)), *how], capture_output=True, text=True,
                                  cwd=self.code_root, timeout=60)
            if done.returncode != 0:
                raise ClusterError(f"formatting {node_name(cid)} failed: {done.stderr.strip()}")

    def start_node(self, node: int | str, *, wait: bool = True, timeout: float = 60.0) -> None:
        """Start one node (again) with the config written by start(); wait for it to be ready."""
        name = node_name(node)
        if self.is_running(name):
            raise ClusterError(f"{name} is already running")
        self._spawn(node_id(name))
        if wait:
            self._wait_ready([node_id(name)], time.monotonic() + timeout, timeout)

    def restart(self, node: int | str, *, hard: bool = False, timeout: float = 60.0) -> None:
        """Stop a node (SIGTERM, or SIGKILL if hard) and start it again, waiting until ready."""
        if hard:
            self.kill(node)
        else:
            self.terminate(node)
        self.start_node(node, timeout=timeout)

    def kill(self, node: int | str) -> int | None:
        """SIGKILL a node; returns its exit status (None if it was not running)."""
        p = self.process(node)
        if p is None:
            return None
        _signal_group(p, signal.SIGKILL)
        return p.wait()

    def terminate(self, node: int | str, timeout: float = 30.0) -> int | None:
        """SIGTERM a node and wait for it to exit; SIGKILL after `timeout` seconds."""
        p = self.process(node)
        if p is None:
            return None
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                self._say(f"{node_name(node)} ignored SIGTERM for {timeout:.0f}s; killing it")
                _signal_group(p, signal.SIGKILL)
                p.wait()
        return p.returncode

    def stop(self, timeout: float = 30.0) -> None:
        """Stop brokers first (SIGTERM, SIGKILL after `timeout`), then the controller, so brokers
        can still reach it while shutting down. Idempotent."""
        brokers = {n: p for n, p in self._procs.items() if not is_controller_id(node_id(n))}
        _reap(brokers, timeout, self._say)
        _reap({n: p for n, p in self._procs.items() if is_controller_id(node_id(n))}, timeout, self._say)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- internals
    def _say(self, msg: str) -> None:
        if self.verbose:
            print(f"strata-cluster: {msg}", file=sys.stderr, flush=True)

    def _spawn(self, nid: int) -> subprocess.Popen:
        name = node_name(nid)
        module = self.modules["controller" if is_controller_id(nid) else "broker"]
        # -P: the cwd (base_dir, holding a "controller" directory) must not shadow our packages.
        args = ["-P", "-m", module, "--config", str(self.config_path(name))]
        if sys.platform == "linux" and threading.current_thread() is threading.main_thread():
            args = ["-P", "-c", _PDEATHSIG_PRELUDE, str(os.getpid()), *args]
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"  # the log file shows what happened up to a crash
        cache_outside_the_tree(env)  # no compile of every module at each start (tools/bytecode.py)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.code_root), env.get("PYTHONPATH")]))
        env.update(self.node_env.get(nid, {}))
        log = self.log_path(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}: python -m {module}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                [sys.executable, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,  # anything a node writes relative to cwd stays out of the repo
                env=env,
                start_new_session=True,  # Ctrl-C reaches the launcher only: it stops nodes in order
                preexec_fn=_nofile_setter(self.nofile[nid]) if nid in self.nofile else None,
                group=self.groups.get(nid),
            )
        self._procs[name] = proc
        return proc

    def _check(self, nid: int, expected: set[int]) -> str | None:
        """None when the node is ready, else why not."""
        if is_controller_id(nid):
            return None if port_open(self.host, self.ports[nid]) else "not listening yet"
        try:
            seen = _run_sync(_metadata_brokers(self.host, self.broker_port(nid), 5.0, self.client_props()))
        except Exception as e:  # any failure just means "not ready yet"; the deadline bounds it
            return str(e) or type(e).__name__
        missing = expected - seen
        return f"Metadata lists brokers {sorted(seen)}, missing {sorted(missing)}" if missing else None

    def _wait_ready(self, nids: list[int], deadline: float, timeout: float) -> None:
        pending = list(nids)
        started = time.monotonic()
        next_note = started + PROGRESS_EVERY
        why: dict[int, str] = {}
        while True:
            for nid in pending:
                p = self.process(nid)
                if p is None or p.poll() is not None:
                    code = None if p is None else p.returncode
                    raise ClusterError(self._failure(nid, f"exited with status {code} while starting"))
            # Ready means the broker sees every broker that is running now (others may be down
            # on purpose in a test that kills nodes).
            expected = {i for i in self.broker_ids if self.is_running(i)}
            for nid in list(pending):
                reason = self._check(nid, expected)
                if reason is None:
                    pending.remove(nid)
                else:
                    why[nid] = reason
            if not pending:
                return
            now = time.monotonic()
            if now >= deadline:
                detail = "; ".join(f"{node_name(n)}: {why.get(n, '?')}" for n in pending)
                raise ClusterError(self._failure(pending[0], f"not ready after {timeout:.0f}s ({detail})"))
            if now >= next_note:
                names = ", ".join(node_name(n) for n in pending)
                self._say(f"waiting for {names} ({now - started:.0f}s of {timeout:.0f}s): {why.get(pending[0], '')}")
                next_note = now + PROGRESS_EVERY
            time.sleep(0.2)

    def _failure(self, nid: int, what: str) -> str:
        name = node_name(nid)
        parts = [f"{name} {what}", f"---- last lines of {self.log_path(name)}:", tail(self.log_path(name))]
        # A dead controller explains every broker that cannot come up.
        for cid in self.controller_ids:
            if nid != cid and not self.is_running(cid) and self.process(cid) is not None:
                parts += [
                    f"---- {node_name(cid)} is not running; last lines of {self.log_path(cid)}:",
                    tail(self.log_path(cid)),
                ]
        return "\n".join(parts)


__all__ = [
    "CONTROLLER",
    "CONTROLLER_ID",
    "DEFAULT_PORT_BASE",
    "DOCKER_CONFIG_PATH",
    "DOCKER_DATA_DIR",
    "DOCKER_INTERNAL_PORT",
    "Cluster",
    "ClusterError",
    "docker_configs",
    "controller_ids",
    "fixed_controller_ports",
    "fixed_ports",
    "is_controller_id",
    "free_ports",
    "node_configs",
    "node_id",
    "node_name",
    "render_properties",
]
