"""Diskless topics in operation (KIP-1164).

- Retention on a diskless topic empties object storage (SeaweedFS) of every file whose batches all
  expired, files holding partitions of two coordinators included: the first owner hands each file
  to the second, which deletes it after the grace period (the bucket is listed before and after).
- DeleteRecords (kafka-python's admin) and topic deletion (confluent-kafka's admin) on a diskless
  topic: the log start moves, and the files of a deleted topic leave the store.
- A broker kill -9ed after an upload and before its commit leaves an orphan; the scan deletes it
  after its grace period while consumers read the referenced files, which all stay.
- kafka-diskless.sh describes coordinators, files (owners, live batches, status) and orphans; the
  leaders log per-coordinator gauges.
- A coordinator's leader killed while its files wait out their deletion grace: the new leader
  deletes them.
- A file its first owner never knew (that commit failed) is taken over by the next owner.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST_FENCING, wait_for
from tests.s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3, s3_server  # noqa: F401
from tools.cluster import Cluster

RACKS = {1: "r1", 2: "r2", 3: "r3"}
COORDINATORS = {"diskless.metadata.topic.num.partitions": "2"}
PARTITIONS = 4  # partitions i and i+1 map to different coordinators (crc32(topic id) + i mod 2)


def _overrides(store_url: str, **extra: str) -> dict[str, str]:
    return {**COORDINATORS, "diskless.wal.max.ms": "100", "diskless.storage.url": store_url,
            "log.retention.check.interval.ms": "300", "diskless.coordinator.file.deletion.grace.ms": "500",
            "diskless.coordinator.orphan.scan.interval.ms": "500",
            "diskless.coordinator.orphan.scan.grace.period.ms": "2000", "broker.heartbeat.interval.ms": "500",
            "diskless.coordinator.gauges.interval.ms": "500", **extra}


def _cluster(tmp_path: Path, overrides: dict[str, str]) -> Cluster:
    c = Cluster(tmp_path / "cluster", brokers=3, broker_overrides=overrides,
                controller_overrides={**COORDINATORS, **FAST_FENCING},
                per_broker_overrides={b: {"broker.rack": r} for b, r in RACKS.items()})
    c.start()
    return c


def _create_topic(bootstrap: str, name: str, **config: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1,
                                       config={"diskless.enable": "true", **config})], operation_timeout=30)
    fs[name].result(60)


def _produce(bootstrap: str, topic: str, n: int, client_id: str = "writer-diskless_az=r1") -> None:
    """n messages spread over every partition in the same WAL files (one producer, one broker)."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 20, "acks": "all"})
    for i in range(n):
        p.produce(topic, value=f"m{i}".encode(), partition=i % PARTITIONS,
                  on_delivery=lambda err, _msg: errors.append(err) if err else None)
        if i % 50 == 49:
            p.flush(30)
    assert p.flush(60) == 0
    assert not errors, errors


def _read(bootstrap: str, topic: str, client_id: str) -> list[bytes]:
    """Every message of the topic from its log start (kafka-python), in partition order."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=100)
    tps = [TopicPartition(topic, i) for i in range(PARTITIONS)]
    c.assign(tps)
    end = c.end_offsets(tps)
    c.seek_to_beginning()
    got: dict[int, list[bytes]] = {i: [] for i in range(PARTITIONS)}
    deadline = time.time() + 30
    while any(c.position(tp) < end[tp] for tp in tps) and time.time() < deadline:
        for tp, recs in c.poll(timeout_ms=200).items():
            got[tp.partition] += [r.value for r in recs]
    c.close()
    return [v for i in range(PARTITIONS) for v in got[i]]


def _offsets(bootstrap: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, client_id="offsets-diskless_az=r2")
    tps = [TopicPartition(topic, i) for i in range(PARTITIONS)]
    try:
        begin, end = c.beginning_offsets(tps), c.end_offsets(tps)
    finally:
        c.close()
    return {tp.partition: o for tp, o in begin.items()}, {tp.partition: o for tp, o in end.items()}


def _tool(bootstrap: str, *args: str) -> dict[str, Any]:
    """kafka-diskless.sh --describe --json (this tree's, as the installed script runs it)."""
    r = subprocess.run([sys.executable, "-m", "tools.kafka_diskless", "--bootstrap-server", bootstrap, "--describe",
                        "--json", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)



def _local_keys(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")}


def _s3_keys(s3: SeaweedS3) -> set[str]:
    from broker.diskless.object_store import S3ObjectStore

    store = S3ObjectStore(s3.bucket, endpoint=s3.endpoint, region="us-east-1", access_key_id=ACCESS_KEY,
                          secret_access_key=SECRET_KEY)
    return {o.key for o in asyncio.run(store.list(""))}


def test_retention_empties_the_bucket_across_two_owners(tmp_path: Path, s3_server: SeaweedS3,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    c = _cluster(tmp_path, _overrides(f"s3://{s3_server.bucket}/wal", **{
        "diskless.storage.s3.endpoint": s3_server.endpoint, "diskless.storage.s3.region": "us-east-1"}))
    try:
        _create_topic(c.bootstrap, "ret")
        _produce(c.bootstrap, "ret", 400)
        before = _s3_keys(s3_server)
        print(f"bucket {s3_server.bucket} after producing: {len(before)} objects\n  " + "\n  ".join(sorted(before)))
        assert before
        view: dict[str, Any] = {}

        def listed() -> bool:  # every object is a committed file (the listing reads SQLite after its applies)
            view.update(_tool(c.bootstrap, "--files", "--coordinators"))
            return {f["key"] for f in view["files"]} == before

        wait_for(what="the tool to list every object", pred=listed)
        shared = {f["key"] for f in view["files"] if len(f["owners"]) == 2}
        assert shared, f"no file holds partitions of both coordinators: {view['files']}"
        assert all(f["status"] == "live" for f in view["files"])

        from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        time.sleep(1.2)  # every batch is older than the retention.ms set now
        res = ConfigResource("topic", "ret", incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(30)

        wait_for(what="retention to empty the bucket", pred=lambda: not _s3_keys(s3_server))
        print(f"bucket {s3_server.bucket} after retention: {sorted(_s3_keys(s3_server))} (empty)")
        begin, end = _offsets(c.bootstrap, "ret")
        assert begin == end and sum(end.values()) == 400, (begin, end)

        def all_deleted() -> bool:  # the status is written just after the object's deletion
            view.update(_tool(c.bootstrap))
            return sum(r.get("files_deleted", 0) for r in view["coordinators"]) == len(before)

        wait_for(what="every file's status to say deleted", pred=all_deleted)
        by_key: dict[str, set[str]] = {}
        for f in view["files"]:
            by_key.setdefault(f["key"], set()).add(f["status"])
        # one owner of a shared file handed it over, the other deleted it; a deleted file is then
        # pruned from its coordinator's state (only the handover is left to list)
        assert by_key == {key: {"handed-over"} for key in shared}, by_key
        assert sum(r["files_handed_over"] for r in view["coordinators"]) == len(shared)
        assert all(r["live_files"] == 0 and r["pending_deletions"] == 0 for r in view["coordinators"])
    finally:
        c.stop()


def test_delete_records_and_topic_deletion_with_stock_clients(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    c = _cluster(tmp_path, _overrides(f"file://{objects}", **{"log.retention.check.interval.ms": "60000"}))
    try:
        _create_topic(c.bootstrap, "dr")
        _produce(c.bootstrap, "dr", 200)
        _, end = _offsets(c.bootstrap, "dr")
        assert end == {i: 50 for i in range(PARTITIONS)}

        from kafka import TopicPartition
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=c.bootstrap, client_id="admin-diskless_az=r2")
        try:
            low = admin.delete_records({TopicPartition("dr", 0): 20, TopicPartition("dr", 1): -1,
                                        TopicPartition("dr", 2): 50})
        finally:
            admin.close()
        assert {tp.partition: v["low_watermark"] for tp, v in low.items()} == {0: 20, 1: 50, 2: 50}
        from confluent_kafka import TopicPartition as CTopicPartition
        from confluent_kafka.admin import AdminClient

        deleter = AdminClient({"bootstrap.servers": c.bootstrap, "client.id": "cadmin-diskless_az=r3"})
        futures = deleter.delete_records([CTopicPartition("dr", 3, 10)], operation_timeout=30)
        assert [f.result(30).low_watermark for f in futures.values()] == [10]  # librdkafka's admin too
        begin, _ = _offsets(c.bootstrap, "dr")
        assert begin == {0: 20, 1: 50, 2: 50, 3: 10}
        got = _read(c.bootstrap, "dr", "reader-diskless_az=r3")
        assert got == [f"m{i}".encode() for i in range(80, 200, 4)] + [f"m{i}".encode() for i in range(43, 200, 4)]

        before = _local_keys(objects)
        assert before
        deleter.delete_topics(["dr"], operation_timeout=30)["dr"].result(60)
        wait_for(what="the deleted topic's files to leave the store", pred=lambda: not _local_keys(objects))
        view = _tool(c.bootstrap, "--coordinators")
        assert all(r["partitions"] == 0 and r["live_files"] == 0 for r in view["coordinators"]), view
        # the per-coordinator gauges, one key=value line each, periodically in the leaders' logs
        gauges = [line for b in c.broker_ids for line in c.log_path(b).read_text(errors="replace").splitlines()
                  if "event='diskless_coordinator_gauges'" in line]
        for field in ("coordinator=", "live_files=", "live_bytes=", "owned_files=", "pending_deletions=",
                      "files_deleted="):
            assert gauges and all(field in line for line in gauges), field
        assert {re.search(r"coordinator=(\d+)", line).group(1) for line in gauges} == {"0", "1"}
    finally:
        c.stop()


def _failpoint_keys(log_path: Path) -> list[str]:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return [m.group(1) for line in text.splitlines() if "diskless_failpoint" in line
            for m in [re.search(r"key='?([^'\s]+)", line)] if m]


def test_orphan_scan_deletes_a_killed_brokers_upload_never_a_referenced_file(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    c = _cluster(tmp_path, _overrides(f"file://{objects}"))
    try:
        _create_topic(c.bootstrap, "orph")
        _produce(f"127.0.0.1:{c.broker_port(1)}", "orph", 400)
        referenced = _local_keys(objects)
        assert referenced
        expected = _read(f"127.0.0.1:{c.broker_port(2)}", "orph", "reader-diskless_az=r2")
        assert sorted(expected) == sorted(f"m{i}".encode() for i in range(400))

        # broker 3 stops each file after its upload, before its commit; then it is killed -9
        os.environ["STRATA_DISKLESS_FAILPOINT"] = "uploaded"
        try:
            c.restart(3)
        finally:
            del os.environ["STRATA_DISKLESS_FAILPOINT"]
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": f"127.0.0.1:{c.broker_port(3)}", "client.id": "doomed-diskless_az=r3",
                      "message.timeout.ms": 3000, "retries": 0})
        for i in range(5):
            p.produce("orph", value=f"lost{i}".encode(), partition=i % PARTITIONS)
        p.poll(0.5)
        wait_for(what="broker 3 to stop at the failpoint", pred=lambda: bool(_failpoint_keys(c.log_path(3))))
        orphans = set(_failpoint_keys(c.log_path(3)))
        c.kill(3)
        p.flush(10)
        assert orphans <= _local_keys(objects), "the upload should be in the store"

        # consumers read the referenced files (through brokers 1 and 2) while the scan runs
        reads: list[bool] = []
        stop = threading.Event()

        def reader(broker: int) -> None:
            while not stop.is_set():
                got = _read(f"127.0.0.1:{c.broker_port(broker)}", "orph", f"scanread{broker}-diskless_az=r{broker}")
                reads.append(got == expected)

        threads = [threading.Thread(target=reader, args=(b,), daemon=True) for b in (1, 2)]
        for t in threads:
            t.start()
        try:
            wait_for(what="the orphan scan to delete the orphan", pred=lambda: not orphans & _local_keys(objects), timeout=40)
            time.sleep(1.5)  # a few more scans while the readers go on
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert reads and all(reads), f"{reads.count(False)} of {len(reads)} reads differed"
        assert referenced <= _local_keys(objects), f"referenced files deleted: {referenced - _local_keys(objects)}"
        view = _tool(c.bootstrap, "--orphans")
        assert orphans <= {o["key"] for o in view["orphans"]}, view
    finally:
        c.stop()


def test_file_deletion_resumes_on_the_new_leader(tmp_path: Path) -> None:
    """The last owner's leader is killed (-9) while its files wait out their deletion grace: the
    new leader, which applied the same log, finds them and deletes them (its status of a file is
    its own, not the log's)."""
    objects = tmp_path / "objects"
    c = _cluster(tmp_path, _overrides(f"file://{objects}", **{"diskless.coordinator.file.deletion.grace.ms": "3000"}))
    try:
        _create_topic(c.bootstrap, "fo")
        _produce(c.bootstrap, "fo", 200)
        assert _local_keys(objects)
        from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        time.sleep(1.2)
        res = ConfigResource("topic", "fo", incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(30)
        pending: list[dict[str, Any]] = []

        def deletions_pending() -> bool:
            pending[:] = [r for r in _tool(c.bootstrap, "--coordinators")["coordinators"]
                          if r.get("pending_deletions", 0) > 0]
            return bool(pending)

        wait_for(what="files waiting for their deletion", pred=deletions_pending)
        victim = pending[0]["leader"]
        c.kill(victim)
        assert _local_keys(objects), "the grace period should not be over yet"
        others = [b for b in c.broker_ids if b != victim]
        moved = {r["coordinator"] for r in pending if r["leader"] == victim}

        def deleted_by_new_leaders() -> set[int]:
            return {i for b in others for i in moved if re.search(
                rf"event='diskless_file_deleted' coordinator={i} ", c.log_path(b).read_text(errors="replace"))}

        wait_for(what="the new leaders to delete the files", pred=lambda: not _local_keys(objects) and deleted_by_new_leaders() == moved, timeout=40)
    finally:
        c.stop()


def test_a_file_its_first_owner_never_knew_is_taken_over(tmp_path: Path) -> None:
    """A file committed to its second owner only (the commit to the first failed): once its
    batches are deleted, the second owner waits for a handover that never comes; after the orphan
    grace period it asks the first owner, which does not know the file, takes it over and deletes
    it. The orphan scan leaves it alone meanwhile (a coordinator knows it)."""
    import zlib

    from node.client import NodeClient
    from protocol.errors import Errors
    from protocol.generated.diskless_commit_file import DisklessCommitFileRequest as C
    from protocol.generated.find_coordinator import FindCoordinatorRequest
    from protocol.generated.metadata import MetadataRequest

    objects = tmp_path / "objects"
    c = _cluster(tmp_path, _overrides(f"file://{objects}", **{"log.retention.check.interval.ms": "60000"}))
    try:
        _create_topic(c.bootstrap, "un")

        async def commit() -> tuple[int, int, int]:
            async with NodeClient("127.0.0.1", c.broker_port(1)) as cl:
                md = await cl.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="un")]), 12)
                tid = md.topics[0].topic_id
                mine = (zlib.crc32(tid.bytes) + 0) % 2  # partition 0's coordinator (the controller's mapping)
                other = 1 - mine
                deadline = time.monotonic() + 30
                while True:
                    r = await cl.request(FindCoordinatorRequest(key_type=100, coordinator_keys=[str(mine)]), 4)
                    if r.coordinators[0].error_code == 0:
                        break
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            leader = r.coordinators[0].node_id
            (objects / "wal").mkdir(parents=True, exist_ok=True)
            (objects / "wal" / "unowned").write_bytes(b"x" * 100)
            req = C(object_key="wal/unowned", object_format=1, file_size=100, owner_ids=[other, mine], batches=[
                C.DisklessCommitBatch(magic=2, request_id=0, topic_id=tid, partition_index=0, byte_offset=0, size=100,
                                      base_offset=0, last_offset=0, batch_max_timestamp=1, timestamp_type=0,
                                      producer_id=-1, producer_epoch=-1, base_sequence=-1, last_sequence=-1)])
            async with NodeClient("127.0.0.1", c.broker_port(leader), client_id=f"diskless-{leader}") as cl:
                deadline = time.monotonic() + 30
                while True:  # until the coordinator is loaded and has created the topic's partitions
                    resp = await cl.request(req)
                    if resp.batches[0].error_code not in (Errors.COORDINATOR_LOAD_IN_PROGRESS,
                                                          Errors.UNKNOWN_TOPIC_OR_PARTITION):
                        break
                    assert time.monotonic() < deadline, resp.batches[0]
                    await asyncio.sleep(0.2)
            assert resp.batches[0].error_code == 0, resp.batches[0]
            return mine, other, leader

        mine, other, leader = asyncio.run(commit())
        from kafka import TopicPartition
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=c.bootstrap, client_id="admin-diskless_az=r1")
        try:
            admin.delete_records({TopicPartition("un", 0): -1})
        finally:
            admin.close()
        statuses = {(f["coordinator"], f["status"]) for f in _tool(c.bootstrap, "--files")["files"]
                    if f["key"] == "wal/unowned"}
        assert statuses == {(mine, "waiting")}, statuses
        deleted = rf"event='diskless_file_deleted' coordinator={mine} key='wal/unowned'"
        wait_for(what="the second owner to take the file over and delete it", pred=lambda: re.search(deleted, c.log_path(leader).read_text(errors="replace")) is not None)
        assert "wal/unowned" not in _local_keys(objects)
        text = c.log_path(leader).read_text(errors="replace")
        assert re.search(rf"event='diskless_file_taken_unowned' coordinator={mine} key='wal/unowned' error=0", text)
        assert not any("diskless_orphan_deleted" in c.log_path(b).read_text(errors="replace") for b in c.broker_ids)
    finally:
        c.stop()
