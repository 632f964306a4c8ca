"""The one exception a decoder raises, whatever is wrong with its input."""

from __future__ import annotations


class CorruptChunk(ValueError):
    """The bytes are not a chunk this codec wrote: truncated, flipped, or of an unknown encoding."""
