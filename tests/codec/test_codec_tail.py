"""codec.tail.decode_tails (a chunk's newest samples, decoded from a block near its end with the
chain solved from its two newest samples) against decode_chunks of the whole chunk, bit for bit,
over every value family and block mode the encoder writes."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.codec.blockdecode import decode_chunks
from metricsd.codec.blocks import Chain, encode_blocks
from metricsd.codec.tail import decode_tails

T0 = 1_700_000_000_000


def _values(kind: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == 0:  # a counter in hundredths: delta of delta blocks
        return np.round(np.cumsum(rng.integers(0, 100, n)) * 0.01, 2)
    if kind == 1:  # any float: XOR
        return rng.normal(size=n)
    if kind == 2:  # a gauge in thousandths: delta blocks
        return np.round(rng.normal(size=n), 3)
    if kind == 3:  # constant: same blocks
        return np.full(n, 5.0)
    if kind == 4:  # steps and flats mixed: every mode in one chunk
        return np.round(np.cumsum(np.where(rng.random(n) < 0.5, 0.0, rng.integers(1, 9, n))), 0) * 1e6
    if kind == 5:  # a steady counter: every block a delta of delta one, the anchor solved from the end
        return np.round(np.cumsum(500 + rng.integers(-1, 2, n)) * 0.01, 2)
    return np.round(rng.normal(size=n) * 1e9, 0)  # large integers: wide deltas, shifts


def _chunks(seed: int, k: int) -> tuple[bytes, list[int], list[int], list[int], np.ndarray, np.ndarray]:
    """``k`` single-chunk series of the codec's own making: (buffer, starts, ends, counts, t, v)."""
    rng = np.random.default_rng(seed)
    bufs, counts, ts, vs = [], [], [], []
    for _ in range(k):
        block = int(rng.integers(1, 40))
        n_blocks = int(rng.integers(1, 30))
        n = block * n_blocks
        step = rng.choice([10_000, 15_000]) if rng.random() < 0.5 else None
        t = T0 + np.cumsum(np.full(n, step) if step else rng.integers(1, 20_000, n))
        v = _values(int(rng.integers(0, 7)), n, rng)
        chain = Chain.empty(1)
        pieces: list[bytes] = []
        for b in range(n_blocks):
            cut = slice(b * block, (b + 1) * block)
            enc = encode_blocks(t[None, cut], v[None, cut], chain, block)
            if enc.started[0] and b:
                break  # the values left the chunk's family: keep one chunk
            pieces.append(enc.data.tobytes())
            chain = enc.after
        got = block * len(pieces)
        bufs.append(b"".join(pieces))
        counts.append(got)
        ts.append(t[:got])
        vs.append(v[:got])
    ends = np.cumsum([len(b) for b in bufs]).tolist()
    starts = [e - len(b) for e, b in zip(ends, bufs, strict=True)]
    return b"".join(bufs), starts, ends, counts, np.array(ts, dtype=object), np.array(vs, dtype=object)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(1, 12))
def test_tails_equal_the_whole_chunks_newest_samples(seed: int, k: int) -> None:
    buf, starts, ends, counts, ts, vs = _chunks(seed, k)
    rng = np.random.default_rng(seed + 1)
    want = np.array([int(rng.integers(1, c + 2)) for c in counts])
    c = np.array(counts)
    t_end = np.array([t[-1] for t in ts], np.int64)
    t_prev = np.array([t[-2] if len(t) > 1 else 0 for t in ts], np.int64)
    v_end = np.array([v[-1] for v in vs], np.float64)
    v_prev = np.array([v[-2] if len(v) > 1 else 0.0 for v in vs], np.float64)
    tails = decode_tails(buf, np.array(starts), np.array(ends), c, want, t_end, t_prev, v_end, v_prev)
    at = 0
    for i in range(k):
        full_t, full_v = decode_chunks(buf, [starts[i]], [ends[i]], [counts[i]])
        if not tails.ok[i]:
            assert tails.counts[i] == 0
            continue
        n = int(tails.counts[i])
        assert max(int(want[i]), 2) <= n < counts[i]  # enough, and not the whole chunk
        assert tails.t[at : at + n].tolist() == full_t[-n:].tolist()
        assert tails.v[at : at + n].view(np.int64).tolist() == full_v[-n:].view(np.int64).tolist()
        assert int(tails.before[i]) == int(full_t[-n - 1])
        at += n
    assert at == len(tails.t) == len(tails.v)


def test_tails_are_taken_for_long_chunks_of_every_kind() -> None:
    """The test above would pass if no tail were ever decoded: here each kind of chunk is."""
    for kind in range(7):
        rng = np.random.default_rng(kind)
        n, block = 640, 32
        t = T0 + np.cumsum(rng.integers(9_000, 11_000, n))
        v = _values(kind, n, rng)
        chain = Chain.empty(1)
        pieces = []
        for b in range(n // block):
            cut = slice(b * block, (b + 1) * block)
            enc = encode_blocks(t[None, cut], v[None, cut], chain, block)
            assert not enc.started[0] or b == 0
            pieces.append(enc.data.tobytes())
            chain = enc.after
        buf = b"".join(pieces)
        tails = decode_tails(buf, np.array([0]), np.array([len(buf)]), np.array([n]), np.array([100]),
                             t[-1:], t[-2:-1], v[-1:], v[-2:-1])
        if kind == 4:  # delta of delta blocks between others: may have to start further back, never wrong
            assert not tails.ok[0] or int(tails.counts[0]) >= 100
            continue
        assert tails.ok[0] and 100 <= int(tails.counts[0]) <= 100 + 2 * block, kind
        got = int(tails.counts[0])
        assert tails.t.tolist() == t[-got:].tolist()
        assert tails.v.view(np.int64).tolist() == v[-got:].view(np.int64).tolist()
