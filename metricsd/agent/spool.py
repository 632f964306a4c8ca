"""The agent's spool files: length-prefixed, CRC-checked records of buffered Write batches.

The byte layout is drawn in metricsd/agent/FORMAT.md. A segment file is append-only; a reader
stops at the first record it cannot trust (a torn tail after a crash, a bad CRC) and says why,
so a damaged file costs the batches after the damage, never a wrong sample.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "MAGIC",
    "MAX_BODY_BYTES",
    "RECORD_OVERHEAD",
    "Record",
    "ScanResult",
    "SegmentWriter",
    "encode_record",
    "iter_segments",
    "read_consumed",
    "read_record_at",
    "read_records_at",
    "scan_segment",
    "segment_name",
    "segment_number",
    "write_consumed",
]

MAGIC = b"MDSPOOL1"  # FORMAT.md: segment header
_HEAD = struct.Struct("<II")  # FORMAT.md: record header: body length, CRC-32 of the body
_META = struct.Struct("<QqI")  # FORMAT.md: body prefix: seq, collected_ms, samples
RECORD_OVERHEAD = _HEAD.size + _META.size
MAX_BODY_BYTES = 1 << 28  # a length above this is damage, not a batch
CONSUMED_FILE = "consumed"
_SEGMENT_RE = re.compile(r"^segment-(\d{12})\.spool$")


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    collected_ms: int
    samples: int
    payload: bytes  # a serialized WriteRequest
    offset: int  # where the record starts in its file
    size: int  # the whole record, header included


@dataclass(slots=True)
class ScanResult:
    records: list[Record]
    problem: str = ""  # empty, or why reading stopped early ("truncated record at 123", ...)


def segment_name(number: int) -> str:
    return f"segment-{number:012d}.spool"


def segment_number(name: str) -> int | None:
    m = _SEGMENT_RE.match(name)
    return int(m.group(1)) if m else None


def encode_record(seq: int, collected_ms: int, samples: int, payload: bytes) -> bytes:
    body = _META.pack(seq, collected_ms, samples) + payload
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def _decode_at(data: bytes, offset: int) -> tuple[Record | None, str]:
    if len(data) - offset < _HEAD.size:
        return None, f"truncated record header at offset {offset}"
    length, crc = _HEAD.unpack_from(data, offset)
    if length < _META.size or length > MAX_BODY_BYTES:
        return None, f"implausible record length {length} at offset {offset}"
    start = offset + _HEAD.size
    if len(data) - start < length:
        return None, f"truncated record at offset {offset} ({len(data) - start} of {length} bytes)"
    body = data[start : start + length]
    if zlib.crc32(body) != crc:
        return None, f"CRC mismatch in record at offset {offset}"
    seq, collected_ms, samples = _META.unpack_from(body)
    return Record(seq, collected_ms, samples, bytes(body[_META.size :]), offset, _HEAD.size + length), ""


def scan_segment(path: Path) -> ScanResult:
    """Every intact record of a segment, in file order. Never raises on content; an unreadable
    file is reported as the problem with no records."""
    try:
        data = path.read_bytes()
    except OSError as e:
        return ScanResult([], f"cannot read: {e.strerror or e}")
    if data[: len(MAGIC)] != MAGIC:
        return ScanResult([], "not a spool segment (bad magic)")
    out: list[Record] = []
    offset = len(MAGIC)
    while offset < len(data):
        rec, problem = _decode_at(data, offset)
        if rec is None:
            return ScanResult(out, problem)
        out.append(rec)
        offset += rec.size
    return ScanResult(out)


def read_record_at(path: Path, offset: int, size: int) -> Record:
    """One record known to be intact (it was written or scanned by us); raises OSError or
    ValueError when the file changed under us."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    rec, problem = _decode_at(data, 0)
    if rec is None:
        raise ValueError(f"{path}: {problem}")
    return Record(rec.seq, rec.collected_ms, rec.samples, rec.payload, offset, rec.size)


def read_records_at(path: Path, offset: int, sizes: list[int]) -> list[Record]:
    """Records known to be intact that follow each other from ``offset`` (their ``sizes`` in
    order), read with one read; raises OSError or ValueError when the file changed under us."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(sum(sizes))
    out = []
    at = 0
    for size in sizes:
        rec, problem = _decode_at(data, at)
        if rec is None or rec.size != size:
            raise ValueError(f"{path}: {problem or 'a record of another size'} at offset {offset + at}")
        out.append(Record(rec.seq, rec.collected_ms, rec.samples, rec.payload, offset + at, rec.size))
        at += size
    return out


class SegmentWriter:
    """Appends records to a new segment file. Each record is flushed to the OS as it is written,
    so an agent that crashes loses none of them (a machine that crashes may lose the page cache;
    the agent does not fsync per batch)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "xb")  # noqa: SIM115 - held open across appends, closed by close()
        self._f.write(MAGIC)
        self._f.flush()
        self.size = len(MAGIC)

    def append(self, record: bytes) -> int:
        """Write one encoded record; returns its offset."""
        offset = self.size
        self._f.write(record)
        self._f.flush()
        self.size += len(record)
        return offset

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def iter_segments(directory: Path) -> Iterator[tuple[int, Path]]:
    """Segment files of a spool directory in the order they were created."""
    found = []
    for p in directory.iterdir():
        n = segment_number(p.name)
        if n is not None:
            found.append((n, p))
    yield from sorted(found)


def read_consumed(directory: Path) -> int:
    """The highest sequence number known to be sent or dropped (0 if none or unreadable)."""
    try:
        text = (directory / CONSUMED_FILE).read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def write_consumed(directory: Path, seq: int) -> None:
    """Atomically (write, then rename) record that every batch up to ``seq`` left the buffer."""
    tmp = directory / (CONSUMED_FILE + ".tmp")
    tmp.write_text(f"{seq}\n")
    os.replace(tmp, directory / CONSUMED_FILE)
