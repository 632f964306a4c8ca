"""codec/bits.py pack_into, the bit writer every sealed block's payloads go through: the bits it
writes are those of a plain big-endian bit writer, for any widths (1..64) and any start bits
(word-aligned ones included, where nothing spills into the next word)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.codec.bits import pack_into


def reference(rows: list[tuple[int, int, list[int]]], n_words: int) -> np.ndarray:
    """(start bit, width, values) per row, written bit by bit into big-endian uint64 words."""
    stream = bytearray(n_words * 8)
    for start, width, values in rows:
        for j, v in enumerate(values):
            for b in range(width):
                if (v >> (width - 1 - b)) & 1:
                    pos = start + j * width + b
                    stream[pos // 8] |= 0x80 >> (pos % 8)
    return np.frombuffer(bytes(stream), dtype=">u8").astype(np.uint64)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[tuple[int, int, list[int]]], int]:
    n = draw(st.integers(1, 12))
    k = draw(st.integers(1, 6))
    rows: list[tuple[int, int, list[int]]] = []
    bit = 0
    for _ in range(k):
        gap = draw(st.sampled_from([0, 0, 1, 7, 63, 64, 65]))  # zero bits before the row
        if len(rows) > 0 or draw(st.booleans()):
            bit += gap
        if draw(st.booleans()):
            bit = -(-bit // 64) * 64  # a word-aligned row: shift 0 for its first value
        width = draw(st.sampled_from([1, 2, 7, 8, 13, 31, 32, 33, 63, 64]) | st.integers(1, 64))
        values = draw(st.lists(st.integers(0, 2**width - 1), min_size=n, max_size=n))
        rows.append((bit, width, values))
        bit += n * width
    return rows, bit // 64 + 2


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_pack_into_writes_the_bits_of_a_plain_bit_writer(layout: tuple[list[tuple[int, int, list[int]]], int]) -> None:
    rows, n_words = layout
    words = np.zeros(n_words, np.uint64)
    pack_into(words, np.array([r[0] for r in rows], np.int64),
              np.array([r[2] for r in rows], dtype=np.uint64).reshape(len(rows), -1),
              np.array([r[1] for r in rows], np.int64))
    assert words.tolist() == reference(rows, n_words).tolist()


def test_a_full_width_value_at_a_word_boundary_spills_nothing_into_the_next_word() -> None:
    words = np.zeros(3, np.uint64)
    pack_into(words, np.array([64]), np.array([[2**64 - 1]], dtype=np.uint64), np.array([64]))
    assert words.tolist() == [0, 2**64 - 1, 0]
