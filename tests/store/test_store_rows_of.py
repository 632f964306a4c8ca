"""SeriesIndex.rows_of with its memory of write batches: the same rows as the search, also after
series are removed or added, and never a row that no longer holds the id. And store/rowruns.py: a
batch's rows guessed as runs of consecutive rows are the rows the search finds, whatever the batch
(runs, ids at random, unknown ids, removed series, a series twice), and a real Prometheus' requests
(runs of the order the series were first written in) are found by the guess alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import make_labels, series_id
from metricsd.store.index import BATCH_CACHE_MIN, SORT_KEYS_MIN, SeriesIndex
from metricsd.store.rowruns import RUN_MIN, RUNS_TRIED, rows_by_runs

N = 400


def _index(n: int) -> tuple[SeriesIndex, np.ndarray]:
    index = SeriesIndex()
    ids = []
    for i in range(n):
        lab = make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"})
        index.add(series_id(lab), lab)
        ids.append(series_id(lab))
    return index, np.array(ids, dtype=np.uint64)


def _plain(index: SeriesIndex, ids: np.ndarray) -> np.ndarray:
    return np.array([index.by_id.get(int(i), -1) for i in ids], dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_remembered_batches_answer_as_the_search_does(data: st.DataObject) -> None:
    index, ids = _index(300)
    batches = [ids[np.array(data.draw(st.lists(st.integers(0, 299), min_size=BATCH_CACHE_MIN, max_size=120,
                                              unique=True)))] for _ in range(3)]
    for _ in range(2):  # the second time from memory
        for b in batches:
            assert index.rows_of(b).tolist() == _plain(index, b).tolist()
    # series removed and added in between: a remembered batch is checked, not trusted
    for row in data.draw(st.lists(st.integers(0, 299), max_size=20, unique=True)):
        index.remove(row)
    lab = make_labels("cpu", {"namespace": "ns", "pod": "late"})
    index.add(series_id(lab), lab)
    for b in batches:
        got = index.rows_of(b)
        assert got.tolist() == _plain(index, b).tolist()
        assert all(r == -1 or bool(index.alive[r]) for r in got.tolist())


def test_a_series_removed_and_added_again_is_found_at_its_new_row() -> None:
    index, ids = _index(2000)
    assert index.rows_of(ids[:100]).tolist() == list(range(100))
    for row in range(50):
        index.remove(row)  # left in the sorted ids until a rebuild
    assert index.rows_of(ids[:100]).tolist() == [-1] * 50 + list(range(50, 100))
    for i in range(10):  # back again, at new rows
        lab = make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"})
        assert index.add(series_id(lab), lab) == 2000 + i
    assert index.rows_of(ids[:100]).tolist() == [2000 + i for i in range(10)] + [-1] * 40 + list(range(50, 100))
    for row in range(100, 1700):  # past a quarter removed: the sorted ids are rebuilt
        index.remove(row)
    assert index.rows_of(ids[:100]).tolist() == [2000 + i for i in range(10)] + [-1] * 40 + list(range(50, 100))
    assert index._dead_sorted == 0
    assert index.rows_of(ids[100:200]).tolist() == [-1] * 100


def test_small_batches_and_unknown_ids_are_not_remembered() -> None:
    index, ids = _index(100)
    index.rows_of(ids[:10])
    unknown = np.concatenate([ids[:80], np.array([12345], dtype=np.uint64)])
    assert index.rows_of(unknown)[-1] == -1
    assert index._batch_rows == {}
    index.rows_of(ids[:80])
    assert index._batch_rows == {}  # seen once: its hash alone
    index.rows_of(ids[:80])
    assert len(index._batch_rows) == 1  # seen twice: remembered
    index.rows_of(ids[1:81])  # another batch: not yet
    assert len(index._batch_rows) == 1


def test_a_remembered_batch_under_another_batchs_hash_is_not_trusted() -> None:
    """The cache is keyed by the hash of a batch's bytes, not the bytes: rows remembered under a
    colliding hash (other series, or another count of them) are checked and searched again."""
    index, ids = _index(100)
    want = index.rows_of(ids[:80]).tolist()
    index._batch_rows[hash(ids[:80].tobytes())] = index.rows_of(ids[1:81]).astype(np.int32)
    assert index.rows_of(ids[:80]).tolist() == want
    index._batch_rows[hash(ids[:80].tobytes())] = index.rows_of(ids[:90]).astype(np.int32)
    assert index.rows_of(ids[:80]).tolist() == want


_UNKNOWN = st.integers(1, 2**64 - 1).map(lambda i: np.uint64(i))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_rows_by_runs_answers_as_the_search_does(data: st.DataObject) -> None:
    index, ids = _index(N)
    for row in data.draw(st.lists(st.integers(0, N - 1), max_size=30, unique=True)):
        index.remove(row)
    pieces = []
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["run", "random", "unknown"]))
        if kind == "run":
            a = data.draw(st.integers(0, N - 1))
            pieces.append(ids[a : a + data.draw(st.integers(1, 150))])
        elif kind == "random":
            pieces.append(ids[np.array(data.draw(st.lists(st.integers(0, N - 1), min_size=1, max_size=20)))])
        else:
            pieces.append(np.array(data.draw(st.lists(_UNKNOWN, min_size=1, max_size=3)), dtype=np.uint64))
    batch = np.concatenate(pieces)
    start = data.draw(st.integers(-2, N + 2))
    rows, k = rows_by_runs(batch, index.id_column, index.alive, index.n_rows, start, index.row_of)
    assert 0 < k <= len(batch) and len(rows) == k
    assert rows.tolist() == _plain(index, batch[:k]).tolist()
    # and through rows_of, guess and search together
    assert index.rows_of(batch).tolist() == _plain(index, batch).tolist()


def test_a_scrape_cut_into_requests_is_found_by_the_guess_alone() -> None:
    index, ids = _index(N)
    start = 0
    for lo in range(0, N, 50):  # requests of 50 in the order the series were made: one run each
        rows, k = rows_by_runs(ids[lo : lo + 50], index.id_column, index.alive, index.n_rows, start,
                               lambda sid: None)  # no search at all
        assert k == 50 and rows.tolist() == list(range(lo, lo + 50))
        start = int(rows[-1]) + 1
    # two runs (the end of one target's scrape, the start of another's), found by row_of
    batch = np.concatenate([ids[350:380], ids[100:140]])
    rows, k = rows_by_runs(batch, index.id_column, index.alive, index.n_rows, 350, index.row_of)
    assert k == 70 and rows.tolist() == [*range(350, 380), *range(100, 140)]


def test_guessing_stops_at_a_short_run_or_after_its_runs() -> None:
    index, ids = _index(N)
    scattered = ids[np.arange(0, N, 7)][:SORT_KEYS_MIN]  # no two in consecutive rows
    rows, k = rows_by_runs(scattered, index.id_column, index.alive, index.n_rows, 0, index.row_of)
    assert k == 1 and rows.tolist() == [0]
    runs = np.concatenate([ids[a : a + RUN_MIN] for a in range(0, 100 * (RUNS_TRIED + 2), 100)])
    rows, k = rows_by_runs(runs, index.id_column, index.alive, index.n_rows, 0, index.row_of)
    assert k == RUNS_TRIED * RUN_MIN
    assert index.rows_of(runs).tolist() == _plain(index, runs).tolist()


def test_rows_of_starts_its_guess_after_the_last_batch() -> None:
    index, ids = _index(N)
    asked: list[int] = []
    row_of = index.row_of
    index.row_of = lambda sid: asked.append(sid) or row_of(sid)  # type: ignore[method-assign]
    assert index.rows_of(ids[100:200]).tolist() == list(range(100, 200))
    assert asked == [int(ids[100])]  # not where the guess starts (row 0): looked up
    assert index.rows_of(ids[200:350]).tolist() == list(range(200, 350))
    assert asked == [int(ids[100])]  # the second batch went on from the first one's end
