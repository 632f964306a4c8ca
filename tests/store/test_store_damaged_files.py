"""A torn or corrupted snapshot or WAL segment at start: found by checksum, reported with the file and
the byte; the store falls back to the previous snapshot and the WAL, reports what it could not read as
lost (so a cluster store catches up from its peers before serving reads), and never holds a sample,
or a value, that was not written."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_state import assert_same_state

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.durable import DurabilitySettings, open_store
from metricsd.store.engine import Store
from metricsd.store.recovery import request_arrays
from metricsd.store.settings import StoreSettings
from metricsd.store.wal import FsyncPolicy
from metricsd.store.wal.record import RECORD_HEADER_SIZE, SEGMENT_HEADER_SIZE

HOUR = 3_600_000
T0 = 1_700_000_000_000
SETTINGS = StoreSettings(chunk_samples=8, head_keep=3, ooo_window_ms=HOUR, max_future_ms=None)
DSET = DurabilitySettings(fsync=FsyncPolicy.NEVER, segment_bytes=2048, keep_snapshots=2)
LABELS = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(12)]
IDS = [series_id(lab) for lab in LABELS]


def _request(rng: np.random.Generator, tick: int, labelled: set[int]) -> pb.WriteRequest:
    series = sorted(rng.choice(len(LABELS), size=4, replace=False).tolist())
    req = pb.WriteRequest(ids=[IDS[i] for i in series], counts=[2] * len(series),
                          timestamps=[T0 + tick * 1000 + k for _ in series for k in (0, 1)],
                          values=rng.normal(size=2 * len(series)).tolist())
    for i in series:
        if i not in labelled:
            labelled.add(i)
            req.series.add(id=IDS[i]).labels.extend(labels_to_pb(LABELS[i]))
    return req


def _build(data: Path) -> Store:
    """A data directory with two snapshots, several WAL segments after and between them, left as a
    kill -9 leaves it; returns the store that never stopped."""
    rng = np.random.default_rng(7)
    ref = Store(SETTINGS)
    _, d = open_store(data, SETTINGS, durability=DSET)
    labelled: set[int] = set()
    for tick in range(120):
        req = _request(rng, tick, labelled)
        assert d.api().write(req).samples_written == 8
        ref.write(*request_arrays(req), {s.id: tuple((x.name, x.value) for x in s.labels) for s in req.series})
        if tick in (40, 80):
            d.snapshot_now()
    d.close(snapshot=False)
    return ref


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Store]:
    data = tmp_path_factory.mktemp("pristine") / "data"
    return data, _build(data)


def _copy(pristine: tuple[Path, Store], dst: Path) -> Path:
    shutil.copytree(pristine[0], dst)
    return dst


def _flip(path: Path, offset: int, bit: int = 0x10) -> None:
    buf = bytearray(path.read_bytes())
    buf[offset] ^= bit
    path.write_bytes(bytes(buf))


def _samples(store: Store) -> dict[int, dict[int, int]]:
    out = {}
    for row in store.index.live_rows():
        t, v = store.series_samples(row, 0, 2**62)
        out[store.index.ids[row]] = dict(zip(t.tolist(), v.view(np.int64).tolist(), strict=True))
    return out


def test_the_build_has_two_snapshots_and_wal_segments_between_and_after(pristine: tuple[Path, Store]) -> None:
    data, _ = pristine
    assert len(list((data / "snapshots").glob("*.snap"))) == 2
    assert len(list((data / "wal").glob("*.wal"))) >= 6


def test_a_damaged_newest_snapshot_is_named_with_its_byte_and_the_older_one_and_the_wal_lose_nothing(
        pristine: tuple[Path, Store], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _copy(pristine, tmp_path / "d")
    newest = sorted((data / "snapshots").glob("*.snap"))[-1]
    _flip(newest, newest.stat().st_size // 2)
    with caplog.at_level(logging.WARNING):
        store, d = open_store(data, SETTINGS, durability=DSET)
    try:
        assert d.recovery.snapshots_skipped == [newest.name] and d.recovery.lost == []
        assert_same_state(store, pristine[1])
        [warning] = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
        assert warning.startswith(f"snapshot {newest.name} unusable (section ") and "at byte " in warning
        assert "checksum mismatch" in warning and (data / "snapshots" / f"{newest.name}.corrupt").exists()
    finally:
        d.close(snapshot=False)


def test_every_snapshot_damaged_after_the_wal_was_pruned_is_reported_as_lost(
        pristine: tuple[Path, Store], tmp_path: Path) -> None:
    data = _copy(pristine, tmp_path / "d")
    for snap in (data / "snapshots").glob("*.snap"):
        _flip(snap, 10)
    first = min(int(p.stem) for p in (data / "wal").glob("*.wal"))
    assert first > 1  # segments below the older snapshot were deleted
    store, d = open_store(data, SETTINGS, durability=DSET)
    try:
        assert d.recovery.lost[0] == f"WAL segments 1-{first - 1} missing (no snapshot could be used)"
        assert d.recovery.lost[1].endswith("series entries of later records dropped (their labels were in lost "
                                           "records)")
        assert d.stats()["recovery_losses"] == 2
        _assert_subset(store, pristine[1])
    finally:
        d.close(snapshot=False)


def test_a_corrupt_record_in_a_middle_segment_is_named_kept_aside_and_reported_as_lost(
        pristine: tuple[Path, Store], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _copy(pristine, tmp_path / "d")
    segs = sorted((data / "wal").glob("*.wal"))
    start = int(sorted((data / "snapshots").glob("*.snap"))[-1].stem)
    victim = next(p for p in segs if int(p.stem) > start and p != segs[-1])  # replayed, not the newest
    offset = SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE + 5  # inside the first record's payload
    _flip(victim, offset)
    with caplog.at_level(logging.WARNING):
        store, d = open_store(data, SETTINGS, durability=DSET)
    try:
        assert d.recovery.lost[0].startswith(f"WAL segment {victim.stem}: record checksum mismatch at offset "
                                             f"{SEGMENT_HEADER_SIZE}, ")
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any(str(victim) in e and f"at offset {SEGMENT_HEADER_SIZE}" in e for e in errors), errors
        kept = victim.with_name(f"{victim.name}.corrupt-{SEGMENT_HEADER_SIZE}")
        assert kept.exists() and kept.stat().st_size > RECORD_HEADER_SIZE
        got, want = _samples(store), _samples(pristine[1])
        _assert_subset(store, pristine[1])
        assert sum(map(len, got.values())) < sum(map(len, want.values()))  # the segment's records are gone ...
        newest_ts = T0 + 119 * 1000
        assert any(newest_ts in s for s in got.values())  # ... but the later segments were replayed
    finally:
        d.close(snapshot=False)


def test_a_record_torn_at_the_end_of_the_newest_segment_is_no_loss(pristine: tuple[Path, Store],
                                                                   tmp_path: Path) -> None:
    data = _copy(pristine, tmp_path / "d")
    newest = sorted((data / "wal").glob("*.wal"))[-1]
    with open(newest, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x01")  # a record header cut short: a crash mid-append
    store, d = open_store(data, SETTINGS, durability=DSET)
    try:
        assert d.recovery.lost == [] and d.recovery.corrupt_tails == 1
        assert_same_state(store, pristine[1])
    finally:
        d.close(snapshot=False)


def _assert_subset(got: Store, want: Store) -> None:
    """Every sample ``got`` holds, ``want`` holds too, with the same value bits; labels agree."""
    w = _samples(want)
    for sid, samples in _samples(got).items():
        assert sid in w, f"series {sid:#x} was never written"
        for t, bits in samples.items():
            assert w[sid].get(t) == bits, f"series {sid:#x} at {t}: a sample or value that was not written"
        row, wrow = got.index.row_of(sid), want.index.row_of(sid)
        assert row is not None and wrow is not None and got.index.labels[row] == want.index.labels[wrow]


def _ambiguous(path: Path, offset: int) -> bool:
    """The length field of the last record of the newest segment: damaged, it reads as a record cut
    short by a crash, which was never acknowledged; nothing tells the two apart."""
    buf = path.read_bytes()
    pos = SEGMENT_HEADER_SIZE
    last = pos
    while pos + RECORD_HEADER_SIZE <= len(buf):
        last = pos
        pos += RECORD_HEADER_SIZE + int.from_bytes(buf[pos : pos + 4], "little")
    return last <= offset < last + 4


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_one_flipped_bit_anywhere_never_yields_a_sample_not_written_and_only_reported_loss_loses_any(
        pristine: tuple[Path, Store], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory(prefix="metricsd-damage-") as tmp:
        d_dir = _copy(pristine, Path(tmp) / "d")
        files = sorted([*(d_dir / "snapshots").glob("*.snap"), *(d_dir / "wal").glob("*.wal")])
        victim = data.draw(st.sampled_from(files), label="file")
        offset = data.draw(st.integers(0, victim.stat().st_size - 1), label="offset")
        bit = data.draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]), label="bit")
        newest_wal = victim == max((d_dir / "wal").glob("*.wal"))
        _flip(victim, offset, bit)
        store, d = open_store(d_dir, SETTINGS, durability=DSET)
        try:
            _assert_subset(store, pristine[1])
            if not d.recovery.lost and not (newest_wal and _ambiguous(victim, offset)):
                assert_same_state(store, pristine[1])
        finally:
            d.close(snapshot=False)
