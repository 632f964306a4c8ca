"""The push buffer: FIFO order, the byte bound dropping the oldest, spilling to and replaying from the spool."""

from __future__ import annotations

import logging
import random
from collections import deque
from pathlib import Path

import pytest

from metricsd.agent import spool
from metricsd.agent.buffer import BufferSettings, PushBuffer
from metricsd.model import Labels, make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb

SERIES: list[Labels] = [make_labels("m", {"namespace": "ns", "pod": f"p{i}"}) for i in range(4)]
IDS = [series_id(lab) for lab in SERIES]
LABELS = dict(zip(IDS, SERIES, strict=True))


def batch(ts: int, n: int = 4) -> pb.WriteRequest:
    """One tick of ``n`` series at ``ts``, values derived from ts so a mix-up is visible."""
    return pb.WriteRequest(ids=IDS[:n], counts=[1] * n, timestamps=[ts] * n, values=[ts + i / 10 for i in range(n)])


def size_of(ts: int) -> int:
    return batch(ts).ByteSize()


def drain(buf: PushBuffer) -> list[pb.WriteRequest]:
    out = []
    while (b := buf.peek()) is not None:
        out.append(b.request)
        assert buf.remove(b.seq)
        buf._check()
    return out


def crash(buf: PushBuffer) -> None:
    """Leave a buffer as a killed process would: files closed by the OS, no consumed mark."""
    seg = buf._segment
    if seg is not None and seg.writer is not None:
        seg.writer.close()


def stamps(reqs: list[pb.WriteRequest]) -> list[int]:
    return [r.timestamps[0] for r in reqs]


def test_batches_leave_in_the_order_they_came() -> None:
    buf = PushBuffer(BufferSettings(max_bytes=1 << 20))
    for ts in range(1000, 1010):
        buf.push(batch(ts), LABELS, collected_ms=ts)
    buf._check()
    assert len(buf) == 10 and buf.samples == 40
    assert stamps(drain(buf)) == list(range(1000, 1010))
    assert len(buf) == 0 and buf.total_bytes == 0


def test_overflow_drops_the_oldest_and_counts_it(caplog: pytest.LogCaptureFixture) -> None:
    one = size_of(1000)
    buf = PushBuffer(BufferSettings(max_bytes=5 * one))
    with caplog.at_level(logging.WARNING, "metricsd.agent.buffer"):
        for ts in range(1000, 1008):
            buf.push(batch(ts), LABELS)
    buf._check()
    assert buf.stats.dropped_batches == 3 and buf.stats.dropped_samples == 12
    assert buf.total_bytes <= 5 * one
    assert stamps(drain(buf)) == [1003, 1004, 1005, 1006, 1007]
    drops = [r for r in caplog.records if "dropped the" in r.getMessage()]
    assert len(drops) == 3 and "3 dropped since start" in drops[-1].getMessage()


def test_overflow_spares_the_batch_being_sent() -> None:
    one = size_of(1000)
    buf = PushBuffer(BufferSettings(max_bytes=3 * one))
    for ts in (1000, 1001, 1002):
        buf.push(batch(ts), LABELS)
    head = buf.peek()
    assert head is not None and head.request.timestamps[0] == 1000
    buf.push(batch(1003), LABELS)
    buf._check()
    # 1000 is in flight: the oldest of the others (1001) goes instead.
    assert buf.stats.dropped_batches == 1
    assert buf.remove(head.seq)
    assert stamps(drain(buf)) == [1002, 1003]


def test_remove_of_a_batch_that_is_no_longer_the_oldest_is_refused() -> None:
    buf = PushBuffer(BufferSettings(max_bytes=1 << 20))
    s1 = buf.push(batch(1), LABELS)
    s2 = buf.push(batch(2), LABELS)
    assert not buf.remove(s2)
    assert buf.remove(s1) and not buf.remove(s1)
    assert len(buf) == 1


def test_past_the_memory_size_batches_go_to_the_spool_and_come_back_in_order(tmp_path: Path) -> None:
    one = size_of(1000)
    buf = PushBuffer(BufferSettings(max_bytes=1 << 20, memory_bytes=3 * one, directory=tmp_path,
                                    segment_bytes=4 * one))
    for ts in range(1000, 1020):
        buf.push(batch(ts), LABELS, collected_ms=ts)
    buf._check()
    assert buf.memory_bytes <= 3 * one and buf.disk_bytes > 0
    assert buf.stats.spilled_batches == 17
    assert len(list(spool.iter_segments(tmp_path))) > 1
    out = drain(buf)
    assert stamps(out) == list(range(1000, 1020))
    assert [list(r.values) for r in out] == [list(batch(ts).values) for ts in range(1000, 1020)]
    assert all(not r.series for r in out), "labels travel from the registry, not the spool"
    # Segments whose batches all left are deleted (the one being written may stay, empty).
    assert len(list(spool.iter_segments(tmp_path))) <= 1
    buf.close()


def test_the_spool_survives_a_restart(tmp_path: Path) -> None:
    settings = BufferSettings(max_bytes=1 << 20, memory_bytes=2 * size_of(1000), directory=tmp_path)
    buf = PushBuffer(settings)
    for ts in range(1000, 1010):
        buf.push(batch(ts), LABELS, collected_ms=ts)
    # Three batches delivered before the restart, one in flight and not acknowledged.
    for _ in range(3):
        b = buf.peek()
        assert b is not None and buf.remove(b.seq)
    assert buf.peek() is not None
    buf.close()  # what is still in memory goes to the spool too

    again = PushBuffer(settings)
    again._check()
    assert again.stats.replayed_batches == 7 and again.stats.replayed_samples == 28
    for sid, labels in LABELS.items():
        assert again.labels.get(sid) == labels, "labels come back from the spool"
    head = again.peek()
    assert head is not None and head.collected_ms == 1003
    # New batches queue behind the replayed ones.
    again.push(batch(2000), LABELS)
    assert stamps(drain(again)) == [*range(1003, 1010), 2000]
    again.close()
    assert len(PushBuffer(settings)) == 0


def test_after_a_crash_the_spool_is_replayed_from_the_last_consumed_mark(tmp_path: Path) -> None:
    """No close: batches delivered since the last mark are sent again (the store drops repeats)."""
    settings = BufferSettings(max_bytes=1 << 20, memory_bytes=0, directory=tmp_path)
    buf = PushBuffer(settings)
    for ts in range(1000, 1005):
        buf.push(batch(ts), LABELS)
    b = buf.peek()
    assert b is not None and buf.remove(b.seq)
    crash(buf)
    again = PushBuffer(settings)
    assert stamps(drain(again)) == list(range(1000, 1005))
    again.close()


def test_a_torn_or_damaged_record_costs_the_rest_of_its_segment_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = BufferSettings(max_bytes=1 << 20, memory_bytes=0, directory=tmp_path, segment_bytes=1 << 20)
    buf = PushBuffer(settings)
    for ts in range(1000, 1004):
        buf.push(batch(ts), LABELS)
    crash(buf)
    (seg,) = [p for _, p in spool.iter_segments(tmp_path)]
    data = bytearray(seg.read_bytes())
    records = spool.scan_segment(seg).records
    assert [r.seq for r in records] == [1, 2, 3, 4]
    data[records[2].offset + 20] ^= 0xFF  # flip a byte inside the third record
    seg.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "metricsd.agent.buffer"):
        again = PushBuffer(settings)
    assert again.stats.spool_problems["crc"] == 1
    assert any("CRC mismatch" in r.getMessage() for r in caplog.records)
    assert stamps(drain(again)) == [1000, 1001]

    # A torn tail (a crash mid-append) is reported as truncated.
    for ts in range(3000, 3002):
        again.push(batch(ts), LABELS)
    crash(again)
    newest = max(p for _, p in spool.iter_segments(tmp_path))
    newest.write_bytes(newest.read_bytes()[:-5])
    third = PushBuffer(settings)
    assert third.stats.spool_problems["truncated"] == 1
    assert stamps(drain(third)) == [3000]
    third.close()


def test_records_round_trip_and_reject_garbage(tmp_path: Path) -> None:
    rec = spool.encode_record(7, 123, 4, b"payload")
    path = tmp_path / spool.segment_name(1)
    path.write_bytes(spool.MAGIC + rec + rec[:3])
    scan = spool.scan_segment(path)
    assert [(r.seq, r.collected_ms, r.samples, r.payload) for r in scan.records] == [(7, 123, 4, b"payload")]
    assert scan.problem.startswith("truncated record header")
    path.write_bytes(b"NOTASPOOL" + rec)
    assert spool.scan_segment(path).problem == "not a spool segment (bad magic)"
    assert spool.segment_number(spool.segment_name(42)) == 42 and spool.segment_number("x.spool") is None


def test_random_operations_against_a_plain_deque(tmp_path: Path) -> None:
    """The buffer behaves like a bounded deque of batches, whatever mix of memory and spool."""
    rng = random.Random(7)
    one = size_of(1000)
    buf = PushBuffer(BufferSettings(max_bytes=12 * one, memory_bytes=4 * one, directory=tmp_path,
                                    segment_bytes=3 * one), logger=logging.getLogger("quiet"))
    oracle: deque[int] = deque()
    inflight: int | None = None
    ts = 1000
    dropped_total = 0
    for _ in range(600):
        op = rng.random()
        if op < 0.55:
            before = buf.stats.dropped_batches
            buf.push(batch(ts), LABELS)
            oracle.append(ts)
            ts += 1
            # Whatever was dropped was the oldest, sparing the batch in flight.
            for _ in range(buf.stats.dropped_batches - before):
                del oracle[1 if inflight is not None and oracle[0] == inflight else 0]
                dropped_total += 1
            assert buf.total_bytes <= 12 * one or len(buf) == 1
        elif op < 0.9:
            b = buf.peek()
            assert (b.request.timestamps[0] if b else None) == (oracle[0] if oracle else None)
            inflight = oracle[0] if oracle else None
            if b is not None and rng.random() < 0.7:
                assert buf.remove(b.seq)
                oracle.popleft()
                inflight = None
        else:
            buf.close()
            buf = PushBuffer(buf.settings, logger=logging.getLogger("quiet"))
            inflight = None
            for _ in range(buf.stats.dropped_batches):  # spooled records are larger than in memory
                oracle.popleft()
            dropped_total += buf.stats.dropped_batches
        buf._check()
        assert len(buf) == len(oracle)
    assert dropped_total > 0 and buf.disk_bytes > 0, "the run exercised drops and the spool"
    assert stamps(drain(buf)) == list(oracle)
    buf.close()
