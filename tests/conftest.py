"""Shared fixtures: real clusters on 127.0.0.1 with random free ports in pytest's temp dirs.

`cluster` is a started 1-controller, 3-broker cluster for one test; `cluster_factory(**kwargs)`
starts clusters with other settings (any Cluster argument: brokers, broker_overrides,
per_broker_overrides, ...). Both stop every process at teardown, also when the test fails; the
launcher itself kills them if the interpreter exits first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from confluent_kafka import KafkaException

ROOT = Path(__file__).resolve().parent.parent
# `tests` (a package) and the project packages import from the repo root even when pytest is
# started from elsewhere or the project is not pip-installed.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# With PYTHONDONTWRITEBYTECODE set, every node and tool process the tests start would compile
# every module again (hundreds of clusters and tool runs per suite): tools/bytecode.py caches it
# outside the tree, for this process (test modules imported from here on) and, through the
# environment, for every process it starts.
from tools.bytecode import cache_outside_the_tree  # noqa: E402

if cache_outside_the_tree(os.environ):
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False

from tools.cluster import Cluster  # noqa: E402

# Storage and coordinator code run inside test processes logs through structlog's default setup,
# which prints debug events too: a background flush finishing after its test printed lines into
# the run's output. Tests see INFO and above, as the nodes log by default.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))

ClusterFactory = Callable[..., Cluster]

# Broker sessions in seconds, not Kafka's 9: a broker killed with SIGKILL and started again is
# refused (DUPLICATE_BROKER_REGISTRATION, as in Kafka) until its old session has run out, and a
# dead broker's partitions move only then. Give it to the controller (the session) and the
# brokers (their heartbeats) of a test that kills brokers.
FAST_FENCING = {"broker.session.timeout.ms": 3000, "broker.heartbeat.interval.ms": 500}


def wait_for(
    pred: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.2,
    retry_on: tuple[type[BaseException], ...] = (AssertionError, OSError),
) -> Any:
    """Poll `pred` until it returns something truthy, and return that. A call raising one of
    `retry_on` (a broker being killed, a coordinator moving, a file not written yet) counts as
    "not yet"; the timeout's message names the last such error."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            v = pred()
        except retry_on as e:
            v, last = None, e
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last!r})" if last else ""))
        time.sleep(interval)


def wait_for_kafka(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """wait_for, also counting a confluent-kafka error (a leader moving, a broker down during a
    failover) as "not yet"."""
    return wait_for(pred, timeout, what, retry_on=(KafkaException, AssertionError, OSError))


def eventually(check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2) -> Any:
    """Retry `check` until it neither raises AssertionError nor returns False (metadata reaching
    every broker, a tool's output settling), and return what it returned. An assert-style check
    returning None passes; a comparison returning False is "not yet", not a pass."""
    done: list[Any] = []

    def passed() -> bool:
        done.append(check())
        return done[-1] is not False

    wait_for(passed, timeout, "a check to pass", interval, (AssertionError,))
    return done[-1]


async def eventually_async(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    """In a test's event loop: wait until `pred()` holds (True) or `timeout` passes (False),
    looking every 10 ms while the coordinator under test runs its timers and writes."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def installed_script(name: str) -> str:
    """The path of one of our kafka-*.sh tools: the venv running the tests first (where
    `pip install -e .` put it), else PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"{name} is not installed: run `pip install -e .` (make does)"
    return found


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[ClusterFactory]:
    started: list[Cluster] = []

    def make(*, start: bool = True, timeout: float = 60.0, **kwargs: Any) -> Cluster:
        c = Cluster(tmp_path / f"cluster-{len(started)}", **kwargs)
        started.append(c)  # before start(): a half-started cluster is stopped too
        if start:
            c.start(timeout=timeout)
        return c

    yield make
    for c in started:
        c.stop()


@pytest.fixture
def cluster(cluster_factory: ClusterFactory) -> Cluster:
    return cluster_factory()


# Files whose tests took longest in a full run (seconds of setup, call and teardown together).
# `make test` hands whole files to its xdist workers in collection order
# (--dist loadfile --no-loadscope-reorder): the longest go first (longest processing time first),
# so the workers finish together instead of one idling while the other runs a long file it got last.
LONGEST_FILES = {
    "test_spark_sink.py": 346, "test_e2e_clients.py": 113, "test_ordered_clients.py": 108,
    "test_broker_core.py": 95, "test_diskless_acceptance.py": 89, "test_consumer_protocol.py": 73,
    "test_diskless_transactions.py": 72, "test_eos_diskless.py": 67, "test_spark_sink_secure.py": 66,
    "test_reassign_tool.py": 66, "test_transactions.py": 49, "test_controller_quorum.py": 45,
    "test_eos_loop.py": 45, "test_faults.py": 90, "test_share_groups.py": 43,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -LONGEST_FILES.get(item.path.name, 0))  # stable: the rest keep their order


# Every JVM (Spark's, and the launcher spark-submit starts first) makes /tmp/hsperfdata_<user>,
# in /tmp whatever TMPDIR says, and leaves the dir when it exits. A run that made it takes it
# away at the end (only if empty: a JVM still running keeps its file there).
_HSPERFDATA = Path("/tmp") / f"hsperfdata_{pwd.getpwuid(os.getuid()).pw_name}"
_hsperf_existed = pytest.StashKey[bool]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_hsperf_existed] = _HSPERFDATA.exists()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or session.config.stash.get(_hsperf_existed, True):
        return  # an xdist worker (the controller cleans up), or the dir was there before the run
    try:
        _HSPERFDATA.rmdir()
    except OSError:
        pass  # missing, or not empty
