"""The stated-length check shared by snapshot sections and WAL records."""

from __future__ import annotations

import cramjam
import pytest

from metricsd.codec.zstdsized import decompress_exact


def test_a_frame_decompresses_to_its_stated_length() -> None:
    raw = b"metricsd" * 100
    assert bytes(decompress_exact(bytes(cramjam.zstd.compress(raw)), len(raw))) == raw


def test_a_frame_holding_another_length_is_refused() -> None:
    frame = bytes(cramjam.zstd.compress(b"x" * 100))
    with pytest.raises(ValueError, match="decompresses to 100 bytes, not the 101 stated"):
        decompress_exact(frame, 101)
    with pytest.raises(ValueError):
        decompress_exact(frame, 99)


def test_bytes_that_are_not_zstd_are_refused() -> None:
    with pytest.raises(ValueError):
        decompress_exact(b"not a zstd frame", 16)
