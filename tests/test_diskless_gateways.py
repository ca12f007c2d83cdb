"""Diskless produce gateways (KIP-1164): 6 brokers in 3 racks, 2 diskless coordinators, producers
naming their rack (`client.rack`, and `diskless_az=<rack>` in client.id, which is what the broker
can see in Metadata). In the same run, first without gateways (`diskless.produce.gateways.enable`
false, a dynamic cluster-wide config: each producer writes every partition through one broker of
its rack), then with them: commit requests per WAL file, read from the brokers'
`diskless_file_committed` events, are at most n_racks with gateways (here exactly 1: each rack has a
broker per coordinator) and fewer than without. Metadata names a gateway of the partition's
coordinator in the client's rack as leader, and lists the gateways in PreferredProduceBrokers."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

from node.client import NodeClient
from protocol.generated.describe_configs import DescribeConfigsRequest
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsRequest
from protocol.generated.metadata import MetadataRequest
from tools.cluster import Cluster

TOPIC = "gw"
PARTITIONS = 8
RACKS = {1: "r1", 2: "r1", 3: "r2", 4: "r2", 5: "r3", 6: "r3"}
COORDINATORS = {"diskless.metadata.topic.num.partitions": "2"}
GATEWAYS_KEY = "diskless.produce.gateways.enable"
COMMITTED = re.compile(r"event='?diskless_file_committed'? .*?commit_requests=(\d+) remote_commit_requests=(\d+)")


def start_cluster(base: Path) -> Cluster:
    c = Cluster(base, brokers=len(RACKS),
                broker_overrides={**COORDINATORS, "diskless.wal.max.ms": "100"},
                controller_overrides=COORDINATORS,
                per_broker_overrides={b: {"broker.rack": r} for b, r in RACKS.items()})
    c.start()
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    fs = admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1,
                                       config={"diskless.enable": "true"})], operation_timeout=30)
    fs[TOPIC].result(60)
    return c


def set_gateways(c: Cluster, enabled: bool) -> None:
    """The cluster-wide dynamic default (broker resource "")."""
    IA = IncrementalAlterConfigsRequest

    async def run() -> None:
        async with NodeClient("127.0.0.1", c.broker_port(1)) as nc:
            resp = await nc.request(IA(resources=[IA.AlterConfigsResource(
                4, "", [IA.AlterableConfig(GATEWAYS_KEY, 0, str(enabled).lower())])]))
            assert resp.responses[0].error_code == 0, resp.responses[0].error_message

    asyncio.run(run())


def client_id(name: str, rack: str) -> str:
    return f"{name}-diskless_az={rack}"


async def _metadata(c: Cluster, broker: int, cid: str) -> Any:
    async with NodeClient("127.0.0.1", c.broker_port(broker), client_id=cid) as nc:
        return await nc.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC),
                                                        MetadataRequest.MetadataRequestTopic(name="__diskless_metadata")]),
                                12)


def metadata_view(c: Cluster, broker: int, cid: str) -> tuple[dict[int, tuple[int, list[int]]], dict[int, int], dict[int, str]]:
    """From one broker, for one client: partition -> (leader, PreferredProduceBrokers); coordinator
    -> its leader; broker -> rack."""
    md = asyncio.run(_metadata(c, broker, cid))
    by_name = {t.name: t for t in md.topics}
    parts = {p.partition_index: (p.leader_id, list(p.preferred_produce_brokers)) for p in by_name[TOPIC].partitions}
    coordinators = {p.partition_index: p.leader_id for p in by_name["__diskless_metadata"].partitions}
    return parts, coordinators, {b.node_id: b.rack for b in md.brokers}


def wait_for_mode(c: Cluster, enabled: bool, timeout: float = 30.0) -> None:
    """Every broker's metadata has the wanted `diskless.produce.gateways.enable`."""
    DC = DescribeConfigsRequest

    async def modes() -> list[str | None]:
        out = []
        for b in RACKS:
            async with NodeClient("127.0.0.1", c.broker_port(b)) as nc:
                r = await nc.request(DC(resources=[DC.DescribeConfigsResource(
                    resource_type=4, resource_name=str(b), configuration_keys=[GATEWAYS_KEY])]))
                found = [x.value for x in r.results[0].configs if x.name == GATEWAYS_KEY]
                out.append(found[0] if found else None)
        return out

    deadline = time.monotonic() + timeout
    while True:
        got = asyncio.run(modes())
        if all(m == str(enabled).lower() for m in got):
            return
        assert time.monotonic() < deadline, f"brokers did not switch gateways to {enabled}: {got}"
        time.sleep(0.2)


def log_offsets(c: Cluster) -> dict[int, int]:
    return {b: c.log_path(b).stat().st_size for b in RACKS}


def commit_requests_per_file(c: Cluster, since: dict[int, int]) -> list[tuple[int, int, int]]:
    """(broker, commit requests, remote commit requests) of every WAL file committed since `since`."""
    out = []
    for b in RACKS:
        with open(c.log_path(b), "rb") as f:
            f.seek(since[b])
            for line in f.read().decode(errors="replace").splitlines():
                m = COMMITTED.search(line)
                if m:
                    out.append((b, int(m.group(1)), int(m.group(2))))
    return out


def produce(c: Cluster, tag: str, per_producer: int, producers_per_rack: int = 2) -> None:
    """Producers in every rack (each bootstrapping from a broker of its rack) write `per_producer`
    keyed messages each over every partition, all at once."""
    from confluent_kafka import Producer

    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    ps = []
    for rack in sorted(set(RACKS.values())):
        home = next(b for b, r in RACKS.items() if r == rack)
        for i in range(producers_per_rack):
            ps.append(Producer({"bootstrap.servers": f"127.0.0.1:{c.broker_port(home)}",
                                "client.id": client_id(f"{tag}-{rack}-{i}", rack), "client.rack": rack,
                                "linger.ms": 5, "acks": "all"}))
    for n in range(per_producer):
        for j, p in enumerate(ps):
            while True:
                try:
                    p.produce(TOPIC, key=f"k{n % 64}-{j}".encode(), value=f"{tag}-{j}-{n}".encode(),
                              on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.01)
            p.poll(0)
        if n % 200 == 0:
            time.sleep(0.01)  # spread over several WAL files
    for p in ps:
        assert p.flush(60) == 0
    assert not errors, errors[:3]


def measure(c: Cluster, enabled: bool, per_producer: int) -> list[tuple[int, int, int]]:
    set_gateways(c, enabled)
    wait_for_mode(c, enabled)
    since = log_offsets(c)
    produce(c, "gw" if enabled else "any", per_producer)
    return commit_requests_per_file(c, since)


def test_gateways_cut_commit_requests_per_file(tmp_path: Path) -> None:
    c = start_cluster(tmp_path / "cluster")
    try:
        n_racks = len(set(RACKS.values()))
        without = measure(c, False, 1500)
        with_gw = measure(c, True, 1500)
        assert without and with_gw
        parts, coordinators, racks = metadata_view(c, 1, client_id("check", "r2"))
        # Metadata: for a client in r2, each partition's leader is a gateway in r2, listed first in
        # PreferredProduceBrokers; a coordinator's own broker is its gateway in its rack
        for leader, preferred in parts.values():
            assert racks[leader] == "r2" and preferred and preferred[0] == leader
        distinct = len(set(coordinators.values())) == 2
        if distinct:
            from confluent_kafka.admin import AdminClient

            md = AdminClient({"bootstrap.servers": c.bootstrap}).list_topics(TOPIC, timeout=15)
            assert md.topics[TOPIC].partitions  # stock clients read the answer (tagged field skipped)
            for co in coordinators.values():
                if racks[co] == "r2":
                    assert any(p[0] == co for p in parts.values())
        per_file_with = [n for _, n, _ in with_gw]
        per_file_without = [n for _, n, _ in without]
        assert max(per_file_with) <= n_racks
        # every broker is the gateway of one coordinator broker: one commit request per file
        assert max(per_file_with) == 1, with_gw
        if distinct:  # (co-located coordinators need one request per file either way)
            # without gateways a file holds partitions of both coordinators
            assert sum(per_file_without) / len(per_file_without) > 1.5, without
            assert sum(per_file_with) / len(per_file_with) < sum(per_file_without) / len(per_file_without)
    finally:
        c.stop()


def _serves(table: dict[tuple[Any, int], list[int]], leaders: dict[int, int]) -> dict[int, set[int]]:
    """broker -> the coordinator brokers it is a gateway for (its commit requests per WAL file)."""
    out: dict[int, set[int]] = {}
    for (_, index), gws in table.items():
        for b in gws:
            out.setdefault(b, set()).add(leaders[index])
    return out


def test_gateway_table_follows_the_seed_scenarios() -> None:
    """KIP-1164's scenarios (3 racks, 12 coordinators on distinct brokers): gateways per
    coordinator per rack = max(1, n_brokers / 12 / 3); commit requests per file of a broker
    (coordinator brokers it serves) as KIP-1164 counts them; co-located coordinators get
    co-located gateways (at most n_racks requests per file with 2 brokers per rack)."""
    from broker.diskless.gateways import gateway_table

    for n_brokers, per_rack, most in ((3, 1, 12), (6, 1, 6), (12, 1, 3), (24, 1, 2), (36, 1, 1), (108, 3, 1)):
        racks = {b: f"r{b % 3}" for b in range(n_brokers)}
        leaders = {i: i % n_brokers for i in range(12)}
        table = gateway_table(racks, leaders)
        assert all(len(table[(r, i)]) == per_rack for r in set(racks.values()) for i in leaders), n_brokers
        assert all(racks[b] == r for (r, _), gws in table.items() for b in gws)
        serves = _serves(table, leaders)
        assert set(serves) == set(racks)  # every broker is a gateway
        assert max(len(s) for s in serves.values()) <= most, (n_brokers, serves)
        # a coordinator's own broker is its gateway in its rack
        assert all(leaders[i] in table[(racks[leaders[i]], i)] for i in leaders)
    # 12 coordinators co-located on 3 brokers, 6 brokers in 3 racks
    racks = {b: f"r{b % 3}" for b in range(6)}
    leaders = {i: i % 3 for i in range(12)}
    serves = _serves(gateway_table(racks, leaders), leaders)
    assert max(len(s) for s in serves.values()) <= 3
