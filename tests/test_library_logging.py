"""The client library (client/: OrderedProducer, OrderedConsumer) and the connector's reader log
through the standard `logging` module under their own names and configure nothing: an
application that sets nothing up sees nothing on stdout or stderr, one that configures logging
sees the library's records under `client.*`. Real broker and controller processes; the
application is a separate Python process, as a user's would be."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import installed_script
from tools.cluster import Cluster

APP = textwrap.dedent("""
    import asyncio, logging, sys

    import structlog

    SETUP = sys.argv[2]
    if SETUP == "configured":
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")

    from client import OrderedConsumer, OrderedProducer
    from connector.reader import ChunkReader

    async def main(bs):
        p = OrderedProducer(bs)
        await p.start()
        for i in range(10):
            await p.send_and_wait("app", b"v%d" % i, key=b"k%d" % (i % 3))
        await p.stop()
        c = OrderedConsumer("app", bootstrap_servers=bs, group_id="app")
        await c.start()
        got = 0
        for _ in range(100):
            got += sum(len(v) for v in (await c.getmany(timeout_ms=200)).values())
            if got >= 10:
                break
        await c.stop()
        assert got == 10, got

    asyncio.run(main(sys.argv[1]))
    assert len(list(ChunkReader(sys.argv[1]).read("app", 0, 0, 10))) == 10  # synchronous
    # the library left every global alone
    if SETUP == "none":
        assert logging.getLogger().handlers == [] and logging.getLogger("client").handlers == []
        assert not structlog.is_configured()
""")


def _app(c: Cluster, setup: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", APP, c.bootstrap, setup], capture_output=True, text=True,
                          timeout=120, cwd=c.base_dir)


def test_library_is_silent_by_default_and_logs_through_logging(cluster: Cluster) -> None:
    r = subprocess.run([installed_script("kafka-topics.sh"), "--bootstrap-server", cluster.bootstrap, "--create",
                        "--topic", "app", "--partitions", "1", "--replication-factor", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    quiet = _app(cluster, "none")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", ""), quiet.stderr
    loud = _app(cluster, "configured")
    assert loud.returncode == 0 and loud.stdout == "", loud.stderr
    assert "client.consumer INFO ordered_consumer_assigned member=" in loud.stderr
