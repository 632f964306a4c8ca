"""The chunk arena (metricsd/store/arena.py) against a dict of bytes: every row reads back what was
last put, views handed out never change, dead slabs are dropped and a clean bounds the dead bytes;
the same with slabs as files (metricsd/store/slabfiles.py), their pages dropped from the resident
set, and a file for every slab held and none for a slab dropped."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.store import arena as arena_mod
from metricsd.store.arena import Arena, Frozen
from metricsd.store.slabfiles import SlabFiles

ROWS = 12
_op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, ROWS - 1), st.binary(max_size=300)),
    st.tuples(st.just("many"), st.lists(st.integers(0, ROWS - 1), unique=True, max_size=6),
              st.lists(st.binary(max_size=200), min_size=6, max_size=6)),
    st.tuples(st.just("grow"), st.lists(st.integers(0, ROWS - 1), unique=True, max_size=6), st.binary(max_size=90)),
    st.tuples(st.just("clear"), st.integers(0, ROWS - 1), st.just(b"")),
    st.tuples(st.just("clean"), st.just(0), st.just(b"")),
    st.tuples(st.just("settle"), st.just(0), st.just(b"")),
)


@pytest.fixture
def small_slabs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arena_mod, "SLAB", 512)  # many slabs, waves and rows longer than one


def _files_match(a: Arena, files: SlabFiles) -> None:
    """A file for each slab the arena holds (and its spare), none for any other."""
    held = [s for s in [*a.slabs, a.spare] if s is not None]
    assert all(files.owns(s) for s in held)
    assert len(list(files.where.iterdir())) == files.files == len(held), "a slab's file left, or one missing"


@pytest.mark.parametrize("on_files", [False, True], ids=["anonymous", "files"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # SLAB only
@given(ops=st.lists(_op, max_size=60))
def test_rows_read_back_and_views_never_change(small_slabs: None, on_files: bool, ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _rows_read_back_and_views_never_change(ops, SlabFiles(Path(tmp) / "chunks") if on_files else None)


def _rows_read_back_and_views_never_change(ops: list[tuple], files: SlabFiles | None) -> None:
    a = Arena(4, files)
    a.ensure_rows(ROWS, ROWS)
    model = {r: b"" for r in range(ROWS)}
    handed: list[tuple[memoryview, bytes]] = []
    frozen: list[tuple[Frozen, list[bytes]]] = []  # snapshots' captures, read after later writes
    for kind, x, y in ops:
        if kind == "put":
            a[x] = y
            model[x] = y
        elif kind == "many":
            a.put_many(x, y[: len(x)])
            model.update(zip(x, y[: len(x)], strict=False))
        elif kind == "grow":  # the append's shape: the old region as a view, then the new piece
            pieces = [p for r in x for p in (a[r], y)]
            a.put_many(x, pieces, np.array([len(model[r]) + len(y) for r in x], np.int64))
            model.update({r: model[r] + y for r in x})
        elif kind == "clear":
            a.clear(x)
            model[x] = b""
        elif kind == "settle":
            a.settle()
        else:
            before = [s for s in range(len(a.slabs)) if s != a.tail and a.slabs[s] is not None]
            a.clean()
            assert all(a.slabs[s] is None or a.used[s] - a.live[s] <= 0.125 * a.used[s] for s in before), \
                "a worn slab was left after a clean"
        a._check()
        if files is not None:
            _files_match(a, files)
        assert {r: bytes(a[r]) for r in range(ROWS)} == model
        assert a.take(np.arange(ROWS)[::-1]) == [model[r] for r in reversed(range(ROWS))]  # a scan's copies
        handed += [(a[r], model[r]) for r in range(ROWS)]
        assert all(bytes(v) == b for v, b in handed), "a view handed out changed"
        order = np.arange(ROWS)[::-1] if len(frozen) % 2 else np.arange(ROWS)
        frozen.append((a.freeze(order), [model[r] for r in order.tolist()]))
    assert a.live_bytes == sum(map(len, model.values()))
    for f, rows in frozen:
        assert [bytes(v) for v in f.rows()] == rows, "a frozen row changed"
        assert [bytes(v) for v in f.rows(release=True)] == rows  # as the snapshot writer reads CDAT
        assert not any(v is not None for v in f._views), "a slab still held after its last row was read"


def test_a_slab_whose_rows_all_moved_is_dropped(small_slabs: None) -> None:
    a = Arena()
    a.ensure_rows(8, 8)
    for r in range(8):
        a[r] = bytes([r]) * 100  # five slabs of 512: rows 0-4 in the first
    first, second = a.slabs[0], a.slabs[1]
    a.put_many(range(5), [b"x" * 10] * 5)
    assert first is not None and a.slabs[0] is None
    a.put_many(range(5), [b"y" * 200] * 5)  # a slab of its own (1,000 > 512): the second is not the newest
    for r in range(5, 8):
        a.clear(r)  # the second slab's last rows, one by one
    assert second is not None and all(s is not second for s in a.slabs)
    a._check()


def test_clean_moves_live_rows_out_of_worn_slabs_and_frees_them(small_slabs: None) -> None:
    a = Arena()
    a.ensure_rows(20, 20)
    for r in range(20):
        a[r] = bytes([r]) * 100
    for r in range(0, 20, 2):
        a[r] = bytes([r]) * 100  # every second row moved: the old slabs are half dead
    held_before = a.held_bytes
    assert a.clean() > 0
    a._check()
    assert all(bytes(a[r]) == bytes([r]) * 100 for r in range(20))
    assert all(a.used[s] == a.live[s] for s in range(len(a.slabs)) if s != a.tail and a.slabs[s] is not None)
    assert a.held_bytes < held_before
    assert a.clean() == 0


def test_sizes_that_do_not_add_up_are_refused() -> None:
    a = Arena()
    a.ensure_rows(2, 2)
    with pytest.raises(ValueError, match="add up"):
        a.put_many([0, 1], [b"abc"], np.array([1, 1], np.int64))
    assert bytes(a[0]) == b"" and bytes(a[1]) == b""


@pytest.mark.parametrize("on_files", [False, True], ids=["anonymous", "files"])
def test_a_dropped_slab_is_reused_only_once_no_view_of_it_is_left(small_slabs: None, on_files: bool,
                                                                  tmp_path: Path) -> None:
    files = SlabFiles(tmp_path / "chunks") if on_files else None
    a = Arena(64, files)
    a.ensure_rows(4, 4)
    a[0] = b"a" * 400
    a[1] = b"b" * 400  # a second slab: 800 > 512
    first, second = a.slabs[0], a.slabs[1]
    kept = a[0]  # a view handed out, as a snapshot's capture holds one
    a.clear(0)
    assert a.spare is first
    a[2] = b"c" * 400  # a third slab is needed: the spare still has a view, a fresh mapping is taken
    assert all(s is not first for s in a.slabs) and bytes(kept) == b"a" * 400
    del kept
    a.clear(1)
    assert a.spare is second
    a[3] = b"d" * 400  # no view of the spare left: reused
    assert a.slabs[a.tail] is second
    assert [bytes(a[r]) for r in range(4)] == [b"", b"", b"c" * 400, b"d" * 400]
    a._check()
    if files is not None:
        _files_match(a, files)  # the reused spare kept its file; the first slab's went
    a.clean()
    assert a.spare is None


def test_a_frozen_slab_is_let_go_once_read_past_its_last_row(small_slabs: None) -> None:
    """The snapshot writer's read: a slab the store dropped while the snapshot was written is free
    for reuse (no buffer of it exported: the spare's resize succeeds) as soon as the writer has
    passed its rows, not at the end of the file."""
    a = Arena()
    a.ensure_rows(3, 3)
    a[0] = b"a" * 400
    a[1] = b"b" * 400  # a slab each
    a[2] = b"c" * 100  # with row 1
    frozen = a.freeze(np.arange(3))
    first = a.slabs[0]
    assert first is not None
    a.clear(0)  # the store gives the first slab up while the snapshot is being written
    assert a.spare is first
    rows = frozen.rows(release=True)
    assert bytes(next(rows)) == b"a" * 400
    with pytest.raises(BufferError):
        first.resize(len(first))  # the writer is still on the first slab's last row
    assert bytes(next(rows)) == b"b" * 400
    first.resize(len(first))  # past it: let go
    assert bytes(next(rows)) == b"c" * 100
    assert next(rows, None) is None
