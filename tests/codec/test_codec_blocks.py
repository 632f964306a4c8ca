"""Block chunks (metricsd/codec/blocks.py): what is sealed a block at a time reads back bit for bit;
a wave of series seals the bytes each series would alone; pinned bytes; and garbage raises
CorruptChunk only, never another error or a large allocation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.codec import CorruptChunk
from metricsd.codec import bitpack as bp
from metricsd.codec.bits import pack_rows, pack_segments, unpack_segments
from metricsd.codec.blockdecode import decode_chunks
from metricsd.codec.blocks import NO_CHUNK, XOR_FAMILY, Chain, encode_blocks
from metricsd.model import STALE_NAN_BITS

T0 = 1_700_000_000_000


class Series:
    """Seals one or more series a block at a time, closing chunks every ``chunk`` samples, as the
    store does; keeps the bytes and counts of each series' chunks."""

    def __init__(self, k: int, block: int, chunk: int) -> None:
        self.block, self.chunk = block, chunk
        self.chain = Chain.empty(k)
        self.chunks: list[list[tuple[bytes, int]]] = [[] for _ in range(k)]
        self.open: list[tuple[bytes, int]] = [(b"", 0)] * k

    def seal(self, t: np.ndarray, v: np.ndarray) -> None:
        enc = encode_blocks(t, v, self.chain, self.block)
        n = t.shape[1]
        for r in range(t.shape[0]):
            piece = enc.data[enc.offsets[r] : enc.offsets[r + 1]].tobytes()
            cur, cnt = self.open[r]
            if enc.started[r] and cnt:
                self.chunks[r].append((cur, cnt))
                cur, cnt = b"", 0
            self.open[r] = (cur + piece, cnt + n)
        self.chain = enc.after
        for r in range(t.shape[0]):
            if self.open[r][1] >= self.chunk:
                self.chunks[r].append(self.open[r])
                self.open[r] = (b"", 0)
                self.chain.family[r] = NO_CHUNK

    def all_chunks(self, r: int) -> list[tuple[bytes, int]]:
        return self.chunks[r] + ([self.open[r]] if self.open[r][1] else [])

    def decode(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        parts = self.all_chunks(r)
        buf = b"".join(c for c, _ in parts)
        ends = np.cumsum([len(c) for c, _ in parts]).tolist()
        return decode_chunks(buf, [0, *ends[:-1]], ends, [n for _, n in parts])


def _values(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "const":
        return np.full(n, 0.25)
    if kind == "counter":
        return np.cumsum(rng.integers(0, 10**6, n)) / 1e6
    if kind == "pages":
        return (2**30 + np.cumsum(rng.integers(-20, 21, n))) * 4096.0
    if kind == "linear":
        return np.arange(n) * 3.0
    if kind == "floats":
        return rng.standard_normal(n)
    if kind == "bits":
        return rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64)
    if kind == "special":
        v = rng.choice(np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-310, 1.5, 2.0**60]), n)
        v[::5] = np.array([STALE_NAN_BITS], np.uint64).view(np.float64)[0]
        return v
    if kind == "mixed":  # decimal, then not, then decimal again: chunks start on the change
        v = np.arange(n) / 10.0
        v[n // 3 : n // 2] = np.nan
        return v
    raise AssertionError(kind)


KINDS = ["const", "counter", "pages", "linear", "floats", "bits", "special", "mixed"]


def _timestamps(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "regular":
        return T0 + 10_000 * np.arange(n, dtype=np.int64)
    if kind == "jitter":
        return T0 + 10_000 * np.arange(n, dtype=np.int64) + rng.integers(0, 6, n)
    if kind == "gaps":
        return T0 + np.cumsum(rng.integers(1, 2**40, n))
    if kind == "extremes":
        return np.iinfo(np.int64).min + 1 + np.cumsum(rng.integers(1, 2**50, n))
    raise AssertionError(kind)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(KINDS), min_size=1, max_size=5),
       st.sampled_from(["regular", "jitter", "gaps", "extremes"]), st.integers(1, 20), st.integers(1, 60),
       st.lists(st.integers(1, 20), min_size=1, max_size=12), st.integers(0, 2**32))
def test_blocks_read_back_bit_for_bit(kinds: list[str], tkind: str, block: int, chunk: int, sizes: list[int],
                                      seed: int) -> None:
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    t = np.stack([_timestamps(tkind, total, rng) for _ in kinds])
    v = np.stack([_values(k, total, rng) for k in kinds])
    s = Series(len(kinds), block, chunk)
    pos = 0
    for n in sizes:
        s.seal(t[:, pos : pos + n], v[:, pos : pos + n])
        pos += n
    for r in range(len(kinds)):
        got_t, got_v = s.decode(r)
        assert got_t.tolist() == t[r].tolist()
        assert got_v.view(np.uint64).tolist() == v[r].view(np.uint64).tolist()


def test_a_wave_seals_the_bytes_each_series_seals_alone() -> None:
    rng = np.random.default_rng(3)
    kinds = KINDS * 3
    n = 16 * 9
    t = np.stack([_timestamps("jitter" if i % 2 else "regular", n, rng) for i in range(len(kinds))])
    v = np.stack([_values(k, n, rng) for k in kinds])
    wave = Series(len(kinds), 16, 64)
    alone = [Series(1, 16, 64) for _ in kinds]
    for pos in range(0, n, 16):
        wave.seal(t[:, pos : pos + 16], v[:, pos : pos + 16])
        for r, s in enumerate(alone):
            s.seal(t[r : r + 1, pos : pos + 16], v[r : r + 1, pos : pos + 16])
    for r, s in enumerate(alone):
        assert wave.all_chunks(r) == s.all_chunks(0)


def test_realistic_series_take_few_bytes() -> None:
    """Regular 10 s scrapes: a constant series is one byte a block after its chunk header, a
    counter at microseconds a few bytes a sample."""
    rng = np.random.default_rng(1)
    t = T0 + 10_000 * np.arange(720, dtype=np.int64)
    s = Series(2, 16, 720)
    v = np.stack([np.full(720, 0.5), np.cumsum(rng.integers(400_000, 600_000, 720)) / 1e6])
    for pos in range(0, 720, 16):
        s.seal(t[None, pos : pos + 16].repeat(2, 0), v[:, pos : pos + 16])
    (const, n0), = s.all_chunks(0)
    (counter, n1), = s.all_chunks(1)
    assert n0 == n1 == 720
    assert len(const) <= 20 + 720 // 16
    assert len(counter) < 720 * 3


def test_the_documented_example_bytes() -> None:
    """metricsd/codec/FORMAT.md, "Block chunks: example"."""
    enc = encode_blocks(np.array([[0, 10_000, 20_000]]), np.array([[0.5, 0.5, 0.5]]), Chain.empty(1), 16)
    assert enc.started.tolist() == [True]
    assert enc.data.tobytes().hex() == "01" "10" "f0d8ffffffffffff" "a09c01" "0a" "00" "08" "03"
    t, v = decode_chunks(enc.data.tobytes(), [0], [len(enc.data)], [3])
    assert t.tolist() == [0, 10_000, 20_000] and v.tolist() == [0.5, 0.5, 0.5]
    # the next block continues the chain: regular, the same value: one flags byte
    nxt = encode_blocks(np.array([[30_000] * 1]), np.array([[0.5]]), enc.after, 1)
    assert nxt.data.tobytes().hex() == "00" and not nxt.started[0]


def test_a_value_outside_the_chunks_scale_starts_a_chunk() -> None:
    first = encode_blocks(np.array([[T0, T0 + 1]]), np.array([[1.0, 2.0]]), Chain.empty(1), 2)
    assert int(first.after.family[0]) == 0
    again = encode_blocks(np.array([[T0 + 2, T0 + 3]]), np.array([[3.0, 4.0]]), first.after, 2)
    assert not again.started[0]
    tenth = encode_blocks(np.array([[T0 + 2, T0 + 3]]), np.array([[3.5, 4.0]]), first.after, 2)
    assert tenth.started[0] and int(tenth.after.family[0]) == 1
    nan = encode_blocks(np.array([[T0 + 2, T0 + 3]]), np.array([[np.nan, 4.0]]), first.after, 2)
    assert nan.started[0] and int(nan.after.family[0]) == XOR_FAMILY


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 64)), min_size=1, max_size=8), st.integers(0, 2**32))
def test_segments_pack_as_the_one_width_packer_does(segments: list[tuple[int, int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = np.array([c for c, _ in segments])
    widths = np.array([w for _, w in segments])
    parts = [rng.integers(0, 2**64, c, dtype=np.uint64) >> np.uint64(64 - w) if w else np.zeros(c, np.uint64)
             for c, w in segments]
    flat = np.concatenate(parts)
    out, nbytes = pack_segments(flat, counts, widths)
    assert out.tobytes() == b"".join(bp.pack(p, int(w)) for p, (_, w) in zip(parts, segments, strict=True))
    assert unpack_segments(out, np.cumsum(nbytes) - nbytes, counts, widths).tolist() == flat.tolist()
    if len(set(counts.tolist())) == 1:
        rows, row_bytes = pack_rows(flat.reshape(len(segments), -1), widths)
        assert rows.tobytes() == out.tobytes() and row_bytes.tolist() == nbytes.tolist()


def _valid() -> tuple[bytes, list[int]]:
    rng = np.random.default_rng(9)
    s = Series(len(KINDS), 8, 40)
    t = np.stack([_timestamps("jitter", 64, rng) for _ in KINDS])
    v = np.stack([_values(k, 64, rng) for k in KINDS])
    for pos in range(0, 64, 8):
        s.seal(t[:, pos : pos + 8], v[:, pos : pos + 8])
    chunks = [c for r in range(len(KINDS)) for c in s.all_chunks(r)]
    return b"".join(c for c, _ in chunks), [len(c) for c, _ in chunks] + [n for _, n in chunks]


VALID, SHAPE = _valid()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), min_size=1, max_size=6))
def test_damaged_chunks_raise_corrupt_chunk_only(flips: list[tuple[int, int]]) -> None:
    buf = bytearray(VALID)
    for pos, x in flips:
        buf[pos] ^= x
    k = len(SHAPE) // 2
    ends = np.cumsum(SHAPE[:k]).tolist()
    try:
        t, _ = decode_chunks(bytes(buf), [0, *ends[:-1]], ends, SHAPE[k:])
    except CorruptChunk:
        return
    assert len(t) == sum(SHAPE[k:])  # read as something else, within the counts asked for


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 10**6))
def test_random_bytes_raise_corrupt_chunk_only(data: bytes, count: int) -> None:
    try:
        t, _ = decode_chunks(data, [0], [len(data)], [count])
    except CorruptChunk:
        return
    assert len(t) == count


def test_counts_bound_what_a_decoder_allocates() -> None:
    """A block of flags 0 is block-size samples from one byte: the expected count stops a decoder
    before it would build more."""
    head = encode_blocks(np.array([[T0, T0 + 1]]), np.array([[1.0, 1.0]]), Chain.empty(1), 255).data.tobytes()
    bomb = head + b"\x00" * 100_000
    with pytest.raises(CorruptChunk, match="more than"):
        decode_chunks(bomb, [0], [len(bomb)], [1000])
