"""TLS and SASL with real clients: aiokafka, kafka-python, confluent-kafka and kcat produce and
consume over SASL_SSL with SCRAM-SHA-512 and with PLAIN; a wrong password, an unknown
mechanism, a plaintext client on the TLS port and a request before the handshake each fail
cleanly (Kafka's error, the connection closed, one log line) and the broker serves on."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from node.client import ClientError, NodeClient
from node.security import properties_client_security
from protocol.errors import Errors
from protocol.generated.metadata import MetadataRequest
from protocol.generated.sasl_authenticate import SaslAuthenticateRequest
from protocol.headers import decode_response, encode_request
from tests.conftest import ROOT, wait_for
from tools.cluster import SECURE_USERS, Cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Cluster:
    c = Cluster(tmp_path_factory.mktemp("secure"), brokers=1, secure="SASL_SSL",
                broker_overrides={"connections.max.reauth.ms": 4000, "group.initial.rebalance.delay.ms": 0})
    try:
        c.start(timeout=60)
        yield c
    finally:
        c.stop()


def log_text(c: Cluster, node) -> str:
    return Path(c.log_path(node)).read_text()


def aiokafka_kwargs(c: Cluster, user: str, mech: str, password: str | None = None) -> dict:
    from aiokafka.helpers import create_ssl_context

    return dict(bootstrap_servers=c.bootstrap, security_protocol="SASL_SSL",
                ssl_context=create_ssl_context(cafile=str(c.certs.ca)), sasl_mechanism=mech,
                sasl_plain_username=user, sasl_plain_password=password or SECURE_USERS[user])


def rdkafka_conf(c: Cluster, user: str, mech: str, password: str | None = None) -> dict:
    return {"bootstrap.servers": c.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": str(c.certs.ca),
            "sasl.mechanism": mech, "sasl.username": user, "sasl.password": password or SECURE_USERS[user]}


MECHS = ["SCRAM-SHA-512", "PLAIN"]


@pytest.mark.parametrize("mech", MECHS)
def test_aiokafka(secure, mech):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import KafkaError

    topic = f"aio-{mech}"

    async def main():
        kw = aiokafka_kwargs(secure, "alice", mech)
        p = AIOKafkaProducer(**kw)
        await p.start()
        try:
            for i in range(5):
                await p.send_and_wait(topic, f"v{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **kw)
        await c.start()
        try:
            got = [m.value for m in (await c.getmany(timeout_ms=10000, max_records=5)).get(
                next(iter(c.assignment())), [])] if c.assignment() else []
            while len(got) < 5:
                got.append((await asyncio.wait_for(c.getone(), 15)).value)
        finally:
            await c.stop()
        assert got == [f"v{i}".encode() for i in range(5)]

        bad = AIOKafkaProducer(**aiokafka_kwargs(secure, "alice", mech, "wrong"), request_timeout_ms=5000)
        with pytest.raises(KafkaError):  # KafkaConnectionError naming the authentication failure
            await asyncio.wait_for(bad.start(), 20)
        await bad.stop()

    asyncio.run(main())


@pytest.mark.parametrize("mech", MECHS)
def test_kafka_python(secure, mech):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError

    topic = f"kp-{mech}"
    kw = dict(bootstrap_servers=secure.bootstrap, security_protocol="SASL_SSL", ssl_cafile=str(secure.certs.ca),
              sasl_mechanism=mech, sasl_plain_username="alice", sasl_plain_password=SECURE_USERS["alice"])
    p = KafkaProducer(**kw)
    for i in range(5):
        p.send(topic, f"v{i}".encode()).get(timeout=30)
    p.close()
    c = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=15000, **kw)
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == 5:
            break
    c.close()
    assert got == [f"v{i}".encode() for i in range(5)]
    before = log_text(secure, 1).count("sasl_authentication_failed")
    with pytest.raises(KafkaError):
        KafkaProducer(**{**kw, "sasl_plain_password": "wrong"}, bootstrap_timeout_ms=3000)
    assert log_text(secure, 1).count("sasl_authentication_failed") > before


@pytest.mark.parametrize("mech", MECHS)
def test_confluent_kafka(secure, mech):
    from confluent_kafka import Consumer, KafkaException, Producer

    topic = f"ck-{mech}"
    p = Producer(rdkafka_conf(secure, "alice", mech))
    for i in range(5):
        p.produce(topic, f"v{i}".encode())
    assert p.flush(30) == 0
    c = Consumer({**rdkafka_conf(secure, "alice", mech), "group.id": f"g-{mech}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, deadline = [], time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == [f"v{i}".encode() for i in range(5)]

    errors = []
    bad = Producer({**rdkafka_conf(secure, "alice", mech, "wrong"), "error_cb": errors.append})
    with pytest.raises(KafkaException):
        bad.list_topics(timeout=3)
    bad.poll(0.5)
    assert any("Authentication failed" in e.str() or "authentication" in e.str().lower() for e in errors), errors


@pytest.mark.parametrize("mech", MECHS)
def test_kcat(secure, mech):
    topic = f"kcat-{mech}"
    opts = ["-b", secure.bootstrap, "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={secure.certs.ca}",
            "-X", f"sasl.mechanisms={mech}", "-X", "sasl.username=alice"]
    good = [*opts, "-X", f"sasl.password={SECURE_USERS['alice']}"]
    subprocess.run(["kcat", *good, "-P", "-t", topic], input=b"a\nb\nc\n", check=True, timeout=60)
    out = subprocess.run(["kcat", *good, "-C", "-t", topic, "-o", "beginning", "-c", "3", "-e"],
                         capture_output=True, check=True, timeout=60)
    assert out.stdout.split() == [b"a", b"b", b"c"]
    bad = subprocess.run(["kcat", *opts, "-X", "sasl.password=wrong", "-L", "-m", "2"], capture_output=True, timeout=60)
    assert bad.returncode != 0 and b"Authentication failed" in bad.stderr + bad.stdout


def test_wrong_password_is_logged_once_with_peer_and_user(secure):
    sec = properties_client_security({**secure.client_props("bob"), "sasl.password": "nope"}, "test")

    async def main():
        with pytest.raises(ClientError, match="Invalid user credentials"):
            await NodeClient(secure.host, secure.broker_port(1), security=sec, timeout=10).connect()

    asyncio.run(main())
    time.sleep(0.2)
    lines = [x for x in log_text(secure, 1).splitlines() if "sasl_authentication_failed" in x and "User:bob" in x]
    assert lines and "peer='127.0.0.1:" in lines[-1] and "Traceback" not in log_text(secure, 1)


def _tls_socket(c: Cluster) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(c.certs.ca))
    raw = socket.create_connection((c.host, c.broker_port(1)), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=c.host)


def _send(s, body, version: int) -> None:
    data = b"".join(bytes(p) for p in encode_request(body, version, 1, "raw"))
    s.sendall(struct.pack(">i", len(data)) + data)


def _read_frame(s) -> bytes:
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            return b""
        head += chunk
    n = struct.unpack(">i", head)[0]
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    return data


def test_bad_input_on_the_wire(secure):
    # a plaintext client on the TLS port: closed, the broker goes on
    with socket.create_connection((secure.host, secure.broker_port(1)), timeout=10) as s:
        _send(s, MetadataRequest(topics=[]), 1)
        try:
            s.recv(100)  # TLS alert bytes or nothing,
            assert s.recv(100) == b""  # then EOF
        except ConnectionResetError:
            pass
    # a request before the handshake: closed without an answer
    with _tls_socket(secure) as s:
        _send(s, MetadataRequest(topics=[]), 1)
        assert _read_frame(s) == b""
    # a SASL token before the handshake: ILLEGAL_SASL_STATE, then closed
    with _tls_socket(secure) as s:
        _send(s, SaslAuthenticateRequest(auth_bytes=b"x"), 1)
        frame = _read_frame(s)
        assert decode_response(frame, 36, 1)[1].error_code == Errors.ILLEGAL_SASL_STATE
        assert _read_frame(s) == b""
    def logged() -> str | None:
        text = log_text(secure, 1)
        return text if "tls_handshake_failed" in text and "sasl_illegal_state" in text else None

    text = wait_for(logged, 10, "the broker to log both failures")
    assert "Traceback" not in text

    async def still_serving():
        sec = properties_client_security(secure.client_props("admin"), "test")
        async with NodeClient(secure.host, secure.broker_port(1), security=sec) as cl:
            md = await cl.request(MetadataRequest(topics=[]))
            assert [b.port for b in md.brokers] == [secure.broker_port(1)]

    asyncio.run(still_serving())


def test_unknown_mechanism(secure):
    sec = replace(properties_client_security(secure.client_props("alice"), "test"), mechanism="GSSAPI")

    async def main():
        with pytest.raises(ClientError, match="UNSUPPORTED_SASL_MECHANISM .enabled there: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"):
            await NodeClient(secure.host, secure.broker_port(1), security=sec, timeout=10).connect()

    asyncio.run(main())
    assert "sasl_unsupported_mechanism" in log_text(secure, 1)


def test_scram_users_managed_with_admin_client(secure):
    from confluent_kafka import Producer
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(rdkafka_conf(secure, "admin", "SCRAM-SHA-512"))
    user = f"carol{uuid.uuid4().hex[:6]}"
    up = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"carol-pw")
    for f in admin.alter_user_scram_credentials([up]).values():
        f.result(timeout=30)
    described = {u: f.result(timeout=30) for u, f in admin.describe_user_scram_credentials([user]).items()}
    everyone = admin.describe_user_scram_credentials(None).result(timeout=30)
    assert {user, "admin", "broker"} <= set(everyone)
    infos = described[user].scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_256, 8192)]

    p = Producer(rdkafka_conf(secure, user, "SCRAM-SHA-256", "carol-pw"))
    p.produce("carol-topic", b"x")
    assert p.flush(30) == 0

    for f in admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)]).values():
        f.result(timeout=30)
    # bad input: deleting what is not there, too few iterations
    futs = admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)])
    with pytest.raises(Exception, match="does not exist"):
        futs[user].result(timeout=30)
    futs = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw")])
    with pytest.raises(Exception, match="Too few iterations"):
        futs["dave"].result(timeout=30)


def test_reauthentication(secure):
    """connections.max.reauth.ms=4000: our client re-authenticates on the same connection and
    keeps working; librdkafka (KIP-368) does too."""
    sec = properties_client_security(secure.client_props("admin"), "test")

    async def main():
        async with NodeClient(secure.host, secure.broker_port(1), security=sec) as cl:
            assert cl._reauth_at > 0
            await asyncio.sleep(4.5)
            md = await cl.request(MetadataRequest(topics=[]))
            assert md.brokers and cl.connected

    asyncio.run(main())
    from confluent_kafka import Producer

    p = Producer({**rdkafka_conf(secure, "alice", "SCRAM-SHA-512"), "linger.ms": 0})
    delivered = []
    for i in range(2):
        p.produce("reauth", f"r{i}".encode(), on_delivery=lambda err, _m: delivered.append(err))
        p.flush(15)
        if i == 0:
            time.sleep(4.5)  # past the session lifetime: librdkafka re-authenticates (KIP-368)
    assert delivered == [None, None]
    assert "sasl_session_expired" not in log_text(secure, 1)


def test_tools_with_command_config(secure, tmp_path):
    """kafka-configs.sh adds a SCRAM user; kafka-topics.sh logs in as it with --command-config;
    a wrong password is one line and exit 1."""
    def tool(module: str, props: dict, *args: str) -> subprocess.CompletedProcess:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return subprocess.run([sys.executable, "-m", module, "--bootstrap-server", secure.bootstrap,
                               "--command-config", str(path), *args], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)

    admin = secure.client_props("admin")
    r = tool("tools.kafka_configs", admin, "--alter", "--entity-type", "users", "--entity-name", "erin",
             "--add-config", "SCRAM-SHA-512=[iterations=8192,password=erin-pw]")
    assert r.returncode == 0, r.stderr
    r = tool("tools.kafka_configs", admin, "--describe", "--entity-type", "users", "--entity-name", "erin")
    assert "SCRAM-SHA-512=iterations=8192" in r.stdout, r.stdout + r.stderr
    erin = {**admin, "sasl.username": "erin", "sasl.password": "erin-pw"}
    r = tool("tools.kafka_topics", erin, "--create", "--topic", "erins", "--partitions", "1")
    assert r.returncode == 0, r.stderr
    r = tool("tools.kafka_topics", {**erin, "sasl.password": "nope"}, "--list")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Invalid user credentials" in r.stderr
