"""Bad input: garbage, truncated, oversized and malformed requests on raw sockets.

In every case the offending connection gets a clean error response or is closed, the broker logs
it exactly once (one event line naming that peer), and it keeps serving everyone else: a
confluent-kafka produce/consume round trip works after each case and the process is still alive.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest

from protocol.framing import frame
from protocol.generated.api_versions import ApiVersionsResponse
from protocol.generated.produce import ProduceRequest
from protocol.headers import decode_response, encode_request
from protocol.records import Record, encode_batch
from tools.cluster import Cluster

MAX_REQUEST = 1 << 20  # socket.request.max.bytes for this broker
BROKER = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(
        tmp_path_factory.mktemp("bad-input"),
        brokers=1,
        broker_overrides={"socket.request.max.bytes": MAX_REQUEST, "auto.create.topics.enable": "false"},
    )
    c.start()
    _create_topic(c.bootstrap, "health", 1)
    _create_topic(c.bootstrap, "victim", 1)
    yield c
    c.stop()


def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)


# ------------------------------------------------------------------------------------- helpers
class Raw:
    """A raw TCP connection to the broker; `peer` is how the broker names us in its log."""

    def __init__(self, c: Cluster) -> None:
        self.log_from = c.log_path(BROKER).stat().st_size  # lines about us come after this
        self.sock = socket.create_connection((c.host, c.broker_port(BROKER)), timeout=10)
        host, port = self.sock.getsockname()[:2]
        self.peer = f"{host}:{port}"

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the broker may close before it read everything: that is one accepted outcome

    def request(self, body, version: int, correlation_id: int = 7) -> bytes:
        return b"".join(bytes(p) for p in frame(encode_request(body, version, correlation_id, "bad-input-test")))

    def read_frame(self) -> bytes | None:
        """The next response frame, or None if the broker closed the connection."""
        head = self._read_exactly(4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        assert 0 <= size < 64 << 20, size
        body = self._read_exactly(size)
        assert body is not None, "connection closed mid-response"
        return body

    def _read_exactly(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    def assert_closed(self, within: float = 10.0) -> None:
        """The broker closes the connection without answering."""
        self.sock.settimeout(within)
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            pytest.fail(f"the broker kept the connection from {self.peer} open for {within}s")
        assert data == b"", f"expected the broker to close the connection, got {data[:100]!r}"

    def assert_open(self) -> None:
        """The connection is still usable: an ApiVersions round trip works on it."""
        from protocol.generated.api_versions import ApiVersionsRequest

        self.send(self.request(ApiVersionsRequest(), 0, correlation_id=99))
        f = self.read_frame()
        assert f is not None, "the broker closed a connection it had answered cleanly"
        cid, resp = decode_response(f, 18, 0)
        assert cid == 99 and resp.error_code == 0

    def close(self) -> None:
        self.sock.close()


def log_lines_about(c: Cluster, raw: Raw) -> list[str]:
    """Broker log lines written since `raw` connected that name its peer address."""
    with open(c.log_path(BROKER), "rb") as f:
        f.seek(raw.log_from)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if f"'{raw.peer}'" in line]


def assert_logged_once(c: Cluster, raw: Raw, *words: str) -> str:
    """Exactly one broker log line names the peer (waiting for it to be written), and it says why."""
    peer = raw.peer
    deadline = time.monotonic() + 10
    lines = log_lines_about(c, raw)
    while not lines and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = log_lines_about(c, raw)
    time.sleep(0.5)  # anything logged twice would show up by now
    lines = log_lines_about(c, raw)
    assert len(lines) == 1, f"expected one log line about {peer}, got {len(lines)}:\n" + "\n".join(lines)
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    return lines[0]


_round_trips = 0


def assert_still_serving(c: Cluster) -> None:
    """The broker process lives and a real client can still produce and consume."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    global _round_trips
    _round_trips += 1
    assert c.is_running(BROKER), "the broker process died"
    value = f"still-alive-{_round_trips}-{uuid.uuid4()}".encode()
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "message.timeout.ms": 20000})
    delivered = []
    p.produce("health", value=value, on_delivery=lambda err, m: delivered.append((err, m.offset())))
    assert p.flush(30) == 0
    assert delivered and delivered[0][0] is None, delivered
    offset = delivered[0][1]
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "health-check", "enable.auto.commit": False})
    try:
        cons.assign([TopicPartition("health", 0, offset)])
        deadline = time.monotonic() + 30
        got = None
        while got is None and time.monotonic() < deadline:
            m = cons.poll(1.0)
            if m is not None and m.error() is None:
                got = m
        assert got is not None, "could not consume the message just produced"
        assert got.value() == value and got.offset() == offset
    finally:
        cons.close()
    assert c.is_running(BROKER), "the broker process died"


def request_header(api_key: int, version: int, correlation_id: int = 1, client_id: bytes = b"bad") -> bytes:
    """Request header v1 (non-flexible): key, version, correlation id, client id."""
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


# --------------------------------------------------------------------------- closed connections
def test_garbage_bytes(cluster):
    """An HTTP request: its first four bytes read as a frame size of ~1.2 GB."""
    raw = Raw(cluster)
    raw.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    raw.assert_closed()
    assert_logged_once(cluster, raw)
    raw.close()
    assert_still_serving(cluster)


def test_garbage_frame(cluster):
    """A well-sized frame of nonsense: API key -1 and random bytes."""
    raw = Raw(cluster)
    raw.send(framed(b"\xff" * 8 + bytes(range(40))))
    raw.assert_closed()
    assert_logged_once(cluster, raw)
    raw.close()
    assert_still_serving(cluster)


def test_truncated_frame_then_close(cluster):
    raw = Raw(cluster)
    raw.send(struct.pack(">i", 100) + request_header(3, 1)[:8])
    time.sleep(0.2)
    raw.close()
    assert_logged_once(cluster, raw)
    assert_still_serving(cluster)


@pytest.mark.parametrize("size", [2**31 - 1, -1, -(2**31)], ids=["max-int32", "minus-1", "min-int32"])
def test_absurd_frame_size(cluster, size):
    raw = Raw(cluster)
    raw.send(struct.pack(">i", size) + request_header(3, 1))
    raw.assert_closed()
    assert_logged_once(cluster, raw, "frame size")
    raw.close()
    assert_still_serving(cluster)


def test_frame_above_socket_request_max_bytes(cluster):
    """A 2 MiB frame to a broker with socket.request.max.bytes = 1 MiB is refused at its size."""
    raw = Raw(cluster)
    payload = request_header(3, 1) + b"\x00" * (2 * MAX_REQUEST - 12)
    raw.send(framed(payload))
    raw.assert_closed()
    line = assert_logged_once(cluster, raw, "frame size")
    assert str(MAX_REQUEST) in line
    raw.close()
    assert_still_serving(cluster)


def test_unknown_api_key(cluster):
    raw = Raw(cluster)
    raw.send(framed(request_header(999, 0) + b"\x00" * 8))
    raw.assert_closed()
    assert_logged_once(cluster, raw, "999")
    raw.close()
    assert_still_serving(cluster)


def test_unsupported_version_of_known_api(cluster):
    raw = Raw(cluster)
    raw.send(framed(request_header(3, 99) + b"\x00" * 8))  # Metadata v99
    raw.assert_closed()
    assert_logged_once(cluster, raw, "99")
    raw.close()
    assert_still_serving(cluster)


@pytest.mark.parametrize("flexible", [False, True], ids=["int32-array", "compact-array"])
def test_huge_array_length_in_small_frame(cluster, flexible):
    """Metadata whose topics array claims 2**31 entries in a frame of a few bytes: refused without
    trying to build the list (the broker must neither allocate it nor hang)."""
    raw = Raw(cluster)
    if flexible:
        # Metadata v12: header v2 (client id + empty tagged fields), topics as a compact array
        # whose length is uvarint(N + 1).
        n = 2**31 + 1
        uvarint = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            uvarint.append(b | (0x80 if n else 0))
            if not n:
                break
        payload = request_header(3, 12) + b"\x00" + bytes(uvarint) + b"\x00\x00"
    else:
        payload = request_header(3, 4) + struct.pack(">I", 2**31 - 1) + b"\x01"
    started = time.monotonic()
    raw.send(framed(payload))
    raw.assert_closed()
    assert time.monotonic() - started < 5
    assert_logged_once(cluster, raw)
    raw.close()
    assert_still_serving(cluster)


# ---------------------------------------------------------------------- clean error responses
def test_api_versions_v99_gets_error_35_and_v0_body(cluster):
    """A client newer than us: UNSUPPORTED_VERSION with a v0 body listing what we serve, and the
    connection stays open so it can retry with a version we know."""
    raw = Raw(cluster)
    # ApiVersions v99 is flexible in any future version: header v2 with empty tagged fields.
    raw.send(framed(request_header(18, 99, correlation_id=4242) + b"\x00" + b"\x00\x00\x00"))
    f = raw.read_frame()
    assert f is not None, "ApiVersions v99 closed the connection instead of answering"
    cid, resp = decode_response(f, 18, 0)
    assert cid == 4242
    assert isinstance(resp, ApiVersionsResponse)
    assert resp.error_code == 35
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert keys[18][0] == 0 and keys[18][1] >= 3
    assert 0 in keys and 1 in keys and 3 in keys  # Produce, Fetch, Metadata
    raw.assert_open()
    assert_logged_once(cluster, raw, "99")
    raw.close()
    assert_still_serving(cluster)


def produce_partition_response(raw: Raw, records: bytes, topic: str = "victim"):
    P = ProduceRequest
    req = P(
        acks=-1,
        timeout_ms=10000,
        topic_data=[P.TopicProduceData(name=topic, partition_data=[P.PartitionProduceData(index=0, records=records)])],
    )
    raw.send(raw.request(req, 8, correlation_id=31))
    f = raw.read_frame()
    assert f is not None, "a Produce with bad records closed the connection instead of answering"
    cid, resp = decode_response(f, 0, 8)
    assert cid == 31
    return resp.responses[0].partition_responses[0]


def victim_end_offset(c: Cluster) -> int:
    from confluent_kafka import Consumer, TopicPartition

    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "probe"})
    try:
        return cons.get_watermark_offsets(TopicPartition("victim", 0), timeout=10)[1]
    finally:
        cons.close()


def test_produce_with_wrong_crc(cluster):
    before = victim_end_offset(cluster)
    batch = bytearray(encode_batch([Record(value=b"corrupted on the wire", key=b"k")]))
    batch[-1] ^= 0xFF  # a payload byte: the stored CRC no longer matches
    raw = Raw(cluster)
    pr = produce_partition_response(raw, bytes(batch))
    assert pr.error_code == 2, pr  # CORRUPT_MESSAGE
    assert pr.base_offset == -1
    assert pr.error_message and "CRC" in pr.error_message
    raw.assert_open()
    assert_logged_once(cluster, raw, "CRC")
    raw.close()
    assert victim_end_offset(cluster) == before, "a corrupt batch was appended"
    assert_still_serving(cluster)


def legacy_message(value: bytes, magic: int = 1) -> bytes:
    """One message set entry in the pre-0.11 format (magic 0 or 1), CRC32 over magic..value."""
    import zlib

    body = struct.pack(">bb", magic, 0)
    if magic == 1:
        body += struct.pack(">q", int(time.time() * 1000))
    body += struct.pack(">i", -1)  # null key
    body += struct.pack(">i", len(value)) + value
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(msg)) + msg


@pytest.mark.parametrize("value", [b"v1", b"a legacy magic 1 message long enough for a v2 header" * 2],
                         ids=["short", "long"])
def test_produce_magic_1_message(cluster, value):
    before = victim_end_offset(cluster)
    raw = Raw(cluster)
    pr = produce_partition_response(raw, legacy_message(value))
    assert pr.error_code == 43, pr  # UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert pr.error_message and "magic" in pr.error_message
    raw.assert_open()
    assert_logged_once(cluster, raw, "magic")
    raw.close()
    assert victim_end_offset(cluster) == before
    assert_still_serving(cluster)


def test_many_bad_connections_at_once_do_not_disturb_a_client(cluster):
    """50 misbehaving connections interleaved with a healthy client: each bad one is closed and
    logged once, the broker stays up."""
    raws = [Raw(cluster) for _ in range(50)]
    for i, raw in enumerate(raws):
        raw.send(b"\x00\x00\x00\x10" + b"\xff" * 16 if i % 2 else b"\xde\xad\xbe\xef" * 4)
    for raw in raws:
        raw.assert_closed()
    assert_still_serving(cluster)
    for raw in raws:
        assert len(log_lines_about(cluster, raw)) == 1, raw.peer
        raw.close()
