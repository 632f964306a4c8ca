"""Chunk compression for sealed series: Gorilla-style timestamps and floats, vectorised with NumPy.

The byte layout is drawn in FORMAT.md beside this file.
"""

from __future__ import annotations

from metricsd.codec.chunk import chunk_count, chunk_time_range, decode_chunk, encode_chunk, encode_chunks
from metricsd.codec.errors import CorruptChunk

__all__ = ["CorruptChunk", "chunk_count", "chunk_time_range", "decode_chunk", "encode_chunk", "encode_chunks"]
