"""Batch compression codecs with Kafka's framings, and bounded decompression.

gzip: RFC 1952. snappy: Java clients use xerial's framing (magic header then length-prefixed
raw blocks); librdkafka writes it too, but raw snappy is accepted as well. lz4: the LZ4 frame
format (Kafka's KafkaLZ4BlockOutputStream writes 64 KiB independent blocks). zstd: a zstd frame.
Every decompressor stops at ``limit`` bytes so a small batch cannot expand without bound.
"""

from __future__ import annotations

import struct
import zlib
from enum import IntEnum

import cramjam
import lz4.frame
import zstandard

from protocol.errors import ProtocolError
from protocol.primitives import read_uvarint

CORRUPT_MESSAGE = 2
# Default cap on one batch's decompressed size; a broker passes its own (message.max.bytes
# is about records on the wire; 64 MiB uncompressed is far above any sane batch).
DEFAULT_LIMIT = 64 * 1024 * 1024

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK = 32 * 1024
_INT32 = struct.Struct(">i")


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if codec == Compression.SNAPPY:
        out = [XERIAL_HEADER]
        mv = memoryview(data)
        for i in range(0, len(mv), XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(mv[i : i + XERIAL_BLOCK]))
            out.append(_INT32.pack(len(block)))
            out.append(block)
        return b"".join(out)
    if codec == Compression.LZ4:
        return lz4.frame.compress(
            data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False, content_checksum=False
        )
    if codec == Compression.ZSTD:
        return zstandard.ZstdCompressor(level=3).compress(data)
    raise ProtocolError(f"unknown compression codec {codec}", error_code=CORRUPT_MESSAGE)


def decompress(codec: int, data, limit: int = DEFAULT_LIMIT) -> bytes:
    """Decompress, raising ProtocolError on corrupt input or output past ``limit`` bytes."""
    try:
        if codec == Compression.GZIP:
            d = zlib.decompressobj(47)  # gzip or zlib header
            out = d.decompress(bytes(data), limit + 1)
        elif codec == Compression.SNAPPY:
            out = _snappy(bytes(data), limit)
        elif codec == Compression.LZ4:
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(bytes(data), max_length=limit + 1)
        elif codec == Compression.ZSTD:
            reader = zstandard.ZstdDecompressor().stream_reader(bytes(data))
            out = reader.read(limit + 1)
        elif codec == Compression.NONE:
            return bytes(data)
        else:
            raise ProtocolError(f"unknown compression codec {codec}", error_code=CORRUPT_MESSAGE)
    except ProtocolError:
        raise
    except Exception as e:  # each library raises its own types on corrupt input
        raise ProtocolError(f"cannot decompress {Compression(codec).name} batch: {e}", error_code=CORRUPT_MESSAGE) from None
    if len(out) > limit:
        raise ProtocolError(f"batch decompresses to more than {limit} bytes", error_code=CORRUPT_MESSAGE)
    return out


def _raw_snappy(block: bytes, budget: int) -> bytes:
    size, _ = read_uvarint(block, 0)  # raw snappy starts with its uncompressed length
    if size > budget:
        raise ProtocolError("batch decompresses to more than the limit", error_code=CORRUPT_MESSAGE)
    return bytes(cramjam.snappy.decompress_raw(block))


def _snappy(data: bytes, limit: int) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return _raw_snappy(data, limit)
    pos = len(XERIAL_HEADER)
    out = bytearray()
    while pos < len(data):
        if len(data) - pos < 4:
            raise ProtocolError("snappy block length truncated", error_code=CORRUPT_MESSAGE)
        n = _INT32.unpack_from(data, pos)[0]
        pos += 4
        if n < 0 or pos + n > len(data):
            raise ProtocolError("snappy block runs past the end", error_code=CORRUPT_MESSAGE)
        out += _raw_snappy(data[pos : pos + n], limit - len(out))
        pos += n
    return bytes(out)
