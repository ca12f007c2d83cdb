"""KIP-966's first part: with `eligible.leader.replicas.enable` the active controller turns the
eligible.leader.replicas.version feature on, writing first what makes it safe (Kafka's
maybeGenerateElrSafetyRecords): a cluster-level min.insync.replicas from its static value, and
no broker-level one. A topic then describes min.insync.replicas as a dynamic cluster default (not
a default), which is what confluent-kafka-python's incremental_alter_configs test expects of
Kafka 4.1; a broker-level min.insync.replicas, or removing the cluster-level one, is refused.
Real processes, real clients."""

from __future__ import annotations

import subprocess

from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

from tests.conftest import installed_script, wait_for

SCRIPT = installed_script("kafka-configs.sh")


def _kc(bs: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, "--bootstrap-server", bs, *args], capture_output=True, text=True, timeout=60)


def test_elr_writes_the_cluster_min_isr_and_guards_it(cluster_factory) -> None:
    c = cluster_factory(brokers=1, controller_overrides={"eligible.leader.replicas.enable": "true",
                                                         "min.insync.replicas": "1"})
    bs = c.bootstrap
    wait_for(lambda: "event='elr_enabled'" in c.log_path(c.controller_ids[0]).read_text(), 20, "ELR turned on")
    admin = AdminClient(c.rdkafka_conf())
    for f in admin.create_topics([NewTopic("elr", 1, 1, config={"retention.ms": "60000"})]).values():
        f.result(timeout=30)
    res = ConfigResource(ResourceType.TOPIC, "elr")
    configs = wait_for(lambda: admin.describe_configs([res])[res].result(timeout=10), 20, "the topic's configs")
    entry = configs["min.insync.replicas"]
    assert (entry.value, entry.is_default, entry.source) == (
        "1", False, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value), entry
    assert sorted(str(e) for e in configs.values() if not e.is_default) == [
        'min.insync.replicas="1"', 'retention.ms="60000"']

    refused = [
        (["--entity-type", "brokers", "--entity-name", str(c.broker_ids[0]), "--add-config", "min.insync.replicas=1"],
         "Broker-level min.insync.replicas cannot be altered while ELR is enabled"),
        (["--entity-type", "brokers", "--entity-default", "--delete-config", "min.insync.replicas"],
         "Cluster-level min.insync.replicas cannot be removed while ELR is enabled"),
    ]
    for args, text in refused:
        r = _kc(bs, "--alter", *args)
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and text in r.stderr, (args, r.stderr)
    # the cluster-level value itself may change
    r = _kc(bs, "--alter", "--entity-type", "brokers", "--entity-default", "--add-config", "min.insync.replicas=2")
    assert r.returncode == 0, r.stderr
    r = _kc(bs, "--describe", "--entity-type", "brokers", "--entity-default")
    assert "  min.insync.replicas=2 sensitive=false" in r.stdout, r.stdout
    # written once: a restarted controller finds the feature on and writes nothing more
    c.restart(c.controller_ids[0])
    wait_for(lambda: c.active_controller(timeout=0.5), 20, "the controller back")
    assert c.log_path(c.controller_ids[0]).read_text().count("event='elr_enabled'") == 1
