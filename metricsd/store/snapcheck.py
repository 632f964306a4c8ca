"""Reading a snapshot file back from the disk, before the WAL it covers is deleted.

A snapshot replaces the WAL segments below its position (metricsd/store/durable.py: the WAL is
checkpointed after each snapshot, so the data directory does not hold the same samples twice).
Once they are gone the snapshot is the only copy of what they held, so it is read back first:
its pages are dropped from the page cache (it was fsynced, so they are clean), and the file is
read again, in pieces, checking the structure and every section's CRC as a restart's reader
would (metricsd/store/snapshot.py ``read_sections``) without decompressing or keeping anything.
What it read is dropped from the page cache again: a snapshot is read only at a restart.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import BinaryIO

from metricsd.store import snapshot as sn
from metricsd.store.snapshot import SnapshotError

__all__ = ["verify_snapshot"]

PIECE = 4 << 20  # bytes read at a time


def _drop_cached(fd: int) -> None:
    """Drop the file's (clean) pages from the page cache, so that the next read comes from the disk."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def verify_snapshot(path: Path) -> int:
    """Read a version-2 snapshot back from the disk and check it as the reader would; its size.

    Raises SnapshotError naming the byte where it is wrong, OSError when it cannot be read."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        _drop_cached(fd)
        try:
            return _check(f, os.fstat(fd).st_size)
        finally:
            _drop_cached(fd)


def _read(f: BinaryIO, n: int, at: int) -> bytes:
    got = f.read(n)
    if len(got) != n:
        raise SnapshotError(f"truncated at byte {at + len(got)}")
    return got


def _check(f: BinaryIO, size: int) -> int:
    magic, version, flags = sn._FILE_HEADER.unpack(_read(f, sn._FILE_HEADER.size, 0))
    if magic != sn.MAGIC or version != sn.VERSION or flags:
        raise SnapshotError(f"not a version-{sn.VERSION} snapshot (magic {bytes(magic)!r}, version {version})")
    pos = sn._FILE_HEADER.size
    seen: set[bytes] = set()
    while True:
        header = _read(f, sn._SECTION.size, pos)
        tag, dtype, codec, n, crc = sn._SECTION.unpack(header)
        start, pos = pos, pos + sn._SECTION.size
        running = zlib.crc32(header[:-4])
        if tag == sn._END:
            if running != crc or dtype or codec or n != len(seen):
                raise SnapshotError(f"end marker at byte {start}: bad checksum or count")
            if pos != size:
                raise SnapshotError(f"{size - pos} bytes after the end marker")
            break
        if tag in seen or sn._SCHEMA.get(tag) != dtype or codec not in (sn.CODEC_RAW, sn.CODEC_ZSTD):
            raise SnapshotError(f"unexpected section {bytes(tag)!r} (type {dtype}, codec {codec}) at byte {start}")
        if pos + n > size:
            raise SnapshotError(f"section {tag.decode()} at byte {start} runs past the end of the file")
        left = n
        while left:
            piece = _read(f, min(left, PIECE), pos + n - left)
            running = zlib.crc32(piece, running)
            left -= len(piece)
        if running != crc:
            raise SnapshotError(f"section {tag.decode()} at byte {start}: checksum mismatch")
        seen.add(tag)
        pos += n
    missing = sorted(t.decode() for t in set(sn._SCHEMA) - seen)
    if missing:
        raise SnapshotError(f"sections missing: {missing}")
    return size
