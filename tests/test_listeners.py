"""Two listeners on one broker: PLAINTEXT for the inside (the inter-broker listener) and an SSL
EXTERNAL one advertised under another name. Metadata, FindCoordinator and DescribeCluster answer
with the endpoints of the listener the request came in on."""

from __future__ import annotations

import asyncio

import pytest

from node.client import NodeClient
from node.security import ClientSecurity, client_ssl_context
from protocol.generated.describe_cluster import DescribeClusterRequest
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.metadata import MetadataRequest
from tools.certs import make_certs
from tools.cluster import Cluster, free_ports

pytestmark = pytest.mark.timeout(120)


def test_metadata_answers_with_the_listener_the_client_came_in_on(tmp_path):
    certs = make_certs(tmp_path / "certs", ("localhost", "127.0.0.1"))
    (external,) = free_ports(1)
    c = Cluster(tmp_path / "c", brokers=1, verbose=False)
    inside = c.broker_port(1)
    c.per_broker_overrides[1] = {
        "listeners": f"PLAINTEXT://127.0.0.1:{inside},EXTERNAL://127.0.0.1:{external}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{inside},EXTERNAL://localhost:{external}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "ssl.certificate.location": str(certs.server_cert), "ssl.key.location": str(certs.server_key),
    }
    tls = ClientSecurity("SSL", client_ssl_context("test", str(certs.ca), None, None, None, True))

    async def ask(port: int, security: ClientSecurity | None):
        async with NodeClient("127.0.0.1" if security is None else "localhost", port, security=security) as cl:
            md = await cl.request(MetadataRequest(topics=[]))
            for _ in range(100):  # the first asks create __consumer_offsets
                fc = await cl.request(FindCoordinatorRequest(key="g", key_type=0), 3)
                if fc.error_code == 0:
                    break
                await asyncio.sleep(0.2)
            dc = await cl.request(DescribeClusterRequest())
            return ([(b.host, b.port) for b in md.brokers], (fc.error_code, fc.host, fc.port),
                    [(b.host, b.port) for b in dc.brokers])

    try:
        c.start(timeout=60)
        md, fc, dc = asyncio.run(ask(inside, None))
        assert md == dc == [("127.0.0.1", inside)]
        assert fc == (0, "127.0.0.1", inside)
        md, fc, dc = asyncio.run(ask(external, tls))
        assert md == dc == [("localhost", external)]
        assert fc == (0, "localhost", external)
        log = c.log_path(1).read_text()
        assert f"EXTERNAL://127.0.0.1:{external} (SSL)" in log and f"PLAINTEXT://127.0.0.1:{inside} (PLAINTEXT)" in log
    finally:
        c.stop()
