"""A failing tool says why: ten invocations of the installed kafka-*.sh scripts that fail, each
printing one line on stderr with the cause (the OS error, the TLS failure, the Kafka error name
and message), nothing on stdout and a non-zero exit. Real processes: a plaintext cluster and a
SASL_SSL cluster with ACLs."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import installed_script
from tools.certs import make_certs
from tools.cluster import Cluster, free_ports


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Cluster, Path]]:
    base = tmp_path_factory.mktemp("tool-errors")
    plain = Cluster(base / "plain", brokers=1, verbose=False)
    secure = Cluster(base / "secure", brokers=1, verbose=False, secure="SASL_SSL", acls=True)
    try:
        plain.start()
        secure.start()
        yield plain, secure, base
    finally:
        plain.stop()
        secure.stop()


def _props(path: Path, **kv: str) -> str:
    path.write_text("".join(f"{k.replace('_', '.')}={v}\n" for k, v in kv.items()))
    return str(path)


def _fails(*args: str, stdin: str = "") -> str:
    r = subprocess.run([installed_script(args[0]), *args[1:]], capture_output=True, text=True, timeout=90,
                       input=stdin)
    assert r.returncode != 0 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    return lines[0]


def test_ten_failing_invocations_each_print_their_cause(clusters: tuple[Cluster, Cluster, Path]) -> None:
    plain, secure, base = clusters
    p, s = plain.bootstrap, secure.bootstrap
    ca = str(secure.certs.ca)  # type: ignore[union-attr]
    other_ca = str(make_certs(base / "other-ca").ca)
    tls = _props(base / "tls.properties", security_protocol="SSL", ssl_ca_location=ca)
    sasl = {"security_protocol": "SASL_SSL", "ssl_ca_location": ca, "sasl_mechanism": "SCRAM-SHA-512"}
    wrong_password = _props(base / "wrong.properties", **sasl, sasl_username="admin", sasl_password="not-it")
    wrong_ca = _props(base / "wrong-ca.properties", **{**sasl, "ssl_ca_location": other_ca},
                      sasl_username="admin", sasl_password="admin-secret")
    alice = _props(base / "alice.properties", **sasl, sasl_username="alice", sasl_password="alice-secret")
    closed_port = free_ports(1)[0]
    subprocess.run([installed_script("kafka-topics.sh"), "--bootstrap-server", p, "--create", "--topic", "known",
                    "--partitions", "1", "--replication-factor", "1"], check=True, capture_output=True, timeout=60)

    cases = [
        # bad host: the resolver's error
        (("kafka-topics.sh", "--bootstrap-server", "no-such-host.invalid:9092", "--list"),
         r"cannot connect to no-such-host\.invalid:9092: \[Errno -?\d+\] \w.+"),
        # nothing listens: the OS's refusal
        (("kafka-topics.sh", "--bootstrap-server", f"127.0.0.1:{closed_port}", "--list"),
         rf"cannot connect to 127\.0\.0\.1:{closed_port}: .*(Connect call failed|Connection refused).*"),
        (("kafka-metadata-quorum.sh", "--bootstrap-controller", f"127.0.0.1:{closed_port}", "describe", "--status"),
         r"no controller answered as the quorum leader: cannot connect to .*(Connect call failed|Connection refused).*"),
        # TLS to a plaintext port: the reset during the handshake, and what it likely means
        (("kafka-topics.sh", "--bootstrap-server", p, "--list", "--command-config", tls),
         r"cannot connect to .*: \[Errno 104\] Connection reset by peer during the TLS handshake "
         r"\(is the listener plaintext\?\)"),
        # a SASL_SSL config against plaintext brokers: the same, not an empty reason
        (("kafka-topics.sh", "--bootstrap-server", p, "--list", "--command-config", wrong_password),
         r"cannot connect to .*: \[Errno 104\] Connection reset by peer during the TLS handshake "
         r"\(is the listener plaintext\?\)"),
        # plaintext to a TLS port: the hang-up at the first request
        (("kafka-topics.sh", "--bootstrap-server", s, "--list"),
         r"connection to .* closed by the peer while waiting for the answer to ApiVersions "
         r"\(is security\.protocol PLAINTEXT what the listener expects\?\)"),
        # a CA that did not sign the broker's certificate: the verification failure
        (("kafka-topics.sh", "--bootstrap-server", s, "--list", "--command-config", wrong_ca),
         r"cannot connect to .*: TLS certificate verification failed: \w.+"),
        # wrong SASL password: Kafka's error name and the broker's message
        (("kafka-topics.sh", "--bootstrap-server", s, "--list", "--command-config", wrong_password),
         r"SASL authentication with .* failed: SASL_AUTHENTICATION_FAILED: .*[Ii]nvalid .*credentials.*"),
        # unauthorized
        (("kafka-topics.sh", "--bootstrap-server", s, "--create", "--topic", "x", "--command-config", alice),
         r"cannot create topic 'x': .+ \(TOPIC_AUTHORIZATION_FAILED\)"),
        (("kafka-acls.sh", "--bootstrap-server", s, "--list", "--command-config", alice),
         r"listing ACLs: .+ \(CLUSTER_AUTHORIZATION_FAILED\)"),
        # unknown topic
        (("kafka-topics.sh", "--bootstrap-server", p, "--describe", "--topic", "nope"),
         r"topic 'nope' does not exist \(UNKNOWN_TOPIC_OR_PARTITION\)"),
        (("kafka-console-consumer.sh", "--bootstrap-server", p, "--topic", "nope", "--timeout-ms", "1000"),
         r"topic 'nope' does not exist \(UNKNOWN_TOPIC_OR_PARTITION\)"),
        # a config key no topic has: the broker's message names it
        (("kafka-configs.sh", "--bootstrap-server", p, "--alter", "--topic", "known", "--add-config", "no.such.key=1"),
         r".*no\.such\.key.*\(INVALID_CONFIG\)"),
    ]
    for args, pattern in cases:
        line = _fails(*args)
        assert re.fullmatch("Error: " + pattern, line), (args, line)


def test_client_library_errors_carry_their_cause(clusters: tuple[Cluster, Cluster, Path]) -> None:
    """The same rule for client/: the exception's text names the cause."""
    import asyncio

    from client import OrderedConsumer, OrderedProducer
    from client.cluster import StrataClientError

    plain, _, _ = clusters
    closed_port = free_ports(1)[0]

    async def failures() -> list[str]:
        out = []
        for start in (OrderedProducer(f"127.0.0.1:{closed_port}").start,
                      OrderedConsumer("nope", bootstrap_servers=plain.bootstrap, group_id="g").start):
            try:
                await start()
            except StrataClientError as e:
                out.append(str(e))
        return out

    refused, unknown = asyncio.run(failures())
    assert re.fullmatch(rf"no broker answered: cannot connect to 127\.0\.0\.1:{closed_port}: "
                        r".*(Connect call failed|Connection refused).*", refused), refused
    assert unknown == "topic 'nope' does not exist", unknown


def test_bad_tool_input_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Two inputs that ended in a traceback: a --command-config that is not UTF-8, and SCRAM
    iterations past what the password may be hashed with (the tool hashes before it sends)."""
    latin = tmp_path / "latin.properties"
    latin.write_bytes(b"security.protocol=PLAINTEXT\nsasl.username=\xff\xfe\n")
    line = _fails("kafka-acls.sh", "--bootstrap-server", "127.0.0.1:9", "--list", "--command-config", str(latin))
    assert re.fullmatch(rf"Error: config file {re.escape(str(latin))} is not UTF-8 text: .+ at byte 42", line), line
    r = subprocess.run([installed_script("kafka-configs.sh"), "--bootstrap-server", "127.0.0.1:9", "--alter",
                        "--entity-type", "users", "--entity-name", "app", "--add-config",
                        "SCRAM-SHA-512=[iterations=1099511627776,password=x]"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.splitlines() == [
        "kafka-configs.sh: error: Iterations 1099511627776 is more than the maximum 16384 allowed for "
        "SCRAM-SHA-512 (see --help)"], r.stderr
