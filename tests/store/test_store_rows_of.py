"""SeriesIndex.rows_of with its memory of write batches: the same rows as the search, also after
series are removed or added, and never a row that no longer holds the id. And store/rowruns.py: a
batch's rows guessed as runs of the order of earlier batches are the rows the search finds, whatever
the batch (runs, ids at random, unknown ids, removed series, a series twice) and however the order
ring has turned, and a real Prometheus' requests (runs of an order written before, cut anywhere)
are found by the guess alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import make_labels, series_id
from metricsd.store.index import BATCH_CACHE_MIN, SORT_KEYS_MIN, SeriesIndex
from metricsd.store.rowruns import RUN_MIN, RUNS_TRIED, RowOrder

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


def _no_search(index: SeriesIndex) -> list[int]:
    """The ids rows_of looks up one by one from now on (the guess's restarts); the search must not run."""
    asked: list[int] = []
    row_of = index.row_of
    index.row_of = lambda sid: asked.append(sid) or row_of(sid)  # type: ignore[method-assign]

    def no_search(ids: np.ndarray) -> np.ndarray:
        raise AssertionError(f"searched {len(ids)} ids")
    index._search = no_search  # type: ignore[method-assign]
    return asked


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_guessed_rows_are_the_rows_the_search_finds(data: st.DataObject) -> None:
    index, ids = _index(N)
    index._order.order = np.zeros(N // 2, dtype=np.int32)  # a small ring: it turns within the test
    perm = ids[np.array(data.draw(st.permutations(range(N))))]  # another sender's order
    for _ in range(data.draw(st.integers(1, 8))):
        for row in data.draw(st.lists(st.integers(0, N - 1), max_size=8, unique=True)):
            index.remove(row)
        pieces = []
        for _ in range(data.draw(st.integers(1, 5))):
            kind = data.draw(st.sampled_from(["made", "other", "random", "unknown"]))
            if kind in ("made", "other"):
                a = data.draw(st.integers(0, N - 1))
                pieces.append((ids if kind == "made" else perm)[a : a + data.draw(st.integers(1, 150))])
            elif kind == "random":
                pieces.append(ids[np.array(data.draw(st.lists(st.integers(0, N - 1), min_size=1, max_size=20)))])
            else:
                pieces.append(np.array(data.draw(st.lists(_UNKNOWN, min_size=1, max_size=3)), dtype=np.uint64))
        batch = np.concatenate(pieces)
        rows, k = RowOrder.guess(index._order, batch, index.id_column, index.alive, index.row_of)
        assert 0 < k <= len(batch) and len(rows) == k
        assert rows.tolist() == _plain(index, batch[:k]).tolist()
        assert index.rows_of(batch).tolist() == _plain(index, batch).tolist()  # guess and search together


def test_a_scrape_cut_into_requests_is_found_by_the_guess_alone() -> None:
    index, ids = _index(N)
    asked = _no_search(index)
    for lo in range(0, N, 50):  # requests in the order the series were made
        assert index.rows_of(ids[lo : lo + 50]).tolist() == list(range(lo, lo + 50))
    assert asked == []  # each request went on where the last one ended
    # two runs (the end of one target's scrape, the start of another's)
    batch = np.concatenate([ids[350:380], ids[100:140]])
    assert index.rows_of(batch).tolist() == [*range(350, 380), *range(100, 140)]
    assert asked == [int(ids[350]), int(ids[100])]


def test_an_order_of_its_own_is_searched_once_then_guessed() -> None:
    """A sender of another order (Prometheus' shards split series by hash): its first requests are
    searched and their order recorded, the next round's, cut elsewhere, found by the guess."""
    index, ids = _index(N)
    perm = np.random.default_rng(1).permutation(N)
    for lo in range(0, N, 64):
        assert index.rows_of(ids[perm[lo : lo + 64]]).tolist() == perm[lo : lo + 64].tolist()
    asked = _no_search(index)
    for lo in range(10, N - 50, 50):  # cut elsewhere: a request spans two recorded ones
        assert index.rows_of(ids[perm[lo : lo + 50]]).tolist() == perm[lo : lo + 50].tolist()
    assert len(asked) <= 2 * len(range(10, N - 50, 50))


def test_guessing_stops_at_a_short_run_or_after_its_runs() -> None:
    index, ids = _index(N)
    scattered = ids[np.arange(0, N, 7)][:SORT_KEYS_MIN]  # no two in consecutive rows
    rows, k = index._order.guess(scattered, index.id_column, index.alive, index.row_of)
    assert k == 1 and rows.tolist() == [0]
    runs = np.concatenate([ids[a : a + RUN_MIN] for a in range(0, 50 * (RUNS_TRIED + 2), 50)])
    rows, k = index._order.guess(runs, index.id_column, index.alive, index.row_of)
    assert k == RUNS_TRIED * RUN_MIN
    assert index.rows_of(runs).tolist() == _plain(index, runs).tolist()
