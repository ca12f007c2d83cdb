"""Frames and headers: split a byte stream into frames, refuse oversized sizes before
buffering, unknown API keys/versions are reported with their correlation id."""

import struct

import pytest

from broker.server import _decoded, is_control_plane
from protocol.errors import ProtocolError
from protocol.framing import JOIN_MAX, FrameReader, frame, frame_joined
from protocol.generated.api_versions import ApiVersionsRequest, ApiVersionsResponse
from protocol.generated.fetch import FetchRequest
from protocol.generated.metadata import MetadataRequest
from protocol.headers import UnsupportedRequest, decode_request, decode_response, encode_request, encode_response


def test_frames_split_across_feeds():
    parts = [b"".join(frame([b"abc"])), b"".join(frame([b""])), b"".join(frame([b"x" * 1000]))]
    stream = b"".join(parts)
    r = FrameReader()
    got = []
    for i in range(0, len(stream), 7):
        got += r.feed(stream[i : i + 7])
    assert got == [b"abc", b"", b"x" * 1000] and r.pending == 0


@pytest.mark.parametrize("size", [-1, 2**31 - 1, 1025])
def test_oversized_or_negative_frame_is_refused(size):
    r = FrameReader(max_frame=1024)
    with pytest.raises(ProtocolError):
        r.feed(struct.pack(">i", size) + b"xx")


def test_request_round_trip_with_header_versions():
    body = MetadataRequest(topics=None, allow_auto_topic_creation=True)
    for v in range(MetadataRequest.MIN_VERSION, MetadataRequest.MAX_VERSION + 1):
        if v == 0:
            continue  # v0 cannot express "all topics" (null)
        req = decode_request(b"".join(encode_request(body, v, 42, "client-1")))
        assert req.correlation_id == 42 and req.api_version == v and req.header.client_id == "client-1"
        assert req.body.topics is None


def test_api_versions_response_header_is_always_v0():
    resp = ApiVersionsResponse(error_code=0)
    data = b"".join(encode_response(18, 3, 5, resp))
    assert data[:4] == struct.pack(">i", 5)
    # v3 body is flexible, header v0 has no tagged-field byte after the correlation id
    cid, body = decode_response(data, 18, 3)
    assert cid == 5 and body.error_code == 0


def test_unknown_api_and_version_keep_correlation_id():
    frame_ = struct.pack(">hhi", 9999, 0, 77) + b"\xff\xff"
    with pytest.raises(UnsupportedRequest) as e:
        decode_request(frame_)
    assert e.value.correlation_id == 77 and e.value.error_code == 35
    good = b"".join(encode_request(ApiVersionsRequest(), 3, 78, "c"))
    bad = good[:2] + struct.pack(">h", 99) + good[4:]
    with pytest.raises(UnsupportedRequest) as e:
        decode_request(bad)
    assert e.value.correlation_id == 78


def test_truncated_request_is_protocol_error():
    good = b"".join(encode_request(MetadataRequest(topics=None), 12, 1, "c"))
    for cut in range(len(good)):
        with pytest.raises(ProtocolError):
            decode_request(good[:cut])


def test_prefix_split_and_large_frame_in_pieces():
    """A size prefix split over reads, and a large frame arriving in pieces, come out whole; the
    declared size is known as soon as the prefix is (the server reserves memory by it)."""
    big = b"".join(frame([b"y" * 300_000]))
    small = b"".join(frame([b"ab"]))
    r = FrameReader()
    assert r.feed(big[:2]) == [] and r.incomplete_size is None
    assert r.feed(big[2:5]) == [] and r.incomplete_size == len(big) and r.pending == 5
    got = []
    for i in range(5, len(big), 65536):
        got += r.feed(big[i : i + 65536] + (small if i + 65536 >= len(big) else b""))
    assert [bytes(f) for f in got] == [b"y" * 300_000, b"ab"] and r.pending == 0 and r.incomplete_size is None


def test_joined_frame_is_one_buffer_when_small_and_parts_when_large():
    small = [b"ab", memoryview(b"cde"), b"f"]
    assert frame_joined(small) == [b"\x00\x00\x00\x06abcdef"]
    assert b"".join(frame(small)) == frame_joined(small)[0]
    big = [b"x" * JOIN_MAX, b"y"]
    out = frame_joined(big)
    assert len(out) == 3 and out[0] == (JOIN_MAX + 1).to_bytes(4, "big") and out[1] is big[0]


def _follower_fetch_frame(replica_id: int) -> bytes:
    req = FetchRequest(max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                       session_epoch=-1, topics=[])
    req.replica_state = FetchRequest.ReplicaState(replica_id=replica_id, replica_epoch=1)
    return b"".join(bytes(p) for p in encode_request(req, 17, 7, "replica-fetcher-2"))


def test_a_classified_follower_fetch_is_decoded_once():
    f = _follower_fetch_frame(2)
    assert is_control_plane(f)
    req = _decoded.take(f)
    assert req is not None and req.body.replica_state.replica_id == 2
    assert _decoded.take(f) is None  # taken once; the dispatcher decodes anything else itself
    assert not is_control_plane(_follower_fetch_frame(-1))  # a consumer's: kept too, but client traffic
    kept = [_follower_fetch_frame(3) for _ in range(_decoded.MAX + 10)]
    for k in kept:
        is_control_plane(k)
    assert len(_decoded._by_id) == _decoded.MAX  # bounded: the oldest are pushed out
    assert _decoded.take(kept[0]) is None and _decoded.take(kept[-1]) is not None
    _decoded._by_id.clear()
