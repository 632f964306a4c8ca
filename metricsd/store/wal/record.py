"""WAL records and segment headers as bytes (layout: metricsd/store/FORMAT.md). No I/O.

A record is a length, a type, a CRC and a payload. The CRC covers the length and type bytes as
well as the payload, so a flipped bit in the length is caught unless it points past the end of
the data, which reads as a torn tail; either way the reader stops at the last good record.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import cramjam

from metricsd.codec.zstdsized import decompress_exact

__all__ = [
    "RECORD_HEADER_SIZE",
    "SEGMENT_HEADER_SIZE",
    "RecordType",
    "ScanEnd",
    "compressed",
    "decode_segment_header",
    "decompressed",
    "encode_record_header",
    "encode_segment_header",
    "scan_records",
]

SEGMENT_MAGIC = b"MDWL"
SEGMENT_VERSION = 1
_SEGMENT = struct.Struct("<4sHHQ")  # magic, version, flags, segment number
SEGMENT_HEADER_SIZE = _SEGMENT.size  # 16

_RECORD = struct.Struct("<IBI")  # length, type, crc32
RECORD_HEADER_SIZE = _RECORD.size  # 9
_LEN_TYPE = struct.Struct("<IB")
MAX_PAYLOAD = 2**32 - 1


class RecordType(enum.IntEnum):
    """What a record's payload is. 0 is invalid, so zero-filled file tails never parse."""

    WRITE = 1  # a serialized proto WriteRequest that passed validation
    GC = 2  # empty: the store ran its retention pass here
    CATCH_UP = 3  # a WriteRequest copied from a peer: applied without the out-of-order window
    WRITE_ZSTD = 4  # WRITE, zstd-compressed (FORMAT.md "Record")
    CATCH_UP_ZSTD = 5  # CATCH_UP, zstd-compressed


_PACKED = {RecordType.WRITE: RecordType.WRITE_ZSTD, RecordType.CATCH_UP: RecordType.CATCH_UP_ZSTD}
_UNPACKED = {v: k for k, v in _PACKED.items()}
_RAW_LEN = struct.Struct("<I")
ZSTD_LEVEL = 1  # ~14 ns a sample at 60 samples a series, 14.2 -> 2.6 bytes a sample (perf/RESULTS.md)
MIN_COMPRESSED = 128  # shorter payloads gain too little to be worth a frame


def compressed(rtype: RecordType, payload: bytes | memoryview) -> tuple[RecordType, bytes | memoryview]:
    """The record to write for a WRITE or CATCH_UP payload: its zstd type and ``raw length ‖ zstd
    frame``, when the payload is long enough and that is smaller. Other records go as they are."""
    packed_type = _PACKED.get(rtype)
    if packed_type is None or len(payload) < MIN_COMPRESSED:
        return rtype, payload
    frame = bytes(cramjam.zstd.compress(payload, level=ZSTD_LEVEL))
    if _RAW_LEN.size + len(frame) >= len(payload):
        return rtype, payload
    return packed_type, _RAW_LEN.pack(len(payload)) + frame


def decompressed(rtype: RecordType, payload: memoryview) -> tuple[RecordType, memoryview]:
    """The inverse of :func:`compressed`. Raises WalFormatError when a zstd record does not
    decompress to the length it states (its CRC was good: only a writer's bug does this)."""
    plain = _UNPACKED.get(rtype)
    if plain is None:
        return rtype, payload
    if len(payload) < _RAW_LEN.size:
        raise WalFormatError("compressed record shorter than its length field")
    (n,) = _RAW_LEN.unpack_from(payload, 0)
    try:
        return plain, decompress_exact(payload[_RAW_LEN.size :], n)
    except ValueError as e:
        raise WalFormatError(f"compressed record: {e}") from e


class WalFormatError(ValueError):
    """A segment header is not one this version writes."""


def encode_segment_header(segment: int) -> bytes:
    # FORMAT.md "Segment header"
    return _SEGMENT.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0, segment)


def decode_segment_header(buf: bytes | memoryview) -> int:
    """The segment number in a header. Raises WalFormatError on a short or foreign header."""
    if len(buf) < SEGMENT_HEADER_SIZE:
        raise WalFormatError(f"segment header is {len(buf)} bytes, want {SEGMENT_HEADER_SIZE}")
    magic, version, _flags, segment = _SEGMENT.unpack_from(buf, 0)
    if magic != SEGMENT_MAGIC:
        raise WalFormatError(f"bad segment magic {bytes(magic)!r}")
    if version != SEGMENT_VERSION:
        raise WalFormatError(f"segment version {version} is not {SEGMENT_VERSION}")
    return int(segment)


def encode_record_header(rtype: RecordType, payload: bytes | memoryview) -> bytes:
    """The 9 bytes that go before ``payload``. Raises ValueError when the payload is over 4 GiB."""
    # FORMAT.md "Record"
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise ValueError(f"WAL payload of {n} bytes exceeds {MAX_PAYLOAD}")
    len_type = _LEN_TYPE.pack(n, int(rtype))
    crc = zlib.crc32(payload, zlib.crc32(len_type))
    return _RECORD.pack(n, int(rtype), crc)


@dataclass
class ScanEnd:
    """Where a scan stopped: ``offset`` is just past the last good record; ``reason`` is empty when
    the data ended exactly there, else says what was wrong with the bytes at ``offset``."""

    offset: int
    reason: str = ""


_TYPES = frozenset(int(t) for t in RecordType)


def scan_records(buf: bytes | memoryview, start: int, end: ScanEnd) -> Iterator[tuple[int, RecordType, memoryview]]:
    """Yield (offset, type, payload view) for each good record from ``start``; fill ``end`` when done.

    Stops at the first torn or corrupt record: nothing after it is trusted, as its length is not.
    """
    view = memoryview(buf)
    pos = start
    size = len(view)
    while pos < size:
        if size - pos < RECORD_HEADER_SIZE:
            end.offset, end.reason = pos, f"torn record header ({size - pos} of {RECORD_HEADER_SIZE} bytes)"
            return
        n, rtype, crc = _RECORD.unpack_from(view, pos)
        if rtype not in _TYPES:
            end.offset, end.reason = pos, f"bad record type {rtype}"
            return
        body = pos + RECORD_HEADER_SIZE
        if body + n > size:
            end.offset, end.reason = pos, f"torn record (length {n}, {size - body} bytes left)"
            return
        payload = view[body : body + n]
        if zlib.crc32(payload, zlib.crc32(view[pos : pos + 5])) != crc:
            end.offset, end.reason = pos, "record checksum mismatch"
            return
        yield pos, RecordType(rtype), payload
        pos = body + n
    end.offset, end.reason = pos, ""
