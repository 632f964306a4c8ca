"""The write-ahead log: round trips, torn and corrupt tails, segments, failed appends, fsync policies."""

from __future__ import annotations

import errno
import logging
import os
import random
from pathlib import Path

import pytest

from metricsd.store.wal import FsyncPolicy, RecordType, WalError, WalPosition, WriteAheadLog
from metricsd.store.wal.log import segment_path
from metricsd.store.wal.record import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    ScanEnd,
    encode_record_header,
    encode_segment_header,
    scan_records,
)


def _payloads(n: int, seed: int = 0) -> list[tuple[RecordType, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 7 == 3:
            out.append((RecordType.GC, b""))
        else:
            out.append((RecordType.WRITE, rng.randbytes(rng.choice([0, 1, 5, 40, 300, 2000]))))
    return out


def _write(d: Path, records: list[tuple[RecordType, bytes]], **kw: object) -> WriteAheadLog:
    wal = WriteAheadLog(d, **kw)  # type: ignore[arg-type]
    assert list(wal.replay()) == []
    wal.open_for_append()
    for rtype, payload in records:
        wal.append(rtype, payload)
    wal.close()
    return wal


def _replay(d: Path, start: WalPosition | None = None) -> tuple[list[tuple[RecordType, bytes]], WriteAheadLog]:
    wal = WriteAheadLog(d)
    got = [(rtype, bytes(p)) for _, rtype, p in wal.replay(start)]
    return got, wal


def test_record_header_bytes_are_pinned() -> None:
    assert encode_record_header(RecordType.WRITE, b"abc").hex() == "0300000001" + "3f277499"
    assert encode_record_header(RecordType.GC, b"").hex() == "0000000002" + "31962c28"
    assert encode_segment_header(7).hex() == "4d44574c" + "0100" + "0000" + "0700000000000000"


def test_round_trip_keeps_types_payloads_and_order(tmp_path: Path) -> None:
    records = _payloads(60)
    _write(tmp_path, records)
    got, wal = _replay(tmp_path)
    assert got == records
    assert wal.stats.records_replayed == 60 and wal.stats.corrupt_tails == 0


def test_positions_increase_and_replay_resumes_from_one(tmp_path: Path) -> None:
    records = _payloads(20)
    wal = WriteAheadLog(tmp_path, segment_bytes=1024)
    list(wal.replay())
    wal.open_for_append()
    positions = [wal.position]
    for rtype, payload in records:
        positions.append(wal.append(rtype, payload))
    wal.close()
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for k in (0, 5, 13):
        got, _ = _replay(tmp_path, positions[k] if positions[k].offset > SEGMENT_HEADER_SIZE or k == 0
                         else WalPosition(positions[k].segment, SEGMENT_HEADER_SIZE))
        assert got == records[k:]


def test_segments_roll_at_the_size_bound_and_are_deleted_below_a_position(tmp_path: Path) -> None:
    records = [(RecordType.WRITE, bytes([i]) * 100) for i in range(30)]
    _write(tmp_path, records, segment_bytes=512)
    wal = WriteAheadLog(tmp_path, segment_bytes=512)
    segs = wal.segments()
    assert len(segs) >= 7
    assert all(segment_path(tmp_path, s).stat().st_size <= 512 for s in segs)
    assert [(t, bytes(p)) for _, t, p in wal.replay()] == records
    wal.open_for_append()
    assert wal.position.segment == segs[-1] + 1
    assert wal.delete_before(segs[3]) == 3
    assert wal.segments()[:1] == [segs[3]]
    wal.close()


def test_a_record_bigger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    big = random.Random(2).randbytes(5000)  # random bytes: zstd cannot make them smaller
    records = [(RecordType.WRITE, b"x" * 10), (RecordType.WRITE, big), (RecordType.WRITE, b"z")]
    _write(tmp_path, records, segment_bytes=256)
    got, wal = _replay(tmp_path)
    assert got == records and len(wal.segments()) == 3


def test_a_file_cut_at_every_offset_of_its_last_record_replays_to_the_record_before(tmp_path: Path,
                                                                                   caplog: pytest.LogCaptureFixture
                                                                                   ) -> None:
    records = [(RecordType.WRITE, b"first"), (RecordType.GC, b""), (RecordType.WRITE, bytes(range(40)))]
    src = tmp_path / "src"
    _write(src, records)
    whole = segment_path(src, 1).read_bytes()
    last_start = len(whole) - RECORD_HEADER_SIZE - 40
    for cut in range(last_start, len(whole) + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        segment_path(d, 1).write_bytes(whole[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            got, wal = _replay(d)
        if cut == len(whole):
            assert got == records and wal.stats.corrupt_tails == 0
            continue
        assert got == records[:2], cut
        torn = cut > last_start
        assert wal.stats.corrupt_tails == int(torn)
        assert wal.stats.bytes_truncated == cut - last_start
        assert segment_path(d, 1).stat().st_size == last_start
        assert ("truncated to the last good record" in caplog.text) == torn
        # writing goes on in a fresh segment, and the next replay sees old and new records
        wal.open_for_append()
        wal.append(RecordType.WRITE, b"after")
        wal.close()
        assert _replay(d)[0] == [*records[:2], (RecordType.WRITE, b"after")]


def test_every_bit_flip_in_a_record_is_detected_and_cut_off(tmp_path: Path) -> None:
    records = [(RecordType.WRITE, b"one"), (RecordType.WRITE, b"the record we flip"), (RecordType.WRITE, b"three")]
    src = tmp_path / "src"
    _write(src, records)
    whole = segment_path(src, 1).read_bytes()
    start = SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE + 3
    end = start + RECORD_HEADER_SIZE + len(records[1][1])
    for bit in range(start * 8, end * 8):
        buf = bytearray(whole)
        buf[bit // 8] ^= 1 << (bit % 8)
        end_info = ScanEnd(SEGMENT_HEADER_SIZE)
        got = [(t, bytes(p)) for _, t, p in scan_records(bytes(buf), SEGMENT_HEADER_SIZE, end_info)]
        assert got == records[:1], bit
        assert end_info.offset == start and end_info.reason
    # and through the files: counted, truncated, no exception
    buf = bytearray(whole)
    buf[start + 12] ^= 0x10
    d = tmp_path / "flipped"
    d.mkdir()
    segment_path(d, 1).write_bytes(bytes(buf))
    got, wal = _replay(d)
    assert got == records[:1] and wal.stats.corrupt_tails == 1
    assert segment_path(d, 1).stat().st_size == start


def test_a_zero_filled_tail_is_truncated(tmp_path: Path) -> None:
    records = _payloads(5)
    _write(tmp_path, records)
    with open(segment_path(tmp_path, 1), "ab") as f:
        f.write(b"\0" * 4096)
    got, wal = _replay(tmp_path)
    assert got == records and wal.stats.corrupt_tails == 1 and wal.stats.bytes_truncated == 4096


def test_corruption_in_a_middle_segment_keeps_the_later_segments(tmp_path: Path) -> None:
    records = [(RecordType.WRITE, bytes([i]) * 100) for i in range(12)]
    _write(tmp_path, records, segment_bytes=400)  # 3 records a segment
    p = segment_path(tmp_path, 2)
    buf = bytearray(p.read_bytes())
    buf[-5] ^= 0xFF  # the last record of segment 2
    p.write_bytes(bytes(buf))
    got, wal = _replay(tmp_path)
    assert got == records[:5] + records[6:]
    assert wal.stats.corrupt_tails == 1


def test_an_unreadable_segment_header_is_moved_aside(tmp_path: Path) -> None:
    records = [(RecordType.WRITE, bytes([i]) * 100) for i in range(6)]
    _write(tmp_path, records, segment_bytes=400)
    p = segment_path(tmp_path, 1)
    buf = bytearray(p.read_bytes())
    buf[0] = ord("X")
    p.write_bytes(bytes(buf))
    got, wal = _replay(tmp_path)
    assert got == records[3:]
    assert not p.exists() and p.with_name(p.name + ".corrupt").exists()
    assert wal.stats.corrupt_tails == 1


def test_an_empty_segment_left_by_a_crash_is_removed(tmp_path: Path) -> None:
    _write(tmp_path, _payloads(3))
    segment_path(tmp_path, 2).write_bytes(b"MDW")
    got, wal = _replay(tmp_path)
    assert got == _payloads(3)
    assert wal.segments() == [1]


def test_a_failed_append_leaves_the_log_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal = WriteAheadLog(tmp_path)
    list(wal.replay())
    wal.open_for_append()
    wal.append(RecordType.WRITE, b"kept")
    size = segment_path(tmp_path, 1).stat().st_size
    real = os.writev

    def half_then_fail(fd: int, bufs: list[memoryview]) -> int:
        real(fd, [bytes(bufs[0])[:4]])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", half_then_fail)
    with pytest.raises(WalError, match="No space left"):
        wal.append(RecordType.WRITE, b"lost")
    monkeypatch.setattr(os, "writev", real)
    assert segment_path(tmp_path, 1).stat().st_size == size
    wal.append(RecordType.WRITE, b"later")
    wal.close()
    assert _replay(tmp_path)[0] == [(RecordType.WRITE, b"kept"), (RecordType.WRITE, b"later")]


def test_a_failed_fsync_stops_the_log_taking_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal = WriteAheadLog(tmp_path, FsyncPolicy.ALWAYS)
    list(wal.replay())
    wal.open_for_append()

    def fail(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", fail)
    with pytest.raises(WalError, match="fdatasync failed"):
        wal.append(RecordType.WRITE, b"x")
    monkeypatch.undo()
    with pytest.raises(WalError, match="unusable"):
        wal.append(RecordType.WRITE, b"y")
    assert wal.failed
    wal.close()


@pytest.mark.parametrize("policy", list(FsyncPolicy))
def test_fsync_policies(tmp_path: Path, policy: FsyncPolicy) -> None:
    wal = WriteAheadLog(tmp_path, policy)
    list(wal.replay())
    wal.open_for_append()
    for _ in range(5):
        wal.append(RecordType.WRITE, b"abc")
    if policy is FsyncPolicy.ALWAYS:
        assert wal.stats.fsyncs == 5 and not wal.dirty
    else:
        assert wal.stats.fsyncs == 0 and wal.dirty
        fd = wal.sync_handle()
        assert fd is not None and not wal.dirty
        os.fdatasync(fd)
        os.close(fd)
        assert wal.sync_handle() is None
    wal.close()


def test_appended_bytes_reach_the_file_before_append_returns(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, FsyncPolicy.NEVER)
    list(wal.replay())
    wal.open_for_append()
    wal.append(RecordType.WRITE, b"visible")
    # another reader (as after a process crash) sees the record without close() or sync()
    got = [(t, bytes(p)) for _, t, p in WriteAheadLog(tmp_path).replay()]
    assert got == [(RecordType.WRITE, b"visible")]
    wal.close()


def _write_request(n: int, seed: int = 0) -> bytes:
    """A WriteRequest as a store logs it: n series x 60 samples of a counter at microseconds."""
    import numpy as np

    from metricsd.proto import metricsd_pb2 as pb

    rng = np.random.default_rng(seed)
    ts = 1_700_000_000_000 + 10_000 * np.arange(60)
    vals = np.cumsum(rng.integers(0, 10**6, (n, 60)), axis=1) / 1e6
    return pb.WriteRequest(ids=range(1, n + 1), counts=[60] * n, timestamps=np.tile(ts, n).tolist(),
                           values=vals.reshape(-1).tolist()).SerializeToString()


def test_writes_are_logged_compressed_and_replay_as_they_were_given(tmp_path: Path) -> None:
    body = _write_request(100)
    records = [(RecordType.WRITE, body), (RecordType.GC, b""), (RecordType.CATCH_UP, body), (RecordType.WRITE, b"ab")]
    _write(tmp_path, records)
    raw = segment_path(tmp_path, 1).read_bytes()
    on_disk = [(t, len(p)) for _, t, p in scan_records(raw, SEGMENT_HEADER_SIZE, ScanEnd(0))]
    assert [t for t, _ in on_disk] == [RecordType.WRITE_ZSTD, RecordType.GC, RecordType.CATCH_UP_ZSTD,
                                       RecordType.WRITE]  # a short payload goes as it is
    assert on_disk[0][1] < 0.6 * len(body)  # repeated timestamps, ids in order: well under the proto
    got, _ = _replay(tmp_path)
    assert got == records


def test_a_compressed_record_that_does_not_decompress_cuts_its_segment_there(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Its CRC is good (only a writer's bug makes one): replay stops the segment there, as for a
    damaged record, and never raises."""
    good = _write_request(20)
    wal = _write(tmp_path, [(RecordType.WRITE, good)])
    bad_payload = (1000).to_bytes(4, "little") + b"not a zstd frame"
    with open(segment_path(tmp_path, 1), "ab") as f:
        f.write(encode_record_header(RecordType.WRITE_ZSTD, bad_payload) + bad_payload)
        f.write(encode_record_header(RecordType.GC, b""))
    del wal
    with caplog.at_level(logging.WARNING):
        got, wal = _replay(tmp_path)
    assert got == [(RecordType.WRITE, good)]
    assert wal.stats.corrupt_tails == 1


def test_an_uncompressed_log_from_before_replays(tmp_path: Path) -> None:
    """Stores before compression wrote WRITE and CATCH_UP payloads as they were."""
    body = _write_request(10)
    seg = bytearray(encode_segment_header(1))
    for rtype in (RecordType.WRITE, RecordType.CATCH_UP, RecordType.GC):
        payload = b"" if rtype is RecordType.GC else body
        seg += encode_record_header(rtype, payload) + payload
    segment_path(tmp_path, 1).write_bytes(bytes(seg))
    got, _ = _replay(tmp_path)
    assert got == [(RecordType.WRITE, body), (RecordType.CATCH_UP, body), (RecordType.GC, b"")]
