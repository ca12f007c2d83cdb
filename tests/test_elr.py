"""KIP-966's first part: with `eligible.leader.replicas.enable` the active controller turns the
eligible.leader.replicas.version feature on, writing first what makes it safe (Kafka's
maybeGenerateElrSafetyRecords): a cluster-level min.insync.replicas from its static value, and
no broker-level one. A topic then describes min.insync.replicas as a dynamic cluster default (not
a default), which is what confluent-kafka-python's incremental_alter_configs test expects of
Kafka 4.1; a broker-level min.insync.replicas, or removing the cluster-level one, is refused.

Then the ELR itself, as Kafka 4.x's controller keeps it: replicas that were in the ISR when it
shrank below min.insync.replicas join the ELR; when the ISR empties the leader is elected from
the ELR (clean); a broker back without a clean shutdown leaves the ELR; the last leader is kept
in LastKnownElr and leads again if nobody eligible is left; an unclean election comes only after
them and clears them; a new min.insync.replicas clears them; a cleanly restarted broker stays
eligible and a killed one does not; kafka-topics.sh --describe prints Elr and LastKnownElr. Real
processes, real clients."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

from protocol.errors import Errors
from protocol.generated.broker_registration import BrokerRegistrationRequest as BR
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsRequest as IA
from tests.conftest import installed_script, wait_for
from tests.test_controller import HOST, cluster_id_of, connect, create, heartbeat, run, start_brokers, topic
from tests.test_controller_replication import LONG_SESSION, alter_isr, controllers, elect, part, wait_image

SCRIPT = installed_script("kafka-configs.sh")
TOPICS = installed_script("kafka-topics.sh")
FEATURES = installed_script("kafka-features.sh")
ELR_FEATURE = "eligible.leader.replicas.version"
__all__ = ["controllers"]  # the fixture, shared with the controller's replication tests


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


async def register(cl, broker_id: int, cluster_id: str, previous_epoch: int = -1):
    """A broker's new process registering: `previous_epoch` names the session it shut down
    cleanly (KIP-966), -1 for none."""
    return await cl.request(BR(
        broker_id=broker_id, cluster_id=cluster_id, incarnation_id=uuid.uuid4(),
        listeners=[BR.Listener("PLAINTEXT", HOST, 9000 + broker_id, 0)],
        log_dirs=[uuid.uuid5(uuid.NAMESPACE_OID, f"broker-{broker_id}")], previous_broker_epoch=previous_epoch))


def _state(p) -> tuple:
    return p.leader, p.isr, p.elr, p.last_known_elr


def _elr_controller(controllers):
    """A controller with ELR on (min ISR 2, long sessions)."""
    return controllers(broker_session_timeout_ms=LONG_SESSION, eligible_leader_replicas_enable="true",
                       min_insync_replicas=2).start()


async def _brokers_and_topic(c, name: str):
    """Brokers 1-3 registered and unfenced, topic `name` on [1, 2, 3]: (client, epochs, partition 0)."""
    cl = await connect(c)
    await wait_image(cl, lambda i: i.features.get(ELR_FEATURE) == 1)
    ep = await start_brokers(cl, {1: None, 2: None, 3: None})
    await create(cl, topic(name, assignments=[[1, 2, 3]]))
    return cl, ep, await part(cl, name)


def test_elr_kept_and_elected_by_the_controller(controllers) -> None:
    c = _elr_controller(controllers)

    async def main():
        cl, ep, p = await _brokers_and_topic(c, "e")
        # 3 leaves while the ISR is still at min ISR: not eligible; 2 leaves below it: eligible
        assert (await alter_isr(cl, 1, ep[1], p, [1, 2]))[1].error_code == 0
        assert _state(p := await part(cl, "e")) == (1, (1, 2), (), ())
        assert (await alter_isr(cl, 1, ep[1], p, [1]))[1].error_code == 0
        assert _state(await part(cl, "e")) == (1, (1,), (2,), ())
        # the leader is fenced, the ISR empties: 2 is elected from the ELR, 1 joins it
        assert (await heartbeat(cl, 1, ep[1], 10**9, want_fence=True)).is_fenced
        assert _state(await part(cl, "e")) == (2, (2,), (1,), ())
        # 2 is fenced too: nobody eligible is up; the ISR stays empty, 2 is the last known leader
        assert (await heartbeat(cl, 2, ep[2], 10**9, want_fence=True)).is_fenced
        assert _state(await part(cl, "e")) == (-1, (), (1, 2), (2,))
        # 1 comes back without a clean shutdown (no previous epoch): it leaves the ELR
        cid = await cluster_id_of(cl)
        r = await register(cl, 1, cid)
        assert r.error_code == 0
        ep[1] = r.broker_epoch
        assert _state(await part(cl, "e")) == (-1, (), (2,), (2,))
        # 2 comes back after a clean shutdown (it names its last epoch): it stays eligible...
        r = await register(cl, 2, cid, previous_epoch=ep[2])
        assert r.error_code == 0
        assert _state(await part(cl, "e")) == (-1, (), (2,), (2,))
        # ...then after an unclean one it is not; the last known leader still leads when back
        r = await register(cl, 2, cid)
        ep[2] = r.broker_epoch
        assert _state(await part(cl, "e")) == (-1, (), (), (2,))
        assert not (await heartbeat(cl, 2, ep[2], 10**9)).is_fenced
        assert _state(p := await part(cl, "e")) == (2, (2,), (), ())
        # 1 is unfenced and catches up; the ISR shrinks below min ISR again, then a new
        # min.insync.replicas for the topic clears the ELR it was kept against
        assert not (await heartbeat(cl, 1, ep[1], 10**9)).is_fenced
        assert (await alter_isr(cl, 2, ep[2], p, [2, 1, 3]))[1].error_code == 0
        assert _state(p := await part(cl, "e")) == (2, (2, 1, 3), (), ())
        assert (await alter_isr(cl, 2, ep[2], p, [2]))[1].error_code == 0
        assert _state(await part(cl, "e")) == (2, (2,), (1, 3), ())
        res = IA.AlterConfigsResource(2, "e", [IA.AlterableConfig("min.insync.replicas", 0, "1")])
        assert (await cl.request(IA(resources=[res]))).responses[0].error_code == 0
        assert _state(await part(cl, "e")) == (2, (2,), (), ())
        await cl.close()

    run(main())


def test_unclean_election_comes_after_the_elr_and_clears_it(controllers) -> None:
    """With every eligible replica fenced, the partition waits (unclean.leader.election.enable is
    off); kafka-leader-election.sh's UNCLEAN election then takes a live replica outside the ELR,
    which becomes the ISR, and the ELR and last known leader are cleared."""
    c = _elr_controller(controllers)

    async def main():
        cl, ep, p = await _brokers_and_topic(c, "u")
        assert (await alter_isr(cl, 1, ep[1], p, [1, 2]))[1].error_code == 0
        for b in (2, 1):
            assert (await heartbeat(cl, b, ep[b], 10**9, want_fence=True)).is_fenced
        assert _state(await part(cl, "u")) == (-1, (), (1, 2), (1,))
        assert (await elect(cl, 0, {"u": [0]}))[1][("u", 0)][0] == Errors.PREFERRED_LEADER_NOT_AVAILABLE
        assert (await elect(cl, 1, {"u": [0]}))[1][("u", 0)] == (0, None)
        assert _state(await part(cl, "u")) == (3, (3,), (), ())
        await cl.close()

    run(main())


def _partition_row(bs: str, name: str) -> dict[str, str]:
    """kafka-topics.sh --describe's line for partition 0, as {field: value}."""
    r = subprocess.run([TOPICS, "--bootstrap-server", bs, "--describe", "--topic", name],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("\tTopic: "))
    fields = [f.partition(": ") for f in line.strip("\t").split("\t")]
    return {k.rstrip(":"): v for k, _, v in fields}


def _elr_topic(cluster_factory, brokers: int, assignment: str, *, fast_sessions: bool = False):
    """A cluster with ELR on and min.insync.replicas 2 whose topic `e` sits on `assignment`; the
    last broker answers the tools. Returns (cluster, its bootstrap, reaches(**fields) waiting for
    partition e-0's kafka-topics.sh row to show those fields)."""
    fast = ({"broker_overrides": {"broker.heartbeat.interval.ms": "300"}} if fast_sessions else {})
    c = cluster_factory(brokers=brokers, controller_overrides={
        "eligible.leader.replicas.enable": "true", "min.insync.replicas": "2",
        **({"broker.session.timeout.ms": "2500"} if fast_sessions else {})}, **fast)
    wait_for(lambda: "event='elr_enabled'" in c.log_path(c.controller_ids[0]).read_text(), 20, "ELR turned on")
    bs = f"{c.host}:{c.broker_port(brokers)}"
    r = subprocess.run([TOPICS, "--bootstrap-server", bs, "--create", "--topic", "e", "--replica-assignment", assignment],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr

    def reaches(**want: str) -> dict[str, str]:
        def check() -> dict[str, str] | None:
            row = _partition_row(bs, "e")
            return row if all(row.get(k) == v for k, v in want.items()) else None
        return wait_for(check, 30, f"partition e-0 with {want}")

    return c, bs, reaches


def test_elr_described_by_kafka_topics_and_elected_when_the_isr_empties(cluster_factory) -> None:
    """Brokers 1-3 hold the partition (min ISR 2) and stall (SIGSTOP) one after the other past
    their sessions; broker 4 answers the tool. The ELR fills as the ISR drops below min ISR, the
    ISR empties with the last leader known, and the first eligible broker to wake leads."""
    c, bs, reaches = _elr_topic(cluster_factory, 4, "1:2:3", fast_sessions=True)
    row = reaches(Leader="1", Isr="1,2,3")
    assert (row["Elr"], row["LastKnownElr"]) == ("", "")
    groups = {b: os.getpgid(c.pid(b)) for b in (1, 2, 3)}
    paused: list[int] = []
    try:
        for b in (3, 2, 1):
            os.killpg(groups[b], signal.SIGSTOP)
            paused.append(b)
            if b == 3:  # the ISR is still at min ISR: 3 is not eligible
                reaches(Leader="1", Isr="1,2", Elr="", LastKnownElr="")
            elif b == 2:
                reaches(Leader="1", Isr="1", Elr="2", LastKnownElr="")
        reaches(Leader="none", Isr="", Elr="1,2", LastKnownElr="1")
        os.killpg(groups[2], signal.SIGCONT)
        paused.remove(2)
        # 2 was eligible: a clean election, though unclean.leader.election.enable is off
        reaches(Leader="2", Isr="2", Elr="1", LastKnownElr="")
        # the operator's lever on the ELR: a new min.insync.replicas clears it
        r = _kc(bs, "--alter", "--entity-type", "topics", "--entity-name", "e", "--add-config", "min.insync.replicas=1")
        assert r.returncode == 0, r.stderr
        reaches(Leader="2", Isr="2", Elr="", LastKnownElr="")
    finally:
        for b in paused:
            os.killpg(groups[b], signal.SIGCONT)


def test_a_clean_restart_stays_eligible_and_a_crash_does_not(cluster_factory) -> None:
    """Brokers 1 and 2 hold the partition (min ISR 2); broker 3 answers the tool. A broker stopped
    with SIGTERM names its last epoch in its dirs' clean shutdown markers and registers with it, so
    it stays in the ELR and leads when it is back first; one killed (-9) names none and leaves the
    ELR, so the partition waits for the other, still eligible, broker."""
    c, bs, reaches = _elr_topic(cluster_factory, 3, "1:2")
    reaches(Leader="1", Isr="1,2", Elr="")
    c.terminate(2)
    reaches(Leader="1", Isr="1", Elr="2")
    c.terminate(1)
    reaches(Leader="none", Isr="", Elr="1,2", LastKnownElr="1")
    c.start_node(2)  # clean: still eligible, so it leads though 1 was the last leader
    reaches(Leader="2", Isr="2", Elr="1", LastKnownElr="")
    c.kill(2)
    reaches(Leader="none", Isr="", Elr="1,2", LastKnownElr="2")
    c.start_node(2)  # crashed: it leaves the ELR and may not lead while 1 is eligible
    reaches(Leader="none", Isr="", Elr="1", LastKnownElr="2")
    c.start_node(1)
    row = reaches(Leader="1")
    assert row["Isr"] in ("1", "1,2") and row["Elr"] == "", row  # 2 may have caught up already


def test_elr_fields_replay_and_survive_a_snapshot() -> None:
    """The image keeps both fields from PartitionRecord and PartitionChangeRecord (null: unchanged),
    and a snapshot writes them back, through the records' encoding."""
    from controller.snapshots import image_records
    from metadata import MetadataDelta, MetadataImage
    from metadata.records import decode_record, encode_record
    from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord
    from protocol.generated.metadata_records.partition_record import PartitionRecord
    from protocol.generated.metadata_records.topic_record import TopicRecord

    tid = uuid.uuid4()
    delta = MetadataDelta(MetadataImage.EMPTY)
    for i, rec in enumerate([
        TopicRecord(name="t", topic_id=tid),
        PartitionRecord(partition_id=0, topic_id=tid, replicas=[1, 2, 3], isr=[1], leader=1, leader_epoch=0, partition_epoch=0,
                        eligible_leader_replicas=[2, 3]),
        PartitionChangeRecord(partition_id=0, topic_id=tid, isr=[], leader=-1, eligible_leader_replicas=[1, 2, 3],
                              last_known_elr=[1]),
        PartitionChangeRecord(partition_id=0, topic_id=tid, eligible_leader_replicas=[2, 3]),  # last known kept
    ]):
        delta.replay(decode_record(encode_record(rec))[0], i)
    image = delta.apply()
    p = image.partition("t", 0)
    assert p is not None and (p.isr, p.elr, p.last_known_elr, p.partition_epoch) == ((), (2, 3), (1,), 2)
    again = MetadataDelta(MetadataImage.EMPTY)
    for i, rec in enumerate(image_records(image)):
        again.replay(decode_record(encode_record(rec))[0], i)
    assert again.apply().partition("t", 0) == p


def test_the_high_watermark_waits_for_min_isr(cluster_factory) -> None:
    """KIP-966's strict min ISR: with ELR on, a record written with acks=1 while the ISR is below
    min.insync.replicas is acknowledged but stays above the high watermark (unreadable) until the
    ISR is back at min ISR; an election from the ELR meanwhile could otherwise lose a record a
    consumer had read."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    c, bs, reaches = _elr_topic(cluster_factory, 3, "1:2", fast_sessions=True)
    reaches(Isr="1,2")
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "hw"})

    def high() -> int:
        return int(consumer.get_watermark_offsets(TopicPartition("e", 0), timeout=10)[1])

    def send(value: bytes) -> int:
        p = Producer({"bootstrap.servers": bs, "acks": "1"})
        got: list = []
        p.produce("e", value, partition=0, on_delivery=lambda e, m: got.append((e, m.offset())))
        assert p.flush(30) == 0 and got and got[0][0] is None, got
        return int(got[0][1])

    try:
        assert send(b"a") == 0
        wait_for(lambda: high() == 1, 20, "high watermark 1")
        group = os.getpgid(c.pid(2))
        os.killpg(group, signal.SIGSTOP)
        try:
            reaches(Isr="1")
            assert send(b"b") == 1  # acknowledged (acks=1) ...
            assert high() == 1  # ... but not readable while the ISR is below min ISR
        finally:
            os.killpg(group, signal.SIGCONT)
        wait_for(lambda: high() == 2, 30, "high watermark 2 once broker 2 is back in the ISR")
    finally:
        consumer.close()


def _features(bs: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FEATURES, "--bootstrap-server", bs, *args], capture_output=True, text=True, timeout=60)


def _described(bs: str) -> dict[str, dict[str, str]]:
    r = _features(bs, "describe")
    assert r.returncode == 0, r.stderr
    out = {}
    for line in r.stdout.splitlines():
        fields = dict(part.split(": ", 1) for part in line.split("\t"))
        out[fields.pop("Feature")] = fields
    return out


def test_kafka_features_describes_and_turns_elr_on_and_off(cluster_factory) -> None:
    """kafka-features.sh (UpdateFeatures through a broker to the controller, ApiVersions' feature
    fields): metadata.version is finalized at 4.0-IV3 and fixed; eligible.leader.replicas.version
    goes 0 -> 1 (a dry run first changes nothing), which makes the controller write the ELR
    safety records and keep ELRs, and back to 0 with disable, which clears every partition's ELR."""
    c = cluster_factory(brokers=4, controller_overrides={"min.insync.replicas": "2", "broker.session.timeout.ms": "2500"},
                        broker_overrides={"broker.heartbeat.interval.ms": "300"})
    bs = f"{c.host}:{c.broker_port(4)}"  # broker 4 answers the tools; brokers 1-3 hold the topic
    d = _described(bs)
    assert d["metadata.version"] == {"SupportedMinVersion": "3.3-IV3", "SupportedMaxVersion": "4.0-IV3",
                                     "FinalizedVersionLevel": "4.0-IV3", "Epoch": d["metadata.version"]["Epoch"]}
    assert int(d["metadata.version"]["Epoch"]) >= 0
    assert d[ELR_FEATURE]["FinalizedVersionLevel"] == "-" and d[ELR_FEATURE]["SupportedMaxVersion"] == "1"

    r = _features(bs, "upgrade", "--feature", f"{ELR_FEATURE}=1", "--dry-run")
    assert (r.returncode, r.stdout.strip()) == (0, f"{ELR_FEATURE} can be upgraded to 1."), r.stderr
    assert _described(bs)[ELR_FEATURE]["FinalizedVersionLevel"] == "-"
    r = _features(bs, "upgrade", "--feature", f"{ELR_FEATURE}=1")
    assert (r.returncode, r.stdout.strip()) == (0, f"{ELR_FEATURE} was upgraded to 1."), r.stderr
    wait_for(lambda: _described(bs)[ELR_FEATURE]["FinalizedVersionLevel"] == "1", 20, "ELR finalized at 1")
    assert "event='elr_enabled'" in c.log_path(c.controller_ids[0]).read_text()

    # ELR at work: the ISR shrinking below min.insync.replicas keeps the dropped replica eligible
    r = subprocess.run([TOPICS, "--bootstrap-server", bs, "--create", "--topic", "e", "--replica-assignment", "1:2:3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: _partition_row(bs, "e").get("Isr") == "1,2,3", 30, "the topic's full ISR")
    groups = {b: os.getpgid(c.pid(b)) for b in (2, 3)}
    try:
        for b in (3, 2):
            os.killpg(groups[b], signal.SIGSTOP)
            wait_for(lambda b=b: _partition_row(bs, "e").get("Isr") == ("1,2" if b == 3 else "1"), 30, f"{b} out")
        assert _partition_row(bs, "e")["Elr"] == "2"
    finally:
        for g in groups.values():
            os.killpg(g, signal.SIGCONT)

    refused = _features(bs, "upgrade", "--feature", "metadata.version=4.1-IV1")
    assert refused.returncode == 1 and refused.stdout.startswith("Could not upgrade metadata.version to 4.1-IV1."), (
        refused.stdout, refused.stderr)
    assert refused.stderr.strip() == "Error: 1 out of 1 operation(s) failed."
    lower = _features(bs, "upgrade", "--feature", f"{ELR_FEATURE}=0")
    assert lower.returncode == 1 and "needs a downgrade" in lower.stdout, lower.stdout
    unknown = _features(bs, "upgrade", "--feature", "group.version=1")
    assert unknown.returncode == 1 and "not supported by Strata" in unknown.stdout, unknown.stdout
    bad = _features(bs, "upgrade", "--feature", f"{ELR_FEATURE}=x")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "whole number" in bad.stderr, bad.stderr

    r = _features(bs, "disable", "--feature", ELR_FEATURE)
    assert (r.returncode, r.stdout.strip()) == (0, f"{ELR_FEATURE} was disabled."), r.stderr
    wait_for(lambda: _described(bs)[ELR_FEATURE]["FinalizedVersionLevel"] == "-", 20, "ELR off")
    assert _partition_row(bs, "e")["Elr"] == "", "disabling ELR clears every partition's ELR"
