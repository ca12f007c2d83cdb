"""TLS client authentication on an SSL cluster with the authorizer on (`ssl.client.auth=requested`):
a client certificate's subject is the principal (User:CN=client,O=strata) and ACLs on it apply; a
client without a certificate is User:ANONYMOUS and gets CLUSTER_AUTHORIZATION_FAILED from an
inter-node API; a certificate from another CA fails the handshake, logged, and the broker serves on."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.metadata import MetadataRequest
from protocol.generated.write_txn_markers import WriteTxnMarkersRequest
from tests.conftest import ROOT, wait_for
from tools.certs import make_certs
from tools.cluster import Cluster

pytestmark = pytest.mark.timeout(120)
NODES = "User:CN=localhost,O=strata"  # the nodes' certificate (tools/certs.py: CN = the first host)


@pytest.fixture(scope="module")
def mtls(tmp_path_factory) -> Cluster:
    over = {"ssl.client.auth": "requested", "super.users": f"{NODES};User:admin"}
    c = Cluster(tmp_path_factory.mktemp("mtls"), brokers=1, secure="SSL", acls=True, broker_overrides=over,
                controller_overrides=over)
    try:
        c.start(timeout=60)
        yield c
    finally:
        c.stop()


def conf(c: Cluster, cert: bool) -> dict:
    out = {**c.rdkafka_conf(), "message.timeout.ms": 10000}
    if cert:
        out.update({"ssl.certificate.location": str(c.certs.client_cert), "ssl.key.location": str(c.certs.client_key)})
    return out


def test_certificate_subject_is_the_principal(mtls):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    c = mtls
    r = subprocess.run([sys.executable, "-m", "tools.kafka_acls", "--bootstrap-server", c.bootstrap, "--command-config",
                        str(_props(c, cert=True)), "--list"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in r.stderr  # CN=client is no super user
    # the nodes are super users by their certificate's subject: they may add ACLs and create topics
    admin = AdminClient({**conf(c, cert=False), "ssl.certificate.location": str(c.certs.server_cert),
                         "ssl.key.location": str(c.certs.server_key)})
    admin.create_topics([NewTopic("certs", 1, 1)])["certs"].result(30)
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
    b = AclBinding(ResourceType.TOPIC, "certs", ResourcePatternType.LITERAL, "User:CN=client,O=strata", "*",
                   AclOperation.WRITE, AclPermissionType.ALLOW)
    admin.create_acls([b])[b].result(30)
    errors = []
    for cert in (True, False):
        p = Producer(conf(c, cert))
        p.produce("certs", b"x", on_delivery=lambda err, _m: errors.append(err))
        p.flush(15)
    assert errors[0] is None and errors[1].code() == Errors.TOPIC_AUTHORIZATION_FAILED


def _props(c: Cluster, cert: bool) -> Path:
    path = Path(c.base_dir) / f"client-{cert}.properties"
    props = c.client_props()
    if cert:
        props.update({"ssl.certificate.location": str(c.certs.client_cert), "ssl.key.location": str(c.certs.client_key)})
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def test_anonymous_gets_cluster_authorization_failed(mtls):
    c = mtls
    R = WriteTxnMarkersRequest

    async def main():
        async with NodeClient(c.host, c.broker_port(1), security=c.client_security()) as cl:
            resp = await cl.request(R(markers=[R.WritableTxnMarker(producer_id=1, producer_epoch=0, topics=[
                R.WritableTxnMarkerTopic(name="certs", partition_indexes=[0])])]))
            codes = {p.error_code for m in resp.markers for t in m.topics for p in t.partitions}
            assert codes == {Errors.CLUSTER_AUTHORIZATION_FAILED}
            md = await cl.request(MetadataRequest(topics=None))
            assert md.topics == []  # ANONYMOUS may describe no topic

    asyncio.run(main())
    assert "principal='User:ANONYMOUS'" in Path(c.log_path(1)).read_text()


def test_certificate_of_another_ca_fails_the_handshake(mtls, tmp_path):
    c = mtls
    other = make_certs(tmp_path / "other")
    ctx = ssl.create_default_context(cafile=str(c.certs.ca))
    ctx.load_cert_chain(str(other.client_cert), str(other.client_key))
    closed = False
    with socket.create_connection((c.host, c.broker_port(1)), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=c.host) as s:
                s.sendall(b"\0\0\0\1x")
                closed = s.recv(10) == b""  # TLS 1.3: the alert comes with the first read
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            closed = True
    assert closed
    # the broker logs it as its side of the handshake ends: maybe a moment after our read did
    wait_for(lambda: "tls_handshake_failed" in Path(c.log_path(1)).read_text(), 10, "the broker to log the failure")

    async def still_serving():
        async with NodeClient(c.host, c.broker_port(1), security=c.client_security()) as cl:
            assert (await cl.request(MetadataRequest(topics=[]))).brokers

    asyncio.run(still_serving())
