"""The broker's KIP-848 settings with real processes:

- a broker whose group.consumer.* or group.coordinator.rebalance.protocols settings Kafka's
  GroupCoordinatorConfig would refuse does not start: exit code 2 and one line naming the
  setting, never a traceback;
- a broker without `consumer` in group.coordinator.rebalance.protocols answers
  ConsumerGroupHeartbeat and ConsumerGroupDescribe with UNSUPPORTED_VERSION, as Kafka's
  KafkaApis; a librdkafka consumer with group.protocol=classic still reads through it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tools.cluster import Cluster, node_configs

pytestmark = pytest.mark.slow


def _broker_props(tmp: Path, extra: dict[str, str]) -> Path:
    props = node_configs(brokers=1, controller_ports={100: 1}, broker_ports={1: 2}, host_of=lambda _: "127.0.0.1",
                         bind_host_of=lambda _: "127.0.0.1", dir_of=lambda n: tmp / n, broker_overrides=extra)
    broker = next(v for v in props.values() if "broker" in v["process.roles"])
    path = tmp / "broker.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in broker.items()))
    return path


@pytest.mark.parametrize("extra, says", [
    ({"group.consumer.heartbeat.interval.ms": "500"},
     "group.consumer.heartbeat.interval.ms must be greater than or equal to group.consumer.min.heartbeat.interval.ms"),
    ({"group.consumer.assignors": "sticky"}, "group.consumer.assignors: unknown assignor 'sticky'"),
    ({"group.coordinator.rebalance.protocols": "consumer"}, "Disabling the 'classic' protocol is not supported"),
])
def test_bad_group_settings_stop_the_broker_with_one_line(tmp_path, extra, says):
    path = _broker_props(tmp_path, extra)
    p = subprocess.run([sys.executable, "-m", "broker", "--config", str(path)], capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in p.stderr, p.stderr


@pytest.fixture(scope="module")
def classic_only(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("classic-only"), brokers=1, verbose=False, broker_overrides={
        "group.coordinator.rebalance.protocols": "classic", "offsets.topic.num.partitions": 1,
        "offsets.topic.replication.factor": 1, "group.initial.rebalance.delay.ms": 0})
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


def test_consumer_protocol_disabled_answers_unsupported_version(classic_only):
    from confluent_kafka import Consumer, Producer

    from node.client import NodeClient
    from protocol.generated.consumer_group_describe import ConsumerGroupDescribeRequest as D
    from protocol.generated.consumer_group_heartbeat import ConsumerGroupHeartbeatRequest as H

    c = classic_only

    async def ask():
        async with NodeClient(c.host, c.broker_port(1), timeout=10) as cl:
            hb = await cl.request(H(group_id="g", member_id="m-1", member_epoch=0, rebalance_timeout_ms=30000,
                                    subscribed_topic_names=["t"], topic_partitions=[]), 1)
            d = await cl.request(D(group_ids=["g", "h"], include_authorized_operations=False), 1)
            return hb, d

    hb, d = asyncio.run(ask())
    assert hb.error_code == 35 and hb.error_message  # UNSUPPORTED_VERSION
    assert [g.error_code for g in d.groups] == [35, 35]

    # the classic protocol still serves
    p = Producer({"bootstrap.servers": c.bootstrap})
    for i in range(10):
        p.produce("classic-only", value=str(i).encode())
    assert p.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "classic", "group.protocol": "classic",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe(["classic-only"])
    got: list = []
    try:
        wait_for(lambda: got.extend(m for m in consumer.consume(10, 0.5) if m.error() is None) or len(got) >= 10,
                 60, "the classic consumer read the records")
        # the admin client describes the classic group all the same (librdkafka falls back from
        # ConsumerGroupDescribe to DescribeGroups)
        from confluent_kafka import ConsumerGroupType
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        d = admin.describe_consumer_groups(["classic"], request_timeout=10)["classic"].result(15)
        assert d.type == ConsumerGroupType.CLASSIC and len(d.members) == 1
    finally:
        consumer.close()
