"""Frames and headers: split a byte stream into frames, refuse oversized sizes before
buffering, unknown API keys/versions are reported with their correlation id."""

import struct

import pytest

from protocol.errors import ProtocolError
from protocol.framing import FrameReader, frame
from protocol.generated.api_versions import ApiVersionsRequest, ApiVersionsResponse
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
