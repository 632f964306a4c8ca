"""Chunk slabs as files (metricsd/store/slabfiles.py): their pages leave the process's resident set
and every view handed out still reads the same bytes; stale files go at start and at close; on a
full disk a slab falls back to anonymous memory (never a SIGBUS, never a lost sample), and a
store with its chunks on a full disk keeps accepting and answering."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from small_fs import fill, free_bytes, small_fs

from metricsd.model import make_labels, series_id
from metricsd.rpc.columns import WriteColumns
from metricsd.store import arena as arena_mod
from metricsd.store.arena import SLAB, Arena
from metricsd.store.durable import Durability, open_store
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.slabfiles import SlabFiles

REPO = Path(__file__).resolve().parents[2]


def _resident_kib(where: Path, removed: bool = True) -> int:
    """Resident KiB of this process's mappings of files under ``where`` (/proc/self/smaps); without
    ``removed``, of the files still there only (not of slabs dropped that a view still holds)."""
    total, ours = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        f = line.split()
        if f and "-" in f[0] and not f[0].endswith(":"):
            ours = len(f) >= 6 and f[5].startswith(str(where)) and (removed or f[-1] != "(deleted)")
        elif ours and f and f[0] == "Rss:":
            total += int(f[1])
    return total


def test_full_slabs_leave_the_resident_set_and_every_view_still_reads_the_same(tmp_path: Path) -> None:
    files = SlabFiles(tmp_path / "chunks")
    a = Arena(32, files)
    a.ensure_rows(24, 32)
    rng = np.random.default_rng(1)
    want = [rng.bytes(SLAB // 2 - 4096) for _ in range(24)]  # two a slab: 11 full slabs and the tail
    for r, b in enumerate(want):
        a[r] = b
    handed = [a[r] for r in range(24)]  # views, as a query's and a snapshot's capture hold
    frozen = a.freeze(np.arange(24))
    assert files.files == 12 and len(list((tmp_path / "chunks").glob("*.slab"))) == 12
    tail = SLAB // 1024 + 64
    # only the tail (4 MiB) is resident: each full slab left the resident set when the next began
    assert _resident_kib(files.where) <= tail
    assert [bytes(v) for v in handed] == want  # read back from the page cache
    assert _resident_kib(files.where) >= 11 * (SLAB - 8192) // 1024  # faulted back in
    a.settle()  # the retention pass's: out again
    assert _resident_kib(files.where) <= tail
    assert a.take(np.arange(24)) == want
    for r in range(0, 6, 2):
        a.clear(2 * r)
        a.clear(2 * r + 1)  # three slabs dropped whole: their files go, the views of them stay valid
    for r in range(14, 24, 4):
        a.clear(r)  # and three slabs half dead, for the clean to move
    assert files.files == 12 - 3 + (a.spare is not None)
    assert len(list(files.where.glob("*.slab"))) == files.files
    assert [bytes(v) for v in handed] == want
    assert a.clean() > 0  # moves live rows: reads the worn slabs and writes new ones, then settles
    # the arena's slabs out again; the dropped ones' pages stay while the views hold them
    assert _resident_kib(files.where, removed=False) <= tail
    assert _resident_kib(files.where) >= 5 * (SLAB - 8192) // 1024
    assert [bytes(v) for v in frozen.rows(release=True)] == want
    assert [bytes(v) for v in handed] == want
    live = [r for r in range(24) if r not in {0, 1, 4, 5, 8, 9, 14, 18, 22}]
    assert [bytes(a[r]) for r in live] == [want[r] for r in live]


def test_slab_files_left_by_a_crash_are_removed_at_start_and_nothing_else(tmp_path: Path) -> None:
    where = tmp_path / "chunks"
    where.mkdir()
    (where / "00000003.slab").write_bytes(b"x" * 100)
    (where / "notes.txt").write_text("an operator's")
    files = SlabFiles(where)
    assert sorted(p.name for p in where.iterdir()) == ["notes.txt"]
    a = Arena(4, files)
    a.ensure_rows(1, 4)
    a[0] = b"abc"
    assert len(list(where.glob("*.slab"))) == 1
    files.clear()
    assert sorted(p.name for p in where.iterdir()) == ["notes.txt"] and bytes(a[0]) == b"abc"


def test_a_dropped_slab_s_file_goes_at_once_or_with_the_spare(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arena_mod, "SLAB", 512)
    files = SlabFiles(tmp_path / "chunks")
    a = Arena(4, files)
    a.ensure_rows(4, 4)

    def names() -> int:
        return len(list(files.where.glob("*.slab")))

    a.put_many([0, 1], [b"x" * 400, b"y" * 400])  # a long wave: a slab of its own size (800)
    a[2] = b"z" * 10  # a standard one after it
    a.put_many([0, 1], [b"", b""])
    assert names() == 1 and a.spare is None  # the long slab's file went at once
    a[3] = b"w" * 510  # another standard slab: the one of row 2 is full and no longer the tail
    a.clear(2)
    assert a.spare is not None and names() == 2  # kept as the spare, with its file
    a.clean()
    assert a.spare is None and names() == 1  # the spare let go at the pass: its file too
    assert bytes(a[3]) == b"w" * 510


_ON_A_FULL_DISK = textwrap.dedent("""
    import sys
    from pathlib import Path
    import numpy as np
    from metricsd.cmd.diskfill import fill, free_bytes
    from metricsd.store.arena import SLAB, Arena
    from metricsd.store.slabfiles import SlabFiles

    fs = Path(sys.argv[1])
    files = SlabFiles(fs / "chunks")
    a = Arena(8, files)
    a.ensure_rows(8, 8)
    a[0] = b"a" * 1000
    filler = fill(fs)
    assert free_bytes(fs) == 0
    want = [bytes([r]) * (SLAB - 100) for r in range(1, 5)]
    for r, b in enumerate(want, 1):
        a[r] = b  # four new slabs on a full disk: anonymous ones
    def shmem_kib():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
    before = shmem_kib()  # Python's anonymous mmap is shared memory
    assert before >= 4 * (SLAB - 100) // 1024
    a.settle()  # DONTNEED must not touch them: it would hide memory still held from the RSS
    assert shmem_kib() >= before - 64, "an anonymous slab left the RSS while it still holds memory"
    assert [bytes(a[r]) for r in range(1, 5)] == want, "an anonymous slab lost its bytes"
    assert files.fallbacks == 4 and files.files == 1
    filler.unlink()
    a[5] = b"f" * (SLAB - 100)
    assert files.files == 2 and files.owns(a.slabs[a.tail])
    print("ok", files.fallbacks)
""")


def test_a_slab_on_a_full_disk_falls_back_to_anonymous_memory_without_a_sigbus(tmp_path: Path) -> None:
    """In a child process: a SIGBUS (a write to a file page the disk has no block for) would kill
    it, and the test would see the signal instead of the pytest process dying."""
    with small_fs(tmp_path / "fs") as fs:
        run = subprocess.run([sys.executable, "-c", _ON_A_FULL_DISK, str(fs)], capture_output=True, text=True,
                             cwd=REPO, timeout=120)
        assert run.returncode == 0, f"rc {run.returncode}: {run.stderr[-2000:]}"
        assert run.stdout.split() == ["ok", "4"]


_LABELS = [make_labels("container_memory_rss", {"namespace": "shop", "pod": f"p{i}"}) for i in range(400)]
_IDS = [series_id(lab) for lab in _LABELS]


def _write(d: Durability, t0: int, samples: int, labelled: bool) -> None:
    n = len(_IDS)
    ts = np.tile(np.arange(samples, dtype=np.int64) * 10_000 + t0, n)
    vals = np.random.default_rng(t0).random(n * samples)
    labels = {sid: lab for sid, lab in zip(_IDS, _LABELS, strict=True)} if labelled else {}
    batch = WriteColumns(np.array(_IDS, np.uint64), np.full(n, samples, np.int64), ts, vals, labels)
    res = d.write_columns(batch)
    assert res.written == n * samples


def _held(store: Store) -> int:
    return sum(len(store.series_samples(row, 0, 2**62)[0]) for row in store.index.live_rows())


def test_a_store_with_its_chunks_on_a_full_disk_keeps_accepting_and_answering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The WAL on a disk with room, ``<data-dir>/chunks`` a full filesystem: new slabs are
    anonymous, every write is accepted and every sample answered; once space returns they are
    files again, and a clean close leaves the directory empty."""
    monkeypatch.setattr(arena_mod, "SLAB", 8192)  # a new slab for every few writes
    data = tmp_path / "data"
    with small_fs(data / "chunks") as chunks:
        store, d = open_store(data)
        try:
            t0 = int(time.time() * 1000) - 3_600_000
            _write(d, t0, 40, True)  # sealed: slabs made while the disk has room
            assert d.files is not None and d.files.files >= 1 and d.files.fallbacks == 0
            filler = fill(chunks)
            assert free_bytes(chunks) == 0
            for k in range(1, 6):
                _write(d, t0 + k * 400_000, 40, False)
            assert d.files.fallbacks > 0  # slabs made on the full disk went to memory
            assert _held(store) == 6 * 40 * len(_IDS)
            store.gc()  # a retention pass: settle must keep the anonymous slabs' bytes
            assert _held(store) == 6 * 40 * len(_IDS)
            filler.unlink()
            for k in range(6, 9):
                _write(d, t0 + k * 400_000, 40, False)
            assert any(d.files.owns(s) for s in store.chunks.open.slabs if s is not None)
            assert _held(store) == 9 * 40 * len(_IDS)
        finally:
            d.close()
        assert not list(chunks.glob("*.slab"))
        again, d2 = open_store(data)  # what a restart finds: everything, from the snapshot
        try:
            assert _held(again) == 9 * 40 * len(_IDS)
        finally:
            d2.close(snapshot=False)


def test_chunks_on_disk_off_keeps_the_slabs_in_memory(tmp_path: Path) -> None:
    store, d = open_store(tmp_path / "data", settings=StoreSettings(chunks_on_disk=False))
    try:
        _write(d, int(time.time() * 1000) - 3_600_000, 40, True)
        assert d.files is None and store.chunks.data.files is None
        assert not list((tmp_path / "data").glob("chunks/*"))
    finally:
        d.close(snapshot=False)
    store, d = open_store(tmp_path / "data")  # auto: the WAL replayed into file slabs
    try:
        assert d.files is not None and d.files.files >= 1 and _held(store) == 40 * len(_IDS)
    finally:
        d.close(snapshot=False)


def test_a_snapshot_and_a_retention_pass_leave_only_the_tails_resident(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Both read every slab (pages faulted back in); both end with the slabs out again."""
    monkeypatch.setattr(arena_mod, "SLAB", 16 << 10)
    store, d = open_store(tmp_path / "data", settings=StoreSettings(chunk_samples=64))  # closed chunks too
    try:
        t0 = int(time.time() * 1000) - 3_600_000
        for k in range(4):
            _write(d, t0 + k * 400_000, 40, k == 0)
        assert d.files is not None and d.files.files > 4
        where = d.files.where

        def tails() -> int:  # KiB the two arenas' tails may hold, written to and so resident
            return sum(len(a.slabs[a.tail] or b"") for a in (store.chunks.data, store.chunks.open)) // 1024 + 64

        assert _held(store) == 4 * 40 * len(_IDS)  # a read of every sample: pages back in
        assert _resident_kib(where, removed=False) > tails()
        d.snapshot_now()
        assert _resident_kib(where, removed=False) <= tails()
        assert _held(store) == 4 * 40 * len(_IDS)
        assert _resident_kib(where, removed=False) > tails()
        store.gc()
        assert _resident_kib(where, removed=False) <= tails()
    finally:
        d.close(snapshot=False)


def test_slab_files_stop_at_their_share_of_the_open_files_limit(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``max_files`` a slab is anonymous, so the chunk files never take the descriptors a
    store's sockets and WAL need; a file given up makes room for the next."""
    monkeypatch.setattr(arena_mod, "SLAB", 4096)
    files = SlabFiles(tmp_path / "chunks", max_files=2)
    a = Arena(8, files)
    a.ensure_rows(8, 8)
    for r in range(4):
        a[r] = bytes([r]) * 4096  # a slab each
    assert files.files == 2 and files.fallbacks == 2
    assert [bytes(a[r]) for r in range(4)] == [bytes([r]) * 4096 for r in range(4)]
    a.clear(0)  # its slab dropped (kept as the spare: still a file) ...
    a.clean()  # ... and let go at the pass
    assert files.files == 1
    a[4 % 8] = b"e" * 4096
    assert files.files == 2 and files.fallbacks == 2


def test_the_default_budget_is_a_quarter_of_the_soft_open_files_limit(tmp_path: Path) -> None:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert SlabFiles(tmp_path / "chunks").max_files == 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
