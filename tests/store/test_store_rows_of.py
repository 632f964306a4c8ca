"""SeriesIndex.rows_of with its memory of write batches: the same rows as the search, also after
series are removed or added, and never a row that no longer holds the id."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import make_labels, series_id
from metricsd.store.index import BATCH_CACHE_MIN, SeriesIndex


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
