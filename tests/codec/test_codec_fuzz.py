"""Decoders are fed garbage: only CorruptChunk may come out, never another error or a huge allocation.

Two layers are attacked: the CRC (random bytes, truncations, bit flips: all must be caught),
and, with the CRC recomputed after the damage, every parser behind it.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.codec import CorruptChunk, chunk_count, chunk_time_range, decode_chunk, encode_chunk
from metricsd.codec.chunk import HEADER_SIZE

T0 = 1_700_000_000_000


def _valid_chunks() -> list[bytes]:
    """One chunk per encoding pair the realistic shapes produce, plus odd ones."""
    rng = np.random.default_rng(5)
    n = 24
    reg = T0 + np.arange(n, dtype=np.int64) * 10_000
    sparse = reg + np.where(np.arange(n) % 9 == 4, 3, 0)
    dense = reg + rng.integers(0, 6, n)
    steps = np.cumsum(rng.integers(1, 10**9, n))
    values = [
        np.full(n, 0.25),
        (2**30 + np.cumsum(rng.integers(-20, 21, n))) * 4096.0,
        np.cumsum(rng.integers(400_000, 600_000, n)) / 1e6,
        np.repeat(np.sqrt(np.arange(2.0, 5.0)), n // 3),
        rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64),
    ]
    chunks = [encode_chunk(t, v) for t in (reg, sparse, dense, steps) for v in values]
    chunks.append(encode_chunk(np.array([-7], np.int64), np.array([np.nan])))
    assert len({c[0] for c in chunks}) >= 10
    return chunks


CHUNKS = _valid_chunks()


def _decode_or_corrupt(data: bytes) -> None:
    """Decode, accepting only CorruptChunk or a result that is a well-formed chunk's."""
    try:
        t, v = decode_chunk(data)
    except CorruptChunk:
        return
    assert t.dtype == np.int64 and v.dtype == np.float64 and t.size == v.size == chunk_count(data)
    assert np.all(t[1:] > t[:-1])
    assert (int(t[0]), int(t[-1])) == chunk_time_range(data)


def _reseal(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def test_random_bytes_are_rejected() -> None:
    rng = np.random.default_rng(1)
    for size in list(range(40)) + [int(s) for s in rng.integers(40, 2000, 300)]:
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        with pytest.raises(CorruptChunk):
            decode_chunk(data)


@pytest.mark.parametrize("index", range(len(CHUNKS)))
def test_every_truncation_is_rejected(index: int) -> None:
    data = CHUNKS[index]
    for end in range(len(data)):
        with pytest.raises(CorruptChunk):
            decode_chunk(data[:end])


@pytest.mark.parametrize("index", range(len(CHUNKS)))
def test_every_bit_flip_is_caught_by_the_crc(index: int) -> None:
    data = bytearray(CHUNKS[index])
    for bit in range(8 * len(data)):
        data[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptChunk):
            decode_chunk(bytes(data))
        data[bit // 8] ^= 1 << (bit % 8)


@pytest.mark.parametrize("index", range(len(CHUNKS)))
def test_parsers_behind_the_crc_survive_flips_and_cuts(index: int) -> None:
    body = CHUNKS[index][:-4]
    rng = np.random.default_rng(index)
    for bit in range(8 * len(body)):  # every single flip, CRC recomputed
        damaged = bytearray(body)
        damaged[bit // 8] ^= 1 << (bit % 8)
        _decode_or_corrupt(_reseal(bytes(damaged)))
    for end in range(HEADER_SIZE, len(body)):  # every cut, CRC recomputed
        _decode_or_corrupt(_reseal(body[:end]))
    for _ in range(50):  # bursts of random bytes, and random bytes appended
        damaged = bytearray(body)
        at = int(rng.integers(0, len(body)))
        damaged[at : at + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
        _decode_or_corrupt(_reseal(bytes(damaged)))
        _decode_or_corrupt(_reseal(body + rng.integers(0, 256, 3, dtype=np.uint8).tobytes()))


@given(st.binary(min_size=HEADER_SIZE, max_size=200))
@settings(max_examples=150, deadline=None)
def test_any_body_behind_a_valid_crc(raw: bytes) -> None:
    _decode_or_corrupt(_reseal(raw))


@given(st.sampled_from(CHUNKS), st.binary(min_size=1, max_size=40))
@settings(max_examples=150, deadline=None)
def test_any_section_after_a_valid_header(chunk: bytes, tail: bytes) -> None:
    _decode_or_corrupt(_reseal(chunk[:HEADER_SIZE] + tail))


def test_a_header_claiming_huge_sizes_allocates_nothing_big() -> None:
    # 65535 samples, a 64-bit width and a tiny body: the packed size check fails before allocating
    header = struct.pack("<BHqq", 0x22, 65535, 0, 2**62)
    _decode_or_corrupt(_reseal(header + b"\x00\x40"))
    _decode_or_corrupt(_reseal(header[:1].replace(b"\x22", b"\x14") + header[1:] + b"\x00" * 8))


def test_header_readers() -> None:
    data = encode_chunk(np.array([-10, 5, 7_000], np.int64), np.array([1.0, 2.0, 3.0]))
    assert chunk_count(data) == 3
    assert chunk_time_range(memoryview(data)) == (-10, 7_000)
    assert chunk_count(memoryview(b"xx" + data)[2:]) == 3
    for bad in (b"", data[:HEADER_SIZE + 3], struct.pack("<BHqq", 0x11, 0, 0, 0) + b"\x00" * 8):
        with pytest.raises(CorruptChunk):
            chunk_count(bad)
    for lo, hi, n in ((5, 4, 2), (0, 1, 1), (0, 3, 5)):  # backwards, 1 sample over 2 ms, 5 in 4 ms
        with pytest.raises(CorruptChunk):
            chunk_time_range(struct.pack("<BHqq", 0x11, n, lo, hi) + b"\x00" * 12)


def test_decode_takes_memoryviews_and_bytearrays() -> None:
    data = CHUNKS[7]
    expected = decode_chunk(data)
    for form in (bytearray(data), memoryview(data), memoryview(b"\x00" * 5 + data)[5:]):
        t, v = decode_chunk(form)
        np.testing.assert_array_equal(t, expected[0])
        np.testing.assert_array_equal(v.view(np.uint64), expected[1].view(np.uint64))


@pytest.mark.parametrize(
    ("t", "v", "message"),
    [
        ([], [], "1..65535"),
        ([1, 2], [1.0], "2 timestamps but 1 values"),
        ([1, 1], [1.0, 2.0], "strictly increasing"),
        ([2, 1], [1.0, 2.0], "strictly increasing"),
        ([[1, 2]], [[1.0, 2.0]], "one-dimensional"),
        ([1.5, 2.5], [1.0, 2.0], "int64"),
        ([1, 2], ["a", "b"], "float64"),
        (np.arange(65536), np.zeros(65536), "1..65535"),
    ],
)
def test_bad_input_to_the_encoder_raises_value_error(t: object, v: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_chunk(np.asarray(t), np.asarray(v))
    assert not issubclass(CorruptChunk, TypeError)
