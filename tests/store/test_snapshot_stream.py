"""The streaming snapshot writer (metricsd/store/snapshot_write.py): what it writes reads back as
the whole in-memory image would, in pieces as small as one row; a file cut short or a writer
killed mid-file loses nothing acknowledged; files of the whole-image writer still read."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_state import assert_same_state
from test_snapshot_format import SETTINGS, build_store

from metricsd.model import make_labels, series_id, stale_marker
from metricsd.store import arena, snapshot_write
from metricsd.store.durable import open_store
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import SnapshotError, StoreImage, capture, read_snapshot, restore, write_snapshot
from metricsd.store.snapshot_write import capture_lean, crc32_combine
from metricsd.store.wal import WalPosition

HOUR = 3_600_000
V2_WHOLE = Path(__file__).parent / "data" / "v2_whole.snap"  # build_store() by the whole-image writer (67ba2a1)
ROOT = Path(__file__).resolve().parents[2]


def _same_image(got: StoreImage, want: StoreImage) -> None:
    """Field by field, floats bit for bit (the string table may be laid out differently: labels
    are compared decoded)."""
    assert got.position == want.position and got.meta == want.meta
    assert got.labels == want.labels
    for name in vars(want):
        if name in ("position", "meta", "labels"):
            continue
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, np.ndarray):
            assert np.asarray(a).shape == b.shape, name
            assert np.asarray(a).tobytes() == np.ascontiguousarray(b, dtype=np.asarray(a).dtype).tobytes(), name
        else:
            assert bytes(a) == bytes(b), name


@pytest.fixture(params=["pieces of a row", "default pieces"])
def piece_size(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param == "pieces of a row":
        monkeypatch.setattr(snapshot_write, "PIECE_BYTES", 8)
        monkeypatch.setattr(snapshot_write, "ROWS_PER_PIECE", 1)


@st.composite
def stores(draw: st.DrawFn) -> Store:
    """Random series and labels (shared and distinct values, unicode, a name only some series
    have), random writes in time order and out of it, NaN and stale values, retention."""
    chunk_samples = draw(st.integers(2, 12))
    store = Store(StoreSettings(chunk_samples=chunk_samples, head_keep=draw(st.integers(1, chunk_samples)),
                                retention_ms=3 * HOUR, ooo_window_ms=HOUR))
    n = draw(st.integers(0, 14))
    labels = [make_labels(draw(st.sampled_from(["cpu", "mem", "disk"])),
                          {"pod": f"p{i}", "namespace": draw(st.sampled_from(["a", "b", "ü✓"])),
                           **({"extra": f"x{i % 3}"} if draw(st.booleans()) else {})}) for i in range(n)]
    ids = np.array([series_id(lab) for lab in labels], dtype=np.uint64)
    t = 1_700_000_000_000
    first = True
    for _ in range(draw(st.integers(0, 6)) if n else 0):
        live = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))))
        k = draw(st.integers(1, 25))
        ts = np.concatenate([t + np.arange(k) * 60_000 + i for i in live])
        vals = np.array(draw(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=len(ts),
                                      max_size=len(ts))))
        if len(vals) > 3:
            vals[3] = stale_marker()
        store.write(ids[live], np.full(len(live), k), ts, vals, {int(ids[i]): labels[i] for i in range(n)}
                    if first else None)
        first = False
        t += k * 60_000 + draw(st.sampled_from([0, HOUR, 2 * HOUR]))
        if draw(st.booleans()):
            store.write(ids[live[:1]], np.array([1]), np.array([t - HOUR // 2]), np.array([1.5]))  # out of order
        if draw(st.booleans()):
            store.gc()
    return store


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(store=stores())
def test_the_streamed_file_reads_back_as_the_whole_image(tmp_path_factory: pytest.TempPathFactory, piece_size: None,
                                                          store: Store) -> None:
    tmp = tmp_path_factory.mktemp("snap")
    path, size = write_snapshot(tmp, capture_lean(store, WalPosition(2, 16)))
    assert size == path.stat().st_size
    img = read_snapshot(path)
    _same_image(img, capture(store, WalPosition(2, 16)))
    assert_same_state(restore(img, store.settings), store)


def test_a_lean_capture_is_the_store_at_the_capture_point(tmp_path: Path, piece_size: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes, a chunk closed, retention and the chunk arenas' clean (regions moved, slabs dropped:
    small slabs make many) after the capture change nothing in the file."""
    monkeypatch.setattr(arena, "SLAB", 1024)
    store = build_store()
    want = capture(store, WalPosition(1, 16))
    lean = capture_lean(store, WalPosition(1, 16))
    sid = np.array([store.index.ids[r] for r in list(store.index.live_rows())[:3]], dtype=np.uint64)
    chunks_before = store.chunks.n_closed.sum()
    for _ in range(3):  # enough samples to seal blocks and close chunks (chunk_samples 8)
        ts = int(store.max_ts) + 1 + np.arange(9)
        store.write(sid, np.full(3, 9), np.tile(ts, 3), np.ones(27))
    assert store.chunks.n_closed.sum() > chunks_before
    fresh = make_labels("cpu", {"namespace": "ns0", "pod": "new", "other": "a name no series had"})
    store.write(np.array([series_id(fresh)], dtype=np.uint64), np.array([1]), np.array([int(store.max_ts) + 1]),
                np.array([1.0]), {series_id(fresh): fresh})
    assert store.chunks.clean(0.0) > 0
    store.gc()
    path, _ = write_snapshot(tmp_path, lean)
    _same_image(read_snapshot(path), want)


def test_the_streamed_file_is_the_sections_the_whole_image_writer_wrote() -> None:
    """The old writer's file of build_store() (kept in tests/store/data) reads as before, and the
    image the streaming writer makes of the same store is the same."""
    old = read_snapshot(V2_WHOLE)
    assert old.position == WalPosition(3, 16)
    store = build_store()
    assert_same_state(restore(old, SETTINGS), store)
    _same_image(old, capture(store, WalPosition(3, 16)))


def test_every_cut_or_flipped_bit_of_a_streamed_file_is_refused(tmp_path: Path, piece_size: None) -> None:
    path, _ = write_snapshot(tmp_path, capture_lean(build_store(), WalPosition(1, 16)))
    whole = path.read_bytes()
    bad = tmp_path / "bad.snap"
    for bit in random.Random(2).sample(range(len(whole) * 8), 150):
        buf = bytearray(whole)
        buf[bit // 8] ^= 1 << (bit % 8)
        bad.write_bytes(bytes(buf))
        with pytest.raises(SnapshotError):
            read_snapshot(bad)
    for cut in range(0, len(whole), max(1, len(whole) // 97)):
        bad.write_bytes(whole[:cut])
        with pytest.raises(SnapshotError):
            read_snapshot(bad)


@given(a=st.binary(max_size=300), b=st.binary(max_size=3000))
def test_crc32_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from pathlib import Path
    from metricsd.model import make_labels, series_id
    from metricsd.rpc.columns import WriteColumns
    from metricsd.proto import metricsd_pb2 as pb
    from metricsd.rpc.wire import labels_to_pb
    from metricsd.store import snapshot_write
    from metricsd.store.durable import open_store

    store, d = open_store(Path(sys.argv[1]), fsync="always")
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(300)]
    ids = [series_id(lab) for lab in labels]
    for tick in range(40):
        req = pb.WriteRequest(ids=ids, counts=[1] * len(ids), timestamps=[1_700_000_000_000 + tick * 10_000] * len(ids),
                              values=[float(tick)] * len(ids))
        if tick == 0:
            for sid, lab in zip(ids, labels):
                req.series.add(id=sid).labels.extend(labels_to_pb(lab))
        d.write(req)
        if tick == 20:
            d.snapshot_now()
    grouped = snapshot_write._regrouped
    def slow(pieces):
        for p in grouped(pieces):
            time.sleep(0.01)
            yield p
    snapshot_write._regrouped = slow  # a writer slow enough to be killed in the middle of its file
    snapshot_write.PIECE_BYTES = 64
    print("acknowledged", flush=True)
    d.snapshot_now()
    print("finished", flush=True)
""")


@pytest.mark.slow
def test_a_writer_killed_mid_file_loses_nothing_acknowledged(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(data)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "acknowledged"
        snaps = data / "snapshots"
        deadline = time.monotonic() + 30
        while not any(p.stat().st_size > 4096 for p in snaps.glob("*.tmp")):
            assert time.monotonic() < deadline and proc.poll() is None, "the snapshot file never grew"
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    assert list(snaps.glob("*.tmp")), "killed after the file was finished"
    store, d = open_store(data)
    try:
        assert not d.recovery.lost
        assert not list(snaps.glob("*.tmp"))  # the half-written file is removed on start
        assert store.stats()["series"] == 300 and store.stats()["samples"] == 300 * 40
        row = store.index.row_of(series_id(make_labels("cpu", {"namespace": "ns", "pod": "p7"})))
        assert row is not None
        t, v = store.series_samples(row, -(2**62), 2**62)
        assert t.tolist() == [1_700_000_000_000 + k * 10_000 for k in range(40)] and v.tolist() == list(range(40))
    finally:
        d.close(snapshot=False)
