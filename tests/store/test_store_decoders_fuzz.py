"""Every decoder of bytes from outside, fed random and mutated bytes: only its documented error
comes out (never another exception, a hang or a crash) and nothing stored changes.

WAL segments (scan_records), snapshot files (read_snapshot), Write requests (StoreAPI.write) and
the agent's spool segments (scan_segment). The chunk codec has its own (tests/codec) and remote
write bodies theirs (tests/http/test_http_remote_write_fuzz.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.agent.spool import MAGIC, encode_record, scan_segment
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import StoreAPI
from metricsd.store.engine import Store
from metricsd.store.snapshot import SnapshotError, capture, read_snapshot, write_snapshot
from metricsd.store.wal import RecordType
from metricsd.store.wal.log import WalPosition
from metricsd.store.wal.record import ScanEnd, encode_record_header, scan_records

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None, extra: bytes) -> bytes:
    """Flip bytes at positions (mod length), cut the tail, append bytes."""
    buf = bytearray(data)
    for pos, val in edits:
        if buf:
            buf[pos % len(buf)] ^= val or 1
    if cut is not None and buf:
        del buf[cut % len(buf):]
    return bytes(buf) + extra


MUTATIONS = (st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=8),
             st.none() | st.integers(0, 10**6), st.binary(max_size=64))


def one_write(pod: str, ts: list[int], vals: list[float]) -> pb.WriteRequest:
    labels = make_labels("cpu", {"namespace": "ns", "pod": pod})
    sid = series_id(labels)
    req = pb.WriteRequest(ids=[sid], counts=[len(ts)], timestamps=ts, values=vals)
    req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return req


def _wal_bytes() -> bytes:
    payloads = [one_write(f"p{i}", [1000 * i, 1000 * i + 10], [1.0, 2.0]).SerializeToString() for i in range(5)]
    return b"".join(encode_record_header(RecordType.WRITE, p) + p for p in payloads)


WAL = _wal_bytes()


@FUZZ
@given(*MUTATIONS)
def test_a_damaged_wal_yields_only_checksummed_records_then_stops(edits: list[tuple[int, int]], cut: int | None,
                                                                   extra: bytes) -> None:
    data = mutate(WAL, edits, cut, extra)
    end = ScanEnd(0)
    records = list(scan_records(data, 0, end))
    assert 0 <= end.offset <= len(data)
    assert (end.reason == "") == (end.offset == len(data))
    for _, rtype, payload in records:
        assert rtype in RecordType
        assert len(payload) <= len(data)


@FUZZ
@given(st.binary(max_size=256))
def test_random_bytes_never_break_the_wal_scan(data: bytes) -> None:
    end = ScanEnd(0)
    list(scan_records(data, 0, end))
    assert end.offset <= len(data)


@pytest.fixture(scope="module")
def snapshot_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    store = Store()
    api = StoreAPI(store)
    for i in range(20):
        api.write(one_write(f"p{i}", [60_000 * k for k in range(30)], [float(k) for k in range(30)]))
    path, _ = write_snapshot(tmp_path_factory.mktemp("snap"), capture(store, WalPosition(3, 128)))
    return path.read_bytes()


@FUZZ
@given(*MUTATIONS)
def test_a_damaged_snapshot_is_refused_with_snapshot_error(snapshot_bytes: bytes, tmp_path: Path,
                                                           edits: list[tuple[int, int]], cut: int | None,
                                                           extra: bytes) -> None:
    path = tmp_path / "00000003.snap"
    damaged = mutate(snapshot_bytes, edits, cut, extra)
    path.write_bytes(damaged)
    try:
        read_snapshot(path)
    except SnapshotError:
        return
    assert damaged == snapshot_bytes or (not edits and cut is None and not extra)


def _state(store: Store) -> tuple[object, ...]:
    st_ = store.stats()
    return st_["series"], st_["samples"], st_["head_samples"], st_["chunk_samples"]


@pytest.fixture(scope="module")
def api() -> StoreAPI:
    api = StoreAPI(Store())
    api.write(one_write("base", [1000, 2000], [1.0, 2.0]))
    return api


@FUZZ
@given(ids=st.lists(st.integers(0, 2**64 - 1), max_size=4), counts=st.lists(st.integers(-3, 5), max_size=4),
       timestamps=st.lists(st.integers(-2**63, 2**63 - 1), max_size=8),
       values=st.lists(st.floats(allow_nan=True), max_size=8), with_labels=st.booleans())
def test_a_malformed_write_is_bad_request_and_stores_nothing(api: StoreAPI, ids: list[int], counts: list[int],
                                                             timestamps: list[int], values: list[float],
                                                             with_labels: bool) -> None:
    req = pb.WriteRequest(ids=ids, counts=[max(c, 0) for c in counts], timestamps=timestamps, values=values)
    if with_labels:
        for sid in ids[:2]:
            req.series.add(id=sid).labels.extend(labels_to_pb(make_labels("cpu", {"namespace": "ns", "pod": "q"})))
    malformed = (len(ids) != len(counts) or sum(max(c, 0) for c in counts) != len(timestamps)
                 or len(timestamps) != len(values))
    before = _state(api.store)
    try:
        api.write(req)
    except BadRequest:
        assert _state(api.store) == before
        return
    assert not malformed, "a malformed request was accepted"


@FUZZ
@given(*MUTATIONS)
def test_a_damaged_spool_segment_gives_back_its_intact_records_and_says_why(
        tmp_path: Path, edits: list[tuple[int, int]], cut: int | None, extra: bytes) -> None:
    good = MAGIC + b"".join(encode_record(i, 1000 * i, 3, bytes([i]) * 40) for i in range(4))
    path = tmp_path / "00000001.spool"
    data = mutate(good, edits, cut, extra)
    path.write_bytes(data)
    res = scan_segment(path)
    assert len(res.records) <= 4 + len(extra) // 20
    assert all(r.offset + r.size <= len(data) for r in res.records)
    if data == good:
        assert len(res.records) == 4 and res.problem == ""


def test_numpy_is_not_the_reason_a_write_fails() -> None:
    """Sanity of the oracle above: a well-formed write passes."""
    api = StoreAPI(Store())
    assert api.write(one_write("x", [1, 2], [1.0, np.nan])).samples_written == 2
