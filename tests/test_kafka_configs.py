"""kafka-configs.sh (tools/kafka_configs.py), run as the script pip installs, against one real
two-broker cluster; its output is compared line by line with what Kafka's ConfigCommand prints.

Bad arguments are one line on stderr and exit 2 (before any connection); what the cluster refuses
is one line and exit 1.
"""

from __future__ import annotations

import re
import socket
import struct
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import eventually, installed_script
from tools import kafka_configs
from tools.cluster import Cluster, free_ports

SCRIPT = installed_script("kafka-configs.sh")
# an ApiVersions v0 request frame: api key 18, version 0, correlation id 1, client id "t"
API_VERSIONS_V0 = struct.pack(">ihhih", 11, 18, 0, 1, 1) + b"t"
# a static key in every broker's properties file (server.properties), shown as STATIC_BROKER_CONFIG
STATIC = {"log.cleaner.threads": "2", "ssl.key.password": "not-for-your-eyes"}
# what kafka-configs.sh adds to the line of a key Strata accepts but does not act on
CLEANER_THREADS = " (ignored by Strata: compaction runs on one log-cleaner thread per broker)"


@pytest.fixture(scope="module")
def bs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    c = Cluster(tmp_path_factory.mktemp("kafka-configs"), brokers=2, broker_overrides=STATIC)
    try:
        c.start()
        yield c.bootstrap
    finally:
        c.stop()


def kc(bs: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, "--bootstrap-server", bs, *args], capture_output=True, text=True, timeout=60)


def ok(bs: str, *args: str) -> list[str]:
    r = kc(bs, *args)
    assert r.returncode == 0 and r.stderr == "", f"kafka-configs.sh {' '.join(args)}: {r.returncode} {r.stderr}"
    return r.stdout.splitlines()



def create_topic(bs: str, name: str) -> None:
    r = subprocess.run([installed_script("kafka-topics.sh"), "--bootstrap-server", bs, "--create", "--topic", name,
                        "--partitions", "1", "--replication-factor", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_topic_configs_add_describe_delete(bs: str, tmp_path) -> None:
    create_topic(bs, "cfg-t")
    assert ok(bs, "--alter", "--entity-type", "topics", "--entity-name", "cfg-t",
              "--add-config", "retention.ms=3600000,cleanup.policy=[compact,delete]") == [
        "Completed updating config for topic cfg-t."]
    assert ok(bs, "--describe", "--topic", "cfg-t") == [
        "Dynamic configs for topic cfg-t are:",
        "  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact,delete,"
        " DEFAULT_CONFIG:log.cleanup.policy=delete}",
        "  retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000,"
        " DEFAULT_CONFIG:log.retention.hours=168}",
    ]
    every = ok(bs, "--describe", "--topic", "cfg-t", "--all")
    assert every[0] == "All configs for topic cfg-t are:"
    names = [line.split("=", 1)[0].strip() for line in every[1:]]
    assert names == sorted(names) and "min.insync.replicas" in names and "segment.bytes" in names
    assert "  segment.bytes=1073741824 sensitive=false synonyms={DEFAULT_CONFIG:log.segment.bytes=1073741824}" in every
    assert "  remote.storage.enable=false sensitive=false synonyms={}" in every
    # --add-config-file (a properties file) and --delete-config
    props = tmp_path / "topic.properties"
    props.write_text("# more\nmax.message.bytes=200000\n")
    ok(bs, "--alter", "--topic", "cfg-t", "--add-config-file", str(props), "--delete-config", "cleanup.policy")
    assert ok(bs, "--describe", "--topic", "cfg-t") == [
        "Dynamic configs for topic cfg-t are:",
        "  max.message.bytes=200000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:max.message.bytes=200000,"
        " DEFAULT_CONFIG:message.max.bytes=1048588}",
        "  retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000,"
        " DEFAULT_CONFIG:log.retention.hours=168}",
    ]
    # every topic, without a name; a missing topic as Kafka words it (exit 0)
    assert "Dynamic configs for topic cfg-t are:" in ok(bs, "--describe", "--entity-type", "topics")
    assert ok(bs, "--describe", "--topic", "nosuch") == [
        "The topic 'nosuch' doesn't exist and doesn't have dynamic config."]


def test_broker_describe_all_shows_defaults_and_static_keys(bs: str) -> None:
    lines = ok(bs, "--describe", "--broker", "2", "--all")
    assert lines[0] == "All configs for broker 2 are:"
    names = [line.split("=", 1)[0].strip() for line in lines[1:]]
    assert names == sorted(names) and len(names) > 100, names
    assert ("  background.threads=10 sensitive=false synonyms={DEFAULT_CONFIG:background.threads=10} (ignored by "
            "Strata: one asyncio event loop per process serves every request: no network or I/O thread pools)") in lines
    assert ("  log.cleaner.threads=2 sensitive=false synonyms={STATIC_BROKER_CONFIG:log.cleaner.threads=2,"
            " DEFAULT_CONFIG:log.cleaner.threads=1}" + CLEANER_THREADS) in lines
    assert "  node.id=2 sensitive=false synonyms={STATIC_BROKER_CONFIG:node.id=2}" in lines
    # a password is never sent back, as Kafka
    assert "  ssl.key.password=null sensitive=true synonyms={STATIC_BROKER_CONFIG:ssl.key.password=null}" in lines
    assert "not-for-your-eyes" not in "\n".join(lines)
    # the fields behind the lines, through kafka-python: read-only for what cannot change at
    # runtime, Kafka's config types, no documentation, no synonyms unless asked
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    kp = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=30000)
    try:
        got = kp.describe_configs([ConfigResource(ConfigResourceType.BROKER, "2")], config_filter="all")["broker"]["2"]
    finally:
        kp.close()
    fields = {k: (got[k]["read_only"], got[k]["config_type"], got[k]["documentation"], got[k].get("synonyms"))
              for k in ("node.id", "log.cleaner.threads", "offsets.topic.replication.factor", "log.cleanup.policy")}
    assert fields == {"node.id": (True, "INT", None, []), "log.cleaner.threads": (False, "INT", None, []),
                      "offsets.topic.replication.factor": (True, "SHORT", None, []),
                      "log.cleanup.policy": (False, "LIST", None, [])}, fields
    # without --all: only what is set dynamically for this broker (nothing yet)
    assert ok(bs, "--describe", "--broker", "2") == ["Dynamic configs for broker 2 are:"]
    assert ok(bs, "--describe", "--broker", "7") == ["The broker '7' doesn't exist and doesn't have dynamic config."]


def _confluent_entry(bs: str, broker: str, key: str) -> tuple[str, str]:
    """(value, source) of one broker config through confluent-kafka's AdminClient.describe_configs."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

    a = AdminClient({"bootstrap.servers": bs})
    res = ConfigResource(ConfigResource.Type.BROKER, broker)
    e = a.describe_configs([res], request_timeout=30)[res].result(30)[key]
    return e.value, ConfigSource(e.source).name


def _kafka_python_synonyms(bs: str, broker: str, key: str) -> list[tuple[str, str, str]]:
    """The synonyms of one broker config through kafka-python (which keeps them as a list, in order)."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    kp = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=30000)
    try:
        got = kp.describe_configs([ConfigResource(ConfigResourceType.BROKER, broker)], include_synonyms=True,
                                  config_filter="all")
    finally:
        kp.close()
    return [(s["name"], s["value"], s["source"]) for s in got["broker"][broker][key]["synonyms"]]


def test_dynamic_per_broker_and_cluster_default(bs: str) -> None:
    assert ok(bs, "--alter", "--broker-defaults", "--add-config", "log.cleaner.threads=4,log.retention.ms=5000000") == [
        "Completed updating default config for brokers in the cluster."]
    assert ok(bs, "--alter", "--entity-type", "brokers", "--entity-name", "1",
              "--add-config", "log.cleaner.threads=3") == ["Completed updating config for broker 1."]
    want = ("  log.cleaner.threads=3 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.cleaner.threads=3, "
            "DYNAMIC_DEFAULT_BROKER_CONFIG:log.cleaner.threads=4, STATIC_BROKER_CONFIG:log.cleaner.threads=2, "
            "DEFAULT_CONFIG:log.cleaner.threads=1}" + CLEANER_THREADS)

    def per_broker() -> None:
        assert ok(bs, "--describe", "--broker", "1") == ["Dynamic configs for broker 1 are:", want]

    eventually(per_broker)
    default_lines = [
        "Default configs for brokers in the cluster are:",
        "  log.cleaner.threads=4 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.cleaner.threads=4}"
        + CLEANER_THREADS,
        "  log.retention.ms=5000000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=5000000}",
    ]
    assert ok(bs, "--describe", "--entity-type", "brokers", "--entity-default") == default_lines
    # every broker, then the cluster default, as Kafka lists them
    assert ok(bs, "--describe", "--entity-type", "brokers") == [
        "Dynamic configs for broker 1 are:", want, "Dynamic configs for broker 2 are:", *default_lines]
    every = ok(bs, "--describe", "--broker", "2", "--all")
    assert ("  log.retention.ms=5000000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms="
            "5000000, DEFAULT_CONFIG:log.retention.hours=168}") in every
    # confluent-kafka's admin client sees the same value, source and synonyms
    assert _confluent_entry(bs, "1", "log.cleaner.threads") == ("3", "DYNAMIC_BROKER_CONFIG")
    assert _confluent_entry(bs, "2", "log.cleaner.threads") == ("4", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    # and kafka-python the synonyms, in Kafka's order
    name = "log.cleaner.threads"
    assert _kafka_python_synonyms(bs, "1", name) == [
        (name, "3", "DYNAMIC_BROKER_CONFIG"), (name, "4", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        (name, "2", "STATIC_BROKER_CONFIG"), (name, "1", "DEFAULT_CONFIG")]
    # deleting both brings back the static value
    ok(bs, "--alter", "--broker", "1", "--delete-config", "log.cleaner.threads")
    ok(bs, "--alter", "--broker-defaults", "--delete-config", "log.cleaner.threads,log.retention.ms")
    eventually(lambda: _check(_confluent_entry(bs, "1", "log.cleaner.threads") == ("2", "STATIC_BROKER_CONFIG")))


def _check(cond: bool) -> None:
    assert cond


def test_client_quotas_and_scram_users(bs: str) -> None:
    assert ok(bs, "--alter", "--user", "alice", "--client", "app",
              "--add-config", "producer_byte_rate=1024,consumer_byte_rate=20000000") == [
        "Completed updating config for user alice."]
    assert ok(bs, "--alter", "--entity-type", "users", "--entity-default",
              "--add-config", "request_percentage=50") == ["Completed updating default config for users in the cluster."]
    assert ok(bs, "--alter", "--client", "batch", "--add-config", "consumer_byte_rate=4096") == [
        "Completed updating config for client batch."]
    assert ok(bs, "--describe", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
              "--entity-name", "app") == [
        "Quota configs for user-principal 'alice', client-id 'app' are consumer_byte_rate=2.0E7, "
        "producer_byte_rate=1024.0"]
    assert ok(bs, "--describe", "--client", "batch") == ["Quota configs for client-id 'batch' are consumer_byte_rate=4096.0"]
    assert ok(bs, "--describe", "--user-defaults") == [
        "Quota configs for the default user-principal are request_percentage=50.0"]
    # SCRAM credentials are users' configs too
    ok(bs, "--alter", "--user", "bob", "--add-config", "SCRAM-SHA-256=[iterations=8192,password=bob-pw]")
    users = ok(bs, "--describe", "--entity-type", "users")
    assert users == ["Quota configs for the default user-principal are request_percentage=50.0",
                     "SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-256=iterations=8192"]
    ok(bs, "--alter", "--user", "alice", "--client", "app", "--delete-config", "consumer_byte_rate")
    assert ok(bs, "--describe", "--user", "alice", "--client", "app") == [
        "Quota configs for user-principal 'alice', client-id 'app' are producer_byte_rate=1024.0"]


@pytest.mark.parametrize("args", [
    ["--describe", "--entity-type", "widgets"],
    ["--describe"],
    ["--alter", "--topic", "t"],
    ["--alter", "--entity-type", "topics", "--add-config", "retention.ms=1"],
    ["--alter", "--topic", "t", "--add-config", "retention.ms"],
    ["--alter", "--topic", "t", "--add-config", "=1"],
    ["--alter", "--broker", "one", "--add-config", "log.cleaner.threads=1"],
    ["--alter", "--user", "u", "--add-config", "producer_byte_rate=fast"],
    ["--alter", "--user", "u", "--add-config", "log.retention.ms=1"],
    ["--alter", "--client", "c", "--add-config", "SCRAM-SHA-256=[password=x]"],
    ["--describe", "--topic", "t", "--add-config", "a=b"],
    ["--alter", "--all", "--topic", "t", "--add-config", "a=b"],
    ["--describe", "--entity-type", "topics", "--entity-type", "brokers"],
    ["--alter", "--topic", "t", "--add-config-file", "/nonexistent/x.properties"],
    ["--alter", "--ip", "not an address!", "--add-config", "connection_creation_rate=5"],
    ["--alter", "--ip", "10.0.0.1", "--add-config", "producer_byte_rate=5"],
    ["--alter", "--ip", "10.0.0.1", "--add-config", "connection_creation_rate=often"],
    ["--describe", "--entity-type", "broker-loggers"],
    ["--alter", "--broker-logger", "one", "--add-config", "root=DEBUG"],
    ["--alter", "--entity-type", "broker-loggers", "--entity-default", "--add-config", "root=DEBUG"],
])
def test_bad_arguments_exit_2_with_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # in-process (the arguments are refused before anything is dialled); the script runs the same main()
    with pytest.raises(SystemExit) as exit_:
        kafka_configs.main(["--bootstrap-server", "127.0.0.1:1", *args])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, (out, err)
    assert len(err.splitlines()) == 1 and err.startswith("kafka-configs.sh: error: "), err
    assert out == ""


def test_what_the_cluster_refuses_is_one_line_and_exit_1(bs: str) -> None:
    create_topic(bs, "cfg-bad")
    cases = [
        (["--alter", "--topic", "cfg-bad", "--add-config", "no.such.key=1"], "Unknown topic config name: no.such.key"),
        (["--alter", "--topic", "cfg-bad", "--add-config", "retention.ms=soon"], "INVALID_CONFIG"),
        (["--alter", "--topic", "cfg-bad", "--delete-config", "retention.ms"], "Invalid config(s): retention.ms"),
        (["--alter", "--topic", "nosuch", "--add-config", "retention.ms=1"], "UNKNOWN_TOPIC_OR_PARTITION"),
        (["--alter", "--broker", "1", "--add-config", "listeners=PLAINTEXT://:1"], "INVALID_CONFIG"),
        (["--describe", "--topic", "nosuch", "--all"], "UNKNOWN_TOPIC_OR_PARTITION"),
    ]
    for args, text in cases:
        r = kc(bs, *args)
        assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("Error: ") and text in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [
    ["--describe", "--topic", "t"],
    ["--describe", "--broker-logger", "1"],
    ["--alter", "--broker-logger", "1", "--add-config", "root=DEBUG"],
    ["--describe", "--ip", "10.0.0.1"],
    ["--alter", "--ip-defaults", "--add-config", "connection_creation_rate=5"],
])
def test_unreachable_cluster_is_one_line(args: list[str]) -> None:
    port = free_ports(1, "127.0.0.1")[0]
    r = subprocess.run([SCRIPT, "--bootstrap-server", f"127.0.0.1:{port}", "--timeout", "2", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("Error: "), r.stderr


def test_broker_catalog_is_kafkas_with_strata_departures() -> None:
    """The broker configs DescribeConfigs lists: Kafka 4.0's names, types and defaults (as checked
    against Kafka's config definitions), except where Strata runs with its own default."""
    from broker.config import QUEUED_MAX_REQUEST_BYTES
    from metadata.broker_defaults import BROKER_CATALOG, BROKER_DEFAULTS, STRATA_DEFAULTS
    from node.security import DEFAULT_MECHANISMS

    kafka = {  # name: (type, Kafka 4.0's default)
        "message.max.bytes": ("INT", "1048588"),
        "fetch.max.bytes": ("INT", "57671680"),
        "log.message.timestamp.after.max.ms": ("LONG", "3600000"),  # KIP-1030
        "log.retention.hours": ("INT", "168"),
        "log.cleaner.io.max.bytes.per.second": ("DOUBLE", "1.7976931348623157E308"),
        "offsets.topic.replication.factor": ("SHORT", "3"),
        "replica.lag.time.max.ms": ("LONG", "30000"),
        "leader.imbalance.check.interval.seconds": ("LONG", "300"),
        "group.initial.rebalance.delay.ms": ("INT", "3000"),
        "log.cleanup.policy": ("LIST", "delete"),
        "compression.gzip.level": ("INT", "-1"),
    }
    for name, want in kafka.items():
        assert BROKER_CATALOG[name] == want, name
    assert BROKER_DEFAULTS["queued.max.request.bytes"] == str(QUEUED_MAX_REQUEST_BYTES)
    assert BROKER_DEFAULTS["sasl.enabled.mechanisms"] == DEFAULT_MECHANISMS
    assert BROKER_DEFAULTS["num.recovery.threads.per.data.dir"] == "1"
    assert "sasl.mechanism.inter.broker.protocol" not in BROKER_DEFAULTS  # set, or the first enabled one
    assert set(STRATA_DEFAULTS) <= set(BROKER_CATALOG)


def test_ip_connection_quotas(bs: str) -> None:
    """ips: connection_creation_rate per IP or for the default IP, through Alter/DescribeClientQuotas."""
    assert ok(bs, "--alter", "--ip", "10.1.2.3", "--add-config", "connection_creation_rate=5") == [
        "Completed updating config for ip 10.1.2.3."]
    assert ok(bs, "--alter", "--entity-type", "ips", "--entity-default",
              "--add-config", "connection_creation_rate=100") == ["Completed updating default config for ips in the cluster."]
    assert ok(bs, "--describe", "--ip", "10.1.2.3") == ["Quota configs for ip '10.1.2.3' are connection_creation_rate=5.0"]
    assert ok(bs, "--describe", "--entity-type", "ips") == [
        "Quota configs for the default ip are connection_creation_rate=100.0",
        "Quota configs for ip '10.1.2.3' are connection_creation_rate=5.0"]
    ok(bs, "--alter", "--ip", "10.1.2.3", "--delete-config", "connection_creation_rate")
    assert ok(bs, "--describe", "--ip", "10.1.2.3") == []

    # enforced by the brokers: connections from 127.0.0.2 beyond 2 a second are closed at once,
    # other addresses are not held
    host, port = bs.split(",")[0].rsplit(":", 1)
    ok(bs, "--alter", "--ip", "127.0.0.2", "--add-config", "connection_creation_rate=2")

    def answered(source: str, n: int) -> int:
        """How many of n connections opened at once from `source` answer an ApiVersions."""
        socks, got = [], 0
        try:
            for _ in range(n):
                s = socket.socket()
                s.settimeout(5)
                s.bind((source, 0))
                s.connect((host, int(port)))
                socks.append(s)
            for s in socks:
                s.sendall(API_VERSIONS_V0)
            for s in socks:
                try:
                    got += len(s.recv(4)) == 4
                except OSError:
                    pass
        finally:
            for s in socks:
                s.close()
        return got

    eventually(lambda: _check(1 <= answered("127.0.0.2", 8) <= 3))
    assert answered("127.0.0.1", 8) == 8
    ok(bs, "--alter", "--ip", "127.0.0.2", "--delete-config", "connection_creation_rate")
    eventually(lambda: _check(answered("127.0.0.2", 8) == 8))
    ok(bs, "--alter", "--ip-defaults", "--delete-config", "connection_creation_rate")
    r = kc(bs, "--alter", "--ip", "10.1.2.3", "--delete-config", "connection_creation_rate")
    assert r.returncode == 1 and r.stderr.splitlines() == [
        "Error: Invalid config(s): connection_creation_rate (INVALID_CONFIG)"], r.stderr


def test_broker_loggers(bs: str) -> None:
    """broker-loggers: a broker's logger levels (BROKER_LOGGER resources) read and changed on that
    broker; a deleted level goes back to the parent's."""
    lines = ok(bs, "--describe", "--broker-logger", "1")
    assert lines[0] == "Dynamic configs for broker-logger 1 are:"
    entries = dict(re.fullmatch(r"  (\S+)=(\S+) sensitive=false synonyms=\{\}", line).groups() for line in lines[1:])
    assert entries["root"] == "INFO" and entries["broker.broker"] == "INFO", entries
    assert list(entries) == ["root", *sorted(set(entries) - {"root"})] or list(entries) == sorted(entries)
    assert ok(bs, "--alter", "--broker-logger", "1", "--add-config", "broker=DEBUG") == [
        "Completed updating config for broker-logger 1."]
    entries = dict(line.split()[0].strip().split("=") for line in ok(bs, "--describe", "--broker-logger", "1")[1:])
    assert entries["broker"] == "DEBUG" and entries["broker.broker"] == "DEBUG" and entries["root"] == "INFO"
    # the other broker is untouched: levels are per broker
    other = dict(line.split()[0].strip().split("=") for line in ok(bs, "--describe", "--broker-logger", "2")[1:])
    assert other["broker.broker"] == "INFO"
    ok(bs, "--alter", "--broker-logger", "1", "--delete-config", "broker")
    entries = dict(line.split()[0].strip().split("=") for line in ok(bs, "--describe", "--broker-logger", "1")[1:])
    assert entries["broker.broker"] == "INFO"
    # the root's level is every logger's without its own
    ok(bs, "--alter", "--broker-logger", "2", "--add-config", "root=WARN")
    other = dict(line.split()[0].strip().split("=") for line in ok(bs, "--describe", "--broker-logger", "2")[1:])
    assert other["root"] == "WARN" and other["broker.broker"] == "WARN"
    ok(bs, "--alter", "--broker-logger", "2", "--add-config", "root=INFO")
    bad = [
        (["--alter", "--broker-logger", "1", "--add-config", "no.such.logger=DEBUG"],
         "Invalid broker logger(s): no.such.logger"),
        (["--alter", "--broker-logger", "1", "--add-config", "root=LOUD"], "is not a supported log level"),
        (["--alter", "--broker-logger", "1", "--delete-config", "root"], "Removing the log level of the root logger"),
        (["--describe", "--broker-logger", "9"], "broker 9 is not a live broker"),
    ]
    for args, text in bad:
        r = kc(bs, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("Error: ") and text in r.stderr, (args, r.stderr)


def test_client_metrics_subscriptions(bs: str) -> None:
    """client-metrics (KIP-714 subscriptions) through IncrementalAlterConfigs of CLIENT_METRICS
    resources, stored as ConfigRecords; listed by kafka-configs.sh and kafka-python's
    list_config_resources (ListConfigResources v1) with the topics, brokers and groups."""
    from kafka import KafkaAdminClient

    create_topic(bs, "cm-topic")
    assert ok(bs, "--alter", "--entity-type", "client-metrics", "--entity-name", "cm-sub", "--add-config",
              "metrics=[org.apache.kafka.producer.,org.apache.kafka.consumer.],interval.ms=1000,"
              "match=[client_id=cm-.*,client_software_name=librdkafka]") == [
        "Completed updating config for client-metric cm-sub."]
    expect = ["Dynamic configs for client-metric cm-sub are:",
              "  interval.ms=1000 sensitive=false synonyms={}",
              "  match=client_id=cm-.*,client_software_name=librdkafka sensitive=false synonyms={}",
              "  metrics=org.apache.kafka.producer.,org.apache.kafka.consumer. sensitive=false synonyms={}"]
    assert ok(bs, "--describe", "--client-metrics", "cm-sub") == expect
    assert ok(bs, "--describe", "--entity-type", "client-metrics") == expect
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        listed = admin.list_config_resources()
        assert listed["client_metrics"] == ["cm-sub"], listed
        assert "cm-topic" in listed["topic"] and sorted(listed["broker"]) == ["1", "2"], listed
        assert admin.list_config_resources(["CLIENT_METRICS"]) == {"client_metrics": ["cm-sub"]}
    finally:
        admin.close()
    bad = [
        ("interval.ms=5", "interval.ms"),
        ("match=[colour=red]", "is not key=regex"),
        ("match=[client_id=(]", "is not a regular expression"),
        ("flavour=mint", "Unknown client metrics config name: flavour"),
    ]
    for config, text in bad:
        r = kc(bs, "--alter", "--client-metrics", "cm-sub", "--add-config", config)
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and text in r.stderr, (config, r.stderr)
    ok(bs, "--alter", "--client-metrics", "cm-sub", "--delete-config", "interval.ms,match,metrics")
    assert ok(bs, "--describe", "--entity-type", "client-metrics") == []


def test_logger_levels_filter_by_the_nearest_ancestor(capsys: pytest.CaptureFixture[str]) -> None:
    """What a BROKER_LOGGER change does in the process: a logger logs at its own level, else its
    package's, else the root's."""
    import structlog

    from node import logging as node_logging

    saved = structlog.get_config()  # the node's setup, for this test only: later tests print as before
    node_logging.configure("INFO")
    try:
        a, b = structlog.get_logger("pkg_t.mod_a"), structlog.get_logger("pkg_t.mod_b")
        a.debug("hidden_a")
        node_logging.levels.set("pkg_t", node_logging.LEVELS["DEBUG"])
        node_logging.levels.set("pkg_t.mod_b", node_logging.LEVELS["ERROR"])
        a.debug("shown_a")
        b.warning("hidden_b")
        b.error("shown_b")
        node_logging.levels.set("pkg_t.mod_b", None)  # DELETE: back to the package's level
        b.debug("shown_b_again")
        levels = node_logging.logger_levels()
        assert levels["root"] == "INFO" and levels["pkg_t"] == "DEBUG" and levels["pkg_t.mod_b"] == "DEBUG"
    finally:
        node_logging.levels.set("pkg_t", None)
        structlog.configure(**saved)
    err = capsys.readouterr().err
    assert "shown_a" in err and "shown_b" in err and "shown_b_again" in err
    assert "hidden_a" not in err and "hidden_b" not in err
