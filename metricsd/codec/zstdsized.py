"""zstd payloads whose decompressed length is stated beside them (snapshot sections, WAL records).

Both formats store the length in their own field (FORMAT.md); this is the shared check that the
frame decompresses to exactly that many bytes, so neither reader trusts a frame over its header."""

from __future__ import annotations

import cramjam

__all__ = ["decompress_exact"]


def decompress_exact(frame: bytes | memoryview, raw_len: int) -> memoryview:
    """The frame decompressed into ``raw_len`` bytes. Raises ValueError when zstd refuses it or it
    holds another number of bytes."""
    out = bytearray(raw_len)
    try:
        got = cramjam.zstd.decompress_into(bytes(frame), out)
    except cramjam.DecompressionError as e:
        raise ValueError(str(e)) from e
    if got != raw_len:
        raise ValueError(f"decompresses to {got} bytes, not the {raw_len} stated")
    return memoryview(bytes(out))
